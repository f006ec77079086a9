//! The stream-ordered resources against the model of the driver: what a
//! GPU test cannot do, fail a wait at will and make the context's error
//! sticky.

use super::{install, take, Call, Driver};
use crate::host_visible;
use crate::sys;
use crate::{CudaAsyncManagedMemory, CudaAsyncMemory, CudaStream};
use memres_core::{Error, MemoryResource, Request};

/// A pool handle the model takes; no driver sees it.
const POOL: sys::CUmemoryPool = 0x5000 as sys::CUmemoryPool;
const ILLEGAL_ADDRESS: sys::CuResult = 700;
const UNKNOWN: sys::CuResult = 999;

/// Runs `f` on another thread than the one `stream` is the per-thread
/// stream of, with `driver` answering its calls: the allocations there
/// join the stream's thread and wait for their work
/// ([`in_order`](crate::stream::in_order)). Returns `f`'s answer and the
/// model after it.
fn elsewhere<T: Send + 'static>(
    driver: Driver,
    f: impl FnOnce(&CudaStream) -> T + Send + 'static,
) -> (T, Driver) {
    let stream = CudaStream::per_thread();
    std::thread::spawn(move || {
        assert!(crate::AsRawStream::off_its_thread(&stream));
        install(driver);
        let answer = f(&stream);
        (answer, take())
    })
    .join()
    .unwrap()
}

/// The calls but the exchanges of the thread's capture mode, which every
/// wait makes ([`relaxed`](crate::stream::relaxed)), and the questions of
/// which capture a stream is in, asked before work that is waited for
/// ([`capture_of`](crate::stream::capture_of)).
fn work_calls(driver: &Driver) -> Vec<Call> {
    let asked = |c: &&Call| matches!(c, Call::CaptureMode { .. } | Call::CaptureInfo { .. });
    driver.calls.iter().filter(|c| !asked(c)).copied().collect()
}

/// The calls after the wait that failed, but the mode exchanges and the
/// capture questions.
fn after_the_wait(driver: &Driver) -> Vec<Call> {
    let calls = work_calls(driver);
    let wait = calls.iter().position(|c| matches!(c, Call::StreamSync { .. })).expect("a wait");
    calls[wait + 1..].to_vec()
}

const PER_THREAD: usize = sys::CU_STREAM_PER_THREAD;

/// A sticky error in the wait after the allocation: the free of the block
/// no one was handed fails too (as every call does), and the block is
/// still out of the resource's table, the wait's error returned.
#[test]
fn a_block_whose_wait_fails_for_good_is_not_kept_live() {
    let driver = Driver { fail_wait: Some(ILLEGAL_ADDRESS), sticky: true, addresses: 1, ..Driver::default() };
    let mr = CudaAsyncMemory::fake(POOL);
    let ((got, live), driver) = elsewhere(driver, move |stream| {
        let got = mr.allocate(Request::new(1000).unwrap(), stream);
        (got, mr.live().len())
    });
    assert_eq!(got, Err(crate::error_from_code(ILLEGAL_ADDRESS)));
    assert_eq!(live, 0, "the block stays counted live: {:?}", driver.calls);
    let base = *driver.allocated.keys().next().expect("the driver could not free it");
    assert_eq!(after_the_wait(&driver), [Call::Free { base, stream: PER_THREAD }]);
}

/// A wait that fails, the context still usable: the block is freed on the
/// handle it was allocated on, without waiting for anything first.
#[test]
fn a_block_whose_wait_fails_is_freed_where_it_was_allocated() {
    let driver = Driver { fail_wait: Some(UNKNOWN), addresses: 2, ..Driver::default() };
    let mr = CudaAsyncMemory::fake(POOL);
    let ((got, live), driver) = elsewhere(driver, move |stream| {
        let got = mr.allocate(Request::new(1000).unwrap(), stream);
        (got, mr.live().len())
    });
    assert_eq!(got, Err(crate::error_from_code(UNKNOWN)));
    assert_eq!(live, 0);
    assert!(driver.allocated.is_empty(), "not freed: {:?}", driver.calls);
    let &[Call::Free { base, stream }] = &after_the_wait(&driver)[..] else {
        panic!("the free waited, or there was none: {:?}", driver.calls)
    };
    assert_eq!(
        work_calls(&driver)[..2],
        [Call::ContextSync, Call::Alloc { base, stream: PER_THREAD }],
        "the allocation joins the stream's thread"
    );
    assert_eq!(stream, PER_THREAD);
}

/// The same of managed memory: the allocation leaves the resource's table
/// and the table of host-visible allocations, so `CudaCopy` refuses it.
#[test]
fn a_managed_block_whose_wait_fails_for_good_is_not_kept_live() {
    let driver = Driver { fail_wait: Some(ILLEGAL_ADDRESS), sticky: true, addresses: 3, ..Driver::default() };
    let mr = CudaAsyncManagedMemory::fake(POOL);
    let ((got, live), driver) = elsewhere(driver, move |stream| {
        let got = mr.allocate(Request::new(1000).unwrap(), stream);
        (got, mr.live().live().len())
    });
    assert_eq!(got, Err(crate::error_from_code(ILLEGAL_ADDRESS)));
    assert_eq!(live, 0, "the block stays counted live: {:?}", driver.calls);
    let base = *driver.allocated.keys().next().expect("the driver could not free it");
    assert_eq!(host_visible::lock().live.check(base, 1), Err(Error::NotLive { addr: base, len: 1 }));
    assert_eq!(after_the_wait(&driver), [Call::Free { base, stream: PER_THREAD }]);
}

#[test]
fn a_managed_block_whose_wait_fails_is_freed_where_it_was_allocated() {
    let driver = Driver { fail_wait: Some(UNKNOWN), addresses: 4, ..Driver::default() };
    let mr = CudaAsyncManagedMemory::fake(POOL);
    let ((got, live), driver) = elsewhere(driver, move |stream| {
        let got = mr.allocate(Request::new(1000).unwrap(), stream);
        (got, mr.live().live().len())
    });
    assert_eq!(got, Err(crate::error_from_code(UNKNOWN)));
    assert_eq!(live, 0);
    assert!(driver.allocated.is_empty(), "not freed: {:?}", driver.calls);
    let &[Call::Free { base, stream }] = &after_the_wait(&driver)[..] else {
        panic!("the free waited, or there was none: {:?}", driver.calls)
    };
    assert_eq!(work_calls(&driver)[1], Call::Alloc { base, stream: PER_THREAD });
    assert_eq!(stream, PER_THREAD);
    assert_eq!(host_visible::lock().live.check(base, 1), Err(Error::NotLive { addr: base, len: 1 }));
}

/// The free that follows the allocation reserving a pool's initial size
/// is refused once: it is tried again after the context is idle, and the
/// block is freed, none left live.
#[test]
fn a_refused_priming_free_is_tried_again_once_the_context_is_idle() {
    install(Driver { refuse_frees: vec![UNKNOWN], addresses: 5, ..Driver::default() });
    let mr = CudaAsyncMemory::fake(POOL);
    let got = mr.prime(4096);
    let (live, driver) = (mr.live().len(), take());
    assert_eq!(got, Ok(()));
    assert_eq!(live, 0, "the block stays live: {:?}", driver.calls);
    assert!(driver.allocated.is_empty(), "not freed: {:?}", driver.calls);
    let frees: Vec<_> = driver.calls.iter().filter(|c| matches!(c, Call::Free { .. })).collect();
    assert_eq!(frees.len(), 2, "{:?}", driver.calls);
    let calls = work_calls(&driver);
    let retry = calls.iter().rposition(|c| matches!(c, Call::Free { .. })).unwrap();
    assert_eq!(calls[retry - 1], Call::ContextSync, "the retry waits for the context first");
}

/// Refused twice, the free's error is returned and the block is still
/// counted live (it was not freed).
#[test]
fn a_priming_free_refused_twice_is_the_error() {
    install(Driver { refuse_frees: vec![UNKNOWN, UNKNOWN], addresses: 6, ..Driver::default() });
    let mr = CudaAsyncMemory::fake(POOL);
    let got = mr.prime(4096);
    let (live, driver) = (mr.live().len(), take());
    assert_eq!(got, Err(crate::error_from_code(UNKNOWN)));
    assert_eq!(live, 1);
    assert_eq!(driver.allocated.len(), 1);
    assert_eq!(driver.calls.iter().filter(|c| matches!(c, Call::Free { .. })).count(), 2);
}

/// A pool made here is destroyed once its context's work has finished,
/// so no free into it is still queued (a view's pool is left alone): the
/// driver hangs now and then when threads destroy pools with frees queued
/// while others use pools (docs/verification.md).
#[test]
fn an_owned_pool_is_destroyed_after_its_context_is_idle() {
    install(Driver { addresses: 7, ..Driver::default() });
    let mr = CudaAsyncMemory::fake_owned(POOL);
    let b = mr.allocate(Request::new(4096).unwrap(), &()).unwrap();
    mr.deallocate(b, &()).unwrap();
    drop(mr);
    drop(CudaAsyncMemory::fake(POOL));
    let driver = take();
    let pool = POOL as usize;
    assert_eq!(
        work_calls(&driver)[2..],
        [Call::ContextSync, Call::PoolDestroy { pool }],
        "{:?}",
        driver.calls
    );
}

/// `wait_for_work` on the legacy stream with `driver`, for work queued
/// when the stream was in the capture `before`: its answer, and the model
/// after it.
fn wait_for_work_with(driver: Driver, before: Option<u64>) -> (memres_core::Result<()>, Driver) {
    install(driver);
    // SAFETY: the model answers every call the wait makes.
    let waited = unsafe { crate::stream::wait_for_work(sys::CU_STREAM_LEGACY as sys::CUstream, before) };
    (waited, take())
}

const LEGACY: usize = sys::CU_STREAM_LEGACY;
const RELAXED: Call = Call::CaptureMode { mode: sys::CU_STREAM_CAPTURE_MODE_RELAXED };
const GLOBAL: Call = Call::CaptureMode { mode: sys::CU_STREAM_CAPTURE_MODE_GLOBAL };
const ACTIVE: std::ffi::c_int = sys::CU_STREAM_CAPTURE_STATUS_ACTIVE;
const INVALIDATED: std::ffi::c_int = 2;
const UNSUPPORTED: sys::CuResult = sys::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;

/// A wait the driver refuses for a capture elsewhere (the legacy stream
/// while another thread's blocking stream captures) while the work runs
/// on: asked again, in relaxed mode, until it is answered; the thread's
/// mode is given back. (It returned the refusal at once, and `CudaCopy`
/// let a free of pinned memory through under a copy still running.)
#[test]
fn a_wait_refused_for_a_capture_elsewhere_is_asked_again_in_relaxed_mode() {
    let driver = Driver { fail_wait: Some(sys::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), ..Driver::default() };
    let (waited, driver) = wait_for_work_with(driver, None);
    assert_eq!(waited, Ok(()));
    let sync = Call::StreamSync { stream: LEGACY };
    assert_eq!(driver.calls, [RELAXED, sync, sync, GLOBAL]);
    assert_eq!(driver.capture_mode, sys::CU_STREAM_CAPTURE_MODE_GLOBAL);
}

/// Work queued in the capture the stream is still in was captured, not
/// run, and the wait spoiled the capture: the refusal is the answer, and
/// an error even where the capture ended before the wait (no graph of the
/// work is spoiled then, but none of it ran). So is a sticky error,
/// without asking about captures.
#[test]
fn a_wait_for_work_still_in_its_capture_or_on_a_failed_context_is_an_error() {
    let driver =
        Driver { fail_wait: Some(UNSUPPORTED), capture_status: Some((ACTIVE, 7)), ..Driver::default() };
    let (waited, driver) = wait_for_work_with(driver, Some(7));
    assert_eq!(waited, Err(crate::error_from_code(UNSUPPORTED)));
    let sync = Call::StreamSync { stream: LEGACY };
    let info = Call::CaptureInfo { stream: LEGACY };
    assert_eq!(driver.calls, [info, RELAXED, sync, GLOBAL]);
    let ended_at_the_wait = Driver { capture_status: Some((ACTIVE, 7)), ..Driver::default() };
    assert_eq!(wait_for_work_with(ended_at_the_wait, Some(7)).0, Err(crate::error_from_code(UNSUPPORTED)));
    let driver = Driver { fail_wait: Some(ILLEGAL_ADDRESS), sticky: true, ..Driver::default() };
    let (waited, driver) = wait_for_work_with(driver, None);
    assert_eq!(waited, Err(crate::error_from_code(ILLEGAL_ADDRESS)));
    assert_eq!(driver.calls, [RELAXED, sync, GLOBAL]);
}

/// Work queued outside the capture the stream is in now runs: a capture
/// begun after it was queued, or another than the one it was queued in,
/// refuses the wait, which is asked again until it is answered. (Asked
/// only whether the stream captured, the wait gave up at the first
/// refusal: a copy into pinned memory ended its access while it ran, and a
/// free could go through under it.)
#[test]
fn a_wait_for_work_queued_outside_the_capture_now_waits_it_out() {
    let sync = Call::StreamSync { stream: LEGACY };
    let info = Call::CaptureInfo { stream: LEGACY };
    for (before, asked) in [(None, &[][..]), (Some(6), &[info][..])] {
        let driver =
            Driver { fail_wait: Some(UNSUPPORTED), capture_status: Some((ACTIVE, 7)), ..Driver::default() };
        let (waited, driver) = wait_for_work_with(driver, before);
        assert_eq!(waited, Ok(()), "{before:?}");
        assert_eq!(driver.calls, [asked, &[RELAXED, sync, sync, GLOBAL]].concat(), "{before:?}");
    }
}

/// `capture_of` names an active capture only: a spoiled one has no id, and
/// the legacy stream's answer while a blocking stream captures is an error.
#[test]
fn capture_of_names_only_an_active_capture() {
    let legacy = sys::CU_STREAM_LEGACY as sys::CUstream;
    let none = sys::CU_STREAM_CAPTURE_STATUS_NONE;
    for (status, expected) in
        [(Some((ACTIVE, 7)), Some(7)), (Some((INVALIDATED, 7)), None), (Some((none, 7)), None), (None, None)]
    {
        install(Driver { capture_status: status, ..Driver::default() });
        // SAFETY: the model answers the call.
        assert_eq!(unsafe { crate::stream::capture_of(legacy) }, expected, "{status:?}");
        take();
    }
}

/// While another thread captures a graph in the global mode, the driver
/// refuses a stream's synchronization made in that mode, and the refusal
/// invalidates that capture. A stream's synchronization is made in
/// relaxed mode: answered, and the thread's mode given back. (It was
/// refused, `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`: a pool's steal or
/// unmap failed, and the capture was lost.) A context's synchronization is
/// refused in either mode: work on another thread's per-thread stream,
/// which joins that thread's work with one, is refused before anything is
/// queued.
#[test]
fn a_streams_wait_is_made_in_relaxed_mode_and_leaves_a_capture_elsewhere_alone() {
    let elsewhere_captures = || Driver { capture_elsewhere: true, ..Driver::default() };
    install(elsewhere_captures());
    let legacy = CudaStream::legacy();
    let answers =
        (memres_core::Stream::synchronize(&legacy), memres_core::Stream::synchronize_device(&legacy));
    let driver = take();
    let refused = Err(crate::error_from_code(sys::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
    assert_eq!(answers, (Ok(()), refused), "{:?}", driver.calls);
    let (sync, ctx) = (Call::StreamSync { stream: 0 }, Call::ContextSync);
    assert_eq!(driver.calls, [RELAXED, sync, GLOBAL, ctx]);
    let (filled, driver) = elsewhere(elsewhere_captures(), |stream| {
        let mut queued = false;
        crate::stream::in_order(stream, |_| {
            queued = true;
            Ok(())
        })
        .map(|()| queued)
    });
    assert_eq!((filled, driver.calls), (refused, vec![ctx]));
}
