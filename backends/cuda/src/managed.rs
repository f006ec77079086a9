//! Managed (unified) memory and the prefetching adaptor.

use crate::context::{Context, Device};
use crate::error::error_from_code;
use crate::host_visible::{self, HostAllocations};
use crate::stream::{in_order, relaxed, AsRawStream};
use crate::sys;
use memres_core::{Block, Error, MemoryResource, Request, Result, Stream};
use std::sync::{Arc, Mutex, PoisonError};

/// Managed memory (`cuMemAllocManaged`, attached globally): RMM's
/// `managed_memory_resource`. The driver migrates its pages between host
/// and device on demand; [`Prefetch`] moves them ahead of use.
///
/// Blocks are separate driver allocations aligned to 256 bytes (or more
/// when asked); their addresses are valid on the host and on every device.
/// Streams mean nothing to it. Freeing is `cuMemFree`.
///
/// Dropping the resource (its last clone) frees nothing, but the blocks it
/// still has out are no longer [`CudaCopy`](crate::CudaCopy)'s to touch
/// (`NotLive`). Their memory stays allocated until the process ends: the
/// context, which would free it, is kept for the process.
///
/// # Errors
///
/// As [`CudaMemory`](crate::CudaMemory): out of memory with figures,
/// unknown addresses as [`Error::UnknownBlock`], a free with another size
/// than the allocation's as [`Error::SizeMismatch`],
/// other driver errors as [`Error::Backend`].
///
/// # Examples
///
/// ```no_run
/// use memres_core::{MemoryResource, Request};
/// use memres_cuda::{Device, ManagedMemory};
/// let mr = ManagedMemory::new(Device::get(0)?)?;
/// let b = mr.allocate(Request::new(4096)?, &())?;
/// // SAFETY: managed memory is host-accessible; the block is live and
/// // no device work uses it.
/// unsafe { (b.addr() as *mut u8).write(7) };
/// mr.deallocate(b, &())?;
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct ManagedMemory {
    /// The allocations handed out and not yet freed, and the device's
    /// primary context they are made in, retained: shared by clones.
    live: Arc<HostAllocations>,
}

impl ManagedMemory {
    /// A resource allocating managed memory in `device`'s primary context.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn new(device: Device) -> Result<ManagedMemory> {
        Ok(ManagedMemory { live: Arc::new(HostAllocations::new(device.primary_context()?)) })
    }

    /// The device whose context the memory was allocated in.
    pub fn device(&self) -> Device {
        self.live.context().device()
    }
}

impl<S: Stream + ?Sized> MemoryResource<S> for ManagedMemory {
    fn allocate(&self, request: Request, _stream: &S) -> Result<Block> {
        let alloc = |bytes, base: &mut u64| {
            // SAFETY: our context is current; the out parameter is a live local.
            relaxed(|| unsafe { sys::cuMemAllocManaged(base, bytes, sys::CU_MEM_ATTACH_GLOBAL) })
        };
        // SAFETY: `free_managed` frees a managed allocation, which `alloc`
        // makes; `host_visible::allocate` calls it as `free_managed` asks,
        // with our context current.
        unsafe {
            host_visible::allocate(&self.live, self.live.context(), request, alloc, |b| free_managed(b))
        }
    }

    fn deallocate(&self, block: Block, _stream: &S) -> Result<()> {
        // SAFETY: every allocation of `self.live` is a managed one of ours,
        // made by `allocate` above in our context.
        unsafe { host_visible::deallocate(&self.live, self.live.context(), block, |b| free_managed(b)) }
    }

    /// Equal to its clones, which share its table of live allocations (one
    /// made by another `new` has a table of its own and refuses this one's
    /// blocks, where RMM's CUDA resources are all equal).
    fn id(&self) -> memres_core::ResourceId {
        memres_core::ResourceId::shared::<Self>(Arc::as_ptr(&self.live).cast())
    }
}

/// `cuMemFree`, as `host_visible::free`'s release.
///
/// # Safety
///
/// `base` must be a managed allocation of ours that no one else frees, with
/// its context current, and `host_visible::free` the caller (it has just
/// taken `base` out of the table of host-visible allocations and waited
/// for the `CudaCopy` accesses in it, so none is under way or can start).
unsafe fn free_managed(base: u64) -> sys::CuResult {
    // SAFETY: as the caller promises.
    relaxed(|| unsafe { sys::cuMemFree_v2(base) })
}

// SAFETY: the block lies inside one driver allocation (`place` checks
// that padding and size fit) that no other block shares, live until
// `deallocate` takes it out of the table and frees it, or the resource ends
// (its drop frees nothing, and the context, whose end would free the
// memory, is kept for the rest of the process); it is managed memory
// (`cuMemAllocManaged`), which `CudaCopy`'s driver copies reach by its
// unified address. Checked access, as for `PinnedMemory`: the allocation is
// in the table of host-visible allocations from before its block is handed
// out until it leaves that table under its lock, before it is freed, or
// until the resource ends (`HostAllocations`' drop takes it out under that
// lock while the context is still retained), and `CudaCopy` touches
// host-visible memory only inside one entry, checked under the lock and
// marked in use until its work has finished, which a free waits for.
unsafe impl memres_core::copy::MemoryOf<crate::CudaCopy> for ManagedMemory {}

/// Prefetches every block it hands out to its device, on the allocation's
/// stream (`cuMemPrefetchAsync`): RMM's `prefetch_resource_adaptor`.
///
/// Meant over [`ManagedMemory`]. A block that is not managed memory (asked of
/// the driver with `cuPointerGetAttribute`) is handed out as it is, as RMM
/// does: prefetching is a hint. So is a prefetch the driver refuses, or
/// the question before it (after a sticky error every call fails): the
/// block is handed out all the same (managed memory is valid wherever it
/// lies; the pages move on first touch instead), and the failure is
/// counted, with its error, in
/// [`failed_prefetches`](Prefetch::failed_prefetches). Handing it back
/// instead could lose it: after a sticky error the upstream refuses the
/// free too, and the block would stay live upstream for good, held by no
/// one.
///
/// # Examples
///
/// ```no_run
/// use memres_core::{MemoryResource, Request};
/// use memres_cuda::{CudaStream, Device, ManagedMemory, Prefetch};
/// let device = Device::get(0)?;
/// let mr = Prefetch::new(ManagedMemory::new(device)?, device)?;
/// let stream = CudaStream::new(device)?;
/// let b = mr.allocate(Request::new(1 << 20)?, &stream)?; // resident on the device once `stream` gets there
/// mr.deallocate(b, &stream)?;
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct Prefetch<R> {
    upstream: R,
    /// The prefetch target's primary context (for the legacy stream).
    context: Context,
    /// The prefetches the driver refused: how many, and the last one's error.
    failed: Mutex<(u64, Option<Error>)>,
}

impl<R> Prefetch<R> {
    /// Prefetches what `upstream` hands out to `device`.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn new(upstream: R, device: Device) -> Result<Prefetch<R>> {
        Ok(Prefetch { upstream, context: device.primary_context()?, failed: Mutex::new((0, None)) })
    }

    /// The prefetches the driver refused (their blocks were handed out all
    /// the same), and the last one's error.
    pub fn failed_prefetches(&self) -> (u64, Option<Error>) {
        *self.failed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &R {
        &self.upstream
    }

    /// The device blocks are prefetched to.
    pub fn device(&self) -> Device {
        self.context.device()
    }

    /// The upstream resource, giving up the adaptor.
    pub fn into_inner(self) -> R {
        self.upstream
    }
}

impl<S: AsRawStream + ?Sized, R: MemoryResource<S>> MemoryResource<S> for Prefetch<R> {
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        let ctx = stream.context().unwrap_or(&self.context);
        self.allocate_hinting(request, stream, |b| {
            prefetch(b.addr(), b.size(), self.context.device(), ctx, stream)
        })
    }

    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        self.upstream.deallocate(block, stream)
    }

    /// Equal to a `Prefetch` over an equal upstream, as in RMM.
    fn id(&self) -> memres_core::ResourceId {
        memres_core::ResourceId::over::<Self>(self.upstream.id())
    }
}

impl<R> Prefetch<R> {
    /// `upstream`'s block for `request`, with `prefetch` (of that block)
    /// as a hint: its failure is counted, never the allocation's.
    fn allocate_hinting<S: Stream + ?Sized>(
        &self,
        request: Request,
        stream: &S,
        prefetch: impl FnOnce(Block) -> Result<bool>,
    ) -> Result<Block>
    where
        R: MemoryResource<S>,
    {
        let block = self.upstream.allocate(request, stream)?;
        if block.is_empty() {
            return Ok(block);
        }
        if let Err(e) = prefetch(block) {
            let mut failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
            *failed = (failed.0 + 1, Some(e));
        }
        Ok(block)
    }
}

/// Prefetches `size` bytes at `addr` to `device`, ordered on `stream`
/// (`cuMemPrefetchAsync`), with `context` current for the call: `Ok(true)`
/// where the range is managed memory, `Ok(false)` (nothing done) where it is
/// not, as RMM's `DeviceBuffer.prefetch`: prefetching is a hint.
///
/// # Errors
///
/// The driver's error as [`Error::Backend`],
/// such as a range past the end of its managed allocation, or the context's
/// sticky error (after a fault on the device, which every call answers).
pub fn prefetch<S: AsRawStream + ?Sized>(
    addr: u64,
    size: u64,
    device: Device,
    context: &Context,
    stream: &S,
) -> Result<bool> {
    prefetch_to(addr, size, sys::PrefetchTo::Device(device.raw()), context, stream)
}

/// [`prefetch`] to the host (RMM's `cudaCpuDeviceId`): the pages move to
/// host memory ahead of the host's use.
///
/// # Errors
///
/// As [`prefetch`]'s.
pub fn prefetch_to_host<S: AsRawStream + ?Sized>(
    addr: u64,
    size: u64,
    context: &Context,
    stream: &S,
) -> Result<bool> {
    prefetch_to(addr, size, sys::PrefetchTo::Host, context, stream)
}

fn prefetch_to<S: AsRawStream + ?Sized>(
    addr: u64,
    size: u64,
    to: sys::PrefetchTo,
    context: &Context,
    stream: &S,
) -> Result<bool> {
    if size == 0 {
        return Ok(false);
    }
    context.scope(|| {
        // Only managed memory takes the hint: ask first, so that plain
        // device memory costs no failing driver call.
        let mut managed: std::ffi::c_uint = 0;
        // SAFETY: `managed` is a valid out-pointer of the attribute's type
        // (unsigned int); the driver answers for any address (an address it
        // does not know is an error code, handled below).
        let code = unsafe {
            sys::cuPointerGetAttribute(
                (&mut managed as *mut std::ffi::c_uint).cast(),
                sys::CU_POINTER_ATTRIBUTE_IS_MANAGED,
                addr,
            )
        };
        match code {
            sys::CUDA_SUCCESS if managed != 0 => {}
            // Memory the driver does not know is not managed memory.
            sys::CUDA_SUCCESS | sys::CUDA_ERROR_INVALID_VALUE => return Ok(false),
            // Not an answer about the address: a sticky error, say, which
            // every later call answers too.
            code => return Err(error_from_code(code)),
        }
        let form = sys::MemPrefetchAsync::get().map_err(error_from_code)?;
        in_order(stream, |raw| {
            // SAFETY: `form` is the driver's (`MemPrefetchAsync::get`); a
            // prefetch migrates pages and never changes their contents; the
            // driver checks that the range lies in managed memory (else an
            // error code); the stream is valid while borrowed (`AsRawStream`'s
            // contract).
            match unsafe { form.to(addr, size as usize, to, raw) } {
                sys::CUDA_SUCCESS => Ok(true),
                code => Err(error_from_code(code)),
            }
        })
    })
}

// SAFETY: `Prefetch` hands out `R`'s blocks unchanged (a prefetch moves
// pages, not data) and gives them back only through `R::deallocate`.
unsafe impl<E, R: memres_core::copy::MemoryOf<E>> memres_core::copy::MemoryOf<E> for Prefetch<R> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::Device;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    /// Lends blocks and counts them out; refuses every free once `sticky`
    /// (as the driver after a sticky error).
    #[derive(Default)]
    struct Upstream {
        next: AtomicU64,
        out: AtomicU64,
        sticky: std::sync::atomic::AtomicBool,
    }

    const STICKY: Error = Error::Backend { code: 700, what: "CUDA_ERROR_ILLEGAL_ADDRESS" };

    impl MemoryResource<()> for Upstream {
        fn allocate(&self, request: Request, _: &()) -> Result<Block> {
            self.out.fetch_add(1, Relaxed);
            Ok(Block::from_addr((1 << 20) + self.next.fetch_add(1 << 20, Relaxed), request.size()))
        }
        fn deallocate(&self, _: Block, _: &()) -> Result<()> {
            if self.sticky.load(Relaxed) {
                return Err(STICKY);
            }
            self.out.fetch_sub(1, Relaxed);
            Ok(())
        }
    }

    /// A prefetch the driver refuses is a hint that failed: the block is
    /// handed out, counted nowhere else, and freed by its owner; the
    /// failure is counted with its error. Before, the block went back
    /// upstream, and after a sticky error that free failed too: the block
    /// stayed live upstream with no one to free it.
    #[test]
    fn a_failed_prefetch_hands_the_block_out_and_is_counted() {
        let mr = Prefetch {
            upstream: Upstream::default(),
            context: Context::fake(Device::fake(0)),
            failed: Mutex::new((0, None)),
        };
        let request = Request::new(1000).unwrap();
        mr.upstream.sticky.store(true, Relaxed);
        let got = mr.allocate_hinting(request, &(), |_| Err(STICKY));
        let block = got.expect("a failed prefetch fails no allocation");
        assert_eq!(block.size(), 1000);
        assert_eq!(mr.upstream.out.load(Relaxed), 1, "the block is the caller's, not lost upstream");
        assert_eq!(mr.failed_prefetches(), (1, Some(STICKY)));
        // Its owner frees it once the upstream frees again.
        assert_eq!(mr.deallocate(block, &()), Err(STICKY));
        mr.upstream.sticky.store(false, Relaxed);
        mr.deallocate(block, &()).unwrap();
        assert_eq!(mr.upstream.out.load(Relaxed), 0);
        // A prefetch that succeeds, or finds no managed memory, counts nothing.
        for answer in [Ok(true), Ok(false)] {
            let b = mr.allocate_hinting(request, &(), |_| answer).unwrap();
            mr.deallocate(b, &()).unwrap();
        }
        assert_eq!(mr.failed_prefetches(), (1, Some(STICKY)));
    }

    /// After a sticky error (here a kernel's fault, seen by a wait), the
    /// driver answers every call with it, the question whether a block is
    /// managed memory included: that is the prefetch's failure, counted,
    /// not an answer that the block is not managed memory. Before, the
    /// prefetch returned `Ok(false)` and the failure went unseen.
    #[test]
    fn a_prefetch_after_a_sticky_error_reports_it() {
        use crate::fake::{self, Driver};
        let mr = Prefetch {
            upstream: Upstream::default(),
            context: Context::fake(Device::fake(0)),
            failed: Mutex::new((0, None)),
        };
        let request = Request::new(1000).unwrap();
        // Not sticky: an address the driver does not know is not managed memory.
        fake::install(Driver::default());
        let got = mr.allocate(request, &());
        let answer = prefetch(0x1000, 1000, Device::fake(0), &mr.context, &());
        fake::take();
        mr.deallocate(got.unwrap(), &()).unwrap();
        assert_eq!(answer, Ok(false));
        assert_eq!(mr.failed_prefetches(), (0, None));
        let mut driver = Driver::default();
        (driver.fail_wait, driver.sticky) = (Some(700), true);
        fake::install(driver);
        // SAFETY: the model answers; the handle names the legacy stream.
        let wait = unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) };
        let got = mr.allocate(request, &());
        let answer = prefetch(0x1000, 1000, Device::fake(0), &mr.context, &());
        fake::take();
        assert_eq!(wait, 700);
        let b = got.expect("a failed prefetch fails no allocation");
        assert_eq!(mr.failed_prefetches(), (1, Some(STICKY)), "the sticky error went unseen");
        assert_eq!(answer, Err(STICKY));
        mr.deallocate(b, &()).unwrap();
    }
}
