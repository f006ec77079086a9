//! The fuzz target of `Planned`: a step decoded from the input, repeated
//! with departures, judged by the live blocks it hands out and by what the
//! spied upstream holds.

use super::Spy;
use arbitrary::{Result as ArbResult, Unstructured};
use memres_core::check::LiveBlocks;
use memres_core::planned::Planned;
use memres_core::{Block, Error, Inspect, MemoryResource, Request};
use std::collections::BTreeMap;

/// One allocation of the step: its request, which earlier allocation of
/// the step it frees after itself (if any), and whether the block lives
/// into the next step.
#[derive(Debug, Clone, Copy)]
struct Slot {
    request: Request,
    frees: Option<usize>,
    carried: bool,
}

fn slot(u: &mut Unstructured<'_>, index: usize) -> ArbResult<Slot> {
    let size = match u.int_in_range(0u8..=3)? {
        0 => u.int_in_range(0..=4096)?,
        1 => u.int_in_range(1..=64u64)? << 12,
        2 => u.int_in_range(1..=16u64)? << 20,
        _ => 256 * u.int_in_range(1..=64)?,
    };
    let align = 1u64 << u.int_in_range(0..=12)?;
    let request = Request::aligned(size, align)
        .or_else(|_| Request::new(size))
        .map_err(|_| arbitrary::Error::IncorrectFormat)?;
    let frees = if index > 0 && u.ratio(1, 2)? { Some(u.int_in_range(0..=index - 1)?) } else { None };
    Ok(Slot { request, frees, carried: u.ratio(1, 5)? })
}

/// The tag a free hands back: mostly the block's own, else none or any.
fn tag_of(u: &mut Unstructured<'_>, block: Block) -> ArbResult<u64> {
    Ok(match u.int_in_range(0u8..=7)? {
        0 => Block::NO_TAG,
        1 => u.arbitrary()?,
        2 => u.int_in_range(0..=32)?,
        _ => block.tag(),
    })
}

/// The first byte of an input that injects faults: the rest decodes as
/// any input does, with the faults' choices among it. (Any other first
/// byte is the input's own, so that the inputs kept before faults were
/// injected mean what they meant.)
pub const FAULTS: u8 = b'!';

/// Fuzz target `planned`: `Planned` over a small simulated device, spied,
/// one decoded step run up to 12 times with `step()` between, some steps
/// departing from it (another size, a missing free, a free too late) and
/// some frees with another tag or with none; after [`FAULTS`], upstream
/// allocations made to fail, frees refused (of blocks and of regions, in a
/// step or a release) and `release()` calls. Every block handed out is
/// aligned and apart from every live one, every failure is the upstream's
/// (out of memory, an injected failure or refused free, or a bad free
/// refused) and changes nothing, and after every call the checker passes
/// and the layer holds what the spy holds: its regions and the blocks it
/// passed through (the device counts those rounded to 256 bytes). At the
/// end nothing is in use, the device holds only the regions (the step's
/// and the carried blocks'), and a release gives them back.
pub fn run_planned(data: &[u8]) {
    let (faults, data) = match data.split_first() {
        Some((&FAULTS, rest)) => (true, rest),
        _ => (false, data),
    };
    let mut u = Unstructured::new(data);
    let _ = run(&mut u, faults);
}

/// The layer, its spied upstream and the books the target keeps.
struct Books {
    planned: Planned<Spy>,
    spy: Spy,
    live: LiveBlocks,
    /// The live blocks the upstream served as they are (not from a
    /// region), by address: their size.
    through: BTreeMap<u64, u64>,
}

impl Books {
    /// The checker passes, and the layer holds what the spy holds.
    fn judge(&self, after: &str) {
        self.planned.check().unwrap_or_else(|v| panic!("checker after {after}: {v}"));
        let s = self.planned.steps();
        let through: u64 = self.through.values().sum();
        let rounding: u64 = self.through.values().map(|&n| n.next_multiple_of(256) - n).sum();
        assert_eq!(self.planned.passed_through(), through, "bytes passed through, after {after}");
        assert_eq!(self.planned.held(), s.region + s.carry_region + through, "held, after {after}");
        assert_eq!(self.planned.held() + rounding, self.spy.usage().held, "the spy's held, after {after}");
    }

    /// What a failed call must leave as it was.
    fn figures(&self) -> (u64, u64, u64, u64) {
        (self.planned.usage().used, self.planned.held(), self.spy.usage().held, self.planned.steps().region)
    }

    /// Allocates `request`: a block recorded as the upstream's unless a
    /// region served it; `None` for a failure, which must be out of memory
    /// or one the spy explains, and change nothing.
    fn allocate(&mut self, request: Request) -> Option<Block> {
        let (before, planned) = (self.figures(), self.planned.steps().planned_allocations);
        self.spy.clear_log();
        let got = match self.planned.allocate(request, &()) {
            Ok(block) => {
                self.live.insert(block, request).expect("aligned and apart from every live block");
                if self.planned.steps().planned_allocations == planned && !block.is_empty() {
                    self.through.insert(block.addr(), block.size());
                }
                Some(block)
            }
            Err(Error::OutOfMemory { .. }) => None,
            Err(e) => {
                super::upstream_explains(&self.spy, &e)
                    .unwrap_or_else(|why| panic!("allocating {request:?}: {e}: {why}"));
                None
            }
        };
        if got.is_none() {
            assert_eq!(self.figures().0, before.0, "a failed allocation changes nothing");
        }
        self.judge("an allocation");
        got
    }

    /// Frees `block` handed back with `tag`: its own, none (a C caller
    /// has none), or any other. With none, the address decides which block
    /// goes; another tag may be refused (by a region, which tells a stale
    /// block by its tag, or by the simulated device), and then nothing
    /// changes and the block's own tag frees it. With `refuse`, the spy
    /// refuses the next free that reaches it; a refused free changes
    /// nothing, and the block is freed again.
    fn free(&mut self, block: Block, tag: u64, refuse: bool) {
        if refuse {
            self.spy.refuse_nth_free(1);
        }
        let before = self.figures();
        let mut freed = self.planned.deallocate(Block::new(block.addr(), block.size(), tag), &());
        loop {
            match freed {
                Ok(()) => break,
                Err(Error::UnknownBlock { .. } | Error::DoubleFree { .. })
                    if tag != block.tag() && tag != Block::NO_TAG => {}
                Err(e) if self.spy.refused_free(&e) => {}
                Err(e) => panic!("freeing {block:?} with tag {tag}: {e}"),
            }
            assert_eq!(self.figures(), before, "a refused free changes nothing");
            self.judge("a refused free");
            freed = self.planned.deallocate(block, &());
        }
        self.live.remove(&block).expect("freed once");
        self.through.remove(&block.addr());
        self.judge("a free");
    }

    /// A bad free (stale, double, or of another size): refused, nothing
    /// changes.
    fn refused(&mut self, block: Block, what: &str) {
        let before = self.figures();
        assert!(self.planned.deallocate(block, &()).is_err(), "{what} of {block:?}");
        assert_eq!(self.figures(), before, "a {what} changes nothing");
        self.judge(what);
    }

    /// Gives back what the layer can: what it holds goes down by what it
    /// says; an error only from a refused free.
    fn release(&mut self) {
        let held = self.planned.held();
        match self.planned.release(&()) {
            Ok(given) => {
                assert_eq!(self.planned.held(), held - given, "a release takes off what it gave back")
            }
            Err(e) => assert!(self.spy.refused_free(&e), "release: {e}"),
        }
        self.judge("a release");
    }

    /// Begins the next step: an error only from a refused free.
    fn step(&mut self) {
        match self.planned.step(&()) {
            Ok(()) => {}
            Err(e) => assert!(self.spy.refused_free(&e), "step: {e}"),
        }
        self.judge("a step");
    }
}

fn run(u: &mut Unstructured<'_>, faults: bool) -> ArbResult<()> {
    let capacity = u.int_in_range(16u64..=256)? << 20;
    let spy = Spy::new(capacity);
    let planned = Planned::new(spy.clone());
    let len = u.int_in_range(1..=24)?;
    let mut script = Vec::with_capacity(len);
    for i in 0..len {
        script.push(slot(u, i)?);
    }
    let mut books = Books { planned, spy, live: LiveBlocks::new(), through: BTreeMap::new() };
    let mut carried: Vec<Block> = Vec::new();
    // A block freed earlier, in this step or an earlier one, with its own
    // tag: its place may have been served again since, to a block of a tag
    // of its own.
    let mut stale: Option<Block> = None;
    // The faults' choices, read only after `FAULTS`.
    let fault = |u: &mut Unstructured<'_>, denominator: u8| -> ArbResult<bool> {
        Ok(faults && u.ratio(1, denominator)?)
    };
    for _ in 0..u.int_in_range(2..=12)? {
        if fault(u, 4)? {
            books.release();
        }
        books.step();
        let stale_again = u.ratio(1, 2)?;
        let depart = u.ratio(1, 4)?;
        let mut blocks: Vec<Option<Block>> = Vec::with_capacity(script.len());
        for (i, s) in script.iter().enumerate() {
            let request = if depart && u.ratio(1, 6)? {
                Request::new(s.request.size() + 256).expect("small")
            } else {
                s.request
            };
            if fault(u, 12)? {
                // The upstream's next allocation, or one after it, fails:
                // this block's, a later one's, or a region's.
                books.spy.fail_nth(u.int_in_range(1..=3)?);
            }
            blocks.push(books.allocate(request));
            if fault(u, 16)? {
                books.release();
            }
            if let Some(b) = stale.filter(|_| stale_again) {
                // Freed again, its place served again since or not:
                // refused by its tag, nothing changes.
                books.refused(b, "stale free");
            }
            if i == 0 && !(depart && u.ratio(1, 2)?) {
                for b in carried.drain(..) {
                    let refuse = fault(u, 8)?;
                    books.free(b, b.tag(), refuse);
                    stale = Some(b);
                }
            }
            if let Some(b) = s.frees.and_then(|j| blocks[j].take()) {
                if depart && u.ratio(1, 4)? {
                    blocks[s.frees.unwrap_or(0)] = Some(b); // freed late, at the end
                } else {
                    let tag = tag_of(u, b)?;
                    let refuse = fault(u, 8)?;
                    books.free(b, tag, refuse);
                    if !b.is_empty() && u.ratio(1, 8)? {
                        // A double free: refused, nothing changes (freeing
                        // the empty block of a 0-byte request is a no-op).
                        books.refused(b, "double free");
                    }
                    if !b.is_empty() && u.ratio(1, 4)? {
                        // Freed again later in this step, after its place
                        // may have been served again.
                        stale = Some(b);
                    }
                }
            }
        }
        for b in carried.drain(..) {
            let tag = tag_of(u, b)?;
            let refuse = fault(u, 8)?;
            books.free(b, tag, refuse);
        }
        for (i, b) in blocks.into_iter().enumerate() {
            let Some(b) = b else { continue };
            if script[i].carried && !b.is_empty() {
                carried.push(b);
            } else {
                if !b.is_empty() && u.ratio(1, 8)? {
                    // A free with another size: refused, nothing changes.
                    books.refused(Block::new(b.addr(), b.size() + 4096, b.tag()), "wrong-size free");
                }
                let tag = tag_of(u, b)?;
                let refuse = fault(u, 8)?;
                books.free(b, tag, refuse);
                if !b.is_empty() && u.ratio(1, 4)? {
                    stale = Some(b);
                }
            }
        }
    }
    for b in carried.drain(..) {
        books.free(b, b.tag(), false);
    }
    assert_eq!(books.planned.usage().used, 0, "nothing in use");
    let steps = books.planned.steps();
    assert_eq!(
        books.spy.usage().held,
        steps.region + steps.carry_region,
        "the device holds only the regions"
    );
    // A refusal left armed takes one release.
    books.spy.refuse_nth_free(0);
    books.release();
    assert_eq!(books.spy.usage().held, 0, "a release gives every region back");
    Ok(())
}
