//! A per-thread or per-stream arena: superblocks and the blocks cut from them.

use super::OwnerKey;
use crate::check::Violation;
use crate::index::{Allocation, CoalescingIndex};
use crate::{Error, Range, Result};
use alloc::vec::Vec;

/// A superblock held by an arena.
#[derive(Clone, Copy, Debug)]
struct Held {
    range: Range,
    /// The arena index's node at the superblock's lowest address.
    first: u32,
}

/// One arena's state (behind its own lock in `ArenaResource`).
///
/// Each superblock is one region of `index`: blocks never coalesce across
/// superblocks, so a wholly free superblock can leave whole.
#[derive(Debug)]
pub(super) struct Local {
    /// Free and used ranges of the superblocks held.
    index: CoalescingIndex,
    /// Superblocks held, in the order they came.
    supers: Vec<Held>,
    /// Sum of the superblocks' lengths.
    held: u64,
    /// Whose arena this is (`NOBODY`: the slot is free). The slot table's
    /// keys only point callers here; this, read under the arena's lock, is
    /// what serves a caller or not.
    owner: OwnerKey,
    /// Superblocks taken out to go to the global arena once their stream is
    /// synchronized, or back here if that fails: the slot may not change
    /// hands meanwhile.
    in_transit: usize,
    /// Whether the arena served an allocation (or changed hands) since the
    /// last idle sweep looked at it.
    touched: bool,
}

impl Local {
    pub(super) fn new() -> Self {
        Local {
            index: CoalescingIndex::new(256),
            supers: Vec::new(),
            held: 0,
            owner: OwnerKey::NOBODY,
            in_transit: 0,
            touched: false,
        }
    }

    /// Whose arena this is (`NOBODY`: the slot is free).
    pub(super) fn owner(&self) -> OwnerKey {
        self.owner
    }

    /// Hands the arena to `owner` (`NOBODY`: frees its slot); a new owner
    /// counts as a use.
    pub(super) fn set_owner(&mut self, owner: OwnerKey) {
        self.owner = owner;
        self.touched = true;
    }

    /// Whether the arena was used since the last call, which starts a new
    /// period (the idle sweep's question).
    pub(super) fn touched_since(&mut self) -> bool {
        core::mem::replace(&mut self.touched, false)
    }

    /// Whether the arena was used since the idle sweep last asked.
    pub(super) fn touched(&self) -> bool {
        self.touched
    }

    /// Whether superblocks taken out by [`take_free`](Self::take_free) are
    /// still in transit.
    pub(super) fn in_transit(&self) -> bool {
        self.in_transit != 0
    }

    /// One superblock taken out by [`take_free`](Self::take_free) reached
    /// the global arena, or came back here.
    pub(super) fn arrived(&mut self) {
        self.in_transit -= 1;
    }

    /// Bytes handed out (at their size class).
    pub(super) fn used_bytes(&self) -> u64 {
        self.index.used_bytes()
    }

    /// The largest free range.
    pub(super) fn largest_free(&self) -> u64 {
        self.index.largest_free()
    }

    /// The superblocks held, in the order they came.
    pub(super) fn superblocks(&self) -> impl Iterator<Item = Range> + '_ {
        self.supers.iter().map(|h| h.range)
    }

    /// Frees a block by its index tag and the size it was asked with.
    #[inline]
    pub(super) fn free(&mut self, tag: u64, addr: u64, size: u64) -> Result<()> {
        self.index.free(tag, addr, size).map(|_| ())
    }

    /// The arena's figures for a dump (`None` for a free slot).
    pub(super) fn stats(&self) -> Option<super::ArenaStats> {
        self.owner.owner().map(|owner| super::ArenaStats {
            owner,
            superblocks: self.supers.len(),
            free_superblocks: self.free_supers(),
            held: self.held,
            used: self.index.used_bytes(),
            free: self.index.free_bytes(),
            largest_free: self.index.largest_free(),
        })
    }

    /// Whether a block is live in the arena.
    pub(super) fn has_live(&self) -> bool {
        self.index.used_count() != 0
    }

    /// Whether the arena can change hands: nothing live, no superblock held
    /// or in transit (so nothing a stream may still be using).
    pub(super) fn is_idle(&self) -> bool {
        !self.has_live() && self.supers.is_empty() && self.in_transit == 0
    }

    /// A block of `size` bytes that takes its size class's `class`.
    #[inline]
    pub(super) fn allocate(&mut self, size: u64, class: u64, align: u64) -> Result<Option<Allocation>> {
        self.touched = true;
        self.index.allocate_class(size, class, align)
    }

    /// [`allocate`](Self::allocate) from any free range that holds it, not
    /// only the first ranges of its class: the last resort when no
    /// superblock is to be had.
    pub(super) fn allocate_exhaustive(
        &mut self,
        size: u64,
        class: u64,
        align: u64,
    ) -> Result<Option<Allocation>> {
        self.touched = true;
        self.index.allocate_class_exhaustive(size, class, align)
    }

    /// [`allocate`](Self::allocate) from the superblock whose first node is
    /// `first`, whatever its size class: a superblock of exactly what an
    /// aligned request needs sits in a class below the one a search starts
    /// at.
    pub(super) fn allocate_in(
        &mut self,
        first: u32,
        size: u64,
        class: u64,
        align: u64,
    ) -> Result<Option<Allocation>> {
        self.touched = true;
        self.index.allocate_class_in(first, size, class, align)
    }

    /// Adds a superblock; returns its first node.
    pub(super) fn add(&mut self, range: Range) -> Result<u32> {
        let first = self.index.add_range(range)?;
        self.supers.push(Held { range, first });
        self.held += range.len();
        Ok(first)
    }

    /// Takes out every wholly free superblock, handing each to `out`, and
    /// counts them in transit.
    pub(super) fn take_free(&mut self, mut out: impl FnMut(Range)) {
        let mut i = 0;
        while i < self.supers.len() {
            let h = self.supers[i];
            if self.index.is_region_free(h.first) && self.index.remove_range(h.first).is_ok() {
                self.supers.swap_remove(i);
                self.held -= h.range.len();
                self.in_transit += 1;
                out(h.range);
            } else {
                i += 1;
            }
        }
    }

    /// Frees a block known by its address, inside the superblock that starts
    /// at `start`. `tag` is the caller's index tag (`None`: unknown).
    pub(super) fn free_at(&mut self, start: u64, addr: u64, size: u64, tag: Option<u64>) -> Result<()> {
        let Some(h) = self.supers.iter().find(|h| h.range.start() == start) else {
            return Err(Error::UnknownBlock { addr });
        };
        let first = h.first;
        self.index.free_by_address(first, addr, size, tag.is_some()).map(|_| ())
    }

    /// Wholly free superblocks.
    fn free_supers(&self) -> usize {
        self.supers.iter().filter(|h| self.index.is_region_free(h.first)).count()
    }

    /// The arena's own invariants: its index, each superblock covered exactly
    /// by its ranges, used + free = held.
    pub(super) fn check(&self) -> core::result::Result<(), Violation> {
        self.index.check()?;
        let mut total = 0;
        for h in &self.supers {
            let mut cursor = h.range.start();
            self.index.for_each_in_region(h.first, |r, _| {
                cursor = if r.start() == cursor { r.end() } else { u64::MAX };
            });
            if cursor != h.range.end() {
                return Err(Violation::new("arena: superblock not covered exactly by its blocks"));
            }
            total += h.range.len();
        }
        if total != self.held {
            return Err(Violation::new("arena: superblock lengths do not add up"));
        }
        if self.index.used_bytes() + self.index.free_bytes() != self.held {
            return Err(Violation::new("arena: bytes in use + bytes free != bytes of its superblocks"));
        }
        Ok(())
    }
}
