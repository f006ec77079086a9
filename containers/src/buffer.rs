use crate::{ContainerError, Result};
use memres_core::copy::{CopyEngine, MemoryOf};
use memres_core::{Block, MemoryResource, Pending, Request, Stream, DEFAULT_ALIGNMENT};
use std::fmt;

/// Untyped bytes in a resource's memory, owned, freed on their stream when
/// dropped: RMM's `device_buffer`.
///
/// ```text
///  DeviceBuffer { resource, engine, stream, block, len, align }
///                                          │
///   block.addr() ──► [ len bytes in use │ capacity - len spare ]
///                     └──────── block.size() = capacity ───────┘
///   block.addr() % align == 0                    (checked on every block)
/// ```
///
/// A buffer made with length zero holds no memory (its resource answers a
/// zero-byte request with [`Block::EMPTY`]). Its length and its capacity
/// are apart: [`clear`](Self::clear) and [`resize`](Self::resize) to zero
/// keep the memory, as RMM's `resize` does, and
/// [`shrink_to_fit`](Self::shrink_to_fit) gives it back. Growing past
/// the capacity allocates a new block, copies the bytes in use on the
/// buffer's stream and frees the old block on it; if any of the three
/// fails (or the copy engine panics), the buffer is unchanged and the new
/// block goes back. The bytes in use have always been written:
/// [`new`](Self::new) and [`resize`](Self::resize) write zeros, unless the
/// caller takes that on with [`new_uninit`](Self::new_uninit) or
/// [`resize_uninit`](Self::resize_uninit).
///
/// Each constructor comes twice (see the [crate's documentation](crate#constructors)):
/// `new(len, stream)` takes the current resource of the stream's device,
/// `new_in(len, stream, resource, engine)` the resource and engine given.
///
/// # Examples
///
/// ```
/// use memres_containers::DeviceBuffer;
/// use memres_sim::{HostCopy, HostMemory};
/// let mem = HostMemory::new();
/// let mut buf = DeviceBuffer::from_slice_in(b"hello", (), &mem, HostCopy)?;
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
    /// frees them first) and they are the capacity. Its address is a
    /// multiple of `align`.
    block: Block,
    /// Bytes in use, at most the capacity, all written (zeros at least),
    /// unless an `unsafe` uninitialized constructor's caller vouches for them.
    len: u64,
    /// The alignment every block of the buffer is asked for and checked
    /// against: a power of two, at least [`DEFAULT_ALIGNMENT`].
    align: u64,
}

impl<R, E, S> DeviceBuffer<R, E, S>
where
    R: MemoryResource<S> + MemoryOf<E::Kind>,
    E: CopyEngine<S>,
    S: Stream,
{
    /// A block of at least `len` bytes aligned to `align` from `resource`;
    /// a shorter or misaligned one goes back untouched, as an error.
    fn allocate(resource: &R, len: u64, align: u64, stream: &S) -> Result<Block> {
        let block = resource.allocate(Request::aligned(len, align)?, stream)?;
        let error = if block.size() < len {
            ContainerError::BlockTooShort { requested: len, size: block.size() }
        } else if block.addr() % align != 0 {
            ContainerError::Misaligned { align, addr: block.addr() }
        } else {
            return Ok(block);
        };
        // Given back untouched, as if the call had failed.
        let _ = resource.deallocate(block, stream);
        Err(error)
    }

    /// A buffer of `len` bytes aligned to `align` (a power of two at least
    /// [`DEFAULT_ALIGNMENT`]), not written yet: each caller writes them
    /// before the buffer is handed out, or passes the duty on (`unsafe`).
    pub(crate) fn unwritten(len: u64, align: u64, stream: S, resource: R, engine: E) -> Result<Self> {
        let block = Self::allocate(&resource, len, align, &stream)?;
        Ok(DeviceBuffer { resource, engine, stream, block, len, align })
    }

    /// [`unwritten`](Self::unwritten), then zeros written on the stream.
    pub(crate) fn zeroed(len: u64, align: u64, stream: S, resource: R, engine: E) -> Result<Self> {
        let mut buf = Self::unwritten(len, align, stream, resource, engine)?;
        buf.fill(0)?;
        Ok(buf)
    }

    /// [`unwritten`](Self::unwritten), then bytes `src..src + len` copied
    /// in on the stream.
    ///
    /// # Safety
    ///
    /// As [`from_device_ptr_in`](Self::from_device_ptr_in).
    pub(crate) unsafe fn copied(
        len: u64,
        align: u64,
        src: u64,
        stream: S,
        resource: R,
        engine: E,
    ) -> Result<Self> {
        let buf = Self::unwritten(len, align, stream, resource, engine)?;
        if len > 0 {
            // SAFETY: the destination is the block just handed to `buf` by
            // the resource (`MemoryOf<E::Kind>`), of at least `len` bytes,
            // used by nothing else; the source is memory of the engine that
            // the caller holds, written and ordered with the stream (this
            // function's contract). Should they overlap, the engine copies
            // as `memmove` does or refuses (its duty, not the caller's).
            unsafe { buf.engine.copy(buf.block.addr(), src, len, &buf.stream)? };
        }
        Ok(buf)
    }

    /// A buffer of `len` zero bytes from `resource`, on `stream` (the zeros
    /// are written on the stream).
    ///
    /// # Errors
    ///
    /// The resource's error (out of memory, invalid size),
    /// [`ContainerError::BlockTooShort`], [`ContainerError::Misaligned`], the
    /// copy engine's error.
    pub fn new_in(len: u64, stream: S, resource: R, engine: E) -> Result<Self> {
        Self::zeroed(len, DEFAULT_ALIGNMENT, stream, resource, engine)
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
    /// [`DeviceScalar`](crate::DeviceScalar) made from it), before the
    /// buffer is cloned ([`try_clone_on`](Self::try_clone_on)) and before
    /// another container copies it in ([`from_device_ptr_in`](Self::from_device_ptr_in)):
    /// until then the bytes are uninitialized memory. The buffer may grow,
    /// shrink, change alignment or stream meanwhile (its moves of unwritten
    /// bytes read nothing).
    ///
    /// # Errors
    ///
    /// As [`new_in`](Self::new_in), less the copy engine's.
    pub unsafe fn new_uninit_in(len: u64, stream: S, resource: R, engine: E) -> Result<Self> {
        Self::unwritten(len, DEFAULT_ALIGNMENT, stream, resource, engine)
    }

    /// A buffer holding a copy of `data`.
    ///
    /// # Errors
    ///
    /// As [`new_in`](Self::new_in).
    pub fn from_slice_in(data: &[u8], stream: S, resource: R, engine: E) -> Result<Self> {
        let mut buf = Self::unwritten(data.len() as u64, DEFAULT_ALIGNMENT, stream, resource, engine)?;
        buf.write(0, data)?;
        Ok(buf)
    }

    /// A buffer holding a copy of the `len` bytes at device address `src`,
    /// copied on `stream` within the engine's memory: RMM's
    /// `device_buffer(source_data, size, stream, mr)`.
    ///
    /// # Safety
    ///
    /// `src..src + len` must be memory of the engine's kind that the caller
    /// holds (in a block that a resource [`MemoryOf<E::Kind>`](MemoryOf)
    /// handed out and that is not given back, such as another container's,
    /// or other live memory of the backend), every byte written, and not
    /// written by work that is not ordered with `stream` (as
    /// [`CopyEngine::copy`] asks). This holds until the copy is done on
    /// `stream`, not only until the call returns: the copy is queued, so
    /// the source is freed, or written by other streams, only after work
    /// ordered after it on `stream` (the new buffer's stream).
    ///
    /// It cannot be a safe call even over an engine that checks that each
    /// range is live memory of its kind (`HostCopy`, `CudaCopy`): the check
    /// says the bytes are someone's, not the caller's. Safe code could then
    /// read a block whose holder writes it through a Rust reference (unsafe
    /// code may make those to its own block), or bytes nobody wrote.
    ///
    /// # Errors
    ///
    /// As [`new_in`](Self::new_in); the new block is given back on the copy
    /// engine's error (for an engine that checks its accesses, `NotLive` for
    /// a range that is not live memory of its kind).
    pub unsafe fn from_device_ptr_in(src: u64, len: u64, stream: S, resource: R, engine: E) -> Result<Self> {
        // SAFETY: the caller's contract is `copied`'s.
        unsafe { Self::copied(len, DEFAULT_ALIGNMENT, src, stream, resource, engine) }
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

    /// The alignment of the buffer's memory, in bytes: every block it takes
    /// is asked for it and checked to start at a multiple of it.
    pub fn alignment(&self) -> u64 {
        self.align
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
    /// [`ContainerError::IndexOutOfRange`]
    /// if the range passes the length; the copy engine's error.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `offset..offset + data.len()` lies in `..len`, inside the
        // capacity: the block the resource (`MemoryOf<E::Kind>`) handed to
        // this buffer and that it holds, as the engine asks (if other code
        // freed it, the promise keeps the call sound). All the buffer's work
        // is on `self.stream`, which keeps the bytes right (not the call's
        // soundness: see `CopyEngine`'s implementing).
        unsafe { self.engine.copy_from_host(self.block.addr() + offset, data, &self.stream)? };
        Ok(())
    }

    /// Copies bytes `offset..offset + out.len()` of the buffer into `out`.
    ///
    /// # Errors
    ///
    /// [`ContainerError::IndexOutOfRange`]
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
            _ => Err(ContainerError::IndexOutOfRange {
                // The last byte the range would touch.
                index: saturating_usize(offset.saturating_add(n.max(1) - 1)),
                len: saturating_usize(self.len),
            }),
        }
    }

    /// The bytes in use, copied to the host.
    ///
    /// # Errors
    ///
    /// [`ContainerError::HostOutOfMemory`] if the host cannot hold them;
    /// the copy engine's error.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        // More bytes than the host's address space can be copied into none.
        let n = usize::try_from(self.len).map_err(|_| ContainerError::HostOutOfMemory { bytes: self.len })?;
        let mut v = crate::error::host_vec::<u8>(n)?;
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
    pub(crate) fn fill_range(&mut self, offset: u64, n: u64, value: u8) -> Result<()> {
        assert!(offset.checked_add(n).is_some_and(|end| end <= self.capacity()), "fill past the capacity");
        if n > 0 {
            // SAFETY: the range lies inside the capacity (asserted): memory
            // the buffer holds, as in `write`.
            unsafe { self.engine.fill(self.block.addr() + offset, value, n, &self.stream)? };
        }
        Ok(())
    }

    /// Moves the bytes in use to a new block of `capacity` bytes aligned to
    /// `align`, which becomes the buffer's alignment. On an error the buffer
    /// is unchanged and holds the old block; the new one goes back. If the
    /// old block's free panics, the buffer holds the new one.
    fn reallocate(&mut self, capacity: u64, align: u64) -> Result<()> {
        let new = Self::allocate(&self.resource, capacity, align, &self.stream)?;
        // Until the buffer takes it, the new block goes back on any way out,
        // a panic in the copy engine included.
        let fresh = Pending::new(&self.resource, new, &self.stream);
        let keep = self.len.min(capacity);
        if keep > 0 {
            // SAFETY: both ranges lie in blocks the resource
            // (`MemoryOf<E::Kind>`) handed to this buffer and that it holds:
            // `keep` is at most the old length and at most `capacity`, which
            // `allocate` checked `new` holds (both used on `self.stream`
            // only, for the bytes). They overlap where other code freed the
            // old block and the resource handed its address out again as
            // `new`: the engine copies as `memmove` does or refuses (its
            // duty, not ours).
            unsafe { self.engine.copy(new.addr(), self.block.addr(), keep, &self.stream)? };
        }
        // The buffer takes the new block before the old one's free (after
        // the copy, on the same stream). A free that panics may have freed
        // the old block (`Logging` frees it when its writer panics) or not:
        // the buffer never uses it again either way. A refused free left
        // it unfreed: the buffer takes it back, and the new one goes back.
        let old = (self.block, self.len, self.align);
        (self.block, self.len, self.align) = (fresh.hand_over(), keep, align);
        if let Err(e) = self.resource.deallocate(old.0, &self.stream) {
            (self.block, self.len, self.align) = old;
            let _ = self.resource.deallocate(new, &self.stream);
            return Err(e.into());
        }
        Ok(())
    }

    /// Sets the length to `len` bytes, keeping the bytes in use up to it;
    /// new bytes are zero (written on the stream). Reallocates only past the
    /// capacity, to exactly `len`.
    ///
    /// # Errors
    ///
    /// As [`reserve`](Self::reserve): the buffer is then unchanged. The copy
    /// engine's error writing the zeros: the length is then unchanged (the
    /// capacity may have grown).
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
    /// As [`new_uninit_in`](Self::new_uninit_in), for the bytes past the old
    /// length: each must be written before it is read to the host or the
    /// buffer is cloned.
    ///
    /// # Errors
    ///
    /// As [`reserve`](Self::reserve); the buffer is then unchanged.
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
    /// The resource's error (allocating the new block, or refusing to free
    /// the old one), [`ContainerError::BlockTooShort`],
    /// [`ContainerError::Misaligned`], the copy engine's error (moving the
    /// bytes in use); the buffer is then unchanged, and any new block goes
    /// back.
    pub fn reserve(&mut self, capacity: u64) -> Result<()> {
        if capacity > self.capacity() {
            self.reallocate(capacity, self.align)?;
        }
        Ok(())
    }

    /// Moves the bytes in use to a block asked for exactly the length (no
    /// memory at all for length 0): the capacity is then the length, or
    /// more where the resource hands out more than asked (each call then
    /// moves the bytes again).
    ///
    /// # Errors
    ///
    /// As [`reserve`](Self::reserve): the buffer is then unchanged, and any
    /// new block goes back.
    pub fn shrink_to_fit(&mut self) -> Result<()> {
        if self.len < self.capacity() {
            self.reallocate(self.len, self.align)?;
        }
        Ok(())
    }

    /// Makes `align` (a power of two; below [`DEFAULT_ALIGNMENT`], raised to
    /// it) the alignment of the buffer's memory from now on. A block at hand
    /// that does not start at a multiple of it is replaced by one that does,
    /// of the same capacity, the bytes in use moved on the stream. A buffer
    /// with no memory takes none, so the way to a new aligned buffer is:
    ///
    /// ```
    /// # use memres_containers::DeviceBuffer;
    /// # use memres_sim::{HostCopy, HostMemory};
    /// # let mem = HostMemory::new();
    /// let mut buf = DeviceBuffer::new_in(0, (), &mem, HostCopy)?;
    /// buf.set_alignment(1 << 16)?;
    /// buf.resize(1000)?;
    /// assert_eq!(buf.addr() % (1 << 16), 0);
    /// # Ok::<(), memres_containers::ContainerError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidAlignment`](memres_core::Error::InvalidAlignment) for
    /// an alignment that is not a power of two or above
    /// [`Request::MAX_ALIGN`]; the resource's error (one that cannot align so
    /// far: `InvalidAlignment`, or out of memory; or its refusal to free the
    /// old block),
    /// [`ContainerError::Misaligned`] (a resource that hands out a block
    /// aligned less than asked), [`ContainerError::BlockTooShort`], the copy
    /// engine's error. The buffer is then unchanged, its alignment included.
    pub fn set_alignment(&mut self, align: u64) -> Result<()> {
        let align = Request::aligned(0, align)?.align();
        if self.block.addr() % align != 0 {
            self.reallocate(self.capacity(), align)?;
        }
        self.align = align;
        Ok(())
    }

    /// Sets the length to zero, keeping the memory.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Raises the alignment to `align` (a power of two at least
    /// [`DEFAULT_ALIGNMENT`]) if the block at hand starts at a multiple of it.
    ///
    /// # Errors
    ///
    /// [`ContainerError::Misaligned`] if it does not; nothing changes.
    pub(crate) fn adopt_alignment(&mut self, align: u64) -> Result<()> {
        if self.block.addr() % align != 0 {
            return Err(ContainerError::Misaligned { align, addr: self.block.addr() });
        }
        self.align = self.align.max(align);
        Ok(())
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

    /// A deep copy on the buffer's own stream, from the same resource, of
    /// the same alignment: RMM's copy construction.
    ///
    /// A device copy can fail where a host copy cannot (the resource out
    /// of memory, a stream's error, a block that other code freed): this
    /// returns the error, where [`Clone`] (the same copy) panics with it.
    ///
    /// # Errors
    ///
    /// As [`try_clone_on`](Self::try_clone_on).
    pub fn try_clone(&self) -> Result<Self>
    where
        R: Clone,
        E: Clone,
        S: Clone,
    {
        self.try_clone_on(self.stream.clone())
    }

    /// A deep copy on `stream`, from the same resource, of the same
    /// alignment: [`try_clone_in`](Self::try_clone_in) with a clone of this
    /// buffer's resource.
    ///
    /// # Errors
    ///
    /// As [`try_clone_in`](Self::try_clone_in).
    pub fn try_clone_on(&self, stream: S) -> Result<Self>
    where
        R: Clone,
        E: Clone,
    {
        self.try_clone_in(stream, self.resource.clone())
    }

    /// A deep copy on `stream` into `resource`, of the same alignment:
    /// RMM's copy construction with its memory resource argument. The
    /// resource may be of another type, such as a pool kept for long-lived
    /// data; it must be memory of the same engine, which makes the copy.
    /// The copy is ordered after the work submitted so far on this buffer's
    /// stream, and this buffer's later work (its free on drop included)
    /// after the copy.
    ///
    /// ```
    /// use memres_containers::DeviceBuffer;
    /// use memres_sim::{HostCopy, HostMemory};
    /// let (scratch, kept) = (HostMemory::new(), HostMemory::new());
    /// let a = DeviceBuffer::from_slice_in(b"bytes", (), &scratch, HostCopy)?;
    /// let b = a.try_clone_in((), &kept)?;
    /// drop(a);
    /// assert_eq!((scratch.live_count(), kept.live_count()), (0, 1));
    /// assert_eq!(b.to_vec()?, b"bytes");
    /// # Ok::<(), memres_containers::ContainerError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// The resource's, the stream's or the copy engine's error,
    /// [`ContainerError::BlockTooShort`], [`ContainerError::Misaligned`]; the
    /// new buffer is then dropped (freed on `stream`). Once the copy is
    /// being queued, until this buffer's stream is ordered after it, any way
    /// out (an error, or a panic of the engine or of a stream) first has the
    /// host wait for the copy's stream, so that this buffer's free never
    /// overtakes the copy.
    pub fn try_clone_in<R2>(&self, stream: S, resource: R2) -> Result<DeviceBuffer<R2, E, S>>
    where
        R2: MemoryResource<S> + MemoryOf<E::Kind>,
        E: Clone,
    {
        let done = self.stream.record()?;
        stream.wait(&done)?;
        // Each event dropped before the copy is returned: a value being
        // returned is not dropped when a local's drop panics (a user's
        // event may), and the copy's block would stay out for good.
        drop(done);
        let copy = DeviceBuffer::unwritten(self.len, self.align, stream, resource, self.engine.clone())?;
        if self.len == 0 {
            return Ok(copy);
        }
        // Declared after `copy`, so dropped (the host waiting for the copy)
        // before `copy` frees its block, on every way out but the last.
        let in_flight = CopyInFlight(&copy.stream);
        // SAFETY: the destination is the block just handed to `copy` by
        // `resource` (`MemoryOf<E::Kind>`), of at least `len` bytes, used by
        // nothing else; the source is this buffer's bytes in use: memory of
        // the engine in the block it holds (this buffer's resource is
        // `MemoryOf<E::Kind>` too), all written (the invariant of `len`;
        // the copy's stream waits for the work submitted on this buffer's
        // stream, above, for the bytes to be right). They overlap where
        // other code freed this buffer's block and a resource over the same
        // memory handed it out again to `copy`: the engine copies as
        // `memmove` does or refuses (its duty).
        unsafe { copy.engine.copy(copy.block.addr(), self.block.addr(), self.len, &copy.stream)? };
        // The source's later work, its free included, after the copy.
        let copied = copy.stream.record()?;
        self.stream.wait(&copied)?;
        drop(copied);
        in_flight.ordered();
        Ok(copy)
    }

    /// Reinterprets the buffer's bytes in use as `T`s.
    ///
    /// # Errors
    ///
    /// As [`DeviceUVector::try_from_buffer`](crate::DeviceUVector::try_from_buffer).
    #[allow(clippy::result_large_err)]
    pub fn try_into_uvector<T: bytemuck::Pod>(
        self,
    ) -> std::result::Result<crate::DeviceUVector<T, R, E, S>, (crate::ContainerError, Self)> {
        crate::DeviceUVector::try_from_buffer(self)
    }
}

/// `n` as a `usize`, `usize::MAX` where it is more (a host of 32 bits): for
/// the byte counts an error reports.
fn saturating_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// A copy queued on a stream that the source's stream is not ordered after
/// yet: if this is dropped before [`ordered`](Self::ordered), the host waits
/// for the copy's stream, so that the source's holder cannot free its block
/// (on its own stream) while the copy still reads it. As `Pending` guards a
/// block, this guards the order, on an error or a panic in user code.
struct CopyInFlight<'a, S: Stream>(&'a S);

impl<S: Stream> CopyInFlight<'_, S> {
    /// The source's stream now waits for the copy: nothing left to do.
    fn ordered(self) {
        std::mem::forget(self);
    }
}

impl<S: Stream> Drop for CopyInFlight<'_, S> {
    fn drop(&mut self) {
        // A stream that cannot synchronize has failed and runs no more
        // work. While the thread unwinds, a panic of the stream is caught
        // (and its payload's drop): a second panic in a destructor would
        // abort the process.
        memres_core::in_destructor(|| {
            let _ = self.0.synchronize();
        });
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
        // resource only fails here if it is itself broken. Nobody takes it
        // over: `Pending` frees it, and catches a panic of the free while
        // the thread unwinds (a second panic would abort the process).
        drop(Pending::new(&self.resource, self.block, &self.stream));
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
            .field("alignment", &self.align)
            .field("stream", &self.stream.id())
            .finish()
    }
}
