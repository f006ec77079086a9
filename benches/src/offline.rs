//! Offline placement: where each block of a workload goes when every
//! lifetime is known before the first allocation.
//!
//! No allocator knows the future, so this is not a resource but a
//! reference: what a placement that never moves a block can reach once it
//! has seen the whole sequence. A training step that repeats exactly shows
//! its sequence after one step, so this is also what a pool that records a
//! step and lays the next ones out from it could hold. The online peers
//! (`offset-allocator`, `range-alloc`) and the pools place each block
//! knowing only the past.
//!
//! The placement is greedy: blocks taken in an [`Order`], each at the
//! lowest offset where it overlaps, in address, no block already placed
//! that is live at the same time. Sizes are rounded up to 256 bytes, as
//! the peers' are.

use crate::replay::GRANULE;
use crate::workload::Workload;

#[cfg(test)]
mod tests;

/// One block of a workload: when it is live and how large it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    /// Index of the op that allocates it.
    pub start: u32,
    /// Index of the op that frees it, or the number of ops if none does.
    pub end: u32,
    /// Bytes, rounded up to 256.
    pub size: u64,
}

impl Lifetime {
    /// Whether both are live at some op.
    fn overlaps(&self, other: &Lifetime) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// The blocks of `workload`, indexed by allocation id.
pub fn lifetimes(workload: &Workload) -> Vec<Lifetime> {
    let end = workload.ops.len() as u32;
    let mut blocks = Vec::with_capacity(workload.ids as usize);
    for (i, op) in workload.ops.iter().enumerate() {
        if op.alloc {
            // Ids are allocated in order (`Workload::from_ops` checks it).
            blocks.push(Lifetime { start: i as u32, end, size: op.size.div_ceil(GRANULE) * GRANULE });
        } else {
            blocks[op.id as usize].end = i as u32;
        }
    }
    blocks
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
    /// Every order, as `memres offline` tries them.
    pub const ALL: [Order; 3] = [Order::Size, Order::SizeThenLifetime, Order::Area];

    /// The name `memres offline` prints.
    pub fn name(self) -> &'static str {
        match self {
            Order::Size => "size",
            Order::SizeThenLifetime => "size-then-lifetime",
            Order::Area => "area",
        }
    }

    /// Ascending keys: the first placed first.
    fn key(self, b: &Lifetime) -> (u128, u32, u32) {
        let life = b.end - b.start;
        match self {
            Order::Size => (u128::MAX - b.size as u128, u32::MAX - life, b.start),
            Order::SizeThenLifetime => (u128::MAX - (b.size >> 20) as u128, u32::MAX - life, b.start),
            Order::Area => (u128::MAX - b.size as u128 * life as u128, u32::MAX - life, b.start),
        }
    }
}

/// Where each block goes.
#[derive(Clone, Debug, PartialEq, Eq)]
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
/// the blocks placed before it that are live at the same time.
pub fn place(blocks: &[Lifetime], order: Order) -> Placement {
    let mut sorted: Vec<usize> = (0..blocks.len()).collect();
    sorted.sort_by_key(|&i| order.key(&blocks[i]));
    let buckets = blocks.iter().map(|b| b.end).max().unwrap_or(0) / BUCKET + 1;
    let mut placed_in: Vec<Vec<usize>> = vec![Vec::new(); buckets as usize];
    let mut offsets = vec![0u64; blocks.len()];
    let mut top = 0u64;
    let mut taken: Vec<(u64, u64)> = Vec::new();
    for i in sorted {
        let b = &blocks[i];
        let span = b.start / BUCKET..=b.end.saturating_sub(1).max(b.start) / BUCKET;
        taken.clear();
        for bucket in span.clone() {
            for &j in &placed_in[bucket as usize] {
                if b.overlaps(&blocks[j]) {
                    taken.push((offsets[j], offsets[j] + blocks[j].size));
                }
            }
        }
        // A block live in several buckets is listed once per bucket; the
        // duplicates sort next to each other and do no harm.
        taken.sort_unstable();
        let mut offset = 0;
        for &(from, to) in &taken {
            if from >= offset + b.size {
                break;
            }
            offset = offset.max(to);
        }
        offsets[i] = offset;
        top = top.max(offset + b.size);
        for bucket in span {
            placed_in[bucket as usize].push(i);
        }
    }
    Placement { offsets, top }
}

/// The placement of `workload` with the lowest top over [`Order::ALL`],
/// and its order.
pub fn best(workload: &Workload) -> (Order, Placement) {
    let blocks = lifetimes(workload);
    Order::ALL
        .into_iter()
        .map(|order| (order, place(&blocks, order)))
        .min_by_key(|(_, p)| p.top)
        .expect("Order::ALL is not empty")
}

/// The first two blocks that are live at the same time and overlap in
/// address under `placement`, if any.
pub fn first_conflict(blocks: &[Lifetime], placement: &Placement) -> Option<(usize, usize)> {
    use std::collections::BTreeMap;
    // Sweep the ops: frees before allocations at the same index, since a
    // block freed at op i and one allocated at op i are never live together.
    let mut events: Vec<(u32, bool, usize)> = Vec::with_capacity(blocks.len() * 2);
    for (i, b) in blocks.iter().enumerate() {
        events.push((b.start, true, i));
        events.push((b.end, false, i));
    }
    events.sort_unstable();
    // Live blocks by offset (zero-sized ones take no address).
    let mut live: BTreeMap<u64, usize> = BTreeMap::new();
    for (_, alloc, i) in events {
        let (from, size) = (placement.offsets[i], blocks[i].size);
        if size == 0 {
            continue;
        }
        if !alloc {
            live.remove(&from);
            continue;
        }
        if let Some((&at, &j)) = live.range(..=from).next_back() {
            if at + blocks[j].size > from {
                return Some((j, i));
            }
        }
        if let Some((&at, &j)) = live.range(from..).next() {
            if at < from + size {
                return Some((j, i));
            }
        }
        live.insert(from, i);
    }
    None
}
