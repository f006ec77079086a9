//! The memres pool against its peers, side by side, on the same op
//! sequences (sizes rounded up to 256 bytes for all).
//!
//! Each iteration replays a whole workload on a warm resource (one pass
//! has run before timing starts, as in the `memres replay` tool), so the
//! figure per element is the cost of one op. Adding a resource is one line
//! in `bench_workload`.
//!
//! With `MEMRES_BENCH_CLOCK=cpu` in the environment the benches time the
//! thread's CPU time instead of wall time (Linux): on a machine shared
//! with other work, wall time counts the waits for a core.

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use memres_bench::replay::{pass, thread_cpu_time, Replayer};
use memres_bench::resources::{Build, OffsetAllocator, Pool, RangeAlloc};
use memres_bench::workload::Workload;
use memres_host::SimDevice;
use std::hint::black_box;
use std::time::{Duration, Instant};

const WORKLOADS: &[&str] = &[
    "random:100000:1048576:42",
    "lograndom:100000:256:16777216:7",
    concat!(env!("CARGO_MANIFEST_DIR"), "/data/resnet_train.csv.gz"),
    concat!(env!("CARGO_MANIFEST_DIR"), "/data/gpt_train.csv.gz"),
];

/// Times whole passes of `workload` on one warm resource built by `B` over
/// a simulated device.
fn bench_resource<B: Build>(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    w: &Workload,
) {
    let mut resource = B::build(SimDevice::new(1 << 40), w);
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

fn bench_workload(c: &mut Criterion, spec: &str) {
    let w = Workload::load(spec).expect("workload decodes");
    let short = spec.rsplit('/').next().unwrap_or(spec);
    let mut group = c.benchmark_group(short);
    group.throughput(Throughput::Elements(w.ops.len() as u64));
    group.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    bench_resource::<Pool>(&mut group, "pool", &w);
    bench_resource::<OffsetAllocator>(&mut group, "offset-allocator", &w);
    bench_resource::<RangeAlloc>(&mut group, "range-alloc", &w);
    group.finish();
}

fn replay(c: &mut Criterion) {
    for spec in WORKLOADS {
        bench_workload(c, spec);
    }
}

criterion_group!(benches, replay);
criterion_main!(benches);
