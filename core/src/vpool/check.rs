//! The virtual pool's figures and invariant checker.

use super::idle::{LONG_RUN, NONE, SENTINEL};
use super::VirtualPool;
use crate::check::Violation;
use crate::vmem::ReservableSpace;
use crate::{Inspect, Usage};
use alloc::vec::Vec;

impl<V: ReservableSpace> Inspect for VirtualPool<V> {
    /// Used: sizes rounded up to 256; held: the committed memory (the
    /// pool's physical footprint); largest free: the longest free range of
    /// its reservations, which may need granules committed.
    ///
    /// ```
    /// use memres_core::vmem::CountingSpace;
    /// use memres_core::vpool::{VirtualConfig, VirtualPool};
    /// use memres_core::{Inspect, MemoryResourceMut, Request};
    /// let space = CountingSpace::new(1 << 30, 2 << 20);
    /// let mut pool = VirtualPool::with_config(&space, VirtualConfig::new(64 << 20))?;
    /// let a = pool.allocate(Request::new(3 << 20)?, &())?;
    /// let u = pool.usage();
    /// assert_eq!((u.used, u.held, u.free), (3 << 20, 4 << 20, 1 << 20)); // two granules
    /// pool.deallocate(a, &())?;
    /// assert_eq!((pool.usage().held, pool.usage().peak_held), (0, 4 << 20));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    fn usage(&self) -> Usage {
        let held = self.committed_bytes();
        let peak_held = self.peak_committed << self.shift;
        Usage::new(self.index.used_bytes(), held, peak_held, self.index.largest_free())
    }

    /// Checks the pool's invariants and returns the first broken one.
    ///
    /// Checked: those of the index; reservations sorted, disjoint, each
    /// covered exactly by its nodes, with slots for exactly its granules;
    /// each granule counts the live blocks that begin or end in it; every
    /// granule a live block touches is committed; the runs of the idle
    /// list, linked both ways, disjoint, each in one reservation and found
    /// from its first and last granule, hold exactly the committed granules
    /// that no live block touches; the bitmap of long runs' starts marks
    /// exactly the first granules of the runs of more than 64 granules; the
    /// committed and idle counts match; every run record is listed or free;
    /// at most `keep` bytes are Idle unless a decommit failed; bytes used +
    /// free = bytes reserved; committed bytes = used bytes + the free bytes
    /// of Busy granules + Idle bytes.
    ///
    /// # Time Complexity
    ///
    /// O(nodes + granules): for tests and fuzzing, not the hot path.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::CountingSpace;
    /// use memres_core::vpool::{VirtualConfig, VirtualPool};
    /// use memres_core::{Inspect, MemoryResourceMut, Request};
    /// let space = CountingSpace::new(1 << 30, 2 << 20);
    /// let mut pool = VirtualPool::with_config(&space, VirtualConfig::new(64 << 20))?;
    /// let a = pool.allocate(Request::new(5000)?, &())?;
    /// assert_eq!(pool.check(), Ok(()));
    /// # pool.deallocate(a, &())?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    fn check(&self) -> core::result::Result<(), Violation> {
        self.index.check()?;
        let g = self.granule();
        let slots = self.edges.len();
        let mut touched = alloc::vec![false; slots];
        let mut edges = alloc::vec![0u32; slots];
        let (mut reserved, mut last_end, mut granules) = (0u64, 0u64, 0usize);
        let mut used_in_busy = 0u64;
        let mut bases: Vec<(u32, u32)> = Vec::new();
        for r in &self.reservations {
            if r.range.start() < last_end {
                return Err(Violation::new("reservations overlap or are not sorted"));
            }
            last_end = r.range.end();
            if r.range.start() % g != 0 || r.range.len() % g != 0 {
                return Err(Violation::new("reservation not aligned to the granule"));
            }
            bases.push((r.base, r.base + (r.range.len() / g) as u32));
            granules += (r.range.len() / g) as usize;
            let mut cursor = r.range.start();
            let mut bad = false;
            self.index.for_each_in_region(r.first, |n, free| {
                bad |= n.start() != cursor;
                cursor = n.end();
                if !free && !bad {
                    let (lo, hi) = self.slots_touched(r, n.start(), n.end());
                    for t in &mut touched[lo as usize..hi as usize] {
                        *t = true;
                    }
                    edges[lo as usize] += 1;
                    edges[hi as usize - 1] += (hi - 1 != lo) as u32;
                    used_in_busy += n.len();
                }
            });
            if bad || cursor != r.range.end() {
                return Err(Violation::new("reservation not covered exactly by its nodes"));
            }
            reserved += r.range.len();
        }
        bases.sort_unstable();
        if granules != slots
            || bases.windows(2).any(|w| w[0].1 != w[1].0)
            || self.tags.len() != slots
            || self.committed_bits.count(0, slots as u32) as u64 != self.committed
        {
            return Err(Violation::new("slots or committed count do not match the reservations' granules"));
        }
        if edges != self.edges {
            return Err(Violation::new("a granule's count of blocks beginning or ending there is wrong"));
        }
        let (mut busy, mut untouched) = (0u64, 0u64);
        for (i, &t) in touched.iter().enumerate() {
            match (self.committed_bits.get(i as u32), t) {
                (true, true) => busy += 1,
                (true, false) => untouched += 1,
                (false, true) => {
                    return Err(Violation::new("a granule touched by a live block is not committed"))
                }
                (false, false) => {}
            }
        }
        // Every listed run once, linked both ways, on committed granules
        // that no live block touches, in one reservation, found from both
        // ends; runs disjoint.
        let mut listed_run = alloc::vec![false; self.runs.len()];
        let mut in_run = alloc::vec![false; slots];
        let (mut idle, mut runs, mut long_runs, mut prev) = (0u64, 0usize, 0usize, SENTINEL);
        let mut id = self.runs[SENTINEL as usize].next;
        while id != SENTINEL {
            let Some(run) = self.runs.get(id as usize) else {
                return Err(Violation::new("idle list names no run record"));
            };
            if core::mem::replace(&mut listed_run[id as usize], true) || run.prev != prev {
                return Err(Violation::new("idle list holds a run twice or its links are not symmetric"));
            }
            if run.start >= run.end
                || !bases.iter().any(|&(lo, hi)| lo <= run.start && run.end <= hi)
                || self.run_starting(run.start) != Some(id)
                || self.run_ending(run.end - 1) != Some(id)
            {
                return Err(Violation::new(
                    "idle run empty, across reservations, or not found from its ends",
                ));
            }
            let long = run.end - run.start > LONG_RUN;
            if self.long_starts.get(run.start) != long {
                return Err(Violation::new("a long idle run's start is not marked, or a short one's is"));
            }
            long_runs += long as usize;
            for s in run.start..run.end {
                if touched[s as usize]
                    || !self.committed_bits.get(s)
                    || core::mem::replace(&mut in_run[s as usize], true)
                {
                    return Err(Violation::new(
                        "idle run over a Busy or Uncommitted granule, or over another run",
                    ));
                }
            }
            idle += (run.end - run.start) as u64;
            runs += 1;
            prev = id;
            id = run.next;
        }
        if self.runs[SENTINEL as usize].prev != prev || self.runs[SENTINEL as usize].start != NONE {
            return Err(Violation::new("idle list does not end at the sentinel's tail"));
        }
        let mut free = 0;
        let mut id = self.free_run;
        while id != NONE && free <= self.runs.len() {
            if id == SENTINEL
                || listed_run.get(id as usize) != Some(&false)
                || self.runs[id as usize].start != NONE
            {
                return Err(Violation::new("a free run record is listed, holds a run, or is out of range"));
            }
            free += 1;
            id = self.runs[id as usize].next;
        }
        if 1 + runs + free != self.runs.len() {
            return Err(Violation::new("run records neither listed nor free, or free ones in a cycle"));
        }
        // Each long run's start is marked (above): no other slot may be.
        if self.long_starts.count(0, slots as u32) as usize != long_runs {
            return Err(Violation::new("the bitmap of long runs' starts marks a slot where none starts"));
        }
        if idle != untouched || idle != self.idle {
            return Err(Violation::new(
                "idle runs or count do not match the committed granules no block touches",
            ));
        }
        if busy + idle != self.committed
            || self.committed > self.peak_committed
            || busy > self.peak_busy
            || self.peak_busy > self.peak_committed
        {
            return Err(Violation::new("committed count does not match the granules"));
        }
        if !self.trim_pending && self.idle_bytes() > self.config.keep {
            return Err(Violation::new("more idle committed memory than the release threshold"));
        }
        if self.index.used_bytes() + self.index.free_bytes() != reserved || reserved != self.reserved_bytes()
        {
            return Err(Violation::new("bytes in use + bytes free != bytes reserved"));
        }
        if used_in_busy != self.index.used_bytes() || self.index.used_bytes() > (busy << self.shift) {
            return Err(Violation::new("live bytes exceed the Busy granules"));
        }
        Ok(())
    }
}
