//! Replays allocation traces (`Thread,Time,Action,Pointer,Size,Stream` CSV,
//! gzipped or not) through a `VirtualPool` over `CudaVirtualSpace`: one
//! warm-up pass, then a timed pass on the same pool, and prints time per
//! operation, peak live bytes, peak committed and mapped bytes, and the
//! footprint (peak mapped / peak live).
//!
//! ```text
//! vpool_replay [--keep BYTES|all] [--slack PERMILLE] [--handle-granules N] [--large-handles]
//!              [--no-trim] [--planned] [TRACE.csv[.gz]...]
//! ```
//!
//! Without traces it replays the `*.csv.gz` files of `traces/`,
//! `../traces/` or `benches/data/`, the first of them that has any; without
//! a GPU it says SKIPPED.
//!
//! `--keep` is the pool's release threshold (default `all`: every committed
//! granule is kept, and only `--slack` bounds it). `--slack` lets committed
//! memory exceed the peak of bytes in use by that many thousandths before
//! an allocation decommits kept memory (default 40; 0 with `--keep 0` or a
//! small keep is the old behaviour). See `VirtualConfig::slack_permille`.
//! The trace is read as `memres replay` reads it (`load_trace`): frees of
//! pointers it never allocated are skipped, and blocks it leaves live are
//! freed at the end of each pass.
//!
//! `--planned` puts a `Planned` layer over the pool and makes each pass a
//! step (`step()` before it), with three warm-up passes: the second
//! repeats the first, so the third is laid out from it (and takes the
//! regions), and the timed pass is a steady step.
//!
//! `--large-handles` maps a long fresh run in larger handles
//! (`CudaVirtualSpace::with_large_handles`). The first pass, from nothing,
//! maps everything: its maps and time per operation are what new peaks
//! cost.

use memres_bench::workload::{load_trace, Op};
use memres_core::planned::Planned;
use memres_core::vpool::{VirtualConfig, VirtualPool};
use memres_core::Inspect;
use memres_core::{Block, MemoryResource, MemoryResourceMut, Request, Shared, Stream};
use memres_cuda::{CudaStream, CudaVirtualSpace, Device};
use std::time::Instant;

/// The pool as replayed: alone, or under `Planned` (a step per pass).
enum Replayed<'a> {
    Pool(Box<VirtualPool<&'a CudaVirtualSpace>>),
    Planned(Box<Planned<Shared<VirtualPool<&'a CudaVirtualSpace>>>>),
}

impl Replayed<'_> {
    fn allocate(&mut self, request: Request, stream: &CudaStream) -> Result<Block, memres_core::Error> {
        match self {
            Replayed::Pool(p) => p.allocate(request, stream),
            Replayed::Planned(p) => p.allocate(request, stream),
        }
    }

    fn deallocate(&mut self, block: Block, stream: &CudaStream) -> Result<(), memres_core::Error> {
        match self {
            Replayed::Pool(p) => p.deallocate(block, stream),
            Replayed::Planned(p) => p.deallocate(block, stream),
        }
    }

    /// The pool's bytes committed at its peak.
    fn peak_committed(&self) -> u64 {
        match self {
            Replayed::Pool(p) => p.usage().peak_held,
            Replayed::Planned(p) => p.upstream().with(|p| p.usage().peak_held),
        }
    }
}

/// One pass (a step, under `Planned`); returns the nanoseconds it took.
/// Every block it allocates, it frees.
fn pass(
    pool: &mut Replayed<'_>,
    stream: &CudaStream,
    ops: &[Op],
    live: &mut [Block],
) -> Result<f64, memres_core::Error> {
    if let Replayed::Planned(p) = pool {
        p.step(stream)?;
    }
    let t = Instant::now();
    for op in ops {
        let id = op.id as usize;
        if op.alloc {
            live[id] = pool.allocate(Request::new(op.size)?, stream)?;
        } else {
            pool.deallocate(std::mem::replace(&mut live[id], Block::EMPTY), stream)?;
        }
    }
    Ok(t.elapsed().as_nanos() as f64)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut keep: u64 = u64::MAX;
    let mut handle_granules = CudaVirtualSpace::DEFAULT_HANDLE_GRANULES;
    let mut trim = true;
    let mut slack = 40;
    let mut planned = false;
    let mut large_handles = false;
    let mut traces = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--keep" => {
                let v = args.next().ok_or("--keep needs a value")?;
                keep = if v == "all" { u64::MAX } else { v.parse()? };
            }
            "--handle-granules" => {
                handle_granules = args.next().ok_or("--handle-granules needs a value")?.parse()?
            }
            "--no-trim" => trim = false,
            "--large-handles" => large_handles = true,
            "--planned" => planned = true,
            "--slack" => slack = args.next().ok_or("--slack needs a value")?.parse()?,
            _ if a.ends_with(".csv") || a.ends_with(".csv.gz") => traces.push(a),
            // Arguments meant for test binaries run beside this one.
            _ => eprintln!("vpool_replay: ignoring argument {a:?}"),
        }
    }
    if traces.is_empty() {
        // The traces beside the binary, or the repository's.
        for dir in ["traces", "../traces", "benches/data"] {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            let mut found: Vec<String> = entries
                .filter_map(|e| e.ok().map(|e| e.path().to_string_lossy().into_owned()))
                .filter(|p| p.ends_with(".csv.gz"))
                .collect();
            found.sort();
            traces = found;
            if !traces.is_empty() {
                break;
            }
        }
    }
    if traces.is_empty() {
        eprintln!("SKIPPED vpool_replay: no trace given or found (traces/, ../traces/, benches/data/)");
        eprintln!(
            "usage: vpool_replay [--keep BYTES|all] [--slack PERMILLE] [--handle-granules N] [--large-handles] \
             [--no-trim] [--planned] TRACE.csv[.gz]..."
        );
        return Ok(());
    }
    let device = match memres_cuda::Device::count() {
        Ok(n) if n > 0 => Device::get(0)?,
        other => {
            eprintln!("SKIPPED vpool_replay: no CUDA device ({other:?})");
            return Ok(());
        }
    };
    let stream = CudaStream::new(device)?;
    for path in &traces {
        let trace = load_trace(path.as_ref())?;
        let (ops, peak) = (&trace.ops, trace.peak_live);
        let space = CudaVirtualSpace::with_handle_granules(device, handle_granules)?
            .with_large_handles(large_handles);
        let config =
            VirtualConfig::new(64 << 30).release_threshold(keep).trim_on_commit(trim).slack_permille(slack);
        let pool = VirtualPool::with_config(&space, config)?;
        let mut pool = if planned {
            Replayed::Planned(Box::new(Planned::new(Shared::new(pool))))
        } else {
            Replayed::Pool(Box::new(pool))
        };
        let mut live = vec![Block::EMPTY; trace.ids as usize];
        let mut first_pass = None;
        for _ in 0..if planned { 3 } else { 1 } {
            let ns = pass(&mut pool, &stream, ops, &mut live)?;
            first_pass.get_or_insert((space.driver_calls().maps, ns / ops.len() as f64));
        }
        let warm = space.driver_calls();
        let ns = pass(&mut pool, &stream, ops, &mut live)?;
        let timed = space.driver_calls();
        stream.synchronize()?;
        let name = path.rsplit('/').next().unwrap_or(path);
        println!(
            "trace={name} ops={} release_threshold={} handle_granules={handle_granules} \
             large_handles={large_handles} trim_on_commit={trim} slack={slack} planned={planned} \
             ns_per_op={:.1} peak_live={peak} peak_committed={} peak_mapped={} footprint={:.3} \
             committed_over_live={:.3} timed_pass_maps={} timed_pass_unmaps={} timed_pass_syncs={} \
             timed_pass_reuses={} timed_pass_memory_infos={} first_pass_maps={} first_pass_ns_per_op={:.1}",
            ops.len(),
            if keep == u64::MAX { "all".to_string() } else { keep.to_string() },
            ns / ops.len() as f64,
            pool.peak_committed(),
            space.peak_mapped_bytes(),
            space.peak_mapped_bytes() as f64 / peak as f64,
            pool.peak_committed() as f64 / peak as f64,
            timed.maps - warm.maps,
            timed.unmaps - warm.unmaps,
            timed.syncs - warm.syncs,
            timed.reuses - warm.reuses,
            timed.memory_infos - warm.memory_infos,
            first_pass.map_or(0, |f| f.0),
            first_pass.map_or(0.0, |f| f.1),
        );
    }
    Ok(())
}
