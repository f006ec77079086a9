extern crate std;

use super::*;
use crate::pool::{Growth, PoolConfig};
use crate::testing::{BumpUpstream, IdStream, LoggedStream, StreamLog};
use alloc::rc::Rc;
use alloc::sync::Arc;
use core::cell::RefCell;

type Maker = PoolMaker<Arc<BumpUpstream>>;
type Pools = PerStreamPool<Maker, LoggedStream>;

const MIB: u64 = 1 << 20;

struct Rig {
    pools: Pools,
    up: Arc<BumpUpstream>,
    log: Rc<RefCell<StreamLog>>,
    a: LoggedStream,
    b: LoggedStream,
    c: LoggedStream,
}

/// Pools that grow in 1 MiB chunks over an upstream of `capacity` bytes.
fn rig(capacity: u64) -> Rig {
    let up = Arc::new(BumpUpstream::new(capacity));
    let config = PoolConfig::new().growth(Growth::Fraction { divisor: 8, granule: MIB });
    let pools = PerStreamPool::new(PoolMaker::with_config(up.clone(), config).unwrap());
    let log = Rc::new(RefCell::new(StreamLog::default()));
    let s = |id| LoggedStream { id, log: log.clone() };
    Rig { pools, up: up.clone(), a: s(1), b: s(2), c: s(3), log }
}

fn req(n: u64) -> Request {
    Request::new(n).unwrap()
}

impl Rig {
    fn alloc(&mut self, n: u64, s: &LoggedStream) -> Block {
        let ids = self.ids();
        let b = self.pools.allocate(req(n), s).unwrap();
        self.read_id_once(ids);
        self.pools.check().unwrap();
        b
    }

    fn free(&mut self, b: Block, s: &LoggedStream) {
        let ids = self.ids();
        self.pools.deallocate(b, s).unwrap();
        self.read_id_once(ids);
        self.pools.check().unwrap();
    }

    fn ids(&self) -> u64 {
        self.log.borrow().ids
    }

    /// A call reads its stream's id once, as `Stream::id` says: a stream
    /// whose id changes between two reads would have a block found in one
    /// lane and freed in another's.
    fn read_id_once(&self, before: u64) {
        assert!(self.ids() - before <= 1, "{} reads of the stream's id in one call", self.ids() - before);
    }

    fn records(&self) -> Vec<u64> {
        self.log.borrow().records.clone()
    }

    fn waits(&self) -> Vec<(u64, u64)> {
        self.log.borrow().waits.clone()
    }

    /// Bytes the pools hold equal what the upstream lent.
    fn exact(&self) {
        assert_eq!(self.pools.usage().held, self.up.usage().held);
    }
}

#[test]
fn a_free_on_the_same_stream_is_reused_at_once_with_no_event() {
    let mut r = rig(1 << 30);
    let a = r.a.clone();
    for _ in 0..3 {
        let x = r.alloc(1000, &a);
        r.free(x, &a);
        let y = r.alloc(1000, &a);
        assert_eq!(x.addr(), y.addr());
        r.free(y, &a);
    }
    // Chunks went wholly free, but no other stream has a pool: no fence.
    assert!(r.records().is_empty() && r.waits().is_empty());
    assert_eq!(r.pools.stats().fences, 0);
    r.exact();
}

#[test]
fn a_free_on_another_stream_orders_the_owner_before_reuse() {
    let mut r = rig(1 << 30);
    let (a, b) = (r.a.clone(), r.b.clone());
    let x = r.alloc(1000, &a);
    r.free(x, &b);
    assert_eq!(r.records(), [b.id], "an event after the free on b");
    assert_eq!(r.pools.stats().cross_frees, 1);
    assert!(r.waits().is_empty(), "the owner waits only when it allocates");
    let y = r.alloc(1000, &a);
    assert_eq!(r.waits(), [(a.id, b.id)], "a waits on b's event before reusing the block");
    assert_eq!(y.addr(), x.addr());
    // Settled: the next allocation waits on nothing more.
    let z = r.alloc(1000, &a);
    assert_eq!(r.waits().len(), 1);
    r.free(y, &a);
    r.free(z, &a);
    r.exact();
}

#[test]
fn a_wholly_free_chunk_moves_to_another_stream_after_a_wait_on_its_fence() {
    let mut r = rig(1 << 30);
    let (a, b) = (r.a.clone(), r.b.clone());
    let small = r.alloc(256, &b);
    let x = r.alloc(MIB, &a);
    r.free(x, &a);
    assert_eq!(r.records(), [a.id], "a fence: b has a pool and may want the chunk");
    let held = r.up.usage().held;
    let y = r.alloc(MIB, &b);
    assert_eq!(r.waits(), [(b.id, a.id)], "b waits on a's fence");
    assert_eq!(y.addr(), x.addr(), "the chunk moved");
    assert_eq!(r.pools.stats().chunks_moved, 1);
    assert_eq!(r.up.usage().held, held, "nothing new from upstream");
    assert_eq!(r.pools.stream_count(), 1, "a's empty pool is dropped");
    r.free(y, &b);
    r.free(small, &b);
    // a comes back: a new pool.
    let z = r.alloc(1000, &a);
    assert_eq!(r.pools.stats().pools_made, 3);
    r.free(z, &a);
    r.exact();
}

#[test]
fn a_lone_stream_is_asked_for_a_fence_and_gives_its_chunks_after() {
    let mut r = rig(1 << 30);
    let (a, b) = (r.a.clone(), r.b.clone());
    let x1 = r.alloc(MIB, &a);
    let x2 = r.alloc(MIB, &a);
    r.free(x1, &a);
    assert!(r.records().is_empty(), "one stream: no fence");
    // b finds a's free chunk with no fence: it grows, and asks a for one.
    let y1 = r.alloc(MIB, &b);
    assert_ne!(y1.addr(), x1.addr());
    assert!(r.waits().is_empty(), "no wait on a fence that does not cover");
    assert_eq!(r.pools.stats().chunks_moved, 0);
    // a's next free that empties a chunk records one.
    r.free(x2, &a);
    assert_eq!(r.records(), [a.id], "a's fence, asked for by b");
    let y2 = r.alloc(MIB, &b);
    assert!(r.waits().contains(&(b.id, a.id)));
    assert!([x1.addr(), x2.addr()].contains(&y2.addr()));
    assert_eq!(r.pools.stats().chunks_moved, 1);
    r.free(y1, &b);
    r.free(y2, &b);
    r.exact();
}

/// A growth whose wait on a later stream's fence fails returns that
/// error, and counts what the streams before gave back. Before, it
/// returned before counting: `bytes_released` said 0 where a chunk had
/// gone back.
#[test]
fn a_growth_whose_wait_fails_counts_what_went_back_before() {
    let mut r = rig(1 << 30);
    let (a, b, c) = (r.a.clone(), r.b.clone(), r.c.clone());
    let small = r.alloc(256, &b);
    // Both live at once: each stream's pool takes a chunk of its own.
    let (xa, xc) = (r.alloc(MIB, &a), r.alloc(MIB, &c));
    r.free(xa, &a);
    r.free(xc, &c);
    let before = r.up.usage().held;
    r.log.borrow_mut().fail_wait_on = Some(c.id);
    let e = r.pools.allocate(req(4 * MIB), &b).unwrap_err();
    assert!(matches!(e, Error::Backend { code: 3, .. }), "{e}");
    assert!(r.waits().contains(&(b.id, a.id)), "{:?} {:?}", r.waits(), r.records());
    assert_eq!(r.up.usage().held, before - MIB, "a's chunk went back");
    assert_eq!(r.pools.stats().bytes_released, MIB);
    r.pools.check().unwrap();
    r.exact();
    r.log.borrow_mut().fail_wait_on = None;
    let y = r.alloc(4 * MIB, &b);
    r.free(y, &b);
    r.free(small, &b);
    r.exact();
}

#[test]
fn growth_gives_the_free_chunks_of_other_streams_back_first() {
    let mut r = rig(1 << 30);
    let (a, b) = (r.a.clone(), r.b.clone());
    let small = r.alloc(256, &b);
    let x = r.alloc(MIB, &a);
    r.free(x, &a);
    let before = r.up.usage().held;
    // Too big for a's chunk: it goes back upstream, freed on b after a wait.
    let y = r.alloc(4 * MIB, &b);
    assert!(r.waits().contains(&(b.id, a.id)));
    assert_eq!(r.pools.stats().bytes_released, MIB);
    assert_eq!(r.pools.stats().chunks_moved, 0);
    assert_eq!(r.up.usage().held, before - MIB + 4 * MIB);
    r.free(y, &b);
    r.free(small, &b);
    r.exact();
}

/// A chunk of another stream that the upstream refuses to take back
/// stays where it is, and the growth goes on without it (it failed with
/// the refusal); the refusal is the error only where the upstream then has
/// no room.
#[test]
fn a_chunk_the_upstream_refuses_before_growing_stays_and_the_growth_goes_on() {
    let mut r = rig(7 * MIB);
    let (a, b) = (r.a.clone(), r.b.clone());
    let small = r.alloc(256, &b); // a then records a fence at its free
    let x = r.alloc(MIB, &a);
    r.free(x, &a);
    let of_a = r.pools.pool_of(a.id).unwrap().usage().held;
    r.up.refuse_free_at(x.addr());
    let y = r.alloc(4 * MIB, &b);
    assert!(r.waits().contains(&(b.id, a.id)), "a's chunk was offered back");
    assert_eq!(r.pools.pool_of(a.id).unwrap().usage().held, of_a, "a's refused chunk stays");
    assert_eq!(r.pools.stats().bytes_released, 0);
    r.exact();
    // Now the upstream has room for 1 MiB, and a's chunk is too small to
    // move to b: the refusal is what went wrong.
    let held = (r.pools.usage().held, r.up.usage().held);
    let e = r.pools.allocate(req(2 * MIB), &b).unwrap_err();
    assert_eq!(e, Error::Backend { code: -2, what: "injected refusal of a free" });
    assert_eq!((r.pools.usage().held, r.up.usage().held), held);
    r.pools.check().unwrap();
    // Once the upstream takes it back, the same request fits in its room.
    r.up.refuse_free_at(0);
    let z = r.alloc(2 * MIB, &b);
    r.free(z, &b);
    r.free(y, &b);
    r.free(small, &b);
    r.exact();
}

/// Where the upstream takes one of a stream's free chunks back and refuses
/// the other, the bytes that went back are counted (they were not: the
/// lane's release answered the refusal, not its bytes).
#[test]
fn the_bytes_a_refused_release_gave_back_are_counted() {
    let mut r = rig(1 << 30);
    let (a, b) = (r.a.clone(), r.b.clone());
    let small = r.alloc(256, &b); // a then records a fence at its free
    let x = r.alloc(MIB, &a);
    let y = r.alloc(MIB, &a);
    assert_eq!(r.pools.pool_of(a.id).unwrap().chunk_ranges().count(), 2);
    r.free(x, &a);
    r.free(y, &a);
    r.up.refuse_free_at(x.addr());
    let before = r.up.usage().held;
    let z = r.alloc(4 * MIB, &b);
    let of_a = r.pools.pool_of(a.id).unwrap().usage().held;
    assert_eq!(of_a, MIB, "a keeps the refused chunk");
    assert_eq!(r.pools.stats().bytes_released, MIB, "and y's went back");
    assert_eq!(r.up.usage().held, before - MIB + 4 * MIB);
    r.exact();
    r.up.refuse_free_at(0);
    r.free(z, &b);
    r.free(small, &b);
    r.exact();
}

#[test]
fn release_gives_back_the_free_chunks_that_the_stream_is_ordered_after() {
    for device in [true, false] {
        let mut r = rig(1 << 30);
        r.log.borrow_mut().device = device;
        let (a, b, c) = (r.a.clone(), r.b.clone(), r.c.clone());
        let x = r.alloc(MIB, &a);
        let y = r.alloc(1000, &b);
        let z = r.alloc(MIB, &c);
        // a's chunk: wholly free, under its fence. c's: wholly free by a
        // free on b that c has not waited for, so no fence covers it.
        r.free(x, &a);
        r.free(z, &b);
        let held = |r: &Rig, s: &LoggedStream| r.pools.pool_of(s.id).map_or(0, |p| p.usage().held);
        let (of_a, of_b, of_c) = (held(&r, &a), held(&r, &b), held(&r, &c));
        assert!(of_a >= MIB && of_c >= MIB);
        let waits = r.waits().len();
        if device {
            // Every stream's, b's chunk kept for its live block.
            assert_eq!(r.pools.release(&b).unwrap(), of_a + of_c);
            assert_eq!(r.log.borrow().device_syncs, 1);
            assert_eq!(r.waits().len(), waits, "the device is idle: no wait");
            assert_eq!(r.up.usage().held, of_b);
        } else {
            // a's after a wait on its fence; c's stay, and c records a
            // fence at its next call.
            assert_eq!(r.pools.release(&b).unwrap(), of_a);
            assert_eq!(r.waits()[waits..], [(b.id, a.id)]);
            assert_eq!(r.up.usage().held, of_b + of_c);
            r.pools.check().unwrap();
            // On c, after c waited on b's free of its block.
            assert_eq!(r.pools.release(&c).unwrap(), of_c);
            assert_eq!(r.waits()[waits + 1..], [(c.id, b.id)]);
            assert_eq!(r.up.usage().held, of_b);
        }
        r.pools.check().unwrap();
        r.exact();
        // The pools serve as before.
        let x = r.alloc(MIB, &a);
        r.free(x, &a);
        r.free(y, &b);
        r.exact();
    }
}

#[test]
fn out_of_memory_synchronizes_the_device_and_gives_every_free_chunk_back() {
    for device in [true, false] {
        let mut r = rig(2 * MIB);
        r.log.borrow_mut().device = device;
        let (a, b) = (r.a.clone(), r.b.clone());
        // a's chunk is free, but its fence does not cover it (a was alone).
        let x = r.alloc(MIB, &a);
        r.free(x, &a);
        let y = r.alloc(MIB, &b);
        if device {
            let z = r.alloc(MIB, &b);
            assert_eq!(r.log.borrow().device_syncs, 1);
            assert_eq!(r.pools.stats().last_resorts, 1);
            r.free(z, &b);
        } else {
            let before = (r.pools.usage().held, r.up.usage().held, r.pools.stream_count());
            let e = r.pools.allocate(req(MIB), &b).unwrap_err();
            // Every stream's pool counts in the pool size, a's free chunk too.
            assert!(matches!(e, Error::OutOfMemory { pool_size, .. } if pool_size == 2 * MIB), "{e}");
            assert_eq!((r.pools.usage().held, r.up.usage().held, r.pools.stream_count()), before);
            r.pools.check().unwrap();
        }
        r.free(y, &b);
        r.exact();
    }
}

/// Memory that comes free upstream at the last resort's device
/// synchronization (another user's frees done) serves one more try, though
/// no lane gave anything back and nothing was refused; that try ran only
/// where a lane gave back or the upstream refused.
#[test]
fn the_last_resort_tries_once_more_though_no_lane_gave_anything_back() {
    for device in [true, false] {
        let mut r = rig(4 * MIB);
        r.log.borrow_mut().device = device;
        let a = r.a.clone();
        let x = r.alloc(MIB, &a);
        let other = crate::MemoryResource::<()>::allocate(&*r.up, req(3 * MIB), &()).unwrap();
        r.log.borrow_mut().freed_at_device_sync = Some((r.up.clone(), other));
        let y = r.alloc(2 * MIB, &a);
        assert_eq!(r.log.borrow().device_syncs, 1);
        assert_eq!(r.pools.stats().last_resorts, 1);
        assert_eq!(r.pools.stats().bytes_released, 0, "no chunk went back before the growth");
        r.exact();
        // With nothing to come free, the error is out of memory, nothing lost.
        let before = (r.pools.usage().held, r.up.usage().held);
        let e = r.pools.allocate(req(2 * MIB), &a).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert_eq!((r.pools.usage().held, r.up.usage().held), before);
        assert_eq!(r.pools.stats().last_resorts, 2);
        r.free(y, &a);
        r.free(x, &a);
        r.exact();
    }
}

/// A chunk that the upstream refuses before the growth and again at the
/// last resort (the device idle: every lane gives back) stays in its lane,
/// and the try after the last resort is served from memory that came free
/// at the synchronization: the refusal is not the answer where the request
/// then fits.
#[test]
fn a_refusal_at_the_last_resort_does_not_stop_the_try_after_it() {
    let mut r = rig(4 * MIB);
    r.log.borrow_mut().device = true;
    let (a, b) = (r.a.clone(), r.b.clone());
    let small = r.alloc(256, &b); // a then records a fence at its free
    let x = r.alloc(MIB, &a);
    r.free(x, &a);
    r.up.refuse_free_at(x.addr());
    let other = crate::MemoryResource::<()>::allocate(&*r.up, req(2 * MIB), &()).unwrap();
    r.log.borrow_mut().freed_at_device_sync = Some((r.up.clone(), other));
    let y = r.alloc(2 * MIB, &b);
    assert!(r.waits().contains(&(b.id, a.id)), "a's chunk was offered back");
    assert_eq!(r.pools.stats().last_resorts, 1);
    assert_eq!(r.pools.pool_of(a.id).unwrap().usage().held, MIB, "a keeps its refused chunk");
    assert_eq!(r.pools.stats().bytes_released, 0);
    r.exact();
    r.up.refuse_free_at(0);
    r.free(y, &b);
    r.free(small, &b);
    r.exact();
}

#[test]
fn bad_frees_are_typed_errors_that_change_nothing() {
    let mut r = rig(1 << 30);
    let (a, b, c) = (r.a.clone(), r.b.clone(), r.c.clone());
    let x = r.alloc(1000, &a);
    let y = r.alloc(1000, &b);
    let stale = r.alloc(1000, &a);
    r.free(stale, &a);
    let state = |r: &Rig| (r.pools.usage().held, r.pools.stats(), r.records(), r.waits());
    let before = state(&r);
    for s in [&a, &b, &c] {
        for (bad, want) in [
            (Block::new(1 << 50, 1000, 0), "unknown"),
            (Block::from_addr(1 << 50, 1000), "unknown"),
            (Block::new(x.addr() + 256, 256, x.tag()), "unknown"),
            (stale, "double"),
            (Block::new(x.addr(), 5000, x.tag()), "size"),
            (Block::new(y.addr(), 5000, y.tag()), "size"),
            // Sizes whose rounding overflows.
            (Block::new(x.addr(), u64::MAX, x.tag()), "size"),
            (Block::from_addr(y.addr(), u64::MAX), "size"),
        ] {
            let e = r.pools.deallocate(bad, s).unwrap_err();
            let ok = match want {
                "unknown" => matches!(e, Error::UnknownBlock { .. }),
                "double" => matches!(e, Error::DoubleFree { .. }),
                _ => matches!(e, Error::SizeMismatch { .. }),
            };
            assert!(ok, "{bad:?} on {}: {e}", s.id);
            r.pools.check().unwrap();
        }
    }
    // A failed cross free may have recorded an event (only order); nothing else.
    let after = state(&r);
    assert_eq!((after.0, after.1, after.3), (before.0, before.1, before.3));
    // The blocks are still live and free normally, by address too.
    r.free(Block::from_addr(x.addr(), 1000), &a);
    r.free(y, &b);
    r.exact();
}

#[test]
fn a_stale_block_after_its_chunk_moved_is_refused() {
    let mut r = rig(1 << 30);
    let (a, b) = (r.a.clone(), r.b.clone());
    let small = r.alloc(256, &b);
    let x = r.alloc(MIB, &a);
    r.free(x, &a);
    let y = r.alloc(MIB, &b);
    assert_eq!(y.addr(), x.addr());
    for s in [&a, &b] {
        let e = r.pools.deallocate(x, s).unwrap_err();
        assert!(matches!(e, Error::DoubleFree { .. } | Error::UnknownBlock { .. }), "{e}");
        r.pools.check().unwrap();
    }
    // y is still live.
    r.free(y, &b);
    r.free(small, &b);
    r.exact();
}

#[test]
fn a_fence_that_fails_to_record_leaves_the_pool_to_settle() {
    let mut r = rig(1 << 30);
    let (a, b) = (r.a.clone(), r.b.clone());
    let small = r.alloc(256, &b);
    let x = r.alloc(MIB, &a);
    r.log.borrow_mut().fail_record = true;
    r.free(x, &a);
    r.log.borrow_mut().fail_record = false;
    // Not covered: b grows instead of taking it.
    let y = r.alloc(MIB, &b);
    assert_ne!(y.addr(), x.addr());
    // a's next allocation settles it.
    let z = r.alloc(256, &a);
    assert!(r.records().contains(&a.id));
    r.free(z, &a);
    r.free(y, &b);
    r.free(small, &b);
    r.exact();
}

#[test]
fn make_pool_gives_the_first_stream_the_initial_size() {
    let mut r = rig(1 << 30);
    let (a, b) = (r.a.clone(), r.b.clone());
    let maker = r.pools.maker().clone().first_initial_size(4 * MIB).unwrap();
    r.pools = PerStreamPool::new(maker);
    r.pools.make_pool(&a).unwrap();
    assert_eq!(r.pools.usage().held, 4 * MIB);
    assert!(matches!(r.pools.make_pool(&a), Err(Error::InvalidConfig { .. })));
    r.pools.check().unwrap();
    // b takes the initial chunk once a fenced it.
    let small = r.alloc(256, &b);
    assert_eq!(r.pools.usage().held, 5 * MIB);
    let x = r.alloc(256, &a);
    r.free(x, &a);
    let y = r.alloc(2 * MIB, &b);
    assert_eq!(r.pools.stats().chunks_moved, 1);
    r.free(y, &b);
    r.free(small, &b);
    r.exact();
}

#[test]
fn virtual_pools_wait_on_frees_from_other_streams_and_record_no_fence() {
    use crate::vmem::CountingSpace;
    use crate::vpool::VirtualConfig;
    let space = CountingSpace::new(64 * MIB, MIB);
    let mut pools = PerStreamPool::new(VirtualMaker::new(&space, VirtualConfig::new(64 * MIB)).unwrap());
    let log = Rc::new(RefCell::new(StreamLog::default()));
    let (a, b) = (LoggedStream { id: 1, log: log.clone() }, LoggedStream { id: 2, log: log.clone() });
    let x = pools.allocate(req(MIB), &a).unwrap();
    let y = pools.allocate(req(MIB), &b).unwrap();
    pools.deallocate(x, &b).unwrap();
    assert_eq!(log.borrow().records, [b.id], "an event after the free on b");
    // a's next call settles: it waits on b's event, and with no chunk to
    // hand another stream, records nothing.
    let z = pools.allocate(req(MIB), &a).unwrap();
    assert_eq!(log.borrow().waits, [(a.id, b.id)]);
    assert_eq!(log.borrow().records, [b.id]);
    assert_eq!(pools.stats().fences, 0);
    pools.check().unwrap();
    for (block, s) in [(z, &a), (y, &b)] {
        pools.deallocate(block, s).unwrap();
        pools.check().unwrap();
    }
    assert_eq!(log.borrow().records, [b.id], "frees on their own streams record nothing");
}

/// A stream's virtual pool out of addresses for another reservation: the
/// error names the request, as the virtual pool's does, and what every
/// stream's pool holds.
#[test]
fn virtual_pools_out_of_addresses_fail_with_the_request() {
    use crate::vmem::CountingSpace;
    use crate::vpool::VirtualConfig;
    // Granules of 1 GiB, reservations of 2^45 bytes: the space's addresses
    // hold three.
    let space = CountingSpace::new(1 << 47, 1 << 30);
    let config = VirtualConfig::new(1 << 45).max_reservations(8);
    let mut pools = PerStreamPool::new(VirtualMaker::new(&space, config).unwrap());
    let log = Rc::new(RefCell::new(StreamLog::default()));
    let (a, b) = (LoggedStream { id: 1, log: log.clone() }, LoggedStream { id: 2, log: log.clone() });
    let x = pools.allocate(req(1 << 45), &a).unwrap();
    let y = pools.allocate(req(1 << 45), &b).unwrap();
    let z = pools.allocate(req(1 << 45), &a).unwrap();
    let e = pools.allocate(req(1000), &a).unwrap_err();
    let expected =
        Error::OutOfMemory { requested: 1000, largest_free: 0, pool_size: 3 << 45, max_size: Some(2 << 45) };
    assert_eq!(e, expected);
    pools.check().unwrap();
    for (block, s) in [(x, &a), (y, &b), (z, &a)] {
        pools.deallocate(block, s).unwrap();
    }
    pools.check().unwrap();
}

/// A space that counts the commits asked of it, failed ones too.
struct Tries<'a> {
    inner: &'a crate::vmem::CountingSpace,
    commits: core::cell::Cell<u64>,
}

impl crate::vmem::ReservableSpace for Tries<'_> {
    fn granule(&self) -> u64 {
        self.inner.granule()
    }
    fn reserve(&self, len: u64) -> Result<crate::Range> {
        self.inner.reserve(len)
    }
    fn release(&self, range: crate::Range) -> Result<()> {
        self.inner.release(range)
    }
    fn commit(&self, range: crate::Range) -> Result<()> {
        self.commits.set(self.commits.get() + 1);
        self.inner.commit(range)
    }
    fn decommit<S: Stream + ?Sized>(&self, range: crate::Range, stream: &S) -> Result<()> {
        self.inner.decommit(range, stream)
    }
}

#[test]
fn a_virtual_pool_out_of_memory_tries_once_then_once_after_the_last_resort() {
    use crate::vmem::CountingSpace;
    use crate::vpool::VirtualConfig;
    let space = CountingSpace::new(4 * MIB, MIB);
    let tries = Tries { inner: &space, commits: core::cell::Cell::new(0) };
    // Idle granules stay mapped (no release threshold reached), so b's
    // freed memory is still b's when a runs out.
    let config = VirtualConfig::new(64 * MIB).release_threshold(u64::MAX);
    let mut pools = PerStreamPool::new(VirtualMaker::new(&tries, config).unwrap());
    let log = Rc::new(RefCell::new(StreamLog { device: true, ..StreamLog::default() }));
    let (a, b) = (LoggedStream { id: 1, log: log.clone() }, LoggedStream { id: 2, log: log.clone() });
    let x = pools.allocate(req(MIB), &a).unwrap();
    let y = pools.allocate(req(3 * MIB), &b).unwrap();
    pools.deallocate(y, &b).unwrap();
    assert_eq!(space.committed_bytes(), 4 * MIB, "b keeps its idle granules");
    let before = tries.commits.get();
    // a needs two granules with none free: its fast path fails, nothing
    // moves between virtual pools, the last resort unmaps b's, and a
    // tries once more.
    let z = pools.allocate(req(2 * MIB), &a).unwrap();
    assert_eq!(pools.stats().last_resorts, 1);
    assert_eq!(log.borrow().device_syncs, 1);
    assert_eq!(tries.commits.get() - before, 2, "the fast path's and the one after the last resort");
    pools.check().unwrap();
    // Nothing left to give back: the out-of-memory error, nothing lost.
    let err = pools.allocate(req(2 * MIB), &a).unwrap_err();
    assert!(err.is_out_of_memory(), "{err:?}");
    assert_eq!(pools.stats().last_resorts, 2);
    assert_eq!(space.committed_bytes(), 3 * MIB);
    pools.check().unwrap();
    pools.deallocate(z, &a).unwrap();
    pools.deallocate(x, &a).unwrap();
    pools.check().unwrap();
}

/// A stream's first allocation reads its `id` once, so it succeeds under a
/// stream whose second read panics: a second read, after the maker took
/// the pool's initial size, panicked and dropped the new pool with its
/// chunk, lost to the upstream.
#[test]
fn a_streams_first_allocation_reads_its_id_once() {
    use crate::testing::PanickingStream;
    let up = BumpUpstream::new(1 << 30);
    let mut pools =
        PerStreamPool::<_, PanickingStream>::new(PoolMaker::new(&up).first_initial_size(1 << 20).unwrap());
    let s = PanickingStream::new(1);
    s.panic_in("id", 1);
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pools.allocate(req(1000), &s)));
    s.disarm();
    let Ok(Ok(b)) = first else { panic!("the first allocation read the id twice, or failed: {first:?}") };
    pools.deallocate(b, &s).unwrap();
    pools.check().unwrap();
    assert_eq!(up.usage().held, pools.usage().held, "every chunk the upstream lent is a pool's");
}

#[test]
fn a_virtual_maker_refuses_a_configuration_no_pool_could_take_when_made() {
    use crate::vmem::CountingSpace;
    use crate::vpool::VirtualConfig;
    let space = CountingSpace::new(64 * MIB, 256);
    for config in
        [VirtualConfig::new(0), VirtualConfig::new(1 << 40), VirtualConfig::new(MIB).max_reservations(0)]
    {
        assert!(matches!(VirtualMaker::new(&space, config), Err(Error::InvalidConfig { .. })), "{config:?}");
    }
    assert_eq!(space.reservation_count(), 0);
    assert!(VirtualMaker::new(&space, VirtualConfig::new(MIB)).is_ok());
}

/// A stream whose events are numbered in the order they were recorded, and
/// which logs each wait as (stream, event): a wait on an event recorded
/// before a free does not order the waiter after it.
#[derive(Clone)]
struct SeqStream {
    id: u64,
    device: bool,
    log: Rc<RefCell<SeqLog>>,
}

/// The last event recorded, and each wait as (stream, event).
type SeqLog = (u64, Vec<(u64, u64)>);

impl Stream for SeqStream {
    type Event = u64;
    fn id(&self) -> u64 {
        self.id
    }
    fn record(&self) -> Result<u64> {
        let mut log = self.log.borrow_mut();
        log.0 += 1;
        Ok(log.0)
    }
    fn wait(&self, e: &u64) -> Result<()> {
        self.log.borrow_mut().1.push((self.id, *e));
        Ok(())
    }
    fn query(&self, _: &u64) -> Result<bool> {
        Ok(false)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn synchronize_device(&self) -> Result<bool> {
        Ok(self.device)
    }
}

/// A stream left alone with a fence from when another stream had a pool:
/// a free that leaves a chunk wholly free unsets what the fence covered,
/// so a release on a third stream (no device synchronization) gives that
/// chunk back only once it waited on a fence recorded after the free. It
/// waited on the old fence and gave the chunk back unordered.
#[test]
fn a_lone_stream_whose_fence_covered_its_chunks_uncovers_them_when_it_frees_one() {
    let log = Rc::new(RefCell::new((0u64, Vec::new())));
    let s = |id, device| SeqStream { id, device, log: log.clone() };
    let (a, b, c) = (s(1, true), s(2, true), s(3, false));
    let up = BumpUpstream::new(1 << 30);
    let mut pools = PerStreamPool::new(PoolMaker::new(&up));
    let x = pools.allocate(req(MIB), &a).unwrap();
    let y = pools.allocate(req(MIB), &b).unwrap();
    pools.deallocate(x, &a).unwrap(); // a's fence
    pools.deallocate(y, &b).unwrap();
    let big = pools.allocate(req(64 * MIB), &a).unwrap(); // b's pool goes
    assert_eq!(pools.stream_count(), 1);
    pools.deallocate(big, &a).unwrap();
    pools.check().unwrap();
    let freed_after = log.borrow().0;
    assert_eq!(pools.release(&c).unwrap(), 0, "nothing covers the chunk freed last");
    // Asked for a fence, a's next call records one after the free; the
    // free that leaves the chunk wholly free again uncovers it.
    let again = pools.allocate(req(256), &a).unwrap();
    assert!(log.borrow().0 > freed_after, "a fence recorded at a's next call");
    pools.deallocate(again, &a).unwrap();
    pools.check().unwrap();
    let waited = log.borrow().1.len();
    assert_eq!(pools.release(&c).unwrap(), 0);
    assert_eq!(log.borrow().1.len(), waited, "no fence covers the chunk now");
    assert_eq!(pools.usage().held, up.usage().held);
}

/// The checker agrees: a lone stream's chunk left wholly free after its
/// lane was settled is not said covered with no fence.
#[test]
fn a_lone_streams_wholly_free_chunk_after_a_settle_passes_the_checker() {
    let up = BumpUpstream::new(1 << 30);
    let mut pools = PerStreamPool::new(PoolMaker::new(&up));
    let (a, b) = (IdStream(1), IdStream(2));
    let x1 = pools.allocate(req(4096), &a).unwrap();
    let x2 = pools.allocate(req(4096), &a).unwrap();
    let y = pools.allocate(req(4096), &b).unwrap();
    pools.deallocate(x1, &b).unwrap(); // a settles at its next call
    let z = pools.allocate(req(4096), &a).unwrap(); // no wholly free chunk: no fence, covered
    pools.deallocate(y, &b).unwrap();
    let big = pools.allocate(req(64 << 20), &a).unwrap(); // b's pool goes
    assert_eq!(pools.stream_count(), 1);
    pools.deallocate(x2, &a).unwrap();
    pools.deallocate(z, &a).unwrap(); // a's first chunk wholly free
    pools.check().unwrap();
    pools.deallocate(big, &a).unwrap();
    pools.check().unwrap();
}

/// An upstream outside the contract that hands every chunk out at one
/// address, refusing after its fourth.
struct OneAddress(core::cell::Cell<u32>);

impl<S: Stream + ?Sized> crate::MemoryResource<S> for OneAddress {
    fn allocate(&self, r: Request, _: &S) -> Result<Block> {
        if self.0.get() == 4 {
            return Err(Error::OutOfMemory {
                requested: r.size(),
                largest_free: 0,
                pool_size: 0,
                max_size: None,
            });
        }
        self.0.set(self.0.get() + 1);
        Ok(Block::new(1 << 20, r.size(), 0))
    }
    fn deallocate(&self, _: Block, _: &S) -> Result<()> {
        Ok(())
    }
}

/// Four lanes of `2^62` bytes each, the same bytes from an upstream
/// outside the contract: the second to fourth are refused, so the held
/// bytes, the peak and an out-of-memory's pool size stay those of the one
/// lane that holds them. (Before, the four were taken, and the sums
/// saturated at `u64::MAX` rather than wrap.)
#[test]
fn lanes_the_upstream_hands_the_same_bytes_are_refused_and_the_sums_stay_exact() {
    let up = OneAddress(core::cell::Cell::new(0));
    let maker = PoolMaker::with_config(&up, PoolConfig::new().initial_size(1 << 62)).unwrap();
    let mut pools = PerStreamPool::new(maker);
    pools.allocate(req(256), &IdStream(1)).unwrap();
    for id in 2..=4 {
        let got = pools.allocate(req(256), &IdStream(id));
        assert!(matches!(got, Err(Error::UpstreamMisbehaved { .. })), "{id}: {got:?}");
    }
    assert_eq!(pools.usage().peak_held, 1 << 62);
    match pools.allocate(req(1 << 62), &IdStream(1)) {
        Err(Error::OutOfMemory { pool_size, .. }) => assert_eq!(pool_size, 1 << 62),
        other => panic!("not out of memory: {other:?}"),
    }
    pools.check().unwrap();
}

/// A chunk moved in from another stream's lane that the lane cannot use
/// (a shared-class chunk for a large request) is wholly free and not
/// covered by the lane's fence, recorded before the lane's stream waited
/// on the donor's. If the growth that follows panics (the upstream's free
/// of that chunk, here), a third stream took the chunk after waiting on
/// that old fence only: not ordered after the donor's free of the memory.
#[test]
fn a_chunk_moved_in_before_a_growth_that_panics_is_not_covered_by_the_lanes_old_fence() {
    let up = Arc::new(BumpUpstream::new(1 << 30));
    let config = PoolConfig::new()
        .growth(Growth::Fraction { divisor: 8, granule: 256 << 10 })
        .large_threshold(128 << 10);
    let mut pools: Pools = PerStreamPool::new(PoolMaker::with_config(up.clone(), config).unwrap());
    let log = Rc::new(RefCell::new(StreamLog::default()));
    let s = |id| LoggedStream { id, log: log.clone() };
    let (a, b, c) = (s(1), s(2), s(3));
    // b empties a chunk (its fence recorded, covered), then uses it again.
    let b1 = pools.allocate(req(1000), &b).unwrap();
    let x = pools.allocate(req(1000), &a).unwrap();
    pools.deallocate(b1, &b).unwrap();
    let _b2 = pools.allocate(req(1000), &b).unwrap();
    // a empties its chunk: a's fence covers it.
    pools.deallocate(x, &a).unwrap();
    pools.check().unwrap();
    log.borrow_mut().waits.clear();
    // b asks for a large block: it takes a's shared-class chunk (after a
    // wait on a's fence), cannot use it, grows; the chunk's free panics.
    up.panic_in("deallocate", 0);
    let large = Request::new(139_186).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pools.allocate(large, &b)));
    assert!(r.is_err());
    assert_eq!(log.borrow().waits, [(b.id, a.id)], "b waited on a's fence and took a's chunk");
    pools.check().unwrap();
    log.borrow_mut().waits.clear();
    // c's block in that chunk is ordered after a's free of `x`.
    let y = pools.allocate(req(100 << 10), &c).unwrap();
    let waits = log.borrow().waits.clone();
    let in_xs_chunk = (x.addr()..x.addr() + (256 << 10)).contains(&y.addr());
    assert!(
        !in_xs_chunk || waits.contains(&(c.id, a.id)),
        "c got a's chunk (x at {:#x}, y at {:#x}) after waiting only on {waits:?}",
        x.addr(),
        y.addr()
    );
    pools.check().unwrap();
}

/// Lanes whose pools keep blocks of 4 MiB and more in large chunks of
/// their own, the first lane's with an 8 MiB chunk of the shared class.
fn rig_with_classes() -> Rig {
    let mut r = rig(1 << 30);
    let config = PoolConfig::new()
        .growth(Growth::Fraction { divisor: 8, granule: MIB })
        .large_threshold(4 * MIB)
        .initial_size(8 * MIB);
    r.pools = PerStreamPool::new(PoolMaker::with_config(r.up.clone(), config).unwrap());
    r
}

#[test]
fn a_chunk_moves_only_to_a_request_that_its_class_serves() {
    let mut r = rig_with_classes();
    let (a, b) = (r.a.clone(), r.b.clone());
    let x = r.alloc(1000, &a);
    let small = r.alloc(256, &b);
    r.free(x, &a);
    // a's 8 MiB chunk is wholly free, but of the shared class: a large
    // block cannot be carved from it, so it stays (and goes back upstream
    // before b grows a large chunk).
    let big = r.alloc(4 * MIB, &b);
    assert_eq!(r.pools.stats().chunks_moved, 0, "a chunk that could not serve the request moved");
    r.exact();
    // A large chunk of about the size asked moves.
    let y = r.alloc(5 * MIB, &a);
    r.free(y, &a);
    let z = r.alloc(5 * MIB, &b);
    assert_eq!((z.addr(), r.pools.stats().chunks_moved), (y.addr(), 1));
    // One far longer than the request does not: it would strand its tail.
    let w = r.alloc(32 * MIB, &a);
    r.free(w, &a);
    let v = r.alloc(4 * MIB, &b);
    assert_eq!(r.pools.stats().chunks_moved, 1, "a 32 MiB chunk moved for a 4 MiB block");
    assert!(v.addr() < w.addr() || v.addr() >= w.addr() + 32 * MIB);
    for blk in [small, big, z, v] {
        r.free(blk, &b);
    }
    r.exact();
}

/// An upstream outside its contract: every chunk at one address.
struct SameAddress {
    held: core::cell::Cell<u64>,
}

impl<S: Stream + ?Sized> crate::MemoryResource<S> for SameAddress {
    fn allocate(&self, request: Request, _: &S) -> Result<Block> {
        self.held.set(self.held.get() + request.size());
        Ok(Block::new(1 << 30, request.size(), 0))
    }
    fn deallocate(&self, block: Block, _: &S) -> Result<()> {
        self.held.set(self.held.get() - block.size());
        Ok(())
    }
}

/// Memory the upstream hands to a second stream's pool that the first's
/// holds is refused, whether the pool takes it when made (an initial size)
/// or when it grows: no block is handed out twice, the memory goes back
/// upstream, and the pools stay whole and usable. (Each pool checks only
/// its own chunks: two live blocks at one address, and a checker that
/// found chunks of two pools overlapping.)
#[test]
fn memory_the_upstream_hands_to_two_streams_pools_is_refused() {
    let (a, b) = (IdStream(1), IdStream(2));
    for initial in [0, 1 << 20] {
        let up = SameAddress { held: core::cell::Cell::new(0) };
        let config = PoolConfig::new().initial_size(initial);
        let mut pools = PerStreamPool::new(PoolMaker::with_config(&up, config).unwrap());
        let x = pools.allocate(Request::new(1000).unwrap(), &a).unwrap();
        let (held, used) = (up.held.get(), pools.usage().used);
        let y = pools.allocate(Request::new(1000).unwrap(), &b);
        assert!(matches!(y, Err(Error::UpstreamMisbehaved { addr: 0x4000_0000, .. })), "{initial}: {y:?}");
        assert_eq!(up.held.get(), held, "{initial}: the second chunk went back");
        pools.check().unwrap();
        assert_eq!(pools.usage().used, used);
        pools.deallocate(x, &a).unwrap();
        assert_eq!(pools.allocate(Request::new(1000).unwrap(), &a).map(|b| b.addr()), Ok(x.addr()));
        pools.check().unwrap();
    }
}

/// As [`SameAddress`], and refusing every block back.
struct SameAddressKept;

impl<S: Stream + ?Sized> crate::MemoryResource<S> for SameAddressKept {
    fn allocate(&self, request: Request, _: &S) -> Result<Block> {
        Ok(Block::new(1 << 30, request.size(), 0))
    }
    fn deallocate(&self, block: Block, _: &S) -> Result<()> {
        Err(Error::UnknownBlock { addr: block.addr() })
    }
}

/// Memory the upstream hands a second stream's pool over the first's, and
/// then refuses back, is never served: the second stream's next blocks
/// come from elsewhere, none overlapping the first's live block, and the
/// chunk counts as held. (Before, it stayed a free chunk of the second
/// pool, whose next allocation handed out the first's live block again.)
#[test]
fn memory_the_upstream_hands_two_streams_and_refuses_back_is_never_served() {
    let (a, b) = (IdStream(1), IdStream(2));
    let up = SameAddressKept;
    let mut pools = PerStreamPool::new(PoolMaker::with_config(&up, PoolConfig::new()).unwrap());
    let x = pools.allocate(Request::new(1000).unwrap(), &a).unwrap();
    let held = pools.usage().held;
    let y = pools.allocate(Request::new(1000).unwrap(), &b);
    assert!(matches!(y, Err(Error::UpstreamMisbehaved { addr: 0x4000_0000, .. })), "{y:?}");
    let usage = pools.usage();
    assert!(usage.held > held, "the refused chunk is held: {usage:?}");
    assert_eq!((usage.peak_held, usage.free), (usage.held, usage.held - usage.used));
    pools.check().unwrap();
    for _ in 0..2 {
        match pools.allocate(Request::new(1000).unwrap(), &b) {
            Ok(z) => assert!(z.addr() >= x.addr() + 1024 || z.addr() + 1024 <= x.addr(), "{z:?} over {x:?}"),
            Err(e) => assert!(matches!(e, Error::UpstreamMisbehaved { .. }), "{e:?}"),
        }
        pools.check().unwrap();
    }
    pools.deallocate(x, &a).unwrap();
    assert_eq!(pools.allocate(Request::new(1000).unwrap(), &a).map(|b| b.addr()), Ok(x.addr()));
    pools.check().unwrap();
}
