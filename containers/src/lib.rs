//! Stream-ordered RAII containers over any memres resource, as RMM's
//! `device_buffer`, `device_uvector<T>` and `device_scalar<T>`.
//!
//! A container holds a block from a [`MemoryResource`](memres_core::MemoryResource),
//! the stream it belongs to and the backend's [`CopyEngine`](memres_core::copy::CopyEngine);
//! dropping it frees the block on that stream to the resource it came from.
//!
//! | type | what it is |
//! | --- | --- |
//! | [`DeviceBuffer`] | untyped bytes: size, capacity, resize, alignment, deep copy (`Clone`, `try_clone`, into another resource with `try_clone_in`), change of stream |
//! | [`DeviceUVector`] | a vector of plain-old-data `T`, zeroed on creation (RMM's uninitialized creation is `unsafe`), aligned to `T` |
//! | [`DeviceScalar`] | one `T` in device memory |
//!
//! The resource `R` may be a reference (`&Pool`) or an `Arc`: both are
//! resources through the core's forwarding impls.
//!
//! # Constructors
//!
//! Every constructor comes twice, as RMM's default argument `mr =
//! get_current_device_resource()` (but for the device, which is the
//! stream's, not the thread's current one: `()` is device 0):
//!
//! | without a resource | with one |
//! | --- | --- |
//! | `new(len, stream)` | `new_in(len, stream, resource, engine)` |
//! | `new_uninit(len, stream)` (`unsafe`) | `new_uninit_in(len, stream, resource, engine)` |
//! | `from_slice(data, stream)` (`from_value` for a scalar) | `from_slice_in(data, stream, resource, engine)` |
//! | `from_device_ptr(src, len, stream)` (`unsafe`) | `from_device_ptr_in(src, len, stream, resource, engine)` |
//!
//! (A scalar's take no `len`.) The `_in` forms take any resource `R` and
//! engine `E` with `R: MemoryOf<E::Kind>`. The others take the current
//! resource of the stream's device ([`DeviceStream::device`](memres_core::device::DeviceStream::device), `()`
//! is device 0) from the process-wide registry, and the engine promised
//! with it: the resource must have been set with
//! [`set_per_device_resource_of`](memres_core::device::set_per_device_resource_of), which asks `R: MemoryOf<E>`, or made by
//! a backend's default factory that promises it. The registry's untyped
//! resources cannot be vouched for, so one set without the promise, such as
//! the simulator's default (a simulated device, numbers with no bytes
//! behind them), is refused with `InvalidConfig` rather than touched: over
//! the simulator, set host memory. The engine's type is named where the
//! container is made; the resource's is [`Current`]:
//!
//! ```
//! use memres_containers::{DeviceScalar, DeviceUVector};
//! use memres_core::device::set_per_device_resource_of;
//! use memres_sim::{HostCopy, HostMemory};
//! use std::sync::Arc;
//! set_per_device_resource_of::<(), _, _>(0, Arc::new(HostMemory::new()), HostCopy);
//! let v = DeviceUVector::<f32, _, HostCopy>::from_slice(&[1.0, 2.0], ())?;
//! let w = v.try_clone()?;
//! let s: DeviceScalar<u64, _, HostCopy> = DeviceScalar::new(())?;
//! assert_eq!((w.to_vec()?, s.value()?), (vec![1.0, 2.0], 0));
//! # Ok::<(), memres_containers::ContainerError>(())
//! ```
//!
//! [`Clone`] is RMM's copy construction: a deep copy on the container's
//! own stream, from the same resource, that panics if the copy fails
//! (with the typed error in its message). A device copy can fail where a
//! host copy cannot, so `try_clone` (on the container's stream) and
//! `try_clone_on` (on another) return the error instead; see
//! [`DeviceBuffer::try_clone`]. RMM's copy construction into another
//! memory resource is `try_clone_in(stream, resource)`: the copy is a
//! container of that resource's type, made by the same engine
//! ([`DeviceBuffer::try_clone_in`]).
//!
//! # The host view
//!
//! The elements are read and written by copies through the engine: one
//! element ([`element`](DeviceUVector::element),
//! [`set_element_async`](DeviceUVector::set_element_async), front and
//! back), a range ([`slice_to_vec`](DeviceUVector::slice_to_vec),
//! [`copy_to_slice_at`](DeviceUVector::copy_to_slice_at),
//! [`copy_from_slice_at`](DeviceUVector::copy_from_slice_at)), all
//! ([`to_vec`](DeviceUVector::to_vec)) or a batch at a time
//! ([`iter`](DeviceUVector::iter)). No container lends a Rust slice of its
//! memory, even where the memory is host memory: other code can free a
//! container's block at any moment (below), and the bytes under a live
//! `&[T]` would then be freed or another holder's. Holding the engine's
//! lock for a slice's life would keep every free out, but it is one lock
//! for all host copies: any copy made while the slice lives, by this thread
//! through another container, would deadlock.
//!
//! # What holds
//!
//! In safe code, a container touches only memory its resource handed out
//! for it (or, once other code has freed that, memory another holder has
//! now: see the last point), and only bytes that were written:
//!
//! - **Resource and engine agree.** The constructors take a resource `R`
//!   and an engine `E` only where `R:`
//!   [`MemoryOf<E::Kind>`](memres_core::copy::MemoryOf): the resource
//!   promises (an `unsafe` trait) that its blocks are memory the engine may
//!   read and write. Host memory goes with `HostCopy`, the CUDA resources
//!   with `CudaCopy`, and the adaptors, pools and arenas over them forward
//!   the promise; a simulated device, whose addresses have no bytes behind
//!   them, goes with neither. This does not compile:
//!
//! ```compile_fail,E0277
//! use memres_containers::DeviceBuffer;
//! use memres_sim::{HostCopy, SimDevice};
//! // `SimDevice: MemoryOf<HostCopy>` does not hold.
//! let _ = DeviceBuffer::from_slice_in(b"hello", (), &SimDevice::new(1 << 30), HostCopy);
//! ```
//!
//! - **Blocks as asked.** Every block a container gets is checked against
//!   its request; a shorter one goes back to the resource and the call
//!   fails with [`ContainerError::BlockTooShort`], one not aligned as asked
//!   (the container's alignment: `T`'s, at least 256 bytes, or more with
//!   `set_alignment`) with [`ContainerError::Misaligned`], the container
//!   unchanged.
//! - **No unwritten reads.** [`new`](DeviceBuffer::new) and
//!   [`resize`](DeviceBuffer::resize) write zeros (with the engine's `fill`,
//!   on the container's stream); `reserve` and `shrink_to_fit` keep the
//!   length, so spare capacity is never read. RMM's uninitialized creation
//!   and growth are `unsafe` (`new_uninit`, `resize_uninit`): the caller
//!   writes before reading. So is the copy from a raw device address
//!   (`from_device_ptr`): the engine can check that the range is live
//!   memory of its kind, not that it is the caller's and written
//!   ([`DeviceBuffer::from_device_ptr_in`] says why).
//! - **The current resource is memory of the engine.** The constructors
//!   without a resource take one from the registry only if it was promised
//!   as memory of the engine's type, by a `MemoryOf` bound or an `unsafe`
//!   call ([`memres_core::device`]).
//! - **Stream order.** A container's work is ordered on its stream, and it
//!   frees its block on that stream; a change of stream makes the new stream
//!   wait on an event of the old, and a deep copy on another stream waits on
//!   the source's stream and makes the source's stream wait on the copy. So
//!   the free comes after the work that used the block *on the stream*;
//!   whether the block is handed out again before that work has run is the
//!   resource's doing. A stream-ordered resource
//!   ([`StreamOrdered`](memres_core::StreamOrdered),
//!   [`PerStreamPool`](memres_core::per_stream::PerStreamPool), the
//!   [arena](memres_core::arena::ArenaResource), CUDA's own pool
//!   `CudaAsyncMemory`, `async` in a stack) reuses it only for work ordered
//!   after the free. One that ignores streams, such as a plain
//!   [`CoalescingPool`](memres_core::pool::CoalescingPool) (`pool(cuda)`),
//!   takes the block back at once on the host, and may hand it to work on
//!   another stream while the device still runs the old work on it (wrong
//!   data on the device, not on the host): it is right on one stream, or
//!   where a container is dropped only once every stream is done with its
//!   block. With several streams, take a stream-ordered resource. A
//!   [`DeviceStream`](memres_core::device::DeviceStream)
//!   whose `key` is another stream than itself (a safe trait; the workspace's
//!   streams are their own keys) breaks this for the containers made without
//!   a resource: their blocks are then freed on the key's stream, unordered
//!   with the work on theirs (wrong data on the device, not on the host). So
//!   does a stream whose `wait` does nothing (a safe trait too), for
//!   [`set_stream`](DeviceBuffer::set_stream) and a deep copy on another
//!   stream: the copy engines stay sound on work left unordered
//!   ([`CopyEngine`](memres_core::copy::CopyEngine)'s implementing).
//! - **Blocks freed by other code.** The types cannot stop other code from
//!   freeing a container's block through the resource itself (a copy of
//!   [`block`](DeviceBuffer::block), a forged
//!   [`Block`](memres_core::Block)) or ending the resource under it (a pool
//!   moved out of its [`Shared`](memres_core::Shared) lock through `with`
//!   and dropped). The resource's `MemoryOf` promise covers that too: an
//!   engine of host-addressable memory checks every access against the
//!   allocations live at that moment, under the lock they are freed under
//!   ([checked access](memres_core::copy#checked-access)). The container's
//!   later calls then fail with
//!   [`Error::NotLive`](memres_core::Error::NotLive), touching nothing, or,
//!   where the memory has been handed out again, read and write the new
//!   holder's bytes: wrong data, never freed or uninitialized memory. Where
//!   the memory was handed out again to the same container (a growth, a
//!   deep copy), the engine copies between ranges that overlap, which every
//!   engine copies as `memmove` does or refuses ([implementing a
//!   `CopyEngine`](memres_core::copy::CopyEngine#implementing)). A pool
//!   dropped under a live block keeps the chunk that holds it (never given
//!   back upstream, so never handed out again): the container's calls go
//!   on in that memory, which stays allocated until the process ends. Its
//!   drop's free is refused by the resource (and ignored), or frees the
//!   memory under its new holder, which then fares the same.
//!
//! What remains outside these guarantees: unsafe code that reads or writes
//! a block's bytes through its address (a kernel, a raw pointer) is not
//! guarded: a stale container may write them, one of its own resource if
//! other code can free its blocks, and one of *any* resource of the same
//! memory in the process once the allocator hands a freed address out again
//! (the table of live ranges knows which are live, not whose), so such code
//! holds no reference to the bytes while containers over that memory may
//! run elsewhere; and over plain CUDA device memory, a block
//! freed by other code after `CudaCopy` asked the driver about it and
//! before the device ran the queued copy is written on the device anyway
//! (device bytes of whoever holds them then, or a driver error), as in RMM.
//!
//! A resource the types cannot vouch for, such as a stack chosen at run
//! time, is promised by hand with
//! [`AssumeMemoryOf`](memres_core::copy::AssumeMemoryOf):
//!
//! ```
//! use memres_containers::DeviceUVector;
//! use memres_core::copy::AssumeMemoryOf;
//! use memres_core::MemoryResource;
//! use memres_sim::{HostCopy, HostMemory};
//! let stack: Box<dyn MemoryResource> = Box::new(HostMemory::new());
//! // SAFETY: the box holds host memory, whose blocks `HostCopy` may touch.
//! let mr = unsafe { AssumeMemoryOf::<_, HostCopy>::new(stack) };
//! let v = DeviceUVector::from_slice_in(&[1u16, 2], (), &mr, HostCopy)?;
//! assert_eq!(v.to_vec()?, [1, 2]);
//! # Ok::<(), memres_containers::ContainerError>(())
//! ```

/// The stream methods and `try_clone` of a container that wraps a
/// [`DeviceBuffer`] in field `$field`: written once for
/// [`DeviceUVector`] and [`DeviceScalar`]. `$make` builds the container
/// from the cloned buffer `$b`.
macro_rules! over_buffer {
    ($what:literal, $field:ident, |$b:ident| $make:expr) => {
        #[doc = concat!("The stream the ", $what, "'s work is ordered on.")]
        pub fn stream(&self) -> &S {
            self.$field.stream()
        }

        #[doc = concat!("Makes `stream` the ", $what, "'s stream (see [`DeviceBuffer::set_stream`](crate::DeviceBuffer::set_stream)).")]
        ///
        /// # Errors
        ///
        /// The stream's error.
        pub fn set_stream(&mut self, stream: S) -> Result<()> {
            self.$field.set_stream(stream)
        }

        #[doc = concat!("A deep copy on the ", $what, "'s stream (see [`DeviceBuffer::try_clone`](crate::DeviceBuffer::try_clone): the error that `Clone` panics with).")]
        ///
        /// # Errors
        ///
        /// As [`DeviceBuffer::try_clone_on`](crate::DeviceBuffer::try_clone_on).
        pub fn try_clone(&self) -> Result<Self>
        where
            R: Clone,
            E: Clone,
            S: Clone,
        {
            let $b = self.$field.try_clone()?;
            Ok($make)
        }
    };
}

mod buffer;
mod clone;
mod current;
mod error;
mod scalar;
mod uvector;

pub use buffer::DeviceBuffer;
pub use current::Current;
pub use error::{ContainerError, Result};
pub use scalar::DeviceScalar;
pub use uvector::{DeviceUVector, Iter};
