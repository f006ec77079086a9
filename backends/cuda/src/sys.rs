//! The CUDA driver API functions this crate calls, declared with plain
//! integer results.
//!
//! `cust::sys` declares `CUresult` as a Rust `enum` generated from the CUDA
//! 11.4 headers. A newer driver may return a code that enum does not list,
//! and a Rust `enum` holding an undeclared value is undefined behaviour. So
//! the functions used here are declared again with `c_int` results (the ABI
//! is the same: `CUresult` is a C `enum`, an `int`); the handle types are
//! `cust::sys`'s, so handles pass freely between `cust` and this crate.
//! Linking goes through `cust`'s build script (`CUDA_LIBRARY_PATH`).
//!
//! Every function here is a raw driver call: read the CUDA driver API
//! documentation of the function of the same name before calling it.
#![allow(non_snake_case, missing_docs)]

use core::ffi::{c_char, c_int, c_uint, c_void};

pub use cust::sys::{CUcontext, CUdevice, CUdeviceptr, CUevent, CUmemoryPool, CUstream};

/// A driver result code (`CUresult`), kept as a plain integer.
pub type CuResult = c_int;

pub const CUDA_SUCCESS: CuResult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
pub const CUDA_ERROR_NO_DEVICE: CuResult = 100;
pub const CUDA_ERROR_INVALID_CONTEXT: CuResult = 201;
pub const CUDA_ERROR_NOT_FOUND: CuResult = 500;
pub const CUDA_ERROR_NOT_READY: CuResult = 600;
pub const CUDA_ERROR_NOT_SUPPORTED: CuResult = 801;
/// The first and last of the stream-capture errors
/// (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` to `_WRONG_THREAD`).
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CuResult = 900;
/// An implicit dependency on a capturing stream (the legacy stream's wait
/// while a blocking stream captures).
pub const CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: CuResult = 906;
pub const CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: CuResult = 908;

/// `CU_STREAM_LEGACY`: the legacy default stream, whatever the build's default.
pub const CU_STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream.
pub const CU_STREAM_PER_THREAD: usize = 0x2;

/// `CUstreamCaptureMode`: `CU_STREAM_CAPTURE_MODE_GLOBAL`, the driver's
/// default, and `_RELAXED`, which lets a thread make calls a capture
/// elsewhere would refuse.
pub const CU_STREAM_CAPTURE_MODE_GLOBAL: c_int = 0;
pub const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;
/// `CUstreamCaptureStatus`: a stream not capturing a graph (`_NONE`), or
/// capturing one (`_ACTIVE`; `_INVALIDATED` once a call it refused has
/// spoiled the capture, until it ends).
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: c_int = 1;

pub const CU_STREAM_DEFAULT: c_uint = 0x0;
pub const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
pub const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 0x1;
pub const CU_MEMHOSTALLOC_PORTABLE: c_uint = 0x1;
pub const CU_MEMHOSTALLOC_DEVICEMAP: c_uint = 0x2;
pub const CU_MEMHOSTALLOC_WRITECOMBINED: c_uint = 0x4;

pub const CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: c_int = 89;
pub const CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: c_int = 115;
/// `CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES`: a mask of the
/// export handle types a device's pools can have.
pub const CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: c_int = 119;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_int = 1;

pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CU_MEM_ALLOCATION_TYPE_MANAGED` (CUDA 13): pools of managed memory.
pub const CU_MEM_ALLOCATION_TYPE_MANAGED: c_int = 2;
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
pub const CU_MEM_LOCATION_TYPE_HOST: c_int = 2;
/// `CU_DEVICE_CPU`: the host, where a device ordinal is asked for.
pub const CU_DEVICE_CPU: CUdevice = -1;
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: c_int = 0;
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;

pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: c_int = 2;
/// `CU_POINTER_ATTRIBUTE_IS_MANAGED`.
pub const CU_POINTER_ATTRIBUTE_IS_MANAGED: c_int = 8;
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: c_int = 11;
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: c_int = 12;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`: the device an address's memory
/// was allocated on (an `int`).
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
/// `CU_MEMORYTYPE_DEVICE`, a `CUmemorytype`.
pub const CU_MEMORYTYPE_DEVICE: c_uint = 2;
/// `CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION`: the device ordinal a
/// managed range was last prefetched to (`CU_DEVICE_INVALID`, -2, if none).
pub const CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION: c_int = 4;
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: c_int = 6;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CuMemLocation {
    pub type_: c_int,
    pub id: c_int,
}

/// `CUmemPoolProps` (88 bytes; fields added by later drivers live in
/// `reserved` and must be zero).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CuMemPoolProps {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: CuMemLocation,
    pub win32_security_attributes: *mut c_void,
    pub reserved: [u8; 64],
}

const _: () = assert!(core::mem::size_of::<CuMemPoolProps>() == 88);

/// `CUmemGenericAllocationHandle`: a handle of physical memory made by `cuMemCreate`.
pub type CuMemGenericAllocationHandle = u64;

/// `CUmemAllocationProp` (32 bytes; the `allocFlags` of later drivers
/// must be zero).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CuMemAllocationProp {
    pub type_: c_int,
    pub requested_handle_types: c_int,
    pub location: CuMemLocation,
    pub win32_handle_meta_data: *mut c_void,
    /// `compressionType`, `gpuDirectRDMACapable`, `usage`, `reserved[4]`.
    pub alloc_flags: [u8; 8],
}

const _: () = assert!(core::mem::size_of::<CuMemAllocationProp>() == 32);

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CuMemAccessDesc {
    pub location: CuMemLocation,
    pub flags: c_int,
}

const _: () = assert!(core::mem::size_of::<CuMemAccessDesc>() == 12);

// The calls unit tests answer from a model of the driver where they
// install one (`crate::fake`, which calls these where none is installed);
// every other build calls the driver's own.
#[cfg(test)]
pub(crate) use crate::fake::{
    cuCtxSynchronize, cuMemAllocFromPoolAsync, cuMemFreeAsync, cuMemGetInfo_v2, cuMemPoolDestroy,
    cuPointerGetAttribute, cuStreamGetCaptureInfo_v2, cuStreamSynchronize, cuThreadExchangeStreamCaptureMode,
};
#[cfg(not(test))]
pub use linked::*;

/// The driver's own functions of the calls the model answers in tests.
#[cfg_attr(test, allow(unreachable_pub))] // re-exported in other builds
pub(crate) mod linked {
    use super::*;

    #[link(name = "cuda")]
    extern "C" {
        pub fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult;
        pub fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr) -> CuResult;
        pub fn cuMemPoolDestroy(pool: CUmemoryPool) -> CuResult;
        pub fn cuMemAllocFromPoolAsync(
            dptr: *mut CUdeviceptr,
            bytes: usize,
            pool: CUmemoryPool,
            stream: CUstream,
        ) -> CuResult;
        pub fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CuResult;
        pub fn cuStreamSynchronize(stream: CUstream) -> CuResult;
        pub fn cuCtxSynchronize() -> CuResult;
        /// `id`, `graph`, `dependencies` and `count` may be null; `id` is
        /// written only where the status is `_ACTIVE`: an id no other
        /// capture of the process has.
        pub fn cuStreamGetCaptureInfo_v2(
            stream: CUstream,
            status: *mut c_int,
            id: *mut u64,
            graph: *mut *mut c_void,
            dependencies: *mut *const *mut c_void,
            count: *mut usize,
        ) -> CuResult;
        pub fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CuResult;
    }
}

#[link(name = "cuda")]
extern "C" {
    pub fn cuInit(flags: c_uint) -> CuResult;
    pub fn cuDriverGetVersion(version: *mut c_int) -> CuResult;
    pub fn cuGetErrorName(error: CuResult, name: *mut *const c_char) -> CuResult;

    pub fn cuDeviceGetCount(count: *mut c_int) -> CuResult;
    pub fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CuResult;
    pub fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CuResult;
    pub fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CuResult;
    pub fn cuDeviceGetAttribute(value: *mut c_int, attrib: c_int, dev: CUdevice) -> CuResult;
    pub fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CuResult;

    pub fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CuResult;
    pub fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CuResult;
    pub fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) -> CuResult;
    pub fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CuResult;
    pub fn cuCtxSetCurrent(ctx: CUcontext) -> CuResult;
    pub fn cuCtxGetDevice(device: *mut CUdevice) -> CuResult;

    pub fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CuResult;
    pub fn cuMemFree_v2(dptr: CUdeviceptr) -> CuResult;
    pub fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> CuResult;
    pub fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: c_uint) -> CuResult;
    pub fn cuMemFreeHost(p: *mut c_void) -> CuResult;
    /// The form of CUDA 11.3 (`cuGetProcAddress_v2` came with 12.5): a
    /// driver function as it was in a CUDA version. Used by
    /// [`MemPrefetchAsync`] only.
    pub fn cuGetProcAddress(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        version: c_int,
        flags: u64,
    ) -> CuResult;
    pub fn cuMemRangeGetAttribute(
        data: *mut c_void,
        data_size: usize,
        attribute: c_int,
        ptr: CUdeviceptr,
        count: usize,
    ) -> CuResult;
    pub fn cuMemGetAddressRange_v2(pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr)
        -> CuResult;
    pub fn cuPointerGetAttributes(
        num_attributes: c_uint,
        attributes: *mut c_int,
        data: *mut *mut c_void,
        ptr: CUdeviceptr,
    ) -> CuResult;

    pub fn cuMemGetAllocationGranularity(
        granularity: *mut usize,
        prop: *const CuMemAllocationProp,
        option: c_int,
    ) -> CuResult;
    pub fn cuMemAddressReserve(
        ptr: *mut CUdeviceptr,
        size: usize,
        alignment: usize,
        addr: CUdeviceptr,
        flags: u64,
    ) -> CuResult;
    pub fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CuResult;
    pub fn cuMemCreate(
        handle: *mut CuMemGenericAllocationHandle,
        size: usize,
        prop: *const CuMemAllocationProp,
        flags: u64,
    ) -> CuResult;
    pub fn cuMemRelease(handle: CuMemGenericAllocationHandle) -> CuResult;
    pub fn cuMemMap(
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: CuMemGenericAllocationHandle,
        flags: u64,
    ) -> CuResult;
    pub fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CuResult;
    pub fn cuMemSetAccess(
        ptr: CUdeviceptr,
        size: usize,
        desc: *const CuMemAccessDesc,
        count: usize,
    ) -> CuResult;

    pub fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CuMemPoolProps) -> CuResult;
    pub fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> CuResult;
    pub fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> CuResult;
    pub fn cuMemPoolExportToShareableHandle(
        handle: *mut c_void,
        pool: CUmemoryPool,
        handle_type: c_int,
        flags: u64,
    ) -> CuResult;
    pub fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CuResult;

    pub fn cuMemsetD32Async(dst: CUdeviceptr, value: c_uint, count: usize, stream: CUstream) -> CuResult;
    pub fn cuMemsetD8Async(dst: CUdeviceptr, value: u8, count: usize, stream: CUstream) -> CuResult;
    pub fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream) -> CuResult;
    pub fn cuMemcpyDtoHAsync_v2(
        dst: *mut c_void,
        src: CUdeviceptr,
        bytes: usize,
        stream: CUstream,
    ) -> CuResult;
    pub fn cuMemcpyHtoDAsync_v2(
        dst: CUdeviceptr,
        src: *const c_void,
        bytes: usize,
        stream: CUstream,
    ) -> CuResult;

    pub fn cuStreamCreateWithPriority(stream: *mut CUstream, flags: c_uint, priority: c_int) -> CuResult;
    pub fn cuStreamDestroy_v2(stream: CUstream) -> CuResult;
    pub fn cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint) -> CuResult;
    pub fn cuStreamGetCtx(stream: CUstream, ctx: *mut CUcontext) -> CuResult;

    pub fn cuLaunchHostFunc(
        stream: CUstream,
        f: Option<unsafe extern "C" fn(data: *mut c_void)>,
        data: *mut c_void,
    ) -> CuResult;

    pub fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> CuResult;
    pub fn cuEventRecord(event: CUevent, stream: CUstream) -> CuResult;
    pub fn cuEventQuery(event: CUevent) -> CuResult;
    pub fn cuEventSynchronize(event: CUevent) -> CuResult;
    pub fn cuEventDestroy_v2(event: CUevent) -> CuResult;
}

/// `cuMemPrefetchAsync` in the form the driver has, looked up at run time
/// (`cuGetProcAddress`) rather than linked: CUDA 12.2 replaced its device
/// ordinal by a `CUmemLocation` under the name `cuMemPrefetchAsync_v2`, and
/// CUDA 13's headers name only that form. Linking `_v2` would make the
/// loader refuse every program of this crate on a driver before 12.2;
/// linking the old form would leave it to a future driver's goodwill.
#[derive(Clone, Copy, Debug)]
pub enum MemPrefetchAsync {
    /// CUDA 12.2 and later: the destination is a `CUmemLocation`; flags must be 0.
    Location(PrefetchToLocation),
    /// Before 12.2: the destination is a device ordinal.
    Ordinal(PrefetchToOrdinal),
}

/// `cuMemPrefetchAsync` of CUDA 12.2 and later (`cuMemPrefetchAsync_v2`).
pub type PrefetchToLocation =
    unsafe extern "C" fn(CUdeviceptr, usize, CuMemLocation, c_uint, CUstream) -> CuResult;
/// `cuMemPrefetchAsync` before CUDA 12.2.
pub type PrefetchToOrdinal = unsafe extern "C" fn(CUdeviceptr, usize, CUdevice, CUstream) -> CuResult;

impl MemPrefetchAsync {
    /// The form of the running driver, looked up at the first call that
    /// finds it and kept for the process.
    ///
    /// # Errors
    ///
    /// The driver's code where it has no such function (a failed lookup
    /// is not kept: the next call tries again).
    pub fn get() -> Result<MemPrefetchAsync, CuResult> {
        static FORM: std::sync::OnceLock<MemPrefetchAsync> = std::sync::OnceLock::new();
        if let Some(form) = FORM.get() {
            return Ok(*form);
        }
        let form = MemPrefetchAsync::as_of(MemPrefetchAsync::LOCATION_SINCE)?;
        Ok(*FORM.get_or_init(|| form))
    }

    /// The first CUDA version of the `Location` form.
    pub const LOCATION_SINCE: c_int = 12020;

    /// The form a program built for CUDA `version` (1000 x major + 10 x
    /// minor, as `cuDriverGetVersion` gives it) gets from the running
    /// driver: `Location` where both are 12.2 or later, `Ordinal` else.
    ///
    /// # Errors
    ///
    /// The driver's code where it has no such function (`version` before
    /// 8000, where the function came).
    pub fn as_of(version: c_int) -> Result<MemPrefetchAsync, CuResult> {
        let mut driver = 0;
        // SAFETY: the out parameter is a live local.
        match unsafe { cuDriverGetVersion(&mut driver) } {
            CUDA_SUCCESS => {}
            code => return Err(code),
        }
        // At most 12.2, so that a later change of the function never reaches this code.
        let version = version.min(driver).min(Self::LOCATION_SINCE);
        let mut pfn: *mut c_void = core::ptr::null_mut();
        // SAFETY: the symbol is a NUL-terminated string, the out parameter a
        // live local; flags 0 asks for the default (legacy) stream semantics,
        // those of the functions linked above.
        match unsafe { cuGetProcAddress(c"cuMemPrefetchAsync".as_ptr(), &mut pfn, version, 0) } {
            CUDA_SUCCESS if !pfn.is_null() => {}
            CUDA_SUCCESS => return Err(CUDA_ERROR_NOT_FOUND),
            code => return Err(code),
        }
        Ok(if version >= Self::LOCATION_SINCE {
            // SAFETY: `cuGetProcAddress` returned the function as it was in
            // CUDA `version` (at most the driver's own), which is 12.2 here:
            // the `CUmemLocation` form, whose C signature this is.
            MemPrefetchAsync::Location(unsafe {
                core::mem::transmute::<*mut c_void, PrefetchToLocation>(pfn)
            })
        } else {
            // SAFETY: as above, CUDA `version` is before 12.2: the form with
            // a device ordinal, whose C signature this is.
            MemPrefetchAsync::Ordinal(unsafe { core::mem::transmute::<*mut c_void, PrefetchToOrdinal>(pfn) })
        })
    }

    /// Prefetches `count` bytes at `ptr` to `to`, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// The function held is the driver's, as [`get`](Self::get) and
    /// [`as_of`](Self::as_of) give it (a variant made by hand calls
    /// whatever it holds). Then as `cuMemPrefetchAsync`: `stream` is a
    /// valid stream or a special handle. The driver checks the range (an
    /// error code where it is not managed memory).
    pub unsafe fn to(self, ptr: CUdeviceptr, count: usize, to: PrefetchTo, stream: CUstream) -> CuResult {
        match self {
            MemPrefetchAsync::Location(f) => {
                let location = match to {
                    PrefetchTo::Device(id) => CuMemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id },
                    PrefetchTo::Host => CuMemLocation { type_: CU_MEM_LOCATION_TYPE_HOST, id: 0 },
                };
                // SAFETY: the caller's contract; flags must be 0.
                unsafe { f(ptr, count, location, 0, stream) }
            }
            MemPrefetchAsync::Ordinal(f) => {
                let ordinal = match to {
                    PrefetchTo::Device(id) => id,
                    PrefetchTo::Host => CU_DEVICE_CPU,
                };
                // SAFETY: the caller's contract.
                unsafe { f(ptr, count, ordinal, stream) }
            }
        }
    }
}

/// `cuMemGetDefaultMemPool` (CUDA 13): the default pool of a location for
/// an allocation type.
pub type GetDefaultMemPool = unsafe extern "C" fn(*mut CUmemoryPool, *mut CuMemLocation, c_int) -> CuResult;

/// The first CUDA version with `cuMemGetDefaultMemPool` and pools of
/// managed memory.
pub const MANAGED_POOLS_SINCE: c_int = 13000;

/// `cuMemGetDefaultMemPool`, looked up at run time (`cuGetProcAddress`)
/// rather than linked, so that the crate still loads on a driver before
/// CUDA 13, which has no such function.
///
/// # Errors
///
/// `CUDA_ERROR_NOT_SUPPORTED` on a driver before CUDA 13; the driver's
/// code where the lookup fails.
pub fn get_default_mem_pool() -> Result<GetDefaultMemPool, CuResult> {
    let mut driver = 0;
    // SAFETY: the out parameter is a live local.
    match unsafe { cuDriverGetVersion(&mut driver) } {
        CUDA_SUCCESS if driver >= MANAGED_POOLS_SINCE => {}
        CUDA_SUCCESS => return Err(CUDA_ERROR_NOT_SUPPORTED),
        code => return Err(code),
    }
    let mut pfn: *mut c_void = core::ptr::null_mut();
    // SAFETY: the symbol is a NUL-terminated string, the out parameter a
    // live local; flags 0 asks for the default stream semantics.
    match unsafe { cuGetProcAddress(c"cuMemGetDefaultMemPool".as_ptr(), &mut pfn, MANAGED_POOLS_SINCE, 0) } {
        CUDA_SUCCESS if !pfn.is_null() => {}
        CUDA_SUCCESS => return Err(CUDA_ERROR_NOT_FOUND),
        code => return Err(code),
    }
    // SAFETY: `cuGetProcAddress` returned the function as it is in CUDA
    // 13.0, whose C signature this is.
    Ok(unsafe { core::mem::transmute::<*mut c_void, GetDefaultMemPool>(pfn) })
}

/// Where [`MemPrefetchAsync::to`] moves pages: a device (its ordinal) or
/// the host, each form's way of saying it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefetchTo {
    Device(CUdevice),
    Host,
}
