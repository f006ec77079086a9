//! Offline placement: where each block of a sequence goes when every
//! lifetime is known before the first allocation.
//!
//! Two greedy heuristics of static memory planners, each in an [`Order`]
//! ([`Method`]): each block at the lowest offset where it overlaps, in
//! address, no block placed before it that is live at the same time; or
//! the skyline, which fills the lowest stretch of the offsets reached so
//! far over time first. A third places the blocks as they come, each in
//! the smallest free stretch (an online best fit): it ignores lifetimes,
//! and on some sequences that leaves fewer holes. [`best`] keeps the
//! lowest of them. Not optimal
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
    /// Every order.
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

/// How blocks are placed: two heuristics, each with an [`Order`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Each block in the order at the lowest offset where it overlaps no
    /// block placed before it that is live at the same time.
    Lowest(Order),
    /// The skyline: the lowest stretch of the highest offsets reached
    /// over time is filled first, with the first block in the order whose
    /// whole life lies within that stretch; where none does, the stretch
    /// is raised to its lower neighbour. It leaves no hole under a block
    /// that a later one could have used, where [`Method::Lowest`] leaves
    /// holes that small blocks of odd lifetimes fill.
    Skyline(Order),
    /// Best fit in time order, as an online allocator would place them:
    /// each block, when it is allocated, in the smallest free stretch
    /// that holds it (the lowest of equal ones), else on top.
    BestFit,
}

impl Method {
    /// Every method, as [`best`] tries them.
    pub const ALL: [Method; 7] = [
        Method::Lowest(Order::Size),
        Method::Lowest(Order::SizeThenLifetime),
        Method::Lowest(Order::Area),
        Method::Skyline(Order::Size),
        Method::Skyline(Order::SizeThenLifetime),
        Method::Skyline(Order::Area),
        Method::BestFit,
    ];

    /// The method's name.
    pub fn name(self) -> &'static str {
        match self {
            Method::Lowest(Order::Size) => "size",
            Method::Lowest(Order::SizeThenLifetime) => "size-then-lifetime",
            Method::Lowest(Order::Area) => "area",
            Method::Skyline(Order::Size) => "skyline-size",
            Method::Skyline(Order::SizeThenLifetime) => "skyline-size-then-lifetime",
            Method::Skyline(Order::Area) => "skyline-area",
            Method::BestFit => "best-fit",
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

/// `low`, or the end of the highest fixed block that takes room, if that
/// is higher.
fn above_fixed(fixed: &[(Lifetime, u64)], low: u64) -> u64 {
    fixed.iter().filter(|(b, _)| takes_room(b)).map(|&(b, at)| at.saturating_add(b.size)).fold(low, u64::max)
}

/// Whether a block takes an address at some op.
fn takes_room(b: &Lifetime) -> bool {
    b.size > 0 && b.end > b.start
}

/// Places `blocks` by `method`. A block of no size or no ops of life goes
/// at 0 and takes no room.
pub fn place(blocks: &[Lifetime], method: Method) -> Placement {
    place_around(blocks, method, &[], 0)
}

/// Places `blocks` as [`place`] does, around `fixed` blocks already at
/// their offsets, and in two ranges: a block goes below `low` only where
/// it ends by `low`, else at `low` or above. `top` and `offsets` are those
/// of `blocks` only. Below `low` blocks are placed by [`Method::Lowest`]
/// in the method's order (largest first for [`Method::BestFit`]); a
/// skyline or the best fit places the rest above it, and so above every
/// fixed block: for those two, a fixed block that reaches past `low`
/// raises it to its end (they see no fixed block above it).
///
/// [`Planned`](super::Planned) lays out a step's blocks this way in the
/// free time of the carried blocks' region (`[0, low)`, the carried
/// blocks fixed in it) and above it in the step's own.
pub fn place_around(blocks: &[Lifetime], method: Method, fixed: &[(Lifetime, u64)], low: u64) -> Placement {
    let offsets: Vec<u64> = match method {
        Method::Lowest(order) => {
            lowest(blocks, order, fixed, low, true).into_iter().map(|o| o.unwrap_or(0)).collect()
        }
        Method::Skyline(order) => {
            let low = above_fixed(fixed, low);
            let mut offsets = lowest(blocks, order, fixed, low, false);
            skyline(blocks, order, low, &mut offsets);
            offsets.into_iter().map(|o| o.unwrap_or(0)).collect()
        }
        Method::BestFit => {
            let low = above_fixed(fixed, low);
            let mut offsets = lowest(blocks, Order::Size, fixed, low, false);
            best_fit(blocks, low, &mut offsets);
            offsets.into_iter().map(|o| o.unwrap_or(0)).collect()
        }
    };
    let top = blocks
        .iter()
        .zip(&offsets)
        .filter(|(b, _)| takes_room(b))
        .map(|(b, o)| o.saturating_add(b.size))
        .max();
    Placement { offsets, top: top.unwrap_or(0) }
}

/// [`Method::Lowest`]: each block in `order` at the lowest offset free of
/// the blocks placed before it (and of `fixed`) while it is live, below
/// `low` only where it ends by `low`. With `above` false, a block that
/// does not fit below `low` is left unplaced (`None`).
fn lowest(
    blocks: &[Lifetime],
    order: Order,
    fixed: &[(Lifetime, u64)],
    low: u64,
    above: bool,
) -> Vec<Option<u64>> {
    let n = blocks.len();
    let all: Vec<Lifetime> = blocks.iter().copied().chain(fixed.iter().map(|&(b, _)| b)).collect();
    let mut sorted: Vec<usize> = (0..n).collect();
    sorted.sort_unstable_by_key(|&i| (order.key(&all[i]), i));
    // Past the last allocation every block still live overlaps every
    // other: ends are bucketed no later than that.
    let horizon = all.iter().map(|b| b.start).max().unwrap_or(0).saturating_add(1);
    let buckets = horizon / BUCKET + 1;
    let mut placed_in: Vec<Vec<usize>> = (0..buckets).map(|_| Vec::new()).collect();
    let mut offsets: Vec<Option<u64>> =
        (0..n).map(|_| None).chain(fixed.iter().map(|&(_, o)| Some(o))).collect();
    let span = |b: &Lifetime| b.start / BUCKET..=b.end.min(horizon).saturating_sub(1).max(b.start) / BUCKET;
    for (i, b) in all.iter().enumerate().skip(n) {
        if takes_room(b) {
            span(b).for_each(|bucket| placed_in[bucket as usize].push(i));
        }
    }
    let mut taken: Vec<(u64, u64)> = Vec::new();
    for i in sorted {
        let b = &all[i];
        if !takes_room(b) {
            offsets[i] = Some(0);
            continue;
        }
        taken.clear();
        for bucket in span(b) {
            for &j in &placed_in[bucket as usize] {
                if let (true, Some(at)) = (b.overlaps(&all[j]), offsets[j]) {
                    taken.push((at, at.saturating_add(all[j].size)));
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
            if !above {
                continue;
            }
            offset = lowest_from(low);
        } else if offset >= low && !above {
            continue;
        }
        offsets[i] = Some(offset);
        span(b).for_each(|bucket| placed_in[bucket as usize].push(i));
    }
    offsets.truncate(n);
    offsets
}

/// [`Method::Skyline`]: places the blocks `offsets` leaves unplaced, at
/// `low` or above.
///
/// The skyline is the highest offset placed so far at each op, in
/// stretches of equal height. The lowest stretch (the earliest of equal
/// ones) takes the first block in `order` whose whole life lies within
/// it, at its height; where no block fits, the stretch rises to its lower
/// neighbour and joins it. Each step places a block or removes a stretch.
fn skyline(blocks: &[Lifetime], order: Order, low: u64, offsets: &mut [Option<u64>]) {
    use alloc::collections::BTreeSet;
    let mut unplaced: Vec<usize> = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        match offsets[i] {
            None if takes_room(b) => unplaced.push(i),
            None => offsets[i] = Some(0),
            Some(_) => {}
        }
    }
    let Some(horizon) = unplaced.iter().map(|&i| blocks[i].end).max() else { return };
    let mut unplaced = Candidates::new(blocks, order, unplaced);
    // Stretches by start: (end, height), covering `0..horizon`; and the
    // same by (height, start), to find the lowest.
    let mut stretches: BTreeMap<u32, (u32, u64)> = BTreeMap::new();
    let mut by_height: BTreeSet<(u64, u32)> = BTreeSet::new();
    stretches.insert(0, (horizon, low));
    by_height.insert((low, 0));
    while !unplaced.is_empty() {
        let Some(&(height, from)) = by_height.first() else { break };
        let to = stretches[&from].0;
        let Some(i) = unplaced.first_within(from, to) else {
            // Nothing fits: rise to the lower neighbour and join it. The
            // whole `0..horizon` holds every block, so a stretch with no
            // neighbour always has a block to take.
            let before = stretches.range(..from).next_back().map(|(&s, &(_, h))| (s, h));
            let after = stretches.get(&to).map(|&(_, h)| (to, h));
            let rise = match (before, after) {
                (Some(b), Some(a)) => a.1.min(b.1),
                (Some((_, h)), None) | (None, Some((_, h))) => h,
                (None, None) => unreachable!("the whole horizon holds every unplaced block"),
            };
            by_height.remove(&(height, from));
            stretches.insert(from, (to, rise));
            by_height.insert((rise, from));
            join_equal(&mut stretches, &mut by_height, from);
            continue;
        };
        let b = blocks[i];
        unplaced.remove(i);
        offsets[i] = Some(height);
        let raised = height.saturating_add(b.size);
        by_height.remove(&(height, from));
        stretches.remove(&from);
        for (s, e, h) in [(from, b.start, height), (b.start, b.end, raised), (b.end, to, height)] {
            if s < e {
                stretches.insert(s, (e, h));
                by_height.insert((h, s));
            }
        }
        join_equal(&mut stretches, &mut by_height, b.start);
    }
}

/// [`Method::BestFit`]: places the blocks `offsets` leaves unplaced, at
/// `low` or above, in the order they are allocated, as an online
/// allocator that knows no lifetime would.
fn best_fit(blocks: &[Lifetime], low: u64, offsets: &mut [Option<u64>]) {
    use alloc::collections::BTreeSet;
    let mut events: Vec<(u32, bool, usize)> = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        match offsets[i] {
            None if takes_room(b) => {
                events.push((b.start, true, i));
                events.push((b.end, false, i));
            }
            None => offsets[i] = Some(0),
            Some(_) => {}
        }
    }
    // Frees before allocations at the same op.
    events.sort_unstable();
    // The free stretches below `top`, by offset and by (length, offset).
    let mut by_offset: BTreeMap<u64, u64> = BTreeMap::new();
    let mut by_len: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut top = low;
    for (_, alloc, i) in events {
        let size = blocks[i].size;
        if !alloc {
            let (mut at, mut len) = (offsets[i].unwrap_or(low), size);
            if let Some((&s, &l)) = by_offset.range(..at).next_back() {
                if s.saturating_add(l) == at {
                    by_offset.remove(&s);
                    by_len.remove(&(l, s));
                    (at, len) = (s, len.saturating_add(l));
                }
            }
            let after = at.saturating_add(len);
            if let Some(l) = by_offset.remove(&after) {
                by_len.remove(&(l, after));
                len = len.saturating_add(l);
            }
            if at.saturating_add(len) >= top {
                top = at;
            } else {
                by_offset.insert(at, len);
                by_len.insert((len, at));
            }
            continue;
        }
        let at = match by_len.range((size, 0)..).next().copied() {
            // The smallest stretch that holds it, the lowest of equal ones.
            Some((len, at)) => {
                by_len.remove(&(len, at));
                by_offset.remove(&at);
                if len > size {
                    let rest = at.saturating_add(size);
                    by_offset.insert(rest, len - size);
                    by_len.insert((len - size, rest));
                }
                at
            }
            // On top, from the free stretch that ends there if one does.
            None => {
                let at = match by_offset.range(..top).next_back() {
                    Some((&s, &l)) if s.saturating_add(l) == top => {
                        by_offset.remove(&s);
                        by_len.remove(&(l, s));
                        s
                    }
                    _ => top,
                };
                top = at.saturating_add(size);
                at
            }
        };
        offsets[i] = Some(at);
    }
}

/// The blocks [`skyline`] has still to place, for its one question: the
/// first in order (of equal keys, the lowest index) whose whole life lies
/// within a stretch `from..to`.
///
/// ```text
///   by_start   the blocks by (start, index): leaf p of the tree is the p-th
///   tree[1]    root: the least rank and the least end of all unplaced
///   tree[n]    node n covers the leaves its children 2n and 2n+1 cover
/// ```
///
/// A block's rank is its place in order. A search of the leaves that start
/// in `from..to` skips a node whose least end is past `to` (nothing in it
/// fits) or whose least rank is no better than a fit found already, and
/// takes a node's least rank whole where that block fits: the first fit,
/// in about O(log n) where a scan of every block that starts in the
/// stretch took O(n), which made the skyline quadratic on many
/// short-lived blocks in sequence (`docs/measurements.md` has figures).
struct Candidates<'a> {
    blocks: &'a [Lifetime],
    /// The unplaced blocks' (start, index), ascending: the leaves in order.
    by_start: Vec<(u32, usize)>,
    /// Block index to its leaf (`u32::MAX`: not a candidate).
    leaf_of: Vec<u32>,
    /// Rank to block index.
    by_rank: Vec<u32>,
    /// The leaves' count, a power of two; leaf `p` is node `leaves + p`.
    leaves: usize,
    /// Per node (1-based; 0 unused): the least rank of its unplaced
    /// blocks and their least end; `(u32::MAX, u32::MAX)` where none is.
    tree: Vec<(u32, u32)>,
}

impl<'a> Candidates<'a> {
    const NONE: (u32, u32) = (u32::MAX, u32::MAX);

    fn new(blocks: &'a [Lifetime], order: Order, unplaced: Vec<usize>) -> Self {
        let mut by_start: Vec<(u32, usize)> = unplaced.iter().map(|&i| (blocks[i].start, i)).collect();
        by_start.sort_unstable();
        let mut by_rank: Vec<u32> = unplaced.iter().map(|&i| i as u32).collect();
        by_rank.sort_unstable_by_key(|&i| (order.key(&blocks[i as usize]), i));
        let leaves = by_start.len().next_power_of_two();
        let mut tree = alloc::vec![Self::NONE; 2 * leaves];
        let mut leaf_of = alloc::vec![u32::MAX; blocks.len()];
        for (p, &(_, i)) in by_start.iter().enumerate() {
            leaf_of[i] = p as u32;
        }
        for (rank, &i) in by_rank.iter().enumerate() {
            let i = i as usize;
            tree[leaves + leaf_of[i] as usize] = (rank as u32, blocks[i].end);
        }
        for n in (1..leaves).rev() {
            tree[n] = Self::join(tree[2 * n], tree[2 * n + 1]);
        }
        Candidates { blocks, by_start, leaf_of, by_rank, leaves, tree }
    }

    fn join(a: (u32, u32), b: (u32, u32)) -> (u32, u32) {
        (a.0.min(b.0), a.1.min(b.1))
    }

    /// Whether every block is placed: the root holds none.
    fn is_empty(&self) -> bool {
        self.tree[1] == Self::NONE
    }

    /// Block `i` placed: no longer a candidate.
    fn remove(&mut self, i: usize) {
        let mut n = self.leaves + self.leaf_of[i] as usize;
        self.tree[n] = Self::NONE;
        while n > 1 {
            n /= 2;
            self.tree[n] = Self::join(self.tree[2 * n], self.tree[2 * n + 1]);
        }
    }

    /// The first block in order that starts in `from..to` and ends by `to`.
    fn first_within(&self, from: u32, to: u32) -> Option<usize> {
        let lo = self.by_start.partition_point(|&(s, _)| s < from);
        let hi = self.by_start.partition_point(|&(s, _)| s < to);
        let mut best = u32::MAX;
        self.search(1, 0, self.leaves, lo, hi, to, &mut best);
        (best != u32::MAX).then(|| self.by_rank[best as usize] as usize)
    }

    /// [`first_within`](Self::first_within) in node `n`, which covers
    /// the leaves `n_lo..n_hi`: lowers `best` to the least rank that fits.
    #[allow(clippy::too_many_arguments)]
    fn search(&self, n: usize, n_lo: usize, n_hi: usize, lo: usize, hi: usize, to: u32, best: &mut u32) {
        let (rank, end) = self.tree[n];
        if n_hi <= lo || hi <= n_lo || end > to || rank >= *best {
            return;
        }
        let whole = lo <= n_lo && n_hi <= hi;
        if whole && self.blocks[self.by_rank[rank as usize] as usize].end <= to {
            *best = rank;
            return;
        }
        if n_hi - n_lo == 1 {
            return;
        }
        let mid = (n_lo + n_hi) / 2;
        self.search(2 * n, n_lo, mid, lo, hi, to, best);
        self.search(2 * n + 1, mid, n_hi, lo, hi, to, best);
    }
}

/// Joins the stretch that starts at `at` with its neighbours of equal
/// height.
fn join_equal(
    stretches: &mut BTreeMap<u32, (u32, u64)>,
    by_height: &mut alloc::collections::BTreeSet<(u64, u32)>,
    at: u32,
) {
    let mut at = at;
    // With the one before.
    if let Some((&s, &(_, h))) = stretches.range(..at).next_back() {
        if h == stretches[&at].1 {
            let (e, _) = stretches.remove(&at).unwrap_or_default();
            by_height.remove(&(h, at));
            stretches.insert(s, (e, h));
            at = s;
        }
    }
    // With the one after.
    let (e, h) = stretches[&at];
    if let Some(&(e2, h2)) = stretches.get(&e) {
        if h2 == h {
            stretches.remove(&e);
            by_height.remove(&(h2, e));
            stretches.insert(at, (e2, h));
        }
    }
}

/// The placement of `blocks` with the lowest top over [`Method::ALL`],
/// and its method.
pub fn best(blocks: &[Lifetime]) -> (Method, Placement) {
    best_around(blocks, &[], 0)
}

/// [`place_around`] with the lowest top over [`Method::ALL`], and its
/// method.
pub fn best_around(blocks: &[Lifetime], fixed: &[(Lifetime, u64)], low: u64) -> (Method, Placement) {
    let mut best = (Method::ALL[0], place_around(blocks, Method::ALL[0], fixed, low));
    for method in &Method::ALL[1..] {
        let p = place_around(blocks, *method, fixed, low);
        if p.top < best.1.top {
            best = (*method, p);
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

#[cfg(test)]
mod tests {
    use super::{Candidates, Lifetime, Order};
    use crate::testing::{steps, SplitMix64};
    use alloc::vec::Vec;

    /// The tree's first fit is the scan's, the first in order of the blocks
    /// that start in the stretch and end by its end, as blocks go.
    #[test]
    fn the_first_block_within_a_stretch_is_the_one_a_scan_finds() {
        let mut rng = SplitMix64::new(7);
        for round in 0..steps(200) as u64 {
            let n = 1 + rng.below(60) as usize;
            let blocks: Vec<Lifetime> = (0..n)
                .map(|_| {
                    let start = rng.below(40) as u32;
                    let end = start + 1 + rng.below(12) as u32;
                    // Few sizes, so that keys tie and the index decides.
                    Lifetime { start, end, size: 256 << rng.below(3) }
                })
                .collect();
            let order = Order::ALL[round as usize % 3];
            // Some blocks are no candidates (placed below `low`).
            let mut unplaced: Vec<usize> = (0..n).filter(|_| rng.below(5) != 0).collect();
            let mut tree = Candidates::new(&blocks, order, unplaced.clone());
            while !unplaced.is_empty() {
                let from = rng.below(45) as u32;
                let to = from + 1 + rng.below(30) as u32;
                let scan = unplaced
                    .iter()
                    .copied()
                    .filter(|&i| (from..to).contains(&blocks[i].start) && blocks[i].end <= to)
                    .min_by_key(|&i| (order.key(&blocks[i]), i));
                assert_eq!(tree.first_within(from, to), scan, "round {round}: {from}..{to}");
                let gone = unplaced.swap_remove(rng.below(unplaced.len() as u64) as usize);
                tree.remove(gone);
                assert_eq!(tree.is_empty(), unplaced.is_empty());
            }
        }
    }
}
