//! The fuzz target of `Planned`: a step decoded from the input, repeated
//! with departures, judged by the live blocks it hands out.

use arbitrary::{Result as ArbResult, Unstructured};
use memres_core::check::LiveBlocks;
use memres_core::planned::Planned;
use memres_core::{Block, Error, Inspect, MemoryResource, Request};
use memres_sim::SimDevice;
use std::sync::Arc;

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

/// Fuzz target `planned`: `Planned` over a small simulated device, one
/// decoded step run up to 12 times with `step()` between, some steps
/// departing from it (another size, a missing free, a free too late) and
/// some frees with another tag or with none. Every block
/// handed out is aligned and apart from every live one, every failure is
/// the upstream's out of memory (or a bad free refused) and changes
/// nothing, the checker passes after every call, and
/// at the end nothing is in use and the device holds only the regions
/// (the step's and the carried blocks').
pub fn run_planned(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let _ = run(&mut u);
}

fn run(u: &mut Unstructured<'_>) -> ArbResult<()> {
    let capacity = u.int_in_range(16u64..=256)? << 20;
    let device = Arc::new(SimDevice::new(capacity));
    let planned = Planned::new(Arc::clone(&device));
    let len = u.int_in_range(1..=24)?;
    let mut script = Vec::with_capacity(len);
    for i in 0..len {
        script.push(slot(u, i)?);
    }
    let mut live = LiveBlocks::new();
    let mut carried: Vec<Block> = Vec::new();
    // A block freed earlier, in this step or an earlier one, with its own
    // tag: its place may have been served again since, to a block of a tag
    // of its own.
    let mut stale: Option<Block> = None;
    // Frees `block` handed back with `tag`: its own, none (a C caller
    // has none), or any other. With none, the address decides which block
    // goes; another tag may be refused (by a region, which tells a stale
    // block by its tag, or by the simulated device), and then nothing
    // changes and the block's own tag frees it.
    let free = |live: &mut LiveBlocks, block: Block, tag: u64| {
        let used = planned.usage().used;
        match planned.deallocate(Block::new(block.addr(), block.size(), tag), &()) {
            Ok(()) => {}
            Err(Error::UnknownBlock { .. } | Error::DoubleFree { .. })
                if tag != block.tag() && tag != Block::NO_TAG =>
            {
                assert_eq!(planned.usage().used, used, "a refused free changes nothing");
                planned.deallocate(block, &()).expect("a live block is freed with its own tag");
            }
            Err(e) => panic!("freeing {block:?} with tag {tag}: {e}"),
        }
        live.remove(&block).expect("freed once");
        planned.check().expect("checker after a free");
    };
    for _ in 0..u.int_in_range(2..=12)? {
        planned.step(&()).expect("the simulated device takes and gives back regions");
        planned.check().expect("checker after a step");
        let stale_again = u.ratio(1, 2)?;
        let depart = u.ratio(1, 4)?;
        let mut blocks: Vec<Option<Block>> = Vec::with_capacity(script.len());
        for (i, s) in script.iter().enumerate() {
            let request = if depart && u.ratio(1, 6)? {
                Request::new(s.request.size() + 256).expect("small")
            } else {
                s.request
            };
            let used = planned.usage().used;
            match planned.allocate(request, &()) {
                Ok(block) => {
                    live.insert(block, request).expect("aligned and apart from every live block");
                    blocks.push(Some(block));
                }
                Err(Error::OutOfMemory { .. }) => {
                    assert_eq!(planned.usage().used, used, "a failed allocation changes nothing");
                    blocks.push(None);
                }
                Err(e) => panic!("allocating {request:?}: {e}"),
            }
            planned.check().expect("checker after an allocation");
            if let Some(b) = stale.filter(|_| stale_again) {
                // Freed again, its place served again since or not:
                // refused by its tag, nothing changes.
                let used = planned.usage().used;
                assert!(planned.deallocate(b, &()).is_err(), "stale free of {b:?}");
                assert_eq!(planned.usage().used, used);
                planned.check().expect("checker after a stale free");
            }
            if i == 0 && !(depart && u.ratio(1, 2)?) {
                for b in carried.drain(..) {
                    free(&mut live, b, b.tag());
                    stale = Some(b);
                }
            }
            if let Some(b) = s.frees.and_then(|j| blocks[j].take()) {
                if depart && u.ratio(1, 4)? {
                    blocks[s.frees.unwrap_or(0)] = Some(b); // freed late, at the end
                } else {
                    free(&mut live, b, tag_of(u, b)?);
                    if !b.is_empty() && u.ratio(1, 8)? {
                        // A double free: refused, nothing changes (freeing
                        // the empty block of a 0-byte request is a no-op).
                        let used = planned.usage().used;
                        assert!(planned.deallocate(b, &()).is_err(), "double free of {b:?}");
                        assert_eq!(planned.usage().used, used);
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
            free(&mut live, b, tag_of(u, b)?);
        }
        for (i, b) in blocks.into_iter().enumerate() {
            let Some(b) = b else { continue };
            if script[i].carried && !b.is_empty() {
                carried.push(b);
            } else {
                if !b.is_empty() && u.ratio(1, 8)? {
                    // A free with another size: refused, nothing changes.
                    let wrong = Block::new(b.addr(), b.size() + 4096, b.tag());
                    let used = planned.usage().used;
                    assert!(planned.deallocate(wrong, &()).is_err(), "wrong-size free of {b:?}");
                    assert_eq!(planned.usage().used, used);
                }
                free(&mut live, b, tag_of(u, b)?);
                if !b.is_empty() && u.ratio(1, 4)? {
                    stale = Some(b);
                }
            }
        }
    }
    for b in carried.drain(..) {
        free(&mut live, b, b.tag());
    }
    assert_eq!(planned.usage().used, 0, "nothing in use");
    let steps = planned.steps();
    assert_eq!(device.usage().held, steps.region + steps.carry_region, "the device holds only the regions");
    Ok(())
}
