//! Asking for more than the device holds is an error with figures, and the
//! resource works afterwards. Each test reports itself SKIPPED (and tests
//! nothing) without a GPU.

mod common;

use common::{expect_filled, fill, gpu};
use memres_core::{Error, MemoryResource, Request};
use memres_cuda::{CudaAsyncMemory, CudaMemory, CudaStream, Device};

/// Asks `mr` for twice the device's memory, checks the error, then checks
/// the resource still serves a normal request.
fn too_much_then_fine<R: MemoryResource<CudaStream>>(mr: &R, device: Device, stream: &CudaStream) -> Error {
    let total = device.total_memory().unwrap();
    let err = mr.allocate(Request::new(2 * total).unwrap(), stream).unwrap_err();
    match err {
        Error::OutOfMemory { requested, largest_free, max_size, .. } => {
            assert_eq!(requested, 2 * total);
            // The driver's figures: the maximum is the memory it reports
            // (at most what the device has), the largest free block at most that.
            let max = max_size.expect("the device's memory is the maximum");
            assert!(max > 0 && max <= total, "maximum {max}, device {total}");
            assert!(largest_free <= max);
        }
        other => panic!("expected out of memory, got {other:?}"),
    }
    assert!(err.is_out_of_memory());
    let b = mr.allocate(Request::new(1 << 20).unwrap(), stream).expect("works after out of memory");
    fill(stream, &b, 0x00B0_0B00);
    expect_filled(stream, &b, 0x00B0_0B00);
    mr.deallocate(b, stream).unwrap();
    err
}

#[test]
fn device_memory_out_of_memory() {
    let Some(device) = gpu("device_memory_out_of_memory") else { return };
    let mr = CudaMemory::new(device).unwrap();
    let stream = CudaStream::new(device).unwrap();
    too_much_then_fine(&mr, device, &stream);
}

#[test]
fn async_memory_out_of_memory_reports_the_pool_size() {
    let Some(device) = gpu("async_memory_out_of_memory_reports_the_pool_size") else { return };
    let mr =
        CudaAsyncMemory::with_config(device, memres_cuda::AsyncConfig::new().initial_size(4 << 20)).unwrap();
    let stream = CudaStream::new(device).unwrap();
    // A live block: the pool cannot hand its memory back while it fails.
    let held = mr.allocate(Request::new(4 << 20).unwrap(), &stream).unwrap();
    let err = too_much_then_fine(&mr, device, &stream);
    let Error::OutOfMemory { pool_size, .. } = err else { unreachable!("checked above") };
    // The figure is the pool's reserved bytes (at least the live block's,
    // except under tools such as compute-sanitizer that replace the pool).
    assert_eq!(pool_size, mr.reserved_bytes().unwrap(), "the pool's reserved bytes");
    mr.deallocate(held, &stream).unwrap();
}

#[test]
fn an_initial_size_above_the_device_is_out_of_memory_and_leaves_nothing() {
    let Some(device) = gpu("an_initial_size_above_the_device_is_out_of_memory_and_leaves_nothing") else {
        return;
    };
    let total = device.total_memory().unwrap();
    // Read after the context is made (its own memory is not the pool's).
    let before = device.memory_info().unwrap().free;
    let config = memres_cuda::AsyncConfig::new().initial_size(2 * total);
    let err = CudaAsyncMemory::with_config(device, config).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { requested, .. } if requested == 2 * total), "{err:?}");
    // The other tests of this file run beside this one and hold a few MiB.
    const SLACK: u64 = 64 << 20;
    let after = device.memory_info().unwrap().free;
    assert!(after + SLACK >= before, "{before} bytes free before the failed pool, {after} after");
}
