//! The containers made without a resource: their resource is the current
//! resource of the stream's device, promised as memory of the engine, and
//! their constructors are those of the `_in` forms with it (RMM's default
//! argument `mr = get_current_device_resource()`).

use crate::{DeviceBuffer, DeviceScalar, DeviceUVector, Result};
use bytemuck::Pod;
use memres_core::copy::CopyEngine;
use memres_core::device::{get_per_device_resource_of, CurrentResource, DeviceStream};

/// The resource of a container made without one (`DeviceUVector::new(n,
/// stream)`): the current resource of the stream's device in the
/// process-wide registry, promised as memory of engines of type `E`
/// (see [`memres_core::device::set_per_device_resource_of`]).
pub type Current<S, E> = CurrentResource<<S as DeviceStream>::Key, E>;

/// The current resource of `stream`'s device and the engine promised with
/// it.
///
/// # Errors
///
/// The registry's: `InvalidConfig` when the device has no resource and no
/// default, or one not promised as memory of `E`.
pub(crate) fn current<S, E>(stream: &S) -> Result<(Current<S, E>, E)>
where
    S: DeviceStream,
    E: Clone + Send + Sync + 'static,
{
    Ok(get_per_device_resource_of::<S::Key, E>(stream.device())?)
}

/// The constructors that take the current resource of the stream's device
/// and the engine promised with it (see the [crate's documentation](crate#constructors)).
impl<E, S> DeviceBuffer<Current<S, E>, E, S>
where
    E: CopyEngine<S, Kind = E> + Clone + Send + Sync + 'static,
    S: DeviceStream,
{
    /// [`new_in`](Self::new_in) from the current resource of the stream's
    /// device: RMM's `device_buffer(size, stream)`.
    ///
    /// ```
    /// use memres_containers::DeviceBuffer;
    /// use memres_core::device::set_per_device_resource_of;
    /// use memres_sim::{HostCopy, HostMemory};
    /// use std::sync::Arc;
    /// // Device 0 (the device of `()`) serves from host memory.
    /// set_per_device_resource_of::<(), _, _>(0, Arc::new(HostMemory::new()), HostCopy);
    /// let buf: DeviceBuffer<_, HostCopy> = DeviceBuffer::new(64, ())?;
    /// assert_eq!(buf.to_vec()?, [0; 64]);
    /// # Ok::<(), memres_containers::ContainerError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `InvalidConfig` (as [`ContainerError::Memory`](crate::ContainerError::Memory)) when the device has
    /// no current resource promised as memory of `E` (none set and no
    /// default, or one set without the promise, such as a simulated
    /// device); as [`new_in`](Self::new_in).
    pub fn new(len: u64, stream: S) -> Result<Self> {
        let (resource, engine) = current(&stream)?;
        Self::new_in(len, stream, resource, engine)
    }

    /// [`new_uninit_in`](Self::new_uninit_in) from the current resource.
    ///
    /// # Safety
    ///
    /// As [`new_uninit_in`](Self::new_uninit_in).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub unsafe fn new_uninit(len: u64, stream: S) -> Result<Self> {
        let (resource, engine) = current(&stream)?;
        // SAFETY: the caller's contract is `new_uninit_in`'s.
        unsafe { Self::new_uninit_in(len, stream, resource, engine) }
    }

    /// [`from_slice_in`](Self::from_slice_in) from the current resource.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn from_slice(data: &[u8], stream: S) -> Result<Self> {
        let (resource, engine) = current(&stream)?;
        Self::from_slice_in(data, stream, resource, engine)
    }

    /// [`from_device_ptr_in`](Self::from_device_ptr_in) from the current
    /// resource.
    ///
    /// # Safety
    ///
    /// As [`from_device_ptr_in`](Self::from_device_ptr_in).
    ///
    /// # Errors
    ///
    /// As [`from_device_ptr_in`](Self::from_device_ptr_in) and [`new`](Self::new).
    pub unsafe fn from_device_ptr(src: u64, len: u64, stream: S) -> Result<Self> {
        let (resource, engine) = current(&stream)?;
        // SAFETY: the caller's contract is `from_device_ptr_in`'s.
        unsafe { Self::from_device_ptr_in(src, len, stream, resource, engine) }
    }
}

/// The constructors that take the current resource of the stream's device
/// and the engine promised with it (see the [crate's documentation](crate#constructors)).
impl<T, E, S> DeviceUVector<T, Current<S, E>, E, S>
where
    T: Pod,
    E: CopyEngine<S, Kind = E> + Clone + Send + Sync + 'static,
    S: DeviceStream,
{
    /// [`new_in`](Self::new_in) from the current resource of the stream's
    /// device: RMM's `device_uvector(n, stream)`, with its elements zero.
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::new`]; [`ContainerError::LengthOverflow`](crate::ContainerError::LengthOverflow).
    pub fn new(len: usize, stream: S) -> Result<Self> {
        let (resource, engine) = current(&stream)?;
        Self::new_in(len, stream, resource, engine)
    }

    /// [`new_uninit_in`](Self::new_uninit_in) from the current resource.
    ///
    /// # Safety
    ///
    /// As [`new_uninit_in`](Self::new_uninit_in).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub unsafe fn new_uninit(len: usize, stream: S) -> Result<Self> {
        let (resource, engine) = current(&stream)?;
        // SAFETY: the caller's contract is `new_uninit_in`'s.
        unsafe { Self::new_uninit_in(len, stream, resource, engine) }
    }

    /// [`from_slice_in`](Self::from_slice_in) from the current resource.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn from_slice(data: &[T], stream: S) -> Result<Self> {
        let (resource, engine) = current(&stream)?;
        Self::from_slice_in(data, stream, resource, engine)
    }

    /// [`from_device_ptr_in`](Self::from_device_ptr_in) from the current
    /// resource.
    ///
    /// # Safety
    ///
    /// As [`from_device_ptr_in`](Self::from_device_ptr_in).
    ///
    /// # Errors
    ///
    /// As [`from_device_ptr_in`](Self::from_device_ptr_in) and [`new`](Self::new).
    pub unsafe fn from_device_ptr(src: u64, len: usize, stream: S) -> Result<Self> {
        let (resource, engine) = current(&stream)?;
        // SAFETY: the caller's contract is `from_device_ptr_in`'s.
        unsafe { Self::from_device_ptr_in(src, len, stream, resource, engine) }
    }
}

/// The constructors that take the current resource of the stream's device
/// and the engine promised with it (see the [crate's documentation](crate#constructors)).
impl<T, E, S> DeviceScalar<T, Current<S, E>, E, S>
where
    T: Pod,
    E: CopyEngine<S, Kind = E> + Clone + Send + Sync + 'static,
    S: DeviceStream,
{
    /// [`new_in`](Self::new_in) from the current resource of the stream's
    /// device, holding zero.
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::new`](crate::DeviceBuffer::new).
    pub fn new(stream: S) -> Result<Self> {
        let (resource, engine) = current(&stream)?;
        Self::new_in(stream, resource, engine)
    }

    /// [`new_uninit_in`](Self::new_uninit_in) from the current resource:
    /// RMM's `device_scalar(stream)`.
    ///
    /// # Safety
    ///
    /// As [`new_uninit_in`](Self::new_uninit_in).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub unsafe fn new_uninit(stream: S) -> Result<Self> {
        let (resource, engine) = current(&stream)?;
        // SAFETY: the caller's contract is `new_uninit_in`'s.
        unsafe { Self::new_uninit_in(stream, resource, engine) }
    }

    /// [`from_value_in`](Self::from_value_in) from the current resource.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn from_value(value: &T, stream: S) -> Result<Self> {
        let (resource, engine) = current(&stream)?;
        Self::from_value_in(value, stream, resource, engine)
    }

    /// [`from_device_ptr_in`](Self::from_device_ptr_in) from the current
    /// resource.
    ///
    /// # Safety
    ///
    /// As [`from_device_ptr_in`](Self::from_device_ptr_in).
    ///
    /// # Errors
    ///
    /// As [`from_device_ptr_in`](Self::from_device_ptr_in) and [`new`](Self::new).
    pub unsafe fn from_device_ptr(src: u64, stream: S) -> Result<Self> {
        let (resource, engine) = current(&stream)?;
        // SAFETY: the caller's contract is `from_device_ptr_in`'s.
        unsafe { Self::from_device_ptr_in(src, stream, resource, engine) }
    }
}
