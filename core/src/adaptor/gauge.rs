//! One figure counted atomically: held now, exact peak, running total; and
//! leaves counted in a shared one, for the bytes a stack holds from its
//! devices whatever its leaves ([`Counted`], feature `alloc`).

use crate::primitive::{AtomicU64, Ordering::Relaxed};
#[cfg(feature = "alloc")]
use crate::{Block, MemoryResource, Request, Result, Stream};
#[cfg(feature = "alloc")]
use alloc::sync::Arc;

/// One figure counted with three atomics: what is held now, its exact
/// peak, and the running total. [`Statistics`](super::Statistics) keeps
/// two (bytes and allocations); [`Counted`] leaves share
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
/// assert_eq!((g.value(), g.peak(), g.total()), (250, 300, 350));
/// ```
#[derive(Debug, Default)]
pub struct Gauge {
    /// Held now and its peak.
    pub(super) held: Held,
    /// Everything ever added, absolute.
    pub(super) total: AtomicU64,
}

/// A figure held now and its exact peak, one read-modify-write per change:
/// a [`Gauge`] without its running total (what [`Unheld`] takes off and
/// counts back).
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// Held now, absolute (since made). Wraps rather than panics if a
    /// caller takes off more than it added.
    pub(super) current: AtomicU64,
    /// The highest `current` since the last push of a [`Statistics`](super::Statistics)
    /// level (or since creation): always `>=` every value `current` took
    /// since then, and equal to one.
    pub(super) peak: AtomicU64,
}

impl Held {
    /// `n` more held.
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        raise(&self.peak, self.current.fetch_add(n, Relaxed).wrapping_add(n));
    }

    /// `n` fewer held.
    #[inline]
    pub(crate) fn sub(&self, n: u64) {
        self.current.fetch_sub(n, Relaxed);
    }

    /// Held now.
    pub(crate) fn value(&self) -> u64 {
        self.current.load(Relaxed)
    }

    /// The most held at once.
    pub(crate) fn peak(&self) -> u64 {
        signed_max(self.peak.load(Relaxed), self.value())
    }
}

impl Gauge {
    /// Counts `n` more held (and `n` more in the total).
    #[inline]
    pub fn add(&self, n: u64) {
        self.held.add(n);
        self.total.fetch_add(n, Relaxed);
    }

    /// Counts `n` fewer held. Taking off more than is held wraps (no
    /// panic on a hot path): [`value`](Self::value) then reads near
    /// `u64::MAX`, the two's complement of the shortfall.
    #[inline]
    pub fn sub(&self, n: u64) {
        self.held.sub(n);
    }

    /// Held now (a [`Counter`](super::Counter)'s `value`).
    pub fn value(&self) -> u64 {
        self.held.value()
    }

    /// The most held at once.
    pub fn peak(&self) -> u64 {
        self.held.peak()
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
        let held = &mut self.held;
        let now = held.current.load(Relaxed).wrapping_add(n);
        held.current.store(now, Relaxed);
        self.total.store(self.total.load(Relaxed).wrapping_add(n), Relaxed);
        if (now as i64) > (held.peak.load(Relaxed) as i64) {
            held.peak.store(now, Relaxed);
        }
    }

    /// [`sub`](Self::sub) for a caller with exclusive access.
    #[inline]
    pub(super) fn sub_exclusive(&mut self, n: u64) {
        let current = &self.held.current;
        current.store(current.load(Relaxed).wrapping_sub(n), Relaxed);
    }
}

/// `n` taken off a figure for a free under way, before the upstream frees
/// the block (once freed, another thread may get the memory and count it):
/// counted back when dropped, as the free failed or panicked and the block
/// is still live, unless [`freed`](Self::freed) says the upstream freed it.
/// Counted back as any value is, raising the peak: another thread may have
/// counted a block meanwhile.
pub(super) struct Unheld<'a> {
    held: &'a Held,
    n: u64,
}

impl<'a> Unheld<'a> {
    /// Takes `n` off `held`.
    #[inline]
    pub(super) fn take(held: &'a Held, n: u64) -> Self {
        held.sub(n);
        Unheld { held, n }
    }

    /// The block is freed: `n` stays off.
    #[inline]
    pub(super) fn freed(self) {
        core::mem::forget(self);
    }
}

impl Drop for Unheld<'_> {
    fn drop(&mut self) {
        self.held.add(self.n);
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
    // Compared as signed: a free of more bytes than were asked for, which
    // an upstream of the user's may take, takes `current` below zero for a
    // while, and a wrapped value must not become the peak.
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

/// Counts the bytes its upstream hands out in a [`Gauge`] that other
/// `Counted` resources may share: put over each leaf of a stack, one gauge
/// tells what the whole stack holds from its devices now, its peak (the
/// footprint's numerator) and its total, whatever sits above the leaves.
/// Sizes are the blocks' ([`Block::size`]), so a leaf's own rounding is not
/// counted.
///
/// A free is taken off the gauge before the upstream frees the block, so
/// that a racing allocation of the same memory cannot raise the peak above
/// what the device lent; a free the upstream refuses, or panics in, is
/// counted back (the block is still live).
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::{Counted, Gauge};
/// use memres_core::{MemoryResource, Request};
/// # use memres_core::testing::BumpUpstream;
/// use std::sync::Arc;
/// let gauge = Arc::new(Gauge::default());
/// let (a, b) = (Counted::new(BumpUpstream::new(1 << 20), gauge.clone()), Counted::new(BumpUpstream::new(1 << 20), gauge.clone()));
/// let x = a.allocate(Request::new(1000)?, &())?;
/// let y = b.allocate(Request::new(3000)?, &())?;
/// assert_eq!(gauge.value(), 4000);
/// a.deallocate(x, &())?;
/// b.deallocate(y, &())?;
/// assert_eq!((gauge.value(), gauge.peak(), gauge.total()), (0, 4000, 4000));
/// # Ok::<(), memres_core::Error>(())
/// ```
#[cfg(feature = "alloc")]
#[derive(Debug)]
pub struct Counted<R> {
    inner: R,
    gauge: Arc<Gauge>,
}

#[cfg(feature = "alloc")]
impl<R> Counted<R> {
    /// Counts what `inner` hands out in `gauge`.
    pub fn new(inner: R, gauge: Arc<Gauge>) -> Self {
        Counted { inner, gauge }
    }

    /// The leaf.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// The gauge it counts in.
    pub fn gauge(&self) -> &Arc<Gauge> {
        &self.gauge
    }
}

#[cfg(feature = "alloc")]
impl<S: Stream + ?Sized, R: MemoryResource<S>> MemoryResource<S> for Counted<R> {
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        let b = self.inner.allocate(request, stream)?;
        self.gauge.add(b.size());
        Ok(b)
    }

    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        let uncounted = Unheld::take(&self.gauge.held, block.size());
        self.inner.deallocate(block, stream)?;
        uncounted.freed();
        Ok(())
    }
}

#[cfg(feature = "alloc")]
crate::inspect::forward_inspect!(Counted<R>, inner);

#[cfg(feature = "alloc")]
// SAFETY: `Counted` hands out `R`'s blocks unchanged and gives them back only
// through `R::deallocate`.
unsafe impl<E, R: crate::copy::MemoryOf<E>> crate::copy::MemoryOf<E> for Counted<R> {}
