//! The adaptors that count: statistics and limiting.

extern crate std;

use super::tests::{req, FlakyFree};
use super::*;
use crate::pool::CoalescingPool;
use crate::testing::{BumpUpstream, SplitMix64};
use crate::Inspect;
use crate::{Block, Error, MemoryResource, Shared};
use alloc::sync::Arc;
use alloc::vec::Vec;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;

// ---------------------------------------------------------------- statistics

#[test]
fn statistics_over_a_pool_stay_exact_when_a_free_states_a_size_of_the_same_footprint() {
    // The pool refuses a size that rounds as the block's did: the
    // statistics count off the size a free states, and drifted for good.
    let s = Statistics::new(Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 20))));
    let b = s.allocate(req(3073), &()).unwrap();
    let e = s.deallocate(Block::new(b.addr(), 3328, b.tag()), &());
    assert!(matches!(e, Err(Error::SizeMismatch { expected: 3073, given: 3328, .. })), "{e:?}");
    assert_eq!(s.get_bytes_counter(), Counter { value: 3073, peak: 3073, total: 3073 });
    s.deallocate(b, &()).unwrap();
    assert_eq!(s.get_bytes_counter().value, 0);
}

#[test]
fn statistics_counts_bytes_and_allocations() {
    let s = Statistics::new(BumpUpstream::new(1 << 20));
    let a = s.allocate(req(100), &()).unwrap();
    let b = s.allocate(req(300), &()).unwrap();
    let z = s.allocate(req(0), &()).unwrap();
    assert_eq!(s.get_bytes_counter(), Counter { value: 400, peak: 400, total: 400 });
    assert_eq!(s.get_allocations_counter(), Counter { value: 2, peak: 2, total: 2 });
    s.deallocate(a, &()).unwrap();
    s.deallocate(z, &()).unwrap();
    let c = s.allocate(req(50), &()).unwrap();
    assert_eq!(s.get_bytes_counter(), Counter { value: 350, peak: 400, total: 450 });
    assert_eq!(s.get_allocations_counter(), Counter { value: 2, peak: 2, total: 3 });
    s.deallocate(b, &()).unwrap();
    s.deallocate(c, &()).unwrap();
    assert_eq!(s.get_bytes_counter().value, 0);
    assert_eq!(s.upstream().usage().held, 0);
}

#[test]
fn statistics_failed_calls_count_nothing() {
    let s = Statistics::new(FlakyFree::default());
    let a = s.allocate(req(1000), &()).unwrap();
    assert!(s.allocate(req(2 << 30), &()).is_err());
    assert_eq!(s.get_bytes_counter(), Counter { value: 1000, peak: 1000, total: 1000 });
    s.upstream().fail_frees.store(true, Ordering::Relaxed);
    assert!(s.deallocate(a, &()).is_err());
    assert_eq!(s.get_bytes_counter(), Counter { value: 1000, peak: 1000, total: 1000 });
    assert_eq!(s.get_allocations_counter().value, 1);
    s.upstream().fail_frees.store(false, Ordering::Relaxed);
    s.deallocate(a, &()).unwrap();
    assert_eq!(s.get_bytes_counter(), Counter { value: 0, peak: 1000, total: 1000 });
}

#[test]
fn statistics_push_pop_nest_and_merge_as_rmm() {
    let s = Statistics::new(BumpUpstream::new(1 << 30));
    let a = s.allocate(req(1000), &()).unwrap();
    let (outer, outer_count) = s.push_counters();
    assert_eq!(outer, Counter { value: 1000, peak: 1000, total: 1000 });
    assert_eq!(outer_count.value, 1);
    assert_eq!(s.get_bytes_counter(), Counter::default());
    assert_eq!(s.depth(), 1);

    let b = s.allocate(req(500), &()).unwrap();
    s.push_counters();
    let c = s.allocate(req(2000), &()).unwrap();
    s.deallocate(c, &()).unwrap();
    // Frees a block of the base level from inside: a negative value.
    s.deallocate(a, &()).unwrap();
    assert_eq!(s.get_bytes_counter(), Counter { value: -1000, peak: 2000, total: 2000 });
    let (inner, inner_count) = s.pop_counters().unwrap();
    assert_eq!(inner, Counter { value: -1000, peak: 2000, total: 2000 });
    assert_eq!(inner_count, Counter { value: -1, peak: 1, total: 1 });
    // Merged: value and total add up; the peak is measured from the
    // level's base (500 live when the inner level peaked at +2000).
    assert_eq!(s.get_bytes_counter(), Counter { value: -500, peak: 2500, total: 2500 });
    let (level1, _) = s.pop_counters().unwrap();
    assert_eq!(level1, Counter { value: -500, peak: 2500, total: 2500 });
    // Base level: 1000 live before, 3500 at the inner peak.
    assert_eq!(s.get_bytes_counter(), Counter { value: 500, peak: 3500, total: 3500 });
    assert_eq!(s.get_allocations_counter(), Counter { value: 1, peak: 3, total: 3 });
    s.deallocate(b, &()).unwrap();
}

#[test]
fn statistics_uneven_push_pop() {
    let s = Statistics::new(BumpUpstream::new(1 << 30));
    // More pops than pushes: an error that changes nothing.
    let a = s.allocate(req(256), &()).unwrap();
    assert!(matches!(s.pop_counters(), Err(Error::InvalidConfig { .. })));
    assert_eq!(s.get_bytes_counter(), Counter { value: 256, peak: 256, total: 256 });
    s.push_counters();
    s.pop_counters().unwrap();
    assert!(s.pop_counters().is_err());
    assert_eq!(s.depth(), 0);
    assert_eq!(s.get_bytes_counter(), Counter { value: 256, peak: 256, total: 256 });
    // Pushes never popped: figures are those of the innermost level, and the
    // allocations keep counting below it when it is popped later.
    s.push_counters();
    s.push_counters();
    let b = s.allocate(req(512), &()).unwrap();
    assert_eq!(s.get_bytes_counter(), Counter { value: 512, peak: 512, total: 512 });
    assert_eq!(s.depth(), 2);
    s.pop_counters().unwrap();
    s.pop_counters().unwrap();
    assert_eq!(s.get_bytes_counter(), Counter { value: 768, peak: 768, total: 768 });
    s.deallocate(a, &()).unwrap();
    s.deallocate(b, &()).unwrap();
}

#[test]
fn statistics_peak_is_exact_under_concurrency() {
    // Every thread holds all its blocks at the barrier, so the true peak is
    // exactly the sum of everything; nothing is live at any other time
    // beyond that. A lost peak update would show as a lower peak.
    const THREADS: u64 = 4;
    const PER: u64 = crate::testing::steps(500) as u64;
    for round in 0..5 {
        let s = Statistics::new(BumpUpstream::new(1 << 40));
        let barrier = Barrier::new(THREADS as usize);
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (s, barrier) = (&s, &barrier);
                scope.spawn(move || {
                    let blocks: Vec<Block> = (0..PER)
                        .map(|i| s.allocate(req(256 * (1 + (i + t + round) % 3)), &()).unwrap())
                        .collect();
                    barrier.wait();
                    for b in blocks {
                        s.deallocate(b, &()).unwrap();
                    }
                });
            }
        });
        let expected_bytes: u64 =
            (0..THREADS).flat_map(|t| (0..PER).map(move |i| 256 * (1 + (i + t + round) % 3))).sum();
        assert_eq!(
            s.get_bytes_counter(),
            Counter { value: 0, peak: expected_bytes as i64, total: expected_bytes as i64 }
        );
        assert_eq!(
            s.get_allocations_counter(),
            Counter { value: 0, peak: (THREADS * PER) as i64, total: (THREADS * PER) as i64 }
        );
    }
}

// ---------------------------------------------------------------- limiting

#[test]
fn limiting_zero_limit_refuses_all_but_zero_bytes() {
    let l = Limiting::new(BumpUpstream::new(1 << 30), 0);
    assert_eq!(l.allocate(req(0), &()).unwrap(), Block::EMPTY);
    assert_eq!(l.allocate(req(1), &()), Err(Error::LimitExceeded { requested: 1, used: 0, limit: 0 }));
    assert_eq!(l.get_allocated_bytes(), 0);
    assert_eq!(l.upstream().usage().held, 0);
    l.deallocate(Block::EMPTY, &()).unwrap();
}

#[test]
fn limiting_exact_limit_and_rollback() {
    let l = Limiting::new(BumpUpstream::new(1 << 30), 1024);
    let a = l.allocate(req(1000), &()).unwrap();
    assert_eq!(l.get_allocated_bytes(), 1024);
    assert!(matches!(l.allocate(req(1), &()), Err(Error::LimitExceeded { used: 1024, .. })));
    l.deallocate(a, &()).unwrap();
    // Upstream failure: the reservation is given back.
    l.upstream().fail_after(0);
    assert!(matches!(l.allocate(req(512), &()), Err(Error::Backend { .. })));
    assert_eq!(l.get_allocated_bytes(), 0);
    l.upstream().fail_after(u64::MAX);
    let b = l.allocate(req(1024), &()).unwrap();
    l.deallocate(b, &()).unwrap();
    assert_eq!((l.get_allocated_bytes(), l.upstream().usage().held), (0, 0));
}

/// An upstream that frees a block by any size: the limit counts off what
/// the block was charged, never what the free states, so it neither wraps
/// below zero nor lets the limit be overshot later.
#[test]
fn limiting_counts_off_what_a_block_was_charged_whatever_size_its_free_states() {
    // An upstream of the user's that takes any size (every memres resource
    // takes only the size asked for).
    struct AnySize(AtomicU64);
    impl<S: crate::Stream + ?Sized> MemoryResource<S> for AnySize {
        fn allocate(&self, request: crate::Request, _: &S) -> crate::Result<Block> {
            let addr = (1 << 20) + self.0.fetch_add(request.rounded_size(256), Ordering::Relaxed);
            Ok(Block::new(addr, request.size(), 0))
        }
        fn deallocate(&self, _: Block, _: &S) -> crate::Result<()> {
            Ok(())
        }
    }
    let up = AnySize(AtomicU64::new(0));
    for (asked, stated) in [(100, 4000), (2049, 2560)] {
        let l = Limiting::new(&up, 8192);
        let a = l.allocate(req(asked), &()).unwrap();
        let charged = asked.div_ceil(256) * 256;
        assert_eq!(l.get_allocated_bytes(), charged);
        // More than was charged: the upstream accepts it.
        l.deallocate(Block::new(a.addr(), stated, a.tag()), &()).unwrap();
        assert_eq!(l.get_allocated_bytes(), 0);
        // Less than was charged.
        let b = l.allocate(req(stated), &()).unwrap();
        l.deallocate(Block::new(b.addr(), asked, b.tag()), &()).unwrap();
        assert_eq!(l.get_allocated_bytes(), 0);
        // The limit still holds exactly.
        let c = l.allocate(req(4096), &()).unwrap();
        let d = l.allocate(req(4096), &()).unwrap();
        assert!(matches!(l.allocate(req(1), &()), Err(Error::LimitExceeded { used: 8192, .. })));
        l.deallocate(c, &()).unwrap();
        l.deallocate(d, &()).unwrap();
        assert_eq!(l.get_allocated_bytes(), 0);
    }
}

/// A zero-byte request that an upstream outside the contract answers at an
/// address, not with the empty block: the limit records it, charged
/// nothing, and takes its free (once); the empty block still passes
/// through unrecorded. Before, the block was handed out unrecorded and its
/// free was `UnknownBlock` for good.
#[test]
fn limiting_takes_the_free_of_a_zero_byte_block_at_an_address() {
    /// Hands every block out at one address; counts frees.
    #[derive(Default)]
    struct AtAnAddress(AtomicU64);
    impl MemoryResource<()> for AtAnAddress {
        fn allocate(&self, r: crate::Request, _: &()) -> crate::Result<Block> {
            Ok(Block::new(1 << 20, r.size(), 0))
        }
        fn deallocate(&self, _: Block, _: &()) -> crate::Result<()> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }
    let up = AtAnAddress::default();
    let l = Limiting::new(&up, 0);
    let b = l.allocate(req(0), &()).unwrap();
    assert_eq!((b.addr(), l.get_allocated_bytes()), (1 << 20, 0));
    l.check_layer().unwrap();
    assert_eq!(l.deallocate(b, &()), Ok(()));
    assert_eq!(l.deallocate(b, &()), Err(Error::UnknownBlock { addr: 1 << 20 }));
    assert_eq!((up.0.load(Ordering::Relaxed), l.get_allocated_bytes()), (1, 0));
    l.check_layer().unwrap();
    // The empty block holds nothing: its free goes straight through.
    assert_eq!(l.deallocate(Block::EMPTY, &()), Ok(()));
    assert_eq!(up.0.load(Ordering::Relaxed), 2);
}

/// A block the limit never handed out (taken from its upstream directly, or
/// freed already) is refused before the upstream sees it: nothing is freed
/// and the count does not move.
#[test]
fn limiting_refuses_a_block_it_did_not_hand_out() {
    let up = BumpUpstream::new(1 << 30);
    let l = Limiting::new(&up, 4096);
    let mine = l.allocate(req(1000), &()).unwrap();
    let theirs = up.allocate(req(3000), &()).unwrap();
    assert_eq!(l.deallocate(theirs, &()), Err(Error::UnknownBlock { addr: theirs.addr() }));
    assert_eq!((l.get_allocated_bytes(), up.usage().held), (1024, 4096));
    l.deallocate(mine, &()).unwrap();
    assert_eq!(l.deallocate(mine, &()), Err(Error::UnknownBlock { addr: mine.addr() }));
    assert_eq!((l.get_allocated_bytes(), up.usage().held), (0, 3072));
    // An upstream that refuses the free: still counted, freed later.
    let flaky = FlakyFree::default();
    let l = Limiting::new(&flaky, 4096);
    let a = l.allocate(req(300), &()).unwrap();
    flaky.fail_frees.store(true, Ordering::Relaxed);
    assert!(matches!(l.deallocate(a, &()), Err(Error::Backend { .. })));
    assert_eq!(l.get_allocated_bytes(), 512);
    flaky.fail_frees.store(false, Ordering::Relaxed);
    l.deallocate(a, &()).unwrap();
    assert_eq!(l.get_allocated_bytes(), 0);
    up.deallocate(theirs, &()).unwrap();
    // A block freed behind the limit's back (straight to the upstream)
    // stays counted until the upstream hands its address out again
    // through the limit: then only the new block counts.
    let pool = Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 30)));
    let l = Limiting::new(&pool, 4096);
    let a = l.allocate(req(1000), &()).unwrap();
    pool.deallocate(a, &()).unwrap();
    assert_eq!(l.get_allocated_bytes(), 1024);
    let b = l.allocate(req(3000), &()).unwrap();
    assert_eq!((b.addr(), l.get_allocated_bytes()), (a.addr(), 3072));
    l.deallocate(b, &()).unwrap();
    assert_eq!(l.get_allocated_bytes(), 0);
}

#[test]
fn limiting_never_exceeded_by_concurrent_callers() {
    let up = BumpUpstream::new(1 << 40);
    let l = Limiting::new(&up, 64 * 1024);
    let max_seen = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (l, max_seen, up) = (&l, &max_seen, &up);
            scope.spawn(move || {
                let mut rng = SplitMix64::new(t);
                let mut held = Vec::new();
                for _ in 0..crate::testing::steps(5000) {
                    if held.is_empty() || rng.below(2) == 0 {
                        match l.allocate(req(256 * (1 + rng.below(16))), &()) {
                            Ok(b) => held.push(b),
                            Err(e) => assert!(matches!(e, Error::LimitExceeded { .. })),
                        }
                    } else {
                        l.deallocate(held.swap_remove(0), &()).unwrap();
                    }
                    max_seen.fetch_max(up.usage().held, Ordering::Relaxed);
                }
                for b in held {
                    l.deallocate(b, &()).unwrap();
                }
            });
        }
    });
    assert!(max_seen.load(Ordering::Relaxed) <= 64 * 1024);
    assert_eq!((l.get_allocated_bytes(), up.usage().held), (0, 0));
}

/// An upstream whose allocations panic while `panics` is set, and its
/// frees while `frees_panic` is.
struct Panicking {
    inner: BumpUpstream,
    panics: std::sync::atomic::AtomicBool,
    frees_panic: std::sync::atomic::AtomicBool,
}

impl Inspect for Panicking {
    fn usage(&self) -> crate::Usage {
        self.inner.usage()
    }
    fn check(&self) -> Result<(), crate::check::Violation> {
        self.inner.check()
    }
}

impl MemoryResource for Panicking {
    fn allocate(&self, request: crate::Request, s: &()) -> crate::Result<Block> {
        assert!(!self.panics.load(Ordering::Relaxed), "the upstream panics");
        self.inner.allocate(request, s)
    }
    fn deallocate(&self, block: Block, s: &()) -> crate::Result<()> {
        assert!(!self.frees_panic.load(Ordering::Relaxed), "the upstream's free panics");
        self.inner.deallocate(block, s)
    }
}

/// The charge of an allocation whose upstream panics goes back: it kept
/// the limit shrunk for good, refusing every allocation after it.
#[test]
fn limiting_gives_the_charge_back_when_the_upstream_panics() {
    let up = Panicking { inner: BumpUpstream::new(1 << 20), panics: true.into(), frees_panic: false.into() };
    let l = Limiting::new(&up, 4096);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.allocate(req(4096), &())));
    assert!(r.is_err());
    assert_eq!(l.get_allocated_bytes(), 0);
    up.panics.store(false, Ordering::Relaxed);
    let b = l.allocate(req(4096), &()).unwrap();
    l.check().unwrap();
    l.deallocate(b, &()).unwrap();
    assert_eq!(l.get_allocated_bytes(), 0);
}

/// An upstream that refuses the first free it is armed for, allocating
/// through the statistics above it meanwhile (as another thread may,
/// between the statistics' uncount and their count back).
struct AllocatesWhileRefusing {
    inner: BumpUpstream,
    above: std::sync::Mutex<std::sync::Weak<Statistics<Arc<AllocatesWhileRefusing>>>>,
    got: std::sync::Mutex<Option<Block>>,
}

impl MemoryResource for AllocatesWhileRefusing {
    fn allocate(&self, request: crate::Request, s: &()) -> crate::Result<Block> {
        self.inner.allocate(request, s)
    }
    fn deallocate(&self, block: Block, s: &()) -> crate::Result<()> {
        let above = core::mem::take(&mut *self.above.lock().unwrap());
        let Some(stats) = above.upgrade() else { return self.inner.deallocate(block, s) };
        *self.got.lock().unwrap() = Some(stats.allocate(req(256), s).unwrap());
        Err(Error::Backend { code: 9, what: "free refused" })
    }
}

/// A refused free counts its block again as any allocation does, raising
/// the peak: the value reached 512 while the peak stayed at 256.
#[test]
fn statistics_count_a_refused_free_back_into_the_peak() {
    let up = Arc::new(AllocatesWhileRefusing {
        inner: BumpUpstream::new(1 << 20),
        above: Default::default(),
        got: Default::default(),
    });
    let s = Arc::new(Statistics::new(up.clone()));
    let a = s.allocate(req(256), &()).unwrap();
    *up.above.lock().unwrap() = Arc::downgrade(&s);
    assert!(s.deallocate(a, &()).is_err());
    assert_eq!(s.get_bytes_counter().value, 512);
    let b = up.got.lock().unwrap().take().unwrap();
    s.deallocate(b, &()).unwrap();
    assert_eq!(s.get_bytes_counter(), Counter { value: 256, peak: 512, total: 512 });
    s.deallocate(a, &()).unwrap();
}

/// A free whose upstream panics leaves the block live and charged, as a
/// refused free does: its charge was lost for good, and the block could
/// not be freed again.
#[test]
fn limiting_keeps_a_block_live_when_the_upstreams_free_panics() {
    let up = Panicking { inner: BumpUpstream::new(1 << 20), panics: false.into(), frees_panic: true.into() };
    let l = Limiting::new(&up, 4096);
    let b = l.allocate(req(4096), &()).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.deallocate(b, &())));
    assert!(r.is_err());
    assert_eq!(l.get_allocated_bytes(), 4096);
    l.check().unwrap();
    up.frees_panic.store(false, Ordering::Relaxed);
    l.deallocate(b, &()).unwrap();
    assert_eq!((l.get_allocated_bytes(), up.inner.usage().held), (0, 0));
}

/// Runs `f`, a call whose upstream panics, and checks that it panicked.
fn panics<T>(f: impl FnOnce() -> T) {
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err(), "the upstream was to panic");
}

/// A free whose upstream panics leaves the block counted as live, as a
/// refused free does: it was uncounted for good, and its retry took the
/// figures below zero.
#[test]
fn statistics_keep_a_block_counted_when_the_upstreams_free_panics() {
    let s = Statistics::new(BumpUpstream::new(1 << 20));
    let a = s.allocate(req(1000), &()).unwrap();
    s.upstream().panic_in("deallocate", 0);
    panics(|| s.deallocate(a, &()));
    assert_eq!(s.get_bytes_counter(), Counter { value: 1000, peak: 1000, total: 1000 });
    assert_eq!(s.get_allocations_counter(), Counter { value: 1, peak: 1, total: 1 });
    s.deallocate(a, &()).unwrap();
    assert_eq!(s.get_bytes_counter(), Counter { value: 0, peak: 1000, total: 1000 });
    assert_eq!(s.get_allocations_counter(), Counter { value: 0, peak: 1, total: 1 });
    assert_eq!(s.upstream().usage().held, 0);
}

/// An allocation whose upstream panics counts nothing.
#[test]
fn statistics_count_nothing_when_the_upstreams_allocation_panics() {
    let s = Statistics::new(BumpUpstream::new(1 << 20));
    s.upstream().panic_in("allocate", 0);
    panics(|| s.allocate(req(1000), &()));
    assert_eq!(s.get_bytes_counter(), Counter::default());
    assert_eq!(s.get_allocations_counter(), Counter::default());
}

/// The same for a leaf counted in a shared gauge.
#[test]
fn counted_keeps_a_block_counted_when_the_leafs_free_panics() {
    let gauge = Arc::new(Gauge::default());
    let c = Counted::new(BumpUpstream::new(1 << 20), gauge.clone());
    let a = c.allocate(req(1000), &()).unwrap();
    c.inner().panic_in("deallocate", 0);
    panics(|| c.deallocate(a, &()));
    assert_eq!((gauge.value(), gauge.peak(), gauge.total()), (1000, 1000, 1000));
    c.inner().panic_in("allocate", 0);
    panics(|| c.allocate(req(500), &()));
    assert_eq!((gauge.value(), gauge.total()), (1000, 1000));
    c.deallocate(a, &()).unwrap();
    assert_eq!((gauge.value(), gauge.peak(), gauge.total()), (0, 1000, 1000));
}

/// A free whose upstream panics leaves the block outstanding, with its
/// bytes: it was dropped from the table, so its retry was `UnknownBlock`
/// and the leak report missed it.
#[test]
fn tracking_keeps_a_block_outstanding_when_the_upstreams_free_panics() {
    let t = Tracking::new(BumpUpstream::new(1 << 20));
    let a = t.allocate(req(1000), &()).unwrap();
    t.upstream().panic_in("deallocate", 0);
    panics(|| t.deallocate(a, &()));
    assert_eq!((t.get_allocated_bytes(), t.size_of(a.addr())), (1000, Some(1000)));
    assert_eq!(t.get_outstanding_allocations().count(), 1);
    t.upstream().panic_in("allocate", 0);
    panics(|| t.allocate(req(500), &()));
    assert_eq!(t.get_outstanding_allocations().count(), 1);
    t.deallocate(a, &()).unwrap();
    assert!(t.get_outstanding_allocations().is_empty());
    assert_eq!((t.get_allocated_bytes(), t.upstream().usage().held), (0, 0));
}

/// Serves any size, at one address: each block is freed before the next.
struct AnySize;

impl MemoryResource<()> for AnySize {
    fn allocate(&self, request: crate::Request, _: &()) -> crate::Result<Block> {
        Ok(Block::new(1 << 20, request.size(), Block::NO_TAG))
    }
    fn deallocate(&self, _: Block, _: &()) -> crate::Result<()> {
        Ok(())
    }
}

/// The running total of bytes passes `i64::MAX` after two of the largest
/// requests: it saturates there. It was cast, and read as `i64::MIN`, a
/// negative total.
#[test]
fn statistics_total_past_i64_max_saturates() {
    let stats = Statistics::new(AnySize);
    for _ in 0..2 {
        let b = stats.allocate(crate::Request::new(crate::Request::MAX_SIZE).unwrap(), &()).unwrap();
        stats.deallocate(b, &()).unwrap();
    }
    let bytes = stats.get_bytes_counter();
    assert_eq!((bytes.value, bytes.peak, bytes.total), (0, 1 << 62, i64::MAX));
    stats.push_counters();
    let b = stats.allocate(crate::Request::new(1).unwrap(), &()).unwrap();
    stats.deallocate(b, &()).unwrap();
    assert_eq!(stats.get_bytes_counter().total, 1);
}
