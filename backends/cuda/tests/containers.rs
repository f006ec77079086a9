//! The containers over CUDA memory, with `CudaCopy`: the same assertions as
//! the host backend's container tests (`containers/tests/suite/mod.rs`),
//! over `CudaAsyncMemory` and over a coalescing pool with a maximum size
//! over it, over pinned and over managed memory, on two non-blocking
//! streams. Each test reports itself SKIPPED
//! (and tests nothing) without a GPU.

mod common;

#[macro_use]
#[path = "../../../containers/tests/suite/mod.rs"]
mod suite;

use common::gpu;
use memres_core::pool::{CoalescingPool, PoolConfig};
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
    use memres_cuda::{ManagedMemory, PinnedMemory};

    /// The pool's maximum size.
    const MAX: u64 = 4 << 20;

    /// What a pool's upstream must offer: made for a device, and its bytes
    /// in use where the driver counts them.
    pub(crate) trait Upstream:
        for<'a> MemoryResource<&'a CudaStream> + MemoryOf<CudaCopy> + 'static
    {
        fn make(device: Device) -> Self;
        fn used_bytes(&self) -> Option<u64>;
    }

    impl Upstream for CudaAsyncMemory {
        fn make(device: Device) -> Self {
            CudaAsyncMemory::new(device).unwrap()
        }
        fn used_bytes(&self) -> Option<u64> {
            Some(CudaAsyncMemory::used_bytes(self).unwrap())
        }
    }

    // Host-visible memory: every copy and fill is checked against the live
    // pinned and managed allocations and waits for its stream.
    impl Upstream for PinnedMemory {
        fn make(device: Device) -> Self {
            PinnedMemory::new(device).unwrap()
        }
        fn used_bytes(&self) -> Option<u64> {
            None
        }
    }

    impl Upstream for ManagedMemory {
        fn make(device: Device) -> Self {
            ManagedMemory::new(device).unwrap()
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
        let pool = Shared::new(CoalescingPool::with_config(U::make(device), config, &&streams.a).unwrap());
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
                assert_eq!(self.pool.with(|p| p.pool_size()), 0);
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
                p.used_bytes()
            })
        }
        fn charge(&self, size: u64) -> Option<u64> {
            Some(size.div_ceil(256) * 256)
        }
        fn held(&self) -> u64 {
            self.pool.with(|p| p.pool_size())
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
