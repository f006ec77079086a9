//! The replay engine: drives one resource through a decoded [`Workload`].
//!
//! The loop is generic over the resource ([`Replayer`]), so each
//! resource's allocate and free are direct, inlinable calls; it walks the
//! ops with a table of handles indexed by id and does no parsing, hashing
//! or I/O. One untimed warm-up pass runs first (a pool grows to its working
//! size there, as in RMM's harness), then the timed passes: one in
//! `RunOptions::default`, as in RMM's harness; more give the median pass,
//! which a busy machine disturbs less on short workloads (`memres replay`
//! runs three unless told).

use crate::resources::RunError;
use crate::workload::{Op, Workload};
use memres_core::{Block, Error, MemoryResource, MemoryResourceMut, Request, Stream};
use memres_sim::SimStream;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, PoisonError, RwLock};
use std::time::{Duration, Instant};

#[cfg(test)]
mod tests;

/// Sizes are rounded up to this many bytes for every resource.
pub const GRANULE: u64 = 256;

/// A resource as the replay loop sees it.
pub trait Replayer {
    /// What an allocation hands back and its free takes, kept per id.
    type Handle: Copy;

    /// The handle of an id not allocated yet.
    fn vacant(&self) -> Self::Handle;

    /// Allocates `size` bytes (rounded up to [`GRANULE`]) on `stream`.
    ///
    /// # Errors
    ///
    /// The resource's error, e.g. [`Error::OutOfMemory`].
    fn allocate(&mut self, size: u64, stream: u16) -> Result<Self::Handle, Error>;

    /// Frees what `allocate(size, ..)` handed back, on `stream`.
    ///
    /// # Errors
    ///
    /// The resource's error.
    fn deallocate(&mut self, handle: Self::Handle, size: u64, stream: u16) -> Result<(), Error>;

    /// The most bytes held from upstream at once so far: for a resource
    /// over an upstream, the upstream's peak; for one that manages offsets
    /// in a range of its own, the highest end offset it handed out.
    fn peak_upstream(&self) -> u64;

    /// The allocations the resource has made from its upstream so far (its
    /// leaf's count of successful allocations), where the replay can read
    /// it: [`replay`] reads it after the warm-up and after the last pass
    /// for [`Measurement::upstream_allocations_per_pass`]. `None` (the
    /// default) where it cannot: the peers, which have no upstream, and
    /// the CUDA leaves.
    fn upstream_allocations(&self) -> Option<u64> {
        None
    }

    /// Called before each pass: `0` is the warm-up, `1` the first timed
    /// pass; and once after the last one (`passes + 1`), after the figures
    /// are read, to end it. Does nothing unless a resource needs to know (a
    /// log that records one pass, a `planned` layer's steps).
    fn begin_pass(&mut self, _pass: usize) {}
}

/// A `&self` resource driven through `&mut self` calls, so that one
/// [`StreamReplayer`] serves both kinds.
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

/// Where the replay loop finds each op's stream.
pub trait Streams {
    /// The stream type.
    type Stream: Stream + ?Sized;

    /// The stream of the workload's stream `i`.
    fn stream(&self, i: u16) -> &Self::Stream;
}

/// One simulated stream per stream of the workload.
impl Streams for Vec<SimStream> {
    type Stream = SimStream;

    #[inline]
    fn stream(&self, i: u16) -> &SimStream {
        &self[i as usize]
    }
}

/// `()` for every op, the stream of resources for which streams mean
/// nothing (the default stream), with nothing to look up: how one thread
/// replays the stream-agnostic resources (an arena then serves the thread's
/// own arena, as a program on the default stream would).
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultStream;

impl Streams for DefaultStream {
    type Stream = ();

    #[inline]
    fn stream(&self, _: u16) -> &() {
        &()
    }
}

/// Told of each pass before it runs, with the ops' streams.
type OnPass<T> = dyn FnMut(usize, &T);
/// Reads a resource's allocations from upstream so far, where counted.
type CountOf<R> = dyn Fn(&R) -> Option<u64>;

/// A memres resource as the replay loop sees it: each op on the stream
/// `streams` gives for its workload stream, the call direct
/// (monomorphized) for a typed resource.
pub struct StreamReplayer<R, T = Vec<SimStream>> {
    /// The resource.
    pub inner: R,
    /// The ops' streams.
    pub streams: T,
    /// The most bytes held from upstream so far.
    peak: Box<dyn Fn(&R) -> u64>,
    /// The allocations made from upstream so far, where they are counted.
    upstream_allocations: Box<CountOf<R>>,
    /// Told of each pass before it runs (see [`Replayer::begin_pass`]),
    /// with the ops' streams.
    on_pass: Box<OnPass<T>>,
}

impl<R, T> StreamReplayer<R, T> {
    /// `inner` on `streams`, its peak upstream read by `peak`; its
    /// upstream allocations not counted.
    pub fn new(inner: R, streams: T, peak: impl Fn(&R) -> u64 + 'static) -> Self {
        StreamReplayer {
            inner,
            streams,
            peak: Box::new(peak),
            upstream_allocations: Box::new(|_| None),
            on_pass: Box::new(|_, _| {}),
        }
    }

    /// Reads the allocations made from upstream so far with `count` (see
    /// [`Replayer::upstream_allocations`]).
    pub fn upstream_allocations(mut self, count: impl Fn(&R) -> Option<u64> + 'static) -> Self {
        self.upstream_allocations = Box::new(count);
        self
    }

    /// Calls `on_pass` before each pass, with the ops' streams.
    pub fn on_pass(mut self, on_pass: impl FnMut(usize, &T) + 'static) -> Self {
        self.on_pass = Box::new(on_pass);
        self
    }
}

impl<R, T> fmt::Debug for StreamReplayer<R, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamReplayer").finish_non_exhaustive()
    }
}

impl<R: MemoryResourceMut<T::Stream>, T: Streams> Replayer for StreamReplayer<R, T> {
    type Handle = Block;

    fn vacant(&self) -> Block {
        Block::EMPTY
    }

    #[inline]
    fn allocate(&mut self, size: u64, stream: u16) -> Result<Block, Error> {
        self.inner.allocate(Request::new(size)?, self.streams.stream(stream))
    }

    #[inline]
    fn deallocate(&mut self, block: Block, _size: u64, stream: u16) -> Result<(), Error> {
        self.inner.deallocate(block, self.streams.stream(stream))
    }

    fn peak_upstream(&self) -> u64 {
        (self.peak)(&self.inner)
    }

    fn upstream_allocations(&self) -> Option<u64> {
        (self.upstream_allocations)(&self.inner)
    }

    fn begin_pass(&mut self, pass: usize) {
        (self.on_pass)(pass, &self.streams);
    }
}

/// What one replay measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measurement {
    /// Ops in one pass.
    pub ops: u64,
    /// Timed passes run.
    pub passes: u32,
    /// Wall time of the median timed pass (of an even number of passes,
    /// the slower of the two middle ones).
    pub elapsed: Duration,
    /// Wall time of the fastest timed pass: on a busy machine, the one
    /// least disturbed.
    pub fastest: Duration,
    /// CPU time the replaying thread spent in the median timed pass (by
    /// CPU time), where the platform tells it (Linux): unlike wall time,
    /// it leaves out the time the thread waited for a core.
    pub cpu: Option<Duration>,
    /// The most bytes (as requested) live at once.
    pub peak_live: u64,
    /// The most bytes held from upstream at once (warm-up included).
    pub peak_upstream: u64,
    /// Allocations the resource made from its upstream in the timed passes
    /// (the warm-up left out), over the number of timed passes: the mean
    /// per pass. It shows churn: a pool in its steady state makes none.
    /// `None` where the replay cannot count them (see
    /// [`Replayer::upstream_allocations`]) and for replays on threads
    /// ([`replay_threads`]).
    pub upstream_allocations_per_pass: Option<f64>,
}

impl Measurement {
    /// Nanoseconds per op of the median timed pass.
    pub fn ns_per_op(&self) -> f64 {
        if self.ops == 0 {
            return 0.0;
        }
        self.elapsed.as_nanos() as f64 / self.ops as f64
    }

    /// CPU nanoseconds per op of the median timed pass (see
    /// [`Measurement::cpu`]).
    pub fn cpu_ns_per_op(&self) -> Option<f64> {
        let cpu = self.cpu?;
        Some(if self.ops == 0 { 0.0 } else { cpu.as_nanos() as f64 / self.ops as f64 })
    }

    /// Nanoseconds per op of the fastest timed pass.
    pub fn best_ns_per_op(&self) -> f64 {
        if self.ops == 0 {
            return 0.0;
        }
        self.fastest.as_nanos() as f64 / self.ops as f64
    }

    /// Peak bytes held from upstream per peak byte live (`None` when
    /// nothing was ever live).
    pub fn footprint(&self) -> Option<f64> {
        footprint(self.peak_upstream, self.peak_live)
    }
}

/// `held` bytes per byte of `peak_live`: `None` when nothing was ever live,
/// which the tool prints as `-` (an empty CSV field, JSON's `null`).
pub fn footprint(held: u64, peak_live: u64) -> Option<f64> {
    (peak_live > 0).then(|| held as f64 / peak_live as f64)
}

/// A replay that stopped: the op that failed and why.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayError {
    /// Index of the failing op in the workload.
    pub op: usize,
    /// Whether it was an allocation.
    pub alloc: bool,
    /// Its size.
    pub size: u64,
    /// The resource's error.
    pub error: Error,
    /// Why the blocks the replay held when it stopped were left to the
    /// resource, not freed ([`free_held`]): the table that finds them
    /// could not be allocated. `None`: they were freed.
    pub unfreed: Option<TableError>,
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.alloc { "allocation" } else { "free" };
        write!(f, "op {} ({what} of {}) failed: {}", self.op, memres_core::Bytes(self.size), self.error)?;
        match &self.unfreed {
            Some(e) => write!(f, "; the blocks it held are left to the resource: {e}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for ReplayError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Why a replay on threads ([`replay_threads`]) stopped.
#[derive(Debug)]
pub enum ThreadsError {
    /// An op failed, on one of the threads.
    Replay(ReplayError),
    /// A round's thread could not be made (a limit of the process: its
    /// threads, the memory of their stacks); the round ran no op.
    Spawn {
        /// The thread's index.
        thread: usize,
        /// The round's threads.
        threads: usize,
        /// Why.
        error: io::Error,
    },
    /// A round's thread (or the warm-up) could not allocate its table of
    /// handles; the round ran no op.
    Table(TableError),
}

/// A table of one entry per id of the workload (a replay's handles, or
/// which blocks a stopped replay holds) that could not be allocated: a
/// limit of the process's memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableError {
    /// Whose table it was.
    pub of: TableOf,
    /// The ids it was for.
    pub ids: usize,
    /// Its size.
    pub bytes: u64,
}

/// Whose table a [`TableError`] is about, so that its text names the
/// replay that could not run (or could not free what it held).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableOf {
    /// A replay on the calling thread ([`replay`]; the warm-up pass of
    /// [`replay_threads`]).
    Replay,
    /// A thread of a replay on threads ([`replay_threads`]' rounds).
    Thread,
    /// The one pass of `memres steps` ([`crate::stack::run_steps`]).
    Steps,
    /// A watched replay (`--timeline`, `--snapshot`, `--map`:
    /// [`crate::observe::observe`]).
    Watched,
    /// Which blocks a stopped replay holds, to free them ([`free_held`]).
    Held,
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ids, bytes) = (self.ids, memres_core::Bytes(self.bytes));
        let table = match self.of {
            TableOf::Replay => "a replay's table of handles",
            TableOf::Thread => "a replay thread's table of handles",
            TableOf::Steps => "a stepped replay's table of handles",
            TableOf::Watched => "a watched replay's table of handles",
            TableOf::Held => "the table of the blocks a stopped replay holds",
        };
        write!(f, "cannot allocate {table}: {bytes} for {ids} ids")
    }
}

impl std::error::Error for TableError {}

impl From<TableError> for ThreadsError {
    fn from(e: TableError) -> Self {
        ThreadsError::Table(e)
    }
}

impl fmt::Display for ThreadsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThreadsError::Replay(e) => e.fmt(f),
            ThreadsError::Spawn { thread, threads, error } => {
                write!(f, "cannot start replay thread {} of {threads}: {error}", thread + 1)
            }
            ThreadsError::Table(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ThreadsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ThreadsError::Replay(e) => Some(e),
            ThreadsError::Spawn { error, .. } => Some(error),
            ThreadsError::Table(e) => Some(e),
        }
    }
}

impl From<ReplayError> for ThreadsError {
    fn from(e: ReplayError) -> Self {
        ThreadsError::Replay(e)
    }
}

/// Where the threads of a round wait to start together: once every one of
/// them is made and has its table of handles, or never where one could not
/// be made or get its table (a barrier alone would keep the others waiting
/// for it).
struct Start {
    /// Write-locked while the threads are made; then whether all were.
    made: RwLock<bool>,
    /// Whether a thread could not get its table.
    unready: AtomicBool,
    barrier: Barrier,
}

impl Start {
    /// Waits until every thread of the round is made; `false`: not all
    /// could be, and the caller runs nothing.
    fn made(&self) -> bool {
        *self.made.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for every thread of the round, the caller `ready` or not:
    /// whether all were, and the round runs.
    fn arrive(&self, ready: bool) -> bool {
        if !ready {
            // The barrier orders this store before the loads after it.
            self.unready.store(true, Ordering::Relaxed);
        }
        self.barrier.wait();
        !self.unready.load(Ordering::Relaxed)
    }
}

/// A thread of the round on its way to the start gate. Dropped before it
/// gets there (a panic in `setup` or in getting its table), it arrives
/// there not ready on its way out, so that the other threads are let go
/// and run nothing, and the panic goes on to the caller.
struct Arriving<'a>(Option<&'a Start>);

impl Arriving<'_> {
    /// Arrives with `table`, the caller's: the table to run with, `None`
    /// where another thread was not ready and none runs, or the caller's
    /// error.
    fn ready<H>(mut self, table: Result<Vec<H>, TableError>) -> Result<Option<Vec<H>>, TableError> {
        let start = self.0.take().expect("a thread arrives once");
        let all = start.arrive(table.is_ok());
        Ok(all.then_some(table?))
    }
}

impl Drop for Arriving<'_> {
    fn drop(&mut self) {
        if let Some(start) = self.0.take() {
            start.arrive(false);
        }
    }
}

/// Runs `work(stream, handles)` on a thread of its own per stream, with
/// a table of handles of its own for `ids` ids (see [`table`]), once every
/// thread is made and has its table; `setup(i)` runs first on each. Their
/// results, in order.
///
/// # Errors
///
/// [`ThreadsError::Spawn`] where a thread could not be made,
/// [`ThreadsError::Table`] where one could not get its table: the others
/// end without running; else the first thread's (in order) that failed.
///
/// # Panics
///
/// With the first thread's (in order) panic, once every thread has ended:
/// one that panics in `setup` lets the others go without running.
fn on_threads<S, T>(
    streams: &[S],
    ids: u32,
    setup: &(dyn Fn(usize) + Sync),
    work: impl Fn(&S, &mut [Block]) -> Result<T, ReplayError> + Sync,
) -> Result<Vec<T>, ThreadsError>
where
    S: Sync,
    T: Send,
{
    let start = Start {
        made: RwLock::new(false),
        unready: AtomicBool::new(false),
        barrier: Barrier::new(streams.len()),
    };
    // On each thread: `None` where it did not run.
    let run = |i: usize, stream: &S| -> Option<Result<T, ThreadsError>> {
        if !start.made() {
            return None;
        }
        let arriving = Arriving(Some(&start));
        setup(i);
        // After every thread is made, so that a table that does not fit is
        // told apart from a thread that cannot be made.
        let mut handles = match arriving.ready(table(TableOf::Thread, Block::EMPTY, ids as usize)) {
            Ok(handles) => handles?,
            Err(e) => return Some(Err(e.into())),
        };
        Some(work(stream, &mut handles).map_err(ThreadsError::from))
    };
    std::thread::scope(|scope| {
        let mut made = start.made.write().unwrap_or_else(PoisonError::into_inner);
        let mut workers = Vec::with_capacity(streams.len());
        let mut failed = None;
        for (i, stream) in streams.iter().enumerate() {
            let run = &run;
            match std::thread::Builder::new().spawn_scoped(scope, move || run(i, stream)) {
                Ok(worker) => workers.push(worker),
                Err(error) => {
                    failed = Some(ThreadsError::Spawn { thread: i, threads: streams.len(), error });
                    break;
                }
            }
        }
        *made = failed.is_none();
        drop(made);
        // Every thread joined before a panic of one goes on to the caller.
        let joined: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        let mut done = Vec::with_capacity(joined.len());
        for result in joined {
            done.push(result.unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
        }
        failed.map_or_else(|| done.into_iter().flatten().collect(), Err)
    })
}

/// A table of handles for `ids` ids, each `vacant`, allocated fallibly: one
/// per replaying thread, a large trace's under a limit of the process's
/// memory may not fit.
///
/// # Errors
///
/// [`TableError`], naming whose table (`of`) and its size, where it cannot
/// be allocated.
pub fn table<H: Clone>(of: TableOf, vacant: H, ids: usize) -> Result<Vec<H>, TableError> {
    let mut handles = Vec::new();
    handles.try_reserve_exact(ids).map_err(|_| TableError {
        of,
        ids,
        bytes: (ids as u64).saturating_mul(size_of::<H>() as u64),
    })?;
    handles.resize(ids, vacant);
    Ok(handles)
}

/// The most timed passes a replay takes: each pass's time is kept, for
/// the median (some 40 bytes a pass). `--passes 4294967295` grew them
/// without bound until the host ran out of memory and the process aborted.
pub const MAX_PASSES: u32 = 1_000_000;

/// Ops between two calls of the progress callback (and two clock reads).
pub const CHUNK: usize = 1 << 16;

/// Replays `workload` on `resource`: a warm-up pass, then `passes` timed
/// passes (at least one). `progress` is told how many ops each chunk of
/// [`CHUNK`] ops did, outside the timed regions.
///
/// # Errors
///
/// [`RunError::Replay`]: the first op that fails, with the resource's
/// error; the blocks the pass held are freed first ([`free_held`]), so
/// that what the resource still holds then is its own.
/// [`RunError::Table`]: the table of handles ([`table`]) does not fit in
/// the process's memory; no op ran.
pub fn replay<R: Replayer>(
    resource: &mut R,
    workload: &Workload,
    passes: u32,
    progress: &mut dyn FnMut(usize),
) -> Result<Measurement, RunError> {
    let passes = passes.max(1);
    let mut handles = table(TableOf::Replay, resource.vacant(), workload.ids as usize)?;
    resource.begin_pass(0);
    run_pass(resource, workload, &mut handles, progress)?;
    let warm = resource.upstream_allocations();
    // Reserved for the usual counts only (`memres replay` takes up to
    // `MAX_PASSES`, some 40 MB of times).
    let mut times = Vec::with_capacity((passes as usize).min(1024));
    let mut cpu_times = Vec::with_capacity((passes as usize).min(1024));
    for p in 0..passes {
        resource.begin_pass(p as usize + 1);
        let (wall, cpu) = run_pass(resource, workload, &mut handles, progress)?;
        times.push(wall);
        cpu_times.push(cpu);
    }
    // Read before the last pass is ended: what ending it takes (a
    // `planned` layer's region for a pass that never runs) is no pass's.
    let (peak_upstream, after) = (resource.peak_upstream(), resource.upstream_allocations());
    resource.begin_pass(passes as usize + 1);
    times.sort_unstable();
    let cpu = cpu_times.iter().copied().collect::<Option<Vec<Duration>>>().map(|mut c| {
        c.sort_unstable();
        c[c.len() / 2]
    });
    Ok(Measurement {
        ops: workload.ops.len() as u64,
        passes,
        elapsed: times[times.len() / 2],
        fastest: times[0],
        cpu,
        peak_live: workload.peak_live,
        peak_upstream,
        upstream_allocations_per_pass: warm
            .zip(after)
            .map(|(a, b)| b.saturating_sub(a) as f64 / f64::from(passes)),
    })
}

/// One pass over the ops, timed in chunks of [`CHUNK`]: its wall time and,
/// where the platform tells it, the CPU time the thread spent.
///
/// # Errors
///
/// As [`replay`]; the blocks the pass held when it stopped are freed
/// first ([`free_held`]).
pub fn run_pass<R: Replayer>(
    resource: &mut R,
    workload: &Workload,
    handles: &mut [R::Handle],
    progress: &mut dyn FnMut(usize),
) -> Result<(Duration, Option<Duration>), ReplayError> {
    let mut elapsed = Duration::ZERO;
    let mut cpu = Some(Duration::ZERO);
    for (c, chunk) in workload.ops.chunks(CHUNK).enumerate() {
        let cpu_start = thread_cpu_time();
        let start = Instant::now();
        run_ops(resource, chunk, c * CHUNK, handles)
            .map_err(|e| free_held(resource, &workload.ops, e, handles))?;
        elapsed += start.elapsed();
        cpu = match (cpu, cpu_start, thread_cpu_time()) {
            (Some(sum), Some(a), Some(b)) => Some(sum + b.saturating_sub(a)),
            _ => None,
        };
        progress(chunk.len());
    }
    Ok((elapsed, cpu))
}

/// CPU time the calling thread has used, where the platform tells it.
pub fn thread_cpu_time() -> Option<Duration> {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a live, writable `timespec`, the only memory
        // `clock_gettime` writes; the clock id is a valid constant.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        if rc != 0 {
            return None;
        }
        Some(Duration::new(u64::try_from(ts.tv_sec).ok()?, u32::try_from(ts.tv_nsec).ok()?))
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// A replay pass with no progress and no timing, for benchmarks: the ops
/// of `workload` in order.
///
/// # Errors
///
/// As [`replay`].
#[inline]
pub fn pass<R: Replayer>(
    resource: &mut R,
    workload: &Workload,
    handles: &mut [R::Handle],
) -> Result<(), ReplayError> {
    run_ops(resource, &workload.ops, 0, handles).map_err(|e| free_held(resource, &workload.ops, e, handles))
}

/// The blocks a pass over `ops` holds when it stopped at op `stopped`:
/// the allocations before it that no op before it freed, the last
/// allocated first. With `refused`, op `stopped` failed, and if it is a
/// free its block is left out: it is not asked again, its block is as the
/// resource left it.
///
/// # Errors
///
/// [`TableError`] ([`TableOf::Held`]) where its table, an entry per id of
/// the `ids`, cannot be allocated: as large as the trace's ids, it may not
/// fit where the replay stopped for want of memory.
pub(crate) fn held(
    ops: &[Op],
    stopped: usize,
    refused: bool,
    ids: usize,
) -> Result<impl Iterator<Item = Op> + '_, TableError> {
    let done = &ops[..stopped.min(ops.len())];
    let mut live = table(TableOf::Held, false, ids)?;
    for op in done {
        live[op.id as usize] = op.alloc;
    }
    if let Some(op) = ops.get(stopped).filter(|op| refused && !op.alloc) {
        live[op.id as usize] = false;
    }
    Ok(done.iter().rev().filter(move |op| op.alloc && live[op.id as usize]).copied())
}

/// Frees, each on its allocation's stream, the blocks a pass over `ops`
/// held when it stopped at the failed op of `error` (as `held` finds them), and
/// returns the error: a workload frees every block it allocates, so a
/// replay that ran to the end holds nothing, and one that stopped early
/// leaves nothing to a resource's leak report (a `track` layer's, when the
/// stack is dropped) that the workload would have freed. Their own errors
/// are dropped: the replay's error is the op's. Where `held` cannot
/// allocate its table, none is freed and the error says why
/// ([`ReplayError::unfreed`]).
pub fn free_held<R: Replayer>(
    resource: &mut R,
    ops: &[Op],
    mut error: ReplayError,
    handles: &[R::Handle],
) -> ReplayError {
    match held(ops, error.op, true, handles.len()) {
        Ok(blocks) => {
            for op in blocks {
                let _ = resource.deallocate(handles[op.id as usize], op.size, op.stream);
            }
        }
        Err(e) => error.unfreed = Some(e),
    }
    error
}

/// [`free_held`] of a pass on `stream` through a shared resource.
fn free_held_shared<R, S>(
    resource: &R,
    stream: &S,
    ops: &[Op],
    mut error: ReplayError,
    handles: &[Block],
) -> ReplayError
where
    R: MemoryResource<S> + ?Sized,
    S: Stream + ?Sized,
{
    match held(ops, error.op, true, handles.len()) {
        Ok(blocks) => {
            for op in blocks {
                let _ = resource.deallocate(handles[op.id as usize], stream);
            }
        }
        Err(e) => error.unfreed = Some(e),
    }
    error
}

/// Replays `ops`, the first of them op number `first` of the workload (for
/// the error).
#[inline]
pub(crate) fn run_ops<R: Replayer>(
    resource: &mut R,
    ops: &[Op],
    first: usize,
    handles: &mut [R::Handle],
) -> Result<(), ReplayError> {
    for (i, op) in ops.iter().enumerate() {
        let slot = &mut handles[op.id as usize];
        let done = if op.alloc {
            resource.allocate(op.size, op.stream).map(|h| *slot = h)
        } else {
            resource.deallocate(*slot, op.size, op.stream)
        };
        if let Err(error) = done {
            return Err(ReplayError { op: first + i, alloc: op.alloc, size: op.size, error, unfreed: None });
        }
    }
    Ok(())
}

/// Replays `workload` as RMM's harness does with `streams.len()` threads:
/// one untimed warm-up pass on one thread, then `passes` timed rounds in
/// which every thread replays the whole op sequence on its own stream,
/// with its own table of handles, through `resource`. ns per op is a
/// round's wall time over `ops × threads`, the wall time from the earliest
/// thread's start to the latest thread's end, each read by the thread
/// itself; CPU time is summed over the threads. `setup(i)` runs first on
/// each thread that replays (`i`: the thread's index; the warm-up runs on
/// the calling thread as index 0).
/// Between the warm-up and the timed rounds, one untimed round, its
/// threads started together as in the timed ones, counts the bytes live
/// over all threads at once (an atomic counter in the timed rounds would
/// time the counter): its most is the peak live figure, not `threads ×`
/// the workload's peak, which the threads seldom reach at once. `peak`
/// reads the peak upstream bytes right after that round, so both figures
/// cover the same ops (the warm-up's live bytes are one thread's, never
/// more than the round's): the footprint compares what was held with what
/// was live together, and is at least 1. Upstream allocations are not
/// counted on threads: `upstream_allocations_per_pass` is `None`.
///
/// # Errors
///
/// The first op that fails (on any thread); a thread that could not be
/// made or could not allocate its table of handles ([`table`]), where its
/// round runs no op.
///
/// # Panics
///
/// With a thread's panic (in `setup`, say), once every thread of its round
/// has ended; one in `setup` before a round keeps that round from running.
pub fn replay_threads<R, S>(
    resource: &R,
    streams: Vec<S>,
    workload: &Workload,
    passes: u32,
    setup: &(dyn Fn(usize) + Sync),
    peak: impl Fn(&R) -> u64,
) -> Result<Measurement, ThreadsError>
where
    R: MemoryResource<S> + Sync,
    S: Stream + Send + Sync,
{
    let threads = streams.len().max(1);
    let passes = passes.max(1);
    if let Some(first) = streams.first() {
        setup(0);
        let mut handles = table(TableOf::Replay, Block::EMPTY, workload.ids as usize)?;
        shared_pass(resource, first, workload, &mut handles)?;
    }
    // Before the timed rounds, so that the held peak read next is that of
    // the rounds whose live bytes were counted, not of a later round whose
    // threads overlapped more.
    let peak_live = counted_round(resource, &streams, workload, setup)?;
    let peak_upstream = peak(resource);
    // Reserved for the usual counts only (`memres replay` takes up to
    // `MAX_PASSES`, some 40 MB of times).
    let mut times = Vec::with_capacity((passes as usize).min(1024));
    let mut cpu_times = Vec::with_capacity((passes as usize).min(1024));
    for _ in 0..passes {
        // Each worker reads the clock itself, right after the barrier and
        // at its end: read by the main thread once woken after the
        // barrier, a round's start came late on a busy machine (after most
        // of the round, with more threads than cores).
        let results = on_threads(&streams, workload.ids, setup, |stream, handles| {
            let start = Instant::now();
            let cpu_start = thread_cpu_time();
            shared_pass(resource, stream, workload, handles)?;
            let cpu = match (cpu_start, thread_cpu_time()) {
                (Some(a), Some(b)) => Some(b.saturating_sub(a)),
                _ => None,
            };
            Ok((start, Instant::now(), cpu))
        })?;
        let mut cpu = Some(Duration::ZERO);
        let mut span: Option<(Instant, Instant)> = None;
        for (start, end, c) in results {
            cpu = cpu.zip(c).map(|(a, b)| a + b);
            span = Some(span.map_or((start, end), |(s, e)| (s.min(start), e.max(end))));
        }
        // The earliest start to the latest end.
        let wall = span.map_or(Duration::ZERO, |(start, end)| end.saturating_duration_since(start));
        times.push(wall);
        cpu_times.push(cpu);
    }
    times.sort_unstable();
    let cpu = cpu_times.iter().copied().collect::<Option<Vec<Duration>>>().map(|mut c| {
        c.sort_unstable();
        c[c.len() / 2]
    });
    Ok(Measurement {
        ops: workload.ops.len() as u64 * threads as u64,
        passes,
        elapsed: times[times.len() / 2],
        fastest: times[0],
        cpu,
        peak_live,
        peak_upstream,
        upstream_allocations_per_pass: None,
    })
}

/// One round of [`replay_threads`] that counts the bytes live over all
/// threads: the most at once.
fn counted_round<R, S>(
    resource: &R,
    streams: &[S],
    workload: &Workload,
    setup: &(dyn Fn(usize) + Sync),
) -> Result<u64, ThreadsError>
where
    R: MemoryResource<S> + Sync,
    S: Stream + Send + Sync,
{
    let (live, most) = (AtomicU64::new(0), AtomicU64::new(0));
    // The threads start together, as in the timed rounds: started one by
    // one, a short workload's threads may not overlap at all.
    on_threads(streams, workload.ids, setup, |stream, handles| {
        for (i, op) in workload.ops.iter().enumerate() {
            let slot = &mut handles[op.id as usize];
            let done = if op.alloc {
                Request::new(op.size).and_then(|r| resource.allocate(r, stream)).map(|b| {
                    *slot = b;
                    let now = live.fetch_add(op.size, Ordering::Relaxed) + op.size;
                    most.fetch_max(now, Ordering::Relaxed);
                })
            } else {
                live.fetch_sub(op.size, Ordering::Relaxed);
                resource.deallocate(*slot, stream)
            };
            if let Err(error) = done {
                let e = ReplayError { op: i, alloc: op.alloc, size: op.size, error, unfreed: None };
                return Err(free_held_shared(resource, stream, &workload.ops, e, handles));
            }
        }
        Ok(())
    })?;
    Ok(most.into_inner())
}

/// One pass of `workload` on `stream` through a shared resource.
///
/// # Errors
///
/// As [`replay`]; the blocks the pass held are freed first.
#[inline]
pub fn shared_pass<R, S>(
    resource: &R,
    stream: &S,
    workload: &Workload,
    handles: &mut [Block],
) -> Result<(), ReplayError>
where
    R: MemoryResource<S> + ?Sized,
    S: Stream + ?Sized,
{
    for (i, op) in workload.ops.iter().enumerate() {
        let slot = &mut handles[op.id as usize];
        let done = if op.alloc {
            Request::new(op.size).and_then(|r| resource.allocate(r, stream)).map(|b| *slot = b)
        } else {
            resource.deallocate(*slot, stream)
        };
        if let Err(error) = done {
            let e = ReplayError { op: i, alloc: op.alloc, size: op.size, error, unfreed: None };
            return Err(free_held_shared(resource, stream, &workload.ops, e, handles));
        }
    }
    Ok(())
}
