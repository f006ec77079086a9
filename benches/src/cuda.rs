//! The CUDA upstreams (feature `cuda`): `--upstream cuda` (`cuMemAlloc`,
//! [`CudaMemory`]) and `--upstream async` (`cuMemAllocAsync`,
//! [`CudaAsyncMemory`]), the plain CUDA resources as rows of their own
//! (`--resource cuda`, `--resource async`), and the `cuda` and `async`
//! leaves of a `--stack` replayed with `--upstream cuda|async`.
//!
//! The upstream sits under a [`Statistics`] adaptor, whose peak is the
//! row's peak upstream (as RMM's harness puts `statistics_resource_adaptor`
//! over its upstream). Every replaying thread makes a non-blocking
//! [`CudaStream`] of its own and every upstream call of that thread goes to
//! it, as in RMM's harness (whose single thread also replays on a
//! non-blocking stream).

use crate::replay::{replay, replay_threads, Measurement};
use crate::resources::{Build, BuildShared, RunError, RunOptions, Upstream, UpstreamKind};
use crate::workload::Workload;
use memres_core::adaptor::Statistics;
use memres_core::stack::StackErrorKind;
use memres_core::{Block, MemoryResource, Request, Stream};
use memres_cuda::{CudaAsyncMemory, CudaMemory, CudaStream, Device, StreamOptions};
use memres_sim::{Built, SimStream, SimWorld, StackBuilder};
use std::cell::RefCell;
use std::fmt;

thread_local! {
    /// The CUDA stream of the replaying thread (none: the legacy default
    /// stream).
    static STREAM: RefCell<Option<CudaStream>> = const { RefCell::new(None) };
}

/// A CUDA resource under a statistics adaptor, reached on the calling
/// thread's CUDA stream whatever stream the resource above passes.
pub struct CudaUpstream<R> {
    inner: Statistics<R>,
}

impl<R> CudaUpstream<R> {
    /// `resource` under a statistics adaptor.
    pub fn new(resource: R) -> Self {
        CudaUpstream { inner: Statistics::new(resource) }
    }
}

impl<R> fmt::Debug for CudaUpstream<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaUpstream").field("bytes", &self.inner.bytes()).finish_non_exhaustive()
    }
}

impl<S, R> MemoryResource<S> for CudaUpstream<R>
where
    S: Stream + ?Sized,
    R: MemoryResource<CudaStream> + MemoryResource<()>,
{
    #[inline]
    fn allocate(&self, request: Request, _: &S) -> memres_core::Result<Block> {
        STREAM.with(|s| match &*s.borrow() {
            Some(stream) => self.inner.allocate(request, stream),
            None => self.inner.allocate(request, &()),
        })
    }

    #[inline]
    fn deallocate(&self, block: Block, _: &S) -> memres_core::Result<()> {
        STREAM.with(|s| match &*s.borrow() {
            Some(stream) => self.inner.deallocate(block, stream),
            None => self.inner.deallocate(block, &()),
        })
    }
}

impl<R> Upstream for CudaUpstream<R>
where
    R: MemoryResource<CudaStream> + MemoryResource<()> + fmt::Debug + Send + Sync + 'static,
{
    fn peak_held_bytes(&self) -> u64 {
        self.inner.bytes().peak.max(0) as u64
    }
}

fn device() -> Result<Device, RunError> {
    memres_cuda::init()
        .and_then(|()| Device::get(0))
        .map_err(|e| RunError::Unsupported(format!("no CUDA device: {e}")))
}

fn cuda_error(what: &str, e: memres_core::Error) -> RunError {
    RunError::Unsupported(format!("{what}: {e}"))
}

/// The upstream `--upstream` names, made on device 0.
enum Made {
    Cuda(CudaUpstream<CudaMemory>),
    Async(CudaUpstream<CudaAsyncMemory>),
}

fn make(kind: UpstreamKind, device: Device) -> Result<Made, RunError> {
    match kind {
        UpstreamKind::Cuda => Ok(Made::Cuda(CudaUpstream::new(
            CudaMemory::new(device).map_err(|e| cuda_error("cuMemAlloc resource", e))?,
        ))),
        UpstreamKind::Async => Ok(Made::Async(CudaUpstream::new(
            CudaAsyncMemory::new(device).map_err(|e| cuda_error("cuMemAllocAsync pool", e))?,
        ))),
        other => Err(RunError::Unsupported(format!("`{other}` is not a CUDA upstream"))),
    }
}

/// Replays on one thread, on a non-blocking stream, a resource built by `B`
/// over the CUDA upstream of `options`.
///
/// # Errors
///
/// No device, a resource that cannot be made, an op's failure.
pub fn run<B: Build>(
    w: &Workload,
    options: &RunOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<Measurement, RunError> {
    let device = device()?;
    let _stream = OwnStream::new(device);
    match make(options.upstream, device)? {
        Made::Cuda(u) => {
            let mut r = B::build(u, w, options).map_err(RunError::Unsupported)?;
            Ok(replay(&mut r, w, options.passes, progress)?)
        }
        Made::Async(u) => {
            let mut r = B::build(u, w, options).map_err(RunError::Unsupported)?;
            Ok(replay(&mut r, w, options.passes, progress)?)
        }
    }
}

/// Gives the calling thread a non-blocking CUDA stream of its own (none if
/// the driver refuses one: the legacy default stream then).
fn set_stream(device: Device) {
    let stream = CudaStream::with_options(device, StreamOptions { non_blocking: true, priority: 0 }).ok();
    STREAM.with(|s| *s.borrow_mut() = stream);
}

/// Each replaying thread's setup: a non-blocking CUDA stream of its own.
pub(crate) fn per_thread_stream(device: Device) -> impl Fn(usize) + Sync {
    move |_| set_stream(device)
}

/// The calling thread's own stream while it lives; back to none after
/// (declared before the resource, so dropped after it).
pub(crate) struct OwnStream;

impl OwnStream {
    pub(crate) fn new(device: Device) -> OwnStream {
        set_stream(device);
        OwnStream
    }
}

impl Drop for OwnStream {
    fn drop(&mut self) {
        STREAM.with(|s| s.borrow_mut().take());
    }
}

/// Replays on [`RunOptions::threads`] threads, each on its own CUDA stream,
/// through one resource built by `B` over the CUDA upstream.
///
/// # Errors
///
/// As [`run`].
pub fn run_shared<B: BuildShared>(w: &Workload, options: &RunOptions) -> Result<Measurement, RunError> {
    let device = device()?;
    let _stream = OwnStream::new(device); // the warm-up's, on this thread
    let threads = options.threads.unwrap_or(1);
    let world = SimWorld::new();
    let streams: Vec<SimStream> = (0..threads).map(|_| world.non_blocking_stream()).collect();
    let setup = per_thread_stream(device);
    match make(options.upstream, device)? {
        Made::Cuda(u) => {
            let r = B::build_shared(u, w, options).map_err(RunError::Unsupported)?;
            Ok(replay_threads(&r, streams, w, options.passes, &setup, |r| B::peak(r))?)
        }
        Made::Async(u) => {
            let r = B::build_shared(u, w, options).map_err(RunError::Unsupported)?;
            Ok(replay_threads(&r, streams, w, options.passes, &setup, |r| B::peak(r))?)
        }
    }
}

/// Replays straight into a plain CUDA resource (`--resource cuda` or
/// `--resource async`), on one thread or on `--streams` threads.
///
/// # Errors
///
/// As [`run`].
pub fn run_plain(
    kind: UpstreamKind,
    w: &Workload,
    options: &RunOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<Measurement, RunError> {
    let device = device()?;
    let _stream = OwnStream::new(device);
    match make(kind, device)? {
        Made::Cuda(u) => plain(u, device, w, options, progress),
        Made::Async(u) => plain(u, device, w, options, progress),
    }
}

fn plain<U: Upstream>(
    u: U,
    device: Device,
    w: &Workload,
    options: &RunOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<Measurement, RunError> {
    match options.threads {
        None => {
            let mut r =
                crate::resources::RefReplayer::new(crate::resources::Owned(u), |u| u.0.peak_held_bytes());
            Ok(replay(&mut r, w, options.passes, progress)?)
        }
        Some(k) => {
            let world = SimWorld::new();
            let streams: Vec<SimStream> = (0..k).map(|_| world.non_blocking_stream()).collect();
            let setup = per_thread_stream(device);
            Ok(replay_threads(&u, streams, w, options.passes, &setup, |u| u.peak_held_bytes())?)
        }
    }
}

/// Registers the `cuda` and `async` leaves of a stack replayed with
/// `--upstream cuda|async`: the CUDA resources of device 0, each under a
/// statistics adaptor and reached on the replaying thread's CUDA stream
/// whatever stream the stack passes, as the upstreams of the `--resource`
/// rows are. Returns the device.
///
/// # Errors
///
/// No device.
pub fn register_stack_leaves(builder: &mut StackBuilder<SimStream>) -> Result<Device, RunError> {
    let device = device()?;
    builder.register("async", move |call, cx| {
        call.expect_args(0, &[])?;
        let mr = CudaAsyncMemory::new(device).map_err(|e| call.error(StackErrorKind::Resource(e)))?;
        Ok(cx.keep(call, CudaUpstream::new(mr)))
    });
    builder.register("cuda", move |call, cx| {
        call.expect_args(0, &[])?;
        let mr = CudaMemory::new(device).map_err(|e| call.error(StackErrorKind::Resource(e)))?;
        Ok(cx.keep(call, CudaUpstream::new(mr)))
    });
    Ok(device)
}

/// The peak of the outermost CUDA leaf of a built stack, if it has one.
pub fn stack_leaf_peak(built: &Built<SimStream>) -> Option<Box<dyn Fn() -> u64>> {
    if let Some(leaf) = built.get::<CudaUpstream<CudaAsyncMemory>>("async") {
        return Some(Box::new(move || leaf.peak_held_bytes()));
    }
    let leaf = built.get::<CudaUpstream<CudaMemory>>("cuda")?;
    Some(Box::new(move || leaf.peak_held_bytes()))
}
