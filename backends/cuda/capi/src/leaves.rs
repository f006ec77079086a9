//! The CUDA resources as names of a [`StackBuilder`]: `async`, `cuda`,
//! `managed` and `vmm`, each counted on the way to the device.

use crate::vmm::vmm_config;
use memres_core::stack::{Call, StackError, StackErrorKind};
use memres_core::{Block, DynResource, MemoryResource, Request, Result};
use memres_cuda::{AsyncConfig, CudaAsyncMemory, CudaMemory, CudaStream, Device, ManagedMemory};
use memres_sim::{SimDevice, StackBuilder};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Bytes held from the device by every leaf of one stack: the figure the
/// footprint is measured with (peak held from upstream).
///
/// # Examples
///
/// ```
/// use memres::leaves::UpstreamCounter;
/// let c = UpstreamCounter::default();
/// c.add(300);
/// c.sub(100);
/// c.add(50);
/// assert_eq!((c.current(), c.peak(), c.total()), (250, 300, 350));
/// ```
#[derive(Debug, Default)]
pub struct UpstreamCounter {
    /// Bytes held now.
    current: AtomicU64,
    /// The highest `current` has been: each `add` raises it to the value
    /// its own `fetch_add` produced, so it is the exact maximum.
    peak: AtomicU64,
    /// Bytes ever taken (frees do not subtract).
    total: AtomicU64,
}

impl UpstreamCounter {
    /// Counts `bytes` taken from the device.
    pub fn add(&self, bytes: u64) {
        let now = self.current.fetch_add(bytes, Relaxed).wrapping_add(bytes);
        self.total.fetch_add(bytes, Relaxed);
        self.peak.fetch_max(now, Relaxed);
    }

    /// Counts `bytes` given back.
    pub fn sub(&self, bytes: u64) {
        self.current.fetch_sub(bytes, Relaxed);
    }

    /// Bytes held now.
    pub fn current(&self) -> u64 {
        self.current.load(Relaxed)
    }

    /// The most bytes held at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Relaxed)
    }

    /// Bytes ever taken.
    pub fn total(&self) -> u64 {
        self.total.load(Relaxed)
    }
}

/// A leaf resource and the counter it reports to.
///
/// # Examples
///
/// ```
/// use memres::leaves::{Counted, UpstreamCounter};
/// use memres_core::{MemoryResource, Request};
/// use memres_sim::SimDevice;
/// use std::sync::Arc;
/// let counter = Arc::new(UpstreamCounter::default());
/// let leaf = Counted::new(SimDevice::new(1 << 20), counter.clone());
/// let b = leaf.allocate(Request::new(1000)?, &())?;
/// assert_eq!(counter.current(), 1000);
/// leaf.deallocate(b, &())?;
/// assert_eq!((counter.current(), counter.peak()), (0, 1000));
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct Counted<R> {
    inner: R,
    counter: Arc<UpstreamCounter>,
}

impl<R> Counted<R> {
    /// Counts what `inner` hands out in `counter`.
    pub fn new(inner: R, counter: Arc<UpstreamCounter>) -> Self {
        Counted { inner, counter }
    }

    /// The leaf.
    pub fn inner(&self) -> &R {
        &self.inner
    }
}

impl<S: memres_core::Stream + ?Sized, R: MemoryResource<S>> MemoryResource<S> for Counted<R> {
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        let b = self.inner.allocate(request, stream)?;
        self.counter.add(b.size());
        Ok(b)
    }

    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        // Uncounted first, so that a racing allocation of the same memory
        // cannot raise the peak above what the device really lent.
        self.counter.sub(block.size());
        let r = self.inner.deallocate(block, stream);
        if r.is_err() {
            self.counter.add_back(block.size());
        }
        r
    }
}

impl UpstreamCounter {
    /// Undoes a `sub` whose free failed (does not count as taken again).
    fn add_back(&self, bytes: u64) {
        self.current.fetch_add(bytes, Relaxed);
    }
}

/// The options of `async`: `initial=` (bytes reserved when made, default 0)
/// and `release_threshold=` (bytes kept reserved across synchronizations,
/// default: all of them).
///
/// # Errors
///
/// An unknown key, a positional argument or a bad size, at its position.
///
/// # Examples
///
/// ```
/// use memres::leaves::async_config;
/// use memres_core::stack::parse;
/// let c = async_config(&parse("async(initial=1GiB, release_threshold=2GiB)")?)?;
/// assert_eq!(c, memres_cuda::AsyncConfig::new().initial_size(1 << 30).release_threshold(2 << 30));
/// assert!(async_config(&parse("async(initial=lots)")?).is_err());
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
pub fn async_config(call: &Call) -> std::result::Result<AsyncConfig, StackError> {
    call.expect_args(0, &["initial", "release_threshold"])?;
    let mut config = AsyncConfig::new();
    if let Some(initial) = call.size_arg("initial")? {
        config = config.initial_size(initial);
    }
    if let Some(threshold) = call.size_arg("release_threshold")? {
        config = config.release_threshold(threshold);
    }
    Ok(config)
}

fn resource_error(call: &Call, e: memres_core::Error) -> StackError {
    call.error(StackErrorKind::Resource(e))
}

/// Registers the CUDA leaves of `device` in `builder`, every one counted in
/// `counter`:
///
/// | name | arguments | resource (typed handle) |
/// | --- | --- | --- |
/// | `async` | `initial=`, `release_threshold=` | [`CudaAsyncMemory`] on its own pool (`Counted<CudaAsyncMemory>`) |
/// | `cuda` | none | [`CudaMemory`] (`Counted<CudaMemory>`) |
/// | `managed` | none | [`ManagedMemory`] (`Counted<ManagedMemory>`) |
/// | `vmm` | `reserve=`, `keep=`, `granules=`, `trim_on_commit=` | a [`VirtualPool`](memres_core::vpool::VirtualPool) over [`CudaVirtualSpace`](memres_cuda::CudaVirtualSpace) ([`VmmPool`](crate::vmm::VmmPool)), counted by the bytes it maps (see [`crate::vmm`]) |
///
/// # Examples
///
/// ```no_run
/// use memres::leaves::{register_cuda, UpstreamCounter};
/// use memres_cuda::{CudaStream, Device};
/// use memres_sim::StackBuilder;
/// use std::sync::Arc;
/// let device = Device::get(0)?;
/// let mut builder = StackBuilder::<CudaStream>::new();
/// register_cuda(&mut builder, device, Arc::new(UpstreamCounter::default()));
/// let stream = CudaStream::legacy_in(device.primary_context()?);
/// let stack = builder.build("stats(pool(async, initial=1GiB))", &stream)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn register_cuda(builder: &mut StackBuilder<CudaStream>, device: Device, counter: Arc<UpstreamCounter>) {
    let c = counter.clone();
    builder.register("async", move |call, cx| {
        let config = async_config(call)?;
        let mr = CudaAsyncMemory::with_config(device, config).map_err(|e| resource_error(call, e))?;
        Ok(cx.keep(call, Counted::new(mr, c.clone())))
    });
    let c = counter.clone();
    builder.register("cuda", move |call, cx| {
        call.expect_args(0, &[])?;
        let mr = CudaMemory::new(device).map_err(|e| resource_error(call, e))?;
        Ok(cx.keep(call, Counted::new(mr, c.clone())))
    });
    let c = counter.clone();
    builder.register("managed", move |call, cx| {
        call.expect_args(0, &[])?;
        let mr = ManagedMemory::new(device).map_err(|e| resource_error(call, e))?;
        Ok(cx.keep(call, Counted::new(mr, c.clone())))
    });
    builder.register("vmm", move |call, cx| {
        let pool = vmm_config(call)?.build(device, counter.clone()).map_err(|e| resource_error(call, e))?;
        Ok(cx.keep(call, pool))
    });
}

/// Makes the names of [`StackBuilder::new`] that stand for no device memory
/// errors in `builder`: `sim` (a simulated device: made-up addresses),
/// `host` (host memory, which kernels cannot use) and `vpool` (a pool over
/// a simulated address space; `vmm` is the device's). Handed to PyTorch or
/// CuPy, their pointers would crash the first kernel that used them.
///
/// # Examples
///
/// ```
/// use memres::leaves::refuse_host_leaves;
/// use memres_cuda::CudaStream;
/// use memres_sim::StackBuilder;
/// let mut b = StackBuilder::<CudaStream>::new();
/// assert!(b.build("pool(sim)", &CudaStream::legacy()).is_ok());
/// refuse_host_leaves(&mut b);
/// let e = b.build("stats(pool(sim))", &CudaStream::legacy()).err().unwrap();
/// assert_eq!(e.pos, 11);
/// assert!(e.to_string().contains("`sim` is a simulated device"), "{e}");
/// ```
pub fn refuse_host_leaves(builder: &mut StackBuilder<CudaStream>) {
    for (name, what) in [
        ("sim", "a simulated device, whose addresses are made up"),
        ("host", "host memory, which kernels cannot use"),
        ("vpool", "a pool over a simulated address space (`vmm` is the device's)"),
    ] {
        builder.register(name, move |call, _| {
            Err(call.error(StackErrorKind::BadValue(format!(
                "`{name}` is {what}: the C library hands out device memory (async, cuda, managed, vmm)"
            ))))
        });
    }
}

/// A builder that checks a stack without touching a device: the CUDA
/// leaves check their arguments and stand in as simulated devices, and
/// `log` checks its arguments without opening its file; `sim`, `host` and
/// `vpool` are refused ([`refuse_host_leaves`]).
///
/// # Examples
///
/// ```
/// use memres::leaves::checking_builder;
/// use memres_cuda::CudaStream;
/// let b = checking_builder();
/// assert!(b.build("stats(pool(async, initial=1GiB))", &CudaStream::legacy()).is_ok());
/// assert!(b.build("pool(asink)", &CudaStream::legacy()).is_err());
/// ```
pub fn checking_builder() -> StackBuilder<CudaStream> {
    // Large enough for any initial size; a simulated device holds no bytes.
    const CAPACITY: u64 = 1 << 62;
    let mut b = StackBuilder::<CudaStream>::new();
    refuse_host_leaves(&mut b);
    b.register("async", |call, cx| {
        async_config(call)?;
        Ok(cx.keep(call, SimDevice::new(CAPACITY)))
    });
    for name in ["cuda", "managed"] {
        b.register(name, |call, cx| {
            call.expect_args(0, &[])?;
            Ok(cx.keep(call, SimDevice::new(CAPACITY)))
        });
    }
    b.register("vmm", |call, cx| {
        vmm_config(call)?;
        Ok(cx.keep(call, SimDevice::new(CAPACITY)))
    });
    b.register("log", |call, cx| {
        call.expect_args(1, &["file"])?;
        let file = call.keyed("file").ok_or_else(|| call.error(StackErrorKind::MissingArg("file=")))?;
        file.text()?;
        let upstream: DynResource<CudaStream> = cx.upstream(call, 0)?;
        Ok(upstream)
    });
    b
}
