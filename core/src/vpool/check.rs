//! The virtual pool's figures and invariant checker.

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
    /// every granule a live block touches is committed; the candidates
    /// sorted, disjoint, each in one reservation, and each of their
    /// granules not marked touched committed and touched by no live block
    /// (a trim may decommit it); the committed count matches the bitmap;
    /// where the pool counts Idle granules, at least as many counted as
    /// there are; at most `keep` bytes of those the space can give back
    /// unless a trim is pending; the
    /// peak of Busy granules seen at most the peak committed; bytes used +
    /// free = bytes reserved; live bytes within the Busy granules.
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
        let slots = (self.reserved_bytes() >> self.shift) as usize;
        let mut touched = alloc::vec![false; slots];
        let mut last_end = 0u64;
        let mut used_bytes = 0u64;
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
                    used_bytes += n.len();
                }
            });
            if bad || cursor != r.range.end() {
                return Err(Violation::new("reservation not covered exactly by its nodes"));
            }
        }
        bases.sort_unstable();
        if bases.first().is_some_and(|b| b.0 != 0)
            || bases.windows(2).any(|w| w[0].1 != w[1].0)
            || self.committed_bits.count(0, slots as u32) as u64 != self.committed
        {
            return Err(Violation::new("slots or committed count do not match the reservations' granules"));
        }
        let (mut busy, mut idle) = (0u64, 0u64);
        for (i, &t) in touched.iter().enumerate() {
            match (self.committed_bits.get(i as u32), t) {
                (true, true) => busy += 1,
                (true, false) => idle += 1,
                (false, true) => {
                    return Err(Violation::new("a granule touched by a live block is not committed"))
                }
                (false, false) => {}
            }
        }
        let mut below = 0;
        for &(lo, hi) in &self.candidates {
            if lo < below || lo >= hi || !bases.iter().any(|&(b, e)| b <= lo && hi <= e) {
                return Err(Violation::new(
                    "candidates not sorted, empty, overlapping or across reservations",
                ));
            }
            below = hi;
            let unsafe_to_take =
                |s: u32| !self.touched.get(s) && (touched[s as usize] || !self.committed_bits.get(s));
            if (lo..hi).any(unsafe_to_take) {
                return Err(Violation::new(
                    "a candidate granule not marked touched is Uncommitted or touched by a live block",
                ));
            }
        }
        if idle != self.count_idle() {
            return Err(Violation::new("the search for Idle granules misses some or finds others"));
        }
        if self.counts_idle() && idle > self.idle_bound {
            return Err(Violation::new("more Idle granules than the pool counts"));
        }
        // What the pool keeps: the Idle granules the space can give back.
        if !self.trim_pending && self.count_releasable() << self.shift > self.config.keep {
            return Err(Violation::new("more idle committed memory than the release threshold"));
        }
        // busy + idle = the committed bits, counted above.
        if self.committed > self.peak_committed || self.peak_busy > self.peak_committed {
            return Err(Violation::new("committed count above its peak, or the Busy peak above it"));
        }
        if self.index.used_bytes() + self.index.free_bytes() != self.reserved_bytes() {
            return Err(Violation::new("bytes in use + bytes free != bytes reserved"));
        }
        if used_bytes != self.index.used_bytes() || self.index.used_bytes() > (busy << self.shift) {
            return Err(Violation::new("live bytes exceed the Busy granules"));
        }
        Ok(())
    }
}
