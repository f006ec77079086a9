use super::*;
use memres_core::snapshot::MemoryMap;

#[test]
fn a_bar_shows_used_free_and_partly_used_cells() {
    let mut map = MemoryMap::new(0);
    map.segment_alloc(0, 6400, 0, None);
    map.alloc(0, 1000, 1000, 0, None); // cells 0..10 used
    map.alloc(6350, 50, 50, 0, None); // half the last cell
    let segs = map.runs();
    let bar = bar(&segs[0]);
    assert_eq!(bar.len(), WIDTH);
    assert_eq!(&bar[..10], "##########");
    assert_eq!(&bar[10..63], &".".repeat(53));
    assert_eq!(&bar[63..], "5");
    let text = render(&segs);
    assert!(text.contains("used 1.03 KiB in 2 blocks  free 5.22 KiB, largest 5.22 KiB"), "{text}");
    assert!(
        text.ends_with(
            "1 segments: held 6.25 KiB, used 1.03 KiB, free 5.22 KiB  (# used, . free, 1-9 tenths used)\n"
        ),
        "{text}"
    );
}

#[test]
fn a_tiny_segment_gets_a_cell_per_byte_and_many_segments_are_summed() {
    let mut map = MemoryMap::new(0);
    map.segment_alloc(0, 3, 0, None);
    map.alloc(1, 1, 1, 0, None);
    assert_eq!(bar(&map.runs()[0]), ".#.");
    for i in 0..(MAX_SEGMENTS as u64 + 5) {
        map.segment_alloc(1000 + i * 10, 10, 0, None);
    }
    let text = render(&map.runs());
    assert!(text.contains("... and 6 smaller segments of 53 B in all"), "{text}");
}

/// A live block in no watched segment (from a leaf not tapped, a `vpool`
/// beside a `sim`) is no segment held: the totals' held bytes are the
/// map's, as the peak label says, and the block is counted apart (it was
/// a segment of its own, and held read 8.25 KiB where the map held 6.25).
#[test]
fn blocks_outside_watched_segments_are_not_counted_as_held() {
    let mut map = MemoryMap::new(0);
    map.segment_alloc(0, 6400, 0, None);
    map.alloc(0, 1000, 1000, 0, None);
    map.alloc(100_000, 2048, 2000, 0, None);
    let text = render(&map.runs());
    assert!(!text.contains("segment 0x186a0"), "{text}");
    assert!(text.contains("1 blocks outside watched segments: 1.95 KiB live in 2.00 KiB\n"), "{text}");
    assert!(
        text.ends_with(
            "1 segments: held 6.25 KiB, used 1000 B, free 5.27 KiB  (# used, . free, 1-9 tenths used)\n"
        ),
        "{text}"
    );
    assert_eq!(map.held(), 6400);
}
