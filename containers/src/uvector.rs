use crate::{ContainerError, DeviceBuffer, Result};
use bytemuck::Pod;
use memres_core::copy::{CopyEngine, MemoryOf};
use memres_core::{MemoryResource, Request, Stream, DEFAULT_ALIGNMENT};
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

/// A vector of plain-old-data `T` in a resource's memory: RMM's
/// `device_uvector<T>`. New elements are zero ([`new`](Self::new),
/// [`resize`](Self::resize)); RMM's uninitialized creation and growth, which
/// write nothing, are the `unsafe` [`new_uninit`](Self::new_uninit) and
/// [`resize_uninit`](Self::resize_uninit).
///
/// A thin typed view over a [`DeviceBuffer`] whose length is always a whole
/// number of elements and whose alignment is at least `T`'s: an element
/// type aligned above the default 256 bytes (`#[repr(align(4096))]`) gets
/// blocks of its alignment, or a typed error, never a misaligned block.
///
/// The elements are read and written by copies, one element, a range or all
/// of them at a time ([`element`](Self::element), [`slice_to_vec`](Self::slice_to_vec),
/// [`to_vec`](Self::to_vec), [`iter`](Self::iter)), never through a Rust
/// reference into the memory: see the [crate's documentation](crate#the-host-view).
///
/// # Examples
///
/// ```
/// use memres_containers::DeviceUVector;
/// use memres_sim::{HostCopy, HostMemory};
/// let mem = HostMemory::new();
/// let mut v = DeviceUVector::from_slice_in(&[1u32, 2, 3], (), &mem, HostCopy)?;
/// v.set_element_async(1, &20)?;
/// assert_eq!(v.element(1)?, 20);
/// assert_eq!((v.front_element()?, v.back_element()?), (1, 3));
/// assert_eq!(v.to_vec()?, vec![1, 20, 3]);
/// assert_eq!(v.slice_to_vec(1..)?, vec![20, 3]);
/// assert_eq!(v.iter().sum::<Result<u32, _>>()?, 24);
/// assert_eq!(v.element_addr(2)?, v.addr() + 8);
/// assert!(v.element(3).is_err());
/// # Ok::<(), memres_containers::ContainerError>(())
/// ```
///
/// A zero-sized element type holds no bytes: its vector does not compile.
///
/// ```compile_fail,E0080
/// # use memres_containers::DeviceUVector;
/// # use memres_sim::{HostCopy, HostMemory};
/// let mem = HostMemory::new();
/// let v = DeviceUVector::<(), _, _>::new_in(3, (), &mem, HostCopy);
/// ```
pub struct DeviceUVector<T, R, E, S = ()>
where
    T: Pod,
    R: MemoryResource<S>,
    E: CopyEngine<S>,
    S: Stream,
{
    /// Its length is `len() * size_of::<T>()` bytes, at most `usize::MAX`
    /// (so every element's byte offset is a `usize`); its alignment at least
    /// `element_align::<T>()`.
    buf: DeviceBuffer<R, E, S>,
    _t: PhantomData<T>,
}

/// The size of a `T`, for every count and offset of the vector: a
/// zero-sized `T` (`()`, `[u32; 0]`, which are `Pod`) is refused when the
/// program is compiled, since its elements hold no bytes to count.
struct Element<T>(PhantomData<T>);

impl<T> Element<T> {
    const SIZE: usize = {
        assert!(size_of::<T>() != 0, "DeviceUVector: a zero-sized element type holds no bytes");
        size_of::<T>()
    };
}

/// The bytes of `len` elements: at most `usize::MAX` (the vector's
/// invariant), so every count of elements in them is a `usize`.
fn bytes_of_len<T>(len: usize) -> Result<u64> {
    let bytes = len.checked_mul(Element::<T>::SIZE).and_then(|b| u64::try_from(b).ok());
    bytes.ok_or(ContainerError::LengthOverflow { len })
}

/// The whole elements in `bytes`, `usize::MAX` where more.
fn elements_in<T>(bytes: u64) -> usize {
    usize::try_from(bytes / Element::<T>::SIZE as u64).unwrap_or(usize::MAX)
}

/// The alignment of a vector of `T`s: `T`'s, at least the default.
fn element_align<T>() -> u64 {
    (align_of::<T>() as u64).max(DEFAULT_ALIGNMENT)
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
    /// As [`DeviceBuffer::new_in`]; [`ContainerError::LengthOverflow`].
    pub fn new_in(len: usize, stream: S, resource: R, engine: E) -> Result<Self> {
        let buf =
            DeviceBuffer::zeroed(bytes_of_len::<T>(len)?, element_align::<T>(), stream, resource, engine)?;
        Ok(DeviceUVector { buf, _t: PhantomData })
    }

    /// `len` elements that are not written: RMM's `device_uvector(n, stream, mr)`.
    ///
    /// # Safety
    ///
    /// As [`DeviceBuffer::new_uninit_in`]: every element must be written
    /// before it is read to the host, the vector is cloned or copied from.
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::new_uninit_in`]; [`ContainerError::LengthOverflow`].
    pub unsafe fn new_uninit_in(len: usize, stream: S, resource: R, engine: E) -> Result<Self> {
        let buf =
            DeviceBuffer::unwritten(bytes_of_len::<T>(len)?, element_align::<T>(), stream, resource, engine)?;
        // The caller takes on the buffer's contract for its elements.
        Ok(DeviceUVector { buf, _t: PhantomData })
    }

    /// A copy of `data`.
    ///
    /// # Errors
    ///
    /// As [`new_in`](Self::new_in).
    pub fn from_slice_in(data: &[T], stream: S, resource: R, engine: E) -> Result<Self> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let len = bytes_of_len::<T>(data.len())?;
        let mut buf = DeviceBuffer::unwritten(len, element_align::<T>(), stream, resource, engine)?;
        buf.write(0, bytes)?;
        Ok(DeviceUVector { buf, _t: PhantomData })
    }

    /// A copy of the `len` elements at device address `src`, copied on
    /// `stream` within the engine's memory.
    ///
    /// # Safety
    ///
    /// As [`DeviceBuffer::from_device_ptr_in`], for the
    /// `len * size_of::<T>()` bytes at `src` (which need not be aligned).
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::from_device_ptr_in`]; [`ContainerError::LengthOverflow`].
    pub unsafe fn from_device_ptr_in(
        src: u64,
        len: usize,
        stream: S,
        resource: R,
        engine: E,
    ) -> Result<Self> {
        let bytes = bytes_of_len::<T>(len)?;
        // SAFETY: the caller's contract is `copied`'s.
        let buf =
            unsafe { DeviceBuffer::copied(bytes, element_align::<T>(), src, stream, resource, engine)? };
        Ok(DeviceUVector { buf, _t: PhantomData })
    }

    /// A vector viewing `buf`'s bytes as `T`s; the buffer's alignment is
    /// raised to `T`'s.
    ///
    /// # Errors
    ///
    /// [`ContainerError::NotWholeElements`] if the buffer's length is not a
    /// multiple of `size_of::<T>()`; [`ContainerError::LengthOverflow`] if it
    /// is more bytes than a `usize` counts (a host of 32 bits);
    /// [`ContainerError::Misaligned`] if its block does not start at a
    /// multiple of `T`'s alignment. The buffer comes back unchanged.
    #[allow(clippy::result_large_err)]
    pub fn try_from_buffer(
        mut buf: DeviceBuffer<R, E, S>,
    ) -> std::result::Result<Self, (ContainerError, DeviceBuffer<R, E, S>)> {
        let size = Element::<T>::SIZE;
        if buf.len() % size as u64 != 0 {
            return Err((ContainerError::NotWholeElements { bytes: buf.len(), element_size: size }, buf));
        }
        if usize::try_from(buf.len()).is_err() {
            return Err((ContainerError::LengthOverflow { len: elements_in::<T>(buf.len()) }, buf));
        }
        if let Err(e) = buf.adopt_alignment(element_align::<T>()) {
            return Err((e, buf));
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
        // Exact: the bytes fit in a `usize` (the invariant of `buf`).
        elements_in::<T>(self.buf.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Elements the vector can hold without reallocating (`usize::MAX` for
    /// a block that holds more, from a resource that handed out more than
    /// asked).
    pub fn capacity(&self) -> usize {
        elements_in::<T>(self.buf.capacity())
    }

    /// Size of the elements in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.buf.len()
    }

    /// The raw device address of element 0, for kernels (0 when empty and
    /// holding no memory).
    pub fn addr(&self) -> u64 {
        self.buf.addr()
    }

    /// The raw device address of element `index`: RMM's `element_ptr`.
    ///
    /// # Errors
    ///
    /// [`ContainerError::IndexOutOfRange`].
    pub fn element_addr(&self, index: usize) -> Result<u64> {
        let offset = self.element_offset(index, 1)?;
        Ok(self.buf.addr() + offset)
    }

    /// The alignment of the vector's memory in bytes (at least `T`'s).
    pub fn alignment(&self) -> u64 {
        self.buf.alignment()
    }

    /// Makes `align`, or `T`'s alignment if that is larger, the alignment of
    /// the vector's memory (see [`DeviceBuffer::set_alignment`]).
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::set_alignment`]; the vector is then unchanged.
    pub fn set_alignment(&mut self, align: u64) -> Result<()> {
        let align = Request::aligned(0, align)?.align();
        self.buf.set_alignment(align.max(element_align::<T>()))
    }

    over_buffer!("vector", buf, |buf| DeviceUVector { buf, _t: PhantomData });

    /// A deep copy on `stream` (see [`DeviceBuffer::try_clone_on`]).
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::try_clone_on`].
    pub fn try_clone_on(&self, stream: S) -> Result<Self>
    where
        R: Clone,
        E: Clone,
    {
        Ok(DeviceUVector { buf: self.buf.try_clone_on(stream)?, _t: PhantomData })
    }

    /// A deep copy on `stream` into `resource` (see
    /// [`DeviceBuffer::try_clone_in`]).
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::try_clone_in`].
    pub fn try_clone_in<R2>(&self, stream: S, resource: R2) -> Result<DeviceUVector<T, R2, E, S>>
    where
        R2: MemoryResource<S> + MemoryOf<E::Kind>,
        E: Clone,
    {
        Ok(DeviceUVector { buf: self.buf.try_clone_in(stream, resource)?, _t: PhantomData })
    }

    /// The byte offset of element `start`, once elements `start..start + n`
    /// are checked to lie inside the length.
    fn element_offset(&self, start: usize, n: usize) -> Result<u64> {
        match start.checked_add(n) {
            Some(end) if end <= self.len() => bytes_of_len::<T>(start),
            _ => Err(ContainerError::IndexOutOfRange {
                index: start.saturating_add(n.max(1) - 1),
                len: self.len(),
            }),
        }
    }

    /// Writes `value` to element `index`, ordered on the vector's stream.
    ///
    /// # Errors
    ///
    /// [`ContainerError::IndexOutOfRange`]; the copy engine's error.
    pub fn set_element_async(&mut self, index: usize, value: &T) -> Result<()> {
        self.copy_from_slice_at(index, std::slice::from_ref(value))
    }

    /// Sets element `index` to zero, ordered on the vector's stream (a fill
    /// on the device): RMM's `set_element_to_zero_async`.
    ///
    /// # Errors
    ///
    /// [`ContainerError::IndexOutOfRange`]; the copy engine's error.
    pub fn set_element_to_zero_async(&mut self, index: usize) -> Result<()> {
        let offset = self.element_offset(index, 1)?;
        self.buf.fill_range(offset, Element::<T>::SIZE as u64, 0)
    }

    /// Sets every element to zero, ordered on the vector's stream (a fill on
    /// the device).
    ///
    /// # Errors
    ///
    /// The copy engine's error.
    pub fn fill_zero(&mut self) -> Result<()> {
        self.buf.fill(0)
    }

    /// Reads element `index` (waits for the stream's work before it). The
    /// element comes back by value, on the stack: read one larger than the
    /// stack with [`copy_to_slice_at`](Self::copy_to_slice_at) into a slice
    /// on the heap, or [`to_vec`](Self::to_vec).
    ///
    /// # Errors
    ///
    /// [`ContainerError::IndexOutOfRange`]; the copy engine's error.
    pub fn element(&self, index: usize) -> Result<T> {
        let mut value = T::zeroed();
        self.copy_to_slice_at(index, std::slice::from_mut(&mut value))?;
        Ok(value)
    }

    /// Reads the first element: RMM's `front_element`.
    ///
    /// # Errors
    ///
    /// [`ContainerError::IndexOutOfRange`] (index 0) when empty; the copy
    /// engine's error.
    pub fn front_element(&self) -> Result<T> {
        self.element(0)
    }

    /// Reads the last element: RMM's `back_element`.
    ///
    /// # Errors
    ///
    /// [`ContainerError::IndexOutOfRange`] (index 0) when empty; the copy
    /// engine's error.
    pub fn back_element(&self) -> Result<T> {
        self.element(self.len().saturating_sub(1))
    }

    /// The elements, copied to the host.
    ///
    /// # Errors
    ///
    /// [`ContainerError::HostOutOfMemory`] when the host cannot hold them;
    /// the copy engine's error.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.slice_to_vec(..)
    }

    /// Elements `range`, copied to the host: a slice of the vector, read.
    ///
    /// # Errors
    ///
    /// [`ContainerError::IndexOutOfRange`] for a range that is reversed or
    /// passes the length; [`ContainerError::HostOutOfMemory`] if the host
    /// cannot hold the copy; the copy engine's error.
    pub fn slice_to_vec(&self, range: impl RangeBounds<usize>) -> Result<Vec<T>> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            // Past the last index there is: no vector holds it.
            Bound::Included(&i) => {
                i.checked_add(1).ok_or(ContainerError::IndexOutOfRange { index: i, len: self.len() })?
            }
            Bound::Excluded(&i) => i,
            Bound::Unbounded => self.len(),
        };
        let n = end
            .checked_sub(start)
            .ok_or(ContainerError::IndexOutOfRange { index: start, len: self.len() })?;
        // Checked before the host allocates the copy.
        self.element_offset(start, n)?;
        let mut v = crate::error::host_vec(n)?;
        self.copy_to_slice_at(start, &mut v)?;
        Ok(v)
    }

    /// The elements in order, copied to the host a batch at a time (64 KiB
    /// of elements) as the iteration reaches them; an error ends it. Each
    /// comes back by value, on the stack, as from [`element`](Self::element).
    pub fn iter(&self) -> Iter<'_, T, R, E, S> {
        Iter { vector: self, next: 0, batch: Vec::new(), taken: 0, failed: false }
    }

    /// Copies `data` over elements `start..start + data.len()`.
    ///
    /// # Errors
    ///
    /// [`ContainerError::IndexOutOfRange`]; the copy engine's error.
    pub fn copy_from_slice_at(&mut self, start: usize, data: &[T]) -> Result<()> {
        let offset = self.element_offset(start, data.len())?;
        self.buf.write(offset, bytemuck::cast_slice(data))
    }

    /// Copies elements `start..start + out.len()` into `out` (waits for the
    /// stream's work before it).
    ///
    /// # Errors
    ///
    /// [`ContainerError::IndexOutOfRange`]; the copy engine's error.
    pub fn copy_to_slice_at(&self, start: usize, out: &mut [T]) -> Result<()> {
        let offset = self.element_offset(start, out.len())?;
        self.buf.read(offset, bytemuck::cast_slice_mut(out))
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
    /// length must be written before it is read to the host, the vector is
    /// cloned or copied from.
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
    /// [`ContainerError::LengthOverflow`] for a capacity whose bytes
    /// overflow; otherwise [`DeviceBuffer::reserve`]'s (the resource's, for
    /// the new block or the old one's free, a block too short or misaligned,
    /// the copy engine's). The vector is then unchanged.
    pub fn reserve(&mut self, capacity: usize) -> Result<()> {
        self.buf.reserve(bytes_of_len::<T>(capacity)?)
    }

    /// Makes the capacity the length, or more where the resource hands out
    /// more than asked (see [`DeviceBuffer::shrink_to_fit`]).
    ///
    /// # Errors
    ///
    /// [`DeviceBuffer::shrink_to_fit`]'s (the resource's, for the new block
    /// or the old one's free, a block too short or misaligned, the copy
    /// engine's); the vector is then unchanged.
    pub fn shrink_to_fit(&mut self) -> Result<()> {
        self.buf.shrink_to_fit()
    }

    /// Sets the length to zero, keeping the memory.
    pub fn clear(&mut self) {
        self.buf.clear();
    }
}

/// The elements of a [`DeviceUVector`] in order, copied to the host a batch
/// at a time ([`DeviceUVector::iter`]).
pub struct Iter<'a, T, R, E, S = ()>
where
    T: Pod,
    R: MemoryResource<S>,
    E: CopyEngine<S>,
    S: Stream,
{
    vector: &'a DeviceUVector<T, R, E, S>,
    /// The index of the first element not copied yet.
    next: usize,
    /// The elements copied last, of which the first `taken` were yielded
    /// (none while a copy is under way: one that panicked left none).
    batch: Vec<T>,
    taken: usize,
    /// Whether a copy failed (its error was yielded: the iteration is over).
    failed: bool,
}

/// Bytes of elements one batch of [`Iter`] copies.
const BATCH_BYTES: usize = 64 << 10;

impl<T, R, E, S> Iterator for Iter<'_, T, R, E, S>
where
    T: Pod,
    R: MemoryResource<S> + MemoryOf<E::Kind>,
    E: CopyEngine<S>,
    S: Stream,
{
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        if self.taken == self.batch.len() {
            let left = self.vector.len().saturating_sub(self.next);
            if self.failed || left == 0 {
                return None;
            }
            let n = left.min((BATCH_BYTES / Element::<T>::SIZE).max(1));
            // Filled apart and kept only once read: a copy that panics
            // leaves no batch of zeros to be yielded as elements.
            let mut batch = core::mem::take(&mut self.batch);
            self.taken = 0;
            batch.clear();
            batch.resize(n, T::zeroed());
            if let Err(e) = self.vector.copy_to_slice_at(self.next, &mut batch) {
                self.failed = true;
                return Some(Err(e));
            }
            self.batch = batch;
            self.next += n;
        }
        self.taken += 1;
        Some(Ok(self.batch[self.taken - 1]))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = if self.failed {
            0
        } else {
            self.batch.len() - self.taken + self.vector.len().saturating_sub(self.next)
        };
        (left.min(1), Some(left))
    }
}

impl<T: Pod, R: MemoryResource<S>, E: CopyEngine<S>, S: Stream> fmt::Debug for Iter<'_, T, R, E, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Iter")
            .field("next", &self.next)
            .field("batched", &(self.batch.len() - self.taken))
            .finish()
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
