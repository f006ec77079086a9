//! memres as a C library (`libmemres.so`): the allocator of PyTorch and
//! CuPy, over the CUDA backend.
//!
//! | C function | what it does |
//! | --- | --- |
//! | `void* memres_alloc(ssize_t size, int device, cudaStream_t stream)` | allocates from `device`'s stack on `stream`; NULL when out of memory (or on any error) |
//! | `void memres_free(void* ptr, ssize_t size, int device, cudaStream_t stream)` | frees on `stream`; a bad free is recorded, never fatal |
//! | `int memres_configure(const char* stack)` | sets the stack of every device, before any is used; non-zero for a bad stack, or once a device was used |
//! | `int memres_stats(int device, memres_stats_t* out)` | the figures of a device's stack |
//! | `size_t memres_last_error(char* buf, size_t len)` | the calling thread's latest error message |
//! | `size_t memres_stack(int device, char* buf, size_t len)` | the stack a device runs |
//! | `int memres_step(int device, cudaStream_t stream)` | marks the start of a step (a training iteration) for the `planned` layers of a device's stack |
//! | `int memres_steps(int device, memres_steps_t* out)` | what the `planned` layers of a device's stack have done, summed over them |
//! | `int64_t memres_release(int device, cudaStream_t stream)` | gives back what the pools of a device's stack keep free, once the device is done |
//! | `void memres_empty_cache(void)` | `memres_release` of every device used: the reset function of PyTorch's pluggable allocator, for `torch.cuda.empty_cache()` |
//! | `int memres_flush(void)` | writes out the buffers of `log` adaptors (also done at exit) |
//! | `int memres_snapshot(const char* path)` | writes a snapshot for PyTorch's memory viewer, with `MEMRES_SNAPSHOT=1` ([`snapshot`]) |
//!
//! `alloc` and `free` have the signatures PyTorch's
//! `torch.cuda.memory.CUDAPluggableAllocator` loads; the header is
//! `include/memres.h`.
//!
//! # The stack of a device
//!
//! Each device gets its own resource, built the first time the device is
//! used, from the stack description (`stats(pool(async, per_stream=true, initial=1GiB))`,
//! see [`memres_core::stack`]) set by `memres_configure`, else the
//! environment variable `MEMRES_STACK` as it is then, else
//! [`DEFAULT_STACK`]. `MEMRES_STACK` is checked as `memres_configure`
//! checks its stack, before the device is touched: a malformed one fails
//! the call with a message naming the variable. The CUDA leaves are `async`, `cuda`, `managed` and
//! `vmm` ([`memres_cuda::stack`]); every leaf counts the bytes it holds
//! (`vmm`: the bytes it has mapped, see [`VmmConfig`](memres_cuda::stack::VmmConfig)),
//! so `memres_stats` reports the bytes held from the device whatever the
//! stack.
//!
//! When the environment variable `MEMRES_LOG_FILE` ([`LOG_FILE_VAR`](memres_core::stack::LOG_FILE_VAR), RMM's
//! `RMM_LOG_FILE`) names a file, the stack of each device is wrapped in the
//! logging adaptor, writing RMM's CSV format to that name with `.dev<N>`
//! before its extension (`trace.csv`: `trace.dev0.csv`, as RMM's Python
//! names per-device logs), flushed as the `log` adaptors are
//! ([`memres_core::stack::log_from_env`]), and written out before a
//! `fork` (a child's exit writes none of the parent's rows again).
//! `memres_configure` checks the
//! name (a missing directory, a directory or a name ending with `/`, white
//! space around it, a read-only file: -1 with a message naming the
//! variable); a file that cannot be made is the error
//! of the device's first call (NULL with that message), never an abort.
//! A `log(..., file=)` in the stack is built for each device: a file that
//! a live log of the process writes is refused the same way (`Logging::to_file`),
//! so a second device never cuts the first one's rows.
//!
//! The built resource is also set as the device's resource in
//! [`memres_core::device`]'s registry, so Rust code in the same process
//! shares it; the C functions themselves find it in a fixed array of
//! per-device cells (one atomic load) rather than through the registry's
//! lock, map lookup and reference count on every call.
//!
//! # Frees by address
//!
//! A C caller frees with a pointer; the resources want the [`Block`] they
//! handed out, tag included. Each device keeps its live blocks in a sharded
//! hash table ([`table::Table`]), filled by `memres_alloc` and emptied by
//! `memres_free`, so a free costs one hash lookup under an uncontended lock
//! and then frees with the real tag: O(1) in the pool, where an address-only
//! free walks the chunk, and accepted by the stream-ordered layer, which
//! refuses address-only frees. A pointer not in the table (never allocated
//! here, or freed already) is refused before it reaches a resource. A
//! pointer freed twice is refused only while its address is not handed
//! out again: the pools hand a freed address out at once, and a pointer
//! names no owner, so a late second free of the same size frees the newer
//! block (as it would through `cudaFree` or PyTorch's allocator).
//!
//! A free by address alone costs more the more blocks are live in the
//! chunk; a table lookup does not (the `free_by_address` example measures
//! both; the figures are in the repository's `docs/measurements.md`).
//!
//! # Streams
//!
//! The stream is the caller's `cudaStream_t`, named by a borrowed
//! [`CudaStream`] for the call only, and it is a stream of the call's
//! device: null, `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD` name that
//! device's default streams in its primary context, whatever context the
//! calling thread has current (none, or another device's); any other
//! handle is a stream of the device's primary context (as the CUDA
//! runtime's, PyTorch's and CuPy's streams are), valid for the call. The
//! per-stream pools keep events recorded on it after the call, and memres
//! keeps the primary contexts alive, so those events stay valid.
//!
//! The default stack, `stats(pool(cuda, per_stream=true, growth=32,
//! granule=2MiB))`, is stream-ordered as PyTorch's own allocator and
//! RMM's pool are: each stream has a pool of its own
//! ([`memres_core::per_stream`]); a block freed on a stream is reused on
//! that stream at once, and reaches another
//! stream only once that stream is ordered after the free (it waits on an
//! event recorded after it; a block freed on another stream than its
//! allocation's is reused by its own stream only after a wait on the freeing
//! stream). Memory moves between streams as whole free chunks; on out of
//! memory the device is synchronized and every stream's free chunks go
//! back. No stream handle is kept past the call, so streams may be
//! destroyed at any time; a stream whose handle is reused by a new stream
//! after it is destroyed is taken for the same stream (synchronize a stream
//! before destroying it when that may happen, as with PyTorch's and RMM's
//! pools). A pluggable allocator never sees PyTorch's `record_stream`: a
//! tensor used on a side stream must be freed only once that use is ordered
//! before the free on its stream.
//!
//! A stack whose pool ignores streams (`pool(async)`, `pool(cuda)`, `vmm`)
//! hands a freed block to the next request whatever its stream: right only
//! when the program works on one stream or frees a block only once every
//! stream is done with it. `vmm` also gives memory back to the device: it
//! unmaps only after synchronizing the stream of the call in progress,
//! which makes that safe under the same condition (see
//! [`VmmPool`](memres_cuda::stack::VmmPool)). With `per_stream=true`
//! (`pool(cuda, per_stream=true)`, `vmm(per_stream=true)`) each stream has
//! a pool of its own and the stack is stream-ordered (see
//! [`VmmPools`](memres_cuda::stack::VmmPools)).
//!
//! The `sim`, `host` and `vpool` names of `memres-sim` and the CUDA
//! crate's `pinned` are refused here ([`leaves::refuse_host_leaves`]):
//! their pointers are not device memory.
//!
//! # Errors
//!
//! No Rust panic crosses into C: every entry point catches unwinding and
//! turns it into an error return with a message. Out of memory is NULL
//! from `memres_alloc`; the message says how much was asked and what the
//! stack held. (PyTorch's `CUDAPluggableAllocator`, in the versions read
//! while writing this, stores the pointer without checking it: a NULL
//! there surfaces as a failing kernel rather than PyTorch's out-of-memory
//! error.)
//!
//! # Examples
//!
//! The same functions from Rust (without a GPU the allocation fails and
//! says why):
//!
//! ```
//! use std::ffi::CString;
//! let stack = CString::new("stats(pool(async))").unwrap();
//! // SAFETY: a valid NUL-terminated string.
//! assert_eq!(unsafe { memres::memres_configure(stack.as_ptr()) }, 0);
//! // SAFETY: the null stream is the legacy default stream.
//! let p = unsafe { memres::memres_alloc(1 << 20, 0, std::ptr::null_mut()) };
//! if p.is_null() {
//!     assert!(!memres::last_error().is_empty());
//! } else {
//!     // SAFETY: `p` came from memres_alloc with this size and device.
//!     unsafe { memres::memres_free(p, 1 << 20, 0, std::ptr::null_mut()) };
//! }
//! ```
#![warn(missing_docs)]

mod devices;
pub mod leaves;
pub mod snapshot;
pub mod table;

pub use devices::{configure, flush, stack};
use memres_core::planned::{Planned, Steps};
use memres_core::{Block, MemoryResource, Request, Stream};
use memres_cuda::{sys, CudaStream, Device};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use table::{Stranded, Table};

/// The stack a device runs when neither `memres_configure` nor
/// `MEMRES_STACK` names one: a pool per stream (see *Streams*) over
/// `cuMemAlloc`, growing by 1/32 of what it holds in 2 MiB steps. Over
/// `cuMemAllocAsync` the driver's own pool reserves in larger units and
/// keeps what the pool gives back until the next synchronization; the
/// figures behind the choice are in the repository's
/// `docs/measurements.md`.
pub const DEFAULT_STACK: &str = "stats(pool(cuda, per_stream=true, growth=32, granule=2MiB))";

/// The environment variable read when a device is first used.
pub const STACK_VAR: &str = "MEMRES_STACK";

/// Device ids `0..MAX_DEVICES` are served.
pub const MAX_DEVICES: usize = 64;

/// The figures `memres_stats` reports (`memres_stats_t` in C). All are
/// bytes unless named counts.
///
/// # Examples
///
/// ```
/// let s = memres::MemresStats::default();
/// assert_eq!(std::mem::size_of_val(&s), 13 * 8);
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemresStats {
    /// Bytes live now, per the outermost `stats` adaptor (0 without one).
    pub bytes_current: i64,
    /// The most bytes live at once, per `stats`.
    pub bytes_peak: i64,
    /// Bytes ever allocated, per `stats`.
    pub bytes_total: i64,
    /// Live allocations now, per `stats`.
    pub count_current: i64,
    /// The most live allocations at once, per `stats`.
    pub count_peak: i64,
    /// Allocations ever made, per `stats`.
    pub count_total: i64,
    /// Bytes the CUDA leaves hold from the device now.
    pub upstream_current: i64,
    /// The most bytes the leaves held at once: the footprint's numerator.
    pub upstream_peak: i64,
    /// Bytes the leaves ever took.
    pub upstream_total: i64,
    /// Bytes the driver pools of `async` leaves have reserved now, each
    /// pool once (two leaves may view the device's default pool).
    pub reserved_current: i64,
    /// The sum of each of those pools' most reserved bytes.
    pub reserved_peak: i64,
    /// Blocks handed out by `memres_alloc` and not yet freed.
    pub live_blocks: i64,
    /// 1 when the stack has a `stats` adaptor (the first six figures are
    /// its), else 0.
    pub has_stats: i64,
}

/// What the `planned` layers of a device's stack have done, summed over
/// them (`memres_steps_t`; see `memres_core::planned::Steps`): whether a
/// training loop is being laid out. Counts, and bytes where named.
///
/// # Examples
///
/// ```
/// let s = memres::MemresSteps::default();
/// assert_eq!(std::mem::size_of_val(&s), 6 * 8);
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemresSteps {
    /// Calls of `memres_step`.
    pub steps: i64,
    /// Steps served from a plan from their first allocation to their end.
    pub followed: i64,
    /// Plans made, each from a step that repeated the one before it.
    pub plans: i64,
    /// Allocations served from the plans' regions.
    pub planned_allocations: i64,
    /// Bytes of the steps' regions held now.
    pub region: i64,
    /// Bytes of the regions of blocks carried into the next step held now.
    pub carry_region: i64,
}

// Per thread, as `errno` and `cudaGetLastError`: a thread reads the error
// of its own failed call, never one another thread made since.
thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn set_error(message: String) {
    // A call from a thread's destructors, after its slot is gone, keeps no message.
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = message);
}

/// The latest error message of this thread ("" when there was none): the
/// Rust form of `memres_last_error`.
pub fn last_error() -> String {
    LAST_ERROR.try_with(|e| e.borrow().clone()).unwrap_or_default()
}

/// Runs an entry point: an `Err` or a panic is recorded and becomes `fallback`.
pub(crate) fn guard<T>(fallback: T, f: impl FnOnce() -> Result<T, String>) -> T {
    caught(f).unwrap_or_else(|message| {
        set_error(message);
        fallback
    })
}

/// `f`'s answer, a panic of it turned into an error message.
fn caught<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|payload| Err(format!("memres: internal error (panic: {})", panic_said(payload))))
}

/// What a panic's payload says; the payload is leaked, as dropping it
/// could itself panic.
fn panic_said(payload: Box<dyn std::any::Any + Send>) -> String {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown".into());
    std::mem::forget(payload);
    what
}

fn device_index(device: c_int) -> Result<usize, String> {
    let d = if device < 0 {
        Device::current().map_err(|e| format!("memres: no current device: {e}"))?.ordinal() as usize
    } else {
        device as usize
    };
    if d >= MAX_DEVICES {
        return Err(format!("memres: device {d} out of range (0 to {})", MAX_DEVICES - 1));
    }
    Ok(d)
}

/// Names the C caller's stream, a stream of `st`'s device's primary
/// context (the entry points' contract). Every handle is named with that
/// context, so that its calls run there whatever context the calling
/// thread has current: none on a thread that never called CUDA, another
/// device's after a switch (a default handle named without one would put
/// its events in the current context, or fail where none is). The legacy
/// stream is the device's own, made once: no stream is made for most
/// calls; the others share its idle events, so a fence on a caller's
/// stream makes no event once the first ones are back.
///
/// # Safety
///
/// `stream` is null, a default handle, or a stream of `st`'s device that
/// stays valid while the returned one lives (the crate doc's *Streams*).
unsafe fn stream_of(stream: *mut c_void, st: &devices::DeviceState) -> CallStream<'_> {
    if matches!(stream as usize, 0 | sys::CU_STREAM_LEGACY) {
        return CallStream::Device(&st.legacy);
    }
    // SAFETY: the stream is a default handle or valid for the call (this
    // function's contract), and it is a stream of `st`'s device's
    // primary context (the contract too; for the per-thread handle, the
    // context memres makes current for the call), which is `st.legacy`'s;
    // the borrowed handle is dropped before the call returns and never
    // destroys the stream, and no resource keeps it (the per-stream pools
    // keep events recorded on it, not the stream).
    CallStream::Named(unsafe { CudaStream::from_raw_beside(stream.cast(), &st.legacy) })
}

/// The stream of a call: the device's legacy stream, or one named for it.
enum CallStream<'a> {
    Device(&'a CudaStream),
    Named(CudaStream),
}

impl std::ops::Deref for CallStream<'_> {
    type Target = CudaStream;
    fn deref(&self) -> &CudaStream {
        match self {
            CallStream::Device(s) => s,
            CallStream::Named(s) => s,
        }
    }
}

/// `memres_alloc`'s work, its errors as messages.
///
/// # Safety
///
/// As `memres_alloc`'s.
unsafe fn allocate(size: isize, device: c_int, stream: *mut c_void) -> Result<*mut c_void, String> {
    let size = u64::try_from(size).map_err(|_| format!("memres: negative size {size}"))?;
    let d = device_index(device)?;
    if size == 0 {
        // Nothing to allocate: the device is not even set up for it.
        return Ok(std::ptr::null_mut());
    }
    // Checked first: a size no request can have leaves the device as it is.
    let request = Request::new(size).map_err(|e| format!("memres: {size} bytes: {e}"))?;
    let st = devices::state(d)?;
    // SAFETY: `stream` is a stream of device `d` (this function's contract).
    let stream = unsafe { stream_of(stream, st) };
    let block = st
        .resource
        .allocate(request, &stream)
        .map_err(|e| format!("memres: device {d}: allocating {size} bytes: {e}"))?;
    record(d, &st.table, &st.stranded, &*st.resource, block, size, &*stream)?;
    Ok(block.addr() as usize as *mut c_void)
}

/// Records `block`, just handed out by `resource` on `stream`, in `table`.
/// At an address that is live already (a resource that handed it out
/// twice, or two whose ranges overlap) the older block stays, freeable,
/// and the new one goes back to `resource`: an error (as Python's
/// `memres_py_alloc` answers). So does a block at address 0 (the empty
/// block included): C would take it for NULL, a failure, and never free
/// it; and one of another size than the `asked` bytes: one shorter would
/// be written past its end, one longer is recorded at its own size, so
/// the caller's free of the size it asked for would be refused and the
/// block stay live for good. If `resource` refuses it, it is kept in
/// `stranded` for the device's next release to give back, once `stream` is
/// done with what it ordered before (the release may free on another
/// stream); if it panics, the block is left to it.
fn record<R, S>(
    d: usize,
    table: &Table,
    stranded: &Stranded,
    resource: &R,
    block: Block,
    asked: u64,
    stream: &S,
) -> Result<(), String>
where
    R: MemoryResource<S> + ?Sized,
    S: Stream + ?Sized,
{
    let what = if block.addr() == 0 {
        format!("a block of {} bytes at address 0, which C takes for NULL", block.size())
    } else if block.size() != asked {
        let how = match block.size() < asked {
            true => "shorter than asked",
            false => "longer than asked, so a free of the size asked would be refused",
        };
        format!("a block of {} bytes at {:#x} for a request of {asked}: {how}", block.size(), block.addr())
    } else {
        let Some(older) = table.insert(block) else { return Ok(()) };
        format!("{:#x}, a live address (of a block of {} bytes)", block.addr(), older.size())
    };
    // A give-back that panics is left to the stack, as the core leaves a
    // block whose free panicked to the layer below: the stack may have
    // taken it before the panic, and a second give-back would free it twice.
    let back = match catch_unwind(AssertUnwindSafe(|| resource.deallocate(block, stream))) {
        Ok(Ok(())) => "it was given back".to_string(),
        Err(payload) => format!("giving it back panicked ({}); left to the stack", panic_said(payload)),
        Ok(Err(e)) => {
            let waited = match stream.synchronize() {
                Ok(()) => String::new(),
                Err(w) => format!(" (waiting for its stream failed: {w})"),
            };
            stranded.keep(block);
            format!("giving it back failed: {e}; kept to give back at the next memres_release{waited}")
        }
    };
    Err(format!("memres: device {d}: the stack handed out {what}: {back}"))
}

/// `memres_free`'s work, its errors as messages.
///
/// # Safety
///
/// As `memres_free`'s.
unsafe fn deallocate(
    ptr: *mut c_void,
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> Result<(), String> {
    if ptr.is_null() {
        return Ok(());
    }
    let addr = ptr as usize as u64;
    let d = device_index(device)?;
    let tables = || (0..MAX_DEVICES).filter_map(|o| Some((o, &devices::used(o)?.table)));
    let st = devices::used(d).ok_or_else(|| not_held(d, addr, false, tables()))?;
    // A negative size skips the check.
    let block = st.table.remove_sized(addr, u64::try_from(size).ok()).map_err(|kept| match kept {
        Some(block) => {
            format!("memres: device {d}: free of {addr:#x} with size {size}, allocated with {}", block.size())
        }
        None => not_held(d, addr, true, tables()),
    })?;
    // Back in the table if the free fails: the stack still holds the
    // block, and the caller may free again. Not if it panics: the stack may
    // have freed it before the panic (the core leaves such a block to the
    // layer below), and a second free would free it twice.
    // SAFETY: `stream` is a stream of device `d` (this function's contract).
    let stream = unsafe { stream_of(stream, st) };
    st.resource.deallocate(block, &stream).map_err(|e| {
        st.table.insert(block);
        format!("memres: device {d}: free of {addr:#x}: {e}")
    })
}

/// The message of a free of `addr` on device `d`, whose table does not
/// hold it (`used`: `d` has a table), naming the device whose table does
/// where one of `tables` does: the free named the wrong device, and
/// "freed already" would send the caller after a double free.
fn not_held<'a>(
    d: usize,
    addr: u64,
    used: bool,
    mut tables: impl Iterator<Item = (usize, &'a Table)>,
) -> String {
    let here = if used {
        format!("memres: device {d}: free of {addr:#x}, not allocated here or freed already")
    } else {
        format!("memres: free of {addr:#x} on device {d}, which has allocated nothing")
    };
    match tables.find_map(|(o, t)| Some((o, t.get(addr)?)).filter(|_| o != d)) {
        Some((o, block)) => {
            format!("{here}: it is live on device {o} ({} bytes); free it there", block.size())
        }
        None => here,
    }
}

/// The state of `device` (negative: the current device), once used: what
/// `memres_stats` and `memres_steps` read, neither of which builds a stack.
fn used_state(device: c_int) -> Result<&'static devices::DeviceState, String> {
    let d = device_index(device)?;
    devices::used(d).ok_or_else(|| format!("memres: device {d} has not been used yet"))
}

/// The figures of device `device`'s stack: the Rust form of `memres_stats`.
///
/// # Errors
///
/// A message when the device is out of range or has not been used yet.
pub fn stats(device: c_int) -> Result<MemresStats, String> {
    let st = used_state(device)?;
    let mut out = MemresStats {
        upstream_current: st.upstream.value() as i64,
        upstream_peak: st.upstream.peak() as i64,
        upstream_total: st.upstream.total() as i64,
        live_blocks: st.table.len() as i64,
        ..MemresStats::default()
    };
    if let Some(s) = &st.stats {
        let (bytes, count) = (s.get_bytes_counter(), s.get_allocations_counter());
        out.has_stats = 1;
        (out.bytes_current, out.bytes_peak, out.bytes_total) = (bytes.value, bytes.peak, bytes.total);
        (out.count_current, out.count_peak, out.count_total) = (count.value, count.peak, count.total);
    }
    let (now, peak) = st.driver_pools.reserved();
    (out.reserved_current, out.reserved_peak) = (now as i64, peak as i64);
    Ok(out)
}

/// Copies `text` into `buf` as C's `snprintf` would; returns its length.
/// A cut falls between characters, so what `buf` holds is UTF-8 still.
///
/// # Safety
///
/// `buf` is null or valid for `len` bytes of writes.
unsafe fn copy_out(text: &str, buf: *mut c_char, len: usize) -> usize {
    if !buf.is_null() && len > 0 {
        let mut n = text.len().min(len - 1);
        while !text.is_char_boundary(n) {
            n -= 1;
        }
        // SAFETY: `buf` is valid for `len > n` bytes (the caller's promise);
        // the source is `n` bytes of `text`; the two cannot overlap (`text`
        // is ours).
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, n);
            *buf.add(n) = 0;
        }
    }
    text.len()
}

/// Allocates `size` bytes on `device` (negative: the current device),
/// ordered on `stream` (null: the legacy default stream). Returns NULL
/// when `size` is 0, and NULL with a message for `memres_last_error` when
/// the memory cannot be had or the device's stack cannot be built, or for
/// a size no request can have (negative, above `Request::MAX_SIZE`),
/// refused before the device is set up.
///
/// # Safety
///
/// `stream` is a stream of `device` (the crate doc's *Streams*).
#[no_mangle]
pub unsafe extern "C" fn memres_alloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    // SAFETY: this function's contract is `allocate`'s.
    guard(std::ptr::null_mut(), || unsafe { allocate(size, device, stream) })
}

/// Frees `ptr`, allocated by `memres_alloc` with `size` bytes on `device`,
/// ordered on `stream`. NULL is ignored; a pointer not allocated here, or a
/// size that differs from the allocation's (a negative size skips that
/// check), is refused with a message for `memres_last_error`. It returns
/// nothing, so it clears the thread's message first: a message after it
/// says that it failed.
///
/// # Safety
///
/// `stream` is a stream of `device` (the crate doc's *Streams*); the memory at `ptr` is
/// no longer used by work that is not ordered before the free on `stream`.
#[no_mangle]
pub unsafe extern "C" fn memres_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void) {
    set_error(String::new());
    // SAFETY: this function's contract is `deallocate`'s.
    guard((), || unsafe { deallocate(ptr, size, device, stream) });
}

/// Sets the stack of every device used from now on. Returns 0, or -1 with
/// a message for `memres_last_error` (a bad stack, a NULL or non-UTF-8
/// string, a device in use already).
///
/// # Safety
///
/// `stack` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memres_configure(stack: *const c_char) -> c_int {
    guard(-1, || {
        if stack.is_null() {
            return Err("memres: memres_configure(NULL)".into());
        }
        // SAFETY: a NUL-terminated string, as the caller promises.
        let text = unsafe { CStr::from_ptr(stack) }.to_str().map_err(|_| "memres: stack is not UTF-8")?;
        configure(text).map(|()| 0)
    })
}

/// Refuses an `out` of `call` that is NULL or not aligned for its struct
/// `ty`: neither can be written through.
fn check_out<T>(out: *mut T, call: &str, ty: &str) -> Result<(), String> {
    if out.is_null() {
        return Err(format!("memres: {call}(.., NULL)"));
    }
    if !out.is_aligned() {
        return Err(format!("memres: {call}: out is not aligned for {ty} (at {out:p})"));
    }
    Ok(())
}

/// Fills `*out` with the figures of `device`'s stack. Returns 0, or -1
/// with a message (the device has not been used, `out` is NULL or not
/// aligned for a `memres_stats_t`).
///
/// # Safety
///
/// `out` is NULL, not aligned (refused), or valid for writing one
/// `memres_stats_t`.
#[no_mangle]
pub unsafe extern "C" fn memres_stats(device: c_int, out: *mut MemresStats) -> c_int {
    guard(-1, || {
        check_out(out, "memres_stats", "memres_stats_t")?;
        let s = stats(device)?;
        // SAFETY: `out` is not NULL and is aligned (both checked above), and
        // valid for one write (the caller's promise, which no check can see).
        unsafe { out.write(s) };
        Ok(0)
    })
}

/// Marks the start of a step on `device` (negative: the current device),
/// ordered on `stream` (null: the legacy default stream): each `planned`
/// layer of the device's stack ends the step in progress and begins the
/// next, laying it out from the last one (see `memres_core::planned`).
/// Returns how many `planned` layers it stepped (0 for a stack with none,
/// which is harmless), or -1 with a message (the stack cannot be built, an
/// error of the upstream taking or giving back a plan's region). Every
/// layer is stepped, those after one that fails too, so that the layers
/// stay in step with each other; the message is the first layer's error,
/// with how many failed where more than one did.
///
/// # Safety
///
/// `stream` is a stream of `device` (the crate doc's *Streams*).
#[no_mangle]
pub unsafe extern "C" fn memres_step(device: c_int, stream: *mut c_void) -> c_int {
    guard(-1, || {
        let d = device_index(device)?;
        let st = devices::state(d)?;
        // SAFETY: `stream` is a stream of device `d` (this function's contract).
        let stream = unsafe { stream_of(stream, st) };
        step_each(d, &st.planned, &*stream)?;
        Ok(st.planned.len() as c_int)
    })
}

/// Steps each of device `d`'s `layers` on `stream`, those after one that
/// fails too: a layer left unstepped would lay out its next step from a
/// step that spanned two, out of step with the others.
///
/// # Errors
///
/// The first layer's error, naming the device, and how many layers failed
/// where more than one did.
fn step_each<R, S>(d: usize, layers: &[Arc<Planned<R>>], stream: &S) -> Result<(), String>
where
    R: MemoryResource<S>,
    S: Stream + ?Sized,
{
    let Err((e, failed)) = Planned::step_each(layers.iter().map(|p| &**p), stream) else { return Ok(()) };
    let step = format!("memres: device {d}: step: {e}");
    Err(match failed {
        1 => step,
        n => format!("{step} ({n} of the {} planned layers failed; this is the first)", layers.len()),
    })
}

/// What the `planned` layers of `device`'s stack have done, summed over
/// them, and how many there are (0: a stack without `planned`).
///
/// # Errors
///
/// The device is out of range or has not been used yet.
pub fn steps(device: c_int) -> Result<(MemresSteps, usize), String> {
    let st = used_state(device)?;
    let s: Steps = st.planned.iter().map(|p| p.steps()).sum();
    let out = MemresSteps {
        steps: s.steps as i64,
        followed: s.followed as i64,
        plans: s.plans as i64,
        planned_allocations: s.planned_allocations as i64,
        region: s.region as i64,
        carry_region: s.carry_region as i64,
    };
    Ok((out, st.planned.len()))
}

/// Fills `*out` with what the `planned` layers of `device`'s stack have
/// done (zeros for a stack without one). Returns how many `planned` layers
/// there are, or -1 with a message (the device has not been used, `out` is
/// NULL or not aligned for a `memres_steps_t`).
///
/// # Safety
///
/// `out` is NULL, not aligned (refused), or valid for writing one
/// `memres_steps_t`.
#[no_mangle]
pub unsafe extern "C" fn memres_steps(device: c_int, out: *mut MemresSteps) -> c_int {
    guard(-1, || {
        check_out(out, "memres_steps", "memres_steps_t")?;
        let (s, layers) = steps(device)?;
        // SAFETY: `out` is not NULL and is aligned (both checked above), and
        // valid for one write (the caller's promise, which no check can see).
        unsafe { out.write(s) };
        Ok(layers as c_int)
    })
}

/// Gives back what the pools of `device`'s stack keep free (see
/// `memres_release`): the Rust form, returning the bytes given back (0 for
/// a device not used yet). First it gives back the blocks kept since the
/// stack handed out a live address (or 0, or another size than asked) and
/// refused them back (see `record`); those still refused stay kept, and the
/// first refusal is the error.
///
/// # Errors
///
/// A message when the device is out of range, or the first error of a
/// layer (the layers after it still give back).
///
/// # Safety
///
/// `stream` is a stream of `device` (the crate doc's *Streams*).
pub unsafe fn release(device: c_int, stream: *mut c_void) -> Result<u64, String> {
    let d = device_index(device)?;
    let Some(st) = devices::used(d) else { return Ok(0) };
    // SAFETY: `stream` is a stream of device `d` (this function's contract).
    let stream = unsafe { stream_of(stream, st) };
    let stranded = st.stranded.give_back(|b| st.resource.deallocate(b, &*stream));
    let released = st.releasing.release(&*stream).map_err(|e| format!("memres: device {d}: release: {e}"));
    stranded.map_err(|e| format!("memres: device {d}: release: giving back a block kept since the stack handed it out at a live address, at 0 or of another size than asked: {e}"))?;
    released
}

/// Gives back to `device` (negative: the current device) what the pools of
/// its stack keep free, once every stream of the device is done, ordered
/// on `stream` (null: the device's legacy default stream): the wholly free
/// chunks of each `pool`, `fixed`, `binning` and `arena` layer, a `vmm`
/// leaf's mapped granules that no block uses,
/// an `async` leaf's driver pool reserve beyond what is in use, the
/// regions of a `planned` layer that no block lives in, once its step's
/// region is free (its plan goes, and the next steps are laid out afresh;
/// gradients kept between steps keep the carry region). Returns
/// the bytes given back to the device, each counted once (a pool's chunk
/// that `vmm` then unmaps counts when it is unmapped; 0 for a device not
/// used yet), or -1 with a message. First it gives back the blocks that
/// `memres_alloc` kept since the stack refused them back (see `record`);
/// one still refused stays kept, and the call is -1 with a message saying
/// so, once the pools have given back.
///
/// # Safety
///
/// `stream` is a stream of `device` (the crate doc's *Streams*).
#[no_mangle]
pub unsafe extern "C" fn memres_release(device: c_int, stream: *mut c_void) -> i64 {
    // SAFETY: the caller's promise is `release`'s.
    guard(-1, || unsafe { release(device, stream) }.map(|n| i64::try_from(n).unwrap_or(i64::MAX)))
}

/// `memres_release` of every device used so far, on its legacy default
/// stream; the first failure is kept for `memres_last_error`, and the
/// other devices still give back. It returns nothing, so it clears the
/// thread's message: a message after it is the first device's failure. Its
/// signature is that of the reset function of PyTorch's
/// `CUDAPluggableAllocator` (`allocator.allocator().set_reset_fn`), which
/// `torch.cuda.empty_cache()` calls.
#[no_mangle]
pub extern "C" fn memres_empty_cache() {
    // SAFETY: the null stream is the device's legacy default stream.
    release_each(|d| unsafe { release(d, std::ptr::null_mut()) });
}

/// `release` of every device, as `memres_empty_cache` does: those after
/// one that fails or panics too; the first failure is the thread's
/// message, else none.
fn release_each(mut release: impl FnMut(c_int) -> Result<u64, String>) {
    let mut first = Ok(());
    for d in 0..MAX_DEVICES as c_int {
        first = first.and(caught(|| release(d)).map(drop));
    }
    set_error(first.err().unwrap_or_default());
}

/// Writes out what the `log` adaptors of every device hold in their
/// buffers (also done when the process exits). Returns 0, or -1 with a
/// message when a write failed.
#[no_mangle]
pub extern "C" fn memres_flush() -> c_int {
    guard(-1, || flush().map(|()| 0))
}

/// Copies the latest error message of the calling thread into `buf` (at most
/// `len - 1` bytes and a NUL, cut between UTF-8 characters) and returns its
/// full length: 0 when no error happened yet. `buf` may be NULL to ask for
/// the length.
///
/// # Safety
///
/// `buf` is NULL or valid for `len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn memres_last_error(buf: *mut c_char, len: usize) -> usize {
    // SAFETY: the caller's promise is `copy_out`'s.
    guard(0, || Ok(unsafe { copy_out(&last_error(), buf, len) }))
}

/// Copies the stack description `device` runs (or, not used yet, the one
/// its first use would build now, unchecked: a malformed one is refused
/// then) into `buf` as `memres_last_error` does; returns its length, 0 with
/// a message when the device is out of range or `MEMRES_STACK` is not UTF-8.
///
/// # Safety
///
/// `buf` is NULL or valid for `len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn memres_stack(device: c_int, buf: *mut c_char, len: usize) -> usize {
    // SAFETY: the caller's promise is `copy_out`'s.
    guard(0, || Ok(unsafe { copy_out(&stack(device)?, buf, len) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_fallback_and_a_message() {
        let v = guard(7, || -> Result<i32, String> { panic!("boom {}", 1) });
        assert_eq!(v, 7);
        assert!(last_error().contains("boom 1"), "{}", last_error());
        let v = guard(7, || -> Result<i32, String> { std::panic::panic_any(42u8) });
        assert_eq!(v, 7);
        assert!(last_error().contains("unknown"), "{}", last_error());
    }

    #[test]
    fn each_thread_reads_its_own_latest_error() {
        guard((), || Err("mine".into()));
        let theirs = std::thread::spawn(|| {
            let before = last_error();
            guard((), || Err("theirs".into()));
            (before, last_error())
        })
        .join()
        .unwrap();
        assert_eq!(theirs, (String::new(), "theirs".to_string()));
        assert_eq!(last_error(), "mine");
        // A call that succeeds leaves the message of the last one that failed.
        assert_eq!(guard(1, || Ok(2)), 2);
        assert_eq!(last_error(), "mine");
    }

    /// `memres_free` returns nothing: a message after it is its own
    /// failure, never an earlier call's.
    #[test]
    fn a_free_clears_the_threads_message_first() {
        let freed_twice = 0x1000 as *mut c_void;
        // SAFETY: the stream is null (the legacy stream); nothing is freed.
        unsafe { memres_free(freed_twice, 8, 0, std::ptr::null_mut()) };
        assert!(last_error().contains("0x1000"), "{}", last_error());
        // SAFETY: as above; NULL is ignored.
        unsafe { memres_free(std::ptr::null_mut(), 8, 0, std::ptr::null_mut()) };
        assert_eq!(last_error(), "", "the free succeeded");
        guard((), || Err("an allocation failed".into()));
        // SAFETY: as above.
        unsafe { memres_free(freed_twice, 8, 0, std::ptr::null_mut()) };
        assert!(last_error().contains("0x1000"), "{}", last_error());
    }

    /// `memres_empty_cache` returns nothing either: a message after it is
    /// a device's failure to give back, never an earlier call's.
    #[test]
    fn an_empty_cache_clears_the_threads_message_first() {
        guard((), || Err("an allocation failed".into()));
        memres_empty_cache();
        assert_eq!(last_error(), "", "no device failed to give back");
    }

    /// Every device gives back, those after one that fails or panics too,
    /// and the message is the first failure's (as `memres_step`'s is).
    #[test]
    fn an_empty_cache_releases_every_device_and_keeps_the_first_error() {
        let mut asked = Vec::new();
        release_each(|d| {
            asked.push(d);
            match d {
                1 => Err("memres: device 1: release: refused".into()),
                3 => Err("memres: device 3: release: refused".into()),
                5 => panic!("device 5"),
                _ => Ok(0),
            }
        });
        assert_eq!(asked, (0..MAX_DEVICES as c_int).collect::<Vec<_>>());
        assert_eq!(last_error(), "memres: device 1: release: refused");
    }

    /// A free that names another device than the block's is refused (the
    /// block stays live where it is) with a message naming its device.
    #[test]
    fn a_free_on_another_device_names_the_blocks_device() {
        let (zero, two) = (Table::new(), Table::new());
        zero.insert(Block::new(0x1000, 512, 7));
        let tables = || [(0, &zero), (2, &two)].into_iter();
        let e = not_held(2, 0x1000, true, tables());
        assert_eq!(
            e,
            "memres: device 2: free of 0x1000, not allocated here or freed already: \
             it is live on device 0 (512 bytes); free it there"
        );
        let e = not_held(1, 0x1000, false, tables());
        assert_eq!(
            e,
            "memres: free of 0x1000 on device 1, which has allocated nothing: \
             it is live on device 0 (512 bytes); free it there"
        );
        // Live nowhere: freed already, or never allocated here.
        let e = not_held(2, 0x2000, true, tables());
        assert_eq!(e, "memres: device 2: free of 0x2000, not allocated here or freed already");
    }

    /// A figures struct at an address not aligned for it is refused before
    /// anything is written, not written through a misaligned pointer.
    #[test]
    fn a_misaligned_out_is_refused() {
        let mut bytes = [0u64; 16];
        let odd = bytes.as_mut_ptr().cast::<u8>().wrapping_add(4);
        // SAFETY: `odd` is not NULL and has room for either struct; only
        // its alignment is wrong, which the calls refuse.
        assert_eq!(unsafe { memres_stats(0, odd.cast()) }, -1);
        assert!(last_error().contains("memres_stats: out is not aligned"), "{}", last_error());
        // SAFETY: as above.
        assert_eq!(unsafe { memres_steps(0, odd.cast()) }, -1);
        assert!(last_error().contains("memres_steps: out is not aligned"), "{}", last_error());
        assert_eq!(bytes, [0; 16], "nothing written");
    }

    #[test]
    fn the_default_stack_builds_without_a_device() {
        // The GPU tests build it for real; this catches a broken default
        // where there is no GPU.
        let built = leaves::checking_builder().build(DEFAULT_STACK, &CudaStream::legacy());
        assert!(built.is_ok(), "{DEFAULT_STACK}: {:?}", built.err());
    }

    /// An upstream whose frees are refused while `refusing` is set.
    #[derive(Debug)]
    struct Refusing {
        up: memres_core::testing::BumpUpstream,
        refusing: std::sync::atomic::AtomicBool,
    }

    impl MemoryResource<()> for Refusing {
        fn allocate(&self, request: Request, stream: &()) -> memres_core::Result<memres_core::Block> {
            self.up.allocate(request, stream)
        }
        fn deallocate(&self, block: memres_core::Block, stream: &()) -> memres_core::Result<()> {
            if self.refusing.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(memres_core::Error::Backend { code: 1, what: "refused" });
            }
            self.up.deallocate(block, stream)
        }
    }

    /// Three planned layers, each with a plan and its region after two
    /// repeating steps.
    fn planned_layers() -> Vec<Arc<Planned<Refusing>>> {
        let layers: Vec<_> = (0..3)
            .map(|_| {
                let up = memres_core::testing::BumpUpstream::new(1 << 30);
                Arc::new(Planned::new(Refusing { up, refusing: false.into() }))
            })
            .collect();
        assert_eq!(step_each(0, &layers, &()), Ok(()));
        for _ in 0..2 {
            for p in &layers {
                let b = p.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
                p.deallocate(b, &()).unwrap();
            }
            assert_eq!(step_each(0, &layers, &()), Ok(()));
        }
        for p in &layers {
            let s = p.steps();
            assert_eq!((s.steps, s.plans), (3, 1), "{s:?}");
            assert!(s.region >= 1 << 20, "{s:?}");
        }
        layers
    }

    /// A layer whose step fails does not keep the layers after it from
    /// stepping: each gives its region back and counts the step, the
    /// failed one keeps its region; the first error comes back, naming the
    /// device, with how many failed.
    #[test]
    fn every_planned_layer_steps_though_one_before_it_fails() {
        // The step that ends now asked for nothing, so it left the plan:
        // each layer gives its region back, the first's refused.
        let layers = planned_layers();
        layers[0].upstream().refusing.store(true, std::sync::atomic::Ordering::Relaxed);
        let first = "memres: device 3: step: backend error 1: refused";
        assert_eq!(step_each(3, &layers, &()), Err(first.to_string()));
        let steps: Vec<_> = layers.iter().map(|p| p.steps()).collect();
        assert!(steps.iter().all(|s| s.steps == 4), "{steps:?}");
        assert!(steps[0].region >= 1 << 20, "the refused region is kept: {steps:?}");
        assert_eq!((steps[1].region, steps[2].region), (0, 0), "{steps:?}");

        let layers = planned_layers();
        for p in [&layers[0], &layers[2]] {
            p.upstream().refusing.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let both = format!("{first} (2 of the 3 planned layers failed; this is the first)");
        assert_eq!(step_each(3, &layers, &()), Err(both));
        let steps: Vec<_> = layers.iter().map(|p| p.steps()).collect();
        assert!(steps.iter().all(|s| s.steps == 4), "{steps:?}");
        assert_eq!(steps[1].region, 0, "{steps:?}");
    }

    /// A resource that hands out one address every time, and keeps the
    /// blocks that come back.
    #[derive(Debug, Default)]
    struct OneAddress {
        back: std::sync::Mutex<Vec<Block>>,
        /// Whether frees are refused.
        refusing: std::sync::atomic::AtomicBool,
        /// Whether frees panic.
        panicking: std::sync::atomic::AtomicBool,
    }

    impl MemoryResource<()> for OneAddress {
        fn allocate(&self, request: Request, _stream: &()) -> memres_core::Result<Block> {
            Ok(Block::new(0x1000, request.size(), 7))
        }
        fn deallocate(&self, block: Block, _stream: &()) -> memres_core::Result<()> {
            if self.panicking.load(std::sync::atomic::Ordering::Relaxed) {
                panic!("a free that panics");
            }
            if self.refusing.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(memres_core::Error::Backend { code: 1, what: "refused" });
            }
            self.back.lock().unwrap().push(block);
            Ok(())
        }
    }

    /// What `memres_alloc` does with the block its stack handed out (the C
    /// library takes no stack of the program's, so none that misbehaves).
    #[test]
    fn an_address_live_already_is_refused_and_the_new_block_given_back() {
        let (table, resource) = (Table::new(), OneAddress::default());
        let older = resource.allocate(Request::new(512).unwrap(), &()).unwrap();
        let stranded = Stranded::default();
        assert_eq!(record(5, &table, &stranded, &resource, older, older.size(), &()), Ok(()));
        let newer = resource.allocate(Request::new(256).unwrap(), &()).unwrap();
        let refused = "memres: device 5: the stack handed out 0x1000, a live address \
                       (of a block of 512 bytes): it was given back";
        assert_eq!(
            record(5, &table, &stranded, &resource, newer, newer.size(), &()),
            Err(refused.to_string())
        );
        assert_eq!(*resource.back.lock().unwrap(), [newer]);
        assert!(stranded.blocks().is_empty());
        // The older block stays, and its free frees it.
        assert_eq!(table.remove_sized(0x1000, Some(512)), Ok(older));
        assert!(table.is_empty());
    }

    /// A block at address 0 would reach C as NULL, which the caller takes
    /// for a failure and never frees: it is refused and given back, with
    /// a message, and nothing is left live.
    #[test]
    fn a_block_at_address_zero_is_refused_and_given_back() {
        let (table, stranded) = (Table::new(), Stranded::default());
        let resource = OneAddress::default();
        for handed in [Block::new(0, 256, 7), Block::EMPTY] {
            let err = record(5, &table, &stranded, &resource, handed, 256, &()).unwrap_err();
            assert!(err.contains("address 0"), "{err}");
            assert!(err.contains("it was given back"), "{err}");
            assert_eq!(resource.back.lock().unwrap().pop(), Some(handed));
        }
        assert!(table.is_empty(), "nothing live");
        assert!(stranded.blocks().is_empty());
    }

    /// A block of another size than asked: one shorter would be written
    /// past its end, one longer recorded at its own size, so the caller's
    /// free of the size it asked for would be refused and the block stay
    /// live for good. Either is refused as a block at address 0 is: given
    /// back, or kept for the next release if refused, with a message.
    #[test]
    fn a_block_of_another_size_than_asked_is_refused_and_given_back() {
        let (table, stranded, resource) = (Table::new(), Stranded::default(), OneAddress::default());
        for (size, what) in [(256, "shorter than asked"), (1024, "longer than asked")] {
            let handed = Block::new(0x1000, size, 7);
            let err = record(5, &table, &stranded, &resource, handed, 512, &()).unwrap_err();
            assert!(
                err.contains(&format!("a block of {size} bytes at 0x1000 for a request of 512: {what}")),
                "{err}"
            );
            assert!(err.contains("it was given back"), "{err}");
            assert_eq!(resource.back.lock().unwrap().pop(), Some(handed));
        }
        resource.refusing.store(true, std::sync::atomic::Ordering::Relaxed);
        let handed = Block::new(0x1000, 256, 7);
        let err = record(5, &table, &stranded, &resource, handed, 512, &()).unwrap_err();
        assert!(err.contains("kept to give back at the next memres_release"), "{err}");
        assert_eq!(stranded.blocks(), [handed], "kept, not lost");
        assert!(table.is_empty(), "nothing live");
    }

    /// A stack that hands out a live address and refuses the block back:
    /// the block is kept, not lost, and a later give-back (what each
    /// release does first) frees it; one still refused stays kept.
    #[test]
    fn a_block_whose_give_back_is_refused_is_kept_and_given_back_later() {
        let (table, stranded, resource) = (Table::new(), Stranded::default(), OneAddress::default());
        let older = resource.allocate(Request::new(512).unwrap(), &()).unwrap();
        assert_eq!(record(5, &table, &stranded, &resource, older, older.size(), &()), Ok(()));
        let newer = resource.allocate(Request::new(256).unwrap(), &()).unwrap();
        resource.refusing.store(true, std::sync::atomic::Ordering::Relaxed);
        let err = record(5, &table, &stranded, &resource, newer, newer.size(), &()).unwrap_err();
        assert!(err.contains("giving it back failed: backend error 1: refused"), "{err}");
        assert!(err.contains("kept to give back at the next memres_release"), "{err}");
        assert_eq!(stranded.blocks(), [newer], "kept, not lost");
        // Still refused: still kept, and the error says so.
        assert!(stranded.give_back(|b| resource.deallocate(b, &())).is_err());
        assert_eq!(stranded.blocks(), [newer]);
        resource.refusing.store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(stranded.give_back(|b| resource.deallocate(b, &())), Ok(()));
        assert!(stranded.blocks().is_empty());
        assert_eq!(*resource.back.lock().unwrap(), [newer], "given back");
        // The older block stays the caller's.
        assert_eq!(table.remove_sized(0x1000, Some(512)), Ok(older));
    }

    /// A give-back that panics leaves the block to the stack, which may
    /// have taken it before the panic, as the core's layers leave a block
    /// whose free panicked to the layer below: kept and given back again,
    /// it would be freed twice. The error says what happened.
    #[test]
    fn a_block_whose_give_back_panics_is_left_to_the_stack() {
        let (table, stranded, resource) = (Table::new(), Stranded::default(), OneAddress::default());
        let older = resource.allocate(Request::new(512).unwrap(), &()).unwrap();
        assert_eq!(record(5, &table, &stranded, &resource, older, older.size(), &()), Ok(()));
        let newer = resource.allocate(Request::new(256).unwrap(), &()).unwrap();
        resource.panicking.store(true, std::sync::atomic::Ordering::Relaxed);
        let err = record(5, &table, &stranded, &resource, newer, newer.size(), &()).unwrap_err();
        assert!(err.contains("a live address"), "{err}");
        assert!(err.contains("giving it back panicked (a free that panics); left to the stack"), "{err}");
        assert!(stranded.blocks().is_empty(), "not kept");
        assert_eq!(table.remove_sized(0x1000, Some(512)), Ok(older));
    }

    /// A release's give-back of the kept blocks whose free panics on one
    /// of them: the blocks before it are given back, it is left to the
    /// stack, and those after it stay kept for the next release.
    #[test]
    fn a_kept_block_whose_give_back_panics_is_left_to_the_stack_and_the_rest_stay_kept() {
        let (stranded, resource) = (Stranded::default(), OneAddress::default());
        let blocks = [1u64, 2, 3].map(|i| Block::new(i << 12, 256, i));
        blocks.iter().for_each(|&b| stranded.keep(b));
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            stranded.give_back(|b| {
                resource.panicking.store(b == blocks[1], std::sync::atomic::Ordering::Relaxed);
                resource.deallocate(b, &())
            })
        }));
        assert!(panicked.is_err());
        assert_eq!(*resource.back.lock().unwrap(), [blocks[0]], "given back");
        assert_eq!(stranded.blocks(), [blocks[2]], "the panicking one left to the stack, the next kept");
    }

    #[test]
    fn copy_out_truncates_and_terminates() {
        let mut buf = [0x7f as c_char; 5];
        // SAFETY: `buf` is 5 bytes.
        assert_eq!(unsafe { copy_out("abcdefg", buf.as_mut_ptr(), 5) }, 7);
        assert_eq!(buf.map(|c| c as u8), *b"abcd\0");
        // SAFETY: NULL asks for the length only.
        assert_eq!(unsafe { copy_out("abc", std::ptr::null_mut(), 0) }, 3);
    }

    #[test]
    fn copy_out_cuts_between_characters() {
        // `é` is two bytes: three bytes of room hold "a", the NUL, and not
        // half of `é`.
        let mut buf = [0x7f as c_char; 3];
        // SAFETY: `buf` is 3 bytes.
        assert_eq!(unsafe { copy_out("aé", buf.as_mut_ptr(), 3) }, 3);
        assert_eq!(buf.map(|c| c as u8), *b"a\0\x7f");
    }
}
