//! The pool's two classes (large blocks in chunks of their own) and giving
//! free chunks back only above the peak in use.

use super::tests::randomized;
use super::*;
use crate::testing::BumpUpstream;

const MIB: u64 = 1 << 20;

fn req(bytes: u64) -> Request {
    Request::new(bytes).unwrap()
}

fn pool() -> CoalescingPool<BumpUpstream> {
    CoalescingPool::with_config(BumpUpstream::new(1 << 40), PoolConfig::compact(), &()).unwrap()
}

#[test]
fn randomized_with_both_classes() {
    // Sizes of the random walk reach 4 MiB: a 1 MiB threshold makes a
    // quarter of them large.
    randomized(PoolConfig::compact().large_threshold(MIB), 100_000, 4);
    randomized(PoolConfig::compact().large_threshold(MIB).release_on_grow(false), 30_000, 5);
}

#[test]
fn large_blocks_get_chunks_of_their_own_that_small_ones_never_share() {
    let mut p = pool();
    let big = p.allocate(req(40 * MIB + 1), &()).unwrap();
    // Exactly its size in the granule: 42 MiB, not 1/32 of anything.
    assert_eq!(p.usage().held, 42 * MIB);
    let small = p.allocate(req(1000), &()).unwrap();
    assert_eq!(p.chunk_count(), 2, "the small block did not go in the large chunk's tail");
    assert!(p.large_index().used_bytes() > 0 && p.index().used_bytes() == 1024);
    assert!(small.addr() < big.addr() || small.addr() >= big.addr() + 42 * MIB);
    // Freed, the large chunk is wholly free however long the small block lives.
    p.deallocate(big, &()).unwrap();
    assert_eq!(p.shortest_free_chunk(None), Some(42 * MIB));
    p.deallocate(small, &()).unwrap();
    p.check().unwrap();
}

#[test]
fn a_large_chunk_serves_a_request_of_about_its_size_only() {
    let mut p = pool();
    let a = p.allocate(req(64 * MIB), &()).unwrap();
    p.deallocate(a, &()).unwrap();
    // Within a quarter and a granule: the same chunk.
    let b = p.allocate(req(52 * MIB), &()).unwrap();
    assert_eq!((b.addr(), p.chunk_count()), (a.addr(), 1));
    p.deallocate(b, &()).unwrap();
    // Far smaller: a chunk of its own (the 64 MiB one, free, stays under
    // the peak in use of 64 MiB + 20 MiB? no: 20 MiB + 64 MiB > 64 MiB, so
    // it goes back first).
    let c = p.allocate(req(20 * MIB), &()).unwrap();
    assert_ne!(c.addr(), a.addr());
    assert_eq!((p.usage().held, p.chunk_count()), (20 * MIB, 1));
    p.deallocate(c, &()).unwrap();
    p.check().unwrap();
}

#[test]
fn free_chunks_go_back_only_when_the_pool_would_pass_its_peak_in_use() {
    let mut p = pool();
    let a = p.allocate(req(32 * MIB), &()).unwrap();
    let b = p.allocate(req(32 * MIB), &()).unwrap();
    p.deallocate(a, &()).unwrap();
    // Peak in use 64 MiB; 32 MiB in use, one 32 MiB chunk free. A 20 MiB
    // request does not take it (it would strand 12 MiB), and 32 + 32 + 20
    // would pass the peak: the free chunk goes back first.
    let c = p.allocate(req(20 * MIB), &()).unwrap();
    assert_eq!((p.usage().held, p.chunk_count()), (52 * MIB, 2));
    assert_eq!(p.usage().peak_held, 64 * MIB);
    p.deallocate(c, &()).unwrap();
    // Now a free 20 MiB chunk and 32 MiB in use: a 4 MiB request (shared
    // class) fits under the peak beside it, so the free chunk stays.
    let d = p.allocate(req(4 * MIB), &()).unwrap();
    assert_eq!((p.usage().held, p.chunk_count()), (56 * MIB, 3));
    // Without giving back, the same calls keep every chunk.
    let mut q = CoalescingPool::with_config(
        BumpUpstream::new(1 << 40),
        PoolConfig::compact().release_on_grow(false),
        &(),
    )
    .unwrap();
    let (a, b2) = (q.allocate(req(32 * MIB), &()).unwrap(), q.allocate(req(32 * MIB), &()).unwrap());
    q.deallocate(a, &()).unwrap();
    let c = q.allocate(req(20 * MIB), &()).unwrap();
    assert_eq!(q.usage().held, 84 * MIB);
    for (pool, blocks) in [(&mut p, [b, d]), (&mut q, [b2, c])] {
        for x in blocks {
            pool.deallocate(x, &()).unwrap();
        }
        pool.check().unwrap();
        pool.release(&()).unwrap();
        assert_eq!(pool.usage().held, 0);
    }
}

/// An upstream of one address: every block starts at 1 GiB (one at a time).
struct OneAddress(core::cell::Cell<bool>);

impl MemoryResource<()> for OneAddress {
    fn allocate(&self, request: Request, _: &()) -> Result<Block> {
        if self.0.replace(true) {
            return Err(Error::OutOfMemory {
                requested: request.size(),
                largest_free: 0,
                pool_size: 0,
                max_size: None,
            });
        }
        Ok(Block::new(1 << 30, request.size(), 0))
    }
    fn deallocate(&self, _: Block, _: &()) -> Result<()> {
        self.0.set(false);
        Ok(())
    }
}

#[test]
fn a_stale_large_tag_at_an_address_reused_by_a_small_block_is_a_double_free() {
    let mut p =
        CoalescingPool::with_config(OneAddress(core::cell::Cell::new(false)), PoolConfig::compact(), &())
            .unwrap();
    let big = p.allocate(req(20 * MIB), &()).unwrap();
    p.deallocate(big, &()).unwrap();
    p.release(&()).unwrap();
    let small = p.allocate(req(2047), &()).unwrap();
    // The same address again; both indexes number their nodes alike, so
    // only the class bit of the tag tells the stale block from the live one.
    assert_eq!(small.addr(), big.addr());
    assert_eq!(p.deallocate(big, &()), Err(Error::DoubleFree { addr: big.addr() }));
    assert_eq!(p.usage().used, 2048);
    p.deallocate(small, &()).unwrap();
    p.check().unwrap();
}

#[test]
fn large_none_turns_the_class_off_and_large_bytes_are_checked() {
    let mut p = CoalescingPool::with_config(
        BumpUpstream::new(1 << 40),
        PoolConfig::compact().large_threshold(u64::MAX),
        &(),
    )
    .unwrap();
    let big = p.allocate(req(40 * MIB + 1), &()).unwrap();
    let small = p.allocate(req(1000), &()).unwrap();
    assert_eq!(p.large_index().used_bytes(), 0);
    assert_eq!(p.chunk_count(), 1, "the small block shares the big one's chunk");
    for b in [big, small] {
        p.deallocate(b, &()).unwrap();
    }
    p.check().unwrap();
}

/// A large request at an alignment whose padding makes its chunk longer
/// than a quarter and a granule above its size, allocated and freed in a
/// loop, is served from the chunk grown for it the first time (before, the
/// chunk was too long for the request: every cycle grew another, until the
/// maximum refused a request that a wholly free chunk held).
#[test]
fn a_freed_large_aligned_chunk_serves_the_same_request_again() {
    let config = PoolConfig::new()
        .large_threshold(16 * MIB)
        .growth(Growth::Fraction { divisor: 8, granule: 2 * MIB })
        .release_on_grow(false)
        .maximum_size(128 * MIB);
    let mut p = CoalescingPool::with_config(BumpUpstream::new(1 << 40), config, &()).unwrap();
    let r = Request::aligned(16 * MIB, 8 * MIB).unwrap();
    for cycle in 0..8 {
        let b = p.allocate(r, &()).unwrap_or_else(|e| panic!("cycle {cycle}: {e:?}; {:?}", p.usage()));
        assert_eq!(b.addr() % (8 * MIB), 0);
        p.deallocate(b, &()).unwrap();
        // The padding's worst case in the granule: 16 + 8 MiB.
        assert_eq!((p.usage().held, p.chunk_count()), (24 * MIB, 1), "cycle {cycle}");
    }
    p.check().unwrap();
}

/// The compact policy gives free chunks back only above the peak in use:
/// the same large aligned request, allocated and freed again, takes the
/// chunk it freed, not a new one from upstream in its place (before, the
/// freed chunk went back and an equal one was taken every time).
#[test]
fn the_compact_pool_reuses_a_freed_large_aligned_chunk() {
    let mut p = pool();
    for r in [Request::aligned(16 * MIB, 8 * MIB).unwrap(), Request::aligned(300 * MIB, 16 * MIB).unwrap()] {
        let first = p.allocate(r, &()).unwrap();
        p.deallocate(first, &()).unwrap();
        let chunks = p.chunk_ranges().collect::<alloc::vec::Vec<_>>();
        let again = p.allocate(r, &()).unwrap();
        assert_eq!(again.addr(), first.addr());
        p.deallocate(again, &()).unwrap();
        assert_eq!(p.chunk_ranges().collect::<alloc::vec::Vec<_>>(), chunks, "{r:?}: a new chunk");
    }
    p.check().unwrap();
}

/// At the maximum a large request takes a free large chunk longer than
/// "about its size" rather than fail: no chunk of its own can be had. It
/// was `OutOfMemory` naming a largest free block that held it.
#[test]
fn at_the_maximum_a_large_request_takes_a_longer_free_large_chunk() {
    let config = PoolConfig::compact().maximum_size(64 * MIB).release_on_grow(false);
    let mut p = CoalescingPool::with_config(BumpUpstream::new(1 << 40), config, &()).unwrap();
    let a = p.allocate(req(40 * MIB), &()).unwrap();
    let b = p.allocate(req(20 * MIB), &()).unwrap();
    p.deallocate(a, &()).unwrap();
    // 60 MiB held: no room for a 20 MiB chunk; the free 40 MiB one holds it.
    let c = p.allocate(req(20 * MIB), &()).unwrap();
    assert_eq!((c.addr(), p.usage().held), (a.addr(), 60 * MIB));
    p.check().unwrap();
    p.deallocate(c, &()).unwrap();
    p.deallocate(b, &()).unwrap();
    p.check().unwrap();
    assert_eq!(p.usage().used, 0);
}

/// At the maximum a request takes any free range that holds it: the class
/// search looks only at the first ranges of the request's class. With the
/// one range that fits further down that list, the request failed with
/// `OutOfMemory` naming that range as the largest free block.
#[test]
fn at_the_maximum_a_request_comes_from_any_free_range_that_holds_it() {
    let max = 24 * MIB;
    let config = PoolConfig::new().initial_size(max).maximum_size(max);
    let mut p = CoalescingPool::with_config(BumpUpstream::new(1 << 40), config, &()).unwrap();
    let long = (1536 + 31) << 10;
    let (holes, kept) = holes_with_one_fit_past_the_search(&mut p, max, long);
    let at = free_holes(&mut p, holes);
    let big = p.allocate(req(long), &()).unwrap();
    assert_eq!((big.addr(), p.usage().held), (at, max));
    p.check().unwrap();
    p.deallocate(big, &()).unwrap();
    for b in kept {
        p.deallocate(b, &()).unwrap();
    }
    p.check().unwrap();
    assert_eq!(p.usage().used, 0);
}

/// Fills `bytes` of the pool with ten blocks of one class, the first
/// `long` bytes, kept apart by the blocks returned second.
fn holes_with_one_fit_past_the_search(
    p: &mut CoalescingPool<BumpUpstream>,
    bytes: u64,
    long: u64,
) -> (alloc::vec::Vec<Block>, alloc::vec::Vec<Block>) {
    let mut holes = alloc::vec::Vec::new();
    let mut kept = alloc::vec::Vec::new();
    for k in 0..10 {
        holes.push(p.allocate(req(if k == 0 { long } else { 1536 << 10 }), &()).unwrap());
        kept.push(p.allocate(req(512 << 10), &()).unwrap());
    }
    kept.push(p.allocate(req(bytes - p.usage().used), &()).unwrap());
    (holes, kept)
}

/// Frees the holes longest first: it ends last in its class's list, where
/// the class search misses it. Returns its address.
fn free_holes(p: &mut CoalescingPool<BumpUpstream>, holes: alloc::vec::Vec<Block>) -> u64 {
    let at = holes[0].addr();
    for h in holes {
        p.deallocate(h, &()).unwrap();
    }
    at
}

/// With the upstream out of memory (no maximum set) a request takes any
/// free range that holds it, as at the maximum.
#[test]
fn with_the_upstream_out_of_memory_a_request_comes_from_any_free_range_that_holds_it() {
    let full = 24 * MIB;
    let config = PoolConfig::new().initial_size(full);
    let mut p = CoalescingPool::with_config(BumpUpstream::new(full), config, &()).unwrap();
    let long = (1536 + 31) << 10;
    let (holes, kept) = holes_with_one_fit_past_the_search(&mut p, full, long);
    let at = free_holes(&mut p, holes);
    let big = p.allocate(req(long), &()).unwrap();
    assert_eq!((big.addr(), p.usage().held), (at, full));
    p.deallocate(big, &()).unwrap();
    for b in kept {
        p.deallocate(b, &()).unwrap();
    }
    p.check().unwrap();
    assert_eq!(p.usage().used, 0);
}

/// A growth that fails with the upstream's error (it refused a wholly free
/// chunk given back, and then there was no room) still lets a request take
/// any free range that holds it; the error stands only where none does.
#[test]
fn a_growth_refused_by_the_upstream_still_lets_a_request_take_any_free_range_that_holds_it() {
    let max = 25 * MIB;
    let config = PoolConfig::new().initial_size(24 * MIB).maximum_size(max);
    let mut p = CoalescingPool::with_config(BumpUpstream::new(1 << 40), config, &()).unwrap();
    let long = (1536 + 31) << 10;
    let (holes, mut kept) = holes_with_one_fit_past_the_search(&mut p, 24 * MIB, long);
    // A second chunk, the last MiB under the maximum, wholly free, and
    // the upstream refuses to take it back.
    let small = p.allocate(req(512 << 10), &()).unwrap();
    assert_eq!(p.usage().held, max);
    let chunk = p.chunk_ranges().find(|c| c.contains(small.addr())).unwrap();
    p.deallocate(small, &()).unwrap();
    p.upstream().refuse_free_at(chunk.start());
    let at = free_holes(&mut p, holes);
    let big = p.allocate(req(long), &()).unwrap();
    assert_eq!((big.addr(), p.usage().held), (at, max));
    p.check().unwrap();
    // Nothing free holds 2 MiB: the refusal is the error.
    let e = p.allocate(req(2 * MIB), &()).unwrap_err();
    assert!(matches!(e, Error::Backend { code: -2, .. }), "{e:?}");
    p.check().unwrap();
    p.upstream().refuse_free_at(0);
    kept.push(big);
    for b in kept {
        p.deallocate(b, &()).unwrap();
    }
    p.check().unwrap();
    assert_eq!(p.usage().used, 0);
}
