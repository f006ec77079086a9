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
fn an_event_of_the_default_stream_keeps_its_context_alive() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(device) = gpu("an_event_of_the_default_stream_keeps_its_context_alive") else { return };
    // The legacy stream names no context: it records in the current one,
    // here bound by a retain that goes at once. Without the event's own
    // retain the primary context would be reset under it.
    let context = device.primary_context().unwrap();
    context.bind().unwrap();
    let e = CudaStream::legacy().record().unwrap();
    drop(context);
    e.synchronize().unwrap();
    assert!(e.query().unwrap());
    drop(e);
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
    drop(context); // kept retained while bound
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
