//! The fuzz target of the virtual pool over a simulated address space.

use super::super::{drive, FuzzResource, Model};
use super::round256;
use arbitrary::Unstructured;
use memres_core::vmem::{CommitLedger, ReservableSpace};
use memres_core::vpool::{VirtualConfig, VirtualPool};
use memres_core::{Block, Error, Inspect, MemoryResourceMut, Range, Request, Result, Stream};
use memres_sim::SimAddressSpace;
use std::cell::Cell;

/// The simulated space spans 2^18 granules: the pool keeps one slot per
/// granule reserved, and a reservation of a terabyte would take gigabytes.
const SPAN_GRANULES_LOG2: u32 = 18;

/// The error of an injected refusal of a reservation.
pub(super) const REFUSED_RESERVATION: Error =
    Error::Backend { code: 3, what: "injected refusal of a reservation" };

/// How [`Refusing`] answers the next reservation once armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// With [`REFUSED_RESERVATION`].
    Error,
    /// With the first range it reserved, the pool's own.
    Overlapping,
    /// With a range a granule longer than asked (reserved, so the pool
    /// gives it back), or the error where the space has no room for it.
    TooLong,
}

/// A `SimAddressSpace` whose next reservation an input may make fail, with
/// an error or a range the pool must refuse (`UpstreamMisbehaved`).
#[derive(Debug)]
struct Refusing {
    inner: SimAddressSpace,
    armed: Cell<Option<Refusal>>,
    /// The first range reserved.
    first: Cell<Option<Range>>,
    /// Reservations refused so far, and granted so far.
    refused: Cell<u64>,
    granted: Cell<u64>,
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
        let Some(refusal) = self.armed.take() else {
            let got = self.inner.reserve(len);
            match (&got, self.first.get()) {
                (Ok(r), None) => self.first.set(Some(*r)),
                (Ok(_), Some(_)) => self.granted.set(self.granted.get() + 1),
                (Err(_), _) => {}
            }
            return got;
        };
        self.refused.set(self.refused.get() + 1);
        match refusal {
            Refusal::Error => Err(REFUSED_RESERVATION),
            Refusal::Overlapping => Ok(self.first.get().expect("the pool's first reservation")),
            // Out of room for that: the error (out of memory would say the
            // space had no room for `len`).
            Refusal::TooLong => self.inner.reserve(len + self.granule()).map_err(|_| REFUSED_RESERVATION),
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

/// `VirtualPool` over a `SimAddressSpace`, which may hold its memory in
/// pieces given back whole only (as CUDA's physical handles), and may
/// refuse a reservation.
///
/// Injected failures are judged by the call they fire in, not by whether one
/// was armed: an armed failure fires in a later call or never. The space
/// counts the failures it delivered; each call compares the counts before
/// and after.
#[derive(Debug)]
struct VpoolTarget {
    pool: VirtualPool<Refusing>,
    /// Injected (commit, decommit) failures delivered during the last
    /// allocate, for `judge_alloc_failure`.
    delivered: (u64, u64),
    /// Reservations refused during the last allocate.
    refused: u64,
    /// The most idle bytes the space could give back that the pool may
    /// hold now ([`VirtualPool::releasable_bytes`]: all idle bytes unless
    /// the space holds pieces). `keep` unless a decommit failed: then
    /// unbounded after that call, and after later calls that do not retry
    /// the trim (a successful allocate, which never adds Idle granules, a
    /// failed free), the least seen since or `keep`. A call that retries
    /// (a free, a failed allocate, a trim) and meets no failure brings it
    /// back to `keep` (0 for a trim).
    idle_ceiling: u64,
    /// The first broken rule a call found (reported by `check`).
    broken: Option<String>,
    /// Whether the space holds memory in pieces: without, every idle byte
    /// can go back.
    pieced: bool,
}

/// Bytes of the granules of `g` bytes that the model's live blocks touch.
pub(super) fn busy_bytes(model: &Model, g: u64) -> u64 {
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

impl VpoolTarget {
    /// Bytes of the granules that live blocks touch.
    fn busy_bytes(&self, model: &Model) -> u64 {
        busy_bytes(model, self.pool.granule())
    }

    /// Runs `call` on the pool; returns what it returned and the injected
    /// failures the space delivered during it (commits, decommits).
    fn observe<T>(&mut self, call: impl FnOnce(&mut VirtualPool<Refusing>) -> T) -> (T, (u64, u64)) {
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
            None => self.idle_ceiling.min(self.pool.releasable_bytes()).max(keep),
        };
    }

    /// Records the first rule a call broke, for `check` to report.
    fn broke(&mut self, why: String) {
        self.broken.get_or_insert(why);
    }
}

impl FuzzResource for VpoolTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        let space = self.pool.space();
        let (refused, granted) = (space.refused.get(), space.granted.get());
        let reservations = self.pool.reservation_count();
        let got;
        (got, self.delivered) = self.observe(|pool| pool.allocate(request, &()));
        if got.is_ok() && self.delivered.0 > 0 {
            // A failed commit is never retried: the allocate fails with it.
            self.broke(format!("an allocate succeeded though a commit failed: {got:?}"));
        }
        // A refused reservation changes nothing, and the call may still be
        // served from a free range held before: with nothing new reserved,
        // but for a reservation granted later in the call (the second try
        // after running out of physical memory).
        let space = self.pool.space();
        self.refused = space.refused.get() - refused;
        let granted = (space.granted.get() - granted) as usize;
        if got.is_ok() && self.refused > 0 && self.pool.reservation_count() != reservations + granted {
            self.broke(format!(
                "{request:?} succeeded though a reservation was refused, with {reservations} reservations before and {} after ({granted} granted)",
                self.pool.reservation_count()
            ));
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
        // physical memory all meet failures, alone and together. And the
        // next reservation, for `n` up to 3: refused with an error, or
        // answered with a range the pool must refuse.
        let space = self.pool.space();
        space.fail_nth_commit(n);
        space.fail_nth_decommit(n);
        let refusal =
            [Refusal::Error, Refusal::Overlapping, Refusal::TooLong].get((n as usize).wrapping_sub(1));
        space.armed.set(refusal.copied());
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
        // The pool decommits whole pieces only.
        if space.partial_decommits() != 0 {
            return Err(format!("{} decommits of part of a piece", space.partial_decommits()));
        }
        let releasable = self.pool.releasable_bytes();
        let idle = self.pool.idle_bytes();
        if releasable > idle || (!self.pieced && releasable != idle) || releasable > self.idle_ceiling {
            return Err(format!(
                "{releasable} bytes idle to give back of {idle} idle (pieces: {}), more than the {} allowed now (keep {})",
                self.pieced,
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
    fn size_class(&self, size: u64) -> u64 {
        // The index checks the exact size a block was asked with.
        size
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
            // A refused reservation's error stands only where no free range
            // held the request: the pool looks at every one. (A failed
            // allocate leaves the free ranges as they were.)
            Error::Backend { .. } | Error::UpstreamMisbehaved { .. } if self.refused > 0 => {
                let refusal = *err == REFUSED_RESERVATION
                    || matches!(err, Error::UpstreamMisbehaved { what, .. } if what.contains("reservation"));
                let granules = request.size().div_ceil(256) + request.align() / 256 - 1;
                if !refusal {
                    Err(format!("{} reservations refused in the call, not its error", self.refused))
                } else if self.pool.usage().largest_free >= 256 * granules {
                    Err(format!(
                        "a refused reservation's error, though the largest free range ({} bytes) holds the request",
                        self.pool.usage().largest_free
                    ))
                } else {
                    Ok(())
                }
            }
            // Out of physical memory, the space's error comes through as it
            // is: `requested` is then the bytes of the commit.
            Error::OutOfMemory { .. } => {
                // A reservation made for the block stays when the commit
                // then fails (address space only, kept for later).
                // Reserved room: where no reservation can be added, any free
                // range that holds the block serves, so none holds it at any
                // address.
                let granules = request.size().div_ceil(256) + request.align() / 256 - 1;
                let room_short = self.pool.usage().largest_free < 256 * granules;
                let no_more = at_max
                    || need.max(self.pool.config().reserve_size()).next_multiple_of(g)
                        > (g << SPAN_GRANULES_LOG2) - reserved;
                // Physical memory: what the pool cannot give back (what
                // live blocks touch, and with pieces the idle granules of
                // pieces they hold), plus the granules the block would
                // touch. Other Idle granules do not count: the pool gives
                // them back before it fails, and if a decommit fails, the
                // error is that failure.
                let stuck = self.pool.usage().held - self.pool.releasable_bytes();
                let physical = stuck.max(self.busy_bytes(model)) + (need.div_ceil(g) + 1) * g
                    > self.pool.space().physical_bytes();
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
/// granule sizes, physical sizes, reservation sizes, release thresholds and
/// pieces (none, or up to 1, 4 or 32 granules each); commits, decommits
/// and reservations made to fail.
pub fn run_vpool(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok((granule, physical, pieces, config)) =
        (|| -> arbitrary::Result<(u64, u64, u64, VirtualConfig)> {
            let granule = *u.choose(&[4096u64, 64 << 10, 2 << 20])?;
            let pieces = *u.choose(&[0u64, 1, 4, 32])?;
            let physical = *u.choose(&[granule * 8, 64 << 20, 1 << 36])?;
            let reserve = granule * *u.choose(&[16u64, 1 << 10, 1 << 16])?;
            let keep = *u.choose(&[0, granule * 2, 1 << 30])?;
            let config = VirtualConfig::new(reserve)
                .release_threshold(keep)
                .max_reservations(u.int_in_range(1..=3)?)
                .trim_on_commit(u.arbitrary()?);
            Ok((granule, physical, pieces, config))
        })()
    else {
        return;
    };
    let mut space = SimAddressSpace::with_span(physical, granule, granule << SPAN_GRANULES_LOG2)
        .expect("the granules drawn are powers of two from 256");
    if pieces > 0 {
        space = space.with_pieces(pieces).expect("no memory is committed yet");
    }
    let space = Refusing {
        inner: space,
        armed: Cell::new(None),
        first: Cell::new(None),
        refused: Cell::new(0),
        granted: Cell::new(0),
    };
    let pool = VirtualPool::with_config(space, config).expect("a valid configuration");
    let idle_ceiling = config.release_threshold_bytes();
    let mut target =
        VpoolTarget { pool, delivered: (0, 0), refused: 0, idle_ceiling, broken: None, pieced: pieces > 0 };
    drive(&mut target, &mut u);
}
