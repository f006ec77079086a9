//! The builder with the core's names over a leaf of the test doubles (the
//! backends' leaves are tested with them: `memres-sim`'s `tests/stack.rs`).

extern crate std;

use super::*;
use crate::adaptor::{Limiting, Statistics};
use crate::arena::ArenaResource;
use crate::binning::BinningResource;
use crate::per_stream::{PerStreamPool, PoolMaker};
use crate::pool::CoalescingPool;
use crate::stack::Unbacked;
use crate::testing::{BumpUpstream, IdStream};
use crate::Inspect;
use crate::{Error, Request};
use alloc::vec;

fn req(size: u64) -> Request {
    Request::new(size).unwrap()
}

/// The core's names and `bump(capacity)`: a [`BumpUpstream`].
fn builder<S: Stream + ?Sized + 'static>() -> StackBuilder<S>
where
    S::Event: Send,
{
    let mut b = StackBuilder::new();
    b.register("bump", |call, cx| {
        call.expect_args(1, &[])?;
        let capacity = call.positional(0).map(|v| v.size()).transpose()?.unwrap_or(1 << 30);
        Ok(cx.keep(call, BumpUpstream::new(capacity)))
    });
    b
}

#[test]
fn the_core_registers_its_resources_and_adaptors() {
    let b = StackBuilder::<()>::new();
    let names: Vec<&str> = b.names().collect();
    let mut want = vec!["align", "arena", "binning", "fixed", "limit", "planned", "pool", "stats", "track"];
    if cfg!(feature = "std") {
        want.push("log");
        want.sort_unstable();
    }
    assert_eq!(names, want);
    assert!(StackBuilder::<()>::empty().names().next().is_none());
}

#[test]
fn every_name_builds_and_serves() {
    let b = builder::<()>();
    for text in [
        "pool(bump, initial=1MiB, max=64MiB, growth=double)",
        "pool(bump, growth=4, granule=1MiB, release=false)",
        "fixed(bump, 64KiB, blocks=16)",
        "binning(bump, min_bin=1KiB, max_bin=1MiB)",
        "arena(bump, initial=64MiB, superblock=1MiB)",
        "stats(track(limit(align(pool(bump), alignment=64KiB), 1GiB)))",
        "planned(pool(bump))",
    ] {
        let r = b.build(text, &()).unwrap_or_else(|e| panic!("{text}: {e}"));
        let blocks: Vec<_> = (1..50).map(|i| r.allocate(req(1000 * i), &()).unwrap()).collect();
        for x in blocks {
            r.deallocate(x, &()).unwrap();
        }
    }
}

/// An arena's chunks hold whole superblocks: a `superblock=` above the
/// default chunk (32 MiB) makes the chunk its size. Before, it was refused
/// as a chunk below the superblock.
#[test]
fn an_arena_of_superblocks_above_the_default_chunk_builds_and_serves() {
    let b = builder::<()>();
    for sb in [48u64 << 20, 64 << 20] {
        let text = alloc::format!("arena(bump(1GiB), superblock={sb})");
        let built = b.build_with_handles(&text, &()).unwrap_or_else(|e| panic!("{text}: {e}"));
        // A block of a whole superblock (from the global arena) and a small
        // one (from a superblock lent to this thread's arena).
        let large = built.resource.allocate(req(sb), &()).unwrap();
        let small = built.resource.allocate(req(1000), &()).unwrap();
        let arena = built.get::<ArenaResource<DynResource>>("arena").unwrap();
        assert_eq!(arena.usage().used, sb + 1024, "{text}");
        assert!(arena.usage().held >= 2 * sb, "{text}: {:?}", arena.usage());
        built.resource.deallocate(small, &()).unwrap();
        built.resource.deallocate(large, &()).unwrap();
        assert_eq!(arena.usage().used, 0, "{text}");
    }
}

/// The count `fixed(leaf, 256, blocks=4294967291)` was taken, and its
/// first allocation asked the host for about 100 GB of slots.
#[test]
fn a_fixed_layer_of_more_blocks_per_chunk_than_the_most_is_refused() {
    let b = builder::<()>();
    for blocks in [(1 << 20) + 1, u32::MAX - 4] {
        let text = alloc::format!("fixed(bump(1TiB), 256, blocks={blocks})");
        let e = b.build(&text, &()).err().unwrap_or_else(|| panic!("{text} built"));
        assert!(matches!(e.kind, StackErrorKind::Resource(Error::InvalidConfig { .. })), "{text}: {e}");
    }
    assert!(b.build("fixed(bump(1TiB), 256, blocks=1048576)", &()).is_ok());
}

#[test]
fn handles_are_typed_and_outermost_first() {
    let built = builder::<()>()
        .build_with_handles("stats(limit(stats(pool(bump, initial=1MiB)), 4MiB))", &())
        .unwrap();
    let x = built.resource.allocate(req(1000), &()).unwrap();
    let all = built.all::<Statistics<DynResource>>("stats");
    assert_eq!(all.len(), 2);
    assert_eq!((all[0].get_bytes_counter().value, all[1].get_bytes_counter().value), (1000, 1000));
    assert_eq!(built.get::<Limiting<DynResource>>("limit").unwrap().get_allocated_bytes(), 1024);
    let pool = built.get::<Shared<CoalescingPool<DynResource>>>("pool").unwrap();
    assert_eq!(pool.with(|p| (p.usage().held, p.usage().used)), (1 << 20, 1024));
    assert_eq!(built.get::<BumpUpstream>("bump").unwrap().usage().held, 1 << 20);
    // A wrong type or an absent name: none.
    assert!(built.get::<BumpUpstream>("stats").is_none());
    assert!(built.get::<BumpUpstream>("track").is_none());
    built.resource.deallocate(x, &()).unwrap();
    assert_eq!(all[0].get_bytes_counter(), crate::adaptor::Counter { value: 0, peak: 1000, total: 1000 });
    let built =
        builder::<()>().build_with_handles("binning(arena(bump), min_bin=1KiB, max_bin=4KiB)", &()).unwrap();
    let bins = built.get::<BinningResource<'static, DynResource, ()>>("binning").unwrap();
    assert_eq!(bins.bin_sizes(), &[1024, 2048, 4096]);
    assert!(built.get::<ArenaResource<DynResource>>("arena").is_some());
}

#[test]
fn a_planned_stack_is_stepped_through_its_handle() {
    let built = builder::<()>().build_with_handles("stats(planned(pool(bump)))", &()).unwrap();
    let planned = built.get::<crate::planned::Planned<DynResource>>("planned").unwrap();
    for _ in 0..4 {
        planned.step(&()).unwrap();
        let x = built.resource.allocate(req(1000), &()).unwrap();
        built.resource.deallocate(x, &()).unwrap();
    }
    let steps = planned.steps();
    assert_eq!((steps.plans, steps.followed, steps.planned_allocations), (1, 1, 2));
    // `stats` above the plan counts every allocation asked for.
    assert_eq!(built.get::<Statistics<DynResource>>("stats").unwrap().get_allocations_counter().total, 4);
}

#[test]
fn registering_adds_or_replaces_a_name_for_any_stream() {
    let mut b = builder::<IdStream>();
    let s = IdStream(3);
    let e = b.build("stats(refuse)", &s).err().unwrap();
    assert_eq!((e.pos, e.kind), (6, StackErrorKind::UnknownName("refuse".into())));
    // A resource that refuses everything, registered with one call.
    b.register("refuse", |call, _| {
        call.expect_args(0, &[])?;
        Ok(Arc::new(Limiting::new(BumpUpstream::new(0), 0)))
    });
    assert!(b.build("stats(refuse)", &s).unwrap().allocate(req(1), &s).is_err());
    assert_eq!(b.build("refuse(bump)", &s).err().unwrap().kind, StackErrorKind::ExtraArg);
    // Replaced: the name now makes a pool over the test upstream.
    b.register("refuse", |call, cx| {
        Ok(cx.keep(call, Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 30)))))
    });
    let r = b.build("stats(refuse)", &s).unwrap();
    let x = r.allocate(req(1), &s).unwrap();
    r.deallocate(x, &s).unwrap();
}

#[test]
fn errors_name_the_position_and_build_nothing() {
    let b = builder::<()>();
    let cases: &[(&str, usize, StackErrorKind)] = &[
        ("stats(pool(gpu))", 11, StackErrorKind::UnknownName("gpu".into())),
        ("pool(bump, initial=1QiB)", 19, StackErrorKind::BadSize("1QiB".into())),
        ("limit(bump)", 0, StackErrorKind::MissingArg("the limit in bytes")),
        ("limit(bump, 1G, bytes=2G)", 22, StackErrorKind::DuplicateKey("bytes".into())),
        ("fixed(bump, 1MiB, size=1MiB)", 23, StackErrorKind::DuplicateKey("size".into())),
        ("binning(bump, min_bin=x)", 22, StackErrorKind::BadSize("x".into())),
        (
            "binning(bump, max_bin=3000)",
            22,
            StackErrorKind::BadValue("max_bin 3000: a power of two of at least 256 bytes".into()),
        ),
        ("binning(bump, min=10)", 14, StackErrorKind::UnknownKey("min".into())),
        ("stats()", 0, StackErrorKind::MissingArg("an upstream resource")),
    ];
    for (text, pos, kind) in cases {
        let e = b.build(text, &()).err().unwrap_or_else(|| panic!("{text} built"));
        assert_eq!((e.pos, &e.kind), (*pos, kind), "{text}: {e}");
    }
}

/// A size of an arena or a bin that its resource refuses is an error at
/// its value that names its key. Before, each was the resource's own
/// message at the call (byte 0): one for any arena size not a multiple of
/// 256, and "chunk size overflows" for a bin too large.
/// A pool's or fixed-size resource's configuration that the resource
/// refuses is an error at the value its message names, as the arena's
/// sizes are. Before, every one was at the call's name (byte 0 of
/// `pool(bump, initial=1000)`).
#[test]
fn a_refused_pool_or_fixed_configuration_is_an_error_at_its_value() {
    let b = builder::<()>();
    let cases = [
        ("stats(pool(bump, initial=1000))", "initial=", "initial pool size is not a multiple of 256"),
        ("stats(pool(bump, max=1000))", "max=", "maximum pool size is not a multiple of 256"),
        ("stats(pool(bump, initial=4MiB, max=2MiB))", "max=", "maximum pool size below the initial size"),
        (
            "stats(pool(bump, granule=9223372036854775808))",
            "granule=",
            "growth granule above the largest request",
        ),
        (
            "stats(pool(bump, initial=18446744073709551360))",
            "initial=",
            "initial pool size above the largest request",
        ),
        (
            "stats(pool(bump, per_stream=true, initial=1000))",
            "initial=",
            "initial pool size is not a multiple of 256",
        ),
        ("stats(fixed(bump, 1000))", "1000", "block size is zero, not a multiple of 256 or too large"),
        ("stats(fixed(bump, size=1000))", "size=", "block size is zero, not a multiple of 256 or too large"),
        ("stats(fixed(bump, blocks=0))", "blocks=", "blocks per chunk is zero, or too large (above 2^20)"),
        ("stats(fixed(bump, 36028797018963968, blocks=1048576))", "blocks=", "chunk size overflows"),
    ];
    for (text, key, what) in cases {
        let e = b.build(text, &()).err().unwrap_or_else(|| panic!("{text} built"));
        let at = text.find(key).unwrap() + key.find('=').map_or(0, |i| i + 1);
        assert_eq!((e.pos, e.kind), (at, StackErrorKind::Resource(Error::InvalidConfig { what })), "{text}");
    }
}

#[test]
fn a_refused_arena_or_bin_size_is_an_error_at_its_value_naming_its_key() {
    use alloc::string::String;
    let b = builder::<()>();
    let largest_request = Request::MAX_SIZE;
    let too_large = "too large for a fixed-size bin, at most 36028797018963968 (2^55): its chunk of 128 blocks must fit in a request";
    let cases = [
        (
            "arena(bump, initial=2MiB, superblock=1000000)",
            "superblock=",
            String::from("superblock 1000000: a multiple of 256 bytes from 1 MiB to 1 TiB"),
        ),
        (
            "arena(bump, superblock=2TiB)",
            "superblock=",
            alloc::format!("superblock {}: a multiple of 256 bytes from 1 MiB to 1 TiB", 2u64 << 40),
        ),
        (
            "arena(bump, initial=1000, max=1GiB)",
            "initial=",
            alloc::format!("initial 1000: a multiple of 256 bytes of at most {largest_request}"),
        ),
        ("arena(bump, max=1000)", "max=", String::from("max 1000: a multiple of 256 bytes")),
        (
            "arena(bump, initial=4MiB, max=2MiB, superblock=1MiB)",
            "max=",
            String::from("max 2097152 below initial 4194304"),
        ),
        ("arena(bump, max=1MiB)", "max=", String::from("max 1048576 below superblock 8388608 (the default)")),
        (
            "arena(bump, superblock=4MiB, max=2MiB)",
            "max=",
            String::from("max 2097152 below superblock 4194304"),
        ),
        (
            "binning(bump, max_bin=4611686018427387904)",
            "max_bin=",
            alloc::format!("max_bin 4611686018427387904: {too_large}"),
        ),
        (
            "binning(bump, min_bin=72057594037927936, max_bin=72057594037927936)",
            "min_bin=",
            alloc::format!("min_bin 72057594037927936: {too_large}"),
        ),
        (
            "binning(bump, bin(1KiB), bin(72057594037927936))",
            "bin(7",
            alloc::format!("bin size 72057594037927936: {too_large}"),
        ),
        (
            "binning(bump, bin(4611686018427388160, bump))",
            "bin(",
            alloc::format!(
                "bin size 4611686018427388160: too large, above {largest_request}, the largest request"
            ),
        ),
    ];
    for (text, key, message) in cases {
        let e = b.build(text, &()).err().unwrap_or_else(|| panic!("{text} built"));
        // The key's value: after `key=`, or a bin's size after `bin(`.
        let at = text.find(key).unwrap() + key.find(['=', '(']).unwrap() + 1;
        assert_eq!((e.pos, e.kind), (at, StackErrorKind::BadValue(message)), "{text}");
    }
    // The largest of each builds.
    for text in [
        "arena(bump, initial=1MiB, max=1MiB, superblock=1MiB)",
        "binning(bump, min_bin=36028797018963968, max_bin=36028797018963968)",
        "binning(bump, bin(36028797018963968), bin(4611686018427387904, bump))",
    ] {
        b.build(text, &()).unwrap_or_else(|e| panic!("{text}: {e}"));
    }
}

#[test]
fn per_stream_pools_keep_one_pool_per_stream() {
    type Pools = Shared<PerStreamPool<PoolMaker<DynResource<IdStream>>, IdStream>>;
    let built = builder::<IdStream>()
        .build_with_handles("pool(bump, per_stream=true, initial=1MiB, granule=1MiB)", &IdStream(0))
        .unwrap();
    let pools = built.get::<Pools>("pool").unwrap();
    assert_eq!(pools.with(|p| (p.stream_count(), p.usage().held)), (1, 1 << 20));
    let x = built.resource.allocate(req(1000), &IdStream(1)).unwrap();
    assert_eq!(pools.with(|p| p.stream_count()), 2);
    built.resource.deallocate(x, &IdStream(1)).unwrap();
}

#[test]
fn the_stream_layer_joins_on_request() {
    let mut b = builder::<IdStream>();
    let e = b.build("stream(pool(bump))", &IdStream(0)).err().unwrap();
    assert_eq!(e.kind, StackErrorKind::UnknownName("stream".into()));
    b.register_stream_layer();
    let built = b.build_with_handles("stream(pool(bump))", &IdStream(0)).unwrap();
    let x = built.resource.allocate(req(1 << 20), &IdStream(1)).unwrap();
    built.resource.deallocate(x, &IdStream(1)).unwrap();
    let y = built.resource.allocate(req(1 << 20), &IdStream(1)).unwrap();
    assert_eq!(x.addr(), y.addr());
    built.resource.deallocate(y, &IdStream(1)).unwrap();
    let so = built.get::<Shared<StreamOrdered<OnStream<IdStream>, IdStream>>>("stream").unwrap();
    assert!(so.with(|s| s.stats().own_hits) >= 1);
}

#[test]
fn an_unbacked_leaf_serves_any_size_and_never_reuses_an_address() {
    let leaf = Unbacked::new();
    let a = leaf.allocate(req(1 << 50), &()).unwrap();
    let b = leaf.allocate(Request::aligned(10, 1 << 20).unwrap(), &()).unwrap();
    assert!(b.addr() >= a.addr() + (1 << 50) && b.addr() % (1 << 20) == 0);
    assert_eq!(leaf.allocate(req(0), &()).unwrap(), Block::EMPTY);
    leaf.deallocate(a, &()).unwrap();
    assert!(leaf.allocate(req(1 << 20), &()).unwrap().addr() > b.addr());
    // The counter never wraps: past the end of the address space, out of memory.
    let most = req(Request::MAX_SIZE);
    let outcomes: Vec<bool> = (0..4).map(|_| leaf.allocate(most, &()).is_ok()).collect();
    assert_eq!(outcomes, [true, true, true, false]);
    assert!(matches!(leaf.allocate(most, &()), Err(Error::OutOfMemory { .. })));
}

#[cfg(feature = "std")]
#[test]
fn log_writes_its_file_and_says_when_it_cannot() {
    let path = std::env::temp_dir().join(alloc::format!("memres-core-stack-log-{}.csv", std::process::id()));
    {
        let r =
            builder::<()>().build(&alloc::format!("log(pool(bump), file={})", path.display()), &()).unwrap();
        let x = r.allocate(req(4096), &()).unwrap();
        r.deallocate(x, &()).unwrap();
    }
    let rows = crate::trace::read_all(std::io::BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!((rows.len(), rows[0].size, rows[1].pointer), (2, 4096, rows[0].pointer));
    let e = builder::<()>().build("log(bump, file=/nonexistent-dir/x/y.csv)", &()).err().unwrap();
    assert_eq!(e.pos, 15);
    assert!(matches!(&e.kind, StackErrorKind::Io(m) if m.contains("/nonexistent-dir/x/y.csv")), "{e}");
    let e = builder::<()>().build("log(bump)", &()).err().unwrap();
    assert_eq!((e.pos, e.kind), (0, StackErrorKind::MissingArg("file=")));
}

/// A constructor that goes on after an upstream failed to build (here:
/// its first upstream, else its second) builds as if it had not tried:
/// what the failed build kept is let go. Before, its handles, layers and
/// steps stayed in the build: a pool made there was kept alive by its
/// handle, holding its initial size from the leaf for as long as the
/// stack lived, and counted as a layer of a stack it is not in.
#[test]
fn a_failed_build_a_constructor_goes_on_from_keeps_nothing() {
    let below = Arc::new(Statistics::new(Unbacked::new()));
    let mut b = StackBuilder::<()>::new();
    b.register_resource("leaf", below.clone());
    b.register("first_of", |call, cx| {
        call.expect_args(2, &[])?;
        cx.upstream(call, 0).or_else(|_| cx.upstream(call, 1))
    });
    b.register("first_with", |call, cx| {
        call.expect_args(2, &[])?;
        cx.build_with(cx.builder, call.resource(0)?).or_else(|_| cx.upstream(call, 1))
    });
    for name in ["first_of", "first_with"] {
        // `align` builds its upstream, then refuses its alignment.
        let text = alloc::format!("{name}(align(pool(stats(leaf), initial=1MiB), alignment=3000), leaf)");
        let built = b.build_with_handles(&text, &()).unwrap();
        let layers = built.release_layers();
        let kept = (built.names().count(), layers.len(), layers.held(), below.get_bytes_counter().value);
        assert_eq!(kept, (0, 0, 0, 0), "{text}");
        let x = built.resource.allocate(req(1000), &()).unwrap();
        built.resource.deallocate(x, &()).unwrap();
    }
}

/// A stack refused after some of its layers took memory (a pool's initial
/// size) from an upstream shared beyond it gives that memory back, on a
/// stream with no drop stream too (where a dropped pool keeps its chunks):
/// refused in a layer above (`align`'s alignment), in the layer that wraps
/// it (a limit met), or when the whole stack was built (a `log` file that
/// cannot be opened). Before, the shared leaf kept 1 MiB for each.
#[test]
fn a_refused_stack_gives_back_what_its_layers_took_from_a_shared_upstream() {
    let below = Arc::new(Statistics::new(Unbacked::new()));
    let mut b = StackBuilder::<IdStream>::new();
    b.register_resource("leaf", below.clone());
    let mut refused = vec![
        "align(pool(leaf, initial=1MiB), alignment=3)",
        "align(pool(leaf, initial=1MiB, per_stream=true), alignment=3)",
        "align(arena(leaf, initial=1MiB), alignment=3)",
        "pool(limit(pool(leaf, initial=1MiB), 2MiB), initial=4MiB)",
        "stats(binning(leaf, bin(1KiB, pool(leaf, initial=1MiB)), bin(2KiB, pool(leaf, initial=lots))))",
    ];
    if cfg!(feature = "std") {
        refused.push("log(pool(leaf, initial=1MiB), file=/nonexistent-dir/x.csv)");
    }
    for text in refused {
        assert!(b.build(text, &IdStream(0)).is_err(), "{text} built");
        assert_eq!(below.get_bytes_counter().value, 0, "{text}: the shared leaf still holds memory");
    }
    // A stack that builds keeps its pool's initial size.
    let built = b.build("pool(leaf, initial=1MiB)", &IdStream(0)).unwrap();
    assert_eq!(below.get_bytes_counter().value, 1 << 20);
    drop(built);
}

/// A refused stack built over another built stack (its layers registered
/// with `keep_releasing_of`, as the Python package names the resource
/// objects a stack string is built over) leaves what that stack holds:
/// it is not the refused build's. Before, the refusal released the other
/// stack's pool, which gave back all it kept free.
#[test]
fn a_refused_stack_leaves_what_a_stack_it_is_built_over_holds() {
    let leaf = Arc::new(Statistics::new(Unbacked::new()));
    let mut b = StackBuilder::<IdStream>::new();
    b.register_resource("leaf", leaf.clone());
    let under = b.build_with_handles("pool(leaf, initial=1MiB)", &IdStream(0)).unwrap();
    let mut over = StackBuilder::<IdStream>::new();
    let (resource, layers) = (under.resource.clone(), under.release_layers());
    over.register("under", move |call, cx| {
        cx.keep_releasing_of(call, Arc::new(layers.clone()));
        Ok(resource.clone())
    });
    for text in ["align(under, alignment=3)", "align(pool(under, initial=4KiB), alignment=3)"] {
        assert!(over.build(text, &IdStream(0)).is_err(), "{text} built");
        assert_eq!(leaf.get_bytes_counter().value, 1 << 20, "{text}: the stack under it gave its pool back");
        assert_eq!(under.release_layers().held(), 1 << 20, "{text}");
    }
}
