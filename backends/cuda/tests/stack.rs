//! The CUDA leaves of the core's stack builder: built on a GPU, refused
//! with the driver's error at the leaf's position without one.

mod common;

use common::gpu;
use memres_core::adaptor::{Counted, Gauge};
use memres_core::stack::{StackBuilder, StackErrorKind};
use memres_core::Inspect;
use memres_core::{MemoryResource, Request};
use memres_cuda::stack::{register, VmmPool, VmmPools};
use memres_cuda::{CudaAsyncMemory, CudaStream};
use std::sync::Arc;

#[test]
fn every_leaf_builds_serves_and_counts() {
    // Without a device there is nothing to register the leaves for; the
    // driver's refusal is what the C library's `memres_alloc` reports.
    let Some(device) = gpu("every_leaf_builds_serves_and_counts") else { return };
    let counter = Arc::new(Gauge::default());
    let mut b = StackBuilder::<CudaStream>::new();
    register(&mut b, device, counter.clone());
    let names: Vec<&str> = b.names().collect();
    for n in ["async", "cuda", "managed", "pinned", "vmm", "pool", "stats", "log"] {
        assert!(names.contains(&n), "{names:?}");
    }
    let stream = CudaStream::new(device).unwrap();
    for text in [
        "async(initial=1MiB, release_threshold=0)",
        "cuda",
        "managed",
        "pinned",
        "vmm(reserve=1GiB, release_threshold=0)",
        "pool(cuda)",
        "stats(pool(async))",
        "stats(vmm)",
    ] {
        let built = b.build_with_handles(text, &stream).unwrap_or_else(|e| panic!("{text}: {e}"));
        let before = counter.value();
        let blk = built.resource.allocate(Request::new(3000).unwrap(), &stream).unwrap();
        assert!(counter.value() > before, "{text}: counted");
        built.resource.deallocate(blk, &stream).unwrap();
        memres_core::Stream::synchronize(&stream).unwrap();
        if !text.starts_with("pool") && !text.starts_with("stats") {
            // (`vmm` with release_threshold=0 unmaps the granule of the block at once.)
            assert_eq!(counter.value(), before, "{text}: uncounted");
        }
    }
    let built = b.build_with_handles("pool(async(initial=2MiB))", &stream).unwrap();
    let leaf = built.get::<Counted<CudaAsyncMemory>>("async").expect("typed handle");
    assert!(leaf.inner().reserved_bytes().unwrap() >= 2 << 20);

    let e = b.build("pool(async(bogus=1))", &stream).err().unwrap();
    assert_eq!((e.pos, e.kind), (11, StackErrorKind::UnknownKey("bogus".into())));
}

/// `vmm` counts what it maps: the counter is the space's mapped bytes after
/// every call, retained granules of a partly freed handle included.
#[test]
fn vmm_counts_its_mapped_bytes() {
    let Some(device) = gpu("vmm_counts_its_mapped_bytes") else { return };
    let counter = Arc::new(Gauge::default());
    let mut b = StackBuilder::<CudaStream>::new();
    register(&mut b, device, counter.clone());
    let stream = CudaStream::new(device).unwrap();
    let built =
        b.build_with_handles("vmm(reserve=4GiB, release_threshold=0, handle_granules=4)", &stream).unwrap();
    let pool = built.get::<VmmPool>("vmm").expect("typed handle");
    let mapped = || pool.with(|p| p.space().inner().mapped_bytes());
    let granule = pool.with(|p| p.granule());
    assert_eq!(pool.with(|p| p.reserved_bytes()), 4 << 30);
    assert_eq!(counter.value(), 0);
    // Three granules in one handle, then a block of its own after them.
    let a = built.resource.allocate(Request::new(3 * granule).unwrap(), &stream).unwrap();
    let c = built.resource.allocate(Request::new(granule).unwrap(), &stream).unwrap();
    assert_eq!((counter.value(), mapped()), (4 * granule, 4 * granule));
    // Freeing `a` decommits its granules, but the handle stays mapped for `c`.
    built.resource.deallocate(a, &stream).unwrap();
    assert_eq!(pool.with(|p| p.usage().held), granule);
    assert_eq!(counter.value(), mapped());
    built.resource.deallocate(c, &stream).unwrap();
    assert_eq!((counter.value(), mapped(), counter.peak()), (0, 0, 4 * granule));
    assert_eq!(counter.peak(), pool.with(|p| p.space().inner().peak_mapped_bytes()));

    let e = b.build("vmm(handle_granules=0)", &stream).err().unwrap();
    assert_eq!(e.pos, 20);
    drop(built);
    assert_eq!(counter.value(), 0);
}

/// `vmm(per_stream=true)`: each stream maps a reservation of its own, a
/// block freed on another stream goes back to its own stream's pool, which
/// reuses it once it waited; the counter is the mapped bytes of all.
#[test]
fn vmm_per_stream_maps_a_reservation_per_stream() {
    let Some(device) = gpu("vmm_per_stream_maps_a_reservation_per_stream") else { return };
    let counter = Arc::new(Gauge::default());
    let mut b = StackBuilder::<CudaStream>::new();
    register(&mut b, device, counter.clone());
    let (s1, s2) = (CudaStream::new(device).unwrap(), CudaStream::new(device).unwrap());
    let built = b.build_with_handles("vmm(reserve=4GiB, per_stream=true, handle_granules=1)", &s1).unwrap();
    let pools = built.get::<VmmPools>("vmm").expect("typed handle");
    let r = &built.resource;
    let x = r.allocate(Request::new(3 << 20).unwrap(), &s1).unwrap();
    let y = r.allocate(Request::new(3 << 20).unwrap(), &s2).unwrap();
    let (id1, id2) = (memres_core::Stream::id(&s1), memres_core::Stream::id(&s2));
    pools.with(|p| {
        assert_eq!(p.stream_count(), 2);
        assert!(p.pool_of(id1).unwrap().holds(x.addr()) && !p.pool_of(id1).unwrap().holds(y.addr()));
        assert!(p.pool_of(id2).unwrap().holds(y.addr()));
        assert_eq!(p.usage().held, 8 << 20, "two granules each");
        assert_eq!(counter.value(), p.maker().space().inner().mapped_bytes());
    });
    // x freed on s2: back in s1's pool, reused on s1 after s1 waits on s2.
    r.deallocate(x, &s2).unwrap();
    let z = r.allocate(Request::new(3 << 20).unwrap(), &s1).unwrap();
    assert_eq!(z.addr(), x.addr());
    assert_eq!(pools.with(|p| p.stats().cross_frees), 1);
    for (blk, s) in [(z, &s1), (y, &s2)] {
        r.deallocate(blk, s).unwrap();
    }
    pools.with(|p| memres_core::Inspect::check(p)).unwrap();
    memres_core::Stream::synchronize(&s1).unwrap();
    memres_core::Stream::synchronize(&s2).unwrap();
    assert_eq!(counter.value(), 8 << 20, "idle granules stay mapped (release_threshold= all)");
    drop((pools, built));
    assert_eq!(counter.value(), 0, "every granule unmapped when the pools go");
}

/// `DriverPools` counts each driver pool under the stacks' `async` leaves
/// once, and forgets those of a stack that is gone.
#[test]
fn driver_pools_count_each_pool_once_and_only_of_live_stacks() {
    let Some(device) = gpu("driver_pools_count_each_pool_once_and_only_of_live_stacks") else { return };
    let mut b = StackBuilder::<CudaStream>::new();
    register(&mut b, device, Arc::new(Gauge::default()));
    let stream = CudaStream::new(device).unwrap();
    let (a, c) = (32 << 20, 64 << 20);
    let one = b.build_with_handles(&format!("async(initial={a}, release_threshold={a})"), &stream).unwrap();
    let two = b.build_with_handles(&format!("async(initial={c}, release_threshold={c})"), &stream).unwrap();
    let mut pools = memres_cuda::stack::DriverPools::default();
    pools.note(&one);
    pools.note(&two);
    // Noting a stack again adds no pool twice to the figures.
    pools.note(&two);
    let (now, peak) = pools.reserved();
    assert!(now >= a + c && now < a + c + (64 << 20), "{now}");
    assert!(peak >= now);
    drop(two);
    let (now, _) = pools.reserved();
    assert!(now >= a && now < c, "{now}");
    drop(one);
    assert_eq!(pools.reserved(), (0, 0));
}
