//! Resources that call Python: RMM's `CallbackMemoryResource` (Python
//! functions allocate and free) and the function of
//! `FailureCallbackResourceAdaptor` (asked whether to retry after out of
//! memory), registered as the names `callback` and `on_failure`.

use crate::backend::Stream;
use memres_core::adaptor::FailureCallback;
use memres_core::stack::StackBuilder;
use memres_core::{Block, Error, MemoryResource, Request};
use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;
use std::sync::Arc;

/// `(allocate, deallocate, on_failure)`: the Python functions of a build.
pub(crate) type Callbacks = (Option<Py<PyAny>>, Option<Py<PyAny>>, Option<Py<PyAny>>);

/// What a failing Python function becomes: a `MemoryError` is out of
/// memory for `requested` bytes (so that a `FailureCallbackResourceAdaptor`
/// over it is asked, and the caller gets `memres.OutOfMemory`, as RMM);
/// any other exception is printed (it cannot travel through the
/// resource's `Result`) and the call fails.
fn raised(py: Python<'_>, e: PyErr, requested: u64) -> Error {
    if e.is_instance_of::<PyMemoryError>(py) {
        return Error::OutOfMemory { requested, largest_free: 0, pool_size: 0, max_size: None };
    }
    e.print(py);
    Error::Backend { code: -1, what: "a Python callback raised" }
}

/// Memory from Python functions: `allocate(nbytes) -> int` and
/// `deallocate(ptr, nbytes)`.
struct PyCallbacks {
    allocate: Py<PyAny>,
    deallocate: Py<PyAny>,
}

impl<S: ?Sized + memres_core::Stream> MemoryResource<S> for PyCallbacks {
    fn allocate(&self, request: Request, _: &S) -> memres_core::Result<Block> {
        Python::attach(|py| {
            let addr: u64 = self
                .allocate
                .call1(py, (request.size(),))
                .and_then(|r| r.extract(py))
                .map_err(|e| raised(py, e, request.size()))?;
            if addr == 0 || addr % request.align() != 0 {
                if addr != 0 {
                    // Refused, the memory goes back: nobody else would free it.
                    if let Err(e) = self.deallocate.call1(py, (addr, request.size())) {
                        e.print(py);
                    }
                }
                return Err(Error::Backend {
                    code: -2,
                    what: "allocate_func returned a null or misaligned address",
                });
            }
            Ok(Block::new(addr, request.size(), 0))
        })
    }

    fn deallocate(&self, block: Block, _: &S) -> memres_core::Result<()> {
        Python::attach(|py| {
            self.deallocate.call1(py, (block.addr(), block.size())).map(drop).map_err(|e| raised(py, e, 0))
        })
    }
}

/// Registers `callback` (a leaf) and `on_failure(UP)` for this build's
/// Python functions.
pub(crate) fn register_callbacks(
    builder: &mut StackBuilder<Stream>,
    (allocate, deallocate, on_failure): Callbacks,
) {
    if let (Some(allocate), Some(deallocate)) = (allocate, deallocate) {
        let leaf = Arc::new(PyCallbacks { allocate, deallocate });
        builder.register("callback", move |call, _| {
            call.expect_args(0, &[])?;
            Ok(leaf.clone())
        });
    }
    if let Some(function) = on_failure {
        let function = Arc::new(function);
        builder.register("on_failure", move |call, cx| {
            call.expect_args(1, &[])?;
            let adaptor =
                FailureCallback::new(cx.upstream(call, 0)?, function.clone(), |bytes, f: &Arc<Py<PyAny>>| {
                    Python::attach(|py| {
                        f.call1(py, (bytes,)).and_then(|r| r.bind(py).is_truthy()).unwrap_or_else(|e| {
                            e.print(py);
                            false
                        })
                    })
                });
            Ok(cx.keep(call, adaptor))
        });
    }
}
