//! Fuzz harness: operation sequences decoded from bytes, run against a
//! resource, with three oracles checked after every step.
//!
//! 1. The resource's own invariant checker (`check()`).
//! 2. [`LiveBlocks`]: every block handed out is aligned as asked and overlaps
//!    no live block.
//! 3. A reference [`Model`]: which calls must succeed and which must fail, with
//!    which [`Error`] variant, and that a failed call changes nothing.
//!
//! Each algorithm plugs in through [`FuzzResource`]; the `run_<target>`
//! functions of [`targets`] are what the `fuzz/` crate's targets and the
//! corpus replay call. Any disagreement panics with a message that names the
//! step and both answers.
//!
//! ```
//! // Any bytes are a valid input: they decode to some operation sequence.
//! memres_tests::fuzz::run_pool(&[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]);
//! ```

mod ops;
mod step;
pub mod targets;

pub use ops::{Op, SizeClass};
pub use step::drive;
pub use targets::{
    callback_outcomes, run_arena, run_binning, run_binning_counted, run_callback, run_device_stack,
    run_fixed, run_index, run_per_stream, run_planned, run_pool, run_pool_fixed, run_pool_stack,
    run_snapshot, run_stack, run_stack_adaptors, run_stack_string, run_stream, run_trace, run_vpool,
    run_vpool_streams, stack_string_of, stack_string_order, CallbackOutcomes, LayerCheck, LayerJudge, Layers,
    SharedPool, StackOrder,
};

use memres_core::check::LiveBlocks;
use memres_core::{Block, Error, Range, Request, Result};
use std::fmt::Write as _;

/// A fuzz target: runs one input, panics on a finding.
pub type Target = fn(&[u8]);

/// Every fuzz target, by the name of its `fuzz/fuzz_targets/<name>.rs` and
/// corpus folder `fuzz/corpus/<name>/`.
pub const TARGETS: &[(&str, Target)] = &[
    ("index", run_index),
    ("pool", run_pool),
    ("pool_fixed", run_pool_fixed),
    ("pool_stack", run_pool_stack),
    ("fixed", run_fixed),
    ("binning", run_binning),
    ("stack", run_stack_adaptors),
    ("stream", run_stream),
    ("vpool", run_vpool),
    ("arena", run_arena),
    ("planned", run_planned),
    ("vpool_streams", run_vpool_streams),
    ("stack_string", run_stack_string),
    ("binning_counted", run_binning_counted),
    ("device_stack", run_device_stack),
    ("per_stream", run_per_stream),
    ("callback", run_callback),
    ("snapshot", run_snapshot),
    ("trace", run_trace),
];

/// Whether the resources' own invariant checkers run (the default). With
/// `MEMRES_FUZZ_ORACLE=model` in the environment they are skipped, to show
/// what the model and `LiveBlocks` catch on their own (see `fuzz/plant.sh`).
pub fn invariant_checker_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MEMRES_FUZZ_ORACLE").map_or(true, |v| v != "model"))
}

/// Most operations decoded from one input: keeps each run short.
pub const MAX_STEPS: usize = 400;
/// Freed blocks remembered for double frees.
const FREED_MEMORY: usize = 64;

/// A resource under test, with what the model needs to judge its answers.
///
/// Only `allocate`, `deallocate`, `check`, `used_bytes`, `footprint` and
/// `judge_alloc_failure` are required; the rest default to "not supported".
pub trait FuzzResource {
    /// Allocates through the resource's public path.
    fn allocate(&mut self, request: Request) -> Result<Block>;

    /// Frees through the resource's public path (a block with
    /// [`Block::NO_TAG`] takes the address-only path).
    fn deallocate(&mut self, block: Block) -> Result<()>;

    /// Gives free memory back upstream (`None`: no such operation).
    fn release(&mut self) -> Option<Result<u64>> {
        None
    }

    /// Whether `err`, the answer of a release or of a live block's free,
    /// is the upstream's refusal of a free that [`fail_nth`](Self::fail_nth)
    /// armed: the chunks it refused stay (the resource's own check judges
    /// the rest), a block whose free it refused stays live and the free
    /// changes nothing. By default the spied upstream's refusals.
    fn refused_free(&self, err: &Error) -> bool {
        self.spy().is_some_and(|spy| spy.refused_free(err))
    }

    /// Called once the operations decoded from the input are done, before
    /// the final frees and release, which must succeed: disarms what would
    /// make them fail. By default the spied upstream's refusals of frees.
    fn end_of_input(&mut self) {
        self.spies().into_iter().for_each(|spy| spy.refuse_nth_free(0));
    }

    /// Arms the upstream to fail its `n`-th next allocation, and to refuse
    /// its `n`-th next free (`false`: no upstream that can fail). By
    /// default every spied upstream: a growth gives chunks back, a release
    /// too, and the chunk refused stays with the resource.
    fn fail_nth(&mut self, n: u64) -> bool {
        let spies = self.spies();
        for spy in &spies {
            spy.fail_nth(n);
            spy.refuse_nth_free(n);
        }
        !spies.is_empty()
    }

    /// Runs the invariant checker and every cross-check against the model
    /// (counters, figures the resource reports).
    fn check(&self, model: &Model) -> std::result::Result<(), String>;

    /// Bytes handed out, as the resource counts them.
    fn used_bytes(&self) -> u64;

    /// Bytes a live block of `size` bytes occupies (the size rounded up to
    /// the resource's granule).
    fn footprint(&self, size: u64) -> u64;

    /// Bytes the block handed out for `request` occupies: by default the
    /// [`footprint`](Self::footprint) of its size; a resource whose blocks
    /// occupy what depends on the alignment too (which path served them)
    /// says so here.
    fn footprint_of(&self, request: &Request) -> u64 {
        self.footprint(request.size())
    }

    /// A few figures that no failed free may change (used bytes, free bytes,
    /// bytes held from upstream, ...).
    fn summary(&self) -> Vec<u64> {
        vec![self.used_bytes()]
    }

    /// How many times memory went back upstream so far: after that a double
    /// free may be answered [`Error::UnknownBlock`] instead of
    /// [`Error::DoubleFree`] (the resource no longer knows the address).
    fn give_backs(&self) -> u64 {
        self.spy().map_or(0, targets::Spy::frees)
    }

    /// Called before each allocation, so that the resource can reset what it
    /// records about its upstream calls.
    fn begin_allocate(&mut self) {
        self.spies().into_iter().for_each(targets::Spy::clear_log);
    }

    /// The spy on the resource's upstream, if it has one: then the
    /// upstream's frees are the give-backs.
    fn spy(&self) -> Option<&targets::Spy> {
        None
    }

    /// Every spied upstream (a resource over two devices has two): their
    /// logs restart at each allocation, and [`fail_nth`](Self::fail_nth)
    /// arms them all. By default [`spy`](Self::spy).
    fn spies(&self) -> Vec<&targets::Spy> {
        self.spy().into_iter().collect()
    }

    /// What a free compares sizes by: two sizes of the same class free the
    /// same block, and [`Error::SizeMismatch`] names the class of the block
    /// as `expected`. The footprint by default; the exact size for a
    /// resource that checks it.
    fn size_class(&self, size: u64) -> u64 {
        self.footprint(size)
    }

    /// [`size_class`](Self::size_class) of `size` for a free of the live
    /// `block`: for a resource whose size rule differs between its blocks
    /// (by the path that served them). The size class of `block.size()` is
    /// what [`Error::SizeMismatch`] names as `expected`.
    fn size_class_of(&self, _block: &Block, size: u64) -> u64 {
        self.size_class(size)
    }

    /// Whether frees with sizes no block has are tried too: 0 and sizes
    /// above `Request::MAX_SIZE`, each a wrong size as any other (zero
    /// bytes at an address is no empty block: [`Block::is_empty`]). Off by
    /// default.
    fn odd_free_sizes(&self) -> bool {
        false
    }

    /// The errors allowed for a free of the live block at `addr` (of size
    /// class `expected`) with a size of another class.
    fn mismatch_errors(&self, addr: u64, expected: u64, given: u64) -> Vec<Error> {
        vec![Error::SizeMismatch { addr, expected, given }]
    }

    /// Whether the resource may have forgotten a freed `block` at once (it
    /// went straight back to an upstream, or its slot was reused): a stale
    /// free of it may then be [`Error::UnknownBlock`] instead of
    /// [`Error::DoubleFree`], and a stale tag may reach a stale slot.
    fn forgets(&self, _block: &Block) -> bool {
        false
    }

    /// Further errors allowed for a stale free of a block the resource
    /// [`forgets`](Self::forgets) (e.g. the upstream's answer for memory it
    /// handed out again to the resource itself); `live` is the live block
    /// now at its address, if one is.
    fn stale_errors(&self, _block: &Block, _live: Option<&Block>) -> Vec<Error> {
        Vec::new()
    }

    /// Whether a bad free of `block` is one the resource is known not to
    /// detect (an open issue, listed in `fuzz/README.md`): the step is
    /// skipped, since the free would corrupt the resource.
    fn undetected_bad_free(&self, _block: &Block) -> bool {
        false
    }

    /// Where the simulated devices behind the resource start: a foreign
    /// free "in the device's address space" picks one of them. By default
    /// the one device at [`SimDevice::BASE`](memres_sim::SimDevice::BASE).
    fn device_bases(&self) -> Vec<u64> {
        vec![memres_sim::SimDevice::BASE]
    }

    /// Whether a block known only by its address can be freed (`false`: such
    /// a free is [`Error::UnknownBlock`]).
    fn frees_by_address(&self) -> bool {
        true
    }

    /// Number of streams the resource works on (0: no stream operations
    /// are decoded).
    fn streams(&self) -> u8 {
        0
    }

    /// Applies a stream operation (only decoded when [`streams`](Self::streams)
    /// is not zero).
    fn stream_op(&mut self, _op: Op) {}

    /// Whether `err`, the answer to the valid, non-zero `request`, is
    /// legitimate: out of memory only when a maximum, a limit or the
    /// upstream's capacity makes it so; an upstream error only when the
    /// upstream failed. `before` is [`summary`](Self::summary) before the call.
    fn judge_alloc_failure(
        &self,
        request: &Request,
        err: &Error,
        before: &[u64],
        model: &Model,
    ) -> std::result::Result<(), String>;
}

/// One block the model knows to be live.
#[derive(Clone, Copy, Debug)]
pub struct Live {
    /// The block as handed out.
    pub block: Block,
    /// Bytes it occupies in the resource (its footprint).
    pub footprint: u64,
}

#[derive(Clone, Copy, Debug)]
struct Freed {
    block: Block,
    /// `give_backs()` when it was freed.
    give_backs: u64,
}

/// The reference model: the live blocks, the recently freed ones, and the
/// log of the run for panic messages.
#[derive(Debug, Default)]
pub struct Model {
    live: Vec<Live>,
    freed: Vec<Freed>,
    blocks: LiveBlocks,
    used: u64,
    log: String,
    step: usize,
}

impl Model {
    /// The live non-empty blocks.
    pub fn live(&self) -> &[Live] {
        &self.live
    }

    /// Sum of the footprints of the live blocks.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// The live block whose footprint contains `addr`, if any.
    pub fn live_at(&self, addr: u64) -> Option<&Live> {
        self.live.iter().find(|l| addr >= l.block.addr() && addr - l.block.addr() < l.footprint)
    }

    /// The free gaps of `region` given the live blocks (sorted by address).
    pub fn gaps_in(&self, region: Range) -> Vec<Range> {
        let mut inside: Vec<Range> = self
            .live
            .iter()
            .filter(|l| region.contains(l.block.addr()))
            .map(|l| Range::new(l.block.addr(), l.footprint).expect("live footprint fits"))
            .collect();
        inside.sort_by_key(|r| r.start());
        let mut gaps = Vec::new();
        let mut cursor = region.start();
        for r in inside {
            if r.start() > cursor {
                gaps.push(Range::from_bounds(cursor, r.start()).expect("ordered"));
            }
            cursor = cursor.max(r.end());
        }
        if region.end() > cursor {
            gaps.push(Range::from_bounds(cursor, region.end()).expect("ordered"));
        }
        gaps
    }

    fn fail(&self, what: &str) -> ! {
        panic!("fuzz oracle: step {}: {what}\nlast steps:\n{}", self.step, self.tail_of_log())
    }

    fn tail_of_log(&self) -> &str {
        let lines: Vec<usize> = self.log.match_indices('\n').map(|(i, _)| i).collect();
        let from = if lines.len() > 40 { lines[lines.len() - 41] + 1 } else { 0 };
        &self.log[from..]
    }

    fn note(&mut self, line: std::fmt::Arguments<'_>) {
        let _ = writeln!(self.log, "  {:>3}: {line}", self.step);
    }

    fn add(&mut self, block: Block, request: Request, footprint: u64) {
        if let Err(v) = self.blocks.insert(block, request) {
            self.fail(&format!("LiveBlocks rejects {block:?} for {request:?}: {v}"));
        }
        if !block.is_empty() {
            self.live.push(Live { block, footprint });
            self.used += footprint;
        }
    }

    fn remove(&mut self, index: usize, give_backs: u64) {
        let live = self.live.swap_remove(index);
        if let Err(v) = self.blocks.remove(&live.block) {
            self.fail(&format!("LiveBlocks rejects the free of {:?}: {v}", live.block));
        }
        self.used -= live.footprint;
        if self.freed.len() == FREED_MEMORY {
            self.freed.remove(0);
        }
        self.freed.push(Freed { block: live.block, give_backs });
    }
}
