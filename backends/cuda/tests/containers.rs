//! The containers over CUDA memory, with `CudaCopy`: the same assertions as
//! the host backend's container tests (`containers/tests/suite/mod.rs`:
//! among them copies from raw device pointers, clones, alignment),
//! over `CudaAsyncMemory` and over a coalescing pool with a maximum size
//! over it, over pinned and over managed memory, on two non-blocking
//! streams; then copies from driver memory no container holds, and the
//! containers made without a resource. Each test reports itself SKIPPED
//! (and tests nothing) without a GPU.

mod common;

#[macro_use]
#[path = "../../../containers/tests/suite/mod.rs"]
mod suite;

use common::gpu;
use memres_core::pool::{CoalescingPool, PoolConfig};
use memres_core::Inspect;
use memres_core::{Shared, Stream};
use memres_cuda::{CudaAsyncMemory, CudaCopy, CudaStream, Device, StreamOptions};
use suite::Setup;

/// Two non-blocking streams (ordered with nothing but each other's events)
/// and the copy engine of the device.
struct Streams {
    a: CudaStream,
    b: CudaStream,
    engine: CudaCopy,
    device: Device,
}

impl Streams {
    fn new(device: Device) -> Streams {
        let options = StreamOptions { non_blocking: true, priority: 0 };
        Streams {
            a: CudaStream::with_options(device, options).unwrap(),
            b: CudaStream::with_options(device, options).unwrap(),
            engine: CudaCopy::new(device).unwrap(),
            device,
        }
    }

    fn synchronize(&self) {
        self.a.synchronize().unwrap();
        self.b.synchronize().unwrap();
    }

    /// More `u64`s than the device has bytes.
    fn more_than_the_device(&self) -> usize {
        (self.device.total_memory().unwrap() / 8 * 2) as usize
    }
}

mod over_async_memory {
    use super::*;

    /// The driver's stream-ordered allocator, on a pool of its own.
    pub(crate) struct Async {
        mr: CudaAsyncMemory,
        streams: Streams,
    }

    fn setup(test: &str) -> Option<Async> {
        let device = gpu(test)?;
        Some(Async { mr: CudaAsyncMemory::new(device).unwrap(), streams: Streams::new(device) })
    }

    impl Setup for Async {
        type S<'a> = &'a CudaStream;
        type R<'a> = &'a CudaAsyncMemory;
        type E<'a> = &'a CudaCopy;

        fn stream(&self) -> &CudaStream {
            &self.streams.a
        }
        fn other_stream(&self) -> &CudaStream {
            &self.streams.b
        }
        fn resource(&self) -> &CudaAsyncMemory {
            &self.mr
        }
        fn engine(&self) -> &CudaCopy {
            &self.streams.engine
        }
        fn used(&self) -> u64 {
            self.streams.synchronize();
            self.mr.used_bytes().unwrap()
        }
        fn charge(&self, _size: u64) -> Option<u64> {
            None // the driver rounds as it likes
        }
        fn held(&self) -> u64 {
            self.streams.synchronize();
            self.mr.reserved_bytes().unwrap()
        }
        fn too_many_u64(&self) -> usize {
            self.streams.more_than_the_device()
        }
    }

    container_suite!(setup);
}

/// A coalescing pool with a maximum size over a driver resource `U`.
mod over_a_pool {
    use super::*;
    use memres_core::copy::MemoryOf;
    use memres_core::MemoryResource;
    use memres_cuda::{CudaAsyncManagedMemory, ManagedMemory, PinnedMemory};

    /// The pool's maximum size.
    const MAX: u64 = 4 << 20;

    /// What a pool's upstream must offer: made for a device, and its bytes
    /// in use where the driver counts them.
    pub(crate) trait Upstream:
        for<'a> MemoryResource<&'a CudaStream> + MemoryOf<CudaCopy> + Sized + 'static
    {
        /// `None` where the device or driver has no such memory.
        fn make(device: Device) -> Option<Self>;
        fn used_bytes(&self) -> Option<u64>;
    }

    impl Upstream for CudaAsyncMemory {
        fn make(device: Device) -> Option<Self> {
            Some(CudaAsyncMemory::new(device).unwrap())
        }
        fn used_bytes(&self) -> Option<u64> {
            Some(CudaAsyncMemory::used_bytes(self).unwrap())
        }
    }

    // Host-visible memory: every copy and fill is checked against the live
    // pinned and managed allocations and waits for its stream.
    impl Upstream for PinnedMemory {
        fn make(device: Device) -> Option<Self> {
            Some(PinnedMemory::new(device).unwrap())
        }
        fn used_bytes(&self) -> Option<u64> {
            None
        }
    }

    impl Upstream for ManagedMemory {
        fn make(device: Device) -> Option<Self> {
            Some(ManagedMemory::new(device).unwrap())
        }
        fn used_bytes(&self) -> Option<u64> {
            None
        }
    }

    // Stream-ordered managed memory (CUDA 13): host-visible, as above.
    impl Upstream for CudaAsyncManagedMemory {
        fn make(device: Device) -> Option<Self> {
            match CudaAsyncManagedMemory::default_pool(device) {
                Ok(mr) => Some(mr),
                Err(e) if memres_cuda::driver_version().unwrap() < 13000 => {
                    eprintln!("SKIPPED: no pools of managed memory before CUDA 13 ({e})");
                    None
                }
                Err(e) => panic!("{e}"),
            }
        }
        fn used_bytes(&self) -> Option<u64> {
            None
        }
    }

    type Pool<U> = Shared<CoalescingPool<U>>;

    pub(crate) struct PoolSetup<U: Upstream> {
        pool: Pool<U>,
        streams: Streams,
    }

    fn setup<U: Upstream>(test: &str) -> Option<PoolSetup<U>> {
        let device = gpu(test)?;
        let streams = Streams::new(device);
        let config = PoolConfig::new().maximum_size(MAX);
        let pool = Shared::new(CoalescingPool::with_config(U::make(device)?, config, &&streams.a).unwrap());
        Some(PoolSetup { pool, streams })
    }

    impl<U: Upstream> Drop for PoolSetup<U> {
        fn drop(&mut self) {
            // Every test has freed all its blocks: all chunks go back.
            let stream = &self.streams.a;
            let given_back = self.pool.with(|p| p.release(&stream));
            stream.synchronize().unwrap();
            if !std::thread::panicking() {
                given_back.unwrap();
                assert_eq!(self.pool.with(|p| p.usage().held), 0);
                assert!(matches!(self.pool.with(|p| p.upstream().used_bytes()), None | Some(0)));
            }
        }
    }

    impl<U: Upstream> Setup for PoolSetup<U> {
        type S<'a> = &'a CudaStream;
        type R<'a> = &'a Pool<U>;
        type E<'a> = CudaCopy;

        fn stream(&self) -> &CudaStream {
            &self.streams.a
        }
        fn other_stream(&self) -> &CudaStream {
            &self.streams.b
        }
        fn resource(&self) -> &Pool<U> {
            &self.pool
        }
        fn engine(&self) -> CudaCopy {
            self.streams.engine.clone()
        }
        fn used(&self) -> u64 {
            self.streams.synchronize();
            self.pool.with(|p| {
                p.check().unwrap();
                p.usage().used
            })
        }
        fn charge(&self, size: u64) -> Option<u64> {
            Some(size.div_ceil(256) * 256)
        }
        fn held(&self) -> u64 {
            self.pool.with(|p| p.usage().held)
        }
        fn too_many_u64(&self) -> usize {
            (MAX / 8 + 1) as usize
        }
    }

    mod of_async_memory {
        use super::*;
        container_suite!(setup::<CudaAsyncMemory>);
    }

    mod of_pinned_memory {
        use super::*;
        container_suite!(setup::<PinnedMemory>);
    }

    mod of_managed_memory {
        use super::*;
        container_suite!(setup::<ManagedMemory>);
    }

    mod of_async_managed_memory {
        use super::*;
        container_suite!(setup::<CudaAsyncManagedMemory>);
    }
}

/// The legacy default stream (`()`) works as the containers' stream too.
#[test]
fn containers_on_the_legacy_default_stream() {
    let Some(device) = gpu("containers_on_the_legacy_default_stream") else { return };
    let mr = CudaAsyncMemory::new(device).unwrap();
    let engine = CudaCopy::new(device).unwrap();
    // `()` names the legacy stream of whatever context is current.
    let context = device.primary_context().unwrap();
    context.bind().unwrap();
    let mut v = memres_containers::DeviceUVector::from_slice_in(&[1.5f64, 2.5], (), &mr, engine).unwrap();
    v.resize(1000).unwrap();
    v.set_element_async(999, &-1.0).unwrap();
    assert_eq!(v.element(0).unwrap(), 1.5);
    assert_eq!(v.element(999).unwrap(), -1.0);
    let w = v.as_buffer().try_clone_on(()).unwrap();
    assert_eq!(w.len(), 8000);
    drop((v, w));
    // The frees were queued on the legacy stream: wait for them.
    memres_cuda::default_stream(device).unwrap().synchronize().unwrap();
    assert_eq!(mr.used_bytes().unwrap(), 0);
}

/// A copy from a raw device pointer of memory no container holds (a block
/// of `CudaMemory`, written by a memset, copied on two streams), and of
/// ranges that are no CUDA memory or run past the driver's allocation,
/// which `CudaCopy` refuses, the new block given back.
#[test]
fn copies_from_raw_pointers_to_driver_memory() {
    use memres_containers::{ContainerError, DeviceBuffer, DeviceUVector};
    use memres_core::adaptor::Statistics;
    use memres_core::{Error, MemoryResource, Request};
    use memres_cuda::CudaMemory;
    let Some(device) = gpu("copies_from_raw_pointers_to_driver_memory") else { return };
    let streams = Streams::new(device);
    let (a, b, engine) = (&streams.a, &streams.b, &streams.engine);
    let mr = Statistics::new(CudaMemory::new(device).unwrap());
    let raw = mr.allocate(Request::new(4096).unwrap(), &a).unwrap();
    common::fill(a, &raw, 0xDEAD_BEEF);
    // SAFETY: `raw` is device memory this test holds, from a resource that
    // is `MemoryOf<CudaCopy>`, written on `a`, which the copy is ordered on.
    let v = unsafe { DeviceUVector::<u32, _, _, _>::from_device_ptr_in(raw.addr(), 1024, a, &mr, engine) }
        .unwrap();
    b.wait(&a.record().unwrap()).unwrap();
    // SAFETY: the same memory; stream `b` waits for the memset on `a`.
    let w =
        unsafe { DeviceUVector::<u32, _, _, _>::from_device_ptr_in(raw.addr() + 2048, 512, b, &mr, engine) }
            .unwrap();
    let stack = [0u8; 64];
    let live = mr.get_allocations_counter().value;
    for (addr, len, what) in [
        (stack.as_ptr() as u64, 64, "a host stack buffer"),
        // (Just past the end may be the next allocation, such as `v`'s.)
        (raw.addr() + 2048, 4 << 20, "past the end of the driver's allocation"),
    ] {
        // SAFETY: a contract broken on purpose: `CudaCopy` asks the driver
        // about the range and refuses it, queueing nothing.
        let e = unsafe { DeviceBuffer::from_device_ptr_in(addr, len, a, &mr, engine) }.map(|_| ());
        assert_eq!(e, Err(ContainerError::Memory(Error::NotLive { addr, len })), "{what}");
        assert_eq!(mr.get_allocations_counter().value, live, "{what}: the new block went back");
    }
    // Both copies are queued before the source goes.
    streams.synchronize();
    mr.deallocate(raw, &a).unwrap();
    assert_eq!(v.to_vec().unwrap(), vec![0xDEAD_BEEF; 1024], "the copy outlives its source");
    assert_eq!(w.to_vec().unwrap(), vec![0xDEAD_BEEF; 512]);
    drop((v, w));
    streams.synchronize();
    assert_eq!(mr.get_allocations_counter().value, 0);
}

/// The containers made without a resource take the current resource of
/// their stream's device, set with its promise of `CudaCopy` memory; clones
/// and raw-pointer copies come from it too.
#[test]
fn containers_without_a_resource_use_the_devices_current_resource() {
    use memres_containers::{DeviceScalar, DeviceUVector};
    use memres_core::device::set_per_device_resource_of;
    use std::sync::Arc;
    let Some(device) = gpu("containers_without_a_resource_use_the_devices_current_resource") else { return };
    let streams = Streams::new(device);
    let mr = Arc::new(CudaAsyncMemory::new(device).unwrap());
    set_per_device_resource_of::<CudaStream, _, _>(
        device.ordinal(),
        mr.clone(),
        CudaCopy::new(device).unwrap(),
    );
    let stream = &streams.a;
    let v = DeviceUVector::<f32, _, CudaCopy, _>::from_slice(&[1.0, 2.0, 3.0], stream).unwrap();
    let w = v.try_clone().unwrap();
    // SAFETY: `v`'s memory, written on the same stream above.
    let c = unsafe {
        DeviceUVector::<f32, _, CudaCopy, _>::from_device_ptr(v.element_addr(1).unwrap(), 2, stream)
    }
    .unwrap();
    let mut s = DeviceScalar::<u64, _, CudaCopy, _>::new(stream).unwrap();
    s.set_value_async(&7).unwrap();
    assert_eq!(
        (w.to_vec().unwrap(), c.to_vec().unwrap(), s.value().unwrap()),
        (vec![1.0, 2.0, 3.0], vec![2.0, 3.0], 7)
    );
    assert!(mr.used_bytes().unwrap() > 0, "from the device's current resource");
    drop((v, w, c, s));
    streams.synchronize();
    assert_eq!(mr.used_bytes().unwrap(), 0);
}
