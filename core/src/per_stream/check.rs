//! The per-stream pool's figures and invariant checker.

use super::{ChunkPool, MakePool, PerStreamPool};
use crate::check::Violation;
use crate::{Inspect, Stream, Usage};
use alloc::vec::Vec;

impl<M: MakePool<S>, S: Stream + ?Sized> Inspect for PerStreamPool<M, S> {
    /// The pools' figures added up, with chunks stranded out of them as
    /// held and free; the peak is of what they held together.
    fn usage(&self) -> Usage {
        let stranded = Usage::new(0, self.stranded_bytes(), self.stranded_bytes(), 0);
        let total = self.lanes.iter().map(|l| l.pool.usage()).fold(stranded, Usage::plus);
        Usage { peak_held: self.peak_held.max(total.held), ..total }
    }

    /// Checks the invariants: every pool's own; distinct stream ids; chunks
    /// of different pools disjoint, so that every block is in exactly one
    /// stream's pool; a pool said covered with a wholly free chunk has a
    /// fence; pending waits only on a lane to settle, at most one per
    /// stream; the peak held at least what is held.
    ///
    /// # Errors
    ///
    /// The first broken invariant.
    ///
    /// # Time Complexity
    ///
    /// O(chunks · log chunks) plus each pool's check.
    fn check(&self) -> core::result::Result<(), Violation> {
        let mut chunks = Vec::new();
        for (j, lane) in self.lanes.iter().enumerate() {
            lane.pool.check()?;
            if self.lanes[..j].iter().any(|l| l.id == lane.id) {
                return Err(Violation::new("two pools for one stream"));
            }
            if lane.covered && lane.fence.is_none() && lane.pool.shortest_free_chunk(None).is_some() {
                return Err(Violation::new("a wholly free chunk said covered with no fence"));
            }
            if !lane.waits.is_empty() && (lane.covered || !lane.settle_next) {
                return Err(Violation::new("waits pending on a pool not to settle"));
            }
            if lane.waits.iter().enumerate().any(|(k, w)| lane.waits[..k].iter().any(|v| v.0 == w.0)) {
                return Err(Violation::new("two pending waits for one stream"));
            }
            lane.pool.for_each_chunk(&mut |r| chunks.push(r));
        }
        chunks.sort_unstable();
        if chunks.windows(2).any(|w| w[0].end() > w[1].start()) {
            return Err(Violation::new("chunks of two pools overlap"));
        }
        if self.peak_held < self.held() {
            return Err(Violation::new("peak held below what the pools hold"));
        }
        Ok(())
    }
}
