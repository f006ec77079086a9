//! Pluggable locks and [`Shared`], the wrapper that makes a `&mut self`
//! algorithm a shareable `&self` resource.
//!
//! The algorithms of the core are plain state machines. Which lock guards
//! them is the user's choice, as with `lock_api`:
//!
//! | lock | feature | for |
//! | --- | --- | --- |
//! | [`SpinLock`] | always (over atomics built from critical sections where the target has no compare-and-swap: `critical-section`) | `no_std` targets with atomics; short critical sections |
//! | `StdLock` | `std` | threads that should sleep, not spin, under contention |
//! | `CriticalSectionLock` | `critical-section` | bare-metal targets without atomics |
//!
//! Under `cfg(loom)` the spin lock is built from loom's atomics, so loom
//! explores every interleaving of the code that uses it.

use crate::check::Violation;
use crate::primitive::{spin_loop, AtomicBool, Ordering, UnsafeCell};
use crate::{Block, Error, Inspect, MemoryResource, MemoryResourceMut, Request, Result, Stream, Usage};
use core::fmt;

/// A lock that runs a closure with exclusive access.
///
/// # Safety
///
/// For each lock value, an implementation guarantees:
///
/// - **Mutual exclusion, re-entry included.** Neither method runs a closure
///   while another closure of the same lock is running: one on another
///   thread, or the very closure the call is made from (a call on the same
///   thread from inside a closure of this lock). Such a call must wait until
///   the running closure has returned (for a re-entrant call that is never:
///   a deadlock), panic, or return `None` from
///   [`try_with_lock`](Self::try_with_lock); it must never run its closure.
///   A lock that lets its holder in again, as a re-entrant mutex or a bare
///   `critical_section::with` does, is not a `RawLock`.
/// - **Order.** Each closure's effects happen-before the start of the next
///   closure of the same lock.
/// - **The caller's thread, once.** A closure runs on the thread that
///   called, at most once, before the call returns (`Some` or the value:
///   it ran; `None`: it did not). It may hold what is neither `Send` nor
///   `Sync`.
///
/// [`Shared`] relies on both to hand out `&mut` access to what it guards.
///
/// | lock | a re-entrant call |
/// | --- | --- |
/// | [`SpinLock`] | spins forever (deadlock) |
/// | `StdLock` | deadlocks or panics (`std::sync::Mutex` leaves it open which) |
/// | `CriticalSectionLock` | is refused: `None`, or a panic from [`with_lock`](Self::with_lock) |
///
/// # Examples
///
/// ```
/// use memres_core::lock::{RawLock, SpinLock};
/// let lock = SpinLock::default();
/// assert_eq!(lock.with_lock(|| 1 + 1), 2);
/// assert_eq!(lock.try_with_lock(|| 3), Some(3));
/// ```
pub unsafe trait RawLock: Default {
    /// Runs `f` while holding the lock, or returns `None` without running it
    /// when this is a re-entrant call that the lock refuses.
    fn try_with_lock<T>(&self, f: impl FnOnce() -> T) -> Option<T>;

    /// Runs `f` while holding the lock.
    ///
    /// # Panics
    ///
    /// If the lock refuses this call as re-entrant (see the table above).
    #[inline]
    fn with_lock<T>(&self, f: impl FnOnce() -> T) -> T {
        self.try_with_lock(f).unwrap_or_else(|| reentered())
    }
}

/// The panic of a refused re-entrant call where there is no error to return.
#[cold]
#[inline(never)]
fn reentered() -> ! {
    panic!("re-entrant call into a lock from inside its own closure (refused: it would alias `&mut`)")
}

/// A test-and-test-and-set spin lock: `no_std`, no allocation, one byte.
///
/// Memres's critical sections are short (an O(1) index update), which is
/// where spinning beats sleeping.
///
/// # Examples
///
/// ```
/// use memres_core::lock::{RawLock, SpinLock};
/// let lock = SpinLock::default();
/// let mut n = 0;
/// lock.with_lock(|| n += 1);
/// assert_eq!(n, 1);
/// ```
#[derive(Default)]
pub struct SpinLock {
    /// `true` while some caller runs its closure.
    locked: AtomicBool,
}

impl fmt::Debug for SpinLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpinLock").field("locked", &self.locked.load(Ordering::Relaxed)).finish()
    }
}

/// Releases the spin lock when dropped, so a panicking closure does not
/// leave it held forever.
struct SpinGuard<'a>(&'a AtomicBool);

impl Drop for SpinGuard<'_> {
    // Inlined into the callers' crates: an out-of-line call here makes every
    // locked allocation spill its result around it.
    #[inline]
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

// SAFETY: the compare-exchange from `false` to `true` succeeds for one caller
// at a time (mutual exclusion); a re-entrant call finds `locked` set by its
// own caller and spins forever, never reaching `f`. The `Acquire` pairs with
// the `Release` store of the guard, so each closure's effects happen-before
// the next one's.
unsafe impl RawLock for SpinLock {
    #[inline]
    fn try_with_lock<T>(&self, f: impl FnOnce() -> T) -> Option<T> {
        while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            while self.locked.load(Ordering::Relaxed) {
                spin_loop();
            }
        }
        let _guard = SpinGuard(&self.locked);
        Some(f())
    }
}

/// A lock over `std::sync::Mutex`: threads sleep under contention.
///
/// A panic inside a closure does not poison the lock for later callers: the
/// algorithms keep their invariants at every step that can panic. A
/// re-entrant call deadlocks or panics.
///
/// # Examples
///
/// ```
/// use memres_core::lock::{RawLock, StdLock};
/// assert_eq!(StdLock::default().with_lock(|| 7), 7);
/// ```
#[cfg(feature = "std")]
#[derive(Debug, Default)]
pub struct StdLock(std::sync::Mutex<()>);

// SAFETY: `Mutex` gives mutual exclusion and orders its critical sections;
// `Mutex::lock` from the thread that holds it "will not return" (std's
// words: it deadlocks or panics), so a re-entrant call never reaches `f`.
#[cfg(feature = "std")]
unsafe impl RawLock for StdLock {
    #[inline]
    fn try_with_lock<T>(&self, f: impl FnOnce() -> T) -> Option<T> {
        let _guard = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Some(f())
    }
}

/// A lock for bare-metal targets: the closure runs inside a critical section
/// of the `critical-section` crate (interrupts off on a single core, or the
/// platform's own implementation).
///
/// Critical sections nest, so the lock keeps a flag of its own, set while
/// one of its closures runs: a re-entrant call (from inside a closure of the
/// same lock, through an upstream that calls back, say) is refused, never
/// run. [`Shared`] turns the refusal into [`Error::Reentrant`] where it can
/// return an error and into a panic in [`Shared::with`].
///
/// # Examples
///
/// ```
/// use memres_core::lock::{CriticalSectionLock, RawLock};
/// let lock = CriticalSectionLock::default();
/// assert_eq!(lock.with_lock(|| 3), 3);
/// assert_eq!(lock.with_lock(|| lock.try_with_lock(|| 4)), None);
///
/// // Through `Shared`: the nested call is an error, and nothing ran.
/// use memres_core::{lock::Shared, Error};
/// let s: Shared<u32, CriticalSectionLock> = Shared::new_in(5);
/// assert_eq!(s.with(|_| s.try_with(|v| *v)), Err(Error::Reentrant));
/// ```
#[cfg(feature = "critical-section")]
pub struct CriticalSectionLock {
    /// `true` while a closure of this lock runs.
    held: critical_section::Mutex<core::cell::Cell<bool>>,
}

#[cfg(feature = "critical-section")]
impl Default for CriticalSectionLock {
    fn default() -> Self {
        CriticalSectionLock { held: critical_section::Mutex::new(core::cell::Cell::new(false)) }
    }
}

#[cfg(feature = "critical-section")]
impl fmt::Debug for CriticalSectionLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CriticalSectionLock").finish_non_exhaustive()
    }
}

/// Clears the held flag when dropped, so a panicking closure does not leave
/// the lock refusing every later call.
#[cfg(feature = "critical-section")]
struct HeldGuard<'a>(&'a core::cell::Cell<bool>);

#[cfg(feature = "critical-section")]
impl Drop for HeldGuard<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

// SAFETY: `critical_section::with` guarantees that no other critical section
// runs at the same time on any core and orders them, so no other thread runs
// a closure of this lock meanwhile. On this thread, `held` is set before `f`
// runs and cleared after it returns or unwinds (the guard drops inside the
// critical section), so a call from inside `f` finds it set and returns
// `None` without running its closure. `held` is only touched inside critical
// sections, which `critical_section::Mutex` enforces.
#[cfg(feature = "critical-section")]
unsafe impl RawLock for CriticalSectionLock {
    #[inline]
    fn try_with_lock<T>(&self, f: impl FnOnce() -> T) -> Option<T> {
        critical_section::with(|cs| {
            let held = self.held.borrow(cs);
            if held.replace(true) {
                return None;
            }
            let _guard = HeldGuard(held);
            Some(f())
        })
    }
}

/// Makes a `&mut self` algorithm a shareable `&self` [`MemoryResource`] by
/// putting it behind a lock of type `L`.
///
/// `Shared<R, L>` is `Sync` when `R` is `Send` and the lock is `Sync` (as
/// memres's locks are): every access to the inner algorithm happens inside
/// a closure of the lock.
///
/// A resource must not call back into the same `Shared` from inside its own
/// `allocate` (through its upstream, say). The nested call never runs: it
/// deadlocks under [`SpinLock`] (`StdLock`: deadlock or panic), and under a
/// lock that refuses re-entry (`CriticalSectionLock`) it fails with
/// [`Error::Reentrant`] (a panic from [`with`](Self::with)).
///
/// No lock poisons: after a panic inside a closure, the next one gets the
/// algorithm as the panic left it. memres's algorithms keep their
/// invariants at every step that can panic (docs/bad-input.md); a user's
/// `R` that does not may give wrong answers then, never unsoundness (the
/// access stays exclusive).
///
/// # Examples
///
/// ```
/// use memres_core::{pool::CoalescingPool, Inspect, MemoryResource, Request, Shared};
/// # use memres_core::testing::BumpUpstream;
/// let pool = Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 20)));
/// std::thread::scope(|s| {
///     for _ in 0..2 {
///         s.spawn(|| {
///             let b = pool.allocate(Request::new(512).unwrap(), &()).unwrap();
///             pool.deallocate(b, &()).unwrap();
///         });
///     }
/// });
/// assert_eq!(pool.usage().used, 0); // `Inspect` reads through the lock
/// ```
pub struct Shared<R, L: RawLock = SpinLock> {
    lock: L,
    /// Accessed only inside closures of `lock`.
    inner: UnsafeCell<R>,
}

// SAFETY: `inner` is only reached inside closures of the lock, which exclude other
// threads, so sharing `&Shared` across threads hands `&mut R` to one thread at
// a time: that needs `R: Send`, like `Mutex<R>`.
unsafe impl<R: Send, L: RawLock + Sync> Sync for Shared<R, L> {}
// SAFETY: moving the wrapper moves `R` and the lock.
unsafe impl<R: Send, L: RawLock + Send> Send for Shared<R, L> {}

impl<R> Shared<R> {
    /// Puts `inner` behind a new [`SpinLock`].
    pub fn new(inner: R) -> Self {
        Self::new_in(inner)
    }
}

impl<R, L: RawLock> Shared<R, L> {
    /// Puts `inner` behind a new lock of type `L`.
    ///
    /// ```
    /// use memres_core::lock::{Shared, SpinLock};
    /// let s: Shared<u32, SpinLock> = Shared::new_in(5);
    /// assert_eq!(s.with(|v| *v), 5);
    /// ```
    pub fn new_in(inner: R) -> Self {
        Shared { lock: L::default(), inner: UnsafeCell::new(inner) }
    }

    /// Runs `f` with exclusive access to the inner algorithm (to read its
    /// figures, call `release()`, run the invariant checker...).
    ///
    /// # Panics
    ///
    /// If called from inside a closure of the same `Shared` under a lock
    /// that refuses re-entry, as `RefCell::borrow_mut` would
    /// ([`try_with`](Self::try_with) returns the error instead).
    #[inline]
    pub fn with<T>(&self, f: impl FnOnce(&mut R) -> T) -> T {
        self.try_with(f).unwrap_or_else(|_| reentered())
    }

    /// Runs `f` with exclusive access to the inner algorithm.
    ///
    /// # Errors
    ///
    /// [`Error::Reentrant`], without running `f`, if called from inside a
    /// closure of the same `Shared` under a lock that refuses re-entry.
    ///
    /// ```
    /// use memres_core::lock::Shared;
    /// let s = Shared::new(5u32);
    /// assert_eq!(s.try_with(|v| *v), Ok(5));
    /// ```
    #[inline]
    pub fn try_with<T>(&self, f: impl FnOnce(&mut R) -> T) -> Result<T> {
        self.lock
            .try_with_lock(|| {
                // SAFETY: `RawLock`'s contract: no other closure of this lock
                // runs now, on any thread, this one's callers included; and
                // `inner` is only reached inside such closures, so this is the
                // only reference to it for the closure's duration.
                self.inner.with_mut(|p| f(unsafe { &mut *p }))
            })
            .ok_or(Error::Reentrant)
    }

    /// The inner algorithm, through exclusive access to the wrapper.
    pub fn get_mut(&mut self) -> &mut R {
        self.inner.get_mut()
    }

    /// Takes the inner algorithm back out.
    pub fn into_inner(self) -> R {
        self.inner.into_inner()
    }
}

impl<R: Default, L: RawLock> Default for Shared<R, L> {
    fn default() -> Self {
        Self::new_in(R::default())
    }
}

impl<R: fmt::Debug, L: RawLock> fmt::Debug for Shared<R, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.try_with(|inner| f.debug_struct("Shared").field("inner", inner).finish()) {
            Ok(written) => written,
            Err(_) => f.write_str("Shared { <in use by the caller> }"),
        }
    }
}

impl<S: Stream + ?Sized, R: MemoryResourceMut<S>, L: RawLock> MemoryResource<S> for Shared<R, L> {
    #[inline]
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        self.try_with(|r| r.allocate(request, stream))?
    }
    #[inline]
    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        self.try_with(|r| r.deallocate(block, stream))?
    }
}

/// The inner algorithm's figures and checker, through the lock.
///
/// # Panics
///
/// As [`with`](Shared::with), when called from inside a closure of the same
/// `Shared` under a lock that refuses re-entry (`check` returns a
/// violation instead).
impl<R: Inspect, L: RawLock> Inspect for Shared<R, L> {
    fn usage(&self) -> Usage {
        self.with(|r| r.usage())
    }
    fn check(&self) -> core::result::Result<(), Violation> {
        self.try_with(|r| r.check())
            .unwrap_or(Err(Violation::new("checked from inside a call on the same resource")))
    }
}

// SAFETY: `Shared` hands out `R`'s blocks unchanged and gives them back only
// through `R::deallocate`; `R` ends with the `Shared` or when moved out
// through `with`, which ends it as a resource (the trait's promise stops there).
unsafe impl<E, R: crate::copy::MemoryOf<E>, L: RawLock> crate::copy::MemoryOf<E> for Shared<R, L> {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn spin_lock_excludes_threads() {
        extern crate std;
        let lock = SpinLock::default();
        let counter = Shared::<u64>::new(0);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..crate::testing::steps(10_000) {
                        counter.with(|c| *c += 1);
                        lock.with_lock(|| ());
                    }
                });
            }
        });
        assert_eq!(counter.into_inner(), 2 * crate::testing::steps(10_000) as u64);
    }

    #[test]
    fn spin_lock_released_after_panic() {
        extern crate std;
        let shared = Shared::<u32>::new(1);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            shared.with(|_| panic!("inside"));
        }));
        assert!(r.is_err());
        assert_eq!(shared.with(|v| *v), 1);
    }
}

#[cfg(all(test, not(loom), feature = "critical-section"))]
mod reentry_tests {
    extern crate std;
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    /// Before the held flag, the nested closure ran: two `&mut` to one
    /// value (Miri: a Stacked Borrows violation in `Shared::with`).
    #[test]
    fn nested_with_on_one_critical_section_lock_is_refused() {
        let shared: Shared<u32, CriticalSectionLock> = Shared::new_in(0);
        let nested = catch_unwind(AssertUnwindSafe(|| {
            shared.with(|outer| {
                shared.with(|inner| *inner += 1);
                *outer += 1;
            })
        }));
        assert!(nested.is_err(), "the nested closure ran: two `&mut` to one value");
        assert_eq!(shared.with(|v| *v), 0);
        // The flag was cleared by the unwinding: the lock serves again.
        shared.with(|v| *v += 1);
        assert_eq!(shared.try_with(|v| *v), Ok(1));
        // `Debug` from inside a closure says so instead of panicking.
        let text = shared.with(|_| std::format!("{shared:?}"));
        assert_eq!(text, "Shared { <in use by the caller> }");
        assert_eq!(std::format!("{shared:?}"), "Shared { inner: 1 }");
    }

    /// A resource whose allocate and deallocate call back into the `Shared`
    /// that holds it (as an upstream wired in a cycle would).
    struct CallsBack<'a> {
        target: Option<&'a dyn MemoryResource<()>>,
        /// What the nested call answered.
        nested: Option<Result<()>>,
        /// Calls that ran to the end.
        calls: u32,
    }

    impl MemoryResourceMut<()> for CallsBack<'_> {
        fn allocate(&mut self, request: Request, stream: &()) -> Result<Block> {
            if let Some(target) = self.target {
                self.nested = Some(target.allocate(request, stream).map(|_| ()));
            }
            self.calls += 1;
            Ok(Block::new(256 * u64::from(self.calls), request.size(), Block::NO_TAG))
        }
        fn deallocate(&mut self, block: Block, stream: &()) -> Result<()> {
            if let Some(target) = self.target {
                self.nested = Some(target.deallocate(block, stream));
            }
            self.calls += 1;
            Ok(())
        }
    }

    #[test]
    fn a_resource_calling_back_into_its_shared_gets_a_reentrant_error() {
        let shared: Shared<CallsBack<'_>, CriticalSectionLock> =
            Shared::new_in(CallsBack { target: None, nested: None, calls: 0 });
        shared.with(|r| r.target = Some(&shared));
        let block = shared.allocate(Request::new(512).unwrap(), &()).unwrap();
        assert_eq!(shared.with(|r| (r.nested.take(), r.calls)), (Some(Err(Error::Reentrant)), 1));
        shared.deallocate(block, &()).unwrap();
        assert_eq!(shared.with(|r| (r.nested.take(), r.calls)), (Some(Err(Error::Reentrant)), 2));
    }

    #[test]
    fn two_critical_section_locks_nest() {
        let (a, b): (Shared<u32, CriticalSectionLock>, Shared<u32, CriticalSectionLock>) =
            (Shared::new_in(1), Shared::new_in(2));
        assert_eq!(a.with(|x| b.with(|y| *x + *y)), 3);
    }
}
