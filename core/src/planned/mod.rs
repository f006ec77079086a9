//! [`Planned`]: lays out each step of a repeating workload from the step
//! before it (feature `alloc`).
//!
//! A training loop asks for the same sizes in the same order every step.
//! An online allocator places each block knowing only the past, and the
//! holes it leaves cost memory; knowing when each block of the last step
//! was freed, the next step's blocks can be placed as a static memory
//! planner places them ([`placement`]). `Planned` records the allocations
//! and frees between two calls of [`step`](Planned::step); at the next
//! call it places the blocks that were allocated and freed inside that
//! step, takes one region of the placement's size from its upstream, and
//! serves the following steps from the region for as long as they repeat
//! the recorded one:
//!
//! ```text
//! step()  step 1: every block from upstream, recorded
//! step()  step 2: the same, recorded
//! step()  step 2 repeated step 1: plan from it (placement::best);
//!         region [0, top) from upstream
//!         the k-th allocation of a step, as recorded (size, alignment,
//!           the step's stream), placed in step 1  -> region + offset[k]
//!         ... outlived step 1, or on another stream -> upstream
//!         anything else (another size, an extra allocation)
//!                               -> upstream, and so is the rest of the step
//! step()  the step followed the plan to its end: keep the plan;
//!         else give the region back, record the next steps and plan
//!         again once one repeats the one before it
//! ```
//!
//! A steady step asks the upstream for nothing: no chunk to grow, no
//! mapping to make. What the steps lay out is bounded by the region; the
//! upstream holds the rest (blocks that live across steps). Before the
//! first [`step`](Planned::step), and in a step that departs from its
//! plan, `Planned` is its upstream with a record kept beside it.
//!
//! Streams: a step's plan serves one stream, the one [`step`] is called
//! with. A region block freed on another stream waits for that stream
//! ([`Stream::synchronize`]) before its bytes are planned again, and a
//! region is given back on another stream than its own only after the
//! device is idle ([`Stream::synchronize_device`]).
//!
//! [`step`]: Planned::step
//!
//! # Examples
//!
//! ```
//! use memres_core::planned::Planned;
//! use memres_core::{MemoryResource, Request};
//! # use memres_core::testing::BumpUpstream;
//! let planned = Planned::new(BumpUpstream::new(1 << 30));
//! for _ in 0..4 {
//!     planned.step(&())?;
//!     let a = planned.allocate(Request::new(1000)?, &())?;
//!     let b = planned.allocate(Request::new(3000)?, &())?;
//!     planned.deallocate(a, &())?;
//!     let c = planned.allocate(Request::new(500)?, &())?;
//!     planned.deallocate(b, &())?;
//!     planned.deallocate(c, &())?;
//! }
//! let steps = planned.steps();
//! assert_eq!((steps.plans, steps.followed), (1, 1));
//! assert_eq!(steps.planned_allocations, 6); // steps 3 and 4 came from the region
//! assert_eq!(steps.region, 3072 + 1024); // c takes a's place
//! # Ok::<(), memres_core::Error>(())
//! ```

pub mod placement;
#[cfg(test)]
mod tests;

use crate::check::Violation;
use crate::lock::Shared;
use crate::{Block, Error, Inspect, MemoryResource, Request, Result, Stream, Usage};
use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::fmt;
use placement::Lifetime;

/// The unit of the placement: sizes are rounded up to it, and every
/// offset in the region is a multiple of it.
const UNIT: u64 = 256;

/// The most ops (allocations and frees) of one step that are recorded; a
/// longer step is not planned.
pub const MAX_STEP_OPS: u32 = 1 << 22;

/// A block still live when its step ended.
const OPEN: u32 = u32::MAX;

/// What [`Planned`] has done, for tests and reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Steps {
    /// Calls of [`Planned::step`].
    pub steps: u64,
    /// Steps that were served from a plan from their first allocation to
    /// their end.
    pub followed: u64,
    /// Plans made (each from the step before it).
    pub plans: u64,
    /// Allocations served from the region.
    pub planned_allocations: u64,
    /// Bytes of the region held from upstream now.
    pub region: u64,
}

/// One allocation of a plan: as it must arrive, and where it goes.
#[derive(Clone, Copy, Debug)]
struct Entry {
    request: Request,
    /// Offset in the region; `None`: from upstream.
    offset: Option<u64>,
    /// Index of `offset` in [`Plan::slots`].
    slot: u32,
    /// The allocations of the step made before this block was freed in
    /// the recorded step: by the allocation of that index it must be free,
    /// or a later block may be placed over it.
    due: u32,
}

/// A step laid out.
#[derive(Debug, Default)]
struct Plan {
    /// One per allocation of the recorded step, in order.
    entries: Vec<Entry>,
    /// The distinct planned offsets, ascending: a region block is found by
    /// its offset here.
    slots: Vec<u64>,
    /// The planned entries by `due`, ascending.
    by_due: Vec<u32>,
}

impl Plan {
    /// The plan for the next steps from the record of the last one, and
    /// the bytes it needs: the blocks allocated and freed inside the step
    /// on its stream are placed, every other allocation goes upstream.
    /// `None` when nothing is to be placed.
    fn of(record: &[(Lifetime, Request, bool)]) -> Option<(Plan, u64)> {
        // On the step's stream, freed in the step, live for an op at least
        // (a failed allocation is not) and of some size.
        let placed: Vec<usize> = (0..record.len())
            .filter(|&k| {
                let (life, _, on) = record[k];
                on && life.end != OPEN && life.end > life.start && life.size > 0
            })
            .collect();
        if placed.is_empty() {
            return None;
        }
        let blocks: Vec<Lifetime> = placed.iter().map(|&k| record[k].0).collect();
        let (_, placement) = placement::best(&blocks);
        let mut entries: Vec<Entry> =
            record.iter().map(|&(_, request, _)| Entry { request, offset: None, slot: 0, due: 0 }).collect();
        let mut slots: Vec<u64> = placement.offsets.clone();
        slots.sort_unstable();
        slots.dedup();
        for (i, &k) in placed.iter().enumerate() {
            let offset = placement.offsets[i];
            // Allocations recorded before this block's free: record is in
            // allocation order, so the starts ascend.
            let due = record.partition_point(|r| r.0.start < record[k].0.end) as u32;
            let slot = slots.binary_search(&offset).unwrap_or(0) as u32;
            entries[k] = Entry { offset: Some(offset), slot, due, ..entries[k] };
        }
        let mut by_due: Vec<u32> = placed.iter().map(|&k| k as u32).collect();
        by_due.sort_unstable_by_key(|&k| entries[k as usize].due);
        Some((Plan { entries, slots, by_due }, placement.top))
    }
}

/// The state behind the lock.
struct State<R> {
    /// Whether [`Planned::step`] has been called: before it, nothing is
    /// recorded.
    stepping: bool,
    /// Whether the step in progress is recorded: every step that did not
    /// begin by following a plan.
    recording: bool,
    /// The recorded step, one entry per allocation in order: its lifetime
    /// in ops since the step began (`end == OPEN` while live; the size
    /// rounded up to `UNIT`), the request, and whether it was made on the
    /// step's stream. Empty unless `recording`.
    record: Vec<(Lifetime, Request, bool)>,
    /// Ops recorded since the step began, at most `MAX_STEP_OPS`.
    ops: u32,
    /// Steps begun: an upstream allocation that returns after a step
    /// boundary is not recorded in the new step.
    epoch: u64,
    /// The requests of the step recorded before (and whether each was on
    /// its stream): a step is planned only when it repeats them.
    previous: Vec<(Request, bool)>,
    /// The recorded step's live allocations by address: their index in
    /// `record`.
    born: BTreeMap<u64, u32>,
    /// The plan in force (no entries: none). Every planned offset plus its
    /// rounded size is at most `region.size()`.
    plan: Plan,
    /// Whether the step in progress is served from `plan`: every
    /// allocation so far arrived as planned. Never true with an empty plan.
    following: bool,
    /// Allocations since the step began.
    allocations: u32,
    /// How far through `plan.by_due` the step is: the entries before it
    /// are due to be free.
    cursor: u32,
    /// Region blocks live past their due: while any is, nothing more is
    /// placed (it may lie where the next block goes).
    overdue: u32,
    /// Per slot of the plan: the live block there (its entry's index + 1),
    /// 0 for none, with its top bit set once it is overdue.
    slot_live: Vec<u32>,
    /// Live region blocks and their rounded bytes.
    live_count: u32,
    live_bytes: u64,
    /// The stream id the step is on (the stream `step` was called with).
    stream: u64,
    /// The region from upstream (`Block::EMPTY` with none).
    region: Block,
    /// The stream id the region was taken on.
    region_stream: u64,
    /// Figures.
    steps: Steps,
    /// How the region goes back upstream when `Planned` is dropped: set
    /// when a region is first taken, on a stream type with a drop stream.
    at_drop: Option<fn(&R, Block)>,
}

/// The flag of [`State::slot_live`] for an overdue block.
const OVERDUE: u32 = 1 << 31;

/// Gives `block` back to `upstream` on the stream type's drop stream.
fn give_back_at_drop<S: Stream + ?Sized, R: MemoryResource<S>>(upstream: &R, block: Block) {
    // Dropping: an error of the upstream cannot be reported any more.
    S::at_drop(&mut |stream| {
        let _ = upstream.deallocate(block, stream);
    });
}

impl<R> State<R> {
    fn new() -> Self {
        State {
            stepping: false,
            recording: false,
            record: Vec::new(),
            ops: 0,
            epoch: 0,
            previous: Vec::new(),
            born: BTreeMap::new(),
            plan: Plan::default(),
            following: false,
            allocations: 0,
            cursor: 0,
            overdue: 0,
            slot_live: Vec::new(),
            live_count: 0,
            live_bytes: 0,
            stream: 0,
            region: Block::EMPTY,
            region_stream: 0,
            steps: Steps::default(),
            at_drop: None,
        }
    }

    /// Counts a recorded op; `false` once the step is too long to record.
    fn tick(&mut self) -> bool {
        if self.ops >= MAX_STEP_OPS {
            return false;
        }
        self.ops += 1;
        true
    }

    /// Serves the next allocation from the region if the plan says so:
    /// its address, else `None` (and the allocation is recorded if the
    /// step is, its index returned).
    fn place(&mut self, request: Request, stream: u64) -> core::result::Result<u64, Option<u32>> {
        let k = self.allocations;
        self.allocations = k.saturating_add(1);
        if self.following {
            match self.plan.entries.get(k as usize).copied() {
                Some(e) if e.request == request => {
                    self.mark_due(k);
                    if let (Some(offset), true) = (e.offset, stream == self.stream && self.overdue == 0) {
                        let addr = self.region.addr() + offset;
                        if addr % request.align() == 0 {
                            let size = request.rounded_size(UNIT);
                            self.slot_live[e.slot as usize] = k + 1;
                            self.live_count += 1;
                            self.live_bytes += size;
                            self.steps.planned_allocations += 1;
                            return Ok(addr);
                        }
                    }
                    if self.overdue > 0 {
                        self.following = false;
                    }
                }
                _ => self.following = false,
            }
        }
        if !self.recording {
            return Err(None);
        }
        let start = self.ops;
        if !self.tick() {
            return Err(None);
        }
        let size = request.rounded_size(UNIT);
        self.record.push((Lifetime { start, end: OPEN, size }, request, stream == self.stream));
        Err(Some(self.record.len() as u32 - 1))
    }

    /// Marks the region blocks due by allocation `k` that are still live
    /// as overdue.
    fn mark_due(&mut self, k: u32) {
        while let Some(&j) = self.plan.by_due.get(self.cursor as usize) {
            let e = self.plan.entries[j as usize];
            if e.due > k {
                break;
            }
            self.cursor += 1;
            let live = &mut self.slot_live[e.slot as usize];
            if *live & !OVERDUE == j + 1 {
                *live |= OVERDUE;
                self.overdue += 1;
            }
        }
    }

    /// Records the free of the recorded step's block at `addr`, if it is
    /// one.
    fn freed(&mut self, addr: u64) {
        if let Some(k) = self.born.remove(&addr) {
            let end = self.ops;
            if self.tick() {
                self.record[k as usize].0.end = end;
            }
        }
    }

    /// If `addr` lies in the region: the slot of the live block there,
    /// its entry's index + 1 and its request, or `Err(())` where no block
    /// starting at `addr` is live.
    fn region_block(&self, addr: u64) -> Option<core::result::Result<(usize, u32, Request), ()>> {
        let r = self.region;
        if r.is_empty() || addr < r.addr() || addr - r.addr() >= r.size() {
            return None;
        }
        let found = self.plan.slots.binary_search(&(addr - r.addr())).ok().and_then(|slot| {
            let live = self.slot_live[slot] & !OVERDUE;
            (live != 0).then(|| (slot, live, self.plan.entries[live as usize - 1].request))
        });
        Some(found.ok_or(()))
    }

    /// Whether the step that just ended was served from the plan from its
    /// first allocation to its last, and left nothing in the region.
    fn followed_plan(&self) -> bool {
        self.following && self.allocations as usize == self.plan.entries.len() && self.live_count == 0
    }

    /// Begins a step on `stream`: following the plan if there is one and
    /// the region is free, else recorded.
    fn begin(&mut self, stream: u64) {
        self.record.clear();
        self.born.clear();
        self.ops = 0;
        self.epoch += 1;
        self.allocations = 0;
        self.cursor = 0;
        self.stream = stream;
        self.following = !self.plan.entries.is_empty() && self.live_count == 0;
        self.recording = !self.following;
        if self.following {
            // Overdue marks belong to the step that ended.
            self.slot_live.iter_mut().for_each(|l| *l = 0);
            self.overdue = 0;
        }
    }

    /// The live region blocks, by ascending offset: offset and rounded
    /// size.
    fn live_blocks(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.slot_live.iter().zip(&self.plan.slots).filter(|(l, _)| **l & !OVERDUE != 0).map(|(l, &o)| {
            let e = &self.plan.entries[(l & !OVERDUE) as usize - 1];
            (o, e.request.rounded_size(UNIT))
        })
    }

    /// Puts `plan` in force with a fresh table of live slots.
    fn install(&mut self, plan: Plan) {
        self.slot_live = (0..plan.slots.len()).map(|_| 0).collect();
        self.plan = plan;
        self.overdue = 0;
    }
}

/// Lays out each step of a repeating workload from the step before it;
/// see the [module](self).
pub struct Planned<R> {
    upstream: R,
    state: Shared<State<R>>,
}

impl<R> Planned<R> {
    /// `upstream` with no plan yet: nothing is recorded before the first
    /// [`step`](Self::step).
    pub fn new(upstream: R) -> Self {
        Planned { upstream, state: Shared::new(State::new()) }
    }

    /// The upstream.
    pub fn upstream(&self) -> &R {
        &self.upstream
    }

    /// What it has done so far.
    pub fn steps(&self) -> Steps {
        self.state.with(|s| Steps { region: s.region.size(), ..s.steps })
    }

    /// Ends the step in progress and begins the next one on `stream`.
    ///
    /// If the step that ended followed the plan to its end, the plan
    /// stays. If it was recorded (it did not begin by following a plan), a
    /// new plan is made from it and the region resized to fit, unless a
    /// block in the region is still live; then, and after a step that
    /// left its plan, the next step is recorded to plan from. Errors are
    /// the upstream's, from giving back or taking the region; after one,
    /// no plan is in force and the resource is otherwise as before.
    pub fn step<S: Stream + ?Sized>(&self, stream: &S) -> Result<()>
    where
        R: MemoryResource<S>,
    {
        let id = stream.id();
        // What the step that ended leaves to do outside the lock: plan
        // from its record (`Some(record)`), or give the region back
        // (`None`): the region of a plan that no longer holds would sit
        // idle beside the next step, which runs from upstream.
        let ended = self.state.with(|s| {
            s.steps.steps += 1;
            let first = !s.stepping;
            s.stepping = true;
            let mut ended = None;
            if first {
            } else if s.followed_plan() && s.stream == id {
                s.steps.followed += 1;
            } else if s.live_count == 0 {
                let mut record =
                    (s.recording && s.ops < MAX_STEP_OPS).then(|| core::mem::take(&mut s.record));
                // Planned only from a step that repeats the one recorded
                // before it: a loop's first step (lazy setup) and steps of
                // changing shapes are never laid out.
                let asked: Vec<(Request, bool)> =
                    record.as_deref().unwrap_or_default().iter().map(|&(_, r, on)| (r, on)).collect();
                if asked != s.previous {
                    record = None;
                }
                s.previous = asked;
                ended = Some((record, s.region, s.region_stream));
                // Nothing is served from the region until a new plan is in.
                s.install(Plan::default());
            }
            // (With a region block live the plan stays, to find it by, and
            // the next step is recorded.)
            s.begin(id);
            ended
        });
        let Some((record, region, region_stream)) = ended else { return Ok(()) };
        let record = record.unwrap_or_default();
        let made = Plan::of(&record);
        let top = made.as_ref().map_or(0, |(_, top)| *top);
        let fits = !region.is_empty() && top <= region.size();
        // Keep a region that fits and wastes at most an eighth; and any
        // region that fits where it cannot be given back on this stream:
        // its last blocks may still be in use on its own stream, which
        // this call does not have, and the device cannot be waited for.
        let mut keep = fits && region.size() - top <= region.size() / 8;
        if !keep && !region.is_empty() && region_stream != id && !stream.synchronize_device()? {
            if !fits {
                return Ok(());
            }
            keep = true;
        }
        let mut new_region = region;
        if !keep {
            if !region.is_empty() {
                self.upstream.deallocate(region, stream)?;
                self.state.with(|s| s.region = Block::EMPTY);
                new_region = Block::EMPTY;
            }
            if top > 0 {
                // Without a region the steps run from upstream, recorded.
                new_region = self.upstream.allocate(Request::new(top)?, stream).unwrap_or(Block::EMPTY);
            }
        }
        self.state.with(|s| {
            if new_region != region {
                s.region_stream = id;
            }
            s.region = new_region;
            if !new_region.is_empty() && s.at_drop.is_none() && S::at_drop(&mut |_| {}) {
                s.at_drop = Some(give_back_at_drop::<S, R>);
            }
            if let (Some((plan, _)), false) = (made, new_region.is_empty()) {
                s.install(plan);
                s.steps.plans += 1;
                // Allocations that came in meanwhile went upstream: this
                // step no longer begins as the plan does, and is recorded.
                if s.allocations == 0 && s.live_count == 0 {
                    s.following = true;
                    s.recording = false;
                }
            }
        });
        Ok(())
    }
}

impl<S: Stream + ?Sized, R: MemoryResource<S>> MemoryResource<S> for Planned<R> {
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        let id = stream.id();
        let recorded = match self.state.with(|s| s.place(request, id).map_err(|k| k.map(|k| (k, s.epoch)))) {
            Ok(addr) => return Ok(Block::from_addr(addr, request.size())),
            Err(recorded) => recorded,
        };
        let block = self.upstream.allocate(request, stream);
        if let Some((k, epoch)) = recorded {
            self.state.with(|s| {
                // A step that began meanwhile has a record of its own.
                if s.epoch != epoch {
                    return;
                }
                match &block {
                    Ok(b) => {
                        s.born.insert(b.addr(), k);
                    }
                    // Live for no op: never placed.
                    Err(_) => s.record[k as usize].0.end = s.record[k as usize].0.start,
                }
            });
        }
        block
    }

    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        let addr = block.addr();
        let found = self.state.with(|s| s.region_block(addr).map(|b| (b, s.stream)));
        let Some((found, plan_stream)) = found else {
            self.upstream.deallocate(block, stream)?;
            self.state.with(|s| {
                if s.recording {
                    s.freed(addr);
                }
            });
            return Ok(());
        };
        let Ok((slot, live, request)) = found else { return Err(Error::UnknownBlock { addr }) };
        let size = request.rounded_size(UNIT);
        if block.size().div_ceil(UNIT) * UNIT != size {
            return Err(Error::SizeMismatch { addr, expected: request.size(), given: block.size() });
        }
        if stream.id() != plan_stream {
            // Its bytes are planned again on the step's stream.
            stream.synchronize()?;
        }
        self.state.with(|s| {
            let now = s.slot_live.get(slot).copied().unwrap_or(0);
            if now & !OVERDUE != live {
                // Freed by another thread meanwhile.
                return Err(Error::UnknownBlock { addr });
            }
            if now & OVERDUE != 0 {
                s.overdue -= 1;
            }
            s.slot_live[slot] = 0;
            s.live_count -= 1;
            s.live_bytes -= size;
            Ok(())
        })
    }
}

impl<R: Inspect> Inspect for Planned<R> {
    /// The upstream's figures, with the region's bytes not in use by a
    /// live block counted free (the largest free block is the upstream's
    /// or the region's longest free run).
    fn usage(&self) -> Usage {
        let up = self.upstream.usage();
        let (region, live_bytes, longest) = self.state.with(|s| {
            let (mut longest, mut at) = (0, 0);
            for (o, n) in s.live_blocks() {
                longest = longest.max(o.saturating_sub(at));
                at = o + n;
            }
            let size = s.region.size();
            (size, s.live_bytes, longest.max(size.saturating_sub(at)))
        });
        let used = up.used.saturating_sub(region) + live_bytes;
        Usage::new(used, up.held, up.peak_held, up.largest_free.max(longest))
    }

    fn check(&self) -> core::result::Result<(), Violation> {
        self.state.with(|s| {
            let (mut at, mut sum, mut count, mut overdue) = (0, 0, 0, 0);
            for (o, n) in s.live_blocks() {
                if o < at || o + n > s.region.size() {
                    return Err(Violation::new("planned blocks overlap or leave the region"));
                }
                at = o + n;
                sum += n;
                count += 1;
            }
            for (slot, &live) in s.slot_live.iter().enumerate() {
                let Some(e) = (live & !OVERDUE).checked_sub(1).and_then(|k| s.plan.entries.get(k as usize))
                else {
                    if live & !OVERDUE != 0 {
                        return Err(Violation::new("a live slot names no entry of the plan"));
                    }
                    continue;
                };
                if e.slot as usize != slot {
                    return Err(Violation::new("a live block in another entry's slot"));
                }
                overdue += u32::from(live & OVERDUE != 0);
            }
            if (sum, count, overdue) != (s.live_bytes, s.live_count, s.overdue) {
                return Err(Violation::new("planned blocks in use miscounted"));
            }
            if s.following && s.plan.entries.is_empty() {
                return Err(Violation::new("following an empty plan"));
            }
            let end = |e: &Entry| e.offset.map(|o| o + e.request.rounded_size(UNIT));
            if s.plan.entries.iter().any(|e| end(e).is_some_and(|end| end > s.region.size())) {
                return Err(Violation::new("a planned offset past the region's end"));
            }
            Ok(())
        })?;
        self.upstream.check()
    }
}

impl<R: fmt::Debug> fmt::Debug for Planned<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Planned")
            .field("upstream", &self.upstream)
            .field("steps", &self.steps())
            .finish_non_exhaustive()
    }
}

impl<R> Drop for Planned<R> {
    /// Gives the region back on the stream type's drop stream, if it has
    /// one and no block in the region is live (a block someone may still
    /// use is never freed under it).
    fn drop(&mut self) {
        let (region, at_drop, empty) = self.state.with(|s| (s.region, s.at_drop, s.live_count == 0));
        if let (false, Some(give_back), true) = (region.is_empty(), at_drop, empty) {
            give_back(&self.upstream, region);
        }
    }
}
