use super::*;

#[test]
fn runs_tile_each_segment_and_stray_blocks_stand_alone() {
    let mut map = MemoryMap::new(0);
    map.segment_alloc(1000, 100, 7, None);
    map.alloc(1000, 10, 9, 0, None);
    map.alloc(1090, 10, 10, 0, None);
    map.alloc(5000, 64, 60, 3, None); // in no segment
    let runs = map.runs();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0].runs.iter().map(|r| r.size).sum::<u64>(), 100);
    assert_eq!(runs[0].runs[1], Run { addr: 1010, size: 80, requested: None });
    assert_eq!((runs[1].addr, runs[1].size, runs[1].stream), (5000, 64, 3));
    assert_eq!((map.held_bytes(), map.live_bytes(), map.largest_free()), (100, 79, 80));
    map.free(1000, 0, None);
    map.free(1000, 0, None); // twice: ignored
    assert_eq!((map.live_bytes(), map.largest_free()), (70, 90));
    map.segment_free(1000, 0, None);
    assert_eq!(map.held_bytes(), 0);
}

#[test]
fn the_trace_keeps_the_last_entries() {
    let mut map = MemoryMap::new(2);
    map.segment_alloc(0, 512, 0, Some(5));
    map.alloc(0, 256, 200, 0, Some(6));
    map.oom(1 << 40, 0, None);
    let kept: Vec<Action> = map.trace().map(|e| e.action).collect();
    assert_eq!(kept, [Action::Alloc, Action::Oom]);
    assert_eq!(map.trace().next().unwrap().time_us, Some(6));
}
