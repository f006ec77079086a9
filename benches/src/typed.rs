//! The fast path: the stacks the tool compares, built typed.
//!
//! A stack built by the core's builder is a tree of `Arc<dyn
//! MemoryResource>`s with a lock around each `&mut self` algorithm: right for
//! a program, but a dynamic call and a lock per op that the plain algorithm
//! does not pay. So the stacks of these shapes are built here as concrete
//! types over their leaf, with the same readers of their arguments
//! ([`memres_core::stack::pool_config`] and the others) and so the same
//! meaning, and replayed with direct calls, on one thread without a lock:
//!
//! | shape | typed resource (over the leaf `L`, `Arc<U>`) |
//! | --- | --- |
//! | `pool(L, ...)` (not `per_stream=true`) | `CoalescingPool<L>` |
//! | `stats(pool(L, ...))` | `Statistics<CoalescingPool<L>>` (with threads, inside the pool's lock) |
//! | `stream(pool(L, ...))` | `StreamOrdered<CoalescingPool<L>, SimStream>` |
//! | `fixed(L, ...)` | `FixedSizeResource<L>` |
//! | `binning(L, ...)` | `BinningResource<L>` (`&self`: no lock) |
//! | `arena(L, ...)` | `ArenaResource<L>` (`&self`: no lock) |
//! | `vpool(sim...)` (not `per_stream=true`) | `VirtualPool<SimAddressSpace>` ([`run_vpool`]) |
//! | `stats(vpool(sim...))` | `Statistics<VirtualPool<SimAddressSpace>>` (with threads, inside the pool's lock) |
//!
//! The leaf `L` is whatever the builder makes of the innermost call
//! (`sim(1TiB)`, `host`, with the feature `cuda` the tool's `cuda` and
//! `async`), kept typed. What to do with the resource once built is a
//! [`Runner`]'s: the tool replays it, the criterion benches time it. One
//! thread calls the resources on `()` ([`DefaultStream`]; the stream-ordered
//! layer and the arena, which keep memory per stream, aside: on the
//! workload's streams), threads each on a simulated stream of its own.

use crate::replay::{DefaultStream, Owned, Replayer, StreamReplayer};
use crate::workload::Workload;
use memres_core::adaptor::Statistics;
use memres_core::arena::{ArenaConfig, ArenaResource};
use memres_core::binning::BinningResource;
use memres_core::fixed::{FixedConfig, FixedSizeResource};
use memres_core::pool::{CoalescingPool, PoolConfig};
use memres_core::stack::{
    arena_config, binning_bins, binning_exponents, fixed_block_size, fixed_config, pool_config, Call,
    StackBuilder, StackError,
};
use memres_core::{Block, Inspect, MemoryResource, MemoryResourceMut, StreamOrdered};
use memres_sim::SimStream;
use std::sync::Arc;

/// What to do with a resource built typed.
pub trait Runner {
    /// What running gives.
    type Output;

    /// Whether the resource will be shared between threads, each on a
    /// stream of its own; if not, one thread calls it, on `()`
    /// ([`run_default`](Self::run_default)) but for the stream-ordered
    /// layer and the arena, which need their streams.
    fn shared(&self) -> bool;

    /// Runs a resource of `&mut self` calls on the workload's streams, or
    /// shared between threads behind a lock; `peak` reads the most bytes it
    /// held from upstream, `upstream_allocations` the allocations it made
    /// from upstream so far, where its leaf counts them
    /// ([`Upstream::upstream_allocations`]).
    fn run_mut<R>(
        self,
        resource: R,
        peak: impl Fn(&R) -> u64 + Send + Sync + 'static,
        upstream_allocations: impl Fn(&R) -> Option<u64> + Send + Sync + 'static,
    ) -> Self::Output
    where
        R: MemoryResourceMut<SimStream> + Send + 'static;

    /// Runs a resource of `&self` calls shared as it is.
    fn run_ref<R>(
        self,
        resource: R,
        peak: impl Fn(&R) -> u64 + Send + Sync + 'static,
        upstream_allocations: impl Fn(&R) -> Option<u64> + Send + Sync + 'static,
    ) -> Self::Output
    where
        R: MemoryResource<SimStream> + Send + Sync + 'static;

    /// Runs a stream-agnostic resource on one thread, on `()`.
    fn run_default<R>(
        self,
        resource: R,
        peak: impl Fn(&R) -> u64 + Send + Sync + 'static,
        upstream_allocations: impl Fn(&R) -> Option<u64> + Send + Sync + 'static,
    ) -> Self::Output
    where
        R: MemoryResourceMut + Send + 'static;
}

/// What to do with a typed resource as a [`Replayer`] on one thread (see
/// [`OneThread`]).
pub trait WithReplayer {
    /// What it gives.
    type Output;

    /// Does it with `replayer`.
    fn with<R: Replayer<Handle = Block>>(self, replayer: R) -> Self::Output;
}

/// The [`Runner`] that hands each typed resource, on one thread, to `then`
/// as a [`StreamReplayer`] on `streams` (the workload's).
#[derive(Debug)]
pub struct OneThread<F> {
    /// The streams, one per stream of the workload.
    pub streams: Vec<SimStream>,
    /// What to do with the replayer.
    pub then: F,
}

impl<F: WithReplayer> Runner for OneThread<F> {
    type Output = F::Output;

    fn shared(&self) -> bool {
        false
    }

    fn run_mut<R>(
        self,
        resource: R,
        peak: impl Fn(&R) -> u64 + Send + Sync + 'static,
        upstream_allocations: impl Fn(&R) -> Option<u64> + Send + Sync + 'static,
    ) -> F::Output
    where
        R: MemoryResourceMut<SimStream> + Send + 'static,
    {
        let replayer = StreamReplayer::new(resource, self.streams, peak);
        self.then.with(replayer.upstream_allocations(upstream_allocations))
    }

    fn run_ref<R>(
        self,
        resource: R,
        peak: impl Fn(&R) -> u64 + Send + Sync + 'static,
        upstream_allocations: impl Fn(&R) -> Option<u64> + Send + Sync + 'static,
    ) -> F::Output
    where
        R: MemoryResource<SimStream> + Send + Sync + 'static,
    {
        let replayer = StreamReplayer::new(Owned(resource), self.streams, move |o| peak(&o.0));
        self.then.with(replayer.upstream_allocations(move |o| upstream_allocations(&o.0)))
    }

    fn run_default<R>(
        self,
        resource: R,
        peak: impl Fn(&R) -> u64 + Send + Sync + 'static,
        upstream_allocations: impl Fn(&R) -> Option<u64> + Send + Sync + 'static,
    ) -> F::Output
    where
        R: MemoryResourceMut + Send + 'static,
    {
        let replayer = StreamReplayer::new(resource, DefaultStream, peak);
        self.then.with(replayer.upstream_allocations(upstream_allocations))
    }
}

/// An upstream the typed resources take memory from; its
/// [`Usage`](memres_core::Usage) gives the row's peak upstream. It serves
/// simulated streams and `()`, the stream of the stream-ordered layer's
/// inner calls.
pub trait Upstream: MemoryResource<SimStream> + MemoryResource + Inspect + Send + Sync + 'static {
    /// The allocations it has served so far, where it counts them (the
    /// simulated device and host memory); `None` by default.
    fn upstream_allocations(&self) -> Option<u64> {
        None
    }
}

impl Upstream for memres_sim::SimDevice {
    fn upstream_allocations(&self) -> Option<u64> {
        Some(self.call_counts().0)
    }
}

impl Upstream for memres_sim::HostMemory {
    fn upstream_allocations(&self) -> Option<u64> {
        Some(self.call_counts().0)
    }
}

/// A stack of one of the typed shapes, its arguments read, its leaf not
/// built yet.
#[derive(Debug)]
pub enum Shape<'c> {
    /// `pool(L, ...)`.
    Pool(PoolConfig, &'c Call),
    /// `stats(pool(L, ...))`.
    StatsPool(PoolConfig, &'c Call),
    /// `stream(pool(L, ...))`.
    StreamPool(PoolConfig, &'c Call),
    /// `fixed(L, ...)`, with its block size.
    Fixed(FixedConfig, u64, &'c Call),
    /// `binning(L, min_bin=, max_bin=)`, as bin exponents.
    Binning(u32, u32, &'c Call),
    /// `arena(L, ...)`.
    Arena(ArenaConfig, &'c Call),
}

/// Names the leaves of the typed shapes may have.
const LEAVES: &[&str] = &["sim", "host", "cuda", "async"];

/// The call of `call`'s first argument if it is a leaf: a call of one of
/// [`LEAVES`] (which the builder builds, arguments and all).
fn leaf(call: &Call) -> Option<&Call> {
    call.resource(0).ok().filter(|up| LEAVES.contains(&up.name.as_str()))
}

/// A pool over a leaf, the pool call and the leaf.
fn pool(call: &Call) -> Option<(&Call, &Call)> {
    (call.name == "pool" && !matches!(call.bool_arg("per_stream"), Ok(Some(true)) | Err(_)))
        .then(|| leaf(call).map(|l| (call, l)))
        .flatten()
}

/// The shape of `call`, if it has one with a leaf that the fast path builds
/// (`vpool` has none: [`run_vpool`]), with its arguments read (before the
/// leaf is built, as the builder reads them).
///
/// # Errors
///
/// The arguments' errors, at their positions, as the builder gives them.
pub fn shape(call: &Call) -> Result<Option<Shape<'_>>, StackError> {
    let inner_pool = || call.resource(0).ok().filter(|_| call.args.len() == 1).and_then(pool);
    Ok(Some(match call.name.as_str() {
        "pool" => match pool(call) {
            Some((p, l)) => Shape::Pool(pool_config(p)?, l),
            None => return Ok(None),
        },
        "stats" | "stream" => match inner_pool() {
            Some((p, l)) if call.name == "stats" => Shape::StatsPool(pool_config(p)?, l),
            Some((p, l)) => Shape::StreamPool(pool_config(p)?, l),
            None => return Ok(None),
        },
        "fixed" | "binning" | "arena" => {
            let Some(l) = leaf(call) else { return Ok(None) };
            match call.name.as_str() {
                "fixed" => Shape::Fixed(fixed_config(call)?, fixed_block_size(call)?, l),
                "binning" => {
                    let powers = binning_exponents(call)?;
                    match powers {
                        Some((min, max)) if binning_bins(call)?.is_empty() => Shape::Binning(min, max, l),
                        // Bins given one by one, or none: the builder's.
                        _ => return Ok(None),
                    }
                }
                _ => Shape::Arena(arena_config(call)?, l),
            }
        }
        _ => return Ok(None),
    }))
}

impl Shape<'_> {
    /// The leaf to build.
    pub fn leaf(&self) -> &Call {
        match self {
            Shape::Pool(_, l)
            | Shape::StatsPool(_, l)
            | Shape::StreamPool(_, l)
            | Shape::Fixed(_, _, l)
            | Shape::Binning(_, _, l)
            | Shape::Arena(_, l) => l,
        }
    }

    /// Builds the resource over `leaf` and hands it to `runner`; `call` is
    /// the stack's outer call, `stream` the stream of what is allocated
    /// while building.
    ///
    /// # Errors
    ///
    /// The resource's refusal, at the call it is about.
    pub fn run<U: Upstream, K: Runner>(
        self,
        call: &Call,
        leaf: Arc<U>,
        stream: &SimStream,
        runner: K,
    ) -> Result<K::Output, StackError> {
        let peak = {
            let leaf = leaf.clone();
            move || leaf.usage().peak_held
        };
        let counted = {
            let leaf = leaf.clone();
            move || leaf.upstream_allocations()
        };
        let made = |c: &Call, e| c.resource_error(e);
        Ok(match self {
            Shape::Pool(config, _) => {
                let pool = CoalescingPool::with_config(leaf, config, stream).map_err(|e| made(call, e))?;
                run_mut(runner, pool, move |_| peak(), move |_| counted())
            }
            Shape::StatsPool(config, _) | Shape::StreamPool(config, _) => {
                let pool_call = call.resource(0)?;
                let pool =
                    CoalescingPool::with_config(leaf, config, stream).map_err(|e| made(pool_call, e))?;
                if call.name == "stats" {
                    run_mut(runner, Statistics::new(pool), move |_| peak(), move |_| counted())
                } else {
                    runner.run_mut(
                        StreamOrdered::<_, SimStream>::new(pool),
                        move |_| peak(),
                        move |_| counted(),
                    )
                }
            }
            Shape::Fixed(config, _, _) => {
                let fixed =
                    FixedSizeResource::with_config(leaf, config, stream).map_err(|e| made(call, e))?;
                run_mut(runner, fixed, move |_| peak(), move |_| counted())
            }
            Shape::Binning(min, max, _) if runner.shared() => {
                let bins = BinningResource::<'static, _, SimStream>::with_exponents(leaf, min, max)
                    .map_err(|e| made(call, e))?;
                runner.run_ref(bins, move |_| peak(), move |_| counted())
            }
            Shape::Binning(min, max, _) => {
                let bins = BinningResource::<'static, _, ()>::with_exponents(leaf, min, max)
                    .map_err(|e| made(call, e))?;
                runner.run_default(Owned(bins), move |_| peak(), move |_| counted())
            }
            // On the workload's streams even on one thread: the arena keeps
            // an arena per stream, and on `()` it saw one stream where the
            // trace has several (and held less than the same arena built
            // by the builder, which the timeline and the map watch).
            Shape::Arena(config, _) => {
                let arena = ArenaResource::with_config(leaf, config, stream).map_err(|e| made(call, e))?;
                runner.run_ref(arena, move |_| peak(), move |_| counted())
            }
        })
    }
}

/// Runs a stream-agnostic `&mut self` resource: shared as it is, or on `()`
/// on one thread.
fn run_mut<R, K: Runner>(
    runner: K,
    resource: R,
    peak: impl Fn(&R) -> u64 + Send + Sync + 'static,
    upstream_allocations: impl Fn(&R) -> Option<u64> + Send + Sync + 'static,
) -> K::Output
where
    R: MemoryResourceMut + MemoryResourceMut<SimStream> + Send + 'static,
{
    if runner.shared() {
        runner.run_mut(resource, peak, upstream_allocations)
    } else {
        runner.run_default(resource, peak, upstream_allocations)
    }
}

/// Builds `call` typed when it has one of the shapes (its leaf by
/// `builder`, alone) and hands it to `runner`; gives `runner` back when it
/// has none.
///
/// # Errors
///
/// The stack's errors, at their positions, as the builder gives them.
///
/// # Examples
///
/// ```
/// use memres_bench::typed::{run_typed, Runner};
/// use memres_core::stack::parse;
/// use memres_core::{MemoryResource, MemoryResourceMut, Request};
/// use memres_sim::SimStream;
/// /// Allocates 1000 bytes and tells the peak held from the device.
/// struct Probe(SimStream);
/// impl Runner for Probe {
///     type Output = u64;
///     fn shared(&self) -> bool {
///         true
///     }
///     fn run_mut<R: MemoryResourceMut<SimStream> + Send + 'static>(
///         self, mut r: R, peak: impl Fn(&R) -> u64, _: impl Fn(&R) -> Option<u64>,
///     ) -> u64 {
///         r.allocate(Request::new(1000).unwrap(), &self.0).unwrap();
///         peak(&r)
///     }
///     fn run_ref<R: MemoryResource<SimStream> + Send + Sync + 'static>(
///         self, r: R, peak: impl Fn(&R) -> u64, _: impl Fn(&R) -> Option<u64>,
///     ) -> u64 {
///         r.allocate(Request::new(1000).unwrap(), &self.0).unwrap();
///         peak(&r)
///     }
///     fn run_default<R: MemoryResourceMut + Send + 'static>(
///         self, mut r: R, peak: impl Fn(&R) -> u64, _: impl Fn(&R) -> Option<u64>,
///     ) -> u64 {
///         r.allocate(Request::new(1000).unwrap(), &()).unwrap();
///         peak(&r)
///     }
/// }
/// let (builder, world) = (memres_bench::stack::builder(), memres_sim::SimWorld::new());
/// let stream = world.default_stream();
/// let run = |text| run_typed(&parse(text).unwrap(), &builder, &stream, Probe(world.stream())).unwrap();
/// assert_eq!(run("pool(sim, granule=1MiB)").ok(), Some(1 << 20));
/// assert!(run("pool(limit(sim, 1GiB))").is_err(), "no typed shape: the runner comes back");
/// // A vpool's peak is its committed granules, under `stats` as alone.
/// assert_eq!(run("stats(vpool(sim(1TiB), granule=1MiB))").ok(), Some(1 << 20));
/// assert!(run("stats(vpool(sim(1TiB), per_stream=true))").is_err());
/// ```
pub fn run_typed<K: Runner>(
    call: &Call,
    builder: &StackBuilder<SimStream>,
    stream: &SimStream,
    runner: K,
) -> Result<Result<K::Output, K>, StackError> {
    // A pool per stream has no typed shape: the runner comes back.
    if call.name == "vpool" && call.bool_arg("per_stream")? != Some(true) {
        return run_vpool(call, runner).map(Ok);
    }
    if let Some(pool) = stats_vpool(call) {
        return run_stats_vpool(pool, runner).map(Ok);
    }
    let Some(shape) = shape(call)? else { return Ok(Err(runner)) };
    let leaf = builder.build_call_with_handles(shape.leaf(), stream)?;
    let name = shape.leaf().name.as_str();
    if let Some(sim) = leaf.get::<memres_sim::SimDevice>("sim").filter(|_| name == "sim") {
        return shape.run(call, sim, stream, runner).map(Ok);
    }
    if let Some(host) = leaf.get::<memres_sim::HostMemory>("host").filter(|_| name == "host") {
        return shape.run(call, host, stream, runner).map(Ok);
    }
    // The tool's `cuda` and `async`; without the feature the builder knows
    // no CUDA leaf and has refused it before this.
    #[cfg(feature = "cuda")]
    return crate::cuda::run_typed(shape, call, &leaf, stream, runner).map(Ok);
    #[cfg(not(feature = "cuda"))]
    {
        let leaf = shape.leaf();
        Err(leaf.error(memres_core::stack::StackErrorKind::UnknownName(leaf.name.clone())))
    }
}

/// The `vpool` call of `stats(vpool(...))`, one pool for every stream;
/// anything else (a pool per stream, a bad argument) is left to the
/// builder, which gives its errors.
fn stats_vpool(call: &Call) -> Option<&Call> {
    (call.name == "stats" && call.args.len() == 1)
        .then(|| call.resource(0).ok())
        .flatten()
        .filter(|p| p.name == "vpool" && matches!(p.bool_arg("per_stream"), Ok(None | Some(false))))
}

/// Builds `stats(vpool(sim...))` typed: the counters inside the pool's
/// lock (one thread: no lock), as over a chunk pool.
///
/// # Errors
///
/// As `memres_sim::vpool`.
fn run_stats_vpool<K: Runner>(pool: &Call, runner: K) -> Result<K::Output, StackError> {
    Ok(run_mut(
        runner,
        Statistics::new(memres_sim::vpool(pool)?),
        |s| s.upstream().usage().peak_held,
        |s| Some(s.upstream().space().call_counts().0),
    ))
}

/// Builds `vpool(sim...)` typed, a [`VirtualPool`](memres_core::vpool::VirtualPool)
/// over its own simulated space, and hands it to `runner`.
///
/// # Errors
///
/// As `memres_sim::vpool`.
pub fn run_vpool<K: Runner>(call: &Call, runner: K) -> Result<K::Output, StackError> {
    // Its upstream allocations are the commits (maps) of its space.
    Ok(run_mut(
        runner,
        memres_sim::vpool(call)?,
        |v| v.usage().peak_held,
        |v| Some(v.space().call_counts().0),
    ))
}

/// Why a `fixed` stack cannot replay `workload`: a request larger than its
/// blocks (the resource would refuse it at that op).
pub fn fixed_misfit(block: u64, workload: &Workload) -> Option<String> {
    let (i, op) = workload.ops.iter().enumerate().find(|(_, op)| op.alloc && op.size > block)?;
    Some(format!(
        "fixed: blocks of {block} bytes ({}) serve no larger request, but op {i} of the workload asks for {} bytes",
        crate::report::human_bytes(block),
        op.size
    ))
}
