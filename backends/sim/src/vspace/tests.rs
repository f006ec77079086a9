use super::*;
use memres_core::check::LiveBlocks;
use memres_core::testing::{SplitMix64, TestStream};
use memres_core::vpool::{VirtualConfig, VirtualPool};
use memres_core::Inspect;
use memres_core::{Block, MemoryResource, MemoryResourceMut, Request, Shared};

const MIB: u64 = 1 << 20;

fn range(start: u64, len: u64) -> Range {
    Range::new(start, len).unwrap()
}

#[test]
fn a_span_past_the_last_address_is_cut_to_what_lies_above_the_base() {
    for granule in [256, 2 * MIB] {
        let space = SimAddressSpace::with_span(1 << 30, granule, u64::MAX).unwrap();
        let top = (u64::MAX - SimAddressSpace::BASE) / granule * granule;
        assert_eq!((space.addresses().start(), space.span()), (SimAddressSpace::BASE, top));
        let r = space.reserve(granule).unwrap();
        assert_eq!(r.start(), SimAddressSpace::BASE);
        space.release(r).unwrap();
    }
}

#[test]
fn every_granule_a_space_takes_can_be_reserved_and_the_others_are_refused() {
    // Granules up to 2^45 were taken, but one above 2^40 (a request's
    // largest alignment) could never be reserved.
    for granule in [256, 2 * MIB, SimAddressSpace::MAX_GRANULE] {
        let space = SimAddressSpace::new(1 << 50, granule).unwrap();
        let r = space.reserve(granule).unwrap();
        assert_eq!((r.start() % granule, r.len()), (0, granule));
        space.release(r).unwrap();
    }
    for granule in [0, 255, 3 * MIB, SimAddressSpace::MAX_GRANULE << 1, 1 << 63] {
        let e = SimAddressSpace::new(1 << 30, granule).unwrap_err();
        assert!(matches!(e, Error::InvalidConfig { .. }), "{granule}: {e:?}");
    }
}

#[test]
fn reservations_beyond_the_address_space_are_errors() {
    let space = SimAddressSpace::with_span(1 << 30, 2 * MIB, 64 * MIB).unwrap();
    let err = space.reserve(66 * MIB).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: 66 * MIB,
            largest_free: 64 * MIB,
            pool_size: 64 * MIB,
            max_size: Some(64 * MIB)
        }
    );
    const NOT_GRANULES: &str = "not a non-zero multiple of the granule";
    assert_eq!(space.reserve(0), Err(Error::InvalidSize { size: 0, what: NOT_GRANULES }));
    assert_eq!(space.reserve(MIB), Err(Error::InvalidSize { size: MIB, what: NOT_GRANULES }));
    let a = space.reserve(40 * MIB).unwrap();
    // Room for 24 MiB only now.
    assert!(space.reserve(26 * MIB).unwrap_err().is_out_of_memory());
    let b = space.reserve(24 * MIB).unwrap();
    assert!(!a.overlaps(&b));
    assert_eq!(space.reserved_bytes(), 64 * MIB);
    space.release(a).unwrap();
    assert_eq!(space.release(a), Err(Error::UnknownBlock { addr: a.start() }));
    // Released addresses are reused.
    assert_eq!(space.reserve(40 * MIB).unwrap(), a);
    // A pool whose reservation does not fit fails to build.
    assert!(VirtualPool::with_config(&space, VirtualConfig::new(1 << 40)).unwrap_err().is_out_of_memory());
}

#[test]
fn reservations_beyond_the_granules_a_space_keeps_bitmaps_for_are_refused() {
    // Each reservation's bitmap was allocated whatever its size: 32 GiB for
    // 2^46 bytes in granules of 256 bytes, aborting the process when the
    // allocation failed. (Before, this test made bitmaps of 128 MiB, never
    // touched.)
    let space = SimAddressSpace::new(1 << 30, 256).unwrap();
    let most = SimAddressSpace::MAX_RESERVED_GRANULES * 256;
    let refused = |requested, largest_free| Error::OutOfMemory {
        requested,
        largest_free,
        pool_size: SimAddressSpace::DEFAULT_SPAN,
        max_size: Some(most),
    };
    assert_eq!(space.reserve(most + 256), Err(refused(most + 256, most)));
    assert_eq!(
        space.reserve(SimAddressSpace::DEFAULT_SPAN),
        Err(refused(SimAddressSpace::DEFAULT_SPAN, most))
    );
    // Counted over every reservation of the space.
    let r = space.reserve(256).unwrap();
    assert_eq!(space.reserve(most), Err(refused(most, most - 256)));
    assert_eq!(space.reserved_bytes(), 256);
    space.release(r).unwrap();
    // With large granules the bound lies beyond the span.
    let space = SimAddressSpace::new(1 << 30, 2 * MIB).unwrap();
    assert_eq!(space.reserve(SimAddressSpace::DEFAULT_SPAN).unwrap().len(), SimAddressSpace::DEFAULT_SPAN);
}

#[test]
fn a_reservation_longer_than_any_range_the_space_hands_out_is_out_of_memory() {
    // With a span past 2^62 and large granules, a reservation longer than
    // the index's largest range passed the checks and was refused by the
    // index as an invalid size: the trait asks `OutOfMemory` of a length
    // that is a multiple of the granule.
    let g = SimAddressSpace::MAX_GRANULE;
    let space = SimAddressSpace::with_span(1 << 30, g, u64::MAX).unwrap();
    let most = Request::MAX_SIZE;
    for len in [most + g, 1 << 63, space.span()] {
        let refused = Error::OutOfMemory {
            requested: len,
            largest_free: most,
            pool_size: space.span(),
            max_size: Some(most),
        };
        assert_eq!(space.reserve(len), Err(refused));
    }
    let r = space.reserve(most).unwrap();
    assert_eq!((r.len(), space.reserved_bytes()), (most, most));
    space.release(r).unwrap();
}

#[test]
fn misuse_is_an_error_and_counts_stay_exact() {
    let space = SimAddressSpace::new(8 * MIB, 2 * MIB).unwrap();
    let r = space.reserve(16 * MIB).unwrap();
    let g = |i: u64, n: u64| range(r.start() + i * 2 * MIB, n * 2 * MIB);
    space.commit(g(0, 2)).unwrap();
    assert!(matches!(space.commit(g(1, 2)), Err(Error::InvalidConfig { .. })), "partly committed");
    assert!(matches!(space.decommit(g(1, 2), &()), Err(Error::InvalidConfig { .. })), "partly uncommitted");
    assert!(matches!(space.commit(range(r.start() + 256, 2 * MIB)), Err(Error::InvalidConfig { .. })));
    assert!(matches!(space.commit(range(r.end(), 2 * MIB)), Err(Error::InvalidConfig { .. })));
    assert!(matches!(space.release(r), Err(Error::InvalidConfig { .. })), "memory still committed");
    // Physical memory: 8 MiB.
    assert!(space.commit(g(2, 3)).unwrap_err().is_out_of_memory());
    space.fail_nth_commit(1);
    assert!(matches!(space.commit(g(2, 1)), Err(Error::Backend { .. })));
    space.commit(g(2, 2)).unwrap();
    assert_eq!((space.committed_bytes(), space.peak_committed_bytes()), (8 * MIB, 8 * MIB));
    assert!(space.is_committed(g(0, 4)) && !space.is_committed(g(0, 5)));
    space.fail_nth_decommit(1);
    assert!(matches!(space.decommit(g(0, 4), &()), Err(Error::Backend { .. })));
    assert_eq!(space.committed_bytes(), 8 * MIB);
    space.decommit(g(0, 4), &()).unwrap();
    assert_eq!((space.committed_bytes(), space.call_counts()), (0, (2, 1)));
    space.release(r).unwrap();
}

#[test]
fn decommits_are_ordered_on_the_stream_of_the_free() {
    let space = SimAddressSpace::new(1 << 30, 2 * MIB).unwrap();
    let mut pool = VirtualPool::with_config(&space, VirtualConfig::new(64 * MIB)).unwrap();
    let (s1, s2) = (TestStream::new(7), TestStream::new(7));
    let a = pool.allocate(Request::new(3 * MIB).unwrap(), &s1).unwrap();
    let b = pool.allocate(Request::new(1000).unwrap(), &s1).unwrap();
    assert_eq!(s1.faults().syncs(), 0, "commits need no stream order");
    pool.deallocate(a, &s2).unwrap();
    assert_eq!((s1.faults().syncs(), s2.faults().syncs()), (0, 1));
    pool.deallocate(b, &s1).unwrap();
    assert_eq!((s1.faults().syncs(), s2.faults().syncs()), (1, 1));
    assert_eq!(space.committed_bytes(), 0);
}

#[test]
fn a_decommit_refused_for_misuse_synchronizes_nothing() {
    // The stream was synchronized before the range was looked at, so a
    // refused decommit took the stream's work as done (observed, on a
    // simulated stream): the CUDA space looks first and synchronizes only
    // to unmap, so on a GPU that work may still run.
    let space = SimAddressSpace::new(1 << 30, 2 * MIB).unwrap();
    let r = space.reserve(8 * MIB).unwrap();
    let g = |i: u64, n: u64| range(r.start() + i * 2 * MIB, n * 2 * MIB);
    space.commit(g(0, 2)).unwrap();
    let s = TestStream::new(7);
    for bad in
        [g(1, 2), g(2, 1), range(r.start() + 256, 2 * MIB), range(r.end(), 2 * MIB), range(r.start(), 0)]
    {
        assert!(matches!(space.decommit(bad, &s), Err(Error::InvalidConfig { .. })), "{bad:?}");
    }
    assert_eq!((s.faults().syncs(), space.committed_bytes()), (0, 4 * MIB));
    space.decommit(g(0, 2), &s).unwrap();
    assert_eq!((s.faults().syncs(), space.committed_bytes()), (1, 0));
}

#[test]
fn a_failed_decommit_keeps_the_memory_counted_and_is_retried() {
    let space = SimAddressSpace::new(1 << 30, 2 * MIB).unwrap();
    let mut pool =
        VirtualPool::with_config(&space, VirtualConfig::new(64 * MIB).release_threshold(2 * MIB)).unwrap();
    let a = pool.allocate(Request::new(8 * MIB).unwrap(), &()).unwrap();
    space.fail_nth_decommit(1);
    // The free succeeds; the decommit of the granules beyond `keep` fails.
    pool.deallocate(a, &()).unwrap();
    assert_eq!((pool.idle_bytes(), pool.usage().held, space.committed_bytes()), (8 * MIB, 8 * MIB, 8 * MIB));
    pool.check().unwrap();
    // The next free trims.
    let b = pool.allocate(Request::new(256).unwrap(), &()).unwrap();
    pool.deallocate(b, &()).unwrap();
    assert_eq!((pool.idle_bytes(), space.committed_bytes()), (2 * MIB, 2 * MIB));
    pool.check().unwrap();
    space.fail_nth_decommit(1);
    assert!(pool.trim(&()).is_err());
    assert_eq!(space.committed_bytes(), 2 * MIB);
    pool.check().unwrap();
    assert_eq!(pool.trim(&()), Ok(2 * MIB));
    assert_eq!(space.committed_bytes(), 0);
}

#[test]
fn randomized_pool_over_the_sim_space_from_threads() {
    let space = SimAddressSpace::new(1 << 34, 2 * MIB).unwrap();
    let config = VirtualConfig::new(1 << 30).release_threshold(8 * MIB).max_reservations(2);
    let pool = Shared::new(VirtualPool::with_config(&space, config).unwrap());
    std::thread::scope(|scope| {
        for t in 0..2u64 {
            let pool = &pool;
            let space = &space;
            scope.spawn(move || {
                let mut rng = SplitMix64::new(t + 10);
                let mut live = LiveBlocks::new();
                let mut blocks: Vec<Block> = Vec::new();
                for step in 0..20_000 {
                    if blocks.is_empty() || rng.below(100) < 52 {
                        let size = if rng.below(8) == 0 { rng.below(12 * MIB) } else { rng.below(64 << 10) };
                        let req = Request::new(size).unwrap();
                        let b = pool.allocate(req, &()).unwrap();
                        live.insert(b, req).unwrap_or_else(|v| panic!("step {step}: {v}"));
                        if !b.is_empty() {
                            let r = b.range();
                            let g = Range::from_bounds(r.start() & !(2 * MIB - 1), r.end()).unwrap();
                            assert!(space.is_committed(g), "step {step}: block over unmapped memory");
                            blocks.push(b);
                        }
                    } else {
                        let b = blocks.swap_remove(rng.below(blocks.len() as u64) as usize);
                        pool.deallocate(b, &()).unwrap();
                        live.remove(&b).unwrap();
                    }
                    if step % 64 == 0 {
                        pool.with(|p| p.check()).unwrap_or_else(|v| panic!("step {step}: {v}"));
                    }
                }
                for b in blocks {
                    pool.deallocate(b, &()).unwrap();
                }
            });
        }
    });
    pool.with(|p| {
        p.check().unwrap();
        assert_eq!(p.usage().used, 0);
        assert_eq!(p.usage().held, space.committed_bytes());
        assert!(p.idle_bytes() <= 8 * MIB);
    });
}

#[test]
fn pieces_of_no_granule_or_chosen_after_a_commit_are_refused() {
    // Both panicked.
    let e = SimAddressSpace::new(1 << 30, MIB).unwrap().with_pieces(0).unwrap_err();
    assert_eq!(e, Error::InvalidConfig { what: "a piece holds at least one granule" });
    let space = SimAddressSpace::new(1 << 30, MIB).unwrap();
    let r = space.reserve(4 * MIB).unwrap();
    space.commit(range(r.start(), MIB)).unwrap();
    let e = space.with_pieces(4).unwrap_err();
    assert_eq!(e, Error::InvalidConfig { what: "pieces are chosen before anything is committed" });
}

#[test]
fn with_pieces_only_whole_pieces_go_back() {
    let space = SimAddressSpace::new(1 << 30, MIB).unwrap().with_pieces(4).unwrap();
    let r = space.reserve(16 * MIB).unwrap();
    // Pieces of 4 and 2 granules.
    space.commit(range(r.start(), 6 * MIB)).unwrap();
    // Part of the first piece: refused, counted, nothing changes.
    let tail = range(r.start() + 2 * MIB, 4 * MIB);
    assert!(matches!(space.decommit(tail, &()), Err(Error::InvalidConfig { .. })));
    assert_eq!((space.committed_bytes(), space.partial_decommits()), (6 * MIB, 1));
    assert_eq!(space.releasable(tail, MIB), Some(range(r.start() + 4 * MIB, 2 * MIB)));
    space.decommit(range(r.start() + 4 * MIB, 2 * MIB), &()).unwrap();
    assert_eq!(space.releasable(tail, MIB), None);
    space.decommit(range(r.start(), 4 * MIB), &()).unwrap();
    assert_eq!((space.committed_bytes(), space.partial_decommits()), (0, 1));
    // Without pieces any granule goes back alone.
    let plain = SimAddressSpace::new(1 << 30, MIB).unwrap();
    assert_eq!(plain.releasable(tail, MIB), Some(range(tail.end() - MIB, MIB)));
}
