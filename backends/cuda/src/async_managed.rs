//! Stream-ordered managed memory from the device's default pool of managed
//! memory (CUDA 13).

use crate::async_memory::CudaAsyncMemory;
use crate::context::Device;
use crate::error::{check, error_from_code};
use crate::host_visible::{self, HostAllocations};
use crate::stream::{allocate_in_order, free_in_order, AsRawStream, CudaStream};
use crate::sys;
use memres_core::{Block, Error, MemoryResource, Request, Result};
use std::ptr;
use std::sync::Arc;

/// Stream-ordered managed memory (`cuMemAllocFromPoolAsync` /
/// `cuMemFreeAsync`) from the device's default pool of managed memory
/// (`cuMemGetDefaultMemPool` for `CU_MEM_ALLOCATION_TYPE_MANAGED`, CUDA 13
/// and later): RMM's `cuda_async_managed_memory_resource`.
///
/// ```text
///  CudaAsyncManagedMemory { pool (the device's default managed pool), live }
///    allocate(req, stream)  ──► cuMemAllocFromPoolAsync(pool, stream), then
///                               recorded as host-visible memory
///    deallocate(b, stream)  ──► out of the host-visible table (under its
///                               lock), then cuMemFreeAsync(stream)
/// ```
///
/// Its blocks are managed memory, valid on the host and on every device,
/// usable in the order of the stream they were allocated on. As for
/// [`ManagedMemory`](crate::ManagedMemory), each allocation is in the table
/// of host-visible allocations while it is live, which is what lets
/// [`CudaCopy`](crate::CudaCopy) touch it; dropping the resource frees
/// nothing, and its blocks still out are `NotLive` to `CudaCopy` from then
/// on. The pool is the driver's, shared with every user of the device's
/// default managed pool; its attributes are left as they are. Unlike
/// [`CudaAsyncMemory`], it is not bounded by the device's memory: managed
/// memory may exceed it.
///
/// # Errors
///
/// - [`Error::InvalidConfig`] when made on a driver before CUDA 13, or on
///   a device without memory pools or concurrent managed access;
/// - out of memory with figures, unknown addresses as
///   [`Error::UnknownBlock`], a free with another size than the
///   allocation's as [`Error::SizeMismatch`], the driver's other errors as
///   [`Error::Backend`].
///
/// # Examples
///
/// ```no_run
/// use memres_core::{MemoryResource, Request};
/// use memres_cuda::{CudaAsyncManagedMemory, CudaStream, Device};
/// let device = Device::get(0)?;
/// let mr = CudaAsyncManagedMemory::default_pool(device)?;
/// let stream = CudaStream::new(device)?;
/// let b = mr.allocate(Request::new(1 << 20)?, &stream)?;
/// mr.deallocate(b, &stream)?;
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct CudaAsyncManagedMemory {
    /// A view of the pool, for its attributes (reserved bytes, trimming);
    /// blocks are not allocated through it.
    pool: Arc<CudaAsyncMemory>,
    /// The allocations handed out and not yet freed, and the device's
    /// primary context, retained: shared by clones.
    live: Arc<HostAllocations>,
}

impl CudaAsyncManagedMemory {
    /// A resource over `device`'s default pool of managed memory.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] on a driver before CUDA 13 or a device
    /// without memory pools or concurrent managed access (which pools of
    /// managed memory need); the driver's other errors as
    /// [`Error::Backend`].
    pub fn default_pool(device: Device) -> Result<CudaAsyncManagedMemory> {
        if !device.supports_memory_pools()? || !device.concurrent_managed_access()? {
            return Err(Error::InvalidConfig {
                what: "pools of managed memory need a device with memory pools and concurrent managed access",
            });
        }
        let get = sys::get_default_mem_pool().map_err(|code| match code {
            sys::CUDA_ERROR_NOT_SUPPORTED => {
                Error::InvalidConfig { what: "pools of managed memory need a CUDA 13 driver" }
            }
            code => error_from_code(code),
        })?;
        let context = device.primary_context()?;
        let mut location = sys::CuMemLocation { type_: sys::CU_MEM_LOCATION_TYPE_DEVICE, id: device.raw() };
        let mut raw = ptr::null_mut();
        // SAFETY: `get` is the driver's `cuMemGetDefaultMemPool` (looked up
        // for CUDA 13, whose signature `GetDefaultMemPool` is); the driver
        // is initialized (a context was retained); both out and in
        // parameters are live locals.
        check(unsafe { get(&mut raw, &mut location, sys::CU_MEM_ALLOCATION_TYPE_MANAGED) })?;
        // SAFETY: the device's default pool is the driver's for the whole
        // process: valid while the view and every block lives.
        let pool = unsafe { CudaAsyncMemory::from_pool(device, raw)? };
        Ok(CudaAsyncManagedMemory { pool: Arc::new(pool), live: Arc::new(HostAllocations::new(context)) })
    }

    /// A resource over `pool` in a context that names no driver context,
    /// for models of the driver.
    #[cfg(test)]
    pub(crate) fn fake(pool: sys::CUmemoryPool) -> CudaAsyncManagedMemory {
        let context = crate::Context::fake(Device::fake(0));
        CudaAsyncManagedMemory {
            pool: Arc::new(CudaAsyncMemory::fake(pool)),
            live: Arc::new(HostAllocations::new(context)),
        }
    }

    /// The allocations handed out and not yet freed.
    #[cfg(test)]
    pub(crate) fn live(&self) -> &HostAllocations {
        &self.live
    }

    /// The driver's pool handle.
    pub fn pool_handle(&self) -> sys::CUmemoryPool {
        self.pool.pool_handle()
    }

    /// The device whose default managed pool this is.
    pub fn device(&self) -> Device {
        self.live.context().device()
    }

    /// Bytes the pool has reserved now (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn reserved_bytes(&self) -> Result<u64> {
        self.pool.reserved_bytes()
    }

    /// A view of the driver's pool, for its figures
    /// ([`reserved_by`](crate::reserved_by)); blocks are not
    /// allocated through it. Not public: as a resource it would hand out
    /// managed memory that the table of host-visible allocations does not
    /// hold (`CudaCopy` refuses it).
    pub(crate) fn pool(&self) -> &CudaAsyncMemory {
        &self.pool
    }
}

impl<S: AsRawStream + ?Sized> MemoryResource<S> for CudaAsyncManagedMemory {
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        let pool = self.pool_handle();
        // The stream's context current throughout, also inside
        // `host_visible` (a default handle names its context's stream).
        let context = stream.context().unwrap_or(self.live.context());
        context.scope(|| {
            let queue = |raw| {
                // SAFETY: a context is current; the pool is the driver's for
                // the process and the stream valid while borrowed
                // (`AsRawStream`'s contract); the out parameter is a live
                // local.
                let alloc =
                    |bytes, base: &mut u64| unsafe { sys::cuMemAllocFromPoolAsync(base, bytes, pool, raw) };
                // SAFETY: the release frees, on the allocating stream, an
                // allocation that `alloc` made and no one else frees;
                // `host_visible::allocate` calls it as its contract says
                // (out of the table, no `CudaCopy` access under way in it,
                // the stream's context current).
                unsafe {
                    host_visible::allocate(&self.live, context, request, alloc, |base| {
                        sys::cuMemFreeAsync(base, raw)
                    })
                }
            };
            allocate_in_order(stream, queue, |block, raw| {
                // SAFETY: the allocation, just made on `raw` with `context`
                // current (still, in this scope), is one of `self.live`'s,
                // handed out to no one; `host_visible::discard` takes it
                // out of that table first, and the release queues its free
                // on `raw` (valid while the stream is borrowed, `AsRawStream`'s
                // contract) once, out of the host-visible table: no one else
                // frees it.
                unsafe { host_visible::discard(&self.live, block, |base| sys::cuMemFreeAsync(base, raw)) }
            })
        })
    }

    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let context = stream.context().unwrap_or(self.live.context());
        context.scope(|| {
            free_in_order(stream, |raw| {
                // SAFETY: every allocation of `self.live` is one of this
                // pool's, made by `allocate` above; `host_visible::deallocate`
                // takes it out of that table first, so the release queues
                // its free (on a stream valid while borrowed, its context
                // current) once, and no one else frees it.
                unsafe {
                    host_visible::deallocate(&self.live, context, block, |base| {
                        sys::cuMemFreeAsync(base, raw)
                    })
                }
            })
        })
    }

    /// Equal to its clones, which share its table of live allocations.
    fn id(&self) -> memres_core::ResourceId {
        memres_core::ResourceId::shared::<Self>(Arc::as_ptr(&self.live).cast())
    }
}

// SAFETY: the block lies inside one driver allocation (`place` checks that
// padding and size fit) that no other block shares: managed memory from the
// driver's pool (`cuMemAllocFromPoolAsync`), which `CudaCopy`'s driver
// copies reach by its unified address. Checked access, as for
// `ManagedMemory`: the allocation is in the table of host-visible
// allocations from before its block is handed out until it leaves that
// table under its lock, before its free is queued, or until the resource
// ends (`HostAllocations`' drop takes it out under that lock), and
// `CudaCopy` touches host-visible memory only inside one entry, checked
// under the lock and marked in use until its work has finished, and its
// free waits for such marks: no copy of `CudaCopy`'s is in flight in a
// block whose free is queued, and none starts after.
unsafe impl memres_core::copy::MemoryOf<crate::CudaCopy> for CudaAsyncManagedMemory {}

/// `release` trims the device's default managed pool to what is in use
/// (`cuMemPoolTrimTo(pool, 0)`) once the device is done, as for
/// [`CudaAsyncMemory`]; it returns the reserved bytes given back.
impl memres_core::stack::Release<CudaStream> for CudaAsyncManagedMemory {
    fn release(&self, stream: &CudaStream) -> Result<u64> {
        memres_core::stack::Release::release(&*self.pool, stream)
    }
    fn held(&self) -> u64 {
        self.reserved_bytes().unwrap_or(0)
    }
}
