use super::*;
use crate::{SimDevice, SimWorld};

/// Hands out exactly the blocks it is told to, so that tests choose which
/// ranges are reused.
#[derive(Debug, Default)]
struct Scripted {
    next: Mutex<Vec<Block>>,
}

impl MemoryResource<SimStream> for Scripted {
    fn allocate(&self, _: Request, _: &SimStream) -> Result<Block> {
        self.next.lock().unwrap().pop().ok_or(memres_core::Error::OutOfMemory {
            requested: 0,
            largest_free: 0,
            pool_size: 0,
            max_size: None,
        })
    }
    fn deallocate(&self, _: Block, _: &SimStream) -> Result<()> {
        Ok(())
    }
}

fn give(r: &HbChecked<Scripted>, addr: u64, size: u64, s: &SimStream) -> Block {
    r.inner().next.lock().unwrap().push(Block::from_addr(addr, size));
    r.allocate(Request::new(size).unwrap(), s).unwrap()
}

#[test]
fn partial_reuse_keeps_the_rest_of_the_free_checked() {
    let world = SimWorld::new();
    let (a, b) = (world.stream(), world.stream());
    let r = HbChecked::new(Scripted::default());
    let x = give(&r, 0x1000, 0x1000, &a);
    r.deallocate(x, &a).unwrap();
    // The middle reused on a itself: fine, and cut out of the record.
    give(&r, 0x1400, 0x400, &a);
    assert_eq!(r.pending_frees(), 2);
    assert_eq!(r.violation_count(), 0);
    // The head reused on b without ordering: reported.
    give(&r, 0x1000, 0x100, &b);
    assert_eq!(r.violation_count(), 1);
    let v = r.violations()[0];
    assert_eq!(
        (v.freed.start(), v.freed.len(), v.free_stream, v.reuse_stream),
        (0x1000, 0x400, a.id(), b.id())
    );
    // The tail reused on b after b waited on an event after the free: fine.
    b.wait(&a.record().unwrap()).unwrap();
    give(&r, 0x1800, 0x800, &b);
    assert_eq!(r.violation_count(), 1);
    assert_eq!(r.ordered_cross_stream_reuses(), 1);
}

#[test]
fn an_event_recorded_before_the_free_does_not_order_the_reuse() {
    let world = SimWorld::new();
    let (a, b) = (world.stream(), world.stream());
    let r = HbChecked::new(Scripted::default());
    let x = give(&r, 0x1000, 0x100, &a);
    let early = a.record().unwrap();
    r.deallocate(x, &a).unwrap();
    b.wait(&early).unwrap();
    give(&r, 0x1000, 0x100, &b);
    assert_eq!(r.violation_count(), 1);
}

#[test]
fn host_observation_orders_the_reuse_but_device_progress_alone_does_not() {
    let world = SimWorld::new();
    let (a, b) = (world.stream(), world.stream());
    let r = HbChecked::new(Scripted::default());
    let x = give(&r, 0x1000, 0x100, &a);
    r.deallocate(x, &a).unwrap();
    world.advance();
    give(&r, 0x1000, 0x100, &b);
    assert_eq!(r.violation_count(), 1);
    let y = give(&r, 0x2000, 0x100, &a);
    r.deallocate(y, &a).unwrap();
    let ev = a.record().unwrap();
    world.advance();
    assert!(b.query(&ev).unwrap());
    give(&r, 0x2000, 0x100, &b);
    assert_eq!(r.violation_count(), 1);
}

#[test]
fn transitive_waits_order_the_reuse() {
    let world = SimWorld::new();
    let (a, b, c) = (world.stream(), world.stream(), world.stream());
    let r = HbChecked::new(Scripted::default());
    let x = give(&r, 0x1000, 0x100, &a);
    r.deallocate(x, &a).unwrap();
    b.wait(&a.record().unwrap()).unwrap();
    c.wait(&b.record().unwrap()).unwrap();
    give(&r, 0x1000, 0x100, &c);
    assert_eq!((r.violation_count(), r.ordered_cross_stream_reuses()), (0, 1));
}

#[test]
fn failed_calls_record_nothing() {
    let world = SimWorld::new();
    let a = world.stream();
    let r = HbChecked::new(SimDevice::new(1 << 20));
    assert!(r.deallocate(Block::from_addr(0x10, 256), &a).is_err());
    assert_eq!(r.pending_frees(), 0);
    r.clear_frees();
    assert_eq!(r.violation_count(), 0);
}

#[test]
fn an_event_of_another_world_orders_nothing() {
    // A wait on it was taken when its clock was no longer than this
    // world's, ordering `c` after `a`, the stream of this world of `x`'s
    // number.
    let (w1, w2) = (SimWorld::new(), SimWorld::new());
    let (a, c) = (w1.non_blocking_stream(), w1.non_blocking_stream());
    let x = w2.non_blocking_stream();
    let dev = HbChecked::new(SimDevice::new(1 << 20));
    let blk = dev.allocate(Request::new(256).unwrap(), &a).unwrap();
    dev.deallocate(blk, &a).unwrap();
    x.enqueue();
    let waited = c.wait(&x.record().unwrap());
    let y = dev.allocate(Request::new(256).unwrap(), &c).unwrap();
    assert_eq!(y.addr(), blk.addr());
    assert!(
        matches!(waited, Err(memres_core::Error::Backend { .. })),
        "a wait on another world's event: {waited:?}"
    );
    assert_eq!(dev.violation_count(), 1, "the reuse on `c` is not ordered after the free on `a`");
}

#[test]
fn a_reuse_in_another_world_is_ordered_only_by_the_host() {
    // The default streams of two worlds have one id, 0: the reuse was
    // taken as one on the freeing stream itself.
    let (w1, w2) = (SimWorld::new(), SimWorld::new());
    let r = HbChecked::new(Scripted::default());
    let x = give(&r, 0x1000, 0x100, &w1.default_stream());
    r.deallocate(x, &w1.default_stream()).unwrap();
    w2.synchronize();
    give(&r, 0x1000, 0x100, &w2.default_stream());
    assert_eq!(r.violation_count(), 1);
    let y = give(&r, 0x2000, 0x100, &w1.default_stream());
    r.deallocate(y, &w1.default_stream()).unwrap();
    w1.synchronize();
    give(&r, 0x2000, 0x100, &w2.default_stream());
    assert_eq!((r.violation_count(), r.ordered_cross_stream_reuses()), (1, 1));
}

#[test]
fn synchronizing_a_stream_observes_no_later_default_stream_free() {
    // A blocking stream's synchronize observed the default stream's work
    // submitted after its own (its next operation's clock, not its last):
    // that free counted as complete, and its reuse as ordered.
    let world = SimWorld::new();
    let (blocking, other) = (world.stream(), world.non_blocking_stream());
    let default = world.default_stream();
    let dev = HbChecked::new(SimDevice::new(1 << 20));
    let x = dev.allocate(Request::new(256).unwrap(), &default).unwrap();
    blocking.enqueue();
    dev.deallocate(x, &default).unwrap();
    blocking.synchronize().unwrap();
    assert!(!other.is_ordered_after(0, default.position()), "the free may still be pending");
    let y = dev.allocate(Request::new(256).unwrap(), &other).unwrap();
    assert_eq!(y.addr(), x.addr());
    assert_eq!(dev.violation_count(), 1);
    // The freeing stream's own synchronize observes its free.
    dev.deallocate(y, &other).unwrap();
    other.synchronize().unwrap();
    let z = dev.allocate(Request::new(256).unwrap(), &default).unwrap();
    assert_eq!((z.addr(), dev.violation_count()), (x.addr(), 1));
}

#[test]
fn synchronizing_the_default_stream_observes_every_blocking_streams_work() {
    // The legacy stream's synchronize waits on the blocking streams first,
    // as any of its operations does: a free on one is complete after it.
    let world = SimWorld::new();
    let (blocking, other) = (world.stream(), world.non_blocking_stream());
    let default = world.default_stream();
    let dev = HbChecked::new(SimDevice::new(1 << 20));
    let x = dev.allocate(Request::new(256).unwrap(), &blocking).unwrap();
    dev.deallocate(x, &blocking).unwrap();
    default.synchronize().unwrap();
    assert!(other.is_ordered_after(blocking.id(), blocking.position()));
    let y = dev.allocate(Request::new(256).unwrap(), &other).unwrap();
    assert_eq!((y.addr(), dev.violation_count()), (x.addr(), 0));
}

#[test]
fn a_refused_free_submits_nothing() {
    // A free the inner resource refused stayed submitted: on a blocking
    // stream it took in the default stream's later free, which that
    // stream's synchronize then observed, and the reuse passed as ordered.
    let world = SimWorld::new();
    let (blocking, other) = (world.stream(), world.non_blocking_stream());
    let default = world.default_stream();
    let dev = HbChecked::new(SimDevice::new(1 << 20));
    let x = dev.allocate(Request::new(256).unwrap(), &default).unwrap();
    dev.deallocate(x, &default).unwrap();
    assert!(dev.deallocate(Block::from_addr(0x10_0000_0000, 256), &blocking).is_err());
    assert_eq!(blocking.position(), 0);
    blocking.synchronize().unwrap();
    let y = dev.allocate(Request::new(256).unwrap(), &other).unwrap();
    assert_eq!((y.addr(), dev.violation_count()), (x.addr(), 1));
}

/// In panicking mode the allocation that reuses memory out of order panics
/// and its block goes back to the inner resource (before, it stayed held
/// there for good), and the violation is counted as in counting mode.
#[test]
fn a_panicking_check_gives_the_block_of_its_violation_back() {
    let world = SimWorld::new();
    let (a, b) = (world.stream(), world.stream());
    let dev = HbChecked::new(SimDevice::new(1 << 20)).panicking();
    let x = dev.allocate(Request::new(256).unwrap(), &a).unwrap();
    dev.deallocate(x, &a).unwrap();
    let reuse = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        dev.allocate(Request::new(256).unwrap(), &b)
    }));
    assert!(reuse.is_err(), "the reuse on b, not ordered after a's free, panics");
    assert_eq!(dev.violation_count(), 1);
    assert_eq!(dev.inner().usage().used, 0, "the block went back");
    dev.inner().check().unwrap();
}
