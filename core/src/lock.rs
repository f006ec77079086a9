//! Pluggable locks and [`Shared`], the wrapper that makes a `&mut self`
//! algorithm a shareable `&self` resource.
//!
//! The algorithms of the core are plain state machines. Which lock guards
//! them is the user's choice, as with `lock_api`:
//!
//! | lock | feature | for |
//! | --- | --- | --- |
//! | [`SpinLock`] | always | `no_std` targets with atomics; short critical sections |
//! | `StdLock` | `std` | threads that should sleep, not spin, under contention |
//! | `CriticalSectionLock` | `critical-section` | bare-metal targets without atomics |
//!
//! Under `cfg(loom)` the spin lock is built from loom's atomics, so loom
//! explores every interleaving of the code that uses it.

use crate::primitive::{spin_loop, AtomicBool, Ordering, UnsafeCell};
use crate::{Block, MemoryResource, MemoryResourceMut, Request, Result, Stream};
use core::fmt;

/// A lock that runs a closure with exclusive access.
///
/// # Safety
///
/// While `with_lock` runs its closure for one caller, it must not run a
/// closure for any other caller of the same lock (mutual exclusion), and the
/// closure's effects must happen-before the next caller's closure. [`Shared`]
/// relies on this to hand out `&mut` access.
///
/// # Examples
///
/// ```
/// use memres_core::lock::{RawLock, SpinLock};
/// let lock = SpinLock::default();
/// assert_eq!(lock.with_lock(|| 1 + 1), 2);
/// ```
pub unsafe trait RawLock: Default {
    /// Runs `f` while holding the lock.
    fn with_lock<T>(&self, f: impl FnOnce() -> T) -> T;
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
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

// SAFETY: the compare-exchange from `false` to `true` succeeds for one caller
// at a time (mutual exclusion); its `Acquire` pairs with the `Release` store
// of the guard, so each closure's effects happen-before the next one's.
unsafe impl RawLock for SpinLock {
    #[inline]
    fn with_lock<T>(&self, f: impl FnOnce() -> T) -> T {
        while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            while self.locked.load(Ordering::Relaxed) {
                spin_loop();
            }
        }
        let _guard = SpinGuard(&self.locked);
        f()
    }
}

/// A lock over `std::sync::Mutex`: threads sleep under contention.
///
/// A panic inside a closure does not poison the lock for later callers: the
/// algorithms keep their invariants at every step that can panic.
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

// SAFETY: `Mutex` gives mutual exclusion and orders its critical sections.
#[cfg(feature = "std")]
unsafe impl RawLock for StdLock {
    #[inline]
    fn with_lock<T>(&self, f: impl FnOnce() -> T) -> T {
        let _guard = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f()
    }
}

/// A lock for bare-metal targets: the closure runs inside a critical section
/// of the `critical-section` crate (interrupts off on a single core, or the
/// platform's own implementation).
///
/// # Examples
///
/// ```
/// use memres_core::lock::{CriticalSectionLock, RawLock};
/// assert_eq!(CriticalSectionLock::default().with_lock(|| 3), 3);
/// ```
#[cfg(feature = "critical-section")]
#[derive(Debug, Default)]
pub struct CriticalSectionLock(());

// SAFETY: `critical_section::with` guarantees that no other critical section
// runs at the same time on any core, and orders them.
#[cfg(feature = "critical-section")]
unsafe impl RawLock for CriticalSectionLock {
    #[inline]
    fn with_lock<T>(&self, f: impl FnOnce() -> T) -> T {
        critical_section::with(|_| f())
    }
}

/// Makes a `&mut self` algorithm a shareable `&self` [`MemoryResource`] by
/// putting it behind a lock of type `L`.
///
/// `Shared<R, L>` is `Sync` when `R` is `Send`: every access to the inner
/// algorithm happens inside `L::with_lock`.
///
/// A resource must not call back into the same `Shared` from inside its own
/// `allocate` (through its upstream, say): that would deadlock.
///
/// # Examples
///
/// ```
/// use memres_core::{pool::CoalescingPool, MemoryResource, Request, Shared};
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
/// assert_eq!(pool.with(|p| p.used_bytes()), 0);
/// ```
pub struct Shared<R, L: RawLock = SpinLock> {
    lock: L,
    /// Accessed only inside `lock.with_lock`.
    inner: UnsafeCell<R>,
}

// SAFETY: `inner` is only reached inside `with_lock`, which excludes other
// threads, so sharing `&Shared` across threads hands `&mut R` to one thread at
// a time: that needs `R: Send`, like `Mutex<R>`.
unsafe impl<R: Send, L: RawLock + Sync> Sync for Shared<R, L> {}
// SAFETY: moving the wrapper moves `R` and the lock.
unsafe impl<R: Send, L: RawLock + Send> Send for Shared<R, L> {}

impl<R> Shared<R> {
    /// Puts `inner` behind a new [`SpinLock`].
    pub fn new(inner: R) -> Self {
        Self::new_with_lock(inner)
    }
}

impl<R, L: RawLock> Shared<R, L> {
    /// Puts `inner` behind a new lock of type `L`.
    ///
    /// ```
    /// use memres_core::lock::{Shared, SpinLock};
    /// let s: Shared<u32, SpinLock> = Shared::new_with_lock(5);
    /// assert_eq!(s.with(|v| *v), 5);
    /// ```
    pub fn new_with_lock(inner: R) -> Self {
        Shared { lock: L::default(), inner: UnsafeCell::new(inner) }
    }

    /// Runs `f` with exclusive access to the inner algorithm (to read its
    /// figures, call `release()`, run the invariant checker...).
    #[inline]
    pub fn with<T>(&self, f: impl FnOnce(&mut R) -> T) -> T {
        self.lock.with_lock(|| {
            // SAFETY: `with_lock` excludes every other closure on this lock,
            // and `inner` is only reached inside such closures, so this is the
            // only reference to it for the closure's duration.
            self.inner.with_mut(|p| f(unsafe { &mut *p }))
        })
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
        Self::new_with_lock(R::default())
    }
}

impl<R: fmt::Debug, L: RawLock> fmt::Debug for Shared<R, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with(|inner| f.debug_struct("Shared").field("inner", inner).finish())
    }
}

impl<S: Stream + ?Sized, R: MemoryResourceMut<S>, L: RawLock> MemoryResource<S> for Shared<R, L> {
    #[inline]
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        self.with(|r| r.allocate(request, stream))
    }
    #[inline]
    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        self.with(|r| r.deallocate(block, stream))
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
                    for _ in 0..10_000 {
                        counter.with(|c| *c += 1);
                        lock.with_lock(|| ());
                    }
                });
            }
        });
        assert_eq!(counter.into_inner(), 20_000);
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
