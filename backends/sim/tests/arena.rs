//! The arena over simulated streams, with the happens-before checker on
//! every reuse: superblocks move between streams' arenas only ordered after
//! every free in them.

use memres_core::arena::{ArenaConfig, ArenaResource};
use memres_core::{Block, Error, Inspect, MemoryResource, Request};
use memres_sim::{HbChecked, SimDevice, SimWorld};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

type Arena = HbChecked<ArenaResource<Arc<SimDevice>>>;

fn arena(config: ArenaConfig) -> Arena {
    let device = Arc::new(SimDevice::new(1 << 40));
    HbChecked::new(ArenaResource::with_config(device, config, &()).unwrap())
}

fn req(n: u64) -> Request {
    Request::new(n).unwrap()
}

/// The case (#17): stream a's arena holds every superblock the
/// maximum allows, all freed on a while a kernel of a may still use them.
/// Stream b used to get out of memory; as RMM's arena, it now takes them
/// after a device synchronization, with no happens-before violation. With
/// everything live, out of memory comes with its figures.
#[test]
fn another_streams_free_superblocks_serve_after_a_device_synchronization() {
    let world = SimWorld::new();
    let (a, b) = (world.non_blocking_stream(), world.non_blocking_stream());
    let config = ArenaConfig::new()
        .superblock_size(MIB)
        .chunk_size(MIB)
        .large_threshold(256 << 10)
        .maximum_size(2 * MIB);
    let res = arena(config);
    let blocks: Vec<Block> = (0..8).map(|_| res.allocate(req(200 << 10), &a).unwrap()).collect();
    a.enqueue(); // a kernel on a, still running, uses them
    for x in &blocks {
        res.deallocate(*x, &a).unwrap();
    }
    let mut mine = vec![res.allocate(req(200 << 10), &b).unwrap()];
    assert_eq!(res.violation_count(), 0, "{:?}", res.violations());
    assert_eq!(res.ordered_cross_stream_reuses(), 1, "b reuses memory a freed");
    assert!(blocks.iter().any(|x| x.addr() == mine[0].addr()));
    // Both superblocks full on b: nothing free anywhere to take back.
    for _ in 0..7 {
        mine.push(res.allocate(req(200 << 10), &b).unwrap());
    }
    let err = res.allocate(req(200 << 10), &b).unwrap_err();
    let want = Error::OutOfMemory {
        requested: 200 << 10,
        largest_free: 128 << 10,
        pool_size: 2 * MIB,
        max_size: Some(2 * MIB),
    };
    assert_eq!(err, want);
    assert_eq!(res.violation_count(), 0, "{:?}", res.violations());
    for x in mine {
        res.deallocate(x, &b).unwrap();
    }
    res.inner().check().unwrap();
    assert_eq!(res.inner().usage().used, 0);
}

/// Streams that come and go, never released (the case: only
/// `max_arenas` distinct streams could ever use one arena): 1000 streams,
/// each allocating, using and freeing in turn, 64 slots. All are served,
/// with no happens-before violation, and the memory held stays within a
/// superblock per slot (and the newest chunk's tail).
#[test]
fn a_thousand_streams_in_turn_with_no_release() {
    let world = SimWorld::new();
    let res = arena(ArenaConfig::new().max_arenas(64));
    for n in 0..1000 {
        let s = world.non_blocking_stream();
        let x = res.allocate(req(1000), &s).unwrap_or_else(|e| panic!("stream {n}: {e}"));
        s.enqueue();
        res.deallocate(x, &s).unwrap();
        assert!(res.inner().arena_count() <= 64);
    }
    assert_eq!(res.violation_count(), 0, "{:?}", res.violations().first());
    assert!(res.ordered_cross_stream_reuses() > 0, "memory moved between streams");
    res.inner().check().unwrap();
    let peak = res.inner().usage().peak_held;
    assert!(peak <= 65 * (8 * MIB) * 9 / 8, "{peak}");
}
