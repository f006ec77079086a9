//! Idle granules: committed granules that no live block touches.
//!
//! The pool keeps no record of them while blocks come and go: updating
//! one on every call cost more than the index itself (per-granule counts
//! and an idle list, read and written at random over the reservation,
//! miss the cache). It finds them only when it gives memory back, in the
//! index's free ranges (a granule wholly inside a free range is touched by
//! no live block), and keeps what it found, the *candidates*, for the
//! trims that follow, skipping the granules that blocks have been placed
//! over since (`touched`).
//!
//! A space that frees memory only in pieces longer than a granule
//! ([`ReservableSpace::releasable`]) gives nothing back for an Idle granule
//! whose piece holds a live block: the search leaves such granules out of
//! the candidates and of its count, so that the pool counts them with the
//! Busy ones, and a trim takes whole pieces.

use super::VirtualPool;
use crate::vmem::ReservableSpace;

impl<V: ReservableSpace> VirtualPool<V> {
    /// Calls `f` with each run of Idle granules, as slots `lo..hi`: the
    /// committed granules wholly inside a free range, free range by free
    /// range in no particular order.
    ///
    /// # Time Complexity
    ///
    /// O(free ranges of a granule or more + their granules / 64).
    pub(super) fn for_each_idle_run(&self, mut f: impl FnMut(u32, u32)) {
        let g = self.granule();
        self.index.for_each_free_from(g, |range| {
            let r = self.reservation_of(range.start()).expect("the index holds the reservations");
            let lo = r.base + (range.start() - r.range.start()).div_ceil(g) as u32;
            let hi = r.base + ((range.end() - r.range.start()) >> self.shift) as u32;
            let mut s = lo;
            while s < hi {
                let run = self.committed_bits.find(s, hi, true);
                s = self.committed_bits.find(run, hi, false);
                if run < s {
                    f(run, s);
                }
            }
        });
    }

    /// Calls `f` with each run of Idle granules that the space can give
    /// back ([`releasable`](Self::releasable)): all of them, unless the
    /// space frees memory in pieces longer than a granule.
    fn for_each_releasable_run(&self, mut f: impl FnMut(u32, u32)) {
        self.for_each_idle_run(|lo, hi| {
            if let Some((a, b)) = self.releasable(lo, hi, u64::MAX) {
                f(a, b);
            }
        });
    }

    /// The slots of `lo..hi` (Idle granules of one reservation) to
    /// decommit to give back at least `want` granules, the highest first,
    /// as the space answers ([`ReservableSpace::releasable`]); `None` if
    /// none. Whatever the space answers, the slots lie in `lo..hi`.
    pub(super) fn releasable(&self, lo: u32, hi: u32, want: u64) -> Option<(u32, u32)> {
        let asked = self.slot_range(self.reservation_of_slot(lo), lo, hi);
        let g = self.granule();
        let got = self.space.releasable(asked, want.saturating_mul(g))?;
        // Whole granules of `asked` only: `got` is the space's word.
        let start = got.start().clamp(asked.start(), asked.end()).next_multiple_of(g);
        let end = got.end().clamp(asked.start(), asked.end()) & !(g - 1);
        let slot = |addr: u64| lo + ((addr - asked.start()) >> self.shift) as u32;
        (start < end).then(|| (slot(start), slot(end)))
    }

    /// The number of Idle granules, counted afresh.
    pub(super) fn count_idle(&self) -> u64 {
        let mut idle = 0;
        self.for_each_idle_run(|lo, hi| idle += (hi - lo) as u64);
        idle
    }

    /// The number of Idle granules the space can give back, counted afresh.
    pub(super) fn count_releasable(&self) -> u64 {
        let mut idle = 0;
        self.for_each_releasable_run(|lo, hi| idle += (hi - lo) as u64);
        idle
    }

    /// Finds every Idle granule: those the space can give back become the
    /// candidates, and no granule counts as touched since. Returns their
    /// number. All Idle granules become the bound on them (a free may make
    /// a piece whole, so the bound counts those the space holds too); the
    /// peak of Busy granules rises to what is committed and cannot be given
    /// back.
    #[inline(never)]
    pub(super) fn scan(&mut self) -> u64 {
        let mut candidates = core::mem::take(&mut self.candidates);
        candidates.clear();
        let (mut idle, mut releasable) = (0, 0);
        self.for_each_idle_run(|lo, hi| {
            idle += (hi - lo) as u64;
            if let Some((a, b)) = self.releasable(lo, hi, u64::MAX) {
                candidates.push((a, b));
                releasable += (b - a) as u64;
            }
        });
        candidates.sort_unstable();
        self.candidates = candidates;
        self.touched.clear();
        self.idle_bound = idle;
        self.peak_busy = self.peak_busy.max(self.committed - releasable);
        releasable
    }

    /// Takes Idle granules off the candidates to give back `n` (at least
    /// 1), from the highest slot down (in a reservation, the highest
    /// address): one run of them, as slots `lo..hi`, or `None` when no
    /// candidate is left. It holds `n` granules, fewer where a candidate
    /// ends, more where the space frees whole pieces longer than that
    /// ([`releasable`](Self::releasable)). A granule placed over since the
    /// scan is dropped, Idle again or not: the next scan finds it if it is;
    /// so is one above the run that the space could not give back.
    pub(super) fn take_candidate(&mut self, n: u64) -> Option<(u32, u32)> {
        while let Some(&(lo, hi)) = self.candidates.last() {
            // The highest stretch of the run that no block was placed over.
            let Some(last) = self.touched.find_back(lo, hi, false) else {
                self.candidates.pop();
                continue;
            };
            let end = last + 1;
            let start = match self.touched.find_back(lo, end, true) {
                Some(t) => t + 1,
                None => lo,
            };
            let taken = self.releasable(start, end, n);
            // Above what is taken (all of the untouched stretch, if the
            // space gives none of it back) nothing is left to take:
            // untouched granules taken or not releasable, touched ones
            // dropped.
            let below = taken.map_or(start, |(a, _)| a);
            if below == lo {
                self.candidates.pop();
            } else {
                self.candidates.last_mut().expect("looked at above").1 = below;
            }
            if taken.is_some() {
                return taken;
            }
        }
        None
    }
}
