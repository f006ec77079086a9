//! Footprint of the virtual-memory pool on allocation traces.
//!
//! Replays each trace (RMM's replay log, gzipped CSV:
//! `Thread,Time,Action,Pointer,Size,Stream`) twice on one `VirtualPool` over
//! a simulated address space with 2 MiB granules, for several release
//! thresholds and slacks, and prints peak committed bytes / peak live bytes,
//! and per pass the pool's commit and decommit calls and the maps and unmaps
//! of physical handles that the CUDA space would make for them (handles of
//! up to 32 granules, or `--handle-granules N`; a handle stays mapped, and
//! holds its memory, until its last granule is decommitted, so "mapped /
//! live" is the footprint on a GPU). The second pass is the steady state
//! that `vpool_replay` times on a GPU; its maps there matched these.
//!
//! ```text
//! cargo run --release -p memres-sim --example vpool_footprint -- [--handle-granules N] TRACE.csv.gz...
//! ```

use flate2::read::GzDecoder;
use memres_core::vmem::ReservableSpace;
use memres_core::vpool::{VirtualConfig, VirtualPool};
use memres_core::Inspect;
use memres_core::{Block, MemoryResourceMut, Range, Request, Stream};
use memres_sim::SimAddressSpace;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::time::Instant;

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

/// Counts the calls a pool makes, and the handles the CUDA space would map
/// and unmap for them: it maps each fresh run in handles of at most
/// `handle_granules` granules, keeps a handle mapped while any of its
/// granules is committed (a decommitted granule of it is *retained*, and
/// committing it again costs no driver call), and unmaps a handle when its
/// last granule is decommitted.
struct Counted<'a> {
    space: &'a SimAddressSpace,
    handle_granules: u64,
    commits: Cell<u64>,
    handles: Cell<u64>,
    decommits: Cell<u64>,
    unmaps: Cell<u64>,
    /// Granules mapped (committed or retained) now, and their peak.
    mapped: Cell<u64>,
    peak_mapped: Cell<u64>,
    /// Mapped handles by first granule: (granules, committed-granule mask).
    mappings: RefCell<BTreeMap<u64, (u64, u64)>>,
}

impl Counted<'_> {
    fn new(space: &SimAddressSpace, handle_granules: u64) -> Counted<'_> {
        Counted {
            space,
            handle_granules,
            commits: Cell::new(0),
            handles: Cell::new(0),
            decommits: Cell::new(0),
            unmaps: Cell::new(0),
            mapped: Cell::new(0),
            peak_mapped: Cell::new(0),
            mappings: RefCell::new(BTreeMap::new()),
        }
    }

    /// The mapping holding granule `g`, if any.
    fn mapping_of(m: &BTreeMap<u64, (u64, u64)>, g: u64) -> Option<u64> {
        m.range(..=g).next_back().filter(|(&s, &(len, _))| g < s + len).map(|(&s, _)| s)
    }
}

/// The CUDA space's default handle size, in granules.
const DEFAULT_HANDLE_GRANULES: u64 = 32;

impl ReservableSpace for Counted<'_> {
    fn granule(&self) -> u64 {
        self.space.granule()
    }
    fn reserve(&self, len: u64) -> memres_core::Result<Range> {
        self.space.reserve(len)
    }
    fn release(&self, range: Range) -> memres_core::Result<()> {
        self.space.release(range)
    }
    fn commit(&self, range: Range) -> memres_core::Result<()> {
        self.space.commit(range)?;
        self.commits.set(self.commits.get() + 1);
        let gs = self.space.granule();
        let (lo, hi) = (range.start() / gs, range.end() / gs);
        let mut m = self.mappings.borrow_mut();
        let mut g = lo;
        while g < hi {
            if let Some(s) = Self::mapping_of(&m, g) {
                m.get_mut(&s).expect("found").1 |= 1 << (g - s);
                g += 1;
                continue;
            }
            // A fresh run up to the next mapping or the range's end.
            let end = m.range(g..hi).next().map_or(hi, |(&s, _)| s);
            let mut s = g;
            while s < end {
                let len = (end - s).min(self.handle_granules);
                m.insert(s, (len, u64::MAX >> (64 - len)));
                self.handles.set(self.handles.get() + 1);
                self.mapped.set(self.mapped.get() + len);
                self.peak_mapped.set(self.peak_mapped.get().max(self.mapped.get()));
                s += len;
            }
            g = end;
        }
        Ok(())
    }
    fn decommit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> memres_core::Result<()> {
        self.space.decommit(range, stream)?;
        self.decommits.set(self.decommits.get() + 1);
        let gs = self.space.granule();
        let mut m = self.mappings.borrow_mut();
        for g in range.start() / gs..range.end() / gs {
            let s = Self::mapping_of(&m, g).expect("a committed granule is mapped");
            let e = m.get_mut(&s).expect("found");
            e.1 &= !(1 << (g - s));
            if e.1 == 0 {
                self.mapped.set(self.mapped.get() - e.0);
                m.remove(&s);
                self.unmaps.set(self.unmaps.get() + 1);
            }
        }
        Ok(())
    }
}

struct Pass {
    commits: u64,
    handles: u64,
    decommits: u64,
    unmaps: u64,
    ns_per_op: f64,
}

struct Outcome {
    peak_live: u64,
    peak_busy: u64,
    peak_committed: u64,
    peak_mapped: u64,
    passes: Vec<Pass>,
}

/// Replays `ops` `passes` times on one pool; per pass, the calls it made
/// to the space and the pool's time per operation. With `busy`, also the
/// most bytes of granules that live blocks touched at once, counted after
/// every call (which the times then include): the pool itself learns it
/// only when it searches for Idle granules.
fn replay(
    ops: &[Op],
    ids: usize,
    config: VirtualConfig,
    handle_granules: u64,
    passes: usize,
    busy: bool,
) -> memres_core::Result<Outcome> {
    let sim = SimAddressSpace::new(80 << 30, 2 * MIB);
    let space = Counted::new(&sim, handle_granules);
    let mut pool = VirtualPool::with_config(&space, config)?;
    let mut blocks = vec![Block::EMPTY; ids];
    let (mut live, mut peak_live, mut peak_busy) = (0u64, 0u64, 0u64);
    let mut out = Vec::new();
    for _ in 0..passes {
        let before = (space.commits.get(), space.handles.get(), space.decommits.get(), space.unmaps.get());
        let t = Instant::now();
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
            if busy {
                peak_busy = peak_busy.max(pool.usage().held - pool.idle_bytes());
            }
        }
        let ns = t.elapsed().as_nanos() as f64;
        assert_eq!(pool.usage().used, 0);
        pool.check().map_err(|_| memres_core::Error::InvalidConfig { what: "pool invariant broken" })?;
        out.push(Pass {
            commits: space.commits.get() - before.0,
            handles: space.handles.get() - before.1,
            decommits: space.decommits.get() - before.2,
            unmaps: space.unmaps.get() - before.3,
            ns_per_op: ns / ops.len() as f64,
        });
    }
    Ok(Outcome {
        peak_live,
        peak_busy: peak_busy.max(pool.peak_busy_bytes()),
        peak_committed: pool.usage().peak_held,
        peak_mapped: space.peak_mapped.get() * sim.granule(),
        passes: out,
    })
}

fn main() {
    let mut handle_granules = DEFAULT_HANDLE_GRANULES;
    let mut paths = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--handle-granules" {
            handle_granules =
                args.next().and_then(|v| v.parse().ok()).filter(|&n| (1..=64).contains(&n)).unwrap_or_else(
                    || {
                        eprintln!("--handle-granules needs a number from 1 to 64");
                        std::process::exit(2);
                    },
                );
        } else {
            paths.push(a);
        }
    }
    if paths.is_empty() {
        eprintln!("usage: vpool_footprint [--handle-granules N] TRACE.csv.gz...");
        std::process::exit(2);
    }
    println!(
        "| trace | keep | trim on commit | slack (‰) | peak live (MiB) | peak busy (MiB) | peak committed (MiB) \
         | footprint | mapped / live | commits (maps) pass 1 | commits (maps) pass 2 | decommits (unmaps) pass 2 | pass 2 ns/op |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for path in &paths {
        let (ops, ids, skipped) = decode(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let name =
            std::path::Path::new(path).file_name().map_or(path.clone(), |n| n.to_string_lossy().into_owned());
        if skipped > 0 {
            eprintln!("{name}: skipped {skipped} frees of unknown pointers");
        }
        let all = u64::MAX;
        let mut policies = vec![(0, true, 0), (256 * MIB, true, 0), (256 * MIB, false, 0), (all, false, 0)];
        for slack in [0, 10, 20, 30, 40, 50] {
            policies.push((all, true, slack));
        }
        policies.push((256 * MIB, true, 40));
        for (keep, trim, slack) in policies {
            let config = VirtualConfig::new(64 << 30)
                .release_threshold(keep)
                .trim_on_commit(trim)
                .slack_permille(slack);
            let run = |busy| {
                replay(&ops, ids, config, handle_granules, 2, busy).unwrap_or_else(|e| panic!("{name}: {e}"))
            };
            // The pool is deterministic: a second run, counting, places the
            // same blocks.
            let o = Outcome { peak_busy: run(true).peak_busy, ..run(false) };
            let mib = |b: u64| b as f64 / MIB as f64;
            println!(
                "| {name} | {} | {} | {slack} | {:.1} | {:.1} | {:.1} | {:.4} | {:.4} | {} ({}) | {} ({}) | {} ({}) | {:.0} |",
                if keep == all { "all".to_string() } else { format!("{} MiB", keep / MIB) },
                if trim { "yes" } else { "no" },
                mib(o.peak_live),
                mib(o.peak_busy),
                mib(o.peak_committed),
                o.peak_committed as f64 / o.peak_live as f64,
                o.peak_mapped as f64 / o.peak_live as f64,
                o.passes[0].commits,
                o.passes[0].handles,
                o.passes[1].commits,
                o.passes[1].handles,
                o.passes[1].decommits,
                o.passes[1].unmaps,
                o.passes[1].ns_per_op,
            );
        }
    }
}
