//! The core's algorithms stacked over the CUDA resources. Each test reports
//! itself SKIPPED (and tests nothing) without a GPU.
//!
//! One test per composed stack: the coalescing pool is here; binning and
//! arena stacks join when those resources exist, each as its own test
//! over `CudaAsyncMemory` with the same write-and-read-back checks.

mod common;

use common::{expect_filled, fill, gpu, pattern};
use memres_core::pool::{CoalescingPool, PoolConfig};
use memres_core::testing::SplitMix64;
use memres_core::{Block, MemoryResource, Request, Shared, Stream};
use memres_cuda::{AsyncConfig, CudaAsyncMemory, CudaStream};

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
        assert_eq!(p.used_bytes(), 0);
        assert!(p.pool_size() <= 512 << 20);
        let held = p.pool_size();
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
