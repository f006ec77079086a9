//! The names `memres replay --resource` knows: aliases of stack strings
//! over the chosen upstream, the peers, and the plain CUDA resources.
//!
//! | name | stack string (`UP`: the `--upstream`'s leaf, `sim(1TiB)` by default) |
//! | --- | --- |
//! | `pool`, `pool:SIZE` | `pool(UP)`, `pool(UP, initial=SIZE)` |
//! | `rmm-pool` | `pool(UP, growth=double, release=false)`: RMM's pool grown from zero |
//! | `fixed:SIZE` | `fixed(UP, SIZE)` |
//! | `binning` | `binning(UP)` |
//! | `arena`, `arena:SIZE` | `arena(UP)`, `arena(UP, initial=SIZE)` |
//! | `vpool` | `vpool(sim(1TiB))` (`--upstream sim` only) |
//! | `stream-pool` | `stream(pool(UP))` |
//! | `stats-pool` | `stats(pool(UP))` |
//!
//! They are built and replayed as any `--stack` is ([`crate::stack`]); the
//! peers (`offset-allocator`, `range-alloc`: [`crate::peers`]) and the
//! plain CUDA rows (`cuda`, `async`, feature `cuda`) are replayed as they
//! are. Adding a name is one line in [`RESOURCES`].

use crate::peers::{OffsetReplayer, RangeReplayer};
use crate::replay::{replay, Measurement, ReplayError, TableError, ThreadsError};
use crate::stack::run_stack;
use crate::workload::Workload;
use std::fmt;
use std::str::FromStr;

#[cfg(test)]
mod tests;

/// Which upstream the memres resources take memory from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UpstreamKind {
    /// A [`SimDevice`](memres_sim::SimDevice) of [`UpstreamKind::SIM_CAPACITY`] bytes: no bytes behind it.
    #[default]
    Sim,
    /// [`HostMemory`](memres_sim::HostMemory): real host bytes.
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

    /// The leaf of a stack string that stands for it.
    ///
    /// ```
    /// use memres_bench::resources::UpstreamKind;
    /// assert_eq!(UpstreamKind::Sim.leaf(), "sim(1TiB)");
    /// assert_eq!(UpstreamKind::Async.leaf(), "async");
    /// ```
    pub fn leaf(self) -> &'static str {
        match self {
            UpstreamKind::Sim => "sim(1TiB)",
            UpstreamKind::Host => "host",
            UpstreamKind::Cuda => "cuda",
            UpstreamKind::Async => "async",
        }
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
    /// The resource's parameter (`fixed:SIZE`: the block size; `pool:SIZE`,
    /// `arena:SIZE`: the initial size).
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
    /// The run could not write what it makes (a `log` layer's rows).
    Output(String),
    /// A thread of a replay on threads could not be made
    /// ([`ThreadsError::Spawn`]).
    Spawn(String),
    /// A replay's table of handles (on threads, a thread's:
    /// [`ThreadsError::Table`]) could not be allocated.
    Table(TableError),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Unsupported(what) => f.write_str(what),
            RunError::Replay(e) => e.fmt(f),
            RunError::Output(what) | RunError::Spawn(what) => f.write_str(what),
            RunError::Table(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Unsupported(_) | RunError::Output(_) | RunError::Spawn(_) => None,
            RunError::Replay(e) => Some(e),
            RunError::Table(e) => Some(e),
        }
    }
}

impl From<ReplayError> for RunError {
    fn from(e: ReplayError) -> Self {
        RunError::Replay(e)
    }
}

impl From<TableError> for RunError {
    fn from(e: TableError) -> Self {
        RunError::Table(e)
    }
}

impl From<ThreadsError> for RunError {
    fn from(e: ThreadsError) -> Self {
        match e {
            ThreadsError::Replay(e) => RunError::Replay(e),
            spawn @ ThreadsError::Spawn { .. } => RunError::Spawn(spawn.to_string()),
            ThreadsError::Table(e) => RunError::Table(e),
        }
    }
}

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

/// What an entry replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A stack string: `{up}` stands for the upstream's leaf, `{size}` for
    /// the parameter; the second form is the one with a parameter.
    Stack(&'static str, Option<&'static str>),
    /// `offset-allocator`.
    OffsetAllocator,
    /// `range-alloc`.
    RangeAlloc,
    /// A plain CUDA resource, whatever `--upstream` says (feature `cuda`).
    Cuda(UpstreamKind),
}

/// One entry of the registry.
#[derive(Clone, Copy, Debug)]
pub struct Resource {
    /// The name on the command line.
    pub name: &'static str,
    /// One line on what it is.
    pub about: &'static str,
    /// The parameter after `name:`.
    pub param: Param,
    /// What it replays.
    pub kind: Kind,
    /// Runs only over the simulated device (left out of the default list
    /// for other upstreams).
    pub sim_only: bool,
}

const fn alias(name: &'static str, text: &'static str, about: &'static str) -> Resource {
    Resource { name, about, param: Param::None, kind: Kind::Stack(text, None), sim_only: false }
}

/// Every resource the tool knows, by name.
pub const RESOURCES: &[Resource] = &[
    Resource {
        param: Param::OptionalSize,
        kind: Kind::Stack("pool({up})", Some("pool({up}, initial={size})")),
        ..alias("pool", "", "memres CoalescingPool, grown from zero over the upstream, or pool:SIZE with an initial size as RMM's harness's pool (behind a spin lock with --streams)")
    },
    alias("rmm-pool", "pool({up}, growth=double, release=false)", "memres CoalescingPool grown as RMM's pool_memory_resource from zero: doubles (grows by max(request, pool size)), never gives chunks back before growing; memres's placement, not RMM's exact best fit; the RMM column of footprint tables"),
    Resource {
        param: Param::Size,
        kind: Kind::Stack("fixed({up})", Some("fixed({up}, {size})")),
        ..alias("fixed", "", "memres FixedSizeResource, fixed:SIZE blocks of SIZE bytes (128 per chunk); larger requests are an error")
    },
    alias("binning", "binning({up})", "memres BinningResource as in RMM's harness: fixed bins 256 KiB..4 MiB, larger requests straight to the upstream"),
    Resource {
        param: Param::OptionalSize,
        kind: Kind::Stack("arena({up})", Some("arena({up}, initial={size})")),
        ..alias("arena", "", "memres ArenaResource over the upstream, or arena:SIZE with an initial global arena of SIZE bytes (RMM's takes half the device up front)")
    },
    Resource {
        sim_only: true,
        ..alias("vpool", "vpool(sim(1TiB))", "memres VirtualPool: 64 GiB reserved in 2 MiB granules, free memory kept mapped up to 1.04x the peak in use (sim only; footprint: peak committed)")
    },
    alias("stream-pool", "stream(pool({up}))", "memres StreamOrdered over a CoalescingPool, one simulated stream per workload stream or thread"),
    alias("stats-pool", "stats(pool({up}))", "memres Statistics over a CoalescingPool, inside its lock with --streams (the cost of the counters)"),
    Resource { kind: Kind::OffsetAllocator, ..alias("offset-allocator", "", "crate offset-allocator 0.2 (peer, 256-byte units)") },
    Resource { kind: Kind::RangeAlloc, ..alias("range-alloc", "", "crate range-alloc 0.1 (peer, 256-byte units)") },
    Resource {
        kind: Kind::Cuda(UpstreamKind::Cuda),
        ..alias("cuda", "", "cuMemAlloc itself, whatever --upstream says (feature cuda)")
    },
    Resource {
        kind: Kind::Cuda(UpstreamKind::Async),
        ..alias("async", "", "cuMemAllocAsync's pool itself, whatever --upstream says (feature cuda)")
    },
];

impl Resource {
    /// The stack string it stands for over `upstream`, with `param`
    /// (rounded up to 256 bytes as an initial size); `None` for the peers
    /// and the plain CUDA rows.
    ///
    /// ```
    /// use memres_bench::resources::{find, UpstreamKind};
    /// let pool = find("pool")?;
    /// assert_eq!(pool.stack(UpstreamKind::Sim, None).as_deref(), Some("pool(sim(1TiB))"));
    /// assert_eq!(pool.stack(UpstreamKind::Host, Some(1000)).as_deref(), Some("pool(host, initial=1024)"));
    /// assert_eq!(find("fixed")?.stack(UpstreamKind::Sim, Some(1 << 20)).as_deref(), Some("fixed(sim(1TiB), 1048576)"));
    /// assert!(find("range-alloc")?.stack(UpstreamKind::Sim, None).is_none());
    /// # Ok::<(), String>(())
    /// ```
    pub fn stack(&self, upstream: UpstreamKind, param: Option<u64>) -> Option<String> {
        let Kind::Stack(plain, with_size) = self.kind else { return None };
        let text = match (param, with_size) {
            (Some(size), Some(with_size)) => {
                // An initial size is a multiple of 256; a block size is any.
                // A size past the last multiple of 256 takes that one, which
                // the stack then refuses as above any request.
                let up = || size.checked_next_multiple_of(256).unwrap_or(!255);
                let size = if self.param == Param::OptionalSize { up() } else { size };
                with_size.replace("{size}", &size.to_string())
            }
            _ => plain.to_string(),
        };
        Some(text.replace("{up}", upstream.leaf()))
    }

    /// Whether the resource can run as `options` say, told before any
    /// replay: its size, its upstream, threads, the tool's features.
    ///
    /// # Errors
    ///
    /// Why it cannot, to print as bad usage.
    pub fn check(&self, options: &RunOptions) -> Result<(), String> {
        if self.param == Param::Size && options.param.is_none() {
            return Err(format!("{0} needs a size: {0}:SIZE", self.name));
        }
        if self.sim_only && options.upstream != UpstreamKind::Sim {
            return Err(format!(
                "{} maps granules of a simulated address space: it runs only with --upstream sim, not {}",
                self.name, options.upstream
            ));
        }
        let peer = matches!(self.kind, Kind::OffsetAllocator | Kind::RangeAlloc);
        if peer && options.threads.is_some() {
            return Err(format!("{} cannot be shared between threads (--streams)", self.name));
        }
        if matches!(self.kind, Kind::Cuda(_)) && !cfg!(feature = "cuda") {
            return Err(format!("resource `{}` needs the tool built with `--features cuda`", self.name));
        }
        if let (Some(threads), Some(text)) = (options.threads, self.stack(options.upstream, options.param)) {
            crate::stack::check_threads(&text, threads)?;
        }
        Ok(())
    }

    /// The upstream it replays over when `--upstream` is `upstream`: `None`
    /// for a peer, which keeps its own books.
    pub fn upstream(&self, upstream: UpstreamKind) -> Option<UpstreamKind> {
        match self.kind {
            Kind::Stack(..) => Some(upstream),
            Kind::OffsetAllocator | Kind::RangeAlloc => None,
            Kind::Cuda(kind) => Some(kind),
        }
    }

    /// Replays `workload` as `options` say: on threads when
    /// [`RunOptions::threads`] is set.
    ///
    /// # Errors
    ///
    /// [`RunError::Unsupported`] for a mode, an upstream or a workload the
    /// resource cannot run; the run's error.
    pub fn run(
        &self,
        workload: &Workload,
        options: &RunOptions,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Measurement, RunError> {
        self.check(options).map_err(RunError::Unsupported)?;
        match self.kind {
            Kind::Stack(..) => {
                let text = self.stack(options.upstream, options.param).expect("a stack alias");
                run_stack(&text, workload, options, progress)
            }
            Kind::OffsetAllocator => {
                Ok(replay(&mut OffsetReplayer::new(workload), workload, options.passes, progress)?)
            }
            Kind::RangeAlloc => Ok(replay(&mut RangeReplayer::new(), workload, options.passes, progress)?),
            #[cfg(feature = "cuda")]
            Kind::Cuda(kind) => crate::cuda::run_plain(kind, workload, options, progress),
            #[cfg(not(feature = "cuda"))]
            Kind::Cuda(_) => unreachable!("refused by `check`"),
        }
    }
}

/// The name as the tool lists it: `fixed:SIZE`, `pool[:SIZE]`.
pub fn spelled(r: &Resource) -> String {
    match r.param {
        Param::Size => format!("{}:SIZE", r.name),
        Param::OptionalSize => format!("{}[:SIZE]", r.name),
        Param::None => r.name.to_string(),
    }
}

/// Looks a resource up by name (without its parameter).
///
/// # Errors
///
/// A message that lists the known names and suggests the nearest.
pub fn find(name: &str) -> Result<&'static Resource, String> {
    RESOURCES.iter().find(|r| r.name == name).ok_or_else(|| {
        let known: Vec<_> = RESOURCES.iter().map(spelled).collect();
        let mut message = format!("unknown resource `{name}` (known: {})", known.join(", "));
        if let Some(n) = crate::names::nearest(name, RESOURCES.iter().map(|r| r.name)) {
            message.push_str(&format!("; did you mean `{n}`?"));
        }
        message
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
            _ => Err(format!("bad size `{p}` in `{spec}` (e.g. 1MiB, 1mb, 65536)")),
        },
    }
}
