//! What differs between the two builds of this crate: the stream type, the
//! leaves of stack strings, the copy engine and how a Python stream handle
//! becomes a stream. Everything else is written once over these names.
//!
//! Without feature `cuda` (`memres._memres`): streams are `()` (the
//! simulated device and host memory run no kernels, so every call is
//! ordered), the leaves are `sim` and `host` (counted in the device gauge)
//! and `vpool`. With `cuda` (`memres._cuda`): streams are the caller's
//! `cudaStream_t`, the leaves are `memres_cuda::stack`'s.

use crate::errors::GilFree;
use memres_core::adaptor::Gauge;
use std::sync::{Arc, OnceLock};

/// Devices `0..MAX_DEVICES` are served.
pub(crate) const MAX_DEVICES: usize = 64;

/// Bytes held from each device by every leaf this module built.
pub(crate) fn gauge(device: u32) -> Result<Arc<Gauge>, GilFree> {
    static GAUGES: [OnceLock<Arc<Gauge>>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];
    let slot = GAUGES.get(device as usize).ok_or_else(|| {
        GilFree::Value(format!("memres: device {device} out of range (0 to {})", MAX_DEVICES - 1))
    })?;
    Ok(slot.get_or_init(Default::default).clone())
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::{gauge, GilFree};
    use memres_core::adaptor::Counted;
    use memres_core::stack::StackBuilder;
    use memres_core::stack::StackError;
    use memres_core::{DynResource, MemoryResource};
    use memres_sim::{HostCopy, HostMemory};
    use pyo3::PyResult;
    use std::sync::{Arc, Mutex, PoisonError, Weak};

    /// No stream: nothing runs on the simulated device or on the host.
    pub(crate) type Stream = ();
    /// Host memory's `memcpy`, every access checked.
    pub(crate) type Engine = HostCopy;
    /// The backend's name, as `memres` reports it.
    pub(crate) const BACKEND: &str = "sim";
    /// Why the C functions of this backend refuse a device whose resource
    /// is of the other.
    pub(crate) const OTHER_BACKENDS_RESOURCE: &str =
        "the device's current resource is a CUDA one: the simulated backend's C functions serve only a simulated one";
    /// The backend's plain leaf, under the C functions' default stack
    /// ([`c_default_stack`](super::c_default_stack)).
    pub(crate) const DEFAULT_LEAF: &str = "host";
    /// The leaves a snapshot counts as segments.
    pub(crate) const SEGMENT_LEAVES: &[&str] = &["sim", "host"];

    /// Any handle names the one order of the host.
    ///
    /// # Safety
    ///
    /// None here; the CUDA backend's contract, so that callers are written
    /// once for both.
    pub(crate) unsafe fn stream(_handle: u64, _device: u32) -> PyResult<Stream> {
        Ok(())
    }

    /// The device's default stream.
    pub(crate) fn default_stream(_device: u32) -> Result<Stream, GilFree> {
        Ok(())
    }

    /// The handle [`stream`] takes back: any.
    pub(crate) fn handle_of(_stream: &Stream) -> u64 {
        0
    }

    /// A stream made for `memres.Stream()`: only a number, since the
    /// simulated device runs no work (any handle names its one order).
    #[derive(Debug)]
    pub(crate) struct MadeStream(u64);

    /// A number no other made stream has, above the default streams' 0-2
    /// (blocking or not, a simulated stream orders nothing).
    pub(crate) fn make_stream(_device: u32, _non_blocking: bool) -> PyResult<MadeStream> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0x1000);
        Ok(MadeStream(NEXT.fetch_add(1, Ordering::Relaxed)))
    }

    /// The handle of a made stream.
    pub(crate) fn made_handle(stream: &MadeStream) -> u64 {
        stream.0
    }

    pub(crate) fn engine(_device: u32) -> PyResult<Engine> {
        Ok(HostCopy)
    }

    /// No driver pools without CUDA.
    pub(crate) fn note_driver_pools(_device: u32, _built: &memres_core::stack::Built<Stream>) {}

    /// No driver pools without CUDA: `(0, 0)`.
    pub(crate) fn driver_reserved(_device: u32) -> (u64, u64) {
        (0, 0)
    }

    /// No device to ask without CUDA: 0, as a snapshot's `oom` says where
    /// it is not known.
    pub(crate) fn device_free(_device: u32) -> u64 {
        0
    }

    /// No device to ask without CUDA.
    pub(crate) fn memory_info(_device: u32) -> PyResult<(u64, u64)> {
        Err(pyo3::exceptions::PyValueError::new_err(
            "memres: the simulated backend has no device memory to ask about",
        ))
    }

    /// No driver pool without CUDA.
    pub(crate) fn default_memory_pool(_device: u32, _managed: bool) -> PyResult<u64> {
        Err(pyo3::exceptions::PyValueError::new_err(
            "memres: the simulated backend has no driver memory pool",
        ))
    }

    /// Host memory does not migrate: nothing to prefetch.
    pub(crate) fn prefetch(
        _addr: u64,
        _size: u64,
        _device: u32,
        _to: Option<u32>,
        _stream: &Stream,
    ) -> PyResult<bool> {
        Ok(false)
    }

    /// The numbers of resources that must not share addresses while they
    /// live (each `sim`'s device, each `vpool`'s space): the lowest whose
    /// resource is gone, so that a process may make and drop them without
    /// end. The limit is on those living at once (`memres_sim`'s).
    struct Numbers(Mutex<Vec<Weak<dyn MemoryResource<Stream> + Send + Sync>>>);

    impl Numbers {
        const fn new() -> Self {
            Numbers(Mutex::new(Vec::new()))
        }

        /// What `make` builds with the lowest free number, which stays
        /// taken while it lives. The lock is held while it is built, so
        /// two threads never take one number; `make` builds a leaf, which
        /// takes no other number of this kind.
        fn build(
            &self,
            make: impl FnOnce(u64) -> Result<DynResource<Stream>, StackError>,
        ) -> Result<DynResource<Stream>, StackError> {
            let mut taken = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            let nth = taken.iter().position(|w| w.strong_count() == 0).unwrap_or(taken.len());
            let made = make(nth as u64)?;
            let weak = Arc::downgrade(&made);
            match taken.get_mut(nth) {
                Some(slot) => *slot = weak,
                None => taken.push(weak),
            }
            Ok(made)
        }
    }

    /// The core's names, `vpool`, and `sim` and `host` counted in the
    /// device gauge; each `sim` and each `vpool` of the process has
    /// addresses no other living one has.
    pub(crate) fn builder(device: u32) -> Result<StackBuilder<Stream>, GilFree> {
        let g = gauge(device)?;
        let mut b = memres_sim::builder::<Stream>();
        let g2 = g.clone();
        b.register("sim", move |call, cx| {
            // Each resource is a stack of its own: a device of the process
            // has addresses no other living one has.
            static DEVICES: Numbers = Numbers::new();
            DEVICES
                .build(|nth| Ok(cx.keep(call, Counted::new(memres_sim::sim_device(call, nth)?, g2.clone()))))
        });
        b.register("vpool", |call, cx| {
            // So is each simulated address space.
            static SPACES: Numbers = Numbers::new();
            SPACES.build(|nth| memres_sim::keep_vpool(call, cx, nth))
        });
        b.register_leaf_of::<Engine>("host", move |call, cx| {
            call.expect_args(0, &[])?;
            Ok(cx.keep_leaf_of(call, Counted::new(HostMemory::new(), g.clone())))
        });
        Ok(b)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{gauge, GilFree, MAX_DEVICES};
    use crate::errors::backend_error;
    use memres_core::stack::StackBuilder;
    use memres_cuda::stack::DriverPools;
    use memres_cuda::{Context, CudaCopy, CudaStream, Device};
    use pyo3::PyResult;
    use std::sync::{Mutex, OnceLock};

    /// The caller's `cudaStream_t`, borrowed.
    pub(crate) type Stream = CudaStream;
    /// The driver's copies, ordered on the stream.
    pub(crate) type Engine = CudaCopy;
    /// The backend's name, as `memres` reports it.
    pub(crate) const BACKEND: &str = "cuda";
    /// Why the C functions of this backend refuse a device whose resource
    /// is of the other.
    pub(crate) const OTHER_BACKENDS_RESOURCE: &str =
        "the device's current resource is a simulated one (memres's sim backend): PyTorch's allocations need a CUDA resource";
    /// The backend's plain leaf, under the C functions' default stack
    /// ([`c_default_stack`](super::c_default_stack)).
    pub(crate) const DEFAULT_LEAF: &str = "cuda";
    /// The leaves a snapshot counts as segments (device memory).
    pub(crate) const SEGMENT_LEAVES: &[&str] = &["async", "cuda", "managed", "vmm"];

    fn device_of(device: u32) -> Result<Device, GilFree> {
        Device::get(device).map_err(|e| GilFree::Backend(format!("device {device}: {e}")))
    }

    /// The primary context of `device` (kept for the process; after its
    /// first use a lookup with no driver call: a stream is named with it on
    /// every call of PyTorch's).
    fn context(device: u32) -> Result<Context, GilFree> {
        Context::primary(device).map_err(|e| GilFree::Backend(format!("device {device}: {e}")))
    }

    /// Names the caller's stream: 0 and `CU_STREAM_LEGACY` (1) are the
    /// legacy default stream of the device's primary context (the thread
    /// may have no current context); any other handle is asked for its own
    /// context when one is needed.
    ///
    /// # Safety
    ///
    /// `handle` is 0 or a stream handle of `device` that stays valid for as
    /// long as the stream returned, and everything it is given to (a
    /// buffer, a stack, a deferred free), uses it.
    pub(crate) unsafe fn stream(handle: u64, device: u32) -> PyResult<Stream> {
        if handle == 0 || handle as usize == memres_cuda::sys::CU_STREAM_LEGACY {
            return Ok(default_stream(device)?);
        }
        // A per-thread stream is named with its device's context, which its
        // calls then use on any thread (a buffer collected on another).
        let known = match handle as usize {
            memres_cuda::sys::CU_STREAM_PER_THREAD => Some(context(device)?),
            _ => None,
        };
        // SAFETY: a live stream handle for as long as it is used (the
        // contract); the borrowed handle never destroys the stream. The
        // context given to a per-thread stream is the device's primary one:
        // the package makes no other current, and the CUDA runtime, whose
        // per-thread streams CuPy, PyTorch and Numba name, works in it. For
        // any other handle none is claimed (the driver is asked for the
        // stream's).
        Ok(unsafe { CudaStream::from_raw(handle as usize as *mut std::ffi::c_void as _, known) })
    }

    /// The legacy default stream of the device's primary context.
    pub(crate) fn default_stream(device: u32) -> Result<Stream, GilFree> {
        Ok(CudaStream::legacy_in(context(device)?))
    }

    /// The device whose memory `addr` lies in, as the driver tells it
    /// (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`); `None` where the driver
    /// does not know the address.
    pub(crate) fn pointer_device(addr: u64) -> Option<u32> {
        let mut ordinal: std::ffi::c_int = -1;
        // SAFETY: `ordinal` is a valid out-pointer of the attribute's type
        // (int); the driver answers for any address (an address it does
        // not know is an error code, handled below) and writes nothing
        // else.
        let code = unsafe {
            memres_cuda::sys::cuPointerGetAttribute(
                (&mut ordinal as *mut std::ffi::c_int).cast(),
                memres_cuda::sys::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                addr,
            )
        };
        (code == memres_cuda::sys::CUDA_SUCCESS).then_some(()).and_then(|()| u32::try_from(ordinal).ok())
    }

    /// The handle of `stream`, which [`stream`] takes back.
    pub(crate) fn handle_of(stream: &Stream) -> u64 {
        stream.raw() as usize as u64
    }

    /// A stream made for `memres.Stream()`: owned, destroyed when dropped.
    pub(crate) type MadeStream = CudaStream;

    /// A new stream on `device`'s primary context at the default priority,
    /// blocking (ordered with the legacy default stream, as RMM's
    /// `Stream()` makes one) unless `non_blocking`.
    pub(crate) fn make_stream(device: u32, non_blocking: bool) -> PyResult<MadeStream> {
        let options = memres_cuda::StreamOptions { non_blocking, priority: 0 };
        CudaStream::in_context(context(device)?, options)
            .map_err(|e| backend_error(format!("device {device}: a new stream: {e}")))
    }

    /// The handle of a made stream.
    pub(crate) fn made_handle(stream: &MadeStream) -> u64 {
        handle_of(stream)
    }

    pub(crate) fn engine(device: u32) -> PyResult<Engine> {
        Ok(CudaCopy::in_context(context(device)?))
    }

    /// The driver pools under the `async` leaves built for each device, to
    /// ask the driver what they reserve (which can exceed what memres holds
    /// from them).
    fn driver_pools(device: u32) -> Option<&'static Mutex<DriverPools>> {
        static POOLS: [OnceLock<Mutex<DriverPools>>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];
        Some(POOLS.get(device as usize)?.get_or_init(Default::default))
    }

    /// Remembers the `async` leaves of a stack just built for `device`.
    pub(crate) fn note_driver_pools(device: u32, built: &memres_core::stack::Built<Stream>) {
        if let Some(pools) = driver_pools(device) {
            pools.lock().unwrap_or_else(|p| p.into_inner()).note(built);
        }
    }

    /// Bytes the driver's pools under the live `async` leaves of `device`
    /// reserve: `(now, the sum of their peaks)`, each pool once.
    pub(crate) fn driver_reserved(device: u32) -> (u64, u64) {
        driver_pools(device)
            .map_or((0, 0), |pools| pools.lock().unwrap_or_else(|p| p.into_inner()).reserved())
    }

    /// Free bytes of `device` now (`cuMemGetInfo`; 0 where the driver
    /// cannot say), for a snapshot's `oom` event.
    pub(crate) fn device_free(device: u32) -> u64 {
        context(device).ok().and_then(|c| c.memory_info().ok()).map_or(0, |info| info.free)
    }

    /// Free and total bytes of `device` now (`cuMemGetInfo`).
    pub(crate) fn memory_info(device: u32) -> PyResult<(u64, u64)> {
        let info = context(device)?.memory_info().map_err(|e| crate::errors::to_py(e, "memory_info"))?;
        Ok((info.free, info.total))
    }

    /// The handle of `device`'s default memory pool
    /// (`cuDeviceGetDefaultMemPool`), which `async(pool=default)` views, or
    /// with `managed` of its default pool of managed memory (CUDA 13),
    /// which `async(pool=managed)` views.
    pub(crate) fn default_memory_pool(device: u32, managed: bool) -> PyResult<u64> {
        let device = device_of(device)?;
        let to_py = |e| crate::errors::to_py(e, "default_memory_pool");
        let pool = match managed {
            false => memres_cuda::CudaAsyncMemory::default_pool(device).map_err(to_py)?.pool_handle(),
            true => memres_cuda::CudaAsyncManagedMemory::default_pool(device).map_err(to_py)?.pool_handle(),
        };
        Ok(pool as u64)
    }

    /// Prefetches managed memory to device `to` (the host for `None`) on
    /// `stream`, whose device is `device`; `false` for memory that does not
    /// migrate.
    pub(crate) fn prefetch(
        addr: u64,
        size: u64,
        device: u32,
        to: Option<u32>,
        stream: &Stream,
    ) -> PyResult<bool> {
        let context = context(device)?;
        match to {
            Some(to) => memres_cuda::prefetch(addr, size, device_of(to)?, &context, stream),
            None => memres_cuda::prefetch_to_host(addr, size, &context, stream),
        }
        .map_err(|e| crate::errors::to_py(e, "prefetch"))
    }

    /// The core's names and the CUDA leaves of `device`, counted in its
    /// gauge.
    pub(crate) fn builder(device: u32) -> Result<StackBuilder<Stream>, GilFree> {
        let mut b = StackBuilder::new();
        memres_cuda::stack::register(&mut b, device_of(device)?, gauge(device)?);
        Ok(b)
    }
}

/// What the C functions give a device nobody set a resource for: the C
/// library's `DEFAULT_STACK` (memres-cuda-capi) over the backend's leaf,
/// which is that very stack with CUDA.
pub(crate) fn c_default_stack() -> String {
    format!("stats(pool({DEFAULT_LEAF}, per_stream=true, growth=32, granule=2MiB))")
}

#[cfg(feature = "cuda")]
pub(crate) use imp::pointer_device;
pub(crate) use imp::{
    default_memory_pool, default_stream, device_free, driver_reserved, engine, handle_of, made_handle,
    make_stream, memory_info, note_driver_pools, prefetch, stream, Engine, MadeStream, Stream, BACKEND,
    DEFAULT_LEAF, OTHER_BACKENDS_RESOURCE,
};

/// The builder of `device`'s stacks: the backend's leaves and the core's
/// names, the leaves tapped into `map` when a snapshot is recorded
/// (`snapshot`).
pub(crate) fn builder(
    device: u32,
    map: Option<&crate::snapshot::Map>,
) -> Result<memres_core::stack::StackBuilder<Stream>, GilFree> {
    let mut b = imp::builder(device)?;
    if let Some(map) = map {
        crate::snapshot::tap_leaves(&mut b, imp::builder(device)?, imp::SEGMENT_LEAVES, map);
    }
    Ok(b)
}
