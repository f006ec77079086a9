//! Resources of two devices used from one thread. Reports itself SKIPPED
//! (and tests nothing) with fewer than two GPUs.

mod common;

use common::{expect_filled, fill, gpus, Owned};
use memres_containers::{ContainerError, DeviceBuffer};
use memres_core::copy::MemoryOf;
use memres_core::{Error, MemoryResource, Request, Shared, Stream};
use memres_cuda::{
    CudaAsyncManagedMemory, CudaAsyncMemory, CudaCopy, CudaStream, Device, ManagedMemory, PinnedMemory,
};

#[test]
fn two_devices_from_one_thread() {
    let Some(devices) = gpus("two_devices_from_one_thread", 2) else { return };
    let (d0, d1) = (devices[0], devices[1]);
    let mrs = [CudaAsyncMemory::new(d0).unwrap(), CudaAsyncMemory::new(d1).unwrap()];
    let streams = [CudaStream::new(d0).unwrap(), CudaStream::new(d1).unwrap()];
    assert_eq!(mrs[1].device(), d1);
    // Device 0's context is current; using device 1's resource must not change that.
    d0.primary_context().unwrap().bind().unwrap();
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
}

/// A buffer over `mr`, a resource of device 0, which is replaced by
/// `replacement` (of device 1) under it and so ends: every later access
/// through `engine` (of device 1) is refused.
fn ended_under_a_buffer<'s, R>(
    mr: Shared<Owned<R>>,
    replacement: R,
    stream: &'s CudaStream,
    engine: &CudaCopy,
) where
    R: MemoryResource<&'s CudaStream> + MemoryOf<CudaCopy>,
{
    let mut buf = DeviceBuffer::from_slice_in(b"hello", stream, &mr, engine).unwrap();
    assert_eq!(buf.to_vec().unwrap(), b"hello");
    let addr = buf.addr();
    mr.with(|r| *r = Owned(replacement));
    let refused = ContainerError::Memory(Error::NotLive { addr, len: 5 });
    assert_eq!(buf.to_vec().unwrap_err(), refused);
    assert_eq!(buf.write(0, b"HELLO").unwrap_err(), refused);
    assert_eq!(buf.fill(0).unwrap_err(), refused);
    drop(buf); // its free goes to the replacement, which refuses it: ignored
}

/// Pinned and managed memory of a resource of another device than the
/// engine's: when the resource ends, its allocations leave the table
/// `CudaCopy` checks, and the engine must refuse the range rather than copy
/// from or to memory nothing owns any more.
#[test]
fn host_visible_memory_of_an_ended_resource_is_not_live() {
    let Some(devices) = gpus("host_visible_memory_of_an_ended_resource_is_not_live", 2) else { return };
    let (d0, d1) = (devices[0], devices[1]);
    let engine = CudaCopy::new(d1).unwrap();
    let stream = CudaStream::new(d1).unwrap();
    let pinned = Shared::new(Owned(PinnedMemory::new(d0).unwrap()));
    ended_under_a_buffer(pinned, PinnedMemory::new(d1).unwrap(), &stream, &engine);
    let managed = Shared::new(Owned(ManagedMemory::new(d0).unwrap()));
    ended_under_a_buffer(managed, ManagedMemory::new(d1).unwrap(), &stream, &engine);
}

/// Stream-ordered managed memory of device 0 used on device 1's default
/// stream from a thread where device 0's context is current: the default
/// handle names device 1's stream throughout (the driver's calls once ran
/// in device 0's context, where the handle names device 0's stream), and
/// the caller's context comes back.
#[test]
fn async_managed_memory_on_another_devices_default_stream() {
    let Some(devices) = gpus("async_managed_memory_on_another_devices_default_stream", 2) else { return };
    let (d0, d1) = (devices[0], devices[1]);
    let mr = match CudaAsyncManagedMemory::default_pool(d0) {
        Ok(mr) => mr,
        // Pools of managed memory came with CUDA 13; a newer driver has them.
        Err(Error::InvalidConfig { what }) if memres_cuda::driver_version().unwrap() < 13000 => {
            return eprintln!("SKIPPED async_managed_memory_on_another_devices_default_stream: {what}");
        }
        Err(e) => panic!("{e}"),
    };
    d0.primary_context().unwrap().bind().unwrap();
    let legacy1 = d1.default_stream().unwrap();
    for _ in 0..3 {
        let b = mr.allocate(Request::new(1 << 20).unwrap(), &legacy1).unwrap();
        fill(&legacy1, &b, 0xA1A1);
        expect_filled(&legacy1, &b, 0xA1A1);
        mr.deallocate(b, &legacy1).unwrap();
        assert_eq!(Device::current().unwrap(), d0, "the caller's context is restored");
    }
    legacy1.synchronize().unwrap();
}

/// A thread with no context that uses device 1 is left with none, so the
/// CUDA runtime's current device there is still device 0 (device 1's
/// context was left bound, and with it `cudaGetDevice`); one that uses
/// device 0 keeps device 0's primary context, as the runtime binds it.
#[test]
fn a_thread_with_no_context_is_left_on_device_0() {
    let Some(devices) = gpus("a_thread_with_no_context_is_left_on_device_0", 2) else { return };
    let (d0, d1) = (devices[0], devices[1]);
    let current = || {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: the out parameter is a live local.
        assert_eq!(unsafe { memres_cuda::sys::cuCtxGetCurrent(&mut ctx) }, 0);
        ctx
    };
    let mrs = [CudaAsyncMemory::new(d0).unwrap(), CudaAsyncMemory::new(d1).unwrap()];
    std::thread::scope(|s| {
        s.spawn(|| {
            assert!(current().is_null(), "a new thread has no context");
            let b = mrs[1].allocate(Request::new(4096).unwrap(), &()).unwrap();
            mrs[1].deallocate(b, &()).unwrap();
            assert!(current().is_null(), "device 1's context was left bound");
            let b = mrs[0].allocate(Request::new(4096).unwrap(), &()).unwrap();
            mrs[0].deallocate(b, &()).unwrap();
            assert_eq!(current(), d0.primary_context().unwrap().raw());
        });
    });
}
