//! Virtual pools, one per stream, over simulated streams: memory freed on
//! one stream is neither handed to another stream nor unmapped before the
//! work that used it is done. The happens-before checker watches every
//! reuse of an address; `UnmapChecked` watches every unmap. (That one
//! virtual pool for all streams races, and one per stream does not, is in
//! `per_stream.rs`, beside the chunk pools.)

use memres_core::per_stream::{PerStreamPool, VirtualMaker};
use memres_core::testing::SplitMix64;
use memres_core::vpool::{VirtualConfig, VirtualPool};
use memres_core::{Block, Error, Inspect, MemoryResource, Range, Request, Shared, Stream};
use memres_sim::{HbChecked, SimAddressSpace, SimStream, SimWorld, UnmapChecked};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn req(n: u64) -> Request {
    Request::new(n).unwrap()
}

type Space = UnmapChecked<SimAddressSpace>;

fn checked_space(physical: u64) -> Arc<Space> {
    Arc::new(UnmapChecked::new(SimAddressSpace::new(physical, 2 * MIB).unwrap()))
}

/// A kernel on `stream` that uses `block`.
fn kernel(space: &Space, block: Block, stream: &SimStream) {
    stream.enqueue();
    space.used(Range::new(block.addr(), block.size()).unwrap(), stream);
}

type Pools = Shared<PerStreamPool<VirtualMaker<Arc<Space>>, SimStream>>;

fn per_stream(space: &Arc<Space>, config: VirtualConfig) -> Pools {
    Shared::new(PerStreamPool::new(VirtualMaker::new(space.clone(), config).unwrap()))
}

#[test]
fn a_granule_freed_on_another_stream_is_unmapped_only_after_that_stream_s_work() {
    // Two granules of one stream's pool, at most one kept mapped when idle.
    let config = VirtualConfig::new(64 * MIB).release_threshold(2 * MIB);
    for per_stream_pools in [false, true] {
        let world = SimWorld::new();
        let (a, b) = (world.non_blocking_stream(), world.non_blocking_stream());
        let space = checked_space(1 << 30);
        let plain = Shared::new(VirtualPool::with_config(space.clone(), config).unwrap());
        let pools = per_stream(&space, config);
        let res: &dyn MemoryResource<SimStream> = if per_stream_pools { &pools } else { &plain };
        let y = res.allocate(req(2 * MIB), &a).unwrap();
        let x = res.allocate(req(2 * MIB), &a).unwrap();
        assert!(x.addr() > y.addr());
        kernel(&space, x, &a);
        kernel(&space, y, &a);
        // The caller orders b after a's use of x, uses x on b, frees it on b:
        // its granule turns idle and stays mapped (under the threshold).
        b.wait(&a.record().unwrap()).unwrap();
        kernel(&space, x, &b);
        res.deallocate(x, &b).unwrap();
        assert_eq!(space.inner().committed_bytes(), 4 * MIB);
        // y's free on a leaves two idle granules: x's, the higher, is
        // unmapped, ordered on a. Only a pool that made a wait on b first is
        // right.
        res.deallocate(y, &a).unwrap();
        assert_eq!(space.inner().committed_bytes(), 2 * MIB);
        assert_eq!(space.early_unmaps(), usize::from(!per_stream_pools), "per stream: {per_stream_pools}");
        if per_stream_pools {
            assert!(a.is_ordered_after(b.id(), b.position()));
            assert_eq!(pools.with(|p| p.stats().cross_frees), 1);
            pools.with(|p| p.check()).unwrap();
        }
    }
}

#[test]
fn out_of_memory_on_one_stream_unmaps_the_idle_granules_of_the_others() {
    let world = SimWorld::new();
    let (a, b) = (world.non_blocking_stream(), world.non_blocking_stream());
    // 8 MiB of physical memory; idle granules stay mapped up to the slack.
    let space = checked_space(8 * MIB);
    let pools =
        per_stream(&space, VirtualConfig::new(64 * MIB).release_threshold(u64::MAX).slack_permille(1000));
    let xs: Vec<Block> = (0..4).map(|_| pools.allocate(req(2 * MIB), &a).unwrap()).collect();
    for &x in &xs {
        kernel(&space, x, &a);
        pools.deallocate(x, &a).unwrap();
    }
    assert_eq!(space.inner().committed_bytes(), 8 * MIB, "a keeps its idle granules");
    // b maps nothing until a's idle granules are unmapped, after the device
    // is synchronized.
    let y = pools.allocate(req(4 * MIB), &b).unwrap();
    assert_eq!(pools.with(|p| p.stats().last_resorts), 1);
    assert!(b.is_observed(a.id(), a.position()), "the device was synchronized");
    assert_eq!(space.early_unmaps(), 0);
    // Too much for the device even then: out of memory, nothing changed.
    let before = pools.with(|p| p.usage());
    let err = pools.allocate(req(8 * MIB), &b).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert_eq!(pools.with(|p| (p.usage().used, p.usage().held)), (before.used, before.held));
    pools.deallocate(y, &b).unwrap();
    pools.with(|p| p.check()).unwrap();
}

#[test]
fn randomized_three_streams_never_reuse_or_unmap_too_early() {
    for seed in 0..6 {
        let world = SimWorld::new();
        let streams: Vec<SimStream> =
            (0..3).map(|i| if i == 0 { world.stream() } else { world.non_blocking_stream() }).collect();
        // A small device, so that streams run out and take each other's memory.
        let space = checked_space(96 * MIB);
        let threshold = [0, 4 * MIB, u64::MAX][seed as usize % 3];
        let config = VirtualConfig::new(256 * MIB).release_threshold(threshold).slack_permille(40);
        let res = HbChecked::new(per_stream(&space, config)).panicking();
        let mut rng = SplitMix64::new(seed);
        // (block, the stream that used it last)
        let mut live: Vec<(Block, usize)> = Vec::new();
        for _ in 0..3000 {
            let s = rng.below(3) as usize;
            let stream = &streams[s];
            match rng.below(100) {
                0..=44 => {
                    let size = match rng.below(4) {
                        0 => 256 + rng.below(64 << 10),
                        1 => 1 + rng.below(2 * MIB),
                        _ => MIB + rng.below(12 * MIB),
                    };
                    match res.allocate(req(size), stream) {
                        Ok(b) => {
                            kernel(&space, b, stream);
                            live.push((b, s));
                        }
                        Err(e) => {
                            assert!(e.is_out_of_memory(), "{e}");
                            // Out of memory only when it is: every idle
                            // granule went back (the device synchronized),
                            // and the granules the block needs do not fit
                            // beside the busy ones, or its stream's
                            // reservation has no room for it.
                            res.inner().with(|p| {
                                let room = p.pool_of(stream.id()).map_or(u64::MAX, |v| v.usage().largest_free);
                                let busy = space.inner().committed_bytes();
                                let need = size.div_ceil(2 * MIB) * 2 * MIB + 2 * MIB;
                                assert!(
                                    busy + need > 96 * MIB || room < size + 256,
                                    "seed {seed}: out of memory with {busy} bytes mapped and {room} free for {size}"
                                );
                                assert_eq!(p.usage().held, busy);
                            });
                        }
                    }
                }
                45..=84 if !live.is_empty() => {
                    let (b, used_on) = live.swap_remove(rng.below(live.len() as u64) as usize);
                    // Mostly freed where used; sometimes on another stream,
                    // which the caller first orders after the use.
                    let on = if rng.below(4) == 0 { s } else { used_on };
                    if on != used_on {
                        streams[on].wait(&streams[used_on].record().unwrap()).unwrap();
                        kernel(&space, b, &streams[on]);
                    }
                    res.deallocate(b, &streams[on]).unwrap();
                }
                85..=92 => world.advance(),
                93 => stream.synchronize().unwrap(),
                _ => {
                    let ev = stream.record().unwrap();
                    world.complete(&ev).unwrap();
                }
            }
            res.inner().with(|p| {
                p.check().unwrap();
                let used: u64 = live.iter().map(|(b, _)| b.size().div_ceil(256) * 256).sum();
                assert_eq!(p.usage().used, used, "seed {seed}: the pools hand out what the caller holds");
                assert_eq!(
                    p.usage().held,
                    space.inner().committed_bytes(),
                    "seed {seed}: held is what is mapped"
                );
            });
        }
        assert_eq!(space.early_unmaps(), 0, "seed {seed}");
        for (b, s) in live.drain(..) {
            res.deallocate(b, &streams[s]).unwrap();
        }
        res.inner().with(|p| p.check()).unwrap();
        let unknown = res.deallocate(Block::from_addr(1 << 50, 256), &streams[0]).unwrap_err();
        assert!(matches!(unknown, Error::UnknownBlock { .. }), "{unknown}");
    }
}
