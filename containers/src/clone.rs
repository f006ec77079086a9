//! `Clone` for the containers: RMM's copy construction, a deep copy on the
//! container's own stream from the same resource, that panics where the
//! copy fails (as `Vec::clone` does when the allocator fails).
//!
//! A device copy fails where a host copy cannot (the resource out of
//! memory, a stream's error, a block that other code freed): code that
//! must go on after such a failure calls `try_clone` (or `try_clone_on`
//! for another stream), which returns the error instead, nothing leaked.

use crate::{DeviceBuffer, DeviceScalar, DeviceUVector, Result};
use bytemuck::Pod;
use memres_core::copy::{CopyEngine, MemoryOf};
use memres_core::{MemoryResource, Stream};

/// The clone, or a panic that names the container and `try_clone`'s typed
/// error.
fn or_panic<T>(what: &str, clone: Result<T>) -> T {
    clone.unwrap_or_else(|e| panic!("{what}::clone failed: {e:?} (try_clone returns this error instead)"))
}

/// A deep copy through [`DeviceBuffer::try_clone`].
///
/// # Panics
///
/// Where [`try_clone`](DeviceBuffer::try_clone) returns an error, with
/// that error; use it for a copy that may fail.
///
/// ```
/// use memres_containers::DeviceBuffer;
/// use memres_sim::{HostCopy, HostMemory};
/// let host = HostMemory::new();
/// let a = DeviceBuffer::from_slice_in(b"bytes", (), &host, HostCopy)?;
/// let b = a.clone();
/// assert_ne!(a.addr(), b.addr());
/// assert_eq!(b.to_vec()?, b"bytes");
/// # Ok::<(), memres_containers::ContainerError>(())
/// ```
impl<R, E, S> Clone for DeviceBuffer<R, E, S>
where
    R: MemoryResource<S> + MemoryOf<E::Kind> + Clone,
    E: CopyEngine<S> + Clone,
    S: Stream + Clone,
{
    fn clone(&self) -> Self {
        or_panic("DeviceBuffer", self.try_clone())
    }
}

/// A deep copy through [`DeviceUVector::try_clone`].
///
/// # Panics
///
/// Where [`try_clone`](DeviceUVector::try_clone) returns an error, with
/// that error; use it for a copy that may fail.
///
/// ```
/// use memres_containers::DeviceUVector;
/// use memres_sim::{HostCopy, HostMemory};
/// let host = HostMemory::new();
/// let v = DeviceUVector::from_slice_in(&[1u32, 2, 3], (), &host, HostCopy)?;
/// assert_eq!(v.clone().to_vec()?, [1, 2, 3]);
/// # Ok::<(), memres_containers::ContainerError>(())
/// ```
impl<T, R, E, S> Clone for DeviceUVector<T, R, E, S>
where
    T: Pod,
    R: MemoryResource<S> + MemoryOf<E::Kind> + Clone,
    E: CopyEngine<S> + Clone,
    S: Stream + Clone,
{
    fn clone(&self) -> Self {
        or_panic("DeviceUVector", self.try_clone())
    }
}

/// A deep copy through [`DeviceScalar::try_clone`].
///
/// # Panics
///
/// Where [`try_clone`](DeviceScalar::try_clone) returns an error, with
/// that error; use it for a copy that may fail.
///
/// ```
/// use memres_containers::DeviceScalar;
/// use memres_sim::{HostCopy, HostMemory};
/// let host = HostMemory::new();
/// let s = DeviceScalar::from_value_in(&7u64, (), &host, HostCopy)?;
/// assert_eq!(s.clone().value()?, 7);
/// # Ok::<(), memres_containers::ContainerError>(())
/// ```
impl<T, R, E, S> Clone for DeviceScalar<T, R, E, S>
where
    T: Pod,
    R: MemoryResource<S> + MemoryOf<E::Kind> + Clone,
    E: CopyEngine<S> + Clone,
    S: Stream + Clone,
{
    fn clone(&self) -> Self {
        or_panic("DeviceScalar", self.try_clone())
    }
}
