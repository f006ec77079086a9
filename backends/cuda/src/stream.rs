//! CUDA streams and events as the core's [`Stream`] model.

use crate::context::{Context, Current, Device};
use crate::error::{check, error_from_code};
use crate::sys;
use memres_core::device::{DeviceId, DeviceStream};
use memres_core::{thread_number, Block, Error, Result, Stream};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A stream that names a raw `CUstream`: what the stream-ordered CUDA
/// resources ([`CudaAsyncMemory`](crate::CudaAsyncMemory),
/// [`Prefetch`](crate::Prefetch)) and the copy engine need of the stream
/// they are given. The handle goes to the driver, so the trait is `unsafe`:
/// a made-up handle would be undefined behaviour in the driver.
///
/// `()` is the legacy default stream of the current context.
///
/// # Safety
///
/// [`as_raw_stream`](Self::as_raw_stream) returns null, `CU_STREAM_LEGACY`,
/// `CU_STREAM_PER_THREAD`, or a stream handle that stays valid for as long
/// as `self` is borrowed; [`context`](Self::context) returns `None` or the
/// context that stream belongs to; [`off_its_thread`](Self::off_its_thread)
/// is `true` whenever the handle is `CU_STREAM_PER_THREAD` and the stream
/// meant is another thread's than the caller's. A type that wraps another
/// stream forwards all three together.
///
/// # Examples
///
/// ```
/// use memres_cuda::AsRawStream;
/// assert!(().as_raw_stream().is_null());
/// ```
///
/// A stream of the user's names a handle only with `unsafe`:
///
/// ```compile_fail,E0200
/// # use memres_core::{Result, Stream};
/// struct Mine(usize);
/// impl Stream for Mine {
///     type Event = ();
///     fn id(&self) -> u64 { self.0 as u64 }
///     fn record(&self) -> Result<()> { Ok(()) }
///     fn wait(&self, _: &()) -> Result<()> { Ok(()) }
///     fn query(&self, _: &()) -> Result<bool> { Ok(true) }
///     fn synchronize(&self) -> Result<()> { Ok(()) }
/// }
/// impl memres_cuda::AsRawStream for Mine {
///     fn as_raw_stream(&self) -> memres_cuda::sys::CUstream { self.0 as _ }
/// }
/// ```
pub unsafe trait AsRawStream: Stream {
    /// The driver's handle of the stream.
    fn as_raw_stream(&self) -> sys::CUstream;

    /// The context the stream belongs to, when known: made current for the
    /// calls that need one.
    fn context(&self) -> Option<&Context> {
        None
    }

    /// Whether [`as_raw_stream`](Self::as_raw_stream) is
    /// `CU_STREAM_PER_THREAD` while the stream meant is another thread's
    /// than the caller's (the handle names the caller's): work queued on
    /// it then waits for all work of the context first and is waited for
    /// (but frees, which no later work depends on).
    /// Part of the trait's safety contract: a type that wraps a
    /// [`CudaStream`] forwards this with the handle, or its per-thread
    /// streams lose that order on other threads.
    fn off_its_thread(&self) -> bool {
        false
    }
}

// SAFETY: null, the legacy default stream, is always a valid handle.
unsafe impl AsRawStream for () {
    fn as_raw_stream(&self) -> sys::CUstream {
        ptr::null_mut()
    }
}

// SAFETY: forwards `S`'s answers, which hold while `*self` is borrowed, so
// while `self` is.
unsafe impl<S: AsRawStream + ?Sized + 'static> AsRawStream for &S {
    fn as_raw_stream(&self) -> sys::CUstream {
        (**self).as_raw_stream()
    }
    fn context(&self) -> Option<&Context> {
        (**self).context()
    }
    fn off_its_thread(&self) -> bool {
        (**self).off_its_thread()
    }
}

/// Options of a stream made by [`CudaStream::with_options`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamOptions {
    /// Work on the stream does not wait for the legacy default stream
    /// (`CU_STREAM_NON_BLOCKING`).
    pub non_blocking: bool,
    /// Scheduling priority: lower numbers are higher priorities; 0 is the default.
    pub priority: i32,
}

/// A CUDA stream: the [`Stream`] of the CUDA resources.
///
/// ```text
///  CudaStream { raw: CUstream, owned, context }
///    record() ── cuEventRecord on an idle event of the context
///                (cuEventCreate when there is none) ──► CudaEvent
///    drop(CudaEvent) ── back to the idle events (or cuEventDestroy)
///    wait(e)  ── cuStreamWaitEvent
///    query(e) ── cuEventQuery (CUDA_ERROR_NOT_READY: false)
///    synchronize() ── cuStreamSynchronize
///    synchronize_device() ── cuCtxSynchronize
/// ```
///
/// A stream made by [`new`](CudaStream::new) is owned, and destroyed on drop
/// once its work has run (its handle may name the next stream made);
/// [`legacy`](CudaStream::legacy), [`per_thread`](CudaStream::per_thread)
/// and [`from_raw`](CudaStream::from_raw) only name a stream.
///
/// [`id`](Stream::id) is the raw handle as a number, with two exceptions:
/// the legacy default stream is 0 whether it is named by the null handle or
/// by `CU_STREAM_LEGACY`, and the per-thread default stream, a different
/// stream on every thread, is `CU_STREAM_PER_THREAD` (2) with the top bit
/// and a number of the thread that made the value added (so that free lists
/// kept per stream never mix two threads' streams).
///
/// A per-thread stream means the stream of the thread that made the value,
/// on every thread. CUDA's handle names the calling thread's, so on another
/// thread (the value moved there in a container, say) the calls order
/// conservatively instead: [`record`](Stream::record) and
/// [`synchronize`](Stream::synchronize) first wait for all work of the
/// context, [`wait`](Stream::wait) waits for the event on the host, and the
/// work this crate queues on the stream (allocations of
/// [`CudaAsyncMemory`](crate::CudaAsyncMemory), copies, prefetches) is queued
/// after all work of the context and waited for (its frees are not waited
/// for: no later work uses a freed block). That is correct but slow
/// (a pool may do it under its lock, recording a fence for a block freed on
/// such a stream), and not allowed while another thread captures a CUDA
/// graph in global mode: a stream made with [`new`](CudaStream::new) moves
/// between threads with none of it.
///
/// # Examples
///
/// ```no_run
/// use memres_core::Stream;
/// use memres_cuda::{CudaStream, Device};
/// let device = Device::get(0)?;
/// let (a, b) = (CudaStream::new(device)?, CudaStream::new(device)?);
/// let e = a.record()?; // after all work queued on `a` so far
/// b.wait(&e)?;         // later work on `b` runs after it
/// b.synchronize()?;
/// assert!(a.query(&e)?);
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct CudaStream {
    /// Null or `CU_STREAM_LEGACY`: the legacy stream; `CU_STREAM_PER_THREAD`:
    /// the thread's; otherwise a stream handle, valid while `self` lives
    /// (owned) or as the maker of a borrowed one promised.
    raw: sys::CUstream,
    /// Whether `raw` was created here and is destroyed on drop.
    owned: bool,
    /// The stream's context, if known (always for owned streams).
    context: Option<Context>,
    /// Idle events of `context` (present exactly when `context` is).
    events: Option<Arc<EventCache>>,
    /// When `raw` is `CU_STREAM_PER_THREAD`: the number of the thread that
    /// made the value, whose stream it names everywhere; otherwise 0.
    home: u64,
}

// SAFETY: stream handles may be used from any thread (the driver serializes
// what needs it); an owned handle is destroyed exactly once, by `Drop`.
unsafe impl Send for CudaStream {}
// SAFETY: as above; every method takes `&self` and only passes the handle on.
unsafe impl Sync for CudaStream {}

impl CudaStream {
    /// A new stream on `device`'s primary context, created blocking
    /// (ordered with the legacy default stream) at the default priority.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn new(device: Device) -> Result<CudaStream> {
        Self::with_options(device, StreamOptions::default())
    }

    /// A new stream on `device`'s primary context with `options`.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn with_options(device: Device, options: StreamOptions) -> Result<CudaStream> {
        Self::in_context(device.primary_context()?, options)
    }

    /// A new stream in `context`.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn in_context(context: Context, options: StreamOptions) -> Result<CudaStream> {
        let flags = if options.non_blocking { sys::CU_STREAM_NON_BLOCKING } else { sys::CU_STREAM_DEFAULT };
        let raw = context.scope(|| {
            let mut raw = ptr::null_mut();
            // SAFETY: a context is current; the out parameter points at a live local.
            check(unsafe { sys::cuStreamCreateWithPriority(&mut raw, flags, options.priority) })?;
            Ok(raw)
        })?;
        Ok(CudaStream::make(raw, true, Some(context)))
    }

    /// The legacy default stream of whatever context is current when it is
    /// used (the null stream). Its [`id`](Stream::id) is 0.
    pub const fn legacy() -> CudaStream {
        CudaStream { raw: ptr::null_mut(), owned: false, context: None, events: None, home: 0 }
    }

    /// The legacy default stream of `context`.
    pub fn legacy_in(context: Context) -> CudaStream {
        CudaStream::make(ptr::null_mut(), false, Some(context))
    }

    /// The calling thread's default stream (`CU_STREAM_PER_THREAD`) of the
    /// current context: each thread that makes one names its own stream.
    /// The context current when it is made, if primary, is its context
    /// (kept alive by the value); otherwise the calls use whatever context
    /// is current when they run.
    ///
    /// The value keeps meaning the stream of the thread that made it when
    /// it moves to another thread (in a container, say): there its calls
    /// wait for all work of the context instead of naming the stream, which
    /// CUDA's handle cannot do from another thread (see [`CudaStream`]). So
    /// a block freed on another thread is not reused before the work queued
    /// on it completes. [`raw`](Self::raw) is CUDA's handle, which names the
    /// calling thread's stream wherever it is used.
    pub fn per_thread() -> CudaStream {
        // Kept, so that on another thread the calls use that context too.
        let context = Context::current_primary().ok();
        CudaStream::make(sys::CU_STREAM_PER_THREAD as sys::CUstream, false, context)
    }

    /// Names a stream made elsewhere (by another library; for a `cust`
    /// stream pass `stream.as_inner()`); it is not destroyed on drop.
    /// `context` is the stream's context if known; when it is `None`, calls
    /// that need a context ask the driver for the stream's (`cuStreamGetCtx`).
    /// `CU_STREAM_PER_THREAD` names the calling thread's stream, as
    /// [`per_thread`](Self::per_thread) does; with no context, its calls on
    /// another thread use the context current there.
    ///
    /// # Safety
    ///
    /// `raw` must be null, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD` or a
    /// stream handle that stays valid for as long as the returned value and
    /// everything it is given to (a resource, an event) use it; `context`,
    /// if given, must be the context the stream belongs to.
    pub unsafe fn from_raw(raw: sys::CUstream, context: Option<Context>) -> CudaStream {
        CudaStream::make(raw, false, context)
    }

    /// Names a stream made elsewhere in `beside`'s context, sharing
    /// `beside`'s idle events (events belong to a context, not a stream):
    /// code that names a borrowed stream per call, as the C library's entry
    /// points do, then records its events without making one each time.
    /// `CU_STREAM_PER_THREAD` names the calling thread's stream, as
    /// [`per_thread`](Self::per_thread) does.
    ///
    /// # Safety
    ///
    /// As [`from_raw`](Self::from_raw)'s, with `beside`'s context as the
    /// stream's: `raw` must be null, `CU_STREAM_LEGACY`,
    /// `CU_STREAM_PER_THREAD` or a stream handle that stays valid for as
    /// long as the returned value and everything it is given to use it, and
    /// a stream of `beside`'s context if `beside` has one.
    pub unsafe fn from_raw_beside(raw: sys::CUstream, beside: &CudaStream) -> CudaStream {
        let home = if raw as usize == sys::CU_STREAM_PER_THREAD { thread_number() } else { 0 };
        CudaStream { raw, owned: false, context: beside.context.clone(), events: beside.events.clone(), home }
    }

    fn make(raw: sys::CUstream, owned: bool, context: Option<Context>) -> CudaStream {
        let events =
            context.clone().map(|c| Arc::new(EventCache { _context: c, idle: Mutex::new(Vec::new()) }));
        let home = if raw as usize == sys::CU_STREAM_PER_THREAD { thread_number() } else { 0 };
        CudaStream { raw, owned, context, events, home }
    }

    /// The driver's handle.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// Whether this is one of the default streams (legacy or per-thread),
    /// named by a special handle rather than made.
    pub fn is_default(&self) -> bool {
        matches!(self.raw as usize, 0 | sys::CU_STREAM_LEGACY | sys::CU_STREAM_PER_THREAD)
    }

    /// The context to make current for calls on this stream: the known
    /// one, else the stream's own as the driver reports it, else none
    /// (default streams of an unknown context use whatever is current).
    fn call_context(&self) -> Result<sys::CUcontext> {
        if let Some(c) = &self.context {
            return Ok(c.raw());
        }
        if self.is_default() {
            return Ok(ptr::null_mut());
        }
        let mut ctx = ptr::null_mut();
        // SAFETY: `raw` is a valid stream handle (the promise of `from_raw`);
        // the out parameter points at a live local.
        check(unsafe { sys::cuStreamGetCtx(self.raw, &mut ctx) })?;
        Ok(ctx)
    }

    /// Runs `f` with the stream's context current.
    pub(crate) fn scope<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let _current = match &self.context {
            Some(c) => Current::of(c)?,
            // SAFETY: null (a default stream, the thread's context as it
            // is), or the context of a borrowed stream, which lives while
            // the stream does (the contract of `from_raw`), and so while
            // this call, which borrows the stream, runs.
            None => unsafe { Current::enter(self.call_context()?)? },
        };
        f()
    }
}

impl Drop for CudaStream {
    /// An owned stream waits for its work, then is destroyed. The driver
    /// may hand its handle, its [`id`](Stream::id), to the next stream
    /// made, and a pool that kept blocks freed on this one would serve
    /// them there with no wait: that is safe only once this one's work
    /// has run (`cuStreamDestroy` alone returns at once).
    fn drop(&mut self) {
        if self.owned {
            // A stream that cannot synchronize has failed and runs no more work.
            let _ = Stream::synchronize(self);
            // SAFETY: an owned handle was created by `cuStreamCreateWithPriority`
            // and is destroyed only here. An error (driver shut down) leaves
            // nothing to undo.
            let _ = unsafe { sys::cuStreamDestroy_v2(self.raw) };
        }
    }
}

/// The [`Stream::id`] of a raw handle, for a per-thread stream the one of
/// thread `home`; see [`CudaStream`].
fn stream_id(raw: sys::CUstream, home: u64) -> u64 {
    match raw as usize {
        0 | sys::CU_STREAM_LEGACY => 0,
        // User-space pointers stay below 2^47: an id with the top bit set
        // is never a real handle.
        sys::CU_STREAM_PER_THREAD => (1 << 63) | (home << 2) | sys::CU_STREAM_PER_THREAD as u64,
        h => h as u64,
    }
}

/// Runs `queue`, which queues work on the stream's handle, in the
/// stream's order. When `stream` names another thread's per-thread stream
/// (see [`CudaStream`]), the handle names the calling thread's: the work
/// then comes after all work of the current context ([`join_its_thread`])
/// and is waited for, so it is ordered after what the stream's thread
/// queued so far and before what it queues next. Called with the stream's
/// context current.
pub(crate) fn in_order<S: AsRawStream + ?Sized, T>(
    stream: &S,
    queue: impl FnOnce(sys::CUstream) -> Result<T>,
) -> Result<T> {
    join_its_thread(stream)?;
    in_order_joined(stream, queue)
}

/// The first half of [`in_order`], for a caller that takes a lock before
/// it queues: waiting for the whole context under a lock would hold it
/// while work of every stream runs (work that may wait for that lock's
/// next holder).
pub(crate) fn join_its_thread<S: AsRawStream + ?Sized>(stream: &S) -> Result<()> {
    if stream.off_its_thread() {
        // SAFETY: takes no argument; a context is current (the caller's
        // scope), and none is reported as an error.
        check(unsafe { sys::cuCtxSynchronize() })?;
    }
    Ok(())
}

/// The capture `raw` is in now, by its id: `None` where it captures
/// nothing, its capture is spoiled, or the driver cannot say (the legacy
/// stream while a blocking stream captures).
///
/// # Safety
///
/// `raw` is a valid stream of the current context (or a default stream
/// handle).
pub(crate) unsafe fn capture_of(raw: sys::CUstream) -> Option<u64> {
    let (mut status, mut id) = (sys::CU_STREAM_CAPTURE_STATUS_NONE, 0);
    let (graph, dependencies, count) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: the caller vouches for the stream; `status` and `id` are
    // valid places for the answers, and the outputs not asked for are null,
    // as the driver allows.
    let asked =
        unsafe { sys::cuStreamGetCaptureInfo_v2(raw, &mut status, &mut id, graph, dependencies, count) };
    (asked == sys::CUDA_SUCCESS && status == sys::CU_STREAM_CAPTURE_STATUS_ACTIVE).then_some(id)
}

/// Waits until the work this thread has just queued on `raw` has
/// finished, or will never run: `Ok` only once it has finished, an error
/// only where it never will. `before` is [`capture_of`] `raw` before the
/// work was queued.
///
/// It never will where the context has failed (errors of work are sticky:
/// it runs no more work), or where the work was captured into a graph, not
/// run: where `raw` is in the same capture now as before the work was
/// queued (ids are unique, so that capture spanned the queueing). The
/// wait then spoils the capture (the driver refuses a wait on a capturing
/// stream, and the refusal invalidates the capture), so no graph is made
/// of the work.
///
/// Any other refusal for a capture is waited out, asked again every 100
/// µs: a capture begun on `raw` after the work was queued (the work runs,
/// and a wait is refused until that capture ends; each refusal spoils
/// it); a capture elsewhere (another thread's, or this thread's on
/// another stream, in the driver's default global mode) makes the driver
/// refuse a wait while the work runs on (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`):
/// the wait is made in relaxed mode, where the driver allows it, and where
/// it refuses still (the legacy stream while a blocking stream of another
/// thread captures, `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`), it is asked
/// again until that capture ends. (This thread's own capture of a blocking
/// stream cannot be the cause: it would have refused the queueing on the
/// legacy stream.) (The wait asked only whether `raw` captured, before:
/// a capture begun after a copy into host memory was queued ended the
/// copy's access while it ran.)
///
/// # Safety
///
/// `raw` is a valid stream of the current context (or a default stream
/// handle).
pub(crate) unsafe fn wait_for_work(raw: sys::CUstream, before: Option<u64>) -> Result<()> {
    // SAFETY: the caller vouches for the stream.
    let captured = before.is_some() && unsafe { capture_of(raw) } == before;
    let _relaxed = RelaxedCapture::enter();
    loop {
        // SAFETY: as above.
        let waited = unsafe { sys::cuStreamSynchronize(raw) };
        let capture =
            sys::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED..=sys::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
        if captured {
            // In a graph, not run: an error even where the capture ended
            // before the wait could spoil it.
            let refused = crate::error_from_code(sys::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            return Err(check(waited).err().unwrap_or(refused));
        }
        if !capture.contains(&waited) {
            return check(waited);
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

/// `f`, which waits for or asks about work or takes or frees memory, in
/// relaxed capture mode: in the driver's default global mode, while any
/// thread captures a graph, such a call is refused and invalidates that
/// capture (a capture is another thread's business; a call of memres's
/// must not end it). Nothing is asked again: where the driver still
/// refuses, the caller has its error, with nothing queued that would need
/// the wait. It refuses `cuCtxSynchronize` in either mode, which is not
/// made relaxed (an H100, driver 580.159.04). Only the synchronous leaves'
/// allocations and frees are: the stream-ordered pools' are stream work,
/// and two more driver calls on their every allocation were not measured.
pub(crate) fn relaxed<T>(f: impl FnOnce() -> T) -> T {
    let _relaxed = RelaxedCapture::enter();
    f()
}

/// This thread's stream-capture mode, relaxed until the value drops, then
/// what it was.
struct RelaxedCapture {
    /// The mode before; `None` if the driver refused the exchange.
    before: Option<std::ffi::c_int>,
}

impl RelaxedCapture {
    fn enter() -> RelaxedCapture {
        let mut mode = sys::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: `mode` is a valid place to read the mode from and write the old one to.
        let swapped = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        RelaxedCapture { before: (swapped == sys::CUDA_SUCCESS).then_some(mode) }
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some(mut mode) = self.before {
            // SAFETY: as in `enter`.
            unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        }
    }
}

/// A free in the stream's order: as [`in_order`], without the wait after
/// the work. Once freed, a block is used by no later work of the stream's
/// thread, and the driver hands its memory to another stream only after
/// the free completes or behind a dependency on it; so a queued free is
/// done, whatever a wait after it would say.
pub(crate) fn free_in_order<S: AsRawStream + ?Sized>(
    stream: &S,
    queue: impl FnOnce(sys::CUstream) -> Result<()>,
) -> Result<()> {
    join_its_thread(stream)?;
    queue(stream.as_raw_stream())
}

/// An allocation in the stream's order: as [`in_order`], but where the
/// wait after a queued allocation fails, the block, handed to no one, goes
/// to `discard` with the handle it was allocated on, and the wait's error
/// is returned.
///
/// `discard` frees it in that handle's order without waiting for anything
/// first: no work but its allocation was ever ordered on it, and a free on
/// the handle comes after that. (A free through the resource's
/// `deallocate` would first wait for the whole context, which fails again
/// where the wait failed for good.) It takes the block out of the
/// resource's table whatever the driver answers: no one holds the block to
/// free it later, so kept there it would be live for good.
pub(crate) fn allocate_in_order<S: AsRawStream + ?Sized>(
    stream: &S,
    queue: impl FnOnce(sys::CUstream) -> Result<Block>,
    discard: impl FnOnce(Block, sys::CUstream),
) -> Result<Block> {
    let mut made = None;
    let r = in_order(stream, |raw| {
        let block = queue(raw)?;
        made = Some((block, raw));
        Ok(block)
    });
    match (r, made) {
        (Err(e), Some((block, raw))) => {
            discard(block, raw);
            Err(e)
        }
        (r, _) => r,
    }
}

/// The second half of [`in_order`], after [`join_its_thread`].
pub(crate) fn in_order_joined<S: AsRawStream + ?Sized, T>(
    stream: &S,
    queue: impl FnOnce(sys::CUstream) -> Result<T>,
) -> Result<T> {
    let raw = stream.as_raw_stream();
    let off = stream.off_its_thread();
    // SAFETY: `raw` is valid while `stream` is borrowed (`AsRawStream`'s
    // contract).
    let before = if off { unsafe { capture_of(raw) } } else { None };
    let queued = queue(raw)?;
    if off {
        // The work is queued: an error of the wait must mean it never runs.
        // SAFETY: as above.
        unsafe { wait_for_work(raw, before) }?;
    }
    Ok(queued)
}

impl Stream for CudaStream {
    type Event = CudaEvent;

    fn id(&self) -> u64 {
        stream_id(self.raw, self.home)
    }

    /// The legacy default stream, as RMM's pools free on the default stream
    /// when destroyed; the resources of this crate make their own context
    /// current for the call.
    fn at_drop(give_back: &mut dyn FnMut(&Self)) -> bool {
        give_back(&CudaStream::legacy());
        true
    }

    fn static_drop_stream() -> Option<&'static Self> {
        static LEGACY: CudaStream = CudaStream::legacy();
        Some(&LEGACY)
    }

    /// A default stream of no known context records in the current context,
    /// which must be a primary one: the event keeps it alive.
    fn record(&self) -> Result<CudaEvent> {
        self.scope(|| {
            let event = match self.events.as_ref().and_then(|c| c.take()) {
                Some(event) => event,
                None if self.events.is_none() && self.is_default() => {
                    let context = Context::current_primary()?;
                    let mut event = CudaEvent::new(None)?;
                    event.context = Some(context);
                    event
                }
                None => CudaEvent::new(self.events.clone())?,
            };
            // SAFETY: both handles are valid: the event belongs to the current
            // context (made in it now, or idle in its cache), and no one else
            // holds it; the stream is ours or promised valid.
            in_order(self, |raw| check(unsafe { sys::cuEventRecord(event.raw, raw) }))?;
            Ok(event)
        })
    }

    fn wait(&self, event: &CudaEvent) -> Result<()> {
        if self.off_its_thread() {
            // The other thread's stream cannot be named from here: all work
            // queued after this call, on any stream, runs after the event.
            return self.scope(|| event.synchronize());
        }
        // SAFETY: both handles are valid while borrowed; flags must be 0.
        self.scope(|| check(unsafe { sys::cuStreamWaitEvent(self.raw, event.raw, 0) }))
    }

    fn query(&self, event: &CudaEvent) -> Result<bool> {
        event.query()
    }

    fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is valid while `self` lives.
        self.scope(|| in_order(self, |raw| check(relaxed(|| unsafe { sys::cuStreamSynchronize(raw) }))))
    }

    /// `cuCtxSynchronize` in the stream's context.
    fn synchronize_device(&self) -> Result<bool> {
        // SAFETY: takes no argument; the stream's context (or the current
        // one) is current in the scope, and the driver reports none as an error.
        self.scope(|| check(unsafe { sys::cuCtxSynchronize() }))?;
        Ok(true)
    }
}

// SAFETY: `raw` is null, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`, a
// stream this value owns and destroys only on drop, or one named by
// `from_raw`, whose caller promised it valid while the value lives;
// `context` is the stream's (`in_context`, `legacy_in`, or `from_raw`'s
// promise).
unsafe impl AsRawStream for CudaStream {
    fn as_raw_stream(&self) -> sys::CUstream {
        self.raw
    }
    fn context(&self) -> Option<&Context> {
        self.context.as_ref()
    }
    fn off_its_thread(&self) -> bool {
        self.raw as usize == sys::CU_STREAM_PER_THREAD && self.home != thread_number()
    }
}

/// A stream's device is its context's; a borrowed stream of unknown context
/// is taken to be the current context's (device 0 when the thread has none,
/// or the driver cannot say). Its device's resources are registered under
/// `CudaStream`.
impl DeviceStream for CudaStream {
    type Key = CudaStream;
    fn key(&self) -> &CudaStream {
        self
    }
    fn device(&self) -> DeviceId {
        match &self.context {
            Some(context) => context.device().ordinal(),
            None => Device::current().map_or(0, |d| d.ordinal()),
        }
    }
}

/// A CUDA event (made without timing, the cheap kind). Dropped, it goes back
/// to its stream's idle events for the next [`record`](Stream::record), or
/// is destroyed.
///
/// # Examples
///
/// ```no_run
/// use memres_core::Stream;
/// let s = memres_cuda::CudaStream::new(memres_cuda::Device::get(0)?)?;
/// let e = s.record()?;
/// e.synchronize()?;
/// assert!(e.query()?);
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct CudaEvent {
    /// Valid until `Drop` destroys it or hands it to `home`.
    raw: sys::CUevent,
    /// The idle events of the context `raw` belongs to, if it has them
    /// (they keep the context alive).
    home: Option<Arc<EventCache>>,
    /// The context `raw` belongs to, kept alive, when no `home` does: an
    /// event of a default stream of no known context. Otherwise `None`, and
    /// the context is the stream's, which `from_raw`'s caller promised
    /// alive for as long as the events recorded on it.
    context: Option<Context>,
}

// SAFETY: event handles may be used from any thread; the handle is
// destroyed exactly once, by `Drop`.
unsafe impl Send for CudaEvent {}
// SAFETY: as above; methods take `&self` and only pass the handle on.
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    /// An event in the current context, to go back to `home` (the current
    /// context's idle events) when dropped. Callers make the context current.
    fn new(home: Option<Arc<EventCache>>) -> Result<CudaEvent> {
        let mut raw = ptr::null_mut();
        // SAFETY: the out parameter points at a live local; the driver
        // reports a missing context as an error.
        check(unsafe { sys::cuEventCreate(&mut raw, sys::CU_EVENT_DISABLE_TIMING) })?;
        Ok(CudaEvent { raw, home, context: None })
    }

    /// The driver's handle, valid while `self` lives.
    pub fn raw(&self) -> sys::CUevent {
        self.raw
    }

    /// Whether the work before the event has completed (`cuEventQuery`).
    ///
    /// # Errors
    ///
    /// Any driver error but `CUDA_ERROR_NOT_READY` (which is `false`), as
    /// [`Error::Backend`].
    pub fn query(&self) -> Result<bool> {
        // SAFETY: the handle is valid while `self` lives.
        match relaxed(|| unsafe { sys::cuEventQuery(self.raw) }) {
            sys::CUDA_SUCCESS => Ok(true),
            sys::CUDA_ERROR_NOT_READY => Ok(false),
            code => Err(error_from_code(code)),
        }
    }

    /// Blocks until the work before the event has completed.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is valid while `self` lives.
        check(relaxed(|| unsafe { sys::cuEventSynchronize(self.raw) }))
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if self.home.as_ref().is_some_and(|h| h.give(self.raw)) {
            return;
        }
        // SAFETY: the handle was made by `cuEventCreate` and is destroyed
        // only here; the driver defers the release if the event is still
        // pending. An error leaves nothing to undo.
        let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}

/// Events of one context that no one holds, ready to be recorded again:
/// recording an event per free, as stream-ordered pools do, then costs no
/// create and destroy. Re-recording an idle event is safe: a stream that
/// waited on it captured the record it waited for when it called
/// `cuStreamWaitEvent`.
#[derive(Debug)]
struct EventCache {
    /// Keeps the events' context alive until they are destroyed.
    _context: Context,
    /// At most [`EventCache::MAX`] idle events of `context`.
    idle: Mutex<Vec<sys::CUevent>>,
}

// SAFETY: event handles may be used from any thread; each idle handle is
// owned by the cache alone (taken out before use, destroyed once in `Drop`).
unsafe impl Send for EventCache {}
// SAFETY: as above; the handles are only reached through the mutex.
unsafe impl Sync for EventCache {}

impl EventCache {
    /// Idle events kept per cache (a stream's, shared by those named
    /// beside it); more are destroyed.
    const MAX: usize = 64;

    /// An idle event, now owned by the caller.
    fn take(self: &Arc<Self>) -> Option<CudaEvent> {
        let raw = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
        Some(CudaEvent { raw, home: Some(self.clone()), context: None })
    }

    /// Keeps `raw` for reuse; `false` if the cache is full (the caller
    /// destroys it then).
    fn give(&self, raw: sys::CUevent) -> bool {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() >= Self::MAX {
            return false;
        }
        idle.push(raw);
        true
    }
}

impl Drop for EventCache {
    fn drop(&mut self) {
        let idle = self.idle.get_mut().unwrap_or_else(|p| p.into_inner());
        for raw in idle.drain(..) {
            // SAFETY: idle events are owned by the cache alone; the context
            // they belong to is retained by `self._context` until after this.
            let _ = unsafe { sys::cuEventDestroy_v2(raw) };
        }
    }
}

/// A fixed set of streams handed out round robin: RMM's `cuda_stream_pool`.
///
/// # Examples
///
/// ```no_run
/// use memres_core::Stream;
/// let pool = memres_cuda::StreamPool::new(memres_cuda::Device::get(0)?, 4)?;
/// let (a, b) = (pool.get(), pool.get());
/// assert_ne!(a.id(), b.id());
/// assert_eq!(pool.get_at(5).id(), pool.get_at(1).id());
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct StreamPool {
    /// Never empty.
    streams: Vec<CudaStream>,
    /// Index of the next stream [`get`](StreamPool::get) hands out (mod len).
    next: AtomicUsize,
}

impl StreamPool {
    /// RMM's default pool size.
    pub const DEFAULT_SIZE: usize = 16;

    /// `size` new streams on `device` (blocking, default priority).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a size of 0; the driver's error as
    /// [`Error::Backend`].
    pub fn new(device: Device, size: usize) -> Result<StreamPool> {
        Self::with_options(device, size, StreamOptions::default())
    }

    /// `size` new streams on `device` with `options`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a size of 0; the driver's error as
    /// [`Error::Backend`].
    pub fn with_options(device: Device, size: usize, options: StreamOptions) -> Result<StreamPool> {
        if size == 0 {
            return Err(Error::InvalidConfig { what: "a stream pool needs at least one stream" });
        }
        let context = device.primary_context()?;
        let streams = (0..size)
            .map(|_| CudaStream::in_context(context.clone(), options))
            .collect::<Result<Vec<_>>>()?;
        Ok(StreamPool { streams, next: AtomicUsize::new(0) })
    }

    /// The next stream, round robin.
    pub fn get(&self) -> &CudaStream {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        &self.streams[i % self.streams.len()]
    }

    /// The stream at `index` modulo the pool's size.
    pub fn get_at(&self, index: usize) -> &CudaStream {
        &self.streams[index % self.streams.len()]
    }

    /// Number of streams.
    pub fn len(&self) -> usize {
        self.streams.len()
    }

    /// Always `false`: a pool has at least one stream.
    pub fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_stream_ids() {
        assert_eq!(CudaStream::legacy().id(), 0);
        // SAFETY: `CU_STREAM_LEGACY` is one of the handles `from_raw` accepts.
        let legacy = unsafe { CudaStream::from_raw(sys::CU_STREAM_LEGACY as sys::CUstream, None) };
        assert_eq!(legacy.id(), 0);
        assert!(legacy.is_default() && CudaStream::per_thread().is_default());
        let pt = CudaStream::per_thread();
        let mine = pt.id();
        assert_eq!(mine, CudaStream::per_thread().id(), "stable on one thread");
        assert_eq!(mine & 3, 2);
        assert!(mine >= 1 << 63);
        assert!(!pt.off_its_thread());
        let other = std::thread::spawn(|| CudaStream::per_thread().id()).join().unwrap();
        assert_ne!(mine, other, "each thread's per-thread stream is its own");
        let (moved, off) = std::thread::spawn(move || (pt.id(), pt.off_its_thread())).join().unwrap();
        assert_eq!(moved, mine, "a value moved to another thread names its own thread's stream");
        assert!(off);
        assert!(!CudaStream::legacy().off_its_thread());
        assert_eq!(stream_id(0x7f00_1234_5600 as sys::CUstream, 0), 0x7f00_1234_5600);
    }

    #[test]
    fn unit_stream_is_the_null_stream() {
        assert!(().as_raw_stream().is_null());
        assert!(().context().is_none());
    }
}
