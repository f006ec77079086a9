//! [`Carry`]: the blocks a step carries into the next one, side by side
//! in a region of their own.

use super::placement::Lifetime;
use super::{OPEN, UNIT};
use crate::{Block, Request};
use alloc::vec::Vec;

/// Where the blocks a step carries into the next one go.
///
/// ```text
/// step k:    ... a (index 12) ... b (index 40) ...            | step()
/// step k+1:  ... a of step k freed ... a (slot 0) ... b of step k freed ... b (slot 1)
/// region:    [ slot 0: index 12 | slot 1: index 40 | ... ]
///            taken at the first carried allocation
/// ```
///
/// A slot belongs to one allocation index of the step: the gradient that
/// backward allocates k-th in every step. At a step boundary every
/// carried block is live, so no two share bytes: the region is their sum,
/// in order, with nothing to place. A slot is reused only once the block
/// there is freed (its successor goes upstream if not).
///
/// The layout comes from a recorded step that repeated the one before it
/// ([`carried_of`]), and serves the steps after it, recorded ones too: the
/// next recorded step carries its blocks here, and only then is the plan
/// made, so that the first planned step frees the blocks of the step
/// before here and not between the upstream's blocks, where they would
/// have kept partly used granules of a virtual pool mapped. The region is
/// taken at the first carried allocation, not at
/// [`Planned::step`](super::Planned::step): until then the blocks the step
/// before carried are still live, and both would be held at once.
#[derive(Debug, Default)]
pub(super) struct Carry {
    /// Per slot, ascending by index: the allocation index it serves, its
    /// offset in the region (the slot before's end) and its rounded size.
    pub(super) slots: Vec<(u32, u64, u64)>,
    /// Per slot: the size asked for by the block live there, 0 for none
    /// (a carried block is never of size 0).
    pub(super) live: Vec<u64>,
    /// Live slots and their rounded bytes.
    pub(super) live_count: u32,
    pub(super) live_bytes: u64,
    /// The region (`Block::EMPTY` until the first carried allocation): at
    /// least the sum of the slots while a block is live.
    pub(super) region: Block,
    /// The stream id the region was taken on.
    pub(super) region_stream: u64,
    /// Whether the upstream refused the region: not asked again until the
    /// next step.
    pub(super) refused: bool,
    /// Whether a recorded step found the layout not its own while blocks
    /// lived in it: recorded steps no longer carry blocks here, so that
    /// the layout can be made anew once those are freed.
    pub(super) stale: bool,
    /// Changed with the layout: a region taken for another layout goes
    /// back.
    pub(super) generation: u64,
}

/// The blocks of a recorded step to carry into the next ones, as
/// (allocation index, rounded size): live at the step's end, on its
/// stream, of some size, and allocated after the step freed the block of
/// the same index that the step before left live (`carried_frees`: index
/// and the op that freed it).
pub(super) fn carried_of(
    record: &[(Lifetime, Request, bool)],
    carried_frees: &[(u32, u32)],
) -> Vec<(u32, u64)> {
    let mut freed_at: Vec<Option<u32>> = (0..record.len()).map(|_| None).collect();
    for &(k, at) in carried_frees {
        if let Some(f) = freed_at.get_mut(k as usize) {
            *f = Some(at);
        }
    }
    (0..record.len())
        .filter(|&k| {
            let (life, _, on) = record[k];
            on && life.end == OPEN && life.size > 0 && freed_at[k].is_some_and(|at| at < life.start)
        })
        .map(|k| (k as u32, record[k].0.size))
        .collect()
}

impl Carry {
    /// The bytes of the layout.
    pub(super) fn size(&self) -> u64 {
        self.slots.last().map_or(0, |&(_, o, n)| o + n)
    }

    /// A new layout of `(index, rounded size)` pairs, ascending by index,
    /// with the region kept (the caller sees that it fits). Nothing may be
    /// live.
    pub(super) fn lay_out(&mut self, carried: &[(u32, u64)]) {
        let mut at = 0;
        self.slots = carried
            .iter()
            .map(|&(k, n)| {
                at += n;
                (k, at - n, n)
            })
            .collect();
        self.live = carried.iter().map(|_| 0).collect();
        self.refused = false;
        self.stale = false;
        self.generation += 1;
    }

    /// Whether the layout is `carried`.
    pub(super) fn is(&self, carried: &[(u32, u64)]) -> bool {
        self.slots.len() == carried.len()
            && self.slots.iter().zip(carried).all(|(&(k, _, n), &c)| (k, n) == c)
    }

    /// The slot of allocation `index`, if it has one for a block of
    /// `request`.
    pub(super) fn slot_for(&self, index: u32, request: Request) -> Option<u32> {
        let slot = self.slots.binary_search_by_key(&index, |&(k, _, _)| k).ok()?;
        (self.slots[slot].2 == request.rounded_size(UNIT)).then_some(slot as u32)
    }

    /// The slot a block at `addr` would occupy, if `addr` is in the region.
    pub(super) fn slot_at(&self, addr: u64) -> Option<Option<usize>> {
        let r = self.region;
        if r.is_empty() || addr < r.addr() || addr - r.addr() >= r.size() {
            return None;
        }
        Some(self.slots.binary_search_by_key(&(addr - r.addr()), |&(_, o, _)| o).ok())
    }

    /// Serves `slot` if the region is there, the slot free and its address
    /// suits `request`.
    pub(super) fn serve(&mut self, slot: u32, request: Request) -> Option<u64> {
        let (_, offset, size) = *self.slots.get(slot as usize)?;
        let addr = self.region.addr() + offset;
        if self.region.is_empty() || self.live[slot as usize] != 0 || addr % request.align() != 0 {
            return None;
        }
        self.live[slot as usize] = request.size();
        self.live_count += 1;
        self.live_bytes += size;
        Some(addr)
    }

    /// The live blocks, by ascending offset: offset and rounded size.
    pub(super) fn live_blocks(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.slots.iter().zip(&self.live).filter(|(_, &l)| l != 0).map(|(&(_, o, n), _)| (o, n))
    }
}
