//! The stream-ordered layer over a pool over the simulated device, with the
//! happens-before checker on every reuse.

use memres_core::check::LiveBlocks;
use memres_core::pool::{CoalescingPool, PoolConfig};
use memres_core::stream_ordered::{CrossStream, StreamOrdered};
use memres_core::testing::SplitMix64;
use memres_core::Inspect;
use memres_core::{Block, Error, MemoryResource, MemoryResourceMut, Request, Shared, Stream};
use memres_sim::{HbChecked, SimDevice, SimStream, SimWorld};
use std::sync::Arc;

type Layer = StreamOrdered<CoalescingPool<Arc<SimDevice>>, SimStream>;
type Checked = HbChecked<Shared<Layer>>;

fn req(n: u64) -> Request {
    Request::new(n).unwrap()
}

struct Rig {
    world: SimWorld,
    streams: Vec<SimStream>,
    device: Arc<SimDevice>,
    res: Checked,
}

fn rig(capacity: u64, streams: usize, cross: CrossStream, panicking: bool) -> Rig {
    let world = SimWorld::new();
    let streams = (0..streams).map(|_| world.stream()).collect();
    let device = Arc::new(SimDevice::new(capacity));
    let pool = CoalescingPool::new(device.clone());
    let checked = HbChecked::new(Shared::new(StreamOrdered::new(pool).with_cross_stream(cross)));
    let res = if panicking { checked.panicking() } else { checked };
    Rig { world, streams, device, res }
}

impl Rig {
    fn layer<T>(&self, f: impl FnOnce(&mut Layer) -> T) -> T {
        self.res.inner().with(f)
    }

    /// The layer's and the pool's invariants, and exact accounting from the
    /// caller down to the device.
    fn check(&self, live: &LiveBlocks) {
        self.layer(|l| {
            l.check().unwrap();
            let pool = l.inner();
            assert_eq!(l.usage().used + l.listed_bytes(), pool.usage().used);
            assert_eq!(pool.usage().held, self.device.usage().held);
            assert_eq!(l.live_count(), live.len());
        });
    }
}

/// One random workload step driver, shared by the correct and the broken
/// layer. Returns the number of allocations that succeeded (each block is
/// freed again).
fn drive(rig: &Rig, seed: u64, steps: usize) -> usize {
    let mut rng = SplitMix64::new(seed);
    let mut live = LiveBlocks::new();
    // (block, stream index of its last use)
    let mut blocks: Vec<(Block, usize)> = Vec::new();
    // Blocks freed already: freeing one again must fail and change nothing.
    let mut stale: Vec<Block> = Vec::new();
    let n = rig.streams.len();
    let mut allocated = 0;
    for _ in 0..steps {
        let s = rng.below(n as u64) as usize;
        let stream = &rig.streams[s];
        match rng.below(100) {
            0..=44 if blocks.len() < 200 => {
                let size = match rng.below(16) {
                    0 => rng.below(1 << 20),
                    1..=3 => rng.below(64 << 10),
                    _ => 256 * (1 + rng.below(16)),
                };
                let r = req(size);
                match rig.res.allocate(r, stream) {
                    Ok(b) => {
                        live.insert(b, r).unwrap();
                        // The block is used by a kernel on its stream.
                        stream.enqueue();
                        blocks.push((b, s));
                        allocated += 1;
                    }
                    Err(e) => assert!(e.is_out_of_memory(), "{e}"),
                }
            }
            0..=84 if !blocks.is_empty() => {
                let (b, used_on) = blocks.swap_remove(rng.below(blocks.len() as u64) as usize);
                // Mostly freed where used; sometimes on another stream, which
                // the caller first orders after the use (as CUDA requires).
                let on = if rng.below(8) == 0 { s } else { used_on };
                if on != used_on {
                    let ev = rig.streams[used_on].record().unwrap();
                    rig.streams[on].wait(&ev).unwrap();
                }
                live.remove(&b).unwrap();
                rig.res.deallocate(b, &rig.streams[on]).unwrap();
                if stale.len() < 16 {
                    stale.push(b);
                } else {
                    stale[rng.below(16) as usize] = b;
                }
            }
            85 if !stale.is_empty() => {
                let b = stale[rng.below(stale.len() as u64) as usize];
                let before = rig.layer(|l| (l.live_count(), l.usage().used, l.listed_bytes()));
                let err = rig.res.deallocate(b, stream).unwrap_err();
                assert!(matches!(err, Error::DoubleFree { .. } | Error::UnknownBlock { .. }), "{err}");
                assert_eq!(rig.layer(|l| (l.live_count(), l.usage().used, l.listed_bytes())), before);
            }
            85..=89 => {
                stream.enqueue();
            }
            90..=92 => rig.world.advance(),
            93 => stream.synchronize().unwrap(),
            94..=95 => {
                let ev = stream.record().unwrap();
                rig.world.complete(&ev).unwrap();
            }
            96..=97 => {
                rig.layer(|l| l.reclaim()).unwrap();
            }
            98 => {
                // A stream waits on another, as user code does.
                let other = &rig.streams[rng.below(n as u64) as usize];
                stream.wait(&other.record().unwrap()).unwrap();
            }
            _ => {}
        }
        rig.check(&live);
    }
    for (b, s) in blocks.drain(..) {
        live.remove(&b).unwrap();
        rig.res.deallocate(b, &rig.streams[s]).unwrap();
    }
    rig.check(&live);
    allocated
}

#[test]
fn randomized_four_streams_checked_after_every_step() {
    let rig = rig(8 << 20, 4, CrossStream::Wait, true);
    // Out of memory is the exception: 100 000 steps allocate some 42 000 blocks.
    let allocated = drive(&rig, 1, 100_000);
    assert!(allocated > 30_000, "{allocated} allocations succeeded");
    assert_eq!(rig.res.violation_count(), 0);
    let stats = rig.layer(|l| l.stats());
    // Every path of the layer ran.
    assert!(stats.own_hits > 0 && stats.steals > 0 && stats.inner_allocations > 0, "{stats:?}");
    assert!(stats.reclaimed > 0 && stats.last_resorts > 0, "{stats:?}");
    assert!(rig.res.ordered_cross_stream_reuses() > 0);
    // Every listed block goes back to the pool, and the pool to the device.
    rig.layer(|l| l.synchronize_and_merge()).unwrap();
    assert_eq!(rig.layer(|l| (l.listed_bytes(), l.inner().usage().used)), (0, 0));
    let Rig { device, res, .. } = rig;
    drop(res);
    assert_eq!(device.usage().held, 0, "the pool dropped gives every chunk back");
}

#[test]
fn checker_catches_the_layer_that_skips_the_wait() {
    let broken = rig(24 << 20, 4, CrossStream::Unordered, false);
    drive(&broken, 2, 20_000);
    let violations = broken.res.violations();
    assert!(!violations.is_empty());
    for v in &violations {
        assert_ne!(v.free_stream, v.reuse_stream);
        assert!(v.freed.start() < v.reuse.addr() + v.reuse.size() && v.reuse.addr() < v.freed.end());
    }
    // The correct layer passes the same workload.
    let correct = rig(24 << 20, 4, CrossStream::Wait, false);
    drive(&correct, 2, 20_000);
    assert_eq!(correct.res.violation_count(), 0);
    assert!(correct.res.ordered_cross_stream_reuses() > 0);
}

#[test]
fn skipped_wait_is_reported_with_both_streams_and_the_block() {
    let rig = rig(1 << 20, 2, CrossStream::Unordered, false);
    let (a, b) = (&rig.streams[0], &rig.streams[1]);
    let x = rig.res.allocate(req(4096), a).unwrap();
    a.enqueue();
    rig.res.deallocate(x, a).unwrap();
    let y = rig.res.allocate(req(4096), b).unwrap();
    assert_eq!(y.addr(), x.addr());
    let v = rig.res.violations();
    assert_eq!(v.len(), 1);
    assert_eq!((v[0].free_stream, v[0].reuse_stream), (a.id(), b.id()));
    assert_eq!((v[0].freed.start(), v[0].reuse), (x.addr(), y));
}

#[test]
#[should_panic(expected = "happens-before violation")]
fn panicking_checker_panics_at_the_first_violation() {
    let rig = rig(1 << 20, 2, CrossStream::Unordered, true);
    let (a, b) = (&rig.streams[0], &rig.streams[1]);
    let x = rig.res.allocate(req(4096), a).unwrap();
    rig.res.deallocate(x, a).unwrap();
    let _ = rig.res.allocate(req(4096), b);
}

#[test]
fn free_on_another_stream_than_the_allocation_is_ordered_correctly() {
    let rig = rig(1 << 20, 3, CrossStream::Wait, true);
    let (a, b, c) = (&rig.streams[0], &rig.streams[1], &rig.streams[2]);
    let x = rig.res.allocate(req(4096), a).unwrap();
    a.enqueue();
    b.wait(&a.record().unwrap()).unwrap();
    rig.res.deallocate(x, b).unwrap();
    // Reused on b at once, no wait needed.
    let y = rig.res.allocate(req(4096), b).unwrap();
    assert_eq!(y.addr(), x.addr());
    b.enqueue();
    rig.res.deallocate(y, b).unwrap();
    // Taken by c: c must wait on b (the freeing stream), which the layer does.
    let z = rig.res.allocate(req(4096), c).unwrap();
    assert_eq!(z.addr(), x.addr());
    assert!(c.is_ordered_after(b.id(), b.position()));
    assert_eq!(rig.res.ordered_cross_stream_reuses(), 1);
    rig.res.deallocate(z, c).unwrap();
    rig.check(&LiveBlocks::new());
}

#[test]
fn free_of_another_resources_block_is_an_error_and_changes_nothing() {
    let rig = rig(1 << 20, 2, CrossStream::Wait, true);
    let other = rig_other();
    let a = &rig.streams[0];
    let mine = rig.res.allocate(req(1024), a).unwrap();
    let mut live = LiveBlocks::new();
    live.insert(mine, req(1024)).unwrap();
    let before = rig.layer(|l| (l.live_count(), l.usage().used, l.listed_bytes(), l.inner().usage().used));
    for foreign in other {
        let err = rig.res.deallocate(foreign, a).unwrap_err();
        assert!(matches!(err, Error::UnknownBlock { .. }), "{err}");
        assert_eq!(
            rig.layer(|l| (l.live_count(), l.usage().used, l.listed_bytes(), l.inner().usage().used)),
            before
        );
        rig.check(&live);
    }
    rig.res.deallocate(mine, a).unwrap();
}

/// Blocks of another layer whose tags name slots that this layer's tests
/// also use, at addresses this layer never hands out.
fn rig_other() -> Vec<Block> {
    let other = rig(1 << 20, 1, CrossStream::Wait, true);
    let s = &other.streams[0];
    let pad = other.res.allocate(req(64 << 10), s).unwrap();
    let blocks = vec![other.res.allocate(req(1024), s).unwrap(), other.res.allocate(req(512), s).unwrap()];
    assert!(pad.tag() != blocks[0].tag());
    blocks
}

#[test]
fn device_failure_in_a_cross_stream_transfer_loses_nothing() {
    let rig = rig(64 << 20, 2, CrossStream::Wait, true);
    let (a, b) = (&rig.streams[0], &rig.streams[1]);
    let xs: Vec<_> = (0..8).map(|_| rig.res.allocate(req(64 << 10), a).unwrap()).collect();
    a.enqueue();
    for &x in &xs {
        rig.res.deallocate(x, a).unwrap();
    }
    let listed = rig.layer(|l| l.listed_bytes());
    assert_eq!(listed, 8 * (64 << 10));
    // b needs more than the pool's first chunk holds: the pool must grow,
    // and the device fails.
    let held = rig.device.usage().held;
    rig.device.fail_nth(1);
    let err = rig.res.allocate(req(held), b).unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    assert_eq!(rig.layer(|l| l.listed_bytes()), listed);
    rig.check(&LiveBlocks::new());
    // The listed blocks still serve b, ordered.
    let y = rig.res.allocate(req(64 << 10), b).unwrap();
    assert!(xs.iter().any(|x| x.addr() == y.addr()));
    rig.res.deallocate(y, b).unwrap();
    assert_eq!(rig.res.violation_count(), 0);
}

#[test]
fn stream_failure_in_a_cross_stream_transfer_loses_nothing() {
    let rig = rig(4 << 20, 2, CrossStream::Wait, true);
    let (a, b) = (&rig.streams[0], &rig.streams[1]);
    let x = rig.res.allocate(req(8192), a).unwrap();
    a.enqueue();
    rig.res.deallocate(x, a).unwrap();
    for n in [1, 2] {
        // n = 1: the record on a fails; n = 2: b's wait fails.
        rig.world.fail_nth(n);
        let err = rig.res.allocate(req(8192), b).unwrap_err();
        assert!(matches!(err, Error::Backend { .. }), "{err}");
        assert_eq!(rig.layer(|l| (l.listed_bytes(), l.live_count())), (8192, 0));
        rig.check(&LiveBlocks::new());
    }
    let y = rig.res.allocate(req(8192), b).unwrap();
    assert_eq!(y.addr(), x.addr());
    assert_eq!(rig.res.violation_count(), 0);
}

#[test]
fn out_of_memory_after_the_last_resort_keeps_exact_accounting() {
    // The device holds 1 MiB; stream a lists all of it in 64 KiB blocks.
    let rig = rig(1 << 20, 2, CrossStream::Wait, true);
    let (a, b) = (&rig.streams[0], &rig.streams[1]);
    let xs: Vec<_> = (0..16).map(|_| rig.res.allocate(req(64 << 10), a).unwrap()).collect();
    assert!(rig.res.allocate(req(64 << 10), a).unwrap_err().is_out_of_memory());
    a.enqueue();
    let keep = xs[0];
    for &x in &xs[1..] {
        rig.res.deallocate(x, a).unwrap();
    }
    // b asks for more than any listed block: the layer synchronizes a, merges
    // its list into the pool and retries, which cannot fit 1 MiB with one
    // block still live.
    let err = rig.res.allocate(req(1 << 20), b).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    let stats = rig.layer(|l| l.stats());
    assert_eq!(stats.last_resorts, 1);
    let mut live = LiveBlocks::new();
    live.insert(keep, req(64 << 10)).unwrap();
    rig.check(&live);
    assert_eq!(rig.layer(|l| (l.listed_bytes(), l.inner().usage().used)), (0, 64 << 10));
    // What fits does: the merged blocks coalesced in the pool.
    let big = rig.res.allocate(req(15 * (64 << 10)), b).unwrap();
    assert!(a.is_observed(a.id(), a.position()));
    rig.res.deallocate(big, b).unwrap();
    rig.res.deallocate(keep, a).unwrap();
    assert_eq!(rig.res.violation_count(), 0);
}

#[test]
fn pool_with_maximum_size_under_the_layer() {
    let world = SimWorld::new();
    let s = world.stream();
    let device = Arc::new(SimDevice::new(1 << 30));
    let config = PoolConfig::new().initial_size(1 << 20).maximum_size(1 << 20);
    let pool = CoalescingPool::with_config(device.clone(), config, &()).unwrap();
    let mut layer: Layer = StreamOrdered::new(pool);
    let x = layer.allocate(req(1 << 20), &s).unwrap();
    assert!(layer.allocate(req(256), &s).unwrap_err().is_out_of_memory());
    layer.deallocate(x, &s).unwrap();
    layer.check().unwrap();
    assert_eq!(device.usage().held, 1 << 20);
}

#[test]
fn shared_layer_two_threads_each_on_its_own_stream() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Checked>();
    let rig = rig(8 << 20, 2, CrossStream::Wait, true);
    std::thread::scope(|scope| {
        for (t, stream) in rig.streams.iter().enumerate() {
            let res = &rig.res;
            scope.spawn(move || {
                let mut rng = SplitMix64::new(100 + t as u64);
                let mut mine: Vec<Block> = Vec::new();
                for i in 0..20_000 {
                    if mine.is_empty() || (mine.len() < 64 && rng.below(2) == 0) {
                        match res.allocate(req(256 * (1 + rng.below(64))), stream) {
                            Ok(b) => {
                                stream.enqueue();
                                mine.push(b);
                            }
                            Err(e) => assert!(e.is_out_of_memory(), "{e}"),
                        }
                    } else {
                        let b = mine.swap_remove(rng.below(mine.len() as u64) as usize);
                        res.deallocate(b, stream).unwrap();
                    }
                    if i % 512 == 0 {
                        res.inner().with(|l| l.check()).unwrap();
                    }
                }
                for b in mine {
                    res.deallocate(b, stream).unwrap();
                }
            });
        }
    });
    assert_eq!(rig.res.violation_count(), 0);
    assert!(rig.layer(|l| l.stats().steals) > 0);
    rig.check(&LiveBlocks::new());
}

#[test]
fn legacy_default_stream_is_ordered_after_blocking_streams() {
    // Even the layer that skips the wait is safe when the taker is the
    // legacy default stream: its work waits for all blocking streams.
    let rig = rig(1 << 20, 2, CrossStream::Unordered, true);
    let a = &rig.streams[0];
    let default = rig.world.default_stream();
    let x = rig.res.allocate(req(4096), a).unwrap();
    a.enqueue();
    rig.res.deallocate(x, a).unwrap();
    let y = rig.res.allocate(req(4096), &default).unwrap();
    assert_eq!(y.addr(), x.addr());
    assert_eq!(rig.res.ordered_cross_stream_reuses(), 1);
    // And a blocking stream taking from the default stream is ordered too.
    default.enqueue();
    rig.res.deallocate(y, &default).unwrap();
    let z = rig.res.allocate(req(4096), a).unwrap();
    assert_eq!(z.addr(), x.addr());
    assert_eq!(rig.res.violation_count(), 0);
}

#[test]
fn non_blocking_streams_are_not_ordered_by_the_default_stream() {
    let world = SimWorld::new();
    let a = world.non_blocking_stream();
    let device = Arc::new(SimDevice::new(1 << 20));
    let layer: Layer =
        StreamOrdered::new(CoalescingPool::new(device)).with_cross_stream(CrossStream::Unordered);
    let res = HbChecked::new(Shared::new(layer));
    let default = world.default_stream();
    let x = res.allocate(req(4096), &a).unwrap();
    res.deallocate(x, &a).unwrap();
    let y = res.allocate(req(4096), &default).unwrap();
    assert_eq!(y.addr(), x.addr());
    assert_eq!(res.violation_count(), 1);
}
