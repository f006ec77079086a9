//! Replays through a stack built from its text by
//! [`memres_sim::StackBuilder`] (`memres replay --stack 'stats(binning(pool(sim)))'`).
//!
//! The stack is built for [`SimStream`]s: one per stream of the workload on
//! one thread, one per thread with `--streams`. Its peak upstream is the
//! peak of its leaf: the outermost `sim` or `host` device, else a `vpool`'s
//! peak committed bytes.
//!
//! A `log` layer records only the first timed pass (the warm-up and later
//! passes go straight to its upstream), so that the log of a replay replays
//! to the same table: the same ops, peak live and footprint.

use crate::replay::{replay_threads, Measurement, Replayer};
use crate::resources::{RunError, RunOptions, UpstreamKind};
use crate::workload::Workload;
use memres_core::stack::StackErrorKind;
use memres_core::vpool::VirtualPool;
use memres_core::{Block, DynResource, Error, MemoryResource, Request, Shared};
use memres_sim::{HostMemory, Logging, SimAddressSpace, SimDevice, SimStream, SimWorld, StackBuilder};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A logging layer that logs only while switched on.
pub struct Gated<S: ?Sized> {
    log: Logging<DynResource<S>>,
    on: AtomicBool,
}

impl<S: ?Sized> fmt::Debug for Gated<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gated").field("on", &self.on).finish_non_exhaustive()
    }
}

impl<S: ?Sized> Gated<S> {
    /// Logs from now on (`true`) or stops logging.
    pub fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
        let _ = self.log.flush();
    }
}

impl<S: memres_core::Stream + ?Sized> MemoryResource<S> for Gated<S> {
    fn allocate(&self, request: Request, stream: &S) -> memres_core::Result<Block> {
        if self.on.load(Ordering::Relaxed) {
            self.log.allocate(request, stream)
        } else {
            self.log.upstream().allocate(request, stream)
        }
    }

    fn deallocate(&self, block: Block, stream: &S) -> memres_core::Result<()> {
        if self.on.load(Ordering::Relaxed) {
            self.log.deallocate(block, stream)
        } else {
            self.log.upstream().deallocate(block, stream)
        }
    }
}

impl<S: ?Sized> Drop for Gated<S> {
    fn drop(&mut self) {
        let _ = self.log.flush();
    }
}

/// The builder the tool uses: the standard names, with `log` switched by
/// the replay (see the module's documentation).
pub fn builder() -> StackBuilder<SimStream> {
    let mut b = StackBuilder::<SimStream>::new();
    b.register_stream_layer();
    b.register("log", |call, cx| {
        call.expect_args(1, &["file"])?;
        let file = call.keyed("file").ok_or_else(|| call.error(StackErrorKind::MissingArg("file=")))?;
        let upstream = cx.upstream(call, 0)?;
        let path = file.text()?;
        let log = Logging::to_file(upstream, path).map_err(|e| {
            memres_core::stack::StackError::new(
                file.pos(),
                StackErrorKind::Io(format!("cannot log to `{path}`: {e}")),
            )
        })?;
        Ok(cx.keep(call, Gated { log, on: AtomicBool::new(false) }))
    });
    b
}

/// A built stack as the replay loop sees it.
pub struct StackReplayer {
    resource: DynResource<SimStream>,
    streams: Vec<SimStream>,
    logs: Vec<Arc<Gated<SimStream>>>,
    peak: Box<dyn Fn() -> u64>,
}

impl fmt::Debug for StackReplayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackReplayer").field("streams", &self.streams.len()).finish_non_exhaustive()
    }
}

impl Replayer for StackReplayer {
    type Handle = Block;

    fn vacant(&self) -> Block {
        Block::EMPTY
    }

    #[inline]
    fn allocate(&mut self, size: u64, stream: u16) -> Result<Block, Error> {
        self.resource.allocate(Request::new(size)?, &self.streams[stream as usize])
    }

    #[inline]
    fn deallocate(&mut self, block: Block, _size: u64, stream: u16) -> Result<(), Error> {
        self.resource.deallocate(block, &self.streams[stream as usize])
    }

    fn peak_upstream(&self) -> u64 {
        (self.peak)()
    }

    fn begin_pass(&mut self, pass: usize) {
        // Pass 0 is the warm-up: log pass 1 only.
        for log in &self.logs {
            log.set(pass == 1);
        }
    }
}

/// Builds `text` and replays `workload` through it as `options` say.
/// `--upstream sim` (the default) leaves the leaves to the stack;
/// `--upstream cuda|async` (feature `cuda`) makes its `cuda` and `async`
/// leaves the CUDA resources, reached on each replaying thread's own CUDA
/// stream (the `cuda` module, with the feature); `--upstream host` does
/// not apply.
///
/// # Errors
///
/// [`RunError::Unsupported`] for a stack that does not build (with the
/// position of the fault) or has no leaf whose peak can be read, or an
/// upstream that does not apply; an op's failure.
pub fn run_stack(
    text: &str,
    workload: &Workload,
    options: &RunOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<Measurement, RunError> {
    let mut builder = builder();
    let cuda = cuda_leaves(&mut builder, options)?;
    let world = SimWorld::new();
    let build_stream = world.default_stream();
    let built = builder
        .build_with_handles(text, &build_stream)
        .map_err(|e| RunError::Unsupported(format!("stack `{text}`: {e}")))?;
    let peak: Box<dyn Fn() -> u64> = if let Some(sim) = built.get::<SimDevice>("sim") {
        Box::new(move || sim.peak_held_bytes())
    } else if let Some(host) = built.get::<HostMemory>("host") {
        Box::new(move || host.peak_held_bytes())
    } else if let Some(v) = built.get::<Shared<VirtualPool<SimAddressSpace>>>("vpool") {
        Box::new(move || v.with(|v| v.peak_committed_bytes()))
    } else if let Some(peak) = cuda.as_ref().and_then(|_| cuda_peak(&built)) {
        peak
    } else {
        return Err(RunError::Unsupported(format!(
            "stack `{text}` has no sim, host or vpool leaf (or cuda or async, with --upstream cuda|async) \
             whose peak the tool can read"
        )));
    };
    let logs = built.all::<Gated<SimStream>>("log");
    match options.threads {
        None => {
            let _stream = cuda.map(own_stream);
            let streams = (0..workload.streams.max(1)).map(|_| world.stream()).collect();
            let mut r = StackReplayer { resource: built.resource.clone(), streams, logs, peak };
            Ok(crate::replay::replay(&mut r, workload, options.passes, progress)?)
        }
        Some(k) => {
            if !logs.is_empty() {
                return Err(RunError::Unsupported(
                    "a stack with `log` replays on one thread only (its log is the replay's op sequence)"
                        .into(),
                ));
            }
            let _stream = cuda.map(own_stream); // the warm-up's, on this thread
            let streams = (0..k.max(1)).map(|_| world.non_blocking_stream()).collect();
            let setup = thread_setup(cuda);
            Ok(replay_threads(&built.resource, streams, workload, options.passes, &*setup, |_| peak())?)
        }
    }
}

/// The CUDA device whose resources are the stack's `cuda` and `async`
/// leaves, with `--upstream cuda|async`; `None` with `--upstream sim`.
#[cfg(feature = "cuda")]
type CudaLeaves = Option<memres_cuda::Device>;
#[cfg(not(feature = "cuda"))]
type CudaLeaves = Option<std::convert::Infallible>;

fn cuda_leaves(builder: &mut StackBuilder<SimStream>, options: &RunOptions) -> Result<CudaLeaves, RunError> {
    match options.upstream {
        UpstreamKind::Sim => Ok(None),
        UpstreamKind::Host => Err(RunError::Unsupported(
            "--upstream host does not apply to a stack: its leaf names the upstream".into(),
        )),
        #[cfg(feature = "cuda")]
        UpstreamKind::Cuda | UpstreamKind::Async => crate::cuda::register_stack_leaves(builder).map(Some),
        #[cfg(not(feature = "cuda"))]
        UpstreamKind::Cuda | UpstreamKind::Async => {
            let _ = builder;
            Err(RunError::Unsupported(format!(
                "--upstream {} needs the tool built with `--features cuda`",
                options.upstream
            )))
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_peak(built: &memres_sim::Built<SimStream>) -> Option<Box<dyn Fn() -> u64>> {
    crate::cuda::stack_leaf_peak(built)
}

#[cfg(not(feature = "cuda"))]
fn cuda_peak(_: &memres_sim::Built<SimStream>) -> Option<Box<dyn Fn() -> u64>> {
    None
}

/// The replaying thread's own CUDA stream while the guard lives.
#[cfg(feature = "cuda")]
fn own_stream(device: memres_cuda::Device) -> impl Drop {
    crate::cuda::OwnStream::new(device)
}

#[cfg(not(feature = "cuda"))]
fn own_stream(never: std::convert::Infallible) -> std::convert::Infallible {
    never
}

/// Each replaying thread's setup: its own CUDA stream with CUDA leaves.
#[cfg(feature = "cuda")]
fn thread_setup(cuda: CudaLeaves) -> Box<dyn Fn(usize) + Sync> {
    match cuda {
        Some(device) => Box::new(crate::cuda::per_thread_stream(device)),
        None => Box::new(|_| {}),
    }
}

#[cfg(not(feature = "cuda"))]
fn thread_setup(_: CudaLeaves) -> Box<dyn Fn(usize) + Sync> {
    Box::new(|_| {})
}
