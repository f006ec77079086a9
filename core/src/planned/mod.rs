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
//! step()  plan from step 1 (placement::best); region [0, top) from upstream
//!         the k-th allocation of a step, as recorded (size, alignment,
//!           the step's stream), placed in step 1  -> region + offset[k]
//!         ... outlived step 1, or on another stream -> upstream
//!         anything else (another size, an extra allocation)
//!                               -> upstream, and so is the rest of the step
//! step()  the step followed the plan to its end: keep the plan;
//!         else plan again from this step
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
//! for _ in 0..3 {
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
//! assert_eq!(steps.planned_allocations, 3); // the third step came from the region
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
struct Planned1 {
    request: Request,
    /// Offset in the region; `None`: from upstream.
    offset: Option<u64>,
}

/// The state behind the lock.
struct State<R> {
    /// Whether [`Planned::step`] has been called: before it, nothing is
    /// recorded.
    stepping: bool,
    /// The step in progress, one entry per allocation in order: its
    /// lifetime in ops since the step began (`end == OPEN` while live; the
    /// size rounded up to `UNIT`), the request, and whether it was made on
    /// the step's stream.
    record: Vec<(Lifetime, Request, bool)>,
    /// Ops since the step began; at most `MAX_STEP_OPS` are recorded.
    ops: u32,
    /// Steps begun: an allocation made across a step boundary is not
    /// recorded in the new step's record.
    epoch: u64,
    /// The step's live allocations by address: their index in `record`.
    born: BTreeMap<u64, u32>,
    /// The plan in force, one entry per allocation of a step; empty with
    /// none. Every offset plus its request's rounded size is at most
    /// `region.size()`.
    plan: Vec<Planned1>,
    /// Whether the step in progress is served from `plan`: every
    /// allocation so far arrived as planned. Never true with an empty plan.
    following: bool,
    /// The stream id the step is on (the stream `step` was called with).
    stream: u64,
    /// The region from upstream (`Block::EMPTY` with none).
    region: Block,
    /// The stream id the region was taken on.
    region_stream: u64,
    /// The region's live blocks: offset to rounded size. Disjoint, each
    /// inside `region`.
    live: BTreeMap<u64, u64>,
    /// Sum of the sizes in `live`.
    live_bytes: u64,
    /// Figures.
    steps: Steps,
    /// How the region goes back upstream when `Planned` is dropped: set
    /// when a region is first taken, on a stream type with a drop stream.
    at_drop: Option<fn(&R, Block)>,
}

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
            record: Vec::new(),
            ops: 0,
            epoch: 0,
            born: BTreeMap::new(),
            plan: Vec::new(),
            following: false,
            stream: 0,
            region: Block::EMPTY,
            region_stream: 0,
            live: BTreeMap::new(),
            live_bytes: 0,
            steps: Steps::default(),
            at_drop: None,
        }
    }

    /// Counts an op; `false` once the step is too long to record.
    fn tick(&mut self) -> bool {
        if self.ops >= MAX_STEP_OPS {
            return false;
        }
        self.ops += 1;
        true
    }

    /// Where the next allocation goes: its offset in the region, or `None`
    /// for upstream. Records the allocation (its index is returned) and
    /// stops following the plan when it departs from it.
    fn next(&mut self, request: Request, stream: u64) -> (Option<u64>, Option<u32>) {
        let k = self.record.len();
        let mut offset = None;
        if self.following {
            match self.plan.get(k) {
                Some(p) if p.request == request => {
                    offset = p.offset.filter(|&o| {
                        stream == self.stream && (self.region.addr() + o) % request.align() == 0
                    });
                }
                _ => self.following = false,
            }
        }
        if !self.stepping {
            return (offset, None);
        }
        let start = self.ops;
        if !self.tick() {
            return (offset, None);
        }
        let size = request.size().div_ceil(UNIT) * UNIT;
        self.record.push((Lifetime { start, end: OPEN, size }, request, stream == self.stream));
        (offset, Some(k as u32))
    }

    /// Records the free of the step's block at `addr`, if it is one.
    fn freed(&mut self, addr: u64) {
        if let Some(k) = self.born.remove(&addr) {
            let end = self.ops;
            if self.tick() {
                self.record[k as usize].0.end = end;
            }
        }
    }

    /// The region's offset of `addr`, if it lies in the region.
    fn in_region(&self, addr: u64) -> Option<u64> {
        let r = self.region;
        (!r.is_empty() && addr >= r.addr() && addr - r.addr() < r.size()).then(|| addr - r.addr())
    }

    /// Whether the step that just ended was served from the plan from its
    /// first allocation to its last, and left nothing in the region.
    fn followed_plan(&self) -> bool {
        self.following && self.record.len() == self.plan.len() && self.live.is_empty()
    }

    /// Begins a step on `stream`: a fresh record, following the plan if
    /// there is one and the region is free.
    fn begin(&mut self, stream: u64) {
        self.record.clear();
        self.born.clear();
        self.ops = 0;
        self.epoch += 1;
        self.stream = stream;
        self.following = !self.plan.is_empty() && self.live.is_empty();
    }
}

/// The plan for the next steps from the record of the last one: the
/// blocks allocated and freed inside it on its stream are placed; every
/// other allocation goes upstream. `None` when nothing is to be placed.
fn plan_of(record: &[(Lifetime, Request, bool)]) -> Option<(Vec<Planned1>, u64)> {
    let placed: Vec<usize> = (0..record.len()).filter(|&k| record[k].2 && record[k].0.end != OPEN).collect();
    if placed.is_empty() {
        return None;
    }
    let blocks: Vec<Lifetime> = placed.iter().map(|&k| record[k].0).collect();
    let (_, placement) = placement::best(&blocks);
    let mut plan: Vec<Planned1> =
        record.iter().map(|&(_, request, _)| Planned1 { request, offset: None }).collect();
    for (i, &k) in placed.iter().enumerate() {
        plan[k].offset = Some(placement.offsets[i]);
    }
    Some((plan, placement.top))
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
        self.state.with(|s| s.steps)
    }
}

impl<R> Planned<R> {
    /// Ends the step in progress and begins the next one on `stream`.
    ///
    /// If the step that ended followed the plan to its end, the plan
    /// stays. Otherwise a new plan is made from it and the region resized
    /// to fit, if the region holds no live block; while one is live the
    /// next step is not planned. Errors are the upstream's, from giving
    /// back or taking the region; after one, no plan is in force and the
    /// resource is otherwise as before.
    pub fn step<S: Stream + ?Sized>(&self, stream: &S) -> Result<()>
    where
        R: MemoryResource<S>,
    {
        let id = stream.id();
        let ended = self.state.with(|s| {
            s.steps.steps += 1;
            if !s.stepping {
                s.stepping = true;
                s.begin(id);
                return None;
            }
            if s.followed_plan() && s.stream == id {
                s.steps.followed += 1;
                s.begin(id);
                return None;
            }
            // Nothing is served from the region until the new plan is in.
            s.following = false;
            let busy = !s.live.is_empty() || s.ops >= MAX_STEP_OPS;
            let record = core::mem::take(&mut s.record);
            s.plan.clear();
            s.begin(id);
            (!busy).then_some((record, s.region, s.region_stream))
        });
        let Some((record, region, region_stream)) = ended else { return Ok(()) };
        let made = plan_of(&record);
        let top = made.as_ref().map_or(0, |(_, top)| *top);
        // Keep a region that fits and wastes at most an eighth.
        let keep = !region.is_empty() && top <= region.size() && region.size() - top <= region.size() / 8;
        let mut new_region = region;
        if !keep {
            if !region.is_empty() {
                if region_stream != id {
                    // The region's last blocks may still be in use on its
                    // own stream, which this call does not have.
                    stream.synchronize_device()?;
                }
                self.upstream.deallocate(region, stream)?;
                self.state.with(|s| s.region = Block::EMPTY);
                new_region = Block::EMPTY;
            }
            if top > 0 {
                let request = Request::new(top)?;
                // Without a region the step runs from upstream, unplanned.
                new_region = self.upstream.allocate(request, stream).unwrap_or(Block::EMPTY);
            }
        }
        self.state.with(|s| {
            s.region = new_region;
            if !new_region.is_empty() {
                s.region_stream = if new_region == region { s.region_stream } else { id };
                if s.at_drop.is_none() && S::at_drop(&mut |_| {}) {
                    s.at_drop = Some(give_back_at_drop::<S, R>);
                }
            }
            if let (Some((plan, _)), false) = (made, new_region.is_empty()) {
                s.plan = plan;
                s.steps.plans += 1;
                // Allocations that came in meanwhile went upstream: this
                // step no longer starts as the plan does.
                s.following = s.record.is_empty() && s.live.is_empty();
            }
            s.steps.region = new_region.size();
        });
        Ok(())
    }
}

impl<S: Stream + ?Sized, R: MemoryResource<S>> MemoryResource<S> for Planned<R> {
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        let id = stream.id();
        let recorded = self.state.with(|s| {
            let (offset, k) = s.next(request, id);
            let Some(offset) = offset else { return Err(k.map(|k| (k, s.epoch))) };
            let size = request.size().div_ceil(UNIT) * UNIT;
            // The plan keeps the blocks of one step apart; one freed later
            // than in the recorded step may still be where this one goes.
            let clear = s.live.range(..offset + size).next_back().is_none_or(|(&o, &n)| o + n <= offset);
            if !clear {
                s.following = false;
                return Err(k.map(|k| (k, s.epoch)));
            }
            s.live.insert(offset, size);
            s.live_bytes += size;
            s.steps.planned_allocations += 1;
            let addr = s.region.addr() + offset;
            if let Some(k) = k {
                s.born.insert(addr, k);
            }
            Ok(Block::from_addr(addr, request.size()))
        });
        let recorded = match recorded {
            Ok(block) => return Ok(block),
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
        let id = stream.id();
        let region =
            self.state.with(|s| s.in_region(block.addr()).map(|o| (o, s.live.get(&o).copied(), s.stream)));
        let Some((offset, live, plan_stream)) = region else {
            self.upstream.deallocate(block, stream)?;
            self.state.with(|s| s.freed(block.addr()));
            return Ok(());
        };
        let Some(size) = live else {
            return Err(Error::UnknownBlock { addr: block.addr() });
        };
        if size != block.size().div_ceil(UNIT) * UNIT {
            return Err(Error::SizeMismatch { addr: block.addr(), expected: size, given: block.size() });
        }
        if id != plan_stream {
            // Its bytes are planned again on the step's stream.
            stream.synchronize()?;
        }
        self.state.with(|s| {
            if s.live.remove(&offset).is_some() {
                s.live_bytes -= size;
                s.freed(block.addr());
                Ok(())
            } else {
                // Freed by another thread meanwhile.
                Err(Error::UnknownBlock { addr: block.addr() })
            }
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
            let mut longest = 0;
            let mut at = 0;
            for (&o, &n) in &s.live {
                longest = longest.max(o - at);
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
            let mut at = 0;
            let mut sum = 0;
            for (&o, &n) in &s.live {
                if o < at || o + n > s.region.size() {
                    return Err(Violation::new("planned blocks overlap or leave the region"));
                }
                at = o + n;
                sum += n;
            }
            if sum != s.live_bytes {
                return Err(Violation::new("planned bytes in use miscounted"));
            }
            if s.following && s.plan.is_empty() {
                return Err(Violation::new("following an empty plan"));
            }
            if s.plan.iter().any(|p| {
                p.offset.is_some_and(|o| o + p.request.size().div_ceil(UNIT) * UNIT > s.region.size())
            }) {
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
        let (region, at_drop, empty) = self.state.with(|s| (s.region, s.at_drop, s.live.is_empty()));
        if let (false, Some(give_back), true) = (region.is_empty(), at_drop, empty) {
            give_back(&self.upstream, region);
        }
    }
}
