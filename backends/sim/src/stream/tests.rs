use super::*;

#[test]
fn default_stream_exists_with_id_zero() {
    let world = SimWorld::new();
    assert_eq!(world.default_stream().id(), 0);
    assert_eq!(world.stream().id(), 1);
    assert_eq!(world.stream_count(), 2);
}

#[test]
fn work_stays_pending_until_advanced_or_synchronized() {
    let world = SimWorld::new();
    let (a, b) = (world.stream(), world.stream());
    a.enqueue();
    let ev = a.record().unwrap();
    assert!(!b.query(&ev).unwrap());
    world.advance();
    // Completed on the device, but the host has not looked yet.
    assert!(!b.is_observed(a.id(), 1));
    assert!(b.query(&ev).unwrap());
    assert!(b.is_observed(a.id(), 1));
    a.enqueue();
    assert!(!b.is_observed(a.id(), 2));
    a.synchronize().unwrap();
    assert!(b.is_observed(a.id(), 2));
}

#[test]
fn waits_order_transitively() {
    let world = SimWorld::new();
    let (a, b, c) = (world.non_blocking_stream(), world.non_blocking_stream(), world.non_blocking_stream());
    let p = a.enqueue();
    assert!(!c.is_ordered_after(a.id(), p));
    b.wait(&a.record().unwrap()).unwrap();
    b.enqueue();
    // c waits on b only, and so is ordered after a's work before b's wait.
    c.wait(&b.record().unwrap()).unwrap();
    assert!(c.is_ordered_after(a.id(), p));
    // Work on a after the event is not covered.
    let q = a.enqueue();
    assert!(!c.is_ordered_after(a.id(), q));
}

#[test]
fn completing_an_event_completes_what_it_depends_on() {
    let world = SimWorld::new();
    let (a, b) = (world.non_blocking_stream(), world.non_blocking_stream());
    a.enqueue();
    let ea = a.record().unwrap();
    b.wait(&ea).unwrap();
    b.enqueue();
    let eb = b.record().unwrap();
    b.enqueue();
    let later = b.record().unwrap();
    world.complete(&eb);
    assert!(a.query(&ea).unwrap());
    assert!(a.query(&eb).unwrap());
    assert!(!a.query(&later).unwrap());
}

#[test]
fn legacy_default_stream_orders_blocking_streams_only() {
    let world = SimWorld::new();
    let (blocking, non_blocking) = (world.stream(), world.non_blocking_stream());
    let d = world.default_stream();
    let p = blocking.enqueue();
    let q = non_blocking.enqueue();
    assert!(d.is_ordered_after(blocking.id(), p));
    assert!(!d.is_ordered_after(non_blocking.id(), q));
    let r = d.enqueue();
    assert!(blocking.is_ordered_after(0, r));
    assert!(!non_blocking.is_ordered_after(0, r));
}

#[test]
fn injected_failures_fail_one_call_and_change_nothing() {
    let world = SimWorld::new();
    let (a, b) = (world.stream(), world.stream());
    let p = a.enqueue();
    world.fail_nth(2);
    let ev = a.record().unwrap();
    assert!(matches!(b.wait(&ev), Err(Error::Backend { .. })));
    assert!(!b.is_ordered_after(a.id(), p));
    b.wait(&ev).unwrap();
    assert!(b.is_ordered_after(a.id(), p));
}

#[test]
fn streams_are_send_sync_and_share_state() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SimStream>();
    assert_send_sync::<SimEvent>();
    let world = SimWorld::new();
    let a = world.stream();
    let a2 = a.clone();
    a2.enqueue();
    assert_eq!(a.position(), 1);
}
