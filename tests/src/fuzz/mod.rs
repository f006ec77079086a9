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
pub mod targets;

pub use ops::{Op, SizeClass};
pub use targets::{
    run_arena, run_binning, run_fixed, run_index, run_pool, run_pool_fixed, run_pool_stack, run_stack,
    run_stack_adaptors, run_stream, run_vpool, LayerCheck, LayerJudge, Layers, SharedPool,
};

use arbitrary::Unstructured;
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

    /// Arms the upstream to fail its `n`-th next allocation (`false`: no
    /// upstream that can fail). By default the spied upstream, if any.
    fn fail_nth(&mut self, n: u64) -> bool {
        self.spy().map(|spy| spy.fail_nth(n)).is_some()
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
        if let Some(spy) = self.spy() {
            spy.clear_log();
        }
    }

    /// The spy on the resource's upstream, if it has one: then the
    /// upstream's frees are the give-backs, and its log restarts at each
    /// allocation.
    fn spy(&self) -> Option<&targets::Spy> {
        None
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

    /// Whether frees with sizes no block has are tried too: 0 (which frees
    /// nothing: [`Block::is_empty`]) and sizes above `Request::MAX_SIZE`
    /// (a wrong size as any other). Off by default.
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
    /// handed out again to the resource itself).
    fn stale_errors(&self, _block: &Block) -> Vec<Error> {
        Vec::new()
    }

    /// Whether a bad free of `block` is one the resource is known not to
    /// detect (an open issue, listed in `fuzz/README.md`): the step is
    /// skipped, since the free would corrupt the resource.
    fn undetected_bad_free(&self, _block: &Block) -> bool {
        false
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

/// Runs `data` as an operation sequence against `resource`.
///
/// # Panics
///
/// On the first disagreement between the resource and the oracles.
pub fn drive<R: FuzzResource>(resource: &mut R, u: &mut Unstructured<'_>) {
    let mut model = Model::default();
    after_step(resource, &mut model);
    while !u.is_empty() && model.step < MAX_STEPS {
        let op = match Op::decode_for(u, resource.streams()) {
            Ok(op) => op,
            Err(_) => break,
        };
        model.step += 1;
        apply(resource, &mut model, op);
        after_step(resource, &mut model);
    }
    // Free everything: the resource must end with nothing in use.
    while let Some(live) = model.live.last().copied() {
        model.step += 1;
        model.note(format_args!("final free {:?}", live.block));
        if let Err(e) = resource.deallocate(live.block) {
            model.fail(&format!("final free of live {:?} failed: {e:?}", live.block));
        }
        let gb = resource.give_backs();
        model.remove(model.live.len() - 1, gb);
        after_step(resource, &mut model);
    }
    if let Some(Err(e)) = resource.release() {
        model.fail(&format!("final release failed: {e:?}"));
    }
    after_step(resource, &mut model);
}

fn after_step<R: FuzzResource>(resource: &R, model: &mut Model) {
    if let Err(v) = resource.check(model) {
        model.fail(&format!("check failed: {v}"));
    }
    let used = resource.used_bytes();
    if used != model.used {
        model.fail(&format!("resource counts {used} bytes in use, the model {}", model.used));
    }
    if model.blocks.bytes() > model.used {
        model.fail("LiveBlocks holds more bytes than the model's footprints");
    }
}

fn apply<R: FuzzResource>(r: &mut R, m: &mut Model, op: Op) {
    match op {
        Op::Allocate { size, align } => allocate(r, m, size, align),
        Op::Free { index, by_address } => {
            if m.live.is_empty() {
                return;
            }
            let i = index % m.live.len();
            let b = m.live[i].block;
            let block = if by_address { Block::from_addr(b.addr(), b.size()) } else { b };
            m.note(format_args!("free live {block:?}"));
            let before = r.summary();
            if by_address && !r.frees_by_address() {
                let got = r.deallocate(block);
                let want = Error::UnknownBlock { addr: b.addr() };
                expect_unchanged_err(r, m, got, &[want], &before, "address-only free (unsupported)");
                return;
            }
            match r.deallocate(block) {
                Ok(()) => {
                    let gb = r.give_backs();
                    m.remove(i, gb);
                }
                Err(e) => {
                    m.fail(&format!("free of live {block:?} failed: {e:?} (summary before {before:?})"))
                }
            }
        }
        Op::FreeWrongSize { index, by_address, delta } => {
            if m.live.is_empty() {
                return;
            }
            let i = index % m.live.len();
            let b = m.live[i].block;
            let size = wrong_size(b.size(), delta, r.odd_free_sizes());
            let block = if by_address {
                Block::from_addr(b.addr(), size)
            } else {
                Block::new(b.addr(), size, b.tag())
            };
            m.note(format_args!("free live {b:?} with size {size}"));
            if size == 0 {
                // An empty block: its free does nothing, the block stays live.
                let before = r.summary();
                if let Err(e) = r.deallocate(block) {
                    m.fail(&format!("free of {block:?} (size 0) failed: {e:?}"));
                }
                if r.summary() != before {
                    m.fail(&format!("free of {block:?} (size 0) changed the resource"));
                }
                return;
            }
            let (fp_old, fp_new) = (r.size_class_of(&b, b.size()), r.size_class_of(&b, size));
            if fp_new != fp_old && r.undetected_bad_free(&block) {
                m.note(format_args!("skipped: a bad free the resource does not detect"));
                return;
            }
            let before = r.summary();
            let got = r.deallocate(block);
            if by_address && !r.frees_by_address() {
                let want = Error::UnknownBlock { addr: b.addr() };
                expect_unchanged_err(r, m, got, &[want], &before, "address-only free (unsupported)");
            } else if fp_new == fp_old {
                // The same footprint: a valid free of the block.
                if let Err(e) = got {
                    m.fail(&format!("free of live {b:?} with size {size} (same footprint) failed: {e:?}"));
                }
                let gb = r.give_backs();
                m.remove(i, gb);
            } else {
                let want = r.mismatch_errors(b.addr(), fp_old, size);
                expect_unchanged_err(r, m, got, &want, &before, "free with a wrong size");
            }
        }
        Op::DoubleFree { index, by_address } => {
            if m.freed.is_empty() {
                return;
            }
            let f = m.freed[index % m.freed.len()];
            let b = f.block;
            let block = if by_address { Block::from_addr(b.addr(), b.size()) } else { b };
            m.note(format_args!("double free {block:?}"));
            let gave_back = r.give_backs() != f.give_backs;
            stale_or_foreign_free(r, m, block, gave_back, true);
        }
        Op::FreeForeign { base, offset, tag } => {
            let addr = match (base, m.live.is_empty()) {
                (0, false) => {
                    let l = m.live[offset as usize % m.live.len()];
                    // Inside a live block, past its start (granule steps or odd).
                    l.block.addr().wrapping_add(1 + (offset >> 8) % l.footprint.max(1))
                }
                (1, _) => offset,
                (2, _) => memres_sim::SimDevice::BASE.wrapping_add(offset & 0xffff_ffff_ff00),
                _ => offset & !255,
            };
            if m.live.iter().any(|l| l.block.addr() == addr) || addr.checked_add(256).is_none() {
                return; // handed out: not foreign
            }
            let block =
                if tag == Block::NO_TAG { Block::from_addr(addr, 256) } else { Block::new(addr, 256, tag) };
            m.note(format_args!("foreign free {block:?}"));
            stale_or_foreign_free(r, m, block, true, false);
        }
        Op::Release => {
            let before_used = r.used_bytes();
            match r.release() {
                None => {}
                Some(Ok(bytes)) => m.note(format_args!("release: {bytes} bytes back upstream")),
                Some(Err(e)) => m.fail(&format!("release failed: {e:?}")),
            }
            if r.used_bytes() != before_used {
                m.fail("release changed the bytes in use");
            }
        }
        Op::FailNth { n } => {
            if r.fail_nth(n) {
                m.note(format_args!("upstream fails its call number {n} from now"));
            }
        }
        Op::Stream { .. } | Op::Advance | Op::Synchronize | Op::FailStream { .. } => {
            m.note(format_args!("{op:?}"));
            r.stream_op(op);
        }
    }
}

fn allocate<R: FuzzResource>(r: &mut R, m: &mut Model, size: u64, align: u64) {
    // Validation: exactly what `Request` promises.
    let expect = if !align.is_power_of_two() || align > Request::MAX_ALIGN {
        Err(Error::InvalidAlignment { align })
    } else if size > Request::MAX_SIZE {
        Err(Error::InvalidSize { size })
    } else {
        Ok(())
    };
    let request = match (Request::aligned(size, align), expect) {
        (Ok(req), Ok(())) => req,
        (Err(got), Err(want)) if got == want => {
            m.note(format_args!("request({size}, {align}) rejected: {got:?}"));
            return;
        }
        (got, want) => m.fail(&format!("Request::aligned({size}, {align}) = {got:?}, expected {want:?}")),
    };
    if request.size() != size || request.align() != align.max(memres_core::DEFAULT_ALIGNMENT) {
        m.fail(&format!("Request::aligned({size}, {align}) became {request:?}"));
    }
    let before = r.summary();
    r.begin_allocate();
    match r.allocate(request) {
        Ok(block) => {
            m.note(format_args!("allocate({size}, {align}) = {block:?}"));
            let fp = if block.is_empty() { 0 } else { r.footprint_of(&request) };
            m.add(block, request, fp);
        }
        Err(e) => {
            m.note(format_args!("allocate({size}, {align}) failed: {e:?}"));
            if request.is_zero() {
                m.fail(&format!("zero-byte request failed: {e:?}"));
            }
            if r.used_bytes() != before[0] {
                m.fail("a failed allocation changed the bytes in use");
            }
            if let Err(why) = r.judge_alloc_failure(&request, &e, &before, m) {
                m.fail(&format!("allocate({size}, {align}) failed with {e:?}, illegitimately: {why}"));
            }
        }
    }
}

/// A free of a block that is not live (stale: freed before; foreign: never
/// handed out). By address, a stale address that is live again is a valid
/// free of that live block.
fn stale_or_foreign_free<R: FuzzResource>(
    r: &mut R,
    m: &mut Model,
    block: Block,
    gave_back: bool,
    stale: bool,
) {
    let addr = block.addr();
    let before = r.summary();
    let tagged = block.tag() != Block::NO_TAG;
    let forgets = r.forgets(&block);
    if r.undetected_bad_free(&block) {
        m.note(format_args!("skipped: a bad free the resource does not detect"));
        return;
    }
    if let Some(i) = m.live.iter().position(|l| l.block.addr() == addr) {
        let live = m.live[i];
        if tagged {
            // A stale tag for an address handed out again: never the new block.
            let got = r.deallocate(block);
            let mut allowed = vec![Error::DoubleFree { addr }];
            if forgets {
                allowed.push(Error::UnknownBlock { addr });
                allowed.extend(r.stale_errors(&block));
            }
            expect_unchanged_err(r, m, got, &allowed, &before, "stale free of a reused address");
        } else if !r.frees_by_address() {
            let got = r.deallocate(block);
            let want = Error::UnknownBlock { addr };
            expect_unchanged_err(r, m, got, &[want], &before, "address-only free (unsupported)");
        } else if r.size_class_of(&live.block, block.size())
            == r.size_class_of(&live.block, live.block.size())
        {
            if let Err(e) = r.deallocate(block) {
                m.fail(&format!("address-only free of live {:?} failed: {e:?}", live.block));
            }
            let gb = r.give_backs();
            m.remove(i, gb);
        } else {
            let got = r.deallocate(block);
            let want = r.mismatch_errors(addr, r.size_class_of(&live.block, live.block.size()), block.size());
            expect_unchanged_err(r, m, got, &want, &before, "address-only free with another size");
        }
        return;
    }
    if stale && forgets && !tagged && r.frees_by_address() && m.live_at(addr).is_none() {
        // Memory that went straight back upstream may be the upstream's
        // again under another owner (a chunk of the resource itself): a
        // free by address there is undetectable, as a double free of any
        // allocator's memory that it handed out again.
        m.note(format_args!("skipped: address-only free of forgotten memory"));
        return;
    }
    let got = r.deallocate(block);
    if m.live_at(addr).is_some() {
        // Inside a live block: not a block start the resource handed out.
        let mut allowed = vec![Error::UnknownBlock { addr }];
        if forgets && tagged {
            allowed.push(Error::DoubleFree { addr });
        }
        expect_unchanged_err(r, m, got, &allowed, &before, "free inside a live block");
    } else if stale && !gave_back && !forgets {
        // Still in memory the resource holds, and free there.
        expect_unchanged_err(r, m, got, &[Error::DoubleFree { addr }], &before, "double free");
    } else {
        let mut allowed = vec![Error::DoubleFree { addr }, Error::UnknownBlock { addr }];
        if forgets {
            allowed.extend(r.stale_errors(&block));
        }
        expect_unchanged_err(
            r,
            m,
            got,
            &allowed,
            &before,
            if stale { "double free after memory went back upstream" } else { "free of a foreign address" },
        );
    }
}

fn expect_unchanged_err<R: FuzzResource>(
    r: &R,
    m: &Model,
    got: Result<()>,
    allowed: &[Error],
    before: &[u64],
    what: &str,
) {
    match got {
        Ok(()) => m.fail(&format!("{what} succeeded; expected one of {allowed:?}")),
        Err(e) if allowed.contains(&e) => {}
        Err(e) => m.fail(&format!("{what} failed with {e:?}; expected one of {allowed:?}")),
    }
    let after = r.summary();
    if after != before {
        m.fail(&format!("{what}: the failed call changed the resource: {before:?} -> {after:?}"));
    }
}

/// A size other than `size`, picked by `delta`; with `odd`, a quarter of
/// the picks are sizes no block has (0, above `Request::MAX_SIZE`).
fn wrong_size(size: u64, delta: u8, odd: bool) -> u64 {
    if odd && delta & 0x60 == 0x60 {
        return match delta % 3 {
            0 => 0,
            1 => Request::MAX_SIZE + 1 + u64::from(delta),
            _ => u64::MAX - u64::from(delta & 1),
        };
    }
    let d = match delta % 6 {
        0 => 1,
        1 => 255,
        2 => 256,
        3 => 257,
        4 => 4096,
        _ => size,
    };
    let s = if delta & 0x80 != 0 { size.saturating_sub(d) } else { size.saturating_add(d) };
    if s == 0 || s == size {
        size + 1
    } else {
        s
    }
}
