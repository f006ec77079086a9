use super::*;

/// The largest free block an out-of-memory error of a peer names, in bytes.
fn largest_free(e: Error) -> u64 {
    match e {
        Error::OutOfMemory { largest_free, .. } => largest_free,
        other => panic!("not out of memory: {other:?}"),
    }
}

/// A peer out of memory names its largest free range, as every memres
/// resource does (it said 0 B, an empty peer's error included).
#[test]
fn a_peer_out_of_memory_names_its_largest_free_range() {
    let units = RangeReplayer::CAPACITY;
    let mut range = RangeReplayer::new();
    let e = range.allocate((units + 1) * GRANULE, 0).unwrap_err();
    assert_eq!(largest_free(e), units * GRANULE, "empty: the whole range");
    let half = range.allocate(units / 2 * GRANULE, 0).unwrap();
    let _quarter = range.allocate(units / 4 * GRANULE, 0).unwrap();
    let _rest = range.allocate(units / 4 * GRANULE, 0).unwrap();
    range.deallocate(half, units / 2 * GRANULE, 0).unwrap();
    let e = range.allocate((units / 2 + 1) * GRANULE, 0).unwrap_err();
    assert_eq!(largest_free(e), units / 2 * GRANULE, "the half freed");

    let w = Workload::load("random:10:1000:1").unwrap();
    let mut offset = OffsetReplayer::new(&w);
    let Err(e) = offset.allocate(u64::from(u32::MAX) * GRANULE, 0) else { panic!("1 TiB fits") };
    let free = largest_free(e);
    assert!(free > 0 && free < u64::from(u32::MAX) * GRANULE, "{free}");
    // What it names is a block it can hand out.
    assert!(offset.allocate(free, 0).is_ok(), "{free}");
}
