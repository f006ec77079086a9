use super::*;
use crate::MemoryResource;
use alloc::string::ToString;
use alloc::vec::Vec;

fn err(text: &str) -> StackError {
    parse(text).expect_err(text)
}

#[test]
fn nested_calls_and_arguments() {
    let c = parse(" limit( stats(pool(sim, initial=1GiB, max = 4GiB)) , 2GiB )").unwrap();
    assert_eq!((c.name.as_str(), c.pos), ("limit", 1));
    let stats = c.resource(0).unwrap();
    assert_eq!((stats.name.as_str(), stats.pos), ("stats", 8));
    let pool = stats.resource(0).unwrap();
    assert_eq!(pool.name, "pool");
    assert_eq!(pool.resource(0).unwrap().name, "sim");
    assert_eq!(pool.resource(0).unwrap().args, Vec::new());
    assert_eq!(pool.size_arg("initial").unwrap(), Some(1 << 30));
    assert_eq!(pool.size_arg("max").unwrap(), Some(4 << 30));
    assert_eq!(c.positional(1).unwrap().size().unwrap(), 2 << 30);
    pool.expect_args(1, &["initial", "max", "growth"]).unwrap();
}

#[test]
fn words_keep_paths_and_empty_parens() {
    let c = parse("log(pool(host), file=/tmp/x.csv)").unwrap();
    assert_eq!(c.keyed("file").unwrap().text().unwrap(), "/tmp/x.csv");
    let c = parse("sim()").unwrap();
    assert_eq!((c.name.as_str(), c.args.len()), ("sim", 0));
    let c = parse("sim").unwrap();
    assert_eq!((c.name.as_str(), c.args.len()), ("sim", 0));
}

#[test]
fn malformed_strings_name_the_position() {
    let cases: &[(&str, usize, StackErrorKind)] = &[
        ("", 0, StackErrorKind::EmptyName),
        ("   ", 3, StackErrorKind::EmptyName),
        ("(sim)", 0, StackErrorKind::EmptyName),
        ("stats(pool(sim)", 15, StackErrorKind::Expected("`,` or `)`")),
        ("stats(sim))", 10, StackErrorKind::UnbalancedParen),
        ("stats(sim) x", 11, StackErrorKind::TrailingInput),
        ("stats(,sim)", 6, StackErrorKind::EmptyName),
        ("stats(sim,)", 10, StackErrorKind::EmptyName),
        ("pool(sim, max=)", 14, StackErrorKind::Expected("a value after `=`")),
        ("pool(sim, =4G)", 10, StackErrorKind::EmptyName),
        ("pool(sim max=4G)", 9, StackErrorKind::Expected("`,` or `)`")),
        ("4G(sim)", 0, StackErrorKind::Expected("a resource name before `(`")),
        ("pool(sim, 1x=4G)", 10, StackErrorKind::Expected("a key name before `=`")),
        ("2GiB", 0, StackErrorKind::WrongKind("a resource name")),
    ];
    for (text, pos, kind) in cases {
        let e = err(text);
        assert_eq!((e.pos, &e.kind), (*pos, kind), "{text:?}: {e}");
    }
}

/// White space is Unicode's everywhere the parser takes it: a no-break
/// space (U+00A0, 2 bytes in UTF-8), an em space (U+2003) or an
/// ideographic space (U+3000, 3 bytes each) separates tokens as a space
/// does, and errors name byte positions past them. Before, they were word
/// characters: `pool(\u{3000}sim)` had a word `\u{3000}sim`, no resource.
#[test]
fn unicode_white_space_is_white_space_and_errors_count_its_bytes() {
    let c = parse("\u{a0}pool(\u{3000}sim,\u{a0}max\u{2003}=\u{2003}4G\u{3000})\u{a0}").unwrap();
    assert_eq!((c.name.as_str(), c.pos), ("pool", 2));
    assert_eq!((c.resource(0).unwrap().name.as_str(), c.resource(0).unwrap().pos), ("sim", 10));
    assert_eq!((c.args[1].key.as_deref(), c.args[1].key_pos), (Some("max"), 16));
    assert_eq!((c.args[1].value.text().unwrap(), c.args[1].value.pos()), ("4G", 26));
    let cases: &[(&str, usize, StackErrorKind)] = &[
        ("\u{3000}", 3, StackErrorKind::EmptyName),
        ("stats(sim)\u{a0}x", 12, StackErrorKind::TrailingInput),
        ("stats(sim)\u{2003})", 13, StackErrorKind::UnbalancedParen),
        ("stats(\u{3000}pool(sim)", 18, StackErrorKind::Expected("`,` or `)`")),
        ("pool(sim,\u{2003}=4G)", 12, StackErrorKind::EmptyName),
        ("pool(sim,\u{a0}max=\u{3000})", 18, StackErrorKind::Expected("a value after `=`")),
        ("pool(sim\u{a0}max=4G)", 10, StackErrorKind::Expected("`,` or `)`")),
        ("pool(sim,\u{3000}1x=4G)", 12, StackErrorKind::Expected("a key name before `=`")),
    ];
    for (text, pos, kind) in cases {
        let e = err(text);
        assert_eq!((e.pos, &e.kind), (*pos, kind), "{text:?}: {e}");
    }
    let e = parse("pool(sim,\u{a0}initial=\u{2003}1x)").unwrap().size_arg("initial").unwrap_err();
    assert_eq!((e.pos, e.kind), (22, StackErrorKind::BadSize("1x".into())));
}

/// Parentheses nested past `MAX_DEPTH` are an error naming the call that
/// opens one level too many, never a stack overflow; `MAX_DEPTH` parse.
#[test]
fn nesting_deeper_than_the_limit_is_an_error_not_an_overflow() {
    let nested = |levels: usize| alloc::format!("{}sim{}", "stats(".repeat(levels), ")".repeat(levels));
    let c = parse(&nested(MAX_DEPTH)).unwrap();
    let mut opened = 0;
    let mut call = &c;
    while let Ok(inner) = call.resource(0) {
        (call, opened) = (inner, opened + 1);
    }
    assert_eq!((opened, call.name.as_str()), (MAX_DEPTH, "sim"));
    let e = err(&nested(MAX_DEPTH + 1));
    assert_eq!((e.pos, &e.kind), (MAX_DEPTH * 6, &StackErrorKind::TooDeep), "{e}");
    assert!(e.to_string().contains("nested more than 64 deep"), "{e}");
    // Deep enough to overflow a thread's stack when parsed recursively, and
    // unbalanced or keyed: still the depth error.
    for text in [nested(8000), "stats(".repeat(8000), "pool(sim, x=".repeat(8000)] {
        assert_eq!(err(&text).kind, StackErrorKind::TooDeep);
    }
}

#[test]
fn bad_sizes_unknown_and_duplicate_keys() {
    let c = parse("pool(sim, initial=12XB, max=4G, max=5G, extra=1, 7)").unwrap();
    let e = c.size_arg("initial").unwrap_err();
    assert_eq!((e.pos, e.kind.clone()), (18, StackErrorKind::BadSize("12XB".into())));
    assert_eq!(
        e.to_string(),
        "at byte 18: bad size `12XB` (a number with B, K, KiB, KB, M, MiB, MB, G, GiB, GB, T, TiB or TB, any case)"
    );
    let e = c.expect_args(1, &["initial", "max"]).unwrap_err();
    assert_eq!((e.pos, e.kind), (32, StackErrorKind::DuplicateKey("max".into())));
    let e = c.expect_args(1, &["initial", "max", "extra"]).unwrap_err();
    assert_eq!(e.pos, 32);
    let c = parse("pool(sim, extra=1, 7)").unwrap();
    let e = c.expect_args(1, &["initial"]).unwrap_err();
    assert_eq!((e.pos, e.kind), (10, StackErrorKind::UnknownKey("extra".into())));
    let e = c.expect_args(1, &["extra"]).unwrap_err();
    assert_eq!((e.pos, e.kind), (19, StackErrorKind::ExtraArg));
    // A resource where a size is wanted, a size where a resource is.
    let c = parse("limit(2G, stats(sim))").unwrap();
    assert_eq!(c.resource(0).unwrap_err().pos, 6);
    assert_eq!(c.positional(1).unwrap().size().unwrap_err().pos, 10);
    assert_eq!(c.resource(2).unwrap_err().kind, StackErrorKind::MissingArg("an upstream resource"));
}

/// Whole numbers are digits only, as sizes and the trace reader's numbers
/// are: `growth=+4` and `blocks=+16` were taken (`str::parse` reads a
/// leading `+`) where `initial=+4` was refused.
#[test]
fn whole_numbers_take_no_sign() {
    for (text, at) in [("pool(sim, growth=+4)", 17), ("pool(sim, growth=-4)", 17)] {
        let e = pool_config(&parse(text).unwrap()).unwrap_err();
        assert_eq!((e.pos, matches!(e.kind, StackErrorKind::BadValue(_))), (at, true), "{text}: {e}");
    }
    for (text, at) in [("fixed(sim, blocks=+16)", 18), ("fixed(sim, blocks=16x)", 18)] {
        let e = fixed_config(&parse(text).unwrap()).unwrap_err();
        assert_eq!((e.pos, matches!(e.kind, StackErrorKind::BadValue(_))), (at, true), "{text}: {e}");
    }
    assert_eq!(parse("fixed(sim, blocks=16)").unwrap().u32_arg("blocks", "").unwrap(), Some(16));
    assert!(parse_size("+4").is_none());
}

#[test]
fn sizes() {
    for (text, want) in [
        ("0", Some(0)),
        ("17", Some(17)),
        ("17B", Some(17)),
        ("3K", Some(3 << 10)),
        ("3KiB", Some(3 << 10)),
        ("3M", Some(3 << 20)),
        ("3MiB", Some(3 << 20)),
        ("3G", Some(3 << 30)),
        ("3GiB", Some(3 << 30)),
        ("3T", Some(3 << 40)),
        ("3TiB", Some(3 << 40)),
        ("18446744073709551615", Some(u64::MAX)),
        ("18446744073709551616", None),
        ("16777216TiB", None),
        ("", None),
        ("G", None),
        ("_1", None),
        ("3gib", Some(3 << 30)),
        ("2GB", Some(2_000_000_000)),
        ("5mb", Some(5_000_000)),
        ("7Kb", Some(7000)),
        ("1tb", Some(1_000_000_000_000)),
        ("4b", Some(4)),
        ("3GIB", Some(3 << 30)),
        ("3GiBB", None),
        ("2XB", None),
        ("3 G", None),
        ("-1", None),
    ] {
        assert_eq!(parse_size(text), want, "{text:?}");
    }
}

/// Underscores group digits: each sits between two. `1_`, `1__0` and
/// `64_MiB` were taken, the dangling or doubled underscore dropped.
#[test]
fn underscores_in_a_size_sit_between_digits() {
    for (text, want) in [
        ("1_000", Some(1000)),
        ("1_0_0", Some(100)),
        ("64_000KB", Some(64_000_000)),
        ("1_", None),
        ("1__0", None),
        ("64_MiB", None),
        ("1_000_", None),
        ("_1", None),
        ("_", None),
        ("1_K_iB", None),
    ] {
        assert_eq!(parse_size(text), want, "{text:?}");
    }
    let c = parse("pool(sim, initial=64_MiB)").unwrap();
    let e = c.size_arg("initial").unwrap_err();
    assert_eq!((e.pos, e.kind), (18, StackErrorKind::BadSize("64_MiB".into())));
}

/// Many bins in any order: `binning_bins` keeps the text's order and finds
/// a size given twice at its second place, and the built resource has the
/// same bins, sorted, as from the sizes given in order.
#[test]
fn many_bins_in_any_order_make_the_same_binning_resource() {
    use crate::binning::BinningResource;
    let n = if cfg!(miri) { 200 } else { 5_000 };
    let mut rng = crate::testing::SplitMix64::new(11);
    let mut sizes: Vec<u64> = (1..=n).map(|k| k * 256).collect();
    let sorted = sizes.clone();
    for i in (1..sizes.len()).rev() {
        sizes.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let text = |sizes: &[u64]| {
        let mut t = alloc::string::String::from("binning(leaf");
        for (i, s) in sizes.iter().enumerate() {
            // Every third bin with a resource of its own.
            t.push_str(&if i % 3 == 0 {
                alloc::format!(", bin({s}, leaf)")
            } else {
                alloc::format!(", bin({s})")
            });
        }
        t + ")"
    };
    let mut b = StackBuilder::<()>::new();
    b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    let bins_of = |sizes: &[u64]| {
        let call = parse(&text(sizes)).unwrap();
        let given: Vec<u64> = binning_bins(&call).unwrap().iter().map(|b| b.0).collect();
        assert_eq!(given, sizes, "in the text's order");
        let built = b.build_call_with_handles(&call, &()).unwrap();
        let binning = built.get::<BinningResource<'static, crate::DynResource, ()>>("binning").unwrap();
        binning.bin_sizes().to_vec()
    };
    for order in [&sizes, &sorted, &sorted.iter().rev().copied().collect::<Vec<_>>()] {
        assert_eq!(bins_of(order), sorted);
    }
    // A size given twice, far apart: refused at its second place.
    let mut twice = sizes.clone();
    twice.push(sizes[0]);
    let t = text(&twice);
    let e = binning_bins(&parse(&t).unwrap()).unwrap_err();
    let at = t.rfind(&alloc::format!("bin({}", sizes[0])).unwrap() + 4;
    assert_eq!(
        (e.pos, e.kind),
        (at, StackErrorKind::BadValue(alloc::format!("bin size {}: given twice", sizes[0])))
    );
}

#[test]
fn non_ascii_text_is_kept_whole() {
    let c = parse("log(sim, file=/tmp/é.csv)").unwrap();
    assert_eq!(c.keyed("file").unwrap().text().unwrap(), "/tmp/é.csv");
}

/// A leaf for the tests of `register_leaf_of`: `BumpUpstream`'s numbers,
/// said to be memory of `Engine` (nothing touches them).
struct Bytes(crate::testing::BumpUpstream);

impl MemoryResource for Bytes {
    fn allocate(&self, request: crate::Request, stream: &()) -> crate::Result<crate::Block> {
        self.0.allocate(request, stream)
    }
    fn deallocate(&self, block: crate::Block, stream: &()) -> crate::Result<()> {
        self.0.deallocate(block, stream)
    }
}

struct Engine;

// SAFETY: no engine of these tests touches the blocks.
unsafe impl crate::copy::MemoryOf<Engine> for Bytes {}

fn bytes_builder() -> StackBuilder<()> {
    let mut b = StackBuilder::<()>::new();
    b.register_leaf_of::<Engine>("bytes", |call, cx| {
        call.expect_args(0, &[])?;
        Ok(cx.keep_leaf_of(call, Bytes(crate::testing::BumpUpstream::new(1 << 30))))
    });
    b
}

/// A leaf of an engine's memory that keeps freed memory, as a driver's
/// pool does: it counts the releases asked of it.
struct DriverPool(Bytes, alloc::sync::Arc<core::sync::atomic::AtomicUsize>);

impl MemoryResource for DriverPool {
    fn allocate(&self, request: crate::Request, stream: &()) -> crate::Result<crate::Block> {
        self.0.allocate(request, stream)
    }
    fn deallocate(&self, block: crate::Block, stream: &()) -> crate::Result<()> {
        self.0.deallocate(block, stream)
    }
}

// SAFETY: no engine of these tests touches the blocks.
unsafe impl crate::copy::MemoryOf<Engine> for DriverPool {}

impl Release<()> for DriverPool {
    fn release(&self, _stream: &()) -> crate::Result<u64> {
        self.1.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        Ok(0)
    }
    fn held(&self) -> u64 {
        0
    }
}

/// A refused stack over a leaf of the driver's memory leaves the leaf
/// unreleased (its release would wait for the device and trim a pool the
/// driver may share beyond the stack), and releases the pool it made over
/// it; a built stack's release reaches both.
#[test]
fn a_refused_stack_releases_its_pools_but_not_a_leaf_of_the_drivers_memory() {
    let releases = alloc::sync::Arc::new(core::sync::atomic::AtomicUsize::new(0));
    let mut b = StackBuilder::<()>::new();
    let seen = releases.clone();
    b.register_leaf_of::<Engine>("driver", move |call, cx| {
        call.expect_args(0, &[])?;
        Ok(cx.keep_leaf_of_releasing(
            call,
            DriverPool(Bytes(crate::testing::BumpUpstream::new(1 << 30)), seen.clone()),
        ))
    });
    for text in ["align(driver, alignment=3)", "align(pool(driver, initial=1MiB), alignment=3)"] {
        assert!(b.build(text, &()).is_err(), "{text}");
        assert_eq!(releases.load(core::sync::atomic::Ordering::Relaxed), 0, "{text}");
    }
    let built = b.build_with_handles("pool(driver, initial=1MiB)", &()).unwrap();
    let layers = built.release_layers();
    assert_eq!(layers.held_by("pool"), 1 << 20);
    layers.release(&()).unwrap();
    assert_eq!((layers.held_by("pool"), releases.load(core::sync::atomic::Ordering::Relaxed)), (0, 1));
}

#[test]
fn a_leaf_of_an_engine_is_built_with_its_promise_and_its_typed_handle() {
    let b = bytes_builder();
    assert!(b.is_leaf_of::<Engine>("bytes"));
    assert!(!b.is_leaf_of::<()>("bytes"), "another engine");
    assert!(!b.is_leaf_of::<Engine>("pool") && !b.is_leaf_of::<Engine>("nothing"));
    let built = b.build_with_handles("stats(bytes)", &()).unwrap();
    assert!(built.get::<Bytes>("bytes").is_some(), "kept as the leaf's own type");
    let x = built.resource.allocate(crate::Request::new(1000).unwrap(), &()).unwrap();
    built.resource.deallocate(x, &()).unwrap();
    let leaf: LeafOf<(), Engine> = b.build_leaf_of(&parse("bytes").unwrap(), &()).unwrap();
    let x = leaf.allocate(crate::Request::new(1000).unwrap(), &()).unwrap();
    leaf.deallocate(x, &()).unwrap();
}

#[test]
fn a_name_replaced_or_never_a_leaf_of_the_engine_has_no_promise() {
    let mut b = bytes_builder();
    let Err(e) = b.build_leaf_of::<Engine>(&parse("stats(bytes)").unwrap(), &()) else {
        panic!("`stats` is not a leaf")
    };
    assert!(matches!((e.pos, &e.kind), (0, StackErrorKind::WrongKind(_))), "{e}");
    assert!(b.build_leaf_of::<()>(&parse("bytes").unwrap(), &()).is_err(), "another engine");
    b.register("bytes", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    assert!(!b.is_leaf_of::<Engine>("bytes"));
    assert!(b.build_leaf_of::<Engine>(&parse("bytes").unwrap(), &()).is_err());
    assert!(b.build("bytes", &()).is_ok(), "the plain constructor replaced it");
}

/// Another builder, whose `chunks` is a pool over unbacked space that
/// keeps freed memory, for a layer to wrap with `Context::build_with`.
fn a_builder_of_a_releasing_pool() -> alloc::sync::Arc<StackBuilder<()>> {
    use crate::pool::CoalescingPool;
    use crate::Shared;
    let mut inner = StackBuilder::<()>::empty();
    inner.register("chunks", |call, cx| {
        Ok(cx.keep_releasing(call, Shared::new(CoalescingPool::new(Unbacked::new()))))
    });
    alloc::sync::Arc::new(inner)
}

/// The layers that keep freed memory are found through a layer that wraps
/// another builder's resource (a snapshot's tap), and given back outermost
/// first. Before, the wrapped leaf was built in a context of its own, and
/// its handles and layers were lost.
#[test]
fn a_layer_built_with_another_builder_keeps_its_handles_and_what_it_releases() {
    use crate::adaptor::Statistics;
    use crate::pool::CoalescingPool;
    use crate::{DynResource, Request, Shared};
    type Inner = Shared<CoalescingPool<Unbacked>>;
    let inner = a_builder_of_a_releasing_pool();
    let mut b = StackBuilder::<()>::new();
    b.register("chunks", move |call, cx| {
        let leaf = cx.build_with(&inner, call)?;
        Ok(cx.keep(call, Statistics::new(leaf)))
    });
    let built = b.build_with_handles("pool(chunks, initial=1MiB)", &()).unwrap();
    assert!(built.get::<Inner>("chunks").is_some(), "the wrapped leaf's handle");
    assert!(built.get::<Statistics<DynResource>>("chunks").is_some(), "the wrapper's");
    let layers = built.release_layers();
    assert_eq!(layers.len(), 2);
    let x = built.resource.allocate(Request::new(4 << 20).unwrap(), &()).unwrap();
    built.resource.deallocate(x, &()).unwrap();
    let (outer, leaf) = (layers.held_by("pool"), layers.held_by("chunks"));
    assert!(outer > 0 && leaf >= outer, "{outer} {leaf}");
    // The outer pool's chunks go back to the leaf's pool, which gives them
    // on: what left the stack is what the leaf's pool held.
    assert_eq!(layers.held(), leaf);
    assert_eq!(layers.release(&()).unwrap(), leaf);
    assert_eq!((layers.held_by("pool"), layers.held_by("chunks")), (0, 0));
}

/// A layer that keeps freed memory over a resource it built with another
/// builder (`Context::build_with`, for the same call) is over that
/// resource's layers, as over an upstream: it is released first, and what
/// left the stack is what the layers under it gave back. Before, the
/// wrapped pool, kept first at the same position, was taken for the outer
/// layer and both for innermost: `held()` counted the wrapper's chunks
/// twice, and the release gave the wrapper's chunks to the wrapped pool
/// after it had been released, where they stayed, said to have left.
#[test]
fn a_layer_over_what_it_built_with_another_builder_is_released_first() {
    use crate::pool::CoalescingPool;
    use crate::{DynResource, Request, Shared};
    type Pool<U> = Shared<CoalescingPool<U>>;
    let inner = a_builder_of_a_releasing_pool();
    let mut b = StackBuilder::<()>::new();
    b.register("chunks", move |call, cx| {
        let leaf = cx.build_with(&inner, call)?;
        Ok(cx.keep_releasing(call, Shared::new(CoalescingPool::new(leaf))))
    });
    let built = b.build_with_handles("stats(chunks)", &()).unwrap();
    let wrapped = built.get::<Pool<Unbacked>>("chunks").unwrap();
    let wrapper = built.get::<Pool<DynResource>>("chunks").unwrap();
    assert_eq!(built.names().collect::<Vec<_>>(), [("stats", 0), ("chunks", 6), ("chunks", 6)]);
    let x = built.resource.allocate(Request::new(4 << 20).unwrap(), &()).unwrap();
    built.resource.deallocate(x, &()).unwrap();
    let from_leaf = wrapped.with(|p| p.held_bytes());
    assert!(from_leaf >= 4 << 20 && wrapper.with(|p| p.held_bytes()) > 0);
    let layers = built.release_layers();
    assert_eq!(layers.held(), from_leaf, "what the stack holds from its leaf, once");
    assert_eq!(layers.release(&()).unwrap(), from_leaf);
    assert_eq!((wrapper.with(|p| p.held_bytes()), wrapped.with(|p| p.held_bytes())), (0, 0));
    assert_eq!(layers.held(), 0);
}

/// A layer whose release fails does not keep the layers under it from
/// giving back: the error comes back after all of them ran.
#[test]
fn a_layer_that_fails_to_release_leaves_the_others_giving_back() {
    use crate::{Block, DynResource, Error, MemoryResource, Request};
    /// Hands its upstream's blocks on; its release always fails.
    struct Refusing(DynResource);
    impl MemoryResource<()> for Refusing {
        fn allocate(&self, request: Request, stream: &()) -> crate::Result<Block> {
            self.0.allocate(request, stream)
        }
        fn deallocate(&self, block: Block, stream: &()) -> crate::Result<()> {
            self.0.deallocate(block, stream)
        }
    }
    impl Release<()> for Refusing {
        fn release(&self, _: &()) -> crate::Result<u64> {
            Err(Error::InvalidConfig { what: "refused" })
        }
        fn held(&self) -> u64 {
            0
        }
    }
    let mut b = StackBuilder::<()>::new();
    b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    b.register("refusing", |call, cx| Ok(cx.keep_releasing(call, Refusing(cx.upstream(call, 0)?))));
    let built = b.build_with_handles("refusing(pool(leaf))", &()).unwrap();
    let x = built.resource.allocate(Request::new(4 << 20).unwrap(), &()).unwrap();
    built.resource.deallocate(x, &()).unwrap();
    let layers = built.release_layers();
    let held = layers.held_by("pool");
    assert!(held >= 4 << 20);
    assert_eq!(layers.release(&()), Err(Error::InvalidConfig { what: "refused" }));
    assert_eq!(layers.held_by("pool"), 0, "the pool under the failing layer gave back");
    assert_eq!(layers.release(&()), Err(Error::InvalidConfig { what: "refused" }));
}

/// A layer is under the call whose upstream built it however the
/// constructor came by the call it builds from: one that builds its
/// upstream from a copy of its call is an outer layer all the same. Before, the builder told the upstream by the address of its
/// call in the parsed tree: the copy's upstream was no upstream, so both
/// layers were innermost and `held` counted the pool's chunk twice.
#[test]
fn a_layer_is_under_its_callers_upstream_whoever_holds_the_call() {
    use crate::{Block, DynResource, MemoryResource, Request};
    /// Hands its upstream's blocks on and keeps nothing; `held` says
    /// what it was built to say, so that a count of it shows.
    struct Passing(DynResource);
    impl MemoryResource<()> for Passing {
        fn allocate(&self, request: Request, stream: &()) -> crate::Result<Block> {
            self.0.allocate(request, stream)
        }
        fn deallocate(&self, block: Block, stream: &()) -> crate::Result<()> {
            self.0.deallocate(block, stream)
        }
    }
    impl Release<()> for Passing {
        fn release(&self, _: &()) -> crate::Result<u64> {
            Ok(0)
        }
        fn held(&self) -> u64 {
            1
        }
    }
    let mut b = StackBuilder::<()>::new();
    b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    b.register("copying", |call, cx| {
        let copy = call.clone();
        Ok(cx.keep_releasing(call, Passing(cx.upstream(&copy, 0)?)))
    });
    let built = b.build_with_handles("copying(pool(leaf))", &()).unwrap();
    let x = built.resource.allocate(Request::new(4096).unwrap(), &()).unwrap();
    let layers = built.release_layers();
    let pool = layers.held_by("pool");
    assert!(pool > 0);
    assert_eq!(layers.held(), pool, "the pool alone is innermost");
    built.resource.deallocate(x, &()).unwrap();
}

/// The fixed-size, binning and arena layers keep freed memory too: a
/// release gives their free chunks to the pool under them, which gives
/// them on.
#[test]
fn fixed_binning_and_arena_layers_give_back_through_the_pool_under_them() {
    use crate::Request;
    let mut b = StackBuilder::<()>::new();
    b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    for (text, name, size) in [
        ("fixed(pool(leaf), 4KiB)", "fixed", 4096),
        ("binning(pool(leaf))", "binning", 300 << 10),
        ("arena(pool(leaf))", "arena", 1000),
    ] {
        let built = b.build_with_handles(text, &()).unwrap();
        let layers = built.release_layers();
        assert_eq!(layers.len(), 2, "{text}");
        let x = built.resource.allocate(Request::new(size).unwrap(), &()).unwrap();
        built.resource.deallocate(x, &()).unwrap();
        assert!(layers.held_by(name) > 0 && layers.held_by("pool") > 0, "{text}");
        assert!(layers.release(&()).unwrap() > 0, "{text}");
        assert_eq!((layers.held_by(name), layers.held_by("pool")), (0, 0), "{text}");
    }
}

/// A `binning` layer whose counted bin has a layer of its own (a pool) is
/// still innermost for what its upstream lends it, its fixed bins' chunks
/// and its large blocks: `held` and `release` count those and the pool's
/// chunks, each once, live blocks or not; a counted bin's blocks count in
/// `binning` only where no layer under the bin holds them. Before, building
/// the counted bin's pool made `binning` an outer layer, so its fixed bins'
/// chunks went to the leaf uncounted (`held` 33554432 where the leaves held
/// 33685504, and as much missing from what `release` returned).
#[test]
fn a_binning_layer_counts_its_own_chunks_beside_a_counted_bins_layers() {
    use crate::adaptor::Statistics;
    use crate::{Block, DynResource, Request};
    let mut b = StackBuilder::<()>::new();
    b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    let from_leaves = |built: &Built<()>| -> u64 {
        built.all::<Statistics<DynResource>>("stats").iter().map(|s| s.get_bytes_counter().value as u64).sum()
    };
    for text in [
        "binning(stats(leaf), bin(1KiB), bin(4KiB, pool(stats(leaf))))",
        "binning(stats(leaf), bin(1KiB), bin(4KiB, fixed(pool(stats(leaf)), 4KiB)))",
        "binning(stats(leaf), bin(1KiB), bin(4KiB, stats(leaf)))",
        "binning(pool(stats(leaf)), bin(1KiB), bin(4KiB, pool(stats(leaf))))",
    ] {
        let built = b.build_with_handles(text, &()).unwrap();
        let layers = built.release_layers();
        // A fixed bin's block, a counted bin's (a multiple of 256: its
        // footprint is what a leaf under it lends) and a large block.
        let live: Vec<Block> = [1000, 3072, 1 << 20]
            .map(|size| built.resource.allocate(Request::new(size).unwrap(), &()).unwrap())
            .into();
        assert_eq!(layers.held(), from_leaves(&built), "{text}, blocks live");
        for x in live {
            built.resource.deallocate(x, &()).unwrap();
        }
        let before = from_leaves(&built);
        assert!(before > 0, "{text}");
        assert_eq!(layers.held(), before, "{text}");
        assert_eq!(layers.release(&()).unwrap(), before, "{text}");
        assert_eq!((from_leaves(&built), layers.held()), (0, 0), "{text}");
    }
}

/// The `stream` layer keeps freed blocks listed for reuse: a release gives
/// them to the pool under it once the stream that freed them is done, and
/// the pool gives its chunk on. A failed synchronization leaves the block
/// listed, for the next release.
#[test]
fn the_stream_layer_gives_its_listed_blocks_back_once_their_stream_is_done() {
    use crate::testing::TestStream;
    use crate::Request;
    let mut b = StackBuilder::<TestStream>::new();
    b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    b.register_stream_layer();
    let built = b.build_with_handles("stream(pool(leaf))", &TestStream::new(0)).unwrap();
    let layers = built.release_layers();
    assert_eq!(layers.len(), 2);
    let freeing = TestStream::new(1);
    let x = built.resource.allocate(Request::new(1 << 20).unwrap(), &freeing).unwrap();
    built.resource.deallocate(x, &freeing).unwrap();
    assert_eq!(layers.held_by("stream"), 1 << 20, "listed on stream 1");
    let pool = layers.held_by("pool");
    assert!(pool >= 1 << 20);
    freeing.faults().fail_nth(1);
    assert!(layers.release(&TestStream::new(0)).is_err());
    assert_eq!((layers.held_by("stream"), layers.held_by("pool")), (1 << 20, pool), "still listed");
    assert_eq!(
        layers.release(&TestStream::new(0)).unwrap(),
        pool,
        "the listed block went on through the pool"
    );
    assert_eq!((layers.held_by("stream"), layers.held_by("pool")), (0, 0));
    assert_eq!(freeing.faults().syncs(), 1, "the freeing stream was waited for");
}

/// Routes requests under 1 MiB to its first upstream, the others to its
/// second; keeps nothing, but says it gave back a byte, which no count of
/// the stack must see (other layers are under it).
struct Split(crate::DynResource, crate::DynResource);

impl Split {
    fn to(&self, size: u64) -> &crate::DynResource {
        if size < 1 << 20 {
            &self.0
        } else {
            &self.1
        }
    }
}

impl crate::MemoryResource<()> for Split {
    fn allocate(&self, request: crate::Request, stream: &()) -> crate::Result<crate::Block> {
        self.to(request.size()).allocate(request, stream)
    }
    fn deallocate(&self, block: crate::Block, stream: &()) -> crate::Result<()> {
        self.to(block.size()).deallocate(block, stream)
    }
}

impl Release<()> for Split {
    fn release(&self, _: &()) -> crate::Result<u64> {
        Ok(1)
    }
    fn held(&self) -> u64 {
        1
    }
}

/// What a release returns is what left the stack, counted once however
/// many layers it went through: in a tree of layers, and into another
/// stack that the stack is built over (a Python object's upstream).
#[test]
fn a_release_counts_what_planned_gives_back_and_what_passes_through_it() {
    use crate::adaptor::Statistics;
    use crate::planned::Planned;
    use crate::{DynResource, Error, MemoryResource, Request};
    use alloc::sync::Arc;
    let mut b = StackBuilder::<()>::new();
    b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    for text in [
        "planned(stats(leaf))",
        "fixed(planned(stats(leaf)), 4KiB)",
        "pool(planned(stats(leaf)))",
        "planned(pool(stats(leaf)))",
        "pool(planned(pool(stats(leaf))), initial=1MiB)",
    ] {
        let built = b.build_with_handles(text, &()).unwrap();
        let layers = built.release_layers();
        let planned: Vec<Arc<Planned<DynResource>>> = built.all("planned");
        let leaf = built.get::<Statistics<DynResource>>("stats").unwrap();
        let lent = || leaf.get_bytes_counter().value as u64;
        for step in 0..6 {
            planned[0].step(&()).unwrap();
            let mut blocks = Vec::new();
            for size in [4 << 20, 4 << 10, 64 << 10] {
                match built.resource.allocate(Request::new(size).unwrap(), &()) {
                    Ok(x) => blocks.push(x),
                    Err(Error::InvalidSize { .. }) if text.starts_with("fixed") => {}
                    Err(e) => panic!("{text}: {e}"),
                }
            }
            for x in blocks {
                built.resource.deallocate(x, &()).unwrap();
            }
            if step == 3 {
                // Mid-way: what went back is what the leaf no longer lends.
                let before = lent();
                assert_eq!(layers.release(&()).unwrap(), before - lent(), "{text}");
            }
        }
        // The steps after the release repeated: a region again.
        planned[0].step(&()).unwrap();
        let before = lent();
        assert!(before > 0, "{text}");
        assert_eq!(layers.held(), before, "{text}");
        assert_eq!(layers.release(&()).unwrap(), before, "{text}");
        assert_eq!((lent(), layers.held()), (0, 0), "{text}");
    }
}

#[test]
fn a_release_counts_what_left_the_stack_once() {
    use crate::adaptor::Statistics;
    use crate::{DynResource, MemoryResource, Request};
    use alloc::sync::Arc;
    let mut b = StackBuilder::<()>::new();
    b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    b.register("split", |call, cx| {
        let (small, large) = (cx.upstream(call, 0)?, cx.upstream(call, 1)?);
        Ok(cx.keep_releasing(call, Split(small, large)))
    });
    let from_leaves = |built: &Built<()>| -> u64 {
        built.all::<Statistics<DynResource>>("stats").iter().map(|s| s.get_bytes_counter().value as u64).sum()
    };
    for text in [
        "pool(stats(leaf))",
        "pool(pool(stats(leaf)), initial=1MiB)",
        "split(fixed(pool(pool(stats(leaf))), 4KiB), stats(leaf))",
        "split(pool(stats(leaf)), pool(pool(stats(leaf))))",
        "split(pool(pool(stats(leaf))), fixed(stats(leaf), 8MiB))",
    ] {
        let built = b.build_with_handles(text, &()).unwrap();
        let layers = built.release_layers();
        for size in [4 << 10, 4 << 20] {
            let x = built.resource.allocate(Request::new(size).unwrap(), &()).unwrap();
            built.resource.deallocate(x, &()).unwrap();
        }
        let before = from_leaves(&built);
        assert!(before >= 4 << 20, "{text}");
        assert_eq!(layers.held(), before, "{text}");
        assert_eq!(layers.release(&()).unwrap(), before, "{text}");
        assert_eq!((from_leaves(&built), layers.held()), (0, 0), "{text}");
    }

    // A stack built over another: its release goes on into the other's
    // layers, and counts what left the other.
    let below = b.build_with_handles("pool(stats(leaf))", &()).unwrap();
    let mut over = StackBuilder::<()>::new();
    let (resource, layers) = (below.resource.clone(), below.release_layers());
    over.register("below", move |call, cx| {
        cx.keep_releasing_of(call, Arc::new(layers.clone()));
        Ok(resource.clone())
    });
    let built = over.build_with_handles("pool(pool(below))", &()).unwrap();
    let layers = built.release_layers();
    assert_eq!(layers.len(), 3);
    let x = built.resource.allocate(Request::new(3 << 20).unwrap(), &()).unwrap();
    built.resource.deallocate(x, &()).unwrap();
    let before = from_leaves(&below);
    assert!(before >= 3 << 20);
    assert_eq!(layers.held(), before);
    assert_eq!(layers.release(&()).unwrap(), before);
    assert_eq!((from_leaves(&below), layers.held_by("pool"), below.release_layers().held()), (0, 0, 0));
}

/// A build recursed once per level with the layer's resource in its frame
/// (a pool 16 KiB, moved a few times as it was made and kept): `MAX_DEPTH`
/// nested pools overflowed a 2 MiB thread stack, aborting the process, and
/// the C library builds its stack on whichever thread allocates first.
/// Now `MAX_DEPTH` layers, pools and arenas among them, build and serve on
/// a thread of 256 KiB, in a debug build as in a release one.
// Not under Miri: it gives no thread a stack of the size asked, so there
// is nothing to overflow, and the build has no unsafe code of its own.
#[cfg(not(miri))]
#[test]
fn a_stack_of_max_depth_layers_builds_and_serves_on_a_small_thread_stack() {
    extern crate std;
    let layers = ["pool(", "arena(", "binning(", "planned(", "track(", "stats(", "align("];
    let mut text: alloc::string::String = (0..MAX_DEPTH).map(|i| layers[i % layers.len()]).collect();
    text += "leaf";
    text += &")".repeat(MAX_DEPTH);
    let served = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            let mut b = StackBuilder::<()>::new();
            b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
            let stack = b.build(&text, &()).unwrap();
            let block = stack.allocate(crate::Request::new(1000).unwrap(), &()).unwrap();
            stack.deallocate(block, &()).unwrap();
            block.size()
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(served, 1000);
}

/// `wrap(wrap(...(leaf)))`, `levels` calls around `leaf`, made by hand at
/// the positions `parse` gives them in that text (`wrap(` is 5 bytes).
fn nested_by_hand(levels: usize) -> Call {
    let mut call = Call { name: "leaf".into(), pos: levels * 5, args: Vec::new() };
    for level in (0..levels).rev() {
        let arg = Arg { key: None, key_pos: (level + 1) * 5, value: Value::Call(call) };
        call = Call { name: "wrap".into(), pos: level * 5, args: alloc::vec![arg] };
    }
    call
}

/// Drops a chain of calls a level at a time: the derived drop recurses
/// once per level.
fn drop_level_by_level(mut call: Call) {
    while let Some(Arg { value: Value::Call(inner), .. }) = call.args.pop() {
        call = inner;
    }
}

/// The core's names, `leaf`, the leaf of `Engine` `bytes`, and `wrap(UP)`
/// (statistics over `UP`), each counting its constructor's runs in
/// `entered`.
fn counting_builder(entered: &alloc::sync::Arc<core::sync::atomic::AtomicUsize>) -> StackBuilder<()> {
    use core::sync::atomic::Ordering::Relaxed;
    let mut b = bytes_builder();
    let seen = entered.clone();
    b.register("leaf", move |call, cx| {
        seen.fetch_add(1, Relaxed);
        Ok(cx.keep(call, Unbacked::new()))
    });
    let seen = entered.clone();
    b.register("wrap", move |call, cx| {
        seen.fetch_add(1, Relaxed);
        call.expect_args(1, &[])?;
        Ok(cx.keep(call, crate::adaptor::Statistics::new(cx.upstream(call, 0)?)))
    });
    b
}

/// A `Call` can be made by hand, nested deeper than `parse` takes: its
/// build recursed once per level and overflowed the thread's stack,
/// aborting the process. Every build refuses it as `parse` refuses its
/// text, `TooDeep` at the call that opens one level too many, before any
/// constructor runs; `MAX_DEPTH` levels build.
#[test]
fn a_call_made_by_hand_nested_past_the_limit_is_refused_before_anything_is_built() {
    extern crate std;
    use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let entered = alloc::sync::Arc::new(AtomicUsize::new(0));
    let b = counting_builder(&entered);
    let levels = MAX_DEPTH + 1;
    let e = err(&alloc::format!("{}leaf{}", "wrap(".repeat(levels), ")".repeat(levels)));
    let refused = (MAX_DEPTH * 5, StackErrorKind::TooDeep);
    assert_eq!((e.pos, e.kind), refused, "the text's error");
    // Deep enough to overflow a small thread's stack, built on one (Miri
    // gives no thread the size asked: a chain it walks at its pace).
    let deep = nested_by_hand(if cfg!(miri) { 2 * MAX_DEPTH } else { 20_000 });
    let mut leaf_of_deep = nested_by_hand(MAX_DEPTH + 1);
    leaf_of_deep.name = "bytes".into();
    let errors = std::thread::scope(|s| {
        let builds = std::thread::Builder::new().stack_size(256 << 10).spawn_scoped(s, || {
            [
                b.build_call(&deep, &()).err(),
                b.build_call_with_handles(&deep, &()).err(),
                b.build_call(&nested_by_hand(MAX_DEPTH + 1), &()).err(),
                b.build_leaf_of::<Engine>(&leaf_of_deep, &()).err(),
            ]
        });
        builds.unwrap().join().unwrap()
    });
    for e in errors {
        let e = e.expect("refused");
        assert_eq!((e.pos, e.kind), refused);
    }
    assert_eq!(entered.load(Relaxed), 0, "no constructor ran");
    drop_level_by_level(deep);
    let stack = b.build_call(&nested_by_hand(MAX_DEPTH), &()).unwrap();
    assert_eq!(entered.load(Relaxed), MAX_DEPTH + 1);
    let block = stack.allocate(crate::Request::new(1000).unwrap(), &()).unwrap();
    stack.deallocate(block, &()).unwrap();
}

/// A constructor may hand the build any call, one made by hand too:
/// `Context::upstream`, `build_with` and `build_leaf_of_with` refuse one
/// nested past `MAX_DEPTH` as a build does, before its constructors run.
/// Before, they built it (the leaf of `Engine` refused its argument).
#[test]
fn a_call_made_by_hand_in_a_constructor_nested_past_the_limit_is_refused() {
    use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let entered = alloc::sync::Arc::new(AtomicUsize::new(0));
    let mut b = counting_builder(&entered);
    b.register("by_upstream", |call, cx| {
        let arg = Arg { key: None, key_pos: 0, value: Value::Call(nested_by_hand(MAX_DEPTH + 1)) };
        let made = Call { args: alloc::vec![arg], ..call.clone() };
        cx.upstream(&made, 0)
    });
    b.register("by_build_with", |_, cx| cx.build_with(cx.builder, &nested_by_hand(MAX_DEPTH + 1)));
    b.register("by_leaf_of_with", |_, cx| {
        let mut deep = nested_by_hand(MAX_DEPTH + 1);
        deep.name = "bytes".into();
        cx.build_leaf_of_with::<Engine>(cx.builder, &deep).map(crate::copy::AssumeMemoryOf::into_inner)
    });
    for name in ["by_upstream", "by_build_with", "by_leaf_of_with"] {
        let e = b.build(name, &()).err().expect(name);
        assert_eq!((e.pos, e.kind), (MAX_DEPTH * 5, StackErrorKind::TooDeep), "{name}");
    }
    assert_eq!(entered.load(Relaxed), 0, "no constructor under them ran");
}

/// A stack refused after its `log` layer was built (an outer layer's bad
/// argument, a pool whose initial size its upstream cannot give, a bin's
/// bad argument) had made the log file anew: what it held was gone. The
/// file is made once the whole stack is built, with what the layer logged
/// while it was (the pool's initial chunk).
#[cfg(feature = "std")] // its `log` layer
#[test]
fn a_refused_stack_leaves_its_log_file_as_it_was() {
    extern crate std;
    let dir = std::env::temp_dir().join(alloc::format!("memres-refused-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("log.csv");
    let mut b = StackBuilder::<()>::new();
    b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    b.register("small", |call, cx| Ok(cx.keep(call, crate::testing::BumpUpstream::new(1 << 20))));
    for text in [
        "align(log(leaf, file={F}), alignment=3)",
        "pool(log(small, file={F}), initial=2MiB)",
        "binning(log(leaf, file={F}), bin(4KiB, pool(leaf, growth=0)))",
    ] {
        std::fs::write(&path, "precious rows\n").unwrap();
        let text = text.replace("{F}", path.to_str().unwrap());
        assert!(b.build(&text, &()).is_err(), "{text}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious rows\n", "{text}");
    }
    let text = alloc::format!("pool(log(leaf, file={}), initial=1MiB)", path.display());
    drop(b.build(&text, &()).unwrap());
    let rows = crate::trace::read_all(&std::fs::read(&path).unwrap()[..]).unwrap();
    assert_eq!((rows[0].action, rows[0].size), (crate::trace::Action::Allocate, 1 << 20));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A stack of two `log` layers whose second file cannot be made (its
/// directory is missing, or it is the first's file, which a live log
/// writes) was refused after the first file was made: cut to its header,
/// or made where nothing was. Every file is opened before any is cut, so
/// the first is as it was, and one the build made is gone.
#[cfg(feature = "std")] // its `log` layer
#[test]
fn a_stack_whose_second_log_file_is_refused_leaves_the_first_as_it_was() {
    extern crate std;
    let dir = std::env::temp_dir().join(alloc::format!("memres-second-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let first = dir.join("first.csv");
    let missing = dir.join("no-such-dir").join("second.csv");
    let mut b = StackBuilder::<()>::new();
    b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    for second in [&missing, &first] {
        let text = alloc::format!(
            "pool(log(log(leaf, file={}), file={}), initial=1MiB)",
            first.display(),
            second.display()
        );
        std::fs::write(&first, "precious rows\n").unwrap();
        assert!(b.build(&text, &()).is_err(), "{text}");
        assert_eq!(std::fs::read_to_string(&first).unwrap(), "precious rows\n", "{text}");
        std::fs::remove_file(&first).unwrap();
        assert!(b.build(&text, &()).is_err(), "{text}");
        assert!(!first.exists(), "{text}");
    }
    let text = alloc::format!(
        "binning(log(leaf, file={}), bin(4KiB, log(leaf, file={})))",
        first.display(),
        missing.display()
    );
    std::fs::write(&first, "precious rows\n").unwrap();
    assert!(b.build(&text, &()).is_err());
    assert_eq!(std::fs::read_to_string(&first).unwrap(), "precious rows\n");
    // Both files made, each with the pool's initial chunk.
    let second = dir.join("second.csv");
    let text = alloc::format!(
        "pool(log(log(leaf, file={}), file={}), initial=1MiB)",
        first.display(),
        second.display()
    );
    drop(b.build(&text, &()).unwrap());
    for path in [&first, &second] {
        let rows = crate::trace::read_all(&std::fs::read(path).unwrap()[..]).unwrap();
        assert_eq!((rows[0].action, rows[0].size), (crate::trace::Action::Allocate, 1 << 20));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A layer registered from outside may report any figure: two innermost
/// layers that each hold (and give back) nearly all of `u64` add up
/// saturated, neither panicking nor wrapping to a small count.
#[test]
fn the_figures_of_layers_that_add_up_past_u64_max_saturate() {
    use crate::{Block, MemoryResource, Request};
    /// Holds and gives back what it was built to say.
    struct Huge;
    impl MemoryResource<()> for Huge {
        fn allocate(&self, _: Request, _: &()) -> crate::Result<Block> {
            Err(crate::Error::InvalidConfig { what: "serves nothing" })
        }
        fn deallocate(&self, block: Block, _: &()) -> crate::Result<()> {
            Err(crate::Error::UnknownBlock { addr: block.addr() })
        }
    }
    impl Release<()> for Huge {
        fn release(&self, _: &()) -> crate::Result<u64> {
            Ok(u64::MAX - 1)
        }
        fn held(&self) -> u64 {
            u64::MAX - 1
        }
    }
    let mut b = StackBuilder::<()>::new();
    b.register("huge", |call, cx| Ok(cx.keep_releasing(call, Huge)));
    b.register("split", |call, cx| {
        let (small, large) = (cx.upstream(call, 0)?, cx.upstream(call, 1)?);
        Ok(cx.keep_releasing(call, Split(small, large)))
    });
    let built = b.build_with_handles("split(huge, huge)", &()).unwrap();
    let layers = built.release_layers();
    assert_eq!(layers.held(), u64::MAX);
    assert_eq!(layers.held_by("huge"), u64::MAX);
    assert_eq!(layers.release(&()), Ok(u64::MAX));
}

/// What passed through an innermost layer during a release adds up
/// saturated too: after a layer that gave back all of `u64`, one whose
/// passed-through bytes went down by one panicked in a debug build (an
/// overflow in the sum) and wrapped the count to 0 in release.
#[test]
fn bytes_passed_through_during_a_release_add_up_saturated() {
    use crate::{Block, MemoryResource, Request};
    use core::sync::atomic::{AtomicU64, Ordering::Relaxed};
    /// Serves nothing; gives back what it was built to say, and its
    /// passed-through bytes go down by one at each look.
    struct Odd {
        given: u64,
        through: AtomicU64,
    }
    impl MemoryResource<()> for Odd {
        fn allocate(&self, _: Request, _: &()) -> crate::Result<Block> {
            Err(crate::Error::InvalidConfig { what: "serves nothing" })
        }
        fn deallocate(&self, block: Block, _: &()) -> crate::Result<()> {
            Err(crate::Error::UnknownBlock { addr: block.addr() })
        }
    }
    impl Release<()> for Odd {
        fn release(&self, _: &()) -> crate::Result<u64> {
            Ok(self.given)
        }
        fn held(&self) -> u64 {
            0
        }
        fn passed_through(&self) -> u64 {
            self.through.fetch_sub(1, Relaxed)
        }
    }
    let mut b = StackBuilder::<()>::new();
    b.register("huge", |call, cx| Ok(cx.keep_releasing(call, Odd { given: u64::MAX, through: 1.into() })));
    b.register("odd", |call, cx| Ok(cx.keep_releasing(call, Odd { given: 0, through: 2.into() })));
    b.register("split", |call, cx| {
        let (small, large) = (cx.upstream(call, 0)?, cx.upstream(call, 1)?);
        Ok(cx.keep_releasing(call, Split(small, large)))
    });
    let built = b.build_with_handles("split(huge, odd)", &()).unwrap();
    assert_eq!(built.release_layers().release(&()), Ok(u64::MAX));
}

/// A stack of two `log` layers whose second file opens but refuses its
/// first write (`/dev/full`, as a full disk) was refused after the first
/// file was cut to its header and rows, or made where nothing was. Every
/// file's first write is tried before any is cut, so the first is as it
/// was, and one the build made is gone.
#[cfg(target_os = "linux")]
#[test]
fn a_stack_whose_second_log_file_refuses_its_first_write_leaves_the_first_as_it_was() {
    extern crate std;
    let dir = std::env::temp_dir().join(alloc::format!("memres-full-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let first = dir.join("first.csv");
    let mut b = StackBuilder::<()>::new();
    b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    let text = alloc::format!("pool(log(log(leaf, file={}), file=/dev/full), initial=1MiB)", first.display());
    std::fs::write(&first, "precious rows\n").unwrap();
    assert!(b.build(&text, &()).is_err());
    assert_eq!(std::fs::read_to_string(&first).unwrap(), "precious rows\n");
    std::fs::remove_file(&first).unwrap();
    assert!(b.build(&text, &()).is_err());
    assert!(!first.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A `log` file named by a link to nothing (dangling) was taken for a file
/// that was there: the file the refused build made through the link was
/// left behind. It is removed, and the link, which was there, is left.
#[cfg(unix)]
#[cfg(feature = "std")] // its `log` layer
#[test]
fn a_refused_stack_removes_the_file_it_made_through_a_dangling_link_and_keeps_the_link() {
    extern crate std;
    let dir = std::env::temp_dir().join(alloc::format!("memres-link-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (link, target) = (dir.join("link.csv"), dir.join("target.csv"));
    std::os::unix::fs::symlink("target.csv", &link).unwrap();
    let mut b = StackBuilder::<()>::new();
    b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    let missing = dir.join("no-such-dir").join("second.csv");
    let text = alloc::format!("log(log(leaf, file={}), file={})", link.display(), missing.display());
    assert!(b.build(&text, &()).is_err());
    assert!(!target.exists(), "the file made through the link is removed");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link is left");
    // Built, the log writes its file through the link.
    drop(b.build(&alloc::format!("log(leaf, file={})", link.display()), &()).unwrap());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), alloc::format!("{}\n", crate::trace::HEADER));
    std::fs::remove_dir_all(&dir).unwrap();
}
