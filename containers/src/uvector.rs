use crate::{ContainerError, DeviceBuffer, Result};
use bytemuck::Pod;
use memres_core::copy::{CopyEngine, MemoryOf};
use memres_core::{MemoryResource, Stream};
use std::fmt;
use std::marker::PhantomData;

/// A vector of plain-old-data `T` in a resource's memory: RMM's
/// `device_uvector<T>`. New elements are zero ([`new`](Self::new),
/// [`resize`](Self::resize)); RMM's uninitialized creation and growth, which
/// write nothing, are the `unsafe` [`new_uninit`](Self::new_uninit) and
/// [`resize_uninit`](Self::resize_uninit).
///
/// A thin typed view over a [`DeviceBuffer`] whose length is always a whole
/// number of elements.
///
/// # Examples
///
/// ```
/// use memres_containers::DeviceUVector;
/// use memres_sim::{HostCopy, HostMemory};
/// let mem = HostMemory::new();
/// let mut v = DeviceUVector::from_slice(&[1u32, 2, 3], (), &mem, HostCopy)?;
/// v.set_element_async(1, &20)?;
/// assert_eq!(v.element(1)?, 20);
/// assert_eq!(v.to_vec()?, vec![1, 20, 3]);
/// assert!(v.element(3).is_err());
/// # Ok::<(), memres_containers::ContainerError>(())
/// ```
pub struct DeviceUVector<T, R, E, S = ()>
where
    T: Pod,
    R: MemoryResource<S>,
    E: CopyEngine<S>,
    S: Stream,
{
    /// Its length is `len() * size_of::<T>()` bytes.
    buf: DeviceBuffer<R, E, S>,
    _t: PhantomData<T>,
}

fn bytes_of_len<T>(len: usize) -> Result<u64> {
    len.checked_mul(size_of::<T>()).map(|b| b as u64).ok_or(ContainerError::LengthOverflow { len })
}

impl<T, R, E, S> DeviceUVector<T, R, E, S>
where
    T: Pod,
    R: MemoryResource<S> + MemoryOf<E::Kind>,
    E: CopyEngine<S>,
    S: Stream,
{
    /// `len` zero elements (written on the stream).
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::new`]; [`ContainerError::LengthOverflow`].
    pub fn new(len: usize, stream: S, resource: R, engine: E) -> Result<Self> {
        let buf = DeviceBuffer::new(bytes_of_len::<T>(len)?, stream, resource, engine)?;
        Ok(DeviceUVector { buf, _t: PhantomData })
    }

    /// `len` elements that are not written: RMM's `device_uvector(n, stream)`.
    ///
    /// # Safety
    ///
    /// As [`DeviceBuffer::new_uninit`]: every element must be written before
    /// it is read to the host or the vector is cloned.
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::new_uninit`]; [`ContainerError::LengthOverflow`].
    pub unsafe fn new_uninit(len: usize, stream: S, resource: R, engine: E) -> Result<Self> {
        // SAFETY: the caller takes on the buffer's contract for its elements.
        let buf = unsafe { DeviceBuffer::new_uninit(bytes_of_len::<T>(len)?, stream, resource, engine)? };
        Ok(DeviceUVector { buf, _t: PhantomData })
    }

    /// A copy of `data`.
    ///
    /// # Errors
    ///
    /// The resource's or the copy engine's error.
    pub fn from_slice(data: &[T], stream: S, resource: R, engine: E) -> Result<Self> {
        let buf = DeviceBuffer::from_slice(bytemuck::cast_slice(data), stream, resource, engine)?;
        Ok(DeviceUVector { buf, _t: PhantomData })
    }

    /// A vector viewing `buf`'s bytes as `T`s.
    ///
    /// # Errors
    ///
    /// [`ContainerError::NotWholeElements`] if the buffer's length is not a
    /// multiple of `size_of::<T>()`; the buffer comes back unchanged.
    #[allow(clippy::result_large_err)]
    pub fn try_from_buffer(
        buf: DeviceBuffer<R, E, S>,
    ) -> std::result::Result<Self, (ContainerError, DeviceBuffer<R, E, S>)> {
        let size = size_of::<T>();
        if size == 0 || buf.len() % size as u64 != 0 {
            return Err((ContainerError::NotWholeElements { bytes: buf.len(), element_size: size }, buf));
        }
        Ok(DeviceUVector { buf, _t: PhantomData })
    }

    /// The underlying untyped buffer.
    pub fn into_buffer(self) -> DeviceBuffer<R, E, S> {
        self.buf
    }

    /// The underlying untyped buffer, borrowed.
    pub fn as_buffer(&self) -> &DeviceBuffer<R, E, S> {
        &self.buf
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        (self.buf.len() / size_of::<T>() as u64) as usize
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Elements the vector can hold without reallocating.
    pub fn capacity(&self) -> usize {
        (self.buf.capacity() / size_of::<T>() as u64) as usize
    }

    /// Size of the elements in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.buf.len()
    }

    /// The raw device address of element 0, for kernels (0 when empty and
    /// holding no memory).
    pub fn device_ptr(&self) -> u64 {
        self.buf.addr()
    }

    /// The stream the vector's work is ordered on.
    pub fn stream(&self) -> &S {
        self.buf.stream()
    }

    /// Makes `stream` the vector's stream (see [`DeviceBuffer::set_stream`]).
    ///
    /// # Errors
    ///
    /// The stream's error.
    pub fn set_stream(&mut self, stream: S) -> Result<()> {
        self.buf.set_stream(stream)
    }

    fn check_index(&self, index: usize) -> Result<()> {
        if index < self.len() {
            Ok(())
        } else {
            Err(ContainerError::IndexOutOfRange { index, len: self.len() })
        }
    }

    /// Writes `value` to element `index`, ordered on the vector's stream.
    ///
    /// # Errors
    ///
    /// [`ContainerError::IndexOutOfRange`]; the copy engine's error.
    pub fn set_element_async(&mut self, index: usize, value: &T) -> Result<()> {
        self.check_index(index)?;
        self.buf.write((index * size_of::<T>()) as u64, bytemuck::bytes_of(value))
    }

    /// Reads element `index` (waits for the stream's work before it).
    ///
    /// # Errors
    ///
    /// [`ContainerError::IndexOutOfRange`]; the copy engine's error.
    pub fn element(&self, index: usize) -> Result<T> {
        self.check_index(index)?;
        let mut value = T::zeroed();
        self.buf.read((index * size_of::<T>()) as u64, bytemuck::bytes_of_mut(&mut value))?;
        Ok(value)
    }

    /// The elements, copied to the host.
    ///
    /// # Errors
    ///
    /// The copy engine's error.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = vec![T::zeroed(); self.len()];
        self.buf.read(0, bytemuck::cast_slice_mut(&mut v))?;
        Ok(v)
    }

    /// Copies `data` over elements `start..start + data.len()`.
    ///
    /// # Errors
    ///
    /// [`ContainerError::IndexOutOfRange`]; the copy engine's error.
    pub fn copy_from_slice_at(&mut self, start: usize, data: &[T]) -> Result<()> {
        self.buf.write(bytes_of_len::<T>(start)?, bytemuck::cast_slice(data))
    }

    /// Sets the length to `len` elements, keeping those up to it; new
    /// elements are zero (written on the stream).
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::resize`]; [`ContainerError::LengthOverflow`].
    pub fn resize(&mut self, len: usize) -> Result<()> {
        self.buf.resize(bytes_of_len::<T>(len)?)
    }

    /// Sets the length to `len` elements, keeping those up to it and
    /// writing nothing: RMM's `device_uvector::resize`.
    ///
    /// # Safety
    ///
    /// As [`DeviceBuffer::resize_uninit`]: every element past the old
    /// length must be written before it is read to the host or the vector is
    /// cloned.
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::resize_uninit`]; [`ContainerError::LengthOverflow`].
    pub unsafe fn resize_uninit(&mut self, len: usize) -> Result<()> {
        // SAFETY: the caller takes on the buffer's contract for the new elements.
        unsafe { self.buf.resize_uninit(bytes_of_len::<T>(len)?) }
    }

    /// Makes the capacity at least `capacity` elements (see
    /// [`DeviceBuffer::reserve`]: no element becomes readable).
    ///
    /// # Errors
    ///
    /// The resource's error; the vector is then unchanged.
    pub fn reserve(&mut self, capacity: usize) -> Result<()> {
        self.buf.reserve(bytes_of_len::<T>(capacity)?)
    }

    /// Makes the capacity equal to the length.
    ///
    /// # Errors
    ///
    /// The resource's error; the vector is then unchanged.
    pub fn shrink_to_fit(&mut self) -> Result<()> {
        self.buf.shrink_to_fit()
    }

    /// Sets the length to zero, keeping the memory.
    pub fn clear(&mut self) {
        self.buf.clear();
    }
}

impl<T, R, E, S> fmt::Debug for DeviceUVector<T, R, E, S>
where
    T: Pod,
    R: MemoryResource<S> + MemoryOf<E::Kind>,
    E: CopyEngine<S>,
    S: Stream,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceUVector")
            .field("element", &std::any::type_name::<T>())
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .field("buffer", &self.buf)
            .finish()
    }
}
