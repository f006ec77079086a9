//! The per-stream pools over simulated streams, with the happens-before
//! checker on every reuse: memory freed on one stream is never handed to
//! another that is not ordered after the free.

use memres_core::check::LiveBlocks;
use memres_core::per_stream::{PerStreamPool, PoolMaker};
use memres_core::pool::{CoalescingPool, Growth, PoolConfig};
use memres_core::stream_ordered::StreamOrdered;
use memres_core::testing::SplitMix64;
use memres_core::Inspect;
use memres_core::{Block, DynResource, Error, MemoryResource, Request, Shared, Stream};
use memres_sim::{builder, HbChecked, SimDevice, SimStream, SimWorld};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn req(n: u64) -> Request {
    Request::new(n).unwrap()
}

/// Pools that grow in 1 MiB steps.
fn config() -> PoolConfig {
    PoolConfig::new().growth(Growth::Fraction { divisor: 8, granule: MIB })
}

/// A simulated `cuMemAllocAsync`: memory freed on one stream is reused on
/// another only once ordered after the free (the device alone reuses it at
/// once, which would show as a violation that is the device's).
type Upstream = Arc<Shared<StreamOrdered<CoalescingPool<Arc<SimDevice>>, SimStream>>>;
type Layer = PerStreamPool<PoolMaker<Upstream>, SimStream>;

struct Rig {
    world: SimWorld,
    streams: Vec<SimStream>,
    upstream: Upstream,
    res: HbChecked<Shared<Layer>>,
}

fn rig(capacity: u64, streams: usize) -> Rig {
    let world = SimWorld::new();
    // Blocking and non-blocking streams, as PyTorch's are the latter.
    let streams =
        (0..streams).map(|i| if i % 2 == 0 { world.stream() } else { world.non_blocking_stream() }).collect();
    let device = Arc::new(SimDevice::new(capacity));
    let inner = CoalescingPool::with_config(device, config(), &()).unwrap();
    let upstream = Arc::new(Shared::new(StreamOrdered::new(inner)));
    let layer = PerStreamPool::new(PoolMaker::with_config(upstream.clone(), config()).unwrap());
    let res = HbChecked::new(Shared::new(layer)).panicking();
    Rig { world, streams, upstream, res }
}

impl Rig {
    fn layer<T>(&self, f: impl FnOnce(&mut Layer) -> T) -> T {
        self.res.inner().with(f)
    }

    /// The layer's invariants, and exact accounting from the caller down
    /// to the upstream.
    fn check(&self, live: &[(Block, usize)]) {
        let held = self.upstream.with(|u| u.usage().used);
        self.layer(|l| {
            l.check().unwrap();
            assert_eq!(l.usage().held, held, "the pools hold what the upstream lent");
            let used: u64 = live.iter().map(|(b, _)| b.size().div_ceil(256) * 256).sum();
            assert_eq!(l.usage().used, used, "the pools hand out what the caller holds");
        });
    }
}

#[test]
fn the_stream_agnostic_default_races_and_the_per_stream_pool_does_not() {
    // (stack, violations, whether b gets a's memory at a's address)
    for (stack, violations, moves) in [
        ("stats(pool(sim))", 1, true),
        ("stats(pool(sim, per_stream=true))", 0, true),
        // The virtual pools: one for all streams races too; one per stream
        // maps a reservation per stream, so b never gets a's addresses.
        ("stats(vpool(sim(1GiB), reserve=1GiB))", 1, true),
        ("stats(vpool(sim(1GiB), reserve=1GiB, per_stream=true))", 0, false),
    ] {
        let world = SimWorld::new();
        let (a, b) = (world.non_blocking_stream(), world.non_blocking_stream());
        let built: DynResource<SimStream> = builder().build(stack, &world.default_stream()).unwrap();
        let res = HbChecked::new(built);
        // b has used the resource before: it has a pool of its own, whose
        // 32 MiB chunk is too small for what follows.
        let warm = res.allocate(req(256), &b).unwrap();
        let x = res.allocate(req(40 * MIB), &a).unwrap();
        a.enqueue(); // a kernel on a, still running, writes x
        res.deallocate(x, &a).unwrap();
        // Reused on a at once, with nothing to wait for.
        let y = res.allocate(req(40 * MIB), &a).unwrap();
        assert_eq!(y.addr(), x.addr(), "{stack}");
        a.enqueue();
        res.deallocate(y, &a).unwrap();
        let z = res.allocate(req(40 * MIB), &b).unwrap();
        assert_eq!(res.violation_count(), violations, "{stack}: {:?}", res.violations());
        assert_eq!(z.addr() == x.addr(), moves, "{stack}");
        if violations == 0 && moves {
            // The memory did move to b, after b waited on a.
            assert_eq!(res.ordered_cross_stream_reuses(), 1);
        }
        res.deallocate(z, &b).unwrap();
        res.deallocate(warm, &b).unwrap();
    }
}

#[test]
fn a_free_on_another_stream_is_ordered_before_the_owner_reuses_it() {
    let rig = rig(1 << 30, 3);
    let (a, b, c) = (&rig.streams[0], &rig.streams[1], &rig.streams[2]);
    let x = rig.res.allocate(req(4096), a).unwrap();
    a.enqueue();
    // The caller orders b after a's use, then frees on b, which uses it too.
    b.wait(&a.record().unwrap()).unwrap();
    b.enqueue();
    rig.res.deallocate(x, b).unwrap();
    // c cannot have it: c has no pool and a's is not settled.
    let z = rig.res.allocate(req(4096), c).unwrap();
    assert_ne!(z.addr(), x.addr());
    // a reuses it only after waiting on b.
    let y = rig.res.allocate(req(4096), a).unwrap();
    assert_eq!(y.addr(), x.addr());
    assert!(a.is_ordered_after(b.id(), b.position()));
    assert_eq!(rig.res.ordered_cross_stream_reuses(), 1);
    assert_eq!(rig.res.violation_count(), 0);
    rig.res.deallocate(y, a).unwrap();
    rig.res.deallocate(z, c).unwrap();
    rig.check(&[]);
}

#[test]
fn a_chunk_given_back_upstream_reaches_the_next_stream_ordered_after_its_frees() {
    let rig = rig(1 << 30, 3);
    let (a, b, c) = (&rig.streams[0], &rig.streams[1], &rig.streams[2]);
    let warm: Vec<Block> = [b, c].iter().map(|s| rig.res.allocate(req(256), s).unwrap()).collect();
    let x = rig.res.allocate(req(MIB), a).unwrap();
    a.enqueue();
    rig.res.deallocate(x, a).unwrap();
    // Too big for a's free chunk: b gives it back upstream (on b) and grows.
    let y = rig.res.allocate(req(4 * MIB), b).unwrap();
    assert_eq!(rig.layer(|l| l.stats().bytes_released), MIB);
    // The upstream hands the chunk to c's pool, ordered after b's free of
    // it: c is ordered after a's use only if b waited on a's fence.
    let z = rig.res.allocate(req(MIB), c).unwrap();
    assert_eq!(z.addr(), x.addr());
    assert_eq!(rig.res.violation_count(), 0);
    assert_eq!(rig.res.ordered_cross_stream_reuses(), 1);
    for (blk, s) in [(y, b), (z, c), (warm[0], b), (warm[1], c)] {
        rig.res.deallocate(blk, s).unwrap();
    }
    rig.check(&[]);
}

#[test]
fn out_of_memory_synchronizes_the_device_and_takes_every_free_chunk() {
    let rig = rig(4 * MIB, 2);
    let (a, b) = (&rig.streams[0], &rig.streams[1]);
    // a fills the device, frees it with its kernel pending: a lone stream
    // records no fence, so b cannot take the chunks without the last resort.
    let xs: Vec<Block> = (0..4).map(|_| rig.res.allocate(req(MIB), a).unwrap()).collect();
    a.enqueue();
    for x in xs {
        rig.res.deallocate(x, a).unwrap();
    }
    let y = rig.res.allocate(req(2 * MIB), b).unwrap();
    assert_eq!(rig.layer(|l| l.stats().last_resorts), 1);
    assert!(b.is_observed(a.id(), a.position()), "the device was synchronized");
    assert_eq!(rig.res.violation_count(), 0);
    rig.res.deallocate(y, b).unwrap();
    rig.check(&[]);
}

/// Random work on `streams` streams, the checker after every step; returns
/// the layer's statistics.
fn drive(rig: &Rig, seed: u64, steps: usize) -> memres_core::per_stream::Stats {
    let mut rng = SplitMix64::new(seed);
    let mut live = LiveBlocks::new();
    // (block, index of the stream it is used on)
    let mut blocks: Vec<(Block, usize)> = Vec::new();
    let mut stale: Vec<Block> = Vec::new();
    let n = rig.streams.len();
    for _ in 0..steps {
        let s = rng.below(n as u64) as usize;
        let stream = &rig.streams[s];
        match rng.below(100) {
            0..=44 if blocks.len() < 200 => {
                let size = match rng.below(16) {
                    0 => rng.below(2 * MIB),
                    1..=3 => rng.below(64 << 10),
                    _ => 256 * (1 + rng.below(16)),
                };
                let r = req(size);
                match rig.res.allocate(r, stream) {
                    Ok(b) if b.is_empty() => {}
                    Ok(b) => {
                        live.insert(b, r).unwrap();
                        stream.enqueue(); // a kernel uses it
                        blocks.push((b, s));
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
            85 | 86 if !stale.is_empty() || !blocks.is_empty() => {
                // A bad free: a stale block, or a live one with a wrong size.
                let (bad, double) = match blocks.get(rng.below(blocks.len() as u64 + 1) as usize) {
                    Some(&(b, _)) if stale.is_empty() || rng.below(2) == 0 => {
                        (Block::new(b.addr(), b.size() + 512, b.tag()), false)
                    }
                    _ => (stale[rng.below(stale.len() as u64) as usize], true),
                };
                let before = rig.layer(|l| (l.usage().held, l.usage().used, l.stats()));
                let err = rig.res.deallocate(bad, stream).unwrap_err();
                if double {
                    assert!(matches!(err, Error::DoubleFree { .. } | Error::UnknownBlock { .. }), "{err}");
                } else {
                    assert!(matches!(err, Error::SizeMismatch { .. }), "{err}");
                }
                assert_eq!(rig.layer(|l| (l.usage().held, l.usage().used, l.stats())), before);
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
                // A stream waits on another, as user code does.
                let other = &rig.streams[rng.below(n as u64) as usize];
                stream.wait(&other.record().unwrap()).unwrap();
            }
            _ => {}
        }
        rig.check(&blocks);
    }
    for (b, s) in blocks.drain(..) {
        live.remove(&b).unwrap();
        rig.res.deallocate(b, &rig.streams[s]).unwrap();
    }
    rig.check(&blocks);
    assert_eq!(rig.layer(|l| l.usage().used), 0);
    rig.layer(|l| l.stats())
}

#[test]
fn randomized_four_streams_checked_after_every_step() {
    // Room for the live blocks and little more: streams compete for chunks.
    let rig = rig(24 * MIB, 4);
    let stats = drive(&rig, 1, 60_000);
    assert_eq!(rig.res.violation_count(), 0);
    // Every path ran.
    assert!(stats.cross_frees > 0 && stats.chunks_moved > 0 && stats.bytes_released > 0, "{stats:?}");
    assert!(stats.last_resorts > 0 && stats.fences > 0, "{stats:?}");
    assert!(rig.res.ordered_cross_stream_reuses() > 0);
}

#[test]
fn randomized_with_room_to_spare() {
    let rig = rig(1 << 30, 3);
    let stats = drive(&rig, 2, 30_000);
    assert_eq!(rig.res.violation_count(), 0);
    assert!(stats.cross_frees > 0 && stats.chunks_moved > 0, "{stats:?}");
}
