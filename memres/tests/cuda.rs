//! The facade over CUDA (feature `cuda`, built by `backends/cuda/ci.sh`):
//! every device's default resource is its `cuMemAlloc` resource, the
//! containers made without a resource use it, and clones copy on the GPU.
//! Without a GPU the tests print SKIPPED (after checking that the default
//! is a typed error, nothing stored); `MEMRES_REQUIRE_GPU=1` makes that a
//! failure.
#![cfg(feature = "cuda")]

#[path = "../../backends/cuda/tests/common/mod.rs"]
mod common;

use memres::cuda::{CudaCopy, CudaStream};
use memres::device::{get_current_device_resource, get_per_device_resource};
use memres::prelude::*;
use memres::DynResource;
use std::sync::Arc;

#[test]
fn the_default_resource_of_a_device_is_its_cumemalloc_resource() {
    let Some(device) = common::gpu("the_default_resource_of_a_device_is_its_cumemalloc_resource") else {
        // No device: the default cannot be made; a typed error each time.
        for _ in 0..2 {
            assert!(matches!(get_current_device_resource::<()>(), Err(Error::Backend { .. })));
            assert!(matches!(get_per_device_resource::<CudaStream>(0), Err(Error::Backend { .. })));
        }
        return;
    };
    let mr: DynResource = get_current_device_resource().unwrap();
    assert!(Arc::ptr_eq(&mr, &get_per_device_resource(device.ordinal()).unwrap()), "device 0 is current");
    let stream = CudaStream::new(device).unwrap();
    let block = mr.allocate(1 << 20).unwrap();
    common::fill(&stream, &block, 0x5EED);
    common::expect_filled(&stream, &block, 0x5EED);
    mr.deallocate(block).unwrap();
    // A pool over the default for CUDA streams, through the short path.
    let on_streams: DynResource<CudaStream> = get_current_device_resource().unwrap();
    let pool = Statistics::new(Shared::new(CoalescingPool::new(on_streams)));
    let b = pool.allocate_on(4096, &stream).unwrap();
    pool.deallocate_on(b, &stream).unwrap();
    assert_eq!(pool.get_bytes_counter().peak, 4096);
    // A device that does not exist: the driver's error, nothing stored.
    let count = memres::cuda::Device::count().unwrap();
    for _ in 0..2 {
        assert!(matches!(get_per_device_resource::<()>(count), Err(Error::Backend { .. })));
    }
}

#[test]
fn containers_without_a_resource_use_the_default_and_clone_on_the_gpu() {
    let Some(device) = common::gpu("containers_without_a_resource_use_the_default_and_clone_on_the_gpu")
    else {
        return;
    };
    // The containers ask the core's registry: the defaults are installed
    // by the first call of `memres::device`, which this test need not be
    // the second of (tests run in any order).
    memres::device::install_defaults();
    let stream = CudaStream::new(device).unwrap();
    let data: Vec<u32> = (0..10_000u64).map(common::pattern).collect();
    let mut v = DeviceUVector::<u32, _, CudaCopy, _>::from_slice(&data, &stream).unwrap();
    let w = v.clone();
    assert_ne!(w.addr(), v.addr());
    v.fill_zero().unwrap();
    assert_eq!(w.to_vec().unwrap(), data, "a deep copy, ordered before the fill");
    assert!(v.iter().all(|x| x == Ok(0)));
    let s = DeviceScalar::<u64, _, CudaCopy, _>::from_value(&42, &stream).unwrap();
    assert_eq!(s.clone().value().unwrap(), 42);
    // The `()` stream (the legacy default stream) has the default too.
    let b = DeviceBuffer::<_, CudaCopy>::from_slice(b"bytes", ()).unwrap();
    assert_eq!(b.clone().to_vec().unwrap(), b"bytes");
}
