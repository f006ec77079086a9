//! The idle list: committed granules that no live block touches, as runs
//! oldest first, found from their ends through per-granule tags and, for
//! long runs, a bitmap of their starts.

use super::VirtualPool;
use crate::vmem::ReservableSpace;

/// "None": the `start` of a record that holds no run, the end of the list
/// of free records.
pub(super) const NONE: u32 = u32::MAX;
/// The record that heads the idle list (a circle through it); it holds no
/// run.
pub(super) const SENTINEL: u32 = 0;
/// Idle runs of more granules than this have their start marked in a
/// bitmap: the start of a shorter one lies less than this many slots below
/// any of its granules, close enough to look up slot by slot. Most runs
/// are shorter (over 96 % on the training traces of the benches), and the
/// calls that make and take them touch no bitmap.
pub(super) const LONG_RUN: u32 = 64;

/// Granules that turned Idle in one call, or what is left of them: one
/// entry of the idle list. A large block turns Idle, and is taken again, at
/// the cost of one entry, not one per granule.
#[derive(Clone, Copy, Debug)]
pub(super) struct Run {
    /// The run's granules are the slots `start..end`, never empty, in one
    /// reservation; `start` is `NONE` in a free record and the sentinel.
    pub(super) start: u32,
    pub(super) end: u32,
    /// Neighbours in the idle list, a circle through the sentinel; a free
    /// record's `next` is the next free record.
    pub(super) prev: u32,
    pub(super) next: u32,
}

impl<V: ReservableSpace> VirtualPool<V> {
    /// The idle run that starts at slot `s`, if one does.
    #[inline(always)]
    pub(super) fn run_starting(&self, s: u32) -> Option<u32> {
        let id = self.tags[s as usize];
        (self.runs[id as usize].start == s).then_some(id)
    }

    /// The idle run that ends at slot `s` (its last granule), if one does.
    #[inline]
    pub(super) fn run_ending(&self, s: u32) -> Option<u32> {
        let id = self.tags[s as usize];
        let r = self.runs[id as usize];
        (r.start != NONE && r.end == s + 1).then_some(id)
    }

    /// The idle run that holds slot `s`, an Idle granule: the one that
    /// starts at the last run start at or below it (runs are disjoint).
    /// A short run starts at most `LONG_RUN - 1` slots below, found slot by
    /// slot; a long one is marked, found a word of `long_starts` at a time.
    /// Only a block placed at an alignment inside a run starts inside one.
    #[cold]
    pub(super) fn run_holding(&self, s: u32) -> u32 {
        let near = (s.saturating_sub(LONG_RUN - 1)..=s).rev().find_map(|t| self.run_starting(t));
        let start = || self.long_starts.find_back(0, s + 1, true).and_then(|t| self.run_starting(t));
        near.or_else(start).expect("an Idle granule lies in a run")
    }

    /// Makes the committed slots `start..end` Idle, as one run at the back
    /// of the idle list (the newest) or at its front (the oldest). Out of
    /// line: half the frees of a training trace leave no granule Idle, and
    /// a free without it is small enough to inline into its caller.
    #[inline(never)]
    pub(super) fn push_idle(&mut self, start: u32, end: u32, front: bool) {
        let id = self.new_run(start, end);
        let after = if front { SENTINEL } else { self.runs[SENTINEL as usize].prev };
        self.link_after(id, after);
        self.idle += (end - start) as u64;
        if end - start > LONG_RUN {
            self.long_starts.put(start, true);
        }
    }

    /// A record for the run `start..end`, not linked yet (nor marked if
    /// long).
    #[inline(always)]
    pub(super) fn new_run(&mut self, start: u32, end: u32) -> u32 {
        let run = Run { start, end, prev: NONE, next: NONE };
        let id = match self.free_run {
            NONE => {
                self.runs.push(run);
                (self.runs.len() - 1) as u32
            }
            id => {
                self.free_run = self.runs[id as usize].next;
                self.runs[id as usize] = run;
                id
            }
        };
        self.tags[start as usize] = id;
        self.tags[end as usize - 1] = id;
        id
    }

    /// Links run `id` into the idle list after `prev` (the sentinel: first).
    #[inline(always)]
    pub(super) fn link_after(&mut self, id: u32, prev: u32) {
        let next = self.runs[prev as usize].next;
        let run = &mut self.runs[id as usize];
        (run.prev, run.next) = (prev, next);
        self.runs[prev as usize].next = id;
        self.runs[next as usize].prev = id;
    }

    /// Takes the granules from slot `s` up to `hi` or the end of their run
    /// `id` (which starts at or below `s`) off the idle list; returns where
    /// they end. What is left of the run on either side keeps its place in
    /// the list.
    #[inline(always)]
    pub(super) fn take_idle(&mut self, id: u32, s: u32, hi: u32) -> u32 {
        let Run { start, end, prev, next } = self.runs[id as usize];
        let e = end.min(hi);
        match (start < s, e < end) {
            (false, false) => {
                self.runs[prev as usize].next = next;
                self.runs[next as usize].prev = prev;
                let run = &mut self.runs[id as usize];
                (run.start, run.next) = (NONE, self.free_run);
                self.free_run = id;
            }
            (true, false) => {
                self.runs[id as usize].end = s;
                self.tags[s as usize - 1] = id;
            }
            (false, true) => {
                self.runs[id as usize].start = e;
                self.tags[e as usize] = id;
            }
            (true, true) => {
                // Both sides stay, the right one (newer) in a record of its
                // own just after this one.
                self.runs[id as usize].end = s;
                self.tags[s as usize - 1] = id;
                let right = self.new_run(e, end);
                self.link_after(right, id);
            }
        }
        self.idle -= (e - s) as u64;
        // Last: a store to the bitmap before the cases above makes them
        // reload `self`'s vectors even where none happened (measured).
        if end - start > LONG_RUN {
            self.mark_parts(start, end, s, e);
        }
        e
    }

    /// Marks what is left of the long run `start..end` once `s..e` is
    /// taken from it: `start..s` and `e..end` (each maybe empty), only
    /// those still long.
    #[inline(always)]
    pub(super) fn mark_parts(&mut self, start: u32, end: u32, s: u32, e: u32) {
        self.long_starts.put(start, s - start > LONG_RUN);
        if end - e > LONG_RUN {
            self.long_starts.put(e, true);
        }
    }

    /// The slots of the granules a block of `lo..hi` shares with no other
    /// live block: all but the first and last if other blocks count there.
    #[inline(always)]
    pub(super) fn own_slots(&self, lo: u32, hi: u32) -> (u32, u32) {
        let first = lo + (self.edges[lo as usize] != 0) as u32;
        (first, hi - (self.edges[hi as usize - 1] != 0) as u32)
    }

    /// Pins the granules of slots `s..hi` that a block just carved shares
    /// with no other live block: the Idle ones, a run at a time, leave the
    /// idle list, so that no trim takes them. Returns whether some are
    /// Uncommitted. Out of line, as [`push_idle`](Self::push_idle).
    #[inline(never)]
    pub(super) fn pin(&mut self, mut s: u32, hi: u32) -> bool {
        let mut fresh = false;
        while s < hi {
            if let Some(id) = self.run_starting(s) {
                s = self.take_idle(id, s, hi);
            } else if self.committed_bits.get(s) {
                s = self.take_idle(self.run_holding(s), s, hi);
            } else {
                fresh = true;
                s = self.committed_bits.find(s, hi, true);
            }
        }
        fresh
    }

    /// Counts a new block of slots `lo..hi` at its first and last granule.
    #[inline(always)]
    pub(super) fn count_edges(&mut self, lo: u32, hi: u32) {
        self.edges[lo as usize] += 1;
        self.edges[hi as usize - 1] += (hi - 1 != lo) as u32;
    }

    /// After a free of a block of slots `lo..hi`: uncounts it; its granules
    /// that no other live block counts, all committed, turn Idle as one run
    /// (the newest).
    #[inline(always)]
    pub(super) fn unpin(&mut self, lo: u32, hi: u32) {
        self.edges[lo as usize] -= 1;
        self.edges[hi as usize - 1] -= (hi - 1 != lo) as u32;
        let (lo, hi) = self.own_slots(lo, hi);
        if lo < hi {
            self.push_idle(lo, hi, false);
        }
    }
}
