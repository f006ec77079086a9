//! Bad input against every resource: each misuse gets its typed error (or
//! its documented behaviour), and afterwards the resource is still usable
//! with exact accounting and its invariant checker passes. The bad-input
//! table (`docs/bad-input.md`) names these tests.

use memres_core::adaptor::{Aligned, FailureCallback, Limiting, Logging, Statistics, Tracking};
use memres_core::arena::{ArenaConfig, ArenaResource};
use memres_core::binning::BinningResource;
use memres_core::fixed::{FixedConfig, FixedSizeResource};
use memres_core::per_stream::{PerStreamPool, PoolMaker};
use memres_core::pool::{CoalescingPool, PoolConfig};
use memres_core::stack::StackErrorKind;
use memres_core::stream_ordered::StreamOrdered;
use memres_core::vpool::{VirtualConfig, VirtualPool};
use memres_core::{Block, Error, Inspect, MemoryResource, Request, Shared};
use memres_sim::{HostMemory, SimAddressSpace, SimDevice, SimStream, SimWorld};
use std::sync::Arc;

/// A resource under test, with its figure of bytes in use and its checker.
struct Subject {
    name: &'static str,
    res: Box<dyn MemoryResource<SimStream>>,
    used: Box<dyn Fn() -> u64>,
    check: Box<dyn Fn() -> Result<(), String>>,
}

impl Subject {
    fn alloc(&self, size: u64, s: &SimStream) -> Result<Block, Error> {
        self.res.allocate(Request::new(size).unwrap(), s)
    }

    /// The resource is consistent, counts `used` bytes, serves a new block
    /// and takes it back to the same count.
    fn usable(&self, used: u64, s: &SimStream) {
        self.usable_with(used, 1000, s);
    }

    /// As [`usable`](Self::usable), with a new block of `size` bytes.
    fn usable_with(&self, used: u64, size: u64, s: &SimStream) {
        let name = self.name;
        (self.check)().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((self.used)(), used, "{name}: bytes in use changed");
        let b = self.alloc(size, s).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!((self.used)() > used, "{name}: a new block is counted");
        self.res.deallocate(b, s).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((self.used)(), used, "{name}: the new block's bytes came back");
        (self.check)().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

fn ok<E: std::fmt::Display>(r: Result<(), E>) -> Result<(), String> {
    r.map_err(|e| e.to_string())
}

/// One of each resource, over `dev` (and `space` for the virtual pool).
fn make_subjects(dev: &Arc<SimDevice>, space: &Arc<SimAddressSpace>, world: &SimWorld) -> Vec<Subject> {
    let mut v = Vec::new();
    {
        let d = dev.clone();
        v.push(Subject {
            name: "SimDevice",
            res: Box::new(dev.clone()),
            used: Box::new(move || d.usage().held),
            check: Box::new(|| Ok(())),
        });
    }
    {
        let host = Arc::new(HostMemory::new());
        let h = host.clone();
        v.push(Subject {
            name: "HostMemory",
            res: Box::new(host),
            used: Box::new(move || h.usage().held),
            check: Box::new(|| Ok(())),
        });
    }
    {
        let p = Arc::new(Shared::new(CoalescingPool::new(dev.clone())));
        let (p1, p2) = (p.clone(), p.clone());
        v.push(Subject {
            name: "CoalescingPool",
            res: Box::new(p),
            used: Box::new(move || p1.with(|p| p.usage().used)),
            check: Box::new(move || ok(p2.with(|p| p.check()))),
        });
    }
    {
        let config = FixedConfig::new(4096).blocks_per_chunk(16);
        let f = Arc::new(Shared::new(FixedSizeResource::try_new(dev.clone(), config).unwrap()));
        let (f1, f2) = (f.clone(), f.clone());
        v.push(Subject {
            name: "FixedSizeResource",
            res: Box::new(f),
            used: Box::new(move || f1.with(|f| f.usage().used)),
            check: Box::new(move || ok(f2.with(|f| f.check()))),
        });
    }
    {
        // Bins of 256 B to 4 KiB; larger requests straight to the device.
        // Its own view of the device: what went upstream, bins and large blocks.
        let up = Arc::new(Tracking::new(dev.clone()));
        let b = Arc::new(BinningResource::<_, SimStream>::with_exponents(up, 8, 12).unwrap());
        let (b1, b2) = (b.clone(), b.clone());
        v.push(Subject {
            name: "BinningResource",
            res: Box::new(b),
            used: Box::new(move || {
                let (mut used, mut held) = (0, 0);
                for &size in b1.bin_sizes() {
                    let bin = b1.fixed_bin(size).expect("fixed bins");
                    used += bin.with(|f| f.usage().used);
                    held += bin.with(|f| f.usage().held);
                }
                // What the bins do not hold went straight upstream.
                used + b1.upstream().get_allocated_bytes() - held
            }),
            check: Box::new(move || ok(b2.check())),
        });
    }
    {
        let config = ArenaConfig::new().superblock_size(1 << 20).chunk_size(4 << 20);
        let a = Arc::new(ArenaResource::with_config(dev.clone(), config, &world.default_stream()).unwrap());
        let (a1, a2) = (a.clone(), a.clone());
        v.push(Subject {
            name: "ArenaResource",
            res: Box::new(a),
            used: Box::new(move || a1.usage().used),
            check: Box::new(move || ok(a2.check())),
        });
    }
    {
        let so = Arc::new(Shared::new(StreamOrdered::<_, SimStream>::new(CoalescingPool::new(dev.clone()))));
        let (s1, s2) = (so.clone(), so.clone());
        v.push(Subject {
            name: "StreamOrdered",
            res: Box::new(so),
            used: Box::new(move || s1.with(|s| s.usage().used)),
            check: Box::new(move || ok(s2.with(|s| s.check()))),
        });
    }
    {
        let maker = PoolMaker::with_config(dev.clone(), PoolConfig::new()).unwrap();
        let ps = Arc::new(Shared::new(PerStreamPool::<_, SimStream>::new(maker)));
        let (p1, p2) = (ps.clone(), ps.clone());
        v.push(Subject {
            name: "PerStreamPool",
            res: Box::new(ps),
            used: Box::new(move || p1.with(|p| p.usage().used)),
            check: Box::new(move || ok(p2.with(|p| p.check()))),
        });
    }
    {
        let config = VirtualConfig::new(1 << 30).release_threshold(0).max_reservations(1);
        let p = Arc::new(Shared::new(VirtualPool::with_config(space.clone(), config).unwrap()));
        let (p1, p2) = (p.clone(), p.clone());
        v.push(Subject {
            name: "VirtualPool",
            res: Box::new(p),
            used: Box::new(move || p1.with(|p| p.usage().used)),
            check: Box::new(move || ok(p2.with(|p| p.check()))),
        });
    }
    {
        let t = Arc::new(Tracking::new(dev.clone()));
        let t1 = t.clone();
        v.push(Subject {
            name: "Tracking",
            res: Box::new(t),
            used: Box::new(move || t1.get_allocated_bytes()),
            check: Box::new(|| Ok(())),
        });
    }
    {
        let l = Arc::new(Limiting::new(dev.clone(), 1 << 30));
        let (l1, l2) = (l.clone(), l.clone());
        v.push(Subject {
            name: "Limiting",
            res: Box::new(l),
            used: Box::new(move || l1.get_allocated_bytes()),
            check: Box::new(move || ok(l2.check())),
        });
    }
    v
}

struct Setup {
    dev: Arc<SimDevice>,
    space: Arc<SimAddressSpace>,
    s1: SimStream,
    s2: SimStream,
    subjects: Vec<Subject>,
    /// A second set over the same device and space, so that their blocks
    /// are another resource's blocks of the same kind.
    others: Vec<Subject>,
}

fn setup() -> Setup {
    setup_with(64 << 30, 2 << 20)
}

/// Resources over a device of `capacity` bytes and a virtual space of as
/// much physical memory in granules of `granule` bytes.
fn setup_with(capacity: u64, granule: u64) -> Setup {
    let dev = Arc::new(SimDevice::new(capacity));
    let space = Arc::new(SimAddressSpace::new(capacity, granule).unwrap());
    let world = SimWorld::new();
    let (s1, s2) = (world.stream(), world.stream());
    let subjects = make_subjects(&dev, &space, &world);
    let others = make_subjects(&dev, &space, &world);
    Setup { dev, space, s1, s2, subjects, others }
}

fn all(f: impl Fn(&Setup, &Subject)) {
    let st = setup();
    for x in &st.subjects {
        f(&st, x);
    }
}

/// Runs `bad` against a subject holding one live block of 1000 bytes, then
/// checks that nothing changed: same bytes in use, checker clean, a new
/// block served and taken back, and the live block still frees.
fn with_live_block(st: &Setup, x: &Subject, bad: impl FnOnce(Block)) {
    let s = &st.s1;
    let a = x.alloc(1000, s).unwrap();
    let used = (x.used)();
    bad(a);
    x.usable(used, s);
    x.res.deallocate(a, s).unwrap_or_else(|e| panic!("{}: {e}", x.name));
    x.usable(0, s);
}

#[test]
fn zero_size_is_the_empty_block_and_its_free_a_no_op() {
    all(|st, x| {
        let b = x.alloc(0, &st.s1).unwrap();
        assert_eq!(b, Block::EMPTY, "{}", x.name);
        assert_eq!((x.used)(), 0, "{}", x.name);
        x.res.deallocate(b, &st.s2).unwrap();
        x.usable(0, &st.s1);
    });
}

#[test]
fn sizes_and_alignments_no_request_can_hold() {
    // Refused before any resource sees them.
    for size in [Request::MAX_SIZE + 1, u64::MAX - 255, u64::MAX] {
        assert_eq!(Request::new(size), Err(Error::InvalidSize { size, what: "above Request::MAX_SIZE" }));
    }
    // Rounding up to the alignment would overflow.
    assert!(matches!(Request::aligned(u64::MAX - 255, 512), Err(Error::InvalidSize { .. })));
    for align in [0, 3, 384, 1000, Request::MAX_ALIGN * 2, 1 << 63] {
        assert_eq!(Request::aligned(256, align), Err(Error::InvalidAlignment { align }));
    }
    // Below 256 is raised to the default.
    assert_eq!(Request::aligned(100, 16).unwrap().align(), 256);
}

#[test]
fn largest_size_fails_cleanly_everywhere() {
    all(|st, x| {
        with_live_block(st, x, |_| {
            let e = x.res.allocate(Request::new(Request::MAX_SIZE).unwrap(), &st.s1).unwrap_err();
            match x.name {
                // Above the block size.
                "FixedSizeResource" => assert_eq!(
                    e,
                    Error::InvalidSize { size: Request::MAX_SIZE, what: "above the block size" }
                ),
                // Refused before the upstream is asked.
                "Limiting" => assert!(matches!(e, Error::LimitExceeded { .. }), "{e:?}"),
                _ => assert!(
                    matches!(e, Error::OutOfMemory { requested, .. } if requested == Request::MAX_SIZE),
                    "{}: {e:?}",
                    x.name
                ),
            }
        })
    });
}

#[test]
fn largest_alignment_fails_cleanly_everywhere() {
    all(|st, x| {
        with_live_block(st, x, |_| {
            let r = Request::aligned(256, Request::MAX_ALIGN).unwrap();
            let e = x.res.allocate(r, &st.s1).unwrap_err();
            match x.name {
                // Blocks are aligned to what their chunks guarantee.
                "FixedSizeResource" | "BinningResource" => {
                    assert_eq!(e, Error::InvalidAlignment { align: Request::MAX_ALIGN })
                }
                _ => assert!(matches!(e, Error::OutOfMemory { .. }), "{}: {e:?}", x.name),
            }
        })
    });
}

#[test]
fn unknown_free_everywhere() {
    all(|st, x| {
        with_live_block(st, x, |a| {
            let never = Block::from_addr(0x1234_5600, 256);
            assert_eq!(
                x.res.deallocate(never, &st.s1),
                Err(Error::UnknownBlock { addr: 0x1234_5600 }),
                "{}",
                x.name
            );
            // Inside a live block, with its tag.
            let inside = Block::new(a.addr() + 256, 256, a.tag());
            let e = x.res.deallocate(inside, &st.s1).unwrap_err();
            assert_eq!(e, Error::UnknownBlock { addr: a.addr() + 256 }, "{}", x.name);
        })
    });
}

#[test]
fn double_free_everywhere() {
    all(|st, x| {
        with_live_block(st, x, |_| {
            let b = x.alloc(3000, &st.s1).unwrap();
            x.res.deallocate(b, &st.s1).unwrap();
            let by_tag = x.res.deallocate(b, &st.s1).unwrap_err();
            let by_addr = x.res.deallocate(Block::from_addr(b.addr(), b.size()), &st.s1).unwrap_err();
            let (double, unknown) =
                (Error::DoubleFree { addr: b.addr() }, Error::UnknownBlock { addr: b.addr() });
            let expected = match x.name {
                // A table of live blocks only: a freed one is unknown.
                "HostMemory" | "Tracking" | "Limiting" => (unknown, unknown),
                // The device tells a double free by the block's tag, the
                // layer by its slot.
                "SimDevice" | "StreamOrdered" => (double, unknown),
                _ => (double, double),
            };
            assert_eq!((by_tag, by_addr), expected, "{}", x.name);
        })
    });
}

#[test]
fn wrong_size_everywhere() {
    all(|st, x| {
        with_live_block(st, x, |a| {
            // 0 too: zero bytes at a live block's address is no empty block.
            for given in [a.size() + 5000, 10, 0] {
                let r = x.res.deallocate(Block::new(a.addr(), given, a.tag()), &st.s1);
                match x.name {
                    // Routed by size to another bin, which never handed it
                    // out, or to the upstream, which knows the address as
                    // the start of a bin's chunk of another size: their
                    // error.
                    "BinningResource" => assert!(
                        matches!(r, Err(Error::UnknownBlock { .. } | Error::SizeMismatch { .. })),
                        "{r:?}"
                    ),
                    _ => assert!(
                        matches!(r, Err(Error::SizeMismatch { addr, given: g, .. }) if addr == a.addr() && g == given),
                        "{}: {r:?}",
                        x.name
                    ),
                }
            }
        })
    });
}

#[test]
fn fixed_size_resource_frees_a_block_only_with_the_size_it_was_asked_with() {
    let st = setup();
    let x = st.subjects.iter().find(|x| x.name == "FixedSizeResource").unwrap();
    let a = x.alloc(1000, &st.s1).unwrap();
    // Any size a block of it could have is not enough: an adaptor above
    // counts off the size a free states.
    for (given, tag) in [(4097, a.tag()), (4096, a.tag()), (999, a.tag()), (4096, Block::NO_TAG)] {
        let e = x.res.deallocate(Block::new(a.addr(), given, tag), &st.s1).unwrap_err();
        assert!(matches!(e, Error::SizeMismatch { expected: 1000, given: g, .. } if g == given), "{e:?}");
        x.usable(4096, &st.s1);
    }
    x.res.deallocate(a, &st.s1).unwrap();
    x.usable(0, &st.s1);
}

#[test]
fn block_of_another_resource_everywhere() {
    let st = setup();
    for (x, other) in st.subjects.iter().zip(&st.others) {
        if x.name == "SimDevice" {
            // Two resources over one device: the device's own blocks.
            continue;
        }
        with_live_block(&st, x, |_| {
            let o = other.alloc(1000, &st.s1).unwrap();
            let e = x.res.deallocate(o, &st.s1).unwrap_err();
            assert_eq!(e, Error::UnknownBlock { addr: o.addr() }, "{}", x.name);
            let o2 = Block::from_addr(o.addr(), o.size());
            assert_eq!(
                x.res.deallocate(o2, &st.s1),
                Err(Error::UnknownBlock { addr: o.addr() }),
                "{}",
                x.name
            );
            other.res.deallocate(o, &st.s1).unwrap();
        });
        other.usable(0, &st.s1);
    }
}

#[test]
fn free_on_another_stream_than_the_allocation() {
    all(|st, x| {
        with_live_block(st, x, |_| {
            let before = (x.used)();
            let b = x.alloc(3000, &st.s1).unwrap();
            x.res.deallocate(b, &st.s2).unwrap_or_else(|e| panic!("{}: {e}", x.name));
            assert_eq!((x.used)(), before, "{}", x.name);
            // Served again on either stream.
            let c = x.alloc(3000, &st.s2).unwrap();
            let d = x.alloc(3000, &st.s1).unwrap();
            x.res.deallocate(c, &st.s2).unwrap();
            x.res.deallocate(d, &st.s1).unwrap();
        })
    });
}

#[test]
fn out_of_memory_everywhere() {
    // A device of its own for each: the others' chunks are not in the way.
    for i in 0..setup().subjects.len() {
        let st = setup_with(16 << 20, 64 << 10);
        let x = &st.subjects[i];
        if x.name == "HostMemory" {
            continue;
        }
        let s = &st.s1;
        // Blocks the resource serves: fixed-size and binned blocks are small.
        let unit = match x.name {
            "FixedSizeResource" | "BinningResource" => 4096,
            _ => 64 << 10,
        };
        let mut held = Vec::new();
        let e = loop {
            match x.alloc(unit, s) {
                Ok(b) => held.push(b),
                Err(e) => break e,
            }
            assert!(held.len() < 100_000, "{}: never out of memory", x.name);
        };
        assert!(
            matches!(e, Error::OutOfMemory { requested, largest_free: 0, .. } if requested == unit),
            "{}: {e:?}",
            x.name
        );
        assert!(!held.is_empty(), "{}", x.name);
        let used = (x.used)();
        (x.check)().unwrap_or_else(|v| panic!("{}: {v}", x.name));
        // A failed call changed nothing; once a block is back, one fits.
        assert_eq!((x.used)(), used, "{}", x.name);
        let last = held.pop().unwrap();
        x.res.deallocate(last, s).unwrap();
        held.push(x.alloc(unit, s).unwrap_or_else(|e| panic!("{}: {e}", x.name)));
        assert_eq!((x.used)(), used, "{}", x.name);
        for b in held {
            x.res.deallocate(b, s).unwrap();
        }
        // (A bin keeps its chunks until released: the same size again.)
        x.usable_with(0, unit, s);
    }
}

#[test]
fn upstream_failure_while_growing_everywhere() {
    for i in 0..setup().subjects.len() {
        let st = setup();
        let x = &st.subjects[i];
        if x.name == "HostMemory" {
            continue;
        }
        let s = &st.s1;
        // A first block: the resource holds memory from its upstream.
        let a = x.alloc(1000, s).unwrap();
        let used = (x.used)();
        // Then a request that needs more from the upstream, which fails.
        st.dev.fail_nth(1);
        st.space.fail_nth_commit(1);
        let big = match x.name {
            "FixedSizeResource" | "BinningResource" => 4096,
            _ => 64 << 20,
        };
        let mut blocks = Vec::new();
        let e = loop {
            match x.alloc(big, s) {
                Ok(b) => blocks.push(b),
                Err(e) => break e,
            }
            assert!(blocks.len() < 1000, "{}: the upstream was never asked", x.name);
        };
        assert!(matches!(e, Error::Backend { .. }), "{}: {e:?}", x.name);
        st.dev.fail_nth(0);
        st.space.fail_nth_commit(0);
        for b in blocks {
            x.res.deallocate(b, s).unwrap();
        }
        // What was held still serves, and the upstream works again.
        x.usable(used, s);
        let b = x.alloc(big, s).unwrap_or_else(|e| panic!("{}: {e}", x.name));
        x.res.deallocate(b, s).unwrap();
        x.res.deallocate(a, s).unwrap();
        x.usable(0, s);
    }
}

#[test]
fn failure_callback_that_always_retries_gives_up_and_stays_usable() {
    let dev = Arc::new(SimDevice::new(4 << 20));
    let calls = std::sync::atomic::AtomicU64::new(0);
    let r = FailureCallback::new(dev.clone(), &calls, |_, calls: &&std::sync::atomic::AtomicU64| {
        calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        true // "try again", forever
    });
    let a = r.allocate(Request::new(3 << 20).unwrap(), &()).unwrap();
    let e = r.allocate(Request::new(2 << 20).unwrap(), &()).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { requested, .. } if requested == 2 << 20), "{e:?}");
    // The first attempt and each of the bounded retries.
    assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), u64::from(r.max_retries()) + 1);
    assert_eq!(dev.usage().held, 3 << 20);
    let b = r.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    r.deallocate(a, &()).unwrap();
    r.deallocate(b, &()).unwrap();
    assert_eq!(dev.usage().held, 0);
}

#[test]
fn aligned_adaptor_refuses_an_impossible_alignment() {
    let dev = Arc::new(SimDevice::new(1 << 30));
    for align in [0, 3000, Request::MAX_ALIGN * 2] {
        assert_eq!(Aligned::new(dev.clone(), align, 0).unwrap_err(), Error::InvalidAlignment { align });
    }
    let a = Aligned::new(dev.clone(), 1 << 20, 4096).unwrap();
    let b = a.allocate(Request::new(8192).unwrap(), &()).unwrap();
    assert_eq!(b.addr() % (1 << 20), 0);
    a.deallocate(b, &()).unwrap();
    assert_eq!(dev.usage().held, 0);
}

#[test]
fn statistics_counters_popped_unevenly_change_nothing() {
    let dev = Arc::new(SimDevice::new(1 << 30));
    let s = Statistics::new(dev.clone());
    let a = s.allocate(Request::new(1000).unwrap(), &()).unwrap();
    let before = (s.get_bytes_counter(), s.get_allocations_counter(), s.depth());
    assert!(matches!(s.pop_counters(), Err(Error::InvalidConfig { .. })));
    assert_eq!((s.get_bytes_counter(), s.get_allocations_counter(), s.depth()), before);
    s.push_counters();
    s.pop_counters().unwrap();
    assert!(matches!(s.pop_counters(), Err(Error::InvalidConfig { .. })));
    assert_eq!((s.get_bytes_counter(), s.get_allocations_counter(), s.depth()), before);
    s.deallocate(a, &()).unwrap();
    assert_eq!((s.get_bytes_counter().value, dev.usage().held), (0, 0));
}

#[test]
fn malformed_stack_string_builds_nothing() {
    let builder = memres_sim::builder::<()>();
    let build_err = |text: &str| builder.build(text, &()).err().expect("a malformed stack");
    let e = build_err("stats(pool(sim)");
    assert_eq!((e.pos, e.kind), (15, StackErrorKind::Expected("`,` or `)`")));
    let e = build_err("pool(sim, initial=1000)");
    assert!(matches!(e.kind, StackErrorKind::Resource(Error::InvalidConfig { .. })), "{e}");
    let e = build_err("stats(pool(sim, colour=red))");
    assert_eq!((e.pos, e.kind), (16, StackErrorKind::UnknownKey("colour".into())));
    // The builder still builds.
    let r = builder.build("stats(pool(sim))", &()).unwrap();
    let b = r.allocate(Request::new(1000).unwrap(), &()).unwrap();
    r.deallocate(b, &()).unwrap();
}

#[test]
fn log_file_that_cannot_be_opened_is_an_error_at_construction() {
    let dev = Arc::new(SimDevice::new(1 << 30));
    let e = Logging::to_file(dev.clone(), "/nonexistent-dir/memres/log.csv").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    // Nothing was taken from the upstream, which still serves.
    assert_eq!(dev.usage().held, 0);
    let b = dev.allocate(Request::new(1000).unwrap(), &()).unwrap();
    dev.deallocate(b, &()).unwrap();
    assert_eq!(dev.usage().held, 0);
}
