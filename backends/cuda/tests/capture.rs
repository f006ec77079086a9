//! `CudaCopy` and memres's waits while another thread captures a CUDA
//! graph in the driver's default global mode, which refuses "unsafe" calls
//! in every thread of the process: a binary of its own, so that no other
//! test runs then.

mod common;

use common::gpu;
use memres_containers::DeviceBuffer;
use memres_core::{MemoryResource, Request, Stream};
use memres_cuda::{
    sys, AsRawStream, CudaCopy, CudaMemory, CudaStream, Device, ManagedMemory, PinnedMemory, StreamOptions,
};
use std::ffi::{c_int, c_void};
use std::sync::Barrier;

extern "C" {
    fn cuStreamBeginCapture_v2(stream: sys::CUstream, mode: c_int) -> c_int;
    fn cuStreamEndCapture(stream: sys::CUstream, graph: *mut *mut c_void) -> c_int;
    fn cuGraphDestroy(graph: *mut c_void) -> c_int;
}

/// `CU_STREAM_CAPTURE_MODE_GLOBAL`.
const GLOBAL: c_int = 0;

/// A fill of a container of pinned memory, queued behind work that began
/// before another thread's capture: the driver refuses the stream's
/// synchronization then, while the fill runs on. The fill was waited for
/// anyway, and the capture was left whole. (Before: the refusal,
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, at once, the fill's access
/// ended with the fill still queued, so a free of the memory could run
/// under it; and the capture invalidated.)
#[test]
fn a_fill_of_pinned_memory_is_waited_for_while_another_thread_captures() {
    let Some(device) = gpu("a_fill_of_pinned_memory_is_waited_for_while_another_thread_captures") else {
        return;
    };
    let options = StreamOptions { non_blocking: true, priority: 0 };
    let (a, b) = (
        CudaStream::with_options(device, options).unwrap(),
        CudaStream::with_options(device, options).unwrap(),
    );
    let pinned = PinnedMemory::new(device).unwrap();
    let mut buf = DeviceBuffer::new_in(64 << 20, &a, &pinned, CudaCopy::new(device).unwrap()).unwrap();
    let busy = CudaMemory::new(device).unwrap();
    let big = busy.allocate(Request::new(1 << 30).unwrap(), &a).unwrap();
    // A few hundred milliseconds of work on `a` before the capture begins.
    for i in 0..400 {
        common::fill(&a, &big, i);
    }
    let (begun, ended) = (Barrier::new(2), Barrier::new(2));
    let (filled, captured) = std::thread::scope(|s| {
        let capture = s.spawn(|| capture_between(device, &b, &begun, &ended));
        begun.wait();
        let filled = buf.fill(7);
        ended.wait();
        (filled, capture.join().unwrap())
    });
    assert_eq!(filled, Ok(()), "the fill was waited for");
    assert_eq!(captured, 0, "the capture was left whole");
    assert!(buf.to_vec().unwrap().iter().all(|&x| x == 7));
    a.synchronize().unwrap();
    busy.deallocate(big, &a).unwrap();
}

/// A stream's synchronization, an event's query and wait, and an
/// allocation and free of device, pinned and managed memory, on one thread
/// while another captures a graph in the global mode: each is answered
/// and the capture is left whole. (Before: each was refused,
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, and invalidated the capture: a
/// pool's steal between streams, a virtual pool's unmap or a pool's growth
/// failed, and the other thread's graph was lost.)
#[test]
fn waits_and_allocations_leave_another_threads_capture_whole() {
    let Some(device) = gpu("waits_and_allocations_leave_another_threads_capture_whole") else {
        return;
    };
    let options = StreamOptions { non_blocking: true, priority: 0 };
    let (a, b) = (
        CudaStream::with_options(device, options).unwrap(),
        CudaStream::with_options(device, options).unwrap(),
    );
    let event = a.record().unwrap();
    let (plain, pinned, managed) = (
        CudaMemory::new(device).unwrap(),
        PinnedMemory::new(device).unwrap(),
        ManagedMemory::new(device).unwrap(),
    );
    let round_trip = |mr: &dyn MemoryResource<CudaStream>| {
        let block = mr.allocate(Request::new(2 << 20)?, &a)?;
        mr.deallocate(block, &a)
    };
    let calls: [(&str, &dyn Fn() -> memres_core::Result<()>); 6] = [
        ("the stream's synchronization", &|| a.synchronize()),
        ("the event's query", &|| a.query(&event).map(drop)),
        ("the event's wait", &|| event.synchronize()),
        ("cuMemAlloc and cuMemFree", &|| round_trip(&plain)),
        ("cuMemHostAlloc and cuMemFreeHost", &|| round_trip(&pinned)),
        ("cuMemAllocManaged and cuMemFree", &|| round_trip(&managed)),
    ];
    for (what, call) in calls {
        let (begun, ended) = (Barrier::new(2), Barrier::new(2));
        let (answered, captured) = std::thread::scope(|s| {
            let capture = s.spawn(|| capture_between(device, &b, &begun, &ended));
            begun.wait();
            let answered = call();
            ended.wait();
            (answered, capture.join().unwrap())
        });
        assert_eq!((answered, captured), (Ok(()), 0), "{what}: answered, the capture whole");
    }
}

/// A fill of pinned memory queued while this thread captures its stream
/// is in the graph, not run: the fill's wait says so at once (the stream
/// is in the capture it was in before the fill was queued) and spoils the
/// capture, so that no graph of it writes the memory after it is freed.
/// Once the capture has ended, the same fill runs. (A wait that waited out
/// every capture begun after its work would wait here for this thread's
/// own capture to end: forever.)
#[test]
fn a_fill_this_thread_captures_is_refused_at_once_and_spoils_the_capture() {
    let Some(device) = gpu("a_fill_this_thread_captures_is_refused_at_once_and_spoils_the_capture") else {
        return;
    };
    let a = CudaStream::with_options(device, StreamOptions { non_blocking: true, priority: 0 }).unwrap();
    let pinned = PinnedMemory::new(device).unwrap();
    let mut buf = DeviceBuffer::new_in(1 << 20, &a, &pinned, CudaCopy::new(device).unwrap()).unwrap();
    device.primary_context().unwrap().bind().unwrap();
    let raw = a.as_raw_stream();
    // SAFETY: `a` is a live stream of the bound context.
    assert_eq!(unsafe { cuStreamBeginCapture_v2(raw, GLOBAL) }, 0, "capture begun");
    let filled = buf.fill(7);
    let mut graph = std::ptr::null_mut();
    // SAFETY: as above; `graph` is a valid place for the graph.
    let end = unsafe { cuStreamEndCapture(raw, &mut graph) };
    if !graph.is_null() {
        // SAFETY: the graph the capture made, destroyed once.
        unsafe { cuGraphDestroy(graph) };
    }
    assert!(filled.is_err(), "the captured fill did not run: {filled:?}");
    assert_eq!(end, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "the capture was spoiled");
    assert_eq!(buf.fill(9), Ok(()));
    assert!(buf.to_vec().unwrap().iter().all(|&x| x == 9));
}

/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`: a capture that a call it
/// refused has spoiled.
const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: c_int = 901;

/// Captures on `b` in the global mode from a thread of its own between the
/// two barriers; the answer of `cuStreamEndCapture`.
fn capture_between(device: Device, b: &CudaStream, begun: &Barrier, ended: &Barrier) -> c_int {
    device.primary_context().unwrap().bind().unwrap();
    let raw = b.as_raw_stream();
    // SAFETY: `b` is a live stream of the bound context.
    assert_eq!(unsafe { cuStreamBeginCapture_v2(raw, GLOBAL) }, 0, "capture begun");
    begun.wait();
    ended.wait();
    let mut graph = std::ptr::null_mut();
    // SAFETY: as above; `graph` is a valid place for the graph.
    let end = unsafe { cuStreamEndCapture(raw, &mut graph) };
    if !graph.is_null() {
        // SAFETY: the graph the capture made, destroyed once.
        unsafe { cuGraphDestroy(graph) };
    }
    end
}
