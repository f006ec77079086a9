//! Page-locked host memory: RMM's `pinned_memory_resource`.

use crate::context::{Context, Device};
use crate::live::LiveAllocations;
use crate::place::{allocate_with, deallocate_with};
use crate::sys;
use memres_core::{Block, MemoryResource, Request, Result, Stream};
use std::sync::Arc;

/// Page-locked (pinned) host memory (`cuMemHostAlloc` / `cuMemFreeHost`):
/// RMM's `pinned_memory_resource`. Copies between it and the device run
/// asynchronously and at full speed.
///
/// Blocks are host addresses, valid on the host and (through unified
/// addressing) in device copies; they are page aligned, or aligned to more
/// when asked. The memory is portable (`CU_MEMHOSTALLOC_PORTABLE`): pinned
/// for every context, not only the one it was allocated in. Streams mean
/// nothing to it.
///
/// # Errors
///
/// Out of memory with figures (those of the device, the only ones the driver
/// gives), unknown addresses as [`Error::UnknownBlock`](memres_core::Error::UnknownBlock),
/// other driver errors as [`Error::Backend`](memres_core::Error::Backend).
///
/// # Examples
///
/// ```no_run
/// use memres_core::{MemoryResource, Request};
/// use memres_cuda::{Device, PinnedMemory};
/// let mr = PinnedMemory::new(Device::get(0)?)?;
/// let b = mr.allocate(Request::new(4096)?, &())?;
/// // SAFETY: a live pinned block of 4096 bytes is plain host memory.
/// unsafe { core::ptr::write_bytes(b.addr() as *mut u8, 0, 4096) };
/// mr.deallocate(b, &())?;
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct PinnedMemory {
    /// A context to allocate in (pinned memory needs a current one).
    context: Context,
    /// `cuMemHostAlloc` flags.
    flags: u32,
    /// The allocations handed out and not yet freed (shared by clones).
    live: Arc<LiveAllocations>,
}

impl PinnedMemory {
    /// Portable pinned memory, allocated through `device`'s primary context.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`](memres_core::Error::Backend).
    pub fn new(device: Device) -> Result<PinnedMemory> {
        Self::with_flags(device, sys::CU_MEMHOSTALLOC_PORTABLE)
    }

    /// Pinned memory with `cuMemHostAlloc` flags of your choice
    /// (`CU_MEMHOSTALLOC_PORTABLE` = 1, `DEVICEMAP` = 2, `WRITECOMBINED` = 4).
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`](memres_core::Error::Backend);
    /// invalid flags are reported by the first allocation.
    pub fn with_flags(device: Device, flags: u32) -> Result<PinnedMemory> {
        Ok(PinnedMemory { context: device.primary_context()?, flags, live: Arc::default() })
    }
}

impl<S: Stream + ?Sized> MemoryResource<S> for PinnedMemory {
    fn allocate(&self, request: Request, _stream: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        self.context.scope(|| {
            allocate_with(
                &self.context,
                &self.live,
                request,
                |bytes, base| {
                    let mut p = core::ptr::null_mut();
                    // SAFETY: a context is current; the out parameter is a live local.
                    let code = unsafe { sys::cuMemHostAlloc(&mut p, bytes, self.flags) };
                    *base = p as u64;
                    code
                },
                // SAFETY: `base` was just allocated and is handed out to no one.
                |base| unsafe { sys::cuMemFreeHost(base as *mut core::ffi::c_void) },
                || None,
            )
        })
    }

    fn deallocate(&self, block: Block, _stream: &S) -> Result<()> {
        // SAFETY: `base` is a live pinned allocation of ours, just taken out
        // of the table (so no one frees it twice).
        deallocate_with(&self.context, &self.live, block, |base| unsafe {
            sys::cuMemFreeHost(base as *mut core::ffi::c_void)
        })
    }
}

// SAFETY: the block lies inside one driver allocation (`place` checks
// that padding and size fit) that no other block shares, live until
// `deallocate` takes it out of the table and frees it (dropping the resource
// frees nothing); it is page-locked host memory (`cuMemHostAlloc`), which
// `CudaCopy`'s driver copies reach by its unified address.
unsafe impl memres_core::copy::MemoryOf<crate::CudaCopy> for PinnedMemory {}
