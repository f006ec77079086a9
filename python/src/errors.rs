//! memres's errors as Python exceptions: out of memory is
//! `memres.OutOfMemory` (a `MemoryError` carrying the figures), as is a
//! size no resource can serve, misuse is `memres.InvalidArgument` (a
//! `ValueError` and a `RuntimeError`), a backend's failure, or an
//! upstream's answer outside its contract, is `memres.MemresError`. The
//! exception classes are defined once, in `memres/_errors.py`.

use memres_core::stack::StackError;
use memres_core::Error;
use pyo3::exceptions::{PyException, PyRuntimeError, PyValueError};
use pyo3::panic::PanicException;
use pyo3::prelude::*;

/// An instance of `memres._errors.NAME(args...)`, or a plain
/// `RuntimeError` if the Python side cannot be reached.
fn python_error(name: &str, message: String, kwargs: Vec<(&str, Option<u64>)>) -> PyErr {
    Python::attach(|py| {
        let make = || -> PyResult<PyErr> {
            let class = py.import("memres._errors")?.getattr(name)?;
            let kw = pyo3::types::PyDict::new(py);
            for (k, v) in kwargs {
                kw.set_item(k, v)?;
            }
            Ok(PyErr::from_value(class.call((message.clone(),), Some(&kw))?))
        };
        make().unwrap_or_else(|e| PyRuntimeError::new_err(format!("{message} (and {e})")))
    })
}

/// A failure of the backend (the driver), as `memres.MemresError`;
/// `message` is said after `memres: `.
pub(crate) fn backend_error(message: String) -> PyErr {
    python_error("MemresError", format!("memres: {message}"), vec![])
}

/// What a resource refuses, as `memres.InvalidArgument`: a `ValueError`,
/// and a `RuntimeError` as RMM's C++ errors are; `message` is said whole.
pub(crate) fn invalid_argument(message: String) -> PyErr {
    python_error("InvalidArgument", message, vec![])
}

/// An error made where the GIL may not be taken: under a lock that a
/// thread holding the GIL may wait for (the making of a device's default,
/// `current`), taking it would have each wait for the other. Its text needs
/// no Python; it becomes its exception (`?` in a `PyResult`) where the GIL
/// may be taken.
#[derive(Debug)]
pub(crate) enum GilFree {
    /// A `ValueError` saying this.
    Value(String),
    /// A `memres.MemresError` ([`backend_error`]) of this message (the
    /// driver's: the simulated backend has none).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Backend(String),
}

impl std::fmt::Display for GilFree {
    /// The text of the exception it becomes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GilFree::Value(message) => f.write_str(message),
            GilFree::Backend(message) => write!(f, "memres: {message}"),
        }
    }
}

impl From<GilFree> for PyErr {
    fn from(e: GilFree) -> PyErr {
        match e {
            GilFree::Value(message) => PyValueError::new_err(message),
            GilFree::Backend(message) => backend_error(message),
        }
    }
}

/// `e`, met while doing `what`, as the Python exception of its kind.
pub(crate) fn to_py(e: Error, what: &str) -> PyErr {
    if let Some(raised) = crate::callback::take_failure_raised() {
        return failure_raised(raised, what);
    }
    let message = format!("memres: {what}: {e}");
    match e {
        // Out of memory, perhaps a Python function's `MemoryError`.
        Error::OutOfMemory { requested, largest_free, pool_size, max_size } => caused(message, |message| {
            python_error(
                "OutOfMemory",
                message,
                vec![
                    ("requested", Some(requested)),
                    ("largest_free", Some(largest_free)),
                    ("pool_size", Some(pool_size)),
                    ("max_size", max_size),
                ],
            )
        }),
        Error::LimitExceeded { requested, used, limit } => python_error(
            "OutOfMemory",
            message,
            vec![("requested", Some(requested)), ("used", Some(used)), ("limit", Some(limit))],
        ),
        // The Python crate's own refusal (`reentry`), or the core's of a
        // step inside a callback: both are calls from below the stack.
        Error::Reentrant => python_error(
            "MemresError",
            format!(
                "memres: {what}: a re-entrant call from inside a callback under the same resource \
                 (its stack is in a call on this thread, whose locks it may hold): refused, nothing changed"
            ),
            vec![],
        ),
        Error::Backend { code: crate::callback::RAISED, .. } => {
            caused(message, |message| python_error("MemresError", message, vec![]))
        }
        // Not the caller's fault: an upstream (a Python function's resource
        // under a pool) answered outside its contract.
        Error::Backend { .. } | Error::CapacityExhausted { .. } | Error::UpstreamMisbehaved { .. } => {
            python_error("MemresError", message, vec![])
        }
        // A size no resource can serve: RMM raises `MemoryError` for
        // every allocation that fails.
        Error::InvalidSize { size, .. } => {
            python_error("OutOfMemory", message, vec![("requested", Some(size))])
        }
        _ if e.is_out_of_memory() => python_error("OutOfMemory", message, vec![]),
        _ => invalid_argument(message),
    }
}

/// `e` as its text in an error's message (`Type: text`, as PyO3's
/// `Display` of it), without failing: that `Display` fails where the
/// type's `__qualname__` raises (a metaclass's doing), and `format!` then
/// panicked in place of the error being made. Each lookup may run Python
/// code that raises a `PanicException`, which PyO3 turns back into a panic
/// when it fetches it: caught here, as any other failure of it (it made
/// the call raise that `PanicException`, the function's exception lost).
pub(crate) fn said(py: Python<'_>, e: &PyErr) -> String {
    let value = e.value(py);
    let ty = value.get_type();
    let name = caught(|| ty.qualname())
        .or_else(|| caught(|| ty.name()))
        .map_or_else(|| "?".to_string(), |n| n.to_string_lossy().into_owned());
    match caught(|| value.str().map(|text| text.to_string_lossy().into_owned())) {
        Some(text) => format!("{name}: {text}"),
        None => format!("{name}: <exception str() failed>"),
    }
}

/// `f`'s value, `None` where it fails or panics.
fn caught<T>(f: impl FnOnce() -> PyResult<T>) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_or_else(
        |payload| {
            panic_message(payload);
            None
        },
        Result::ok,
    )
}

/// The message of a caught panic whose payload is text (`&str` or
/// `String`, what `panic!` makes), dropped with it; `None` for a payload
/// of another type, which is forgotten, not dropped: its `Drop` may be the
/// user's and panic, unwinding from where the first panic was caught.
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> Option<String> {
    if let Some(s) = payload.downcast_ref::<&str>() {
        Some(s.to_string())
    } else if let Some(s) = payload.downcast_ref::<String>() {
        Some(s.clone())
    } else {
        std::mem::forget(payload);
        None
    }
}

/// What a call whose failure callback raised `raised` raises, as RMM's
/// (which turns the exception into a C++ one and back): a `MemoryError`
/// stays one; any other `Exception` is a `MemresError` (a `RuntimeError`)
/// that says it and has it as its `__cause__`. One that is no `Exception`
/// (Ctrl-C's `KeyboardInterrupt`, `sys.exit()`'s `SystemExit`) is raised as
/// it is, where RMM's makes a `RuntimeError` of it too: no `except
/// RuntimeError` around the call swallows a request to stop.
fn failure_raised(raised: PyErr, what: &str) -> PyErr {
    Python::attach(|py| {
        if raised.is_instance_of::<pyo3::exceptions::PyMemoryError>(py)
            || !raised.is_instance_of::<PyException>(py)
        {
            return raised;
        }
        let message = format!("memres: {what}: the failure callback raised");
        with_cause(py, raised, &message, |m| python_error("MemresError", m, vec![]))
    })
}

/// The error `make` makes of `message`, with the exception a Python
/// function of this call raised (`callback::take_raised`), if any, as its
/// `__cause__` and its text at the message's end, so that the function's
/// own words (RMM's `match="My alloc error"`) are in what is raised.
pub(crate) fn caused(message: String, make: impl FnOnce(String) -> PyErr) -> PyErr {
    let Some(cause) = crate::callback::take_raised() else { return make(message) };
    Python::attach(|py| {
        // Ctrl-C (`KeyboardInterrupt`) or `sys.exit()` in the function asks
        // the program to stop, and is no `Exception`: raised as it is, as a
        // failure callback's, so that no `except Exception` (nor `except
        // RuntimeError`) around the call swallows it. A Rust panic's
        // `PanicException` stays the function's error.
        if !cause.is_instance_of::<PyException>(py) && !cause.is_instance_of::<PanicException>(py) {
            return cause;
        }
        with_cause(py, cause, &message, make)
    })
}

/// The error `make` makes of `message` with `cause`'s text at its end, and
/// `cause` as its `__cause__`.
pub(crate) fn with_cause(
    py: Python<'_>,
    cause: PyErr,
    message: &str,
    make: impl FnOnce(String) -> PyErr,
) -> PyErr {
    let e = make(format!("{message} ({})", said(py, &cause)));
    e.set_cause(py, Some(cause));
    e
}

/// The text of [`stack_to_py`]'s exception for a stack of no Python
/// function (no callback's exception is behind it), made without the GIL.
pub(crate) fn stack_text(e: &StackError, text: &str) -> String {
    match &e.kind {
        memres_core::stack::StackErrorKind::Resource(inner) => {
            format!("memres: stack `{text}`: at byte {}: {inner}", e.pos)
        }
        _ => format!("memres: stack `{text}`: {e}"),
    }
}

/// A stack that could not be built: `ValueError` for what the text says,
/// the resource's own error (out of memory, the driver) otherwise; either
/// says the byte of the text it is at.
pub(crate) fn stack_to_py(e: StackError, text: &str) -> PyErr {
    match e.kind {
        memres_core::stack::StackErrorKind::Resource(inner) => {
            to_py(inner, &format!("stack `{text}`: at byte {}", e.pos))
        }
        _ => PyValueError::new_err(format!("memres: stack `{text}`: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::panic_message;
    use std::panic::catch_unwind;

    /// A payload whose `Drop` panics, as a user's panic value may.
    struct Bomb;

    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("the payload, dropped");
        }
    }

    #[test]
    fn a_panics_text_is_its_message_and_any_other_payload_is_forgotten() {
        let payload = catch_unwind(|| panic!("literal")).unwrap_err();
        assert_eq!(panic_message(payload).as_deref(), Some("literal"));
        let n = 7;
        let payload = catch_unwind(|| panic!("formatted {n}")).unwrap_err();
        assert_eq!(panic_message(payload).as_deref(), Some("formatted 7"));
        // Dropped, this payload would panic out of the caller that caught it.
        let payload = catch_unwind(|| std::panic::panic_any(Bomb)).unwrap_err();
        assert_eq!(panic_message(payload), None);
    }
}
