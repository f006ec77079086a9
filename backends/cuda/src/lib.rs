//! The CUDA backend of memres: device, stream-ordered, managed and pinned
//! memory from the CUDA driver, and CUDA streams and events as the core's
//! [`Stream`](memres_core::Stream) model.
//!
//! | type | driver calls | RMM counterpart |
//! | --- | --- | --- |
//! | [`CudaMemory`] | `cuMemAlloc` / `cuMemFree` | `cuda_memory_resource` |
//! | [`CudaAsyncMemory`] | `cuMemAllocFromPoolAsync` / `cuMemFreeAsync` on its own pool, the device's default pool, or a pool made elsewhere | `cuda_async_memory_resource`, `cuda_async_view_memory_resource` |
//! | [`ManagedMemory`] | `cuMemAllocManaged` | `managed_memory_resource` |
//! | [`CudaAsyncManagedMemory`] | `cuMemAllocFromPoolAsync` / `cuMemFreeAsync` on the device's default pool of managed memory (CUDA 13) | `cuda_async_managed_memory_resource` |
//! | [`Prefetch`] | `cuMemPrefetchAsync` on each allocation | `prefetch_resource_adaptor` |
//! | [`CudaCopy`] | `cuMemcpy*Async`, `cuMemsetD8Async` | the copies inside `device_buffer`, `device_uvector` |
//! | [`PinnedMemory`] | `cuMemHostAlloc` / `cuMemFreeHost` | `pinned_memory_resource` |
//! | [`CudaVirtualSpace`] | `cuMemAddressReserve`, `cuMemCreate` / `cuMemMap`: the reservable space of a [`VirtualPool`](memres_core::vpool::VirtualPool) | (the driver pool's and PyTorch's expandable segments' virtual memory) |
//! | [`CudaStream`], [`CudaEvent`], [`StreamPool`] | `cuStream*`, `cuEvent*` | `cuda_stream`, `cuda_stream_pool` |
//! | [`Device`], [`Context`] | `cuDevice*`, primary contexts | `cuda_device_id` |
//!
//! The resources are also the leaves `async`, `cuda`, `managed`, `pinned`
//! and `vmm` of the core's stack strings, and [`Prefetch`] the layer
//! `prefetch` ([`stack`]).
//!
//! Every resource implements [`memres_core::MemoryResource`] and so stacks
//! under the core's algorithms (a [`CoalescingPool`](memres_core::pool::CoalescingPool)
//! over [`CudaAsyncMemory`], say). Every block is aligned to 256 bytes, or
//! more when asked. Driver errors are [`memres_core::Error`] values: out of
//! memory with its figures, a free of an unknown address as
//! [`UnknownBlock`](memres_core::Error::UnknownBlock), anything else as
//! [`Backend`](memres_core::Error::Backend) with the `CUresult` code and its
//! name. Nothing here panics, and drops ignore driver errors.
//!
//! # Contexts
//!
//! Each resource and stream holds its device's primary context and makes
//! it current for the calls that need one, restoring the caller's context
//! afterwards (a thread that had none keeps device 0's, as the CUDA
//! runtime binds it): any thread may use any resource, with no set-up. A primary
//! context is retained at its first use and kept for the rest of the
//! process, as the CUDA runtime keeps it ([`Context`] says why).
//!
//! # Building
//!
//! The crate links `libcuda` through `cust` (whose build script reads
//! `CUDA_LIBRARY_PATH`, or finds a CUDA toolkit in the usual places). A
//! machine without a GPU can build and run it: [`init`] then fails with
//! `CUDA_ERROR_NO_DEVICE` and [`Device::count`] is 0. It builds for 64-bit
//! hosts only, as CUDA runs on no other: sizes and addresses are `u64` in
//! the core and `size_t` or pointers in the driver, and the casts between
//! them are lossless there.
//!
//! The newest driver function it links is `cuGetProcAddress` (CUDA 11.3).
//! [`Prefetch`]'s `cuMemPrefetchAsync`, whose form changed in CUDA 12.2, is
//! looked up at run time in the form the driver has
//! ([`sys::MemPrefetchAsync`]), so that no driver refuses to load a program
//! for it. The tests run both forms on a driver of CUDA 13 (a program built
//! for CUDA 12.0 gets the older form there). So is [`CudaAsyncManagedMemory`]'s
//! `cuMemGetDefaultMemPool`, which only CUDA 13 drivers have
//! ([`sys::get_default_mem_pool`]).
//!
//! # Example
//!
//! ```no_run
//! use memres_core::{MemoryResource, Request, Stream};
//! use memres_cuda::{default_resource, CudaStream, Device};
//! let device = Device::get(0)?;
//! let mr = default_resource(device)?;
//! let stream = CudaStream::new(device)?;
//! let block = mr.allocate(Request::new(1 << 20)?, &stream)?;
//! mr.deallocate(block, &stream)?;
//! stream.synchronize()?;
//! # Ok::<(), memres_core::Error>(())
//! ```
#![warn(missing_docs)]

#[cfg(not(target_pointer_width = "64"))]
compile_error!(
    "memres-cuda needs a 64-bit host, as CUDA does: its `u64` to `usize` casts are lossless only there"
);

mod async_managed;
mod async_memory;
mod context;
mod copy;
mod device_memory;
mod error;
#[cfg(test)]
mod fake;
mod host_visible;
mod live;
mod managed;
mod pinned;
mod place;
mod stream;
mod vmm;

pub mod ops;
pub mod stack;
pub mod sys;

pub use async_managed::CudaAsyncManagedMemory;
pub use async_memory::{reserved_by, AsyncConfig, CudaAsyncMemory, IpcHandle};
pub use context::{driver_version, init, Context, Device, MemoryInfo};
pub use copy::CudaCopy;
pub use device_memory::CudaMemory;
pub use error::{error_from_code, error_name};
pub use managed::{prefetch, prefetch_to_host, ManagedMemory, Prefetch};
pub use pinned::PinnedMemory;
pub use stream::{AsRawStream, CudaEvent, CudaStream, StreamOptions, StreamPool};
pub use vmm::{CudaVirtualSpace, DriverCalls};

/// The resource a device starts with: stream-ordered allocation from a new
/// pool of its own ([`CudaAsyncMemory`] with [`AsyncConfig::new`]: starts
/// empty, keeps what it reserves). This is what a per-device registry hands
/// out until the user sets another.
///
/// # Errors
///
/// As [`CudaAsyncMemory::with_config`].
///
/// # Examples
///
/// ```no_run
/// let mr = memres_cuda::default_resource(memres_cuda::Device::current()?)?;
/// # Ok::<(), memres_core::Error>(())
/// ```
pub fn default_resource(device: Device) -> Result<CudaAsyncMemory, memres_core::Error> {
    CudaAsyncMemory::new(device)
}

/// The default stream of `device`: its legacy default stream, bound to the
/// device's primary context (the stream that `()` stands for when the
/// device's context is current).
///
/// # Errors
///
/// The driver's error as [`Backend`](memres_core::Error::Backend).
pub fn default_stream(device: Device) -> Result<CudaStream, memres_core::Error> {
    device.default_stream()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_is_shareable_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<CudaMemory>();
        send_sync::<CudaAsyncMemory>();
        send_sync::<ManagedMemory>();
        send_sync::<Prefetch<ManagedMemory>>();
        send_sync::<PinnedMemory>();
        send_sync::<CudaStream>();
        send_sync::<CudaEvent>();
        send_sync::<StreamPool>();
        send_sync::<Context>();
        send_sync::<CudaCopy>();
        send_sync::<CudaVirtualSpace>();
    }

    #[test]
    fn without_a_gpu_there_are_no_devices_and_no_panics() {
        // On a machine with a GPU this checks nothing about absence: it
        // checks that the calls agree with each other.
        match init() {
            Ok(()) => assert!(Device::count().is_ok()),
            Err(e) => {
                assert!(matches!(e, memres_core::Error::Backend { .. }), "{e:?}");
                if e == error_from_code(sys::CUDA_ERROR_NO_DEVICE) {
                    assert_eq!(Device::count(), Ok(0));
                } else {
                    assert!(Device::count().is_err());
                }
                assert!(Device::get(0).is_err());
                assert!(Device::current().is_err());
            }
        }
    }
}
