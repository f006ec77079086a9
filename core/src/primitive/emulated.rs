//! The atomics a target's hardware lacks, each a value behind a critical
//! section: compare-and-swap on `thumbv6m` (Cortex-M0), 64-bit atomics on
//! `thumbv7m` and 32-bit RISC-V. Only the methods the crate calls, with
//! the signatures of `core::sync::atomic`'s.
//!
//! A critical section runs alone (on a single core, with interrupts off;
//! on several, under the implementation's lock) and orders what it does
//! before the next one, which is at least what every `Ordering` asks.

use core::cell::Cell;
use core::fmt;
use core::sync::atomic::Ordering;
use critical_section::Mutex;

macro_rules! emulated {
    ($(#[$doc:meta])* $name:ident, $t:ty) => {
        $(#[$doc])*
        pub(crate) struct $name(Mutex<Cell<$t>>);

        impl Default for $name {
            fn default() -> Self {
                $name::new(<$t>::default())
            }
        }

        #[allow(dead_code)] // each build calls some of them
        impl $name {
            pub(crate) const fn new(value: $t) -> Self {
                $name(Mutex::new(Cell::new(value)))
            }

            fn update<R>(&self, f: impl FnOnce(&Cell<$t>) -> R) -> R {
                critical_section::with(|cs| f(self.0.borrow(cs)))
            }

            pub(crate) fn load(&self, _: Ordering) -> $t {
                self.update(Cell::get)
            }

            pub(crate) fn store(&self, value: $t, _: Ordering) {
                self.update(|c| c.set(value))
            }

            pub(crate) fn swap(&self, value: $t, _: Ordering) -> $t {
                self.update(|c| c.replace(value))
            }

            pub(crate) fn compare_exchange(&self, current: $t, new: $t, _: Ordering, _: Ordering) -> Result<$t, $t> {
                self.update(|c| match c.get() {
                    now if now == current => Ok(c.replace(new)),
                    now => Err(now),
                })
            }

            /// Never fails spuriously.
            pub(crate) fn compare_exchange_weak(&self, current: $t, new: $t, success: Ordering, failure: Ordering) -> Result<$t, $t> {
                self.compare_exchange(current, new, success, failure)
            }

            pub(crate) fn fetch_update(&self, _: Ordering, _: Ordering, mut f: impl FnMut($t) -> Option<$t>) -> Result<$t, $t> {
                self.update(|c| {
                    let now = c.get();
                    match f(now) {
                        Some(new) => {
                            c.set(new);
                            Ok(now)
                        }
                        None => Err(now),
                    }
                })
            }

            pub(crate) fn get_mut(&mut self) -> &mut $t {
                self.0.get_mut().get_mut()
            }

            pub(crate) fn into_inner(self) -> $t {
                self.0.into_inner().into_inner()
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.load(Ordering::Relaxed), f)
            }
        }
    };
}

emulated!(
    /// `AtomicBool` without compare-and-swap.
    AtomicBool,
    bool
);
emulated!(
    /// `AtomicU64` without 64-bit atomics.
    AtomicU64,
    u64
);

#[allow(dead_code)] // each build calls one of them
impl AtomicU64 {
    /// Wraps, as `core`'s does.
    pub(crate) fn fetch_add(&self, n: u64, _: Ordering) -> u64 {
        self.update(|c| c.replace(c.get().wrapping_add(n)))
    }

    /// Wraps, as `core`'s does.
    pub(crate) fn fetch_sub(&self, n: u64, _: Ordering) -> u64 {
        self.update(|c| c.replace(c.get().wrapping_sub(n)))
    }
}

#[cfg(test)]
mod tests;
