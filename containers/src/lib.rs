//! Stream-ordered RAII containers over any memres resource, as RMM's
//! `device_buffer`, `device_uvector<T>` and `device_scalar<T>`.
//!
//! A container holds a block from a [`MemoryResource`](memres_core::MemoryResource),
//! the stream it belongs to and the backend's [`CopyEngine`](memres_core::copy::CopyEngine);
//! dropping it frees the block on that stream to the resource it came from.
//!
//! | type | what it is |
//! | --- | --- |
//! | [`DeviceBuffer`] | untyped bytes: size, capacity, resize, deep copy, change of stream |
//! | [`DeviceUVector`] | a vector of plain-old-data `T`, zeroed on creation (RMM's uninitialized creation is `unsafe`) |
//! | [`DeviceScalar`] | one `T` in device memory |
//!
//! The resource `R` may be a reference (`&Pool`) or an `Arc`: both are
//! resources through the core's forwarding impls.
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
//! let _ = DeviceBuffer::from_slice(b"hello", (), &SimDevice::new(1 << 30), HostCopy);
//! ```
//!
//! - **Blocks as long as asked.** Every block a container gets is checked
//!   against its request; a shorter one goes back to the resource and the
//!   call fails with [`ContainerError::BlockTooShort`], the container
//!   unchanged.
//! - **No unwritten reads.** [`new`](DeviceBuffer::new) and
//!   [`resize`](DeviceBuffer::resize) write zeros (with the engine's `fill`,
//!   on the container's stream); `reserve` and `shrink_to_fit` keep the
//!   length, so spare capacity is never read. RMM's uninitialized creation
//!   and growth are `unsafe` (`new_uninit`, `resize_uninit`): the caller
//!   writes before reading.
//! - **Stream order.** A container's work is ordered on its stream; a change
//!   of stream and a deep copy on another stream wait on events both ways,
//!   so a block is freed on drop only after the work that used it.
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
//!   holder's bytes: wrong data, never freed or uninitialized memory. Its
//!   drop's free is refused by the resource (and ignored), or frees the
//!   memory under its new holder, which then fares the same.
//!
//! What remains outside these guarantees: unsafe code that reads or writes
//! a block's bytes through its address (a kernel, a raw pointer) must keep
//! the resource where no other code can free its blocks, since a stale
//! container may write them; and over plain CUDA device memory, a block
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
//! let v = DeviceUVector::from_slice(&[1u16, 2], (), &mr, HostCopy)?;
//! assert_eq!(v.to_vec()?, [1, 2]);
//! # Ok::<(), memres_containers::ContainerError>(())
//! ```

mod buffer;
mod error;
mod scalar;
mod uvector;

pub use buffer::DeviceBuffer;
pub use error::{ContainerError, Result};
pub use scalar::DeviceScalar;
pub use uvector::DeviceUVector;
