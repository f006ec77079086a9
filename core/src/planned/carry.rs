//! [`Carry`]: the blocks a step carries into the next one, side by side
//! in a region of their own.

use super::placement::Lifetime;
use super::{offset_in, Region, OPEN, UNIT};
use crate::Request;
use alloc::collections::BTreeMap;
use alloc::vec::Vec;

/// Where the blocks a step carries into the next one go.
///
/// ```text
/// step k:    ... a (index 12) ... b (index 40) ...                 | step()
/// step k+1:  ... a of step k freed ... s (a step block) ... s freed
///            ... a (slot 0) ... b of step k freed ... b (slot 1)
/// region:    [ slot 0: index 12 | slot 1: index 40 | ... ]
///            s placed over slot 0 and 1 while both are free
/// ```
///
/// A slot belongs to one allocation index of the step: the gradient that
/// backward allocates k-th in every step. At a step boundary every
/// carried block is live, so no two share bytes: the layout is their sum,
/// in order, with nothing to place (as far as one request holds them).
/// Between the free of a slot's block and its successor's allocation, the
/// plan places blocks of the step there ([`Plan::of`](super::Plan)). Every block is handed out here only
/// where no live one lies (else it goes upstream): the region's live
/// blocks are kept by offset.
///
/// The layout comes from the recorded step a plan is made from
/// ([`carried_of`]). Its region is taken with the first block it serves,
/// not at [`Planned::step`](super::Planned::step): in the first planned
/// step that comes after the blocks the recorded step carried (from
/// upstream) are freed, so that both are never held at once.
#[derive(Debug, Default)]
pub(super) struct Carry {
    /// Per slot, ascending by index: the allocation index it serves, its
    /// offset in the region (the slot before's end) and its rounded size;
    /// at most [`Request::MAX_SIZE`] bytes in all ([`carried_of`]).
    pub(super) slots: Vec<(u32, u64, u64)>,
    /// The live blocks by offset: their rounded size, the size asked for
    /// and their tag. None overlaps another or leaves the region.
    pub(super) live: BTreeMap<u64, (u64, u64, u64)>,
    /// Blocks served so far: the next one's tag, so that a stale block
    /// (freed, its bytes served again) is told from the live one. It stops
    /// one short of [`Block::NO_TAG`](crate::Block::NO_TAG), where the
    /// blocks are told apart by address only.
    pub(super) served: u64,
    /// The region (`Region::EMPTY` until the first block it serves): at
    /// least the sum of the slots while a block is live.
    pub(super) region: Region,
    /// The stream id the region was taken on.
    pub(super) region_stream: u64,
    /// Whether the upstream refused the region: not asked again until the
    /// next step.
    pub(super) refused: bool,
    /// Changed with the layout: a region taken for another layout goes
    /// back.
    pub(super) generation: u64,
}

/// The blocks of a recorded step to carry into the next ones, as
/// (allocation index, rounded size): live at the step's end, on its
/// stream, of some size, aligned to at most `UNIT` (the slots' offsets are
/// its multiples), and allocated after the step freed the block of
/// the same index that the step before left live (`carried_frees`: index
/// and the op that freed it). Their region is one request: the blocks past
/// [`Request::MAX_SIZE`] bytes in all are left out, and go upstream.
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
    let mut total: u64 = 0;
    (0..record.len())
        .filter(|&k| {
            let (life, request, on) = record[k];
            on && life.end == OPEN
                && life.size > 0
                && request.align() <= UNIT
                && freed_at[k].is_some_and(|at| at < life.start)
        })
        .map(|k| (k as u32, record[k].0.size))
        .take_while(|&(_, n)| {
            total = total.saturating_add(n);
            total <= Request::MAX_SIZE
        })
        .collect()
}

/// The slots of a layout of `(index, rounded size)` pairs: each with its
/// offset, the slot before's end.
pub(super) fn slots_of(carried: &[(u32, u64)]) -> Vec<(u32, u64, u64)> {
    let mut at = 0;
    carried
        .iter()
        .map(|&(k, n)| {
            at += n;
            (k, at - n, n)
        })
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
        self.slots = slots_of(carried);
        self.refused = false;
        self.generation += 1;
    }

    /// Whether the layout is `carried`.
    pub(super) fn is(&self, carried: &[(u32, u64)]) -> bool {
        self.slots.len() == carried.len()
            && self.slots.iter().zip(carried).all(|(&(k, _, n), &c)| (k, n) == c)
    }

    /// If `addr` is in the region: the live block starting there (its
    /// offset, rounded size, size asked for and tag), if any.
    pub(super) fn block_at(&self, addr: u64) -> Option<Option<(u64, u64, u64, u64)>> {
        let offset = offset_in(self.region, addr)?;
        Some(self.live.get(&offset).map(|&(n, asked, tag)| (offset, n, asked, tag)))
    }

    /// Serves `request` at `offset` if the region is there, the block's
    /// bytes lie in it and no live block covers them, and its address
    /// suits `request`: its address and tag.
    pub(super) fn serve_at(&mut self, offset: u64, request: Request) -> Option<(u64, u64)> {
        let size = request.rounded_size(UNIT);
        let (r, end) = (self.region, offset.checked_add(size)?);
        let below = self.live.range(..end).next_back();
        let clear = below.is_none_or(|(&o, &(n, ..))| o + n <= offset);
        if r.is_empty() || end > r.size() || !clear || (r.addr() + offset) % request.align() != 0 || size == 0
        {
            return None;
        }
        let tag = self.served;
        self.served = tag.saturating_add(1);
        self.live.insert(offset, (size, request.size(), tag));
        Some((r.addr() + offset, tag))
    }

    /// Frees the live block at `offset` if its tag is `tag`; `false` if
    /// there is none, or another (served there once it was freed).
    pub(super) fn free(&mut self, offset: u64, tag: u64) -> bool {
        if self.live.get(&offset).is_none_or(|&(.., t)| t != tag) {
            return false;
        }
        self.live.remove(&offset);
        true
    }

    /// The rounded bytes of the live blocks.
    pub(super) fn live_bytes(&self) -> u64 {
        self.live.values().map(|&(n, ..)| n).sum()
    }

    /// The live blocks, by ascending offset: offset and rounded size.
    pub(super) fn live_blocks(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.live.iter().map(|(&o, &(n, ..))| (o, n))
    }
}
