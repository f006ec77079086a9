//! The current resource of each device, and three C functions over it with
//! the signatures PyTorch's `CUDAPluggableAllocator` takes from this very
//! library: `memres_py_alloc`, `memres_py_free` and, as its reset
//! function, `memres_py_empty_cache`.
//!
//! The resource is kept in the core's per-device registry
//! (`memres_core::device`), so Rust code in the process sees it too. The C
//! functions free by pointer: each device keeps the blocks they handed out,
//! with the resource that made each, so a block goes back to its own
//! resource even after the current one changed.

use crate::backend::{self, Stream, MAX_DEVICES};
use crate::errors::panic_message;
use crate::kept::{self, give_back, Kept};
use crate::reentry::CFrees;
use crate::resource::Resource;
use memres_core::addr_map::AddrMap;
use memres_core::{Block, DynResource, MemoryResource, Request};
use pyo3::prelude::*;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

type Live = Mutex<AddrMap<(Block, DynResource<Stream>)>>;

/// The blocks of `device` that a resource handed out at a live address,
/// at 0 or of another size than asked and refused back (not one it
/// panicked in giving back: see [`mod@kept`]), with that resource: kept here,
/// never lost, and given back again by each [`memres_py_empty_cache`], as
/// the C library's `memres_empty_cache` gives back its own.
fn kept(device: usize) -> Option<&'static Kept> {
    static KEPT: [OnceLock<Kept>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];
    KEPT.get(device).map(|slot| slot.get_or_init(Default::default))
}

fn live(device: usize) -> Option<&'static Live> {
    static LIVE: [OnceLock<Live>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];
    LIVE.get(device).map(|slot| slot.get_or_init(Default::default))
}

/// Makes `mr` the current resource of `device` for the C functions (and
/// Rust code).
#[pyfunction]
pub(crate) fn set_per_device_resource(py: Python<'_>, device: u32, mr: PyRef<'_, Resource>) -> PyResult<()> {
    let blocks = mr.hold("set_per_device_resource", |m| m.blocks.clone())?;
    set(py, device, Arc::new(CFrees(blocks)));
    Ok(())
}

/// What the registry of this module holds for a device whose resource is
/// of the other backend (a simulated one where this is CUDA's, or the
/// reverse): the C functions here refuse to allocate there, rather than
/// serve from a resource that is no longer the device's, or make one.
struct OtherBackend;

impl MemoryResource<Stream> for OtherBackend {
    fn allocate(&self, _request: Request, _stream: &Stream) -> memres_core::Result<Block> {
        Err(memres_core::Error::InvalidConfig { what: backend::OTHER_BACKENDS_RESOURCE })
    }

    fn deallocate(&self, block: Block, _stream: &Stream) -> memres_core::Result<()> {
        // It hands out nothing (a block goes back to its own resource).
        Err(memres_core::Error::UnknownBlock { addr: block.addr() })
    }
}

/// Takes `device`'s resource away from this module's C functions: its
/// resource now is of the other backend. What they allocated before goes
/// back to its own resource, which lives until the last such block is
/// freed.
#[pyfunction]
pub(crate) fn set_other_backend(py: Python<'_>, device: u32) {
    set(py, device, Arc::new(OtherBackend));
}

/// Makes `resource` the registry's entry of `device` (with the GIL
/// released: [`made`]'s lock may be held by a thread that builds a
/// device's default resource, and the resource replaced is dropped here),
/// and forgets a default made before ([`made`]).
fn set(py: Python<'_>, device: u32, resource: DynResource<Stream>) {
    crate::gil::detach(py, || {
        memres_core::device::set_per_device_resource::<Stream>(device, resource);
        // After the registry took the new one: a default made meanwhile
        // is there by now, and one made later finds the new one stored.
        drop(made(device).map(|m| m.lock().unwrap_or_else(|p| p.into_inner()).take()));
    });
}

/// Forgets `device`'s resource in this module's registry, as though none
/// had been set: the C functions (and Rust code) get the device's default
/// on their next use. What they allocated before goes back to its own
/// resource.
#[pyfunction]
pub(crate) fn forget_per_device_resource(py: Python<'_>, device: u32) {
    crate::gil::detach(py, || {
        drop(memres_core::device::global().reset_per_device_resource::<Stream>(device));
        drop(made(device).map(|m| m.lock().unwrap_or_else(|p| p.into_inner()).take()));
    });
}

/// Registers [`default_resource`] as the default of devices nobody set a
/// resource for.
pub(crate) fn install_default() {
    memres_core::device::set_default_factory::<Stream>(default_resource);
}

/// The resource [`default_resource`] made for `device`, until Python takes
/// it as the device's resource object ([`take_default`]) or another is set.
/// Its lock serializes the making: threads that race to make the device's
/// default wait here, and all get the one made first.
fn made(device: u32) -> Option<&'static Mutex<Option<Resource>>> {
    static MADE: [Mutex<Option<Resource>>; MAX_DEVICES] = [const { Mutex::new(None) }; MAX_DEVICES];
    MADE.get(device as usize)
}

/// The resource of a device nobody set one for, made when the C functions
/// (PyTorch's allocator changed without `memres.allocators.torch.use`, or
/// a device `use()` did not configure) or Rust code ask first: the C
/// library's default stack over the backend's leaf
/// ([`backend::c_default_stack`]), or the one [`set_c_default_stack`]
/// set. Python's `get_per_device_resource` then
/// takes it as the device's resource ([`take_default`]), so that the
/// device has one resource for both.
///
/// The registry calls this outside its lock, and keeps the first it gets:
/// threads that race here all hand out that one, so that the stack Python
/// takes is the one that served every block (made once, under [`made`]'s
/// lock; the registry's when one was stored while they waited, even taken
/// by Python since). Nothing is replaced, so nothing is dropped under the
/// lock (a stack's drop may take the GIL).
///
/// A stack that cannot be built is the registry's
/// [`InvalidConfig`](memres_core::Error::InvalidConfig), whose text is
/// fixed: why, in the build's words, is kept for this thread
/// ([`take_default_failure`]), where `memres_py_alloc` says it. Nothing here
/// takes the GIL, the failure's text included ([`Resource::build_plain`]):
/// a call holding it may wait for [`made`]'s lock (`memres_py_alloc` keeps
/// it where no Python function is under any stack), and taken under that
/// lock each waited for the other.
fn default_resource(device: u32) -> memres_core::Result<DynResource<Stream>> {
    let slot = made(device).ok_or(memres_core::Error::InvalidConfig { what: "a device out of range" })?;
    let mut made = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(stored) = memres_core::device::global().existing_per_device_resource::<Stream>(device) {
        return Ok(stored);
    }
    let resource = match &mut *made {
        Some(waiting) => waiting,
        none @ None => none.insert(Resource::build_plain(&default_stack(), device).map_err(|why| {
            // At a thread's exit the slot may be gone: nothing is kept.
            let _ = DEFAULT_FAILURE.try_with(|f| *f.borrow_mut() = Some(why));
            memres_core::Error::InvalidConfig { what: DEFAULT_NOT_BUILT }
        })?),
    };
    Ok(Arc::new(CFrees(resource.blocks.clone())))
}

/// The registry's text for a default stack that could not be built.
const DEFAULT_NOT_BUILT: &str = "the device's default resource could not be built";

thread_local! {
    /// Why this thread's last build of a device's default stack failed
    /// ([`default_resource`]), until taken.
    static DEFAULT_FAILURE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Why this thread's last build of a device's default stack failed, if one
/// did since the last call; forgotten here.
fn take_default_failure() -> Option<String> {
    // At a thread's exit (a free from a key's destructor) the slot may be
    // gone: then there is nothing to say.
    DEFAULT_FAILURE.try_with(|f| f.borrow_mut().take()).ok().flatten()
}

/// The stack set by [`set_c_default_stack`], if any.
static CONFIGURED_DEFAULT: Mutex<Option<String>> = Mutex::new(None);

/// The stack [`default_resource`] builds: the one set by
/// [`set_c_default_stack`], else the C library's
/// ([`backend::c_default_stack`]).
fn default_stack() -> String {
    CONFIGURED_DEFAULT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_else(backend::c_default_stack)
}

/// Sets the stack the C functions build for a device nobody gave a
/// resource, from its next such build on (`None`: the C library's
/// default, `C_DEFAULT_STACK`), as the C library's `memres_configure`
/// does for its own. The text is checked when a device's default is
/// built: a stack that cannot be built fails that allocation, whose
/// `last_error` says why.
#[pyfunction]
#[pyo3(signature = (stack=None))]
pub(crate) fn set_c_default_stack(py: Python<'_>, stack: Option<String>) {
    crate::gil::detach(py, || *CONFIGURED_DEFAULT.lock().unwrap_or_else(|p| p.into_inner()) = stack);
}

/// The resource the C functions made for `device` (nobody had set one),
/// taken out for Python to hold as the device's resource object; `None`
/// if they made none since one was last set.
#[pyfunction]
pub(crate) fn take_default(py: Python<'_>, device: u32) -> Option<Resource> {
    crate::gil::detach(py, || made(device).and_then(|m| m.lock().unwrap_or_else(|p| p.into_inner()).take()))
}

/// Blocks handed out by `memres_py_alloc` on `device` and not yet freed.
#[pyfunction]
pub(crate) fn c_live_count(py: Python<'_>, device: usize) -> usize {
    crate::gil::detach(py, || live(device).map_or(0, |l| l.lock().unwrap_or_else(|p| p.into_inner()).len()))
}

/// Free and total bytes of `device` now, as the driver tells them (RMM's
/// `available_device_memory`).
#[pyfunction]
pub(crate) fn memory_info(py: Python<'_>, device: u32) -> PyResult<(u64, u64)> {
    crate::gil::detach(py, || backend::memory_info(device))
}

/// The device whose memory `addr` lies in (an array's data pointer), as
/// the driver tells it; `None` where the driver does not know the address.
#[cfg(feature = "cuda")]
#[pyfunction]
pub(crate) fn pointer_device(py: Python<'_>, addr: u64) -> Option<u32> {
    crate::gil::detach(py, || backend::pointer_device(addr))
}

/// Waits until the work queued so far on the stream of `handle` (of
/// `device`) has finished: RMM's `Stream.synchronize()`.
#[pyfunction]
pub(crate) fn synchronize_stream(py: Python<'_>, handle: u64, device: u32) -> PyResult<()> {
    crate::gil::detach(py, || {
        // SAFETY: a handle of the package's Python layer (the module's
        // contract: "Streams at the boundary" in lib.rs), used for this
        // call only.
        let stream = unsafe { backend::stream(handle, device)? };
        memres_core::Stream::synchronize(&stream).map_err(|e| crate::errors::to_py(e, "synchronize"))
    })
}

/// The handle of `device`'s default driver memory pool
/// (`cudaDeviceGetDefaultMemPool`), for RMM's async view resource, or with
/// `managed` of its default pool of managed memory (CUDA 13), for RMM's
/// async managed resource.
#[pyfunction]
#[pyo3(signature = (device, managed=false))]
pub(crate) fn default_memory_pool(py: Python<'_>, device: u32, managed: bool) -> PyResult<u64> {
    crate::gil::detach(py, || backend::default_memory_pool(device, managed))
}

/// Bytes held from `device` by every leaf this module built, and reserved
/// by the driver's pools under its `async` leaves: `(now, peak, total,
/// reserved now, reserved peak)`.
#[pyfunction]
pub(crate) fn device_bytes(device: u32) -> PyResult<(u64, u64, u64, u64, u64)> {
    let g = backend::gauge(device)?;
    let (reserved, peak_reserved) = backend::driver_reserved(device);
    Ok((g.value(), g.peak(), g.total(), reserved, peak_reserved))
}

/// Why the last call of [`memres_py_alloc`] or [`memres_py_free`] that
/// failed failed (or the last give-back of a kept block that
/// [`memres_py_empty_cache`] was refused): PyTorch's `CUDAPluggableAllocator` does not check for
/// NULL (it makes a tensor of it), and a free returns nothing, so the
/// reason is kept for Python to read. One for the process: the backward
/// pass allocates on PyTorch's autograd threads, and Python reads the
/// reason on its own.
static LAST_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// Keeps `why` as the reason of the last failed call.
fn set_last_error(why: String) {
    *LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
}

/// The reason the last failed call of [`memres_py_alloc`] or
/// [`memres_py_free`] failed, `None` if none has; `clear` forgets it.
#[pyfunction]
#[pyo3(signature = (clear=false))]
pub(crate) fn last_error(py: Python<'_>, clear: bool) -> Option<String> {
    crate::gil::detach(py, || {
        let mut last = LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner());
        if clear {
            last.take()
        } else {
            last.clone()
        }
    })
}

/// [`memres_py_alloc`]'s work.
///
/// # Safety
///
/// `stream` as [`memres_py_alloc`]'s.
unsafe fn alloc(size: isize, device: i32, stream: *mut c_void) -> Result<*mut c_void, String> {
    let size = u64::try_from(size).map_err(|_| "a negative size")?;
    let d = u32::try_from(device).map_err(|_| "a negative device")?;
    // Before allocating: a block with no table would never be freed.
    let table = live(d as usize).ok_or("a device out of range")?;
    drop(take_default_failure()); // another call's, on this thread
    let resource = memres_core::device::get_per_device_resource::<Stream>(d).map_err(|e| match e {
        memres_core::Error::InvalidConfig { what: DEFAULT_NOT_BUILT } => match take_default_failure() {
            Some(why) => format!("{e}: {why}"),
            None => e.to_string(),
        },
        _ => e.to_string(),
    })?;
    // SAFETY: null or a stream of `device` valid for the call (the contract).
    let s = unsafe { backend::stream(stream as usize as u64, d) }.map_err(|e| e.to_string())?;
    let request = Request::new(size).map_err(|e| e.to_string())?;
    let block = resource.allocate(request, &s).map_err(|e| e.to_string())?;
    record(table, kept(d as usize).ok_or("a device out of range")?, &resource, block, size, &s)?;
    Ok(block.addr() as usize as *mut c_void)
}

/// Records `block`, just handed out by `resource` on `s`, in `table`. At
/// an address that is live already (two resources whose ranges overlap,
/// or one that handed it out twice) the older block stays freeable, and
/// the new one goes back through the stack it came from: an error. So does
/// a block at address 0 (the empty block included): the caller would take
/// it for NULL, a failure, and never free it; and one of another size than
/// the `asked` bytes: one shorter would be written past its end, one longer
/// is recorded at its own size, so the caller's free of the size it asked
/// for would be refused and the block stay live for good. If `resource`
/// refuses it (not if it panics: [`kept::refuse`]), it is kept in `kept`
/// for the device's next [`memres_py_empty_cache`] to give back, once `s`
/// is done with what it ordered before (that gives back on the device's
/// default stream). As the C library's.
fn record(
    table: &Live,
    kept: &Kept,
    resource: &DynResource<Stream>,
    block: Block,
    asked: u64,
    s: &Stream,
) -> Result<(), String> {
    let what = if let Some(misfit) = kept::misfit(block, asked, "which C takes for NULL") {
        misfit
    } else {
        let mut entries = table.lock().unwrap_or_else(|p| p.into_inner());
        let Some(older) = entries.insert(block.addr(), (block, resource.clone())) else { return Ok(()) };
        let older_size = older.0.size();
        entries.insert(block.addr(), older);
        format!("{:#x}, a live address (of a block of {older_size} bytes)", block.addr())
    };
    let (back, _) = kept::refuse(kept, &**resource, resource, block, s, "memres_py_empty_cache");
    Err(format!("the resource handed out {what}: {back}"))
}

/// [`memres_py_free`]'s work.
///
/// # Safety
///
/// `stream` as [`memres_py_free`]'s.
unsafe fn free(ptr: *mut c_void, size: isize, device: i32, stream: *mut c_void) -> Result<(), String> {
    let unknown = || "not allocated here, or freed already".to_string();
    let d = u32::try_from(device).map_err(|_| unknown())?;
    let table = live(d as usize).ok_or_else(unknown)?;
    // SAFETY: null or a stream of `device` valid for the call, and for a
    // deferred free until it is applied (the contract).
    let s = unsafe { backend::stream(stream as usize as u64, d) }.map_err(|e| format!("the stream: {e}"))?;
    let (block, resource) = {
        let mut entries = table.lock().unwrap_or_else(|p| p.into_inner());
        let addr = ptr as usize as u64;
        let allocated = entries.get(addr).ok_or_else(unknown)?.0.size();
        // A negative size skips the check, as the C library's free does.
        if size >= 0 && size as u64 != allocated {
            return Err(format!("freed with size {size}, allocated with {allocated}"));
        }
        entries.remove(addr).ok_or_else(unknown)?
    };
    // SAFETY: `s` is the stream its caller keeps valid until a free
    // deferred on it is applied (the contract).
    let resource = unsafe { crate::reentry::vouched_for(&s, || free_taken(table, block, resource, &s)) }?;
    // The last block of a stack no longer current: the stack goes with it.
    crate::callback::drop_saying_what_raised(resource);
    Ok(())
}

/// Frees `block`, just taken out of `table`, to `resource` on `s`, and
/// hands the resource back. If the free fails, the block goes back in the
/// table: the stack still holds it, and the caller may free again (not over
/// a newer block: a free that freed and then failed may have let another
/// thread get the address since). A free that panics is left to the stack,
/// which may have freed the block first: nothing puts it back.
fn free_taken(
    table: &Live,
    block: Block,
    resource: DynResource<Stream>,
    s: &Stream,
) -> Result<DynResource<Stream>, String> {
    match resource.deallocate(block, s) {
        Ok(()) => Ok(resource),
        Err(e) => {
            let mut entries = table.lock().unwrap_or_else(|p| p.into_inner());
            if entries.get(block.addr()).is_none() {
                entries.insert(block.addr(), (block, resource));
            }
            Err(e.to_string())
        }
    }
}

/// Runs `f`, with the GIL released if this thread holds it: a stack's lock
/// may be held by a thread in a Python callback, which waits for the GIL
/// (PyTorch frees a tensor's storage holding the GIL). Never takes the
/// GIL for a thread that does not hold it. Without Python callbacks no
/// lock's holder waits for the GIL, and the release is skipped.
fn without_gil<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    extern "C" {
        // CPython's API since 3.4 (not the limited API, so not in
        // `pyo3::ffi` under abi3), exported by every interpreter since.
        fn PyGILState_Check() -> std::ffi::c_int;
    }
    if !crate::callback::python_under_stacks() {
        // No Python runs under it: nothing for the exit to wait for.
        return crate::gil::in_a_call(f);
    }
    // SAFETY: `PyGILState_Check` takes nothing and may be called from any
    // thread at any time; this library is loaded by the interpreter that
    // defines it.
    if unsafe { PyGILState_Check() } == 1 {
        Python::attach(|py| crate::gil::detach(py, f))
    } else {
        // Once the exit has begun, it runs no Python (a callback under it
        // that calls memres again still runs: this call may hold a stack's
        // lock).
        crate::gil::without_the_gil(f)
    }
}

/// Allocates `size` bytes from `device`'s current resource on `stream`;
/// NULL when that fails (or for 0 bytes), the reason kept for
/// `last_error`. Never unwinds.
///
/// # Safety
///
/// `stream` is null or a stream of `device` valid for the call.
#[no_mangle]
pub unsafe extern "C" fn memres_py_alloc(size: isize, device: i32, stream: *mut c_void) -> *mut c_void {
    if size == 0 {
        // An empty tensor's: no memory, and nothing failed.
        return std::ptr::null_mut();
    }
    let failed = |why: String| {
        set_last_error(format!(
            "memres_py_alloc({size} bytes, device {device}): {}",
            naming_what_raised(why)
        ));
        std::ptr::null_mut()
    };
    // Pointers cross `without_gil` as integers: they are not `Send`.
    let stream = stream as usize;
    let outer = OuterRaised::take();
    // SAFETY: `stream` as this function's contract says.
    let ptr = match guarded(|| unsafe { alloc(size, device, stream as *mut c_void) }.map(|p| p as usize)) {
        Ok(ptr) => ptr as *mut c_void,
        Err(why) => failed(why),
    };
    outer.put_back();
    ptr
}

/// Runs `f` without the GIL ([`without_gil`]); a panic there is the error
/// "a panic", with its message if it has one. Never unwinds.
fn guarded<T: Send>(f: impl FnOnce() -> Result<T, String> + Send) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(|| without_gil(f))).unwrap_or_else(|payload| {
        Err(panic_message(payload).map_or_else(|| "a panic".to_string(), |m| format!("a panic ({m})")))
    })
}

/// The exception of a Python function that an earlier call on this thread
/// left (`callback::take_raised`), held out while a C function runs: the
/// error of a call this one runs inside (a failure callback's
/// `gc.collect()` freeing a tensor) may be behind it, and one that a
/// finished call recovered from is no part of this call's reason
/// ([`naming_what_raised`]).
struct OuterRaised(Option<PyErr>);

impl OuterRaised {
    fn take() -> OuterRaised {
        OuterRaised(crate::callback::take_raised())
    }

    /// Puts it back, dropping what this call's functions raised.
    fn put_back(self) {
        crate::callback::restore_raised(self.0);
    }
}

/// Frees `ptr`, from `memres_py_alloc` on `device`, on `stream`. A free
/// that fails changes nothing (a pointer not from there, a `size` that is
/// not the allocation's, one whose free the stack refused: it stays live),
/// and its reason is kept for `last_error`; NULL is ignored, and a negative
/// `size` is not checked. Never unwinds. Called from inside a Python
/// callback under the block's stack (a failure callback's `gc.collect()`
/// that frees a tensor), the free is applied once the outermost call of
/// memres in progress on this thread returns.
///
/// # Safety
///
/// `stream` is null or a stream of `device` valid for the call (and, for
/// a free so deferred, until it is applied); no work that is not ordered
/// before the free on `stream` uses the memory.
#[no_mangle]
pub unsafe extern "C" fn memres_py_free(ptr: *mut c_void, size: isize, device: i32, stream: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    // Pointers cross `without_gil` as integers: they are not `Send`.
    let (addr, stream) = (ptr as usize, stream as usize);
    let outer = OuterRaised::take();
    // SAFETY: `stream` as this function's contract says.
    if let Err(why) = guarded(|| unsafe { free(addr as *mut c_void, size, device, stream as *mut c_void) }) {
        set_last_error(format!("memres_py_free({addr:#x}, device {device}): {}", naming_what_raised(why)));
    }
    outer.put_back();
}

/// `why`, the reason a call of the C functions failed, naming what a
/// Python function of the call raised: a failure callback's exception, or
/// that of a `CallbackMemoryResource`'s function behind the call's error
/// (`callback::take_raised`). The caller gets NULL or nothing, so the
/// exception is said where Python says one it cannot raise, but once the
/// exit has begun on a thread that may not take the GIL then
/// ([`gil::may_take_the_gil`](crate::gil::may_take_the_gil)): the
/// finalization that follows could end the thread inside this call. This
/// runs outside the call's `catch_unwind`, so it has one of its own (the
/// interpreter may be finalizing): the reason alone if it panics.
fn naming_what_raised(why: String) -> String {
    let named = catch_unwind(AssertUnwindSafe(|| {
        // Both taken: neither is any part of a later call.
        let failure = crate::callback::take_failure_raised();
        let function = crate::callback::take_raised();
        let (raised, said) = match (failure, function) {
            (Some(raised), _) => (raised, "the failure callback raised "),
            (None, Some(raised)) => (raised, ""),
            (None, None) => return why.clone(),
        };
        if !crate::gil::may_take_the_gil() {
            let who = if said.is_empty() { "a Python function" } else { "the failure callback" };
            return format!("{why} ({who} raised; not said: the interpreter exits)");
        }
        Python::attach(|py| {
            let named = format!("{why} ({said}{})", crate::errors::said(py, &raised));
            raised.write_unraisable(py, None);
            named
        })
    }));
    named.unwrap_or_else(|payload| {
        panic_message(payload);
        why
    })
}

/// Gives back the blocks each device keeps ([`kept()`]): [`give_back_kept_of`]
/// for every device, as `memres_py_empty_cache`. Never unwinds.
fn give_back_kept() {
    for d in 0..MAX_DEVICES {
        give_back_kept_of(d, "memres_py_empty_cache");
    }
}

/// Gives back the blocks `device` keeps ([`kept()`]), on its default stream;
/// why one was refused is kept for `last_error`, said as `caller`'s. Never
/// unwinds.
fn give_back_kept_of(d: usize, caller: &str) {
    let Some(kept) = kept(d).filter(|k| !k.lock().unwrap_or_else(|p| p.into_inner()).is_empty()) else {
        return;
    };
    let outer = OuterRaised::take();
    let given = guarded(|| {
        let s = backend::default_stream(d as u32).map_err(|e| format!("the default stream: {e}"))?;
        // SAFETY: `s` is the legacy default stream of the device's primary
        // context, which the package keeps for the process (`backend`), so
        // it is valid when a give-back deferred on it (a call from inside a
        // callback) is applied.
        unsafe {
            crate::reentry::vouched_for(&s, || give_back(kept, &s, crate::callback::drop_saying_what_raised))
        }
    });
    if let Err(why) = given {
        set_last_error(format!(
            "{caller}: device {d}: giving back a block kept since its resource handed it out at a live \
             address, at 0 or of another size than asked: {}",
            naming_what_raised(why)
        ));
    }
    outer.put_back();
}

/// Gives back the blocks the C functions keep for `device` (see
/// [`memres_py_empty_cache`]), as `torch.cuda.empty_cache()` does first:
/// for `memres.allocators.torch.empty_cache()`. One refused again stays
/// kept, and why is kept for `last_error`.
#[pyfunction]
pub(crate) fn give_back_c_kept(device: usize) {
    give_back_kept_of(device, "memres.allocators.torch.empty_cache");
}

/// Gives back what the pools of every device's current resource keep free,
/// through `memres.allocators.torch._empty_caches`: the reset function that
/// `memres.allocators.torch` gives PyTorch's `CUDAPluggableAllocator`, so
/// that `torch.cuda.empty_cache()` reaches memres. Takes the GIL (PyTorch
/// calls it holding it). Never unwinds; does nothing once the interpreter
/// is gone, nor once the exit has begun on a thread that may not take the
/// GIL then (`gil::may_take_the_gil`): the finalization that follows could
/// end the thread inside this call. An error is reported as Python reports
/// one it cannot raise (`sys.unraisablehook`). First it gives back the
/// blocks kept since a resource handed them out at a live address (or 0,
/// or of another size than asked) and refused them back (`Kept`); those
/// still refused stay kept, and the reason is kept for `last_error`.
#[no_mangle]
pub extern "C" fn memres_py_empty_cache() {
    // SAFETY: `Py_IsInitialized` may be called at any time, from any thread.
    if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 || !crate::gil::may_take_the_gil() {
        return;
    }
    give_back_kept();
    let emptied = catch_unwind(|| {
        Python::attach(|py| {
            let result = py.import("memres.allocators.torch").and_then(|m| m.call_method0("_empty_caches"));
            if let Err(e) = result {
                e.write_unraisable(py, None);
            }
        })
    });
    if let Err(payload) = emptied {
        panic_message(payload);
    }
}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    use super::*;
    use crate::kept::testing::OneAddress;
    use std::sync::atomic::Ordering;

    /// A block at address 0 would reach the caller as NULL, which it takes
    /// for a failure and never frees: it is refused and given back, with
    /// a message, and nothing is left live.
    #[test]
    fn a_block_at_address_zero_is_refused_and_given_back() {
        let (table, resource) = (Live::default(), Arc::new(OneAddress::default()));
        let handing: DynResource<Stream> = resource.clone();
        for handed in [Block::new(0, 256, 7), Block::EMPTY] {
            let err = record(&table, &Kept::default(), &handing, handed, 256, &()).unwrap_err();
            assert!(err.contains("address 0"), "{err}");
            assert!(err.contains("it was given back"), "{err}");
            assert_eq!(resource.back.lock().unwrap().pop(), Some(handed));
        }
        assert_eq!(table.lock().unwrap().len(), 0, "nothing live");
    }

    /// A block of another size than asked: one shorter would be written
    /// past its end, one longer recorded at its own size, so the caller's
    /// free of the size it asked for would be refused and the block stay
    /// live for good. Either is refused as a block at address 0 is.
    #[test]
    fn a_block_of_another_size_than_asked_is_refused_and_given_back() {
        let (table, resource) = (Live::default(), Arc::new(OneAddress::default()));
        let handing: DynResource<Stream> = resource.clone();
        for (size, what) in [(256, "shorter than asked"), (1024, "longer than asked")] {
            let handed = Block::new(0x1000, size, 7);
            let err = record(&table, &Kept::default(), &handing, handed, 512, &()).unwrap_err();
            let said = format!("a block of {size} bytes at 0x1000 for a request of 512: {what}");
            assert!(err.contains(&said) && err.contains("it was given back"), "{err}");
            assert_eq!(resource.back.lock().unwrap().pop(), Some(handed));
        }
        assert_eq!(table.lock().unwrap().len(), 0, "nothing live");
    }

    /// A free the stack refuses puts the block back in the table, for the
    /// caller to free again; one that panics leaves it to the stack, which
    /// may have freed it before the panic (before, it was put back, and a
    /// second free of a block the stack had freed reached the stack).
    #[test]
    fn a_free_the_stack_refuses_puts_the_block_back_and_one_that_panics_does_not() {
        let table = Live::default();
        let resource = Arc::new(OneAddress { addr: 0x1000, ..Default::default() });
        let handing: DynResource<Stream> = resource.clone();
        let block = Block::new(0x1000, 512, 7);
        let live = |table: &Live| table.lock().unwrap().get(0x1000).map(|e| e.0);
        resource.refusing.store(true, Ordering::Relaxed);
        assert!(free_taken(&table, block, handing.clone(), &()).map(drop).unwrap_err().contains("refused"));
        assert_eq!(live(&table), Some(block), "put back");
        let (taken, _) = table.lock().unwrap().remove(0x1000).unwrap();
        resource.refusing.store(false, Ordering::Relaxed);
        resource.panicking.store(true, Ordering::Relaxed);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            free_taken(&table, taken, handing.clone(), &()).map(drop)
        }));
        assert!(r.is_err());
        assert_eq!(live(&table), None, "left to the stack");
    }

    /// A block the stack refuses back is kept with its resource, not lost,
    /// and the error says so; a later give-back (what each
    /// `memres_py_empty_cache` does first) frees it. One whose give-back
    /// panics is left to the stack, which may have taken it first: kept,
    /// a later give-back would free it twice.
    #[test]
    fn a_block_whose_give_back_is_refused_is_kept_and_one_whose_give_back_panics_is_not() {
        let (table, kept) = (Live::default(), Kept::default());
        let resource = Arc::new(OneAddress { addr: 0x1000, ..Default::default() });
        let handing: DynResource<Stream> = resource.clone();
        let older = Block::new(0x1000, 512, 7);
        assert_eq!(record(&table, &kept, &handing, older, older.size(), &()), Ok(()));
        resource.refusing.store(true, Ordering::Relaxed);
        let refused = Block::new(0x1000, 256, 7);
        let err = record(&table, &kept, &handing, refused, refused.size(), &()).unwrap_err();
        assert!(err.contains("a live address") && err.contains("refused") && err.contains("kept"), "{err}");
        resource.refusing.store(false, Ordering::Relaxed);
        resource.panicking.store(true, Ordering::Relaxed);
        let panicked = Block::new(0, 128, 7);
        let err = record(&table, &kept, &handing, panicked, panicked.size(), &()).unwrap_err();
        assert!(
            err.contains("address 0") && err.contains("a panic (a free that panics); left to the resource"),
            "{err}"
        );
        assert!(!err.contains("kept"), "{err}");
        let blocks = || kept.lock().unwrap().iter().map(|(b, _)| *b).collect::<Vec<_>>();
        assert_eq!(blocks(), [refused], "the refused one kept, not lost");
        // Still refused: kept again, and the refusal said.
        resource.panicking.store(false, Ordering::Relaxed);
        resource.refusing.store(true, Ordering::Relaxed);
        assert!(give_back(&kept, &(), drop).unwrap_err().contains("refused"));
        assert_eq!(blocks(), [refused]);
        // A give-back that panics leaves it to the resource.
        resource.refusing.store(false, Ordering::Relaxed);
        resource.panicking.store(true, Ordering::Relaxed);
        assert!(give_back(&kept, &(), drop).unwrap_err().contains("left to the resource"));
        assert!(blocks().is_empty());
        assert!(resource.back.lock().unwrap().is_empty(), "never given back twice");
        assert_eq!(table.lock().unwrap().get(0x1000).map(|e| e.0), Some(older), "the older block stays");
    }
}
