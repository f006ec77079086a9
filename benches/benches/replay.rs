//! The memres pool against its peers, side by side, on the same op
//! sequences (sizes rounded up to 256 bytes for all).
//!
//! The workloads are two generated ones and every trace of the family in
//! `benches/data/`, as `memres replay` runs them with no workload named;
//! a held-out trace's group is named `held-out/NAME`. Criterion's filter
//! picks some: `cargo bench -p memres-bench -- gpt_train`.
//!
//! Each iteration replays a whole workload on a warm resource (one pass
//! has run before timing starts, as in the `memres replay` tool), so the
//! figure per element is the cost of one op. The memres resources are
//! stack strings built typed as the tool builds them
//! (`memres_bench::typed`); adding one is one line in `bench_workload`.
//!
//! The group `arena-threads` replays `random:100000:1048576:42` through
//! one arena on 1 and on 2 threads (each thread the whole sequence on its
//! own stream, as `memres replay --streams K`): the figure per element is
//! the aggregate cost of one op, so the scaling ratio reads off one run.
//!
//! With `MEMRES_BENCH_CLOCK=cpu` in the environment the benches time the
//! thread's CPU time instead of wall time (Linux): on a machine shared
//! with other work, wall time counts the waits for a core.

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use memres_bench::family;
use memres_bench::peers::{OffsetReplayer, RangeReplayer};
use memres_bench::replay::{pass, shared_pass, thread_cpu_time, Replayer};
use memres_bench::stack::builder;
use memres_bench::typed::{fixed_misfit, run_typed, OneThread, WithReplayer};
use memres_bench::workload::Workload;
use memres_core::arena::ArenaResource;
use memres_core::stack::{fixed_block_size, parse};
use memres_core::Block;
use memres_sim::{SimDevice, SimWorld};
use std::hint::black_box;
use std::path::Path;
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// The generated workloads, before the family's traces.
const GENERATED: &[&str] = &["random:100000:1048576:42", "lograndom:100000:256:16777216:7"];

type Group<'a> = BenchmarkGroup<'a, criterion::measurement::WallTime>;

/// Times whole passes of `w` on one warm resource.
fn bench_replayer<R: Replayer>(group: &mut Group<'_>, name: &str, w: &Workload, mut resource: R) {
    let mut handles = vec![resource.vacant(); w.ids as usize];
    pass(&mut resource, w, &mut handles).expect("warm-up pass");
    let cpu_clock = std::env::var("MEMRES_BENCH_CLOCK").is_ok_and(|c| c == "cpu");
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let (wall, cpu) = (Instant::now(), thread_cpu_time());
            for _ in 0..iters {
                pass(black_box(&mut resource), black_box(w), &mut handles).expect("replay pass");
            }
            match (cpu_clock, cpu, thread_cpu_time()) {
                (true, Some(a), Some(b)) => b.saturating_sub(a),
                _ => wall.elapsed(),
            }
        })
    });
}

/// Benches the replayer it is given.
struct Bench<'g, 'a> {
    group: &'g mut Group<'a>,
    name: &'g str,
    w: &'g Workload,
}

impl WithReplayer for Bench<'_, '_> {
    type Output = ();
    fn with<R: Replayer<Handle = Block>>(self, r: R) {
        bench_replayer(self.group, self.name, self.w, r);
    }
}

/// Times whole passes of `w` on the stack `text` over a simulated device,
/// built typed as the tool builds it.
fn bench_stack(group: &mut Group<'_>, name: &str, w: &Workload, text: &str) {
    let call = parse(text).expect("a stack string");
    if call.name == "fixed" && fixed_block_size(&call).ok().and_then(|b| fixed_misfit(b, w)).is_some() {
        return; // fixed-size blocks too small for the workload
    }
    let world = SimWorld::new();
    let streams = (0..w.streams).map(|_| world.stream()).collect();
    let bench = OneThread { streams, then: Bench { group, name, w } };
    if run_typed(&call, &builder(), &world.default_stream(), bench).expect("the stack builds").is_err() {
        panic!("{text} has no typed shape");
    }
}

fn bench_workload(c: &mut Criterion, group_name: &str, spec: &str) {
    let w = Workload::load(spec).expect("workload decodes");
    let mut group = c.benchmark_group(group_name);
    group.throughput(Throughput::Elements(w.ops.len() as u64));
    group.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    bench_stack(&mut group, "pool", &w, "pool(sim(1TiB))");
    // Only where every request fits a 1 MiB block.
    bench_stack(&mut group, "fixed-1MiB", &w, "fixed(sim(1TiB), 1MiB)");
    bench_stack(&mut group, "binning", &w, "binning(sim(1TiB))");
    bench_stack(&mut group, "arena", &w, "arena(sim(1TiB))");
    bench_stack(&mut group, "stats-pool", &w, "stats(pool(sim(1TiB)))");
    bench_stack(&mut group, "vpool", &w, "vpool(sim(1TiB))");
    bench_replayer(&mut group, "offset-allocator", &w, OffsetReplayer::new(&w));
    bench_replayer(&mut group, "range-alloc", &w, RangeReplayer::new());
    group.finish();
}

/// One arena, `threads` threads each replaying the whole workload on its
/// own stream per iteration; wall time (or, with `MEMRES_BENCH_CLOCK=cpu`,
/// CPU time summed over the threads) over `ops × threads` elements.
fn arena_threads(c: &mut Criterion) {
    let w = Workload::load("random:100000:1048576:42").expect("workload decodes");
    let mut group = c.benchmark_group("arena-threads");
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    let cpu_clock = std::env::var("MEMRES_BENCH_CLOCK").is_ok_and(|c| c == "cpu");
    for threads in [1usize, 2] {
        group.throughput(Throughput::Elements(w.ops.len() as u64 * threads as u64));
        let arena = ArenaResource::new(SimDevice::new(1 << 40));
        let world = SimWorld::new();
        let streams: Vec<_> = (0..threads).map(|_| world.non_blocking_stream()).collect();
        let mut warm = vec![Block::EMPTY; w.ids as usize];
        shared_pass(&arena, &streams[0], &w, &mut warm).expect("warm-up pass");
        group.bench_function(format!("{threads}-thread"), |b| {
            b.iter_custom(|iters| {
                let barrier = Barrier::new(threads + 1);
                std::thread::scope(|scope| {
                    let workers: Vec<_> = streams
                        .iter()
                        .map(|stream| {
                            let (arena, w, barrier) = (&arena, &w, &barrier);
                            scope.spawn(move || {
                                let mut handles = vec![Block::EMPTY; w.ids as usize];
                                barrier.wait();
                                let cpu = thread_cpu_time();
                                for _ in 0..iters {
                                    shared_pass(black_box(arena), stream, w, &mut handles)
                                        .expect("replay pass");
                                }
                                cpu.zip(thread_cpu_time()).map(|(a, b)| b.saturating_sub(a))
                            })
                        })
                        .collect();
                    barrier.wait();
                    let wall = Instant::now();
                    let cpu: Option<Duration> = workers
                        .into_iter()
                        .map(|t| t.join().expect("replay thread"))
                        .try_fold(Duration::ZERO, |sum, c| c.map(|c| sum + c));
                    let wall = wall.elapsed();
                    match (cpu_clock, cpu) {
                        (true, Some(c)) => c,
                        _ => wall,
                    }
                })
            })
        });
    }
    group.finish();
}

fn replay(c: &mut Criterion) {
    for spec in GENERATED {
        bench_workload(c, spec, spec);
    }
    for path in family::traces(Path::new(family::DATA_DIR)).expect("the family's traces") {
        let name = family::trace_name(&path).expect("a trace");
        let group = match family::is_held_out(&path).expect("the held-out list") {
            true => format!("held-out/{name}"),
            false => name.to_string(),
        };
        bench_workload(c, &group, path.to_str().expect("a UTF-8 path"));
    }
}

criterion_group!(benches, replay, arena_threads);
criterion_main!(benches);
