use super::*;
use memres_core::stack::parse;
use memres_core::testing::SplitMix64;
use memres_core::vmem::CountingSpace;
use memres_core::Inspect;
use memres_core::{Block, Error, MemoryResourceMut, Request};

fn config(text: &str) -> std::result::Result<VmmConfig, StackError> {
    vmm_config(&parse(text).unwrap())
}

#[test]
fn options_are_read_with_their_defaults() {
    assert_eq!(
        config("vmm").unwrap(),
        VmmConfig {
            reserve: None,
            release_threshold: u64::MAX,
            handle_granules: 32,
            large_handles: false,
            trim_on_commit: true,
            slack_permille: 40,
            per_stream: false
        }
    );
    assert!(config("vmm(per_stream=true)").unwrap().per_stream);
    assert!(config("vmm(per_stream=maybe)").is_err());
    assert!(config("vmm(large_handles=true)").unwrap().large_handles);
    assert!(config("vmm(large_handles=1)").is_err());
    assert_eq!(config("vmm(slack=0)").unwrap().slack_permille, 0);
    assert_eq!(config("vmm(slack=100)").unwrap().virtual_config(1 << 30).slack(), 100);
    assert!(!config("vmm(trim_on_commit=false)").unwrap().trim_on_commit);
    assert!(config("vmm(trim_on_commit=true)").unwrap().trim_on_commit);
    assert_eq!(config("vmm(reserve=64GiB)").unwrap().reserve, Some(64 << 30));
    assert_eq!(config("vmm(release_threshold=0)").unwrap().release_threshold, 0);
    assert_eq!(config("vmm(release_threshold=64GiB)").unwrap().release_threshold, 64 << 30);
    assert_eq!(config("vmm(handle_granules=1)").unwrap().handle_granules, 1);
    assert_eq!(config("vmm(handle_granules=64)").unwrap().handle_granules, 64);
}

#[test]
fn bad_options_are_refused_at_their_position() {
    for (text, pos, kind) in [
        ("vmm(1GiB)", 4, StackErrorKind::ExtraArg),
        ("vmm(max=1GiB)", 4, StackErrorKind::UnknownKey("max".into())),
        (
            "vmm(release_threshold=1GiB, release_threshold=2GiB)",
            28,
            StackErrorKind::DuplicateKey("release_threshold".into()),
        ),
        ("vmm(release_threshold=lots)", 22, StackErrorKind::BadSize("lots".into())),
    ] {
        let e = config(text).unwrap_err();
        assert_eq!((e.pos, e.kind), (pos, kind), "{text}");
    }
    let e = config("vmm(reserve=0)").unwrap_err();
    assert_eq!(e.pos, 12);
    assert!(matches!(&e.kind, StackErrorKind::BadValue(m) if m.contains("reserve=0")), "{e}");
    let e = config("vmm(slack=lots)").unwrap_err();
    assert_eq!(e.pos, 10);
    assert!(matches!(&e.kind, StackErrorKind::BadValue(m) if m.contains("permille")), "{e}");
    let e = config("vmm(trim_on_commit=no)").unwrap_err();
    assert_eq!(e.pos, 19);
    assert!(matches!(&e.kind, StackErrorKind::BadValue(m) if m.contains("true or false")), "{e}");
    for bad in ["0", "65", "-1", "many", "1.5"] {
        let text = format!("vmm(handle_granules={bad})");
        let e = config(&text).unwrap_err();
        assert_eq!(e.pos, 20, "{text}");
        assert!(matches!(&e.kind, StackErrorKind::BadValue(m) if m.contains("1 to 64")), "{text}: {e}");
    }
}

/// A whole number takes no sign, as every other whole number of a stack
/// (`growth=+4`, a `vpool`'s `slack=+40`); `str::parse` took `+`.
#[test]
fn whole_numbers_take_no_sign() {
    for (text, pos) in [("vmm(slack=+40)", 10), ("vmm(handle_granules=+8)", 20)] {
        let e = config(text).map(|c| format!("taken: {c:?}")).unwrap_err();
        assert_eq!(e.pos, pos, "{text}");
        assert!(matches!(&e.kind, StackErrorKind::BadValue(_)), "{text}: {e}");
    }
}

#[test]
fn the_reservation_defaults_to_twice_the_device() {
    let c = VmmConfig::default().virtual_config(80 << 30);
    assert_eq!(
        (c.reserve_size(), c.release_threshold_bytes(), c.reservations()),
        (160 << 30, u64::MAX, VMM_RESERVATIONS)
    );
    let c = config("vmm(reserve=1GiB, release_threshold=1MiB)").unwrap().virtual_config(80 << 30);
    assert_eq!((c.reserve_size(), c.release_threshold_bytes()), (1 << 30, 1 << 20));
    assert!(c.trims_on_commit(), "kept memory raises the peak by the slack at most");
    let c = config("vmm(trim_on_commit=false)").unwrap().virtual_config(1 << 30);
    assert!(!c.trims_on_commit());
}

fn counted(counter: &Arc<Gauge>) -> CountedSpace<CountingSpace> {
    CountedSpace::new(CountingSpace::new(256 << 20, 1 << 20), CountingSpace::committed_bytes, counter.clone())
}

/// The counter follows the space's committed bytes through random
/// allocations and frees, its peak is the space's, and a dropped pool
/// leaves nothing counted.
#[test]
fn the_counter_follows_the_space_under_a_random_workload() {
    let mut rng = SplitMix64::new(7);
    for keep in [0, 3 << 20, 1 << 30] {
        let counter = Arc::new(Gauge::default());
        let mut pool =
            VirtualPool::with_config(counted(&counter), VirtualConfig::new(64 << 20).release_threshold(keep))
                .unwrap();
        let mut live: Vec<Block> = Vec::new();
        for step in 0..2000 {
            if live.len() < 40 && (live.is_empty() || rng.next_u64() % 3 != 0) {
                let size = 1 + rng.next_u64() % (3 << 20);
                match pool.allocate(Request::new(size).unwrap(), &()) {
                    Ok(b) => live.push(b),
                    Err(e) => assert!(e.is_out_of_memory(), "{e}"),
                }
            } else {
                let i = (rng.next_u64() % live.len() as u64) as usize;
                pool.deallocate(live.swap_remove(i), &()).unwrap();
            }
            pool.check().unwrap_or_else(|v| panic!("step {step}: {v:?}"));
            let space = pool.space().inner();
            assert_eq!(counter.value(), space.committed_bytes(), "keep {keep}, step {step}");
            assert_eq!(counter.peak(), space.peak_committed_bytes(), "keep {keep}, step {step}");
        }
        assert!(counter.peak() > 0);
        for b in live {
            pool.deallocate(b, &()).unwrap();
        }
        drop(pool);
        assert_eq!(counter.value(), 0, "keep {keep}");
    }
}

#[test]
fn a_failed_commit_counts_nothing() {
    let counter = Arc::new(Gauge::default());
    let mut pool = VirtualPool::with_config(counted(&counter), VirtualConfig::new(64 << 20)).unwrap();
    let a = pool.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    assert_eq!(counter.value(), 1 << 20);
    pool.space().inner().fail_nth(1);
    let e = pool.allocate(Request::new(5 << 20).unwrap(), &()).unwrap_err();
    assert!(matches!(e, Error::Backend { .. }), "{e}");
    assert_eq!((counter.value(), counter.peak(), counter.total()), (1 << 20, 1 << 20, 1 << 20));
    pool.deallocate(a, &()).unwrap();
    assert_eq!(counter.value(), 0);
}

/// What the space holds when counting starts is counted, and what it still
/// holds when the counting space drops is given back.
#[test]
fn held_memory_is_counted_from_the_start_to_the_drop() {
    let counter = Arc::new(Gauge::default());
    let inner = CountingSpace::new(256 << 20, 1 << 20);
    let r = inner.reserve(8 << 20).unwrap();
    inner.commit(Range::new(r.start(), 2 << 20).unwrap()).unwrap();
    let space = CountedSpace::new(inner, CountingSpace::committed_bytes, counter.clone());
    assert_eq!(counter.value(), 2 << 20);
    space.commit(Range::new(r.start() + (4 << 20), 1 << 20).unwrap()).unwrap();
    assert_eq!(counter.value(), 3 << 20);
    // A refused decommit (not committed) changes nothing.
    assert!(space.decommit(Range::new(r.start() + (6 << 20), 1 << 20).unwrap(), &()).is_err());
    assert_eq!(counter.value(), 3 << 20);
    space.decommit(Range::new(r.start(), 1 << 20).unwrap(), &()).unwrap();
    assert_eq!((counter.value(), counter.peak()), (2 << 20, 3 << 20));
    drop(space);
    assert_eq!(counter.value(), 0);
}
