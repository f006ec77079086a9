//! Footprint of the virtual-memory pool on allocation traces.
//!
//! Replays each trace (RMM's replay log, gzipped CSV:
//! `Thread,Time,Action,Pointer,Size,Stream`) through a `VirtualPool` over a
//! simulated address space with 2 MiB granules, for several release
//! thresholds, and prints peak committed bytes / peak live bytes.
//!
//! ```text
//! cargo run --release -p memres-host --example vpool_footprint -- TRACE.csv.gz...
//! ```

use flate2::read::GzDecoder;
use memres_core::vpool::{VirtualConfig, VirtualPool};
use memres_core::{Block, MemoryResourceMut, Request};
use memres_host::SimAddressSpace;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};

const MIB: u64 = 1 << 20;

enum Op {
    Allocate { id: usize, size: u64 },
    Free { id: usize },
}

/// Decodes a trace: each live pointer gets an id; frees of pointers not
/// live are skipped.
fn decode(path: &str) -> std::io::Result<(Vec<Op>, usize, usize)> {
    let file = std::fs::File::open(path)?;
    let mut ops = Vec::new();
    let mut live: HashMap<String, usize> = HashMap::new();
    let (mut ids, mut skipped) = (0, 0);
    for line in BufReader::new(GzDecoder::new(file)).lines().skip(1) {
        let line = line?;
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() < 6 {
            continue;
        }
        let (action, pointer) = (fields[2], fields[3]);
        match action {
            "allocate" => {
                let size: u64 = fields[4].trim().parse().map_err(std::io::Error::other)?;
                // A pointer handed out again without a free: end the old one.
                if let Some(id) = live.remove(pointer) {
                    ops.push(Op::Free { id });
                }
                live.insert(pointer.to_string(), ids);
                ops.push(Op::Allocate { id: ids, size });
                ids += 1;
            }
            "free" => match live.remove(pointer) {
                Some(id) => ops.push(Op::Free { id }),
                None => skipped += 1,
            },
            _ => {}
        }
    }
    // Free what is still live at the end.
    let mut rest: Vec<usize> = live.into_values().collect();
    rest.sort_unstable();
    ops.extend(rest.into_iter().map(|id| Op::Free { id }));
    Ok((ops, ids, skipped))
}

struct Outcome {
    peak_live: u64,
    peak_committed: u64,
    commits: u64,
    decommits: u64,
}

fn replay(ops: &[Op], ids: usize, config: VirtualConfig) -> memres_core::Result<Outcome> {
    let space = SimAddressSpace::new(80 << 30, 2 * MIB);
    let mut pool = VirtualPool::with_config(&space, config)?;
    let mut blocks = vec![Block::EMPTY; ids];
    let (mut live, mut peak_live) = (0u64, 0u64);
    for op in ops {
        match *op {
            Op::Allocate { id, size } => {
                blocks[id] = pool.allocate(Request::new(size)?, &())?;
                live += size;
                peak_live = peak_live.max(live);
            }
            Op::Free { id } => {
                let b = std::mem::replace(&mut blocks[id], Block::EMPTY);
                live -= b.size();
                pool.deallocate(b, &())?;
            }
        }
    }
    assert_eq!(pool.used_bytes(), 0);
    pool.check().map_err(|_| memres_core::Error::InvalidConfig { what: "pool invariant broken" })?;
    let (commits, decommits) = space.call_counts();
    Ok(Outcome { peak_live, peak_committed: pool.peak_committed_bytes(), commits, decommits })
}

fn main() {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        eprintln!("usage: vpool_footprint TRACE.csv.gz...");
        std::process::exit(2);
    }
    println!("| trace | keep | trim on commit | peak live (MiB) | peak committed (MiB) | footprint | commits | decommits |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for path in &paths {
        let (ops, ids, skipped) = decode(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let name =
            std::path::Path::new(path).file_name().map_or(path.clone(), |n| n.to_string_lossy().into_owned());
        if skipped > 0 {
            eprintln!("{name}: skipped {skipped} frees of unknown pointers");
        }
        for (keep, trim) in
            [(0, true), (64 * MIB, true), (256 * MIB, true), (64 * MIB, false), (256 * MIB, false)]
        {
            let config = VirtualConfig::new(64 << 30).keep(keep).trim_on_commit(trim);
            let o = replay(&ops, ids, config).unwrap_or_else(|e| panic!("{name}: {e}"));
            println!(
                "| {name} | {} MiB | {} | {:.1} | {:.1} | {:.4} | {} | {} |",
                keep / MIB,
                if trim { "yes" } else { "no" },
                o.peak_live as f64 / MIB as f64,
                o.peak_committed as f64 / MIB as f64,
                o.peak_committed as f64 / o.peak_live as f64,
                o.commits,
                o.decommits,
            );
        }
    }
}
