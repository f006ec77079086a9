//! The core's algorithms stacked over the CUDA resources. Each test reports
//! itself SKIPPED (and tests nothing) without a GPU.
//!
//! One test per composed stack (pool over the async resource, arena over
//! device memory, binning over a pool, the stream-ordered pool on four
//! streams), each writing a pattern into every block, reading it back
//! before the free, and running the stack's invariant checker every step.

mod common;

use common::{expect_filled, fill, gpu, pattern};
use memres_core::arena::ArenaResource;
use memres_core::binning::BinningResource;
use memres_core::pool::{CoalescingPool, PoolConfig};
use memres_core::testing::SplitMix64;
use memres_core::Inspect;
use memres_core::StreamOrdered;
use memres_core::{Block, MemoryResource, Request, Shared, Stream};
use memres_cuda::{AsyncConfig, CudaAsyncMemory, CudaMemory, CudaStream, StreamOptions};
use std::borrow::Borrow;

/// `steps` random allocations (sizes 4 B..`max_size`) and frees through `mr`
/// on random streams of `streams`: every block is filled with its own
/// pattern on its stream and read back before it is freed, so two live
/// blocks that overlapped, or memory reused before its last use finished,
/// would show as a wrong word. A block is sometimes freed on another stream
/// than the one it was used on, after that stream waited on an event of the
/// first (the ordering RMM asks of its callers). `check` runs after every step.
fn exercise<S: Stream + Borrow<CudaStream>>(
    mr: &dyn MemoryResource<S>,
    streams: &[S],
    steps: u64,
    max_size: u64,
    seed: u64,
    mut check: impl FnMut(),
) {
    let mut rng = SplitMix64::new(seed);
    let mut live: Vec<(Block, u32, usize)> = Vec::new();
    for step in 0..steps {
        if live.len() > 48 || (!live.is_empty() && rng.below(3) == 0) {
            let (b, value, on) = live.swap_remove(rng.below(live.len() as u64) as usize);
            expect_filled(streams[on].borrow(), &b, value);
            let free_on = rng.below(streams.len() as u64) as usize;
            if free_on != on {
                let done = streams[on].record().unwrap();
                streams[free_on].wait(&done).unwrap();
            }
            mr.deallocate(b, &streams[free_on]).unwrap();
        } else {
            let on = rng.below(streams.len() as u64) as usize;
            let size = 4 * (1 + rng.below(max_size / 4));
            let b = mr.allocate(Request::new(size).unwrap(), &streams[on]).unwrap();
            assert_eq!(b.addr() % 256, 0);
            let value = pattern(step);
            fill(streams[on].borrow(), &b, value);
            live.push((b, value, on));
        }
        check();
    }
    for (b, value, on) in live.drain(..) {
        expect_filled(streams[on].borrow(), &b, value);
        mr.deallocate(b, &streams[on]).unwrap();
    }
    check();
    for s in streams {
        s.synchronize().unwrap();
    }
}

fn streams(device: memres_cuda::Device, n: usize) -> Vec<CudaStream> {
    (0..n)
        .map(|_| CudaStream::with_options(device, StreamOptions { non_blocking: true, priority: 0 }).unwrap())
        .collect()
}

#[test]
fn arena_over_device_memory() {
    let Some(device) = gpu("arena_over_device_memory") else { return };
    let upstream = CudaMemory::new(device).unwrap();
    let arena = ArenaResource::new(&upstream);
    let streams = streams(device, 2);
    // Small blocks come from per-stream arenas, blocks above 1 MiB straight
    // from the global arena.
    exercise(&arena, &streams, 500, 3 << 20, 11, || arena.check().unwrap());
    assert_eq!(arena.usage().used, 0);
    arena.release(&streams[0]).unwrap();
    arena.check().unwrap();
}

#[test]
fn binning_over_a_pool_over_async_memory() {
    let Some(device) = gpu("binning_over_a_pool_over_async_memory") else { return };
    let upstream = CudaAsyncMemory::with_config(device, AsyncConfig::new()).unwrap();
    let stream = streams(device, 1);
    let pool = Shared::new(CoalescingPool::new(&upstream));
    // RMM's harness's bins: 256 KiB..4 MiB, larger requests to the pool.
    let bins = BinningResource::with_exponents(&pool, 18, 22).unwrap();
    exercise(&bins, &stream, 500, 6 << 20, 12, || {
        bins.check().unwrap();
        pool.with(|p| p.check()).unwrap();
    });
    bins.release(&stream[0]).unwrap();
    pool.with(|p| {
        assert_eq!(p.usage().used, 0, "the bins gave their chunks back");
        p.release(&stream[0]).unwrap();
    });
}

#[test]
fn stream_ordered_pool_on_four_streams() {
    let Some(device) = gpu("stream_ordered_pool_on_four_streams") else { return };
    let upstream = CudaAsyncMemory::with_config(device, AsyncConfig::new()).unwrap();
    let streams = streams(device, 4);
    let config = PoolConfig::new().maximum_size(256 << 20);
    let pool = CoalescingPool::with_config(&upstream, config, &()).unwrap();
    // The layer keeps the streams it has seen (to synchronize them as its
    // last resort), so it works on borrowed streams that outlive it.
    let borrowed: Vec<&CudaStream> = streams.iter().collect();
    let layer: Shared<StreamOrdered<_, &CudaStream>> = Shared::new(StreamOrdered::new(pool));
    exercise(&layer, &borrowed, 800, 1 << 20, 13, || layer.with(|l| l.check()).unwrap());
    layer.with(|l| {
        assert_eq!(l.usage().used, 0);
        l.synchronize_and_merge().unwrap();
        l.check().unwrap();
    });
}

#[test]
fn coalescing_pool_over_async_memory() {
    let Some(device) = gpu("coalescing_pool_over_async_memory") else { return };
    let upstream = CudaAsyncMemory::with_config(device, AsyncConfig::new()).unwrap();
    let stream = CudaStream::new(device).unwrap();
    let config = PoolConfig::new().initial_size(32 << 20).maximum_size(512 << 20);
    let pool = Shared::new(CoalescingPool::with_config(&upstream, config, &stream).unwrap());
    let mr: &dyn MemoryResource<CudaStream> = &pool;

    let mut rng = SplitMix64::new(7);
    let mut live: Vec<(Block, u32)> = Vec::new();
    for step in 0..600u64 {
        if live.len() > 64 || (!live.is_empty() && rng.below(3) == 0) {
            let (b, value) = live.swap_remove(rng.below(live.len() as u64) as usize);
            expect_filled(&stream, &b, value);
            mr.deallocate(b, &stream).unwrap();
        } else {
            let size = 4 * (1 + rng.below(1 << 18));
            let b = mr.allocate(Request::new(size).unwrap(), &stream).unwrap();
            assert_eq!(b.addr() % 256, 0);
            let value = pattern(step);
            fill(&stream, &b, value);
            live.push((b, value));
        }
        pool.with(|p| p.check()).unwrap();
    }
    // No two live blocks overlap: each still holds its own pattern.
    for (b, value) in live.drain(..) {
        expect_filled(&stream, &b, value);
        mr.deallocate(b, &stream).unwrap();
    }
    pool.with(|p| {
        assert_eq!(p.usage().used, 0);
        assert!(p.usage().held <= 512 << 20);
        let held = p.usage().held;
        assert_eq!(p.release(&stream).unwrap(), held, "every chunk goes back");
        p.check().unwrap();
    });
    stream.synchronize().unwrap();
    assert_eq!(upstream.used_bytes().unwrap(), 0, "the async pool got everything back");
}

#[test]
fn the_default_resource_serves_as_a_dyn_resource() {
    let Some(device) = gpu("the_default_resource_serves_as_a_dyn_resource") else { return };
    let mr: Box<dyn MemoryResource<CudaStream>> = Box::new(memres_cuda::default_resource(device).unwrap());
    let stream = CudaStream::new(device).unwrap();
    let b = mr.allocate(Request::new(12345 * 4).unwrap(), &stream).unwrap();
    fill(&stream, &b, 0xDEFA_0017);
    expect_filled(&stream, &b, 0xDEFA_0017);
    mr.deallocate(b, &stream).unwrap();
}
