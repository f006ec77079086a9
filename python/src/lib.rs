//! The native module of the `memres` Python package (PyO3).
//!
//! Built twice from this crate: without feature `cuda` it is
//! `memres._memres`, which serves the simulated device and host memory and
//! never links the CUDA driver, so `import memres` works anywhere; with
//! `cuda` it is `memres._cuda`, imported by the Python side only when a
//! CUDA resource is first made (the private module `backend` holds every difference). The
//! Python modules (`python/memres/`) hold the API; this crate only builds
//! stacks, allocates, copies and counts.
//!
//! # Streams at the boundary
//!
//! The module's `stream` arguments are raw `cudaStream_t` handles, as the C
//! library's are. The Python layer makes each of a stream object it
//! accepted (`memres._stream.as_handle`: a framework's stream, or one this
//! module made for `Stream()`, a `MadeStream`; either kept alive by the
//! buffer that uses it, by a free deferred from inside a callback until it
//! is applied, and by a stack that remembers it after the call,
//! `Resource::keep`) or of `Stream.from_handle`, whose caller
//! vouches for it, and refuses a bare int. No handle can be checked
//! here: the module is private, and a caller that passes it another int
//! hands that to the driver, as a C caller of `memres_alloc` would. Every
//! call of `backend::stream` names this contract.
//!
//! # Arrays at the boundary
//!
//! `NativeBuffer.copy_from_cuda_array` takes a raw device address and a
//! size. The Python layer passes only those of an object's
//! `__cuda_array_interface__` (CuPy's, Numba's, PyTorch's arrays), 1-D and
//! contiguous, whose producer promises that many bytes of device memory
//! while the object lives, and holds the object for the whole call; the
//! call waits for its copy before it returns.

// The simulated build's stream type is `()`: code written once for both
// builds binds streams that are unit there.
#![allow(clippy::let_unit_value)]

mod backend;
mod buffer;
mod callback;
pub mod current;
mod detached;
mod errors;
mod gil;
mod kept;
mod reentry;
mod resource;
mod snapshot;
mod stream;

use pyo3::prelude::*;

/// The log file of `device` for the name `name`, as RMM and the C library
/// name it: `.devN` before the extension (`x.csv` is `x.dev1.csv` for device
/// 1); `None` for an empty name. A name of a directory (`logs/`, `logs`
/// where that is one) is a `ValueError`, as `MEMRES_LOG_FILE`'s is: the
/// device's file would lie beside it (`logs.dev0`).
#[pyfunction]
fn log_file_of_device(name: std::path::PathBuf, device: u32) -> PyResult<Option<std::path::PathBuf>> {
    let refused = |why: &dyn std::fmt::Display| {
        pyo3::exceptions::PyValueError::new_err(format!("memres: log file `{}`: {why}", name.display()))
    };
    memres_core::snapshot::check_names_a_file(&name).map_err(|e| refused(&e))?;
    if name.is_dir() {
        return Err(refused(&"it names a directory; name a file in it"));
    }
    Ok(memres_core::stack::log_file_of_device(Some(name.as_os_str()), device))
}

/// The names of the resources of the stack `text`, outermost first: each
/// call's, and those of the calls among its positional arguments (its
/// upstreams), not the values of its keys (`file=/tmp/host.csv`,
/// `per_stream=true`); `ValueError` for text that is no stack, as a build's.
#[pyfunction]
fn stack_names(text: &str) -> PyResult<Vec<String>> {
    fn walk(call: &memres_core::stack::Call, names: &mut Vec<String>) {
        names.push(call.name.clone());
        for arg in call.args.iter().filter(|a| a.key.is_none()) {
            if let memres_core::stack::Value::Call(c) = &arg.value {
                walk(c, names);
            }
        }
    }
    let call = memres_core::stack::parse(text).map_err(|e| errors::stack_to_py(e, text))?;
    let mut names = Vec::new();
    walk(&call, &mut names);
    Ok(names)
}

#[pymodule]
#[cfg_attr(feature = "cuda", pyo3(name = "_cuda"))]
#[cfg_attr(not(feature = "cuda"), pyo3(name = "_memres"))]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("BACKEND", backend::BACKEND)?;
    m.add("MAX_DEVICES", backend::MAX_DEVICES)?;
    m.add("MAX_REQUEST", memres_core::Request::MAX_SIZE)?;
    m.add("C_DEFAULT_STACK", backend::c_default_stack())?;
    m.add("GIT_COMMIT", env!("MEMRES_GIT_COMMIT"))?;
    m.add_class::<resource::Resource>()?;
    m.add_class::<resource::LockedForFork>()?;
    m.add_function(wrap_pyfunction!(resource::lock_for_fork, m)?)?;
    m.add_class::<buffer::Buffer>()?;
    m.add_class::<stream::MadeStream>()?;
    m.add_function(wrap_pyfunction!(current::set_per_device_resource, m)?)?;
    m.add_function(wrap_pyfunction!(current::take_default, m)?)?;
    m.add_function(wrap_pyfunction!(current::set_c_default_stack, m)?)?;
    m.add_function(wrap_pyfunction!(current::set_other_backend, m)?)?;
    m.add_function(wrap_pyfunction!(current::forget_per_device_resource, m)?)?;
    m.add_function(wrap_pyfunction!(current::c_live_count, m)?)?;
    m.add_function(wrap_pyfunction!(current::give_back_c_kept, m)?)?;
    m.add_function(wrap_pyfunction!(current::last_error, m)?)?;
    m.add_function(wrap_pyfunction!(current::device_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(current::memory_info, m)?)?;
    m.add_function(wrap_pyfunction!(current::default_memory_pool, m)?)?;
    m.add_function(wrap_pyfunction!(current::synchronize_stream, m)?)?;
    #[cfg(feature = "cuda")]
    m.add_function(wrap_pyfunction!(current::pointer_device, m)?)?;
    m.add_function(wrap_pyfunction!(snapshot::record, m)?)?;
    m.add_function(wrap_pyfunction!(snapshot::snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(snapshot::write_file, m)?)?;
    m.add_function(wrap_pyfunction!(log_file_of_device, m)?)?;
    m.add_function(wrap_pyfunction!(stack_names, m)?)?;
    m.add_function(wrap_pyfunction!(gil::at_exit, m)?)?;
    m.add_function(wrap_pyfunction!(gil::after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(gil::running_a_call, m)?)?;
    m.add_function(wrap_pyfunction!(gil::running_a_call_capsule, m)?)?;
    m.add_function(wrap_pyfunction!(gil::link_other, m)?)?;
    current::install_default();
    Ok(())
}
