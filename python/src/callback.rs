//! Resources that call Python: RMM's `CallbackMemoryResource` (Python
//! functions allocate and free) and the function of
//! `FailureCallbackResourceAdaptor` (asked whether to retry after out of
//! memory), registered as the names `callback` and `on_failure`.

use crate::backend::Stream;
use crate::errors::panic_message;
use crate::kept::Kept;
use crate::reentry::{in_callback, Covers};
use memres_core::adaptor::FailureCallback;
use memres_core::stack::StackBuilder;
use memres_core::{Block, Error, MemoryResource, Request};
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};
use pyo3::PyTraverseError;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// `(allocate, deallocate, on_failure)`: the Python functions of a build.
pub(crate) type Callbacks = (Option<Py<PyAny>>, Option<Py<PyAny>>, Option<Py<PyAny>>);

/// A Python function of a resource object, held for its stack: the
/// object's `__traverse__` visits it and its `__clear__` takes it, so that
/// a cycle through the function (a bound method of an object that holds
/// the resource) is collected, and its memory given back. A stack whose
/// function was taken fails as its callback would (a failure callback
/// declines to retry).
pub(crate) struct Function(Mutex<Option<Py<PyAny>>>);

impl Function {
    fn new(f: Py<PyAny>) -> Arc<Function> {
        Arc::new(Function(Mutex::new(Some(f))))
    }

    /// The function, unless the garbage collector took it or found it
    /// garbage: the Python side's `_Function` is `dead` once its finalizer
    /// ran, which the collector runs before it clears anything of a cycle,
    /// and has no `dead` once its slots are cleared. Called after that, a
    /// function the collector had cleared (its globals gone) crashed the
    /// interpreter: a stack held outside Python (a block of the C
    /// functions) outlives the collection of its objects.
    fn get(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        let f = self.0.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|f| f.clone_ref(py))?;
        let dead = f.bind(py).getattr(pyo3::intern!(py, "dead")).and_then(|d| d.is_truthy()).unwrap_or(true);
        (!dead).then_some(f)
    }

    /// For the owning object's `__traverse__`.
    pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        // Never waits: the lock is held only by a thread that holds the
        // GIL, as the collector's thread does.
        match &*self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(f) => visit.call(f),
            None => Ok(()),
        }
    }

    /// For the owning object's `__clear__`: the function, taken.
    pub(crate) fn take(&self) -> Option<Py<PyAny>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// What a stack answers once the garbage collector took its functions.
const CLEARED: Error =
    Error::Backend { code: -3, what: "the resource's Python functions were taken by the garbage collector" };

thread_local! {
    /// The exception a failure callback of this thread raised, for the
    /// call that asked it: as RMM, that call raises it (a `KeyboardInterrupt`
    /// too), and no failure callback is asked again meanwhile.
    static FAILURE_RAISED: RefCell<Option<PyErr>> = const { RefCell::new(None) };
}

/// The exception a failure callback raised in this thread's call, taken
/// (none once the thread's locals are gone: its call raised nothing then).
pub(crate) fn take_failure_raised() -> Option<PyErr> {
    FAILURE_RAISED.try_with(|r| r.borrow_mut().take()).ok().flatten()
}

/// Whether a failure callback's exception waits for this thread's call
/// (none once the thread's locals are gone).
fn failure_raised() -> bool {
    FAILURE_RAISED.try_with(|r| r.borrow().is_some()).unwrap_or(false)
}

/// `on_failure`'s layer: refuses every allocation while the exception of a
/// failure callback waits for the call that asked it, so that a pool above
/// does not recover from it with a smaller request; the call fails, and
/// raises it, as RMM's exception would unwind it.
struct UntilRaised<R>(R);

impl<S: ?Sized + memres_core::Stream, R: MemoryResource<S>> MemoryResource<S> for UntilRaised<R> {
    fn allocate(&self, request: Request, stream: &S) -> memres_core::Result<Block> {
        if failure_raised() {
            return Err(Error::Backend { code: -5, what: "a failure callback raised" });
        }
        self.0.allocate(request, stream)
    }

    fn deallocate(&self, block: Block, stream: &S) -> memres_core::Result<()> {
        self.0.deallocate(block, stream)
    }

    fn id(&self) -> memres_core::ResourceId {
        self.0.id()
    }
}

/// The code of [`Error::Backend`] for a Python function that raised: its
/// exception waits in [`take_raised`].
pub(crate) const RAISED: i64 = -1;

thread_local! {
    /// The exception of the last Python function of this thread that
    /// raised: it cannot travel through the resource's `Result`, so the
    /// error raised to the caller takes it as its `__cause__`. Cleared when
    /// an outermost call begins (`reentry`), so that one a call recovered
    /// from is no part of the next.
    static LAST_RAISED: RefCell<Option<PyErr>> = const { RefCell::new(None) };
}

/// The exception behind this thread's last [`RAISED`] error, taken (none
/// once the thread's locals are gone: a free from a destructor that runs
/// at the thread's exit, after them, kept none).
pub(crate) fn take_raised() -> Option<PyErr> {
    // No borrow of it outlives a statement, and none runs Python code
    // (`keep_raised`): a free from a destructor may come here at any time.
    LAST_RAISED.try_with(|r| r.take()).ok().flatten()
}

/// Puts back an exception [`take_raised`] took, for the error it is behind.
pub(crate) fn restore_raised(e: Option<PyErr>) {
    keep_raised(e);
}

/// Keeps `e` as this thread's last raised exception; dropped once the
/// thread's locals are gone (nothing could take it then).
fn keep_raised(e: Option<PyErr>) {
    // The exception it replaces is dropped after the borrow: dropping it
    // may free a frame and run a destructor that frees a block of the C
    // functions, which takes this one (the process aborted there).
    let replaced = LAST_RAISED.try_with(|r| r.replace(e)).ok().flatten();
    drop(replaced);
}

/// Drops `value` (a stack, a buffer), and says on `sys.unraisablehook`, as
/// Python says an exception it cannot raise, what a Python function raised
/// in a free the drop made: a pool over a `CallbackMemoryResource` gives
/// its chunks back when dropped, the drop cannot fail, and the core drops
/// the free's error, so such a free was lost without a word. Nothing is
/// said once the exit has begun: the process is ending, and the memory
/// with it.
pub(crate) fn drop_saying_what_raised<T>(value: T) {
    // The exception the error of a call in progress may be behind.
    let outer = take_raised();
    drop(value);
    if let Some(raised) = take_raised().filter(|_| !crate::gil::exiting()) {
        crate::gil::with_python(|py| {
            let e = crate::errors::with_cause(
                py,
                raised,
                "a free that dropping a resource made failed, and the memory was not given back",
                crate::errors::backend_error,
            );
            // What Python's default hook names: "Exception ignored in: ...".
            let context = pyo3::types::PyString::new(py, "memres: the drop of a resource");
            e.write_unraisable(py, Some(context.as_any()));
        });
    }
    restore_raised(outer);
}

/// The error of a Python function that could not run: the interpreter is
/// being finalized.
const FINALIZING: Error = Error::Backend { code: -4, what: "the Python interpreter is being finalized" };

/// Whether a build was ever given Python functions: only they run Python
/// while a stack holds a lock, so only then may a lock's holder wait for
/// the GIL.
static PYTHON_UNDER_STACKS: AtomicBool = AtomicBool::new(false);

/// Notes that a build was given Python functions.
pub(crate) fn note_python_under_stacks() {
    PYTHON_UNDER_STACKS.store(true, Ordering::Relaxed);
}

pub(crate) fn python_under_stacks() -> bool {
    // Relaxed: a stack reaches another thread through a lock (the device
    // registry, a table, Python's objects), which orders the store first.
    PYTHON_UNDER_STACKS.load(Ordering::Relaxed)
}

/// Runs `f`, which calls Python for a callback, so that no panic unwinds
/// out of it: one comes back as a `PanicException` carrying its message,
/// for its caller to take as the function's exception. PyO3 turns a
/// `PanicException` that Python code raised (one that a Rust panic became)
/// back into a panic wherever it fetches it: from the function, from the
/// repr or truth of what it returned. Unwinding from a callback into the
/// stack that called it would run the frees deferred meanwhile during the
/// unwind, and a panic there aborted the process. A `deallocate_func` that
/// raises it refuses its block, as with any exception: the block is kept
/// for the function again. A free the function made through memres and
/// that panicked was left to that stack, which refuses it a second time.
fn catching<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let message = panic_message(payload).unwrap_or_else(|| "a panic in a memres callback".to_string());
        Err(PanicException::new_err(message))
    })
}

/// What a failing Python function becomes: a `MemoryError` is out of
/// memory for `requested` bytes (so that a `FailureCallbackResourceAdaptor`
/// over it is asked, and the caller gets `memres.OutOfMemory`, as RMM);
/// any other exception fails the call with [`RAISED`]. Either is kept for
/// the caller ([`take_raised`]), whose error it becomes the cause of (one
/// that is no `Exception`, as Ctrl-C's, is what the caller raises:
/// `errors::caused`).
fn raised(py: Python<'_>, e: PyErr, requested: u64, what: &'static str) -> Error {
    let out_of_memory = e.is_instance_of::<PyMemoryError>(py);
    keep_raised(Some(e));
    if out_of_memory {
        return Error::OutOfMemory { requested, largest_free: 0, pool_size: 0, max_size: None };
    }
    Error::Backend { code: RAISED, what }
}

/// `allocate_func`'s result as an address: `TypeError` for anything but
/// an int (a bool included), `ValueError` for an int out of 0..2**64.
fn address(result: &Bound<'_, PyAny>) -> PyResult<u64> {
    if result.is_instance_of::<PyBool>() || !result.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "memres: allocate_func returned {} (a {}), not an int address",
            shown(result),
            type_name(result)
        )));
    }
    result.extract().map_err(|_| {
        PyValueError::new_err(format!(
            "memres: allocate_func returned {}, not an address from 0 to 2**64 - 1",
            shown(result)
        ))
    })
}

/// `obj`'s repr, for an error's text; where its `__repr__` raises, a text
/// that says so: the error being made stays what is raised (the repr's
/// exception took its place, a `MemoryError` then out of memory).
fn shown(obj: &Bound<'_, PyAny>) -> String {
    match obj.repr() {
        Ok(repr) => repr.to_string_lossy().into_owned(),
        Err(e) => format!("<{} object, whose repr raised {}>", type_name(obj), type_name(e.value(obj.py()))),
    }
}

/// The name of `obj`'s type, for an error's text (`?` where even that
/// raises).
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map_or_else(|_| "?".to_string(), |n| n.to_string_lossy().into_owned())
}

/// Memory from Python functions: `allocate(nbytes, stream) -> int` and
/// `deallocate(ptr, nbytes, stream)`, the stream as its raw handle (the
/// Python layer gives RMM's functions a `memres.Stream` of it).
///
/// It keeps the blocks `allocate` handed out that were not given to
/// `deallocate` since, and refuses a block that overlaps one of them (a
/// function that hands an address out twice): it goes back to
/// `deallocate`, and the call fails. Refused here, no layer above (a
/// `Tracking`, a `Limiting` one) takes it for a block of its own: one that
/// had, and then saw it given back, forgot the older block of that address,
/// which could not be freed any more.
struct PyCallbacks {
    allocate: Arc<Function>,
    free: Arc<PyFree>,
    /// Blocks handed out and not freed: start to length (at least 1).
    live: Mutex<BTreeMap<u64, u64>>,
    /// The object's blocks refused back (its table's): a refused block
    /// whose give-back `deallocate` refuses is kept there, for `release()`.
    kept: Arc<Kept>,
}

/// What `allocate` refuses a null or misaligned address with.
const NULL_OR_MISALIGNED: Error =
    Error::Backend { code: -2, what: "allocate_func returned a null or misaligned address" };

/// `deallocate(ptr, nbytes, stream)` alone: what gives a kept block back.
struct PyFree {
    deallocate: Arc<Function>,
    /// The `CallbackMemoryResource` object's.
    covers: Covers,
}

impl PyCallbacks {
    /// Notes `block` as live, unless it overlaps a live block: whether it
    /// did.
    fn note(&self, block: Block) -> bool {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let (start, len) = (block.addr(), block.size().max(1));
        let end = start.saturating_add(len);
        let before = live.range(..=start).next_back().is_some_and(|(&s, &l)| s.saturating_add(l) > start);
        if before || live.range(start.saturating_add(1)..end).next().is_some() {
            return false;
        }
        live.insert(start, len);
        true
    }
}

impl MemoryResource<Stream> for PyCallbacks {
    fn allocate(&self, request: Request, stream: &Stream) -> memres_core::Result<Block> {
        let handle = crate::backend::handle_of(stream);
        let given = in_callback(&self.free.covers, || {
            crate::gil::with_python(|py| {
                let (Some(allocate), Some(deallocate)) =
                    (self.allocate.get(py), self.free.deallocate.get(py))
                else {
                    return Err(CLEARED);
                };
                let result = catching(|| allocate.call1(py, (request.size(), handle)))
                    .map_err(|e| raised(py, e, request.size(), "allocate_func raised"))?;
                let addr = catching(|| address(result.bind(py)))
                    .map_err(|e| raised(py, e, request.size(), "allocate_func returned no int address"))?;
                let block = Block::new(addr, request.size(), 0);
                let misaligned = addr == 0 || addr % request.align() != 0;
                if !misaligned && self.note(block) {
                    return Ok(Ok(block));
                }
                if addr == 0 {
                    return Err(NULL_OR_MISALIGNED);
                }
                // Refused, the memory goes back: nobody else would free it.
                let back = catching(|| deallocate.call1(py, (addr, request.size(), handle)));
                Ok(Err((block, misaligned, back.map(drop))))
            })
            .unwrap_or(Err(FINALIZING))
        })?;
        let (block, misaligned, back) = match given {
            Ok(block) => return Ok(block),
            Err(refused) => refused,
        };
        match (misaligned, back) {
            (true, Ok(())) => Err(NULL_OR_MISALIGNED),
            (false, Ok(())) => Err(Error::Backend {
                code: -2,
                what: "allocate_func returned a live address (in a block it handed out, not freed since): \
                       it was given back",
            }),
            (true, Err(e)) => {
                // The call raises: the function's exception is its error's
                // cause (a `SystemExit` what it raises), never printed
                // (`PyErr_Print` of a `SystemExit` ended the process here).
                keep_raised(Some(e));
                Err(Error::Backend {
                    code: RAISED,
                    what: "allocate_func returned a misaligned address, and deallocate_func raised giving it back",
                })
            }
            (false, Err(e)) => {
                // Its memory is in use by the live block: kept, for
                // `release()` to give back once `deallocate` takes it.
                crate::kept::keep(&self.kept, block, self.free.clone(), stream);
                keep_raised(Some(e));
                Err(Error::Backend {
                    code: RAISED,
                    what:
                        "allocate_func returned a live address, and deallocate_func raised giving it back: \
                           kept to give back at the next release()",
                })
            }
        }
    }

    fn deallocate(&self, block: Block, stream: &Stream) -> memres_core::Result<()> {
        // Out of the live blocks before `deallocate` runs: once it has, the
        // address may be handed out again (to a thread that `deallocate`
        // let take the GIL). Back in if the block stays live.
        let noted = self.live.lock().unwrap_or_else(|p| p.into_inner()).remove(&block.addr());
        let freed = self.free.deallocate(block, stream);
        if freed.is_err() && noted.is_some() {
            // Unless another block took its place meanwhile.
            self.note(block);
        }
        freed
    }
}

impl MemoryResource<Stream> for PyFree {
    fn allocate(&self, _: Request, _: &Stream) -> memres_core::Result<Block> {
        Err(Error::Backend { code: -2, what: "a kept block's give-back allocates nothing" })
    }

    fn deallocate(&self, block: Block, stream: &Stream) -> memres_core::Result<()> {
        let handle = crate::backend::handle_of(stream);
        in_callback(&self.covers, || {
            crate::gil::with_python(|py| {
                // The block stays live: nothing else could give it back.
                let Some(deallocate) = self.deallocate.get(py) else {
                    // Said where a drop made this free (its error is dropped).
                    keep_raised(Some(PyRuntimeError::new_err(format!(
                        "memres: deallocate_func of the block at {:#x} ({} bytes) was taken by the \
                         garbage collector (a cycle through it was collected)",
                        block.addr(),
                        block.size()
                    ))));
                    return Err(CLEARED);
                };
                catching(|| deallocate.call1(py, (block.addr(), block.size(), handle)))
                    .map(drop)
                    .map_err(|e| raised(py, e, 0, "deallocate_func raised"))
            })
            .unwrap_or(Err(FINALIZING))
        })
    }
}

/// Registers `callback` (a leaf) and `on_failure(UP)` for this build's
/// Python functions, of the resource object of `covers` whose blocks
/// refused back are `kept`; returns them, for the object's `__traverse__`
/// and `__clear__`.
pub(crate) fn register_callbacks(
    py: Python<'_>,
    builder: &mut StackBuilder<Stream>,
    (allocate, deallocate, on_failure): Callbacks,
    covers: &Covers,
    kept: &Arc<Kept>,
) -> PyResult<Vec<Arc<Function>>> {
    if allocate.is_some() || on_failure.is_some() {
        note_python_under_stacks();
    }
    let mut functions = Vec::new();
    if let (Some(allocate), Some(deallocate)) = (allocate, deallocate) {
        // What `deallocate`'s finalizer runs (`mr._Function`): the stacks
        // over this object give back what they keep free through it, and
        // they and its own stack the blocks `allocate` kept.
        let owner = covers.own();
        let give_back = pyo3::types::PyCFunction::new_closure(py, None, None, move |args, _| {
            crate::resource::give_back_to(args.py(), owner)
        })?;
        deallocate.bind(py).setattr(pyo3::intern!(py, "give_back"), give_back)?;
        let (allocate, deallocate) = (Function::new(allocate), Function::new(deallocate));
        functions.extend([allocate.clone(), deallocate.clone()]);
        let free = Arc::new(PyFree { deallocate, covers: covers.clone() });
        let leaf = Arc::new(PyCallbacks { allocate, free, live: Mutex::default(), kept: kept.clone() });
        builder.register("callback", move |call, _| {
            call.expect_args(0, &[])?;
            Ok(leaf.clone())
        });
    }
    if let Some(function) = on_failure {
        let function = Function::new(function);
        functions.push(function.clone());
        let function = Arc::new((function, covers.clone()));
        builder.register("on_failure", move |call, cx| {
            call.expect_args(1, &[])?;
            let adaptor = FailureCallback::new(
                cx.upstream(call, 0)?,
                function.clone(),
                |bytes, f: &Arc<(Arc<Function>, Covers)>| {
                    // A callback that raised ends the call: none is asked again.
                    if failure_raised() {
                        return false;
                    }
                    in_callback(&f.1, || {
                        crate::gil::with_python(|py| {
                            let Some(callback) = f.0.get(py) else { return false };
                            catching(|| callback.call1(py, (bytes,))?.bind(py).is_truthy()).unwrap_or_else(
                                |e| {
                                    let _ = FAILURE_RAISED.try_with(|r| *r.borrow_mut() = Some(e));
                                    false
                                },
                            )
                        })
                        .unwrap_or(false)
                    })
                },
            );
            Ok(cx.keep(call, UntilRaised(adaptor)))
        });
    }
    Ok(functions)
}
