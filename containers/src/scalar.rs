use crate::{DeviceUVector, Result};
use bytemuck::Pod;
use memres_core::copy::{CopyEngine, MemoryOf};
use memres_core::{MemoryResource, Stream};
use std::fmt;

/// One `T` in a resource's memory: RMM's `device_scalar<T>`.
///
/// # Examples
///
/// ```
/// use memres_containers::DeviceScalar;
/// use memres_sim::{HostCopy, HostMemory};
/// let mem = HostMemory::new();
/// let mut s = DeviceScalar::from_value(&7u64, (), &mem, HostCopy)?;
/// s.set_value_async(&42)?;
/// assert_eq!(s.value()?, 42);
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
    /// As [`DeviceBuffer::new`](crate::DeviceBuffer::new).
    pub fn new(stream: S, resource: R, engine: E) -> Result<Self> {
        Ok(DeviceScalar { inner: DeviceUVector::new(1, stream, resource, engine)? })
    }

    /// A scalar whose value is not written: RMM's `device_scalar(stream)`.
    ///
    /// # Safety
    ///
    /// As [`DeviceBuffer::new_uninit`](crate::DeviceBuffer::new_uninit): the
    /// value must be written before it is read.
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::new_uninit`](crate::DeviceBuffer::new_uninit).
    pub unsafe fn new_uninit(stream: S, resource: R, engine: E) -> Result<Self> {
        // SAFETY: the caller takes on the vector's contract for the value.
        Ok(DeviceScalar { inner: unsafe { DeviceUVector::new_uninit(1, stream, resource, engine)? } })
    }

    /// A scalar holding `value`.
    ///
    /// # Errors
    ///
    /// The resource's or the copy engine's error.
    pub fn from_value(value: &T, stream: S, resource: R, engine: E) -> Result<Self> {
        Ok(DeviceScalar {
            inner: DeviceUVector::from_slice(std::slice::from_ref(value), stream, resource, engine)?,
        })
    }

    /// Writes `value`, ordered on the scalar's stream.
    ///
    /// # Errors
    ///
    /// The copy engine's error.
    pub fn set_value_async(&mut self, value: &T) -> Result<()> {
        self.inner.set_element_async(0, value)
    }

    /// Reads the value (waits for the stream's work before it).
    ///
    /// # Errors
    ///
    /// The copy engine's error.
    pub fn value(&self) -> Result<T> {
        self.inner.element(0)
    }

    /// The raw device address of the value, for kernels.
    pub fn device_ptr(&self) -> u64 {
        self.inner.device_ptr()
    }

    /// The stream the scalar's work is ordered on.
    pub fn stream(&self) -> &S {
        self.inner.stream()
    }

    /// Makes `stream` the scalar's stream.
    ///
    /// # Errors
    ///
    /// The stream's error.
    pub fn set_stream(&mut self, stream: S) -> Result<()> {
        self.inner.set_stream(stream)
    }
}

impl<T, R, E, S> fmt::Debug for DeviceScalar<T, R, E, S>
where
    T: Pod,
    R: MemoryResource<S> + MemoryOf<E::Kind>,
    E: CopyEngine<S>,
    S: Stream,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceScalar").field("vector", &self.inner).finish()
    }
}
