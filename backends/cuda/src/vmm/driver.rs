//! The driver calls of [`CudaVirtualSpace`](super::CudaVirtualSpace),
//! behind a trait so that the space's bookkeeping is tested on any machine
//! against a model of the driver (`tests.rs`).

use crate::context::{Context, Current, MemoryInfo};
use crate::stream::relaxed;
use crate::sys;
use memres_core::Result;
use std::fmt;

/// A result code of the driver (`CUDA_SUCCESS` is 0).
pub(super) type Code = sys::CuResult;

/// The virtual memory calls the space makes. Addresses and lengths are the
/// space's: granule-aligned, inside live reservations, checked under the
/// space's lock before any call.
pub(super) trait Driver: Send + Sync + fmt::Debug {
    /// Makes the driver's context current until the guard drops.
    fn enter(&self) -> Result<Option<Current<'_>>>;
    /// `cuMemAddressReserve` of `len` bytes aligned to `align`.
    fn reserve(&self, len: u64, align: u64) -> core::result::Result<u64, Code>;
    /// `cuMemAddressFree` of a whole reservation with nothing mapped in it.
    fn free(&self, start: u64, len: u64) -> Code;
    /// `cuMemCreate` of a handle of `len` bytes and `cuMemMap` of it at
    /// `start`, where nothing is mapped; nothing is left on failure.
    fn map(&self, start: u64, len: u64) -> core::result::Result<u64, Code>;
    /// `cuMemSetAccess` read/write for the device over mapped memory.
    fn set_access(&self, start: u64, len: u64) -> Code;
    /// `cuMemMap` at `start`, where nothing is mapped, of `handle`: one of
    /// `len` bytes that `unmap` kept; on failure it stays kept.
    fn map_kept(&self, start: u64, len: u64, handle: u64) -> Code;
    /// `cuMemUnmap` of one whole mapping, then `cuMemRelease` of its handle
    /// unless `keep` (then the handle is the caller's, to map again with
    /// `map_kept` or give back with `release`). The answer is the unmap's:
    /// once it succeeded nothing is mapped there, whatever the release
    /// answers (a handle a failing driver will not release is lost).
    fn unmap(&self, start: u64, len: u64, handle: u64, keep: bool) -> Code;
    /// `cuMemRelease` of a handle that `unmap` kept.
    fn release(&self, handle: u64) -> Code;
    /// `cuStreamSynchronize` of the legacy default stream of the context.
    fn sync_legacy(&self) -> Code;
    /// `cuCtxSynchronize` of the context: all its work done.
    fn sync_context(&self) -> Code;
    /// The device's free and total memory, if the driver tells.
    fn memory_info(&self) -> Option<MemoryInfo>;
}

/// The CUDA driver, in a device's primary context.
#[derive(Debug)]
pub(super) struct CudaDriver {
    pub(super) context: Context,
}

impl CudaDriver {
    /// Pinned device memory on the context's device, no handle types to export.
    pub(super) fn prop(&self) -> sys::CuMemAllocationProp {
        sys::CuMemAllocationProp {
            type_: sys::CU_MEM_ALLOCATION_TYPE_PINNED,
            requested_handle_types: 0,
            location: self.location(),
            win32_handle_meta_data: core::ptr::null_mut(),
            alloc_flags: [0; 8],
        }
    }

    fn location(&self) -> sys::CuMemLocation {
        sys::CuMemLocation {
            type_: sys::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.context.device().ordinal() as i32,
        }
    }

    /// The minimum granularity of [`prop`](Self::prop) memory.
    pub(super) fn granularity(&self) -> Result<u64> {
        let _current = self.enter()?;
        let prop = self.prop();
        let mut granule = 0usize;
        // SAFETY: `prop` is a fully initialized `CUmemAllocationProp` (zero
        // where the driver wants zero); the out parameter is a live local.
        crate::error::check(unsafe {
            sys::cuMemGetAllocationGranularity(&mut granule, &prop, sys::CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        })?;
        Ok(granule as u64)
    }
}

impl Driver for CudaDriver {
    fn enter(&self) -> Result<Option<Current<'_>>> {
        Current::of(&self.context).map(Some)
    }

    fn reserve(&self, len: u64, align: u64) -> core::result::Result<u64, Code> {
        let mut ptr = 0;
        // SAFETY: the out parameter is a live local; a fixed address of 0
        // lets the driver choose; flags must be 0.
        match unsafe { sys::cuMemAddressReserve(&mut ptr, len as usize, align as usize, 0, 0) } {
            sys::CUDA_SUCCESS => Ok(ptr),
            rc => Err(rc),
        }
    }

    fn free(&self, start: u64, len: u64) -> Code {
        // SAFETY: the caller passes exactly a live reservation with nothing
        // mapped in it, freed once.
        unsafe { sys::cuMemAddressFree(start, len as usize) }
    }

    fn map(&self, start: u64, len: u64) -> core::result::Result<u64, Code> {
        let prop = self.prop();
        let mut handle = 0;
        // SAFETY: `prop` is fully initialized; `len` is a multiple of the
        // granularity the driver gave for these properties; the out
        // parameter is a live local; flags must be 0.
        let rc = unsafe { sys::cuMemCreate(&mut handle, len as usize, &prop, 0) };
        if rc != sys::CUDA_SUCCESS {
            return Err(rc);
        }
        // SAFETY: `start..start + len` lies in a live reservation with
        // nothing mapped there (the caller checked under its lock);
        // `handle` was just made, `len` long; offset and flags must be 0.
        let rc = unsafe { sys::cuMemMap(start, len as usize, 0, handle, 0) };
        if rc != sys::CUDA_SUCCESS {
            // SAFETY: the handle was just made and is mapped nowhere.
            let _ = unsafe { sys::cuMemRelease(handle) };
            return Err(rc);
        }
        Ok(handle)
    }

    fn set_access(&self, start: u64, len: u64) -> Code {
        let desc = sys::CuMemAccessDesc {
            location: self.location(),
            flags: sys::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the caller passes a range wholly mapped by this space's
        // handles; one descriptor, live across the call.
        unsafe { sys::cuMemSetAccess(start, len as usize, &desc, 1) }
    }

    fn map_kept(&self, start: u64, len: u64, handle: u64) -> Code {
        // SAFETY: `start..start + len` lies in a live reservation with
        // nothing mapped there (the caller checked under its lock);
        // `handle` is live, `len` long, and mapped nowhere (`unmap` kept
        // it); offset and flags must be 0.
        unsafe { sys::cuMemMap(start, len as usize, 0, handle, 0) }
    }

    fn unmap(&self, start: u64, len: u64, handle: u64, keep: bool) -> Code {
        // SAFETY: the caller passes exactly one mapping made by `map` or
        // `map_kept` (from its table, under its lock), so the call unmaps
        // only this space's device memory (`prop`: pinned memory on a device
        // location), never host pages or memory that Rust code reaches. The
        // caller waited for the stream it was given first, but that wait is
        // the stream's own `Stream::synchronize` (a safe trait, which cannot
        // promise it waited): device work may still use the range. That work
        // then faults on the device (an illegal address; the context fails
        // and later driver calls return errors), or reads and writes device
        // memory mapped there later: wrong data on the device, not undefined
        // behaviour on the host, and the host is all this call's soundness
        // rests on.
        let rc = unsafe { sys::cuMemUnmap(start, len as usize) };
        if rc != sys::CUDA_SUCCESS || keep {
            return rc;
        }
        // SAFETY: the handle's one mapping is gone; it is released once.
        let _ = unsafe { sys::cuMemRelease(handle) };
        // Unmapped: reported as a failed unmap, the range would stay counted
        // mapped and committed, and blocks would be placed over it.
        sys::CUDA_SUCCESS
    }

    fn release(&self, handle: u64) -> Code {
        // SAFETY: a handle `unmap` kept is mapped nowhere; the caller
        // releases it once, out of its list of kept handles.
        unsafe { sys::cuMemRelease(handle) }
    }

    fn sync_legacy(&self) -> Code {
        // SAFETY: the null handle names the legacy default stream of the
        // current context (the caller entered ours).
        relaxed(|| unsafe { sys::cuStreamSynchronize(core::ptr::null_mut()) })
    }

    fn sync_context(&self) -> Code {
        // SAFETY: takes no argument and acts on the current context (the
        // caller entered ours; with none, the driver reports an error).
        unsafe { sys::cuCtxSynchronize() }
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        self.context.memory_info().ok()
    }
}
