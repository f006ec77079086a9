//! The fuzz target of the stream-ordered layer on simulated streams.

use super::super::{drive, FuzzResource, Model, Op};
use super::streams::SimStreams;
use super::{judge_pool_failure, round256, Pool, Spy};
use arbitrary::Unstructured;
use memres_core::stream_ordered::StreamOrdered;
use memres_core::{Block, Error, Inspect, MemoryResource, Request, Result, Shared};
use memres_sim::{HbChecked, SimStream};

type Ordered = StreamOrdered<Pool, SimStream>;

/// `StreamOrdered` over a pool, on a few `SimStream`s of one `SimWorld`,
/// behind the happens-before checker.
struct StreamTarget {
    hb: HbChecked<Shared<Ordered>>,
    spy: Spy,
    streams: SimStreams,
    /// Injected stream failures delivered during the last allocate, for
    /// `judge_alloc_failure`.
    delivered: u64,
    /// The bytes the layer counts for the last block it handed out (its
    /// inner block's footprint), the block's footprint in the model.
    counted: u64,
    /// The first broken rule a call found (reported by `check`).
    broken: Option<String>,
}

impl std::fmt::Debug for StreamTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamTarget").field("delivered", &self.delivered).finish_non_exhaustive()
    }
}

impl StreamTarget {
    fn with<T>(&self, f: impl FnOnce(&mut Ordered) -> T) -> T {
        self.hb.inner().with(f)
    }
}

impl FuzzResource for StreamTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        let used = self.used_bytes();
        let got;
        (got, self.delivered) = self.streams.observe(|| self.hb.allocate(request, self.streams.current()));
        let block = got?;
        self.counted = self.used_bytes() - used;
        // A listed block serves a request only if it wastes at most half.
        let asked = if block.is_empty() { 0 } else { round256(request.size()) };
        if self.counted < asked || self.counted > 2 * asked {
            let counted = self.counted;
            self.broken.get_or_insert(format!("{counted} bytes counted for {block:?}, asked {request:?}"));
        }
        self.streams.allocated(&block);
        Ok(block)
    }
    fn deallocate(&mut self, block: Block) -> Result<()> {
        let on = self.streams.free_on(&block);
        self.hb.deallocate(block, self.streams.get(on))?;
        self.streams.freed(&block);
        Ok(())
    }
    fn release(&mut self) -> Option<Result<u64>> {
        // Blocks whose free completed go back to the pool, the pool's free
        // chunks upstream.
        match self.streams.observe(|| self.with(|so| so.reclaim())) {
            (Ok(n), _) => Some(Ok(n as u64)),
            // The failure injected into the event it records: the lists stay.
            (Err(Error::Backend { .. }), delivered) if delivered > 0 => Some(Ok(0)),
            (Err(e), _) => Some(Err(e)),
        }
    }
    fn check(&self, model: &Model) -> std::result::Result<(), String> {
        if let Some(why) = &self.broken {
            return Err(why.clone());
        }
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
            Ok(())
        })
    }
    fn used_bytes(&self) -> u64 {
        self.with(|so| so.usage().used)
    }
    fn footprint(&self, size: u64) -> u64 {
        round256(size)
    }
    fn footprint_of(&self, _: &Request) -> u64 {
        // Called right after the allocation: what the layer counted for it
        // (checked there), which its free must take back.
        self.counted
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
                so.usage().used,
                so.live_count() as u64,
                so.inner().usage().held,
                so.listed_bytes(),
                so.inner().usage().used,
            ]
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
        if matches!(err, Error::Backend { .. }) && self.delivered > 0 {
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
    let hb = HbChecked::new(Shared::new(StreamOrdered::new(pool)));
    let mut target =
        StreamTarget { hb, spy, streams: SimStreams::new(count), delivered: 0, counted: 0, broken: None };
    drive(&mut target, &mut u);
}
