//! Test doubles for examples, tests and fuzzing (feature `testing`; the
//! core's own unit tests have them always).
//!
//! They need nothing but the core, so that the core's tests can use them:
//! an upstream that hands out numbers ([`BumpUpstream`], with injected
//! failures and panics), streams known by
//! an id ([`IdStream`], [`TestStream`] with injected `synchronize`
//! failures, [`PanickingStream`] with injected panics, by a [`PanicTrap`]
//! that other doubles use too), the deterministic generator of
//! workloads and randomized tests ([`SplitMix64`]) and a check that work
//! waits for a lock held (`waits_for`, feature `std`); under `--cfg loom`,
//! module `loom` runs the loom models of the core and the workspace. The
//! simulated device, streams with a happens-before checker and address
//! space live in `memres-sim`; fault injection of those is
//! [`FailNth`](crate::check::FailNth).

use crate::check::Violation;
#[cfg(feature = "alloc")]
use crate::primitive::AtomicBool;
use crate::primitive::{AtomicU64, Ordering};
pub use crate::splitmix::SplitMix64;
use crate::{Block, Error, Inspect, MemoryResource, Request, Result, Stream, Usage};
#[cfg(feature = "alloc")]
use alloc::sync::Arc;

/// An upstream that hands out fresh, never-reused address ranges from a
/// counter, up to a capacity, and counts the bytes it holds out (a leaf's
/// [`Usage`]). Frees are only counted (it cannot tell a bad free: use
/// `SimDevice` for that).
///
/// # Examples
///
/// ```
/// use memres_core::{testing::BumpUpstream, Inspect, MemoryResource, Request};
/// let up = BumpUpstream::new(1024);
/// let b = up.allocate(Request::new(512)?, &())?;
/// assert_eq!(up.usage().held, 512);
/// assert!(up.allocate(Request::new(1024)?, &()).is_err());
/// up.deallocate(b, &())?;
/// assert_eq!((up.usage().held, up.usage().peak_held), (0, 512));
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct BumpUpstream {
    capacity: u64,
    /// Next address to hand out; starts at 1 MiB so that 0 is never valid.
    next: AtomicU64,
    /// Bytes handed out and not yet freed (sizes rounded to 256).
    outstanding: AtomicU64,
    /// The most bytes outstanding at once.
    peak: AtomicU64,
    /// Allocations to let through before every call fails (`u64::MAX`: never).
    fail_after: AtomicU64,
    /// Calls of `allocate`, and of `deallocate`, to let through before one
    /// panics (`u64::MAX`: none).
    panic_after: [AtomicU64; 2],
    /// The address whose free is refused (0: none).
    refused: AtomicU64,
}

impl BumpUpstream {
    /// An upstream that holds at most `capacity` bytes outstanding.
    pub fn new(capacity: u64) -> Self {
        BumpUpstream {
            capacity,
            next: AtomicU64::new(1 << 20),
            outstanding: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            fail_after: AtomicU64::new(u64::MAX),
            panic_after: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
            refused: AtomicU64::new(0),
        }
    }

    /// Refuses every free of the block at `addr` (`Backend`, nothing
    /// freed), until told another address (0: none): an upstream that
    /// will not take a chunk back.
    ///
    /// ```
    /// use memres_core::{testing::BumpUpstream, Error, Inspect, MemoryResource, Request};
    /// let up = BumpUpstream::new(1 << 20);
    /// let b = up.allocate(Request::new(256)?, &())?;
    /// up.refuse_free_at(b.addr());
    /// assert!(matches!(up.deallocate(b, &()), Err(Error::Backend { .. })));
    /// assert_eq!(up.usage().held, 256);
    /// up.refuse_free_at(0);
    /// up.deallocate(b, &())?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn refuse_free_at(&self, addr: u64) {
        self.refused.store(addr, Ordering::Relaxed);
    }

    /// Lets `n` more allocations succeed, then fails every later one.
    pub fn fail_after(&self, n: u64) {
        self.fail_after.store(n, Ordering::Relaxed);
    }

    /// Makes `method` (`"allocate"` or `"deallocate"`) panic once, after
    /// `skip` calls of it pass: a user's upstream that breaks mid-call. The
    /// call that panics changes nothing (a block whose free panicked stays
    /// held).
    ///
    /// ```
    /// use memres_core::{testing::BumpUpstream, Inspect, MemoryResource, Request};
    /// let up = BumpUpstream::new(1 << 20);
    /// let b = up.allocate(Request::new(256)?, &())?;
    /// up.panic_in("deallocate", 0);
    /// let freed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| up.deallocate(b, &())));
    /// assert!(freed.is_err());
    /// assert_eq!(up.usage().held, 256);
    /// up.deallocate(b, &())?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    ///
    /// # Panics
    ///
    /// For another method name.
    pub fn panic_in(&self, method: &'static str, skip: u64) {
        let i = match method {
            "allocate" => 0,
            "deallocate" => 1,
            _ => panic!("BumpUpstream::panic_in: no method `{method}`"),
        };
        self.panic_after[i].store(skip, Ordering::Relaxed);
    }

    /// Panics if the call of method `i` is the one armed to.
    fn call(&self, i: usize) {
        let left = &self.panic_after[i];
        match left.load(Ordering::Relaxed) {
            u64::MAX => {}
            0 => {
                left.store(u64::MAX, Ordering::Relaxed);
                panic!("BumpUpstream: `{}` panics", ["allocate", "deallocate"][i]);
            }
            n => left.store(n - 1, Ordering::Relaxed),
        }
    }
}

impl<S: Stream + ?Sized> MemoryResource<S> for BumpUpstream {
    fn allocate(&self, request: Request, _: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        self.call(0);
        let left = self.fail_after.load(Ordering::Relaxed);
        if left == 0 {
            return Err(Error::Backend { code: -1, what: "injected upstream failure" });
        }
        if left != u64::MAX {
            self.fail_after.store(left - 1, Ordering::Relaxed);
        }
        let size = request.rounded_size(256);
        let out = self.outstanding.load(Ordering::Relaxed);
        if out.checked_add(size).is_none_or(|total| total > self.capacity) {
            return Err(Error::OutOfMemory {
                requested: request.size(),
                largest_free: self.capacity.saturating_sub(out),
                pool_size: self.capacity,
                max_size: Some(self.capacity),
            });
        }
        let now = self.outstanding.fetch_add(size, Ordering::Relaxed) + size;
        self.peak.fetch_max(now, Ordering::Relaxed);
        let align = request.align();
        let addr = self.next.fetch_add(size + align, Ordering::Relaxed);
        let addr = (addr + align - 1) & !(align - 1);
        Ok(Block::new(addr, request.size(), 0))
    }

    fn deallocate(&self, block: Block, _: &S) -> Result<()> {
        self.call(1);
        if block.addr() == self.refused.load(Ordering::Relaxed) && !block.is_empty() {
            return Err(Error::Backend { code: -2, what: "injected refusal of a free" });
        }
        // A caller's block may be of any size: rounded and counted off
        // without overflow, so a stale or made-up one cannot panic here.
        let size = block.size().checked_next_multiple_of(256).unwrap_or(u64::MAX);
        let _ = self
            .outstanding
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |out| Some(out.saturating_sub(size)));
        Ok(())
    }
}

/// A leaf: it holds what it handed out.
impl Inspect for BumpUpstream {
    fn usage(&self) -> Usage {
        Usage::leaf(self.outstanding.load(Ordering::Relaxed), self.peak.load(Ordering::Relaxed))
    }
    fn check(&self) -> core::result::Result<(), Violation> {
        Ok(())
    }
}

/// A stream known only by its id, whose work is always complete: for
/// resources that key state by stream (per-stream arenas, free lists, logs)
/// in tests and examples with no device behind them.
///
/// # Examples
///
/// ```
/// use memres_core::{testing::IdStream, Stream};
/// let s = IdStream(7);
/// assert_eq!(s.id(), 7);
/// assert!(s.query(&s.record()?)?);
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IdStream(pub u64);

impl Stream for IdStream {
    type Event = ();
    fn id(&self) -> u64 {
        self.0
    }
    fn record(&self) -> Result<()> {
        Ok(())
    }
    fn wait(&self, _: &()) -> Result<()> {
        Ok(())
    }
    fn query(&self, _: &()) -> Result<bool> {
        Ok(true)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn synchronize_device(&self) -> Result<bool> {
        Ok(true)
    }
}

/// A stream known by its id whose chosen method panics once: a user's
/// `Stream`, safe to write, that breaks mid-call. What a resource is left
/// with after such a panic is caught is what its tests check.
///
/// ```
/// use memres_core::{testing::PanickingStream, Stream};
/// let s = PanickingStream::new(3);
/// s.panic_in("id", 1); // the second call of `id` panics
/// assert_eq!(s.id(), 3);
/// assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.id())).is_err());
/// assert_eq!(s.id(), 3);
/// ```
#[derive(Clone, Debug, Default)]
pub struct PanickingStream {
    id: u64,
    trap: PanicTrap,
}

impl PanickingStream {
    /// A stream of id `id` that panics nowhere yet.
    pub fn new(id: u64) -> Self {
        PanickingStream { id, trap: PanicTrap::new() }
    }

    /// Makes `method` (`"id"`, `"record"`, `"wait"`, `"query"`,
    /// `"synchronize"`, `"synchronize_device"`) panic once, after `skip`
    /// calls of it pass.
    pub fn panic_in(&self, method: &'static str, skip: u32) {
        self.trap.arm(method, skip);
    }

    /// Panics nowhere from now on.
    pub fn disarm(&self) {
        self.trap.disarm();
    }

    fn call(&self, method: &'static str) {
        self.trap.spring("PanickingStream", method);
    }
}

/// Which method of a test double panics, once, and after how many calls
/// of it pass: user code that breaks mid-call ([`PanickingStream`], a test
/// space). Not `Sync`: for doubles used on one thread.
///
/// ```
/// let trap = memres_core::testing::PanicTrap::new();
/// trap.arm("commit", 1);
/// trap.spring("Space", "decommit"); // another method: nothing
/// trap.spring("Space", "commit"); // the first call passes
/// let spring = std::panic::AssertUnwindSafe(|| trap.spring("Space", "commit"));
/// assert!(std::panic::catch_unwind(spring).is_err());
/// trap.spring("Space", "commit"); // once only
/// ```
#[derive(Clone, Debug, Default)]
pub struct PanicTrap {
    /// The method that panics, after how many calls of it pass.
    armed: core::cell::Cell<Option<(&'static str, u32)>>,
}

impl PanicTrap {
    /// A trap armed for nothing.
    pub const fn new() -> Self {
        PanicTrap { armed: core::cell::Cell::new(None) }
    }

    /// Makes the call of `method` after `skip` calls of it panic.
    pub fn arm(&self, method: &'static str, skip: u32) {
        self.armed.set(Some((method, skip)));
    }

    /// Panics nowhere from now on.
    pub fn disarm(&self) {
        self.armed.set(None);
    }

    /// Called first in `method` of `who`: panics if it is the call armed.
    pub fn spring(&self, who: &str, method: &'static str) {
        match self.armed.get() {
            Some((m, 0)) if m == method => {
                self.armed.set(None);
                panic!("{who}: `{method}` panics");
            }
            Some((m, skip)) if m == method => self.armed.set(Some((m, skip - 1))),
            _ => {}
        }
    }
}

impl Stream for PanickingStream {
    type Event = ();
    fn id(&self) -> u64 {
        self.call("id");
        self.id
    }
    fn record(&self) -> Result<()> {
        self.call("record");
        Ok(())
    }
    fn wait(&self, _: &()) -> Result<()> {
        self.call("wait");
        Ok(())
    }
    fn query(&self, _: &()) -> Result<bool> {
        self.call("query");
        Ok(true)
    }
    fn synchronize(&self) -> Result<()> {
        self.call("synchronize");
        Ok(())
    }
    fn synchronize_device(&self) -> Result<bool> {
        self.call("synchronize_device");
        Ok(true)
    }
}

/// The number of steps a randomized test takes: `n`, or under Miri, which
/// interprets each step thousands of times slower (an invariant checker
/// that walks every bin takes some 0.1 s there), a five-thousandth of it (at
/// least 10, or `n` if smaller). CI runs the unit tests under Miri, where a
/// short run still finds undefined behaviour on every path it takes.
///
/// ```
/// use memres_core::testing::steps;
/// assert_eq!(steps(100_000), if cfg!(miri) { 20 } else { 100_000 });
/// assert_eq!(steps(500), if cfg!(miri) { 10 } else { 500 });
/// assert_eq!(steps(8), 8);
/// ```
pub const fn steps(n: usize) -> usize {
    const MIN: usize = 10;
    if !cfg!(miri) || n <= MIN {
        n
    } else if n / 5000 > MIN {
        n / 5000
    } else {
        MIN
    }
}

/// The error of a [`TestStream`]'s injected `synchronize` failure: a backend
/// error of its own, so that a test tells it from an upstream's.
///
/// # Examples
///
/// ```
/// use memres_core::testing::{TestStream, SYNC_FAILURE};
/// use memres_core::Stream;
/// let s = TestStream::new(1);
/// s.faults().fail_nth(1);
/// assert_eq!(s.synchronize(), Err(SYNC_FAILURE));
/// ```
#[cfg(feature = "alloc")]
pub const SYNC_FAILURE: Error =
    Error::Backend { code: 5, what: "injected failure of a test stream's synchronize" };

/// Whether `work`, run on a thread of its own, waits for `held` (a lock
/// the caller took): not done 200 ms in, and done once `held` is dropped,
/// which this waits for (feature `std`).
///
/// ```
/// use memres_core::testing::waits_for;
/// use std::sync::{Arc, Mutex};
/// let lock = Arc::new(Mutex::new(()));
/// let other = lock.clone();
/// assert!(waits_for(lock.lock().unwrap(), move || drop(other.lock().unwrap())));
/// assert!(!waits_for((), || ()));
/// ```
#[cfg(feature = "std")]
pub fn waits_for<H>(held: H, work: impl FnOnce() + Send + 'static) -> bool {
    let (done, finished) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        work();
        let _ = done.send(());
    });
    let waited = finished.recv_timeout(std::time::Duration::from_millis(200)).is_err();
    drop(held);
    let _ = finished.recv();
    thread.join().expect("the work panicked");
    waited
}

/// What [`TestStream`]s count and inject: their `synchronize` calls, and
/// the failures of those calls. Streams that share one (through an `Arc`)
/// share counts and faults, as streams of one device share its failures
/// (feature `alloc`, as [`TestStream`]).
///
/// A call fails, with [`SYNC_FAILURE`], while failing is on
/// ([`set_failing`](Self::set_failing)) or when it is the one armed by
/// [`fail_nth`](Self::fail_nth); a failed call is counted apart from the
/// ones that succeeded.
///
/// # Examples
///
/// ```
/// use memres_core::testing::{SyncFaults, TestStream};
/// use memres_core::Stream;
/// use std::sync::Arc;
/// let faults = Arc::new(SyncFaults::new());
/// let (a, b) = (TestStream::with_faults(1, faults.clone()), TestStream::with_faults(2, faults.clone()));
/// a.synchronize()?;
/// faults.fail_nth(2);
/// b.synchronize()?;
/// assert!(a.synchronize().is_err());
/// assert_eq!((faults.syncs(), faults.failed_syncs()), (2, 1));
/// # Ok::<(), memres_core::Error>(())
/// ```
#[cfg(feature = "alloc")]
#[derive(Debug)]
pub struct SyncFaults {
    /// Every call fails while set.
    failing: AtomicBool,
    /// Calls to go until the one that fails (1: the next; 0: none armed).
    fail_in: AtomicU64,
    /// Calls that succeeded.
    syncs: AtomicU64,
    /// Calls made to fail.
    failed: AtomicU64,
    /// `synchronize_device` calls that succeeded (also counted in `syncs`).
    device_syncs: AtomicU64,
}

#[cfg(feature = "alloc")]
impl SyncFaults {
    /// Nothing counted, no failure armed.
    ///
    /// ```
    /// let f = memres_core::testing::SyncFaults::new();
    /// assert_eq!((f.syncs(), f.failed_syncs()), (0, 0));
    /// ```
    pub fn new() -> Self {
        SyncFaults {
            failing: AtomicBool::new(false),
            fail_in: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            device_syncs: AtomicU64::new(0),
        }
    }

    /// Makes every `synchronize` fail from now on (`true`) or lets them
    /// succeed again (`false`; a call armed by [`fail_nth`](Self::fail_nth)
    /// still fails).
    ///
    /// ```
    /// use memres_core::{testing::TestStream, Stream};
    /// let s = TestStream::new(0);
    /// s.faults().set_failing(true);
    /// assert!(s.synchronize().is_err() && s.synchronize().is_err());
    /// s.faults().set_failing(false);
    /// assert!(s.synchronize().is_ok());
    /// ```
    pub fn set_failing(&self, on: bool) {
        self.failing.store(on, Ordering::Relaxed);
    }

    /// Makes the `n`th `synchronize` from now fail (`n = 1`: the next one),
    /// once; `n = 0` cancels.
    ///
    /// ```
    /// use memres_core::{testing::TestStream, Stream};
    /// let s = TestStream::new(0);
    /// s.faults().fail_nth(2);
    /// assert!(s.synchronize().is_ok());
    /// assert!(s.synchronize().is_err());
    /// assert!(s.synchronize().is_ok());
    /// ```
    pub fn fail_nth(&self, n: u64) {
        self.fail_in.store(n, Ordering::Relaxed);
    }

    /// The `synchronize` calls that succeeded.
    ///
    /// ```
    /// use memres_core::{testing::TestStream, Stream};
    /// let s = TestStream::new(0);
    /// s.synchronize()?;
    /// assert_eq!(s.faults().syncs(), 1);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// The `synchronize` calls made to fail.
    ///
    /// ```
    /// use memres_core::{testing::TestStream, Stream};
    /// let s = TestStream::new(0);
    /// s.faults().fail_nth(1);
    /// assert!(s.synchronize().is_err());
    /// assert_eq!((s.faults().syncs(), s.faults().failed_syncs()), (0, 1));
    /// ```
    pub fn failed_syncs(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// The `synchronize_device` calls that succeeded (of streams made with
    /// [`TestStream::device_sync`]); each is also one of [`syncs`](Self::syncs).
    ///
    /// ```
    /// use memres_core::{testing::TestStream, Stream};
    /// let s = TestStream::new(1).device_sync(true);
    /// assert!(s.synchronize_device()?);
    /// assert_eq!((s.faults().syncs(), s.faults().device_syncs()), (1, 1));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn device_syncs(&self) -> u64 {
        self.device_syncs.load(Ordering::Relaxed)
    }

    /// One `synchronize`: counts it and fails it if asked to.
    fn synchronize(&self) -> Result<()> {
        // The armed call counts down on every call, failed or not.
        let armed = self.fail_in.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if self.failing.load(Ordering::Relaxed) || armed == Ok(1) {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return Err(SYNC_FAILURE);
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(feature = "alloc")]
impl Default for SyncFaults {
    fn default() -> Self {
        Self::new()
    }
}

/// A stream with an id whose work is always complete, and whose
/// `synchronize` calls are counted and can be made to fail, through its
/// [`SyncFaults`] (feature `alloc`).
///
/// A clone shares the original's faults; so do streams made by
/// [`with_faults`](Self::with_faults) from one `Arc`. `KIND` only makes
/// distinct stream types, for what is keyed by stream type (the device
/// registry): [`new`](TestStream::new) and
/// [`with_faults`](TestStream::with_faults) make kind 0 (so that it need not
/// be named), `default` any kind, of id 0.
///
/// # Examples
///
/// ```
/// use memres_core::{testing::TestStream, Stream};
/// let s = TestStream::new(7);
/// assert_eq!(s.id(), 7);
/// assert!(s.query(&s.record()?)?);
/// s.synchronize()?;
/// assert_eq!(s.faults().syncs(), 1);
/// // Another type, of id 0.
/// let other = TestStream::<1>::default();
/// assert_eq!(other.id(), 0);
/// # Ok::<(), memres_core::Error>(())
/// ```
#[cfg(feature = "alloc")]
#[derive(Clone, Debug, Default)]
pub struct TestStream<const KIND: u32 = 0> {
    id: u64,
    faults: Arc<SyncFaults>,
    /// Whether `synchronize_device` can.
    device: bool,
}

#[cfg(feature = "alloc")]
impl TestStream {
    /// A stream of id `id` with faults of its own.
    ///
    /// ```
    /// use memres_core::{testing::TestStream, Stream};
    /// assert_eq!(TestStream::new(3).id(), 3);
    /// ```
    pub fn new(id: u64) -> Self {
        Self::with_faults(id, Arc::default())
    }

    /// A stream of id `id` that counts and fails with `faults`, which other
    /// streams may share.
    ///
    /// ```
    /// use memres_core::testing::{SyncFaults, TestStream};
    /// use memres_core::Stream;
    /// use std::sync::Arc;
    /// let faults = Arc::new(SyncFaults::new());
    /// let s = TestStream::with_faults(1, faults.clone());
    /// faults.set_failing(true);
    /// assert!(s.synchronize().is_err());
    /// ```
    pub fn with_faults(id: u64, faults: Arc<SyncFaults>) -> Self {
        TestStream { id, faults, device: false }
    }
}

#[cfg(feature = "alloc")]
impl<const KIND: u32> TestStream<KIND> {
    /// What this stream counts and injects.
    ///
    /// ```
    /// use memres_core::{testing::TestStream, Stream};
    /// let s = TestStream::new(1);
    /// let t = s.clone();
    /// t.synchronize()?;
    /// assert_eq!(s.faults().syncs(), 1);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn faults(&self) -> &Arc<SyncFaults> {
        &self.faults
    }

    /// Whether [`synchronize_device`](Stream::synchronize_device) can (the
    /// default: it cannot, and answers `Ok(false)`); when it can, it is
    /// one more `synchronize` to its faults, counted and failed as those.
    ///
    /// ```
    /// use memres_core::{testing::TestStream, Stream};
    /// assert!(!TestStream::new(1).synchronize_device()?);
    /// let s = TestStream::new(1).device_sync(true);
    /// s.faults().fail_nth(1);
    /// assert!(s.synchronize_device().is_err());
    /// assert!(s.synchronize_device()?);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn device_sync(mut self, can: bool) -> Self {
        self.device = can;
        self
    }
}

#[cfg(feature = "alloc")]
/// An [`IdStream`] whose `synchronize` goes through its faults.
impl<const KIND: u32> Stream for TestStream<KIND> {
    type Event = ();
    fn id(&self) -> u64 {
        self.id
    }
    fn record(&self) -> Result<()> {
        IdStream(self.id).record()
    }
    fn wait(&self, event: &()) -> Result<()> {
        IdStream(self.id).wait(event)
    }
    fn query(&self, event: &()) -> Result<bool> {
        IdStream(self.id).query(event)
    }
    fn synchronize(&self) -> Result<()> {
        self.faults.synchronize()
    }
    fn synchronize_device(&self) -> Result<bool> {
        if !self.device {
            return Ok(false);
        }
        self.faults.synchronize()?;
        self.faults.device_syncs.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }
}

/// How the loom models (the core's, its arena's and the workspace's) run:
/// `RUSTFLAGS="--cfg loom"` builds only.
#[cfg(all(loom, feature = "alloc"))]
pub mod loom {
    use ::loom::thread;
    use alloc::sync::Arc;

    /// Explores every interleaving of `f` within `preemptions` preemptions
    /// (all of them for `None`), on a thread with room for a pool's or an
    /// arena's index on its stack (bin heads inline), which loom's default
    /// coroutine stack of 32 KiB is not. Once `f` is done it waits until
    /// every thread has given back its number for the arena's per-thread
    /// arenas: loom destroys a thread's thread-locals after its `join`
    /// returns, and its statics when the execution ends.
    pub fn model(preemptions: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
        let mut b = ::loom::model::Builder::new();
        b.preemption_bound = preemptions;
        let f = Arc::new(f);
        b.check(move || {
            let f = f.clone();
            spawn(move || f()).join().unwrap();
            // Before loom drops the statics that the numbers go back to.
            #[cfg(feature = "std")]
            while !crate::arena::thread_numbers_given_back() {
                thread::yield_now();
            }
        });
    }

    /// A loom thread with the stack [`model`]'s threads have (4 MiB).
    pub fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
        thread::Builder::new().stack_size(4 << 20).spawn(f).unwrap()
    }
}

/// What the [`LoggedStream`]s sharing it were asked, for the tests of the
/// stream-ordered layers.
#[cfg(all(test, feature = "alloc"))]
#[derive(Debug, Default)]
pub(crate) struct StreamLog {
    /// The stream of each record.
    pub(crate) records: alloc::vec::Vec<u64>,
    /// (waiting stream, stream the event was recorded on).
    pub(crate) waits: alloc::vec::Vec<(u64, u64)>,
    /// The stream of each `synchronize`.
    pub(crate) syncs: alloc::vec::Vec<u64>,
    /// `synchronize_device` calls.
    pub(crate) device_syncs: u64,
    /// `id` calls (the stream-ordered layer and the per-stream pool read
    /// it once per call).
    pub(crate) ids: u64,
    /// What every query answers.
    pub(crate) complete: bool,
    /// Whether `record` fails.
    pub(crate) fail_record: bool,
    /// A wait on an event of this stream fails.
    pub(crate) fail_wait_on: Option<u64>,
    /// This stream's `synchronize` fails.
    pub(crate) fail_sync_of: Option<u64>,
    /// Whether `synchronize_device` can.
    pub(crate) device: bool,
    /// A block of an upstream that `synchronize_device` frees: memory that
    /// comes free when the device is idle (another stream's frees done).
    pub(crate) freed_at_device_sync: Option<(alloc::sync::Arc<BumpUpstream>, Block)>,
}

/// A stream whose events name the stream they were recorded on, and which
/// logs what it is asked in the [`StreamLog`] it shares with the test.
#[cfg(all(test, feature = "alloc"))]
#[derive(Clone, Debug)]
pub(crate) struct LoggedStream {
    pub(crate) id: u64,
    pub(crate) log: alloc::rc::Rc<core::cell::RefCell<StreamLog>>,
}

#[cfg(all(test, feature = "alloc"))]
impl Stream for LoggedStream {
    /// The id of the stream it was recorded on.
    type Event = u64;
    fn id(&self) -> u64 {
        self.log.borrow_mut().ids += 1;
        self.id
    }
    fn record(&self) -> Result<u64> {
        let mut log = self.log.borrow_mut();
        if log.fail_record {
            return Err(Error::Backend { code: 1, what: "record" });
        }
        log.records.push(self.id);
        Ok(self.id)
    }
    fn wait(&self, e: &u64) -> Result<()> {
        if self.log.borrow().fail_wait_on == Some(*e) {
            return Err(crate::Error::Backend { code: 3, what: "injected failure of a wait" });
        }
        self.log.borrow_mut().waits.push((self.id, *e));
        Ok(())
    }
    fn query(&self, _: &u64) -> Result<bool> {
        Ok(self.log.borrow().complete)
    }
    fn synchronize(&self) -> Result<()> {
        if self.log.borrow().fail_sync_of == Some(self.id) {
            return Err(SYNC_FAILURE);
        }
        self.log.borrow_mut().syncs.push(self.id);
        Ok(())
    }
    fn synchronize_device(&self) -> Result<bool> {
        let mut log = self.log.borrow_mut();
        log.device_syncs += 1;
        if let Some((up, block)) = log.freed_at_device_sync.take() {
            MemoryResource::<()>::deallocate(&*up, block, &())?;
        }
        Ok(log.device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bump_upstream_takes_a_made_up_block_of_any_size_without_overflow() {
        let up = BumpUpstream::new(1 << 20);
        let b = up.allocate(Request::new(1000).unwrap(), &()).unwrap();
        assert!(up.deallocate(Block::new(1 << 20, u64::MAX, 0), &()).is_ok());
        up.deallocate(b, &()).unwrap();
        assert_eq!(up.usage().held, 0);
        assert!(up.allocate(Request::new(Request::MAX_SIZE).unwrap(), &()).is_err());
    }
}
