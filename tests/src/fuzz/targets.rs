//! The fuzz targets: one [`FuzzResource`] per algorithm or stack.

use super::{drive, FuzzResource, Model};
use arbitrary::Unstructured;
use memres_core::pool::{Chunk, CoalescingIndex, CoalescingPool, Growth, Node, PoolConfig};
use memres_core::storage::{ArrayStorage, Storage};
use memres_core::{
    Block, Error, Inspect, MemoryResource, MemoryResourceMut, Range, Request, Result, Shared, Stream,
};
use memres_sim::SimDevice;
use std::cell::Cell;
use std::sync::{Arc, Mutex};

mod arena;
mod more;
pub use arena::*;
pub use more::*;

// ---------------------------------------------------------------- index

/// `CoalescingIndex` alone over a few regions; `release` removes the wholly
/// free regions.
#[derive(Debug)]
struct IndexTarget {
    index: CoalescingIndex,
    /// Regions still in the index, with their first node.
    regions: Vec<(Range, u32)>,
    removed: u64,
    /// The range the last successful free coalesced into, to compare with
    /// the model.
    last_free: Cell<Option<(u64, Range)>>,
}

impl IndexTarget {
    fn build(u: &mut Unstructured<'_>) -> arbitrary::Result<Self> {
        let granule = 1u64 << *u.choose(&[8u32, 8, 8, 9, 12, 16])?;
        let mut index = CoalescingIndex::new(granule);
        let mut regions = Vec::new();
        let count = u.int_in_range(1..=4)?;
        let mut cursor = granule * u.int_in_range(0..=1024u64)?;
        for _ in 0..count {
            let len = granule
                * match u.int_in_range(0..=3u8)? {
                    0 => u.int_in_range(1..=64u64)?,
                    1 => u.int_in_range(1..=1 << 16)?,
                    2 => u.int_in_range(1..=1 << 24)?,
                    _ => 1 << u.int_in_range(20..=34u32)?,
                };
            // Adjacent regions too: they must never merge.
            let gap = if u.arbitrary()? { 0 } else { granule * u.int_in_range(1..=1 << 20)? };
            let start = match cursor.checked_add(gap) {
                Some(s) if s.checked_add(len).is_some() => s,
                _ => break,
            };
            let range = Range::new(start, len).expect("checked");
            let first = index.add_range(range).expect("add_range of a valid region");
            regions.push((range, first));
            cursor = range.end();
        }
        Ok(IndexTarget { index, regions, removed: 0, last_free: Cell::new(None) })
    }

    fn region_of(&self, addr: u64) -> Option<(Range, u32)> {
        self.regions.iter().copied().find(|(r, _)| r.contains(addr))
    }
}

impl FuzzResource for IndexTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        match self.index.allocate(request.size(), request.align())? {
            Some(a) => Ok(Block::new(a.addr, request.size(), a.tag)),
            None => Err(Error::OutOfMemory {
                requested: request.size(),
                largest_free: self.index.largest_free(),
                pool_size: self.regions.iter().map(|(r, _)| r.len()).sum(),
                max_size: None,
            }),
        }
    }

    fn deallocate(&mut self, block: Block) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let addr = block.addr();
        let freed = match self.index.free(block.tag(), addr, block.size()) {
            Err(Error::UnknownBlock { .. }) => {
                // The address-only path, as the pool does it.
                let Some((_, first)) = self.region_of(addr) else {
                    return Err(Error::UnknownBlock { addr });
                };
                match self.index.find_used(first, addr) {
                    Some(tag) if block.tag() == Block::NO_TAG => self.index.free(tag, addr, block.size())?,
                    Some(_) => return Err(Error::DoubleFree { addr }),
                    None if self.index.is_free_at(first, addr) => return Err(Error::DoubleFree { addr }),
                    None => return Err(Error::UnknownBlock { addr }),
                }
            }
            other => other?,
        };
        self.last_free.set(Some((addr, freed)));
        Ok(())
    }

    fn release(&mut self) -> Option<Result<u64>> {
        let mut bytes = 0;
        let mut kept = Vec::new();
        for (range, first) in std::mem::take(&mut self.regions) {
            if self.index.is_region_free(first) {
                match self.index.remove_range(first) {
                    Ok(r) if r == range => {
                        bytes += r.len();
                        self.removed += 1;
                    }
                    Ok(r) => panic!("remove_range({first}) gave {r:?}, the region was {range:?}"),
                    Err(e) => return Some(Err(e)),
                }
            } else {
                kept.push((range, first));
            }
        }
        self.regions = kept;
        Some(Ok(bytes))
    }

    fn check(&self, model: &Model) -> std::result::Result<(), String> {
        if super::invariant_checker_on() {
            self.index.check().map_err(|v| v.to_string())?;
        }
        let mut live: Vec<(u64, u64)> = model.live().iter().map(|l| (l.block.addr(), l.footprint)).collect();
        live.sort_unstable();
        let mut free = 0;
        let mut largest = 0;
        for &(region, first) in &self.regions {
            let gaps = model.gaps_in(region);
            free += gaps.iter().map(|g| g.len()).sum::<u64>();
            largest = gaps.iter().map(|g| g.len()).max().unwrap_or(0).max(largest);
            // The index's ranges of the region are exactly the model's gaps
            // and live blocks.
            let mut gi = gaps.iter();
            let mut bad = None;
            self.index.for_each_in_region(first, |r, is_free| {
                if is_free && gi.next() != Some(&r) {
                    bad = Some(r);
                }
                if !is_free && live.binary_search(&(r.start(), r.len())).is_err() {
                    bad = Some(r);
                }
            });
            if let Some(r) = bad {
                return Err(format!("index range {r:?} of region {region:?} is not what the model has"));
            }
            if gi.next().is_some() {
                return Err(format!("the index misses a free gap of region {region:?}"));
            }
        }
        if self.index.free_bytes() != free {
            return Err(format!("index counts {} bytes free, the model {free}", self.index.free_bytes()));
        }
        if self.index.largest_free() != largest {
            return Err(format!(
                "largest_free() = {}, the model's largest gap {largest}",
                self.index.largest_free()
            ));
        }
        if self.index.used_count() != model.live().len() as u64 {
            return Err(format!(
                "used_count() = {}, {} live blocks",
                self.index.used_count(),
                model.live().len()
            ));
        }
        if let Some((addr, range)) = self.last_free.take() {
            let region = self.region_of(addr).ok_or("freed address in no region")?.0;
            let gap = model.gaps_in(region).into_iter().find(|g| g.contains(addr));
            if gap != Some(range) {
                return Err(format!(
                    "free of {addr:#x} coalesced into {range:?}, the model's gap is {gap:?}"
                ));
            }
        }
        Ok(())
    }

    fn used_bytes(&self) -> u64 {
        self.index.used_bytes()
    }

    fn footprint(&self, size: u64) -> u64 {
        let g = self.index.granule();
        size.div_ceil(g) * g
    }

    fn summary(&self) -> Vec<u64> {
        vec![
            self.index.used_bytes(),
            self.index.free_bytes(),
            self.index.used_count(),
            self.regions.len() as u64,
        ]
    }

    fn give_backs(&self) -> u64 {
        self.removed
    }

    fn judge_alloc_failure(
        &self,
        request: &Request,
        err: &Error,
        _before: &[u64],
        model: &Model,
    ) -> std::result::Result<(), String> {
        if !matches!(err, Error::OutOfMemory { .. }) {
            return Err("the index fails only by finding no range".into());
        }
        // The index's promise: a range of at least `need` plus one size
        // class step (1/32) always serves the request, whatever its place.
        let g = self.index.granule();
        let align = request.align().max(g);
        let need = request.size().div_ceil(g) + align / g - 1;
        let sure = need + need / 32;
        for &(region, _) in &self.regions {
            for gap in model.gaps_in(region) {
                if gap.len() / g >= sure {
                    return Err(format!(
                        "free range {gap:?} of {} granules surely fits {need} granules",
                        gap.len() / g
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Fuzz target `index`: [`CoalescingIndex`] alone over a few regions.
pub fn run_index(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(mut target) = IndexTarget::build(&mut u) else { return };
    drive(&mut target, &mut u);
}

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
}

/// An upstream wrapper that records what the upstream answered, so that the
/// oracle can tell a legitimate out of memory from a wrong one.
#[derive(Debug, Clone)]
pub struct Spy {
    inner: Arc<SimDevice>,
    log: Arc<Mutex<SpyLog>>,
    frees: Arc<Mutex<u64>>,
}

impl Spy {
    fn new(capacity: u64) -> Self {
        Spy { inner: Arc::new(SimDevice::new(capacity)), log: Arc::default(), frees: Arc::default() }
    }
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
    /// Makes the upstream's `n`th allocation from now fail.
    pub(super) fn fail_nth(&self, n: u64) {
        self.inner.fail_nth(n);
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
        let got = self.inner.deallocate(block, stream);
        if got.is_ok() {
            *self.frees.lock().expect("spy lock") += 1;
        }
        got
    }
}

// ---------------------------------------------------------------- pool

type Pool<N = Vec<Node>, C = Vec<Chunk>> = CoalescingPool<Spy, N, C>;

fn build_pool<N: Storage<Node>, C: Storage<Chunk>>(
    u: &mut Unstructured<'_>,
) -> arbitrary::Result<(Pool<N, C>, Spy)> {
    let capacity = *u.choose(&[64u64 << 20, 1 << 30, 1 << 44])?;
    let spy = Spy::new(capacity);
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
    match *err {
        Error::OutOfMemory { requested, largest_free, pool_size: ps, max_size } => {
            if !log.granted.is_empty() {
                return Err(format!(
                    "the pool took chunks of {:?} bytes from upstream and still failed",
                    log.granted
                ));
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
        self.pool.allocate(request, &())
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
        judge_pool_failure(&self.pool, &self.spy, request, err, before)
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

/// The pool shared behind a lock, as stacks see it.
pub type SharedPool = Shared<Pool>;

/// A cross-check of the layers against the model, run after every step.
pub type LayerCheck = Box<dyn Fn(&Model) -> std::result::Result<(), String>>;
/// A judge of allocation failures the layers cause: `Some(verdict)` for a
/// failure of their own (e.g. `LimitExceeded` of a limiting adaptor), `None`
/// to hand it to the pool's judgement.
pub type LayerJudge = Box<dyn Fn(&Request, &Error, &Model) -> Option<std::result::Result<(), String>>>;

/// The layers of a stack over a [`SharedPool`], built by the closure given to
/// [`run_stack`].
pub struct Layers {
    /// The resource the operations go to.
    pub top: Box<dyn MemoryResource>,
    /// Cross-checks of the layers after every step.
    pub check: LayerCheck,
    /// Judge of failures the layers cause.
    pub judge: LayerJudge,
    /// Whether a layer keeps a table of the live blocks it handed out (as
    /// `Limiting`): a block freed already is then unknown to it
    /// ([`Error::UnknownBlock`] rather than the pool's `DoubleFree`).
    pub forgets: bool,
}

impl Layers {
    /// Layers with no checks or failures of their own.
    pub fn new(top: Box<dyn MemoryResource>) -> Self {
        Layers { top, check: Box::new(|_| Ok(())), judge: Box::new(|_, _, _| None), forgets: false }
    }
}

impl std::fmt::Debug for Layers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layers").finish_non_exhaustive()
    }
}

/// A stack of resources over a [`SharedPool`], driven only through
/// `dyn MemoryResource`; the pool below is checked after every step.
#[derive(Debug)]
struct StackTarget {
    layers: Layers,
    pool: Arc<SharedPool>,
    spy: Spy,
}

impl FuzzResource for StackTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        self.layers.top.allocate(request, &())
    }
    fn deallocate(&mut self, block: Block) -> Result<()> {
        self.layers.top.deallocate(block, &())
    }
    fn release(&mut self) -> Option<Result<u64>> {
        Some(self.pool.with(|p| {
            let got = p.release(&());
            released(p, got)
        }))
    }
    fn check(&self, model: &Model) -> std::result::Result<(), String> {
        self.pool.with(|p| check_pool(p, &self.spy))?;
        (self.layers.check)(model)
    }
    fn used_bytes(&self) -> u64 {
        self.pool.with(|p| p.usage().used)
    }
    fn footprint(&self, size: u64) -> u64 {
        size.div_ceil(256) * 256
    }
    fn summary(&self) -> Vec<u64> {
        self.pool.with(|p| pool_summary(p))
    }
    fn spy(&self) -> Option<&Spy> {
        Some(&self.spy)
    }
    fn forgets(&self, _block: &Block) -> bool {
        self.layers.forgets
    }
    fn judge_alloc_failure(
        &self,
        request: &Request,
        err: &Error,
        before: &[u64],
        model: &Model,
    ) -> std::result::Result<(), String> {
        if let Some(verdict) = (self.layers.judge)(request, err, model) {
            return verdict;
        }
        self.pool.with(|p| judge_pool_failure(p, &self.spy, request, err, before))
    }
}

/// Runs `data` against a stack built by `wrap` over a shared pool (whose
/// configuration is decoded from `data`).
///
/// A new stack target is a few lines:
///
/// ```
/// use memres_tests::fuzz::{run_stack, Layers};
/// let data = [7u8; 64];
/// run_stack(&data, |pool| Layers::new(Box::new(pool)));
/// ```
pub fn run_stack(data: &[u8], wrap: impl FnOnce(Arc<SharedPool>) -> Layers) {
    let mut u = Unstructured::new(data);
    let Ok((pool, spy)) = build_pool::<Vec<Node>, Vec<Chunk>>(&mut u) else { return };
    let pool = Arc::new(Shared::new(pool));
    let layers = wrap(Arc::clone(&pool));
    drive(&mut StackTarget { layers, pool, spy }, &mut u);
}

/// Fuzz target `pool_stack`: a [`Shared`] pool under `dyn MemoryResource`.
pub fn run_pool_stack(data: &[u8]) {
    run_stack(data, |pool| Layers::new(Box::new(pool)));
}
