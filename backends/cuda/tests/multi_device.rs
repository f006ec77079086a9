//! Resources of two devices used from one thread. Reports itself SKIPPED
//! (and tests nothing) with fewer than two GPUs.

mod common;

use common::{expect_filled, fill, gpus};
use memres_core::{MemoryResource, Request};
use memres_cuda::{CudaAsyncMemory, CudaStream, Device};

#[test]
fn two_devices_from_one_thread() {
    let Some(devices) = gpus("two_devices_from_one_thread", 2) else { return };
    let (d0, d1) = (devices[0], devices[1]);
    let mrs = [CudaAsyncMemory::new(d0).unwrap(), CudaAsyncMemory::new(d1).unwrap()];
    let streams = [CudaStream::new(d0).unwrap(), CudaStream::new(d1).unwrap()];
    assert_eq!(mrs[1].device(), d1);
    // Device 0's context is current; using device 1's resource must not change that.
    let context0 = d0.primary_context().unwrap();
    context0.bind().unwrap();
    let blocks: Vec<_> =
        (0..2).map(|i| mrs[i].allocate(Request::new(1 << 20).unwrap(), &streams[i]).unwrap()).collect();
    assert_eq!(Device::current().unwrap(), d0, "the caller's context is restored");
    for i in 0..2 {
        fill(&streams[i], &blocks[i], 0xD0 + i as u32);
    }
    for i in 0..2 {
        expect_filled(&streams[i], &blocks[i], 0xD0 + i as u32);
    }
    for (i, b) in blocks.into_iter().enumerate() {
        mrs[i].deallocate(b, &streams[i]).unwrap();
    }
    assert_eq!(Device::current().unwrap(), d0);
    // Device 1's legacy stream through `()`: its own context's, not device 0's.
    let b = mrs[1].allocate(Request::new(4096).unwrap(), &()).unwrap();
    let legacy1 = d1.default_stream().unwrap();
    fill(&legacy1, &b, 0xD1D1);
    expect_filled(&legacy1, &b, 0xD1D1);
    mrs[1].deallocate(b, &()).unwrap();
    drop(context0); // kept retained while bound
}
