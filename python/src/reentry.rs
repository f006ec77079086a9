//! Calls into a stack from below it, on the same thread.
//!
//! A `pool`, `fixed` or `arena` holds its spin lock while it calls its
//! upstream. A Python callback there (`CallbackMemoryResource`'s functions,
//! a failure callback) that calls the same stack again, itself or through a
//! finalizer that `gc.collect()` runs, would spin for ever on a lock its
//! own thread holds. So every call into a stack notes, per thread, the
//! resources the stack covers ([`Covers`]); a call whose set meets one in
//! progress on the thread is re-entrant. An allocation (anything that
//! takes the stack's locks) is then refused with [`Error::Reentrant`] and
//! changes nothing; a free is deferred, and applied once the outermost call
//! in progress on the thread returns, with no lock of a stack held (with
//! greenlets, once no call is in progress on the thread: a call of one
//! suspended inside a callback holds the deferred frees until it ends). A
//! deferred free keeps what it is made with until it is applied: the
//! stream value it was asked on (a per-thread stream's value says whose
//! thread's it is) and what keeps that stream's handle valid (its Python
//! object; a buffer, which holds both, is dropped then as a whole).
//!
//! While the callback of a resource object runs ([`in_callback`]), the
//! resources under that object are no part of the call in progress: the
//! callback runs at the root of its object's stack, after any call into
//! them returned, so they hold no lock of this thread. A failure callback
//! may free blocks of its own upstream, and have its retry see the memory.
//!
//! A free may go further, as it never runs the callback again: into the
//! object whose callback runs (its root is the callback's layer, which
//! holds no lock while the callback runs) and into any object that only
//! passes calls on ([`Covers::new`]'s `passes_on`: `stats`, `track`,
//! `log`, `limit`, `on_failure`, `prefetch`, none of which holds a lock while it calls
//! its upstream). So RMM's failure callback, `gc.collect()` and retry,
//! sees the memory of the buffers it collected, also under
//! `statistics()`. An allocation there would run the callback again, a
//! recursion with no end, and stays refused.

use crate::backend::{self, Stream};
use memres_core::{Block, DynResource, Error, MemoryResource, Request};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The resource objects a stack is built over: its own id and, through
/// its upstreams `upN`, theirs.
#[derive(Clone)]
pub(crate) struct Covers {
    own: u64,
    /// Sorted, without repeats; `own` among them.
    all: Arc<[u64]>,
    /// The objects of `all` whose stacks only pass calls on; sorted.
    passing_on: Arc<[u64]>,
}

impl Covers {
    /// The set of a new resource over `upstreams`; `passes_on`: whether
    /// every layer of its own stack passes each call on to its upstream
    /// holding no lock meanwhile.
    pub(crate) fn new<'a>(upstreams: impl IntoIterator<Item = &'a Covers>, passes_on: bool) -> Covers {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let own = NEXT.fetch_add(1, Ordering::Relaxed);
        let (mut all, mut passing_on) = (vec![own], if passes_on { vec![own] } else { vec![] });
        for u in upstreams {
            all.extend_from_slice(&u.all);
            passing_on.extend_from_slice(&u.passing_on);
        }
        for ids in [&mut all, &mut passing_on] {
            ids.sort_unstable();
            ids.dedup();
        }
        Covers { own, all: all.into(), passing_on: passing_on.into() }
    }

    /// The set of a call into no stack: a frame of it meets no call.
    fn nothing() -> Covers {
        // `own` is no object's: ids count up from 0.
        Covers { own: u64::MAX, all: Arc::new([]), passing_on: Arc::new([]) }
    }

    fn contains(&self, id: u64) -> bool {
        self.all.binary_search(&id).is_ok()
    }

    /// The number of the object itself.
    pub(crate) fn own(&self) -> u64 {
        self.own
    }

    /// Whether `id` lies under this object (covered, and not itself).
    pub(crate) fn under(&self, id: u64) -> bool {
        id != self.own && self.contains(id)
    }

    fn passes_on(&self, id: u64) -> bool {
        self.passing_on.binary_search(&id).is_ok()
    }
}

/// What a call into a stack does, which decides where it may re-enter.
#[derive(Clone, Copy)]
enum Call {
    /// Takes the stack's locks and may run its callbacks.
    Allocate,
    /// Gives a block back: runs no failure callback.
    Free,
}

/// A call in progress on this thread.
struct Frame {
    /// Its number, by which its end takes it out.
    id: u64,
    covers: Covers,
    /// The objects whose callbacks run inside the call now, each with the
    /// number by which its end takes it out: what lies under all of them
    /// is out of the call meanwhile.
    callbacks: Vec<(u64, Covers)>,
}

impl Frame {
    /// Whether a call into `other` would enter this call's stack where it
    /// may hold a lock (or, for an allocation, run a callback running now).
    fn meets(&self, other: &Covers, call: Call) -> bool {
        let out = |id: u64| {
            !self.callbacks.is_empty()
                && match call {
                    Call::Allocate => self.callbacks.iter().all(|(_, c)| c.under(id)),
                    Call::Free => other.passes_on(id) || self.callbacks.iter().all(|(_, c)| c.contains(id)),
                }
        };
        other.all.iter().any(|&id| self.covers.contains(id) && !out(id))
    }
}

/// Work put off until the thread's outermost call returns, and the stack
/// it runs in (`None`: work that enters the stacks it calls itself, through
/// [`Guarded`]).
type Deferred = (Option<Covers>, Box<dyn FnOnce() + Send>);

/// Calls and callbacks end in the order they began, but for greenlets:
/// one switched to inside a callback may begin a call and switch back
/// before it ends. So each call and each callback is taken out by its own
/// number, and the call whose code runs is saved around each callback.
#[derive(Default)]
struct State {
    /// The calls in progress on this thread, in the order they began.
    active: Vec<Frame>,
    /// The number of the next call, callback or vouch.
    next: u64,
    /// The call whose code runs now, in `active` (`None`: none); the
    /// callbacks that run now are its.
    current: Option<u64>,
    deferred: VecDeque<Deferred>,
    /// The streams that calls in progress vouch for ([`vouched_for`]):
    /// each vouch's number and its stream's handle.
    vouches: Vec<(u64, u64)>,
}

impl State {
    fn number(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// Begins a call into the stack of `covers`: its number, and the call
    /// whose code ran before it.
    fn begin(&mut self, covers: Covers) -> (u64, Option<u64>) {
        let id = self.number();
        self.active.push(Frame { id, covers, callbacks: Vec::new() });
        (id, self.current.replace(id))
    }

    /// Ends the call `id` that began after `before`'s code ran; whether no
    /// call is in progress now.
    fn end(&mut self, id: u64, before: Option<u64>) -> bool {
        self.active.retain(|f| f.id != id);
        self.current = before.filter(|b| self.active.iter().any(|f| f.id == *b));
        self.active.is_empty()
    }
}

thread_local! {
    static STATE: RefCell<State> = RefCell::default();
}

/// Runs `f` on the thread's state; `None` once the thread's locals are
/// gone (a free from a destructor that runs at the thread's exit, after
/// them): no call is noted then, and none can be in progress on the
/// thread but that free's own.
fn with_state<T>(f: impl FnOnce(&mut State) -> T) -> Option<T> {
    STATE.try_with(|s| f(&mut s.borrow_mut())).ok()
}

/// A call into a stack in progress on this thread (not `Send`: it ends on
/// the thread it began on). When the outermost one ends, the work deferred
/// meanwhile runs.
pub(crate) struct Entered {
    /// The call's number and the call before it, where it was noted (see
    /// [`enter`]).
    noted: Option<(u64, Option<u64>)>,
    on_this_thread: PhantomData<*const ()>,
}

/// Begins a call into the stack of `covers`; [`Error::Reentrant`] if it
/// meets a call in progress on this thread.
///
/// Before any stack was given Python functions nothing is noted: Python
/// then never runs while a stack holds a lock (no callback, and a
/// finalizer runs only where the GIL is taken, which a stack does only
/// for its callbacks), so no call can come back; and a stack built later
/// with Python functions notes every call into it. The calls PyTorch makes
/// through `memres_py_alloc` stay as cheap as they were.
pub(crate) fn enter(covers: &Covers) -> Result<Entered, Error> {
    enter_for(covers, Call::Allocate)
}

/// Begins a free into the stack of `covers`, as [`enter`] an allocation:
/// it may also go into what only passes calls on, and into the object
/// whose callback runs (see the module's doc).
fn enter_free(covers: &Covers) -> Result<Entered, Error> {
    enter_for(covers, Call::Free)
}

/// Whether a call of kind `call` into the stack of `covers` would meet a
/// call in progress on this thread (see [`enter`]).
fn meets_a_call(covers: &Covers, call: Call) -> bool {
    crate::callback::python_under_stacks()
        && with_state(|s| s.active.iter().any(|a| a.meets(covers, call))).unwrap_or(false)
}

fn enter_for(covers: &Covers, call: Call) -> Result<Entered, Error> {
    if !crate::callback::python_under_stacks() {
        return Ok(Entered { noted: None, on_this_thread: PhantomData });
    }
    if meets_a_call(covers, call) {
        return Err(Error::Reentrant);
    }
    let stale = with_state(|s| {
        // A new outermost call: an exception of a callback left by a call
        // that recovered from it is no part of this one.
        let stale = s
            .active
            .is_empty()
            .then(|| (crate::callback::take_failure_raised(), crate::callback::take_raised()));
        (stale, s.begin(covers.clone()))
    });
    let noted = stale.as_ref().map(|(_, call)| *call);
    // Dropped once the state is let go: with the GIL held (an exit under
    // way) an exception's drop may run a `__del__` that calls memres
    // again, which takes the state.
    drop(stale);
    Ok(Entered { noted, on_this_thread: PhantomData })
}

impl Drop for Entered {
    fn drop(&mut self) {
        // While the thread unwinds, the deferred work stays queued for its
        // next call: a panic in it now would abort the process.
        let ended = self.noted.and_then(|(id, before)| with_state(|s| s.end(id, before)));
        if ended == Some(true) && !std::thread::panicking() {
            run_deferred();
        }
    }
}

/// Runs `f`, a Python function of the object of `covers` (its
/// `CallbackMemoryResource` functions, its failure callback), with what
/// lies under that object out of the call in progress meanwhile.
pub(crate) fn in_callback<T>(covers: &Covers, f: impl FnOnce() -> T) -> T {
    /// The callback's call and its own number.
    struct Leave(u64, u64);
    impl Drop for Leave {
        fn drop(&mut self) {
            let Leave(call, callback) = *self;
            with_state(|s| {
                // The callback's call runs again, whatever ran meanwhile.
                s.current = Some(call);
                if let Some(frame) = s.active.iter_mut().find(|f| f.id == call) {
                    frame.callbacks.retain(|(n, _)| *n != callback);
                }
            });
        }
    }
    // The call whose code runs is the one that reached the callback; with
    // none (a stack dropped, freeing into this one) nothing is in progress.
    let _leave = with_state(|s| {
        let n = s.number();
        let call = s.current?;
        s.active.iter_mut().find(|f| f.id == call)?.callbacks.push((n, covers.clone()));
        Some(Leave(call, n))
    })
    .flatten();
    f()
}

/// Puts `work` off until the thread's outermost call returns; `work` runs
/// as a call into the stack of `covers`, or with `None` as a call into
/// none (it enters the stacks it calls itself).
fn defer(covers: Option<&Covers>, work: impl FnOnce() + Send + 'static) {
    let mut work = Some(work);
    // Once the thread's locals are gone no call is in progress to wait for.
    if with_state(|s| s.deferred.push_back((covers.cloned(), Box::new(work.take().unwrap())))).is_none() {
        if let Some(work) = work {
            work();
        }
    }
}

/// Runs the deferred work in order, each as a call into its stack, so that
/// what it defers in turn (a free from its own callback) waits for this
/// loop rather than running inside it.
fn run_deferred() {
    struct End(u64, Option<u64>);
    impl Drop for End {
        fn drop(&mut self) {
            with_state(|s| s.end(self.0, self.1));
        }
    }
    while let Some((covers, work)) = with_state(|s| s.deferred.pop_front()).flatten() {
        let call = with_state(|s| s.begin(covers.unwrap_or_else(Covers::nothing)));
        let _end = call.map(|(id, before)| End(id, before));
        work();
    }
}

/// Drops `value`, what a resource object holds of its stack over `covers`.
/// Inside a call that meets the stack (the object collected by a finalizer
/// or `gc.collect()` inside a callback under its upstream pool), it is
/// dropped once the thread's outermost call returns: dropping a pool gives
/// its chunks back upstream, to a pool whose lock that call may hold.
pub(crate) fn drop_outside_calls<T: Send + 'static>(covers: &Covers, value: T) {
    use crate::callback::drop_saying_what_raised;
    match enter(covers) {
        // Frees that the drop makes from a callback are deferred in turn.
        Ok(_call) => drop_saying_what_raised(value),
        Err(_) => defer(Some(covers), move || drop_saying_what_raised(value)),
    }
}

/// Drops `value`, a buffer whose drop frees its block into the stack of
/// `covers` through [`Guarded`], on the stream it holds. Where that free
/// would meet a call in progress on this thread (the buffer collected by a
/// finalizer or `gc.collect()` inside a callback under the stack), the
/// buffer is dropped once the thread's outermost call returns, whole: its
/// stream value, and the object that keeps the stream's handle valid, stay
/// with its block until the block is freed.
pub(crate) fn drop_outside_frees<T: Send + 'static>(covers: &Covers, value: T) {
    use crate::callback::drop_saying_what_raised;
    if meets_a_call(covers, Call::Free) {
        defer(None, move || drop_saying_what_raised(value));
    } else {
        drop_saying_what_raised(value);
    }
}

/// A stack as the program calls it (`allocate`, buffers, the C functions):
/// each call is a call of [`enter`], and a re-entrant allocation is
/// refused. A re-entrant free is deferred by whoever owns its stream, which
/// the deferred free keeps until it is applied ([`Guarded::free`], a
/// buffer's drop through [`drop_outside_frees`], [`CFrees`]); through the
/// trait, which only borrows the stream, one is refused
/// ([`Error::Reentrant`]) and changes nothing. Stacks built over this one
/// use the stack itself, not this: their calls into it are theirs.
pub(crate) struct Guarded {
    pub(crate) inner: DynResource<Stream>,
    pub(crate) covers: Covers,
    pub(crate) device: u32,
}

impl Guarded {
    /// Frees `block` on `stream` now, or, where that would meet a call in
    /// progress on this thread, once the thread's outermost call returns
    /// (`Ok` then: the free is taken). Until it is applied the deferred free
    /// keeps `stream` and `keep`, what keeps the stream's handle valid (its
    /// Python object; nothing where the caller vouches for it).
    pub(crate) fn free(
        &self,
        block: Block,
        stream: Stream,
        keep: impl Send + 'static,
    ) -> memres_core::Result<()> {
        match enter_free(&self.covers) {
            Ok(_call) => self.inner.deallocate(block, &stream),
            Err(_) => {
                let inner = self.inner.clone();
                defer(Some(&self.covers), move || {
                    free_later(&inner, block, &stream);
                    // Only now may the stream's handle go.
                    drop(keep);
                });
                Ok(())
            }
        }
    }
}

impl MemoryResource<Stream> for Guarded {
    fn allocate(&self, request: Request, stream: &Stream) -> memres_core::Result<Block> {
        let _call = enter(&self.covers)?;
        self.inner.allocate(request, stream)
    }

    fn deallocate(&self, block: Block, stream: &Stream) -> memres_core::Result<()> {
        // A borrowed stream cannot wait with a deferred free.
        let _call = enter_free(&self.covers)?;
        self.inner.deallocate(block, stream)
    }

    fn id(&self) -> memres_core::ResourceId {
        self.inner.id()
    }
}

/// [`Guarded`] as the device registry holds it for the C functions
/// (`memres_py_alloc`, `memres_py_free`): a free of `memres_py_free` that
/// meets a call in progress is deferred on a stream named by its handle
/// again, which that function's caller keeps valid until it is applied.
/// Any other free that meets one (Rust code of the process calling the
/// registry's resource, which only borrows its stream) is refused with
/// [`Error::Reentrant`], as through [`Guarded`].
pub(crate) struct CFrees(pub(crate) Arc<Guarded>);

/// Runs `f`, the free of `memres_py_free`, with `stream` vouched for: a
/// free of [`CFrees`] on a stream of the same handle may be deferred.
///
/// # Safety
///
/// The stream that `stream`'s handle names stays valid until every free
/// deferred on it meanwhile is applied.
pub(crate) unsafe fn vouched_for<T>(stream: &Stream, f: impl FnOnce() -> T) -> T {
    /// Taken out by its number, as calls are (see [`State`]).
    struct Unvouch(u64);
    impl Drop for Unvouch {
        fn drop(&mut self) {
            with_state(|s| s.vouches.retain(|&(n, _)| n != self.0));
        }
    }
    // No free is deferred before a stack was given Python functions
    // (`meets_a_call`): PyTorch's frees stay as cheap as they were.
    if !crate::callback::python_under_stacks() {
        return f();
    }
    let handle = backend::handle_of(stream);
    let _unvouch = with_state(|s| {
        let n = s.number();
        s.vouches.push((n, handle));
        Unvouch(n)
    });
    f()
}

/// Whether a call in progress on this thread vouches for the stream of
/// `handle` ([`vouched_for`]).
fn vouched(handle: u64) -> bool {
    with_state(|s| s.vouches.iter().any(|&(_, h)| h == handle)).unwrap_or(false)
}

impl MemoryResource<Stream> for CFrees {
    fn allocate(&self, request: Request, stream: &Stream) -> memres_core::Result<Block> {
        self.0.allocate(request, stream)
    }

    fn deallocate(&self, block: Block, stream: &Stream) -> memres_core::Result<()> {
        if !meets_a_call(&self.0.covers, Call::Free) {
            return self.0.deallocate(block, stream);
        }
        let handle = backend::handle_of(stream);
        if !vouched(handle) {
            // A borrowed stream cannot wait with a deferred free.
            return Err(Error::Reentrant);
        }
        // SAFETY: a stream of this handle is vouched for on this thread:
        // `vouched_for`'s caller keeps the stream it names valid until the
        // frees deferred meanwhile are applied (its `# Safety`). The
        // deferred free runs on this thread (the queue is the thread's),
        // where the handle names the same stream as the caller's value (a
        // per-thread stream: this thread's).
        let again = unsafe { backend::stream(handle, self.0.device) }
            .map_err(|_| Error::InvalidConfig { what: "the stream of a deferred free cannot be had" })?;
        self.0.free(block, again, ())
    }

    fn id(&self) -> memres_core::ResourceId {
        self.0.id()
    }
}

/// A deferred free. Its caller was told the free succeeded, so a failure
/// is said where Python says an exception in `__del__`
/// (`sys.unraisablehook`), with the exception of a Python function behind
/// it as its cause, as a drop's refused free; on stderr once the exit has
/// begun (no Python runs for it then).
fn free_later(resource: &DynResource<Stream>, block: Block, stream: &Stream) {
    // The exception the outer call's error may be behind: this free's own
    // callback would write over it.
    let outer = crate::callback::take_raised();
    if let Err(e) = resource.deallocate(block, stream) {
        // This free's callback's exception: its caller was told it freed.
        let raised = crate::callback::take_raised();
        let what = format!(
            "freeing {:#x} ({} bytes), deferred from a call inside a callback, failed: {e}",
            block.addr(),
            block.size()
        );
        let said = (!crate::gil::exiting()).then(|| {
            crate::gil::with_python(|py| {
                let e = match raised {
                    Some(raised) => {
                        crate::errors::with_cause(py, raised, &what, crate::errors::backend_error)
                    }
                    None => crate::errors::backend_error(what.clone()),
                };
                // What Python's default hook names: "Exception ignored in: ...".
                let context =
                    pyo3::types::PyString::new(py, "memres: a free deferred from a call inside a callback");
                e.write_unraisable(py, Some(context.as_any()));
            })
        });
        if said.flatten().is_none() {
            // Where standard error cannot be written, unsaid (`eprintln!`
            // would panic, here under a call from C).
            use std::io::Write;
            let _ = writeln!(std::io::stderr().lock(), "memres: {what}");
        }
    }
    crate::callback::restore_raised(outer);
}

/// Whether a Python callback of a stack runs now on this thread, inside a
/// call that may hold the stack's locks: it must not wait for a lock that
/// another thread may hold while it waits for those.
pub(crate) fn in_a_callback() -> bool {
    with_state(|s| s.active.iter().any(|f| !f.callbacks.is_empty())).unwrap_or(false)
}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Takes every free, and says which.
    #[derive(Default)]
    struct Frees(Mutex<Vec<Block>>);

    impl MemoryResource<Stream> for Frees {
        fn allocate(&self, _request: Request, _stream: &Stream) -> memres_core::Result<Block> {
            Err(Error::InvalidConfig { what: "allocates nothing" })
        }

        fn deallocate(&self, block: Block, _stream: &Stream) -> memres_core::Result<()> {
            self.0.lock().unwrap().push(block);
            Ok(())
        }
    }

    /// A free through the registry's resource that meets a call in
    /// progress is deferred only where `memres_py_free`'s caller vouches
    /// for its stream; any other caller only borrows the stream, and is
    /// refused. Before, every such free was deferred on a stream made
    /// again from its handle, which Rust code could destroy before the
    /// free was applied.
    #[test]
    fn a_free_that_meets_a_call_is_deferred_only_on_a_stream_vouched_for() {
        crate::callback::note_python_under_stacks();
        let frees = Arc::new(Frees::default());
        let covers = Covers::new([], false);
        let inner: DynResource<Stream> = frees.clone();
        let c = CFrees(Arc::new(Guarded { inner, covers: covers.clone(), device: 0 }));
        let stream = Stream::default();
        let block = Block::new(0x1000, 256, 1);
        {
            let _call = enter(&covers).unwrap();
            assert_eq!(c.deallocate(block, &stream), Err(Error::Reentrant), "a borrowed stream");
            // SAFETY: the simulated device's stream is a value, valid for ever.
            let vouched = unsafe { vouched_for(&stream, || c.deallocate(block, &stream)) };
            assert_eq!(vouched, Ok(()), "taken, to be applied later");
            assert!(frees.0.lock().unwrap().is_empty(), "not yet: the call is in progress");
            assert_eq!(c.deallocate(block, &stream), Err(Error::Reentrant), "vouched for that free alone");
        }
        assert_eq!(*frees.0.lock().unwrap(), [block], "applied once the call ended");
        assert!(!vouched(backend::handle_of(&stream)), "the vouch ended with its call");
        // Outside any call, a free goes through at once.
        assert_eq!(c.deallocate(block, &stream), Ok(()));
        assert_eq!(frees.0.lock().unwrap().len(), 2);
    }

    /// A greenlet switched to inside a callback begins a call, and
    /// switches back before it ends: the first call ends first. Each end
    /// takes out its own call and callback. Before, the innermost was
    /// taken out: the call that ended stayed in progress (and refused
    /// every call into its stack), the one in progress was forgotten.
    #[test]
    fn calls_that_end_out_of_order_take_out_their_own() {
        crate::callback::note_python_under_stacks();
        let (a, b) = (Covers::new([], false), Covers::new([], false));
        let call_a = enter(&a).unwrap();
        let mut call_b = None;
        in_callback(&a, || call_b = Some(enter(&b).unwrap()));
        assert!(!in_a_callback(), "a's callback returned");
        drop(call_a);
        assert!(enter(&a).is_ok(), "a's call ended");
        assert!(matches!(enter(&b), Err(Error::Reentrant)), "b's is in progress");
        drop(call_b);
        assert!(enter(&b).is_ok(), "b's call ended");
        assert!(with_state(|s| s.active.is_empty() && s.current.is_none()).unwrap());
    }
}
