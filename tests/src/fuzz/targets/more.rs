//! Targets of the algorithms beside the pool: fixed-size blocks, binning,
//! the stream-ordered layer, and a stack of adaptors.

use super::super::{drive, FuzzResource, Model, Op};
use super::{judge_pool_failure, Layers, Pool, SharedPool, Spy};
use arbitrary::Unstructured;
use memres_core::adaptor::{Limiting, Statistics};
use memres_core::binning::BinningResource;
use memres_core::fixed::{FixedConfig, FixedSizeResource};
use memres_core::stream_ordered::StreamOrdered;
use memres_core::vmem::CommitLedger;
use memres_core::vpool::{VirtualConfig, VirtualPool};
use memres_core::{
    Block, Error, Inspect, MemoryResource, MemoryResourceMut, Request, Result, Shared, Stream,
};
use memres_sim::{HbChecked, SimAddressSpace, SimStream, SimWorld};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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

// ---------------------------------------------------------------- fixed

/// `FixedSizeResource` over the spied `SimDevice`.
#[derive(Debug)]
struct FixedTarget {
    fixed: FixedSizeResource<Spy>,
    spy: Spy,
}

impl FuzzResource for FixedTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        self.fixed.allocate(request, &())
    }
    fn deallocate(&mut self, block: Block) -> Result<()> {
        self.fixed.deallocate(block, &())
    }
    fn release(&mut self) -> Option<Result<u64>> {
        let got = self.fixed.release(&());
        if got.is_ok() && self.fixed.used_blocks() == 0 && self.fixed.usage().held != 0 {
            panic!("fuzz oracle: release() kept {} bytes with nothing in use", self.fixed.usage().held);
        }
        Some(got)
    }
    fn check(&self, model: &Model) -> std::result::Result<(), String> {
        if super::super::invariant_checker_on() {
            self.fixed.check().map_err(|v| v.to_string())?;
        }
        if self.spy.inner.usage().held != self.fixed.usage().held {
            return Err(format!(
                "upstream holds {} bytes, the resource says {}",
                self.spy.inner.usage().held,
                self.fixed.usage().held
            ));
        }
        if self.fixed.used_blocks() != model.live().len() as u64 {
            return Err(format!("{} used blocks, {} live", self.fixed.used_blocks(), model.live().len()));
        }
        let align = self.fixed.alignment();
        if let Some(l) = model.live().iter().find(|l| l.block.addr() % align != 0) {
            return Err(format!("{:?} not aligned to {align}", l.block));
        }
        Ok(())
    }
    fn used_bytes(&self) -> u64 {
        self.fixed.usage().used
    }
    fn footprint(&self, size: u64) -> u64 {
        // Any size the resource takes occupies one block; a larger one is
        // another class (a free with it is a size mismatch).
        if size <= self.fixed.block_size() {
            self.fixed.block_size()
        } else {
            size
        }
    }
    fn summary(&self) -> Vec<u64> {
        vec![
            self.fixed.usage().used,
            self.fixed.usage().free,
            self.fixed.usage().held,
            self.fixed.chunk_count() as u64,
        ]
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
        let want_size = request.size() > self.fixed.block_size();
        let want_align = !want_size && request.align() > self.fixed.alignment();
        match err {
            Error::InvalidSize { size } if want_size && *size == request.size() => Ok(()),
            Error::InvalidAlignment { align } if want_align && *align == request.align() => Ok(()),
            _ if want_size || want_align => Err("expected InvalidSize or InvalidAlignment".into()),
            _ if self.fixed.usage().held != before[2] => {
                Err("a failed allocation changed the bytes held".into())
            }
            _ if before[1] != 0 => Err(format!("{} bytes free in blocks and still failed", before[1])),
            _ => upstream_explains(&self.spy, err),
        }
    }
}

/// Fuzz target `fixed`: [`FixedSizeResource`] over a spied `SimDevice`.
pub fn run_fixed(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(config) = (|| -> arbitrary::Result<FixedConfig> {
        let block = 256 * *u.choose(&[1u64, 1, 3, 16, 4096])?;
        let per_chunk = *u.choose(&[1u32, 2, 7, 128])?;
        let align = 256u64 << *u.choose(&[0u32, 0, 4, 13])?;
        Ok(FixedConfig::new(block).blocks_per_chunk(per_chunk).chunk_alignment(align))
    })() else {
        return;
    };
    let Ok(capacity) = u.choose(&[4u64 << 20, 256 << 20, 1 << 40]).copied() else { return };
    let spy = Spy::new(capacity);
    let fixed = FixedSizeResource::with_config(spy.clone(), config, &()).expect("a valid configuration");
    drive(&mut FixedTarget { fixed, spy }, &mut u);
}

// -------------------------------------------------------------- binning

/// `BinningResource` with power-of-two fixed-size bins over the spied
/// `SimDevice`, which also serves every larger request.
struct BinningTarget {
    bins: BinningResource<'static, Spy>,
    spy: Spy,
    /// Whether a release gave a bin's chunk back (a stale block of a bin may
    /// then be unknown to it).
    released_any: bool,
}

impl std::fmt::Debug for BinningTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BinningTarget").field("bins", &self.bins.bin_sizes()).finish_non_exhaustive()
    }
}

impl BinningTarget {
    fn fixed_figures(&self) -> (u64, u64, u64) {
        let (mut used, mut free, mut held) = (0, 0, 0);
        for &size in self.bins.bin_sizes() {
            if let Some(f) = self.bins.fixed_bin(size) {
                f.with(|f| {
                    used += f.usage().used;
                    free += f.usage().free;
                    held += f.usage().held;
                });
            }
        }
        (used, free, held)
    }
}

impl FuzzResource for BinningTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        self.bins.allocate(request, &())
    }
    fn deallocate(&mut self, block: Block) -> Result<()> {
        self.bins.deallocate(block, &())
    }
    fn release(&mut self) -> Option<Result<u64>> {
        let got = self.bins.release(&());
        if let Ok(bytes) = got {
            self.released_any |= bytes > 0;
            let (used, _, held) = self.fixed_figures();
            if used == 0 && held != 0 {
                panic!("fuzz oracle: release() kept {held} bytes in bins with nothing in use");
            }
        }
        Some(got)
    }
    fn check(&self, model: &Model) -> std::result::Result<(), String> {
        if super::super::invariant_checker_on() {
            self.bins.check().map_err(|v| v.to_string())?;
        }
        // Every live block sits in the bin its size routes to, or upstream.
        for l in model.live() {
            let route = self.bins.bin_for(l.block.size());
            let owner = self.bins.bin_sizes().iter().copied().find(|&s| {
                // A free with a larger size is refused as a size mismatch,
                // without freeing, only by the bin that holds the address.
                let probe = Block::from_addr(l.block.addr(), s + 1);
                self.bins
                    .fixed_bin(s)
                    .is_some_and(|f| matches!(f.deallocate(probe, &()), Err(Error::SizeMismatch { .. })))
            });
            if owner != route {
                return Err(format!("{:?} routes to bin {route:?} but lies in bin {owner:?}", l.block));
            }
        }
        Ok(())
    }
    fn used_bytes(&self) -> u64 {
        let (used, _, held) = self.fixed_figures();
        used + (self.spy.inner.usage().held - held)
    }
    fn footprint(&self, size: u64) -> u64 {
        self.bins.bin_for(size).unwrap_or(size.div_ceil(256) * 256)
    }
    fn summary(&self) -> Vec<u64> {
        let (used, free, held) = self.fixed_figures();
        vec![self.used_bytes(), used, free, held, self.spy.inner.usage().held]
    }
    fn spy(&self) -> Option<&Spy> {
        Some(&self.spy)
    }
    fn forgets(&self, block: &Block) -> bool {
        self.bins.bin_for(block.size()).is_none() || self.released_any
    }
    fn stale_errors(&self, block: &Block) -> Vec<Error> {
        // The upstream may have given the address to a bin as a chunk: the
        // binning resource (naming the bin) or the upstream (naming the
        // chunk) refuses the size.
        let (addr, given) = (block.addr(), block.size());
        self.bins
            .bin_sizes()
            .iter()
            .flat_map(|&bin| {
                [
                    Error::SizeMismatch { addr, expected: bin * 128, given },
                    Error::SizeMismatch { addr, expected: bin, given },
                ]
            })
            .collect()
    }
    fn mismatch_errors(&self, addr: u64, expected: u64, given: u64) -> Vec<Error> {
        let expected_route = self.bins.bin_for(expected);
        if self.bins.bin_for(given) == expected_route {
            return vec![Error::SizeMismatch { addr, expected, given }];
        }
        // Routed to a resource that does not hold the block; the upstream
        // finds the bin's chunk there if the block is its first.
        let mut allowed = vec![Error::UnknownBlock { addr }, Error::DoubleFree { addr }];
        if let Some(bin) = expected_route {
            allowed.push(Error::SizeMismatch { addr, expected: bin * 128, given });
            // A size for the upstream at an address in a bin's chunk: the
            // binning resource refuses it, naming the bin.
            allowed.push(Error::SizeMismatch { addr, expected: bin, given });
        }
        allowed
    }
    fn judge_alloc_failure(
        &self,
        request: &Request,
        err: &Error,
        before: &[u64],
        _: &Model,
    ) -> std::result::Result<(), String> {
        match self.bins.bin_for(request.size()) {
            Some(_) if request.align() > 256 => match err {
                Error::InvalidAlignment { align } if *align == request.align() => Ok(()),
                _ => Err("a bin refuses alignments above 256 with InvalidAlignment".into()),
            },
            Some(bin) => {
                let free_in_bin = self.bins.fixed_bin(bin).expect("a fixed bin").with(|f| f.usage().free);
                if free_in_bin != 0 {
                    return Err(format!("bin {bin} has {free_in_bin} bytes free and failed"));
                }
                if self.summary() != before {
                    return Err("the failed allocation changed the figures".into());
                }
                upstream_explains(&self.spy, err)
            }
            None => upstream_explains(&self.spy, err),
        }
    }
}

/// Fuzz target `binning`: [`BinningResource`] with bins of 256 B up to
/// 2^8..=2^16 bytes over a spied `SimDevice`, which serves larger requests.
pub fn run_binning(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok((max_exponent, capacity)) = (|| -> arbitrary::Result<(u32, u64)> {
        Ok((u.int_in_range(8..=16)?, *u.choose(&[16u64 << 20, 1 << 30, 1 << 40])?))
    })() else {
        return;
    };
    let spy = Spy::new(capacity);
    let bins = BinningResource::with_exponents(spy.clone(), 8, max_exponent).expect("valid exponents");
    drive(&mut BinningTarget { bins, spy, released_any: false }, &mut u);
}

// ---------------------------------------------------------------- stack

/// What the caller handed out and freed through the top of a stack, to
/// judge the statistics (which count sizes as the caller states them).
#[derive(Debug, Default)]
struct Ledger {
    sizes: HashMap<u64, u64>,
    /// Sizes of every allocation, summed.
    allocated: u64,
    /// Allocations made.
    count: u64,
    /// Sum of the sizes the frees stated.
    freed: u64,
}

/// The top of the stack: forwards, and writes the ledger.
struct Recorder<R> {
    inner: R,
    ledger: Arc<Mutex<Ledger>>,
}

impl<R: MemoryResource> MemoryResource for Recorder<R> {
    fn allocate(&self, request: Request, stream: &()) -> Result<Block> {
        let block = self.inner.allocate(request, stream)?;
        if !block.is_empty() {
            let mut l = self.ledger.lock().expect("ledger");
            l.sizes.insert(block.addr(), block.size());
            l.allocated += block.size();
            l.count += 1;
        }
        Ok(block)
    }
    fn deallocate(&self, block: Block, stream: &()) -> Result<()> {
        self.inner.deallocate(block, stream)?;
        if !block.is_empty() {
            let mut l = self.ledger.lock().expect("ledger");
            l.sizes.remove(&block.addr());
            l.freed += block.size();
        }
        Ok(())
    }
}

type Limited = Limiting<Arc<SharedPool>>;

/// Fuzz target `stack`: `Statistics` over `Limiting` over a shared pool,
/// through `dyn MemoryResource`. The statistics agree with what was handed
/// out and freed; the limit refuses exactly when the model's bytes in use
/// plus the request's footprint exceed it.
pub fn run_stack_adaptors(data: &[u8]) {
    let limit = match data.first() {
        None => return,
        Some(&b) => match b % 4 {
            0 => 0,
            1 => 256 * (u64::from(b) + 1),
            2 => 64 << 20,
            _ => 1 << 40,
        },
    };
    super::run_stack(&data[1..], |pool| {
        let limited: Arc<Limited> = Arc::new(Limiting::new(pool, limit));
        let stats = Arc::new(Statistics::new(Arc::clone(&limited)));
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let top = Recorder { inner: Arc::clone(&stats), ledger: Arc::clone(&ledger) };
        let (l2, s2) = (Arc::clone(&limited), Arc::clone(&stats));
        let check = move |model: &Model| -> std::result::Result<(), String> {
            if l2.get_allocated_bytes() != model.used() {
                return Err(format!(
                    "Limiting counts {} bytes, the model {}",
                    l2.get_allocated_bytes(),
                    model.used()
                ));
            }
            if l2.get_allocated_bytes() > limit {
                return Err(format!(
                    "Limiting lets {} bytes be used over a limit of {limit}",
                    l2.get_allocated_bytes()
                ));
            }
            let l = ledger.lock().expect("ledger");
            let (bytes, count) = (s2.get_bytes_counter(), s2.get_allocations_counter());
            let live = model.live().len() as i64;
            let live_bytes = l.allocated as i64 - l.freed as i64;
            let want_bytes: u64 = model.live().iter().map(|x| x.block.size()).sum();
            if l.sizes.len() as i64 != live || l.sizes.values().sum::<u64>() != want_bytes {
                return Err("the ledger lost track of the live blocks".into());
            }
            if count.value != live || count.total != l.count as i64 || count.peak < count.value {
                return Err(format!("allocation counter {count:?}, {live} live of {} made", l.count));
            }
            if bytes.value != live_bytes || bytes.total != l.allocated as i64 || bytes.peak < bytes.value {
                return Err(format!(
                    "byte counter {bytes:?}; {} allocated, {} freed as stated",
                    l.allocated, l.freed
                ));
            }
            Ok(())
        };
        let l3 = Arc::clone(&limited);
        let judge = move |request: &Request, err: &Error, model: &Model| {
            let fp = request.size().div_ceil(256) * 256;
            let over = fp > limit || model.used() > limit - fp;
            match (err, over) {
                (Error::LimitExceeded { requested, used, limit: lim }, true) => {
                    Some(if *requested == request.size() && *used == model.used() && *lim == limit {
                        Ok(())
                    } else {
                        Err(format!("wrong figures; used {}", l3.get_allocated_bytes()))
                    })
                }
                (Error::LimitExceeded { .. }, false) => {
                    Some(Err(format!("{} + {fp} bytes fit the limit {limit}", model.used())))
                }
                (_, true) => Some(Err(format!("{} + {fp} bytes exceed the limit {limit}", model.used()))),
                (_, false) => None,
            }
        };
        // The limit's table of charges holds live blocks only.
        Layers { top: Box::new(top), check: Box::new(check), judge: Box::new(judge), forgets: true }
    });
}

// --------------------------------------------------------------- stream

type Ordered = StreamOrdered<Pool, SimStream>;

/// `StreamOrdered` over a pool, on a few `SimStream`s of one `SimWorld`,
/// behind the happens-before checker.
struct StreamTarget {
    hb: HbChecked<Shared<Ordered>>,
    spy: Spy,
    world: SimWorld,
    streams: Vec<SimStream>,
    current: usize,
    /// Footprints of the blocks handed out and not freed.
    handed: u64,
    /// The stream each live block was handed out on, by address.
    allocated_on: HashMap<u64, usize>,
    /// Whether a stream call was made to fail (a backend error is then
    /// legitimate).
    stream_failure_armed: bool,
}

impl std::fmt::Debug for StreamTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamTarget").field("current", &self.current).finish_non_exhaustive()
    }
}

impl StreamTarget {
    fn with<T>(&self, f: impl FnOnce(&mut Ordered) -> T) -> T {
        self.hb.inner().with(f)
    }
}

fn round256(size: u64) -> u64 {
    size.div_ceil(256) * 256
}

impl FuzzResource for StreamTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        let block = self.hb.allocate(request, &self.streams[self.current])?;
        self.handed += round256(block.size());
        if !block.is_empty() {
            self.allocated_on.insert(block.addr(), self.current);
        }
        Ok(block)
    }
    fn deallocate(&mut self, block: Block) -> Result<()> {
        // A correct caller that frees on another stream than the block's
        // first orders the free after the block's work there (an event
        // and a wait); if that fails, it frees on the block's stream.
        let mut on = self.current;
        if let Some(&first) = self.allocated_on.get(&block.addr()) {
            if first != on {
                let ordered = self.streams[first].record().and_then(|e| self.streams[on].wait(&e));
                if ordered.is_err() {
                    on = first;
                }
            }
        }
        self.hb.deallocate(block, &self.streams[on])?;
        self.handed -= round256(block.size());
        self.allocated_on.remove(&block.addr());
        Ok(())
    }
    fn release(&mut self) -> Option<Result<u64>> {
        // Blocks whose free completed go back to the pool, the pool's free
        // chunks upstream.
        match self.with(|so| so.reclaim()) {
            Ok(n) => Some(Ok(n as u64)),
            // An injected failure of the event it records: the lists stay.
            Err(Error::Backend { .. }) if self.stream_failure_armed => Some(Ok(0)),
            Err(e) => Some(Err(e)),
        }
    }
    fn check(&self, model: &Model) -> std::result::Result<(), String> {
        if let Some(v) = self.hb.violations().first() {
            return Err(format!("happens-before violation: {v}"));
        }
        self.with(|so| {
            if super::super::invariant_checker_on() {
                so.check().map_err(|v| v.to_string())?;
            }
            let pool = so.inner();
            if self.spy.inner.usage().held != pool.usage().held {
                return Err(format!(
                    "upstream holds {} bytes, the pool says {}",
                    self.spy.inner.usage().held,
                    pool.usage().held
                ));
            }
            if pool.usage().used != so.usage().used + so.listed_bytes() {
                return Err(format!(
                    "the pool has {} bytes in use, the layer {} live and {} listed",
                    pool.usage().used,
                    so.usage().used,
                    so.listed_bytes()
                ));
            }
            if so.live_count() != model.live().len() {
                return Err(format!(
                    "{} live in the layer, {} in the model",
                    so.live_count(),
                    model.live().len()
                ));
            }
            // A listed block serves a request only if it wastes at most half.
            if so.usage().used < model.used() || so.usage().used > 2 * model.used() {
                return Err(format!(
                    "{} bytes live behind {} bytes handed out",
                    so.usage().used,
                    model.used()
                ));
            }
            Ok(())
        })
    }
    fn used_bytes(&self) -> u64 {
        self.handed
    }
    fn footprint(&self, size: u64) -> u64 {
        round256(size)
    }
    fn size_class(&self, size: u64) -> u64 {
        // The layer checks the exact size a block was asked with.
        size
    }
    fn forgets(&self, _block: &Block) -> bool {
        // A stale tag names a slot that may hold another address by now.
        true
    }
    fn frees_by_address(&self) -> bool {
        false
    }
    fn summary(&self) -> Vec<u64> {
        self.with(|so| {
            vec![
                self.handed,
                so.live_count() as u64,
                so.inner().usage().held,
                so.usage().used,
                so.listed_bytes(),
                so.inner().usage().used,
            ]
        })
    }
    fn spy(&self) -> Option<&Spy> {
        Some(&self.spy)
    }
    fn streams(&self) -> u8 {
        self.streams.len() as u8
    }
    fn stream_op(&mut self, op: Op) {
        match op {
            Op::Stream { which } => self.current = which as usize % self.streams.len(),
            Op::Advance => self.world.advance(),
            Op::Synchronize => self.world.synchronize(),
            Op::FailStream { n } => {
                self.world.fail_nth(n);
                self.stream_failure_armed = true;
            }
            _ => {}
        }
    }
    fn judge_alloc_failure(
        &self,
        request: &Request,
        err: &Error,
        before: &[u64],
        _: &Model,
    ) -> std::result::Result<(), String> {
        if matches!(err, Error::Backend { .. }) && self.stream_failure_armed {
            return Ok(());
        }
        let pool_before = [0, 0, before[2]];
        self.with(|so| judge_pool_failure(so.inner(), &self.spy, request, err, &pool_before))
    }
}

/// Fuzz target `stream`: [`StreamOrdered`] over a pool on two to four
/// streams of one `SimWorld` (the legacy default stream among them), with
/// the happens-before checker, which must find nothing.
pub fn run_stream(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok((pool, spy)) = super::build_pool::<Vec<_>, Vec<_>>(&mut u) else { return };
    let Ok(count) = u.int_in_range(2..=4usize) else { return };
    let world = SimWorld::new();
    let mut streams = vec![world.default_stream()];
    for i in 1..count {
        streams.push(if i == 3 { world.non_blocking_stream() } else { world.stream() });
    }
    let hb = HbChecked::new(Shared::new(StreamOrdered::new(pool)));
    let mut target = StreamTarget {
        hb,
        spy,
        world,
        streams,
        current: 1,
        handed: 0,
        allocated_on: HashMap::new(),
        stream_failure_armed: false,
    };
    drive(&mut target, &mut u);
}

// ---------------------------------------------------------------- vpool

/// The simulated space spans 2^18 granules: the pool keeps one slot per
/// granule reserved, and a reservation of a terabyte would take gigabytes.
const SPAN_GRANULES_LOG2: u32 = 18;

/// `VirtualPool` over a `SimAddressSpace`.
///
/// Injected failures are judged by the call they fire in, not by whether one
/// was armed: an armed failure fires in a later call or never. The space
/// counts the failures it delivered; each call compares the counts before
/// and after.
#[derive(Debug)]
struct VpoolTarget {
    pool: VirtualPool<SimAddressSpace>,
    /// Injected (commit, decommit) failures delivered during the last
    /// allocate, for `judge_alloc_failure`.
    delivered: (u64, u64),
    /// The most idle bytes the pool may hold now. `keep` unless a decommit
    /// failed: then unbounded after that call, and after later calls that
    /// do not retry the trim (a successful allocate, which never adds Idle
    /// granules, a failed free), the least idle seen since or `keep`. A
    /// call that retries (a free, a failed allocate, a trim) and meets no
    /// failure brings it back to `keep` (0 for a trim).
    idle_ceiling: u64,
    /// The first broken rule a call found (reported by `check`).
    broken: Option<String>,
}

impl VpoolTarget {
    /// Bytes of the granules that live blocks touch.
    fn busy_bytes(&self, model: &Model) -> u64 {
        let g = self.pool.granule();
        let mut spans: Vec<(u64, u64)> = model
            .live()
            .iter()
            .map(|l| (l.block.addr() / g, (l.block.addr() + l.footprint - 1) / g + 1))
            .collect();
        spans.sort_unstable();
        let (mut total, mut end) = (0, 0);
        for (s, e) in spans {
            let s = s.max(end);
            if e > s {
                total += e - s;
            }
            end = end.max(e);
        }
        total * g
    }

    /// Runs `call` on the pool; returns what it returned and the injected
    /// failures the space delivered during it (commits, decommits).
    fn observe<T>(&mut self, call: impl FnOnce(&mut VirtualPool<SimAddressSpace>) -> T) -> (T, (u64, u64)) {
        let before = self.pool.space().injected_failures();
        let got = call(&mut self.pool);
        let now = self.pool.space().injected_failures();
        (got, (now.0 - before.0, now.1 - before.1))
    }

    /// Moves the idle ceiling after a call that `delivered` failures:
    /// unbounded if a decommit failed in it; else `retried`, the ceiling of
    /// a call that retries a pending trim; else (a call that adds no Idle
    /// granules) the idle bytes now if fewer, never under `keep`.
    fn settle(&mut self, delivered: (u64, u64), retried: Option<u64>) {
        let keep = self.pool.config().release_threshold_bytes();
        self.idle_ceiling = match retried {
            _ if delivered.1 > 0 => u64::MAX,
            Some(ceiling) => ceiling,
            None => self.idle_ceiling.min(self.pool.idle_bytes()).max(keep),
        };
    }

    /// Records the first rule a call broke, for `check` to report.
    fn broke(&mut self, why: String) {
        self.broken.get_or_insert(why);
    }
}

impl FuzzResource for VpoolTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        let got;
        (got, self.delivered) = self.observe(|pool| pool.allocate(request, &()));
        if got.is_ok() && self.delivered.0 > 0 {
            // A failed commit is never retried: the allocate fails with it.
            self.broke(format!("an allocate succeeded though a commit failed: {got:?}"));
        }
        // A failed allocate retries a pending trim; a successful one only
        // takes Idle granules.
        let keep = self.pool.config().release_threshold_bytes();
        self.settle(self.delivered, got.is_err().then_some(keep));
        got
    }
    fn deallocate(&mut self, block: Block) -> Result<()> {
        let (got, delivered) = self.observe(|pool| pool.deallocate(block, &()));
        if delivered.0 > 0 {
            self.broke(format!("a commit failed in a free of {block:?}, which commits nothing"));
        }
        // A free of a block retries a pending trim; a failed free, or one of
        // an empty block, changes nothing.
        let keep = self.pool.config().release_threshold_bytes();
        self.settle(delivered, (got.is_ok() && !block.is_empty()).then_some(keep));
        got
    }
    fn release(&mut self) -> Option<Result<u64>> {
        let committed = self.pool.usage().held;
        let (got, delivered) = self.observe(|pool| pool.trim(&()));
        match got {
            Ok(bytes) => {
                // Every Idle granule decommitted, and counted.
                if delivered != (0, 0) || bytes != committed - self.pool.usage().held {
                    self.broke(format!(
                        "a trim returned {bytes} with {delivered:?} failures delivered; committed {committed} -> {}",
                        self.pool.usage().held
                    ));
                }
                self.settle(delivered, Some(0));
                Some(Ok(bytes))
            }
            // The decommit failure injected into this very trim, which stops
            // at the first: its granules stay committed and Idle.
            Err(e) if e == CommitLedger::INJECTED_DECOMMIT_FAILURE && delivered == (0, 1) => {
                self.settle(delivered, None);
                Some(Ok(0))
            }
            Err(e) => Some(Err(e)),
        }
    }
    fn fail_nth(&mut self, n: u64) -> bool {
        // The `n`th commit and the `n`th decommit from now: a commit that
        // fails, the undo of one, a trim and the retry after running out of
        // physical memory all meet failures, alone and together.
        self.pool.space().fail_nth_commit(n);
        self.pool.space().fail_nth_decommit(n);
        true
    }
    fn check(&self, model: &Model) -> std::result::Result<(), String> {
        if super::super::invariant_checker_on() {
            self.pool.check().map_err(|v| v.to_string())?;
        }
        let space = self.pool.space();
        for l in model.live() {
            let range = memres_core::Range::new(l.block.addr(), l.footprint).expect("live range");
            if !space.is_committed(range) {
                return Err(format!("{:?} lies over memory that is not committed", l.block));
            }
        }
        if space.committed_bytes() != self.pool.usage().held
            || space.reserved_bytes() != self.pool.reserved_bytes()
        {
            return Err(format!(
                "the space has {} bytes committed and {} reserved, the pool says {} and {}",
                space.committed_bytes(),
                space.reserved_bytes(),
                self.pool.usage().held,
                self.pool.reserved_bytes()
            ));
        }
        let busy = self.busy_bytes(model);
        if self.pool.usage().held - self.pool.idle_bytes() != busy {
            return Err(format!(
                "{} bytes committed, {} idle; live blocks touch {busy} bytes of granules",
                self.pool.usage().held,
                self.pool.idle_bytes()
            ));
        }
        if let Some(why) = &self.broken {
            return Err(why.clone());
        }
        if self.pool.idle_bytes() > self.idle_ceiling {
            return Err(format!(
                "{} bytes idle, more than the {} allowed now (keep {})",
                self.pool.idle_bytes(),
                self.idle_ceiling,
                self.pool.config().release_threshold_bytes()
            ));
        }
        Ok(())
    }
    fn used_bytes(&self) -> u64 {
        self.pool.usage().used
    }
    fn footprint(&self, size: u64) -> u64 {
        round256(size)
    }
    fn summary(&self) -> Vec<u64> {
        // Idle memory may be decommitted by any call: not in the summary.
        vec![self.pool.usage().used, self.pool.usage().free, self.pool.reserved_bytes()]
    }
    fn judge_alloc_failure(
        &self,
        request: &Request,
        err: &Error,
        before: &[u64],
        model: &Model,
    ) -> std::result::Result<(), String> {
        let g = self.pool.granule();
        let reserved = self.pool.reserved_bytes();
        let need = request.rounded_size(256) + request.align().saturating_sub(g);
        let at_max = self.pool.reservation_count() >= self.pool.config().reservations() as usize;
        let (commits, decommits) = self.delivered;
        match err {
            // A commit failure injected into this call comes through as it
            // is: a failed commit is never retried.
            _ if commits > 0 => {
                if *err == CommitLedger::INJECTED_COMMIT_FAILURE {
                    Ok(())
                } else {
                    Err(format!("{commits} injected commit failures in the call, not its error"))
                }
            }
            // A decommit failure injected into this call, of the trim after
            // running out of physical memory (its Idle granules stay
            // committed: the allocation fails with that error, never with
            // out of memory).
            Error::Backend { .. } if decommits > 0 && *err == CommitLedger::INJECTED_DECOMMIT_FAILURE => {
                Ok(())
            }
            Error::InvalidSize { .. } if reserved / g + need.div_ceil(g) >= u64::from(u32::MAX) => Ok(()),
            // Out of physical memory, the space's error comes through as it
            // is: `requested` is then the bytes of the commit.
            Error::OutOfMemory { .. } => {
                // A reservation made for the block stays when the commit
                // then fails (address space only, kept for later).
                // Reserved room: the index's promise as in the `index` target.
                let granules = request.size().div_ceil(256) + request.align() / 256 - 1;
                let room_short = self.pool.usage().largest_free < 256 * (granules + granules / 32);
                let no_more = at_max
                    || need.max(self.pool.config().reserve_size()).next_multiple_of(g)
                        > (g << SPAN_GRANULES_LOG2) - reserved;
                // Physical memory: what live blocks touch, plus the granules
                // the block would touch. Idle granules do not count: the
                // pool gives them back before it fails, and if a decommit
                // fails, the error is that failure.
                let physical =
                    self.busy_bytes(model) + (need.div_ceil(g) + 1) * g > self.pool.space().physical_bytes();
                let grew = reserved != before[2];
                if (room_short && no_more && !grew) || physical {
                    Ok(())
                } else {
                    Err(format!(
                        "largest free {}, {} reservations, {} bytes busy of {}",
                        self.pool.usage().largest_free,
                        self.pool.reservation_count(),
                        self.busy_bytes(model),
                        self.pool.space().physical_bytes()
                    ))
                }
            }
            _ => Err("unexpected error".into()),
        }
    }
}

/// Fuzz target `vpool`: [`VirtualPool`] over a `SimAddressSpace` of a few
/// granule sizes, physical sizes, reservation sizes and release thresholds;
/// commits and decommits made to fail.
pub fn run_vpool(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok((granule, physical, config)) = (|| -> arbitrary::Result<(u64, u64, VirtualConfig)> {
        let granule = *u.choose(&[4096u64, 64 << 10, 2 << 20])?;
        let physical = *u.choose(&[granule * 8, 64 << 20, 1 << 36])?;
        let reserve = granule * *u.choose(&[16u64, 1 << 10, 1 << 16])?;
        let keep = *u.choose(&[0, granule * 2, 1 << 30])?;
        let config = VirtualConfig::new(reserve)
            .release_threshold(keep)
            .max_reservations(u.int_in_range(1..=3)?)
            .trim_on_commit(u.arbitrary()?);
        Ok((granule, physical, config))
    })() else {
        return;
    };
    let pool = VirtualPool::with_config(
        SimAddressSpace::with_span(physical, granule, granule << SPAN_GRANULES_LOG2),
        config,
    )
    .expect("a valid configuration");
    let idle_ceiling = config.release_threshold_bytes();
    drive(&mut VpoolTarget { pool, delivered: (0, 0), idle_ceiling, broken: None }, &mut u);
}
