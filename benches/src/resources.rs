//! The resources the replay tool and benches compare, and the registry that
//! names them.
//!
//! Adding a resource: implement [`Build`] (construct a [`Replayer`] over
//! an upstream) and add one line to [`RESOURCES`].

use crate::replay::{replay, replay_threads, Measurement, ReplayError, Replayer, GRANULE};
use crate::workload::Workload;
use memres_core::adaptor::Statistics;
use memres_core::arena::{ArenaConfig, ArenaResource};
use memres_core::binning::BinningResource;
use memres_core::fixed::{FixedConfig, FixedSizeResource};
use memres_core::pool::{CoalescingPool, PoolConfig};
use memres_core::vpool::{VirtualConfig, VirtualPool};
use memres_core::{Block, Error, MemoryResource, MemoryResourceMut, Request, Shared, Stream, StreamOrdered};
use memres_sim::{HostMemory, SimAddressSpace, SimDevice, SimStream, SimWorld};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

#[cfg(test)]
mod tests;

/// An upstream a memres resource can take memory from, with the figure
/// the replay reports. Upstreams serve every stream type the replays use:
/// `()` on one thread, [`SimStream`]s on many.
pub trait Upstream: MemoryResource + MemoryResource<SimStream> + fmt::Debug + Send + Sync + 'static {
    /// The most bytes it handed out at once.
    fn peak_held_bytes(&self) -> u64;
}

impl Upstream for SimDevice {
    fn peak_held_bytes(&self) -> u64 {
        SimDevice::peak_held_bytes(self)
    }
}

impl Upstream for HostMemory {
    fn peak_held_bytes(&self) -> u64 {
        HostMemory::peak_held_bytes(self)
    }
}

impl<U: Upstream> Upstream for Arc<U> {
    fn peak_held_bytes(&self) -> u64 {
        U::peak_held_bytes(self)
    }
}

/// Which upstream the memres resources take memory from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UpstreamKind {
    /// A [`SimDevice`] of [`UpstreamKind::SIM_CAPACITY`] bytes: no bytes behind it.
    #[default]
    Sim,
    /// [`HostMemory`]: real host bytes.
    Host,
    /// CUDA device memory from `cuMemAlloc` (feature `cuda`).
    Cuda,
    /// CUDA's stream-ordered pool, `cuMemAllocAsync` (feature `cuda`).
    Async,
}

impl UpstreamKind {
    /// The capacity of the simulated device: 1 TiB.
    pub const SIM_CAPACITY: u64 = 1 << 40;

    /// Whether it is one of the CUDA upstreams.
    pub fn is_cuda(self) -> bool {
        matches!(self, UpstreamKind::Cuda | UpstreamKind::Async)
    }
}

impl FromStr for UpstreamKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sim" => Ok(UpstreamKind::Sim),
            "host" => Ok(UpstreamKind::Host),
            "cuda" => Ok(UpstreamKind::Cuda),
            "async" => Ok(UpstreamKind::Async),
            _ => Err(format!("unknown upstream `{s}` (expected sim, host, cuda or async)")),
        }
    }
}

impl fmt::Display for UpstreamKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UpstreamKind::Sim => "sim",
            UpstreamKind::Host => "host",
            UpstreamKind::Cuda => "cuda",
            UpstreamKind::Async => "async",
        })
    }
}

/// How the tool runs each replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOptions {
    /// Where memres resources take memory from.
    pub upstream: UpstreamKind,
    /// Timed passes after the warm-up (the median is reported).
    pub passes: u32,
    /// `Some(k)`: `k` threads, each replaying the whole workload on a
    /// stream of its own through one shared resource (RMM's harness with
    /// `k` threads); `None`: one thread, the workload's own streams.
    pub threads: Option<u32>,
    /// The resource's parameter (`fixed:SIZE`: the block size).
    pub param: Option<u64>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions { upstream: UpstreamKind::Sim, passes: 1, threads: None, param: None }
    }
}

/// Why a replay gave no figures.
#[derive(Clone, Debug, PartialEq)]
pub enum RunError {
    /// The resource cannot run this replay (a bad parameter, an upstream
    /// or a mode it does not support, a workload it cannot serve).
    Unsupported(String),
    /// An op failed.
    Replay(ReplayError),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Unsupported(what) => f.write_str(what),
            RunError::Replay(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Unsupported(_) => None,
            RunError::Replay(e) => Some(e),
        }
    }
}

impl From<ReplayError> for RunError {
    fn from(e: ReplayError) -> Self {
        RunError::Replay(e)
    }
}

/// Builds a resource for one workload over an upstream.
pub trait Build {
    /// The resource over an upstream of type `U`.
    type Resource<U: Upstream>: Replayer;

    /// The resource over `upstream`, sized for `workload` where it needs a
    /// capacity up front. Resources that manage a range of their own drop
    /// the upstream.
    ///
    /// # Errors
    ///
    /// Why it cannot be made for these options.
    fn build<U: Upstream>(
        upstream: U,
        workload: &Workload,
        options: &RunOptions,
    ) -> Result<Self::Resource<U>, String>;
}

/// Builds a resource that threads share, each on its own [`SimStream`].
pub trait BuildShared {
    /// The shared resource over an upstream of type `U`.
    type Resource<U: Upstream>: MemoryResource<SimStream> + Send + Sync;

    /// The resource over `upstream`.
    ///
    /// # Errors
    ///
    /// Why it cannot be made for these options.
    fn build_shared<U: Upstream>(
        upstream: U,
        workload: &Workload,
        options: &RunOptions,
    ) -> Result<Self::Resource<U>, String>;

    /// The most bytes held from upstream at once so far.
    fn peak<U: Upstream>(resource: &Self::Resource<U>) -> u64;
}

/// Replays `workload` on a fresh resource: monomorphized per resource and
/// upstream.
fn run<B: Build>(
    workload: &Workload,
    options: &RunOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<Measurement, RunError> {
    let passes = options.passes;
    match options.upstream {
        UpstreamKind::Sim => {
            let upstream = SimDevice::new(UpstreamKind::SIM_CAPACITY);
            let mut r = B::build(upstream, workload, options).map_err(RunError::Unsupported)?;
            Ok(replay(&mut r, workload, passes, progress)?)
        }
        UpstreamKind::Host => {
            let mut r = B::build(HostMemory::new(), workload, options).map_err(RunError::Unsupported)?;
            Ok(replay(&mut r, workload, passes, progress)?)
        }
        UpstreamKind::Cuda | UpstreamKind::Async => run_cuda::<B>(workload, options, progress),
    }
}

#[cfg(not(feature = "cuda"))]
fn no_cuda(options: &RunOptions) -> RunError {
    RunError::Unsupported(format!(
        "upstream `{}` needs the tool built with `--features cuda`",
        options.upstream
    ))
}

#[cfg(not(feature = "cuda"))]
#[allow(clippy::extra_unused_type_parameters)] // used with the feature
fn run_cuda<B: Build>(
    _: &Workload,
    options: &RunOptions,
    _: &mut dyn FnMut(usize),
) -> Result<Measurement, RunError> {
    Err(no_cuda(options))
}

#[cfg(feature = "cuda")]
fn run_cuda<B: Build>(
    w: &Workload,
    options: &RunOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<Measurement, RunError> {
    crate::cuda::run::<B>(w, options, progress)
}

/// Replays `workload` on `threads` threads through one fresh shared
/// resource.
fn run_shared<B: BuildShared>(
    workload: &Workload,
    options: &RunOptions,
    _progress: &mut dyn FnMut(usize),
) -> Result<Measurement, RunError> {
    let threads = options.threads.unwrap_or(1);
    match options.upstream {
        UpstreamKind::Sim => {
            let r = B::build_shared(SimDevice::new(UpstreamKind::SIM_CAPACITY), workload, options)
                .map_err(RunError::Unsupported)?;
            let world = SimWorld::new();
            let streams = (0..threads).map(|_| world.non_blocking_stream()).collect();
            Ok(replay_threads(&r, streams, workload, options.passes, &|_| {}, |r| B::peak(r))?)
        }
        UpstreamKind::Host => {
            let r = B::build_shared(HostMemory::new(), workload, options).map_err(RunError::Unsupported)?;
            let world = SimWorld::new();
            let streams = (0..threads).map(|_| world.non_blocking_stream()).collect();
            Ok(replay_threads(&r, streams, workload, options.passes, &|_| {}, |r| B::peak(r))?)
        }
        UpstreamKind::Cuda | UpstreamKind::Async => run_shared_cuda::<B>(workload, options),
    }
}

#[cfg(not(feature = "cuda"))]
#[allow(clippy::extra_unused_type_parameters)] // used with the feature
fn run_shared_cuda<B: BuildShared>(_: &Workload, options: &RunOptions) -> Result<Measurement, RunError> {
    Err(no_cuda(options))
}

#[cfg(feature = "cuda")]
fn run_shared_cuda<B: BuildShared>(w: &Workload, options: &RunOptions) -> Result<Measurement, RunError> {
    crate::cuda::run_shared::<B>(w, options)
}

/// Replays a workload on a fresh resource as the options say, telling a
/// progress callback how many ops each chunk did.
pub type RunFn = fn(&Workload, &RunOptions, &mut dyn FnMut(usize)) -> Result<Measurement, RunError>;

/// How an entry's parameter is written after its name and a colon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// No parameter.
    None,
    /// A size in bytes (`1MiB`, `65536`), required.
    Size,
    /// A size in bytes that may be left out (`pool` or `pool:1GiB`).
    OptionalSize,
}

/// One entry of the registry.
#[derive(Clone, Copy)]
pub struct Resource {
    /// The name on the command line.
    pub name: &'static str,
    /// One line on what it is.
    pub about: &'static str,
    /// The parameter after `name:`.
    pub param: Param,
    /// Replays a workload on a fresh instance on one thread.
    pub single: Option<RunFn>,
    /// Replays a workload on [`RunOptions::threads`] threads through one
    /// shared instance, where the resource can be shared.
    pub shared: Option<RunFn>,
    /// A plain CUDA resource: left out of the default list without the
    /// feature `cuda`.
    pub cuda: bool,
    /// Runs only over the simulated device (left out of the default list
    /// for other upstreams).
    pub sim_only: bool,
}

impl Resource {
    /// Replays `workload` as `options` say: on threads when
    /// [`RunOptions::threads`] is set.
    ///
    /// # Errors
    ///
    /// [`RunError::Unsupported`] for a mode the resource has no run for;
    /// the run's error.
    pub fn run(
        &self,
        workload: &Workload,
        options: &RunOptions,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Measurement, RunError> {
        let (run, mode) = match options.threads {
            Some(_) => (self.shared, "cannot be shared between threads (--streams)"),
            None => (self.single, "runs only with --streams"),
        };
        match run {
            Some(run) => run(workload, options, progress),
            None => Err(RunError::Unsupported(format!("{} {mode}", self.name))),
        }
    }
}

impl fmt::Debug for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resource").field("name", &self.name).finish_non_exhaustive()
    }
}

/// A registry entry for a resource built by `B` and replayed by the generic
/// engine over the chosen upstream, on one thread only.
pub const fn entry<B: Build>(name: &'static str, about: &'static str) -> Resource {
    Resource {
        name,
        about,
        param: Param::None,
        single: Some(run::<B>),
        shared: None,
        cuda: false,
        sim_only: false,
    }
}

/// A registry entry for a resource that also runs shared between threads.
pub const fn shared_entry<B: Build, T: BuildShared>(name: &'static str, about: &'static str) -> Resource {
    Resource {
        name,
        about,
        param: Param::None,
        single: Some(run::<B>),
        shared: Some(run_shared::<T>),
        cuda: false,
        sim_only: false,
    }
}

/// Every resource the tool knows, by name.
pub const RESOURCES: &[Resource] = &[
    Resource {
        param: Param::OptionalSize,
        ..shared_entry::<Pool, SharedPool>("pool", "memres CoalescingPool, grown from zero over the upstream, or pool:SIZE with an initial size as RMM's harness's pool (behind a spin lock with --streams)")
    },
    Resource {
        param: Param::Size,
        ..shared_entry::<Fixed, Fixed>("fixed", "memres FixedSizeResource, fixed:SIZE blocks of SIZE bytes (128 per chunk); larger requests are an error")
    },
    shared_entry::<Binning, Binning>("binning", "memres BinningResource as in RMM's harness: fixed bins 256 KiB..4 MiB, larger requests straight to the upstream"),
    Resource {
        param: Param::OptionalSize,
        ..shared_entry::<Arena, Arena>("arena", "memres ArenaResource over the upstream, or arena:SIZE with an initial global arena of SIZE bytes (RMM's takes half the device up front)")
    },
    Resource {
        sim_only: true,
        ..shared_entry::<VPool, VPool>("vpool", "memres VirtualPool: 64 GiB reserved in 2 MiB granules, free memory kept mapped up to 1.04x the peak in use (sim only; footprint: peak committed)")
    },
    shared_entry::<StreamPool, StreamPool>("stream-pool", "memres StreamOrdered over a CoalescingPool, one simulated stream per workload stream or thread"),
    shared_entry::<StatsPool, StatsPool>("stats-pool", "memres Statistics over a CoalescingPool, inside its lock with --streams (the cost of the counters)"),
    entry::<OffsetAllocator>("offset-allocator", "crate offset-allocator 0.2 (peer, 256-byte units)"),
    entry::<RangeAlloc>("range-alloc", "crate range-alloc 0.1 (peer, 256-byte units)"),
    Resource {
        name: "cuda",
        about: "cuMemAlloc itself, whatever --upstream says (feature cuda)",
        param: Param::None,
        single: Some(run_plain_cuda),
        shared: Some(run_plain_cuda),
        cuda: true,
        sim_only: false,
    },
    Resource {
        name: "async",
        about: "cuMemAllocAsync's pool itself, whatever --upstream says (feature cuda)",
        param: Param::None,
        single: Some(run_plain_async),
        shared: Some(run_plain_async),
        cuda: true,
        sim_only: false,
    },
];

fn run_plain_cuda(
    w: &Workload,
    options: &RunOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<Measurement, RunError> {
    run_plain(UpstreamKind::Cuda, w, options, progress)
}

fn run_plain_async(
    w: &Workload,
    options: &RunOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<Measurement, RunError> {
    run_plain(UpstreamKind::Async, w, options, progress)
}

#[cfg(feature = "cuda")]
fn run_plain(
    kind: UpstreamKind,
    w: &Workload,
    options: &RunOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<Measurement, RunError> {
    crate::cuda::run_plain(kind, w, options, progress)
}

#[cfg(not(feature = "cuda"))]
fn run_plain(
    kind: UpstreamKind,
    _: &Workload,
    _: &RunOptions,
    _: &mut dyn FnMut(usize),
) -> Result<Measurement, RunError> {
    Err(RunError::Unsupported(format!("resource `{kind}` needs the tool built with `--features cuda`")))
}

/// Looks a resource up by name (without its parameter).
///
/// # Errors
///
/// A message that lists the known names.
pub fn find(name: &str) -> Result<&'static Resource, String> {
    RESOURCES.iter().find(|r| r.name == name).ok_or_else(|| {
        let known: Vec<_> = RESOURCES
            .iter()
            .map(|r| match r.param {
                Param::Size => format!("{}:SIZE", r.name),
                Param::OptionalSize => format!("{}[:SIZE]", r.name),
                Param::None => r.name.to_string(),
            })
            .collect();
        format!("unknown resource `{name}` (known: {})", known.join(", "))
    })
}

/// Parses a resource spec, `NAME` or `NAME:PARAM` (e.g. `fixed:1MiB`):
/// the entry and its parameter.
///
/// # Errors
///
/// An unknown name, a missing, unexpected or malformed parameter.
pub fn select(spec: &str) -> Result<(&'static Resource, Option<u64>), String> {
    let (name, param) = match spec.split_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (spec, None),
    };
    let r = find(name)?;
    match (r.param, param) {
        (Param::None, None) => Ok((r, None)),
        (Param::None, Some(_)) => Err(format!("resource `{name}` takes no parameter (`{spec}`)")),
        (Param::Size, None) => {
            Err(format!("resource `{name}` needs a size: `{name}:SIZE`, e.g. `{name}:1MiB`"))
        }
        (Param::OptionalSize, None) => Ok((r, None)),
        (Param::Size | Param::OptionalSize, Some(p)) => match memres_core::stack::parse_size(p) {
            Some(size) if size > 0 => Ok((r, Some(size))),
            _ => Err(format!("bad size `{p}` in `{spec}` (e.g. 1MiB, 65536)")),
        },
    }
}

/// A `&self` resource owned by a replayer and driven through `&mut self`
/// calls, so that one [`MutReplayer`] serves both kinds.
#[derive(Debug)]
pub struct Owned<R>(pub R);

impl<S: Stream + ?Sized, R: MemoryResource<S>> MemoryResourceMut<S> for Owned<R> {
    #[inline]
    fn allocate(&mut self, request: Request, stream: &S) -> Result<Block, Error> {
        self.0.allocate(request, stream)
    }
    #[inline]
    fn deallocate(&mut self, block: Block, stream: &S) -> Result<(), Error> {
        self.0.deallocate(block, stream)
    }
}

/// A resource of `&self` calls, replayed on `()`.
pub type RefReplayer<R> = MutReplayer<Owned<R>>;

/// A resource of `&mut self` calls, replayed on `()`.
pub struct MutReplayer<R> {
    /// The resource.
    pub inner: R,
    peak: fn(&R) -> u64,
}

impl<R> MutReplayer<R> {
    /// `inner`, whose peak upstream `peak` reads.
    pub fn new(inner: R, peak: fn(&R) -> u64) -> Self {
        MutReplayer { inner, peak }
    }
}

impl<R> fmt::Debug for MutReplayer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutReplayer").finish_non_exhaustive()
    }
}

impl<R: MemoryResourceMut> Replayer for MutReplayer<R> {
    type Handle = Block;

    fn vacant(&self) -> Block {
        Block::EMPTY
    }

    #[inline]
    fn allocate(&mut self, size: u64, _stream: u16) -> Result<Block, Error> {
        self.inner.allocate(Request::new(size)?, &())
    }

    #[inline]
    fn deallocate(&mut self, block: Block, _size: u64, _stream: u16) -> Result<(), Error> {
        self.inner.deallocate(block, &())
    }

    fn peak_upstream(&self) -> u64 {
        (self.peak)(&self.inner)
    }
}

/// A resource replayed on simulated streams, one per stream of the
/// workload.
pub struct StreamReplayer<R> {
    /// The resource.
    pub inner: R,
    /// The workload's streams by index.
    pub streams: Vec<SimStream>,
    peak: fn(&R) -> u64,
}

impl<R> fmt::Debug for StreamReplayer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamReplayer").field("streams", &self.streams.len()).finish_non_exhaustive()
    }
}

impl<R: MemoryResourceMut<SimStream>> Replayer for StreamReplayer<R> {
    type Handle = Block;

    fn vacant(&self) -> Block {
        Block::EMPTY
    }

    #[inline]
    fn allocate(&mut self, size: u64, stream: u16) -> Result<Block, Error> {
        self.inner.allocate(Request::new(size)?, &self.streams[stream as usize])
    }

    #[inline]
    fn deallocate(&mut self, block: Block, _size: u64, stream: u16) -> Result<(), Error> {
        self.inner.deallocate(block, &self.streams[stream as usize])
    }

    fn peak_upstream(&self) -> u64 {
        (self.peak)(&self.inner)
    }
}

/// The pool behind a spin lock, for threads.
#[derive(Debug)]
pub struct SharedPool;

impl BuildShared for SharedPool {
    type Resource<U: Upstream> = Shared<CoalescingPool<U>>;
    fn build_shared<U: Upstream>(
        upstream: U,
        _: &Workload,
        options: &RunOptions,
    ) -> Result<Self::Resource<U>, String> {
        pool_with_initial(upstream, options).map(Shared::new)
    }
    fn peak<U: Upstream>(r: &Self::Resource<U>) -> u64 {
        r.with(|p| p.upstream().peak_held_bytes())
    }
}

/// `fixed:SIZE`: [`FixedSizeResource`] with blocks of SIZE bytes.
#[derive(Debug)]
pub struct Fixed;

impl Fixed {
    /// The resource, once the workload's requests are known to fit its blocks.
    fn make<U: Upstream>(
        upstream: U,
        w: &Workload,
        options: &RunOptions,
    ) -> Result<FixedSizeResource<U>, String> {
        let config = Self::check(w, options)?;
        FixedSizeResource::with_config(upstream, config, &()).map_err(|e| format!("fixed: {e}"))
    }

    fn check(workload: &Workload, options: &RunOptions) -> Result<FixedConfig, String> {
        let size = options.param.ok_or("fixed needs a block size: fixed:SIZE")?;
        if let Some((i, op)) = workload.ops.iter().enumerate().find(|(_, op)| op.alloc && op.size > size) {
            return Err(format!(
                "fixed: blocks of {size} bytes ({}) serve no larger request, but op {i} of the workload asks for {} bytes",
                crate::report::human_bytes(size),
                op.size
            ));
        }
        Ok(FixedConfig::new(size))
    }
}

impl Build for Fixed {
    type Resource<U: Upstream> = MutReplayer<FixedSizeResource<U>>;
    fn build<U: Upstream>(
        upstream: U,
        w: &Workload,
        options: &RunOptions,
    ) -> Result<Self::Resource<U>, String> {
        Ok(MutReplayer { inner: Self::make(upstream, w, options)?, peak: |r| r.upstream().peak_held_bytes() })
    }
}

impl BuildShared for Fixed {
    type Resource<U: Upstream> = Shared<FixedSizeResource<U>>;
    fn build_shared<U: Upstream>(
        upstream: U,
        w: &Workload,
        options: &RunOptions,
    ) -> Result<Self::Resource<U>, String> {
        Self::make(upstream, w, options).map(Shared::new)
    }
    fn peak<U: Upstream>(r: &Self::Resource<U>) -> u64 {
        r.with(|f| f.upstream().peak_held_bytes())
    }
}

/// RMM's harness's binning: fixed bins of 2^18..=2^22 bytes, larger
/// requests to the upstream.
#[derive(Debug)]
pub struct Binning;

impl Binning {
    /// The smallest bin: 256 KiB.
    pub const MIN_EXPONENT: u32 = 18;
    /// The largest bin: 4 MiB.
    pub const MAX_EXPONENT: u32 = 22;

    fn make<U: Upstream, S: memres_core::Stream + ?Sized>(
        upstream: U,
    ) -> Result<BinningResource<'static, Arc<U>, S>, String>
    where
        Arc<U>: MemoryResource<S>,
    {
        BinningResource::with_exponents(Arc::new(upstream), Self::MIN_EXPONENT, Self::MAX_EXPONENT)
            .map_err(|e| format!("binning: {e}"))
    }
}

impl Build for Binning {
    type Resource<U: Upstream> = RefReplayer<BinningResource<'static, Arc<U>>>;
    fn build<U: Upstream>(upstream: U, _: &Workload, _: &RunOptions) -> Result<Self::Resource<U>, String> {
        Ok(MutReplayer::new(Owned(Self::make(upstream)?), |r| r.0.upstream().peak_held_bytes()))
    }
}

impl BuildShared for Binning {
    type Resource<U: Upstream> = BinningResource<'static, Arc<U>, SimStream>;
    fn build_shared<U: Upstream>(
        upstream: U,
        _: &Workload,
        _: &RunOptions,
    ) -> Result<Self::Resource<U>, String> {
        Self::make(upstream)
    }
    fn peak<U: Upstream>(r: &Self::Resource<U>) -> u64 {
        r.upstream().peak_held_bytes()
    }
}

/// [`ArenaResource`] with its default configuration.
#[derive(Debug)]
pub struct Arena;

/// The arena of `arena[:INITIAL]`: grown from zero, or with an initial
/// global arena as RMM's (which takes half the device's free memory).
fn arena_with_initial<U: Upstream>(upstream: U, options: &RunOptions) -> Result<ArenaResource<U>, String> {
    let config = ArenaConfig::new().initial_size(options.param.unwrap_or(0).next_multiple_of(256));
    ArenaResource::with_config(upstream, config, &()).map_err(|e| format!("arena: {e}"))
}

impl Build for Arena {
    type Resource<U: Upstream> = RefReplayer<ArenaResource<U>>;
    fn build<U: Upstream>(
        upstream: U,
        _: &Workload,
        options: &RunOptions,
    ) -> Result<Self::Resource<U>, String> {
        Ok(MutReplayer::new(Owned(arena_with_initial(upstream, options)?), |r| {
            r.0.upstream_with(|u| u.peak_held_bytes())
        }))
    }
}

impl BuildShared for Arena {
    type Resource<U: Upstream> = ArenaResource<U>;
    fn build_shared<U: Upstream>(
        upstream: U,
        _: &Workload,
        options: &RunOptions,
    ) -> Result<Self::Resource<U>, String> {
        arena_with_initial(upstream, options)
    }
    fn peak<U: Upstream>(r: &Self::Resource<U>) -> u64 {
        r.upstream_with(|u| u.peak_held_bytes())
    }
}

/// [`VirtualPool`] over a [`SimAddressSpace`]: the upstream is the
/// simulated address space itself, so only `--upstream sim` runs it.
#[derive(Debug)]
pub struct VPool;

impl VPool {
    /// Bytes reserved: 64 GiB.
    pub const RESERVE: u64 = 64 << 30;
    /// Bytes kept committed when free: all of them, under the slack.
    pub const KEEP: u64 = u64::MAX;
    /// Free committed memory is trimmed above 1.04x the peak in use.
    pub const SLACK_PERMILLE: u32 = 40;
    /// Granule: 2 MiB.
    pub const GRANULE: u64 = 2 << 20;

    fn make(options: &RunOptions) -> Result<VirtualPool<SimAddressSpace>, String> {
        if options.upstream != UpstreamKind::Sim {
            return Err(format!(
                "vpool maps granules of a simulated address space: it runs only with --upstream sim, not {}",
                options.upstream
            ));
        }
        let space = SimAddressSpace::new(UpstreamKind::SIM_CAPACITY, Self::GRANULE);
        let config = VirtualConfig::new(Self::RESERVE).keep(Self::KEEP).slack_permille(Self::SLACK_PERMILLE);
        VirtualPool::with_config(space, config).map_err(|e| format!("vpool: {e}"))
    }
}

impl Build for VPool {
    type Resource<U: Upstream> = MutReplayer<VirtualPool<SimAddressSpace>>;
    fn build<U: Upstream>(_: U, _: &Workload, options: &RunOptions) -> Result<Self::Resource<U>, String> {
        Ok(MutReplayer { inner: Self::make(options)?, peak: |r| r.peak_committed_bytes() })
    }
}

impl BuildShared for VPool {
    type Resource<U: Upstream> = Shared<VirtualPool<SimAddressSpace>>;
    fn build_shared<U: Upstream>(
        _: U,
        _: &Workload,
        options: &RunOptions,
    ) -> Result<Self::Resource<U>, String> {
        Ok(Shared::new(Self::make(options)?))
    }
    fn peak<U: Upstream>(r: &Self::Resource<U>) -> u64 {
        r.with(|v| v.peak_committed_bytes())
    }
}

/// [`StreamOrdered`] over a [`CoalescingPool`], on simulated streams.
#[derive(Debug)]
pub struct StreamPool;

impl Build for StreamPool {
    type Resource<U: Upstream> = StreamReplayer<StreamOrdered<CoalescingPool<U>, SimStream>>;
    fn build<U: Upstream>(upstream: U, w: &Workload, _: &RunOptions) -> Result<Self::Resource<U>, String> {
        let world = SimWorld::new();
        let streams = (0..w.streams.max(1)).map(|_| world.stream()).collect();
        Ok(StreamReplayer {
            inner: StreamOrdered::new(CoalescingPool::new(upstream)),
            streams,
            peak: |r| r.inner().upstream().peak_held_bytes(),
        })
    }
}

impl BuildShared for StreamPool {
    type Resource<U: Upstream> = Shared<StreamOrdered<CoalescingPool<U>, SimStream>>;
    fn build_shared<U: Upstream>(
        upstream: U,
        _: &Workload,
        _: &RunOptions,
    ) -> Result<Self::Resource<U>, String> {
        Ok(Shared::new(StreamOrdered::new(CoalescingPool::new(upstream))))
    }
    fn peak<U: Upstream>(r: &Self::Resource<U>) -> u64 {
        r.with(|s| s.inner().upstream().peak_held_bytes())
    }
}

/// [`Statistics`] over a [`CoalescingPool`], inside the pool's spin lock
/// with `--streams` (the counters then need no atomic read-modify-write):
/// against `pool`, the cost of the counters.
#[derive(Debug)]
pub struct StatsPool;

impl Build for StatsPool {
    type Resource<U: Upstream> = MutReplayer<Statistics<CoalescingPool<U>>>;
    fn build<U: Upstream>(upstream: U, _: &Workload, _: &RunOptions) -> Result<Self::Resource<U>, String> {
        Ok(MutReplayer {
            inner: Statistics::new(CoalescingPool::new(upstream)),
            peak: |r| r.upstream().upstream().peak_held_bytes(),
        })
    }
}

impl BuildShared for StatsPool {
    type Resource<U: Upstream> = Shared<Statistics<CoalescingPool<U>>>;
    fn build_shared<U: Upstream>(
        upstream: U,
        _: &Workload,
        _: &RunOptions,
    ) -> Result<Self::Resource<U>, String> {
        Ok(Shared::new(Statistics::new(CoalescingPool::new(upstream))))
    }
    fn peak<U: Upstream>(r: &Self::Resource<U>) -> u64 {
        r.with(|s| s.upstream().upstream().peak_held_bytes())
    }
}

/// The pool of `pool[:INITIAL]`: grown from zero, or with an initial size.
fn pool_with_initial<U: Upstream>(upstream: U, options: &RunOptions) -> Result<CoalescingPool<U>, String> {
    let config = PoolConfig::new().initial_size(options.param.unwrap_or(0).next_multiple_of(256));
    CoalescingPool::with_config(upstream, config, &()).map_err(|e| format!("pool: {e}"))
}

/// The memres pool, used through [`MemoryResourceMut`] directly.
#[derive(Debug)]
pub struct Pool;

impl Build for Pool {
    type Resource<U: Upstream> = PoolReplayer<U>;
    fn build<U: Upstream>(
        upstream: U,
        _: &Workload,
        options: &RunOptions,
    ) -> Result<PoolReplayer<U>, String> {
        pool_with_initial(upstream, options).map(|p| MutReplayer::new(p, |p| p.upstream().peak_held_bytes()))
    }
}

/// [`CoalescingPool`] as a [`Replayer`].
pub type PoolReplayer<U> = MutReplayer<CoalescingPool<U>>;

/// Sizes in 256-byte units, checked to fit `u32`.
#[inline]
fn units(size: u64) -> Result<u32, Error> {
    u32::try_from(size.div_ceil(GRANULE)).map_err(|_| Error::InvalidSize { size })
}

fn peer_out_of_memory(size: u64, capacity_units: u64) -> Error {
    Error::OutOfMemory {
        requested: size,
        largest_free: 0,
        pool_size: capacity_units * GRANULE,
        max_size: Some(capacity_units * GRANULE),
    }
}

/// The `offset-allocator` crate: OffsetAllocator's TLSF-like index over
/// one range of `u32::MAX` units of 256 bytes (1 TiB).
#[derive(Debug)]
pub struct OffsetAllocator;

impl Build for OffsetAllocator {
    type Resource<U: Upstream> = OffsetReplayer;
    fn build<U: Upstream>(_: U, workload: &Workload, _: &RunOptions) -> Result<OffsetReplayer, String> {
        // Each live allocation and each free gap between them is a node.
        let nodes = (workload.peak_live_count as u64 * 2 + 1024).min(u32::MAX as u64 - 2) as u32;
        Ok(OffsetReplayer {
            inner: offset_allocator::Allocator::with_max_allocs(u32::MAX, nodes),
            peak_end: 0,
        })
    }
}

/// [`offset_allocator::Allocator`] as a [`Replayer`].
pub struct OffsetReplayer {
    inner: offset_allocator::Allocator,
    /// The highest end offset handed out, in units.
    peak_end: u64,
}

impl fmt::Debug for OffsetReplayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OffsetReplayer").field("peak_end", &self.peak_end).finish_non_exhaustive()
    }
}

impl Replayer for OffsetReplayer {
    type Handle = Option<offset_allocator::Allocation>;

    fn vacant(&self) -> Self::Handle {
        None
    }

    #[inline]
    fn allocate(&mut self, size: u64, _stream: u16) -> Result<Self::Handle, Error> {
        let n = units(size)?;
        if n == 0 {
            return Ok(None);
        }
        let a = self.inner.allocate(n).ok_or_else(|| peer_out_of_memory(size, u32::MAX as u64))?;
        self.peak_end = self.peak_end.max(a.offset as u64 + n as u64);
        Ok(Some(a))
    }

    #[inline]
    fn deallocate(&mut self, handle: Self::Handle, _size: u64, _stream: u16) -> Result<(), Error> {
        if let Some(a) = handle {
            self.inner.free(a);
        }
        Ok(())
    }

    fn peak_upstream(&self) -> u64 {
        self.peak_end * GRANULE
    }
}

/// The `range-alloc` crate: a sorted list of free ranges, best fit, over
/// one range of 2^32 units of 256 bytes (1 TiB).
#[derive(Debug)]
pub struct RangeAlloc;

impl Build for RangeAlloc {
    type Resource<U: Upstream> = RangeReplayer;
    fn build<U: Upstream>(_: U, _: &Workload, _: &RunOptions) -> Result<RangeReplayer, String> {
        Ok(RangeReplayer { inner: range_alloc::RangeAllocator::new(0..Self::CAPACITY), peak_end: 0 })
    }
}

impl RangeAlloc {
    /// The range's length in units.
    pub const CAPACITY: u64 = 1 << 32;
}

/// [`range_alloc::RangeAllocator`] as a [`Replayer`].
#[derive(Debug)]
pub struct RangeReplayer {
    inner: range_alloc::RangeAllocator<u64>,
    /// The highest end offset handed out, in units.
    peak_end: u64,
}

impl Replayer for RangeReplayer {
    /// `(start, end)` in units; `(0, 0)` for nothing.
    type Handle = (u64, u64);

    fn vacant(&self) -> Self::Handle {
        (0, 0)
    }

    #[inline]
    fn allocate(&mut self, size: u64, _stream: u16) -> Result<Self::Handle, Error> {
        let n = size.div_ceil(GRANULE);
        if n == 0 {
            return Ok((0, 0));
        }
        let r = self.inner.allocate_range(n).map_err(|_| peer_out_of_memory(size, RangeAlloc::CAPACITY))?;
        self.peak_end = self.peak_end.max(r.end);
        Ok((r.start, r.end))
    }

    #[inline]
    fn deallocate(&mut self, (start, end): Self::Handle, _size: u64, _stream: u16) -> Result<(), Error> {
        if start < end {
            self.inner.free_range(start..end);
        }
        Ok(())
    }

    fn peak_upstream(&self) -> u64 {
        self.peak_end * GRANULE
    }
}
