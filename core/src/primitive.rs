//! Atomics and cells from loom under `cfg(loom)`, from `core` otherwise, so
//! that one code path serves both.

#[cfg(all(not(loom), target_has_atomic = "8"))]
pub(crate) use core::sync::atomic::AtomicBool;
#[cfg(all(not(loom), target_has_atomic = "64"))]
pub(crate) use core::sync::atomic::AtomicU64;
#[cfg(not(loom))]
pub(crate) use core::sync::atomic::Ordering;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};

// A target without compare-and-swap or 64-bit atomics gets them from
// critical sections (tested on every target).
#[cfg(all(not(loom), not(target_has_atomic = "8"), feature = "critical-section"))]
pub(crate) use emulated::AtomicBool;
#[cfg(all(not(loom), not(target_has_atomic = "64"), feature = "critical-section"))]
pub(crate) use emulated::AtomicU64;
#[cfg(all(
    not(loom),
    feature = "critical-section",
    any(test, not(target_has_atomic = "8"), not(target_has_atomic = "64"))
))]
mod emulated;
#[cfg(all(
    not(loom),
    not(feature = "critical-section"),
    not(all(target_has_atomic = "8", target_has_atomic = "64"))
))]
compile_error!(
    "memres-core needs its `critical-section` feature on a target without compare-and-swap or 64-bit atomics: \
     it builds them from critical sections"
);

/// `UnsafeCell` with loom's closure API on both sides.
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(
    #[cfg(not(loom))] core::cell::UnsafeCell<T>,
    #[cfg(loom)] loom::cell::UnsafeCell<T>,
);

impl<T> UnsafeCell<T> {
    pub(crate) fn new(value: T) -> Self {
        #[cfg(not(loom))]
        return UnsafeCell(core::cell::UnsafeCell::new(value));
        #[cfg(loom)]
        return UnsafeCell(loom::cell::UnsafeCell::new(value));
    }

    /// Runs `f` with a mutable pointer to the value.
    #[inline]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        #[cfg(not(loom))]
        return f(self.0.get());
        #[cfg(loom)]
        return self.0.with_mut(f);
    }

    pub(crate) fn get_mut(&mut self) -> &mut T {
        #[cfg(not(loom))]
        return self.0.get_mut();
        // SAFETY: `&mut self` proves no other access exists.
        #[cfg(loom)]
        return self.0.with_mut(|p| unsafe { &mut *p });
    }

    pub(crate) fn into_inner(self) -> T {
        #[cfg(not(loom))]
        return self.0.into_inner();
        #[cfg(loom)]
        return self.0.into_inner();
    }
}

#[inline]
pub(crate) fn spin_loop() {
    #[cfg(not(loom))]
    core::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}
