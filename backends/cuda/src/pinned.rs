//! Page-locked host memory: RMM's `pinned_memory_resource`.

use crate::context::Device;
use crate::host_visible::{self, HostAllocations};
use crate::stream::relaxed;
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
/// Dropping the resource (its last clone) frees nothing, but the blocks it
/// still has out are no longer [`CudaCopy`](crate::CudaCopy)'s to touch
/// (`NotLive`). Their memory stays allocated until the process ends: the
/// context, which would free it, is kept for the process.
///
/// # Errors
///
/// Out of memory with figures (those of the device, the only ones the driver
/// gives), unknown addresses as [`Error::UnknownBlock`](memres_core::Error::UnknownBlock),
/// a free with another size than the allocation's as
/// [`Error::SizeMismatch`](memres_core::Error::SizeMismatch),
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
    /// `cuMemHostAlloc` flags.
    flags: u32,
    /// The allocations handed out and not yet freed, and the context they
    /// are made in (pinned memory needs a current one), retained: shared
    /// by clones.
    live: Arc<HostAllocations>,
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
        Ok(PinnedMemory { flags, live: Arc::new(HostAllocations::new(device.primary_context()?)) })
    }
}

impl<S: Stream + ?Sized> MemoryResource<S> for PinnedMemory {
    fn allocate(&self, request: Request, _stream: &S) -> Result<Block> {
        let alloc = |bytes, base: &mut u64| {
            let mut p = core::ptr::null_mut();
            // SAFETY: a context is current; the out parameter is a live local.
            let code = relaxed(|| unsafe { sys::cuMemHostAlloc(&mut p, bytes, self.flags) });
            *base = p as u64;
            code
        };
        // SAFETY: `free_host` frees a pinned allocation, which `alloc`
        // makes; `host_visible::allocate` calls it as `free_host` asks.
        unsafe { host_visible::allocate(&self.live, self.live.context(), request, alloc, |b| free_host(b)) }
    }

    fn deallocate(&self, block: Block, _stream: &S) -> Result<()> {
        // SAFETY: every allocation of `self.live` is a pinned one of ours,
        // made by `allocate` above.
        unsafe { host_visible::deallocate(&self.live, self.live.context(), block, |b| free_host(b)) }
    }

    /// Equal to its clones, which share its table of live allocations (one
    /// made by another `new` has a table of its own and refuses this one's
    /// blocks, where RMM's CUDA resources are all equal).
    fn id(&self) -> memres_core::ResourceId {
        memres_core::ResourceId::shared::<Self>(Arc::as_ptr(&self.live).cast())
    }
}

/// `cuMemFreeHost`, as `host_visible::free`'s release.
///
/// # Safety
///
/// `base` must be a pinned allocation of ours that no one else frees, and
/// `host_visible::free` the caller (it has just taken `base` out of the
/// table of host-visible allocations and waited for the `CudaCopy`
/// accesses in it, so none is under way or can start).
unsafe fn free_host(base: u64) -> sys::CuResult {
    // SAFETY: as the caller promises.
    relaxed(|| unsafe { sys::cuMemFreeHost(base as *mut core::ffi::c_void) })
}

// SAFETY: the block lies inside one driver allocation (`place` checks
// that padding and size fit) that no other block shares, live until
// `deallocate` takes it out of the table and frees it, or the resource ends
// (its drop frees nothing, and the context, whose end would free the
// memory, is kept for the rest of the process); it is page-locked host memory
// (`cuMemHostAlloc`), which `CudaCopy`'s driver copies reach by its unified
// address. Checked access: the allocation is in the table of host-visible
// allocations from before its block is handed out until it leaves that
// table under its lock, before it is freed, or until the resource ends
// (`HostAllocations`' drop takes it out under that lock while the context
// is still retained), and `CudaCopy` touches host-visible memory only
// inside one entry, checked under the lock and marked in use until its
// work has finished, which a free waits for.
unsafe impl memres_core::copy::MemoryOf<crate::CudaCopy> for PinnedMemory {}
