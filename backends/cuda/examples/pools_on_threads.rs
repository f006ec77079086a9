//! Threads that each build, use and drop stacks of the CUDA leaves at once,
//! over and over: the load under which the driver's fault known from the
//! `resources` test binary shows with memres's own leaves (see "GPU tests
//! and sanitizers" in docs/verification.md). Run it under a time limit:
//! a run the driver hangs does not end.
//!
//! ```text
//! pools_on_threads [async|other|mixed] [THREADS] [ROUNDS]
//! timeout 25 cargo run --release -p memres-cuda --example pools_on_threads -- async 8 150
//! ```
//!
//! `async` builds stacks whose leaves are the driver's pools (each made
//! with an initial allocation, used, and destroyed when the stack drops),
//! `other` stacks of every other leaf (virtual memory, `cuMemAlloc`,
//! managed, pinned), `mixed` the one on even threads and the other on odd
//! ones (default `mixed`, 8 threads, 150 rounds each). Every thread builds
//! its stacks on a stream of its own and synchronizes it every third round.
//! It prints `done` and exits 0 when every round ran; without a GPU it says
//! SKIPPED and exits 0.

use memres_core::adaptor::Gauge;
use memres_core::stack::StackBuilder;
use memres_core::{MemoryResource, Request, Stream};
use memres_cuda::stack::register;
use memres_cuda::{CudaStream, Device};
use std::sync::{Arc, Barrier};

/// Stacks over the driver's pools.
const ASYNC: &[&str] = &[
    "async(initial=1MiB, release_threshold=0)",
    "stats(pool(async))",
    "pool(async(initial=2MiB))",
    "async(initial=32MiB, release_threshold=32MiB)",
];
/// Stacks over every other leaf.
const OTHER: &[&str] = &[
    "vmm(reserve=1GiB, release_threshold=0)",
    "stats(vmm)",
    "vmm(reserve=4GiB, per_stream=true)",
    "cuda",
    "managed",
    "pinned",
    "pool(cuda)",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map_or("mixed", String::as_str);
    if !matches!(mode, "async" | "other" | "mixed") {
        return Err(format!("unknown mode `{mode}`: async, other or mixed").into());
    }
    let number = |i: usize, default: usize| args.get(i).map_or(Ok(default), |a| a.parse::<usize>());
    let (threads, rounds) = (number(1, 8)?, number(2, 150)?);
    if let Err(e) = memres_cuda::init() {
        println!("SKIPPED: the CUDA driver did not initialize ({e})");
        return Ok(());
    }
    let device = Device::get(0)?;
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| -> Result<(), String> {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || -> Result<(), String> {
                    let mut b = StackBuilder::<CudaStream>::new();
                    register(&mut b, device, Arc::new(Gauge::default()));
                    let stream = CudaStream::new(device).map_err(|e| e.to_string())?;
                    barrier.wait();
                    let set = match (mode, t % 2) {
                        ("async", _) | ("mixed", 0) => ASYNC,
                        _ => OTHER,
                    };
                    for r in 0..rounds {
                        let text = set[(r + t) % set.len()];
                        let built = b.build(text, &stream).map_err(|e| format!("{text}: {e}"))?;
                        let block = built
                            .allocate(Request::new(3000).unwrap(), &stream)
                            .map_err(|e| e.to_string())?;
                        built.deallocate(block, &stream).map_err(|e| e.to_string())?;
                        if r % 3 == 0 {
                            stream.synchronize().map_err(|e| e.to_string())?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| w.join().map_err(|_| "a thread panicked".to_string())?)
    })?;
    println!("done");
    Ok(())
}
