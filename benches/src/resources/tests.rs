use super::*;
use crate::replay::{pass, Replayer, StreamReplayer};
use crate::stack::builder;
use crate::typed::{run_typed, OneThread, WithReplayer};
use crate::workload::{generate, parse_trace, SizeLaw};
use memres_core::pool::CoalescingPool;
use memres_core::stack::parse;
use memres_core::Inspect;
use memres_core::{Block, Error};
use memres_sim::{SimDevice, SimWorld};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Wraps a resource and checks, at every step, that the byte ranges it
/// hands out are aligned to 256 and never overlap a live one.
struct Checked<R: Replayer> {
    inner: R,
    range: fn(&R::Handle, u64) -> (u64, u64),
    live: BTreeMap<u64, u64>,
}

impl<R: Replayer> Replayer for Checked<R> {
    type Handle = R::Handle;
    fn vacant(&self) -> R::Handle {
        self.inner.vacant()
    }
    fn allocate(&mut self, size: u64, stream: u16) -> Result<R::Handle, Error> {
        let h = self.inner.allocate(size, stream)?;
        let (start, end) = (self.range)(&h, size);
        assert_eq!(end - start, size.div_ceil(256) * 256);
        if start < end {
            assert_eq!(start % 256, 0);
            if let Some((_, &e)) = self.live.range(..=start).next_back() {
                assert!(e <= start, "{start:#x} overlaps a live block ending at {e:#x}");
            }
            if let Some((&s, _)) = self.live.range(start..).next() {
                assert!(end <= s, "{start:#x}..{end:#x} overlaps a live block at {s:#x}");
            }
            self.live.insert(start, end);
        }
        Ok(h)
    }
    fn deallocate(&mut self, h: R::Handle, size: u64, stream: u16) -> Result<(), Error> {
        let (start, end) = (self.range)(&h, size);
        if start < end {
            assert_eq!(self.live.remove(&start), Some(end));
        }
        self.inner.deallocate(h, size, stream)
    }
    fn peak_upstream(&self) -> u64 {
        self.inner.peak_upstream()
    }
}

fn workloads() -> Vec<Workload> {
    let t = "0,1,allocate,0x10,0,0\n0,2,allocate,0x20,200,1\n0,3,free,0x10,0,1\n0,4,free,0x77,9,0\n0,5,allocate,0x30,3000,0\n";
    vec![
        Workload::load("random:3000:300000:5").unwrap(),
        Workload::load("lograndom:3000:1:1000000:6").unwrap(),
        parse_trace("t", t.as_bytes()).unwrap(),
    ]
}

/// Two passes of `w` through `r`, checked; the peak upstream holds at
/// least the rounded peak live.
fn check_replay<R: Replayer>(r: R, range: fn(&R::Handle, u64) -> (u64, u64), w: &Workload) {
    let mut r = Checked { inner: r, range, live: BTreeMap::new() };
    let mut handles = vec![r.vacant(); w.ids as usize];
    for _ in 0..2 {
        pass(&mut r, w, &mut handles).unwrap();
        assert!(r.live.is_empty());
    }
    let rounded_peak = {
        let (mut live, mut peak) = (0u64, 0u64);
        for op in &w.ops {
            let s = op.size.div_ceil(256) * 256;
            if op.alloc {
                live += s;
                peak = peak.max(live);
            } else {
                live -= s;
            }
        }
        peak
    };
    assert!(r.peak_upstream() >= rounded_peak, "{}: {} < {rounded_peak}", w.name, r.peak_upstream());
}

fn block_range(b: &Block, size: u64) -> (u64, u64) {
    (b.addr(), b.addr() + size.div_ceil(256) * 256)
}

/// Checks a typed resource's replays of one workload.
struct Check<'a>(&'a Workload);

impl WithReplayer for Check<'_> {
    type Output = ();
    fn with<R: Replayer<Handle = Block>>(self, r: R) {
        check_replay(r, block_range, self.0);
    }
}

/// Every workload through the typed stack of `text`.
fn check_typed(text: &str) {
    let (builder, world) = (builder(), SimWorld::new());
    for w in workloads() {
        let call = parse(text).unwrap();
        let streams = (0..w.streams).map(|_| world.stream()).collect();
        let checked =
            run_typed(&call, &builder, &world.default_stream(), OneThread { streams, then: Check(&w) });
        let checked = checked.unwrap();
        assert!(checked.is_ok(), "{text} has a typed shape");
    }
}

#[test]
fn pool_replays_correctly_over_both_upstreams() {
    check_typed("pool(sim(1TiB))");
    check_typed("pool(host)");
    // The pool's own checker agrees, and it is empty after a replay.
    let w = Workload::load("random:3000:300000:5").unwrap();
    let device = Arc::new(SimDevice::new(1 << 40));
    let leaf = device.clone();
    let mut r = StreamReplayer::new(CoalescingPool::new(device), vec![SimWorld::new().stream()], move |_| {
        leaf.usage().peak_held
    });
    let mut handles = vec![Block::EMPTY; w.ids as usize];
    pass(&mut r, &w, &mut handles).unwrap();
    r.inner.check().unwrap();
    assert_eq!(r.inner.usage().used, 0);
    assert_eq!(r.peak_upstream(), r.inner.usage().peak_held);
}

#[test]
fn peers_replay_correctly() {
    fn offset(a: &Option<offset_allocator::Allocation>, size: u64) -> (u64, u64) {
        let start = a.map_or(0, |a| a.offset as u64 * 256);
        (start, start + size.div_ceil(256) * 256)
    }
    for w in workloads() {
        check_replay(OffsetReplayer::new(&w), offset, &w);
        check_replay(RangeReplayer::new(), |&(s, e), _| (s * 256, e * 256), &w);
    }
}

#[test]
fn every_alias_replays_correctly_typed() {
    for r in RESOURCES {
        let Some(text) = r.stack(UpstreamKind::Sim, Some(1 << 20)) else { continue };
        check_typed(&text);
    }
    check_typed("binning(host)");
    check_typed("arena(host, initial=1MiB)");
}

#[test]
fn fixed_needs_a_size_that_fits_and_vpool_needs_sim() {
    let w = Workload::load("random:100:5000:1").unwrap();
    let fixed = find("fixed").unwrap();
    let small = RunOptions { param: Some(4096), ..RunOptions::default() };
    let e = fixed.run(&w, &small, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("blocks of 4096 bytes") && e.contains("asks for"), "{e}");
    let e = fixed.run(&w, &RunOptions::default(), &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("fixed:SIZE"), "{e}");
    let host = RunOptions { upstream: UpstreamKind::Host, ..RunOptions::default() };
    let e = find("vpool").unwrap().run(&w, &host, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("--upstream sim"), "{e}");
    assert_eq!(select("fixed:1MiB").unwrap().1, Some(1 << 20));
    assert!(select("fixed").unwrap_err().contains("needs a size"));
    assert!(select("fixed:0").unwrap_err().contains("bad size"));
    assert_eq!(select("pool:1MiB").unwrap().1, Some(1 << 20), "the pool's initial size");
    assert_eq!(select("pool").unwrap().1, None);
    assert_eq!(select("arena:1MiB").unwrap().1, Some(1 << 20), "the arena's initial size");
    assert!(select("binning:1MiB").unwrap_err().contains("takes no parameter"));
}

#[test]
fn aliases_are_stack_strings_over_the_upstream() {
    let spelled: Vec<(String, Option<String>)> =
        RESOURCES.iter().map(|r| (r.name.to_string(), r.stack(UpstreamKind::Host, Some(1000)))).collect();
    let want = [
        ("pool", Some("pool(host, initial=1024)")),
        ("rmm-pool", Some("pool(host, growth=double, release=false)")),
        ("fixed", Some("fixed(host, 1000)")),
        ("binning", Some("binning(host)")),
        ("arena", Some("arena(host, initial=1024)")),
        ("vpool", Some("vpool(sim(1TiB))")),
        ("stream-pool", Some("stream(pool(host))")),
        ("stats-pool", Some("stats(pool(host))")),
        ("offset-allocator", None),
        ("range-alloc", None),
        ("cuda", None),
        ("async", None),
    ];
    let want: Vec<(String, Option<String>)> =
        want.iter().map(|(n, s)| (n.to_string(), s.map(String::from))).collect();
    assert_eq!(spelled, want);
    assert_eq!(find("pool").unwrap().stack(UpstreamKind::Cuda, None).as_deref(), Some("pool(cuda)"));
}

/// An alias and its stack string, replayed by the tool: the same figures
/// but the time.
#[test]
fn an_alias_replays_as_its_stack_string() {
    let w = Workload::load("lograndom:2000:256:4000000:3").unwrap();
    for (name, param) in
        [("pool", Some(1 << 20)), ("arena", None), ("stats-pool", None), ("fixed", Some(4 << 20))]
    {
        let r = find(name).unwrap();
        let options = RunOptions { param, ..RunOptions::default() };
        let by_name = r.run(&w, &options, &mut |_| {}).unwrap();
        let text = r.stack(UpstreamKind::Sim, param).unwrap();
        let by_text = crate::stack::run_stack(&text, &w, &options, &mut |_| {}).unwrap();
        assert_eq!((by_name.peak_upstream, by_name.ops), (by_text.peak_upstream, by_text.ops), "{name}");
    }
}

#[test]
fn shared_entries_run_on_threads_and_the_rest_say_why_not() {
    let w = Workload::load("random:2000:100000:8").unwrap();
    for r in RESOURCES.iter().filter(|r| !matches!(r.kind, Kind::Cuda(_))) {
        let options = RunOptions { threads: Some(2), param: Some(1 << 20), ..RunOptions::default() };
        match r.run(&w, &options, &mut |_| {}) {
            Ok(m) => {
                assert!(matches!(r.kind, Kind::Stack(..)), "{}", r.name);
                assert_eq!(m.ops, 2 * w.ops.len() as u64, "{}", r.name);
                // The threads' live bytes together: at least one thread's
                // peak, at most both at their peaks at once; never more
                // than was held (the footprint is at least 1).
                assert!(
                    (w.peak_live..=2 * w.peak_live).contains(&m.peak_live),
                    "{}: {}",
                    r.name,
                    m.peak_live
                );
                assert!(m.peak_upstream >= m.peak_live, "{}: {:?}", r.name, m.footprint());
            }
            Err(RunError::Unsupported(e)) => {
                assert!(!matches!(r.kind, Kind::Stack(..)), "{}: {e}", r.name);
                assert!(e.contains("cannot be shared between threads"), "{e}");
            }
            Err(e) => panic!("{}: {e}", r.name),
        }
    }
}

#[test]
fn registry_runs_every_resource_and_failures_are_errors() {
    let w = Workload::load("random:2000:100000:8").unwrap();
    // One allocation of 1 PiB: more than any resource's capacity, and more
    // than a host that overcommits its memory can map.
    let huge = generate("huge", 3, 1 << 50, 1 << 50, 1, SizeLaw::Uniform, u64::MAX).unwrap();
    for r in RESOURCES {
        assert_eq!(find(r.name).unwrap().name, r.name);
        for up in [UpstreamKind::Sim, UpstreamKind::Host] {
            let options = RunOptions { upstream: up, passes: 2, threads: None, param: Some(1 << 20) };
            if matches!(r.kind, Kind::Cuda(_)) {
                // Runs only with the feature `cuda` and a device; without
                // either it says why, never an op failure.
                match r.run(&w, &options, &mut |_| {}) {
                    Ok(m) if cfg!(feature = "cuda") => {
                        assert_eq!((m.ops, m.peak_live), (w.ops.len() as u64, w.peak_live), "{}", r.name);
                    }
                    Ok(_) => panic!("{} ran without the feature `cuda`", r.name),
                    Err(RunError::Unsupported(e)) => {
                        let why = match cfg!(feature = "cuda") {
                            true => "no CUDA device",
                            false => "needs the tool built with `--features cuda`",
                        };
                        assert!(e.contains(why), "{}: {e}", r.name)
                    }
                    Err(e) => panic!("{}: {e}", r.name),
                }
                continue;
            }
            if r.name == "vpool" && up == UpstreamKind::Host {
                assert!(matches!(r.run(&w, &options, &mut |_| {}), Err(RunError::Unsupported(_))));
                continue;
            }
            let m = r.run(&w, &options, &mut |_| {}).unwrap();
            assert_eq!((m.ops, m.passes, m.peak_live), (w.ops.len() as u64, 2, w.peak_live));
            assert!(m.footprint().unwrap() >= 1.0);
            match r.run(&huge, &options, &mut |_| {}).unwrap_err() {
                RunError::Replay(err) => assert_eq!((err.op, err.alloc), (0, true), "{}: {err}", r.name),
                RunError::Unsupported(e) => assert_eq!(r.name, "fixed", "{e}"),
                RunError::Output(e) | RunError::Spawn(e) => panic!("{}: {e}", r.name),
                RunError::Table(e) => panic!("{}: {e}", r.name),
            }
        }
    }
    let err = find("nope").unwrap_err();
    assert!(err.contains("unknown resource `nope`") && err.contains("offset-allocator"), "{err}");
}

#[test]
fn upstream_names_parse() {
    assert_eq!("sim".parse::<UpstreamKind>(), Ok(UpstreamKind::Sim));
    assert_eq!("host".parse::<UpstreamKind>(), Ok(UpstreamKind::Host));
    assert!("gpu".parse::<UpstreamKind>().unwrap_err().contains("unknown upstream"));
    assert_eq!(UpstreamKind::Host.to_string(), "host");
}
