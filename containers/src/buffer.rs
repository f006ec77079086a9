use crate::{ContainerError, Result};
use memres_core::copy::{CopyEngine, MemoryOf};
use memres_core::{Block, MemoryResource, Request, Stream};
use std::fmt;

/// Untyped bytes in a resource's memory, owned, freed on their stream when
/// dropped: RMM's `device_buffer`.
///
/// ```text
///  DeviceBuffer { resource, engine, stream, block, len }
///                                          │
///   block.addr() ──► [ len bytes in use │ capacity - len spare ]
///                     └──────── block.size() = capacity ───────┘
/// ```
///
/// A buffer of length zero holds no memory ([`Block::EMPTY`]). Growing past
/// the capacity allocates a new block, copies the bytes in use on the
/// buffer's stream and frees the old block on it; if the allocation fails
/// the buffer is unchanged. The bytes in use have always been written:
/// [`new`](Self::new) and [`resize`](Self::resize) write zeros, unless the
/// caller takes that on with [`new_uninit`](Self::new_uninit) or
/// [`resize_uninit`](Self::resize_uninit).
///
/// # Examples
///
/// ```
/// use memres_containers::DeviceBuffer;
/// use memres_sim::{HostCopy, HostMemory};
/// let mem = HostMemory::new();
/// let mut buf = DeviceBuffer::from_slice(b"hello", (), &mem, HostCopy)?;
/// buf.resize(8)?;
/// assert_eq!(&buf.to_vec()?[..5], b"hello");
/// assert_eq!(buf.len(), 8);
/// # Ok::<(), memres_containers::ContainerError>(())
/// ```
pub struct DeviceBuffer<R, E, S = ()>
where
    R: MemoryResource<S>,
    E: CopyEngine<S>,
    S: Stream,
{
    resource: R,
    engine: E,
    /// The stream every operation of the buffer is ordered on, and the one
    /// its block is freed on.
    stream: S,
    /// The memory, from `resource`, held until this buffer gives it back;
    /// its `size()` bytes are memory of `E` (the resource's `MemoryOf`
    /// promise, which keeps the engine sound on them even if other code
    /// frees them first) and they are the capacity.
    block: Block,
    /// Bytes in use, at most the capacity, all written (zeros at least),
    /// unless an `unsafe` uninitialized constructor's caller vouches for them.
    len: u64,
}

impl<R, E, S> DeviceBuffer<R, E, S>
where
    R: MemoryResource<S> + MemoryOf<E::Kind>,
    E: CopyEngine<S>,
    S: Stream,
{
    /// A block of at least `len` bytes from `resource`; a shorter one goes
    /// back untouched, as an error.
    fn allocate(resource: &R, len: u64, stream: &S) -> Result<Block> {
        let block = resource.allocate(Request::new(len)?, stream)?;
        if block.size() < len {
            // Given back untouched, as if the call had failed.
            let _ = resource.deallocate(block, stream);
            return Err(ContainerError::BlockTooShort { requested: len, size: block.size() });
        }
        Ok(block)
    }

    /// A buffer of `len` bytes not written yet: each caller writes them
    /// before the buffer is handed out, or passes the duty on (`unsafe`).
    fn unwritten(len: u64, stream: S, resource: R, engine: E) -> Result<Self> {
        let block = Self::allocate(&resource, len, &stream)?;
        Ok(DeviceBuffer { resource, engine, stream, block, len })
    }

    /// A buffer of `len` zero bytes from `resource`, on `stream` (the zeros
    /// are written on the stream).
    ///
    /// # Errors
    ///
    /// The resource's error (out of memory, invalid size),
    /// [`ContainerError::BlockTooShort`], the copy engine's error.
    pub fn new(len: u64, stream: S, resource: R, engine: E) -> Result<Self> {
        let mut buf = Self::unwritten(len, stream, resource, engine)?;
        buf.fill(0)?;
        Ok(buf)
    }

    /// A buffer of `len` bytes that are not written, as RMM's
    /// `device_buffer`: no fill on the stream.
    ///
    /// # Safety
    ///
    /// Every byte must be written (with [`write`](Self::write),
    /// [`fill`](Self::fill), or device work at [`addr`](Self::addr) ordered on
    /// the buffer's stream) before it is read to the host
    /// ([`read`](Self::read), [`to_vec`](Self::to_vec), or the same calls on
    /// a [`DeviceUVector`](crate::DeviceUVector) or
    /// [`DeviceScalar`](crate::DeviceScalar) made from it) and before the
    /// buffer is cloned ([`try_clone_on`](Self::try_clone_on)): until then
    /// the bytes are uninitialized memory. The buffer may grow, shrink or
    /// change stream meanwhile (its moves of unwritten bytes read nothing).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new), less the copy engine's.
    pub unsafe fn new_uninit(len: u64, stream: S, resource: R, engine: E) -> Result<Self> {
        Self::unwritten(len, stream, resource, engine)
    }

    /// A buffer holding a copy of `data`.
    ///
    /// # Errors
    ///
    /// The resource's error, [`ContainerError::BlockTooShort`], the copy
    /// engine's error.
    pub fn from_slice(data: &[u8], stream: S, resource: R, engine: E) -> Result<Self> {
        let mut buf = Self::unwritten(data.len() as u64, stream, resource, engine)?;
        buf.write(0, data)?;
        Ok(buf)
    }

    /// Bytes in use.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no byte is in use.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the buffer can hold without reallocating.
    pub fn capacity(&self) -> u64 {
        self.block.size()
    }

    /// The device address of the first byte (0 for a buffer with no memory).
    pub fn addr(&self) -> u64 {
        self.block.addr()
    }

    /// The block the buffer holds.
    pub fn block(&self) -> Block {
        self.block
    }

    /// The stream the buffer's work is ordered on.
    pub fn stream(&self) -> &S {
        &self.stream
    }

    /// The resource the memory came from.
    pub fn resource(&self) -> &R {
        &self.resource
    }

    /// The copy engine.
    pub fn engine(&self) -> &E {
        &self.engine
    }

    /// Copies `data` into the buffer at byte `offset`.
    ///
    /// # Errors
    ///
    /// [`ContainerError::IndexOutOfRange`](crate::ContainerError::IndexOutOfRange)
    /// if the range passes the length; the copy engine's error.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `offset..offset + data.len()` lies in `..len`, inside the
        // capacity: the block the resource (`MemoryOf<E::Kind>`) handed to
        // this buffer and that it holds, as the engine asks (if other code
        // freed it, the promise keeps the call sound); all the buffer's work
        // is on `self.stream`.
        unsafe { self.engine.copy_from_host(self.block.addr() + offset, data, &self.stream)? };
        Ok(())
    }

    /// Copies bytes `offset..offset + out.len()` of the buffer into `out`.
    ///
    /// # Errors
    ///
    /// [`ContainerError::IndexOutOfRange`](crate::ContainerError::IndexOutOfRange)
    /// if the range passes the length; the copy engine's error.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len() as u64)?;
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: the range lies in `..len`, inside the capacity: memory the
        // buffer holds, as in `write`; its bytes were written (the invariant
        // of `len`).
        unsafe { self.engine.copy_to_host(out, self.block.addr() + offset, &self.stream)? };
        Ok(())
    }

    fn check_range(&self, offset: u64, n: u64) -> Result<()> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(crate::ContainerError::IndexOutOfRange {
                index: offset.saturating_add(n) as usize,
                len: self.len as usize,
            }),
        }
    }

    /// The bytes in use, copied to the host.
    ///
    /// # Errors
    ///
    /// The copy engine's error.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.len as usize];
        self.read(0, &mut v)?;
        Ok(v)
    }

    /// Fills the bytes in use with `value`, ordered on the buffer's stream.
    ///
    /// # Errors
    ///
    /// The copy engine's error.
    pub fn fill(&mut self, value: u8) -> Result<()> {
        self.fill_range(0, self.len, value)
    }

    /// Sets bytes `offset..offset + n` of the capacity to `value`.
    fn fill_range(&mut self, offset: u64, n: u64, value: u8) -> Result<()> {
        assert!(offset.checked_add(n).is_some_and(|end| end <= self.capacity()), "fill past the capacity");
        if n > 0 {
            // SAFETY: the range lies inside the capacity (asserted): memory
            // the buffer holds, as in `write`; all its work is on
            // `self.stream`.
            unsafe { self.engine.fill(self.block.addr() + offset, value, n, &self.stream)? };
        }
        Ok(())
    }

    /// Moves the bytes in use to a new block of `capacity` bytes.
    fn reallocate(&mut self, capacity: u64) -> Result<()> {
        let new = Self::allocate(&self.resource, capacity, &self.stream)?;
        let keep = self.len.min(capacity);
        if keep > 0 {
            // SAFETY: both ranges lie in blocks the resource
            // (`MemoryOf<E::Kind>`) handed to this buffer and that it holds:
            // `keep` is at most the old length and at most `capacity`, which
            // `allocate` checked `new` holds; both are used on `self.stream`
            // only; they overlap only if other code freed the old block.
            let copied = unsafe { self.engine.copy(new.addr(), self.block.addr(), keep, &self.stream) };
            if let Err(e) = copied {
                let _ = self.resource.deallocate(new, &self.stream);
                return Err(e.into());
            }
        }
        let old = std::mem::replace(&mut self.block, new);
        self.len = keep;
        self.resource.deallocate(old, &self.stream)?;
        Ok(())
    }

    /// Sets the length to `len` bytes, keeping the bytes in use up to it;
    /// new bytes are zero (written on the stream). Reallocates only past the
    /// capacity, to exactly `len`.
    ///
    /// # Errors
    ///
    /// The resource's error, [`ContainerError::BlockTooShort`]: the buffer
    /// is then unchanged. The copy engine's error: the length is then
    /// unchanged.
    pub fn resize(&mut self, len: u64) -> Result<()> {
        self.reserve(len)?;
        if len > self.len {
            self.fill_range(self.len, len - self.len, 0)?;
        }
        self.len = len;
        Ok(())
    }

    /// Sets the length to `len` bytes, keeping the bytes in use up to it and
    /// writing nothing: RMM's `device_buffer::resize`.
    ///
    /// # Safety
    ///
    /// As [`new_uninit`](Self::new_uninit), for the bytes past the old
    /// length: each must be written before it is read to the host or the
    /// buffer is cloned.
    ///
    /// # Errors
    ///
    /// As [`resize`](Self::resize), less the copy engine's.
    pub unsafe fn resize_uninit(&mut self, len: u64) -> Result<()> {
        self.reserve(len)?;
        self.len = len;
        Ok(())
    }

    /// Makes the capacity at least `capacity` bytes. The length stays, and
    /// so do the bytes that can be read: the spare capacity is written by
    /// [`resize`](Self::resize) before it comes into use.
    ///
    /// # Errors
    ///
    /// The resource's error, [`ContainerError::BlockTooShort`]; the buffer
    /// is then unchanged.
    pub fn reserve(&mut self, capacity: u64) -> Result<()> {
        if capacity > self.capacity() {
            self.reallocate(capacity)?;
        }
        Ok(())
    }

    /// Makes the capacity equal to the length (no memory at all for length 0).
    ///
    /// # Errors
    ///
    /// The resource's error, [`ContainerError::BlockTooShort`]; the buffer
    /// is then unchanged.
    pub fn shrink_to_fit(&mut self) -> Result<()> {
        if self.len < self.capacity() {
            self.reallocate(self.len)?;
        }
        Ok(())
    }

    /// Sets the length to zero, keeping the memory.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Makes `stream` the buffer's stream: later work, and the final free,
    /// are ordered on it, after everything submitted so far on the old one.
    ///
    /// # Errors
    ///
    /// The stream's error (recording or waiting on the event).
    pub fn set_stream(&mut self, stream: S) -> Result<()> {
        let done = self.stream.record()?;
        stream.wait(&done)?;
        self.stream = stream;
        Ok(())
    }

    /// A deep copy on `stream`, from the same resource. The copy is ordered
    /// after the work submitted so far on this buffer's stream, and this
    /// buffer's later work (its free on drop included) after the copy.
    ///
    /// # Errors
    ///
    /// The resource's, the stream's or the copy engine's error,
    /// [`ContainerError::BlockTooShort`]; the new buffer is then dropped
    /// (freed on `stream`).
    pub fn try_clone_on(&self, stream: S) -> Result<Self>
    where
        R: Clone,
        E: Clone,
    {
        let done = self.stream.record()?;
        stream.wait(&done)?;
        // Written below, byte for byte from this buffer's written bytes.
        let copy = Self::unwritten(self.len, stream, self.resource.clone(), self.engine.clone())?;
        if self.len > 0 {
            // SAFETY: both ranges lie in blocks the resource
            // (`MemoryOf<E::Kind>`) handed out and their buffers hold, of at
            // least `len` bytes (`allocate`'s check); they overlap only if
            // other code freed the source's block; the copy's stream waits
            // for the source's work above, and the source's stream waits for
            // the copy below.
            unsafe { copy.engine.copy(copy.block.addr(), self.block.addr(), self.len, &copy.stream)? };
            let copied = copy.stream.record()?;
            self.stream.wait(&copied)?;
        }
        Ok(copy)
    }

    /// Reinterprets the buffer's bytes in use as `T`s.
    ///
    /// # Errors
    ///
    /// [`ContainerError::NotWholeElements`](crate::ContainerError::NotWholeElements)
    /// if the length is not a multiple of `size_of::<T>()`; the buffer comes back in `Err`.
    #[allow(clippy::result_large_err)]
    pub fn try_into_uvector<T: bytemuck::Pod>(
        self,
    ) -> std::result::Result<crate::DeviceUVector<T, R, E, S>, (crate::ContainerError, Self)> {
        crate::DeviceUVector::try_from_buffer(self)
    }
}

impl<R, E, S> Drop for DeviceBuffer<R, E, S>
where
    R: MemoryResource<S>,
    E: CopyEngine<S>,
    S: Stream,
{
    fn drop(&mut self) {
        // A drop cannot report errors; the block is ours and live, so the
        // resource only fails here if it is itself broken.
        let _ = self.resource.deallocate(self.block, &self.stream);
    }
}

impl<R, E, S> fmt::Debug for DeviceBuffer<R, E, S>
where
    R: MemoryResource<S> + MemoryOf<E::Kind>,
    E: CopyEngine<S>,
    S: Stream,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("addr", &format_args!("{:#x}", self.block.addr()))
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("stream", &self.stream.id())
            .finish()
    }
}
