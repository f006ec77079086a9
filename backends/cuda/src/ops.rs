//! The few memory operations that tests and containers need: fill, copy.
//!
//! They take raw addresses (a [`Block`](memres_core::Block)'s) and are
//! `unsafe`: the caller vouches that the ranges are live memory of the
//! stream's device (or pinned or managed memory) for as long as the work runs.

use crate::error::check;
use crate::stream::{capture_of, in_order, wait_for_work, CudaStream};
use crate::sys;
use memres_core::Result;
use std::ffi::c_void;

/// Fills `count` 32-bit words at `dst` with `value`, ordered on `stream`
/// (`cuMemsetD32Async`).
///
/// # Safety
///
/// `dst..dst + 4 * count` must be device-accessible memory, 4-byte aligned,
/// live and used by nothing else until the work on `stream` completes.
///
/// # Errors
///
/// The driver's error as [`Error::Backend`](memres_core::Error::Backend).
pub unsafe fn memset_d32(stream: &CudaStream, dst: u64, value: u32, count: usize) -> Result<()> {
    // SAFETY: the caller vouches for the range; the stream is valid while borrowed.
    stream.scope(|| in_order(stream, |raw| check(unsafe { sys::cuMemsetD32Async(dst, value, count, raw) })))
}

/// Copies `bytes` from `src` to `dst`, ordered on `stream` (`cuMemcpyAsync`;
/// either side may be device, managed or pinned memory).
///
/// # Safety
///
/// Both ranges must be device-accessible memory, live until the work on
/// `stream` completes; `dst` must be used by nothing else until then.
///
/// # Errors
///
/// The driver's error as [`Error::Backend`](memres_core::Error::Backend).
pub unsafe fn copy(stream: &CudaStream, dst: u64, src: u64, bytes: usize) -> Result<()> {
    // SAFETY: the caller vouches for both ranges.
    stream.scope(|| in_order(stream, |raw| check(unsafe { sys::cuMemcpyAsync(dst, src, bytes, raw) })))
}

/// Copies `dst.len()` bytes from device memory at `src` into `dst` after
/// the work queued on `stream`, and waits for the copy to finish.
///
/// # Safety
///
/// `src..src + dst.len()` must be device-accessible memory, live until the
/// call returns.
///
/// # Errors
///
/// The driver's error as [`Error::Backend`](memres_core::Error::Backend).
pub unsafe fn copy_to_host(stream: &CudaStream, dst: &mut [u8], src: u64) -> Result<()> {
    // SAFETY: the caller vouches for `src`; the stream is valid while borrowed.
    stream.scope(|| in_order(stream, |raw| unsafe { device_to_host(raw, dst, src) }))
}

/// Copies `src` into device memory at `dst` after the work queued on
/// `stream`, and waits for the copy to finish.
///
/// # Safety
///
/// `dst..dst + src.len()` must be device-accessible memory, live and used
/// by nothing else until the call returns.
///
/// # Errors
///
/// The driver's error as [`Error::Backend`](memres_core::Error::Backend).
pub unsafe fn copy_from_host(stream: &CudaStream, dst: u64, src: &[u8]) -> Result<()> {
    // SAFETY: the caller vouches for `dst`; the stream is valid while borrowed.
    stream.scope(|| in_order(stream, |raw| unsafe { host_to_device(raw, dst, src) }))
}

/// [`copy_to_host`] on a raw stream, in the current context.
///
/// # Safety
///
/// As [`copy_to_host`]; `raw` must be a valid stream of the current context
/// (or a default stream handle).
pub(crate) unsafe fn device_to_host(raw: sys::CUstream, dst: &mut [u8], src: u64) -> Result<()> {
    // SAFETY: the caller vouches for the stream.
    let before = unsafe { capture_of(raw) };
    // SAFETY: `dst` is borrowed mutably until this call returns, which is
    // after the copy has finished or once it never will (`wait_for_work`);
    // the caller vouches for `src`.
    check(unsafe { sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast::<c_void>(), src, dst.len(), raw) })?;
    // SAFETY: the caller vouches for the stream.
    unsafe { wait_for_work(raw, before) }
}

/// [`copy_from_host`] on a raw stream, in the current context.
///
/// # Safety
///
/// As [`copy_from_host`]; `raw` must be a valid stream of the current
/// context (or a default stream handle).
pub(crate) unsafe fn host_to_device(raw: sys::CUstream, dst: u64, src: &[u8]) -> Result<()> {
    // SAFETY: the caller vouches for the stream.
    let before = unsafe { capture_of(raw) };
    // SAFETY: `src` is borrowed until this call returns, after the copy
    // (or once it never runs: `wait_for_work`); the caller vouches for `dst`.
    check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast::<c_void>(), src.len(), raw) })?;
    // SAFETY: the caller vouches for the stream.
    unsafe { wait_for_work(raw, before) }
}
