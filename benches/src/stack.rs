//! Replays through a stack described by its text
//! (`memres replay --stack 'stats(binning(pool(sim)))'`, and every
//! `--resource` name but the peers and the plain CUDA rows, which are
//! aliases of stack strings).
//!
//! The stack is built by the core's builder with `memres-sim`'s leaves
//! (`sim`, `host`, `vpool`), the stream layer `stream`, and with
//! `--upstream cuda|async` the tool's `cuda` and `async` leaves (the
//! `cuda` module, feature `cuda`). A stack of one of the shapes the tool
//! compares (a pool, a pool under statistics or the stream layer, fixed,
//! binning, arena over a leaf, a virtual pool) is built typed instead, with
//! the same readers of its arguments ([`crate::typed`]), so that its ops are
//! direct calls. Either way each op runs on the simulated stream of its
//! workload stream on one thread, on the thread's own stream with
//! `--streams`.
//!
//! Its peak upstream is the peak of its leaves: what its `sim` and `host`
//! devices held together (counted in one gauge they share), else a
//! `vpool`'s peak committed bytes, else a CUDA leaf's; a `vpool` beside
//! another leaf is refused. Its upstream allocations per timed pass are
//! those of its `sim` and `host` devices, else the commits (maps) of its
//! `vpool`'s space, on one thread; with no such leaf, or on threads, they
//! are not counted.
//!
//! A `log` layer records only the first timed pass (the warm-up and later
//! passes go straight to its upstream), so that the log of a replay replays
//! to the same table: the same ops, peak live and footprint; under
//! [`run_steps`], its one pass. A run builds
//! a stack several times (each workload's replay, the map's, the
//! timeline's, the snapshot's): the first build in the process that logs
//! to a file (under any name, a hard link included) makes it anew, the
//! later ones append to it, so that it holds
//! every row of the run, each workload's pass in turn, under one header.
//! The check of the stacks before a run opens no file, so that a run
//! refused for bad usage leaves it as it was.

use crate::paths::{file_id, FileId};
use crate::replay::{
    free_held, replay, replay_threads, run_ops, table, DefaultStream, Measurement, Owned, Replayer,
    StreamReplayer, TableOf,
};
use crate::resources::{RunError, RunOptions, UpstreamKind};
use crate::typed::{fixed_misfit, run_typed, Runner};
use crate::workload::Workload;
use memres_core::adaptor::{Gauge, Logging};
use memres_core::per_stream::{PerStreamPool, VirtualMaker};
use memres_core::planned::Planned;
use memres_core::stack::{
    arena_config, fixed_block_size, log_file, parse, Built, Call, StackBuilder, StackError, StackErrorKind,
    Value,
};
use memres_core::vpool::VirtualPool;
use memres_core::{Block, DynResource, Inspect, MemoryResource, MemoryResourceMut, Request, Shared};
use memres_sim::{HostMemory, SimAddressSpace, SimDevice, SimStream, SimWorld};
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A `vpool(..., per_stream=true)`: a virtual pool per stream over one space.
type VirtualPools = Shared<PerStreamPool<VirtualMaker<Arc<SimAddressSpace>>, SimStream>>;

/// A logging layer that logs only while switched on.
pub struct Gated<S: ?Sized> {
    log: Logging<DynResource<S>>,
    on: AtomicBool,
    /// The file it logs to, as the stack names it.
    file: String,
    /// The first error of a flush: rows lost, said by [`Gated::finish`].
    failed: Mutex<Option<std::io::Error>>,
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
        self.flush();
    }

    /// Flushes the log, keeping its first error.
    fn flush(&self) {
        if let Err(e) = self.log.flush() {
            self.failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
        }
    }

    /// Flushes the log: an error if any row of it may not have been
    /// written.
    ///
    /// # Errors
    ///
    /// [`RunError::Output`] naming the file and what was lost.
    pub fn finish(&self) -> Result<(), RunError> {
        self.flush();
        match self.failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
            None => Ok(()),
            Some(e) => Err(RunError::Output(format!("the log of `{}` is not whole: {e}", self.file))),
        }
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

/// The builder the tool uses: the core's names, `memres-sim`'s leaves and
/// the stream layer, with `log` switched by the replay (see the module's
/// documentation).
pub fn builder() -> StackBuilder<SimStream> {
    let mut b = memres_sim::builder::<SimStream>();
    b.register_stream_layer();
    b.register("log", |call, cx| {
        let file = log_file(call)?;
        let log = open_run_log(file, cx.upstream(call, 0)?)?;
        let (file, on, failed) = (file.text()?.to_owned(), AtomicBool::new(false), Mutex::new(None));
        Ok(cx.keep(call, Gated { log, on, file, failed }))
    });
    b
}

/// The files a `log` layer opened in this process, under any name (two
/// stacks may log to two hard links of one file).
static LOGGED: Mutex<BTreeSet<FileId>> = Mutex::new(BTreeSet::new());

/// Logging over `upstream` to the file named by `file`: made anew by the
/// first build of the process that logs to it, appended to by the later
/// ones (see the module's documentation).
fn open_run_log<R>(file: &Value, upstream: R) -> Result<Logging<R>, StackError> {
    let path = file.text()?;
    let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    let seen = file_id(Path::new(path)).is_some_and(|id| logged.contains(&id));
    let opened =
        if seen { Logging::append_to_file(upstream, path) } else { Logging::to_file(upstream, path) };
    let fail = |e| StackError::new(file.pos(), StackErrorKind::Io(format!("cannot log to `{path}`: {e}")));
    let log = opened.map_err(fail)?;
    if let Some(id) = file_id(Path::new(path)) {
        logged.insert(id);
    }
    Ok(log)
}

/// Checks that `path` can be logged to, leaving it as it was
/// ([`crate::paths::check_writable`]).
fn check_log_path(file: &Value) -> Result<(), StackError> {
    let path = Path::new(file.text()?);
    crate::paths::check_writable(path).map_err(|e| {
        StackError::new(file.pos(), StackErrorKind::Io(format!("cannot log to `{}`: {e}", path.display())))
    })
}

/// What [`check_stack`] found of a stack.
#[derive(Clone, Debug, Default)]
pub struct Checked {
    /// The files its `log` layers write.
    pub logs: Vec<PathBuf>,
    /// Whether `--timeline`, `--snapshot` and `--map` can watch it: it has
    /// a `sim` or `host` leaf (a `vpool` maps granules of its own space).
    pub watched: bool,
    /// The name of a layer that makes it replay on one thread only
    /// (`log`, `planned`), if it has one.
    pub one_thread: Option<&'static str>,
}

/// Builds `text` once to check it, before anything is replayed: its names,
/// keys and values. `cuda` and `async` leaves are known (as stand-ins that
/// hold nothing) only with `--upstream cuda|async`.
///
/// # Errors
///
/// The message of [`crate::names::explain`]: the fault's position, and
/// for an unknown name or key the valid ones and the nearest.
pub fn check_stack(text: &str, upstream: UpstreamKind) -> Result<Checked, String> {
    let mut b = builder();
    let logs = Arc::new(Mutex::new(Vec::new()));
    let seen = logs.clone();
    // Checked, not opened: a run refused later leaves the file as it was.
    b.register("log", move |call, cx| {
        let file = log_file(call)?;
        check_log_path(file)?;
        seen.lock().unwrap_or_else(|p| p.into_inner()).push(PathBuf::from(file.text()?));
        cx.upstream(call, 0)
    });
    if upstream.is_cuda() {
        for leaf in ["cuda", "async"] {
            b.register(leaf, |call, cx| {
                call.expect_args(0, &[])?;
                Ok(cx.keep(call, memres_core::stack::Unbacked::new()))
            });
        }
    }
    let world = SimWorld::new();
    let built = parse(text)
        .and_then(|call| b.build_call_with_handles(&call, &world.default_stream()))
        .map_err(|e| crate::names::explain(text, &e))?;
    let watched = built.get::<SimDevice>("sim").is_some() || built.get::<HostMemory>("host").is_some();
    let logs = std::mem::take(&mut *logs.lock().unwrap_or_else(|p| p.into_inner()));
    // As `run_stack` refuses them with `--streams`.
    let one_thread = if !logs.is_empty() {
        Some("log")
    } else if !built.all::<Planned<DynResource<SimStream>>>("planned").is_empty() {
        Some("planned")
    } else {
        None
    };
    Ok(Checked { logs, watched, one_thread })
}

/// Whether `text` can replay on `threads` threads (`--streams`), each on a
/// stream of its own: each `arena` layer needs a slot of its table of
/// arenas for each stream with blocks live, and gives a stream that finds
/// none [`memres_core::Error::CapacityExhausted`]. With more threads than
/// slots, whether a replay fails would depend on how the threads happen
/// to overlap.
///
/// # Errors
///
/// The first arena with fewer slots than `threads`, and what to name
/// instead. A text that does not parse passes: the build says why.
///
/// ```
/// use memres_bench::stack::check_threads;
/// assert!(check_threads("arena(sim)", 64).is_ok());
/// assert!(check_threads("stats(arena(sim))", 65).is_err());
/// assert!(check_threads("arena(sim, max_arenas=100)", 100).is_ok());
/// ```
pub fn check_threads(text: &str, threads: u32) -> Result<(), String> {
    fn first_short(call: &Call, threads: u32) -> Option<(usize, u32)> {
        let slots = match call.name.as_str() {
            "arena" => arena_config(call).map_or(u32::MAX, |c| c.slots()),
            _ => u32::MAX,
        };
        if slots < threads {
            return Some((call.pos, slots));
        }
        call.args.iter().find_map(|a| match &a.value {
            Value::Call(inner) => first_short(inner, threads),
            Value::Word { .. } => None,
        })
    }
    let Some((pos, slots)) = parse(text).ok().and_then(|call| first_short(&call, threads)) else {
        return Ok(());
    };
    let most = memres_core::arena::MAX_ARENAS;
    let fix = if threads <= most {
        format!("replay it with `max_arenas={threads}` through --stack")
    } else {
        format!("an arena has at most {most}")
    };
    Err(format!(
        "the `arena` at byte {pos} of `{text}` has {slots} slots for streams with blocks live, fewer than \
         --streams {threads}: a stream that finds none fails; {fix}"
    ))
}

/// Builds `text` and replays `workload` through it as `options` say:
/// typed for the shapes of [`crate::typed`], else as the core's builder
/// builds it. `--upstream cuda|async` (feature `cuda`) makes its `cuda` and
/// `async` leaves the CUDA resources, reached on each replaying thread's own
/// CUDA stream; `sim` and `host` are there whatever the upstream.
///
/// # Errors
///
/// [`RunError::Unsupported`] for a stack that does not build (with the
/// position of the fault) or has no leaf whose peak can be read, or an
/// upstream that is not built in; an op's failure.
pub fn run_stack(
    text: &str,
    workload: &Workload,
    options: &RunOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<Measurement, RunError> {
    let fail = |e: StackError| RunError::Unsupported(format!("stack `{text}`: {e}"));
    let call = parse(text).map_err(fail)?;
    let mut builder = builder();
    let cuda = cuda_leaves(&mut builder, options)?;
    let world = SimWorld::new();
    let build_stream = world.default_stream();
    let setup = thread_setup(cuda);
    let _stream = cuda.map(own_stream); // the calling thread's, for the warm-up
    let runner = Replay { workload, options, progress, world: &world, setup: &*setup };
    if call.name == "fixed" {
        if let Some(misfit) = fixed_block_size(&call).ok().and_then(|block| fixed_misfit(block, workload)) {
            return Err(RunError::Unsupported(misfit));
        }
    }
    let runner = match run_typed(&call, &builder, &build_stream, runner).map_err(fail)? {
        Ok(typed) => return typed,
        Err(runner) => runner,
    };
    let (built, gauge) = build_summed(&mut builder, &call, &build_stream).map_err(fail)?;
    let (peak, counted) = leaf_figures(&built, cuda.is_some(), gauge)
        .map_err(|e| RunError::Unsupported(format!("stack `{text}` {e}")))?
        .ok_or_else(|| {
            RunError::Unsupported(format!(
                "stack `{text}` has no sim, host or vpool leaf (or cuda or async, with --upstream cuda|async) \
                 whose peak the tool can read"
            ))
        })?;
    let logs = built.all::<Gated<SimStream>>("log");
    if options.threads.is_some() && !logs.is_empty() {
        return Err(RunError::Unsupported(
            "a stack with `log` replays on one thread only (its log is the replay's op sequence)".into(),
        ));
    }
    let planned = built.all::<Planned<DynResource<SimStream>>>("planned");
    if options.threads.is_some() && !planned.is_empty() {
        return Err(RunError::Unsupported(
            "a stack with `planned` replays on one thread only (its steps are the replay's passes)".into(),
        ));
    }
    let finish = logs.clone();
    let on_pass = move |pass: usize, streams: &Vec<SimStream>| {
        // Pass 0 is the warm-up: log pass 1 only.
        for log in &logs {
            log.set(pass == 1);
        }
        // Each pass is one step, on the stream of the workload's stream 0;
        // a step that cannot take its region runs unplanned.
        for p in &planned {
            let _ = p.step(&streams[0]);
        }
    };
    let measured = runner.run(Owned(built.resource), move |_| peak(), move |_| counted(), on_pass)?;
    for log in &finish {
        log.finish()?;
    }
    Ok(measured)
}

/// Reads the most bytes a leaf held at once.
type PeakOf = Box<dyn Fn() -> u64 + Send + Sync>;
/// Reads the allocations a leaf has served so far, where it counts them.
type AllocationsOf = Box<dyn Fn() -> Option<u64> + Send + Sync>;

/// A `sim` or `host` leaf that counts the bytes it holds in a gauge every
/// such leaf of the stack shares: the peak of what several leaves hold
/// together, which a sum of each one's peak is not (they need not peak at
/// once). Counted as the leaves count them, each block rounded up to 256
/// bytes.
struct Summed {
    leaf: DynResource<SimStream>,
    gauge: Arc<Gauge>,
}

impl Summed {
    /// What `sim` and `host` hold for a block of `size` bytes.
    fn held(size: u64) -> u64 {
        size.next_multiple_of(256)
    }
}

impl MemoryResource<SimStream> for Summed {
    fn allocate(&self, request: Request, stream: &SimStream) -> memres_core::Result<Block> {
        let block = self.leaf.allocate(request, stream)?;
        self.gauge.add(Self::held(block.size()));
        Ok(block)
    }

    fn deallocate(&self, block: Block, stream: &SimStream) -> memres_core::Result<()> {
        self.leaf.deallocate(block, stream)?;
        self.gauge.sub(Self::held(block.size()));
        Ok(())
    }
}

/// Builds `call`, and where it has several `sim` and `host` leaves builds
/// it again with them counting in one gauge ([`sum_leaves`]), which it
/// returns: the gauge is an atomic add on every leaf call, kept out of the
/// time of the stacks that do not need it.
fn build_summed(
    builder: &mut StackBuilder<SimStream>,
    call: &Call,
    stream: &SimStream,
) -> Result<(Built<SimStream>, Option<Arc<Gauge>>), StackError> {
    let built = builder.build_call_with_handles(call, stream)?;
    if built.all::<SimDevice>("sim").len() + built.all::<HostMemory>("host").len() < 2 {
        return Ok((built, None));
    }
    drop(built);
    let gauge = sum_leaves(builder);
    Ok((builder.build_call_with_handles(call, stream)?, Some(gauge)))
}

/// Makes the `sim` and `host` leaves of what `builder` builds count in one
/// gauge ([`Summed`]), which it returns. Each leaf is kept as its own type
/// still (and numbered as before: the wrapper is not kept).
fn sum_leaves(builder: &mut StackBuilder<SimStream>) -> Arc<Gauge> {
    let gauge = Arc::new(Gauge::default());
    for name in ["sim", "host"] {
        let leaves = memres_sim::builder::<SimStream>();
        let gauge = gauge.clone();
        builder.register(name, move |call, cx| {
            let leaf = cx.build_with(&leaves, call)?;
            Ok(Arc::new(Summed { leaf, gauge: gauge.clone() }) as DynResource<SimStream>)
        });
    }
    gauge
}

/// What a row reads of a built stack's leaves: the peak upstream of its
/// `sim` or `host` leaf (of several, the peak of what they held together,
/// from `gauge`, in which [`sum_leaves`] made them count: given where the
/// stack has several), else of its
/// `vpool` (one, or one per stream over one space), else (with CUDA
/// leaves) of its CUDA leaf; and the allocations made from them, which
/// `sim` and `host` count, and a `vpool` as the commits (maps) of its
/// space.
///
/// # Errors
///
/// A stack whose leaves share no gauge: a `vpool` beside another leaf.
fn leaf_figures(
    built: &Built<SimStream>,
    cuda: bool,
    gauge: Option<Arc<Gauge>>,
) -> Result<Option<(PeakOf, AllocationsOf)>, String> {
    let uncounted: AllocationsOf = Box::new(|| None);
    let (sims, hosts) = (built.all::<SimDevice>("sim"), built.all::<HostMemory>("host"));
    let single = built.all::<Shared<VirtualPool<SimAddressSpace>>>("vpool");
    let per_stream = built.all::<VirtualPools>("vpool");
    let (leaves, vpools) = (sims.len() + hosts.len(), single.len() + per_stream.len());
    readable_together(leaves, vpools, if cuda { cuda_leaf_count(built) } else { 0 })?;
    Ok(if let Some(gauge) = gauge {
        let counts = move || {
            Some(sims.iter().map(|s| s.call_counts().0).chain(hosts.iter().map(|h| h.call_counts().0)).sum())
        };
        Some((Box::new(move || gauge.peak()), Box::new(counts)))
    } else if let Some(sim) = sims.into_iter().next() {
        let counts = sim.clone();
        Some((Box::new(move || sim.usage().peak_held), Box::new(move || Some(counts.call_counts().0))))
    } else if let Some(host) = hosts.into_iter().next() {
        let counts = host.clone();
        Some((Box::new(move || host.usage().peak_held), Box::new(move || Some(counts.call_counts().0))))
    } else if let Some(v) = single.into_iter().next() {
        let counts = v.clone();
        Some((
            Box::new(move || v.with(|v| v.usage().peak_held)),
            Box::new(move || Some(counts.with(|v| v.space().call_counts().0))),
        ))
    } else if let Some(v) = per_stream.into_iter().next() {
        let counts = v.clone();
        Some((
            Box::new(move || v.with(|v| v.usage().peak_held)),
            Box::new(move || Some(counts.with(|v| v.maker().space().call_counts().0))),
        ))
    } else if cuda {
        cuda_peak(built).map(|peak| (peak, uncounted))
    } else {
        None
    })
}

/// Refuses a stack whose leaves' peak together cannot be read: a `vpool`
/// or a CUDA leaf beside another leaf. Each of those counts its bytes
/// alone, so what it and another leaf held at once is nowhere to read, and
/// one leaf's peak alone was a footprint too low. `sim` and `host` leaves
/// count together ([`sum_leaves`]).
fn readable_together(sims_and_hosts: usize, vpools: usize, cudas: usize) -> Result<(), String> {
    let all = sims_and_hosts + vpools + cudas;
    for (count, what) in [(vpools, "vpool"), (cudas, "cuda or async")] {
        if count > 0 && all > 1 {
            return Err(format!(
                "has {all} leaves, {count} of them {what}: the tool reads the peak of several leaves \
                 only where they are sim or host"
            ));
        }
    }
    Ok(())
}

/// Replays a resource as the options say: on one thread, each op on the
/// simulated stream of its workload stream; on `--streams K` threads, each
/// on its own stream, through the resource shared.
pub(crate) struct Replay<'a> {
    pub(crate) workload: &'a Workload,
    pub(crate) options: &'a RunOptions,
    pub(crate) progress: &'a mut dyn FnMut(usize),
    pub(crate) world: &'a SimWorld,
    /// Run first on each replaying thread (its own CUDA stream).
    pub(crate) setup: &'a (dyn Fn(usize) + Sync),
}

impl Replay<'_> {
    /// Replays a `&self` resource (shared as it is), telling `on_pass` of
    /// each pass of a one-thread replay; its upstream allocations are
    /// counted on one thread only.
    fn run<R>(
        self,
        resource: Owned<R>,
        peak: impl Fn(&R) -> u64 + 'static,
        upstream_allocations: impl Fn(&R) -> Option<u64> + 'static,
        on_pass: impl FnMut(usize, &Vec<SimStream>) + 'static,
    ) -> Result<Measurement, RunError>
    where
        R: MemoryResource<SimStream> + Sync,
    {
        let (w, passes) = (self.workload, self.options.passes);
        match self.options.threads {
            None => {
                let streams: Vec<_> = (0..w.streams.max(1)).map(|_| self.world.stream()).collect();
                let mut r = StreamReplayer::new(resource, streams, move |o| peak(&o.0))
                    .upstream_allocations(move |o| upstream_allocations(&o.0))
                    .on_pass(on_pass);
                Ok(replay(&mut r, w, passes, self.progress)?)
            }
            Some(k) => {
                let streams = (0..k.max(1)).map(|_| self.world.non_blocking_stream()).collect();
                Ok(replay_threads(&resource.0, streams, w, passes, self.setup, peak)?)
            }
        }
    }
}

impl Runner for Replay<'_> {
    type Output = Result<Measurement, RunError>;

    fn shared(&self) -> bool {
        self.options.threads.is_some()
    }

    fn run_mut<R>(
        self,
        resource: R,
        peak: impl Fn(&R) -> u64 + Send + Sync + 'static,
        upstream_allocations: impl Fn(&R) -> Option<u64> + Send + Sync + 'static,
    ) -> Self::Output
    where
        R: MemoryResourceMut<SimStream> + Send + 'static,
    {
        if self.options.threads.is_some() {
            let peak = move |s: &Shared<R>| s.with(|r| peak(r));
            let counted = move |s: &Shared<R>| s.with(|r| upstream_allocations(r));
            return self.run(Owned(Shared::new(resource)), peak, counted, |_, _| {});
        }
        let streams: Vec<_> = (0..self.workload.streams.max(1)).map(|_| self.world.stream()).collect();
        replay(
            &mut StreamReplayer::new(resource, streams, peak).upstream_allocations(upstream_allocations),
            self.workload,
            self.options.passes,
            self.progress,
        )
    }

    fn run_ref<R>(
        self,
        resource: R,
        peak: impl Fn(&R) -> u64 + Send + Sync + 'static,
        upstream_allocations: impl Fn(&R) -> Option<u64> + Send + Sync + 'static,
    ) -> Self::Output
    where
        R: MemoryResource<SimStream> + Send + Sync + 'static,
    {
        self.run(Owned(resource), peak, upstream_allocations, |_, _| {})
    }

    fn run_default<R>(
        self,
        resource: R,
        peak: impl Fn(&R) -> u64 + Send + Sync + 'static,
        upstream_allocations: impl Fn(&R) -> Option<u64> + Send + Sync + 'static,
    ) -> Self::Output
    where
        R: MemoryResourceMut + Send + 'static,
    {
        let mut r =
            StreamReplayer::new(resource, DefaultStream, peak).upstream_allocations(upstream_allocations);
        replay(&mut r, self.workload, self.options.passes, self.progress)
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
        UpstreamKind::Sim | UpstreamKind::Host => Ok(None),
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
fn cuda_leaf_count(built: &Built<SimStream>) -> usize {
    crate::cuda::stack_leaf_count(built)
}

#[cfg(not(feature = "cuda"))]
fn cuda_leaf_count(_: &Built<SimStream>) -> usize {
    0
}

#[cfg(feature = "cuda")]
fn cuda_peak(built: &Built<SimStream>) -> Option<Box<dyn Fn() -> u64 + Send + Sync>> {
    crate::cuda::stack_leaf_peak(built)
}

#[cfg(not(feature = "cuda"))]
fn cuda_peak(_: &Built<SimStream>) -> Option<Box<dyn Fn() -> u64 + Send + Sync>> {
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

/// What [`run_steps`] measured.
#[derive(Clone, Debug)]
pub struct Stepped {
    /// The workload's peak live bytes.
    pub peak_live: u64,
    /// The most bytes the stack's leaf held at once (a `vpool`'s
    /// committed bytes).
    pub peak_upstream: u64,
    /// The figures of each `planned` layer at the end, outermost first.
    pub steps: Vec<memres_core::planned::Steps>,
}

/// Checks that the first step of [`run_steps`], before allocation `phase`
/// (counted from 0), comes before one of `workload`'s allocations: a later
/// one would run no step at all. Phase 0 is taken for any workload.
///
/// # Errors
///
/// [`RunError::Unsupported`] naming the workload's allocations.
pub fn check_phase(workload: &Workload, phase: u64) -> Result<(), RunError> {
    let allocations = workload.ops.iter().filter(|op| op.alloc).count() as u64;
    if phase == 0 || phase < allocations {
        return Ok(());
    }
    let last = match allocations {
        0 | 1 => "so only phase 0".to_string(),
        n => format!("phases 0 to {}", n - 1),
    };
    Err(RunError::Unsupported(format!(
        "{}: --phase {phase} is past its last allocation, which would run no step: it has {allocations} allocation{} ({last})",
        workload.name,
        if allocations == 1 { "" } else { "s" },
    )))
}

/// Replays `workload` once through the stack `text`, with no warm-up pass,
/// calling `step()` on its `planned` layers before allocation `phase` and
/// before every `every`-th allocation after it: the steps of a training
/// loop inside one trace (`memres replay` makes each pass a step instead).
///
/// # Errors
///
/// [`RunError::Unsupported`] for a stack that does not build, has no
/// `planned` layer or no leaf whose peak can be read, `every` 0, or a
/// `phase` past the workload's allocations ([`check_phase`]); an op's
/// failure; [`RunError::Table`] where the table of handles does not
/// fit in the process's memory.
pub fn run_steps(text: &str, workload: &Workload, every: u64, phase: u64) -> Result<Stepped, RunError> {
    let fail = |e: StackError| RunError::Unsupported(format!("stack `{text}`: {e}"));
    if every == 0 {
        return Err(RunError::Unsupported("a step every 0 allocations".into()));
    }
    check_phase(workload, phase)?;
    let world = SimWorld::new();
    let mut builder = builder();
    let (built, gauge) =
        build_summed(&mut builder, &parse(text).map_err(fail)?, &world.default_stream()).map_err(fail)?;
    let (peak, _) = leaf_figures(&built, false, gauge)
        .map_err(|e| RunError::Unsupported(format!("stack `{text}` {e}")))?
        .ok_or_else(|| {
            RunError::Unsupported(format!(
                "stack `{text}` has no sim, host or vpool leaf whose peak the tool can read"
            ))
        })?;
    let planned = built.all::<Planned<DynResource<SimStream>>>("planned");
    if planned.is_empty() {
        return Err(RunError::Unsupported(format!("stack `{text}` has no `planned` layer to step")));
    }
    // The one pass is logged (a `log` layer starts switched off for the
    // warm-up of `replay`, which `steps` has not).
    let logs = built.all::<Gated<SimStream>>("log");
    for log in &logs {
        log.set(true);
    }
    let streams: Vec<SimStream> = (0..workload.streams.max(1)).map(|_| world.stream()).collect();
    let mut replayer = StreamReplayer::new(Owned(built.resource), streams, move |_| peak());
    let mut handles = table(TableOf::Steps, Block::EMPTY, workload.ids as usize)?;
    // The ops between two steps run as a replay pass's do.
    let ops = &workload.ops;
    let (mut from, mut allocations) = (0, 0u64);
    for (i, _) in ops.iter().enumerate().filter(|(_, op)| op.alloc) {
        if allocations >= phase && (allocations - phase) % every == 0 {
            run_ops(&mut replayer, &ops[from..i], from, &mut handles)
                .map_err(|e| RunError::Replay(free_held(&mut replayer, ops, e, &handles)))?;
            from = i;
            // A step that cannot take its region runs unplanned.
            for p in &planned {
                let _ = p.step(&replayer.streams[0]);
            }
        }
        allocations += 1;
    }
    run_ops(&mut replayer, &ops[from..], from, &mut handles)
        .map_err(|e| RunError::Replay(free_held(&mut replayer, ops, e, &handles)))?;
    let steps = planned.iter().map(|p| p.steps()).collect();
    // Blocks the trace never frees go with the stack.
    let peak_upstream = replayer.peak_upstream();
    for log in &logs {
        log.finish()?;
    }
    Ok(Stepped { peak_live: workload.peak_live, peak_upstream, steps })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a stack of several `sim` or `host` leaves gets the shared
    /// gauge; one leaf is left bare, its calls not slowed by the gauge.
    #[test]
    fn only_a_stack_of_several_leaves_counts_them_in_a_gauge() {
        let world = SimWorld::new();
        let stream = world.default_stream();
        for (text, summed) in [
            ("pool(sim)", false),
            ("sim", false),
            ("host", false),
            ("binning(sim, bin(768, pool(sim)))", true),
        ] {
            let (built, gauge) = build_summed(&mut builder(), &parse(text).unwrap(), &stream).unwrap();
            assert_eq!(gauge.is_some(), summed, "{text}");
            let block = built.resource.allocate(Request::new(1000).unwrap(), &stream).unwrap();
            if let Some(gauge) = &gauge {
                assert_eq!(gauge.peak(), 1024, "{text}: the block counted, rounded as the leaves round");
            }
            built.resource.deallocate(block, &stream).unwrap();
        }
    }

    /// A `vpool` or CUDA leaf is read alone or not at all: beside another
    /// leaf of any kind the row is refused, naming it (a CUDA leaf beside a
    /// `sim` one reported the `sim` leaf's peak only).
    #[test]
    fn a_vpool_or_cuda_leaf_beside_another_leaf_is_refused() {
        for ok in [(1, 0, 0), (5, 0, 0), (0, 1, 0), (0, 0, 1), (0, 0, 0)] {
            assert_eq!(readable_together(ok.0, ok.1, ok.2), Ok(()), "{ok:?}");
        }
        for (counts, named) in
            [((1, 0, 1), "1 of them cuda"), ((0, 0, 2), "2 of them cuda"), ((1, 1, 0), "vpool")]
        {
            let e = readable_together(counts.0, counts.1, counts.2).unwrap_err();
            assert!(e.contains(named), "{counts:?}: {e}");
        }
    }
}
