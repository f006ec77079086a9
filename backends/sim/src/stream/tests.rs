use super::*;

#[test]
fn default_stream_exists_with_id_zero() {
    let world = SimWorld::new();
    assert_eq!(world.default_stream().id(), 0);
    assert_ne!(world.stream().id(), 0);
    assert_eq!(world.stream_count(), 2);
}

#[test]
fn streams_of_two_worlds_have_different_ids() {
    // Each world numbered its streams 0, 1, 2...: two worlds' streams
    // shared free lists.
    let (w1, w2) = (SimWorld::new(), SimWorld::new());
    let ids = [w1.stream(), w1.non_blocking_stream(), w2.stream(), w2.non_blocking_stream()].map(|s| s.id());
    for (i, id) in ids.iter().enumerate() {
        assert!(*id != 0 && !ids[i + 1..].contains(id), "{ids:?}");
    }
    // The default stream is 0 in every world, as CUDA's legacy stream.
    assert_eq!((w1.default_stream().id(), w2.default_stream().id()), (0, 0));
    // Each stream is still ordered by the ids of its own world.
    let (a, b) = (w2.non_blocking_stream(), w2.non_blocking_stream());
    let p = a.enqueue();
    b.wait(&a.record().unwrap()).unwrap();
    assert!(b.is_ordered_after(a.id(), p) && !b.is_ordered_after(w1.stream().id(), 1));
}

#[test]
fn an_event_of_another_world_is_refused_and_changes_nothing() {
    // An event whose clock was no longer than this world's was taken.
    let (w1, w2) = (SimWorld::new(), SimWorld::new());
    let (a, b) = (w1.non_blocking_stream(), w1.non_blocking_stream());
    let x = w2.non_blocking_stream();
    a.enqueue();
    x.enqueue();
    let foreign = x.record().unwrap();
    let refused = Err(Error::Backend { code: 4, what: "event of another simulated world" });
    assert_eq!(b.wait(&foreign), refused);
    assert!(!b.is_ordered_after(a.id(), 1));
    w2.advance();
    assert_eq!(b.query(&foreign), refused.map(|()| true));
    assert_eq!(w1.complete(&foreign), refused);
    assert!(!b.query(&a.record().unwrap()).unwrap(), "a's work is pending");
    // In its own world it serves.
    assert!(w2.default_stream().query(&foreign).unwrap());
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
    world.complete(&eb).unwrap();
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

#[test]
fn clocks_grow_with_what_streams_learn_not_with_the_stream_count() {
    // Each stream's clock held an entry per stream made before it: a
    // world of n streams held n²/2 entries before any work.
    let world = SimWorld::new();
    let n = 2000;
    let streams: Vec<_> = (0..n).map(|_| world.stream()).collect();
    // As a stream-ordered pool does: a taker waits on an event of the
    // stream that freed the block.
    for pair in streams.windows(2) {
        pair[1].wait(&pair[0].record().unwrap()).unwrap();
    }
    let total: usize = world.lock().streams.iter().map(|s| s.clock.len()).sum();
    assert!(total <= 2 * (n + 1), "{total} clock entries for {n} streams");
    // What the clocks say is unchanged.
    let p = streams[5].enqueue();
    streams[1500].wait(&streams[5].record().unwrap()).unwrap();
    assert!(streams[1500].is_ordered_after(streams[5].id(), p));
    assert!(!streams[1499].is_ordered_after(streams[5].id(), p));
}

#[test]
fn events_that_say_the_same_are_equal_whatever_the_length_of_their_clocks() {
    // A clock grows with what its stream learns: after a wait that taught
    // it only zeros, an event says what one before it said, in a longer
    // clock. They compared unequal.
    let world = SimWorld::new();
    let s = world.non_blocking_stream();
    let before = s.record().unwrap();
    s.wait(&world.default_stream().record().unwrap()).unwrap();
    let after = s.record().unwrap();
    assert_eq!(before, after);
    s.enqueue();
    assert_ne!(before, s.record().unwrap());
}
