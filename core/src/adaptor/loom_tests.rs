//! loom models of the adaptors' atomics and of the tables of live blocks
//! (the limiting and tracking adaptors', the binning resource's tally):
//! `RUSTFLAGS="--cfg loom" cargo test -p memres-core --features std --lib loom`.

use super::*;
use crate::binning::BinningResource;
use crate::pool::CoalescingPool;
use crate::testing::loom::{model, spawn};
use crate::testing::BumpUpstream;
use crate::{Block, Inspect, MemoryResource, Request, Shared};
use alloc::sync::Arc;
use loom::thread;

/// Two threads allocate and hold: whatever the interleaving, the peak is the
/// sum (a load-then-store peak update would lose the larger one).
#[test]
fn statistics_peak_exact() {
    model(Some(3), || {
        let s = Arc::new(Statistics::new(BumpUpstream::new(1 << 20)));
        let t = {
            let s = s.clone();
            thread::spawn(move || s.allocate(Request::new(512).unwrap(), &()).unwrap())
        };
        let a = s.allocate(Request::new(256).unwrap(), &()).unwrap();
        let b = t.join().unwrap();
        assert_eq!(s.get_bytes_counter(), Counter { value: 768, peak: 768, total: 768 });
        s.deallocate(a, &()).unwrap();
        s.deallocate(b, &()).unwrap();
        assert_eq!(s.get_bytes_counter(), Counter { value: 0, peak: 768, total: 768 });
    });
}

/// Two threads race for the last room under a limit: exactly one wins, and
/// the count never passes the limit.
#[test]
fn limiting_one_winner() {
    model(Some(3), || {
        let l = Arc::new(Limiting::new(BumpUpstream::new(1 << 20), 512));
        let t = {
            let l = l.clone();
            thread::spawn(move || l.allocate(Request::new(512).unwrap(), &()).is_ok())
        };
        let mine = l.allocate(Request::new(512).unwrap(), &()).is_ok();
        let theirs = t.join().unwrap();
        assert!(mine ^ theirs);
        assert_eq!(l.get_allocated_bytes(), 512);
        assert_eq!(l.upstream().usage().held, 512);
    });
}

/// A pool to put a table under, shared by the threads.
type Pool = Arc<Shared<CoalescingPool<BumpUpstream>>>;

fn pool() -> Pool {
    Arc::new(Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 20))))
}

/// Through `layer`, over a pool: a block `x` is freed and its address
/// handed out again as `y`; then a stale copy of `x` is freed again (a
/// double free) on another thread while `y` is freed and the address handed
/// out once more. Whatever the interleaving, the live block's free
/// succeeds and the stale one fails; returns the newest block.
fn double_free_beside_the_live_blocks_free<R: MemoryResource + Send + Sync + 'static>(
    layer: &Arc<R>,
) -> Block {
    let r = Request::new(1000).unwrap();
    let x = layer.allocate(r, &()).unwrap();
    layer.deallocate(x, &()).unwrap();
    let y = layer.allocate(r, &()).unwrap();
    assert_eq!(y.addr(), x.addr(), "the pool hands the address out again");
    let stale = {
        let layer = layer.clone();
        spawn(move || layer.deallocate(x, &()))
    };
    assert_eq!(layer.deallocate(y, &()), Ok(()));
    let z = layer.allocate(r, &()).unwrap();
    assert!(stale.join().unwrap().is_err());
    z
}

/// The limiting adaptor's charges: those of the live blocks.
#[test]
fn limiting_double_free_beside_the_live_blocks_free() {
    model(Some(3), || {
        let l = Arc::new(Limiting::new(pool(), 1 << 20));
        let z = double_free_beside_the_live_blocks_free(&l);
        assert_eq!((l.get_allocated_bytes(), l.upstream().usage().used), (1024, 1024));
        l.check().unwrap();
        l.deallocate(z, &()).unwrap();
        assert_eq!((l.get_allocated_bytes(), l.upstream().usage().used), (0, 0));
    });
}

/// The tracking adaptor's table: the live block, outstanding with its size.
#[test]
fn tracking_double_free_beside_the_live_blocks_free() {
    model(Some(3), || {
        let t = Arc::new(Tracking::new(pool()));
        let z = double_free_beside_the_live_blocks_free(&t);
        assert_eq!((t.get_allocated_bytes(), t.size_of(z.addr())), (1000, Some(1000)));
        assert_eq!((t.get_outstanding_allocations().count(), t.upstream().usage().used), (1, 1024));
        t.deallocate(z, &()).unwrap();
        assert_eq!((t.get_allocated_bytes(), t.upstream().usage().used), (0, 0));
        assert!(t.get_outstanding_allocations().is_empty());
    });
}

/// The binning resource's tally of the blocks its upstream serves (larger
/// than every bin): the live block's footprint.
#[test]
fn binning_double_free_beside_the_live_blocks_free() {
    model(Some(3), || {
        let bins: Arc<BinningResource<'static, Pool>> = Arc::new(BinningResource::new(pool()));
        let z = double_free_beside_the_live_blocks_free(&bins);
        assert_eq!((bins.usage().used, bins.upstream().usage().used), (1024, 1024));
        bins.check().unwrap();
        bins.deallocate(z, &()).unwrap();
        assert_eq!((bins.usage().used, bins.upstream().usage().used), (0, 0));
        bins.check().unwrap();
    });
}

/// The binning resource's tally of a counted bin's blocks: the live
/// block's footprint.
#[test]
fn binning_double_free_in_a_counted_bin_beside_the_live_blocks_free() {
    model(Some(3), || {
        let counted = pool();
        let mut bins: BinningResource<'static, BumpUpstream> =
            BinningResource::new(BumpUpstream::new(1 << 20));
        bins.add_counted_bin(4096, counted.clone()).unwrap();
        let bins = Arc::new(bins);
        let z = double_free_beside_the_live_blocks_free(&bins);
        assert_eq!((bins.usage().used, counted.usage().used), (1024, 1024));
        bins.check().unwrap();
        bins.deallocate(z, &()).unwrap();
        assert_eq!((bins.usage().used, counted.usage().used), (0, 0));
        bins.check().unwrap();
    });
}
