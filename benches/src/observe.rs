//! An untimed replay that watches memory, for `--timeline`, `--snapshot`
//! and `--map`.
//!
//! The stack is built by the dynamic builder with its `sim` and `host`
//! leaves tapped ([`Tap`]): what the stack takes from its leaf is a
//! segment of a [`MemoryMap`], what the replay gets from its top (tapped
//! too) a block. So every stack
//! is watched the same way, whatever its algorithm, and free bytes are
//! what lies in the segments outside the live blocks (bytes a layer keeps
//! for itself, such as a fixed-size bin's free slots, count as free).
//!
//! The replay runs once on one thread, each op on the simulated stream of
//! its workload stream (`--streams` does not apply), with no warm-up and
//! no step of a `planned` layer, which so serves from its upstream. The series is sampled
//! in at most [`SAMPLES`] buckets, each with the bucket's most live and
//! most held bytes (so that no peak falls between samples) and the largest
//! free block at its end.

use crate::replay::{held, table, TableOf};
use crate::resources::RunError;
use crate::stack::builder;
use crate::workload::Workload;
use memres_core::snapshot::{MemoryMap, Side, Tap};
use memres_core::stack::{parse, StackError};
use memres_core::{Block, DynResource, MemoryResource, Request, Shared};
use memres_sim::{SimStream, SimWorld};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[cfg(test)]
mod tests;

/// The most samples a series keeps.
pub const SAMPLES: usize = 2000;

/// The most trace events a snapshot keeps (PyTorch's `max_entries`).
pub const TRACE_ENTRIES: usize = 100_000;

/// One sample of a series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The index of the bucket's last op.
    pub op: u64,
    /// The most bytes live (as requested) in the bucket.
    pub live: u64,
    /// The most bytes held from the upstream in the bucket.
    pub held: u64,
    /// The largest free block at the bucket's end.
    pub largest_free: u64,
    /// The trace's time of the bucket's last op, in microseconds, where the
    /// trace has times.
    pub time_us: Option<u64>,
}

/// The op after which the most bytes were held from the upstream (the
/// first, if several).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peak {
    /// Its index.
    pub op: u64,
    /// The bytes held after it.
    pub held: u64,
    /// The bytes live after it.
    pub live: u64,
    /// Its size.
    pub size: u64,
    /// Its allocation's id in the workload.
    pub id: u32,
    /// Whether it was an allocation (a free can make a peak only where a
    /// layer takes memory when it frees, e.g. to keep metadata).
    pub alloc: bool,
}

/// An op that failed: its index and size, and the resource's error.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// Its index.
    pub op: u64,
    /// Its size.
    pub size: u64,
    /// What the resource said.
    pub error: String,
}

/// What one watched replay saw.
#[derive(Clone, Debug)]
pub struct Observation {
    /// The series, in op order.
    pub samples: Vec<Sample>,
    /// The peak of held bytes (`None` when nothing was ever held).
    pub peak: Option<Peak>,
    /// The map when the replay stopped: at the end, at the failed op, or
    /// after the op of [`observe`]'s `stop_after`.
    pub map: MemoryMap,
    /// The op that failed, if one did (the replay stops there).
    pub failure: Option<Failure>,
}

/// Builds `text` with its leaves tapped into `map`, and says how many
/// leaves it tapped.
fn build(
    text: &str,
    map: &Arc<Shared<MemoryMap>>,
    stream: &SimStream,
) -> Result<(DynResource<SimStream>, usize), StackError> {
    let call = parse(text)?;
    let mut b = builder();
    let tapped = Arc::new(AtomicUsize::new(0));
    for name in ["sim", "host"] {
        let leaves = memres_sim::builder::<SimStream>();
        let (map, tapped) = (map.clone(), tapped.clone());
        b.register(name, move |call, cx| {
            let leaf = cx.build_with(&leaves, call)?;
            tapped.fetch_add(1, Ordering::Relaxed);
            Ok(cx.keep(call, Tap::new(leaf, map.clone(), Side::Segments)))
        });
    }
    let built = b.build_call(&call, stream)?;
    Ok((built, tapped.load(Ordering::Relaxed)))
}

/// Replays `workload` through the stack `text`, watched, up to the end,
/// the first failed op or the op `stop_after`.
///
/// # Errors
///
/// [`RunError::Unsupported`] for a stack that does not build, or that has
/// no tapped leaf while it holds blocks (a `vpool`, which maps granules of
/// its own address space); [`RunError::Table`] where the table of handles, or
/// that of the blocks the replay holds at its end (whose frees are then
/// left to the stack's drop), does not fit in the process's memory.
pub fn observe(text: &str, workload: &Workload, stop_after: Option<u64>) -> Result<Observation, RunError> {
    let map = Arc::new(Shared::new(MemoryMap::new(TRACE_ENTRIES)));
    let world = SimWorld::new();
    let (built, tapped) = build(text, &map, &world.default_stream())
        .map_err(|e| RunError::Unsupported(format!("stack `{text}`: {e}")))?;
    let resource = Tap::new(built, map.clone(), Side::Blocks);
    let streams: Vec<SimStream> = (0..workload.streams.max(1)).map(|_| world.stream()).collect();
    let mut handles = table(TableOf::Watched, Block::EMPTY, workload.ids as usize)?;
    let stride = workload.ops.len().div_ceil(SAMPLES).max(1);
    let mut samples = Vec::with_capacity(SAMPLES);
    const EMPTY: Sample = Sample { op: 0, live: 0, held: 0, largest_free: 0, time_us: None };
    let mut bucket = EMPTY;
    // Whether an op ran since the last sample was pushed.
    let mut pending = false;
    let mut peak: Option<Peak> = None;
    let mut failure = None;
    // Where the replay stopped: the ops before it ran.
    let (mut stopped, mut unwatched) = (workload.ops.len(), false);
    for (i, op) in workload.ops.iter().enumerate() {
        let stream = &streams[op.stream as usize];
        let t = workload.times.as_ref().map(|times| times[i]);
        map.with(|m| m.set_time(t));
        let done = if op.alloc {
            Request::new(op.size)
                .and_then(|r| resource.allocate(r, stream))
                .map(|b| handles[op.id as usize] = b)
        } else {
            resource.deallocate(std::mem::replace(&mut handles[op.id as usize], Block::EMPTY), stream)
        };
        if let Err(e) = done {
            failure = Some(Failure { op: i as u64, size: op.size, error: e.to_string() });
            stopped = i;
            break;
        }
        let (live, held) = map.with(|m| (m.live(), m.held()));
        // Blocks live with nothing held come from no tapped leaf; beside a
        // tapped one (a `vpool` beside a `sim`) the map shows them alone.
        if tapped == 0 && live > 0 && held == 0 {
            (stopped, unwatched) = (i + 1, true);
            break;
        }
        if held > peak.map_or(0, |p| p.held) {
            peak = Some(Peak { op: i as u64, held, live, size: op.size, id: op.id, alloc: op.alloc });
        }
        bucket = Sample {
            op: i as u64,
            live: bucket.live.max(live),
            held: bucket.held.max(held),
            time_us: t,
            ..EMPTY
        };
        pending = true;
        if (i + 1) % stride == 0 || i + 1 == workload.ops.len() {
            samples.push(Sample { largest_free: map.with(|m| m.largest_free()), ..bucket });
            (bucket, pending) = (EMPTY, false);
        }
        if stop_after == Some(i as u64) {
            stopped = i + 1;
            break;
        }
    }
    // A replay stopped between two boundaries (a failed op, `stop_after`)
    // keeps its last ops: before a failure is where the peak usually is.
    if pending && !unwatched {
        samples.push(Sample { largest_free: map.with(|m| m.largest_free()), ..bucket });
    }
    let map = map.with(|m| m.clone());
    // The blocks the replay still holds go back before the stack is
    // dropped, so that a `track` layer's leak report names none of them.
    for op in held(&workload.ops, stopped, failure.is_some(), handles.len())? {
        let _ = resource.deallocate(handles[op.id as usize], &streams[op.stream as usize]);
    }
    if unwatched {
        return Err(RunError::Unsupported(format!(
            "stack `{text}` has no sim or host leaf whose allocations can be watched"
        )));
    }
    Ok(Observation { samples, peak, map, failure })
}
