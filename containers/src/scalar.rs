use crate::{DeviceUVector, Result};
use bytemuck::Pod;
use memres_core::copy::{CopyEngine, MemoryOf};
use memres_core::{MemoryResource, Stream};
use std::fmt;

/// One `T` in a resource's memory: RMM's `device_scalar<T>`, at an address
/// aligned to `T` (and to 256 bytes at least).
///
/// # Examples
///
/// ```
/// use memres_containers::DeviceScalar;
/// use memres_sim::{HostCopy, HostMemory};
/// let mem = HostMemory::new();
/// let mut s = DeviceScalar::from_value_in(&7u64, (), &mem, HostCopy)?;
/// s.set_value_async(&42)?;
/// assert_eq!(s.value()?, 42);
/// s.set_value_to_zero_async()?;
/// assert_eq!(s.value()?, 0);
/// # Ok::<(), memres_containers::ContainerError>(())
/// ```
pub struct DeviceScalar<T, R, E, S = ()>
where
    T: Pod,
    R: MemoryResource<S>,
    E: CopyEngine<S>,
    S: Stream,
{
    /// Always exactly one element.
    inner: DeviceUVector<T, R, E, S>,
}

impl<T, R, E, S> DeviceScalar<T, R, E, S>
where
    T: Pod,
    R: MemoryResource<S> + MemoryOf<E::Kind>,
    E: CopyEngine<S>,
    S: Stream,
{
    /// A scalar holding zero (written on the stream).
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::new_in`](crate::DeviceBuffer::new_in).
    pub fn new_in(stream: S, resource: R, engine: E) -> Result<Self> {
        Ok(DeviceScalar { inner: DeviceUVector::new_in(1, stream, resource, engine)? })
    }

    /// A scalar whose value is not written: RMM's `device_scalar(stream, mr)`.
    ///
    /// # Safety
    ///
    /// As [`DeviceBuffer::new_uninit_in`](crate::DeviceBuffer::new_uninit_in):
    /// the value must be written before it is read, the scalar cloned or
    /// copied from.
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::new_uninit_in`](crate::DeviceBuffer::new_uninit_in).
    pub unsafe fn new_uninit_in(stream: S, resource: R, engine: E) -> Result<Self> {
        // SAFETY: the caller takes on the vector's contract for the value.
        Ok(DeviceScalar { inner: unsafe { DeviceUVector::new_uninit_in(1, stream, resource, engine)? } })
    }

    /// A scalar holding `value`.
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::new_in`](crate::DeviceBuffer::new_in).
    pub fn from_value_in(value: &T, stream: S, resource: R, engine: E) -> Result<Self> {
        Ok(DeviceScalar {
            inner: DeviceUVector::from_slice_in(std::slice::from_ref(value), stream, resource, engine)?,
        })
    }

    /// A scalar holding a copy of the `T` at device address `src`, copied on
    /// `stream` within the engine's memory.
    ///
    /// # Safety
    ///
    /// As [`DeviceBuffer::from_device_ptr_in`](crate::DeviceBuffer::from_device_ptr_in),
    /// for the `size_of::<T>()` bytes at `src`.
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::from_device_ptr_in`](crate::DeviceBuffer::from_device_ptr_in).
    pub unsafe fn from_device_ptr_in(src: u64, stream: S, resource: R, engine: E) -> Result<Self> {
        // SAFETY: the caller's contract is the vector's, for one element.
        let inner = unsafe { DeviceUVector::from_device_ptr_in(src, 1, stream, resource, engine)? };
        Ok(DeviceScalar { inner })
    }

    /// Writes `value`, ordered on the scalar's stream.
    ///
    /// # Errors
    ///
    /// The copy engine's error.
    pub fn set_value_async(&mut self, value: &T) -> Result<()> {
        self.inner.set_element_async(0, value)
    }

    /// Sets the value to zero, ordered on the scalar's stream (a fill on the
    /// device): RMM's `set_value_to_zero_async`.
    ///
    /// # Errors
    ///
    /// The copy engine's error.
    pub fn set_value_to_zero_async(&mut self) -> Result<()> {
        self.inner.fill_zero()
    }

    /// Reads the value (waits for the stream's work before it), by value, on
    /// the stack (see [`DeviceUVector::element`]).
    ///
    /// # Errors
    ///
    /// The copy engine's error.
    pub fn value(&self) -> Result<T> {
        self.inner.element(0)
    }

    /// The raw device address of the value, for kernels.
    pub fn addr(&self) -> u64 {
        self.inner.addr()
    }

    over_buffer!("scalar", inner, |inner| DeviceScalar { inner });

    /// A deep copy on `stream`.
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::try_clone_on`](crate::DeviceBuffer::try_clone_on).
    pub fn try_clone_on(&self, stream: S) -> Result<Self>
    where
        R: Clone,
        E: Clone,
    {
        Ok(DeviceScalar { inner: self.inner.try_clone_on(stream)? })
    }

    /// A deep copy on `stream` into `resource` (see
    /// [`DeviceBuffer::try_clone_in`](crate::DeviceBuffer::try_clone_in)).
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::try_clone_in`](crate::DeviceBuffer::try_clone_in).
    pub fn try_clone_in<R2>(&self, stream: S, resource: R2) -> Result<DeviceScalar<T, R2, E, S>>
    where
        R2: MemoryResource<S> + MemoryOf<E::Kind>,
        E: Clone,
    {
        Ok(DeviceScalar { inner: self.inner.try_clone_in(stream, resource)? })
    }
}

/// As its vector.
impl<T: Pod, R: MemoryResource<S>, E: CopyEngine<S>, S: Stream> fmt::Debug for DeviceScalar<T, R, E, S>
where
    DeviceUVector<T, R, E, S>: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceScalar").field("vector", &self.inner).finish()
    }
}
