//! The CUDA upstreams (feature `cuda`): the `cuda` (`cuMemAlloc`,
//! [`CudaMemory`]) and `async` (`cuMemAllocAsync`, [`CudaAsyncMemory`])
//! leaves of the stacks replayed with `--upstream cuda|async` (the
//! `--resource` aliases and `--stack`s alike), and the plain CUDA resources
//! as rows of their own (`--resource cuda`, `--resource async`).
//!
//! The upstream sits under a [`Statistics`] adaptor, whose peak is the
//! row's peak upstream (as RMM's harness puts `statistics_resource_adaptor`
//! over its upstream). Every replaying thread makes a non-blocking
//! [`CudaStream`] of its own and every upstream call of that thread goes to
//! it, as in RMM's harness (whose single thread also replays on a
//! non-blocking stream).

use crate::replay::Measurement;
use crate::resources::{RunError, RunOptions, UpstreamKind};
use crate::stack::Replay;
use crate::typed::{Runner, Shape, Upstream};
use crate::workload::Workload;
use memres_core::adaptor::Statistics;
use memres_core::check::Violation;
use memres_core::stack::{Built, Call, StackBuilder, StackError};
use memres_core::{Block, Inspect, MemoryResource, Request, Stream, Usage};
use memres_cuda::stack::async_config;
use memres_cuda::{CudaAsyncMemory, CudaMemory, CudaStream, Device, StreamOptions};
use memres_sim::{SimStream, SimWorld};
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
        f.debug_struct("CudaUpstream").field("bytes", &self.inner.get_bytes_counter()).finish_non_exhaustive()
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

impl<R> Upstream for CudaUpstream<R> where
    R: MemoryResource<CudaStream> + MemoryResource<()> + Send + Sync + 'static
{
}

/// A leaf: what the statistics adaptor counts is what it holds.
impl<R> Inspect for CudaUpstream<R> {
    fn usage(&self) -> Usage {
        let bytes = self.inner.get_bytes_counter();
        Usage::leaf(bytes.value.max(0) as u64, bytes.peak.max(0) as u64)
    }

    fn check(&self) -> Result<(), Violation> {
        Ok(())
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
    let world = SimWorld::new();
    let setup = per_thread_stream(device);
    let runner = Replay { workload: w, options, progress, world: &world, setup: &setup };
    runner.run_ref(u, |u| u.usage().peak_held, |_| None)
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
        let config = async_config(call)?;
        let mr = CudaAsyncMemory::with_config(device, config).map_err(|e| call.resource_error(e))?;
        Ok(cx.keep(call, CudaUpstream::new(mr)))
    });
    builder.register("cuda", move |call, cx| {
        call.expect_args(0, &[])?;
        let mr = CudaMemory::new(device).map_err(|e| call.resource_error(e))?;
        Ok(cx.keep(call, CudaUpstream::new(mr)))
    });
    Ok(device)
}

/// Builds a typed shape over the CUDA leaf of `leaf` (built alone by the
/// builder) and hands it to `runner`.
///
/// # Errors
///
/// As [`Shape::run`].
pub(crate) fn run_typed<K: Runner>(
    shape: Shape<'_>,
    call: &Call,
    leaf: &Built<SimStream>,
    stream: &SimStream,
    runner: K,
) -> Result<K::Output, StackError> {
    if let Some(u) = leaf.get::<CudaUpstream<CudaAsyncMemory>>("async") {
        return shape.run(call, u, stream, runner);
    }
    let u = leaf.get::<CudaUpstream<CudaMemory>>("cuda").expect("the tool's cuda leaf");
    shape.run(call, u, stream, runner)
}

/// How many `cuda` and `async` leaves a built stack has.
pub fn stack_leaf_count(built: &Built<SimStream>) -> usize {
    built.all::<CudaUpstream<CudaAsyncMemory>>("async").len()
        + built.all::<CudaUpstream<CudaMemory>>("cuda").len()
}

/// The peak of the outermost CUDA leaf of a built stack, if it has one.
pub fn stack_leaf_peak(built: &Built<SimStream>) -> Option<Box<dyn Fn() -> u64 + Send + Sync>> {
    if let Some(leaf) = built.get::<CudaUpstream<CudaAsyncMemory>>("async") {
        return Some(Box::new(move || leaf.usage().peak_held));
    }
    let leaf = built.get::<CudaUpstream<CudaMemory>>("cuda")?;
    Some(Box::new(move || leaf.usage().peak_held))
}
