//! CUDA result codes as [`memres_core::Error`] values.

use crate::sys;
use memres_core::{Error, Result};

/// Names of the result codes a memory manager meets; others are asked of the
/// driver (`cuGetErrorName`).
const NAMES: &[(i32, &str)] = &[
    (0, "CUDA_SUCCESS"),
    (1, "CUDA_ERROR_INVALID_VALUE"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY"),
    (3, "CUDA_ERROR_NOT_INITIALIZED"),
    (4, "CUDA_ERROR_DEINITIALIZED"),
    (34, "CUDA_ERROR_STUB_LIBRARY"),
    (46, "CUDA_ERROR_DEVICE_UNAVAILABLE"),
    (100, "CUDA_ERROR_NO_DEVICE"),
    (101, "CUDA_ERROR_INVALID_DEVICE"),
    (201, "CUDA_ERROR_INVALID_CONTEXT"),
    (304, "CUDA_ERROR_OPERATING_SYSTEM"),
    (400, "CUDA_ERROR_INVALID_HANDLE"),
    (401, "CUDA_ERROR_ILLEGAL_STATE"),
    (500, "CUDA_ERROR_NOT_FOUND"),
    (600, "CUDA_ERROR_NOT_READY"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"),
    (719, "CUDA_ERROR_LAUNCH_FAILED"),
    (800, "CUDA_ERROR_NOT_PERMITTED"),
    (801, "CUDA_ERROR_NOT_SUPPORTED"),
    (802, "CUDA_ERROR_SYSTEM_NOT_READY"),
    (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
    (804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"),
    (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"),
    (901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"),
    (999, "CUDA_ERROR_UNKNOWN"),
];

/// The driver's name for a result code, such as `"CUDA_ERROR_OUT_OF_MEMORY"`.
///
/// Codes this crate does not list are named by the driver; a code the
/// driver does not know either is `"CUDA_ERROR_UNRECOGNIZED"`.
///
/// # Examples
///
/// ```
/// assert_eq!(memres_cuda::error_name(2), "CUDA_ERROR_OUT_OF_MEMORY");
/// ```
pub fn error_name(code: i32) -> &'static str {
    if let Some(&(_, name)) = NAMES.iter().find(|(c, _)| *c == code) {
        return name;
    }
    let mut ptr = core::ptr::null();
    // SAFETY: `cuGetErrorName` only writes a pointer through its out
    // parameter, which points at a live local; it needs no initialization.
    let rc = unsafe { sys::cuGetErrorName(code, &mut ptr) };
    if rc != sys::CUDA_SUCCESS || ptr.is_null() {
        return "CUDA_ERROR_UNRECOGNIZED";
    }
    // SAFETY: on success the driver points `ptr` at one of its own
    // NUL-terminated static strings. The driver is linked into the process
    // (not loaded and unloaded at run time), so the string lives for the
    // rest of the process: `'static` is its true lifetime.
    let name: &'static core::ffi::CStr = unsafe { core::ffi::CStr::from_ptr(ptr) };
    name.to_str().unwrap_or("CUDA_ERROR_UNRECOGNIZED")
}

/// The [`Error`] for a failed driver call: [`Error::Backend`] with the code
/// and its name. Out of memory is mapped by the allocating calls themselves,
/// which know the figures to report.
///
/// # Examples
///
/// ```
/// use memres_core::Error;
/// assert_eq!(
///     memres_cuda::error_from_code(201),
///     Error::Backend { code: 201, what: "CUDA_ERROR_INVALID_CONTEXT" },
/// );
/// ```
pub fn error_from_code(code: i32) -> Error {
    Error::Backend { code: i64::from(code), what: error_name(code) }
}

/// `Ok` for `CUDA_SUCCESS`, the mapped error otherwise.
#[inline]
pub(crate) fn check(code: sys::CuResult) -> Result<()> {
    if code == sys::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(error_from_code(code))
    }
}

/// The error for a failed free of `addr`: the driver answers an address it
/// did not hand out (or that was freed already) with `CUDA_ERROR_INVALID_VALUE`.
#[inline]
pub(crate) fn check_free(code: sys::CuResult, addr: u64) -> Result<()> {
    match code {
        sys::CUDA_SUCCESS => Ok(()),
        sys::CUDA_ERROR_INVALID_VALUE => Err(Error::UnknownBlock { addr }),
        _ => Err(error_from_code(code)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_codes_have_their_names() {
        for &(code, name) in NAMES {
            assert_eq!(error_name(code), name);
            assert!(name.starts_with("CUDA_"));
        }
    }

    #[test]
    fn success_is_ok_and_failures_are_backend_errors() {
        assert_eq!(check(0), Ok(()));
        assert_eq!(check(999), Err(Error::Backend { code: 999, what: "CUDA_ERROR_UNKNOWN" }));
        assert_eq!(check_free(1, 0x100), Err(Error::UnknownBlock { addr: 0x100 }));
        assert_eq!(check_free(0, 0x100), Ok(()));
        assert!(matches!(check_free(700, 0x100), Err(Error::Backend { code: 700, .. })));
    }
}
