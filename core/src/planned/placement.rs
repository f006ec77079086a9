//! Offline placement: where each block of a sequence goes when every
//! lifetime is known before the first allocation.
//!
//! Blocks are taken in an [`Order`], each put at the lowest offset where it
//! overlaps, in address, no block placed before it that is live at the
//! same time: the greedy heuristics of static memory planners. Not optimal
//! (placement with known lifetimes is NP-hard); `docs/measurements.md`
//! has its figures. [`Planned`](super::Planned) lays out each step this
//! way from the step before it; `memres offline` does it for a whole trace.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

/// One block of a sequence: when it is live and how large it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    /// Index of the op (allocation or free) that allocates it.
    pub start: u32,
    /// Index of the op that frees it: live over `start..end`.
    pub end: u32,
    /// Bytes it takes.
    pub size: u64,
}

impl Lifetime {
    /// Whether both are live at some op.
    fn overlaps(&self, other: &Lifetime) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// The order in which blocks are placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Largest first; of equal sizes, the longest lived first.
    Size,
    /// Largest first by whole MiB; within the same MiB, the longest lived
    /// first, so that long-lived blocks of nearly one size sit together.
    SizeThenLifetime,
    /// Largest area first: bytes times ops lived.
    Area,
}

impl Order {
    /// Every order, as [`best`] tries them.
    pub const ALL: [Order; 3] = [Order::Size, Order::SizeThenLifetime, Order::Area];

    /// The order's name.
    pub fn name(self) -> &'static str {
        match self {
            Order::Size => "size",
            Order::SizeThenLifetime => "size-then-lifetime",
            Order::Area => "area",
        }
    }

    /// Ascending keys: the first placed first.
    fn key(self, b: &Lifetime) -> (u128, u32, u32) {
        let life = b.end.saturating_sub(b.start);
        match self {
            Order::Size => (u128::MAX - b.size as u128, u32::MAX - life, b.start),
            Order::SizeThenLifetime => (u128::MAX - (b.size >> 20) as u128, u32::MAX - life, b.start),
            Order::Area => (u128::MAX - b.size as u128 * life as u128, u32::MAX - life, b.start),
        }
    }
}

/// Where each block goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// Each block's offset, indexed as the blocks were.
    pub offsets: Vec<u64>,
    /// The highest end offset: the bytes the placement needs.
    pub top: u64,
}

/// Ops per time bucket: a block is listed in every bucket it is live in,
/// so that only blocks of the same buckets are compared.
const BUCKET: u32 = 4096;

/// Places `blocks` greedily in `order`: each at the lowest offset free of
/// the blocks placed before it that are live at the same time. A block of
/// no size or no ops of life goes at 0 and takes no room.
pub fn place(blocks: &[Lifetime], order: Order) -> Placement {
    place_around(blocks, order, &[], 0)
}

/// Places `blocks` as [`place`] does, around `fixed` blocks already at
/// their offsets, and in two ranges: a block goes below `low` only where
/// it ends by `low`, else at `low` or above. `top` and `offsets` are those
/// of `blocks` only.
///
/// [`Planned`](super::Planned) lays out a step's blocks this way in the
/// free time of the carried blocks' region (`[0, low)`, the carried
/// blocks fixed in it) and above it in the step's own.
pub fn place_around(blocks: &[Lifetime], order: Order, fixed: &[(Lifetime, u64)], low: u64) -> Placement {
    let n = blocks.len();
    let all: Vec<Lifetime> = blocks.iter().copied().chain(fixed.iter().map(|&(b, _)| b)).collect();
    let mut sorted: Vec<usize> = (0..n).collect();
    sorted.sort_unstable_by_key(|&i| (order.key(&all[i]), i));
    // Past the last allocation every block still live overlaps every
    // other: ends are bucketed no later than that.
    let horizon = all.iter().map(|b| b.start).max().unwrap_or(0).saturating_add(1);
    let buckets = horizon / BUCKET + 1;
    let mut placed_in: Vec<Vec<usize>> = (0..buckets).map(|_| Vec::new()).collect();
    let mut offsets: Vec<u64> = (0..n).map(|_| 0).chain(fixed.iter().map(|&(_, o)| o)).collect();
    let span = |b: &Lifetime| b.start / BUCKET..=b.end.min(horizon).saturating_sub(1).max(b.start) / BUCKET;
    for (i, b) in all.iter().enumerate().skip(n) {
        if b.size > 0 && b.end > b.start {
            span(b).for_each(|bucket| placed_in[bucket as usize].push(i));
        }
    }
    let mut top = 0u64;
    let mut taken: Vec<(u64, u64)> = Vec::new();
    for i in sorted {
        let b = &all[i];
        if b.size == 0 || b.end <= b.start {
            // Takes no address at any op.
            continue;
        }
        taken.clear();
        for bucket in span(b) {
            for &j in &placed_in[bucket as usize] {
                if b.overlaps(&all[j]) {
                    taken.push((offsets[j], offsets[j].saturating_add(all[j].size)));
                }
            }
        }
        // A block live in several buckets is listed once per bucket; the
        // duplicates sort next to each other and do no harm.
        taken.sort_unstable();
        let lowest_from = |start: u64| {
            let mut offset = start;
            for &(from, to) in &taken {
                if from >= offset.saturating_add(b.size) {
                    break;
                }
                offset = offset.max(to);
            }
            offset
        };
        let mut offset = lowest_from(0);
        if offset < low && offset.saturating_add(b.size) > low {
            offset = lowest_from(low);
        }
        offsets[i] = offset;
        top = top.max(offset.saturating_add(b.size));
        span(b).for_each(|bucket| placed_in[bucket as usize].push(i));
    }
    offsets.truncate(n);
    Placement { offsets, top }
}

/// The placement of `blocks` with the lowest top over [`Order::ALL`], and
/// its order.
pub fn best(blocks: &[Lifetime]) -> (Order, Placement) {
    best_around(blocks, &[], 0)
}

/// [`place_around`] with the lowest top over [`Order::ALL`], and its
/// order.
pub fn best_around(blocks: &[Lifetime], fixed: &[(Lifetime, u64)], low: u64) -> (Order, Placement) {
    let mut best = (Order::Size, place_around(blocks, Order::Size, fixed, low));
    for order in &Order::ALL[1..] {
        let p = place_around(blocks, *order, fixed, low);
        if p.top < best.1.top {
            best = (*order, p);
        }
    }
    best
}

/// The first two blocks that are live at the same time and overlap in
/// address under `placement`, if any (blocks past the end of its offsets
/// are not checked).
pub fn first_conflict(blocks: &[Lifetime], placement: &Placement) -> Option<(usize, usize)> {
    // Sweep the ops: frees before allocations at the same index, since a
    // block freed at op i and one allocated at op i are never live together.
    let mut events: Vec<(u32, bool, usize)> = Vec::with_capacity(blocks.len() * 2);
    for (i, (b, _)) in blocks.iter().zip(&placement.offsets).enumerate() {
        // Zero-sized blocks take no address; blocks with no op between
        // their allocation and their free are never live.
        if b.size > 0 && b.start < b.end {
            events.push((b.start, true, i));
            events.push((b.end, false, i));
        }
    }
    events.sort_unstable();
    // Live blocks by offset.
    let mut live: BTreeMap<u64, usize> = BTreeMap::new();
    for (_, alloc, i) in events {
        let (from, size) = (placement.offsets[i], blocks[i].size);
        if !alloc {
            live.remove(&from);
            continue;
        }
        if let Some((&at, &j)) = live.range(..=from).next_back() {
            if at.saturating_add(blocks[j].size) > from {
                return Some((j, i));
            }
        }
        if let Some((&at, &j)) = live.range(from..).next() {
            if at < from.saturating_add(size) {
                return Some((j, i));
            }
        }
        live.insert(from, i);
    }
    None
}
