//! The premise of the composites' `MemoryOf` forwarding: a block their
//! upstream hands out shorter than asked is given back, never managed.

use crate::arena::ArenaResource;
use crate::fixed::FixedSizeResource;
use crate::pool::CoalescingPool;
use crate::testing::{BumpUpstream, IdStream};
use crate::Inspect;
use crate::{Block, Error, MemoryResource, MemoryResourceMut, Request, Result, StreamOrdered};
use core::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Hands out blocks half as long as asked (a safe resource breaking the
/// size promise) and counts those not given back.
#[derive(Debug, Default)]
struct Halving {
    next: AtomicU64,
    live: AtomicI64,
}

impl<S: crate::Stream + ?Sized> MemoryResource<S> for Halving {
    fn allocate(&self, request: Request, _: &S) -> Result<Block> {
        let addr = (1 << 20) + self.next.fetch_add(request.rounded_size(1 << 20), Relaxed);
        self.live.fetch_add(1, Relaxed);
        Ok(Block::new(addr, request.size() / 2, 0))
    }
    fn deallocate(&self, _: Block, _: &S) -> Result<()> {
        self.live.fetch_sub(1, Relaxed);
        Ok(())
    }
}

/// The upstream's fault, not the request's: its first block, at 1 MiB, is
/// half as long as `asked`.
fn short(asked: u64) -> Result<Block> {
    Err(Error::UpstreamMisbehaved { addr: 1 << 20, size: asked / 2, what: "shorter than asked" })
}

#[test]
fn pool_gives_a_short_chunk_back() {
    let up = Halving::default();
    let mut pool = CoalescingPool::new(&up);
    let err = pool.allocate(Request::new(1000).unwrap(), &()).unwrap_err();
    assert!(matches!(err, Error::UpstreamMisbehaved { what: "shorter than asked", .. }), "{err}");
    assert_eq!((up.live.load(Relaxed), pool.usage().held), (0, 0));
    pool.check().unwrap();
}

#[test]
fn arena_gives_a_short_chunk_back() {
    let up = Halving::default();
    let arena = ArenaResource::new(&up);
    assert!(arena.allocate(Request::new(1000).unwrap(), &()).is_err());
    assert!(arena.allocate(Request::new(64 << 20).unwrap(), &()).is_err());
    assert_eq!(up.live.load(Relaxed), 0);
    arena.check().unwrap();
}

#[test]
fn fixed_size_resource_gives_a_short_chunk_back() {
    let up = Halving::default();
    let mut fixed = FixedSizeResource::new(&up);
    assert!(fixed.allocate(Request::new(100).unwrap(), &()).is_err());
    assert_eq!(up.live.load(Relaxed), 0);
}

#[test]
fn stream_ordered_layer_gives_a_short_block_back() {
    let up = Halving::default();
    let mut so: StreamOrdered<_, IdStream> = StreamOrdered::new(&up);
    assert_eq!(so.allocate(Request::new(1000).unwrap(), &IdStream(1)), short(1000));
    assert_eq!((up.live.load(Relaxed), so.live_count()), (0, 0));
}

#[test]
fn stream_ordered_layer_reuses_a_block_only_for_what_it_holds() {
    let mut so: StreamOrdered<_, IdStream> =
        StreamOrdered::new(CoalescingPool::new(BumpUpstream::new(1 << 20)));
    let s = IdStream(1);
    let a = so.allocate(Request::new(100).unwrap(), &s).unwrap();
    so.deallocate(a, &s).unwrap();
    // Same 256-byte bucket, but the listed block holds 100 bytes, not 200.
    let b = so.allocate(Request::new(200).unwrap(), &s).unwrap();
    assert_ne!(b.addr(), a.addr());
    let c = so.allocate(Request::new(60).unwrap(), &s).unwrap();
    assert_eq!(c.addr(), a.addr(), "it still serves what it holds");
    so.check().unwrap();
}

mod live_ranges {
    use crate::copy::LiveRanges;
    use crate::Error;

    #[test]
    fn a_range_is_live_only_inside_one_allocation() {
        let mut live = LiveRanges::new();
        live.insert(0x1000, 0x100);
        live.insert(0x1100, 0x100); // adjacent, a separate allocation
        live.insert(0x4000, 0);
        assert_eq!(live.len(), 2, "an empty allocation is not recorded");
        let not_live = |addr, len| Err(Error::NotLive { addr, len });
        assert_eq!(live.check(0x1000, 0x100), Ok(()));
        assert_eq!(live.check(0x10ff, 1), Ok(()));
        assert_eq!(live.check(0x1100, 0x100), Ok(()));
        assert_eq!(live.check(0x10ff, 2), not_live(0x10ff, 2), "across two allocations");
        assert_eq!(live.check(0xfff, 1), not_live(0xfff, 1), "before the first");
        assert_eq!(live.check(0x1200, 1), not_live(0x1200, 1), "past the last");
        assert_eq!(live.check(u64::MAX, 2), not_live(u64::MAX, 2), "wrapping around");
        assert_eq!(live.check(0x9999, 0), Ok(()), "an empty range touches nothing");
        assert_eq!(live.remove(0x1000), Some(0x100));
        assert_eq!(live.remove(0x1000), None);
        assert_eq!(live.remove(0x1180), None, "only the start names an allocation");
        assert_eq!(live.check(0x1000, 1), not_live(0x1000, 1), "freed");
        assert_eq!(live.check(0x1180, 0x80), Ok(()));
        assert_eq!(live.remove(0x1100), Some(0x100));
        assert!(live.is_empty());
    }

    /// An allocation that reaches the last address gives back the length
    /// it was recorded with, not what is left below the end of the space.
    #[test]
    fn an_allocation_at_the_top_gives_its_length_back() {
        let mut live = LiveRanges::new();
        live.insert(u64::MAX - 0xf, 0x100);
        assert_eq!(live.check(u64::MAX - 0xf, 0xf), Ok(()));
        assert_eq!(live.remove(u64::MAX - 0xf), Some(0x100));
        assert!(live.is_empty());
    }
}

#[test]
fn binning_gives_a_short_large_block_back() {
    // No bins: every size takes the large path, straight to the upstream.
    let up = Halving::default();
    let binning = crate::binning::BinningResource::<_, ()>::new(&up);
    assert_eq!(binning.allocate(Request::new(1 << 20).unwrap(), &()), short(1 << 20));
    assert_eq!((up.live.load(Relaxed), binning.usage().used), (0, 0));
}
