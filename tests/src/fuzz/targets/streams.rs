//! The simulated streams of the stream-ordered targets: which one is
//! current, and what a correct caller does before a free on another stream
//! than the block's.

use super::super::Op;
use memres_core::{Block, Error, Result, Stream};
use memres_sim::{SimStream, SimWorld};
use std::collections::HashMap;

/// Two to four streams of one `SimWorld`: the legacy default stream, blocking
/// ones and, as the fourth, a non-blocking one.
pub(super) struct SimStreams {
    pub(super) world: SimWorld,
    list: Vec<SimStream>,
    current: usize,
    /// The stream each live block was handed out on, by address.
    allocated_on: HashMap<u64, usize>,
}

impl SimStreams {
    /// `count` streams; the first after the default one is current.
    pub(super) fn new(count: usize) -> Self {
        let world = SimWorld::new();
        let mut list = vec![world.default_stream()];
        for i in 1..count {
            list.push(if i == 3 { world.non_blocking_stream() } else { world.stream() });
        }
        SimStreams { world, list, current: 1, allocated_on: HashMap::new() }
    }

    /// Runs `call`; returns what it returned and the injected stream
    /// failures delivered during it: a backend error is legitimate only
    /// from a call that met one (an armed failure fires in a later call,
    /// or never).
    pub(super) fn observe<T>(&self, call: impl FnOnce() -> T) -> (T, u64) {
        let before = self.world.injected_failures();
        let got = call();
        (got, self.world.injected_failures() - before)
    }

    /// Frees `block` through `free`, on the stream a correct caller frees
    /// it on ([`free_on`](Self::free_on)), and once more where the first
    /// try met an injected stream failure (an event of a free on another
    /// stream, a wait before one): such a free changes nothing, and a
    /// caller tries again. The stream it was freed on.
    pub(super) fn free_retrying(
        &self,
        block: &Block,
        free: impl Fn(&SimStream) -> Result<()>,
    ) -> Result<usize> {
        let on = self.free_on(block);
        match self.observe(|| free(self.get(on))) {
            (Err(Error::Backend { .. }), delivered) if delivered > 0 => free(self.get(on))?,
            (got, _) => got?,
        }
        Ok(on)
    }

    /// The stream of the next call.
    pub(super) fn current(&self) -> &SimStream {
        &self.list[self.current]
    }

    /// The stream `i`.
    pub(super) fn get(&self, i: usize) -> &SimStream {
        &self.list[i]
    }

    pub(super) fn count(&self) -> u8 {
        self.list.len() as u8
    }

    /// `block` was handed out on the current stream.
    pub(super) fn allocated(&mut self, block: &Block) {
        if !block.is_empty() {
            self.allocated_on.insert(block.addr(), self.current);
        }
    }

    /// The stream to free `block` on: the current one, ordered after the
    /// block's work on the stream it was handed out on, as a correct caller
    /// does; if that fails, the block's own.
    pub(super) fn free_on(&self, block: &Block) -> usize {
        let on = self.current;
        match self.allocated_on.get(&block.addr()) {
            Some(&first) if first != on => {
                let ordered = self.list[first].record().and_then(|e| self.list[on].wait(&e));
                if ordered.is_err() {
                    first
                } else {
                    on
                }
            }
            _ => on,
        }
    }

    /// `block` was freed.
    pub(super) fn freed(&mut self, block: &Block) {
        self.allocated_on.remove(&block.addr());
    }

    /// Switches, advances, synchronizes or arms a failure.
    pub(super) fn op(&mut self, op: Op) {
        match op {
            Op::Stream { which } => self.current = which as usize % self.list.len(),
            Op::Advance => self.world.advance(),
            Op::Synchronize => self.world.synchronize(),
            Op::FailStream { n } => self.world.fail_nth(n),
            _ => {}
        }
    }
}
