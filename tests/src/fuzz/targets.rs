//! The fuzz targets: one [`FuzzResource`] per algorithm or stack.

use super::{drive, FuzzResource, Model};
use arbitrary::Unstructured;
use memres_core::check::FailNth;
use memres_core::pool::{Chunk, CoalescingPool, Growth, Node, PoolConfig};
use memres_core::storage::{ArrayStorage, Storage};
use memres_core::{Block, Error, Inspect, MemoryResource, MemoryResourceMut, Request, Result, Stream};
use memres_sim::SimDevice;
use std::sync::{Arc, Mutex};

mod adaptors;
mod arena;
mod binning;
mod callback;
mod device_stack;
mod fixed;
mod index;
mod per_stream;
mod planned;
mod snapshot;
mod stack;
mod stack_string;
mod stream;
mod streams;
mod trace;
mod vpool;
mod vpool_streams;
pub use adaptors::*;
pub use arena::*;
pub use binning::*;
pub use callback::*;
pub use device_stack::*;
pub use fixed::*;
pub use index::*;
pub use per_stream::*;
pub use planned::*;
pub use snapshot::*;
pub use stack::*;
pub use stack_string::*;
pub use stream::*;
pub use trace::*;
pub use vpool::*;
pub use vpool_streams::*;

// ------------------------------------------------------- upstream spy

/// What the spy saw during one allocation of the resource above it.
#[derive(Debug, Default, Clone)]
struct SpyLog {
    /// Sizes of upstream allocations refused as out of memory.
    refused: Vec<u64>,
    /// Whether an upstream allocation failed with another error.
    failed_other: bool,
    /// Sizes of upstream allocations that succeeded.
    granted: Vec<u64>,
    /// Sizes of the blocks given back upstream.
    given_back: Vec<u64>,
    /// Whether the upstream refused a free ([`Spy::refuse_nth_free`]).
    free_refused: bool,
}

impl SpyLog {
    /// Whether what was granted is what failed growths take again: each
    /// one chunk of the bytes it gave back (a layer above may try twice).
    fn granted_only_what_went_back(&self) -> bool {
        self.granted.iter().sum::<u64>() <= self.given_back.iter().sum::<u64>()
    }
}

/// An upstream wrapper that records what the upstream answered, so that the
/// oracle can tell a legitimate out of memory from a wrong one.
#[derive(Debug, Clone)]
pub struct Spy {
    inner: Arc<SimDevice>,
    log: Arc<Mutex<SpyLog>>,
    frees: Arc<Mutex<u64>>,
    /// Frees that failed: refused, or bad frees the device answered.
    failed_frees: Arc<Mutex<u64>>,
    /// The free to refuse.
    refuse: Arc<Mutex<FailNth>>,
}

impl Spy {
    fn new(capacity: u64) -> Self {
        Self::over(SimDevice::new(capacity))
    }
    fn over(device: SimDevice) -> Self {
        Spy {
            inner: Arc::new(device),
            log: Arc::default(),
            frees: Arc::default(),
            failed_frees: Arc::default(),
            refuse: Arc::default(),
        }
    }

    /// What a free the spy refuses answers.
    const REFUSED: Error = Error::Backend { code: -3, what: "the spied upstream refuses this free" };

    /// Forgets what the upstream answered so far.
    pub(super) fn clear_log(&self) {
        *self.log.lock().expect("spy lock") = SpyLog::default();
    }
    fn log(&self) -> SpyLog {
        self.log.lock().expect("spy lock").clone()
    }
    pub(super) fn frees(&self) -> u64 {
        *self.frees.lock().expect("spy lock")
    }
    /// Frees that failed so far, refused or judged bad by the device.
    fn failed_frees(&self) -> u64 {
        *self.failed_frees.lock().expect("spy lock")
    }
    /// Makes the upstream's `n`th allocation from now fail.
    pub(super) fn fail_nth(&self, n: u64) {
        self.inner.fail_nth(n);
    }
    /// Makes the spy refuse the `n`th free from now (the block stays held
    /// upstream); `n = 0` cancels.
    pub(super) fn refuse_nth_free(&self, n: u64) {
        self.refuse.lock().expect("spy lock").arm(n);
    }
    /// Whether `err` is the answer of a free the spy refused.
    pub(super) fn refused_free(&self, err: &Error) -> bool {
        *err == Self::REFUSED
    }
}

impl<S: Stream + ?Sized> MemoryResource<S> for Spy {
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        let got = self.inner.allocate(request, stream);
        let mut log = self.log.lock().expect("spy lock");
        match &got {
            Ok(_) => log.granted.push(request.size()),
            Err(e) if e.is_out_of_memory() => log.refused.push(request.size()),
            Err(_) => log.failed_other = true,
        }
        got
    }
    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        let got = if self.refuse.lock().expect("spy lock").fires() {
            self.log.lock().expect("spy lock").free_refused = true;
            Err(Self::REFUSED)
        } else {
            self.inner.deallocate(block, stream)
        };
        if got.is_ok() {
            *self.frees.lock().expect("spy lock") += 1;
            self.log.lock().expect("spy lock").given_back.push(block.size());
        } else {
            *self.failed_frees.lock().expect("spy lock") += 1;
        }
        got
    }
}

/// The device's figures and checker: the spy keeps nothing of its own.
impl Inspect for Spy {
    fn usage(&self) -> memres_core::Usage {
        self.inner.usage()
    }
    fn check(&self) -> std::result::Result<(), memres_core::check::Violation> {
        self.inner.check()
    }
}

// ---------------------------------------------------------------- pool

type Pool<N = Vec<Node>, C = Vec<Chunk>> = CoalescingPool<Spy, N, C>;

/// The capacity of a device and a configuration of the pools over it:
/// with and without a maximum, default, doubling and fractional growth,
/// release on grow or not.
fn draw_pool_config(u: &mut Unstructured<'_>) -> arbitrary::Result<(u64, PoolConfig)> {
    let capacity = *u.choose(&[64u64 << 20, 1 << 30, 1 << 44])?;
    let initial = match u.int_in_range(0..=3u8)? {
        0 => 0,
        1 => 256 * u.int_in_range(1..=64u64)?,
        2 => 2 << 20,
        _ => 64 << 20,
    }
    .min(capacity);
    let mut config = PoolConfig::new().initial_size(initial).release_on_grow(u.arbitrary()?);
    if u.arbitrary()? {
        let max = initial + 256 * u.int_in_range(0..=1u64 << 24)?;
        config = config.maximum_size(max);
    }
    config = config.growth(match u.int_in_range(0..=3u8)? {
        0 | 1 => Growth::DEFAULT,
        2 => Growth::Double,
        _ => {
            Growth::Fraction { divisor: u.int_in_range(1..=16)?, granule: 256 << u.int_in_range(0..=16u32)? }
        }
    });
    Ok((capacity, config))
}

fn build_pool<N: Storage<Node>, C: Storage<Chunk>>(
    u: &mut Unstructured<'_>,
) -> arbitrary::Result<(Pool<N, C>, Spy)> {
    let (capacity, config) = draw_pool_config(u)?;
    let spy = Spy::new(capacity);
    let pool = CoalescingPool::with_config_in(spy.clone(), config, &())
        .expect("a valid configuration over a roomy device");
    Ok((pool, spy))
}

/// What the pool's answers are judged by, for the pool alone or under a stack.
fn judge_pool_failure<N: Storage<Node>, C: Storage<Chunk>>(
    pool: &Pool<N, C>,
    spy: &Spy,
    request: &Request,
    err: &Error,
    before: &[u64],
) -> std::result::Result<(), String> {
    let log = spy.log();
    let pool_size = pool.usage().held;
    if pool_size > before[2] {
        return Err(format!("the pool grew from {} to {pool_size} and still failed", before[2]));
    }
    // A failed growth takes again what it gave back (also beside a chunk
    // the upstream refused), and nothing more.
    if !log.granted_only_what_went_back() {
        return Err(format!(
            "the pool took chunks of {:?} bytes from upstream (it gave back {:?}) and still failed",
            log.granted, log.given_back
        ));
    }
    let took_back = !log.granted.is_empty() || log.failed_other || !log.refused.is_empty();
    if pool_size < before[2] && !took_back {
        return Err(format!("the pool gave back {:?} and did not ask for it again", log.given_back));
    }
    match *err {
        Error::OutOfMemory { requested, largest_free, pool_size: ps, max_size } => {
            if log.free_refused {
                return Err("out of memory after a refused free: the refusal is the cause".into());
            }
            if requested != request.size()
                || largest_free != pool.usage().largest_free
                || ps != pool_size
                || max_size != pool.config().maximum()
            {
                return Err(format!(
                    "wrong figures: pool size {pool_size}, largest free {}, maximum {:?}",
                    pool.usage().largest_free,
                    pool.config().maximum()
                ));
            }
            // What a fresh 256-aligned chunk needs to hold the request.
            let need = request.rounded_size(256) + request.align() - 256;
            let max_forbids = pool.config().maximum().is_some_and(|m| need > m - pool_size);
            let upstream_refused = log.refused.iter().any(|&s| s <= need) || need > Request::MAX_SIZE;
            if max_forbids || upstream_refused {
                Ok(())
            } else {
                Err(format!(
                    "need {need} bytes; the maximum allows it and the upstream refused only {:?}",
                    log.refused
                ))
            }
        }
        Error::Backend { .. } if log.failed_other => Ok(()),
        e if log.free_refused && spy.refused_free(&e) => Ok(()),
        // Fixed-capacity metadata: legitimate only once every slot is made.
        Error::CapacityExhausted { capacity } => {
            let nodes_full =
                capacity == N::default().max_len() && pool.index().node_slots() as u32 == capacity;
            let chunks_full = capacity == C::default().max_len() && pool.chunk_count() as u32 == capacity;
            if nodes_full || chunks_full {
                Ok(())
            } else {
                Err(format!("{} node slots, {} chunks", pool.index().node_slots(), pool.chunk_count()))
            }
        }
        _ => Err(format!("unexpected error; upstream log {log:?}")),
    }
}

fn check_pool<N: Storage<Node>, C: Storage<Chunk>>(
    pool: &Pool<N, C>,
    spy: &Spy,
) -> std::result::Result<(), String> {
    if super::invariant_checker_on() {
        pool.check().map_err(|v| v.to_string())?;
    }
    if spy.inner.usage().held != pool.usage().held {
        return Err(format!(
            "upstream holds {} bytes for the pool, the pool says {}",
            spy.inner.usage().held,
            pool.usage().held
        ));
    }
    Ok(())
}

fn pool_summary<N: Storage<Node>, C: Storage<Chunk>>(pool: &Pool<N, C>) -> Vec<u64> {
    vec![pool.usage().used, pool.usage().free, pool.usage().held, pool.chunk_count() as u64]
}

fn released<N: Storage<Node>, C: Storage<Chunk>>(pool: &Pool<N, C>, got: Result<u64>) -> Result<u64> {
    if let Ok(bytes) = got {
        // Every wholly free chunk is gone: with nothing in use, nothing is held.
        assert!(
            pool.usage().used != 0 || pool.usage().held == 0,
            "fuzz oracle: release() left {} bytes held with nothing in use ({bytes} given back)",
            pool.usage().held
        );
    }
    got
}

/// `CoalescingPool` over a `SimDevice`, with or without a maximum, default
/// or doubling growth.
#[derive(Debug)]
struct PoolTarget<N: Storage<Node> = Vec<Node>, C: Storage<Chunk> = Vec<Chunk>> {
    pool: Pool<N, C>,
    spy: Spy,
}

impl<N: Storage<Node>, C: Storage<Chunk>> FuzzResource for PoolTarget<N, C> {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        let held = self.pool.held_bytes();
        let got = self.pool.allocate(request, &());
        // An upstream failure is a growth's, and a failed growth leaves the
        // pool as it was (taking again what it gave back, as far as the
        // upstream allows): the request may still be served from a free
        // range held before, with nothing new taken from the upstream.
        let log = self.spy.log();
        if got.is_ok()
            && log.failed_other
            && (!log.granted_only_what_went_back() || self.pool.held_bytes() > held)
        {
            panic!(
                "fuzz oracle: {request:?} succeeded though the upstream failed, with chunks of {:?} bytes taken (it gave back {:?}), {held} bytes held before and {} after",
                log.granted,
                log.given_back,
                self.pool.held_bytes()
            );
        }
        got
    }
    fn deallocate(&mut self, block: Block) -> Result<()> {
        self.pool.deallocate(block, &())
    }
    fn release(&mut self) -> Option<Result<u64>> {
        let got = self.pool.release(&());
        Some(released(&self.pool, got))
    }
    fn check(&self, _model: &Model) -> std::result::Result<(), String> {
        check_pool(&self.pool, &self.spy)
    }
    fn used_bytes(&self) -> u64 {
        self.pool.usage().used
    }
    fn footprint(&self, size: u64) -> u64 {
        size.div_ceil(256) * 256
    }
    fn size_class(&self, size: u64) -> u64 {
        // The index checks the exact size a block was asked with.
        size
    }
    fn summary(&self) -> Vec<u64> {
        pool_summary(&self.pool)
    }
    fn spy(&self) -> Option<&Spy> {
        Some(&self.spy)
    }
    fn judge_alloc_failure(
        &self,
        request: &Request,
        err: &Error,
        before: &[u64],
        _: &Model,
    ) -> std::result::Result<(), String> {
        judge_pool_failure(&self.pool, &self.spy, request, err, before)?;
        // A growth that failed with an error leaves the pool as it was:
        // the error stands only where no free range holds the request.
        // The drawn configurations set no large threshold, so every block
        // is the shared index's; the last resort needs two node slots.
        let log = self.spy.log();
        let growth_failed = (matches!(err, Error::Backend { .. }) && log.failed_other)
            || (log.free_refused && self.spy.refused_free(err));
        let index = self.pool.index();
        let fit = request.rounded_size(256) + request.align() - 256;
        let slots = index.node_slots() + 2 <= N::default().max_len() as usize;
        if growth_failed && slots && index.largest_free() >= fit {
            return Err(format!("a free range of {} bytes holds it", index.largest_free()));
        }
        Ok(())
    }
}

/// Fuzz target `pool`: [`CoalescingPool`] over a [`SimDevice`].
pub fn run_pool(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok((pool, spy)) = build_pool::<Vec<Node>, Vec<Chunk>>(&mut u) else { return };
    drive(&mut PoolTarget { pool, spy }, &mut u);
}

/// Fuzz target `pool_fixed`: [`CoalescingPool`] with fixed-capacity metadata
/// (32 nodes, 4 chunks), where running out is `CapacityExhausted`.
pub fn run_pool_fixed(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok((pool, spy)) = build_pool::<ArrayStorage<Node, 32>, ArrayStorage<Chunk, 4>>(&mut u) else {
        return;
    };
    drive(&mut PoolTarget { pool, spy }, &mut u);
}

// --------------------------------------------------------------- stacks

/// Whether an allocation failure is one the spied upstream explains: out of
/// memory only if it refused something, a backend error only if it failed.
fn upstream_explains(spy: &Spy, err: &Error) -> std::result::Result<(), String> {
    let log = spy.log();
    match err {
        Error::OutOfMemory { .. } if !log.refused.is_empty() => Ok(()),
        Error::Backend { .. } if log.failed_other => Ok(()),
        _ => Err(format!("the upstream did not refuse: {log:?}")),
    }
}

/// A size rounded up to 256 bytes, as the pools count it.
fn round256(size: u64) -> u64 {
    size.div_ceil(256) * 256
}
