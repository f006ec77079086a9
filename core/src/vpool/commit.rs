//! Committing the granules of new blocks and decommitting Idle ones: the
//! limit on committed memory, trims, and what a failure leaves.

use super::idle::SENTINEL;
use super::{Reservation, VirtualPool};
use crate::vmem::ReservableSpace;
use crate::{Request, Result, Stream};

impl<V: ReservableSpace> VirtualPool<V> {
    /// The rest of an allocate whose block `a` (of `request`, in slots
    /// `lo..hi`, pinned) has Uncommitted granules: commits them. Out
    /// of physical memory, it decommits the Idle granules and tries once
    /// more, also when a decommit failed after others gave memory back. If
    /// that fails too, the block goes back to the index, its granules that
    /// no live block touches turn Idle, and the error is returned: the
    /// failed decommit's if the pool is still out of physical memory after
    /// a trim that could not give back all its Idle granules (it is then
    /// not out of memory for want of memory but because the space failed).
    #[inline(never)]
    pub(super) fn commit_fresh<S: Stream + ?Sized>(
        &mut self,
        a: &crate::index::Allocation,
        request: Request,
        (lo, hi): (u32, u32),
        stream: &S,
    ) -> Result<()> {
        let r = &self.reservation_of(a.addr).copied().expect("the index hands out reserved addresses");
        let mut committed = self.commit_pinned(r, lo, hi, stream);
        if matches!(committed, Err(e) if e.is_out_of_memory()) && self.idle > 0 {
            // Out of physical memory: give the idle granules back and try
            // once more, as the CUDA pool trims before it fails. A trim
            // that fails part way may still have made room.
            let before = self.committed;
            let trimmed = self.trim_to(0, false, stream);
            if self.committed < before {
                committed = self.commit_pinned(r, lo, hi, stream);
            }
            // Still out of memory with Idle granules left committed: the
            // space's failure to decommit them is why.
            if let (Err(e), Err(t)) = (committed, trimmed) {
                if e.is_out_of_memory() {
                    committed = Err(t);
                }
            }
        }
        if let Err(e) = committed {
            // The index takes the block back; the granules it pinned, or
            // committed and failed to decommit, turn Idle.
            self.index.free(a.tag, a.addr, request.size())?;
            let (mut s, hi) = self.own_slots(lo, hi);
            while s < hi {
                let run = self.committed_bits.find(s, hi, true);
                s = self.committed_bits.find(run, hi, false);
                if run < s {
                    self.push_idle(run, s, false);
                }
            }
            // Beyond `keep` only if an earlier decommit failed (a trim of
            // this call may have cleared that); retry it as a free does.
            self.retry_trim(stream);
            return Err(e);
        }
        Ok(())
    }

    /// Commits the Uncommitted granules of slots `lo..hi` of `r` (the
    /// others pinned or Busy): under `trim_on_commit`, first decommits as
    /// many Idle granules as the commit would take committed memory beyond
    /// its limit (ordered on `stream`), then commits in runs. If a commit
    /// fails, what this call committed is decommitted and the error
    /// returned; the pinned granules stay pinned.
    pub(super) fn commit_pinned<S: Stream + ?Sized>(
        &mut self,
        r: &Reservation,
        lo: u32,
        hi: u32,
        stream: &S,
    ) -> Result<()> {
        let fresh = (hi - lo - self.committed_bits.count(lo, hi)) as u64;
        let busy = self.committed - self.idle + fresh;
        let used = self.peak_used.max(self.index.used_bytes());
        let excess =
            (self.committed + fresh).saturating_sub(self.commit_limit(self.peak_busy.max(busy), used));
        // Idle memory is a cache that raises the peak by at most the slack:
        // give back as much of it as the commit would go beyond that. A
        // failed decommit only leaves more of it. The space may keep what
        // it decommits for the commits below (CUDA: the physical handles,
        // mapped again where they are needed) until they are done.
        let trims = self.config.trim_on_commit && self.idle > 0 && excess > 0;
        if trims {
            let _ = self.trim_to(self.idle.saturating_sub(excess) << self.shift, true, stream);
        }
        let mut s = lo;
        while s < hi {
            let run = self.committed_bits.find(s, hi, false);
            s = self.committed_bits.find(run, hi, true);
            if run == s {
                continue;
            }
            if let Err(e) = self.space.commit(self.slot_range(r, run, s)) {
                if trims {
                    self.space.release_kept();
                }
                self.undo_commits(r, lo, run);
                return Err(e);
            }
        }
        if trims {
            self.space.release_kept();
        }
        self.committed_bits.set(lo, hi, true);
        self.committed += fresh;
        self.peak_committed = self.peak_committed.max(self.committed);
        self.peak_busy = self.peak_busy.max(busy);
        self.peak_used = used;
        Ok(())
    }

    /// Under `trim_on_commit`, the most granules committed while some are
    /// Idle: the peak of bytes in use plus the slack, in whole granules, or
    /// the peak of Busy granules if more (so that a slack of 0 never raises
    /// the peak of committed memory).
    #[inline]
    pub(super) fn commit_limit(&self, peak_busy: u64, peak_used: u64) -> u64 {
        let slack = peak_used.saturating_mul(self.config.slack_permille as u64) / 1000;
        (peak_used.saturating_add(slack) >> self.shift).max(peak_busy)
    }

    /// Decommits the granules of `lo..upto` that are not committed in the
    /// bitmap: those a failed `commit_pinned` committed. Memory no block
    /// ever used needs no stream order. If the space refuses, they stay
    /// committed and counted, pinned with the block's other granules.
    pub(super) fn undo_commits(&mut self, r: &Reservation, lo: u32, upto: u32) {
        let mut s = lo;
        while s < upto {
            let run = self.committed_bits.find(s, upto, false);
            s = self.committed_bits.find(run, upto, true);
            if run < s && self.space.decommit(self.slot_range(r, run, s), &()).is_err() {
                self.committed_bits.set(run, s, true);
                self.committed += (s - run) as u64;
                self.peak_committed = self.peak_committed.max(self.committed);
                self.trim_pending = true;
            }
        }
    }

    /// Decommits the oldest Idle granules, each with its Idle neighbours,
    /// until at most `keep` bytes are Idle; the decommits are ordered on
    /// `stream`, and `for_commit` when a commit follows
    /// ([`ReservableSpace::decommit_for_commit`]). Returns the bytes
    /// decommitted.
    ///
    /// # Errors
    ///
    /// The space's error if a decommit fails; those granules stay
    /// committed and Idle, and the pool stays usable.
    #[inline(never)]
    pub(super) fn trim_to<S: Stream + ?Sized>(
        &mut self,
        keep: u64,
        for_commit: bool,
        stream: &S,
    ) -> Result<u64> {
        let limit = keep >> self.shift;
        let mut freed = 0;
        // How many more granules to take (at most all of them: a u32).
        let excess = |p: &Self| (p.idle - limit) as u32;
        while self.idle > limit {
            // The oldest granule, the first of the head run, then its Idle
            // neighbours above, then below, as many as needed.
            let head = self.runs[SENTINEL as usize].next;
            let s = self.runs[head as usize].start;
            let r = *self.reservation_of_slot(s);
            let end = r.base + (r.range.len() >> self.shift) as u32;
            let mut hi = self.take_idle(head, s, s.saturating_add(excess(self)));
            while hi < end && self.idle > limit {
                let Some(id) = self.run_starting(hi) else { break };
                hi = self.take_idle(id, hi, hi.saturating_add(excess(self)));
            }
            let mut lo = s;
            while lo > r.base && self.idle > limit {
                let Some(id) = self.run_ending(lo - 1) else { break };
                let from = self.runs[id as usize].start.max(lo - excess(self).min(lo));
                self.take_idle(id, from, lo);
                lo = from;
            }
            let range = self.slot_range(&r, lo, hi);
            let decommitted = match for_commit {
                true => self.space.decommit_for_commit(range, stream),
                false => self.space.decommit(range, stream),
            };
            if let Err(e) = decommitted {
                self.push_idle(lo, hi, true);
                self.trim_pending = true;
                return Err(e);
            }
            self.committed_bits.set(lo, hi, false);
            self.committed -= (hi - lo) as u64;
            freed += ((hi - lo) as u64) << self.shift;
        }
        // A trim to more than `keep` (on commit) leaves a failed one pending.
        self.trim_pending &= self.idle_bytes() > self.config.keep;
        Ok(freed)
    }

    /// Decommits every committed granule that no live block touches,
    /// ordered on `stream`, whatever the release threshold (the CUDA pool's
    /// `cudaMemPoolTrimTo(pool, 0)`). Returns the bytes decommitted.
    ///
    /// # Errors
    ///
    /// The space's error if a decommit fails; those granules stay committed
    /// and the pool stays usable.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::CountingSpace;
    /// use memres_core::vpool::{VirtualConfig, VirtualPool};
    /// use memres_core::{MemoryResourceMut, Request};
    /// let space = CountingSpace::new(1 << 30, 2 << 20);
    /// let mut pool = VirtualPool::with_config(&space, VirtualConfig::new(64 << 20).release_threshold(8 << 20))?;
    /// let a = pool.allocate(Request::new(4 << 20)?, &())?;
    /// pool.deallocate(a, &())?;
    /// assert_eq!(pool.idle_bytes(), 4 << 20); // kept: under the threshold
    /// assert_eq!(pool.trim(&())?, 4 << 20);
    /// assert_eq!(space.committed_bytes(), 0);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn trim<S: Stream + ?Sized>(&mut self, stream: &S) -> Result<u64> {
        self.trim_to(0, false, stream)
    }

    /// After a failed allocate: decommits the oldest Idle granules beyond
    /// `keep`, ordered on `stream`, if a failed decommit left some (a trim
    /// pending). A failure of this trim leaves it pending.
    #[cold]
    pub(super) fn retry_trim<S: Stream + ?Sized>(&mut self, stream: &S) {
        if self.idle > self.keep {
            let _ = self.trim_to(self.config.keep, false, stream);
        }
    }
}
