//! `cuMemAlloc` / `cuMemFree`: RMM's `cuda_memory_resource`.

use crate::context::{Context, Device};
use crate::live::LiveAllocations;
use crate::place::{allocate_with, deallocate_with, out_of_memory, padded_size};
use crate::stream::relaxed;
use crate::sys;
use memres_core::{Block, MemoryResource, Request, Result, Stream};
use std::sync::Arc;

/// Device memory straight from the driver (`cuMemAlloc` / `cuMemFree`):
/// RMM's `cuda_memory_resource`.
///
/// ```text
///  allocate(req, _) ──► cuMemAlloc(size [+ padding above 256-byte alignment])
///  deallocate(b, _) ──► cuMemFree (synchronizes the device, as in RMM)
/// ```
///
/// Each block is its own driver allocation, aligned to 256 bytes (or more
/// when asked). Streams mean nothing to it: it serves every [`Stream`] type.
/// The driver is slow (microseconds per call, and every free waits for the
/// device): this is the upstream that pools are built on, not the one to
/// allocate from in a loop.
///
/// # Errors
///
/// - [`Error::OutOfMemory`](memres_core::Error::OutOfMemory) when the device
///   cannot hold the block: `largest_free` is the device's free memory
///   (an upper bound), `pool_size` the device's memory in use by everyone,
///   `max_size` the device's memory.
/// - [`Error::UnknownBlock`](memres_core::Error::UnknownBlock) when the
///   block freed is not one handed out and live (never handed out, freed
///   already, or another address inside a live allocation).
/// - [`Error::SizeMismatch`](memres_core::Error::SizeMismatch) when it is
///   freed with another size than it was asked for.
/// - Other driver errors as [`Error::Backend`](memres_core::Error::Backend).
///
/// # Examples
///
/// ```no_run
/// use memres_core::{MemoryResource, Request};
/// use memres_cuda::{CudaMemory, Device};
/// let mr = CudaMemory::new(Device::get(0)?)?;
/// let b = mr.allocate(Request::new(1 << 20)?, &())?;
/// assert_eq!(b.addr() % 256, 0);
/// mr.deallocate(b, &())?;
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct CudaMemory {
    /// The device's primary context.
    context: Context,
    /// The allocations handed out and not yet freed (shared by clones).
    live: Arc<LiveAllocations>,
}

impl CudaMemory {
    /// A resource allocating on `device` (in its primary context).
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`](memres_core::Error::Backend).
    pub fn new(device: Device) -> Result<CudaMemory> {
        Ok(CudaMemory { context: device.primary_context()?, live: Arc::default() })
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.context.device()
    }

    /// The context the memory lives in.
    pub fn context(&self) -> &Context {
        &self.context
    }
}

impl<S: Stream + ?Sized> MemoryResource<S> for CudaMemory {
    fn allocate(&self, request: Request, _stream: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        if padded_size(request)? as u64 > self.live.device_total(&self.context) {
            return Err(out_of_memory(&self.context, request.size(), None));
        }
        self.context.scope(|| {
            allocate_with(
                &self.context,
                &self.live,
                request,
                // SAFETY: our context is current; the out parameter is a live local.
                |bytes, base| relaxed(|| unsafe { sys::cuMemAlloc_v2(base, bytes) }),
                // SAFETY: `base` was just allocated and is handed out to no one.
                |base| relaxed(|| unsafe { sys::cuMemFree_v2(base) }),
                || None,
            )
        })
    }

    fn deallocate(&self, block: Block, _stream: &S) -> Result<()> {
        deallocate_with(&self.context, &self.live, block, |base| {
            // SAFETY: `base` is a live allocation of ours, just taken out of
            // the table (so no one frees it twice); our context is current.
            relaxed(|| unsafe { sys::cuMemFree_v2(base) })
        })
    }

    /// Equal to its clones, which share its table of live allocations (one
    /// made by another `new` has a table of its own and refuses this one's
    /// blocks, where RMM's CUDA resources are all equal).
    fn id(&self) -> memres_core::ResourceId {
        memres_core::ResourceId::shared::<Self>(Arc::as_ptr(&self.live).cast())
    }
}

// SAFETY: the block lies inside one driver allocation (`place` checks
// that padding and size fit) that no other block shares, live until
// `deallocate` takes it out of the table and frees it (dropping the resource
// frees nothing); it is device memory (`cuMemAlloc`), which
// `CudaCopy`'s driver copies reach by its unified address. Freed by other
// code, it is memory only those copies reach: `CudaCopy` has the driver
// confirm each range is device memory first, and a stale device address
// names device memory or nothing, never host memory.
unsafe impl memres_core::copy::MemoryOf<crate::CudaCopy> for CudaMemory {}
