//! The fuzz target of the virtual pools per stream on simulated streams.

use super::super::{drive, FuzzResource, Model, Op};
use super::round256;
use super::streams::SimStreams;
use super::vpool::{busy_bytes, Refusal, REFUSED_RESERVATION};
use arbitrary::Unstructured;
use memres_core::per_stream::{PerStreamPool, VirtualMaker};
use memres_core::vmem::ReservableSpace;
use memres_core::vpool::VirtualConfig;
use memres_core::{Block, Error, Inspect, MemoryResource, Range, Request, Result, Shared, Stream};
use memres_sim::{HbChecked, SimAddressSpace, SimStream, UnmapChecked};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The simulated space spans 2^18 granules, as in the `vpool` target.
const SPAN_GRANULES_LOG2: u32 = 18;

/// A `SimAddressSpace` whose next reservation an input may make fail, with
/// an error or a range the pool must refuse (`UpstreamMisbehaved`), as in
/// the `vpool` target. Every stream's pool reserves from it (one when the
/// pool is made), so the range handed out again is one of the calling
/// stream's pool, named before each call: another pool's range is one no
/// pool could tell from a free one.
#[derive(Debug)]
struct Refusing {
    inner: SimAddressSpace,
    armed: Mutex<Option<Refusal>>,
    /// The first reservation of the calling stream's pool, if it has one.
    own: Mutex<Option<Range>>,
    /// Reservations refused so far, and granted so far.
    refused: AtomicU64,
    granted: AtomicU64,
}

impl core::ops::Deref for Refusing {
    type Target = SimAddressSpace;
    fn deref(&self) -> &SimAddressSpace {
        &self.inner
    }
}

impl ReservableSpace for Refusing {
    fn granule(&self) -> u64 {
        self.inner.granule()
    }
    fn reserve(&self, len: u64) -> Result<Range> {
        let Some(refusal) = self.armed.lock().expect("not poisoned").take() else {
            let got = self.inner.reserve(len);
            if got.is_ok() {
                self.granted.fetch_add(1, Ordering::Relaxed);
            }
            return got;
        };
        self.refused.fetch_add(1, Ordering::Relaxed);
        let own = *self.own.lock().expect("not poisoned");
        match (refusal, own) {
            (Refusal::Overlapping, Some(own)) => Ok(own),
            // A stream without a pool: nothing of its own to hand out.
            (Refusal::Error | Refusal::Overlapping, _) => Err(REFUSED_RESERVATION),
            (Refusal::TooLong, _) => {
                self.inner.reserve(len + self.granule()).map_err(|_| REFUSED_RESERVATION)
            }
        }
    }
    fn release(&self, range: Range) -> Result<()> {
        self.inner.release(range)
    }
    fn commit(&self, range: Range) -> Result<()> {
        self.inner.commit(range)
    }
    fn decommit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
        self.inner.decommit(range, stream)
    }
    fn releasable(&self, range: Range, want: u64) -> Option<Range> {
        self.inner.releasable(range, want)
    }
}

type Space = UnmapChecked<Refusing>;
type Pools = PerStreamPool<VirtualMaker<Arc<Space>>, SimStream>;

/// A [`PerStreamPool`] of virtual pools over one simulated space, on a few
/// `SimStream`s of one `SimWorld`, behind the happens-before checker, the
/// space checking every unmap against the work before the frees.
struct VpoolStreamsTarget {
    hb: HbChecked<Shared<Pools>>,
    space: Arc<Space>,
    streams: SimStreams,
    /// Injected failures (of stream calls, commits and decommits)
    /// delivered during the last allocate, for `judge_alloc_failure`.
    delivered: u64,
    /// Reservations refused during the last allocate.
    refused: u64,
    /// Whether the space holds memory in pieces given back whole only.
    pieced: bool,
    /// The first broken rule a call found (reported by `check`).
    broken: Option<String>,
}

impl std::fmt::Debug for VpoolStreamsTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VpoolStreamsTarget").finish_non_exhaustive()
    }
}

impl VpoolStreamsTarget {
    fn with<T>(&self, f: impl FnOnce(&mut Pools) -> T) -> T {
        self.hb.inner().with(f)
    }

    /// Injected commit and decommit failures delivered so far.
    fn space_failures(&self) -> u64 {
        let (commits, decommits) = self.space.inner().injected_failures();
        commits + decommits
    }
}

impl FuzzResource for VpoolStreamsTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        let space_before = self.space_failures();
        let id = self.streams.current().id();
        let reservations =
            self.with(|p| p.pool_of(id).map(|v| (v.reservation_count(), v.reservations().next())));
        let refusing = self.space.inner();
        *refusing.own.lock().expect("not poisoned") = reservations.and_then(|(_, first)| first);
        let (refused, granted) =
            (refusing.refused.load(Ordering::Relaxed), refusing.granted.load(Ordering::Relaxed));
        let (got, streams) = self.streams.observe(|| self.hb.allocate(request, self.streams.current()));
        self.delivered = streams + self.space_failures() - space_before;
        // A refused reservation changes nothing, and the call may still be
        // served from a free range the stream's pool held: with nothing
        // new reserved but what was granted in the call (the pool made for
        // the stream, a growth on the second try after running out of
        // physical memory). Only the stream's pool reserves in its call;
        // the others may only be dropped.
        let refusing = self.space.inner();
        self.refused = refusing.refused.load(Ordering::Relaxed) - refused;
        let granted = (refusing.granted.load(Ordering::Relaxed) - granted) as usize;
        let before = reservations.map_or(0, |(n, _)| n);
        let after = self.with(|p| p.pool_of(id).map_or(0, |v| v.reservation_count()));
        if got.is_ok() && self.refused > 0 && after != before + granted {
            self.broken.get_or_insert(format!(
                "{request:?} succeeded though a reservation was refused, with {before} reservations of the stream's pool before and {after} after ({granted} granted)"
            ));
        }
        let block = got?;
        self.streams.allocated(&block);
        Ok(block)
    }
    fn deallocate(&mut self, block: Block) -> Result<()> {
        let on = self.streams.free_retrying(&block, |on| self.hb.deallocate(block, on))?;
        if !block.is_empty() {
            // The work before the free may use the block until it is done.
            let range = Range::new(block.addr(), round256(block.size())).expect("a block's range");
            self.space.used(range, self.streams.get(on));
            self.streams.freed(&block);
        }
        Ok(())
    }
    fn fail_nth(&mut self, n: u64) -> bool {
        // And the next reservation, for `n` up to 3, as in the `vpool`
        // target: refused with an error, or answered with a range the pool
        // must refuse.
        let space = self.space.inner();
        space.fail_nth_commit(n);
        space.fail_nth_decommit(n);
        let refusal =
            [Refusal::Error, Refusal::Overlapping, Refusal::TooLong].get((n as usize).wrapping_sub(1));
        *space.armed.lock().expect("not poisoned") = refusal.copied();
        true
    }
    fn check(&self, model: &Model) -> std::result::Result<(), String> {
        if let Some(why) = &self.broken {
            return Err(why.clone());
        }
        if let Some(v) = self.hb.violations().first() {
            return Err(format!("happens-before violation: {v}"));
        }
        if self.space.early_unmaps() > 0 {
            return Err(format!("{} unmaps before the work on them was done", self.space.early_unmaps()));
        }
        let space = self.space.inner();
        if space.partial_decommits() > 0 {
            return Err(format!("{} decommits of part of a piece", space.partial_decommits()));
        }
        for l in model.live() {
            let range = Range::new(l.block.addr(), l.footprint).expect("live range");
            if !space.is_committed(range) {
                return Err(format!("{:?} lies over memory that is not committed", l.block));
            }
        }
        self.with(|p| {
            if super::super::invariant_checker_on() {
                p.check().map_err(|v| v.to_string())?;
            }
            // Every reservation is a stream's pool's (a refused one went
            // back or was never taken).
            let reserved: u64 = (0..self.streams.count() as usize)
                .filter_map(|i| p.pool_of(self.streams.get(i).id()))
                .map(|v| v.reserved_bytes())
                .sum();
            if reserved != space.reserved_bytes() {
                return Err(format!(
                    "the pools hold {reserved} bytes reserved, the space {}",
                    space.reserved_bytes()
                ));
            }
            if p.usage().held != space.committed_bytes() {
                return Err(format!(
                    "the pools hold {} bytes, the space has {} committed",
                    p.usage().held,
                    space.committed_bytes()
                ));
            }
            Ok(())
        })
    }
    fn used_bytes(&self) -> u64 {
        self.with(|p| p.usage().used)
    }
    fn footprint(&self, size: u64) -> u64 {
        round256(size)
    }
    fn size_class(&self, size: u64) -> u64 {
        // The index checks the exact size a block was asked with.
        size
    }
    fn summary(&self) -> Vec<u64> {
        // Idle memory may be unmapped by any call: not in the summary. The
        // longest unreserved run is, for `judge_alloc_failure`.
        let unreserved = self.space.inner().largest_unreserved();
        self.with(|p| vec![p.usage().used, p.stream_count() as u64, unreserved])
    }
    fn forgets(&self, _block: &Block) -> bool {
        // A stream's pool that holds nothing is dropped, its reservation
        // with it, and the addresses may come back in another's.
        true
    }
    fn streams(&self) -> u8 {
        self.streams.count()
    }
    fn stream_op(&mut self, op: Op) {
        self.streams.op(op);
    }
    fn judge_alloc_failure(
        &self,
        request: &Request,
        err: &Error,
        before: &[u64],
        model: &Model,
    ) -> std::result::Result<(), String> {
        let space = self.space.inner();
        let g = space.granule();
        let need = request.rounded_size(256) + request.align().saturating_sub(g);
        match err {
            Error::Backend { .. } if self.delivered > 0 => Ok(()),
            // A refused reservation's error stands only where the stream's
            // pool (if it has one: making it reserves) has no free range
            // that holds the request: it looks at every one. A failed
            // allocate leaves its free ranges as they were.
            Error::Backend { .. } | Error::UpstreamMisbehaved { .. } if self.refused > 0 => {
                let refusal = *err == REFUSED_RESERVATION
                    || matches!(err, Error::UpstreamMisbehaved { what, .. } if what.contains("reservation"));
                let units = request.size().div_ceil(256) + request.align() / 256 - 1;
                let largest =
                    self.with(|p| p.pool_of(self.streams.current().id()).map(|v| v.usage().largest_free));
                if !refusal {
                    Err(format!("{} reservations refused in the call, not its error", self.refused))
                } else if largest.is_some_and(|free| free >= 256 * units) {
                    Err(format!(
                        "a refused reservation's error, though the stream's pool's largest free range ({largest:?} bytes) holds the request"
                    ))
                } else {
                    Ok(())
                }
            }
            Error::InvalidSize { .. } if need / g + 2 >= 1 << SPAN_GRANULES_LOG2 => Ok(()),
            Error::OutOfMemory { .. } => {
                // Physical memory: every idle granule went back before the
                // error (the device was synchronized), so the live blocks'
                // granules and the block's do not fit. With pieces, the
                // idle granules of pieces that live blocks hold stay: what
                // stays committed then.
                let stuck = if self.pieced { space.committed_bytes() } else { busy_bytes(model, g) };
                let physical = stuck + (need.div_ceil(g) + 1) * g > space.physical_bytes();
                // Addresses: the stream's pool (none yet, or one) has no
                // room and may reserve no more, or the span has none left
                // for a reservation.
                let config = self.with(|p| *p.maker().config());
                let room = self.with(|p| {
                    p.pool_of(self.streams.current().id())
                        .map(|v| (v.usage().largest_free, v.reservation_count()))
                });
                // The index's promise of room, as in the `index` target.
                let units = request.size().div_ceil(256) + request.align() / 256 - 1;
                // Streams' pools come and go: their reservations leave gaps,
                // and a failed allocation drops the pools left empty after
                // it tried to reserve (the least of before and after).
                let reservation = need.max(config.reserve_size()).div_ceil(g);
                let unreserved = before[2].min(space.largest_unreserved());
                let span_full = unreserved < g * (reservation + reservation / 32);
                let pool_full = room.is_none_or(|(free, n)| {
                    free < 256 * (units + units / 32) && (n >= config.reservations() as usize || span_full)
                });
                if physical || pool_full {
                    Ok(())
                } else {
                    Err(format!(
                        "{} bytes busy of {}, room {room:?}, {} reserved",
                        busy_bytes(model, g),
                        space.physical_bytes(),
                        space.reserved_bytes()
                    ))
                }
            }
            _ => Err("unexpected error".into()),
        }
    }
}

/// Fuzz target `vpool_streams`: a [`PerStreamPool`] of virtual pools
/// ([`VirtualMaker`]) over one `SimAddressSpace` of a few granule sizes,
/// physical sizes, reservation sizes, release thresholds and pieces (none,
/// or up to 1, 4 or 32 granules each, as CUDA's handles), on two to four
/// streams of one `SimWorld`; commits, decommits, reservations and stream
/// calls made to fail. The happens-before checker must find no reuse, and
/// the space no unmap, that is not ordered after the frees before it.
pub fn run_vpool_streams(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok((granule, physical, config, count, pieces)) =
        (|| -> arbitrary::Result<(u64, u64, VirtualConfig, usize, u64)> {
            let granule = *u.choose(&[4096u64, 64 << 10, 2 << 20])?;
            let physical = *u.choose(&[granule * 8, 64 << 20, 1 << 36])?;
            let reserve = granule * *u.choose(&[16u64, 1 << 10, 1 << 14])?;
            let keep = *u.choose(&[0, granule * 2, u64::MAX])?;
            let config = VirtualConfig::new(reserve)
                .release_threshold(keep)
                .max_reservations(u.int_in_range(1..=2)?)
                .trim_on_commit(u.arbitrary()?)
                .slack_permille(*u.choose(&[0, 40])?);
            Ok((granule, physical, config, u.int_in_range(2..=4usize)?, *u.choose(&[0u64, 1, 4, 32])?))
        })()
    else {
        return;
    };
    let streams = SimStreams::new(count);
    let mut sim = SimAddressSpace::with_span(physical, granule, granule << SPAN_GRANULES_LOG2)
        .expect("the granules drawn are powers of two from 256");
    if pieces > 0 {
        sim = sim.with_pieces(pieces).expect("no memory is committed yet");
    }
    let sim = Refusing {
        inner: sim,
        armed: Mutex::new(None),
        own: Mutex::new(None),
        refused: AtomicU64::new(0),
        granted: AtomicU64::new(0),
    };
    let space = Arc::new(UnmapChecked::new(sim));
    let pools =
        PerStreamPool::new(VirtualMaker::new(space.clone(), config).expect("a configuration a pool takes"));
    let mut target = VpoolStreamsTarget {
        hb: HbChecked::new(Shared::new(pools)),
        space,
        streams,
        delivered: 0,
        refused: 0,
        pieced: pieces > 0,
        broken: None,
    };
    drive(&mut target, &mut u);
}
