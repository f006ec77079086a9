//! The fuzz target of the two resources that run the program's closures:
//! the failure callback adaptor over the callback resource, over the spied
//! device. What each closure answers comes from the input.

use super::super::{drive, FuzzResource, Model};
use super::{round256, Spy};
use arbitrary::Unstructured;
use memres_core::adaptor::{FailureCallback, RetryOn};
use memres_core::callback::CallbackResource;
use memres_core::{Block, Error, Inspect, MemoryResource, Request, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

type Allocate = fn(Request, &(), &Arc<Program>) -> Result<Block>;
type Deallocate = fn(Block, &(), &Arc<Program>) -> Result<()>;
type Closures = CallbackResource<Arc<Program>, Allocate, Deallocate>;
type Adaptor = FailureCallback<Recorded, Arc<Program>, fn(u64, &Arc<Program>) -> bool>;

/// What the allocate closure returned, as it meant it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Answer {
    /// A block that answers the request.
    Good(Block),
    /// A block spoiled on purpose: empty, of another size, misaligned or
    /// wrapping around.
    Bad(Block),
    /// The device's error.
    Failed(Error),
}

/// What one call of the adaptor set going below it, in order.
#[derive(Debug, Default)]
struct Trace {
    /// The allocate closure's answers.
    closure: Vec<Answer>,
    /// The bad blocks the callback resource gave the deallocate closure.
    handed_back: Vec<Block>,
    /// The callback resource's answers to the adaptor.
    upstream: Vec<Result<Block>>,
    /// The failure callback's calls: the bytes it was told, and whether it
    /// asked to retry.
    callbacks: Vec<(u64, bool)>,
}

impl Trace {
    fn is_empty(&self) -> bool {
        self.closure.is_empty()
            && self.handed_back.is_empty()
            && self.upstream.is_empty()
            && self.callbacks.is_empty()
    }
}

/// What runs of the `callback` target exercised: the corpus test checks
/// that the committed inputs reach each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallbackOutcomes {
    /// Allocations the device first refused for want of memory, then
    /// served on a retry the failure callback asked for: room only its
    /// frees of the ballast make.
    pub served_on_retry: u64,
    /// Allocations that failed because the failure callback declined.
    pub declined: u64,
    /// Allocations that failed with every retry the adaptor allows used up.
    pub retries_used_up: u64,
    /// Frees the device refused: the caller's, the failure callback's and
    /// the callback resource's of a bad block.
    pub refused_frees: u64,
    /// Bad blocks the allocate closure returned.
    pub bad_blocks: u64,
}

impl std::ops::AddAssign for CallbackOutcomes {
    fn add_assign(&mut self, o: Self) {
        self.served_on_retry += o.served_on_retry;
        self.declined += o.declined;
        self.retries_used_up += o.retries_used_up;
        self.refused_frees += o.refused_frees;
        self.bad_blocks += o.bad_blocks;
    }
}

/// The program's side of both resources: what its closures keep.
#[derive(Debug)]
struct Program {
    spy: Spy,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The device's blocks the allocate closure handed out, by address: the
    /// deallocate closure passes on frees of these only (the device's other
    /// blocks are the ballast's).
    held: HashMap<u64, Block>,
    /// The bad block the allocate closure returned, and the device's block
    /// behind it, until the callback resource hands it back.
    pending: Option<(Block, Block)>,
    /// The device's blocks behind bad blocks whose free it refused: the
    /// callback resource ignores that answer, so the program frees them at
    /// the end.
    orphans: Vec<Block>,
    /// The device's blocks the program keeps, that the failure callback
    /// frees to make room.
    ballast: Vec<Block>,
    /// How the allocate closure spoils its blocks (cycled): `b % 16` 0 the
    /// empty block, 1 a byte too long, 2 misaligned, 3 wrapping around,
    /// else none.
    spoil: Tape,
    /// What the failure callback answers (cycled): bit 0 retry, bits 1-2
    /// how many ballast blocks it frees first.
    answers: Tape,
    trace: Trace,
    outcomes: CallbackOutcomes,
}

/// Bytes read in turn, round and round.
#[derive(Debug, Default)]
struct Tape {
    bytes: Vec<u8>,
    at: usize,
}

impl Tape {
    fn draw(u: &mut Unstructured<'_>) -> arbitrary::Result<Self> {
        let len = u.int_in_range(1..=8usize)?;
        Ok(Tape { bytes: u.bytes(len)?.to_vec(), at: 0 })
    }

    fn next(&mut self) -> u8 {
        let b = self.bytes[self.at % self.bytes.len()];
        self.at += 1;
        b
    }
}

impl Program {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("program lock")
    }

    /// The device's bytes the program keeps: its ballast and orphans.
    fn kept_bytes(&self) -> u64 {
        let s = self.lock();
        s.ballast.iter().chain(&s.orphans).map(|b| round256(b.size())).sum()
    }
}

/// `block` spoiled as `how` says (`None`: left as it is).
fn spoiled(block: Block, how: u8) -> Option<Block> {
    match how % 16 {
        1 => Some(Block::new(block.addr(), block.size() + 1, block.tag())),
        2 => Some(Block::new(block.addr() + 1, block.size(), block.tag())),
        3 => Some(Block::new(u64::MAX - block.size() / 2, block.size(), block.tag())),
        _ => None,
    }
}

fn allocate_closure(request: Request, stream: &(), program: &Arc<Program>) -> Result<Block> {
    let mut s = program.lock();
    let how = s.spoil.next();
    let answer = if how % 16 == 0 {
        Answer::Bad(Block::EMPTY)
    } else {
        match program.spy.allocate(request, stream) {
            Err(e) => Answer::Failed(e),
            Ok(real) => match spoiled(real, how) {
                Some(bad) => {
                    s.pending = Some((bad, real));
                    Answer::Bad(bad)
                }
                None => {
                    s.held.insert(real.addr(), real);
                    Answer::Good(real)
                }
            },
        }
    };
    s.trace.closure.push(answer);
    match answer {
        Answer::Good(b) | Answer::Bad(b) => Ok(b),
        Answer::Failed(e) => Err(e),
    }
}

fn deallocate_closure(block: Block, stream: &(), program: &Arc<Program>) -> Result<()> {
    let mut s = program.lock();
    if let Some((bad, real)) = s.pending.filter(|(bad, _)| *bad == block) {
        s.pending = None;
        s.trace.handed_back.push(bad);
        return program.spy.deallocate(real, stream).inspect_err(|e| {
            s.outcomes.refused_frees += u64::from(program.spy.refused_free(e));
            s.orphans.push(real);
        });
    }
    if !s.held.contains_key(&block.addr()) {
        return Err(Error::UnknownBlock { addr: block.addr() });
    }
    program.spy.deallocate(block, stream)?;
    s.held.remove(&block.addr());
    Ok(())
}

/// Frees as many ballast blocks as its answer says, then answers.
fn on_failure(bytes: u64, program: &Arc<Program>) -> bool {
    let mut s = program.lock();
    let answer = s.answers.next();
    let retry = answer & 1 == 1;
    for _ in 0..(answer >> 1) % 4 {
        let Some(block) = s.ballast.pop() else { break };
        if let Err(e) = program.spy.deallocate(block, &()) {
            assert!(program.spy.refused_free(&e), "fuzz oracle: the device failed a ballast free: {e:?}");
            s.outcomes.refused_frees += 1;
            s.ballast.push(block);
            break;
        }
    }
    s.trace.callbacks.push((bytes, retry));
    retry
}

/// The callback resource, its answers to the adaptor recorded; its figures
/// are the device's (it keeps none of its own).
#[derive(Debug)]
struct Recorded {
    inner: Closures,
    program: Arc<Program>,
}

impl MemoryResource for Recorded {
    fn allocate(&self, request: Request, stream: &()) -> Result<Block> {
        let got = self.inner.allocate(request, stream);
        self.program.lock().trace.upstream.push(got);
        got
    }
    fn deallocate(&self, block: Block, stream: &()) -> Result<()> {
        self.inner.deallocate(block, stream)
    }
}

impl Inspect for Recorded {
    fn usage(&self) -> memres_core::Usage {
        self.program.spy.usage()
    }
    fn check(&self) -> std::result::Result<(), memres_core::check::Violation> {
        self.program.spy.check()
    }
}

/// `FailureCallback` over `CallbackResource` over the spied `SimDevice`,
/// with ballast on the device that the failure callback frees.
struct CallbackTarget {
    adaptor: Adaptor,
    program: Arc<Program>,
    retry_on: RetryOn,
    max_retries: u32,
    /// The first wrong answer seen, for `check`.
    finding: Option<String>,
}

impl CallbackTarget {
    /// Whether the failure callback is called after `answer`.
    fn caught(&self, answer: &Result<Block>) -> bool {
        matches!(answer, Err(e) if self.retry_on.catches(e))
    }

    /// The adaptor's answer `got` to `request`, judged by the trace: its
    /// last upstream answer; a retry only after a failure it catches and
    /// the callback's yes, within the cap; the callback called once per
    /// failure it catches, never after a success.
    fn judge_adaptor(
        &self,
        request: &Request,
        got: &Result<Block>,
        t: &Trace,
    ) -> std::result::Result<(), String> {
        let Some(last) = t.upstream.last() else { return Err("the upstream was never asked".into()) };
        if got != last {
            return Err(format!("the adaptor answered {got:?}, its upstream last {last:?}"));
        }
        let retries = t.upstream.len() - 1;
        if retries > self.max_retries as usize {
            return Err(format!("{retries} retries, over the cap of {}", self.max_retries));
        }
        for (i, answer) in t.upstream[..retries].iter().enumerate() {
            if !self.caught(answer) {
                return Err(format!(
                    "retried after {answer:?}, a failure not to retry on ({:?})",
                    self.retry_on
                ));
            }
            if t.callbacks.get(i).is_none_or(|c| !c.1) {
                return Err(format!(
                    "retried though the callback answered {:?} to failure {i}",
                    t.callbacks.get(i)
                ));
            }
        }
        let calls = retries + usize::from(self.caught(last));
        if t.callbacks.len() != calls {
            return Err(format!(
                "the callback was called {} times for upstream answers {:?}; {calls} expected",
                t.callbacks.len(),
                t.upstream
            ));
        }
        if self.caught(last) && t.callbacks[retries].1 && retries < self.max_retries as usize {
            return Err(format!(
                "the callback asked to retry after {retries} of {} retries",
                self.max_retries
            ));
        }
        match t.callbacks.iter().find(|c| c.0 != request.size()) {
            Some(c) => Err(format!("the callback was told {} bytes of a request of {}", c.0, request.size())),
            None => Ok(()),
        }
    }
}

/// The callback resource's answers, judged by its allocate closure's: a
/// good block as it is, a bad one `UpstreamMisbehaved` naming it and handed back to the
/// deallocate closure (unless empty), an error as it is; a zero-byte
/// request the empty block without a closure.
fn judge_closures(request: &Request, t: &Trace) -> std::result::Result<(), String> {
    if request.is_zero() {
        if t.closure.is_empty() && t.upstream.iter().all(|u| *u == Ok(Block::EMPTY)) {
            return Ok(());
        }
        return Err(format!(
            "a zero-byte request: the closure answered {:?}, the resource {:?}",
            t.closure, t.upstream
        ));
    }
    if t.closure.len() != t.upstream.len() {
        return Err(format!("the allocate closure answered {:?}, the resource {:?}", t.closure, t.upstream));
    }
    let mut bad = Vec::new();
    for (closure, resource) in t.closure.iter().zip(&t.upstream) {
        let want = match *closure {
            Answer::Good(b) => Ok(b),
            Answer::Bad(b) => {
                if !b.is_empty() {
                    bad.push(b);
                }
                // The closures' fault, naming their block.
                if matches!(*resource, Err(Error::UpstreamMisbehaved { addr, size, .. }) if (addr, size) == (b.addr(), b.size()))
                {
                    continue;
                }
                return Err(format!(
                    "the allocate closure answered {closure:?}, the callback resource {resource:?}, not the closures' fault naming the block"
                ));
            }
            Answer::Failed(e) => Err(e),
        };
        if *resource != want {
            return Err(format!(
                "the allocate closure answered {closure:?}, the callback resource {resource:?}"
            ));
        }
    }
    if t.handed_back != bad {
        return Err(format!("bad blocks {bad:?}, handed back {:?}", t.handed_back));
    }
    Ok(())
}

impl FuzzResource for CallbackTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        self.program.lock().trace = Trace::default();
        let got = self.adaptor.allocate(request, &());
        let mut s = self.program.lock();
        let t = std::mem::take(&mut s.trace);
        if let Err(why) = judge_closures(&request, &t).and_then(|()| self.judge_adaptor(&request, &got, &t)) {
            self.finding.get_or_insert(format!("allocate({request:?}): {why}"));
        }
        let o = &mut s.outcomes;
        o.bad_blocks += t.closure.iter().filter(|a| matches!(a, Answer::Bad(_))).count() as u64;
        match (got.is_ok(), t.callbacks.last()) {
            (true, Some(_)) if matches!(t.upstream[0], Err(e) if e.is_out_of_memory()) => {
                o.served_on_retry += 1
            }
            // The callback had the last word on the last failure.
            (false, Some(&(_, retry))) if t.callbacks.len() == t.upstream.len() => match retry {
                false => o.declined += 1,
                true => o.retries_used_up += 1,
            },
            _ => {}
        }
        got
    }
    fn deallocate(&mut self, block: Block) -> Result<()> {
        let got = self.adaptor.deallocate(block, &());
        let mut s = self.program.lock();
        if !s.trace.is_empty() {
            let t = std::mem::take(&mut s.trace);
            self.finding
                .get_or_insert(format!("a free of {block:?} allocated or called the callback: {t:?}"));
        }
        if matches!(&got, Err(e) if self.program.spy.refused_free(e)) {
            s.outcomes.refused_frees += 1;
        }
        got
    }
    fn check(&self, model: &Model) -> std::result::Result<(), String> {
        if let Some(finding) = &self.finding {
            return Err(finding.clone());
        }
        self.adaptor.check().map_err(|v| v.to_string())?;
        let device = self.program.spy.inner.usage();
        if self.adaptor.usage() != device {
            return Err(format!("the adaptor's figures {:?}, the device's {device:?}", self.adaptor.usage()));
        }
        let s = self.program.lock();
        if let Some(pending) = s.pending {
            return Err(format!("the bad block {:?} was never handed back", pending.0));
        }
        // The blocks the caller holds are the device's that the program handed out.
        let lent: u64 = s.held.values().map(|b| round256(b.size())).sum();
        if s.held.len() != model.live().len() || lent != model.used() {
            return Err(format!(
                "the program lent {} blocks of {lent} bytes, the caller holds {} of {}",
                s.held.len(),
                model.live().len(),
                model.used()
            ));
        }
        if let Some(l) = model.live().iter().find(|l| s.held.get(&l.block.addr()) != Some(&l.block)) {
            return Err(format!("the caller holds {:?}, which the device did not hand out", l.block));
        }
        Ok(())
    }
    fn used_bytes(&self) -> u64 {
        // The device's, less what the program keeps.
        self.program.spy.inner.usage().held - self.program.kept_bytes()
    }
    fn footprint(&self, size: u64) -> u64 {
        round256(size)
    }
    fn size_class(&self, size: u64) -> u64 {
        // The device checks the exact size a block was asked with.
        size
    }
    fn summary(&self) -> Vec<u64> {
        let used = self.used_bytes();
        let s = self.program.lock();
        let counts = [s.held.len(), s.ballast.len(), s.orphans.len()].map(|n| n as u64);
        [used, self.program.spy.inner.usage().held].into_iter().chain(counts).collect()
    }
    fn spy(&self) -> Option<&Spy> {
        Some(&self.program.spy)
    }
    fn forgets(&self, _block: &Block) -> bool {
        // The deallocate closure forgets a block freed, and the device
        // hands its address out again.
        true
    }
    fn judge_alloc_failure(
        &self,
        _: &Request,
        _: &Error,
        _: &[u64],
        _: &Model,
    ) -> std::result::Result<(), String> {
        // Judged as the call returned, against its trace.
        self.finding.clone().map_or(Ok(()), Err)
    }
}

/// Fuzz target `callback`: [`FailureCallback`] over [`CallbackResource`]
/// over the spied `SimDevice`, the program's blocks (its ballast) filling
/// part of the device. The input picks the device, the ballast, the retry
/// cap, which failures reach the callback, whether the callback retries
/// and how much ballast it frees first, and which blocks the allocate
/// closure spoils. After every call: the adaptor answers its upstream's
/// last answer, retries only as the callback asked and the cap allows, and
/// calls the callback exactly once per failure it catches; the callback
/// resource hands every bad block back and answers `UpstreamMisbehaved`; the caller
/// holds exactly the device's blocks the program lent; the figures are the
/// device's. At the end the device holds nothing.
pub fn run_callback(data: &[u8]) {
    callback_outcomes(data);
}

/// Runs `data` as [`run_callback`] does, and says what the run exercised.
pub fn callback_outcomes(data: &[u8]) -> CallbackOutcomes {
    let mut u = Unstructured::new(data);
    let Ok(mut target) = draw_target(&mut u) else { return CallbackOutcomes::default() };
    drive(&mut target, &mut u);
    let program = target.program;
    let mut s = program.lock();
    for block in std::mem::take(&mut s.ballast).into_iter().chain(std::mem::take(&mut s.orphans)) {
        program.spy.deallocate(block, &()).expect("fuzz oracle: the program's own block is freed at the end");
    }
    let device = program.spy.inner.usage();
    assert!(
        device.held == 0 && s.held.is_empty(),
        "fuzz oracle: lost at the end: the device holds {} bytes, the program lent {:?}",
        device.held,
        s.held
    );
    s.outcomes
}

fn draw_target(u: &mut Unstructured<'_>) -> arbitrary::Result<CallbackTarget> {
    let capacity = *u.choose(&[1u64 << 20, 64 << 20, 1 << 30])?;
    let ballast = u.int_in_range(0..=8u64)?;
    let max_retries = *u.choose(&[0, 1, 2, 3, Adaptor::DEFAULT_MAX_RETRIES])?;
    let retry_on = if u.arbitrary()? { RetryOn::AnyError } else { RetryOn::OutOfMemory };
    let (answers, spoil) = (Tape::draw(u)?, Tape::draw(u)?);
    let spy = Spy::new(capacity);
    let ballast = (0..ballast)
        .map(|_| {
            spy.allocate(Request::new(capacity / 8).expect("a valid size"), &())
                .expect("room for the ballast")
        })
        .collect();
    let state = State { ballast, answers, spoil, ..State::default() };
    let program = Arc::new(Program { spy, state: Mutex::new(state) });
    let closures: Closures = CallbackResource::new(
        Arc::clone(&program),
        allocate_closure as Allocate,
        deallocate_closure as Deallocate,
    );
    let recorded = Recorded { inner: closures, program: Arc::clone(&program) };
    let adaptor = FailureCallback::new(recorded, Arc::clone(&program), on_failure as fn(_, &_) -> _)
        .with_max_retries(max_retries)
        .with_retry_on(retry_on);
    Ok(CallbackTarget { adaptor, program, retry_on, max_retries, finding: None })
}
