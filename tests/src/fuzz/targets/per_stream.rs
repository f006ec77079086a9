//! The fuzz target of the per-stream pools of coalescing pools on
//! simulated streams.

use super::super::{drive, FuzzResource, Model, Op};
use super::streams::SimStreams;
use super::{round256, Spy};
use arbitrary::Unstructured;
use memres_core::per_stream::{PerStreamPool, PoolMaker};
use memres_core::{Block, Error, Inspect, MemoryResource, Request, Result, Shared, Stream};
use memres_sim::{HbChecked, SimStream, SimWorld};

type Pools = PerStreamPool<PoolMaker<Synchronizing>, SimStream>;

/// The spied device as the `cuda` leaf is (`cuMemFree`): a free waits for
/// the whole device first. Memory it takes back may go to any stream at
/// once: the work that used it is done. (`SimDevice` alone ignores
/// streams, and its reuse would show as a violation that is the device's.)
#[derive(Clone, Debug)]
struct Synchronizing {
    spy: Spy,
    world: SimWorld,
}

impl MemoryResource<SimStream> for Synchronizing {
    fn allocate(&self, request: Request, stream: &SimStream) -> Result<Block> {
        self.spy.allocate(request, stream)
    }
    fn deallocate(&self, block: Block, stream: &SimStream) -> Result<()> {
        self.world.synchronize();
        self.spy.deallocate(block, stream)
    }
}

/// A [`PerStreamPool`] of coalescing pools ([`PoolMaker`]) over the spied
/// device, on a few `SimStream`s of one `SimWorld`, behind the
/// happens-before checker.
struct PerStreamTarget {
    hb: HbChecked<Shared<Pools>>,
    spy: Spy,
    streams: SimStreams,
    /// Injected stream failures delivered during the last allocate, for
    /// `judge_alloc_failure`.
    delivered: u64,
}

impl std::fmt::Debug for PerStreamTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerStreamTarget").field("delivered", &self.delivered).finish_non_exhaustive()
    }
}

impl PerStreamTarget {
    fn with<T>(&self, f: impl FnOnce(&mut Pools) -> T) -> T {
        self.hb.inner().with(f)
    }

    /// Bytes the current stream's pool holds, if it has one.
    fn held_by_current(&self) -> Option<u64> {
        self.with(|p| p.pool_of(self.streams.current().id()).map(|pool| pool.usage().held))
    }
}

impl FuzzResource for PerStreamTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        let got;
        (got, self.delivered) = self.streams.observe(|| self.hb.allocate(request, self.streams.current()));
        let block = got?;
        self.streams.allocated(&block);
        Ok(block)
    }
    fn deallocate(&mut self, block: Block) -> Result<()> {
        self.streams.free_retrying(&block, |on| self.hb.deallocate(block, on))?;
        self.streams.freed(&block);
        Ok(())
    }
    fn release(&mut self) -> Option<Result<u64>> {
        let (got, delivered) = self.streams.observe(|| self.with(|p| p.release(self.streams.current())));
        match got {
            Ok(bytes) => {
                // The simulated streams synchronize the device: every pool's
                // wholly free chunks went back.
                let (used, held) = self.with(|p| (p.usage().used, p.usage().held));
                assert!(
                    used != 0 || held == 0,
                    "fuzz oracle: release() left {held} bytes held with nothing in use ({bytes} given back)"
                );
                Some(Ok(bytes))
            }
            // The failure injected into the synchronization or a wait:
            // nothing went back.
            Err(Error::Backend { .. }) if delivered > 0 => Some(Ok(0)),
            Err(e) => Some(Err(e)),
        }
    }
    fn check(&self, _model: &Model) -> std::result::Result<(), String> {
        if let Some(v) = self.hb.violations().first() {
            return Err(format!("happens-before violation: {v}"));
        }
        self.with(|p| {
            if super::super::invariant_checker_on() {
                p.check().map_err(|v| v.to_string())?;
            }
            if self.spy.inner.usage().held != p.usage().held {
                return Err(format!(
                    "upstream holds {} bytes for the pools, they say {}",
                    self.spy.inner.usage().held,
                    p.usage().held
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
    fn forgets(&self, _block: &Block) -> bool {
        // A chunk moved to another stream's pool is stamped with that
        // pool's number: a stale tag there names no block of it.
        self.with(|p| p.stats().chunks_moved > 0)
    }
    fn summary(&self) -> Vec<u64> {
        self.with(|p| {
            let id = self.streams.current().id();
            vec![p.usage().used, p.usage().held, p.stream_count() as u64, u64::from(p.pool_of(id).is_some())]
        })
    }
    fn spy(&self) -> Option<&Spy> {
        Some(&self.spy)
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
        _: &Model,
    ) -> std::result::Result<(), String> {
        let log = self.spy.log();
        let config = self.with(|p| *p.maker().config());
        match *err {
            Error::Backend { .. } if self.delivered > 0 || log.failed_other => Ok(()),
            e if log.free_refused && self.spy.refused_free(&e) => Ok(()),
            // The stream's first allocation, whose pool could not be made:
            // the device refused its initial size.
            Error::OutOfMemory { .. } if before[3] == 0 && self.held_by_current().is_none() => {
                match log.refused.as_slice() {
                    [initial] if *initial > 0 => Ok(()),
                    refused => Err(format!("no pool made, the device refused {refused:?}")),
                }
            }
            Error::OutOfMemory { requested, pool_size, max_size, .. } => {
                if log.free_refused {
                    return Err("out of memory after a refused free: the refusal is the cause".into());
                }
                let held = self.with(|p| p.usage().held);
                if requested != request.size() || pool_size != held || max_size != config.maximum() {
                    return Err(format!(
                        "wrong figures: the pools hold {held}, maximum {:?}",
                        config.maximum()
                    ));
                }
                // The stream's pool may not grow past its maximum, and the
                // device refused what would have held the request.
                let lane = self.held_by_current().unwrap_or(0);
                let need = request.rounded_size(256) + request.align() - 256;
                let max_forbids = config.maximum().is_some_and(|m| need > m.saturating_sub(lane));
                let upstream_refused = log.refused.iter().any(|&s| s <= need) || need > Request::MAX_SIZE;
                if max_forbids || upstream_refused {
                    Ok(())
                } else {
                    Err(format!(
                        "need {need} bytes; the stream's pool holds {lane}, the device refused only {:?}",
                        log.refused
                    ))
                }
            }
            _ => Err(format!("unexpected error; upstream log {log:?}")),
        }
    }
}

/// Fuzz target `per_stream`: a [`PerStreamPool`] of coalescing pools
/// ([`PoolMaker`]) over the spied `SimDevice`, the `pool` target's
/// configurations each stream's pool's (and, in some runs, an initial size
/// of the first pool's own), on two to four streams of one `SimWorld`;
/// device allocations, device frees and stream calls made to fail. The
/// happens-before checker must find no reuse of a block on another stream
/// that is not ordered after its free, whichever way the memory went:
/// a free on another stream, a chunk moved between streams' pools, given
/// back and taken again.
pub fn run_per_stream(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(((capacity, config), first, count)) = (|| {
        let config = super::draw_pool_config(&mut u)?;
        let first = if u.arbitrary()? { Some(256 * u.int_in_range(1..=1u64 << 15)?) } else { None };
        Ok::<_, arbitrary::Error>((config, first, u.int_in_range(2..=4usize)?))
    })() else {
        return;
    };
    let spy = Spy::new(capacity);
    let streams = SimStreams::new(count);
    let device = Synchronizing { spy: spy.clone(), world: streams.world.clone() };
    let maker = PoolMaker::with_config(device, config).expect("the pool target's configurations are valid");
    // A first pool's initial size above the maximum is refused: none then.
    let maker = match first.map(|bytes| maker.clone().first_initial_size(bytes)) {
        Some(Ok(with_first)) => with_first,
        _ => maker,
    };
    let hb = HbChecked::new(Shared::new(PerStreamPool::new(maker)));
    let mut target = PerStreamTarget { hb, spy, streams, delivered: 0 };
    drive(&mut target, &mut u);
}
