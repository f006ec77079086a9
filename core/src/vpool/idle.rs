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

    /// The number of Idle granules, counted afresh.
    pub(super) fn count_idle(&self) -> u64 {
        let mut idle = 0;
        self.for_each_idle_run(|lo, hi| idle += (hi - lo) as u64);
        idle
    }

    /// Finds every Idle granule: they become the candidates, and no
    /// granule counts as touched since. Returns their number, which
    /// becomes the bound on Idle granules; the peak of Busy granules rises
    /// to what is committed and not Idle.
    #[inline(never)]
    pub(super) fn scan(&mut self) -> u64 {
        let mut candidates = core::mem::take(&mut self.candidates);
        candidates.clear();
        let mut idle = 0;
        self.for_each_idle_run(|lo, hi| {
            candidates.push((lo, hi));
            idle += (hi - lo) as u64;
        });
        candidates.sort_unstable();
        self.candidates = candidates;
        self.touched.clear();
        self.idle_bound = idle;
        self.peak_busy = self.peak_busy.max(self.committed - idle);
        idle
    }

    /// Takes up to `n` (at least 1) Idle granules off the candidates, from
    /// the highest slot down (in a reservation, the highest address): one run of them, as slots `lo..hi`, or
    /// `None` when no candidate is left. A granule placed over since the
    /// scan is dropped, Idle again or not: the next scan finds it if it is.
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
            let start = start.max(end.saturating_sub(n.min(u32::MAX as u64) as u32));
            if start == lo {
                self.candidates.pop();
            } else {
                // Above `start` nothing is left to take: untouched granules
                // taken, touched ones dropped.
                self.candidates.last_mut().expect("looked at above").1 = start;
            }
            return Some((start, end));
        }
        None
    }
}
