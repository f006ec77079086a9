//! Streams this module makes: what `memres.Stream()` holds, as RMM's
//! `Stream()` makes a new stream.

use crate::backend;
use pyo3::prelude::*;

/// A stream made on a device and destroyed when the object is collected.
/// The Python `Stream` that holds it, and every buffer or stack given that
/// `Stream`, keep it alive, so its handle stays valid while any of them
/// uses it. The class does not take part in garbage collection (it holds
/// no Python object): the collector never clears it, so a buffer that
/// holds it in a cycle with its `Stream` frees its block before it goes.
#[pyclass(module = "memres", name = "MadeStream", frozen, weakref)]
pub(crate) struct MadeStream {
    /// Owned: dropping it destroys the stream (the driver lets queued work
    /// finish first).
    stream: backend::MadeStream,
}

#[pymethods]
impl MadeStream {
    /// A new stream on `device` (with CUDA: on its primary context, at the
    /// default priority; `non_blocking`: its work does not wait for the
    /// legacy default stream's, `CU_STREAM_NON_BLOCKING`).
    #[new]
    #[pyo3(signature = (device, non_blocking=false))]
    fn new(py: Python<'_>, device: u32, non_blocking: bool) -> PyResult<Self> {
        let stream = crate::gil::detach(py, || backend::make_stream(device, non_blocking))?;
        Ok(MadeStream { stream })
    }

    /// The stream's handle (`cudaStream_t` as an int).
    #[getter]
    fn handle(&self) -> u64 {
        backend::made_handle(&self.stream)
    }
}
