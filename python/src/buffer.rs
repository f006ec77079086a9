//! `memres.DeviceBuffer`'s native side: memres-containers' `DeviceBuffer`
//! over a built stack, with the backend's copy engine, on a stream. Dropped
//! (collected), it frees its block on its stream.

use crate::backend::{self, Engine, Stream};
use crate::detached::DropDetached;
use crate::errors::to_py;
use crate::resource::Resource;
use memres_containers::ContainerError;
use memres_core::copy::{AssumeMemoryOf, CopyEngine};
use memres_core::{DynResource, Error, Stream as _};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

type Kind = <Engine as CopyEngine<Stream>>::Kind;
type Inner = memres_containers::DeviceBuffer<AssumeMemoryOf<DynResource<Stream>, Kind>, Engine, Stream>;

fn container_error(e: ContainerError, what: &str) -> PyErr {
    match e {
        ContainerError::Memory(e) => to_py(e, what),
        // Bytes past the end, as RMM's `ValueError` ("too large").
        _ => PyValueError::new_err(format!("memres: {what}: {e}")),
    }
}

/// The buffer; the lock only makes it shareable between threads. A call
/// that takes the lock releases the GIL first: the lock's holder may be in
/// a Python callback (a resize through a failure callback), which needs
/// the GIL. Collected, it frees its block with the GIL released, on its
/// stream, whose keeper it holds until then (inside a callback under its
/// stack, until the thread's outermost call returns:
/// [`reentry::drop_outside_frees`](crate::reentry::drop_outside_frees)).
///
/// The keeper is not shown to the garbage collector: the collector
/// finalizes a cycle's objects (a framework's stream destroys its handle in
/// its finalizer), then clears them in no set order (a memres `Stream`
/// cleared drops the stream it made), either of which, had it reached the
/// keeper while the buffer still held its block, left the block to be
/// freed on a destroyed stream. Held out of its sight, the keeper is
/// reachable until the buffer is gone. A stream a memres `Stream` made
/// (`MadeStream`, which the collector never clears) keeps no cycle alive;
/// a framework's stream object that holds the buffers made on it is a
/// cycle the collector does not collect.
#[pyclass(module = "memres", name = "NativeBuffer", frozen)]
pub(crate) struct Buffer {
    inner: DropDetached<Shared>,
}

struct Shared {
    buffer: Mutex<Inner>,
    /// The number of the thread holding `buffer` (`memres_core::thread_number`), or
    /// 0. Only the holder writes it, so a thread that reads its own number
    /// here holds the lock.
    holder: AtomicU64,
    /// The buffer's `ptr`, `size` and `capacity` as its last holder left
    /// them: read with no lock, as RMM's, so that a callback that reads
    /// them never waits for a buffer another thread holds.
    figures: [AtomicU64; 3],
    /// What keeps the stream's handle valid (a `MadeStream`, or a
    /// framework's stream object): held, never read, and dropped after
    /// `buffer`, whose drop frees the block on it.
    _keeper: Option<Py<PyAny>>,
}

impl Shared {
    fn new(inner: Inner, keeper: Option<Py<PyAny>>) -> Shared {
        let figures = figures_of(&inner).map(AtomicU64::new);
        Shared { buffer: Mutex::new(inner), holder: AtomicU64::new(0), figures, _keeper: keeper }
    }

    fn figure(&self, i: usize) -> u64 {
        self.figures[i].load(Ordering::Relaxed)
    }
}

const PTR: usize = 0;
const SIZE: usize = 1;
const CAPACITY: usize = 2;

fn figures_of(b: &Inner) -> [u64; 3] {
    // As RMM's `data()`: the block's address (0 with no memory), kept by a
    // resize to 0, which frees nothing.
    [b.addr(), b.len(), b.capacity()]
}

/// The buffer, locked by this thread; its figures are stored and the
/// holder cleared before the lock goes.
struct Locked<'a> {
    shared: &'a Shared,
    guard: MutexGuard<'a, Inner>,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        for (cell, value) in self.shared.figures.iter().zip(figures_of(&self.guard)) {
            cell.store(value, Ordering::Relaxed);
        }
        self.shared.holder.store(0, Ordering::Relaxed);
    }
}

impl std::ops::Deref for Locked<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.guard
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.guard
    }
}

impl Buffer {
    /// Locks the buffer for `what`. A Python callback that a call on this
    /// buffer reached (its resource's failure callback during a resize, a
    /// `CallbackMemoryResource` function) and that uses the buffer again
    /// would wait for ever for a lock its own thread holds: it gets
    /// `Error::Reentrant` instead, and nothing changes. Nor does any
    /// callback wait for a buffer another thread holds: that thread may be
    /// waiting for a lock of the stack the callback runs under (its own
    /// resize into the same pool), so the callback gets a `MemresError`
    /// saying so while the other holds it.
    fn lock(&self, what: &str) -> PyResult<Locked<'_>> {
        let me = memres_core::thread_number();
        let shared = &*self.inner;
        if shared.holder.load(Ordering::Relaxed) == me {
            return Err(to_py(Error::Reentrant, &format!("DeviceBuffer.{what}")));
        }
        let guard = if crate::reentry::in_a_callback() {
            match shared.buffer.try_lock() {
                Ok(guard) => guard,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                // Not re-entrant: the buffer's call is another thread's, and
                // this callback may run under any stack.
                Err(TryLockError::WouldBlock) => {
                    return Err(crate::errors::backend_error(format!(
                        "DeviceBuffer.{what}: held by another thread, in a call of its own; this call \
                         comes from a Python callback under a memres call of this thread, which must not \
                         wait for it (that thread may wait for a lock this thread holds): refused, \
                         nothing changed"
                    )))
                }
            }
        } else {
            shared.buffer.lock().unwrap_or_else(|p| p.into_inner())
        };
        shared.holder.store(me, Ordering::Relaxed);
        Ok(Locked { shared, guard })
    }
}

/// The stack's resource, promised to hand out memory `Engine` may touch.
fn memory_of(mr: &Resource) -> PyResult<AssumeMemoryOf<DynResource<Stream>, Kind>> {
    if !mr.has_bytes {
        return Err(PyValueError::new_err(format!(
            "memres: DeviceBuffer needs memory with bytes behind it; `{}` has none \
             (the simulated device's addresses are made up: use HostMemoryResource)",
            mr.stack
        )));
    }
    let blocks = mr.hold("DeviceBuffer", |m| m.blocks.clone())?;
    // SAFETY: `has_bytes` holds only when every leaf of the stack is a
    // name the stack's builder reports as a leaf of `Engine`'s memory
    // (`StackBuilder::is_leaf_of`), or an upstream object for which the
    // same held. The builder reports only names registered by
    // `register_leaf_of::<Engine>` and not replaced since, whose
    // constructors return a `LeafOf<_, Engine>`: memory of `Engine` by the
    // contract of `AssumeMemoryOf::new`, which `Context::keep_leaf_of`
    // meets from its bound `MemoryOf<Engine>` (host memory here; every CUDA
    // leaf in `memres_cuda::stack`; a snapshot's `Tap` over one, which
    // forwards the bound). The core's algorithms and adaptors between
    // them hand out only parts of their upstreams' blocks (each forwards
    // `MemoryOf` for that reason, as the core's stack names check at
    // compile time, but `BinningResource`, whose bins here are built from
    // the same leaves), and the two layers this crate puts around a stack
    // (`KeepStreams`, and a snapshot's `Tap`) hand out its blocks unchanged
    // and free them only through it.
    Ok(unsafe { AssumeMemoryOf::new(blocks as DynResource<Stream>) })
}

#[pymethods]
impl Buffer {
    /// A buffer of `size` zeroed bytes, or of `data`'s bytes, on `stream`,
    /// whose handle `keeper` keeps valid (held as long as the buffer's
    /// block).
    #[new]
    #[pyo3(signature = (mr, size=0, stream=0, data=None, keeper=None))]
    fn new(
        py: Python<'_>,
        mr: PyRef<'_, Resource>,
        size: u64,
        stream: u64,
        data: Option<&[u8]>,
        keeper: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let resource = memory_of(&mr)?;
        // SAFETY: a handle of the package's Python layer (the module's
        // contract: "Streams at the boundary" in lib.rs).
        let s = unsafe { backend::stream(stream, mr.device)? };
        let engine = backend::engine(mr.device)?;
        let inner = crate::gil::detach(py, || match data {
            Some(bytes) => Inner::from_slice_in(bytes, s, resource, engine),
            None => Inner::new_in(size, s, resource, engine),
        })
        .map_err(|e| container_error(e, "DeviceBuffer"))?;
        Ok(Buffer { inner: DropDetached::of_buffer(Shared::new(inner, keeper), mr.covers.clone()) })
    }

    #[getter]
    fn ptr(&self) -> u64 {
        self.inner.figure(PTR)
    }

    #[getter]
    fn size(&self) -> u64 {
        self.inner.figure(SIZE)
    }

    fn capacity(&self) -> u64 {
        self.inner.figure(CAPACITY)
    }

    /// `size` bytes from `offset` (all from `offset` with no `size`),
    /// copied to the host straight into a new `bytes` (waits for the
    /// stream); past the end, a `ValueError`, as RMM's.
    #[pyo3(signature = (offset=0, size=None))]
    fn copy_to_host<'py>(
        &self,
        py: Python<'py>,
        offset: u64,
        size: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        // The length read now; checked again under the lock, by `read`.
        let n = size.unwrap_or_else(|| self.inner.figure(SIZE).saturating_sub(offset));
        // More than a `bytes` can hold (`Py_ssize_t`) fits in no host.
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| isize::try_from(n).is_ok())
            .ok_or_else(|| container_error(ContainerError::HostOutOfMemory { bytes: n }, "copy_to_host"))?;
        // Nobody else sees the new `bytes` until it is returned, so its
        // memory is this call's to write with the GIL given up.
        PyBytes::new_with(py, n, |out| {
            crate::gil::detach(py, || {
                self.lock("copy_to_host")?.read(offset, out).map_err(|e| container_error(e, "copy_to_host"))
            })
        })
    }

    /// Writes `data` at `offset`; past the end, a `ValueError` naming both
    /// sizes, as RMM's (the container's names the last byte's index).
    #[pyo3(signature = (data, offset=0))]
    fn copy_from_host(&self, py: Python<'_>, data: &[u8], offset: u64) -> PyResult<()> {
        crate::gil::detach(py, || {
            let mut buf = self.lock("copy_from_host")?;
            if offset.checked_add(data.len() as u64).is_none_or(|end| end > buf.len()) {
                let at = if offset == 0 { String::new() } else { format!(" at offset {offset}") };
                return Err(PyValueError::new_err(format!(
                    "memres: copy_from_host: {} bytes{at} into a buffer of {}",
                    data.len(),
                    buf.len()
                )));
            }
            buf.write(offset, data).map_err(|e| container_error(e, "copy_from_host"))
        })
    }

    /// Copies `src`'s bytes to the start of this buffer, ordered after the
    /// work of both streams. The two locks are taken in one order for
    /// every pair (by address), so that copies each way between two
    /// buffers from two threads cannot each hold one lock and wait for
    /// the other.
    fn copy_from_device(&self, py: Python<'_>, src: PyRef<'_, Buffer>) -> PyResult<()> {
        if std::ptr::eq(self, &*src) {
            return Ok(());
        }
        let src: &Buffer = &src;
        crate::gil::detach(py, || {
            let (dst, src) = if std::ptr::from_ref(self) < std::ptr::from_ref(src) {
                let dst = self.lock("copy_from_device")?;
                (dst, src.lock("copy_from_device")?)
            } else {
                let src = src.lock("copy_from_device")?;
                (self.lock("copy_from_device")?, src)
            };
            if src.len() > dst.len() {
                return Err(PyValueError::new_err(format!(
                    "memres: copy_from_device: {} bytes into a buffer of {}",
                    src.len(),
                    dst.len()
                )));
            }
            if src.is_empty() {
                return Ok(());
            }
            let err = |e| to_py(e, "copy_from_device");
            dst.stream().wait(&src.stream().record().map_err(err)?).map_err(err)?;
            // SAFETY: both ranges lie in live blocks of resources that hand
            // out memory the engine may touch (`memory_of`), `src.len()`
            // bytes each (checked above); they are distinct buffers, each
            // holding its block; the destination's stream waits for the
            // source's work above, the source's for the copy below.
            unsafe { dst.engine().copy(dst.addr(), src.addr(), src.len(), dst.stream()) }.map_err(err)?;
            src.stream().wait(&dst.stream().record().map_err(err)?).map_err(err)
        })
    }

    /// Copies `nbytes` at device address `src`, an array's data given by its
    /// `__cuda_array_interface__`, to the start of this buffer, after the
    /// work queued so far on the array's stream (`src_stream`, the
    /// interface's `"stream"`, if it names one, a stream of `src_device`,
    /// the array's device, whose default streams 1 and 2 name), and waits
    /// for the copy, so that the array may go once this returns: RMM's
    /// `copy_from_device` of a CuPy or Numba array. CUDA only: the
    /// simulated backend's buffers are host memory.
    #[pyo3(signature = (src, nbytes, src_device, src_stream=None))]
    fn copy_from_cuda_array(
        &self,
        py: Python<'_>,
        src: u64,
        nbytes: u64,
        src_device: u32,
        src_stream: Option<u64>,
    ) -> PyResult<()> {
        if backend::BACKEND != "cuda" {
            return Err(PyValueError::new_err(
                "memres: copy_from_device: a buffer of the simulated backend copies only a memres DeviceBuffer",
            ));
        }
        // SAFETY: a handle of the package's Python layer (the module's
        // contract: "Streams at the boundary" in lib.rs), used in this call.
        let producer = src_stream.map(|h| unsafe { backend::stream(h, src_device) }).transpose()?;
        crate::gil::detach(py, || {
            let dst = self.lock("copy_from_device")?;
            if nbytes > dst.len() {
                return Err(PyValueError::new_err(format!(
                    "memres: copy_from_device: {nbytes} bytes into a buffer of {}",
                    dst.len()
                )));
            }
            if nbytes == 0 {
                return Ok(());
            }
            let err = |e| to_py(e, "copy_from_device");
            if let Some(producer) = &producer {
                dst.stream().wait(&producer.record().map_err(err)?).map_err(err)?;
            }
            // SAFETY: the destination lies in this buffer's live block,
            // which holds `nbytes` (checked above) of memory the engine may
            // touch (`memory_of`). The source is `nbytes` of device memory
            // by the module's contract for arrays ("Arrays at the boundary"
            // in lib.rs): the Python layer passes only the data pointer and
            // size of a 1-D contiguous array's interface, of an array it
            // holds for the whole call; the copy runs after the producer's
            // stream's work, and is waited for below, before the call
            // returns and the array may be let go.
            unsafe { dst.engine().copy(dst.addr(), src, nbytes, dst.stream()) }.map_err(err)?;
            memres_core::Stream::synchronize(dst.stream()).map_err(err)
        })
    }

    /// Prefetches the bytes to device `to` (the host for `None`) on
    /// `stream` (the buffer's own by default; `device` is the buffer's):
    /// `True` where they are managed memory, `False` (nothing done) where
    /// they do not migrate, as RMM.
    #[pyo3(signature = (device, to, stream=None))]
    fn prefetch(&self, py: Python<'_>, device: u32, to: Option<u32>, stream: Option<u64>) -> PyResult<bool> {
        // SAFETY: a handle of the package's Python layer (the module's
        // contract: "Streams at the boundary" in lib.rs).
        let other = stream.map(|h| unsafe { backend::stream(h, device) }).transpose()?;
        crate::gil::detach(py, || {
            let b = self.lock("prefetch")?;
            if b.is_empty() {
                return Ok(false);
            }
            backend::prefetch(b.addr(), b.len(), device, to, other.as_ref().unwrap_or(b.stream()))
        })
    }

    /// Sets the size (new bytes are zeros); may move the buffer.
    fn resize(&self, py: Python<'_>, size: u64) -> PyResult<()> {
        crate::gil::detach(py, || self.lock("resize")?.resize(size).map_err(|e| container_error(e, "resize")))
    }

    /// Capacity for at least `capacity` bytes; may move the buffer.
    fn reserve(&self, py: Python<'_>, capacity: u64) -> PyResult<()> {
        crate::gil::detach(py, || {
            self.lock("reserve")?.reserve(capacity).map_err(|e| container_error(e, "reserve"))
        })
    }
}
