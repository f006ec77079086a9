//! The copy engine of CUDA memory, for the containers.

use crate::context::{Context, Device};
use crate::error::check;
use crate::host_visible;
use crate::ops;
use crate::stream::{capture_of, in_order_joined, join_its_thread, wait_for_work, AsRawStream};
use crate::sys;
use memres_core::copy::{CopyEngine, LiveRanges};
use memres_core::{Error, Result};

/// Copies into, out of and within CUDA memory (device, managed or pinned),
/// ordered on any stream that names a raw `CUstream` ([`AsRawStream`]):
/// [`CudaStream`](crate::CudaStream), `&CudaStream`, or `()` for the legacy
/// default stream.
///
/// ```text
///  CudaCopy { context }
///    copy_from_host(dst, src, s) ──► cuMemcpyHtoDAsync_v2(s) + cuStreamSynchronize(s)
///    copy_to_host(dst, src, s)   ──► cuMemcpyDtoHAsync_v2(s) + cuStreamSynchronize(s)
///    copy(dst, src, n, s)        ──► cuMemcpyAsync(s)
///    fill(dst, v, n, s)          ──► cuMemsetD8Async(s)
///  each range first: in a live pinned or managed allocation ─► marked in use in that
///                      table, the work queued, cuStreamSynchronize(s), unmarked
///                    else device memory (cuPointerGetAttributes) ─► queued as above
///                    else ─► Error::NotLive, nothing queued
/// ```
///
/// Each call runs with the stream's context current, or, for a stream that
/// does not know its context (`()`, a borrowed stream), the engine's; the
/// caller's context is restored afterwards. Copies that involve a host slice
/// wait for the stream, as [`CopyEngine`] promises, so they also wait for
/// the work queued on the stream before them.
///
/// # Checked access
///
/// Every range is checked before the driver sees it, so that a container
/// whose block was freed by other code never has the driver write freed
/// host memory ([checked access](memres_core::copy#checked-access)):
///
/// - **Pinned and managed memory** ([`PinnedMemory`](crate::PinnedMemory),
///   [`ManagedMemory`](crate::ManagedMemory)) is host memory the driver
///   reads and writes, and once freed its address may be the process's
///   heap. A range in it is touched only while it lies in one live
///   allocation of those resources, under the lock under which they free,
///   and the call waits for its stream before it lets go: `copy` and `fill`
///   on such memory return only once done. Host-visible memory from
///   elsewhere (`cuMemHostRegister`, another library's pinned memory) is
///   refused.
/// - **Device memory** is reached only by the driver's copies. A range in
///   it must lie in one device allocation that is not managed, as the
///   driver reports (`cuPointerGetAttributes`: memory type, range start and
///   size). A stale device address names device memory or nothing: under
///   unified addressing the driver keeps device addresses in ranges it
///   reserves apart from the host's. The copies to and from a host slice
///   are explicit (`HtoD`, `DtoH`) with the host side a Rust slice, but
///   `copy` is `cuMemcpyAsync`, which infers each side's kind from its
///   address, and `fill` may reach any address the device can (on systems
///   with heterogeneous memory management, pageable host memory): hence the
///   check rather than trust in the address.
///
/// Anything else, and two ranges that overlap, is [`Error::NotLive`],
/// nothing queued. What is left: device memory freed by other code after
/// the check and before the device runs the queued work is written on the
/// device anyway (another holder's device bytes, or a driver error), as the
/// stream-ordered model has it in RMM. The cost: one driver query per
/// device range, and for pinned and managed memory a wait for the stream
/// to drain, the ranges marked in use meanwhile (a free of their
/// allocation waits for it).
///
/// # Errors
///
/// Driver errors as [`Error::Backend`]; a length that does not fit a
/// `usize` as [`Error::InvalidSize`]; a range that is not live memory as
/// above as [`Error::NotLive`].
///
/// # Examples
///
/// ```no_run
/// use memres_containers::DeviceUVector;
/// use memres_cuda::{CudaAsyncMemory, CudaCopy, CudaStream, Device};
/// let device = Device::get(0)?;
/// let (mr, stream) = (CudaAsyncMemory::new(device)?, CudaStream::new(device)?);
/// let v = DeviceUVector::from_slice_in(&[1.0f32, 2.0], &stream, &mr, CudaCopy::new(device)?)?;
/// assert_eq!(v.to_vec()?, [1.0, 2.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct CudaCopy {
    /// Made current for streams that do not name their own context; retained
    /// while the engine lives.
    context: Context,
}

impl CudaCopy {
    /// An engine for the memory of `device` (its primary context).
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn new(device: Device) -> Result<CudaCopy> {
        Ok(CudaCopy { context: device.primary_context()? })
    }

    /// An engine whose calls on streams of unknown context run in `context`.
    pub fn in_context(context: Context) -> CudaCopy {
        CudaCopy { context }
    }

    /// The context used for streams that do not name their own.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// Runs `work` on the raw stream with the right context current, once
    /// every range of `ranges` (address, length; none empty) is checked
    /// with the table of host-visible allocations locked; if any range is
    /// host-visible memory, the ranges are marked in use there before the
    /// lock is let go, and unmarked once the stream has drained.
    fn checked<S: AsRawStream + ?Sized, const N: usize>(
        &self,
        stream: &S,
        ranges: [(u64, u64); N],
        work: impl FnOnce(sys::CUstream) -> Result<()>,
    ) -> Result<()> {
        let raw = stream.as_raw_stream();
        stream.context().unwrap_or(&self.context).scope(|| {
            // Before the lock: every allocation of pinned or managed memory
            // takes it, and the context's work may wait for one.
            join_its_thread(stream)?;
            let mut table = host_visible::lock();
            let mut host = false;
            for (addr, len) in ranges {
                host |= host_visible_or_device(&table.live, addr, len)?;
            }
            if let [(a, n), (b, _)] = ranges[..] {
                if a < b.saturating_add(n) && b < a.saturating_add(n) {
                    return Err(Error::NotLive { addr: b, len: n });
                }
            }
            if !host {
                // Device memory only: nothing a free of host memory can race.
                drop(table);
                return in_order_joined(stream, work);
            }
            // A free of the memory waits until the access drops; other
            // threads' accesses and frees go on meanwhile.
            let access = host_visible::Access::begin(&mut table, ranges);
            drop(table);
            // The work must be done before the access lets a free of its
            // host-visible memory through. An error of `work` means nothing
            // it queued will run: the driver refused to queue it, or (for a
            // host slice) its own wait found that it never will. Once it is
            // queued, `wait_for_work` returns when it has finished or never
            // will run.
            // SAFETY: `raw` is valid while `stream` is borrowed (`AsRawStream`'s
            // contract), in the context made current above.
            let before = unsafe { capture_of(raw) };
            // SAFETY: as above.
            let done = work(raw).and_then(|()| unsafe { wait_for_work(raw, before) });
            drop(access);
            done
        })
    }
}

fn bytes(len: u64) -> Result<usize> {
    usize::try_from(len).map_err(|_| Error::InvalidSize { size: len, what: "more than a usize holds" })
}

/// Whether `addr..addr + len` is host-visible memory (in one live pinned or
/// managed allocation of `live`) rather than device memory (in one device
/// allocation that is not managed, as the driver reports).
///
/// # Errors
///
/// [`Error::NotLive`] if it is neither; the driver's error if it cannot say.
fn host_visible_or_device(live: &LiveRanges, addr: u64, len: u64) -> Result<bool> {
    if live.check(addr, len).is_ok() {
        return Ok(true);
    }
    // Each attribute is written into the low bytes of a zeroed `u64` (all
    // are at most 8 bytes; CUDA hosts are little-endian).
    let mut attributes = [
        sys::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        sys::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        sys::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        sys::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut values = [0u64; 4];
    let mut data = values.each_mut().map(|v| (v as *mut u64).cast::<core::ffi::c_void>());
    // SAFETY: four attributes, each with a writable 8-byte slot that lives
    // across the call; the driver only reads `addr` as a number (for memory
    // it does not know it reports zeros).
    check(unsafe { sys::cuPointerGetAttributes(4, attributes.as_mut_ptr(), data.as_mut_ptr(), addr) })?;
    let [memory_type, managed, start, size] = values;
    let device = memory_type as u32 == sys::CU_MEMORYTYPE_DEVICE && managed as u32 == 0;
    let inside = addr >= start && addr.checked_add(len).is_some_and(|end| end <= start.saturating_add(size));
    if device && inside && mapped(addr, addr + len)? {
        Ok(false)
    } else {
        Err(Error::NotLive { addr, len })
    }
}

/// Whether all of `start..end` is mapped. For memory mapped with
/// `cuMemMap` the driver's range of a pointer is the whole reservation,
/// mapped or not; `cuMemGetAddressRange` gives the mapping that holds a
/// pointer (for other device memory, its allocation, so one call), and
/// the range is walked mapping by mapping.
fn mapped(start: u64, end: u64) -> Result<bool> {
    let mut at = start;
    while at < end {
        let (mut base, mut size) = (0, 0usize);
        // SAFETY: two writable out-parameters that live across the call;
        // the driver only reads `at` as a number.
        match unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, at) } {
            sys::CUDA_SUCCESS => {}
            // Not mapped (the driver says "not found"), or not an address.
            sys::CUDA_ERROR_NOT_FOUND | sys::CUDA_ERROR_INVALID_VALUE => return Ok(false),
            code => check(code)?,
        }
        let next = base.saturating_add(size as u64);
        if base > at || next <= at {
            return Ok(false);
        }
        at = next;
    }
    Ok(true)
}

impl<S: AsRawStream + ?Sized> CopyEngine<S> for CudaCopy {
    type Kind = CudaCopy;

    unsafe fn copy_from_host(&self, dst: u64, src: &[u8], stream: &S) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: `dst..dst + src.len()` is checked live memory (see
        // `CudaCopy`'s checked access) and `src` a Rust slice, so not in it
        // (nothing makes references to such memory); the stream is valid
        // while borrowed and `checked` makes its context current.
        self.checked(stream, [(dst, src.len() as u64)], |raw| unsafe { ops::host_to_device(raw, dst, src) })
    }

    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: &S) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let len = dst.len() as u64;
        // SAFETY: as in `copy_from_host`, with the roles swapped.
        self.checked(stream, [(src, len)], |raw| unsafe { ops::device_to_host(raw, dst, src) })
    }

    unsafe fn copy(&self, dst: u64, src: u64, len: u64, stream: &S) -> Result<()> {
        let n = bytes(len)?;
        if n == 0 {
            return Ok(());
        }
        self.checked(stream, [(dst, len), (src, len)], |raw| {
            // SAFETY: both ranges are checked live memory, apart from each
            // other (see `CudaCopy`'s checked access); the stream is valid
            // while borrowed and `checked` makes its context current.
            check(unsafe { sys::cuMemcpyAsync(dst, src, n, raw) })
        })
    }

    unsafe fn fill(&self, dst: u64, value: u8, len: u64, stream: &S) -> Result<()> {
        let n = bytes(len)?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: the range is checked live memory (see `CudaCopy`'s checked
        // access); the stream is valid while borrowed and `checked` makes
        // its context current.
        self.checked(stream, [(dst, len)], |raw| check(unsafe { sys::cuMemsetD8Async(dst, value, n, raw) }))
    }
}
