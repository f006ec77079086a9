//! Stream-ordered allocation from a driver memory pool: RMM's
//! `cuda_async_memory_resource` and `cuda_async_view_memory_resource`.

use crate::context::{Context, Device};
use crate::error::{check, check_free};
use crate::live::LiveAllocations;
use crate::place::{allocate_with, base_of, discard_with, out_of_memory, padded_size};
use crate::stream::{allocate_in_order, free_in_order, AsRawStream, CudaStream};
use crate::sys;
use memres_core::{Block, Error, MemoryResource, Request, Result};
use std::ffi::c_void;
use std::ptr;

/// The kind of handle a pool's memory can be exported as, for sharing with
/// other processes (`CUmemAllocationHandleType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IpcHandle {
    /// No export (the default).
    #[default]
    None,
    /// A POSIX file descriptor.
    PosixFileDescriptor,
    /// A Win32 NT handle.
    Win32,
    /// A Win32 KMT handle.
    Win32Kmt,
    /// A fabric handle (CUDA 12.3 and later, on systems with a fabric).
    Fabric,
}

impl IpcHandle {
    fn code(self) -> i32 {
        match self {
            IpcHandle::None => 0,
            IpcHandle::PosixFileDescriptor => 1,
            IpcHandle::Win32 => 2,
            IpcHandle::Win32Kmt => 4,
            IpcHandle::Fabric => 8,
        }
    }
}

/// How [`CudaAsyncMemory::with_config`] makes its pool.
///
/// # Examples
///
/// ```
/// use memres_cuda::AsyncConfig;
/// let c = AsyncConfig::new().initial_size(1 << 30).release_threshold(4 << 30);
/// assert_eq!(c.initial(), Some(1 << 30));
/// assert_eq!(AsyncConfig::default(), AsyncConfig::new());
/// assert_eq!(AsyncConfig::rmm().initial(), None); // half the free memory
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncConfig {
    /// Bytes to reserve when the pool is made (rounded down to a multiple of
    /// 256); `None`: half the device's free memory.
    initial_size: Option<u64>,
    /// Bytes the pool keeps reserved across synchronizations; `None`: the
    /// device's memory (keep everything).
    release_threshold: Option<u64>,
    /// Export handle type of the pool's memory.
    ipc: IpcHandle,
}

impl Default for AsyncConfig {
    /// [`AsyncConfig::new`].
    fn default() -> Self {
        AsyncConfig::new()
    }
}

impl AsyncConfig {
    /// A pool that starts empty, keeps what it reserves (release threshold:
    /// the device's memory) and is not exportable.
    pub const fn new() -> Self {
        AsyncConfig { initial_size: Some(0), release_threshold: None, ipc: IpcHandle::None }
    }

    /// RMM's defaults: reserve half the device's free memory up front, keep
    /// everything, no export.
    pub const fn rmm() -> Self {
        AsyncConfig { initial_size: None, release_threshold: None, ipc: IpcHandle::None }
    }

    /// Reserve `bytes` when the pool is made (allocated and freed once, as
    /// RMM primes its pool), rounded down to a multiple of 256: below 256
    /// nothing is reserved.
    pub const fn initial_size(mut self, bytes: u64) -> Self {
        self.initial_size = Some(bytes);
        self
    }

    /// Keep at most `bytes` reserved when the pool's memory is idle at a
    /// synchronization (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`); the rest goes
    /// back to the device.
    pub const fn release_threshold(mut self, bytes: u64) -> Self {
        self.release_threshold = Some(bytes);
        self
    }

    /// Make the pool's memory exportable as `handle`.
    pub const fn ipc_handle(mut self, handle: IpcHandle) -> Self {
        self.ipc = handle;
        self
    }

    /// The initial size, if set (`None`: half the free memory).
    pub const fn initial(&self) -> Option<u64> {
        self.initial_size
    }
}

/// Stream-ordered device memory from a driver memory pool
/// (`cuMemAllocFromPoolAsync` / `cuMemFreeAsync`): RMM's
/// `cuda_async_memory_resource`, or, made by [`default_pool`](Self::default_pool)
/// or [`from_pool`](Self::from_pool), its `cuda_async_view_memory_resource`.
///
/// ```text
///  CudaAsyncMemory { pool: CUmemoryPool, owned }
///    allocate(req, stream)   ──► cuMemAllocFromPoolAsync(pool, stream)
///    deallocate(b, stream)   ──► cuMemFreeAsync(stream)
///    the driver reuses freed memory on the same stream at once, on other
///    streams once they are ordered after the free
/// ```
///
/// The pool is the driver's: this type only names it, and destroys it on
/// drop if it made it, once the work queued in its context has finished.
/// Blocks are aligned to 256 bytes (or more when asked). It serves every
/// stream that names a raw `CUstream` ([`AsRawStream`]): [`CudaStream`],
/// and `()` for the legacy default stream.
///
/// # Errors
///
/// - [`Error::OutOfMemory`] when the pool cannot grow to hold the block:
///   `pool_size` is what the pool has reserved, `largest_free` the device's
///   free memory (an upper bound), `max_size` the device's memory.
/// - [`Error::UnknownBlock`] when the block freed is not one handed out and
///   live, [`Error::SizeMismatch`] when it is freed with another size than
///   it was asked for (both answered by the resource, not the driver).
/// - Other driver errors as [`Error::Backend`].
///
/// # Examples
///
/// ```no_run
/// use memres_core::{MemoryResource, Request};
/// use memres_cuda::{AsyncConfig, CudaAsyncMemory, CudaStream, Device};
/// let device = Device::get(0)?;
/// let mr = CudaAsyncMemory::with_config(device, AsyncConfig::new().initial_size(1 << 28))?;
/// let stream = CudaStream::new(device)?;
/// let b = mr.allocate(Request::new(1000)?, &stream)?;
/// mr.deallocate(b, &stream)?;
/// assert!(mr.reserved_bytes()? >= 1 << 28);
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct CudaAsyncMemory {
    /// Valid while `self` lives: made here (`owned`) or promised by the caller.
    pool: sys::CUmemoryPool,
    /// Whether `pool` was made here and is destroyed on drop.
    owned: bool,
    /// The pool's device's primary context.
    context: Context,
    /// The allocations handed out and not yet freed (boxed: 16 shards).
    live: Box<LiveAllocations>,
}

// SAFETY: a memory pool handle may be used from any thread (the driver
// locks what it must); an owned pool is destroyed exactly once, by `Drop`.
unsafe impl Send for CudaAsyncMemory {}
// SAFETY: as above; every method takes `&self` and only passes handles on.
unsafe impl Sync for CudaAsyncMemory {}

/// What the driver pools of `pools` reserve: `(bytes now, the sum of each
/// pool's most)`, each pool counted once however many resources view it
/// (the device's default pool, say); a figure the driver cannot give
/// counts 0. The sum of the peaks is what the driver can tell: each
/// pool's peak, not the most the pools reserved at once.
pub fn reserved_by<'a>(pools: impl IntoIterator<Item = &'a CudaAsyncMemory>) -> (u64, u64) {
    let mut seen: Vec<sys::CUmemoryPool> = Vec::new();
    let (mut now, mut peak) = (0, 0);
    for pool in pools {
        if seen.contains(&pool.pool) {
            continue;
        }
        seen.push(pool.pool);
        now += pool.reserved_bytes().unwrap_or(0);
        peak += pool.peak_reserved_bytes().unwrap_or(0);
    }
    (now, peak)
}

impl CudaAsyncMemory {
    /// A resource over a new pool on `device` with [`AsyncConfig::new`]:
    /// starts empty, keeps what it reserves.
    ///
    /// # Errors
    ///
    /// As [`with_config`](Self::with_config).
    pub fn new(device: Device) -> Result<CudaAsyncMemory> {
        Self::with_config(device, AsyncConfig::new())
    }

    /// A resource over a new pool on `device` made as `config` says.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if the device has no memory pools; out of
    /// memory if the initial size cannot be reserved; the driver's other
    /// errors as [`Error::Backend`]. Nothing is left behind on failure but
    /// in one case: the block that reserves the initial size, freed at
    /// once, cannot be freed even once the device is idle (the driver's
    /// error); the pool then keeps that block's memory for the rest of the
    /// process.
    pub fn with_config(device: Device, config: AsyncConfig) -> Result<CudaAsyncMemory> {
        if !device.supports_memory_pools()? {
            return Err(Error::InvalidConfig { what: "the device does not support memory pools" });
        }
        let context = device.primary_context()?;
        let pool = context.scope(|| {
            let props = sys::CuMemPoolProps {
                alloc_type: sys::CU_MEM_ALLOCATION_TYPE_PINNED,
                handle_types: config.ipc.code(),
                location: sys::CuMemLocation { type_: sys::CU_MEM_LOCATION_TYPE_DEVICE, id: device.raw() },
                win32_security_attributes: ptr::null_mut(),
                reserved: [0; 64],
            };
            let mut pool = ptr::null_mut();
            // SAFETY: a context is current; `props` is a fully initialized
            // `CUmemPoolProps` (reserved bytes zero); the out parameter is a live local.
            check(unsafe { sys::cuMemPoolCreate(&mut pool, &props) })?;
            Ok(pool)
        })?;
        // From here on, dropping `mr` destroys the pool: early returns leave nothing.
        let mr = CudaAsyncMemory { pool, owned: true, context, live: Box::default() };
        let info = mr.context.memory_info()?;
        mr.set_release_threshold(config.release_threshold.unwrap_or(info.total))?;
        mr.prime(config.initial_size.unwrap_or(info.free / 2) & !255)?;
        Ok(mr)
    }

    /// Has the pool reserve `bytes` (0: nothing) by allocating them and
    /// freeing them at once. A refused free is tried once more after the
    /// context is idle: a block no one holds would keep the pool's memory
    /// (its destruction deferred) for the rest of the process.
    ///
    /// # Errors
    ///
    /// The allocation's error; the second free's error if the block could
    /// still not be freed, which is then left behind.
    pub(crate) fn prime(&self, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let block = self.allocate(Request::new(bytes)?, &())?;
        if self.deallocate(block, &()).is_ok() {
            return Ok(());
        }
        // SAFETY: the scope makes the pool's context current; synchronizing
        // it takes no arguments.
        self.context.scope(|| check(unsafe { sys::cuCtxSynchronize() }))?;
        self.deallocate(block, &())
    }

    /// A view of `device`'s default memory pool (`cuDeviceGetDefaultMemPool`,
    /// the one `cuMemAllocAsync` uses): RMM's async view resource. The pool
    /// is the driver's and is not destroyed on drop; its attributes are left
    /// as they are.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if the device has no memory pools; the
    /// driver's other errors as [`Error::Backend`].
    pub fn default_pool(device: Device) -> Result<CudaAsyncMemory> {
        if !device.supports_memory_pools()? {
            return Err(Error::InvalidConfig { what: "the device does not support memory pools" });
        }
        let context = device.primary_context()?;
        let mut pool = ptr::null_mut();
        // SAFETY: the driver is initialized (a context was retained); the
        // out parameter is a live local.
        check(unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, device.raw()) })?;
        Ok(CudaAsyncMemory { pool, owned: false, context, live: Box::default() })
    }

    /// A view of a pool made elsewhere; it is not destroyed on drop.
    ///
    /// # Safety
    ///
    /// `pool` must be a memory pool of `device` that stays valid while the
    /// returned resource, and every block it handed out, lives.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub unsafe fn from_pool(device: Device, pool: sys::CUmemoryPool) -> Result<CudaAsyncMemory> {
        Ok(CudaAsyncMemory { pool, owned: false, context: device.primary_context()?, live: Box::default() })
    }

    /// A view of `pool` in a context that names no driver context, for
    /// models of the driver.
    #[cfg(test)]
    pub(crate) fn fake(pool: sys::CUmemoryPool) -> CudaAsyncMemory {
        let context = Context::fake(Device::fake(0));
        CudaAsyncMemory { pool, owned: false, context, live: Box::default() }
    }

    /// As [`fake`](Self::fake), for a pool made here: destroyed on drop.
    #[cfg(test)]
    pub(crate) fn fake_owned(pool: sys::CUmemoryPool) -> CudaAsyncMemory {
        let mut mr = Self::fake(pool);
        mr.owned = true;
        mr
    }

    /// The allocations handed out and not yet freed.
    #[cfg(test)]
    pub(crate) fn live(&self) -> &LiveAllocations {
        &self.live
    }

    /// The driver's pool handle.
    pub fn pool_handle(&self) -> sys::CUmemoryPool {
        self.pool
    }

    /// Whether the pool was made by this resource (and is destroyed with it).
    pub fn owns_pool(&self) -> bool {
        self.owned
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.context.device()
    }

    /// The context the memory lives in.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// Bytes the pool has reserved from the device now
    /// (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn reserved_bytes(&self) -> Result<u64> {
        self.attribute_u64(sys::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    }

    /// The most bytes the pool has had reserved (`CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`).
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn peak_reserved_bytes(&self) -> Result<u64> {
        self.attribute_u64(sys::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
    }

    /// Bytes of the pool in use by allocations now (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn used_bytes(&self) -> Result<u64> {
        self.attribute_u64(sys::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    }

    /// The release threshold (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`).
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn release_threshold(&self) -> Result<u64> {
        self.attribute_u64(sys::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    }

    /// Sets the release threshold: bytes the pool keeps reserved when idle
    /// at a synchronization.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        let mut v = bytes;
        // SAFETY: the threshold attribute takes a `cuuint64_t`, which `v` is.
        check(unsafe {
            sys::cuMemPoolSetAttribute(
                self.pool,
                sys::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                ptr::from_mut(&mut v).cast(),
            )
        })
    }

    /// Gives reserved memory the pool does not use back to the device,
    /// keeping at least `keep` bytes reserved (`cuMemPoolTrimTo`).
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn trim_to(&self, keep: u64) -> Result<()> {
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        // SAFETY: the pool is valid while `self` lives.
        check(unsafe { sys::cuMemPoolTrimTo(self.pool, keep) })
    }

    fn attribute_u64(&self, attr: i32) -> Result<u64> {
        let mut v: u64 = 0;
        // SAFETY: the byte-count attributes are `cuuint64_t`, which `v` is;
        // the pool is valid while `self` lives.
        check(unsafe {
            sys::cuMemPoolGetAttribute(self.pool, attr, ptr::from_mut(&mut v).cast::<c_void>())
        })?;
        Ok(v)
    }
}

impl<S: AsRawStream + ?Sized> MemoryResource<S> for CudaAsyncMemory {
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        if padded_size(request)? as u64 > self.live.device_total(&self.context) {
            return Err(out_of_memory(&self.context, request.size(), self.reserved_bytes().ok()));
        }
        stream.context().unwrap_or(&self.context).scope(|| {
            allocate_in_order(
                stream,
                |raw| {
                    allocate_with(
                        &self.context,
                        &self.live,
                        request,
                        // SAFETY: a context is current; the pool is valid while `self`
                        // lives and the stream while borrowed (`AsRawStream`'s contract); the out
                        // parameter is a live local.
                        |bytes, base| unsafe { sys::cuMemAllocFromPoolAsync(base, bytes, self.pool, raw) },
                        // SAFETY: `base` was just allocated on `raw` and is handed out to no one.
                        |base| unsafe { sys::cuMemFreeAsync(base, raw) },
                        || self.reserved_bytes().ok(),
                    )
                },
                |block, raw| {
                    // SAFETY: `base` was just allocated on `raw`, in the
                    // context still current, and handed out to no one;
                    // `discard_with` has taken it out of the table, so no
                    // one else frees it. The stream is valid while borrowed
                    // (`AsRawStream`'s contract).
                    discard_with(&self.live, block, |base| unsafe { sys::cuMemFreeAsync(base, raw) })
                },
            )
        })
    }

    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let base = base_of(block)?;
        self.live.remove(base, block.addr(), block.size())?;
        let freed = stream.context().unwrap_or(&self.context).scope(|| {
            free_in_order(stream, |raw| {
                // SAFETY: `base` is a live allocation of this pool (just taken
                // out of the table, so no one frees it twice); the stream is
                // valid while borrowed (`AsRawStream`'s contract).
                check_free(unsafe { sys::cuMemFreeAsync(base, raw) }, block.addr())
            })
        });
        if freed.is_err() {
            self.live.restore(base, block.addr(), block.size());
        }
        freed
    }
}

// SAFETY: the block lies inside one driver allocation (`place` checks that
// padding and size fit) that no other block shares: device memory from the
// driver's pool (`cuMemAllocFromPoolAsync`), usable in the order of the
// allocating stream, which `CudaCopy`'s driver copies reach by its unified
// address. (Its own pool and the device's default pool hold device memory; a
// pool made elsewhere, which `from_pool` takes, may hold host memory, and
// the view of the device's managed pool, which never leaves this crate,
// holds managed memory: for those the last sentence holds.) It stays until
// `deallocate` takes it out of the table and frees it; dropping the
// resource destroys the pool, which the driver defers until its
// outstanding blocks are freed. Freed by other code, or of another kind,
// it is memory only those copies reach: `CudaCopy` has the driver confirm
// each range is device memory, not managed, first (anything else is
// refused), and a stale device address names device memory or nothing,
// never host memory.
unsafe impl memres_core::copy::MemoryOf<crate::CudaCopy> for CudaAsyncMemory {}

/// The driver's pool keeps freed memory reserved up to its release
/// threshold: `release` trims it to what is in use (`cuMemPoolTrimTo(pool,
/// 0)`) once the device is done, as PyTorch's `cudaMallocAsync` backend
/// empties its cache; it returns the reserved bytes given back.
impl memres_core::stack::Release<CudaStream> for CudaAsyncMemory {
    fn release(&self, stream: &CudaStream) -> Result<u64> {
        memres_core::Stream::synchronize_device(stream)?;
        let before = self.reserved_bytes()?;
        self.trim_to(0)?;
        Ok(before.saturating_sub(self.reserved_bytes()?))
    }
    fn held(&self) -> u64 {
        self.reserved_bytes().unwrap_or(0)
    }
}

impl Drop for CudaAsyncMemory {
    fn drop(&mut self) {
        if self.owned {
            let _ = self.context.scope(|| {
                // The context's work finishes first, so no free into the
                // pool is still queued when it goes: the driver allows
                // that, but threads that destroy pools with frees queued
                // while others use pools hang in it now and then
                // (docs/verification.md). A failed wait (a fault, the
                // driver shut down) still leaves the destroy to try.
                // SAFETY: takes no argument; the pool's context is current.
                let _ = unsafe { sys::cuCtxSynchronize() };
                // SAFETY: the pool was made by `cuMemPoolCreate` and is
                // destroyed only here. Blocks still out keep its memory
                // alive in the driver until they are freed. An error
                // (driver shut down) leaves nothing to undo.
                Ok(unsafe { sys::cuMemPoolDestroy(self.pool) })
            });
        }
    }
}
