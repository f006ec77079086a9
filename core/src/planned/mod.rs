//! [`Planned`]: lays out each step of a repeating workload from the step
//! before it (feature `alloc`).
//!
//! A training loop asks for the same sizes in the same order every step.
//! An online allocator places each block knowing only the past, and the
//! holes it leaves cost memory; knowing when each block of the last step
//! was freed, the next step's blocks can be placed as a static memory
//! planner places them ([`placement`]). `Planned` records the allocations
//! and frees between two calls of [`step`](Planned::step); at the next
//! call it lays out that step: the blocks it carries into the next step
//! (a training loop's gradients, freed by the next `zero_grad`) one beside
//! the other in a carry region, and the blocks it allocated and freed in
//! itself where the carried blocks are free, else in a region of the
//! step's own. It serves the following steps from the two regions for as
//! long as they repeat the recorded one:
//!
//! ```text
//! step()  step 1: every block from upstream, recorded
//! step()  step 2: the same, recorded
//! step()  step 2 repeated step 1: plan from it
//!         step's region [0, top) from upstream; carry region later
//!         the k-th allocation of a step, as recorded (size, alignment,
//!           the step's stream):
//!         ... live at step 2's end, its counterpart of step 1 freed in
//!           step 2 before it came (carried)   -> carry region + slot[k]
//!         ... allocated and freed in step 2   -> placed over the carry
//!           region's slots while they are free, or region + offset[k]
//!           (placement::best_around)
//!         ... living longer, on another stream, or aligned beyond 256
//!                                             -> upstream
//!         anything else (another size, an extra allocation)
//!                               -> upstream, and so is the rest of the step
//!         the carry region is taken with the first block it serves:
//!           after step 2's carried blocks (upstream) are freed
//! step()  the step followed the plan to its end: keep the plan;
//!         else give the regions back, record the next steps and plan
//!         again once one repeats the one before it
//! ```
//!
//! A steady step asks the upstream for nothing: no chunk to grow, no
//! mapping to make. The upstream holds the rest: blocks that live longer
//! than into the next step (parameters, optimizer state) or that live
//! beside their successor of the next step (an input replaced only once
//! the next one is in). Before the
//! first [`step`](Planned::step), and in a step that departs from its
//! plan, `Planned` is its upstream with a record kept beside it.
//! [`release`](Planned::release) (what PyTorch's `empty_cache` reaches
//! through a built stack) gives back each region no block lives in, once
//! the step's region is free; the plan goes then, and the next steps are
//! recorded and laid out afresh.
//!
//! A block is never placed over a live one: in the step's region, a
//! block freed later than in the recorded step makes the step depart
//! before anything is placed over it; in the carry region, where blocks
//! of consecutive steps meet, each block is checked against the live ones
//! and goes upstream if it would overlap.
//!
//! Streams: a step's plan serves one stream, the one [`step`] is called
//! with, and each region is one stream's, the one whose steps it serves.
//! A region block freed on any other stream waits for that stream
//! ([`Stream::synchronize`]) before its bytes are planned again; a region
//! serves the plan of another stream's steps, or is given back on
//! another stream than its own, only after the device is idle
//! ([`Stream::synchronize_device`]), and serves no plan while the device
//! cannot be waited for.
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

mod carry;
#[cfg(all(test, feature = "std", loom))]
mod loom_tests;
pub mod placement;
#[cfg(test)]
mod tests;

use crate::addr_map::InFlight;
use crate::check::Violation;
use crate::lock::Shared;
use crate::primitive::{AtomicU64, Ordering};
use crate::{Block, Error, Inspect, MemoryResource, Request, Result, Stream, Usage};
use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use carry::{carried_of, Carry};
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

/// The low bits of a step block's tag: the index of its allocation in the
/// plan (fewer than [`MAX_STEP_OPS`]), which names its slot. The bits above
/// are the step that served it, so that a stale block (freed, its slot
/// served again, in this step or a later one) is told from the live one.
const ENTRY_BITS: u32 = 22;
const _: () = assert!(MAX_STEP_OPS <= 1 << ENTRY_BITS);

/// The tag of the block of the plan's allocation `k` served in step
/// `epoch`: [`Block::NO_TAG`] (told apart by address only) once the steps
/// run past what the tag holds, 2^42, so that a tag is never handed out
/// twice.
fn step_tag(epoch: u64, k: u64) -> u64 {
    if epoch < (1 << (64 - ENTRY_BITS)) - 1 {
        epoch << ENTRY_BITS | k
    } else {
        Block::NO_TAG
    }
}

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
    /// Allocations served from the regions.
    pub planned_allocations: u64,
    /// Bytes of the step's region held from upstream now: those asked for
    /// (of a longer block, the rest is neither used nor counted).
    pub region: u64,
    /// Bytes of the region of carried blocks held from upstream now, as
    /// [`region`](Self::region).
    pub carry_region: u64,
}

/// The counts of several [`Planned`] layers, added field by field (the
/// regions' bytes too: what they all hold now), saturating.
///
/// ```
/// use memres_core::planned::Steps;
/// let a = Steps { steps: 3, followed: 1, region: 4096, ..Steps::default() };
/// let total: Steps = [a, a].into_iter().sum();
/// assert_eq!((total.steps, total.followed, total.region, total.plans), (6, 2, 8192, 0));
/// ```
impl core::iter::Sum for Steps {
    fn sum<I: Iterator<Item = Steps>>(iter: I) -> Steps {
        iter.fold(Steps::default(), |t, s| Steps {
            steps: t.steps.saturating_add(s.steps),
            followed: t.followed.saturating_add(s.followed),
            plans: t.plans.saturating_add(s.plans),
            planned_allocations: t.planned_allocations.saturating_add(s.planned_allocations),
            region: t.region.saturating_add(s.region),
            carry_region: t.carry_region.saturating_add(s.carry_region),
        })
    }
}

/// Where an allocation of a plan goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// To the upstream.
    Upstream,
    /// At `offset` in the step's region; `slot` is its index in
    /// [`Plan::slots`].
    Step { offset: u64, slot: u32 },
    /// To slot `slot` of the [`Carry`] layout: it lives into the next step.
    Carried { slot: u32 },
    /// At `offset` in the carry region, where carried blocks are freed
    /// before it and allocated after it.
    InCarry { offset: u64 },
}

/// One allocation of a plan: as it must arrive, and where it goes.
#[derive(Clone, Copy, Debug)]
struct Entry {
    request: Request,
    place: Place,
    /// For a block in the step's region: the allocations of the step made
    /// before it was freed in the recorded step. By the allocation of that
    /// index it must be free, or a later block may be placed over it.
    due: u32,
}

/// A step laid out.
#[derive(Debug, Default)]
struct Plan {
    /// One per allocation of the recorded step, in order.
    entries: Vec<Entry>,
    /// The distinct offsets in the step's region, ascending: a region
    /// block is found by its offset here, at the index its tag names.
    slots: Vec<u64>,
    /// The entries in the step's region by `due`, ascending.
    by_due: Vec<u32>,
}

/// What [`Plan::of`] knows of the carry layout: its slots (as
/// [`Carry::slots`]), the frees in the recorded step of the blocks the step
/// before left there (allocation index and op, as
/// [`State::carried_frees`]).
struct CarryView<'a> {
    slots: &'a [(u32, u64, u64)],
    frees: &'a [(u32, u32)],
}

impl Plan {
    /// The plan for the next steps from the record of the last one, and
    /// the bytes of the step's region it needs:
    ///
    /// - blocks live at the step's end, on its stream, that the carry
    ///   layout has a slot for go to their slot;
    /// - blocks allocated and freed inside the step on its stream, aligned
    ///   to at most `UNIT` (the offsets' multiple), are placed
    ///   ([`placement::best_around`]) in the carry region where they fit
    ///   between a slot's free and its next allocation, else in the
    ///   step's region;
    /// - every other allocation goes upstream.
    ///
    /// `None` when nothing is to be laid out.
    fn of(record: &[(Lifetime, Request, bool)], carry: &CarryView<'_>) -> Option<(Plan, u64)> {
        let mut entries: Vec<Entry> =
            record.iter().map(|&(_, request, _)| Entry { request, place: Place::Upstream, due: 0 }).collect();
        // The carried blocks, and the slots' busy times as blocks fixed at
        // their offsets: from the step's start to the free of the block
        // the step before left there (all the step if it was not freed),
        // and from the carried block's allocation on.
        let frees: BTreeMap<u32, u32> = carry.frees.iter().copied().collect();
        let mut fixed: Vec<(Lifetime, u64)> = Vec::new();
        for (slot, &(k, offset, size)) in carry.slots.iter().enumerate() {
            let freed = frees.get(&k).copied().unwrap_or(OPEN);
            fixed.push((Lifetime { start: 0, end: freed, size }, offset));
            let Some(&(life, request, on)) = record.get(k as usize) else { continue };
            if on && life.end == OPEN && request.rounded_size(UNIT) == size && request.align() <= UNIT {
                entries[k as usize].place = Place::Carried { slot: slot as u32 };
                fixed.push((Lifetime { start: life.start, end: OPEN, size }, offset));
            }
        }
        // On the step's stream, freed in the step, live for an op at least
        // (a failed allocation is not), of some size and aligned as the
        // offsets are.
        let placed: Vec<usize> = (0..record.len())
            .filter(|&k| {
                let (life, request, on) = record[k];
                on && life.end != OPEN && life.end > life.start && life.size > 0 && request.align() <= UNIT
            })
            .collect();
        let carried = entries.iter().any(|e| matches!(e.place, Place::Carried { .. }));
        if placed.is_empty() && !carried {
            return None;
        }
        let low = carry.slots.last().map_or(0, |&(_, o, n)| o + n);
        let blocks: Vec<Lifetime> = placed.iter().map(|&k| record[k].0).collect();
        let fixed = if low > 0 { fixed } else { Vec::new() };
        let placement = if blocks.is_empty() {
            Default::default()
        } else {
            placement::best_around(&blocks, &fixed, low).1
        };
        let mut slots: Vec<u64> = placement.offsets.iter().filter(|&&o| o >= low).map(|&o| o - low).collect();
        slots.sort_unstable();
        slots.dedup();
        let mut by_due = Vec::new();
        for (i, &k) in placed.iter().enumerate() {
            let at = placement.offsets[i];
            if at < low {
                entries[k].place = Place::InCarry { offset: at };
                continue;
            }
            let offset = at - low;
            // Allocations recorded before this block's free: record is in
            // allocation order, so the starts ascend.
            let due = record.partition_point(|r| r.0.start < record[k].0.end) as u32;
            let slot = slots.binary_search(&offset).unwrap_or(0) as u32;
            entries[k] = Entry { place: Place::Step { offset, slot }, due, ..entries[k] };
            by_due.push(k as u32);
        }
        by_due.sort_unstable_by_key(|&k| entries[k as usize].due);
        Some((Plan { entries, slots, by_due }, placement.top.saturating_sub(low)))
    }

    /// Sends what the plan put in the carry region upstream.
    fn without_carry(&mut self) {
        for e in &mut self.entries {
            if let Place::Carried { .. } | Place::InCarry { .. } = e.place {
                e.place = Place::Upstream;
            }
        }
    }
}

/// A live block in a region, as [`State::region_block`] finds it.
#[derive(Clone, Copy)]
enum Found {
    /// In the step's region: its slot, the live mark there (its entry's
    /// index + 1) and the step that served it, the size asked for and its
    /// rounded size.
    Step { slot: usize, live: u32, epoch: u64, asked: u64, size: u64 },
    /// In the carry region: its offset, the size asked for and its tag (a
    /// block served there once it is freed has another).
    Carried { offset: u64, asked: u64, tag: u64 },
}

/// What [`State::place`] makes of an allocation.
enum Served {
    /// From a region, at this address, with this tag.
    At(u64, u64),
    /// From the upstream; recorded at this index if the step is recorded.
    Upstream(Option<u32>),
    /// At this offset in the carry region, which is to be taken first: of
    /// this size, for the layout of this generation.
    TakeCarry { offset: u64, size: u64, generation: u64 },
}

/// Ends [`State::laying_out`] when a [`Planned::step`] returns or unwinds.
struct LayingOut<'a, R>(&'a Shared<State<R>>);

impl<R> Drop for LayingOut<'_, R> {
    fn drop(&mut self) {
        self.0.with(|s| s.laying_out = false);
    }
}

/// A region from upstream: the upstream's block, given back as it came,
/// and the bytes asked for of it, the only ones used and counted (the rest
/// of a longer block lies idle, as the rest of a pool's chunk does): at
/// most [`Request::MAX_SIZE`], so that the regions' sizes add up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Region {
    block: Block,
    size: u64,
}

impl Region {
    const EMPTY: Region = Region { block: Block::EMPTY, size: 0 };

    fn addr(&self) -> u64 {
        self.block.addr()
    }

    /// The bytes asked for.
    fn size(&self) -> u64 {
        self.size
    }

    fn is_empty(&self) -> bool {
        self.block.is_empty()
    }
}

/// Which region of the state a [`GoingBack`] is: the step's, the carry
/// region, or one of the spares (with the stream id it was taken on).
#[derive(Clone, Copy)]
enum Home {
    Step,
    Carry,
    Spare(u64),
}

impl Home {
    /// The state's place of a region that has one (not a spare).
    fn of<R>(self, s: &mut State<R>) -> Option<&mut Region> {
        match self {
            Home::Step => Some(&mut s.region),
            Home::Carry => Some(&mut s.carry.region),
            Home::Spare(_) => None,
        }
    }
}

/// A region out of the state while it goes back upstream (which may hand
/// its addresses out again at once, and a block there is then the
/// upstream's): [`free`](Self::free) puts it back where the upstream
/// refuses it, and so does a drop before its free (a free before it
/// panicked). A region whose free panics is not put back: the upstream may
/// have taken it first (`Logging` frees before its writer's panic goes
/// on), and a region put back would be served again while the upstream
/// hands it out (it is lost at worst, never handed out twice). A region
/// that serves nothing (a spare, or one shorter than asked) is put back
/// among the spares, to go back at the next chance.
struct GoingBack<'a, R> {
    state: &'a Shared<State<R>>,
    region: Region,
    home: Home,
    /// Whether its free was called (and has not returned).
    freeing: bool,
}

impl<'a, R> GoingBack<'a, R> {
    fn take(state: &'a Shared<State<R>>, region: Region, home: Home) -> Self {
        state.with(|s| {
            if let Some(r) = home.of(s) {
                *r = Region::EMPTY;
            }
        });
        GoingBack { state, region, home, freeing: false }
    }

    /// A region of no home of its own, among the spares: taken out of them
    /// already, or never put there.
    fn spare(state: &'a Shared<State<R>>, region: Region, on: u64) -> Self {
        GoingBack { state, region, home: Home::Spare(on), freeing: false }
    }

    /// Gives the region back upstream; put back where the upstream refuses.
    ///
    /// # Errors
    ///
    /// The upstream's.
    fn free<S: Stream + ?Sized>(mut self, upstream: &R, stream: &S) -> Result<()>
    where
        R: MemoryResource<S>,
    {
        self.freeing = true;
        let freed = upstream.deallocate(self.region.block, stream);
        if freed.is_ok() {
            core::mem::forget(self);
        } else {
            self.freeing = false;
        }
        freed
    }
}

impl<R> Drop for GoingBack<'_, R> {
    fn drop(&mut self) {
        if self.freeing {
            return;
        }
        self.state.with(|s| match (self.home, self.region) {
            (Home::Spare(on), region) => s.spares.push((region, on)),
            (home, region) => {
                if let Some(r) = home.of(s) {
                    *r = region;
                }
            }
        });
    }
}

/// Allocation `k` of the recorded step of `epoch`, which the upstream is
/// serving: recorded as live for no op (never placed) when dropped, as
/// the upstream failed or panicked and the caller got no block, unless
/// [`born`](Self::born) records the block it got.
struct Recorded<'a, R> {
    state: &'a Shared<State<R>>,
    k: u32,
    epoch: u64,
}

impl<R> Recorded<'_, R> {
    fn born(self, addr: u64) {
        self.state.with(|s| {
            if s.epoch == self.epoch {
                s.born.insert(addr, self.k);
                // A free taken back at `addr` was made after all.
                s.frees_in_flight.unmark(addr);
            }
        });
        core::mem::forget(self);
    }
}

impl<R> Drop for Recorded<'_, R> {
    fn drop(&mut self) {
        self.state.with(|s| {
            // A step that began meanwhile has a record of its own.
            if s.epoch == self.epoch {
                let life = &mut s.record[self.k as usize].0;
                life.end = life.start;
            }
        });
    }
}

/// A free [`State::freed`] recorded: of the recorded step's allocation
/// `k`, or of allocation `k` of the step before, carried into this one.
#[derive(Clone, Copy)]
enum Freed {
    Born(u32),
    Carried(u32),
}

/// The free of a recorded block at `addr` while the upstream frees it:
/// recorded before, as once freed the upstream may hand the address to
/// another thread's allocation, recorded at once, whose life a free
/// recorded later would end. Taken back when dropped (the upstream
/// refused the free or panicked: the block is live still) unless
/// [`made`](Self::made), or answered by a double free racing it that the
/// upstream took (`State::frees_in_flight`).
struct Freeing<'a, R> {
    state: &'a Shared<State<R>>,
    addr: u64,
    freed: Freed,
    epoch: u64,
    /// Its number among the step's frees in flight.
    number: u64,
}

impl<R> Freeing<'_, R> {
    /// The upstream freed the block.
    fn made(self) {
        core::mem::forget(self);
    }
}

impl<R> Drop for Freeing<'_, R> {
    fn drop(&mut self) {
        self.state.with(|s| {
            // A step that began meanwhile was planned with the block freed
            // (its counterpart, placed, departs if freed later) and does
            // not carry it. Nor is a free that a double free racing it
            // answered: the upstream freed the block.
            if s.epoch == self.epoch
                && s.frees_in_flight.take(self.addr, self.number)
                && s.unfree(self.addr, self.freed)
            {
                s.frees_in_flight.taken_back(self.addr);
            }
        });
    }
}

/// A block served in the carry region that the caller has not got yet:
/// freed there when dropped (the code in between, a user's, panicked),
/// unless [`hand_over`](Self::hand_over) gives it to the caller.
struct Unserved<'a, R> {
    state: &'a Shared<State<R>>,
    addr: u64,
    tag: u64,
}

impl<R> Unserved<'_, R> {
    /// The block's address and tag, for the caller.
    fn hand_over(self) -> (u64, u64) {
        let served = (self.addr, self.tag);
        core::mem::forget(self);
        served
    }
}

impl<R> Drop for Unserved<'_, R> {
    fn drop(&mut self) {
        self.state.with(|s| {
            // Its region stays while the block is live in it. Freed
            // meanwhile (by its address alone), its place may hold another.
            if let Some(Some((offset, ..))) = s.carry.block_at(self.addr) {
                if s.carry.free(offset, self.tag) {
                    s.steps.planned_allocations -= 1;
                }
            }
        });
    }
}

/// The state behind the lock.
struct State<R> {
    /// Whether [`Planned::step`] has been called: before it, nothing is
    /// recorded.
    stepping: bool,
    /// Whether a [`Planned::step`] is between its first and last lock,
    /// giving regions back or taking them with the lock released: the
    /// regions in the state are then its own, and another `step` (from an
    /// upstream that calls back, or another thread) is refused.
    laying_out: bool,
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
    /// The blocks the step before carried into this one, if it was
    /// recorded whole: by address, their index in its record.
    carried: BTreeMap<u64, u32>,
    /// Those of them freed in this step: their index in the record of
    /// the step before, and the op that freed them in this one.
    carried_frees: Vec<(u32, u32)>,
    /// This step's recorded frees of the upstream's blocks while the
    /// upstream frees them ([`Freeing`]): one refused is taken back only
    /// while in flight, not once a double free racing it went through.
    frees_in_flight: InFlight,
    /// The plan in force (no entries: none). Every offset in the step's
    /// region plus its rounded size is at most `region.size()`; every
    /// carried slot is one of `carry`'s.
    plan: Plan,
    /// Where carried blocks go: the layout of the last recorded step that
    /// ended with nothing live in it.
    carry: Carry,
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
    /// Per slot of the plan: the step that served its live block (its
    /// tag's high bits).
    slot_epoch: Vec<u64>,
    /// Live blocks in the step's region and their rounded bytes.
    live_count: u32,
    live_bytes: u64,
    /// The stream id the step is on (the stream `step` was called with).
    stream: u64,
    /// The region from upstream (`Region::EMPTY` with none).
    region: Region,
    /// The stream id the region was taken on.
    region_stream: u64,
    /// Regions that serve nothing and that the upstream would not take
    /// back (a spare carry region, taken beside another thread's; a region
    /// shorter than asked, its bytes as handed out), with the stream id
    /// each was taken on: held, and given back at the next step or release
    /// on that stream (any stream's once the device is waited for), or on
    /// drop.
    spares: Vec<(Region, u64)>,
    /// Figures.
    steps: Steps,
    /// How the region goes back upstream when `Planned` is dropped: set
    /// when a region is first taken, on a stream type with a drop stream.
    at_drop: Option<fn(&R, Block)>,
}

/// The offset of `addr` in `region`, if it lies there.
fn offset_in(region: Region, addr: u64) -> Option<u64> {
    let offset = addr.checked_sub(region.addr())?;
    (!region.is_empty() && offset < region.size()).then_some(offset)
}

/// Whether regions `a` and `b` share no byte they count (an empty one
/// shares none).
fn apart(a: Region, b: Region) -> bool {
    a.is_empty()
        || b.is_empty()
        || a.addr().saturating_add(a.size()) <= b.addr()
        || b.addr().saturating_add(b.size()) <= a.addr()
}

/// The flag of [`State::slot_live`] for an overdue block.
const OVERDUE: u32 = 1 << 31;

impl<R> State<R> {
    fn new() -> Self {
        State {
            stepping: false,
            laying_out: false,
            recording: false,
            record: Vec::new(),
            ops: 0,
            epoch: 0,
            previous: Vec::new(),
            born: BTreeMap::new(),
            carried: BTreeMap::new(),
            carried_frees: Vec::new(),
            frees_in_flight: InFlight::default(),
            plan: Plan::default(),
            carry: Carry::default(),
            following: false,
            allocations: 0,
            cursor: 0,
            overdue: 0,
            slot_live: Vec::new(),
            slot_epoch: Vec::new(),
            live_count: 0,
            live_bytes: 0,
            stream: 0,
            region: Region::EMPTY,
            region_stream: 0,
            spares: Vec::new(),
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

    /// Serves the next allocation from a region if the plan says so, else
    /// sends it upstream (and records it if the step is recorded).
    fn place(&mut self, request: Request, stream: u64) -> Served {
        let k = self.allocations;
        self.allocations = k.saturating_add(1);
        if self.following {
            match self.plan.entries.get(k as usize).copied() {
                Some(e) if e.request == request => {
                    self.mark_due(k);
                    let here = stream == self.stream && self.overdue == 0;
                    match (e.place, here) {
                        (Place::Step { offset, slot }, true) => {
                            let addr = self.region.addr() + offset;
                            if addr % request.align() == 0 {
                                let size = request.rounded_size(UNIT);
                                self.slot_live[slot as usize] = k + 1;
                                self.slot_epoch[slot as usize] = self.epoch;
                                self.live_count += 1;
                                self.live_bytes += size;
                                self.steps.planned_allocations += 1;
                                return Served::At(addr, step_tag(self.epoch, u64::from(k)));
                            }
                        }
                        (Place::Step { .. } | Place::Upstream, _) | (_, false) => {}
                        (Place::Carried { .. } | Place::InCarry { .. }, true) => {
                            let offset = match e.place {
                                Place::Carried { slot } => {
                                    self.carry.slots.get(slot as usize).map_or(u64::MAX, |s| s.1)
                                }
                                Place::InCarry { offset } => offset,
                                _ => u64::MAX,
                            };
                            // The carry region is taken with the first
                            // block it serves.
                            if self.carry.region.is_empty() && !self.carry.refused {
                                let (size, generation) = (self.carry.size(), self.carry.generation);
                                return Served::TakeCarry { offset, size, generation };
                            }
                            if let Some((addr, tag)) = self.carry.serve_at(offset, request) {
                                self.steps.planned_allocations += 1;
                                return Served::At(addr, tag);
                            }
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
            return Served::Upstream(None);
        }
        let start = self.ops;
        if !self.tick() {
            return Served::Upstream(None);
        }
        let size = request.rounded_size(UNIT);
        self.record.push((Lifetime { start, end: OPEN, size }, request, stream == self.stream));
        Served::Upstream(Some(self.record.len() as u32 - 1))
    }

    /// Puts `region`, taken for the carry layout of `generation`, in place
    /// and serves `request` at `offset` in it: the address, and a region
    /// to give back (the upstream's or one that came in meanwhile).
    fn carry_taken(
        &mut self,
        region: Option<Region>,
        (generation, offset): (u64, u64),
        request: Request,
        stream: u64,
    ) -> (Option<(u64, u64)>, Option<Region>) {
        let Some(region) = region else {
            self.carry.refused = true;
            return (None, None);
        };
        if self.carry.generation != generation {
            return (None, Some(region));
        }
        let spare = if self.carry.region.is_empty() {
            self.carry.region = region;
            self.carry.region_stream = stream;
            None
        } else {
            Some(region)
        };
        let served = self.carry.serve_at(offset, request);
        self.steps.planned_allocations += u64::from(served.is_some());
        (served, spare)
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
            let Place::Step { slot, .. } = e.place else { continue };
            let live = &mut self.slot_live[slot as usize];
            if *live & !OVERDUE == j + 1 {
                *live |= OVERDUE;
                self.overdue += 1;
            }
        }
    }

    /// Records the free of the recorded step's block at `addr`, if it is
    /// one, and says which it was.
    fn freed(&mut self, addr: u64) -> Option<Freed> {
        let at = self.ops;
        if let Some(k) = self.born.remove(&addr) {
            if self.tick() {
                self.record[k as usize].0.end = at;
            }
            Some(Freed::Born(k))
        } else if let Some(k) = self.carried.remove(&addr) {
            if self.tick() {
                self.carried_frees.push((k, at));
            }
            Some(Freed::Carried(k))
        } else {
            None
        }
    }

    /// Takes back the free of the block at `addr` that
    /// [`freed`](Self::freed) recorded in this step: it is live. Unless a
    /// block was recorded at `addr` meanwhile: the upstream did free this
    /// one (a double free racing this free freed it first, and the
    /// address was handed out again), and the newer block keeps its entry.
    /// Whether it took the free back.
    fn unfree(&mut self, addr: u64, freed: Freed) -> bool {
        if self.born.contains_key(&addr) || self.carried.contains_key(&addr) {
            return false;
        }
        match freed {
            Freed::Born(k) => {
                self.record[k as usize].0.end = OPEN;
                self.born.insert(addr, k);
            }
            Freed::Carried(k) => {
                self.carried_frees.retain(|&(j, _)| j != k);
                self.carried.insert(addr, k);
            }
        }
        true
    }

    /// If `addr` lies in a region: the live block there, or the error for
    /// a free of `addr` with `tag`: [`Error::DoubleFree`] for a stale tag
    /// (the block was freed, and its bytes served again), else
    /// [`Error::UnknownBlock`] where no live block starts at `addr`. A
    /// free with [`Block::NO_TAG`] frees the live block at `addr`.
    fn region_block(&self, addr: u64, tag: u64) -> Option<Result<Found>> {
        let stale = || Err(Error::DoubleFree { addr });
        let unknown = || Err(Error::UnknownBlock { addr });
        if let Some(found) = self.carry.block_at(addr) {
            return Some(match found {
                Some((_, _, _, live)) if tag != Block::NO_TAG && tag != live => stale(),
                Some((offset, _, asked, live)) => Ok(Found::Carried { offset, asked, tag: live }),
                None => unknown(),
            });
        }
        let offset = offset_in(self.region, addr)?;
        // The tag names the allocation, and so the slot; a bare address is
        // searched for among the slots (distinct, ascending).
        let slot = if tag == Block::NO_TAG {
            self.plan.slots.binary_search(&offset).ok()
        } else {
            let k = (tag & ((1 << ENTRY_BITS) - 1)) as usize;
            match self.plan.entries.get(k).map(|e| e.place) {
                Some(Place::Step { slot, .. }) if self.plan.slots.get(slot as usize) == Some(&offset) => {
                    Some(slot as usize)
                }
                _ => None,
            }
        };
        let Some(slot) = slot else { return Some(unknown()) };
        let (live, epoch) = (self.slot_live[slot] & !OVERDUE, self.slot_epoch[slot]);
        if live == 0 {
            return Some(unknown());
        }
        // The live block's allocation and step: another block of its slot,
        // freed already, has another.
        if tag != Block::NO_TAG && tag != step_tag(epoch, u64::from(live) - 1) {
            return Some(stale());
        }
        let request = self.plan.entries[live as usize - 1].request;
        Some(Ok(Found::Step { slot, live, epoch, asked: request.size(), size: request.rounded_size(UNIT) }))
    }

    /// Whether the step that just ended was served from the plan from its
    /// first allocation to its last, and left nothing in the region.
    fn followed_plan(&self) -> bool {
        self.following && self.allocations as usize == self.plan.entries.len() && self.live_count == 0
    }

    /// Begins a step on `stream`: following the plan if there is one and
    /// the region is free, else recorded.
    fn begin(&mut self, stream: u64) {
        // The recorded step's blocks still live are carried into this one.
        let whole = self.recording && self.ops < MAX_STEP_OPS;
        self.carried = if whole { core::mem::take(&mut self.born) } else { BTreeMap::new() };
        self.carried_frees.clear();
        // A free in flight across the boundary is not taken back (`Freeing`).
        self.frees_in_flight = InFlight::default();
        // A region the upstream refused is asked for again once a step.
        self.carry.refused = false;
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

    /// Bytes of the regions held from upstream: the step's, the carry
    /// region and the spares, as [`Planned::held`] counts them (each
    /// region at most `Request::MAX_SIZE`, so they add up; a spare is as
    /// long as the upstream said).
    fn regions_held(&self) -> u64 {
        let spares = self.spares.iter().fold(0, |n: u64, (r, _)| n.saturating_add(r.size()));
        (self.region.size() + self.carry.region.size()).saturating_add(spares)
    }

    /// Whether `region` shares no byte with the regions and spares held.
    fn apart_from_held(&self, region: Region) -> bool {
        let held = [self.region, self.carry.region].into_iter().chain(self.spares.iter().map(|&(r, _)| r));
        held.into_iter().all(|r| apart(r, region))
    }

    /// Puts `plan` in force with a fresh table of live slots.
    fn install(&mut self, plan: Plan) {
        self.slot_live = (0..plan.slots.len()).map(|_| 0).collect();
        self.slot_epoch = (0..plan.slots.len()).map(|_| 0).collect();
        self.plan = plan;
        self.overdue = 0;
    }
}

/// Lays out each step of a repeating workload from the step before it;
/// see the [module](self).
pub struct Planned<R> {
    upstream: R,
    state: Shared<State<R>>,
    /// Bytes of the upstream's blocks handed out as they are (not
    /// regions) and not freed yet: with the regions, what `Planned` holds
    /// from its upstream.
    passed: AtomicU64,
}

impl<R> Planned<R> {
    /// `upstream` with no plan yet: nothing is recorded before the first
    /// [`step`](Self::step).
    pub fn new(upstream: R) -> Self {
        Planned { upstream, state: Shared::new(State::new()), passed: AtomicU64::new(0) }
    }

    /// The upstream.
    pub fn upstream(&self) -> &R {
        &self.upstream
    }

    /// Bytes held from the upstream: the regions (the bytes asked for of
    /// each), those the upstream would not take back (a spare carry
    /// region, or one shorter than asked: see [`release`](Self::release)),
    /// and the upstream's blocks handed out as they are and not freed yet.
    pub fn held(&self) -> u64 {
        // Saturating: the blocks handed out are as long as the upstream
        // says, which may overlap.
        self.state.with(|s| s.regions_held()).saturating_add(self.passed_through())
    }

    /// Bytes of the upstream's blocks handed out as they are (outside the
    /// regions) and not freed yet: counted when handed out, counted off
    /// when the upstream takes a free (never below 0, never past
    /// `u64::MAX`: blocks of the upstream that overlap may add up past it).
    /// A block that did not come through here, freed through here and
    /// taken by the upstream, counts off too; a free the upstream refuses
    /// counts off nothing.
    pub fn passed_through(&self) -> u64 {
        self.passed.load(Ordering::Relaxed)
    }

    /// Gives back, ordered on `stream`, each region no block lives in,
    /// once no block lives in the step's region: the plan goes then, and
    /// the steps after it are recorded and laid out afresh. Gradients
    /// live between steps keep only the carry region, where they stay
    /// until freed (and its layout, for the next plan). A region taken on
    /// another stream goes back only where `stream` can wait for the
    /// whole device ([`Stream::synchronize_device`]); else it stays, with
    /// no plan, for the next step or release. A region that serves
    /// nothing and that the upstream would not take back before (a spare
    /// carry region, or one shorter than asked) is given back too, whatever
    /// lives in the others. Returns the bytes given back, as
    /// [`held`](Self::held) counted them (none of the step's or the carry
    /// region with a block live in the step's region, or while a
    /// [`step`](Self::step) gives regions back or takes them).
    ///
    /// # Errors
    ///
    /// The stream's, or the upstream's: a region it refused is kept, with
    /// no plan, for the next release or step (one whose free panicked is
    /// left to the upstream).
    pub fn release<S: Stream + ?Sized>(&self, stream: &S) -> Result<u64>
    where
        R: MemoryResource<S>,
    {
        let id = stream.id();
        // The regions stop serving before the device is waited for: a block
        // another stream's thread took from one meanwhile would have work
        // queued after the wait, the region going back under it.
        let taken = self.state.with(|s| {
            let step = !s.region.is_empty();
            let carry = !s.carry.region.is_empty() && s.carry.live.is_empty();
            // A live block of the step's region is found by the plan's slots.
            if s.laying_out || s.live_count > 0 || !(step || carry) {
                return None;
            }
            // The plan names places in the regions, and the carry layout
            // its region: none from now on, so that no block is served
            // there. A step's call meanwhile is refused, as while a step
            // lays out.
            s.install(Plan::default());
            s.following = false;
            s.laying_out = true;
            if carry {
                s.carry.lay_out(&[]);
            }
            Some([
                (s.region, s.region_stream, Home::Step, step),
                (s.carry.region, s.carry.region_stream, Home::Carry, carry),
            ])
        });
        let _laying_out = taken.is_some().then(|| LayingOut(&self.state));
        // The device is waited for only where a region is another stream's.
        let elsewhere = taken.iter().flatten().any(|&(_, on, _, goes)| goes && on != id)
            || self.state.with(|s| s.spares.iter().any(|&(spare, on)| !spare.is_empty() && on != id));
        let idle = elsewhere && stream.synchronize_device()?;
        let (spared, refused) = self.give_back_spares(stream, idle);
        let Some(regions) = taken else { return refused.map_or(Ok(spared), Err) };
        let (mut given, mut first) = (spared, refused);
        for (region, on, home, goes) in regions {
            // Another stream's, with the device not waited for: kept, with
            // no plan, for the next step or release.
            if !goes || (on != id && !idle) {
                continue;
            }
            // Kept, serving nothing, if its free fails, for the next
            // release or step to give back.
            match GoingBack::take(&self.state, region, home).free(&self.upstream, stream) {
                Ok(()) => {
                    // Saturating: the spares' bytes are as long as the
                    // upstream said they were.
                    given = given.saturating_add(region.size());
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(given), Err)
    }

    /// What it has done so far.
    pub fn steps(&self) -> Steps {
        self.state.with(|s| Steps { region: s.region.size(), carry_region: s.carry.region.size(), ..s.steps })
    }

    /// Steps each of `layers` (the `planned` layers of one stack) on
    /// `stream`, those after one that fails too: a layer left unstepped
    /// would lay out its next step from one that spanned two, out of step
    /// with the others.
    ///
    /// # Errors
    ///
    /// The first layer's error, and how many layers failed.
    ///
    /// ```
    /// use memres_core::planned::Planned;
    /// use memres_core::testing::BumpUpstream;
    /// let layers = [Planned::new(BumpUpstream::new(256)), Planned::new(BumpUpstream::new(256))];
    /// Planned::step_each(&layers, &())?;
    /// assert!(layers.iter().all(|p| p.steps().steps == 1));
    /// # Ok::<(), (memres_core::Error, usize)>(())
    /// ```
    pub fn step_each<'a, S: Stream + ?Sized>(
        layers: impl IntoIterator<Item = &'a Planned<R>>,
        stream: &S,
    ) -> core::result::Result<(), (Error, usize)>
    where
        R: MemoryResource<S> + 'a,
    {
        let (mut first, mut failed) = (None, 0);
        for p in layers {
            if let Err(e) = p.step(stream) {
                first.get_or_insert(e);
                failed += 1;
            }
        }
        first.map_or(Ok(()), |e| Err((e, failed)))
    }

    /// A region of `size` bytes from upstream; `None` where no request
    /// holds them, the upstream refuses, or its block is shorter than asked
    /// (it goes back: blocks laid out past its size would lie in memory
    /// the upstream did not give; kept as a spare if the upstream will not
    /// take it) or lies over a region or spare held already (an upstream
    /// outside the contract that hands one address out twice: not given
    /// back, as it is in part the one held). A longer block serves as far
    /// as asked.
    fn take_region<S: Stream + ?Sized>(&self, size: u64, stream: &S) -> Option<Region>
    where
        R: MemoryResource<S>,
    {
        let block = self.upstream.allocate(Request::new(size).ok()?, stream).ok()?;
        if block.upstream_range(size).is_err() {
            self.give_back_spare(Region { block, size: block.size() }, stream);
            return None;
        }
        let region = Region { block, size };
        self.state.with(|s| s.apart_from_held(region)).then_some(region)
    }

    /// Gives back `spare`, a region taken on `stream` that serves nothing:
    /// kept among the spares, held, if the upstream refuses it, for the
    /// next step or release to give back.
    fn give_back_spare<S: Stream + ?Sized>(&self, spare: Region, stream: &S)
    where
        R: MemoryResource<S>,
    {
        let _ = GoingBack::spare(&self.state, spare, stream.id()).free(&self.upstream, stream);
    }

    /// Gives back the spares taken on `stream` (every stream's where
    /// `idle`: the device was waited for): the bytes given back, as
    /// [`held`](Self::held) counted them, and the upstream's first error.
    /// A spare it refuses stays one, and so do those after a free that
    /// panics.
    fn give_back_spares<S: Stream + ?Sized>(&self, stream: &S, idle: bool) -> (u64, Option<Error>)
    where
        R: MemoryResource<S>,
    {
        let id = stream.id();
        let spares: Vec<(Region, u64)> = self.state.with(|s| {
            let (going, staying) =
                core::mem::take(&mut s.spares).into_iter().partition(|&(_, on)| on == id || idle);
            s.spares = staying;
            going
        });
        // Each put back if its free fails, or if a free before it panics.
        let going: Vec<GoingBack<'_, R>> =
            spares.into_iter().map(|(region, on)| GoingBack::spare(&self.state, region, on)).collect();
        let (mut given, mut first) = (0u64, None);
        for going in going {
            let size = going.region.size();
            match going.free(&self.upstream, stream) {
                Ok(()) => given = given.saturating_add(size),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        (given, first)
    }

    /// Ends the step in progress and begins the next one on `stream`.
    ///
    /// If the step that ended followed the plan to its end, the plan
    /// stays. If it was recorded (it did not begin by following a plan),
    /// the blocks it carries into the next step get a layout (where nothing
    /// lives in the old one), and if it repeated the step recorded before
    /// it, a new plan is made from it and the region resized to fit, unless
    /// a block in the region is still live; then, and after a step that
    /// left its plan, the next step is recorded to plan from.
    ///
    /// # Errors
    ///
    /// The upstream's, from giving back a region; after one, no plan is in
    /// force and the resource is otherwise as before. A region the
    /// upstream refuses is no error: the steps run from upstream; nor is a
    /// spare it refuses to take back (see [`release`](Self::release)): it
    /// stays held.
    /// [`Error::Reentrant`] while another `step` or a
    /// [`release`](Self::release) gives regions back or takes them (from
    /// an upstream that calls back into this one, or from another thread
    /// at once): refused, and nothing changed.
    pub fn step<S: Stream + ?Sized>(&self, stream: &S) -> Result<()>
    where
        R: MemoryResource<S>,
    {
        let id = stream.id();
        // What the step that ended leaves to do outside the lock: lay out
        // its carried blocks and plan from its record, or give the
        // regions back: the region of a plan that no longer holds would
        // sit idle beside the next step, which runs from upstream.
        let ended = self.state.with(|s| {
            if s.laying_out {
                return Err(Error::Reentrant);
            }
            s.steps.steps += 1;
            let first = !s.stepping;
            s.stepping = true;
            let mut ended = None;
            if first {
            } else if s.followed_plan() && s.stream == id {
                s.steps.followed += 1;
            } else if s.live_count == 0 {
                let record = (s.recording && s.ops < MAX_STEP_OPS).then(|| core::mem::take(&mut s.record));
                // Planned only from a step that repeats the one recorded
                // before it: a loop's first step (lazy setup) and steps of
                // changing shapes are never laid out.
                let asked: Vec<(Request, bool)> =
                    record.as_deref().unwrap_or_default().iter().map(|&(_, r, on)| (r, on)).collect();
                let repeats = record.is_some() && asked == s.previous;
                s.previous = asked;
                // What a repeating step carried into the next one is laid
                // out for the steps after it (`Carry`). The old layout
                // goes once nothing lives in it (its region may serve the
                // new one); until then the plan uses what of it still
                // fits.
                let carried = match &record {
                    Some(r) if repeats => carried_of(r, &s.carried_frees),
                    _ => Vec::new(),
                };
                let carry = (!s.carry.is(&carried) && s.carry.live.is_empty()).then(|| {
                    s.carry.lay_out(&[]);
                    (carried, (s.carry.region, s.carry.region_stream))
                });
                // What the plan is made with: the layout of the next steps.
                let frees = core::mem::take(&mut s.carried_frees);
                let view = match &carry {
                    Some((carried, _)) => (carry::slots_of(carried), frees),
                    None => (s.carry.slots.clone(), frees),
                };
                ended = Some((record.filter(|_| repeats), view, s.region, s.region_stream, carry));
                // Nothing is served from the region until a new plan is in.
                s.install(Plan::default());
                s.laying_out = true;
            }
            // (With a region block live the plan stays, to find it by, and
            // the next step is recorded.)
            s.begin(id);
            Ok(ended)
        })?;
        // Where the step lays out: until the last lock below, however this
        // call ends (an error, or an upstream that panics).
        let _laying_out = ended.is_some().then(|| LayingOut(&self.state));
        // A spare refused again stays held, for the next step or release.
        let _ = self.give_back_spares(stream, false);
        let Some((record, (slots, frees), region, region_stream, carry)) = ended else { return Ok(()) };
        // The old carry region serves the new layout if it is the same or
        // fits it closely; else it goes back, or is kept with no slots
        // where it was used on another stream and the device cannot be
        // waited for.
        let carry = match carry {
            Some((carried, (old, on))) if !old.is_empty() => {
                let need: u64 = carried.iter().map(|&(_, n)| n).sum();
                let close = need <= old.size() && old.size() - need <= old.size() / 8;
                let give_back = if close {
                    false
                } else if on != id {
                    stream.synchronize_device()?
                } else {
                    true
                };
                if give_back {
                    // Kept, with no layout, if its free fails.
                    GoingBack::take(&self.state, old, Home::Carry).free(&self.upstream, stream)?;
                }
                Some(carried)
            }
            other => other.map(|(carried, _)| carried),
        };
        let view = CarryView { slots: &slots, frees: &frees };
        let made = record.as_deref().and_then(|r| Plan::of(r, &view));
        let top = made.as_ref().map_or(0, |(_, top)| *top);
        let fits = !region.is_empty() && top <= region.size();
        // Keep a region that fits and wastes at most an eighth; and any
        // region that fits where it cannot be given back on this stream:
        // its last blocks may still be in use on its own stream, which
        // this call does not have, and the device cannot be waited for.
        let mut keep = fits && region.size() - top <= region.size() / 8;
        let mut made = made;
        let mut idle = false;
        let mut wait_device = || -> Result<bool> {
            idle = idle || stream.synchronize_device().inspect_err(|_| self.lay_out(carry.as_deref()))?;
            Ok(idle)
        };
        let blocked = !keep && !region.is_empty() && region_stream != id;
        let blocked = blocked && !wait_device()?;
        if blocked {
            keep = true;
            if !fits {
                // Held as it is, and no plan while it cannot be replaced.
                made = None;
            }
        }
        // A region kept for the plan that was last used on another stream
        // serves this one only once the device is waited for: frees into
        // it on that stream, its steps' stream then, did not wait.
        let carry_on = self.state.with(|s| (!s.carry.region.is_empty()).then_some(s.carry.region_stream));
        let elsewhere =
            (keep && !region.is_empty() && region_stream != id) || carry_on.is_some_and(|on| on != id);
        let mut moved = made.is_some() && elsewhere;
        if moved && !wait_device()? {
            (made, moved) = (None, false);
        }
        let mut new_region = region;
        if !keep {
            if !region.is_empty() {
                GoingBack::take(&self.state, region, Home::Step)
                    .free(&self.upstream, stream)
                    .inspect_err(|_| self.lay_out(carry.as_deref()))?;
                new_region = Region::EMPTY;
            }
            if top > 0 {
                // Without a region the steps run from upstream, recorded.
                // A step whose blocks together exceed any request is
                // refused as a region the upstream refuses.
                new_region = self.take_region(top, stream).unwrap_or(Region::EMPTY);
            }
        }
        self.lay_out(carry.as_deref());
        self.state.with(|s| {
            s.laying_out = false;
            // The regions' memory is this stream's now: taken on it, or
            // the device waited for where it was another's.
            if new_region != region || moved {
                s.region_stream = id;
            }
            if moved {
                s.carry.region_stream = id;
            }
            s.region = new_region;
            // Either region may be taken from now on.
            if s.at_drop.is_none() && S::at_drop(&mut |_| {}) {
                s.at_drop = Some(crate::chunks::give_back_at_drop::<S, R>);
            }
            match made {
                Some((mut plan, _)) if top == 0 || !new_region.is_empty() => {
                    // Made for the layout that was to be put in; where a
                    // kept region could not take it, nothing goes there.
                    if s.carry.slots != slots {
                        plan.without_carry();
                    }
                    s.install(plan);
                    s.steps.plans += 1;
                    // Allocations that came in meanwhile went upstream: this
                    // step no longer begins as the plan does, and is recorded.
                    if s.allocations == 0 && s.live_count == 0 {
                        s.following = true;
                        s.recording = false;
                    }
                }
                _ => {}
            }
        });
        Ok(())
    }

    /// Puts a new carry layout in, if any: `carried` (allocation index,
    /// rounded size), in the old region if it was kept and fits, else
    /// with none (taken at the first carried allocation). A kept region
    /// that does not fit stays with no slots.
    fn lay_out(&self, carried: Option<&[(u32, u64)]>) {
        let Some(carried) = carried else { return };
        self.state.with(|s| {
            s.carry.lay_out(carried);
            if !s.carry.region.is_empty() && s.carry.size() > s.carry.region.size() {
                s.carry.lay_out(&[]);
            }
        });
    }
}

impl<S: Stream + ?Sized, R: MemoryResource<S>> MemoryResource<S> for Planned<R> {
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        let id = stream.id();
        let (served, epoch) = self.state.with(|s| (s.place(request, id), s.epoch));
        let recorded = match served {
            Served::At(addr, tag) => return Ok(Block::new(addr, request.size(), tag)),
            Served::Upstream(recorded) => recorded,
            Served::TakeCarry { offset, size, generation } => {
                // The first block of the carry region since the layout
                // was made: in the first planned step, after the blocks the
                // step before carried (from upstream) are freed.
                let region = self.take_region(size, stream);
                let (served, spare) =
                    self.state.with(|s| s.carry_taken(region, (generation, offset), request, id));
                // Given back to the carry region if the spare's free panics.
                let served = served.map(|(addr, tag)| Unserved { state: &self.state, addr, tag });
                if let Some(spare) = spare {
                    self.give_back_spare(spare, stream);
                }
                if let Some(served) = served {
                    // Served: the block is the caller's whatever became of
                    // the spare region (taken by a thread beside this one).
                    let (addr, tag) = served.hand_over();
                    return Ok(Block::new(addr, request.size(), tag));
                }
                None
            }
        };
        // Live for no op unless the caller gets the block (on the
        // upstream's error, and on its panic).
        let recorded = recorded.map(|k| Recorded { state: &self.state, k, epoch });
        let block = self.upstream.allocate(request, stream)?;
        // Saturating, as `held` adds: blocks of the upstream that overlap
        // may add up past `u64::MAX`.
        let _ = self
            .passed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| Some(p.saturating_add(block.size())));
        if let Some(recorded) = recorded {
            recorded.born(block.addr());
        }
        Ok(block)
    }

    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        let addr = block.addr();
        let found = self.state.with(|s| match s.region_block(addr, block.tag()) {
            Some(b) => {
                let region_stream = match b {
                    Ok(Found::Carried { .. }) => s.carry.region_stream,
                    _ => s.region_stream,
                };
                Ok((b, s.stream, region_stream))
            }
            // The upstream's block: its free recorded now (see `Freeing`).
            None => Err(s
                .recording
                .then(|| s.freed(addr).map(|freed| (freed, s.epoch, s.frees_in_flight.tell(addr))))),
        });
        let (found, plan_stream, region_stream) = match found {
            Ok(found) => found,
            Err(told) => {
                let recording = told.is_some();
                let freeing = told.flatten().map(|(freed, epoch, number)| Freeing {
                    state: &self.state,
                    addr,
                    freed,
                    epoch,
                    number,
                });
                self.upstream.deallocate(block, stream)?;
                match freeing {
                    Some(freeing) => freeing.made(),
                    // Nothing recorded to free, and the upstream freed the
                    // block: the double of a free in flight, which may yet
                    // be refused and must not bring the block back.
                    // If its refusal settled first and took the free back,
                    // the block is freed now.
                    None if recording => self.state.with(|s| {
                        if s.frees_in_flight.answered(addr, None) {
                            s.freed(addr);
                        }
                    }),
                    None => {}
                }
                // Saturating: a block of the upstream that did not come
                // through here is freed through it too.
                let _ = self.passed.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                    Some(p.saturating_sub(block.size()))
                });
                return Ok(());
            }
        };
        let found = found?;
        let (Found::Step { asked, .. } | Found::Carried { asked, .. }) = found;
        if block.size() != asked {
            return Err(Error::SizeMismatch { addr, expected: asked, given: block.size() });
        }
        let id = stream.id();
        if id != plan_stream || id != region_stream {
            // Its bytes are served again on the step's stream and go back
            // upstream on the region's: a free on that one stream needs no
            // wait, a free on any other is done before either.
            stream.synchronize()?;
        }
        self.state.with(|s| match found {
            Found::Step { slot, live, epoch, size, .. } => {
                let now = s.slot_live.get(slot).copied().unwrap_or(0);
                if now & !OVERDUE != live || s.slot_epoch.get(slot) != Some(&epoch) {
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
            }
            Found::Carried { offset, tag, .. } => {
                // Freed by another thread meanwhile: unknown now, though
                // its place may hold the block served there since.
                if s.carry.block_at(addr).flatten().map(|b| b.0) != Some(offset) || !s.carry.free(offset, tag)
                {
                    return Err(Error::UnknownBlock { addr });
                }
                if s.recording {
                    s.freed(addr);
                }
                Ok(())
            }
        })
    }
}

impl<R: Inspect> Inspect for Planned<R> {
    /// The upstream's figures, with the regions' bytes not in use by a
    /// live block counted free, and all of a spare's (held till the
    /// upstream takes it back, it serves no block); the largest free block
    /// is the upstream's or a region's longest free run.
    fn usage(&self) -> Usage {
        let up = self.upstream.usage();
        let (regions, live_bytes, longest) = self.state.with(|s| {
            // The longest run between live blocks, in each region.
            let run = |size: u64, live: &mut dyn Iterator<Item = (u64, u64)>| {
                let (mut longest, mut at) = (0, 0);
                for (o, n) in live {
                    longest = longest.max(o.saturating_sub(at));
                    at = o + n;
                }
                longest.max(size.saturating_sub(at))
            };
            let c = &s.carry;
            let longest =
                run(s.region.size(), &mut s.live_blocks()).max(run(c.region.size(), &mut c.live_blocks()));
            (s.regions_held(), s.live_bytes + c.live_bytes(), longest)
        });
        let used = up.used.saturating_sub(regions) + live_bytes;
        Usage::new(used, up.held, up.peak_held, up.largest_free.max(longest))
    }

    /// Checks the layer's invariants ([`check_layer`](Planned::check_layer))
    /// and the upstream's.
    ///
    /// # Errors
    ///
    /// The first broken invariant.
    fn check(&self) -> core::result::Result<(), Violation> {
        self.check_layer()?;
        self.upstream.check()
    }
}

impl<R> Planned<R> {
    /// Checks the layer's own invariants, not the upstream's (for an
    /// upstream without a checker, as a built stack's `planned` over the
    /// resources under it, checked each on its own): each region lies
    /// within the block it was taken as, at most [`Request::MAX_SIZE`]
    /// bytes, apart from the other; each spare (a region the upstream
    /// would not take back) within its block, apart from the regions and
    /// the other spares; the plan's tables agree (a slot per
    /// distinct offset, ascending, each step-region entry in the slot of
    /// its offset, every offset within the region, every carried entry in
    /// a slot of its size, the carried slots side by side); the live
    /// blocks of either region lie in it, overlap none other and are
    /// counted as live (blocks, bytes, overdue ones), each in its entry's
    /// slot; a step follows a plan only when there is one, and then is not
    /// recorded. [`passed_through`](Self::passed_through) is not checked:
    /// the layer keeps no list of the blocks it counts (a free of a block
    /// that did not come through here counts off too), so nothing in its
    /// state bounds it; [`held`](Self::held) is the sum of the regions',
    /// the spares' and that count by construction. Run it while no other
    /// thread uses the layer.
    ///
    /// # Errors
    ///
    /// The first broken invariant.
    ///
    /// # Time Complexity
    ///
    /// O(n) in the entries of the plan and the live blocks.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::planned::Planned;
    /// use memres_core::{MemoryResource, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let planned = Planned::new(BumpUpstream::new(1 << 20));
    /// for _ in 0..4 {
    ///     planned.step(&())?;
    ///     let a = planned.allocate(Request::new(1000)?, &())?;
    ///     planned.check_layer().unwrap();
    ///     planned.deallocate(a, &())?;
    /// }
    /// planned.check_layer().unwrap();
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn check_layer(&self) -> core::result::Result<(), Violation> {
        self.state.with(|s| s.check())
    }
}

/// The checks of [`Planned::check_layer`].
impl<R> State<R> {
    fn check(&self) -> core::result::Result<(), Violation> {
        self.check_regions()?;
        self.check_spares()?;
        self.check_plan()?;
        self.check_step_region()?;
        self.check_carry()
    }

    /// Each region within its block, at most one request long, and apart
    /// from the other.
    fn check_regions(&self) -> core::result::Result<(), Violation> {
        for r in [self.region, self.carry.region] {
            if r.size() > r.block.size() || r.size() > Request::MAX_SIZE {
                return Err(Violation::new("a region longer than its block or than a request"));
            }
        }
        if !apart(self.region, self.carry.region) {
            return Err(Violation::new("the step's region and the carry region overlap"));
        }
        Ok(())
    }

    /// Each spare counted within its block (as asked, or as handed out),
    /// apart from the regions and from the other spares: each is a block
    /// of the upstream's that the layer holds, as the regions are.
    fn check_spares(&self) -> core::result::Result<(), Violation> {
        for (i, &(spare, _)) in self.spares.iter().enumerate() {
            if spare.size() > spare.block.size() {
                return Err(Violation::new("a spare longer than its block"));
            }
            let others = self.spares[..i].iter().map(|&(r, _)| r);
            if !others.chain([self.region, self.carry.region]).all(|r| apart(r, spare)) {
                return Err(Violation::new("a spare overlaps a region or another spare"));
            }
        }
        Ok(())
    }

    /// The plan's tables agree with each other, with the step's region and
    /// with the carry layout.
    fn check_plan(&self) -> core::result::Result<(), Violation> {
        let plan = &self.plan;
        if self.slot_live.len() != plan.slots.len() || self.slot_epoch.len() != plan.slots.len() {
            return Err(Violation::new("a table of live slots not one per slot of the plan"));
        }
        if plan.slots.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Violation::new("the plan's slots not ascending"));
        }
        if self.following && (plan.entries.is_empty() || self.recording) {
            return Err(Violation::new("following an empty plan, or recording a step that follows one"));
        }
        let c = &self.carry;
        for e in &plan.entries {
            let size = e.request.rounded_size(UNIT);
            match e.place {
                Place::Step { offset, slot } if plan.slots.get(slot as usize) != Some(&offset) => {
                    return Err(Violation::new("a planned entry in the slot of another offset"));
                }
                Place::Step { offset, .. } if offset + size > self.region.size() => {
                    return Err(Violation::new("a planned offset past the region's end"));
                }
                Place::Carried { slot } if c.slots.get(slot as usize).is_none_or(|&(_, _, n)| n != size) => {
                    return Err(Violation::new("a carried entry without its slot"));
                }
                Place::InCarry { offset } if offset + size > c.size() => {
                    return Err(Violation::new("an offset in the carry region past its layout"));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The live blocks of the step's region: in it, apart, each in its
    /// entry's slot, and counted.
    fn check_step_region(&self) -> core::result::Result<(), Violation> {
        // Each slot's entry first: live_blocks() reads them.
        let mut overdue = 0;
        for (slot, &live) in self.slot_live.iter().enumerate() {
            let Some(e) = (live & !OVERDUE).checked_sub(1).and_then(|k| self.plan.entries.get(k as usize))
            else {
                if live & !OVERDUE != 0 {
                    return Err(Violation::new("a live slot names no entry of the plan"));
                }
                continue;
            };
            if e.place != (Place::Step { offset: self.plan.slots[slot], slot: slot as u32 }) {
                return Err(Violation::new("a live block in another entry's slot"));
            }
            overdue += u32::from(live & OVERDUE != 0);
        }
        let (mut at, mut sum, mut count) = (0, 0, 0);
        for (o, n) in self.live_blocks() {
            if o < at || o + n > self.region.size() {
                return Err(Violation::new("planned blocks overlap or leave the region"));
            }
            at = o + n;
            sum += n;
            count += 1;
        }
        if (sum, count, overdue) != (self.live_bytes, self.live_count, self.overdue) {
            return Err(Violation::new("planned blocks in use miscounted"));
        }
        Ok(())
    }

    /// The carry layout's slots side by side, within its region while it
    /// is held; its live blocks in it, apart, each as long as asked.
    fn check_carry(&self) -> core::result::Result<(), Violation> {
        let c = &self.carry;
        let mut at = 0;
        for &(_, o, n) in &c.slots {
            if o != at {
                return Err(Violation::new("carried slots not side by side"));
            }
            at += n;
        }
        let mut end = 0;
        for (&o, &(n, asked, _)) in &c.live {
            if o < end || o + n > c.region.size() || asked.div_ceil(UNIT) * UNIT != n {
                return Err(Violation::new("blocks in the carry region overlap, leave it or miscount"));
            }
            end = o + n;
        }
        if (!c.live.is_empty() || !c.region.is_empty()) && at > c.region.size() {
            return Err(Violation::new("carried slots past the carry region's end"));
        }
        Ok(())
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

// SAFETY: every block is either one of `R`'s, handed out unchanged and freed
// only through `R::deallocate`, or a range inside a region's first bytes, as
// many as were asked of `R` for it (`take_region` refuses a shorter block): a
// block of `R` that `Planned` holds while any block in it is live (a region goes back, at
// a step, a release or on drop, only when none is; one `step` or `release`
// at a time gives regions back or takes them, `laying_out` refusing any
// other step meanwhile, and a region it may give back serves no block
// meanwhile: the step's region has no plan, the carry region no layout (a
// region taken for the old one meanwhile goes back as a spare, and a spare
// the upstream refuses, in the state's spares, never serves), and each is
// out of the state while it goes back, so that a block of `R` the upstream
// hands out there at once is freed as `R`'s; a release, only with no block
// live in the step's region, drops the plan, and the carry layout only with
// none live in it, before it may give their regions back). A block is
// placed in a region only where no live block lies (in the step's region a
// step departs before a block freed later than recorded could be covered; in
// the carry region each block is checked against the live ones), so live
// blocks never overlap; the records are kept in `Planned`'s own state, never
// in the memory.
unsafe impl<E, R: crate::copy::MemoryOf<E>> crate::copy::MemoryOf<E> for Planned<R> {}

impl<R> Drop for Planned<R> {
    /// Gives each region back on the stream type's drop stream, if it has
    /// one and no block in the region is live (a block someone may still
    /// use is never freed under it), and each spare.
    fn drop(&mut self) {
        let (regions, spares, at_drop) = self.state.with(|s| {
            let regions = [(s.region, s.live_count == 0), (s.carry.region, s.carry.live.is_empty())];
            (regions, core::mem::take(&mut s.spares), s.at_drop)
        });
        let spares = spares.into_iter().map(|(region, _)| (region, true));
        for (region, free) in regions.into_iter().chain(spares) {
            if let (false, Some(give_back), true) = (region.is_empty(), at_drop, free) {
                give_back(&self.upstream, region.block);
            }
        }
    }
}
