//! Soak test: many threads, many operations, seven shared resources (the
//! pool, fixed-size, binning, arena, stream-ordered and virtual-pool
//! resources, and `planned`), over a simulated device; at the end nothing
//! may be lost.
//!
//! ```text
//! soak --threads T --ops N [--resource pool|fixed|binning|arena|stream-pool|vpool|planned|all] [--seed S]
//! ```
//!
//! Each of `T` threads runs `N` operations (an allocation of a random size,
//! or a free of a random live block) through the resource. Now and then a
//! thread hands a live block to a mailbox and another thread frees it: on
//! its own stream for the stream-ordered resources, which allow a free on
//! another stream than the allocation. Every `2^20` operations of each
//! thread the threads meet and the resource's invariant checker runs.
//!
//! What is checked: every block is aligned, as large as asked and overlaps
//! no live block (the caller's view, `LiveBlocks`); no call fails; after the
//! last free a `Tracking` adaptor has no outstanding allocation, the
//! resource counts no byte in use and its checker passes; after the
//! resource gives its memory back (`release`, `trim`) the simulated device
//! holds no byte; on the streams, every reuse of freed memory on another
//! stream is ordered after the free (`HbChecked`). Any loss prints what was
//! lost and the exit status is 1.
//!
//! `planned` runs a training loop instead (a plan needs the allocations of
//! a step in the same order every step): thread 0 steps and allocates,
//! every thread frees (see `soak_planned`).
//!
//! Not run in CI: `cargo run --release -p memres-tests --bin soak -- --threads 2 --ops 10000000 --resource all`.

use memres_core::adaptor::Tracking;
use memres_core::arena::{ArenaConfig, ArenaResource};
use memres_core::binning::BinningResource;
use memres_core::check::LiveBlocks;
use memres_core::check::Violation;
use memres_core::fixed::{FixedConfig, FixedSizeResource};
use memres_core::planned::Planned;
use memres_core::pool::CoalescingPool;
use memres_core::stream_ordered::StreamOrdered;
use memres_core::testing::SplitMix64;
use memres_core::vpool::{VirtualConfig, VirtualPool};
use memres_core::{Block, Error, Inspect, MemoryResource, MemoryResourceMut, Request, Shared, Stream, Usage};
use memres_sim::{HbChecked, SimAddressSpace, SimDevice, SimStream, SimWorld};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Instant;

const USAGE: &str =
    "usage: soak --threads T --ops N [--resource pool|fixed|binning|arena|stream-pool|vpool|planned|all] [--seed S]";

/// Capacity of the simulated device: far above what the workload holds, so
/// that running out of memory is a failure too.
const DEVICE: u64 = 1 << 40;
/// Each thread holds about this many live blocks.
const LIVE_TARGET: u64 = 256;
/// The threads meet to run the checker every this many operations.
const CHECK_EVERY: u64 = 1 << 20;

const KINDS: [&str; 7] = ["pool", "fixed", "binning", "arena", "stream-pool", "vpool", "planned"];

struct Args {
    threads: usize,
    ops: u64,
    kinds: Vec<&'static str>,
    seed: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { threads: 2, ops: 100_000, kinds: Vec::new(), seed: 1 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|e| format!("{flag} {value}: {e}"));
        match flag.as_str() {
            "--threads" => args.threads = number()?.clamp(1, 64) as usize,
            "--ops" => args.ops = number()?,
            "--seed" => args.seed = number()?,
            "--resource" => {
                for name in value.split(',') {
                    match name {
                        "all" => args.kinds.extend(KINDS),
                        _ => args.kinds.push(
                            KINDS
                                .iter()
                                .find(|k| **k == name)
                                .ok_or_else(|| format!("unknown resource {name}"))?,
                        ),
                    }
                }
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if args.kinds.is_empty() {
        args.kinds.extend(KINDS);
    }
    Ok(args)
}

/// The workload's knobs for one resource.
#[derive(Clone, Copy)]
struct Workload {
    /// Largest request.
    max_size: u64,
    /// Largest alignment asked for (256: the default only).
    max_align: u64,
    /// Whether a block may be freed on another stream than its allocation.
    cross_stream: bool,
}

/// What a run found.
#[derive(Default)]
struct Outcome {
    ops: u64,
    allocations: u64,
    frees: u64,
    handed_over: u64,
    checks: u64,
    peak_used: u64,
    seconds: f64,
    losses: Vec<String>,
}

impl Outcome {
    fn lose(&mut self, what: impl Into<String>) {
        self.losses.push(what.into());
    }

    /// Takes the threads' losses and the caller's peak from `shared` once
    /// every thread is done: a loss too for each block still live in the
    /// caller's view, and for allocations not matched by frees.
    fn settle<E>(&mut self, shared: &Shared2<E>) {
        self.losses = std::mem::take(&mut *shared.losses.lock().unwrap());
        let (live, peak) = std::mem::take(&mut *shared.live.lock().unwrap());
        self.peak_used = peak;
        if !live.is_empty() {
            self.lose(format!(
                "{} blocks of {} bytes still live in the caller's view",
                live.len(),
                live.bytes()
            ));
        }
        if self.allocations != self.frees {
            self.lose(format!("{} allocations but {} frees", self.allocations, self.frees));
        }
    }
}

/// The caller's view shared by all threads, and the mailbox of blocks on
/// their way to another thread.
struct Shared2<E> {
    live: Mutex<(LiveBlocks, u64)>,
    /// Each block with an event recorded on the giver's stream after its
    /// last use there: the taker's stream waits on it before the free, as a
    /// program that passes a block to another stream must.
    mailbox: Mutex<Vec<(Block, E)>>,
    losses: Mutex<Vec<String>>,
}

impl<E> Shared2<E> {
    fn lose(&self, what: String) {
        let mut l = self.losses.lock().unwrap();
        if l.len() < 20 {
            l.push(what);
        }
    }

    /// Takes `b`, handed out for `request`, into the live blocks and their
    /// peak; false, a loss noted, where it overlaps one or misses the
    /// request.
    fn took(&self, b: Block, request: Request) -> bool {
        let mut live = self.live.lock().unwrap();
        if let Err(v) = live.0.insert(b, request) {
            drop(live);
            self.lose(format!("{b:?} for {request:?}: {v}"));
            return false;
        }
        live.1 = live.1.max(live.0.bytes());
        true
    }

    /// Takes `b` out of the live blocks before its free; false, a loss
    /// noted, where it is none of them.
    fn giving_back(&self, b: &Block) -> bool {
        let gone = self.live.lock().unwrap().0.remove(b);
        if let Err(v) = &gone {
            self.lose(format!("free of {b:?}: {v}"));
        }
        gone.is_ok()
    }
}

/// A random request: log-uniform size up to `max_size`, now and then a
/// larger alignment.
fn random_request(rng: &mut SplitMix64, w: &Workload) -> Request {
    let bits = 64 - w.max_size.leading_zeros() as u64;
    let e = rng.below(bits + 1);
    let size = (rng.below(1 << e) + 1).min(w.max_size);
    let align = if w.max_align > 256 && rng.below(16) == 0 {
        let steps = w.max_align.trailing_zeros() as u64 - 8;
        1 << (9 + rng.below(steps))
    } else {
        256
    };
    Request::aligned(size, align).expect("valid request")
}

/// Runs `threads` threads of `ops` operations on `resource`, thread `i` on
/// `streams[i]`; `check` runs whenever the threads meet (and at the end).
fn drive<R, S>(
    resource: &R,
    streams: &[S],
    ops: u64,
    seed: u64,
    w: Workload,
    check: &(dyn Fn() -> Result<(), String> + Sync),
    tick: &(dyn Fn() + Sync),
) -> Outcome
where
    R: MemoryResource<S> + Sync,
    S: Stream + Sync,
    S::Event: Send,
{
    let threads = streams.len();
    let shared = Shared2 {
        live: Mutex::new((LiveBlocks::new(), 0)),
        mailbox: Mutex::new(Vec::new()),
        losses: Mutex::new(Vec::new()),
    };
    let barrier = Barrier::new(threads);
    let tracked = Tracking::new(resource);
    let start = Instant::now();
    let counts: Vec<(u64, u64, u64, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (shared, barrier, tracked, stream) = (&shared, &barrier, &tracked, &streams[t]);
                scope.spawn(move || {
                    let mut rng = SplitMix64::new(seed ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                    let mut mine: Vec<Block> = Vec::new();
                    let (mut allocs, mut frees, mut handed, mut checks) = (0u64, 0u64, 0u64, 0u64);
                    let free = |b: Block, stream: &S| {
                        if !shared.giving_back(&b) {
                            return;
                        }
                        if let Err(e) = tracked.deallocate(b, stream) {
                            shared.lose(format!("free of {b:?} failed: {e}"));
                        }
                    };
                    let take_mail = |frees: &mut u64| {
                        let mail = std::mem::take(&mut *shared.mailbox.lock().unwrap());
                        for (b, event) in mail {
                            if w.cross_stream {
                                match stream.wait(&event) {
                                    Ok(()) => free(b, stream),
                                    Err(e) => shared.lose(format!("wait before a free failed: {e}")),
                                }
                            } else {
                                // A block of the `()` stream: any thread.
                                free(b, &streams[0]);
                            }
                            *frees += 1;
                        }
                    };
                    for i in 0..ops {
                        if i % CHECK_EVERY == CHECK_EVERY - 1 {
                            if barrier.wait().is_leader() {
                                checks += 1;
                                if let Err(e) = check() {
                                    shared
                                        .lose(format!("checker after {} operations per thread: {e}", i + 1));
                                }
                            }
                            barrier.wait();
                        }
                        if i % 4096 == 0 {
                            tick();
                        }
                        let n = mine.len() as u64;
                        if n == 0 || rng.below(2 * LIVE_TARGET) >= n {
                            let request = random_request(&mut rng, &w);
                            match tracked.allocate(request, stream) {
                                Ok(b) => {
                                    allocs += 1;
                                    if !shared.took(b, request) {
                                        continue;
                                    }
                                    mine.push(b);
                                }
                                Err(e) => shared.lose(format!("allocation of {request:?} failed: {e}")),
                            }
                        } else if rng.below(64) == 0 {
                            // To the mailbox: another thread frees it.
                            let b = mine.swap_remove(rng.below(n) as usize);
                            match stream.record() {
                                Ok(event) => {
                                    shared.mailbox.lock().unwrap().push((b, event));
                                    handed += 1;
                                }
                                Err(e) => shared.lose(format!("record failed: {e}")),
                            }
                        } else {
                            let b = mine.swap_remove(rng.below(n) as usize);
                            free(b, stream);
                            frees += 1;
                        }
                        if i % 64 == 0 {
                            take_mail(&mut frees);
                        }
                    }
                    barrier.wait();
                    for b in mine.drain(..) {
                        free(b, stream);
                        frees += 1;
                    }
                    take_mail(&mut frees);
                    (allocs, frees, handed, checks)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a soak thread panicked")).collect()
    });
    let mut out =
        Outcome { seconds: start.elapsed().as_secs_f64(), ops: ops * threads as u64, ..Outcome::default() };
    for (a, f, h, c) in counts {
        out.allocations += a;
        out.frees += f;
        out.handed_over += h;
        out.checks += c;
    }
    out.settle(&shared);
    let report = tracked.get_outstanding_allocations();
    if !report.is_empty() {
        out.lose(format!("leaks: {report}"));
    }
    if let Err(e) = check() {
        out.lose(format!("checker at the end: {e}"));
    }
    out.checks += 1;
    out
}

fn device_empty(out: &mut Outcome, dev: &SimDevice) {
    if dev.usage().held != 0 {
        out.lose(format!("the device still holds {} bytes after release", dev.usage().held));
    }
    let (allocs, frees) = dev.call_counts();
    if allocs != frees {
        out.lose(format!("the device saw {allocs} allocations and {frees} frees"));
    }
}

fn used_zero(out: &mut Outcome, what: &str, used: u64) {
    if used != 0 {
        out.lose(format!("{what} counts {used} bytes in use after the last free"));
    }
}

fn units(n: usize) -> Vec<()> {
    vec![(); n]
}

fn soak_pool(a: &Args) -> Outcome {
    let dev = SimDevice::new(DEVICE);
    let pool = Shared::new(CoalescingPool::new(&dev));
    let w = Workload { max_size: 4 << 20, max_align: 64 << 10, cross_stream: false };
    let check = || pool.with(|p| p.check()).map_err(|v| v.to_string());
    let mut out = drive(&pool, &units(a.threads), a.ops, a.seed, w, &check, &|| {});
    used_zero(&mut out, "the pool", pool.with(|p| p.usage().used));
    if let Err(e) = pool.with(|p| p.release(&())) {
        out.lose(format!("release: {e}"));
    }
    device_empty(&mut out, &dev);
    out
}

fn soak_fixed(a: &Args) -> Outcome {
    let dev = SimDevice::new(DEVICE);
    let fixed =
        Shared::new(FixedSizeResource::try_new(&dev, FixedConfig::new(64 << 10)).expect("valid config"));
    let w = Workload { max_size: 64 << 10, max_align: 256, cross_stream: false };
    let check = || fixed.with(|f| f.check()).map_err(|v| v.to_string());
    let mut out = drive(&fixed, &units(a.threads), a.ops, a.seed, w, &check, &|| {});
    used_zero(&mut out, "the fixed-size resource", fixed.with(|f| f.usage().used));
    if let Err(e) = fixed.with(|f| f.release(&())) {
        out.lose(format!("release: {e}"));
    }
    device_empty(&mut out, &dev);
    out
}

fn soak_binning(a: &Args) -> Outcome {
    let dev = SimDevice::new(DEVICE);
    let pool = Shared::new(CoalescingPool::new(&dev));
    // Bins of 256 B to 128 KiB; larger requests go to the pool.
    let bins = BinningResource::<_>::with_exponents(&pool, 8, 17).expect("valid bins");
    let w = Workload { max_size: 1 << 20, max_align: 256, cross_stream: false };
    let check = || {
        bins.check().map_err(|v| v.to_string())?;
        pool.with(|p| p.check()).map_err(|v| v.to_string())
    };
    let mut out = drive(&bins, &units(a.threads), a.ops, a.seed, w, &check, &|| {});
    if let Err(e) = bins.release(&()) {
        out.lose(format!("release of the bins: {e}"));
    }
    used_zero(&mut out, "the pool under the bins", pool.with(|p| p.usage().used));
    if let Err(e) = pool.with(|p| p.release(&())) {
        out.lose(format!("release of the pool: {e}"));
    }
    drop(bins);
    device_empty(&mut out, &dev);
    out
}

/// Each thread on a stream of its own (non-blocking: nothing orders them
/// but the resource's own waits).
fn thread_streams(world: &SimWorld, n: usize) -> Vec<SimStream> {
    (0..n).map(|_| world.non_blocking_stream()).collect()
}

fn soak_arena(a: &Args) -> Outcome {
    let dev = SimDevice::new(DEVICE);
    let world = SimWorld::new();
    let streams = thread_streams(&world, a.threads);
    let arena =
        ArenaResource::with_config(&dev, ArenaConfig::new(), &world.default_stream()).expect("valid config");
    let w = Workload { max_size: 2 << 20, max_align: 64 << 10, cross_stream: true };
    let check = || arena.check().map_err(|v| v.to_string());
    let mut out = drive(&arena, &streams, a.ops, a.seed, w, &check, &|| world.advance());
    used_zero(&mut out, "the arena", arena.usage().used);
    for s in streams.iter().chain([&world.default_stream()]) {
        if let Err(e) = arena.release(s) {
            out.lose(format!("release on stream {}: {e}", s.id()));
        }
    }
    if arena.usage().held != 0 {
        out.lose(format!("the arena holds {} bytes after release on every stream", arena.usage().held));
    }
    drop(arena);
    device_empty(&mut out, &dev);
    out
}

/// The pool under the stream-ordered layer, shared so that it can be
/// released at the end, with its checker visible to the layer's.
struct PoolRef<'a, 'd>(&'a Shared<CoalescingPool<&'d SimDevice>>);

impl MemoryResourceMut<()> for PoolRef<'_, '_> {
    fn allocate(&mut self, request: Request, stream: &()) -> memres_core::Result<Block> {
        self.0.allocate(request, stream)
    }
    fn deallocate(&mut self, block: Block, stream: &()) -> memres_core::Result<()> {
        self.0.deallocate(block, stream)
    }
}

impl Inspect for PoolRef<'_, '_> {
    fn usage(&self) -> Usage {
        self.0.usage()
    }
    fn check(&self) -> Result<(), Violation> {
        self.0.check()
    }
}

fn soak_stream_pool(a: &Args) -> Outcome {
    let dev = SimDevice::new(DEVICE);
    let world = SimWorld::new();
    let streams = thread_streams(&world, a.threads);
    let pool = Shared::new(CoalescingPool::new(&dev));
    let layer = HbChecked::new(Shared::new(StreamOrdered::<_, SimStream>::new(PoolRef(&pool))));
    let w = Workload { max_size: 1 << 20, max_align: 64 << 10, cross_stream: true };
    let check = || layer.inner().with(|so| so.check()).map_err(|v| v.to_string());
    // The device finishes submitted work now and then: reclaims see it.
    let mut out = drive(&layer, &streams, a.ops, a.seed, w, &check, &|| world.advance());
    if layer.violation_count() != 0 {
        let first = layer.violations()[0];
        out.lose(format!("{} happens-before violations; the first: {first}", layer.violation_count()));
    }
    let so = layer.inner();
    used_zero(&mut out, "the stream-ordered layer", so.with(|so| so.usage().used));
    if let Err(e) = so.with(|so| so.synchronize_and_merge()) {
        out.lose(format!("synchronize and merge: {e}"));
    }
    used_zero(&mut out, "the pool under the layer", pool.with(|p| p.usage().used));
    let stats = so.with(|so| so.stats());
    println!(
        "    stream-ordered: {} own-stream reuses, {} taken from another stream after a wait, {} from the pool",
        stats.own_hits, stats.steals, stats.inner_allocations
    );
    if let Err(e) = pool.with(|p| p.release(&())) {
        out.lose(format!("release of the pool: {e}"));
    }
    drop(layer);
    device_empty(&mut out, &dev);
    out
}

fn soak_vpool(a: &Args) -> Outcome {
    let space = SimAddressSpace::new(DEVICE, SimAddressSpace::DEFAULT_GRANULE).unwrap();
    // One reservation of 64 GiB; up to 64 MiB of idle committed memory kept.
    let pool = Shared::new(
        VirtualPool::with_config(&space, VirtualConfig::new(64 << 30).release_threshold(64 << 20))
            .expect("valid config"),
    );
    let w = Workload { max_size: 4 << 20, max_align: 64 << 10, cross_stream: false };
    let check = || pool.with(|p| p.check()).map_err(|v| v.to_string());
    let mut out = drive(&pool, &units(a.threads), a.ops, a.seed, w, &check, &|| {});
    used_zero(&mut out, "the virtual pool", pool.with(|p| p.usage().used));
    if let Err(e) = pool.with(|p| p.trim(&())) {
        out.lose(format!("trim: {e}"));
    }
    if space.committed_bytes() != 0 {
        out.lose(format!("{} bytes still committed after trim", space.committed_bytes()));
    }
    drop(pool);
    if space.reserved_bytes() != 0 {
        out.lose(format!("{} bytes still reserved after the pool is gone", space.reserved_bytes()));
    }
    out
}

/// The allocations of one step of [`soak_planned`]'s training loop.
const SCRIPT: usize = 64;

/// `Planned` over a shared pool, in a training loop: thread 0 begins each
/// step with `step()` (again while a release refuses it) and allocates the
/// same script of sizes in the same order (all a plan needs; `--ops` is its
/// allocations); by the block's place in the script it frees the block at
/// the next allocation, frees it at once, carries it into the next step
/// (freed after that step's fourth allocation, as gradients are), or hands
/// it to the other threads, which free it after a while of their own:
/// frees at other times than recorded make steps depart from their plans.
/// Now and then another thread calls `release()`, and the checker runs
/// every 64 steps beside the other threads' frees. At the end nothing is
/// in use, the layer holds what the pool has in use, some allocations were
/// served from a plan, and after the releases the device holds nothing.
fn soak_planned(a: &Args) -> Outcome {
    let dev = SimDevice::new(DEVICE);
    let pool = Shared::new(CoalescingPool::new(&dev));
    let planned = Planned::new(&pool);
    let w = Workload { max_size: 1 << 20, max_align: 4 << 10, cross_stream: false };
    let mut rng = SplitMix64::new(a.seed);
    let script: Vec<Request> = (0..SCRIPT).map(|_| random_request(&mut rng, &w)).collect();
    let steps = (a.ops / SCRIPT as u64).max(1);
    let shared: Shared2<()> = Shared2 {
        live: Mutex::new((LiveBlocks::new(), 0)),
        mailbox: Mutex::new(Vec::new()),
        losses: Mutex::new(Vec::new()),
    };
    let (done, allocations, frees, handed, checks) =
        (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let free = |b: Block| {
        if !shared.giving_back(&b) {
            return;
        }
        match planned.deallocate(b, &()) {
            Ok(()) => _ = frees.fetch_add(1, Ordering::Relaxed),
            Err(e) => shared.lose(format!("free of {b:?} failed: {e}")),
        }
    };
    let take_mail = || std::mem::take(&mut *shared.mailbox.lock().unwrap());
    let check = || planned.check().map_err(|v| v.to_string());
    let start = Instant::now();
    std::thread::scope(|scope| {
        for t in 1..a.threads {
            let (shared, planned, done, free, take_mail) = (&shared, &planned, &done, &free, &take_mail);
            scope.spawn(move || {
                let mut rng = SplitMix64::new(a.seed ^ (t as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                // Each block with the rounds it waits for its free.
                let mut held: Vec<(Block, u64)> = Vec::new();
                loop {
                    // Read before the mail: mail after it is none.
                    let last = done.load(Ordering::Acquire);
                    held.extend(take_mail().into_iter().map(|(b, ())| (b, rng.below(64))));
                    if last && held.is_empty() {
                        break;
                    }
                    let mut i = 0;
                    while i < held.len() {
                        if held[i].1 == 0 || last {
                            free(held.swap_remove(i).0);
                        } else {
                            held[i].1 -= 1;
                            i += 1;
                        }
                    }
                    if rng.below(1 << 12) == 0 {
                        if let Err(e) = planned.release(&()) {
                            shared.lose(format!("release: {e}"));
                        }
                    }
                    std::thread::yield_now();
                }
            });
        }
        let mut carried: Vec<Block> = Vec::new();
        for step in 0..steps {
            loop {
                match planned.step(&()) {
                    Ok(()) => break,
                    Err(Error::Reentrant) => std::thread::yield_now(),
                    Err(e) => {
                        shared.lose(format!("step: {e}"));
                        break;
                    }
                }
            }
            let mut previous: Option<Block> = None;
            for (i, &request) in script.iter().enumerate() {
                if let Some(b) = previous.take() {
                    free(b);
                }
                if i == 4 {
                    carried.drain(..).for_each(free);
                }
                let b = match planned.allocate(request, &()) {
                    Ok(b) => b,
                    Err(e) => {
                        shared.lose(format!("allocation of {request:?} failed: {e}"));
                        continue;
                    }
                };
                allocations.fetch_add(1, Ordering::Relaxed);
                if !shared.took(b, request) {
                    continue;
                }
                match i % 4 {
                    0 => previous = Some(b),
                    1 if a.threads > 1 => {
                        shared.mailbox.lock().unwrap().push((b, ()));
                        handed.fetch_add(1, Ordering::Relaxed);
                    }
                    2 if i < 16 => carried.push(b),
                    _ => free(b),
                }
            }
            previous.into_iter().for_each(free);
            if step % 64 == 63 {
                checks.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = check() {
                    shared.lose(format!("checker after step {}: {e}", step + 1));
                }
            }
        }
        carried.drain(..).for_each(free);
        done.store(true, Ordering::Release);
    });
    let mut out = Outcome {
        seconds: start.elapsed().as_secs_f64(),
        allocations: allocations.into_inner(),
        frees: frees.into_inner(),
        handed_over: handed.into_inner(),
        checks: checks.into_inner() + 1,
        ..Outcome::default()
    };
    out.ops = out.allocations + out.frees;
    out.settle(&shared);
    if let Err(e) = check() {
        out.lose(format!("checker at the end: {e}"));
    }
    used_zero(&mut out, "the planned layer", planned.usage().used);
    let (held, under) = (planned.held(), pool.with(|p| p.usage().used));
    if held != under {
        out.lose(format!("the planned layer holds {held} bytes, the pool has {under} in use"));
    }
    let s = planned.steps();
    println!(
        "    planned: {} steps, {} plans, {} followed, {} allocations from the regions",
        s.steps, s.plans, s.followed, s.planned_allocations
    );
    if steps >= 8 && s.planned_allocations == 0 {
        out.lose("no allocation was served from a plan");
    }
    match planned.release(&()) {
        Ok(n) if n != held => out.lose(format!("release gave back {n} bytes of {held}")),
        Ok(_) => {}
        Err(e) => out.lose(format!("release: {e}")),
    }
    used_zero(&mut out, "the pool under the layer", pool.with(|p| p.usage().used));
    if let Err(e) = pool.with(|p| p.release(&())) {
        out.lose(format!("release of the pool: {e}"));
    }
    drop(planned);
    device_empty(&mut out, &dev);
    out
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut lost = false;
    for kind in &args.kinds {
        let out = match *kind {
            "pool" => soak_pool(&args),
            "fixed" => soak_fixed(&args),
            "binning" => soak_binning(&args),
            "arena" => soak_arena(&args),
            "stream-pool" => soak_stream_pool(&args),
            "vpool" => soak_vpool(&args),
            "planned" => soak_planned(&args),
            _ => unreachable!("parsed names only"),
        };
        println!(
            "{kind:<12} {} threads x {} ops: {:.2} s, {:.0} ops/s; {} allocations, {} frees ({} freed by another thread), \
             peak live {} bytes, {} checks; {}",
            args.threads,
            args.ops,
            out.seconds,
            out.ops as f64 / out.seconds,
            out.allocations,
            out.frees,
            out.handed_over,
            out.peak_used,
            out.checks,
            if out.losses.is_empty() { "no loss".to_string() } else { format!("{} LOSSES", out.losses.len()) }
        );
        for l in &out.losses {
            println!("    lost: {l}");
        }
        lost |= !out.losses.is_empty();
    }
    if lost {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
