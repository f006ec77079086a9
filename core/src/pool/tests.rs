extern crate std;

use super::*;
use crate::check::LiveBlocks;
use crate::testing::{BumpUpstream, SplitMix64};
use alloc::vec::Vec;

fn pool(config: PoolConfig) -> CoalescingPool<BumpUpstream> {
    CoalescingPool::with_config(BumpUpstream::new(1 << 40), config, &()).unwrap()
}

/// Random allocate/free with random sizes and alignments; the pool's checker
/// and the caller's view checked after every step.
pub(super) fn randomized(config: PoolConfig, ops: usize, seed: u64) {
    let mut p = pool(config);
    let mut rng = SplitMix64::new(seed);
    let mut live = LiveBlocks::new();
    let mut blocks: Vec<Block> = Vec::new();
    for step in 0..crate::testing::steps(ops) {
        if blocks.is_empty() || rng.below(100) < 55 {
            let size = match rng.below(4) {
                0 => rng.below(512),
                1 => rng.below(64 << 10),
                2 => rng.below(4 << 20),
                _ => 1 << rng.below(22),
            };
            let align = if rng.below(8) == 0 { 256 << rng.below(8) } else { 256 };
            let req = Request::aligned(size, align).unwrap();
            let b = p.allocate(req, &()).unwrap();
            live.insert(b, req).unwrap_or_else(|v| panic!("step {step}: {v}"));
            if !b.is_empty() {
                blocks.push(b);
            }
        } else {
            let i = rng.below(blocks.len() as u64) as usize;
            let b = blocks.swap_remove(i);
            // Every fourth free goes through the address-only path.
            let b = if rng.below(4) == 0 { Block::from_addr(b.addr(), b.size()) } else { b };
            p.deallocate(b, &()).unwrap();
            live.remove(&b).unwrap();
        }
        if let Err(v) = p.check() {
            panic!("step {step}: {v}");
        }
        if rng.below(5000) == 0 {
            p.release(&()).unwrap();
            p.check().unwrap();
        }
    }
    for b in blocks.drain(..) {
        p.deallocate(b, &()).unwrap();
    }
    p.check().unwrap();
    assert_eq!(p.usage().used, 0);
    p.release(&()).unwrap();
    assert_eq!(p.usage().held, 0);
    assert_eq!(p.upstream().usage().held, 0);
}

#[test]
fn randomized_default_growth() {
    randomized(PoolConfig::new(), 100_000, 1);
}

#[test]
fn randomized_doubling_with_initial() {
    randomized(PoolConfig::new().initial_size(1 << 20).growth(Growth::Double), 100_000, 2);
}

#[test]
fn randomized_without_release_on_grow() {
    randomized(PoolConfig::new().release_on_grow(false), 30_000, 3);
}

#[test]
fn zero_byte_request_is_empty_and_free_is_noop() {
    let mut p = pool(PoolConfig::new());
    let b = p.allocate(Request::new(0).unwrap(), &()).unwrap();
    assert!(b.is_empty());
    assert_eq!(p.usage().held, 0, "no memory taken for zero bytes");
    p.deallocate(b, &()).unwrap();
    p.check().unwrap();
}

#[test]
fn huge_size_is_an_error_without_overflow() {
    assert!(matches!(Request::new(u64::MAX), Err(Error::InvalidSize { .. })));
    assert!(matches!(Request::aligned(u64::MAX - 255, 512), Err(Error::InvalidSize { .. })));
    // The largest valid request fails cleanly as out of memory.
    let mut p = CoalescingPool::new(BumpUpstream::new(1 << 30));
    let e = p.allocate(Request::new(Request::MAX_SIZE).unwrap(), &()).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { requested, .. } if requested == Request::MAX_SIZE));
    p.check().unwrap();
    let b = p.allocate(Request::new(4096).unwrap(), &()).unwrap();
    p.deallocate(b, &()).unwrap();
}

#[test]
fn alignment_not_power_of_two_is_an_error() {
    assert!(matches!(Request::aligned(64, 384), Err(Error::InvalidAlignment { align: 384 })));
    assert!(matches!(Request::aligned(64, 0), Err(Error::InvalidAlignment { align: 0 })));
}

#[test]
fn large_alignments_are_honoured() {
    let mut p = pool(PoolConfig::new());
    let mut live = LiveBlocks::new();
    let mut v = Vec::new();
    for shift in 8..=24 {
        let req = Request::aligned(1000, 1 << shift).unwrap();
        let b = p.allocate(req, &()).unwrap();
        live.insert(b, req).unwrap();
        v.push(b);
        p.check().unwrap();
    }
    for b in v {
        p.deallocate(b, &()).unwrap();
        p.check().unwrap();
    }
}

#[test]
fn bad_frees_are_errors_and_change_nothing() {
    let mut p = pool(PoolConfig::new());
    let a = p.allocate(Request::new(1000).unwrap(), &()).unwrap();
    let b = p.allocate(Request::new(3000).unwrap(), &()).unwrap();
    let used = p.usage().used;
    // An address never handed out, inside and outside the pool.
    assert!(matches!(p.deallocate(Block::from_addr(3, 10), &()), Err(Error::UnknownBlock { addr: 3 })));
    assert!(matches!(
        p.deallocate(Block::from_addr(a.addr() + 256, 10), &()),
        Err(Error::UnknownBlock { .. })
    ));
    // Wrong size.
    let wrong = Block::new(a.addr(), 5000, a.tag());
    assert!(matches!(p.deallocate(wrong, &()), Err(Error::SizeMismatch { expected: 1000, given: 5000, .. })));
    // A size that rounds as the allocation's did is wrong too: adaptors
    // above count off the size a free states.
    let wrong = Block::new(a.addr(), 1024, a.tag());
    assert!(matches!(p.deallocate(wrong, &()), Err(Error::SizeMismatch { expected: 1000, given: 1024, .. })));
    let wrong = Block::from_addr(a.addr(), 5000);
    assert!(matches!(p.deallocate(wrong, &()), Err(Error::SizeMismatch { .. })));
    // A size whose rounding overflows (it panicked in the index's free), by
    // tag and by address, of a small block and of a large one.
    let big = p.allocate(Request::new(64 << 20).unwrap(), &()).unwrap();
    let with_big = p.usage().used;
    for x in [a, big] {
        for tag in [x.tag(), Block::NO_TAG] {
            let wrong = Block::new(x.addr(), u64::MAX, tag);
            assert!(
                matches!(p.deallocate(wrong, &()), Err(Error::SizeMismatch { given: u64::MAX, .. })),
                "{wrong:?}"
            );
        }
    }
    assert_eq!(p.usage().used, with_big);
    p.check().unwrap();
    p.deallocate(big, &()).unwrap();
    assert_eq!(p.usage().used, used);
    p.check().unwrap();
    // Double free, with the tag and by address, also after the memory was reused.
    p.deallocate(a, &()).unwrap();
    assert!(matches!(p.deallocate(a, &()), Err(Error::DoubleFree { .. })));
    assert!(matches!(p.deallocate(Block::from_addr(a.addr(), 1000), &()), Err(Error::DoubleFree { .. })));
    let c = p.allocate(Request::new(1000).unwrap(), &()).unwrap();
    assert_eq!(c.addr(), a.addr(), "best fit reuses the hole");
    assert!(matches!(p.deallocate(a, &()), Err(Error::DoubleFree { .. })), "stale tag of a reused address");
    p.check().unwrap();
    p.deallocate(c, &()).unwrap();
    p.deallocate(b, &()).unwrap();
    p.check().unwrap();
    assert_eq!(p.usage().used, 0);
}

/// A tag 2^32 allocations old: before, the generation wrapped and its free
/// freed the block of the node's next owner.
#[test]
fn a_stale_tag_after_the_generations_run_out_is_a_double_free() {
    let mut p = pool(PoolConfig::new());
    let r = Request::new(1000).unwrap();
    let a = p.allocate(r, &()).unwrap();
    p.deallocate(a, &()).unwrap();
    // As after 2^32 - 2 more allocations of the chunk's first node.
    p.index.shared.set_generation(a.tag() as u32, u32::MAX - 1);
    for _ in 0..2 {
        let b = p.allocate(r, &()).unwrap();
        p.deallocate(b, &()).unwrap();
        p.check().unwrap();
    }
    let c = p.allocate(r, &()).unwrap();
    assert_eq!(c.addr(), a.addr());
    assert_eq!(p.deallocate(a, &()), Err(Error::DoubleFree { addr: a.addr() }));
    assert_eq!(p.usage().used, 1024);
    p.check().unwrap();
    p.deallocate(c, &()).unwrap();
    // The chunk, whose first node moved, still goes back whole.
    let held = p.usage().held;
    assert_eq!(p.release(&()).unwrap(), held);
    assert_eq!(p.upstream().usage().held, 0);
    p.check().unwrap();
}

#[test]
fn upstream_failure_while_growing_is_reported_and_pool_stays_usable() {
    let up = BumpUpstream::new(1 << 30);
    let mut p = CoalescingPool::new(up);
    let a = p.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    let held = p.usage().held;
    p.upstream().fail_after(0);
    let e = p.allocate(Request::new(64 << 20).unwrap(), &()).unwrap_err();
    assert!(matches!(e, Error::Backend { .. }), "{e:?}");
    assert_eq!(p.usage().held, held);
    p.check().unwrap();
    // Memory already held still serves.
    let b = p.allocate(Request::new(4096).unwrap(), &()).unwrap();
    p.upstream().fail_after(u64::MAX);
    let c = p.allocate(Request::new(64 << 20).unwrap(), &()).unwrap();
    for x in [a, b, c] {
        p.deallocate(x, &()).unwrap();
    }
    p.check().unwrap();
}

#[test]
fn a_growth_the_upstream_cannot_serve_leaves_the_pool_holding_what_it_held() {
    // The default gives wholly free chunks back before it grows: a request
    // no upstream could serve emptied the pool, and its error said so.
    let mut p =
        CoalescingPool::with_config(BumpUpstream::new(1 << 30), PoolConfig::new().initial_size(4 << 20), &())
            .unwrap();
    let held = p.usage().held;
    let e = p.allocate(Request::new(1 << 40).unwrap(), &()).unwrap_err();
    assert!(
        matches!(e, Error::OutOfMemory { requested: 1099511627776, pool_size, .. } if pool_size == held),
        "{e:?}"
    );
    assert_eq!((p.usage().held, p.upstream().usage().held), (held, held));
    p.check().unwrap();
    // It serves from what it holds, with no upstream call.
    let a = p.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    assert_eq!(p.upstream().usage().held, held);
    p.deallocate(a, &()).unwrap();
    p.check().unwrap();
}

/// A large request the upstream cannot serve gives the free chunks back
/// and takes their bytes again: in their own class, so the chunk of the
/// blocks below the large threshold still serves them (it came back as a
/// large chunk, and the next small request went upstream).
#[test]
fn a_failed_large_growth_takes_its_chunks_back_in_their_class() {
    let config = PoolConfig::compact().initial_size(32 << 20);
    let mut p = CoalescingPool::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    let a = p.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    p.deallocate(a, &()).unwrap();
    let held = p.usage().held;
    p.allocate(Request::new(1 << 40).unwrap(), &()).unwrap_err();
    assert_eq!(p.usage().held, held);
    assert_eq!((p.index().free_bytes(), p.large_index().free_bytes()), (held, 0));
    p.check().unwrap();
    let b = p.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    assert_eq!(p.usage().held, held);
    p.deallocate(b, &()).unwrap();
    p.check().unwrap();
}

/// The other way round: a small request the upstream cannot serve (its
/// alignment) leaves a large block's free chunk in the large class.
#[test]
fn a_failed_small_growth_takes_a_large_chunk_back_in_its_class() {
    let mut p = CoalescingPool::with_config(BumpUpstream::new(1 << 30), PoolConfig::compact(), &()).unwrap();
    let a = p.allocate(Request::new(32 << 20).unwrap(), &()).unwrap();
    p.deallocate(a, &()).unwrap();
    let held = p.usage().held;
    p.allocate(Request::aligned(1 << 20, 1 << 40).unwrap(), &()).unwrap_err();
    assert_eq!(p.usage().held, held);
    assert_eq!((p.index().free_bytes(), p.large_index().free_bytes()), (0, held));
    p.check().unwrap();
    let b = p.allocate(Request::new(32 << 20).unwrap(), &()).unwrap();
    assert_eq!(p.usage().held, held);
    p.deallocate(b, &()).unwrap();
    p.check().unwrap();
}

/// Chunks of both classes given back by one failed growth come back, each
/// class's bytes as a chunk of that class.
#[test]
fn a_failed_growth_takes_back_the_chunks_of_both_classes_each_in_its_own() {
    let mut p = CoalescingPool::with_config(BumpUpstream::new(1 << 30), PoolConfig::compact(), &()).unwrap();
    let a = p.allocate(Request::new(32 << 20).unwrap(), &()).unwrap();
    let b = p.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    for x in [a, b] {
        p.deallocate(x, &()).unwrap();
    }
    let (shared, large) = (p.index().free_bytes(), p.large_index().free_bytes());
    assert!(shared > 0 && large > 0);
    p.allocate(Request::new(1 << 40).unwrap(), &()).unwrap_err();
    assert_eq!((p.index().free_bytes(), p.large_index().free_bytes()), (shared, large));
    assert_eq!(p.usage().held, shared + large);
    p.check().unwrap();
}

#[test]
fn upstream_out_of_memory_halves_then_reports_figures() {
    // Upstream of 40 MiB: doubling wants more, halving finds what fits.
    let mut p = CoalescingPool::with_config(
        BumpUpstream::new(40 << 20),
        PoolConfig::new().growth(Growth::Double),
        &(),
    )
    .unwrap();
    let a = p.allocate(Request::new(16 << 20).unwrap(), &()).unwrap();
    let b = p.allocate(Request::new(16 << 20).unwrap(), &()).unwrap();
    let e = p.allocate(Request::new(16 << 20).unwrap(), &()).unwrap_err();
    match e {
        Error::OutOfMemory { requested, pool_size, max_size, .. } => {
            assert_eq!((requested, pool_size, max_size), (16 << 20, 32 << 20, None));
        }
        e => panic!("{e:?}"),
    }
    p.check().unwrap();
    p.deallocate(a, &()).unwrap();
    p.deallocate(b, &()).unwrap();
}

#[test]
fn request_above_maximum_is_out_of_memory() {
    let mut p = pool(PoolConfig::new().maximum_size(8 << 20));
    let e = p.allocate(Request::new(9 << 20).unwrap(), &()).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { max_size: Some(m), .. } if m == 8 << 20));
    let mut v = Vec::new();
    while let Ok(b) = p.allocate(Request::new(1 << 20).unwrap(), &()) {
        v.push(b);
        assert!(p.usage().held <= 8 << 20);
    }
    assert_eq!(v.len(), 8);
    p.check().unwrap();
    for b in v {
        p.deallocate(b, &()).unwrap();
    }
}

#[test]
fn invalid_configs_are_rejected() {
    let up = || BumpUpstream::new(1 << 30);
    for c in [
        PoolConfig::new().initial_size(100),
        PoolConfig::new().maximum_size(1000),
        PoolConfig::new().initial_size(1 << 20).maximum_size(1 << 10),
        PoolConfig::new().growth(Growth::Fraction { divisor: 0, granule: 256 }),
        PoolConfig::new().growth(Growth::Exact { granule: 3000 }),
        PoolConfig::new().growth(Growth::Exact { granule: 128 }),
        PoolConfig::new().growth(Growth::Exact { granule: 1 << 63 }),
        PoolConfig::new().growth(Growth::Steps { minimum: 1 << 20, divisor: 0, step: 1 << 20 }),
        PoolConfig::new().growth(Growth::Steps { minimum: 1 << 20, divisor: 8, step: 0 }),
        PoolConfig::new().growth(Growth::Steps { minimum: 1 << 20, divisor: 8, step: 1000 }),
        PoolConfig::new().growth(Growth::Steps { minimum: 1000, divisor: 8, step: 1 << 20 }),
        PoolConfig::new().growth(Growth::Steps { minimum: !255, divisor: 8, step: 1 << 20 }),
        PoolConfig::new().growth(Growth::Steps { minimum: 1 << 20, divisor: 8, step: 1 << 63 }),
    ] {
        assert!(
            matches!(CoalescingPool::with_config(up(), c, &()), Err(Error::InvalidConfig { .. })),
            "{c:?}"
        );
    }
}

/// A configuration under which no request could ever be served (every
/// growth would ask the upstream for more than a request may hold) is
/// refused when the pool is made, with nothing taken from upstream.
#[test]
fn configs_no_request_could_use_are_refused() {
    let up = BumpUpstream::new(1 << 40);
    let above = (Request::MAX_SIZE + 256).next_power_of_two();
    for c in [
        PoolConfig::new().growth(Growth::Fraction { divisor: 8, granule: above }),
        PoolConfig::new().initial_size(Request::MAX_SIZE + 256),
    ] {
        let r = CoalescingPool::with_config(&up, c, &());
        assert!(matches!(r, Err(Error::InvalidConfig { .. })), "{c:?}: {:?}", r.map(|_| ()));
        assert_eq!(up.usage().held, 0);
    }
    // The largest granule that a request can hold still serves.
    let c = PoolConfig::new().growth(Growth::Fraction { divisor: 8, granule: Request::MAX_SIZE });
    let mut p = CoalescingPool::with_config(BumpUpstream::new(u64::MAX), c, &()).unwrap();
    let b = p.allocate(Request::new(1000).unwrap(), &()).unwrap();
    p.deallocate(b, &()).unwrap();
}

/// Growth in steps, as the arena's, serves a pool too: at least the
/// minimum, in whole steps, and a request larger than both exactly.
#[test]
fn growth_in_steps_takes_whole_steps_from_the_minimum() {
    let up = BumpUpstream::new(1 << 40);
    let c = PoolConfig::new().growth(Growth::Steps { minimum: 3 << 20, divisor: 8, step: 2 << 20 });
    let mut p = CoalescingPool::with_config(&up, c, &()).unwrap();
    let a = p.allocate(Request::new(1000).unwrap(), &()).unwrap();
    assert_eq!(up.usage().held, 4 << 20, "the 3 MiB minimum in 2 MiB steps");
    let b = p.allocate(Request::new(9 << 20).unwrap(), &()).unwrap();
    assert_eq!(up.usage().held, (4 << 20) + (9 << 20), "a larger request exactly");
    p.deallocate(a, &()).unwrap();
    p.deallocate(b, &()).unwrap();
    p.check().unwrap();
}

#[test]
fn chunks_never_coalesce_and_release_returns_free_chunks() {
    let mut p = pool(PoolConfig::new().growth(Growth::Fraction { divisor: 1 << 30, granule: 256 }));
    let a = p.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    let b = p.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    assert_eq!(p.chunk_count(), 2);
    p.deallocate(a, &()).unwrap();
    p.deallocate(b, &()).unwrap();
    p.check().unwrap();
    assert_eq!(p.usage().largest_free, 1 << 20, "two chunks stay two free ranges");
    assert_eq!(p.release(&()).unwrap(), 2 << 20);
    assert_eq!((p.usage().held, p.upstream().usage().held), (0, 0));
}

#[test]
fn a_chunk_the_upstream_refuses_stays_and_the_others_go_back() {
    let up = BumpUpstream::new(1 << 40);
    let config = PoolConfig::new().growth(Growth::Fraction { divisor: 1 << 30, granule: 256 });
    let mut p = CoalescingPool::with_config(up, config, &()).unwrap();
    let blocks: Vec<Block> =
        (0..3).map(|_| p.allocate(Request::new(1 << 20).unwrap(), &()).unwrap()).collect();
    assert_eq!(p.chunk_count(), 3);
    for &b in &blocks {
        p.deallocate(b, &()).unwrap();
    }
    // The first chunk is refused; the two after it still go back.
    p.upstream().refuse_free_at(blocks[0].addr());
    assert!(matches!(p.release(&()), Err(Error::Backend { code: -2, .. })));
    p.check().unwrap();
    assert_eq!((p.chunk_count(), p.usage().held, p.upstream().usage().held), (1, 1 << 20, 1 << 20));
    let again = p.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    assert_eq!(again.addr(), blocks[0].addr(), "the refused chunk serves as before");
    p.deallocate(again, &()).unwrap();
    p.upstream().refuse_free_at(0);
    assert_eq!(p.release(&()).unwrap(), 1 << 20);
    assert_eq!(p.upstream().usage().held, 0);
}

/// A refused give-back before growing leaves that chunk in the pool and
/// the growth going on: the allocation still succeeds where the upstream
/// has room, and fails with the refusal (not out of memory) where it has
/// none.
#[test]
fn a_chunk_refused_before_growing_stays_and_the_pool_grows_all_the_same() {
    const MIB: u64 = 1 << 20;
    let up = BumpUpstream::new(4 * MIB);
    let exact = PoolConfig::new().growth(Growth::Exact { granule: 256 });
    let mut p = CoalescingPool::with_config(up, exact, &()).unwrap();
    let a = p.allocate(Request::new(MIB).unwrap(), &()).unwrap();
    p.deallocate(a, &()).unwrap();
    p.upstream().refuse_free_at(a.addr());
    // The default gives every free chunk back before growing: `a`'s is refused.
    let b = p.allocate(Request::new(2 * MIB).unwrap(), &()).unwrap();
    p.check().unwrap();
    assert_eq!((p.chunk_count(), p.usage().held, p.upstream().usage().held), (2, 3 * MIB, 3 * MIB));
    // No room left upstream for 2 MiB more: the refusal is what went wrong.
    assert!(matches!(p.allocate(Request::new(2 * MIB).unwrap(), &()), Err(Error::Backend { code: -2, .. })));
    p.check().unwrap();
    assert_eq!((p.chunk_count(), p.usage().held, p.usage().used), (2, 3 * MIB, 2 * MIB));
    // Once the upstream takes it back, the same request fits in its room.
    p.upstream().refuse_free_at(0);
    let c = p.allocate(Request::new(2 * MIB).unwrap(), &()).unwrap();
    p.deallocate(b, &()).unwrap();
    p.deallocate(c, &()).unwrap();
    assert_eq!(p.release(&()).unwrap(), 4 * MIB);
    assert_eq!(p.upstream().usage().held, 0);
}

/// A growth no upstream can serve, after a give-back the upstream refused
/// in part, takes back what did go back: the pool holds what it held.
#[test]
fn a_failed_growth_takes_back_what_went_back_beside_a_refused_chunk() {
    const MIB: u64 = 1 << 20;
    let up = BumpUpstream::new(1 << 30);
    let exact = PoolConfig::new().growth(Growth::Exact { granule: 256 });
    let mut p = CoalescingPool::with_config(up, exact, &()).unwrap();
    let a = p.allocate(Request::new(MIB).unwrap(), &()).unwrap();
    let b = p.allocate(Request::new(2 * MIB).unwrap(), &()).unwrap();
    p.deallocate(a, &()).unwrap();
    p.deallocate(b, &()).unwrap();
    p.upstream().refuse_free_at(a.addr());
    // `a`'s chunk is refused, `b`'s goes back, and the growth fails.
    let e = p.allocate(Request::new(1 << 40).unwrap(), &()).unwrap_err();
    assert!(matches!(e, Error::Backend { code: -2, .. }), "{e:?}");
    p.check().unwrap();
    assert_eq!((p.chunk_count(), p.usage().held, p.upstream().usage().held), (2, 3 * MIB, 3 * MIB));
    // It serves 2 MiB from what it holds, with no upstream call.
    let c = p.allocate(Request::new(2 * MIB).unwrap(), &()).unwrap();
    assert_eq!(p.upstream().usage().held, 3 * MIB);
    p.deallocate(c, &()).unwrap();
    p.upstream().refuse_free_at(0);
    assert_eq!(p.release(&()).unwrap(), 3 * MIB);
}

/// Keeping free chunks under the peak gives back the largest first; one
/// the upstream refuses stays, and the next largest go back in its place.
#[test]
fn a_largest_chunk_refused_under_the_peak_lets_the_next_largest_go_back() {
    const MIB: u64 = 1 << 20;
    let up = BumpUpstream::new(1 << 40);
    let config = PoolConfig::new().growth(Growth::Exact { granule: 256 }).keep_under_peak(true);
    let mut p = CoalescingPool::with_config(up, config, &()).unwrap();
    let blocks: Vec<Block> =
        [4 * MIB, 2 * MIB, MIB].iter().map(|&n| p.allocate(Request::new(n).unwrap(), &()).unwrap()).collect();
    for &b in &blocks {
        p.deallocate(b, &()).unwrap();
    }
    // 5 MiB under a peak of 7 MiB leaves room for 2 MiB of free chunks:
    // the 4 MiB chunk (refused), then the 2 MiB and the 1 MiB go back.
    p.upstream().refuse_free_at(blocks[0].addr());
    let d = p.allocate(Request::new(5 * MIB).unwrap(), &()).unwrap();
    p.check().unwrap();
    let held: Vec<u64> = p.chunk_ranges().map(|r| r.len()).collect();
    assert_eq!(held, [4 * MIB, 5 * MIB]);
    assert_eq!(p.upstream().usage().held, 9 * MIB);
    p.deallocate(d, &()).unwrap();
    p.upstream().refuse_free_at(0);
    assert_eq!(p.release(&()).unwrap(), 9 * MIB);
}

#[test]
fn best_fit_in_own_class_reuses_exact_holes() {
    let mut p = pool(PoolConfig::new().initial_size(64 << 20));
    let sizes = [5000u64, 70_000, 300_000, 5000, 70_000];
    let blocks: Vec<_> = sizes.iter().map(|&s| p.allocate(Request::new(s).unwrap(), &()).unwrap()).collect();
    let spacer = p.allocate(Request::new(256).unwrap(), &()).unwrap();
    let hole = blocks[2];
    p.deallocate(hole, &()).unwrap();
    let again = p.allocate(Request::new(300_000).unwrap(), &()).unwrap();
    assert_eq!(again.addr(), hole.addr());
    p.deallocate(again, &()).unwrap();
    p.deallocate(spacer, &()).unwrap();
    for (i, b) in blocks.into_iter().enumerate() {
        if i != 2 {
            p.deallocate(b, &()).unwrap();
        }
    }
    p.check().unwrap();
    assert_eq!(p.usage().largest_free, 64 << 20);
}

/// A chunk of exactly the bytes a request needs (request + worst-case
/// padding) sits in a size class below the one the index searches: the
/// pool must still allocate from it, not report out of memory.
#[test]
fn grows_by_exactly_the_need_and_allocates_from_it() {
    let config = PoolConfig::new().growth(Growth::Fraction { divisor: 8, granule: 256 });
    let mut p = pool(config);
    let req = Request::aligned(3_899_031, 512 << 10).unwrap();
    let b = p.allocate(req, &()).unwrap();
    assert_eq!(p.usage().held, req.rounded_size(256) + req.align() - 256);
    assert_eq!(b.addr() % req.align(), 0);
    p.check().unwrap();
    p.deallocate(b, &()).unwrap();
    assert_eq!(p.usage().used, 0);
}

/// A valid request whose worst-case chunk exceeds `Request::MAX_SIZE` is out
/// of memory, not an invalid size.
#[test]
fn request_near_max_size_with_large_alignment_is_out_of_memory() {
    let mut p = pool(PoolConfig::new());
    let req = Request::aligned(Request::MAX_SIZE - 4096, 1 << 33).unwrap();
    let err = p.allocate(req, &()).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { requested, .. } if requested == req.size()), "{err:?}");
    assert_eq!(p.usage().held, 0);
    p.check().unwrap();
}

#[test]
fn wholly_free_chunks_move_between_pools_over_one_upstream() {
    let up = BumpUpstream::new(1 << 30);
    let config = PoolConfig::new().growth(Growth::Fraction { divisor: 8, granule: 1 << 20 });
    let mut a = CoalescingPool::with_config(&up, config, &()).unwrap();
    let mut b = CoalescingPool::with_config(&up, config, &()).unwrap();
    let x = a.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    let y = a.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    assert!(a.holds(x.addr()) && !b.holds(x.addr()));
    assert_eq!(a.try_allocate(Request::new(256).unwrap()).unwrap(), None, "full, and it does not grow");
    assert_eq!(a.shortest_free_chunk(None), None);
    assert!(a.deallocate_reporting(x).unwrap(), "x's chunk is now wholly free");
    assert_eq!(a.shortest_free_chunk(None), Some(1 << 20));
    assert!(
        a.take_free_chunk(Some(Request::new(2 << 20).unwrap()), ChunkMove::granted()).is_none(),
        "none that long"
    );
    let chunk = a.take_free_chunk(Some(Request::new(1 << 20).unwrap()), ChunkMove::granted()).unwrap();
    assert_eq!(chunk.range().start(), x.addr());
    assert_eq!((a.usage().held, a.chunk_count()), (1 << 20, 1));
    a.check().unwrap();
    b.adopt_chunk(chunk, ChunkMove::granted()).unwrap();
    assert_eq!(b.usage().held, 1 << 20);
    let z = b.try_allocate(Request::new(1 << 20).unwrap()).unwrap().unwrap();
    assert_eq!(z.addr(), x.addr());
    b.check().unwrap();
    // A free that empties a chunk says so; one that does not, not.
    let w = b.allocate(Request::new(1000).unwrap(), &()).unwrap();
    let w2 = b.allocate(Request::new(1000).unwrap(), &()).unwrap();
    assert!(!b.deallocate_reporting(w).unwrap());
    assert!(b.deallocate_reporting(w2).unwrap());
    assert!(b.deallocate_reporting(z).unwrap());
    assert!(a.deallocate_reporting(y).unwrap());
    // A pool at its maximum refuses a chunk and hands it back.
    let mut full = CoalescingPool::with_config(&up, config.maximum_size(1 << 20), &()).unwrap();
    let v = full.allocate(Request::new(1000).unwrap(), &()).unwrap();
    let chunk = b.take_free_chunk(None, ChunkMove::granted()).unwrap();
    let (e, chunk) = full.adopt_chunk(chunk, ChunkMove::granted()).unwrap_err();
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e}");
    b.adopt_chunk(chunk, ChunkMove::granted()).unwrap();
    full.deallocate(v, &()).unwrap();
    for p in [&mut a, &mut b, &mut full] {
        p.release(&()).unwrap();
        p.check().unwrap();
        assert_eq!(p.usage().held, 0);
    }
    assert_eq!(up.usage().held, 0, "every chunk went back upstream once");
}

/// `PoolConfig::default()` was derived and left `release_on_grow` off,
/// while `PoolConfig::new()` (the documented default) turns it on.
#[test]
fn default_config_is_new() {
    assert_eq!(PoolConfig::default(), PoolConfig::new());
    let (mut a, mut b) = (pool(PoolConfig::default()), pool(PoolConfig::new()));
    // A wholly free chunk too small for the next request: given back
    // before growing by both.
    for p in [&mut a, &mut b] {
        let x = p.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
        p.deallocate(x, &()).unwrap();
        let y = p.allocate(Request::new(64 << 20).unwrap(), &()).unwrap();
        p.deallocate(y, &()).unwrap();
    }
    assert_eq!(a.usage(), b.usage());
}

/// An upstream outside the contract: every allocation at one address.
struct OneAddress;

impl MemoryResource for OneAddress {
    fn allocate(&self, request: Request, _: &()) -> Result<Block> {
        Ok(Block::new(1 << 20, request.size(), Block::NO_TAG))
    }
    fn deallocate(&self, _: Block, _: &()) -> Result<()> {
        Ok(())
    }
}

/// A chunk over memory the pool holds already is refused (and given back):
/// carved twice, it handed the same address out to two live blocks.
#[test]
fn a_chunk_over_memory_held_already_is_refused() {
    let c = PoolConfig::new().growth(Growth::Exact { granule: 256 });
    let mut p = CoalescingPool::with_config(OneAddress, c, &()).unwrap();
    let a = p.allocate(Request::new(256).unwrap(), &()).unwrap();
    let e = p.allocate(Request::new(256).unwrap(), &()).unwrap_err();
    let what = "overlapping memory a chunk already holds";
    assert_eq!(e, Error::UpstreamMisbehaved { addr: 1 << 20, size: 256, what }, "the upstream's fault");
    assert_eq!((p.chunk_count(), p.usage().used), (1, 256));
    p.check().unwrap();
    p.deallocate(a, &()).unwrap();
}

/// Without `std` nothing catches the second panic: the process aborts.
#[cfg(feature = "std")]
#[test]
fn a_pool_dropped_while_unwinding_over_a_panicking_upstream_does_not_abort() {
    extern crate std;
    let up = BumpUpstream::new(1 << 30);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // Its free chunk stays while it grows: the drop gives it back.
        let mut pool =
            CoalescingPool::with_config(&up, PoolConfig::new().release_on_grow(false), &()).unwrap();
        let b = pool.allocate(Request::new(1000).unwrap(), &()).unwrap();
        pool.deallocate(b, &()).unwrap();
        up.panic_in("allocate", 0);
        up.panic_in("deallocate", 0);
        // Grows: the upstream panics, and the pool, dropped while the
        // thread unwinds, gives its chunk back to it (which panics again).
        let _ = pool.allocate(Request::new(1 << 30).unwrap(), &());
    }));
    assert!(r.is_err());
    assert!(up.usage().held > 0);
}

/// Resources used through references to their streams (`&S`, as the
/// containers pass theirs) give their chunks back when dropped, as over
/// the streams themselves: `&S` gives the stream type's drop stream.
/// Before, `&S` had none, and the chunks stayed with the upstream for good.
#[test]
fn resources_over_references_to_streams_give_their_chunks_back_when_dropped() {
    use crate::arena::ArenaResource;
    use crate::fixed::FixedSizeResource;
    use crate::planned::Planned;
    use crate::{Inspect, MemoryResource};
    let up = BumpUpstream::new(1 << 30);
    let s: &() = &();
    {
        let mut pool = CoalescingPool::new(&up);
        let b = MemoryResourceMut::<&()>::allocate(&mut pool, Request::new(1000).unwrap(), &s).unwrap();
        MemoryResourceMut::<&()>::deallocate(&mut pool, b, &s).unwrap();
        assert!(up.usage().held > 0);
    }
    assert_eq!(up.usage().held, 0, "the pool");
    {
        let mut fixed = FixedSizeResource::try_new(&up, crate::fixed::FixedConfig::new(4096)).unwrap();
        let b = MemoryResourceMut::<&()>::allocate(&mut fixed, Request::new(4096).unwrap(), &s).unwrap();
        MemoryResourceMut::<&()>::deallocate(&mut fixed, b, &s).unwrap();
    }
    assert_eq!(up.usage().held, 0, "the fixed-size resource");
    {
        let arena = ArenaResource::new(&up);
        let b = MemoryResource::<&()>::allocate(&arena, Request::new(1000).unwrap(), &s).unwrap();
        MemoryResource::<&()>::deallocate(&arena, b, &s).unwrap();
    }
    assert_eq!(up.usage().held, 0, "the arena");
    {
        let planned = Planned::new(&up);
        planned.step(&s).unwrap();
        let b = MemoryResource::<&()>::allocate(&planned, Request::new(1000).unwrap(), &s).unwrap();
        MemoryResource::<&()>::deallocate(&planned, b, &s).unwrap();
        planned.step(&s).unwrap();
    }
    assert_eq!(up.usage().held, 0, "the plan's regions");
}

/// A pool with no maximum over an upstream that has one: the message did
/// say "no maximum", as if nothing bounded the pool; the bound is its
/// upstream's.
#[test]
fn out_of_memory_under_a_bounded_upstream_claims_no_maximum_of_its_own_only() {
    let mut p = CoalescingPool::with_config(BumpUpstream::new(1 << 20), PoolConfig::new(), &()).unwrap();
    let e = p.allocate(Request::new(2 << 20).unwrap(), &()).unwrap_err();
    assert_eq!(
        std::string::ToString::to_string(&e),
        "out of memory: requested 2.00 MiB, largest free block 0 B, pool size 0 B, no maximum of its own"
    );
    p.check().unwrap();
}
