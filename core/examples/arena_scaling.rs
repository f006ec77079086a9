//! How the arena scales with threads: runs one allocation workload on 1, 2,
//! ... threads at once (each thread the whole workload, on a stream of its
//! own or on the default stream; or, as a control that shares nothing, each
//! thread with a resource of its own) and prints ns per operation, aggregate
//! (wall time / all operations of all threads), and the speed-up over one
//! thread.
//!
//! ```text
//! cargo run -p memres-core --release --features std --example arena_scaling -- \
//!     [random:N:MAXBYTES:SEED] [threads,threads,...] [stream|default|separate] [repeats]
//! ```
//!
//! The workload is the baseline harness's: `random:100000:1048576:42` makes
//! 100000 allocations of uniform sizes 1 B..1 MiB, each step an allocation or
//! a free of a random live block with equal odds, live bytes capped at
//! 8 GiB, then frees what is left. The upstream hands out numbers, so only
//! the arena's own work is timed. Thread counts take turns for `repeats`
//! rounds and the best run of each is printed with the median, since other
//! processes share the machine.

use memres_core::arena::{ArenaConfig, ArenaResource};
use memres_core::testing::{BumpUpstream, SplitMix64};
use memres_core::{Block, MemoryResource, Request, Result, Stream};
use std::sync::Barrier;
use std::time::Instant;

#[derive(Clone, Copy)]
struct Op {
    alloc: bool,
    id: u32,
    size: u64,
}

fn workload(spec: &str) -> Vec<Op> {
    let f: Vec<u64> = spec
        .trim_start_matches("random:")
        .split(':')
        .map(|x| x.parse().expect("random:N:MAX:SEED"))
        .collect();
    let (n, max, seed, cap) = (f[0], f[1], f[2], 8u64 << 30);
    let mut rng = SplitMix64::new(seed);
    let (mut ops, mut live, mut live_bytes, mut next) = (Vec::new(), Vec::<(u32, u64)>::new(), 0u64, 0u32);
    while u64::from(next) < n {
        let mut alloc = live.is_empty() || rng.next_u64() % 2 == 0;
        let size = 1 + rng.next_u64() % max;
        if alloc && live_bytes + size > cap {
            alloc = false;
        }
        if alloc {
            ops.push(Op { alloc, id: next, size });
            live.push((next, size));
            live_bytes += size;
            next += 1;
        } else {
            let i = (rng.next_u64() % live.len() as u64) as usize;
            let (id, size) = live.swap_remove(i);
            ops.push(Op { alloc, id, size });
            live_bytes -= size;
        }
    }
    ops.extend(live.into_iter().map(|(id, size)| Op { alloc: false, id, size }));
    ops
}

/// A stream that is only an id (0: the default stream).
struct Id(u64);

impl Stream for Id {
    type Event = ();
    fn id(&self) -> u64 {
        self.0
    }
    fn record(&self) -> Result<()> {
        Ok(())
    }
    fn wait(&self, _: &()) -> Result<()> {
        Ok(())
    }
    fn query(&self, _: &()) -> Result<bool> {
        Ok(true)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

fn replay(
    arena: &ArenaResource<BumpUpstream>,
    ops: &[Op],
    requests: &[Request],
    stream: &Id,
    blocks: &mut [Block],
) {
    for (op, r) in ops.iter().zip(requests) {
        if op.alloc {
            blocks[op.id as usize] = arena.allocate(*r, stream).expect("allocate");
        } else {
            arena.deallocate(blocks[op.id as usize], stream).expect("deallocate");
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Each thread on a stream of its own: per-stream arenas.
    Stream,
    /// Every thread on the default stream: per-thread arenas.
    Default,
    /// The control: each thread its own resource (nothing shared at all).
    Separate,
}

/// Seconds of wall time for `threads` threads replaying `ops` at once.
fn run(ops: &[Op], threads: usize, mode: Mode) -> f64 {
    let make =
        || ArenaResource::with_config(BumpUpstream::new(1 << 50), ArenaConfig::new(), &()).expect("arena");
    let arenas: Vec<_> = (0..if mode == Mode::Separate { threads } else { 1 }).map(|_| make()).collect();
    let ids = ops.iter().map(|o| o.id as usize + 1).max().unwrap_or(0);
    let requests: Vec<Request> = ops.iter().map(|o| Request::new(o.size).expect("size")).collect();
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for t in 0..threads {
            let arena = &arenas[if mode == Mode::Separate { t } else { 0 }];
            let (requests, barrier) = (&requests, &barrier);
            s.spawn(move || {
                let stream = Id(if mode == Mode::Default { 0 } else { t as u64 + 1 });
                let mut blocks = vec![Block::EMPTY; ids];
                replay(arena, ops, requests, &stream, &mut blocks); // warm-up
                barrier.wait();
                replay(arena, ops, requests, &stream, &mut blocks);
                barrier.wait();
            });
        }
        barrier.wait();
        let t0 = Instant::now();
        barrier.wait();
        t0.elapsed().as_secs_f64()
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let spec = args.first().map_or("random:100000:1048576:42", String::as_str);
    let threads: Vec<usize> = args
        .get(1)
        .map_or("1,2", String::as_str)
        .split(',')
        .map(|x| x.parse().expect("thread counts"))
        .collect();
    let mode = match args.get(2).map_or("stream", String::as_str) {
        "stream" => Mode::Stream,
        "default" => Mode::Default,
        "separate" => Mode::Separate,
        m => panic!("mode {m}: stream, default or separate"),
    };
    let repeats: usize = args.get(3).map_or(5, |r| r.parse().expect("repeats"));
    let ops = workload(spec);
    println!(
        "workload={spec} ops={} mode={} repeats={repeats} cpus={}",
        ops.len(),
        match mode {
            Mode::Stream => "a stream per thread",
            Mode::Default => "default stream, per-thread arenas",
            Mode::Separate => "control: a resource per thread",
        },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    // Thread counts take turns, so that load from other processes falls on
    // all of them alike; the best run of each is printed.
    let mut walls = vec![Vec::new(); threads.len()];
    for _ in 0..repeats {
        for (i, &t) in threads.iter().enumerate() {
            walls[i].push(run(&ops, t, mode));
        }
    }
    let mut base = 0.0;
    for (i, &t) in threads.iter().enumerate() {
        walls[i].sort_by(f64::total_cmp);
        let total = (ops.len() * t) as f64;
        let best = walls[i][0] * 1e9 / total;
        let median = walls[i][walls[i].len() / 2] * 1e9 / total;
        let throughput = total / walls[i][0];
        if i == 0 {
            base = throughput / t as f64;
        }
        println!("threads={t:<3} ns_per_op={best:.1} (median {median:.1}) speedup={:.2}x", throughput / base);
    }
}
