//! Committing the granules of new blocks and decommitting Idle ones: the
//! limit on committed memory, trims, and what a failure leaves.

use super::{Reservation, VirtualPool};
use crate::index::Allocation;
use crate::vmem::{ReservableSpace, DECOMMITTED_IN_PART};
use crate::{Error, Range, Request, Result, Stream};

/// Whether a failed decommit took part of its range
/// ([`DECOMMITTED_IN_PART`]).
fn in_part(e: &Error) -> bool {
    matches!(e, Error::Backend { what, .. } if *what == DECOMMITTED_IN_PART)
}

/// A block the index carved for an allocate that has not handed it out.
/// Dropped (its commits failed, or the space's code panicked), it goes
/// back to the index as a free that leaves its trim to a later call, which
/// calls no code of the space's.
struct Carved<'a, V: ReservableSpace> {
    pool: &'a mut VirtualPool<V>,
    a: Allocation,
    request: Request,
}

impl<V: ReservableSpace> Carved<'_, V> {
    /// The block's granules are committed and counted: the caller hands
    /// it out.
    fn hand_out(self) {
        core::mem::forget(self);
    }
}

impl<V: ReservableSpace> Drop for Carved<'_, V> {
    fn drop(&mut self) {
        let (a, p) = (self.a, &mut *self.pool);
        // Just carved, the block is live: the index takes it back.
        if let Ok(freed) = p.index.free(a.tag, a.addr, self.request.size()) {
            p.after_free(freed, a.addr, self.request.rounded_size(256), false, &());
        }
    }
}

/// Slots `lo..hi` of reservation `r`, no live block's, whose commit or
/// decommit is in progress. If the space's code panics there, the range
/// may be as it was or not (a space outside its contract maps or unmaps,
/// then panics): dropped, it asks the space granule by granule, as after a
/// decommit that took part of its range
/// ([`recount_in_part`](VirtualPool::recount_in_part)). So the pool never
/// counts a granule the space took, nor hands out a block over one; one
/// the space holds that the pool cannot count is lost to it, never served.
/// Forgotten once the call returns ([`settled`](Self::settled)).
struct Unsure<'a, V: ReservableSpace> {
    pool: &'a mut VirtualPool<V>,
    r: Reservation,
    lo: u32,
    hi: u32,
}

impl<V: ReservableSpace> Unsure<'_, V> {
    /// The call returned: its answer says what it did.
    fn settled(self) {
        core::mem::forget(self);
    }
}

impl<V: ReservableSpace> Drop for Unsure<'_, V> {
    fn drop(&mut self) {
        let (p, r, lo, hi) = (&mut *self.pool, self.r, self.lo, self.hi);
        crate::resource::in_destructor(|| p.recount_in_part(&r, lo, hi));
    }
}

/// A commit of a block's granules that failed: the block went back to the
/// index.
pub(super) struct CommitFailed {
    /// What the allocate returns unless it tries again.
    pub(super) error: Error,
    /// Out of physical memory, the trim after the block went back gave
    /// memory back: another try may fit.
    pub(super) gave_back: bool,
}

/// Slots `lo..hi` of reservation `r` (of one block being placed) whose
/// granules the space holds committed where the bitmap does not say so:
/// those the call in progress committed, less those its undo decommitted.
/// Dropped, on every way out of the call (a panic in the space's code
/// included), it counts them committed.
struct Uncounted<'a, V: ReservableSpace> {
    pool: &'a mut VirtualPool<V>,
    r: Reservation,
    lo: u32,
    hi: u32,
}

impl<V: ReservableSpace> Uncounted<'_, V> {
    /// Decommits the granules it holds, a run at a time from the lowest:
    /// memory no block ever used needs no stream order. Those the space
    /// refuses to decommit stay committed and counted, and a trim is
    /// pending.
    fn undo(&mut self) {
        while self.lo < self.hi {
            let (p, r) = (&mut *self.pool, &self.r);
            let run = p.committed_bits.find(self.lo, self.hi, false);
            let end = p.committed_bits.find(run, self.hi, true);
            // No longer the drop's to count: `run..end` is this decommit's
            // (a panic leaves it to `Unsure`), `end..` stays the drop's.
            self.lo = end;
            if run < end {
                let (r, range) = (*r, p.slot_range(r, run, end));
                let unsure = Unsure { pool: p, r, lo: run, hi: end };
                let undone = unsure.pool.space.decommit(range, &());
                unsure.settled();
                if let Err(e) = undone {
                    let p = &mut *self.pool;
                    p.count_committed(run, end);
                    p.trim_pending = true;
                    if in_part(&e) {
                        p.recount_in_part(&r, run, end);
                    }
                }
            }
        }
    }
}

impl<V: ReservableSpace> Drop for Uncounted<'_, V> {
    fn drop(&mut self) {
        self.pool.count_committed(self.lo, self.hi);
    }
}

impl<V: ReservableSpace> VirtualPool<V> {
    /// The rest of an allocate whose block `a` (of `request`, in slots
    /// `lo..hi`, marked touched) has `fresh` Uncommitted granules: commits
    /// them. Out of physical memory, it decommits the Idle granules and
    /// tries once more, also when a decommit failed after others gave
    /// memory back. If that fails too, the block goes back to the index
    /// (also when the space's code panics, what it committed counted) and
    /// the error is returned: the failed decommit's if the pool is
    /// still out of physical memory after a trim that could not give back
    /// all its Idle granules (it is then not out of memory for want of
    /// memory but because the space failed). Out of physical memory, the
    /// pool then decommits every Idle granule once more: a space that
    /// frees memory in pieces gives back only now those that shared a
    /// piece with the block (and the block's own).
    #[inline(never)]
    pub(super) fn commit_fresh<S: Stream + ?Sized>(
        &mut self,
        a: &Allocation,
        request: Request,
        (lo, hi): (u32, u32),
        fresh: u64,
        stream: &S,
    ) -> core::result::Result<(), CommitFailed> {
        // Until its granules are committed the block is the call's: if
        // that fails, or the space's code panics, the index takes it back.
        // Its granules that no live block touches, committed before or by
        // this call and not decommitted, are then Idle; as a free that
        // leaves its trim to the call's end: beyond `keep` only if an
        // earlier decommit failed (a trim of this call may have cleared
        // that), retried then, as a free does.
        let carved = Carved { pool: self, a: *a, request };
        match carved.pool.commit_or_trim(a, (lo, hi), fresh, stream) {
            Ok(()) => {
                carved.hand_out();
                Ok(())
            }
            Err(e) if e.is_out_of_memory() => {
                drop(carved);
                let before = self.committed;
                let trimmed = self.trim_to(0, false, stream);
                let gave_back = self.committed < before;
                // Still Idle granules the space failed to decommit: its
                // failure is the error, unless another try fits.
                Err(CommitFailed { error: trimmed.err().unwrap_or(e), gave_back })
            }
            Err(e) => {
                drop(carved);
                self.retry_trim(stream);
                Err(CommitFailed { error: e, gave_back: false })
            }
        }
    }

    /// The commits of [`commit_fresh`](Self::commit_fresh), and the trim
    /// and the second try when the space is out of physical memory.
    fn commit_or_trim<S: Stream + ?Sized>(
        &mut self,
        a: &Allocation,
        (lo, hi): (u32, u32),
        fresh: u64,
        stream: &S,
    ) -> Result<()> {
        let r = &self.reservation_of(a.addr).copied().expect("the index hands out reserved addresses");
        let mut committed = self.commit_slots(r, lo, hi, fresh, stream);
        if matches!(committed, Err(e) if e.is_out_of_memory()) {
            // Out of physical memory: give the Idle granules back and try
            // once more, as the CUDA pool trims before it fails. A trim
            // that fails part way may still have made room.
            let before = self.committed;
            let trimmed = self.trim_to(0, false, stream);
            if self.committed < before {
                // Granules the first try committed and could not decommit
                // stay committed: no longer fresh.
                let fresh = self.uncommitted(lo, hi);
                committed = self.commit_slots(r, lo, hi, fresh, stream);
            }
            // Still out of memory with Idle granules left committed: the
            // space's failure to decommit them is why.
            if let (Err(e), Err(t)) = (committed, trimmed) {
                if e.is_out_of_memory() {
                    committed = Err(t);
                }
            }
        }
        committed
    }

    /// Commits the Uncommitted granules of slots `lo..hi` of `r`, `fresh`
    /// of them (the others belong to live blocks or to the block being
    /// placed): under `trim_on_commit`, first decommits as many Idle
    /// granules as the commit would take committed memory beyond its limit
    /// (ordered on `stream`), then commits in runs. If a commit fails, what
    /// this call committed is decommitted and the error returned. If the
    /// space's code panics, what it committed is counted (committed, and
    /// Idle once the block goes back to the index).
    pub(super) fn commit_slots<S: Stream + ?Sized>(
        &mut self,
        r: &Reservation,
        lo: u32,
        hi: u32,
        fresh: u64,
        stream: &S,
    ) -> Result<()> {
        let used = self.peak_used.max(self.index.used_bytes());
        // Busy granules once the block is committed, as far as known.
        let mut busy = 0;
        let over = |p: &Self, busy: u64| {
            (p.committed + fresh).saturating_sub(p.commit_limit(p.peak_busy.max(busy), used))
        };
        // Idle memory is a cache that raises the peak by at most the slack:
        // give back as much of it as the commit would go beyond that. A
        // failed decommit only leaves more of it. The space may keep what
        // it decommits for the commits below (CUDA: the physical handles,
        // mapped again where they are needed) until they are done.
        let mut trims = false;
        if self.config.trim_on_commit && over(self, busy) > 0 {
            trims = true;
            // The candidates of an earlier search first; if they run short,
            // one more search, which also learns how many granules are
            // Busy (so the limit may rise).
            if self.decommit_idle(over(self, busy), true, stream).is_ok() && over(self, busy) > 0 {
                busy = self.committed - self.scan() + fresh;
                let _ = self.decommit_idle(over(self, busy), true, stream);
            }
        }
        // The runs committed so far, `lo..done.hi`, counted when `done`
        // drops: all of `lo..hi` once every commit succeeded.
        let mut done = Uncounted { pool: self, r: *r, lo, hi: lo };
        let mut s = lo;
        while s < hi {
            let p = &mut *done.pool;
            let run = p.committed_bits.find(s, hi, false);
            s = p.committed_bits.find(run, hi, true);
            if run == s {
                continue;
            }
            let unsure = Unsure { pool: p, r: *r, lo: run, hi: s };
            let committed = unsure.pool.space.commit(unsure.pool.slot_range(r, run, s));
            unsure.settled();
            if let Err(e) = committed {
                if trims {
                    done.pool.space.release_kept();
                }
                done.undo();
                return Err(e);
            }
            done.hi = s;
        }
        if trims {
            done.pool.space.release_kept();
        }
        drop(done);
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

    /// The number of Uncommitted granules in slots `lo..hi`.
    #[inline]
    pub(super) fn uncommitted(&self, lo: u32, hi: u32) -> u64 {
        (hi - lo - self.committed_bits.count(lo, hi)) as u64
    }

    /// Sets the bits of slots `lo..hi` (empty or not) and counts those
    /// that were clear as committed.
    fn count_committed(&mut self, lo: u32, hi: u32) {
        if lo < hi {
            self.committed += self.uncommitted(lo, hi);
            self.committed_bits.set(lo, hi, true);
            self.peak_committed = self.peak_committed.max(self.committed);
        }
    }

    /// After a decommit of slots `lo..hi` of `r` (no live block's) that
    /// failed having decommitted part of them ([`DECOMMITTED_IN_PART`]), or
    /// a commit or decommit of them that panicked ([`Unsure`]): the space
    /// does not say which part it holds, and a commit of each granule
    /// tells. Refused as misuse ([`Error::InvalidConfig`]: committed
    /// already), the granule was kept; committed, it had gone and is back;
    /// failing otherwise, it had gone and stays so, and the pool no longer
    /// counts it. A granule counted but not held could be handed out
    /// unmapped, one held but not counted is only lost to the pool (and
    /// keeps its reservation from being released): so all of them count as
    /// gone until their commit says otherwise (if the space's code panics,
    /// the rest stay so).
    #[cold]
    fn recount_in_part(&mut self, r: &Reservation, lo: u32, hi: u32) {
        self.committed -= self.committed_bits.count(lo, hi) as u64;
        self.committed_bits.set(lo, hi, false);
        for s in lo..hi {
            match self.space.commit(self.slot_range(r, s, s + 1)) {
                Ok(()) | Err(Error::InvalidConfig { .. }) => self.count_committed(s, s + 1),
                Err(_) => {}
            }
        }
    }

    /// Decommits up to `n` Idle granules, the candidates of the last
    /// search from the highest address down, each run in one call ordered
    /// on `stream` (`for_commit` when a commit follows,
    /// [`ReservableSpace::decommit_for_commit`]). Returns how many it
    /// decommitted; fewer than `n` when the candidates run out.
    ///
    /// # Errors
    ///
    /// The space's error if a decommit fails; those granules stay
    /// committed and Idle (the next search finds them), and a trim is
    /// pending.
    pub(super) fn decommit_idle<S: Stream + ?Sized>(
        &mut self,
        n: u64,
        for_commit: bool,
        stream: &S,
    ) -> Result<u64> {
        let mut done = 0;
        while done < n {
            let Some((lo, hi)) = self.take_candidate(n - done) else { break };
            self.decommit_slots(lo, hi, for_commit, stream)?;
            done += (hi - lo) as u64;
        }
        Ok(done)
    }

    /// Decommits slots `lo..hi`, Idle granules of one reservation.
    fn decommit_slots<S: Stream + ?Sized>(
        &mut self,
        lo: u32,
        hi: u32,
        for_commit: bool,
        stream: &S,
    ) -> Result<()> {
        let r = *self.reservation_of_slot(lo);
        let range = self.slot_range(&r, lo, hi);
        // Pending until they are given back: if the space's code panics,
        // those it kept stay committed and Idle, as after a failed decommit.
        let pending = core::mem::replace(&mut self.trim_pending, true);
        let unsure = Unsure { pool: self, r, lo, hi };
        let decommitted = match for_commit {
            true => unsure.pool.space.decommit_for_commit(range, stream),
            false => unsure.pool.space.decommit(range, stream),
        };
        unsure.settled();
        if let Err(e) = decommitted {
            if in_part(&e) {
                self.recount_in_part(&r, lo, hi);
            }
            return Err(e);
        }
        self.trim_pending = pending;
        self.committed_bits.set(lo, hi, false);
        self.committed -= (hi - lo) as u64;
        self.idle_bound = self.idle_bound.saturating_sub((hi - lo) as u64);
        Ok(())
    }

    /// Decommits Idle granules until at most `keep` bytes are Idle, the
    /// highest first; the decommits are ordered on `stream`, and
    /// `for_commit` when a commit follows. Returns the bytes decommitted.
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
        // Pending until done: so a panic in the space's code leaves it.
        let pending = core::mem::replace(&mut self.trim_pending, true);
        let idle = self.scan();
        let excess = idle.saturating_sub(keep >> self.shift);
        let done = self.decommit_idle(excess, for_commit, stream)?;
        // A trim to more than `keep` (on commit) leaves a failed one pending.
        self.trim_pending = pending && self.idle_bound << self.shift > self.config.keep;
        Ok(done << self.shift)
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

    /// After a failed allocate: decommits Idle granules beyond `keep`,
    /// ordered on `stream`, if a failed decommit left some (a trim
    /// pending). A failure of this trim leaves it pending.
    #[cold]
    pub(super) fn retry_trim<S: Stream + ?Sized>(&mut self, stream: &S) {
        if self.trim_pending || self.idle_bound > self.keep {
            let _ = self.trim_to(self.config.keep, false, stream);
        }
    }

    /// After a free whose block (`len` bytes at `addr`) became part of the
    /// free range `freed`: its granules wholly inside `freed` are Idle now.
    /// Beyond `keep` Idle granules, decommits them or others, ordered on
    /// `stream`; unless `now` is false (the free of a block on another
    /// stream), then the trim is left pending for a later call.
    ///
    /// If no granule was Idle before, those of the block are all there are
    /// and go first, without a search.
    #[inline]
    pub(super) fn after_free<S: Stream + ?Sized>(
        &mut self,
        freed: Range,
        addr: u64,
        len: u64,
        now: bool,
        stream: &S,
    ) {
        if !self.counts_idle() {
            return;
        }
        let (lo, hi) = self.span_inside(freed, addr, len);
        let (before, new) = (self.idle_bound, (hi - lo) >> self.shift);
        self.idle_bound += new;
        if self.idle_bound <= self.keep {
            return;
        }
        if !now {
            self.trim_pending = true;
        } else if before == 0 && !self.trim_pending {
            // Pending until given back: so a panic in the space's code
            // leaves it.
            self.trim_pending = true;
            self.trim_pending = !self.decommit_freed(lo, hi, stream);
        } else {
            let _ = self.trim_to(self.config.keep, false, stream);
        }
    }

    /// The rest of [`after_free`](Self::after_free) where no granule was
    /// Idle before: the freed block's granules `lo..hi` (addresses) beyond
    /// `keep` are all there are, and go without a search. Returns whether
    /// no decommit failed.
    #[inline(never)]
    fn decommit_freed<S: Stream + ?Sized>(&mut self, lo: u64, hi: u64, stream: &S) -> bool {
        let (lo, hi) = self.slots_of(lo, hi - lo);
        // The highest first, as every trim, in the pieces the space frees.
        let Some((from, to)) = self.releasable(lo, hi, self.idle_bound - self.keep) else {
            return true;
        };
        // Not a candidate of an earlier search any more.
        self.touched.set(from, to, true);
        self.decommit_slots(from, to, false, stream).is_ok()
    }

    /// Whether the pool counts its Idle granules as blocks are freed: only
    /// a release threshold under all the memory makes a free trim.
    #[inline(always)]
    pub(super) fn counts_idle(&self) -> bool {
        self.config.keep != u64::MAX
    }

    /// The addresses of the granules of the block of `len` bytes at `addr`
    /// that lie wholly inside the free range `freed` that holds it: `lo..hi`,
    /// granule-aligned (equal if none).
    #[inline]
    fn span_inside(&self, freed: Range, addr: u64, len: u64) -> (u64, u64) {
        let g = self.granule();
        let lo = freed.start().next_multiple_of(g).max(addr & !(g - 1));
        let hi = (freed.end() & !(g - 1)).min((addr + len).next_multiple_of(g));
        (lo, hi.max(lo))
    }
}
