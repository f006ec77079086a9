//! Streams and events as the core's stream model: record, wait, query,
//! synchronize, and the stream pool. Each test reports itself SKIPPED (and
//! tests nothing) without a GPU.

mod common;

use common::{expect_filled, fill, gpu, Gate};
use memres_core::{MemoryResource, Request, Stream};
use memres_cuda::{CudaAsyncMemory, CudaStream, StreamOptions, StreamPool};
use std::sync::Mutex;

/// These tests hold streams with gates and use the legacy default stream,
/// which orders every blocking stream of the device: run one at a time so
/// that one test's gate does not hold another's work.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn record_query_and_wait_follow_stream_order() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(device) = gpu("record_query_and_wait_follow_stream_order") else { return };
    let a = CudaStream::new(device).unwrap();
    let b = CudaStream::with_options(device, StreamOptions { non_blocking: true, priority: 0 }).unwrap();
    let gate = Gate::block(&a);
    let on_a = a.record().unwrap();
    // `a` is held by the gate: the event cannot have completed.
    assert!(!a.query(&on_a).unwrap(), "event behind a closed gate reported complete");
    b.wait(&on_a).unwrap();
    let on_b = b.record().unwrap();
    assert!(!b.query(&on_b).unwrap(), "`b` waits on `a`, which is held");
    gate.open();
    b.synchronize().unwrap();
    assert!(b.query(&on_b).unwrap());
    assert!(a.query(&on_a).unwrap(), "`b` finished after waiting on it");
    a.synchronize().unwrap();
}

#[test]
fn an_event_of_an_idle_stream_is_complete_after_synchronize() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(device) = gpu("an_event_of_an_idle_stream_is_complete_after_synchronize") else { return };
    let s = CudaStream::new(device).unwrap();
    let e = s.record().unwrap();
    s.synchronize().unwrap();
    assert!(s.query(&e).unwrap());
    e.synchronize().unwrap();
    assert!(e.query().unwrap());
    // A dropped event is recorded again by the next `record`, not remade.
    let raw = e.raw();
    drop(e);
    let again = s.record().unwrap();
    assert_eq!(again.raw(), raw);
    s.synchronize().unwrap();
    assert!(s.query(&again).unwrap());
}

#[test]
fn streams_named_beside_another_share_its_idle_events_and_keep_their_own_order() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(device) = gpu("streams_named_beside_another_share_its_idle_events_and_keep_their_own_order")
    else {
        return;
    };
    let legacy = CudaStream::legacy_in(device.primary_context().unwrap());
    let (made, other) = (CudaStream::new(device).unwrap(), CudaStream::new(device).unwrap());
    // SAFETY: `made` and `other` are streams of the device's primary
    // context, `legacy`'s, and outlive the names.
    let (a, b) = unsafe {
        (CudaStream::from_raw_beside(made.raw(), &legacy), CudaStream::from_raw_beside(other.raw(), &legacy))
    };
    assert_eq!((a.id(), b.id()), (made.id(), other.id()));
    let first = a.record().unwrap();
    a.synchronize().unwrap();
    let raw = first.raw();
    drop((first, a));
    // An event recorded on one name goes back to the shared idle events:
    // the next record on another name takes it, made nothing new.
    let gate = Gate::block(&other);
    let on_b = b.record().unwrap();
    assert_eq!(on_b.raw(), raw);
    // Recorded on `b`, it follows `b`'s work, not `made`'s.
    assert!(!b.query(&on_b).unwrap(), "an event behind a closed gate reported complete");
    gate.open();
    b.synchronize().unwrap();
    assert!(b.query(&on_b).unwrap());
}

#[test]
fn a_primary_context_outlives_every_handle() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(device) = gpu("a_primary_context_outlives_every_handle") else { return };
    // The legacy stream names no context: it records in the current one,
    // here bound by a handle that goes at once, as does the event's.
    device.primary_context().unwrap().bind().unwrap();
    let e = CudaStream::legacy().record().unwrap();
    e.synchronize().unwrap();
    assert!(e.query().unwrap());
    drop(e);
    // With no handle left, the context is still active (with a retain per
    // handle, the driver reset it here while the thread kept it current),
    // and the thread works in it with no set-up.
    let (mut flags, mut active) = (0, 0);
    // SAFETY: both out parameters point at live locals; the device is real.
    let r = unsafe { memres_cuda::sys::cuDevicePrimaryCtxGetState(device.raw(), &mut flags, &mut active) };
    assert_eq!(r, memres_cuda::sys::CUDA_SUCCESS);
    assert_eq!(active, 1, "the primary context was reset when its handles went");
    let e = CudaStream::legacy().record().unwrap();
    e.synchronize().unwrap();
}

#[test]
fn a_primary_context_looked_up_by_ordinal_is_the_devices() {
    let Some(device) = gpu("a_primary_context_looked_up_by_ordinal_is_the_devices") else { return };
    let by_ordinal = memres_cuda::Context::primary(device.ordinal()).unwrap();
    assert_eq!(by_ordinal.raw(), device.primary_context().unwrap().raw());
    assert_eq!(by_ordinal.device(), device);
    let count = memres_cuda::Device::count().unwrap();
    assert!(memres_cuda::Context::primary(count).is_err(), "no such device");
}

#[test]
fn memory_freed_on_one_stream_is_safe_on_another_after_wait() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(device) = gpu("memory_freed_on_one_stream_is_safe_on_another_after_wait") else { return };
    let mr = CudaAsyncMemory::new(device).unwrap();
    let (a, b) = (CudaStream::new(device).unwrap(), CudaStream::new(device).unwrap());
    let x = mr.allocate(Request::new(1 << 20).unwrap(), &a).unwrap();
    fill(&a, &x, 1);
    mr.deallocate(x, &a).unwrap();
    let freed = a.record().unwrap();
    b.wait(&freed).unwrap();
    let y = mr.allocate(Request::new(1 << 20).unwrap(), &b).unwrap();
    fill(&b, &y, 2);
    expect_filled(&b, &y, 2);
    mr.deallocate(y, &b).unwrap();
    b.synchronize().unwrap();
}

#[test]
fn borrowed_and_default_streams() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(device) = gpu("borrowed_and_default_streams") else { return };
    let owned = CudaStream::new(device).unwrap();
    // SAFETY: `owned` outlives `borrowed`.
    let borrowed = unsafe { CudaStream::from_raw(owned.raw(), None) };
    assert_eq!(borrowed.id(), owned.id());
    assert!(!owned.is_default());
    // With no context given, the stream's own is found for the event.
    let e = borrowed.record().unwrap();
    owned.synchronize().unwrap();
    assert!(borrowed.query(&e).unwrap());
    drop(borrowed);
    owned.synchronize().unwrap(); // still alive: dropping a borrowed stream destroys nothing

    let legacy = memres_cuda::default_stream(device).unwrap();
    assert_eq!(legacy.id(), 0);
    let e = legacy.record().unwrap();
    legacy.synchronize().unwrap();
    assert!(legacy.query(&e).unwrap());

    // The per-thread stream uses the current context: bind one first.
    let context = device.primary_context().unwrap();
    context.bind().unwrap();
    let pt = CudaStream::per_thread();
    let e = pt.record().unwrap();
    pt.synchronize().unwrap();
    assert!(pt.query(&e).unwrap());
}

/// Runs `on_other_thread` on a new thread, with `context` bound there (if
/// any), while `gate` holds a stream and opens after a while; returns
/// whether the gate had opened when `on_other_thread` returned.
fn returns_after(
    gate: Gate,
    context: Option<&memres_cuda::Context>,
    on_other_thread: impl FnOnce() + Send + 'static,
) -> bool {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let opened = Arc::new(AtomicBool::new(false));
    let (context, seen) = (context.cloned(), opened.clone());
    let other = std::thread::spawn(move || {
        if let Some(context) = context {
            context.bind().unwrap();
        }
        on_other_thread();
        seen.load(Ordering::SeqCst)
    });
    // Long enough for a call that does not wait to return first.
    std::thread::sleep(std::time::Duration::from_millis(300));
    opened.store(true, Ordering::SeqCst);
    gate.open();
    other.join().unwrap()
}

#[test]
fn a_per_thread_stream_moved_to_another_thread_orders_after_its_own_threads_work() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(device) = gpu("a_per_thread_stream_moved_to_another_thread_orders_after_its_own_threads_work")
    else {
        return;
    };
    let context = device.primary_context().unwrap();
    context.bind().unwrap();
    let id = CudaStream::per_thread().id();

    let hold_this_thread = || Gate::block(&CudaStream::per_thread());

    // An event recorded there comes after the work its own thread queued.
    let pt = CudaStream::per_thread();
    let (tx, rx) = std::sync::mpsc::channel();
    let waited = returns_after(hold_this_thread(), Some(&context), move || {
        let e = pt.record().unwrap();
        tx.send((pt.query(&e).unwrap(), pt.id())).unwrap();
    });
    assert!(waited, "an event recorded on another thread did not wait for the stream's own work");
    let (complete, moved_id) = rx.recv().unwrap();
    assert!(complete);
    assert_eq!(moved_id, id, "the moved value names its own thread's stream");

    // `synchronize` there waits for it too, in the context the value was
    // made in, on a thread with none current.
    let pt = CudaStream::per_thread();
    let waited = returns_after(hold_this_thread(), None, move || pt.synchronize().unwrap());
    assert!(waited, "synchronize on another thread returned before the stream's own work");

    // A free there is queued after the stream's own work is done: the
    // driver's pool cannot hand the block to the other thread's stream
    // while this thread's work may still use it.
    let mr = std::sync::Arc::new(CudaAsyncMemory::new(device).unwrap());
    let pt = CudaStream::per_thread();
    let block = mr.allocate(Request::new(1 << 20).unwrap(), &pt).unwrap();
    let m = mr.clone();
    let waited = returns_after(hold_this_thread(), Some(&context), move || m.deallocate(block, &pt).unwrap());
    assert!(waited, "a free on another thread was queued before the stream's own work completed");

    // Waiting there for an event waits for the event itself.
    let held = CudaStream::new(device).unwrap();
    let gate = Gate::block(&held);
    let e = held.record().unwrap();
    let pt = CudaStream::per_thread();
    let waited = returns_after(gate, Some(&context), move || {
        pt.wait(&e).unwrap();
        assert!(e.query().unwrap());
    });
    assert!(waited, "`wait` on another thread returned before its event completed");
    held.synchronize().unwrap();
    CudaStream::per_thread().synchronize().unwrap();
}

#[test]
fn stream_pool_hands_streams_out_round_robin() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(device) = gpu("stream_pool_hands_streams_out_round_robin") else { return };
    let pool = StreamPool::new(device, 4).unwrap();
    assert_eq!(pool.len(), 4);
    let ids: Vec<u64> = (0..8).map(|_| pool.get().id()).collect();
    let mut distinct = ids[..4].to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "four different streams");
    assert_eq!(ids[..4], ids[4..], "then the same four again");
    assert_eq!(pool.get_at(6).id(), pool.get_at(2).id());
    for i in 0..4 {
        let s = pool.get_at(i);
        let e = s.record().unwrap();
        s.synchronize().unwrap();
        assert!(s.query(&e).unwrap());
    }
    assert!(StreamPool::new(device, 0).is_err());
}

/// An owned stream dropped with work queued waits for that work: the
/// driver may hand its handle, so its id, to the next stream made, and a
/// pool that kept blocks freed on it would serve them there with no wait
/// while the work still ran. Before, the drop returned at once (the work
/// went on after `cuStreamDestroy`).
#[test]
fn an_owned_stream_dropped_with_work_queued_waits_for_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(device) = gpu("an_owned_stream_dropped_with_work_queued_waits_for_it") else { return };
    let a = CudaStream::new(device).unwrap();
    let gate = Gate::block(&a);
    let queued = a.record().unwrap();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        gate.open();
    });
    drop(a);
    assert!(queued.query().unwrap(), "the dropped stream's work has run");
    opener.join().unwrap();
    // How often the driver hands a dropped stream's handle to the next one.
    let made: Vec<usize> = (0..32).map(|_| CudaStream::new(device).unwrap().raw() as usize).collect();
    let again = made.windows(2).filter(|w| w[0] == w[1]).count();
    println!("of 31 streams made after one was dropped, {again} had its handle");
}
