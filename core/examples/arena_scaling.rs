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
//! 8 GiB, then frees what is left. Besides wall time it prints each
//! thread's CPU time per operation and the speed-up it implies (`threads *
//! cpu(1 thread) / cpu(n threads)`): the speed-up the threads would reach on
//! cores of their own, which a busy shared machine cannot show in wall time
//! but which still rises with any lock contention or false sharing. The
//! footprint is peak bytes held from upstream / (peak live bytes of the
//! workload * threads), a lower bound of the true ratio since the threads'
//! peaks need not coincide. `ARENA_SUPERBLOCK` (bytes) and `ARENA_SIZE_CLASSES`
//! (`0` or `1`) in the environment change the configuration. The upstream hands out numbers, so only
//! the arena's own work is timed. Thread counts take turns for `repeats`
//! rounds and the best run of each is printed with the median, since other
//! processes share the machine.

use memres_core::arena::{ArenaConfig, ArenaResource};
use memres_core::testing::{BumpUpstream, IdStream, SplitMix64};
use memres_core::Inspect;
use memres_core::{Block, MemoryResource, Request};
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

fn replay(
    arena: &ArenaResource<BumpUpstream>,
    ops: &[Op],
    requests: &[Request],
    stream: &IdStream,
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

fn config() -> ArenaConfig {
    let env = |name: &str| std::env::var(name).ok().map(|v| v.parse::<u64>().expect(name));
    let mut c = ArenaConfig::new();
    if let Some(sb) = env("ARENA_SUPERBLOCK") {
        c = c.superblock_size(sb).chunk_size(sb.max(32 << 20));
    }
    if let Some(classes) = env("ARENA_SIZE_CLASSES") {
        c = c.size_classes(classes != 0);
    }
    c
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

/// CPU time of the calling thread in nanoseconds: unlike wall time, it
/// leaves out the time the thread waited for a core held by another process,
/// so it shows contention inside the resource even on a busy machine.
#[cfg(target_os = "linux")]
fn thread_cpu_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `clock_gettime` only writes one `timespec` (two C longs, which
    // `Timespec` lays out as C does on 64-bit Linux) through the pointer,
    // which is valid and exclusive for the call.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.sec as u64 * 1_000_000_000 + ts.nsec as u64
}

#[cfg(not(target_os = "linux"))]
fn thread_cpu_ns() -> u64 {
    0
}

/// Wall seconds for `threads` threads replaying `ops` at once, the mean CPU
/// nanoseconds per operation of one thread, and the peak bytes held from
/// upstream.
fn run(ops: &[Op], threads: usize, mode: Mode) -> (f64, f64, u64) {
    let make = || ArenaResource::with_config(BumpUpstream::new(1 << 50), config(), &()).expect("arena");
    let arenas: Vec<_> = (0..if mode == Mode::Separate { threads } else { 1 }).map(|_| make()).collect();
    let ids = ops.iter().map(|o| o.id as usize + 1).max().unwrap_or(0);
    let requests: Vec<Request> = ops.iter().map(|o| Request::new(o.size).expect("size")).collect();
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let arena = &arenas[if mode == Mode::Separate { t } else { 0 }];
                let (requests, barrier) = (&requests, &barrier);
                s.spawn(move || {
                    let stream = IdStream(if mode == Mode::Default { 0 } else { t as u64 + 1 });
                    let mut blocks = vec![Block::EMPTY; ids];
                    replay(arena, ops, requests, &stream, &mut blocks); // warm-up
                    barrier.wait();
                    let cpu = thread_cpu_ns();
                    replay(arena, ops, requests, &stream, &mut blocks);
                    let cpu = thread_cpu_ns() - cpu;
                    barrier.wait();
                    cpu
                })
            })
            .collect();
        barrier.wait();
        let t0 = Instant::now();
        barrier.wait();
        let wall = t0.elapsed().as_secs_f64();
        let cpu: u64 = handles.into_iter().map(|h| h.join().expect("thread")).sum();
        let peak = arenas.iter().map(|a| a.usage().peak_held).sum();
        (wall, cpu as f64 / (threads * ops.len()) as f64, peak)
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
    let (mut live, mut peak_live) = (0u64, 0u64);
    for op in &ops {
        if op.alloc {
            live += op.size;
            peak_live = peak_live.max(live);
        } else {
            live -= op.size;
        }
    }
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
    let mut runs = vec![Vec::new(); threads.len()];
    for _ in 0..repeats {
        for (i, &t) in threads.iter().enumerate() {
            runs[i].push(run(&ops, t, mode));
        }
    }
    let (mut base_wall, mut base_cpu) = (0.0, 0.0);
    for (i, &t) in threads.iter().enumerate() {
        let total = (ops.len() * t) as f64;
        let mut walls: Vec<f64> = runs[i].iter().map(|r| r.0 * 1e9 / total).collect();
        let mut cpus: Vec<f64> = runs[i].iter().map(|r| r.1).collect();
        walls.sort_by(f64::total_cmp);
        cpus.sort_by(f64::total_cmp);
        let (wall, cpu) = (walls[0], cpus[0]);
        if i == 0 {
            (base_wall, base_cpu) = (wall, cpu / t as f64);
        }
        println!(
            "threads={t:<3} ns_per_op={wall:.1} (median {:.1}) speedup={:.2}x | cpu_ns_per_op_per_thread={cpu:.1} (median {:.1}) cpu_speedup={:.2}x | footprint={:.2}",
            walls[walls.len() / 2],
            base_wall / wall,
            cpus[cpus.len() / 2],
            base_cpu * t as f64 / cpu,
            runs[i][0].2 as f64 / (peak_live * t as u64) as f64,
        );
    }
}
