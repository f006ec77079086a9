//! One figure counted atomically: held now, exact peak, running total.

use crate::primitive::{AtomicU64, Ordering::Relaxed};

/// One figure counted with three atomics: what is held now, its exact
/// peak, and the running total. [`Statistics`](super::Statistics) keeps
/// two (bytes and allocations); [`Counted`](super::Counted) leaves share
/// one, through an `Arc`, to count what a stack holds from its devices.
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::Gauge;
/// let g = Gauge::default();
/// g.add(300);
/// g.sub(100);
/// g.add(50);
/// assert_eq!((g.current(), g.peak(), g.total()), (250, 300, 350));
/// ```
#[derive(Debug, Default)]
pub struct Gauge {
    /// Live now, absolute (since the gauge was made). Wraps rather than
    /// panics if a caller takes off more than it added.
    pub(super) current: AtomicU64,
    /// The highest `current` since the last push of a [`Statistics`](super::Statistics)
    /// level (or since creation): always `>=` every value `current` took
    /// since then, and equal to one.
    pub(super) peak: AtomicU64,
    /// Everything ever added, absolute.
    pub(super) total: AtomicU64,
}

impl Gauge {
    /// Counts `n` more held (and `n` more in the total).
    #[inline]
    pub fn add(&self, n: u64) {
        let now = self.current.fetch_add(n, Relaxed).wrapping_add(n);
        self.total.fetch_add(n, Relaxed);
        raise(&self.peak, now);
    }

    /// Counts `n` fewer held.
    #[inline]
    pub fn sub(&self, n: u64) {
        self.current.fetch_sub(n, Relaxed);
    }

    /// Takes back a [`sub`](Self::sub) whose free failed: `n` held again,
    /// not counted in the total a second time.
    #[cfg(feature = "alloc")]
    #[inline]
    pub(super) fn unsub(&self, n: u64) {
        raise(&self.peak, self.current.fetch_add(n, Relaxed).wrapping_add(n));
    }

    /// Held now.
    pub fn current(&self) -> u64 {
        self.current.load(Relaxed)
    }

    /// The most held at once.
    pub fn peak(&self) -> u64 {
        signed_max(self.peak.load(Relaxed), self.current())
    }

    /// Everything ever added.
    pub fn total(&self) -> u64 {
        self.total.load(Relaxed)
    }

    /// [`add`](Self::add) for a caller with exclusive access: plain loads
    /// and stores, no read-modify-write (which costs ~20 cycles each even
    /// uncontended), so that counting inside a lock is nearly free.
    #[inline]
    pub(super) fn add_exclusive(&mut self, n: u64) {
        let now = self.current.load(Relaxed).wrapping_add(n);
        self.current.store(now, Relaxed);
        self.total.store(self.total.load(Relaxed).wrapping_add(n), Relaxed);
        if (now as i64) > (self.peak.load(Relaxed) as i64) {
            self.peak.store(now, Relaxed);
        }
    }

    /// [`sub`](Self::sub) for a caller with exclusive access.
    #[inline]
    pub(super) fn sub_exclusive(&mut self, n: u64) {
        self.current.store(self.current.load(Relaxed).wrapping_sub(n), Relaxed);
    }
}

/// Raises `peak` to at least `now`.
///
/// This is what makes the peak exact under concurrency: every value that
/// `current` ever takes is the result of exactly one `fetch_add`, whose
/// thread then runs this loop with that value. The loop only ends once
/// `peak >= now` (a failed exchange reloads the newer peak; peaks only grow),
/// so the peak is the maximum of all values `current` took, no more (nobody
/// stores a value `current` did not take) and no less.
#[inline]
pub(super) fn raise(peak: &AtomicU64, now: u64) {
    let mut seen = peak.load(Relaxed);
    // Compared as signed: a caller that frees more bytes than it asked for
    // (a size of the same footprint) takes `current` below zero for a while,
    // and a wrapped value must not become the peak.
    while (now as i64) > (seen as i64) {
        match peak.compare_exchange_weak(seen, now, Relaxed, Relaxed) {
            Ok(_) => return,
            Err(actual) => seen = actual,
        }
    }
}

/// The larger of two figures, compared as signed (see [`raise`]).
#[inline]
pub(super) fn signed_max(a: u64, b: u64) -> u64 {
    if (a as i64) >= (b as i64) {
        a
    } else {
        b
    }
}
