extern crate std;

use super::*;
use crate::check::LiveBlocks;
use crate::pool::{CoalescingPool, PoolConfig};
use crate::testing::{BumpUpstream, SplitMix64};
use crate::Inspect;
use crate::{Block, Error, MemoryResource, Request, Shared};
use alloc::string::ToString;
use alloc::sync::Arc;
use alloc::vec::Vec;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub(super) fn req(size: u64) -> Request {
    Request::new(size).unwrap()
}

/// An upstream whose frees can be made to fail, to test roll-backs.
#[derive(Debug)]
pub(super) struct FlakyFree {
    pub(super) inner: BumpUpstream,
    pub(super) fail_frees: std::sync::atomic::AtomicBool,
}

impl Default for FlakyFree {
    fn default() -> Self {
        FlakyFree { inner: BumpUpstream::new(1 << 30), fail_frees: Default::default() }
    }
}

impl MemoryResource for FlakyFree {
    fn allocate(&self, request: Request, s: &()) -> crate::Result<Block> {
        self.inner.allocate(request, s)
    }
    fn deallocate(&self, block: Block, s: &()) -> crate::Result<()> {
        if self.fail_frees.load(Ordering::Relaxed) {
            return Err(Error::Backend { code: 9, what: "free refused" });
        }
        self.inner.deallocate(block, s)
    }
}

/// An upstream of one address whose free, once `gate` is set, frees the
/// block, lets another thread take the address through the layer above
/// (the gate's two waits), then panics, as an upstream that frees and
/// then fails to log would.
#[derive(Default)]
pub(super) struct FreeThenPanic {
    live: Mutex<bool>,
    gate: Mutex<Option<Arc<std::sync::Barrier>>>,
}

impl MemoryResource for FreeThenPanic {
    fn allocate(&self, request: Request, _: &()) -> crate::Result<Block> {
        let mut live = self.live.lock().unwrap();
        if *live {
            return Err(Error::OutOfMemory {
                requested: request.size(),
                largest_free: 0,
                pool_size: 0,
                max_size: None,
            });
        }
        *live = true;
        Ok(Block::new(1 << 20, request.size(), Block::NO_TAG))
    }
    fn deallocate(&self, _: Block, _: &()) -> crate::Result<()> {
        *self.live.lock().unwrap() = false;
        let gate = self.gate.lock().unwrap().take();
        if let Some(gate) = gate {
            gate.wait(); // freed
            gate.wait(); // taken again
            panic!("the upstream panics after its free");
        }
        Ok(())
    }
}

/// Nothing to tell: the layers above it are checked.
impl Inspect for FreeThenPanic {
    fn usage(&self) -> crate::Usage {
        crate::Usage::leaf(0, 0)
    }
    fn check(&self) -> core::result::Result<(), crate::check::Violation> {
        Ok(())
    }
}

/// Frees `a` through `layer` over `up`, whose free lets another thread
/// allocate `size` through `layer` at the same address, then panics;
/// returns that thread's block.
pub(super) fn freed_then_taken<R: MemoryResource + Sync>(
    up: &FreeThenPanic,
    layer: &R,
    a: Block,
    size: u64,
) -> Block {
    let gate = Arc::new(std::sync::Barrier::new(2));
    *up.gate.lock().unwrap() = Some(gate.clone());
    std::thread::scope(|s| {
        let other = s.spawn(|| {
            gate.wait();
            let b = layer.allocate(req(size), &()).unwrap();
            gate.wait();
            b
        });
        let freed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| layer.deallocate(a, &())));
        assert!(freed.is_err(), "the upstream's free panicked");
        let b = other.join().unwrap();
        assert_eq!(b.addr(), a.addr());
        b
    })
}

#[test]
fn a_free_that_panics_after_the_address_was_taken_again_keeps_the_newer_block() {
    // Before, the failed free's entry went back over the newer block's:
    // Limiting charged both for good, Tracking refused the newer block's
    // free as a size mismatch.
    let up = FreeThenPanic::default();
    let limit = Limiting::new(&up, 1 << 20);
    let a = limit.allocate(req(256), &()).unwrap();
    let b = freed_then_taken(&up, &limit, a, 4096);
    assert_eq!(limit.get_allocated_bytes(), 4096);
    limit.check().unwrap();
    limit.deallocate(b, &()).unwrap();
    assert_eq!(limit.get_allocated_bytes(), 0);

    let up = FreeThenPanic::default();
    let track = Tracking::new(&up);
    let a = track.allocate(req(256), &()).unwrap();
    let b = freed_then_taken(&up, &track, a, 4096);
    assert_eq!((track.get_outstanding_allocations().count(), track.get_allocated_bytes()), (1, 4096));
    assert_eq!(track.size_of(b.addr()), Some(4096));
    track.deallocate(b, &()).unwrap();
    assert_eq!(track.get_allocated_bytes(), 0);

    let up = FreeThenPanic::default();
    let bins: crate::binning::BinningResource<_> = crate::binning::BinningResource::new(&up);
    let a = bins.allocate(req(256), &()).unwrap();
    let b = freed_then_taken(&up, &bins, a, 4096);
    assert_eq!(bins.usage().used, 4096);
    bins.check().unwrap();
    bins.deallocate(b, &()).unwrap();
    assert_eq!(bins.usage().used, 0);
}

/// A pool whose free of one block, once `gate` names its tag, stops after
/// it began until the test lets it go on (the gate's two waits): the
/// window in which a layer above has passed that free on.
pub(super) struct StaleFreeWaits {
    pub(super) pool: Shared<CoalescingPool<BumpUpstream>>,
    /// The tag of the free that waits, and the gate.
    gate: Mutex<Option<(u64, Arc<std::sync::Barrier>)>>,
}

impl Default for StaleFreeWaits {
    fn default() -> Self {
        let pool = Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 30)));
        StaleFreeWaits { pool, gate: Mutex::new(None) }
    }
}

impl MemoryResource for StaleFreeWaits {
    fn allocate(&self, request: Request, s: &()) -> crate::Result<Block> {
        self.pool.allocate(request, s)
    }
    fn deallocate(&self, block: Block, s: &()) -> crate::Result<()> {
        let gate = self.gate.lock().unwrap().take_if(|(tag, _)| *tag == block.tag());
        if let Some((_, gate)) = gate {
            gate.wait(); // passed on
            gate.wait(); // go on
        }
        self.pool.deallocate(block, s)
    }
}

impl Inspect for StaleFreeWaits {
    fn usage(&self) -> crate::Usage {
        self.pool.usage()
    }
    fn check(&self) -> core::result::Result<(), crate::check::Violation> {
        self.pool.check()
    }
}

/// Through `layer` over `up`: a block `x` is freed, its address handed
/// out again as `y`; a stale copy of `x` is freed again (a double free),
/// and while the pool has that free, `y` is freed and the address handed
/// out once more. The live block's free must succeed and the stale one
/// fail as a double free; returns the newest block.
pub(super) fn freed_beside_a_double_free<R: MemoryResource + Sync>(up: &StaleFreeWaits, layer: &R) -> Block {
    let r = req(1000);
    let x = layer.allocate(r, &()).unwrap();
    layer.deallocate(x, &()).unwrap();
    let y = layer.allocate(r, &()).unwrap();
    assert_eq!(x.addr(), y.addr(), "the pool hands the address out again");
    let gate = Arc::new(std::sync::Barrier::new(2));
    *up.gate.lock().unwrap() = Some((x.tag(), gate.clone()));
    let (stale, live, z) = std::thread::scope(|s| {
        let stale = s.spawn(|| layer.deallocate(x, &()));
        gate.wait();
        let live = layer.deallocate(y, &());
        let z = layer.allocate(r, &());
        gate.wait();
        (stale.join().unwrap(), live, z)
    });
    assert_eq!(live, Ok(()), "the live block's free went through");
    assert_eq!(stale, Err(Error::DoubleFree { addr: x.addr() }));
    let z = z.unwrap();
    assert_eq!(z.addr(), y.addr());
    assert_eq!(up.pool.usage().used, 1024, "the newest block only is live");
    z
}

// Before, in each layer, the stale free took the address out of the
// layer's table while the pool had it: the live block's free was
// `UnknownBlock`, and the block stayed live and counted for good.

#[test]
fn limiting_lets_a_live_blocks_free_through_beside_a_double_free() {
    let up = StaleFreeWaits::default();
    let limit = Limiting::new(&up, 1 << 20);
    let z = freed_beside_a_double_free(&up, &limit);
    assert_eq!(limit.get_allocated_bytes(), 1024);
    limit.check().unwrap();
    limit.deallocate(z, &()).unwrap();
    assert_eq!((limit.get_allocated_bytes(), up.pool.usage().used), (0, 0));
}

#[test]
fn tracking_lets_a_live_blocks_free_through_beside_a_double_free() {
    let up = StaleFreeWaits::default();
    let track = Tracking::new(&up);
    let z = freed_beside_a_double_free(&up, &track);
    assert_eq!((track.get_outstanding_allocations().count(), track.get_allocated_bytes()), (1, 1000));
    assert_eq!(track.size_of(z.addr()), Some(1000));
    track.deallocate(z, &()).unwrap();
    assert_eq!((track.get_allocated_bytes(), up.pool.usage().used), (0, 0));
}

#[test]
fn binning_lets_a_live_blocks_free_through_beside_a_double_free() {
    // Its large blocks, then a counted bin's.
    let up = StaleFreeWaits::default();
    let bins: crate::binning::BinningResource<_> = crate::binning::BinningResource::new(&up);
    let z = freed_beside_a_double_free(&up, &bins);
    assert_eq!(bins.usage().used, 1024);
    bins.check().unwrap();
    bins.deallocate(z, &()).unwrap();
    assert_eq!((bins.usage().used, up.pool.usage().used), (0, 0));

    let up = StaleFreeWaits::default();
    let mut bins: crate::binning::BinningResource<_> =
        crate::binning::BinningResource::new(BumpUpstream::new(1 << 20));
    bins.add_counted_bin(4096, &up).unwrap();
    let z = freed_beside_a_double_free(&up, &bins);
    assert_eq!(bins.usage().used, 1024);
    bins.check().unwrap();
    bins.deallocate(z, &()).unwrap();
    assert_eq!((bins.usage().used, up.pool.usage().used), (0, 0));
    bins.check().unwrap();
}

// ---------------------------------------------------------------- aligned
// ---------------------------------------------------------------- aligned

#[test]
fn aligned_large_allocations_only() {
    let a = Aligned::new(BumpUpstream::new(1 << 40), 1 << 20, 1 << 16).unwrap();
    let mut blocks = Vec::new();
    let mut small_unaligned = false;
    for i in 0..64 {
        let small = a.allocate(req(1000 + i), &()).unwrap();
        small_unaligned |= small.addr() % (1 << 20) != 0;
        let big = a.allocate(req((1 << 16) + i * 256), &()).unwrap();
        assert_eq!(big.addr() % (1 << 20), 0);
        assert_eq!(big.size(), (1 << 16) + i * 256);
        // A request asking for more than the adaptor's alignment keeps it.
        let bigger = a.allocate(Request::aligned(1 << 16, 1 << 22).unwrap(), &()).unwrap();
        assert_eq!(bigger.addr() % (1 << 22), 0);
        blocks.extend([small, big, bigger]);
    }
    assert!(small_unaligned, "small requests must not be given the large alignment");
    for b in blocks {
        a.deallocate(b, &()).unwrap();
    }
    assert_eq!(a.upstream().usage().held, 0);
    assert_eq!(Aligned::new((), 3 << 10, 0).unwrap_err(), Error::InvalidAlignment { align: 3 << 10 });
    assert_eq!(Aligned::new((), 1 << 41, 0).unwrap_err(), Error::InvalidAlignment { align: 1 << 41 });
}

#[test]
fn aligned_over_pool_gives_back_the_right_blocks() {
    let pool = Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 40)));
    let a = Aligned::new(&pool, 1 << 16, 4096).unwrap();
    let mut rng = SplitMix64::new(5);
    let mut live = LiveBlocks::new();
    let mut blocks = Vec::new();
    for _ in 0..crate::testing::steps(5000) {
        if blocks.is_empty() || rng.below(2) == 0 {
            let size = rng.below(64 << 10);
            let b = a.allocate(req(size), &()).unwrap();
            let align = if size >= 4096 { 1 << 16 } else { 256 };
            live.insert(b, Request::aligned(size, align).unwrap()).unwrap();
            if !b.is_empty() {
                blocks.push(b);
            }
        } else {
            let b = blocks.swap_remove(rng.below(blocks.len() as u64) as usize);
            a.deallocate(b, &()).unwrap();
            live.remove(&b).unwrap();
        }
        pool.with(|p| p.check()).unwrap();
    }
    for b in blocks {
        a.deallocate(b, &()).unwrap();
    }
    assert_eq!(pool.with(|p| p.usage().used), 0);
}

// ---------------------------------------------------------------- failure callback

#[test]
fn failure_callback_retry_forever_is_bounded() {
    let calls = AtomicU64::new(0);
    let r = FailureCallback::new(BumpUpstream::new(1 << 20), &calls, |bytes, calls: &&AtomicU64| {
        assert_eq!(bytes, 2 << 20);
        calls.fetch_add(1, Ordering::Relaxed);
        true
    });
    let err = r.allocate(req(2 << 20), &()).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { requested, .. } if requested == 2 << 20));
    // Called once per failure: the first attempt and each retry.
    let cap = u64::from(r.max_retries());
    assert_eq!(calls.load(Ordering::Relaxed), cap + 1);
    let r = r.with_max_retries(0);
    calls.store(0, Ordering::Relaxed);
    assert!(r.allocate(req(2 << 20), &()).is_err());
    assert_eq!(calls.load(Ordering::Relaxed), 1);
}

#[test]
fn failure_callback_frees_then_retries() {
    let up = BumpUpstream::new(1 << 20);
    let cache = Mutex::new(Vec::new());
    for _ in 0..4 {
        cache.lock().unwrap().push(up.allocate(req(256 << 10), &()).unwrap());
    }
    let r = FailureCallback::new(&up, &cache, |_bytes, cache: &&Mutex<Vec<Block>>| {
        // Free one cached block per call; give up when none is left.
        match cache.lock().unwrap().pop() {
            Some(b) => {
                up.deallocate(b, &()).unwrap();
                true
            }
            None => false,
        }
    });
    let b = r.allocate(req(512 << 10), &()).unwrap();
    assert_eq!(cache.lock().unwrap().len(), 2);
    assert!(r.allocate(req(2 << 20), &()).is_err());
    assert!(cache.lock().unwrap().is_empty());
    r.deallocate(b, &()).unwrap();
    assert_eq!(up.usage().held, 0);
}

#[test]
fn failure_callback_ignores_other_errors() {
    let up = BumpUpstream::new(1 << 20);
    up.fail_after(0);
    let calls = AtomicU64::new(0);
    let r = FailureCallback::new(&up, (), |_, _| {
        calls.fetch_add(1, Ordering::Relaxed);
        true
    });
    assert!(matches!(r.allocate(req(256), &()), Err(Error::Backend { .. })));
    assert_eq!(calls.load(Ordering::Relaxed), 0);
}

/// A failing allocation from a thread-local's destructor, after the
/// thread's other thread-locals were destroyed, under a callback that
/// allocates through its own adaptor: the callback runs once, not from
/// inside itself. Before, the list of what runs on the thread was a
/// thread-local destroyed by then, every call was let in, and the callback
/// called itself until the stack overflowed (here capped at 8 levels).
#[test]
fn a_failure_callback_called_from_a_thread_local_destructor_does_not_call_itself() {
    use std::sync::OnceLock;
    type Adaptor = FailureCallback<BumpUpstream, (), fn(u64, &()) -> bool>;
    static ADAPTOR: OnceLock<Adaptor> = OnceLock::new();
    static DEPTH: AtomicU64 = AtomicU64::new(0);
    static DEEPEST: AtomicU64 = AtomicU64::new(0);
    fn allocating(_: u64, _: &()) -> bool {
        let depth = DEPTH.fetch_add(1, Ordering::Relaxed) + 1;
        DEEPEST.fetch_max(depth, Ordering::Relaxed);
        if depth < 8 {
            let _ = ADAPTOR.get().unwrap().allocate(req(256), &());
        }
        DEPTH.fetch_sub(1, Ordering::Relaxed);
        false
    }
    struct AllocatesWhenDropped;
    impl Drop for AllocatesWhenDropped {
        fn drop(&mut self) {
            let _ = ADAPTOR.get().unwrap().allocate(req(256), &());
        }
    }
    std::thread_local! {
        static LAST: AllocatesWhenDropped = const { AllocatesWhenDropped };
    }
    ADAPTOR.get_or_init(|| FailureCallback::new(BumpUpstream::new(0), (), allocating as fn(_, &_) -> _));
    std::thread::spawn(|| {
        // Used first, destroyed last: after anything the allocation below
        // makes the thread keep.
        LAST.with(|_| ());
        let _ = ADAPTOR.get().unwrap().allocate(req(256), &());
        DEEPEST.store(0, Ordering::Relaxed);
    })
    .join()
    .unwrap();
    assert_eq!(DEEPEST.load(Ordering::Relaxed), 1);
}

#[test]
fn a_failure_callback_that_allocates_through_its_adaptor_gets_the_error_not_a_second_call() {
    use std::sync::OnceLock;
    type Me<'a> = OnceLock<&'a (dyn MemoryResource<()> + Sync)>;
    let me: Me<'_> = OnceLock::new();
    let (calls, nested) = (AtomicU64::new(0), Mutex::new(Vec::new()));
    let r =
        FailureCallback::new(BumpUpstream::new(1 << 20), (&me, &calls, &nested), |_, (me, calls, nested)| {
            calls.fetch_add(1, Ordering::Relaxed);
            // Staging buffers through the same adaptor: out of memory too.
            // (The second once found the callback's mark taken out by the
            // first's refusal, and called it again.)
            for _ in 0..2 {
                let tried = me.get().unwrap().allocate(req(2 << 20), &());
                nested.lock().unwrap().push(tried);
            }
            true
        })
        .with_max_retries(2);
    me.set(&r).ok().unwrap();
    // Before, each nested failure called the callback anew until the stack
    // overflowed and the process aborted.
    let err = r.allocate(req(2 << 20), &()).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { requested, .. } if requested == 2 << 20));
    // Called for the first attempt and each retry, never from inside itself.
    assert_eq!(calls.load(Ordering::Relaxed), 3);
    {
        let nested = nested.lock().unwrap();
        assert_eq!(nested.len(), 6);
        assert!(nested.iter().all(|n| matches!(n, Err(Error::OutOfMemory { .. }))));
    }
    // The adaptor serves on, and its callback runs at the next failure, on
    // any thread.
    assert!(r.allocate(req(256), &()).is_ok());
    std::thread::scope(|s| s.spawn(|| assert!(r.allocate(req(2 << 20), &()).is_err())).join().unwrap());
    assert_eq!(calls.load(Ordering::Relaxed), 6);
}

// ---------------------------------------------------------------- tracking
// ---------------------------------------------------------------- tracking

#[test]
fn tracking_table_and_errors() {
    let t = Tracking::new(FlakyFree::default());
    let a = t.allocate(req(100), &()).unwrap();
    let b = t.allocate(req(200), &()).unwrap();
    assert_eq!(t.allocate(req(0), &()).unwrap(), Block::EMPTY);
    assert_eq!((t.get_outstanding_allocations().count(), t.get_allocated_bytes()), (2, 300));
    assert_eq!(t.size_of(a.addr()), Some(100));
    let report = t.get_outstanding_allocations();
    let mut want = [(a.addr(), 100), (b.addr(), 200)];
    want.sort();
    assert_eq!(report.allocations.iter().map(|o| (o.addr, o.size)).collect::<Vec<_>>(), want);
    assert_eq!(
        t.deallocate(Block::from_addr(a.addr(), 99), &()),
        Err(Error::SizeMismatch { addr: a.addr(), expected: 100, given: 99 })
    );
    assert_eq!(t.deallocate(Block::from_addr(1, 1), &()), Err(Error::UnknownBlock { addr: 1 }));
    // An upstream failure keeps the block tracked.
    t.upstream().fail_frees.store(true, Ordering::Relaxed);
    assert!(t.deallocate(a, &()).is_err());
    assert_eq!((t.get_outstanding_allocations().count(), t.get_allocated_bytes()), (2, 300));
    t.upstream().fail_frees.store(false, Ordering::Relaxed);
    t.deallocate(a, &()).unwrap();
    assert_eq!(t.get_allocated_bytes(), 200);
    assert_eq!(t.deallocate(a, &()), Err(Error::UnknownBlock { addr: a.addr() }));
    t.deallocate(b, &()).unwrap();
    assert!(t.get_outstanding_allocations().is_empty());
    assert_eq!(t.get_allocated_bytes(), 0);
    assert_eq!(t.upstream().inner.usage().held, 0);
}

#[test]
fn tracking_counts_an_address_handed_out_again_once() {
    // The upstream frees a block behind the adaptor's back, then hands its
    // address out again through it: one live block, its bytes counted once.
    let t = Tracking::new(crate::Shared::new(crate::pool::CoalescingPool::new(BumpUpstream::new(1 << 30))));
    let a = t.allocate(req(1024), &()).unwrap();
    t.upstream().deallocate(a, &()).unwrap();
    let b = t.allocate(req(1024), &()).unwrap();
    assert_eq!(b.addr(), a.addr());
    assert_eq!((t.get_outstanding_allocations().count(), t.get_allocated_bytes()), (1, 1024));
    t.deallocate(b, &()).unwrap();
    assert_eq!((t.get_outstanding_allocations().count(), t.get_allocated_bytes()), (0, 0));
}

#[test]
fn tracking_reports_leaks_at_drop() {
    let seen = Arc::new(Mutex::new(None));
    let up = BumpUpstream::new(1 << 20);
    {
        let s = seen.clone();
        let t = Tracking::new(&up).on_leak(move |r| *s.lock().unwrap() = Some((r.count(), r.bytes())));
        let a = t.allocate(req(64), &()).unwrap();
        t.allocate(req(128), &()).unwrap();
        t.deallocate(a, &()).unwrap();
    }
    assert_eq!(*seen.lock().unwrap(), Some((1, 128)));
    // No leak, no call.
    let seen = Arc::new(Mutex::new(false));
    {
        let s = seen.clone();
        let t = Tracking::new(&up).on_leak(move |_| *s.lock().unwrap() = true);
        let a = t.allocate(req(64), &()).unwrap();
        t.deallocate(a, &()).unwrap();
    }
    assert!(!*seen.lock().unwrap());
}

#[test]
fn tracking_backtraces_off_by_default() {
    let t = Tracking::new(BumpUpstream::new(1 << 20));
    let a = t.allocate(req(64), &()).unwrap();
    assert!(t.get_outstanding_allocations().allocations[0].backtrace.is_none());
    t.deallocate(a, &()).unwrap();
    let t = t.with_backtraces(true);
    let a = t.allocate(req(64), &()).unwrap();
    let report = t.get_outstanding_allocations();
    // Frames whatever RUST_BACKTRACE says: asking for backtraces is the switch.
    let backtrace = report.allocations[0].backtrace.as_ref().expect("a backtrace");
    assert_eq!(backtrace.status(), std::backtrace::BacktraceStatus::Captured);
    assert!(report.to_string().contains(&std::format!("{:#x}: 64 bytes", a.addr())));
    t.deallocate(a, &()).unwrap();
}

// ---------------------------------------------------------------- composition

#[test]
fn adaptors_wrap_by_value_reference_and_arc() {
    let up = Arc::new(BumpUpstream::new(1 << 20));
    let by_arc = Statistics::new(up.clone());
    let by_ref = Limiting::new(&by_arc, 4096);
    let by_value = Tracking::new(Aligned::new(by_ref, 4096, 0).unwrap());
    let dynamic: &dyn MemoryResource = &by_value;
    let b = dynamic.allocate(req(100), &()).unwrap();
    assert_eq!(b.addr() % 4096, 0);
    assert_eq!(by_arc.get_bytes_counter().value, 100);
    dynamic.deallocate(b, &()).unwrap();
    assert_eq!(up.usage().held, 0);
    let erased: DynResource = Arc::new(Statistics::new(up.clone()));
    let b = erased.allocate(req(1), &()).unwrap();
    erased.deallocate(b, &()).unwrap();
}

/// Statistics over limiting over a pool over a bump upstream: 10^5 random
/// operations; after every step the statistics agree exactly with the
/// caller's view and the limit's count with the pool's, and the pool's
/// invariant checker passes.
#[test]
fn stats_over_limit_over_pool_randomized() {
    const LIMIT: u64 = 64 << 20;
    let pool = Shared::new(
        CoalescingPool::with_config(BumpUpstream::new(1 << 40), PoolConfig::new().initial_size(8 << 20), &())
            .unwrap(),
    );
    let limit = Limiting::new(&pool, LIMIT);
    let stats = Statistics::new(&limit);
    let mut rng = SplitMix64::new(0x5eed);
    let mut live = LiveBlocks::new();
    let mut blocks: Vec<Block> = Vec::new();
    let (mut refused, mut peak, mut total, mut count_total) = (0u64, 0u64, 0u64, 0u64);
    for step in 0..crate::testing::steps(100_000) {
        if blocks.is_empty() || rng.below(100) < 52 {
            let size = match rng.below(3) {
                0 => rng.below(1024),
                1 => rng.below(256 << 10),
                _ => rng.below(4 << 20),
            };
            match stats.allocate(req(size), &()) {
                Ok(b) => {
                    live.insert(b, req(size)).unwrap_or_else(|v| panic!("step {step}: {v}"));
                    if !b.is_empty() {
                        blocks.push(b);
                        total += size;
                        count_total += 1;
                    }
                }
                Err(Error::LimitExceeded { used, limit: l, .. }) => {
                    assert_eq!(l, LIMIT);
                    assert!(used + size.div_ceil(256) * 256 > LIMIT);
                    refused += 1;
                }
                Err(e) => panic!("step {step}: {e}"),
            }
        } else {
            let b = blocks.swap_remove(rng.below(blocks.len() as u64) as usize);
            stats.deallocate(b, &()).unwrap();
            live.remove(&b).unwrap();
        }
        peak = peak.max(live.bytes());
        let c = stats.get_bytes_counter();
        assert_eq!(
            (c.value, c.peak, c.total),
            (live.bytes() as i64, peak as i64, total as i64),
            "step {step}"
        );
        assert_eq!(stats.get_allocations_counter().value, live.len() as i64);
        assert_eq!(stats.get_allocations_counter().total, count_total as i64);
        assert_eq!(limit.get_allocated_bytes(), pool.with(|p| p.usage().used), "step {step}");
        assert!(limit.get_allocated_bytes() <= LIMIT);
        pool.with(|p| p.check()).unwrap_or_else(|v| panic!("step {step}: {v}"));
    }
    // (A full run reaches the limit; a short one, under Miri, need not.)
    assert!(refused > 0 || cfg!(miri), "the limit was never reached");
    for b in blocks.drain(..) {
        stats.deallocate(b, &()).unwrap();
    }
    assert_eq!(
        (stats.get_bytes_counter().value, limit.get_allocated_bytes(), pool.with(|p| p.usage().used)),
        (0, 0, 0)
    );
}

/// The exclusive form inside the pool's lock: 10^5 random operations,
/// failed ones included; after every step the counters agree exactly with
/// the caller's view and the pool's checker passes.
#[test]
fn stats_inside_the_lock_randomized() {
    let config = PoolConfig::new().maximum_size(256 << 20);
    let shared = Shared::new(Statistics::new(
        CoalescingPool::with_config(BumpUpstream::new(1 << 40), config, &()).unwrap(),
    ));
    let mut rng = SplitMix64::new(0x1c0c);
    let mut live = LiveBlocks::new();
    let mut blocks: Vec<Block> = Vec::new();
    let (mut peak, mut total, mut failed) = (0u64, 0u64, 0u64);
    for step in 0..crate::testing::steps(100_000) {
        if blocks.is_empty() || rng.below(100) < 53 {
            let size = rng.below(4 << 20);
            match shared.allocate(req(size), &()) {
                Ok(b) => {
                    live.insert(b, req(size)).unwrap_or_else(|v| panic!("step {step}: {v}"));
                    if !b.is_empty() {
                        blocks.push(b);
                        total += size;
                    }
                }
                Err(Error::OutOfMemory { .. }) => failed += 1,
                Err(e) => panic!("step {step}: {e}"),
            }
        } else if rng.below(50) == 0 {
            // A bad free is refused and counts nothing.
            let b = blocks[rng.below(blocks.len() as u64) as usize];
            assert!(shared.deallocate(Block::from_addr(b.addr() + 256, 1), &()).is_err());
        } else {
            let b = blocks.swap_remove(rng.below(blocks.len() as u64) as usize);
            shared.deallocate(b, &()).unwrap();
            live.remove(&b).unwrap();
        }
        peak = peak.max(live.bytes());
        shared.with(|s| {
            let c = s.get_bytes_counter();
            assert_eq!(
                (c.value, c.peak, c.total),
                (live.bytes() as i64, peak as i64, total as i64),
                "step {step}"
            );
            assert_eq!(s.get_allocations_counter().value, live.len() as i64);
            s.upstream().check().unwrap_or_else(|v| panic!("step {step}: {v}"));
        });
    }
    // (A full run reaches the maximum; a short one, under Miri, need not.)
    assert!(failed > 0 || cfg!(miri), "the maximum was never reached");
}

/// An upstream outside the contract: its blocks claim `u64::MAX` bytes.
struct ClaimsEverything(BumpUpstream);

impl MemoryResource for ClaimsEverything {
    fn allocate(&self, request: Request, s: &()) -> crate::Result<Block> {
        let b = self.0.allocate(request, s)?;
        Ok(Block::new(b.addr(), u64::MAX, b.tag()))
    }
    fn deallocate(&self, block: Block, s: &()) -> crate::Result<()> {
        self.0.deallocate(Block::from_addr(block.addr(), 256), s)
    }
}

/// Blocks whose sizes sum past `u64::MAX` overflowed the tracking
/// adaptor's count (a panic under the table's lock, the block lost).
#[test]
fn tracking_counts_blocks_whose_sizes_overflow_without_a_panic() {
    let t = Tracking::new(ClaimsEverything(BumpUpstream::new(1 << 20)));
    let a = t.allocate(req(256), &()).unwrap();
    let b = t.allocate(req(256), &()).unwrap();
    assert_eq!(t.get_outstanding_allocations().count(), 2);
    assert_eq!(t.get_outstanding_allocations().bytes(), u64::MAX, "the report's sum saturates");
    t.deallocate(a, &()).unwrap();
    t.deallocate(b, &()).unwrap();
    assert_eq!((t.get_outstanding_allocations().count(), t.get_allocated_bytes()), (0, 0));
}
