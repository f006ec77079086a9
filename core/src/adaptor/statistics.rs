//! RMM's `statistics_resource_adaptor`: counts bytes and allocations.

#[cfg(feature = "alloc")]
use super::gauge::raise;
use super::gauge::{signed_max, Gauge, Unheld};
#[cfg(feature = "alloc")]
use crate::lock::Shared;
use crate::primitive::Ordering::Relaxed;
use crate::{Block, MemoryResource, Request, Result, Stream};
#[cfg(feature = "alloc")]
use alloc::vec::Vec;

/// One figure as [`Statistics`] reports it: what is live now, its peak and
/// the running total, all counted from the start of the current counter
/// level (see [`Statistics::push_counters`]).
///
/// The figures are signed, as RMM's: inside a pushed level, freeing a block
/// allocated before the push makes `value` negative. So `value` and `peak`
/// hold up to `i64::MAX` bytes: more live at once (only an upstream that
/// lends address ranges alone can give that much) reads as negative.
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::Counter;
/// let c = Counter { value: 10, peak: 30, total: 50 };
/// assert!(c.value <= c.peak && c.peak <= c.total);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    /// Live now (bytes, or allocations).
    pub value: i64,
    /// The highest `value` since the level began.
    pub peak: i64,
    /// Sum of everything allocated since the level began (frees do not
    /// subtract), at most `i64::MAX`.
    pub total: i64,
}

impl Gauge {
    fn counter(&self, base: Base) -> Counter {
        let current = self.held.current.load(Relaxed);
        Counter {
            value: current.wrapping_sub(base.current) as i64,
            peak: signed_max(self.held.peak.load(Relaxed), current).wrapping_sub(base.current) as i64,
            // Never negative: past `i64::MAX` it reads `i64::MAX`, until the
            // `u64` total wraps after 2^64 bytes counted (RMM's `int64`
            // overflows at half of that).
            total: self.total.load(Relaxed).wrapping_sub(base.total).min(i64::MAX as u64) as i64,
        }
    }
}

/// The six counters the hot path touches, on one cache line of their own:
/// one line to bring in per call, and no false sharing with the upstream.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Hot {
    /// Bytes requested by live allocations.
    bytes: Gauge,
    /// Number of live allocations.
    count: Gauge,
}

/// Where a counter level began.
#[derive(Clone, Copy, Debug, Default)]
struct Base {
    current: u64,
    total: u64,
}

/// A pushed counter level: where it began and the peak of the level below,
/// to merge back when it is popped.
#[cfg(feature = "alloc")]
#[derive(Clone, Copy, Debug)]
struct Level {
    bytes: Base,
    count: Base,
    /// The enclosing level's peaks at the push.
    outer_peak_bytes: u64,
    outer_peak_count: u64,
}

/// Counts the bytes and allocations that pass through it: RMM's
/// `statistics_resource_adaptor`.
///
/// ```text
///            allocate ─► upstream ─ok─► bytes.current += size   (3 relaxed
///                                       bytes.total   += size    atomics and
///                                       bytes.peak = max(..)     a CAS loop
///                                       (same for the count)     that rarely
///          deallocate ─► bytes.current -= size ─► upstream       runs)
///                                       └ error, panic: add it back
///
///  levels (alloc): [ base 0 ] [ pushed at current=c1 ] [ pushed at c2 ]  ◄─ top
///                  every figure is reported relative to the top's base
/// ```
///
/// Sizes are the requested sizes ([`Block::size`]); zero-byte requests
/// (answered with [`Block::EMPTY`]) are not allocations and are not
/// counted. Failed calls count nothing. A free counts off the size it
/// states, as RMM's: it keeps no record of each block, so a double free or
/// a free of another size that the upstream takes (one that frees by
/// address alone, as `testing::BumpUpstream`) counts off what it says. The
/// pools, the fixed-size resource and the arena refuse both; over others,
/// `Tracking` checks every free against its block.
///
/// The hot path is a few relaxed atomics: figures read while other threads
/// allocate are each exact but need not be a consistent snapshot of one
/// another. The peak is exact (see the compare-exchange loop in the source).
///
/// # Counter levels
///
/// As RMM's `push_counters`/`pop_counters`, [`push_counters`](Self::push_counters)
/// starts a new level whose figures start at zero;
/// [`pop_counters`](Self::pop_counters) ends it, returns its figures, and
/// merges it into the level below (the value and total add up, the peak is
/// the higher of the two, measured from the lower level's base). The base
/// level cannot be popped: popping it is an error and changes nothing, so
/// more pops than pushes fail harmlessly, and pushes never popped simply stay
/// (the figures are then reported for the innermost level). A push or pop
/// while other threads allocate is safe and keeps all figures exact, but an
/// allocation in flight during it may count in either level.
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "alloc"))] fn main() {}
/// # #[cfg(feature = "alloc")] fn main() -> Result<(), memres_core::Error> {
/// use memres_core::adaptor::Statistics;
/// use memres_core::{MemoryResource, Request};
/// # use memres_core::testing::BumpUpstream;
/// let stats = Statistics::new(BumpUpstream::new(1 << 20));
/// let a = stats.allocate(Request::new(1000)?, &())?;
/// stats.push_counters();
/// let b = stats.allocate(Request::new(24)?, &())?;
/// let (bytes, count) = stats.pop_counters()?;
/// assert_eq!((bytes.value, count.value), (24, 1));
/// assert_eq!(stats.get_bytes_counter().value, 1024);
/// assert!(stats.pop_counters().is_err()); // the base level stays
/// stats.deallocate(a, &())?;
/// stats.deallocate(b, &())?;
/// assert_eq!(stats.get_bytes_counter().peak, 1024);
/// assert_eq!(stats.get_allocations_counter().total, 2);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Statistics<R> {
    upstream: R,
    /// The hot counters, on a cache line of their own.
    hot: Hot,
    /// Pushed levels, innermost last; empty means only the base level. Only
    /// push and pop take its lock; the hot path never does.
    #[cfg(feature = "alloc")]
    levels: Shared<Vec<Level>>,
}

impl<R> Statistics<R> {
    /// Counts what passes through to `upstream`.
    ///
    /// ```
    /// # use memres_core::adaptor::Statistics;
    /// # use memres_core::testing::BumpUpstream;
    /// let s = Statistics::new(BumpUpstream::new(1 << 20));
    /// assert_eq!(s.get_bytes_counter().value, 0);
    /// ```
    pub fn new(upstream: R) -> Self {
        Statistics {
            upstream,
            hot: Hot::default(),
            #[cfg(feature = "alloc")]
            levels: Shared::new(Vec::new()),
        }
    }

    /// The upstream resource.
    ///
    /// ```
    /// # use memres_core::Inspect;
    /// # use memres_core::adaptor::Statistics;
    /// # use memres_core::testing::BumpUpstream;
    /// let s = Statistics::new(BumpUpstream::new(1 << 20));
    /// assert_eq!(s.upstream().usage().held, 0);
    /// ```
    pub fn upstream(&self) -> &R {
        &self.upstream
    }

    /// The upstream resource, by value.
    ///
    /// ```
    /// # use memres_core::Inspect;
    /// # use memres_core::adaptor::Statistics;
    /// # use memres_core::testing::BumpUpstream;
    /// let up = Statistics::new(BumpUpstream::new(1 << 20)).into_inner();
    /// assert_eq!(up.usage().held, 0);
    /// ```
    pub fn into_inner(self) -> R {
        self.upstream
    }

    fn bases(&self) -> (Base, Base) {
        #[cfg(feature = "alloc")]
        if let Some(top) = self.levels.with(|l| l.last().copied()) {
            return (top.bytes, top.count);
        }
        (Base::default(), Base::default())
    }

    /// Bytes (requested sizes) of the current level: live now, peak, total
    /// (RMM's `get_bytes_counter`).
    ///
    /// ```
    /// # use memres_core::adaptor::Statistics;
    /// # use memres_core::{MemoryResource, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let s = Statistics::new(BumpUpstream::new(1 << 20));
    /// let b = s.allocate(Request::new(100)?, &())?;
    /// s.deallocate(b, &())?;
    /// let c = s.get_bytes_counter();
    /// assert_eq!((c.value, c.peak, c.total), (0, 100, 100));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn get_bytes_counter(&self) -> Counter {
        self.hot.bytes.counter(self.bases().0)
    }

    /// Number of allocations of the current level: live now, peak, total
    /// (RMM's `get_allocations_counter`).
    ///
    /// ```
    /// # use memres_core::adaptor::Statistics;
    /// # use memres_core::{MemoryResource, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let s = Statistics::new(BumpUpstream::new(1 << 20));
    /// let b = s.allocate(Request::new(100)?, &())?;
    /// assert_eq!(s.get_allocations_counter().value, 1);
    /// # s.deallocate(b, &())?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn get_allocations_counter(&self) -> Counter {
        self.hot.count.counter(self.bases().1)
    }
}

#[cfg(feature = "alloc")]
impl<R> Statistics<R> {
    /// Number of pushed levels (0: only the base level).
    ///
    /// ```
    /// # use memres_core::adaptor::Statistics;
    /// let s = Statistics::new(());
    /// s.push_counters();
    /// assert_eq!(s.depth(), 1);
    /// ```
    pub fn depth(&self) -> usize {
        self.levels.with(|l| l.len())
    }

    /// Starts a new counter level whose figures start at zero, and returns
    /// the figures (bytes, allocations) of the level it covers.
    ///
    /// ```
    /// # use memres_core::adaptor::Statistics;
    /// # use memres_core::{MemoryResource, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let s = Statistics::new(BumpUpstream::new(1 << 20));
    /// let a = s.allocate(Request::new(256)?, &())?;
    /// let (outer, _) = s.push_counters();
    /// assert_eq!(outer.value, 256);
    /// assert_eq!(s.get_bytes_counter().value, 0);
    /// # s.deallocate(a, &())?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn push_counters(&self) -> (Counter, Counter) {
        self.levels.with(|levels| {
            let before = self.both_at(levels.last().copied());
            let bytes = Base {
                current: self.hot.bytes.held.current.load(Relaxed),
                total: self.hot.bytes.total.load(Relaxed),
            };
            let count = Base {
                current: self.hot.count.held.current.load(Relaxed),
                total: self.hot.count.total.load(Relaxed),
            };
            let outer_peak_bytes = self.hot.bytes.held.peak.swap(bytes.current, Relaxed);
            let outer_peak_count = self.hot.count.held.peak.swap(count.current, Relaxed);
            // Allocations that landed between the loads and the swaps.
            raise(&self.hot.bytes.held.peak, self.hot.bytes.held.current.load(Relaxed));
            raise(&self.hot.count.held.peak, self.hot.count.held.current.load(Relaxed));
            levels.push(Level { bytes, count, outer_peak_bytes, outer_peak_count });
            before
        })
    }

    /// Ends the innermost counter level: returns its figures (bytes,
    /// allocations) and merges them into the level below.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) when no level
    /// was pushed; nothing changes.
    ///
    /// ```
    /// # use memres_core::adaptor::Statistics;
    /// # use memres_core::{MemoryResource, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let s = Statistics::new(BumpUpstream::new(1 << 20));
    /// s.push_counters();
    /// let a = s.allocate(Request::new(512)?, &())?;
    /// s.deallocate(a, &())?;
    /// let (bytes, count) = s.pop_counters()?;
    /// assert_eq!((bytes.value, bytes.peak, count.total), (0, 512, 1));
    /// assert_eq!(s.get_bytes_counter().peak, 512);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn pop_counters(&self) -> Result<(Counter, Counter)> {
        self.levels.with(|levels| {
            let Some(top) = levels.pop() else {
                return Err(crate::Error::InvalidConfig { what: "cannot pop the last counter pair" });
            };
            let popped = self.both_at(Some(top));
            raise(&self.hot.bytes.held.peak, top.outer_peak_bytes);
            raise(&self.hot.count.held.peak, top.outer_peak_count);
            Ok(popped)
        })
    }

    fn both_at(&self, level: Option<Level>) -> (Counter, Counter) {
        let (b, c) = level.map_or((Base::default(), Base::default()), |l| (l.bytes, l.count));
        (self.hot.bytes.counter(b), self.hot.count.counter(c))
    }
}

/// The exclusive form, over a plain algorithm: put it inside the lock
/// (`Shared<Statistics<CoalescingPool<_>>>`) and the counters cost a few
/// plain stores instead of atomic read-modify-writes.
///
/// ```
/// use memres_core::adaptor::Statistics;
/// use memres_core::pool::CoalescingPool;
/// use memres_core::{MemoryResource, Request, Shared};
/// # use memres_core::testing::BumpUpstream;
/// let pool = Shared::new(Statistics::new(CoalescingPool::new(BumpUpstream::new(1 << 20))));
/// let b = pool.allocate(Request::new(1000)?, &())?;
/// pool.deallocate(b, &())?;
/// assert_eq!(pool.with(|s| (s.get_bytes_counter().peak, s.get_bytes_counter().value)), (1000, 0));
/// # Ok::<(), memres_core::Error>(())
/// ```
impl<S: Stream + ?Sized, R: crate::MemoryResourceMut<S>> crate::MemoryResourceMut<S> for Statistics<R> {
    #[inline]
    fn allocate(&mut self, request: Request, stream: &S) -> Result<Block> {
        let block = self.upstream.allocate(request, stream)?;
        if !block.is_empty() {
            self.hot.bytes.add_exclusive(block.size());
            self.hot.count.add_exclusive(1);
        }
        Ok(block)
    }

    #[inline]
    fn deallocate(&mut self, block: Block, stream: &S) -> Result<()> {
        self.upstream.deallocate(block, stream)?;
        if !block.is_empty() {
            self.hot.bytes.sub_exclusive(block.size());
            self.hot.count.sub_exclusive(1);
        }
        Ok(())
    }
}

impl<S: Stream + ?Sized, R: MemoryResource<S>> MemoryResource<S> for Statistics<R> {
    #[inline]
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        let block = self.upstream.allocate(request, stream)?;
        if !block.is_empty() {
            self.hot.bytes.add(block.size());
            self.hot.count.add(1);
        }
        Ok(block)
    }

    #[inline]
    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        if block.is_empty() {
            return self.upstream.deallocate(block, stream);
        }
        // Uncount first: the block is counted only while the caller holds
        // it, so another thread that gets the same memory from upstream
        // right after the free cannot make the peak overshoot. Counted
        // again unless the upstream frees it (its error, its panic).
        let bytes = Unheld::take(&self.hot.bytes.held, block.size());
        let count = Unheld::take(&self.hot.count.held, 1);
        self.upstream.deallocate(block, stream)?;
        bytes.freed();
        count.freed();
        Ok(())
    }
}

crate::inspect::forward_inspect!(Statistics<R>, upstream);

// SAFETY: `Statistics` (as a `MemoryResource` and as a `MemoryResourceMut`)
// hands out `R`'s blocks unchanged and gives them back only through
// `R::deallocate`.
unsafe impl<E, R: crate::copy::MemoryOf<E>> crate::copy::MemoryOf<E> for Statistics<R> {}
