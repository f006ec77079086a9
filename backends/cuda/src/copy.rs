//! The copy engine of CUDA memory, for the containers.

use crate::context::{Context, Device};
use crate::error::check;
use crate::ops;
use crate::stream::AsRawStream;
use crate::sys;
use memres_core::copy::CopyEngine;
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
/// ```
///
/// Each call runs with the stream's context current, or, for a stream that
/// does not know its context (`()`, a borrowed stream), the engine's; the
/// caller's context is restored afterwards. Copies that involve a host slice
/// wait for the stream, as [`CopyEngine`] promises, so they also wait for
/// the work queued on the stream before them.
///
/// # Errors
///
/// Driver errors as [`Error::Backend`]; a length that does not fit a
/// `usize` as [`Error::InvalidSize`].
///
/// # Examples
///
/// ```no_run
/// use memres_containers::DeviceUVector;
/// use memres_cuda::{CudaAsyncMemory, CudaCopy, CudaStream, Device};
/// let device = Device::get(0)?;
/// let (mr, stream) = (CudaAsyncMemory::new(device)?, CudaStream::new(device)?);
/// let v = DeviceUVector::from_slice(&[1.0f32, 2.0], &stream, &mr, CudaCopy::new(device)?)?;
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

    /// Runs `f` on the raw stream with the right context current.
    fn on<S: AsRawStream + ?Sized>(
        &self,
        stream: &S,
        f: impl FnOnce(sys::CUstream) -> Result<()>,
    ) -> Result<()> {
        let raw = stream.as_raw_stream();
        stream.context().unwrap_or(&self.context).scope(|| f(raw))
    }
}

fn bytes(len: u64) -> Result<usize> {
    usize::try_from(len).map_err(|_| Error::InvalidSize { size: len })
}

impl<S: AsRawStream + ?Sized> CopyEngine<S> for CudaCopy {
    type Kind = CudaCopy;

    unsafe fn copy_from_host(&self, dst: u64, src: &[u8], stream: &S) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: the caller vouches for `dst..dst + src.len()`; the stream
        // is valid while borrowed and `on` makes its context current.
        self.on(stream, |raw| unsafe { ops::host_to_device(raw, dst, src) })
    }

    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: &S) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: the caller vouches for `src..src + dst.len()`; the stream
        // is valid while borrowed and `on` makes its context current.
        self.on(stream, |raw| unsafe { ops::device_to_host(raw, dst, src) })
    }

    unsafe fn copy(&self, dst: u64, src: u64, len: u64, stream: &S) -> Result<()> {
        let n = bytes(len)?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: the caller vouches that both ranges are live memory used
        // only by work on `stream`; with unified addressing the driver finds
        // the kind of each side from its address.
        self.on(stream, |raw| check(unsafe { sys::cuMemcpyAsync(dst, src, n, raw) }))
    }

    unsafe fn fill(&self, dst: u64, value: u8, len: u64, stream: &S) -> Result<()> {
        let n = bytes(len)?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: the caller vouches that the range is live memory used only
        // by work on `stream`.
        self.on(stream, |raw| check(unsafe { sys::cuMemsetD8Async(dst, value, n, raw) }))
    }
}
