//! `memres.mr`'s native side: one class, a built stack of resources.
//!
//! Every Python resource class is a stack string over its upstreams
//! (`PoolMemoryResource(up, initial_pool_size=N)` is `pool(up0, initial=N)`),
//! built by the core's [`StackBuilder`] with each upstream registered as a
//! leaf `upN` that hands out a clone of the upstream's shared handle: an
//! adaptor wraps the very resource its upstream object is, as in RMM.

use crate::backend::{self, Stream};
use crate::callback::{register_callbacks, Callbacks, Function};
use crate::detached::DropDetached;
use crate::errors::{backend_error, caused, invalid_argument, stack_text, stack_to_py, to_py};
use crate::kept::{self, Kept};
use crate::reentry::{self, Covers, Guarded};
use memres_core::adaptor::{Limiting, Logging, Statistics, Tracking};
use memres_core::planned::{Planned, Steps};
use memres_core::stack::{parse, Call, ReleaseLayers, StackBuilder, Value};
use memres_core::{Block, DynResource, MemoryResource as _, Request};
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::PyTraverseError;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

type Dyn = DynResource<Stream>;

/// What the package locks before `os.fork` and drops after it, in the
/// parent and in the child: the `log` adaptors of stacks, their rows
/// flushed ([`Logging::lock_flushed`]), and the table of live host
/// allocations ([`HostMemory::lock_table`](memres_sim::HostMemory::lock_table)).
/// The child then has no row of the parent's to write again at its exit,
/// and neither lock held by a thread it does not have. Unsendable: dropped
/// on the thread that forked.
#[pyclass(module = "memres", name = "LockedForFork", unsendable)]
pub(crate) struct LockedForFork {
    _logs: Vec<memres_core::adaptor::LockedLog<Dyn>>,
    _host_table: Box<dyn std::any::Any>,
}

/// Locks the `log` adaptors of `resources`, each once (a stack built over
/// another shares its logs), flushed, then the table of live host
/// allocations.
#[pyfunction]
pub(crate) fn lock_for_fork(resources: Vec<PyRef<'_, Resource>>) -> LockedForFork {
    let mut seen = std::collections::HashSet::new();
    let logs = resources.iter().flat_map(|r| r.logs.iter()).filter(|l| seen.insert(Arc::as_ptr(l)));
    // `None` only inside a log's own writer: a file's never forks.
    let logs = logs.filter_map(Logging::lock_flushed).collect();
    LockedForFork { _logs: logs, _host_table: Box::new(memres_sim::HostMemory::lock_table()) }
}

/// A built stack: the resource, its typed handles and its live blocks
/// ([`Parts`], which it dereferences to), dropped with the GIL released.
///
/// A call that takes a lock of the stack (a pool's, an adaptor's) releases
/// the GIL first: the lock's holder may be in a Python callback (a pool
/// over a `CallbackMemoryResource` holds its lock while the callback
/// runs), which needs the GIL.
#[pyclass(module = "memres", name = "NativeResource", frozen)]
pub(crate) struct Resource {
    parts: DropDetached<Parts>,
    /// Whether every block is memory the backend's copy engine may touch.
    #[pyo3(get)]
    pub(crate) has_bytes: bool,
    #[pyo3(get)]
    pub(crate) device: u32,
    #[pyo3(get)]
    pub(crate) stack: String,
    /// Whether this stack or one it is built over keeps streams' objects:
    /// if not, the Python layer need not offer them (`_keep`).
    #[pyo3(get)]
    pub(crate) keeps_streams: bool,
    /// How deep its calls nest with the stacks of the objects it is built
    /// over in place of their `upN` ([`depth`]): at most
    /// [`MAX_DEPTH`](memres_core::stack::MAX_DEPTH).
    depth: usize,
    /// The file of the stack's `log` where it is outermost (whether the
    /// Python layer's `LoggingResourceAdaptor` or a stack string's), made
    /// absolute when the stack was built, as the log opened it.
    #[pyo3(get)]
    pub(crate) log_file: Option<String>,
}

/// What a [`Resource`] holds of its stack.
pub(crate) struct Parts {
    /// The stack, as an upstream of other stacks sees it.
    pub(crate) inner: Dyn,
    /// The stack as the program sees it (`allocate`, buffers, the current
    /// resource): `inner`, its blocks told to the snapshot's map when it
    /// was built while recording, its calls checked for re-entry
    /// ([`Guarded`]).
    pub(crate) blocks: Arc<Guarded>,
    /// The resource objects this stack is built over, itself included.
    pub(crate) covers: Covers,
    stats: Option<Arc<Statistics<Dyn>>>,
    track: Option<Arc<Tracking<Dyn>>>,
    limit: Option<Arc<Limiting<Dyn>>>,
    logs: Vec<Arc<Logging<Dyn>>>,
    /// The layers that keep freed memory (`pool`, `fixed`, `binning`,
    /// `arena`, `vmm`, `vpool`, `async`), given back by `release`.
    releasing: ReleaseLayers<Stream>,
    /// The `planned` layers, stepped by `step`: the stack's, then those of
    /// the objects it is built over.
    planned: Vec<Arc<Planned<Dyn>>>,
    /// The stack's stream objects (`inner` and `blocks` are this).
    streams: Arc<KeepStreams>,
    /// The blocks handed out through `allocate`.
    table: Table,
    /// The Python functions this object gave its stack (`callback`,
    /// `on_failure`): the only Python objects it owns alone.
    functions: Vec<Arc<Function>>,
    /// Whether a layer of the stack remembers streams after a call
    /// ([`forgets_streams`]): only then are the streams' objects kept.
    remembers_streams: bool,
    /// How many hold `streams` once the stack is built (that field,
    /// `inner`, the program side in `blocks`): one more is a stack built
    /// over this one, or a free deferred below ([`Resource::in_use`]).
    own_holders: usize,
    /// Whether the stack calls Python functions: its own, or those of the
    /// objects it is built over.
    calls_python: bool,
    /// Its kept blocks and layers that keep freed memory, where it calls
    /// Python functions, for [`give_back_to`]; registered while this lives.
    over_python: Option<Arc<OverPython>>,
}

impl Drop for Parts {
    /// Gives the kept blocks back once more ([`Table::kept`]): the stack
    /// goes with the object, a retired one (which no `release` reaches)
    /// too. One refused again is lost with the stack, as a block of
    /// `allocate` that nobody freed is.
    fn drop(&mut self) {
        // Once the exit has begun no Python function runs for it.
        if self.table.kept.lock().unwrap_or_else(|p| p.into_inner()).is_empty() || crate::gil::exiting() {
            return;
        }
        if let Ok(s) = backend::default_stream(self.blocks.device) {
            let _ = kept::give_back(&self.table.kept, &s, drop);
        }
    }
}

/// A stack that calls Python functions: its kept blocks, and its layers
/// that keep freed memory.
struct OverPython {
    covers: Covers,
    kept: Arc<Kept>,
    layers: ReleaseLayers<Stream>,
    device: u32,
}

/// Every [`OverPython`] whose object lives (`Parts::over_python`).
static OVER_PYTHON: Mutex<Vec<Weak<OverPython>>> = Mutex::new(Vec::new());

/// Gives back what the stacks built over the resource object `owner` keep
/// free, and the blocks they and its own stack kept ([`Table::kept`]),
/// through its Python functions. Run by the finalizer of its
/// `deallocate_func` (`mr._Function`), which the garbage collector runs
/// when it finds the function garbage (a cycle through a bound method of an
/// object that holds the resource and the pools over it), before it clears
/// anything of the cycle: the function and what it uses are whole. Freed
/// when the collector dropped the pools later, the chunks went back to a
/// function whose object it had cleared (its `__dict__` gone), and were
/// lost; so were the kept blocks, given back at the drop. Every stack over
/// it with a living object is garbage then: each holds its upstream
/// objects, and so the function. Nothing once the exit has begun, nor for
/// a stack in a call on this thread (a collection inside its callback):
/// its drop gives back what it can after the call.
pub(crate) fn give_back_to(py: Python<'_>, owner: u64) -> PyResult<()> {
    if crate::gil::exiting() {
        return Ok(());
    }
    let over: Vec<Arc<OverPython>> = OVER_PYTHON
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|o| o.covers.under(owner) || o.covers.own() == owner)
        .collect();
    let mut first = None;
    for o in &over {
        let given_back = backend::default_stream(o.device).map_err(PyErr::from).and_then(|s| {
            crate::gil::detach(py, || match reentry::enter(&o.covers) {
                Ok(_call) => {
                    let kept = kept::give_back(&o.kept, &s, drop).map_err(|e| {
                        let message = format!(
                            "giving back a block allocate kept over a collected CallbackMemoryResource failed: \
                             {e}; it is still kept"
                        );
                        caused(message, backend_error)
                    });
                    let released = o.layers.release(&s).map(drop).map_err(|e| {
                        to_py(e, "giving back what the pools over a collected CallbackMemoryResource keep free")
                    });
                    kept.and(released)
                }
                Err(_) => Ok(()),
            })
        });
        if let Err(e) = given_back {
            first.get_or_insert(e);
        }
    }
    // Perhaps the last holder of a stack, whose drop may wait for a lock.
    crate::gil::detach(py, move || drop(over));
    first.map_or(Ok(()), Err)
}

impl std::ops::Deref for Resource {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.parts
    }
}

/// The adaptors that pass every call on unchanged, holding no lock while
/// they call their upstream.
const PASS_THROUGH: [&str; 5] = ["stats", "track", "log", "limit", "prefetch"];

/// Whether the outermost `name` adaptor of the stack sees the program's
/// calls: only [`PASS_THROUGH`] adaptors lie above it. One under a pool
/// would count the pool's chunks as the program's allocations.
fn sees_the_program(call: &memres_core::stack::Call, name: &str) -> bool {
    let mut call = call;
    loop {
        if call.name == name {
            return true;
        }
        if !PASS_THROUGH.contains(&call.name.as_str()) {
            return false;
        }
        match call.positional(0) {
            Some(memres_core::stack::Value::Call(upstream)) => call = upstream,
            _ => return false,
        }
    }
}

/// The file of `call`'s `log` if it is outermost, made absolute (as the
/// log, just opened, took it from the working directory).
fn outermost_log_file(call: &Call) -> Option<String> {
    if call.name != "log" {
        return None;
    }
    let file = memres_core::stack::log_file(call).ok()?.text().ok()?;
    std::path::absolute(file).ok()?.into_os_string().into_string().ok()
}

/// How deep `call`'s calls nest, each `upN` standing for the stack of
/// object `N`, `upstreams[N]` deep: what a call of the stack recurses
/// through. A stack string is refused past
/// [`MAX_DEPTH`](memres_core::stack::MAX_DEPTH); so is a chain of objects,
/// each over the one before (thousands of them overflowed the thread's
/// stack in their first allocation: the process was killed).
fn depth(call: &Call, upstreams: &[usize]) -> usize {
    if let Some(i) = call.name.strip_prefix("up").and_then(|i| i.parse::<usize>().ok()) {
        // `build` checked that every `upN` names an object given.
        return upstreams.get(i).copied().unwrap_or(1);
    }
    let under = call.args.iter().map(|a| match &a.value {
        Value::Call(c) => depth(c, upstreams),
        Value::Word { .. } => 0,
    });
    1 + under.max().unwrap_or(0)
}

/// Whether `name` is the name of `call` or of a call among its arguments,
/// at any depth.
fn names(call: &Call, name: &str) -> bool {
    call.name == name
        || call.args.iter().any(|a| match &a.value {
            Value::Call(c) => names(c, name),
            Value::Word { .. } => false,
        })
}

/// Whether every layer of `call` passes each call on to its upstream
/// holding no lock meanwhile ([`PASS_THROUGH`], and `on_failure`, whose
/// retries are calls of the same kind), down to the upstream objects `upN`.
fn passes_calls_on(call: &Call) -> bool {
    let own = PASS_THROUGH.contains(&call.name.as_str())
        || call.name == "on_failure"
        || call.name.strip_prefix("up").is_some_and(|i| i.parse::<usize>().is_ok());
    own && call.args.iter().all(|a| match &a.value {
        Value::Call(c) => passes_calls_on(c),
        Value::Word { .. } => true,
    })
}

/// The layers that use a stream only during the call that names it
/// (neither per stream, nor keeping events or plans of a stream, nor
/// running Python code that may keep one); `bin` is a binning layer's bin.
const FORGET_STREAMS: [&str; 18] = [
    "cuda", "async", "managed", "pinned", "host", "sim", "vmm", "vpool", "stats", "track", "log", "limit",
    "prefetch", "align", "pool", "fixed", "binning", "bin",
];

/// Whether no layer of `call` remembers a stream after the call: every
/// layer is one of [`FORGET_STREAMS`], none with `per_stream=true`, down to
/// the upstream objects `upN` (which keep the streams they need
/// themselves). The stream layer, the arena, `planned`, a pool per stream
/// and the Python callbacks remember; so does any name not listed.
fn forgets_streams(call: &Call) -> bool {
    let upstream = call.name.strip_prefix("up").is_some_and(|i| i.parse::<usize>().is_ok());
    let own = upstream
        || (FORGET_STREAMS.contains(&call.name.as_str())
            && matches!(call.bool_arg("per_stream"), Ok(None | Some(false))));
    own && call.args.iter().filter(|a| a.key.is_none()).all(|a| match &a.value {
        Value::Call(c) => forgets_streams(c),
        Value::Word { .. } => true,
    })
}

/// Whether every leaf under `call` is memory with bytes behind it: a leaf
/// of the backend's engine as `builder` registered it
/// ([`StackBuilder::is_leaf_of`]; upstreams `upN` say for themselves); an
/// algorithm or adaptor only hands out parts of its upstreams' blocks.
/// Upstreams are positional arguments; a keyed one is an option even when
/// it is a bare name (`per_stream=true`).
fn bytes_of(call: &Call, upstreams: &[&Resource], builder: &StackBuilder<Stream>) -> bool {
    if let Some(i) = call.name.strip_prefix("up").and_then(|i| i.parse::<usize>().ok()) {
        return upstreams.get(i).is_some_and(|u| u.has_bytes);
    }
    let inner: Vec<&Call> = call
        .args
        .iter()
        .filter(|a| a.key.is_none())
        .filter_map(|a| match &a.value {
            Value::Call(c) => Some(c),
            Value::Word { .. } => None,
        })
        .collect();
    if inner.is_empty() {
        // A binning layer's `bin(SIZE)` is a fixed-size bin over its
        // upstream, which is looked at beside it.
        return call.name == "bin" || builder.is_leaf_of::<backend::Engine>(&call.name);
    }
    inner.iter().all(|c| bytes_of(c, upstreams, builder))
}

/// `own`, the `planned` layers of a stack, then those of the objects it is
/// built over, each once (two `upN` may be one object): a step of the
/// object reaches a planned stack under an adaptor object (one that
/// `enable_statistics()` or `enable_logging()` put over it), as a release
/// reaches the pools below.
fn with_upstreams_planned(
    mut own: Vec<Arc<Planned<Dyn>>>,
    upstreams: &[&Resource],
) -> Vec<Arc<Planned<Dyn>>> {
    for p in upstreams.iter().flat_map(|u| &u.planned) {
        if !own.iter().any(|q| Arc::ptr_eq(p, q)) {
            own.push(p.clone());
        }
    }
    own
}

/// A stack and the Python objects of the streams it has been given, alive
/// as long as it is: stream-ordered layers remember a stream after the
/// call (its free memory, its events), and a `torch.cuda.Stream` or
/// `cupy.cuda.Stream` destroys its handle when collected. Whoever holds the
/// stack (the per-device registry, blocks PyTorch has not freed yet,
/// buffers, stacks it is the upstream of) holds them through this, however
/// long the Python resource object lives.
struct KeepStreams {
    inner: Dyn,
    /// One object per distinct handle.
    streams: Mutex<HashMap<u64, Py<PyAny>>>,
}

impl memres_core::MemoryResource<Stream> for KeepStreams {
    fn allocate(&self, request: Request, stream: &Stream) -> memres_core::Result<Block> {
        self.inner.allocate(request, stream)
    }

    fn deallocate(&self, block: Block, stream: &Stream) -> memres_core::Result<()> {
        self.inner.deallocate(block, stream)
    }

    fn id(&self) -> memres_core::ResourceId {
        self.inner.id()
    }
}

impl Resource {
    /// The live block at `ptr`, allocated with `nbytes`, taken out of the
    /// table for its free ([`put_back_live`](Self::put_back_live) if that
    /// fails). Its size is checked under the table's lock: a free of
    /// another size leaves it there, never out for a moment in which the
    /// right free of it finds it gone.
    fn take_live(&self, ptr: u64, nbytes: u64) -> PyResult<Block> {
        let taken = match self.table.live.lock().unwrap_or_else(|p| p.into_inner()).entry(ptr) {
            Entry::Occupied(e) if e.get().size() == nbytes => Ok(e.remove()),
            Entry::Occupied(e) => Err(format!(
                "memres: deallocate({ptr:#x}, {nbytes}): allocated with {} bytes",
                e.get().size()
            )),
            Entry::Vacant(_) => {
                Err(format!("memres: deallocate({ptr:#x}): not allocated by this resource, or freed already"))
            }
        };
        // The exception is made once the lock is let go: making it runs
        // Python code (an import, a collection) that may free into this
        // resource, which takes the lock (the interpreter hung there).
        taken.map_err(invalid_argument)
    }

    /// Puts `block` back in the table after its free failed: the stack
    /// still holds it, and the caller may free again. Not over a newer
    /// block: a free that freed and then failed may have let another thread
    /// get the address since. (A free that panics is left to the stack,
    /// which may have freed the block first: nothing puts it back.)
    fn put_back_live(&self, block: Block) {
        self.table.live.lock().unwrap_or_else(|p| p.into_inner()).entry(block.addr()).or_insert(block);
    }

    /// `take` of the stack's parts (a clone that holds it: a buffer's, a
    /// device's registry entry, a stack built over it), unless the stack
    /// is retired ([`retire`](Self::retire)). Both run under the table's
    /// lock, so a later `retire` sees what `take` holds and refuses; one
    /// that came first leaves the caller `InvalidArgument` (use the
    /// object again), never a stack that is no longer the object's.
    pub(crate) fn hold<T>(&self, what: &str, take: impl FnOnce(&Parts) -> T) -> PyResult<T> {
        let held = self.table.unless_retired().map(|_live| take(self));
        // The exception is made once the lock is let go, as in `take_live`.
        held.ok_or_else(|| {
            invalid_argument(format!(
                "memres: {what}: add_bin rebuilt the resource during the call, and the old stack \
                 takes no new use; try again"
            ))
        })
    }

    /// Whether anything but this object uses the stack, `live` being its
    /// table of live blocks. A kept block counts: a rebuild (`add_bin`)
    /// would leave it with the old stack, which no `release` reaches.
    fn used(&self, live: &HashMap<u64, Block>) -> bool {
        !live.is_empty()
            || !self.table.kept.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
            || Arc::strong_count(&self.blocks) > 1
            || Arc::strong_count(&self.streams) > self.own_holders
    }

    /// Begins a call that takes the stack's locks without going through
    /// `blocks` (a step, a release, a look at a pool): refused when it
    /// would re-enter the stack from below it.
    fn enter(&self, what: &str) -> PyResult<reentry::Entered> {
        reentry::enter(&self.covers).map_err(|e| to_py(e, what))
    }
}

/// The blocks a resource object handed out through `allocate`.
#[derive(Default)]
struct Table {
    /// Blocks live, by address: a free by pointer carries the block's tag.
    live: Mutex<HashMap<u64, Block>>,
    /// Whether the object has let its stack go for a rebuild
    /// ([`Resource::retire`]): `allocate` refuses. Read and written only
    /// under `live`'s lock.
    retired: AtomicBool,
    /// Blocks the stack handed out that `allocate` refused and the stack
    /// refused back (not those it panicked in giving back): given back
    /// again first by each `release`, and once more when the stack is
    /// dropped. They count as use ([`Resource::in_use`]). Shared with
    /// [`give_back_to`] where the stack calls Python functions.
    kept: Arc<Kept>,
}

impl Table {
    /// The live blocks, locked, unless the stack is retired: what takes a
    /// new use of the stack (a block, a holder) holds this while it does,
    /// so that `retire`, under the same lock, sees it.
    fn unless_retired(&self) -> Option<std::sync::MutexGuard<'_, HashMap<u64, Block>>> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        (!self.retired.load(Ordering::Relaxed)).then_some(live)
    }

    /// Notes a block just allocated as live; if its address is live
    /// already (the resource handed it out twice), keeps the older entry
    /// and says so; if the stack is retired, notes nothing and says so.
    fn note_allocated(&self, block: Block) -> Result<(), NotNoted> {
        let Some(mut live) = self.unless_retired() else { return Err(NotNoted::Retired) };
        match live.entry(block.addr()) {
            Entry::Occupied(older) => Err(NotNoted::LiveAlready(*older.get())),
            Entry::Vacant(v) => {
                v.insert(block);
                Ok(())
            }
        }
    }

    /// [`note`](Self::note), then [`refuse`](Self::refuse) where it
    /// refused: `allocate` runs the two apart, holding the GIL for the
    /// first only.
    #[cfg(all(test, not(feature = "cuda")))]
    fn take_allocated(
        &self,
        stack: &dyn memres_core::MemoryResource<Stream>,
        below: &Dyn,
        block: Block,
        nbytes: u64,
        s: &Stream,
    ) -> Result<(), Refused> {
        self.note(block, nbytes).map_err(|refused| self.refuse(stack, below, block, nbytes, refused, s))
    }

    /// Notes `block`, just handed out for `nbytes`, as live, or says why
    /// not. A block at address 0 or of another size than asked is refused
    /// too ([`kept::misfit`]): Python takes address 0 for no memory, and
    /// would never free it; one shorter would be written past its end, one
    /// longer freed with the size asked, which the table refuses. Calls
    /// nothing of the stack's, so `allocate` runs it holding the GIL.
    fn note(&self, block: Block, nbytes: u64) -> Result<(), NotNoted> {
        match kept::misfit(block, nbytes, "which Python takes for no memory (allocate's answer for 0 bytes)")
        {
            Some(what) => Err(NotNoted::Misfit(what)),
            None => self.note_allocated(block),
        }
    }

    /// Gives `block`, which [`note`](Self::note) refused, back through
    /// `stack`, the stack it came from on `s` (the older block of its
    /// address stays freeable); if `stack` refuses it back (not if it
    /// panics: [`kept::refuse`]), keeps it ([`kept`](Table::kept)) with `below`, the resource under
    /// `stack` that `release` gives it back to. Answers the error to
    /// raise. It calls the stack, so `allocate` runs it with the GIL
    /// released.
    fn refuse(
        &self,
        stack: &dyn memres_core::MemoryResource<Stream>,
        below: &Dyn,
        block: Block,
        nbytes: u64,
        refused: NotNoted,
        s: &Stream,
    ) -> Refused {
        let (back, failed) = kept::refuse(&self.kept, stack, below, block, s, "release()");
        let (message, retired) = match refused {
            NotNoted::Misfit(what) => (format!("allocate({nbytes}): the resource handed out {what}: {back}"), false),
            NotNoted::LiveAlready(older) => (
                format!(
                    "allocate({nbytes}): the resource handed out {:#x}, a live address (of a block of {} bytes): \
                     {back}",
                    block.addr(),
                    older.size()
                ),
                false,
            ),
            NotNoted::Retired => (
                format!(
                    "memres: allocate({nbytes}): add_bin rebuilt the resource during the call, and the new \
                     stack cannot free a block of the old one: {back}; allocate again"
                ),
                true,
            ),
        };
        Refused { message, retired, failed }
    }
}

/// Why [`Table::note_allocated`] did not note a block.
enum NotNoted {
    /// The block of the address that is live already.
    LiveAlready(Block),
    /// The stack is retired ([`Resource::retire`]).
    Retired,
    /// Not looked at: the block is at address 0 or of another size than
    /// asked ([`kept::misfit`]), what it says.
    Misfit(String),
}

/// Why a block was not taken ([`Table::refuse`]'s answer).
struct Refused {
    /// The error's text (a `MemresError`'s after `memres: `, or whole).
    message: String,
    /// Whether the stack was retired during the call: the caller's to
    /// allocate again (`InvalidArgument`), not the stack's failure
    /// (`MemresError`).
    retired: bool,
    /// Whether the give-back failed: a Python function's exception may be
    /// behind it.
    failed: bool,
}

/// A stack just built, with what it was built from.
struct Building<'a> {
    text: &'a str,
    call: Call,
    builder: StackBuilder<Stream>,
    built: memres_core::stack::Built<Stream>,
    /// The snapshot's map its leaves were tapped into, if any.
    map: Option<crate::snapshot::Map>,
    device: u32,
    /// How deep its calls nest with its upstreams' ([`depth`]).
    depth: usize,
}

impl Resource {
    /// The stack `text` on `device`, over no resource object and calling no
    /// Python function, built where the GIL may not be held (no Python
    /// runs): what the C functions give a device nobody set a resource for.
    /// Its error is the text of the exception it would be, made without
    /// the GIL: the build runs under a lock that a thread holding the GIL
    /// may wait for (`current`'s making of a device's default).
    pub(crate) fn build_plain(text: &str, device: u32) -> Result<Resource, String> {
        let call = parse(text).map_err(|e| stack_text(&e, text))?;
        let map = crate::snapshot::map(device);
        let builder = backend::builder(device, map.as_ref()).map_err(|e| e.to_string())?;
        let covers = Covers::new([], passes_calls_on(&call));
        let stream = backend::default_stream(device).map_err(|e| e.to_string())?;
        let built = builder.build_call_with_handles(&call, &stream).map_err(|e| stack_text(&e, text))?;
        let depth = depth(&call, &[]);
        let b = Building { text, call, builder, built, map, device, depth };
        Ok(Resource::of_built(b, &[], covers, Vec::new(), Arc::default()))
    }

    /// The resource object's native side of the stack `b` built over
    /// `upstreams` (the stack's `upN`), given `functions`, its blocks
    /// refused back `kept` (where its `callback` leaf keeps them too).
    fn of_built(
        b: Building<'_>,
        upstreams: &[&Resource],
        covers: Covers,
        functions: Vec<Arc<Function>>,
        kept: Arc<Kept>,
    ) -> Resource {
        let Building { text, call, builder, built, map, device, depth } = b;
        let calls_python = !functions.is_empty() || upstreams.iter().any(|u| u.calls_python);
        backend::note_driver_pools(device, &built);
        let streams =
            Arc::new(KeepStreams { inner: built.resource.clone(), streams: Mutex::new(HashMap::new()) });
        let inner: Dyn = streams.clone();
        let mut parts = Parts {
            stats: sees_the_program(&call, "stats").then(|| built.get("stats")).flatten(),
            track: sees_the_program(&call, "track").then(|| built.get("track")).flatten(),
            limit: sees_the_program(&call, "limit").then(|| built.get("limit")).flatten(),
            logs: built.all("log"),
            releasing: built.release_layers(),
            planned: with_upstreams_planned(built.all("planned"), upstreams),
            blocks: Arc::new(Guarded {
                inner: crate::snapshot::program_side(inner.clone(), map, device),
                covers: covers.clone(),
                device,
            }),
            covers: covers.clone(),
            inner,
            streams,
            table: Table { kept, ..Table::default() },
            functions,
            remembers_streams: !forgets_streams(&call),
            own_holders: 0,
            calls_python,
            over_python: None,
        };
        parts.own_holders = Arc::strong_count(&parts.streams);
        if calls_python {
            let entry = Arc::new(OverPython {
                covers: covers.clone(),
                kept: parts.table.kept.clone(),
                layers: parts.releasing.clone(),
                device,
            });
            let mut all = OVER_PYTHON.lock().unwrap_or_else(|p| p.into_inner());
            all.retain(|w| w.strong_count() > 0);
            all.push(Arc::downgrade(&entry));
            parts.over_python = Some(entry);
        }
        let keeps_streams = parts.remembers_streams || upstreams.iter().any(|u| u.keeps_streams);
        let log_file = outermost_log_file(&call);
        Resource {
            depth,
            parts: DropDetached::of_stack(parts, covers),
            has_bytes: bytes_of(&call, upstreams, &builder),
            keeps_streams,
            log_file,
            device,
            stack: text.to_string(),
        }
    }
}

#[pymethods]
impl Resource {
    /// Builds `text` on `device`, its names `up0`, `up1`... standing for
    /// `upstreams`; `callbacks` gives the Python functions of `callback`
    /// and `on_failure` names.
    #[staticmethod]
    #[pyo3(signature = (text, upstreams, device, callbacks=None))]
    fn build(
        py: Python<'_>,
        text: &str,
        upstreams: Vec<PyRef<'_, Resource>>,
        device: u32,
        callbacks: Option<Callbacks>,
    ) -> PyResult<Resource> {
        let call = parse(text).map_err(|e| stack_to_py(e, text))?;
        // An upstream given and never named is a mistake in the text: its
        // memory would go unused, and a release would not reach it.
        if let Some(i) = (0..upstreams.len()).find(|&i| !names(&call, &format!("up{i}"))) {
            return Err(PyValueError::new_err(format!(
                "memres: stack `{text}`: upstream `up{i}` is given and not named"
            )));
        }
        if let Some(u) = upstreams.iter().find(|u| u.device != device) {
            return Err(PyValueError::new_err(format!(
                "memres: an upstream on device {} under a resource of device {device}",
                u.device
            )));
        }
        let depth = depth(&call, &upstreams.iter().map(|u| u.depth).collect::<Vec<_>>());
        if depth > memres_core::stack::MAX_DEPTH {
            return Err(PyValueError::new_err(format!(
                "memres: stack `{text}`: with the resources it is built over, calls nested {depth} deep, more \
                 than {}",
                memres_core::stack::MAX_DEPTH
            )));
        }
        // One map for the leaves and the program side, even if a record
        // starts or stops meanwhile.
        let map = crate::snapshot::map(device);
        let mut builder = backend::builder(device, map.as_ref())?;
        for (i, u) in upstreams.iter().enumerate() {
            let (r, below) = u.hold("a stack over it", |u| (u.inner.clone(), u.releasing.clone()))?;
            builder.register(&format!("up{i}"), move |call, cx| {
                call.expect_args(0, &[])?;
                // A release of this stack goes on into the upstream's.
                if !below.is_empty() {
                    cx.keep_releasing_of(call, Arc::new(below.clone()));
                }
                Ok(r.clone())
            });
        }
        let covers = Covers::new(upstreams.iter().map(|u| &u.covers), passes_calls_on(&call));
        let kept = Arc::<Kept>::default();
        let functions = match callbacks {
            Some(cb) => register_callbacks(py, &mut builder, cb, &covers, &kept)?,
            None => Vec::new(),
        };
        let stream = backend::default_stream(device)?;
        // Building may allocate from the upstreams (a pool's initial size).
        let built = crate::gil::detach(py, || {
            let _call = reentry::enter(&covers).map_err(|e| to_py(e, &format!("stack `{text}`")))?;
            builder.build_call_with_handles(&call, &stream).map_err(|e| stack_to_py(e, text))
        })?;
        let upstreams: Vec<&Resource> = upstreams.iter().map(|u| &**u).collect();
        Ok(Resource::of_built(
            Building { text, call, builder, built, map, device, depth },
            &upstreams,
            covers,
            functions,
            kept,
        ))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.functions.iter().try_for_each(|f| f.visit(&visit))
    }

    /// Breaks a cycle through the object's Python functions. The stream
    /// objects are not the object's alone (its stack outlives it wherever
    /// something else holds it), so they stay.
    fn __clear__(&self) {
        for f in &self.functions {
            drop(f.take());
        }
    }

    /// Whether anything but this object uses the stack: a block of
    /// `allocate` not freed yet, or one it kept ([`Table::kept`]), or
    /// another holder (a buffer, a device's registry entry, a stack built
    /// over it, a free deferred until a call below returns).
    fn in_use(&self) -> bool {
        self.used(&self.table.live.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Lets the stack go for a rebuild of its object (`add_bin`), unless
    /// anything but the object uses it or it is retired already: whether it
    /// did. The check and the retiring are one step under the table's lock,
    /// so an allocation that ends after it finds the stack retired and is
    /// refused, its block given back, rather than noted in a table the
    /// object no longer frees from (a block lost for good).
    fn retire(&self) -> bool {
        let live = self.table.live.lock().unwrap_or_else(|p| p.into_inner());
        if self.table.retired.load(Ordering::Relaxed) || self.used(&live) {
            return false;
        }
        self.table.retired.store(true, Ordering::Relaxed);
        true
    }

    /// Keeps `stream`, the object of handle `handle`, alive as long as the
    /// stack if a layer of it remembers streams; whether the upstream
    /// objects are to be asked too (a stream new to this stack, or one it
    /// does not keep).
    fn keep(&self, handle: u64, stream: Py<PyAny>) -> bool {
        if !self.remembers_streams {
            return true;
        }
        let mut streams = self.streams.streams.lock().unwrap_or_else(|p| p.into_inner());
        match streams.entry(handle) {
            Entry::Occupied(_) => false,
            Entry::Vacant(v) => {
                v.insert(stream);
                true
            }
        }
    }

    /// Allocates `nbytes` on `stream`; returns the address (0 for 0 bytes).
    #[pyo3(signature = (nbytes, stream=0))]
    fn allocate(&self, py: Python<'_>, nbytes: u64, stream: u64) -> PyResult<u64> {
        if nbytes == 0 {
            return Ok(0);
        }
        let request = Request::new(nbytes).map_err(|e| to_py(e, &format!("allocate({nbytes})")))?;
        // SAFETY: a handle of the package's Python layer (the module's contract:
        // "Streams at the boundary" in lib.rs).
        let s = unsafe { backend::stream(stream, self.device)? };
        let block = crate::gil::detach(py, || self.blocks.allocate(request, &s))
            .map_err(|e| to_py(e, &format!("allocate({nbytes})")))?;
        // The give-back of a block refused calls the stack: without the GIL.
        let Err(refused) = self.table.note(block, nbytes) else { return Ok(block.addr()) };
        let refused = crate::gil::detach(py, || {
            self.table.refuse(&*self.blocks, &self.blocks.inner, block, nbytes, refused, &s)
        });
        let make: fn(String) -> PyErr = if refused.retired { invalid_argument } else { backend_error };
        // A Python function that raised in the give-back: its exception
        // is the cause, as an allocation's own.
        Err(if refused.failed { caused(refused.message, make) } else { make(refused.message) })
    }

    /// Frees `ptr`, allocated here with `nbytes`, on `stream`, whose handle
    /// `stream_object` keeps valid (a free deferred from inside a callback
    /// keeps it until it is applied). A refused free changes nothing.
    #[pyo3(signature = (ptr, nbytes, stream=0, stream_object=None))]
    fn deallocate(
        &self,
        py: Python<'_>,
        ptr: u64,
        nbytes: u64,
        stream: u64,
        stream_object: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        if ptr == 0 && nbytes == 0 {
            return Ok(());
        }
        // SAFETY: a handle of the package's Python layer (the module's contract:
        // "Streams at the boundary" in lib.rs).
        let s = unsafe { backend::stream(stream, self.device)? };
        let block = self.take_live(ptr, nbytes)?;
        crate::gil::detach(py, || self.blocks.free(block, s, stream_object)).map_err(|e| {
            self.put_back_live(block);
            to_py(e, &format!("deallocate({ptr:#x}, {nbytes})"))
        })
    }

    /// `((bytes now, peak, total), (count now, peak, total))` of the
    /// stack's `stats` adaptor, `None` where the stack's root is not one.
    #[allow(clippy::type_complexity)]
    fn statistics(&self, py: Python<'_>) -> Option<((i64, i64, i64), (i64, i64, i64))> {
        crate::gil::detach(py, || {
            self.stats.as_ref().map(|s| {
                let (b, c) = (s.get_bytes_counter(), s.get_allocations_counter());
                ((b.value, b.peak, b.total), (c.value, c.peak, c.total))
            })
        })
    }

    /// Starts a new level of the `stats` adaptor's counters (RMM's
    /// `push_counters`); returns the figures of the level left.
    #[allow(clippy::type_complexity)]
    fn push_statistics(&self, py: Python<'_>) -> PyResult<((i64, i64, i64), (i64, i64, i64))> {
        let s = self.stats.as_ref().ok_or_else(no_stats)?;
        let (b, c) = crate::gil::detach(py, || s.push_counters());
        Ok(((b.value, b.peak, b.total), (c.value, c.peak, c.total)))
    }

    /// Ends the innermost level; returns its figures.
    #[allow(clippy::type_complexity)]
    fn pop_statistics(&self, py: Python<'_>) -> PyResult<((i64, i64, i64), (i64, i64, i64))> {
        let s = self.stats.as_ref().ok_or_else(no_stats)?;
        // RMM's error for a pop of the base level.
        let (b, c) = crate::gil::detach(py, || s.pop_counters()).map_err(|e| match e {
            memres_core::Error::InvalidConfig { what } => {
                PyIndexError::new_err(format!("memres: pop_statistics: {what}"))
            }
            e => to_py(e, "pop_statistics"),
        })?;
        Ok(((b.value, b.peak, b.total), (c.value, c.peak, c.total)))
    }

    /// `(count, bytes)` outstanding per the outermost `track` adaptor.
    fn outstanding(&self, py: Python<'_>) -> Option<(usize, u64)> {
        crate::gil::detach(py, || {
            self.track.as_ref().map(|t| {
                let live = t.get_outstanding_allocations();
                (live.count(), live.bytes())
            })
        })
    }

    /// The outermost `track` adaptor's outstanding allocations, one line
    /// each (with its backtrace when captured), `None` where the stack's
    /// root is not one.
    fn outstanding_report(&self, py: Python<'_>) -> Option<String> {
        crate::gil::detach(py, || self.track.as_ref().map(|t| t.get_outstanding_allocations().to_string()))
    }

    /// Bytes charged against the outermost `limit` adaptor's limit (RMM's
    /// `get_allocated_bytes`: each block rounded up as it counts it),
    /// `None` where the stack's root is not one.
    fn limited_bytes(&self) -> Option<u64> {
        self.limit.as_ref().map(|l| l.get_allocated_bytes())
    }

    /// Writes out the buffers of the stack's `log` adaptors, every one of
    /// them; the first error, also rows that may not have been
    /// written. With `write_through`, each of them writes every row at
    /// once from now on (`Logging::write_through`): at exit, for the rows
    /// logged after it.
    #[pyo3(signature = (write_through=false))]
    fn flush(&self, py: Python<'_>, write_through: bool) -> PyResult<()> {
        crate::gil::detach(py, || {
            let flush: fn(&Logging<Dyn>) -> std::io::Result<()> =
                if write_through { Logging::write_through } else { Logging::flush };
            let flushed: Vec<_> = self.logs.iter().map(|log| flush(log)).collect();
            flushed.into_iter().collect::<std::io::Result<()>>()
        })
        .map_err(|e| crate::errors::backend_error(format!("flushing a log: {e}")))
    }

    /// Ends the step in progress of the stack's `planned` layers (those of
    /// the objects it is built over too) and begins the next on `stream`;
    /// returns how many layers it stepped, and the first layer's error if
    /// any failed (every layer steps anyway, so each was given the
    /// stream): the Python layer keeps the stream's object, then raises
    /// it. A call refused before any layer (re-entrant, or a handle that
    /// names no stream) raises here, and no layer was given the stream.
    #[pyo3(signature = (stream=0))]
    fn step(&self, py: Python<'_>, stream: u64) -> PyResult<(usize, Option<PyErr>)> {
        // SAFETY: a handle of the package's Python layer (the module's contract:
        // "Streams at the boundary" in lib.rs).
        let s = unsafe { backend::stream(stream, self.device)? };
        let stepped = crate::gil::detach(py, || {
            let _call = self.enter("step")?;
            // Every layer steps, those after one that fails too (see
            // `Planned::step_each`).
            PyResult::Ok(Planned::step_each(self.planned.iter().map(|p| &**p), &s))
        })?;
        let failed = stepped.err().map(|(e, failed)| match failed {
            1 => to_py(e, "step"),
            n => to_py(
                e,
                &format!("step ({n} of the {} planned layers failed; this is the first)", self.planned.len()),
            ),
        });
        Ok((self.planned.len(), failed))
    }

    /// What the stack's `planned` layers (those of the objects it is built
    /// over too) have done, summed over them:
    /// `(steps, followed, plans, planned_allocations, region,
    /// carry_region)`, the fields of `memres_core::planned::Steps`.
    fn steps(&self, py: Python<'_>) -> PyResult<(u64, u64, u64, u64, u64, u64)> {
        let s: Steps = crate::gil::detach(py, || {
            let _call = self.enter("steps")?;
            PyResult::Ok(self.planned.iter().map(|p| p.steps()).sum())
        })?;
        Ok((s.steps, s.followed, s.plans, s.planned_allocations, s.region, s.carry_region))
    }

    /// Gives back the blocks `allocate` kept ([`Table::kept`]), keeping
    /// those refused again (an error then, once the pools gave back), then
    /// what the stack's pools keep free (wholly free chunks, idle mapped
    /// granules, the driver pool's reserve), then what those of its
    /// upstreams keep, once the device is idle; returns the bytes that left
    /// the stack and its upstreams.
    #[pyo3(signature = (stream=0))]
    fn release(&self, py: Python<'_>, stream: u64) -> PyResult<u64> {
        // SAFETY: a handle of the package's Python layer (the module's contract:
        // "Streams at the boundary" in lib.rs).
        let s = unsafe { backend::stream(stream, self.device)? };
        crate::gil::detach(py, || {
            let _call = self.enter("release")?;
            // Through the stack under `blocks`: this call is in it already.
            let kept = kept::give_back(&self.table.kept, &s, drop).map_err(|e| {
                let message =
                    format!("release: giving back a block allocate kept failed: {e}; it is still kept");
                caused(message, backend_error)
            });
            // The pools give back what they keep free all the same.
            let released = self.releasing.release(&s).map_err(|e| to_py(e, "release"));
            kept.and(released)
        })
    }

    /// Bytes the stack's pools hold from their upstreams.
    fn pool_size(&self, py: Python<'_>) -> PyResult<u64> {
        crate::gil::detach(py, || {
            let _call = self.enter("pool_size")?;
            Ok(self.releasing.held_by("pool"))
        })
    }

    /// Whether `ptr` is a live block of this object's `allocate`, of
    /// `nbytes`: a free of it reaches the stack.
    fn holds(&self, ptr: u64, nbytes: u64) -> bool {
        self.table
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ptr)
            .is_some_and(|b| b.size() == nbytes)
    }

    /// Blocks allocated through this object and not yet freed.
    fn live_count(&self) -> usize {
        self.table.live.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

fn no_stats() -> PyErr {
    PyValueError::new_err("memres: this resource is not a StatisticsResourceAdaptor")
}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    use super::*;
    use crate::kept::testing::OneAddress;

    /// A resource object's table, and its stack: `leaf` alone.
    fn over(leaf: &Arc<OneAddress>) -> (Table, Dyn) {
        (Table::default(), leaf.clone())
    }

    /// Allocates `nbytes` as `allocate` does, after the stack's answer: the
    /// block, or why it was refused.
    fn allocate((table, stack): &(Table, Dyn), nbytes: u64) -> Result<Block, String> {
        let block = stack.allocate(Request::new(nbytes).unwrap(), &()).unwrap();
        table.take_allocated(&**stack, stack, block, nbytes, &()).map(|()| block).map_err(|e| e.message)
    }

    /// A block refused at a live address whose give-back the stack
    /// refuses is kept with the resource under the stack, not lost, and the
    /// error says so; a later give-back (what each `release` does first)
    /// frees it, and keeps it while it is refused. One whose give-back
    /// panics is left to the stack, which may have taken it first.
    #[test]
    fn a_block_whose_give_back_is_refused_is_kept_and_one_whose_give_back_panics_is_not() {
        let leaf = Arc::new(OneAddress { addr: 0x1000, ..Default::default() });
        let r = over(&leaf);
        let older = allocate(&r, 512).unwrap();
        leaf.refusing.store(true, Ordering::Relaxed);
        let err = allocate(&r, 256).unwrap_err();
        assert!(err.contains("a live address") && err.contains("refused"), "{err}");
        assert!(err.contains("kept to give back at the next release()"), "{err}");
        leaf.refusing.store(false, Ordering::Relaxed);
        leaf.panicking.store(true, Ordering::Relaxed);
        let err = allocate(&r, 128).unwrap_err();
        assert!(err.contains("a panic (a free that panics); left to the resource"), "{err}");
        assert!(!err.contains("kept"), "{err}");
        leaf.panicking.store(false, Ordering::Relaxed);
        let kept = || r.0.kept.lock().unwrap().iter().map(|(b, _)| *b).collect::<Vec<_>>();
        let refused = Block::new(0x1000, 256, 7);
        assert_eq!(kept(), [refused], "the refused one kept, not lost");
        assert_eq!(r.0.live.lock().unwrap().get(&0x1000), Some(&older), "the older block stays");
        leaf.refusing.store(true, Ordering::Relaxed);
        assert!(kept::give_back(&r.0.kept, &(), drop).unwrap_err().contains("refused"));
        assert_eq!(kept(), [refused]);
        leaf.refusing.store(false, Ordering::Relaxed);
        assert_eq!(kept::give_back(&r.0.kept, &(), drop), Ok(()));
        assert_eq!(*leaf.back.lock().unwrap(), [refused]);
        assert!(kept().is_empty());
    }

    /// A Rust resource under the stack that hands out a block at address
    /// 0 (or the empty block) for a nonzero request, or one of another
    /// size than asked: it reached Python as address 0 (no memory, never
    /// freed) or a block its caller could never free with the size it
    /// asked for. It is refused and given back, as `memres_py_alloc` does.
    #[test]
    fn a_block_at_address_zero_or_of_another_size_is_refused_and_given_back() {
        let leaf = Arc::new(OneAddress { addr: 0x1000, ..Default::default() });
        let r = over(&leaf);
        let handed = [
            (Block::new(0, 256, 7), 256, "a block of 256 bytes at address 0".to_string()),
            (Block::EMPTY, 256, "a block of 0 bytes at address 0".to_string()),
            (
                Block::new(0x1000, 128, 7),
                256,
                "at 0x1000 for a request of 256: shorter than asked".to_string(),
            ),
            (
                Block::new(0x1000, 1024, 7),
                512,
                "at 0x1000 for a request of 512: longer than asked".to_string(),
            ),
        ];
        for (block, asked, said) in handed {
            *leaf.handing.lock().unwrap() = Some(block);
            let err = allocate(&r, asked).unwrap_err();
            assert!(err.contains(&said) && err.contains("it was given back"), "{err}");
            assert_eq!(leaf.back.lock().unwrap().pop(), Some(block));
            assert!(r.0.live.lock().unwrap().is_empty(), "nothing live");
        }
        assert_eq!(allocate(&r, 256), Ok(Block::new(0x1000, 256, 7)), "the resource still serves");
    }
}
