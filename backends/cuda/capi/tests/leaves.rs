//! The CUDA leaves in a `StackBuilder`: built on a GPU, refused with the
//! driver's error at the leaf's position without one.

use memres::leaves::{register_cuda, Counted, UpstreamCounter};
use memres_core::stack::StackErrorKind;
use memres_core::{MemoryResource, Request};
use memres_cuda::{CudaAsyncMemory, CudaStream, Device};
use memres_host::StackBuilder;
use std::sync::Arc;

#[test]
fn every_leaf_builds_serves_and_counts() {
    let Some(device) = (match Device::count() {
        Ok(n) if n > 0 => Some(Device::get(0).unwrap()),
        _ => None,
    }) else {
        let required = std::env::var("MEMRES_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0");
        assert!(!required, "no GPU and MEMRES_REQUIRE_GPU is set");
        // Without a device there is nothing to register the leaves for;
        // the driver's refusal is what `memres_alloc` reports (see alloc.rs).
        assert!(Device::get(0).is_err());
        eprintln!("SKIPPED every_leaf_builds_serves_and_counts: no GPU; nothing was tested");
        return;
    };
    let counter = Arc::new(UpstreamCounter::default());
    let mut b = StackBuilder::<CudaStream>::new();
    register_cuda(&mut b, device, counter.clone());
    let names: Vec<&str> = b.names().collect();
    for n in ["async", "cuda", "managed", "pool", "stats", "log"] {
        assert!(names.contains(&n), "{names:?}");
    }
    let stream = CudaStream::new(device).unwrap();
    for text in
        ["async(initial=1MiB, release_threshold=0)", "cuda", "managed", "pool(cuda)", "stats(pool(async))"]
    {
        let built = b.build_with_handles(text, &stream).unwrap_or_else(|e| panic!("{text}: {e}"));
        let before = counter.current();
        let blk = built.resource.allocate(Request::new(3000).unwrap(), &stream).unwrap();
        assert!(counter.current() > before, "{text}: counted");
        built.resource.deallocate(blk, &stream).unwrap();
        memres_core::Stream::synchronize(&stream).unwrap();
        if !text.starts_with("pool") && !text.starts_with("stats") {
            assert_eq!(counter.current(), before, "{text}: uncounted");
        }
    }
    let built = b.build_with_handles("pool(async(initial=2MiB))", &stream).unwrap();
    let leaf = built.get::<Counted<CudaAsyncMemory>>("async").expect("typed handle");
    assert!(leaf.inner().reserved_bytes().unwrap() >= 2 << 20);

    let e = b.build("pool(async(bogus=1))", &stream).err().unwrap();
    assert_eq!((e.pos, e.kind), (11, StackErrorKind::UnknownKey("bogus".into())));
}

#[test]
fn the_checking_builder_refuses_what_the_real_one_would() {
    let b = memres::leaves::checking_builder();
    let s = CudaStream::legacy();
    let e = b.build("pool(async(bogus=1))", &s).err().unwrap();
    assert_eq!((e.pos, e.kind), (11, StackErrorKind::UnknownKey("bogus".into())));
    let e = b.build("stats(managed(1))", &s).err().unwrap();
    assert_eq!((e.pos, e.kind), (14, StackErrorKind::ExtraArg));
    let e = b.build("limit(cuda)", &s).err().unwrap();
    assert_eq!(e.kind, StackErrorKind::MissingArg("the limit in bytes"));
    // Sizes the simulated stand-in could never hold are still accepted:
    // only the device knows its memory.
    assert!(b.build("pool(async(initial=64GiB), initial=60GiB, max=1TiB)", &s).is_ok());
}
