//! The GIL given up around memres's calls, and never taken back inside
//! them once the interpreter exits.
//!
//! CPython before 3.14 ends a thread that takes the GIL back while the
//! interpreter is finalized (`pthread_exit`, a forced unwind). Taken back
//! inside a call of this module, that unwind crosses Rust frames, and the
//! process aborts: a daemon thread in an allocation at exit killed the
//! program with SIGABRT, where RMM's threads just end. So [`at_exit`], which
//! `atexit` runs before finalization begins, stops every later call from
//! giving the GIL up, and waits for the calls that gave it up: each either
//! takes it back before finalization begins, or, finding the exit begun,
//! never takes it back (its thread sleeps until the process ends, holding
//! no lock of a stack: the call is done), unless it was called from a
//! Python callback under another memres call on its thread. That one takes
//! the GIL back and returns: parked, it would keep its outer call from
//! ending, and with it the lock the outer call holds (a later exit handler
//! freeing into that pool spun for ever); the outer call is still counted,
//! so the exit is still waited for. It waits too for the calls of the C
//! functions made on a thread that does not hold the GIL
//! ([`without_the_gil`]), whose Python functions take it until they end.
//!
//! A call that begins once the exit has begun runs with the GIL held only
//! where it must: on the thread that runs the exit (the finalizing thread,
//! which drops what is left), and on a thread already inside a memres call
//! (a Python callback under it calls memres again): parked there, that
//! outer call would keep its stack's lock for good. On any other thread
//! the call never runs: the thread gives the GIL up and sleeps until the
//! process ends, holding no lock of a stack, as a call that ends after the
//! exit began does (its Python code would not run again either). Run with
//! the GIL held, it waited for a stack's lock that a thread in a Python
//! callback held while that thread waited for the GIL, and the exit waited
//! for the GIL: the process hung for ever. A C function's call on a thread
//! that does not hold the GIL has none to give up: it runs, but runs no
//! Python ([`without_the_gil`]).
//!
//! The CUDA and the simulated native modules each have their own: the
//! package calls both at exit, and a call of one module asks the other
//! whether its thread is inside a call of the other's (through a function
//! each hands the other in a capsule, [`link_other`], which needs no GIL).
//! [`with_python`] takes the GIL only while the interpreter is not being
//! finalized.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};
use std::cell::Cell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::OnceLock;

/// Runs `f` with the GIL taken, unless the interpreter is being finalized
/// or this thread runs a call that may not take it ([`without_the_gil`]):
/// no Python runs then (PyO3 would panic, in a drop an abort), and `None`
/// says so. A pool over a `CallbackMemoryResource` that is dropped then
/// gives its chunks back to no one: the process is ending.
pub(crate) fn with_python<T>(f: impl FnOnce(Python<'_>) -> T) -> Option<T> {
    // SAFETY: `Py_IsInitialized` may be called at any time, from any thread.
    if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 || NO_PYTHON.try_with(Cell::get).unwrap_or(false) {
        return None;
    }
    Some(Python::attach(f))
}

/// Calls that gave the GIL up and have not taken it back, and calls
/// without it ([`without_the_gil`]) that have not ended.
static GIVEN_UP: AtomicUsize = AtomicUsize::new(0);
/// Set by [`at_exit`]; never cleared.
static EXITING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The calls of this module running on this thread (see [`in_a_call`]).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// Whether this thread ran [`at_exit`]: the one that finalizes.
    static FINALIZING: Cell<bool> = const { Cell::new(false) };
    /// Whether this thread runs a call that may not take the GIL
    /// ([`without_the_gil`]).
    static NO_PYTHON: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, a call of this module (what it does with the GIL given up, or
/// a C function's call made without the GIL), counted as running on this
/// thread meanwhile.
pub(crate) fn in_a_call<T>(f: impl FnOnce() -> T) -> T {
    struct Out;
    impl Drop for Out {
        fn drop(&mut self) {
            DEPTH.with(|d| d.set(d.get() - 1));
        }
    }
    DEPTH.with(|d| d.set(d.get() + 1));
    let _out = Out;
    f()
}

/// Whether a call of this module runs on this thread now: a Python
/// function of the user's under it calls memres again.
#[pyfunction]
pub(crate) fn running_a_call() -> bool {
    in_a_call_here()
}

/// [`running_a_call`] for the other module (see [`link_other`]); at a
/// thread's exit `false` (no call runs once its locals are gone).
extern "C" fn in_a_call_here() -> bool {
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(false)
}

/// The other native module's [`running_a_call`], once
/// `memres._native` has linked the two.
static OTHER: OnceLock<extern "C" fn() -> bool> = OnceLock::new();

/// The name of the capsule of [`running_a_call`].
const CAPSULE: &CStr = c"memres._running_a_call";

/// A capsule holding this module's [`running_a_call`], for the other
/// module's [`link_other`].
#[pyfunction]
pub(crate) fn running_a_call_capsule(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
    PyCapsule::new(py, in_a_call_here as extern "C" fn() -> bool, Some(CAPSULE.to_owned()))
}

/// Takes the other module's [`running_a_call`] from its capsule. The
/// first one given stays.
#[pyfunction]
pub(crate) fn link_other(capsule: &Bound<'_, PyCapsule>) -> PyResult<()> {
    if capsule.name()? != Some(CAPSULE) || !capsule.is_valid() {
        return Err(PyValueError::new_err("memres: not a capsule of memres's native modules"));
    }
    // SAFETY: a valid capsule of this name is made only by
    // `running_a_call_capsule` (Python code makes none without `ctypes`),
    // which stores an `extern "C" fn() -> bool` as the capsule's value;
    // the function is copied out, and stays valid for the process (an
    // extension module is never unloaded).
    let f = unsafe { *capsule.reference::<extern "C" fn() -> bool>() };
    let _ = OTHER.set(f);
    Ok(())
}

/// Whether a call of either native module runs on this thread now; asks
/// no Python, so needs no GIL.
fn inside_a_call() -> bool {
    running_a_call() || OTHER.get().is_some_and(|other| other())
}

/// Once the exit has begun: whether a call on this thread runs (with the
/// GIL held), see the module's doc.
fn runs_after_the_exit() -> bool {
    FINALIZING.with(Cell::get) || inside_a_call()
}

/// Whether this thread may take the GIL now: until the exit begins, and
/// then where a call still runs with it (see the module's doc).
pub(crate) fn may_take_the_gil() -> bool {
    !EXITING.load(SeqCst) || runs_after_the_exit()
}

/// Whether the exit has begun ([`at_exit`] ran).
pub(crate) fn exiting() -> bool {
    EXITING.load(SeqCst)
}

/// Runs `f` with the GIL given up, as `Python::detach`, unless the
/// interpreter exits: then with the GIL held where it must run, else not
/// at all (see the module's doc).
pub(crate) fn detach<T: Send>(py: Python<'_>, f: impl Send + FnOnce() -> T) -> T {
    // Counted before the flag is read, and `at_exit` sets the flag before
    // it reads the count (all SeqCst): either this call sees the exit, or
    // the exit waits for this call.
    GIVEN_UP.fetch_add(1, SeqCst);
    if EXITING.load(SeqCst) {
        GIVEN_UP.fetch_sub(1, SeqCst);
        if runs_after_the_exit() {
            return in_a_call(f);
        }
        // Holding no lock of a stack, and not counted: the exit does not
        // wait for it.
        return py.detach(|| loop {
            std::thread::park();
        });
    }
    struct TakenBack;
    impl Drop for TakenBack {
        fn drop(&mut self) {
            GIVEN_UP.fetch_sub(1, SeqCst);
        }
    }
    // Dropped once `detach` has taken the GIL back (or unwinds).
    let _taken_back = TakenBack;
    py.detach(|| {
        let result = in_a_call(f);
        if EXITING.load(SeqCst) && !inside_a_call() {
            // Taking the GIL back could end the thread inside this call.
            GIVEN_UP.fetch_sub(1, SeqCst);
            loop {
                std::thread::park();
            }
        }
        result
    })
}

/// Runs `f`, a C function's call on a thread that does not hold the GIL
/// (a PyTorch autograd thread's). Begun once the exit has begun, on a
/// thread where a call need not run (see the module's doc), it runs with
/// no Python: a Python function under it fails as one does once the
/// interpreter is finalized, and its C caller gets that error. Taking the
/// GIL, the thread could be ended inside the call by the finalization
/// that follows, which aborts the process. Unlike [`detach`], it does not
/// put the thread to sleep: the thread has no GIL to take back.
pub(crate) fn without_the_gil<T>(f: impl FnOnce() -> T) -> T {
    struct Ended;
    impl Drop for Ended {
        fn drop(&mut self) {
            GIVEN_UP.fetch_sub(1, SeqCst);
        }
    }
    // Counted as `detach` counts, so that `at_exit` waits for a call begun
    // before it: its Python functions may take the GIL until it ends.
    GIVEN_UP.fetch_add(1, SeqCst);
    let ended = Ended;
    if !EXITING.load(SeqCst) {
        return in_a_call(f);
    }
    drop(ended);
    if runs_after_the_exit() {
        return in_a_call(f);
    }
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = NO_PYTHON.try_with(|n| n.set(self.0));
        }
    }
    let _restore = NO_PYTHON.try_with(|n| n.replace(true)).ok().map(Restore);
    in_a_call(f)
}

/// How long [`at_exit`] waits for the calls that gave the GIL up (or run
/// without it). A call that ends later finds the exit begun and never
/// takes the GIL back; only one inside a Python function of the user's (a
/// callback resource's, a failure callback) may still take it back during
/// finalization. So the wait is for those, and is bounded: a callback
/// that never returns (a daemon thread waiting on an event) kept the
/// process from ending.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Ends the giving up of the GIL and waits for the calls that gave it up
/// (see the module's doc), for at most [`EXIT_WAIT`], or until a signal
/// (Ctrl-C) comes. Run by the package's `atexit` handler.
#[pyfunction]
pub(crate) fn at_exit(py: Python<'_>) {
    FINALIZING.with(|f| f.set(true));
    EXITING.store(true, SeqCst);
    let start = std::time::Instant::now();
    while GIVEN_UP.load(SeqCst) != 0 && start.elapsed() < EXIT_WAIT {
        // The GIL given up for a while: a call waiting for it takes it back.
        py.detach(|| std::thread::sleep(std::time::Duration::from_millis(1)));
        if py.check_signals().is_err() {
            break;
        }
    }
}

/// In the child of a `fork`: no call gave the GIL up. The calls counted
/// were other threads', which the child does not have; counted still, the
/// child's exit waited for them. Run by `os.register_at_fork`.
#[pyfunction]
pub(crate) fn after_fork_in_child() {
    GIVEN_UP.store(0, SeqCst);
}
