//! `CudaCopy` between pinned and device memory from several threads at
//! once, each on a stream of its own: a copy that touches pinned (or
//! managed) memory waits for its stream before it returns, so a free of
//! that memory cannot overtake it. The figure is how many such copies the
//! threads make together per second, at 1, 2, 4 and 8 threads: copies that
//! wait one behind another stay at the one-thread figure.
//!
//! ```text
//! cargo run --release -p memres-cuda --example copies_on_threads [-- BYTES (default 65536) ROUNDS (default 2000)]
//! ```
//!
//! Each figure is the median of five passes (after one untimed pass). It
//! prints SKIPPED and exits 0 without a GPU.

use memres_core::copy::CopyEngine;
use memres_core::{MemoryResource, Request};
use memres_cuda::{CudaCopy, CudaMemory, CudaStream, Device, PinnedMemory, StreamOptions};
use std::sync::Barrier;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u64>().expect("a number"));
    let bytes = args.next().unwrap_or(1 << 16);
    let rounds = args.next().unwrap_or(2000);
    let Ok(device) = Device::get(0) else {
        println!("SKIPPED: no GPU");
        return;
    };
    let (pinned, memory) = (PinnedMemory::new(device).unwrap(), CudaMemory::new(device).unwrap());
    let engine = CudaCopy::new(device).unwrap();
    let options = StreamOptions { non_blocking: true, ..StreamOptions::default() };
    println!("{bytes} bytes per copy, {rounds} copies per thread and pass");
    let mut one = None;
    for threads in [1, 2, 4, 8] {
        let streams: Vec<_> =
            (0..threads).map(|_| CudaStream::with_options(device, options).unwrap()).collect();
        let request = Request::new(bytes).unwrap();
        let blocks: Vec<_> = streams
            .iter()
            .map(|s| (pinned.allocate(request, s).unwrap(), memory.allocate(request, s).unwrap()))
            .collect();
        let mut passes: Vec<f64> = (0..6)
            .map(|_| {
                let start = Barrier::new(threads + 1);
                std::thread::scope(|scope| {
                    for (stream, (host, dev)) in streams.iter().zip(&blocks) {
                        let (start, engine) = (&start, &engine);
                        scope.spawn(move || {
                            start.wait();
                            for _ in 0..rounds {
                                // SAFETY: both blocks are this thread's, live
                                // until after the scope, used on its stream only.
                                unsafe { engine.copy(dev.addr(), host.addr(), bytes, stream) }.unwrap();
                            }
                        });
                    }
                    start.wait();
                    Instant::now()
                })
                // The scope joined the threads: the pass is timed to their end.
                .elapsed()
                .as_secs_f64()
            })
            .skip(1)
            .collect();
        passes.sort_by(f64::total_cmp);
        let per_second = (threads as u64 * rounds) as f64 / passes[passes.len() / 2];
        let ratio = per_second / *one.get_or_insert(per_second);
        println!("threads {threads}: {per_second:.0} copies/s ({ratio:.2}x one thread)");
        for (stream, (host, dev)) in streams.iter().zip(blocks) {
            pinned.deallocate(host, stream).unwrap();
            memory.deallocate(dev, stream).unwrap();
        }
    }
}
