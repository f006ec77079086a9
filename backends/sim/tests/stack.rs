//! Stacks of the core's names over this crate's leaves: every documented
//! stack builds and serves, every error names its position.

use memres_core::adaptor::{Aligned, Counter, Limiting, Logging, Statistics, Tracking};
use memres_core::arena::ArenaResource;
use memres_core::binning::BinningResource;
use memres_core::check::LiveBlocks;
use memres_core::pool::CoalescingPool;
use memres_core::stack::{OnStream, StackBuilder, StackError, StackErrorKind};
use memres_core::testing::{IdStream, SplitMix64};
use memres_core::trace::read_all;
use memres_core::vpool::VirtualPool;
use memres_core::Inspect;
use memres_core::{Block, DynResource, Error, MemoryResource, Request, Shared, StreamOrdered};
use memres_sim::{builder, HostMemory, SimAddressSpace, SimDevice};
use std::sync::Arc;

fn req(size: u64) -> Request {
    Request::new(size).unwrap()
}

fn build(text: &str) -> Result<DynResource, StackError> {
    builder::<()>().build(text, &())
}

fn build_err(text: &str) -> StackError {
    build(text).err().unwrap_or_else(|| panic!("{text} built"))
}

fn exercise(r: &DynResource) {
    let blocks: Vec<Block> = (0..100).map(|i| r.allocate(req(1000 * i), &()).unwrap()).collect();
    for b in blocks {
        r.deallocate(b, &()).unwrap();
    }
}

#[test]
fn builds_the_documented_stacks() {
    for text in [
        "sim",
        "sim(1GiB)",
        "sim(capacity=1G)",
        "stats(pool(sim, initial=1GiB, max=4GiB))",
        "limit(stats(pool(sim)), 2GiB)",
        "limit(pool(sim, growth=double), bytes=2GiB)",
        "track(align(pool(sim, growth=4), alignment=64KiB, threshold=1MiB))",
        "pool(sim, growth=default)",
    ] {
        let r = build(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        exercise(&r);
    }
}

#[test]
fn limit_and_pool_maximum_apply() {
    let r = build("limit(pool(sim(1GiB), max=8MiB), 4MiB)").unwrap();
    let a = r.allocate(req(3 << 20), &()).unwrap();
    assert!(
        matches!(r.allocate(req(2 << 20), &()), Err(Error::LimitExceeded { limit, .. }) if limit == 4 << 20)
    );
    r.deallocate(a, &()).unwrap();
    let r = build("pool(sim(1GiB), max=8MiB)").unwrap();
    assert!(matches!(r.allocate(req(9 << 20), &()), Err(Error::OutOfMemory { .. })));
    let r = build("align(sim, alignment=1MiB)").unwrap();
    let b = r.allocate(req(10), &()).unwrap();
    assert_eq!(b.addr() % (1 << 20), 0);
    r.deallocate(b, &()).unwrap();
}

#[test]
fn log_stack_writes_the_file() {
    let path = std::env::temp_dir().join(format!("memres-stack-test-{}.csv", std::process::id()));
    {
        let r = build(&format!("log(pool(sim), file={})", path.display())).unwrap();
        let b = r.allocate(req(4096), &()).unwrap();
        r.deallocate(b, &()).unwrap();
    }
    let rows = read_all(std::io::BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!((rows[0].size, rows[1].pointer), (4096, rows[0].pointer));
}

#[test]
fn errors_name_the_position() {
    let cases: &[(&str, usize, StackErrorKind)] = &[
        ("log(pool(gpu), file=/tmp/x.csv)", 9, StackErrorKind::UnknownName("gpu".into())),
        ("stats(pool(sim, initial=1QiB))", 24, StackErrorKind::BadSize("1QiB".into())),
        ("stats(pool(sim, colour=red))", 16, StackErrorKind::UnknownKey("colour".into())),
        ("stats(sim, sim)", 11, StackErrorKind::ExtraArg),
        ("stats()", 0, StackErrorKind::MissingArg("an upstream resource")),
        ("limit(sim)", 0, StackErrorKind::MissingArg("the limit in bytes")),
        ("limit(sim, 1G, bytes=2G)", 21, StackErrorKind::DuplicateKey("bytes".into())),
        ("limit(2G, sim)", 6, StackErrorKind::WrongKind("a resource")),
        (
            "pool(sim, growth=0)",
            17,
            StackErrorKind::BadValue("growth `0`: double, default or a divisor from 1 to 4294967295".into()),
        ),
        (
            "pool(sim, initial=1000)",
            18,
            StackErrorKind::Resource(Error::InvalidConfig {
                what: "initial pool size is not a multiple of 256",
            }),
        ),
        (
            "pool(sim(1MiB), initial=1GiB)",
            0,
            StackErrorKind::Resource(Error::OutOfMemory {
                requested: 1 << 30,
                largest_free: 1 << 20,
                pool_size: 1 << 20,
                max_size: Some(1 << 20),
            }),
        ),
        (
            "align(sim, alignment=3K)",
            21,
            StackErrorKind::Resource(Error::InvalidAlignment { align: 3 << 10 }),
        ),
        ("log(sim)", 0, StackErrorKind::MissingArg("file=")),
        ("stats(pool(sim)", 15, StackErrorKind::Expected("`,` or `)`")),
        ("pool(sim, initial=)", 18, StackErrorKind::Expected("a value after `=`")),
        (
            "track(sim, backtraces=maybe)",
            22,
            StackErrorKind::BadValue("backtraces `maybe`: true or false".into()),
        ),
        ("track(sim, report_leaks=)", 24, StackErrorKind::Expected("a value after `=`")),
        (
            "track(sim, report_leaks=no)",
            24,
            StackErrorKind::BadValue("report_leaks `no`: true or false".into()),
        ),
        ("pool(sim, initial= , max=1G)", 19, StackErrorKind::Expected("a value after `=`")),
        (
            "pool(sim, growth=4294967296)",
            17,
            StackErrorKind::BadValue(
                "growth `4294967296`: double, default or a divisor from 1 to 4294967295".into(),
            ),
        ),
        (
            "binning(sim, min_bin=1MiB, max_bin=4KiB)",
            21,
            StackErrorKind::BadValue("min_bin 1048576 above max_bin 4096".into()),
        ),
    ];
    for (text, pos, kind) in cases {
        let e = build_err(text);
        assert_eq!((e.pos, &e.kind), (*pos, kind), "{text}: {e}");
    }
    let e = build_err("log(sim, file=/nonexistent-dir/x/y.csv)");
    assert_eq!(e.pos, 14);
    assert!(matches!(&e.kind, StackErrorKind::Io(m) if m.contains("/nonexistent-dir/x/y.csv")), "{e}");
    assert_eq!(build_err("stats(slab(sim))").to_string(), "at byte 6: unknown resource `slab`");
    assert_eq!(
        build_err("stream(pool(sim))").to_string(),
        "at byte 0: unknown resource `stream` (a builder has it once `register_stream_layer` added it)"
    );
}

/// The simulated device's space is 64 TiB: a capacity above it is refused
/// at the value, not taken (its figures said the device held what its
/// space never could).
#[test]
fn a_sim_capacity_its_space_cannot_hold_is_refused() {
    assert_eq!(SimDevice::MAX_CAPACITY, 1 << 46);
    let b = builder::<()>();
    let built = b.build("sim(64TiB)", &()).unwrap();
    let block = built.allocate(req(1 << 45), &()).unwrap();
    built.deallocate(block, &()).unwrap();
    let too_big = |value: &str| {
        StackErrorKind::BadValue(format!(
            "capacity `{value}`: the simulated device's space holds at most 64 TiB (70368744177664 bytes)"
        ))
    };
    for (text, pos, value) in [
        ("sim(18446744073709551615)", 4, "18446744073709551615"),
        ("pool(sim(capacity=70368744177920))", 18, "70368744177920"),
        ("vpool(sim(65TiB))", 10, "65TiB"),
    ] {
        let e = build_err(text);
        assert_eq!((e.pos, &e.kind), (pos, &too_big(value)), "{text}: {e}");
    }
}

#[test]
fn a_vpools_sim_takes_its_capacity_as_a_sim_does() {
    // `sim(capacity=1GiB)` builds, but under `vpool` the key was unknown.
    let call = memres_core::stack::parse("vpool(sim(capacity=1GiB))").unwrap();
    let pool = memres_sim::vpool(&call).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(pool.space().physical_bytes(), 1 << 30);
    let e = build_err("vpool(sim(1GiB, capacity=2GiB))");
    assert_eq!((e.pos, e.kind), (25, StackErrorKind::DuplicateKey("capacity".into())));
    let e = build_err("vpool(sim(capacity=65TiB))");
    assert!(matches!(e.kind, StackErrorKind::BadValue(_)), "{e}");
}

#[test]
fn registry_takes_new_names_and_works_for_other_streams() {
    // Any stream type other than the simulated one.
    let s = IdStream(3);
    let mut b = builder::<IdStream>();
    assert_eq!(
        b.names().collect::<Vec<_>>(),
        [
            "align", "arena", "binning", "fixed", "host", "limit", "log", "planned", "pool", "sim", "stats",
            "track", "vpool"
        ]
    );
    // A resource that refuses everything, registered with one call.
    b.register("refuse", |call, _| {
        call.expect_args(0, &[])?;
        Ok(Arc::new(Limiting::new(SimDevice::new(0), 0)))
    });
    let r = b.build("stats(refuse)", &s).unwrap();
    assert!(r.allocate(req(1), &s).is_err());
    let r = b.build("pool(sim, initial=1MiB)", &s).unwrap();
    let x = r.allocate(req(1), &s).unwrap();
    r.deallocate(x, &s).unwrap();
    assert_eq!(b.build("refuse(sim)", &s).err().unwrap().kind, StackErrorKind::ExtraArg);
    assert!(StackBuilder::<()>::empty().build("sim", &()).is_err());
    assert!(StackBuilder::<()>::new().build("sim", &()).is_err(), "the core knows no device");
}

/// Every adaptor stacked over a pool over the simulated device, 10^5 random
/// operations: after every step the statistics agree exactly with the
/// caller's view, the tracking table with the live blocks, the limit's count
/// with the pool's bytes in use, and the pool's checker passes; the log
/// replays to the same operations.
#[test]
fn all_adaptors_stacked_randomized() {
    const LIMIT: u64 = 256 << 20;
    let pool = Shared::new(CoalescingPool::new(SimDevice::new(1 << 30)));
    let aligned = Aligned::new(&pool, 64 << 10, 1 << 20).unwrap();
    let limited = Limiting::new(&aligned, LIMIT);
    let stats = Statistics::new(&limited);
    let tracked = Tracking::new(&stats);
    let log = Logging::new(&tracked, Vec::new()).unwrap();
    let mut rng = SplitMix64::new(42);
    let mut live = LiveBlocks::new();
    let mut blocks: Vec<Block> = Vec::new();
    let (mut peak, mut total, mut ops) = (0u64, 0u64, 0usize);
    for step in 0..100_000 {
        if blocks.is_empty() || rng.below(100) < 52 {
            let size = match rng.below(4) {
                0 => rng.below(512),
                1 => rng.below(64 << 10),
                2 => rng.below(2 << 20),
                _ => rng.below(16 << 20),
            };
            let r = req(size);
            ops += 1;
            match log.allocate(r, &()) {
                Ok(b) => {
                    let want = if size >= 1 << 20 { Request::aligned(size, 64 << 10).unwrap() } else { r };
                    live.insert(b, want).unwrap_or_else(|v| panic!("step {step}: {v}"));
                    if !b.is_empty() {
                        blocks.push(b);
                        total += size;
                    }
                }
                Err(Error::LimitExceeded { .. }) => {}
                Err(e) => panic!("step {step}: {e}"),
            }
        } else {
            let b = blocks.swap_remove(rng.below(blocks.len() as u64) as usize);
            log.deallocate(b, &()).unwrap();
            live.remove(&b).unwrap();
            ops += 1;
        }
        peak = peak.max(live.bytes());
        assert_eq!(
            stats.get_bytes_counter(),
            Counter { value: live.bytes() as i64, peak: peak as i64, total: total as i64 }
        );
        assert_eq!(tracked.get_outstanding_allocations().count(), live.len());
        assert_eq!(limited.get_allocated_bytes(), pool.with(|p| p.usage().used));
        pool.with(|p| p.check()).unwrap_or_else(|v| panic!("step {step}: {v}"));
    }
    assert_eq!(tracked.get_allocated_bytes(), live.bytes());
    for b in blocks.drain(..) {
        log.deallocate(b, &()).unwrap();
        ops += 1;
    }
    assert!(tracked.get_outstanding_allocations().is_empty());
    assert_eq!(pool.with(|p| p.usage().held), pool.with(|p| p.upstream().usage().held));
    let rows = read_all(&log.into_parts().1[..]).unwrap();
    assert_eq!(rows.len(), ops);
}

#[test]
fn pool_granule_and_release_apply() {
    type Pool = Shared<CoalescingPool<DynResource>>;
    let grow = |text: &str| {
        let built = builder::<()>().build_with_handles(text, &()).unwrap();
        let r = &built.resource;
        let pool = built.get::<Pool>("pool").unwrap();
        // A small block, then one too large for the first chunk: the
        // first block's chunk is wholly free when the pool grows.
        let a = r.allocate(req(1000), &()).unwrap();
        let first = pool.with(|p| p.usage().held);
        r.deallocate(a, &()).unwrap();
        let b = r.allocate(req(first + 1), &()).unwrap();
        let sizes = (first, pool.with(|p| (p.usage().held, p.chunk_count())));
        r.deallocate(b, &()).unwrap();
        sizes
    };
    // The default granule is 32 MiB.
    assert_eq!(grow("pool(sim)").0, 32 << 20);
    assert_eq!(grow("pool(sim, growth=4)").0, 32 << 20);
    // 1 MiB granules; the free first chunk goes back before the pool grows,
    // unless release=false.
    assert_eq!(grow("pool(sim, granule=1MiB)"), (1 << 20, (2 << 20, 1)));
    assert_eq!(grow("pool(sim, granule=1MiB, release=true)"), (1 << 20, (2 << 20, 1)));
    assert_eq!(grow("pool(sim, granule=1MiB, release=false)"), (1 << 20, (3 << 20, 2)));
    for (text, pos, what) in [
        ("pool(sim, granule=3000)", 18, "granule 3000: a power of two of at least 256"),
        ("pool(sim, granule=128)", 18, "granule 128: a power of two of at least 256"),
        ("pool(sim, growth=double, granule=1MiB)", 33, "granule= sizes fractional growth, not growth=double"),
        ("pool(sim, release=no)", 18, "release `no`: true, false or peak"),
    ] {
        let e = build_err(text);
        assert_eq!((e.pos, e.kind), (pos, StackErrorKind::BadValue(what.into())), "{text}");
    }
}

#[test]
fn builds_the_new_resources() {
    for text in [
        "host",
        "fixed(sim, 1MiB)",
        "fixed(pool(sim), size=64KiB, blocks=16)",
        "binning(sim)",
        "binning(pool(sim), min_bin=1KiB, max_bin=1MiB)",
        "arena(sim)",
        "arena(sim, initial=64MiB, superblock=1MiB)",
        "vpool(sim)",
        "vpool(sim(8GiB), reserve=1GiB, release_threshold=16MiB, granule=64KiB)",
        "pool(vpool(sim))",
        "stats(binning(pool(sim)))",
    ] {
        let built = builder::<()>().build_with_handles(text, &()).unwrap_or_else(|e| panic!("{text}: {e}"));
        if text.starts_with("fixed") {
            // Fixed blocks serve up to their size only.
            let b = built.resource.allocate(req(1000), &()).unwrap();
            built.resource.deallocate(b, &()).unwrap();
            assert!(matches!(built.resource.allocate(req(2 << 20), &()), Err(Error::InvalidSize { .. })));
        } else {
            exercise(&built.resource);
        }
    }
}

#[test]
fn new_resources_keep_typed_handles_and_route_as_configured() {
    let built =
        builder::<()>().build_with_handles("binning(sim(1GiB), min_bin=1KiB, max_bin=4KiB)", &()).unwrap();
    let bins = built.get::<BinningResource<'static, DynResource, ()>>("binning").unwrap();
    assert_eq!(bins.bin_sizes(), &[1024, 2048, 4096]);
    let sim = built.get::<SimDevice>("sim").unwrap();
    let big = built.resource.allocate(req(1 << 20), &()).unwrap();
    assert_eq!(sim.usage().held, 1 << 20); // above the bins: straight upstream
    built.resource.deallocate(big, &()).unwrap();

    let built =
        builder::<()>().build_with_handles("vpool(sim, reserve=1GiB, release_threshold=0)", &()).unwrap();
    let v = built.get::<Shared<VirtualPool<SimAddressSpace>>>("vpool").unwrap();
    let b = built.resource.allocate(req(3 << 20), &()).unwrap();
    assert_eq!(v.with(|v| (v.reserved_bytes(), v.usage().held)), (1 << 30, 4 << 20));
    built.resource.deallocate(b, &()).unwrap();

    let built = builder::<()>().build_with_handles("arena(host)", &()).unwrap();
    let b = built.resource.allocate(req(5000), &()).unwrap();
    assert!(built.get::<HostMemory>("host").unwrap().usage().held >= 5000);
    assert!(built.get::<ArenaResource<DynResource>>("arena").unwrap().usage().used >= 5000);
    built.resource.deallocate(b, &()).unwrap();
}

/// RMM's `add_bin` in a string: `bin(SIZE)` a fixed-size bin over the
/// upstream, `bin(SIZE, RESOURCE)` one served by the resource, replacing
/// the power of two of its size; powers of two only where asked for once
/// bins are given.
#[test]
fn bins_given_in_the_string_join_or_replace_the_powers_of_two() {
    let built = builder::<()>()
        .build_with_handles("binning(sim(1GiB), bin(1KiB, stats(sim(1GiB))), bin(768), bin(128MiB, sim(1GiB)), min_bin=1KiB, max_bin=2KiB)", &())
        .unwrap();
    let bins = built.get::<BinningResource<'static, DynResource, ()>>("binning").unwrap();
    assert_eq!(bins.bin_sizes(), &[768, 1024, 2048, 128 << 20]);
    assert!(bins.fixed_bin(1024).is_none(), "the given bin replaces the power of two");
    assert!(bins.fixed_bin(768).is_some() && bins.fixed_bin(2048).is_some());
    let stats = built.get::<memres_core::adaptor::Statistics<DynResource>>("stats").unwrap();
    let sims = built.all::<SimDevice>("sim");
    let (a, b, c) = (req(1000), req(100 << 20), req(700));
    let (x, y, z) = (
        built.resource.allocate(a, &()).unwrap(),
        built.resource.allocate(b, &()).unwrap(),
        built.resource.allocate(c, &()).unwrap(),
    );
    assert_eq!(stats.get_bytes_counter().value, 1000, "1000 bytes go to the 1 KiB bin's resource");
    assert_eq!(
        sims.iter().map(|s| s.usage().held).filter(|&h| h == 100 << 20).count(),
        1,
        "the 128 MiB bin's device"
    );
    let u = bins.usage();
    assert_eq!(u.used, 1024 + (100 << 20) + 768);
    for (block, _) in [(x, a), (y, b), (z, c)] {
        built.resource.deallocate(block, &()).unwrap();
    }
    assert_eq!(bins.usage().used, 0);
    bins.check().unwrap();

    // Bins given without min_bin= or max_bin=: those bins only.
    let built = builder::<()>().build_with_handles("binning(sim, bin(4KiB))", &()).unwrap();
    let bins = built.get::<BinningResource<'static, DynResource, ()>>("binning").unwrap();
    assert_eq!(bins.bin_sizes(), &[4096]);
    // And none given: the powers of two of 256 KiB to 4 MiB, as before.
    let built = builder::<()>().build_with_handles("binning(sim)", &()).unwrap();
    let bins = built.get::<BinningResource<'static, DynResource, ()>>("binning").unwrap();
    assert_eq!(bins.bin_sizes(), &[256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20]);
    // `powers=` says it outright: none (every size upstream, as RMM's
    // binning resource without exponents), or powers beside the bins.
    let sizes = |text: &str| {
        let built = builder::<()>().build_with_handles(text, &()).unwrap();
        built.get::<BinningResource<'static, DynResource, ()>>("binning").unwrap().bin_sizes().to_vec()
    };
    assert_eq!(sizes("binning(sim, powers=false)"), Vec::<u64>::new());
    assert_eq!(sizes("binning(sim, bin(768), powers=false)"), [768]);
    assert_eq!(sizes("binning(sim, bin(768), powers=true, max_bin=256KiB)"), [768, 256 << 10]);
    let built = builder::<()>().build_with_handles("binning(sim, powers=false)", &()).unwrap();
    let b = built.resource.allocate(req(3000), &()).unwrap();
    assert_eq!(built.get::<SimDevice>("sim").unwrap().usage().held, 3072, "the block alone, upstream");
    built.resource.deallocate(b, &()).unwrap();
    for (text, at) in [("binning(sim, powers=false, min_bin=1KiB)", 35), ("binning(sim, powers=no)", 20)] {
        let e = build_err(text);
        assert!(matches!(e.kind, StackErrorKind::BadValue(_)) && e.pos == at, "{text}: {e}");
    }
}

/// Each `sim` of one stack is a device of its own: no address of one is
/// another's, in a plain build and in one that builds its `sim`s with
/// another builder (as the replay tool's watched stacks do), so blocks of
/// two devices never overlap.
#[test]
fn each_sim_of_a_stack_has_addresses_of_its_own() {
    fn disjoint(spaces: &[memres_core::Range]) {
        for (i, a) in spaces.iter().enumerate() {
            for b in &spaces[i + 1..] {
                assert!(a.end() <= b.start() || b.end() <= a.start(), "{a:?} meets {b:?}");
            }
        }
    }
    fn sims(built: &memres_core::stack::Built<()>) -> Vec<memres_core::Range> {
        built.all::<SimDevice>("sim").iter().map(|s| s.addresses()).collect()
    }
    /// A block of each size at once: none overlaps another.
    fn serve_at_once(built: &memres_core::stack::Built<()>, sizes: &[u64]) {
        let mut live = LiveBlocks::default();
        let blocks: Vec<Block> = sizes
            .iter()
            .map(|&size| {
                let b = built.resource.allocate(req(size), &()).unwrap();
                live.insert(b, req(size)).unwrap();
                b
            })
            .collect();
        for b in blocks {
            built.resource.deallocate(b, &()).unwrap();
        }
    }
    let text =
        "track(binning(sim(1GiB), bin(1KiB, sim), bin(4KiB, pool(sim(64MiB))), min_bin=8KiB, max_bin=8KiB))";
    let built = builder::<()>().build_with_handles(text, &()).unwrap();
    // Before, the three devices handed out the same first address, and
    // blocks overlapped.
    serve_at_once(&built, &[1000, 4000, 8000, 100 << 10]);
    assert_eq!(sims(&built).len(), 3);
    disjoint(&sims(&built));

    // `sim` built by another builder, nested: still counted.
    let mut outer = StackBuilder::<()>::new();
    let leaves = builder::<()>();
    outer.register("sim", move |call, cx| {
        let leaf = cx.build_with(&leaves, call)?;
        Ok(cx.keep(call, Statistics::new(leaf)))
    });
    let built = outer.build_with_handles("binning(sim(1GiB), bin(1KiB, sim(1GiB)))", &()).unwrap();
    assert_eq!(sims(&built).len(), 2);
    disjoint(&sims(&built));

    // And every `vpool`, one per stream or not, beside the `sim`s.
    let text =
        "binning(vpool(sim), bin(1KiB, vpool(sim, per_stream=true)), bin(4KiB, vpool(sim)), bin(8KiB, sim))";
    let built = builder::<()>().build_with_handles(text, &()).unwrap();
    serve_at_once(&built, &[1000, 4000, 8000, 3 << 20]);
    let mut spaces: Vec<_> = built
        .all::<Shared<VirtualPool<SimAddressSpace>>>("vpool")
        .iter()
        .map(|p| p.with(|p| p.space().addresses()))
        .collect();
    spaces.extend(sims(&built));
    assert_eq!(spaces.len(), 3, "two typed pools, one device");
    disjoint(&spaces);
}

/// PyTorch's memory viewer reads a snapshot's addresses as JavaScript
/// numbers, exact below 2^53; one of 2^63 or more (a stack's second `vpool`
/// had its addresses from 2^63) it could not load at all. Every simulated
/// device and space with addresses of their own lies below 2^53, none
/// meeting another.
#[test]
fn every_simulated_address_lies_below_2_53_for_pytorchs_viewer() {
    const LIMIT: u64 = 1 << 53;
    let mut ranges = Vec::new();
    for nth in 0..memres_sim::SIM_DEVICES {
        ranges.push(memres_sim::nth_sim_device(SimDevice::MAX_CAPACITY, nth).unwrap().addresses());
    }
    for nth in 0..memres_sim::VPOOL_SPACES {
        let mut b = StackBuilder::<()>::new();
        b.register("vpool", move |call, cx| memres_sim::keep_vpool(call, cx, nth));
        let built = b.build_with_handles("vpool(sim)", &()).unwrap();
        let pool = built.get::<Shared<VirtualPool<SimAddressSpace>>>("vpool").unwrap();
        ranges.push(pool.with(|p| p.space().addresses()));
    }
    for (i, a) in ranges.iter().enumerate() {
        assert!(a.end() <= LIMIT, "{a:?} runs past 2^53");
        assert!(
            ranges[i + 1..].iter().all(|b| a.end() <= b.start() || b.end() <= a.start()),
            "{a:?} meets another"
        );
    }
    assert_eq!(memres_sim::ADDRESSES_END, LIMIT);

    // Several `vpool`s alive at once in one stack, each serving a block.
    let text = "binning(vpool(sim), bin(1KiB, vpool(sim)), bin(4KiB, vpool(sim)), bin(8KiB, sim))";
    let built = build(text).unwrap();
    let blocks: Vec<Block> =
        [1000, 4000, 8000, 3 << 20].map(|size| built.allocate(req(size), &()).unwrap()).into();
    for b in blocks {
        assert!(b.addr() + b.size() <= LIMIT, "{b:?} runs past 2^53");
        built.deallocate(b, &()).unwrap();
    }
}

#[test]
fn new_resources_reject_bad_arguments_where_they_are() {
    for (text, pos) in [
        ("binning(sim, min_bin=x)", 21),
        ("binning(sim, min_bin=4MiB, max_bin=256KiB)", 21),
        ("fixed(sim, size=lots)", 16),
        ("fixed(sim, 1MiB, size=1MiB)", 22),
        ("vpool(pool(sim))", 6),
        ("vpool(sim, granule=3000)", 19),
        ("host(1GiB)", 5),
        ("binning(sim, pool(sim))", 13),
        ("binning(sim, bin(1000))", 17),
        ("binning(sim, bin(0))", 17),
        ("binning(sim, bin(1KiB), bin(1KiB, sim))", 28),
        ("binning(sim, bin(1KiB, sim, sim))", 28),
        ("binning(sim, bin(size=1KiB))", 17),
        ("binning(sim, bin())", 13),
        ("binning(sim, bin(1KiB, 1KiB))", 23),
        ("binning(sim, bin(1KiB), x=1)", 24),
        ("binning(sim, bin(1KiB), min_bin=3000)", 32),
    ] {
        let e = build_err(text);
        assert_eq!(e.pos, pos, "{text}: {e}");
    }
}

#[test]
fn a_virtual_pool_per_stream_is_refused_when_built_with_a_reservation_no_pool_could_take() {
    // Each stream's pool is made at its first allocation: its configuration
    // is checked when the stack is built, at the reservation's value.
    for text in [
        "vpool(sim, per_stream=true, reserve=0)",
        "vpool(sim, granule=256, reserve=1TiB, per_stream=true)",
        "vpool(sim, reserve=0)",
    ] {
        let e = build_err(text);
        assert!(matches!(e.kind, StackErrorKind::Resource(Error::InvalidConfig { .. })), "{text}: {e}");
        assert_eq!(e.pos, text.find("reserve=").unwrap() + "reserve=".len(), "{text}: {e}");
    }
}

#[test]
fn the_stream_layer_orders_reuse_across_streams() {
    use memres_sim::SimWorld;
    let world = SimWorld::new();
    let (a, b) = (world.stream(), world.stream());
    let mut builder = builder();
    assert!(builder.build("stream(pool(sim))", &world.default_stream()).is_err());
    builder.register_stream_layer();
    let built = builder.build_with_handles("stream(pool(sim))", &world.default_stream()).unwrap();
    let x = built.resource.allocate(req(1 << 20), &a).unwrap();
    built.resource.deallocate(x, &a).unwrap();
    // Freed on `a`: `a` takes it back at once.
    let y = built.resource.allocate(req(1 << 20), &a).unwrap();
    assert_eq!(x.addr(), y.addr());
    built.resource.deallocate(y, &a).unwrap();
    let z = built.resource.allocate(req(1 << 20), &b).unwrap();
    built.resource.deallocate(z, &b).unwrap();
    let so = built
        .get::<Shared<StreamOrdered<OnStream<memres_sim::SimStream>, memres_sim::SimStream>>>("stream")
        .unwrap();
    assert!(so.with(|s| s.stats().own_hits) >= 1);
}

#[test]
fn per_stream_pools_take_the_pool_options_and_refuse_a_maximum() {
    use memres_core::per_stream::{PerStreamPool, PoolMaker};
    use memres_sim::{SimStream, SimWorld};
    type Pools = Shared<PerStreamPool<PoolMaker<DynResource<SimStream>>, SimStream>>;
    let world = SimWorld::new();
    let (a, b) = (world.stream(), world.stream());
    let text = "pool(sim, per_stream=true, initial=64MiB, granule=1MiB, growth=4)";
    let built = builder().build_with_handles(text, &world.default_stream()).unwrap();
    let pools = built.get::<Pools>("pool").unwrap();
    // The initial size is the build stream's pool.
    assert_eq!(pools.with(|p| (p.stream_count(), p.usage().held)), (1, 64 << 20));
    assert!(pools.with(|p| p.pool_of(0).is_some()));
    let x = built.resource.allocate(req(1000), &a).unwrap();
    let y = built.resource.allocate(req(1000), &b).unwrap();
    // One pool per stream, each growing by the granule given.
    assert_eq!(pools.with(|p| (p.stream_count(), p.usage().held)), (3, (64 << 20) + (2 << 20)));
    built.resource.deallocate(x, &a).unwrap();
    built.resource.deallocate(y, &b).unwrap();
    pools.with(|p| p.check()).unwrap();
    // Without the key, or false: the pool that ignores streams.
    for text in ["pool(sim)", "pool(sim, per_stream=false)"] {
        let built = builder::<SimStream>().build_with_handles(text, &world.default_stream()).unwrap();
        assert!(built.get::<Shared<CoalescingPool<DynResource<SimStream>>>>("pool").is_some(), "{text}");
    }
    for (text, pos, what) in [
        (
            "pool(sim, per_stream=true, max=1GiB)",
            31,
            "max= bounds one pool, and per_stream=true makes one per stream: limit the upstream instead, \
             as in pool(limit(async, 4GiB), per_stream=true)",
        ),
        ("pool(sim, per_stream=yes)", 21, "per_stream `yes`: true or false"),
    ] {
        let e = build_err(text);
        assert_eq!((e.pos, e.kind), (pos, StackErrorKind::BadValue(what.into())), "{text}");
    }
    let e = build_err("pool(sim, per_stream=true, initial=100)");
    assert_eq!(
        (e.pos, e.kind),
        (
            35,
            StackErrorKind::Resource(Error::InvalidConfig {
                what: "initial pool size is not a multiple of 256"
            })
        )
    );
    // The limit goes on the upstream.
    assert!(build("pool(limit(sim, 1GiB), per_stream=true)").is_ok());
}

/// `track(..., report_leaks=false)` dropped with a block outstanding says
/// nothing, as RMM's tracking adaptor; by default the report goes to
/// standard error. The drops run in a child (this binary again, the test
/// alone), whose standard error is read.
#[test]
fn a_tracking_layer_reports_leaks_unless_told_not_to() {
    const CHILD: &str = "MEMRES_SIM_LEAK_REPORT_CHILD";
    const NAME: &str = "a_tracking_layer_reports_leaks_unless_told_not_to";
    if std::env::var_os(CHILD).is_some() {
        for text in ["track(sim, report_leaks=false)", "track(sim)"] {
            let r = build(text).unwrap();
            let _leaked = r.allocate(req(256), &()).unwrap();
            drop(r);
            eprintln!("<{text} dropped>");
        }
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (quiet, rest) = stderr.split_once("<track(sim, report_leaks=false) dropped>").expect(&stderr);
    let (default, _) = rest.split_once("<track(sim) dropped>").expect(&stderr);
    let report = "memres: tracking adaptor dropped with 1 outstanding allocation(s), 256 bytes";
    assert!(!quiet.contains("tracking adaptor"), "{stderr}");
    assert!(default.contains(report), "{stderr}");
}
