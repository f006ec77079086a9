//! The fuzz target of a pool under layers of adaptors.

use super::super::{drive, FuzzResource, Model};
use super::{build_pool, check_pool, pool_summary, released};
use super::{judge_pool_failure, Pool, Spy};
use arbitrary::Unstructured;
use memres_core::pool::{Chunk, Node};
use memres_core::{Block, Error, Inspect, MemoryResource, Request, Result, Shared};
use std::sync::Arc;

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
    fn size_class(&self, size: u64) -> u64 {
        // The index checks the exact size a block was asked with.
        size
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
