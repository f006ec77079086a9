#![allow(non_snake_case)]
//! A model of the driver's stream-ordered calls for unit tests without a
//! GPU: `cuMemAllocFromPoolAsync`, `cuMemFreeAsync`, `cuStreamSynchronize`,
//! `cuCtxSynchronize`, `cuMemPoolDestroy`, `cuPointerGetAttribute`,
//! `cuMemGetInfo_v2`, `cuStreamGetCaptureInfo_v2` and
//! `cuThreadExchangeStreamCaptureMode` (which [`sys`](crate::sys) names in test builds)
//! answer from the model on a thread where a test installed one, and are
//! the driver's elsewhere. A test sets when a synchronization fails, and
//! whether its error is sticky (every later call answers it, as after a
//! fault in a kernel), and which frees are refused; the model keeps the allocations live in its pool
//! and every call it answered.

use crate::sys::{self, linked, CUdeviceptr, CUmemoryPool, CUstream, CuResult};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};

/// Where a test's pool hands out its allocations: addresses no driver
/// hands out, 256-aligned.
const FIRST_BASE: u64 = 0xfa4e_0000_0000;

/// The model: what a test sets, and what the calls did.
#[derive(Debug, Default)]
pub(crate) struct Driver {
    /// The error the next stream synchronization answers (then cleared).
    pub(crate) fail_wait: Option<CuResult>,
    /// Whether that error is sticky: every call after it answers it too.
    pub(crate) sticky: bool,
    /// The errors the next frees answer, first first (each refused free
    /// frees nothing).
    pub(crate) refuse_frees: Vec<CuResult>,
    /// The device's memory that `cuMemGetInfo_v2` reports; `None`: it
    /// answers `CUDA_ERROR_NOT_SUPPORTED`.
    pub(crate) memory: Option<u64>,
    /// Each test uses its own addresses (the table of host-visible
    /// allocations is the process's): the `n`th hands out bases from
    /// `FIRST_BASE + (n << 32)`.
    pub(crate) addresses: u64,
    /// What `cuStreamGetCaptureInfo_v2` answers: a stream's capture status
    /// and the capture's id, or the error (as the legacy stream's while a
    /// blocking stream captures).
    pub(crate) capture_status: Option<(c_int, u64)>,
    /// The thread's capture mode (`cuThreadExchangeStreamCaptureMode`).
    pub(crate) capture_mode: c_int,
    /// Whether another thread captures a graph in the global mode: as the
    /// driver does then, a stream's synchronization made in the global mode
    /// is refused (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`), and a
    /// context's in either mode.
    pub(crate) capture_elsewhere: bool,
    /// The sticky error in effect.
    error: Option<CuResult>,
    /// Allocations made and not freed: base to bytes.
    pub(crate) allocated: BTreeMap<u64, usize>,
    /// Every call answered, in order.
    pub(crate) calls: Vec<Call>,
}

/// A call the model answered, with the stream handle it named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    /// `base`: what it handed out (0: nothing).
    Alloc {
        base: u64,
        stream: usize,
    },
    Free {
        base: u64,
        stream: usize,
    },
    StreamSync {
        stream: usize,
    },
    ContextSync,
    /// The mode set.
    CaptureMode {
        mode: c_int,
    },
    CaptureInfo {
        stream: usize,
    },
    PoolDestroy {
        pool: usize,
    },
}

impl Driver {
    /// Whether a stream's synchronization now is refused for another
    /// thread's capture.
    fn refused_for_a_capture(&self) -> bool {
        self.capture_elsewhere && self.capture_mode == sys::CU_STREAM_CAPTURE_MODE_GLOBAL
    }
}

thread_local! {
    static DRIVER: RefCell<Option<Driver>> = const { RefCell::new(None) };
}

/// Makes `driver` answer the calls of this thread.
pub(crate) fn install(driver: Driver) {
    DRIVER.with(|d| *d.borrow_mut() = Some(driver));
}

/// The model of this thread, taken out: the calls go to the driver again.
pub(crate) fn take() -> Driver {
    DRIVER.with(|d| d.borrow_mut().take()).expect("no fake driver installed")
}

/// `f`'s answer from this thread's model, if there is one.
fn answer(f: impl FnOnce(&mut Driver) -> CuResult) -> Option<CuResult> {
    DRIVER.with(|d| d.borrow_mut().as_mut().map(f))
}

/// # Safety
///
/// As the driver's `cuMemAllocFromPoolAsync`.
pub(crate) unsafe fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CuResult {
    let faked = answer(|d| {
        if let Some(e) = d.error {
            d.calls.push(Call::Alloc { base: 0, stream: stream as usize });
            return e;
        }
        let top = d.allocated.last_key_value().map(|(&b, &n)| b + (n as u64).next_multiple_of(256));
        let base = top.unwrap_or(FIRST_BASE + (d.addresses << 32));
        d.allocated.insert(base, bytes);
        d.calls.push(Call::Alloc { base, stream: stream as usize });
        // SAFETY: the driver's contract: `dptr` is valid for a write.
        unsafe { dptr.write(base) };
        sys::CUDA_SUCCESS
    });
    // SAFETY: as the caller promises.
    faked.unwrap_or_else(|| unsafe { linked::cuMemAllocFromPoolAsync(dptr, bytes, pool, stream) })
}

/// # Safety
///
/// As the driver's `cuMemFreeAsync`.
pub(crate) unsafe fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CuResult {
    let faked = answer(|d| {
        d.calls.push(Call::Free { base: dptr, stream: stream as usize });
        if let Some(e) = d.error {
            return e;
        }
        if !d.refuse_frees.is_empty() {
            return d.refuse_frees.remove(0);
        }
        match d.allocated.remove(&dptr) {
            Some(_) => sys::CUDA_SUCCESS,
            None => sys::CUDA_ERROR_INVALID_VALUE,
        }
    });
    // SAFETY: as the caller promises.
    faked.unwrap_or_else(|| unsafe { linked::cuMemFreeAsync(dptr, stream) })
}

/// # Safety
///
/// As the driver's `cuStreamSynchronize`.
pub(crate) unsafe fn cuStreamSynchronize(stream: CUstream) -> CuResult {
    let faked = answer(|d| {
        d.calls.push(Call::StreamSync { stream: stream as usize });
        if let Some(e) = d.error {
            return e;
        }
        if d.refused_for_a_capture() {
            return sys::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        match d.fail_wait.take() {
            Some(e) => {
                if d.sticky {
                    d.error = Some(e);
                }
                e
            }
            None => sys::CUDA_SUCCESS,
        }
    });
    // SAFETY: as the caller promises.
    faked.unwrap_or_else(|| unsafe { linked::cuStreamSynchronize(stream) })
}

/// # Safety
///
/// As the driver's `cuCtxSynchronize`.
pub(crate) unsafe fn cuCtxSynchronize() -> CuResult {
    let faked = answer(|d| {
        d.calls.push(Call::ContextSync);
        match d.error {
            Some(e) => e,
            None if d.capture_elsewhere => sys::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            None => sys::CUDA_SUCCESS,
        }
    });
    // SAFETY: as the caller promises.
    faked.unwrap_or_else(|| unsafe { linked::cuCtxSynchronize() })
}

/// # Safety
///
/// As the driver's `cuStreamGetCaptureInfo_v2`. The model answers
/// `capture_status` (`None`: `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`), the id
/// only for an active capture, and nothing of the graph.
pub(crate) unsafe fn cuStreamGetCaptureInfo_v2(
    stream: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut *mut c_void,
    dependencies: *mut *const *mut c_void,
    count: *mut usize,
) -> CuResult {
    let faked = answer(|d| {
        d.calls.push(Call::CaptureInfo { stream: stream as usize });
        if let Some(e) = d.error {
            return e;
        }
        let Some((s, capture)) = d.capture_status else { return sys::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT };
        assert!(graph.is_null() && dependencies.is_null() && count.is_null(), "the model answers no graph");
        // SAFETY: the driver's contract: `status` is valid for a write, and
        // `id` where it is not null.
        unsafe {
            status.write(s);
            if s == sys::CU_STREAM_CAPTURE_STATUS_ACTIVE && !id.is_null() {
                id.write(capture);
            }
        }
        sys::CUDA_SUCCESS
    });
    // SAFETY: as the caller promises.
    faked.unwrap_or_else(|| unsafe {
        linked::cuStreamGetCaptureInfo_v2(stream, status, id, graph, dependencies, count)
    })
}

/// # Safety
///
/// As the driver's `cuThreadExchangeStreamCaptureMode`.
pub(crate) unsafe fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CuResult {
    let faked = answer(|d| {
        // SAFETY: the driver's contract: `mode` is valid for a read and a write.
        let set = unsafe { mode.read() };
        d.calls.push(Call::CaptureMode { mode: set });
        // SAFETY: as above.
        unsafe { mode.write(std::mem::replace(&mut d.capture_mode, set)) };
        sys::CUDA_SUCCESS
    });
    // SAFETY: as the caller promises.
    faked.unwrap_or_else(|| unsafe { linked::cuThreadExchangeStreamCaptureMode(mode) })
}

/// # Safety
///
/// As the driver's `cuMemPoolDestroy`.
pub(crate) unsafe fn cuMemPoolDestroy(pool: CUmemoryPool) -> CuResult {
    let faked = answer(|d| {
        d.calls.push(Call::PoolDestroy { pool: pool as usize });
        d.error.unwrap_or(sys::CUDA_SUCCESS)
    });
    // SAFETY: as the caller promises.
    faked.unwrap_or_else(|| unsafe { linked::cuMemPoolDestroy(pool) })
}

/// # Safety
///
/// As the driver's `cuPointerGetAttribute`. The model answers
/// `CU_POINTER_ATTRIBUTE_IS_MANAGED` only: its allocations are its pool's
/// device memory, not managed; an address outside them is unknown.
pub(crate) unsafe fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_int,
    ptr: CUdeviceptr,
) -> CuResult {
    let faked = answer(|d| {
        if let Some(e) = d.error {
            return e;
        }
        assert_eq!(attribute, sys::CU_POINTER_ATTRIBUTE_IS_MANAGED, "the model answers IS_MANAGED only");
        let known = d.allocated.range(..=ptr).next_back().is_some_and(|(&b, &n)| ptr - b < n as u64);
        if !known {
            return sys::CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the driver's contract: `data` is valid for a write of the
        // attribute's type, an unsigned int.
        unsafe { data.cast::<c_uint>().write(0) };
        sys::CUDA_SUCCESS
    });
    // SAFETY: as the caller promises.
    faked.unwrap_or_else(|| unsafe { linked::cuPointerGetAttribute(data, attribute, ptr) })
}

/// # Safety
///
/// As the driver's `cuMemGetInfo_v2`. Free memory is the device's less
/// the model's allocations.
pub(crate) unsafe fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    let faked = answer(|d| {
        if let Some(e) = d.error {
            return e;
        }
        let Some(memory) = d.memory else { return sys::CUDA_ERROR_NOT_SUPPORTED };
        let used: u64 = d.allocated.values().map(|&n| n as u64).sum();
        // SAFETY: the driver's contract: both point at writable `size_t`s.
        unsafe {
            free.write(memory.saturating_sub(used) as usize);
            total.write(memory as usize);
        }
        sys::CUDA_SUCCESS
    });
    // SAFETY: as the caller promises.
    faked.unwrap_or_else(|| unsafe { linked::cuMemGetInfo_v2(free, total) })
}

mod tests;
