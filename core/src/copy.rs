//! Moving bytes: the small trait a backend implements so that containers can
//! fill and read the memory its resources hand out.

use crate::{Result, Stream};

/// Copies between host memory and a backend's memory, ordered on a stream.
///
/// Copies that involve a host slice ([`copy_from_host`](Self::copy_from_host),
/// [`copy_to_host`](Self::copy_to_host)) have completed when they return, so
/// the slice may be reused at once. Copies within the backend's memory
/// ([`copy`](Self::copy), [`fill`](Self::fill)) are only ordered on the
/// stream: later work on the stream sees their result.
///
/// # Examples
///
/// A host-memory backend can implement it with plain pointer copies; see
/// `memres_host::HostCopy`. Calling it:
///
/// ```
/// use memres_core::{copy::CopyEngine, Result, Stream};
/// fn roundtrip<E: CopyEngine<S>, S: Stream>(e: &E, addr: u64, s: &S) -> Result<[u8; 4]> {
///     let mut out = [0u8; 4];
///     // SAFETY: the caller hands us 4 bytes of live memory of this backend at `addr`.
///     unsafe {
///         e.copy_from_host(addr, &[1, 2, 3, 4], s)?;
///         e.copy_to_host(&mut out, addr, s)?;
///     }
///     Ok(out)
/// }
/// ```
pub trait CopyEngine<S: Stream + ?Sized> {
    /// Copies `src` to `dst..dst + src.len()`.
    ///
    /// # Safety
    ///
    /// The destination range must be memory of this backend that is live and
    /// not used by other work that is not ordered with `stream`.
    unsafe fn copy_from_host(&self, dst: u64, src: &[u8], stream: &S) -> Result<()>;

    /// Copies `src..src + dst.len()` into `dst`.
    ///
    /// # Safety
    ///
    /// The source range must be live memory of this backend, not written by
    /// other work that is not ordered with `stream`.
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: &S) -> Result<()>;

    /// Copies `len` bytes from `src` to `dst` (ranges may not overlap).
    ///
    /// # Safety
    ///
    /// Both ranges must be live memory of this backend, used only by work
    /// ordered with `stream`.
    unsafe fn copy(&self, dst: u64, src: u64, len: u64, stream: &S) -> Result<()>;

    /// Sets `len` bytes at `dst` to `value`.
    ///
    /// # Safety
    ///
    /// The range must be live memory of this backend, used only by work
    /// ordered with `stream`.
    unsafe fn fill(&self, dst: u64, value: u8, len: u64, stream: &S) -> Result<()>;
}

impl<S: Stream + ?Sized, E: CopyEngine<S> + ?Sized> CopyEngine<S> for &E {
    unsafe fn copy_from_host(&self, dst: u64, src: &[u8], stream: &S) -> Result<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { (**self).copy_from_host(dst, src, stream) }
    }
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: &S) -> Result<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { (**self).copy_to_host(dst, src, stream) }
    }
    unsafe fn copy(&self, dst: u64, src: u64, len: u64, stream: &S) -> Result<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { (**self).copy(dst, src, len, stream) }
    }
    unsafe fn fill(&self, dst: u64, value: u8, len: u64, stream: &S) -> Result<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { (**self).fill(dst, value, len, stream) }
    }
}
