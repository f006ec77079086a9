//! What the containers guarantee to safe code, over real host memory (these
//! tests run under Miri too): a block shorter than asked is given back as an
//! error, memory the container did not write is never read, a deep copy
//! orders its source's stream after it, a container frees on its stream of
//! the moment, and a block freed or a resource ended by other code under a
//! live container is never touched again (`HostCopy` checks every access
//! against the live allocations). (That a resource of another kind of
//! memory cannot be paired with an engine is a `compile_fail` example in the
//! crate's documentation.)

use memres_containers::{ContainerError, DeviceBuffer, DeviceScalar, DeviceUVector};
use memres_core::adaptor::Logging;
use memres_core::copy::{CopyEngine, MemoryOf};
use memres_core::pool::{CoalescingPool, PoolConfig};
use memres_core::{Block, Error, Inspect, MemoryResource, Request, Result as CoreResult, Shared, Stream};
use memres_sim::{HostCopy, HostMemory, SimEvent, SimStream, SimWorld};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// Host memory that hands out blocks of at most `max` bytes, whatever is
/// asked: a safe resource that breaks the size promise, though every byte it
/// does promise is real.
struct Capped {
    host: HostMemory,
    max: u64,
}

impl<S: Stream + ?Sized> MemoryResource<S> for Capped {
    fn allocate(&self, request: Request, stream: &S) -> CoreResult<Block> {
        self.host.allocate(Request::new(request.size().min(self.max))?, stream)
    }
    fn deallocate(&self, block: Block, stream: &S) -> CoreResult<()> {
        self.host.deallocate(block, stream)
    }
}

// SAFETY: every block is one of `host`'s, unchanged (its `size()` is what
// `host` was asked for), given back only through `host.deallocate`.
unsafe impl MemoryOf<HostCopy> for Capped {}

#[test]
fn a_block_shorter_than_asked_goes_back_as_an_error() {
    let mr = Capped { host: HostMemory::new(), max: 1 };
    let e = DeviceBuffer::from_slice_in(b"hello", (), &mr, HostCopy).unwrap_err();
    assert_eq!(e, ContainerError::BlockTooShort { requested: 5, size: 1 });
    let e = DeviceUVector::<u64, _, _>::new_in(4, (), &mr, HostCopy).unwrap_err();
    assert_eq!(e, ContainerError::BlockTooShort { requested: 32, size: 1 });
    let e = DeviceScalar::from_value_in(&7u32, (), &mr, HostCopy).unwrap_err();
    assert_eq!(e, ContainerError::BlockTooShort { requested: 4, size: 1 });
    assert_eq!(mr.host.call_counts(), (3, 3), "each short block went back");
    // A request the resource does honour works.
    let b = DeviceBuffer::from_slice_in(b"x", (), &mr, HostCopy).unwrap();
    assert_eq!(b.to_vec().unwrap(), b"x");
    drop(b);
    assert_eq!(mr.host.live_count(), 0);
}

#[test]
fn growth_into_a_short_block_leaves_the_container_unchanged() {
    let mr = Capped { host: HostMemory::new(), max: 16 };
    let mut v = DeviceUVector::from_slice_in(&[1u32, 2], (), &mr, HostCopy).unwrap();
    assert_eq!(v.resize(5), Err(ContainerError::BlockTooShort { requested: 20, size: 16 }));
    assert_eq!(v.reserve(100), Err(ContainerError::BlockTooShort { requested: 400, size: 16 }));
    assert_eq!((v.len(), v.capacity()), (2, 2));
    assert_eq!(v.to_vec().unwrap(), [1, 2]);
    assert_eq!(mr.host.live_count(), 1, "only the vector's own block is out");
    v.resize(4).unwrap();
    assert_eq!(v.to_vec().unwrap(), [1, 2, 0, 0]);
    let w = v.as_buffer().try_clone_on(()).unwrap();
    assert_eq!(w.len(), 16);
    drop((v, w));
    assert_eq!(mr.host.live_count(), 0);
}

/// A pool over host memory whose first bytes held 0xEE: a block it hands
/// out next starts where that junk is (checked), so stale bytes would show.
fn dirty_pool() -> (Shared<CoalescingPool<HostMemory>>, u64) {
    let pool = Shared::new(CoalescingPool::new(HostMemory::new()));
    let junk = DeviceBuffer::from_slice_in(&[0xEE; 1024], (), &pool, HostCopy).unwrap();
    let addr = junk.addr();
    drop(junk);
    (pool, addr)
}

#[test]
fn new_containers_read_zeros_not_what_the_memory_held() {
    // The case: fresh host memory, never written (Miri reports a read).
    let host = HostMemory::new();
    assert_eq!(DeviceUVector::<u64, _, _>::new_in(4, (), &host, HostCopy).unwrap().to_vec().unwrap(), [0; 4]);

    let (pool, junk) = dirty_pool();
    let b = DeviceBuffer::new_in(100, (), &pool, HostCopy).unwrap();
    assert_eq!(b.addr(), junk, "the block reuses the junk");
    assert_eq!(b.to_vec().unwrap(), [0; 100]);
    drop(b);
    let v = DeviceUVector::<u64, _, _>::new_in(8, (), &pool, HostCopy).unwrap();
    assert_eq!(v.addr(), junk);
    assert_eq!(v.to_vec().unwrap(), [0; 8]);
    drop(v);
    let s = DeviceScalar::<u64, _, _>::new_in((), &pool, HostCopy).unwrap();
    assert_eq!(s.addr(), junk);
    assert_eq!(s.value().unwrap(), 0);
}

#[test]
fn growth_reads_zeros_past_the_old_length() {
    let (pool, junk) = dirty_pool();
    let mut v = DeviceUVector::from_slice_in(&[7u64; 8], (), &pool, HostCopy).unwrap();
    // Within the capacity: the bytes past the length are stale, not new.
    v.resize(2).unwrap();
    v.resize(5).unwrap();
    assert_eq!(v.to_vec().unwrap(), [7, 7, 0, 0, 0]);
    v.clear();
    v.resize(3).unwrap();
    assert_eq!(v.to_vec().unwrap(), [0; 3]);
    drop(v);
    // Spare capacity from `reserve` is never readable, and reads as zeros
    // once the length grows over it (here the new block lies in the junk).
    let mut w = DeviceUVector::from_slice_in(&[9u64], (), &pool, HostCopy).unwrap();
    w.reserve(64).unwrap();
    assert!(w.addr() >= junk && w.addr() + 64 * 8 <= junk + 1024, "{:#x}", w.addr());
    assert_eq!((w.len(), w.capacity()), (1, 64));
    w.resize(64).unwrap();
    let all = w.to_vec().unwrap();
    assert_eq!((all[0], &all[1..]), (9, &[0; 63][..]));
    // Growth past the capacity keeps the elements and zeroes the rest.
    w.resize(200).unwrap();
    assert_eq!(w.element(0).unwrap(), 9);
    assert!(w.to_vec().unwrap()[1..].iter().all(|&x| x == 0));
}

/// A stream of the simulated world, or a wrapper of one.
trait OnSim: Stream {
    fn sim(&self) -> &SimStream;
}

impl OnSim for SimStream {
    fn sim(&self) -> &SimStream {
        self
    }
}

/// Host copies that are also operations on a simulated stream, as a GPU's
/// would be (copies to and from the host wait for the stream), counting the
/// fills they make. With `copy_panics`, a device-to-device copy panics once
/// it is queued (a user's engine, safe to write, that breaks).
#[derive(Clone, Default)]
struct Queued {
    fills: Arc<AtomicU64>,
    copy_panics: bool,
}

impl<S: OnSim> CopyEngine<S> for Queued {
    type Kind = HostCopy;

    unsafe fn copy_from_host(&self, dst: u64, src: &[u8], stream: &S) -> CoreResult<()> {
        stream.sim().enqueue();
        stream.synchronize()?;
        // SAFETY: forwarded with the caller's guarantees (memory of `HostCopy`).
        unsafe { HostCopy.copy_from_host(dst, src, stream) }
    }
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: &S) -> CoreResult<()> {
        stream.sim().enqueue();
        stream.synchronize()?;
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { HostCopy.copy_to_host(dst, src, stream) }
    }
    unsafe fn copy(&self, dst: u64, src: u64, len: u64, stream: &S) -> CoreResult<()> {
        stream.sim().enqueue();
        if self.copy_panics {
            panic!("the engine breaks once the copy is queued");
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { HostCopy.copy(dst, src, len, stream) }
    }
    unsafe fn fill(&self, dst: u64, value: u8, len: u64, stream: &S) -> CoreResult<()> {
        stream.sim().enqueue();
        self.fills.fetch_add(1, Relaxed);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { HostCopy.fill(dst, value, len, stream) }
    }
}

/// A simulated stream whose `panic_in`-th call to `record` or `wait` from
/// now panics (shared by its clones; 0: none): a user's stream, safe to
/// write, that breaks.
#[derive(Clone)]
struct PanicsOnCall {
    sim: SimStream,
    panic_in: Arc<AtomicU32>,
}

impl PanicsOnCall {
    fn count_down(&self) {
        match self.panic_in.load(Relaxed) {
            0 => {}
            1 => {
                self.panic_in.store(0, Relaxed);
                panic!("the stream breaks");
            }
            n => self.panic_in.store(n - 1, Relaxed),
        }
    }
}

impl OnSim for PanicsOnCall {
    fn sim(&self) -> &SimStream {
        &self.sim
    }
}

impl Stream for PanicsOnCall {
    type Event = SimEvent;

    fn id(&self) -> u64 {
        self.sim.id()
    }
    fn record(&self) -> CoreResult<SimEvent> {
        self.count_down();
        self.sim.record()
    }
    fn wait(&self, event: &SimEvent) -> CoreResult<()> {
        self.count_down();
        self.sim.wait(event)
    }
    fn query(&self, event: &SimEvent) -> CoreResult<bool> {
        self.sim.query(event)
    }
    fn synchronize(&self) -> CoreResult<()> {
        self.sim.synchronize()
    }
}

#[test]
fn a_deep_copy_orders_the_source_stream_after_it() {
    let world = SimWorld::new();
    let (sa, sb) = (world.non_blocking_stream(), world.non_blocking_stream());
    let host = HostMemory::new();
    let a = DeviceBuffer::from_slice_in(b"hello", sa.clone(), &host, Queued::default()).unwrap();
    let b = a.try_clone_on(sb.clone()).unwrap();
    let copy = sb.position();
    assert!(sb.is_ordered_after(sa.id(), sa.position()), "the copy waits for the source's work");
    assert!(!sa.is_observed(sb.id(), copy), "nothing waited on the host");
    assert!(
        sa.is_ordered_after(sb.id(), copy),
        "the source's later work, its free on drop included, waits for the copy"
    );
    drop(a);
    assert_eq!(b.to_vec().unwrap(), b"hello");
}

/// A deep copy on another stream whose ordering back fails (the event after
/// the copy cannot be recorded, or the source's stream cannot wait on it)
/// fails with the stream's error, but only once the copy has read the
/// source: the source's free on drop never overtakes it (#15 item 7).
#[test]
fn a_deep_copy_that_cannot_order_the_source_after_it_waits_for_it() {
    // Stream calls of `try_clone_on`: record on the source's stream, the
    // copy's stream waits, the copy, record on the copy's stream (3rd), the
    // source's stream waits (4th).
    for nth in [3, 4] {
        let world = SimWorld::new();
        let (sa, sb) = (world.non_blocking_stream(), world.non_blocking_stream());
        let host = HostMemory::new();
        let a = DeviceBuffer::from_slice_in(b"hello", sa.clone(), &host, Queued::default()).unwrap();
        world.fail_nth(nth);
        let e = a.try_clone_on(sb.clone()).map(|_| ());
        assert!(matches!(e, Err(ContainerError::Memory(Error::Backend { .. }))), "call {nth}: {e:?}");
        assert!(
            sa.is_ordered_after(sb.id(), sb.position()),
            "call {nth}: the source's free waits for the copy"
        );
        assert_eq!(host.live_count(), 1, "call {nth}: the clone's block went back");
        drop(a);
    }
}

/// A deep copy on another stream whose ordering back panics (the stream
/// panics recording the event after the copy, or waiting on it; or the copy
/// engine panics once the copy is queued) waits on the host for the copy
/// before the panic goes on: the source's free on drop never overtakes it.
#[test]
fn a_deep_copy_that_panics_once_the_copy_is_queued_waits_for_it() {
    // Stream calls of `try_clone_on` as in the test above: the 3rd and 4th
    // come after the copy; 0 panics in none of them.
    for (panic_in, copy_panics) in [(3, false), (4, false), (0, true)] {
        let world = SimWorld::new();
        let panic_at = Arc::new(AtomicU32::new(0));
        let stream = || PanicsOnCall { sim: world.non_blocking_stream(), panic_in: panic_at.clone() };
        let (sa, sb) = (stream(), stream());
        let host = HostMemory::new();
        let engine = Queued { copy_panics, ..Queued::default() };
        let a = DeviceBuffer::from_slice_in(b"hello", sa.clone(), &host, engine).unwrap();
        panic_at.store(panic_in, Relaxed);
        let cloned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.try_clone_on(sb.clone())));
        let case = format!("call {panic_in}, the engine panics: {copy_panics}");
        assert!(cloned.is_err(), "{case}: the panic goes on");
        assert_eq!(sb.sim.position(), 1, "{case}: the copy was queued");
        assert!(sa.sim.is_ordered_after(sb.id(), 1), "{case}: the source's free waits for the copy");
        assert_eq!(host.live_count(), 1, "{case}: the clone's block went back");
        drop(a);
    }
}

/// An event whose drop panics when its number comes up (shared by the
/// events of one stream and its clones; 0: none): a user's event, safe to
/// write, that breaks.
struct DropPanics {
    sim: SimEvent,
    panic_in: Arc<AtomicU32>,
}

impl Drop for DropPanics {
    fn drop(&mut self) {
        match self.panic_in.load(Relaxed) {
            0 => {}
            1 => {
                self.panic_in.store(0, Relaxed);
                panic!("the event breaks as it goes");
            }
            n => self.panic_in.store(n - 1, Relaxed),
        }
    }
}

/// A simulated stream whose events are [`DropPanics`].
#[derive(Clone)]
struct EventsPanic {
    sim: SimStream,
    panic_in: Arc<AtomicU32>,
}

impl OnSim for EventsPanic {
    fn sim(&self) -> &SimStream {
        &self.sim
    }
}

impl Stream for EventsPanic {
    type Event = DropPanics;

    fn id(&self) -> u64 {
        self.sim.id()
    }
    fn record(&self) -> CoreResult<DropPanics> {
        Ok(DropPanics { sim: self.sim.record()?, panic_in: self.panic_in.clone() })
    }
    fn wait(&self, event: &DropPanics) -> CoreResult<()> {
        self.sim.wait(&event.sim)
    }
    fn query(&self, event: &DropPanics) -> CoreResult<bool> {
        self.sim.query(&event.sim)
    }
    fn synchronize(&self) -> CoreResult<()> {
        self.sim.synchronize()
    }
}

/// A deep copy one of whose events panics as it is dropped (the one before
/// the copy, or the one after it; of an empty buffer, the only one) gives
/// the copy's block back as the panic goes on. Before, the copy was built
/// as the return value already, which a panic in a local's drop does not
/// drop: its block stayed out until the resource ended.
#[test]
fn a_deep_copy_whose_event_panics_as_it_is_dropped_gives_its_block_back() {
    for (bytes, panic_in) in [(&b"hello"[..], 1), (b"hello", 2), (b"", 1)] {
        let world = SimWorld::new();
        let panic_at = Arc::new(AtomicU32::new(0));
        let stream = || EventsPanic { sim: world.non_blocking_stream(), panic_in: panic_at.clone() };
        let (sa, sb) = (stream(), stream());
        let host = HostMemory::new();
        let a = DeviceBuffer::from_slice_in(bytes, sa.clone(), &host, Queued::default()).unwrap();
        let live = host.live_count();
        panic_at.store(panic_in, Relaxed);
        let cloned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.try_clone_on(sb.clone())));
        let case = format!("{} bytes, event {panic_in}", bytes.len());
        assert!(cloned.is_err(), "{case}: the panic goes on");
        assert_eq!(host.live_count(), live, "{case}: the clone's block went back");
        assert_eq!(a.to_vec().unwrap(), bytes, "{case}");
        drop(a);
        assert_eq!(host.live_count(), 0, "{case}");
    }
}

/// A panic whose payload panics when dropped.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("the payload, dropped");
    }
}

/// A simulated stream whose `synchronize` panics with a [`Bomb`] once
/// `armed` (shared by its clones): a user's stream, safe to write.
#[derive(Clone)]
struct BombsOnSync {
    sim: SimStream,
    armed: Arc<AtomicBool>,
}

impl OnSim for BombsOnSync {
    fn sim(&self) -> &SimStream {
        &self.sim
    }
}

impl Stream for BombsOnSync {
    type Event = SimEvent;

    fn id(&self) -> u64 {
        self.sim.id()
    }
    fn record(&self) -> CoreResult<SimEvent> {
        self.sim.record()
    }
    fn wait(&self, event: &SimEvent) -> CoreResult<()> {
        self.sim.wait(event)
    }
    fn query(&self, event: &SimEvent) -> CoreResult<bool> {
        self.sim.query(event)
    }
    fn synchronize(&self) -> CoreResult<()> {
        if self.armed.load(Relaxed) {
            std::panic::panic_any(Bomb);
        }
        self.sim.synchronize()
    }
}

/// A deep copy whose engine panics once the copy is queued has the host
/// wait for the copy's stream while the thread unwinds; a stream whose
/// wait then panics with a payload that panics when dropped (any value can
/// be a panic's) has both caught. Before, the payload was dropped where the
/// first was caught, a second panic while unwinding: the process aborted.
#[test]
fn a_deep_copy_whose_wait_panics_while_unwinding_with_a_payload_that_panics_does_not_abort() {
    let world = SimWorld::new();
    let armed = Arc::new(AtomicBool::new(false));
    let stream = || BombsOnSync { sim: world.non_blocking_stream(), armed: armed.clone() };
    let (sa, sb) = (stream(), stream());
    let host = HostMemory::new();
    let engine = Queued { copy_panics: true, ..Queued::default() };
    let a = DeviceBuffer::from_slice_in(b"hello", sa.clone(), &host, engine).unwrap();
    armed.store(true, Relaxed);
    let cloned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.try_clone_on(sb.clone())));
    armed.store(false, Relaxed);
    let Err(payload) = cloned else { panic!("the engine's panic goes on") };
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"the engine breaks once the copy is queued"));
    assert_eq!(host.live_count(), 1, "the clone's block went back");
    drop(a);
    assert_eq!(host.live_count(), 0);
}

/// A deep copy whose stream fails or panics before the copy (recording on
/// the source's stream, the 1st call, or waiting on the copy's, the 2nd)
/// takes no memory and queues nothing; the source is as it was.
#[test]
fn a_deep_copy_whose_streams_fail_before_the_copy_takes_nothing() {
    for (nth, panics) in [(1, false), (2, false), (1, true), (2, true)] {
        let world = SimWorld::new();
        let panic_at = Arc::new(AtomicU32::new(0));
        let stream = || PanicsOnCall { sim: world.non_blocking_stream(), panic_in: panic_at.clone() };
        let (sa, sb) = (stream(), stream());
        let host = HostMemory::new();
        let a = DeviceBuffer::from_slice_in(b"hello", sa.clone(), &host, Queued::default()).unwrap();
        match panics {
            true => panic_at.store(nth, Relaxed),
            false => world.fail_nth(nth.into()),
        }
        let cloned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.try_clone_on(sb.clone())));
        let case = format!("call {nth}, panics: {panics}");
        match cloned {
            Ok(Err(ContainerError::Memory(Error::Backend { .. }))) => assert!(!panics, "{case}"),
            Err(_) => assert!(panics, "{case}"),
            Ok(r) => panic!("{case}: {:?}", r.map(|_| ())),
        }
        assert_eq!((host.live_count(), sb.sim.position()), (1, 0), "{case}: no block taken, nothing queued");
        assert_eq!(a.to_vec().unwrap(), b"hello", "{case}");
    }
}

/// Host memory that logs each call with the id of the stream it came on.
#[derive(Default)]
struct LogsStreams {
    host: HostMemory,
    /// (`"allocate"` or `"free"`, the block's address, the stream's id).
    log: Mutex<Vec<(&'static str, u64, u64)>>,
}

impl MemoryResource<SimStream> for LogsStreams {
    fn allocate(&self, request: Request, stream: &SimStream) -> CoreResult<Block> {
        let block = self.host.allocate(request, stream)?;
        self.log.lock().unwrap().push(("allocate", block.addr(), stream.id()));
        Ok(block)
    }
    fn deallocate(&self, block: Block, stream: &SimStream) -> CoreResult<()> {
        self.log.lock().unwrap().push(("free", block.addr(), stream.id()));
        self.host.deallocate(block, stream)
    }
}

// SAFETY: every block is one of `host`'s, unchanged, given back only through
// `host.deallocate`.
unsafe impl MemoryOf<HostCopy> for LogsStreams {}

/// A buffer frees on its stream of the moment, which is ordered after the
/// work of the streams it had before: the old block of a growth after a
/// change of stream, and its block on drop. (Added coverage: this held
/// before.)
#[test]
fn a_buffer_frees_its_blocks_on_its_stream_of_the_moment() {
    let world = SimWorld::new();
    let (sa, sb) = (world.non_blocking_stream(), world.non_blocking_stream());
    let mr = LogsStreams::default();
    let mut b = DeviceBuffer::from_slice_in(b"abc", sa.clone(), &mr, HostCopy).unwrap();
    let first = b.addr();
    sa.enqueue(); // a kernel on the buffer
    b.set_stream(sb.clone()).unwrap();
    assert!(sb.is_ordered_after(sa.id(), sa.position()), "the new stream waits for the old one's work");
    b.reserve(1000).unwrap();
    let second = b.addr();
    drop(b);
    let log = mr.log.lock().unwrap().clone();
    let (a_id, b_id) = (sa.id(), sb.id());
    assert_eq!(
        log,
        [
            ("allocate", first, a_id),
            ("allocate", second, b_id),
            ("free", first, b_id),
            ("free", second, b_id)
        ]
    );
}

/// A change of stream whose event fails to record on the old stream, or
/// the new stream to wait on it, leaves the buffer on the old one, which
/// its drop frees on. (Added coverage: this held before.)
#[test]
fn a_failed_set_stream_leaves_the_buffer_on_its_stream() {
    for nth in [1, 2] {
        let world = SimWorld::new();
        let (sa, sb) = (world.non_blocking_stream(), world.non_blocking_stream());
        let mr = LogsStreams::default();
        let mut b = DeviceBuffer::from_slice_in(b"abc", sa.clone(), &mr, HostCopy).unwrap();
        world.fail_nth(nth);
        let e = b.set_stream(sb.clone());
        assert!(matches!(e, Err(ContainerError::Memory(Error::Backend { .. }))), "call {nth}: {e:?}");
        assert_eq!(b.stream().id(), sa.id(), "call {nth}");
        let addr = b.addr();
        drop(b);
        assert_eq!(mr.log.lock().unwrap().last(), Some(&("free", addr, sa.id())), "call {nth}");
    }
}

#[test]
fn uninitialized_constructors_write_nothing_and_the_others_zero() {
    let world = SimWorld::new();
    let host = HostMemory::new();
    let engine = Queued::default();
    let fills = || engine.fills.load(Relaxed);
    // SAFETY: every element is written below before anything reads it.
    let mut v =
        unsafe { DeviceUVector::<u32, _, _, _>::new_uninit_in(4, world.stream(), &host, engine.clone()) }
            .unwrap();
    v.copy_from_slice_at(0, &[1, 2, 3, 4]).unwrap();
    // SAFETY: as above, for the two new elements.
    unsafe { v.resize_uninit(6) }.unwrap();
    v.copy_from_slice_at(4, &[5, 6]).unwrap();
    // SAFETY: the value is set below before it is read.
    let mut s = unsafe { DeviceScalar::<u64, _, _, _>::new_uninit_in(world.stream(), &host, engine.clone()) }
        .unwrap();
    s.set_value_async(&9).unwrap();
    assert_eq!(fills(), 0, "no fill on the stream");
    assert_eq!((v.to_vec().unwrap(), s.value().unwrap()), (vec![1, 2, 3, 4, 5, 6], 9));

    let mut w = DeviceUVector::<u32, _, _, _>::new_in(4, world.stream(), &host, engine.clone()).unwrap();
    assert_eq!(fills(), 1);
    w.resize(6).unwrap();
    assert_eq!(fills(), 2);
    w.resize(3).unwrap();
    w.reserve(100).unwrap();
    assert_eq!(fills(), 2, "shrinking and reserving write nothing");
    assert_eq!(w.to_vec().unwrap(), [0; 3]);
}

/// The error of an access to `len` bytes at `addr`, which are not live.
fn not_live(addr: u64, len: u64) -> ContainerError {
    ContainerError::Memory(Error::NotLive { addr, len })
}

/// What a copy out of the freed `len` bytes at `addr` into a new block
/// gives (the new block's address, if it is made): refused as not live,
/// unless the system allocator handed the freed address out again as that
/// very block (glibc's `calloc` does where its per-thread cache holds it),
/// which the copy then reads: defined, and it touches nothing else.
fn refused_unless_reused(got: Result<u64, ContainerError>, addr: u64, len: u64) {
    match got {
        Ok(new) => assert_eq!(new, addr, "a copy from freed memory made other than into its own address"),
        Err(e) => assert_eq!(e, not_live(addr, len)),
    }
}

#[test]
fn a_block_freed_by_other_code_is_never_touched_again() {
    // The case: a copy of `block()` freed through the resource.
    let mem = HostMemory::new();
    let mut buf = DeviceBuffer::from_slice_in(b"hello", (), &mem, HostCopy).unwrap();
    let addr = buf.addr();
    mem.deallocate(buf.block(), &()).unwrap();
    assert_eq!(buf.to_vec(), Err(not_live(addr, 5)));
    assert_eq!(buf.write(1, b"ELL"), Err(not_live(addr + 1, 3)));
    assert_eq!(buf.fill(0), Err(not_live(addr, 5)));
    // Growth allocates a new block, cannot copy from the freed one, and
    // gives the new block back: the buffer is unchanged.
    assert_eq!(buf.resize(1000), Err(not_live(addr, 5)));
    assert_eq!((buf.addr(), buf.len(), mem.live_count()), (addr, 5, 0));
    refused_unless_reused(buf.try_clone_on(()).map(|c| c.addr()), addr, 5);
    assert_eq!(mem.live_count(), 0, "the failed clone gave its block back");
    drop(buf); // its free is refused (`UnknownBlock`), and ignored
    assert_eq!(mem.call_counts(), (3, 3));

    // A forged block, by address, frees a vector's and a scalar's memory.
    let v = DeviceUVector::from_slice_in(&[1u64, 2, 3, 4], (), &mem, HostCopy).unwrap();
    let s = DeviceScalar::from_value_in(&7u32, (), &mem, HostCopy).unwrap();
    mem.deallocate(Block::from_addr(v.addr(), 32), &()).unwrap();
    mem.deallocate(Block::from_addr(s.addr(), 4), &()).unwrap();
    assert_eq!(v.element(2), Err(not_live(v.addr() + 16, 8)));
    assert_eq!(s.value(), Err(not_live(s.addr(), 4)));
    assert_eq!(mem.live_count(), 0);
}

#[test]
fn a_pool_ended_under_its_containers_leaves_them_nothing_to_touch() {
    let pool = Shared::new(CoalescingPool::new(HostMemory::new()));
    let mut v = DeviceUVector::from_slice_in(&[1u64, 2, 3], (), &pool, HostCopy).unwrap();
    let addr = v.addr();
    // The pool that takes its place holds its memory already, so none of it
    // can be where the old pool's was.
    let config = PoolConfig::new().initial_size(1 << 20).maximum_size(1 << 20);
    let new = CoalescingPool::with_config(HostMemory::new(), config, &()).unwrap();
    // Moved out of its lock and dropped: its chunks go back to its
    // `HostMemory`, which frees them.
    drop(pool.with(|p| std::mem::replace(p, new)));
    assert_eq!(v.to_vec(), Err(not_live(addr, 24)));
    assert_eq!(v.set_element_async(0, &9), Err(not_live(addr, 8)));
    assert_eq!(v.resize(100), Err(not_live(addr, 24)), "the copy out of the old block");
    drop(v); // freed into the new pool, which refuses it
    pool.with(|p| assert_eq!(p.usage().used, 0, "the refused growth gave its block back"));
}

#[test]
fn a_block_freed_twice_over_is_shared_wrong_data_but_defined() {
    // A forged free through a pool: it hands the same bytes to a second
    // container. Both read and write memory the pool holds, so they see each
    // other's bytes, but nothing touches freed memory (Miri checks).
    let pool = Shared::new(CoalescingPool::new(HostMemory::new()));
    let mut a = DeviceBuffer::from_slice_in(b"aaaa", (), &pool, HostCopy).unwrap();
    pool.deallocate(a.block(), &()).unwrap();
    let b = DeviceBuffer::from_slice_in(b"bbbb", (), &pool, HostCopy).unwrap();
    assert_eq!(b.addr(), a.addr());
    assert_eq!(a.to_vec().unwrap(), b"bbbb");
    a.write(0, b"AA").unwrap();
    assert_eq!(b.to_vec().unwrap(), b"AAbb");
    drop(b);
    // Growth into the bytes it still thinks it holds: the new block overlaps
    // the old one, the copy between them is a `memmove`, and the free of the
    // old block, now inside the new one, is refused by the pool. The buffer
    // keeps the old block and gives the new one back.
    let old = a.addr();
    let refused = a.reserve(64).unwrap_err();
    assert!(
        matches!(refused, ContainerError::Memory(Error::DoubleFree { addr } | Error::UnknownBlock { addr }) if addr == old),
        "{refused:?}"
    );
    assert_eq!((a.addr(), a.capacity()), (old, 4), "unchanged");
    assert_eq!(pool.with(|p| p.usage().used), 0, "the new block went back");
    assert_eq!(a.to_vec().unwrap(), b"AAbb");
}

/// Host copies whose device-to-device copy panics: a user's engine, safe to
/// write, that breaks mid-growth.
struct PanicOnCopy;

impl CopyEngine<()> for PanicOnCopy {
    type Kind = HostCopy;

    unsafe fn copy_from_host(&self, dst: u64, src: &[u8], stream: &()) -> CoreResult<()> {
        // SAFETY: forwarded with the caller's guarantees (memory of `HostCopy`).
        unsafe { HostCopy.copy_from_host(dst, src, stream) }
    }
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: &()) -> CoreResult<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { HostCopy.copy_to_host(dst, src, stream) }
    }
    unsafe fn copy(&self, _: u64, _: u64, _: u64, _: &()) -> CoreResult<()> {
        panic!("the engine breaks");
    }
    unsafe fn fill(&self, dst: u64, value: u8, len: u64, stream: &()) -> CoreResult<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { HostCopy.fill(dst, value, len, stream) }
    }
}

#[test]
fn a_copy_engine_that_panics_mid_growth_leaves_nothing_behind() {
    let mem = HostMemory::new();
    let mut v = DeviceUVector::from_slice_in(&[1u8, 2, 3], (), &mem, PanicOnCopy).unwrap();
    let (addr, cap) = (v.addr(), v.capacity());
    let grown = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| v.reserve(4096)));
    assert!(grown.is_err());
    assert_eq!(mem.live_count(), 1, "the new block went back during the unwind");
    assert_eq!((v.addr(), v.capacity(), v.to_vec().unwrap()), (addr, cap, vec![1, 2, 3]));
    drop(v);
    assert_eq!(mem.live_count(), 0);
}

/// Host copies whose next copy to the host panics once armed.
struct PanicOnRead(Arc<AtomicBool>);

impl CopyEngine<()> for PanicOnRead {
    type Kind = HostCopy;

    unsafe fn copy_from_host(&self, dst: u64, src: &[u8], stream: &()) -> CoreResult<()> {
        // SAFETY: forwarded with the caller's guarantees (memory of `HostCopy`).
        unsafe { HostCopy.copy_from_host(dst, src, stream) }
    }
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: &()) -> CoreResult<()> {
        assert!(!self.0.swap(false, Relaxed), "the engine breaks");
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { HostCopy.copy_to_host(dst, src, stream) }
    }
    unsafe fn copy(&self, dst: u64, src: u64, len: u64, stream: &()) -> CoreResult<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { HostCopy.copy(dst, src, len, stream) }
    }
    unsafe fn fill(&self, dst: u64, value: u8, len: u64, stream: &()) -> CoreResult<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { HostCopy.fill(dst, value, len, stream) }
    }
}

/// An iteration whose batch copy panicked yields, once resumed, the
/// elements themselves: it yielded the zeros its batch was filled with
/// before the copy, as elements, and then the batch again.
#[test]
fn an_iteration_whose_copy_panicked_resumes_with_the_elements() {
    let mem = HostMemory::new();
    let armed = Arc::new(AtomicBool::new(false));
    let v = DeviceUVector::from_slice_in(&[7u32, 8, 9], (), &mem, PanicOnRead(armed.clone())).unwrap();
    let mut it = v.iter();
    armed.store(true, Relaxed);
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| it.next())).is_err());
    assert_eq!(it.size_hint(), (1, Some(3)));
    assert_eq!(it.map(Result::unwrap).collect::<Vec<_>>(), [7, 8, 9]);
}

/// Host memory whose frees panic while `panics` is set: a user's resource,
/// safe to write, that breaks. The blocks it did not free are kept for the
/// test to free.
#[derive(Default)]
struct PanicsOnFree {
    host: HostMemory,
    panics: AtomicBool,
    kept: Mutex<Vec<Block>>,
}

impl<S: Stream + ?Sized> MemoryResource<S> for PanicsOnFree {
    fn allocate(&self, request: Request, stream: &S) -> CoreResult<Block> {
        self.host.allocate(request, stream)
    }
    fn deallocate(&self, block: Block, stream: &S) -> CoreResult<()> {
        if self.panics.load(Relaxed) {
            self.kept.lock().unwrap().push(block);
            panic!("the resource's free panics");
        }
        self.host.deallocate(block, stream)
    }
}

// SAFETY: every block is one of `host`'s, handed out unchanged and freed
// only through `host`.
unsafe impl MemoryOf<HostCopy> for PanicsOnFree {}

/// The growth's free of the old block panics (the resource keeps the
/// block): the buffer holds the new block, its bytes copied, and never
/// touches the old one again. (A first version aborted the process, the
/// new block's free panicking again in the unwind; the next kept the old
/// block, which a resource that frees before it panics had freed.)
#[test]
fn a_growth_whose_old_free_panics_keeps_the_new_block() {
    let mr = PanicsOnFree::default();
    let mut buf = DeviceBuffer::from_slice_in(b"abc", (), &mr, HostCopy).unwrap();
    let addr = buf.addr();
    mr.panics.store(true, Relaxed);
    let grown = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| buf.reserve(1 << 20)));
    assert!(grown.is_err());
    mr.panics.store(false, Relaxed);
    assert_eq!((buf.capacity(), buf.to_vec().unwrap()), (1 << 20, b"abc".to_vec()));
    let kept = std::mem::take(&mut *mr.kept.lock().unwrap());
    assert_eq!(
        kept.iter().map(|b| b.addr()).collect::<Vec<_>>(),
        [addr],
        "the old block's free alone panicked"
    );
    mr.host.deallocate(kept[0], &()).unwrap();
    drop(buf);
    assert_eq!(mr.host.live_count(), 0);
}

/// A log writer that panics once, on the next free's row, when armed.
struct PanicsOnTheNextFreeRow(Arc<AtomicBool>);

impl std::io::Write for PanicsOnTheNextFreeRow {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if bytes.windows(4).any(|w| w == b"free") && self.0.swap(false, Relaxed) {
            panic!("the writer panics on a free");
        }
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A growth over a log whose writer panics on the old block's free row:
/// the log frees the block all the same, and the pool hands its address to
/// the next buffer. The grown buffer holds its new block, so the two never
/// share bytes. (Before, the buffer kept the old block: a write through it
/// changed the next buffer's bytes, and its drop freed that buffer's block.)
#[test]
fn a_growth_over_a_log_that_frees_while_its_writer_panics_shares_no_bytes() {
    let host = HostMemory::new();
    let pool = Shared::new(CoalescingPool::new(&host));
    let armed = Arc::new(AtomicBool::new(false));
    let log = Logging::new(&pool, PanicsOnTheNextFreeRow(armed.clone())).unwrap();
    let mut a = DeviceBuffer::from_slice_in(b"abc", (), &log, HostCopy).unwrap();
    let old = a.addr();
    armed.store(true, Relaxed);
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.reserve(1 << 16))).is_err());
    let b = DeviceBuffer::from_slice_in(b"xyz", (), &log, HostCopy).unwrap();
    assert_eq!(b.addr(), old, "the pool hands the freed address out again");
    assert_ne!(a.addr(), b.addr());
    a.write(0, b"EVI").unwrap();
    assert_eq!((a.to_vec().unwrap(), b.to_vec().unwrap()), (b"EVI".to_vec(), b"xyz".to_vec()));
    drop(a);
    assert_eq!(b.to_vec().unwrap(), b"xyz");
    drop(b);
    assert_eq!(log.refused_frees(), 0);
}

/// A buffer dropped over a log whose writer panics on the free's row: the
/// panic goes on to the drop's caller, and the block is freed all the
/// same. Before, the log's free left at the panic, before its upstream's,
/// and the drop could not free again: the block was lost while the
/// resource lived.
#[test]
fn a_buffer_dropped_over_a_log_whose_writer_panics_frees_its_block() {
    let host = HostMemory::new();
    let log = Logging::new(&host, PanicsOnTheNextFreeRow(Arc::new(AtomicBool::new(true)))).unwrap();
    let buf = DeviceBuffer::from_slice_in(b"hello", (), &log, HostCopy).unwrap();
    assert_eq!(host.live_count(), 1);
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(buf)));
    assert!(dropped.is_err(), "the writer's panic goes on to the drop's caller");
    assert_eq!(host.live_count(), 0);
    assert_eq!(log.write_errors(), 1);
}

/// Host memory that refuses the next free it is asked for, once, as a
/// resource that cannot order a free on its stream may: the block stays
/// live, the call changes nothing.
#[derive(Default)]
struct RefusesAFree {
    host: HostMemory,
    refuse: AtomicBool,
}

impl<S: Stream + ?Sized> MemoryResource<S> for RefusesAFree {
    fn allocate(&self, request: Request, stream: &S) -> CoreResult<Block> {
        self.host.allocate(request, stream)
    }
    fn deallocate(&self, block: Block, stream: &S) -> CoreResult<()> {
        if self.refuse.swap(false, Relaxed) {
            return Err(Error::Backend { code: 1, what: "free refused" });
        }
        self.host.deallocate(block, stream)
    }
}

// SAFETY: every block is one of `host`'s, unchanged, given back only through
// `host.deallocate`.
unsafe impl MemoryOf<HostCopy> for RefusesAFree {}

#[test]
fn a_refused_free_of_the_old_block_leaves_the_buffer_as_it_was() {
    let mr = RefusesAFree::default();
    let mut buf = DeviceBuffer::from_slice_in(b"abc", (), &mr, HostCopy).unwrap();
    let (addr, cap) = (buf.addr(), buf.capacity());
    mr.refuse.store(true, Relaxed);
    let refused = buf.reserve(1 << 20).unwrap_err();
    assert!(matches!(refused, ContainerError::Memory(Error::Backend { .. })), "{refused:?}");
    assert_eq!((buf.addr(), buf.capacity(), buf.to_vec().unwrap()), (addr, cap, b"abc".to_vec()));
    assert_eq!(mr.host.live_count(), 1, "the new block went back, the old one is the buffer's");
    buf.reserve(1 << 20).unwrap();
    assert_eq!((buf.capacity(), buf.to_vec().unwrap(), mr.host.live_count()), (1 << 20, b"abc".to_vec(), 1));
    drop(buf);
    assert_eq!(mr.host.live_count(), 0);
}

/// Host memory that ignores the alignment asked for: every block starts 256
/// bytes past a multiple of 512 (a resource that cannot align so far and
/// does not say so).
#[derive(Default)]
struct Misaligning {
    host: HostMemory,
    /// Each handed-out block's address to the host block it is the tail of.
    blocks: Mutex<HashMap<u64, Block>>,
}

impl<S: Stream + ?Sized> MemoryResource<S> for Misaligning {
    fn allocate(&self, request: Request, stream: &S) -> CoreResult<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        let inner = self.host.allocate(Request::aligned(request.size() + 256, 512)?, stream)?;
        let block = Block::new(inner.addr() + 256, request.size(), Block::NO_TAG);
        self.blocks.lock().unwrap().insert(block.addr(), inner);
        Ok(block)
    }
    fn deallocate(&self, block: Block, stream: &S) -> CoreResult<()> {
        if block.is_empty() {
            return Ok(());
        }
        let inner = self.blocks.lock().unwrap().remove(&block.addr());
        self.host.deallocate(inner.ok_or(Error::UnknownBlock { addr: block.addr() })?, stream)
    }
}

// SAFETY: every block is the tail of one of `host`'s blocks, past its first
// 256 bytes and `size()` bytes long, handed out to one holder and given back
// to `host` only through `deallocate`.
unsafe impl MemoryOf<HostCopy> for Misaligning {}

/// An element type aligned above the default 256 bytes.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(512))]
struct Big([u8; 512]);

fn is_misaligned_512<T>(r: &Result<T, ContainerError>) -> bool {
    matches!(r, Err(ContainerError::Misaligned { align: 512, addr }) if addr % 512 == 256)
}

#[test]
fn an_alignment_the_resource_cannot_honour_is_an_error_never_a_misaligned_block() {
    let mr = Misaligning::default();
    // The case: a 512-aligned element type.
    assert!(is_misaligned_512(&DeviceUVector::from_slice_in(&[Big([1; 512])], (), &mr, HostCopy)));
    assert!(is_misaligned_512(&DeviceScalar::<Big, _, _>::new_in((), &mr, HostCopy)));
    assert_eq!(mr.host.live_count(), 0, "the misaligned blocks went back");
    // A buffer of the default alignment is served; asked for more, it stays.
    let mut b = DeviceBuffer::from_slice_in(&[5u8; 512], (), &mr, HostCopy).unwrap();
    let addr = b.addr();
    assert!(is_misaligned_512(&b.set_alignment(512)));
    assert_eq!((b.addr(), b.alignment(), mr.host.live_count()), (addr, 256, 1));
    let (e, b) = b.try_into_uvector::<Big>().unwrap_err();
    assert_eq!(e, ContainerError::Misaligned { align: 512, addr });
    assert_eq!((b.addr(), b.to_vec().unwrap()), (addr, vec![5; 512]), "the buffer comes back unchanged");
    let mut v: DeviceUVector<u64, _, _> = b.try_into_uvector().unwrap();
    v.resize(1000).unwrap();
    assert_eq!(v.element(0).unwrap(), u64::from_ne_bytes([5; 8]));
    drop(v);
    assert_eq!(mr.host.live_count(), 0);
}

#[test]
fn a_raw_pointer_copy_of_memory_that_is_not_live_is_refused_and_takes_nothing() {
    let mem = HostMemory::new();
    let stack = [1u8; 64];
    let on_stack = stack.as_ptr() as u64;
    let v = DeviceUVector::from_slice_in(&[7u64; 4], (), &mem, HostCopy).unwrap();
    let freed = DeviceUVector::from_slice_in(&[8u64; 4], (), &mem, HostCopy).unwrap();
    let gone = freed.addr();
    drop(freed);
    // SAFETY: contracts broken on purpose: `HostCopy` checks every range
    // against the live host allocations and refuses these, touching nothing.
    unsafe {
        let e = DeviceBuffer::from_device_ptr_in(on_stack, 64, (), &mem, HostCopy).map(|_| ());
        assert_eq!(e, Err(not_live(on_stack, 64)), "a stack buffer");
        let e = DeviceUVector::<u64, _, _>::from_device_ptr_in(gone, 4, (), &mem, HostCopy);
        refused_unless_reused(e.map(|c| c.addr()), gone, 32);
        let e = DeviceScalar::<[u64; 64], _, _>::from_device_ptr_in(v.addr(), (), &mem, HostCopy).map(|_| ());
        assert_eq!(e, Err(not_live(v.addr(), 512)), "past the end of an allocation");
        let e = DeviceUVector::<u64, _, _>::from_device_ptr_in(v.addr(), usize::MAX, (), &mem, HostCopy);
        assert_eq!(e.map(|_| ()), Err(ContainerError::LengthOverflow { len: usize::MAX }));
    }
    assert_eq!(mem.live_count(), 1, "each refused copy gave its block back");
    assert_eq!(v.to_vec().unwrap(), [7; 4]);
}

#[test]
fn the_host_view_of_a_block_freed_by_other_code_fails_cleanly() {
    let mem = HostMemory::new();
    let mut v = DeviceUVector::from_slice_in(&[1u32; 100], (), &mem, HostCopy).unwrap();
    let mut s = DeviceScalar::from_value_in(&2u16, (), &mem, HostCopy).unwrap();
    let addr = v.addr();
    mem.deallocate(Block::from_addr(addr, 400), &()).unwrap();
    mem.deallocate(Block::from_addr(s.addr(), 2), &()).unwrap();
    let mut it = v.iter();
    assert_eq!(it.next(), Some(Err(not_live(addr, 400))));
    assert_eq!((it.next(), it.size_hint()), (None, (0, Some(0))), "the error ends the iteration");
    assert_eq!(v.slice_to_vec(1..3), Err(not_live(addr + 4, 8)));
    assert_eq!(v.back_element(), Err(not_live(addr + 396, 4)));
    assert_eq!(v.element_addr(5), Ok(addr + 20), "an address is only a number");
    assert_eq!(v.fill_zero(), Err(not_live(addr, 400)));
    assert_eq!(v.set_element_to_zero_async(3), Err(not_live(addr + 12, 4)));
    refused_unless_reused(v.try_clone().map(|c| c.addr()), addr, 400);
    assert_eq!(s.set_value_to_zero_async(), Err(not_live(s.addr(), 2)));
    refused_unless_reused(s.try_clone().map(|c| c.addr()), s.addr(), 2);
    assert_eq!(mem.live_count(), 0, "the failed clones gave their blocks back");
}

/// A host of 32 bits: run with `cargo +nightly miri test -p memres-containers
/// --test safety --target i686-unknown-linux-gnu` on a host of 64.
#[cfg(target_pointer_width = "32")]
mod on_a_host_of_32_bits {
    use super::*;
    use memres_core::testing::BumpUpstream;

    /// A copy engine that touches no memory (each call does nothing), for a
    /// resource of numbers with no bytes behind them.
    struct Untouched;

    impl<S: Stream + ?Sized> CopyEngine<S> for Untouched {
        type Kind = Untouched;

        unsafe fn copy_from_host(&self, _: u64, _: &[u8], _: &S) -> CoreResult<()> {
            Ok(())
        }
        unsafe fn copy_to_host(&self, _: &mut [u8], _: u64, _: &S) -> CoreResult<()> {
            Ok(())
        }
        unsafe fn copy(&self, _: u64, _: u64, _: u64, _: &S) -> CoreResult<()> {
            Ok(())
        }
        unsafe fn fill(&self, _: u64, _: u8, _: u64, _: &S) -> CoreResult<()> {
            Ok(())
        }
    }

    // SAFETY: `Untouched` touches no memory, so any block is memory it may touch.
    unsafe impl MemoryOf<Untouched> for BumpUpstream {}

    /// A device length past what a `usize` counts is refused, or reported
    /// saturated, where it becomes a count of the host's: cut to 32 bits, a
    /// buffer of 4 GiB + 8 bytes copied 8 bytes to the host as the whole of it,
    /// and a vector over it counted 8 elements.
    #[test]
    fn a_length_past_the_hosts_usize_is_an_error_not_a_truncation() {
        let mr = BumpUpstream::new(1 << 40);
        let len = (1u64 << 32) + 8;
        // SAFETY: no byte is read: `Untouched` copies nothing.
        let mut b = unsafe { DeviceBuffer::new_uninit_in(len, (), &mr, Untouched) }.unwrap();
        assert_eq!(b.to_vec(), Err(ContainerError::HostOutOfMemory { bytes: len }));
        let past_all = ContainerError::IndexOutOfRange { index: usize::MAX, len: usize::MAX };
        assert_eq!(b.write(len, &[1]), Err(past_all));
        let (e, b) = b.try_into_uvector::<u64>().unwrap_err();
        assert_eq!(e, ContainerError::LengthOverflow { len: (1 << 29) + 1 });
        let (e, mut b) = b.try_into_uvector::<u8>().unwrap_err();
        assert_eq!(e, ContainerError::LengthOverflow { len: usize::MAX });
        // A capacity past `usize`: the vector's is all it can count.
        b.resize(8).unwrap();
        let v = b.try_into_uvector::<u8>().unwrap();
        assert_eq!((v.len(), v.capacity()), (8, usize::MAX));
    }
}

/// A vector of elements larger than a thread's stack (a `Pod` array of
/// 256 KiB on a stack of 64 KiB) copies to the host: the copy is zeroed
/// where it lies, on the heap, never built on the stack. Before, `to_vec`
/// built a zeroed element on the stack first and overflowed it, which
/// aborts the process.
#[test]
fn a_vector_of_elements_larger_than_the_stack_copies_to_the_host() {
    type Big = [[u8; 4096]; 64];
    let copied = std::thread::Builder::new().stack_size(64 << 10).spawn(|| {
        let mem = HostMemory::new();
        let mut v = DeviceUVector::<Big, _, _>::new_in(2, (), &mem, HostCopy).unwrap();
        let (zero, mut written) = (bytemuck::zeroed_vec::<Big>(1), bytemuck::zeroed_vec::<Big>(1));
        written[0][63][4095] = 7;
        v.copy_from_slice_at(1, &written).unwrap();
        let host = v.to_vec().unwrap();
        assert_eq!(host.len(), 2);
        assert!(host[0] == zero[0] && host[1] == written[0]);
    });
    copied.unwrap().join().unwrap();
}
