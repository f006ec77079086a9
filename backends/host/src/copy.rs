use memres_core::copy::CopyEngine;
use memres_core::{Result, Stream};

/// The copy engine of host memory: addresses are pointers, copies are
/// `memcpy`, done at once (so they are trivially ordered on any stream).
///
/// Use it with memory from [`HostMemory`](crate::HostMemory) or a resource
/// over it; never with [`SimDevice`](crate::SimDevice) addresses, which have
/// no bytes behind them. The containers hold to this through
/// [`MemoryOf<HostCopy>`](memres_core::copy::MemoryOf), which `HostMemory`
/// implements and `SimDevice` does not.
///
/// # Examples
///
/// ```
/// use memres_core::copy::CopyEngine;
/// use memres_host::HostCopy;
/// let mut dst = [0u8; 3];
/// // SAFETY: both are live host buffers of 3 bytes.
/// unsafe {
///     HostCopy.copy_from_host(dst.as_mut_ptr() as u64, b"abc", &())?;
/// }
/// assert_eq!(&dst, b"abc");
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct HostCopy;

impl<S: Stream + ?Sized> CopyEngine<S> for HostCopy {
    type Kind = HostCopy;

    unsafe fn copy_from_host(&self, dst: u64, src: &[u8], _: &S) -> Result<()> {
        // SAFETY: the caller guarantees `dst..dst + src.len()` is live host
        // memory not used by anyone else; `src` is a distinct borrowed slice.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, _: &S) -> Result<()> {
        // SAFETY: the caller guarantees `src..src + dst.len()` is live host
        // memory not written concurrently; `dst` is an exclusive borrow.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn copy(&self, dst: u64, src: u64, len: u64, _: &S) -> Result<()> {
        // SAFETY: the caller guarantees both ranges are live, distinct host
        // memory used by no one else.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len as usize) };
        Ok(())
    }

    unsafe fn fill(&self, dst: u64, value: u8, len: u64, _: &S) -> Result<()> {
        // SAFETY: the caller guarantees the range is live host memory used by
        // no one else.
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, len as usize) };
        Ok(())
    }
}
