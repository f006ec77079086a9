use super::*;
use crate::replay::pass;
use crate::workload::{generate, parse_trace, SizeLaw};
use std::collections::BTreeMap;

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

fn check_replays<R: Replayer>(make: impl Fn(&Workload) -> R, range: fn(&R::Handle, u64) -> (u64, u64)) {
    for w in workloads() {
        let mut r = Checked { inner: make(&w), range, live: BTreeMap::new() };
        let mut handles = vec![r.vacant(); w.ids as usize];
        for _ in 0..2 {
            pass(&mut r, &w, &mut handles).unwrap();
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
}

#[test]
fn pool_replays_correctly_over_both_upstreams() {
    let range = |b: &Block, size: u64| (b.addr(), b.addr() + size.div_ceil(256) * 256);
    let o = RunOptions::default();
    check_replays(|w| Pool::build(SimDevice::new(1 << 40), w, &o).unwrap(), range);
    check_replays(|w| Pool::build(HostMemory::new(), w, &o).unwrap(), range);
    // The pool's own checker agrees, and it is empty after a replay.
    let w = Workload::load("random:3000:300000:5").unwrap();
    let mut r: PoolReplayer<_> =
        MutReplayer::new(CoalescingPool::new(SimDevice::new(1 << 40)), |p| p.upstream().peak_held_bytes());
    let mut handles = vec![Block::EMPTY; w.ids as usize];
    pass(&mut r, &w, &mut handles).unwrap();
    r.inner.check().unwrap();
    assert_eq!(r.inner.used_bytes(), 0);
    assert_eq!(r.peak_upstream(), r.inner.peak_pool_size());
}

#[test]
fn peers_replay_correctly() {
    fn offset(a: &Option<offset_allocator::Allocation>, size: u64) -> (u64, u64) {
        let start = a.map_or(0, |a| a.offset as u64 * 256);
        (start, start + size.div_ceil(256) * 256)
    }
    let o = RunOptions::default();
    check_replays(|w| OffsetAllocator::build(SimDevice::new(1), w, &o).unwrap(), offset);
    check_replays(|w| RangeAlloc::build(SimDevice::new(1), w, &o).unwrap(), |&(s, e), _| (s * 256, e * 256));
}

fn block_range(b: &Block, size: u64) -> (u64, u64) {
    (b.addr(), b.addr() + size.div_ceil(256) * 256)
}

#[test]
fn new_resources_replay_correctly() {
    let o = RunOptions::default();
    let fixed = RunOptions { param: Some(1 << 20), ..o };
    check_replays(|w| Fixed::build(SimDevice::new(1 << 40), w, &fixed).unwrap(), block_range);
    check_replays(|w| Binning::build(SimDevice::new(1 << 40), w, &o).unwrap(), block_range);
    check_replays(|w| Binning::build(HostMemory::new(), w, &o).unwrap(), block_range);
    check_replays(|w| Arena::build(SimDevice::new(1 << 40), w, &o).unwrap(), block_range);
    check_replays(|w| VPool::build(SimDevice::new(1), w, &o).unwrap(), block_range);
    check_replays(|w| StreamPool::build(SimDevice::new(1 << 40), w, &o).unwrap(), block_range);
    check_replays(|w| StatsPool::build(SimDevice::new(1 << 40), w, &o).unwrap(), block_range);
}

#[test]
fn fixed_needs_a_size_that_fits_and_vpool_needs_sim() {
    let w = Workload::load("random:100:5000:1").unwrap();
    let small = RunOptions { param: Some(4096), ..RunOptions::default() };
    let e = Fixed::build(SimDevice::new(1 << 40), &w, &small).unwrap_err();
    assert!(e.contains("blocks of 4096 bytes") && e.contains("asks for"), "{e}");
    assert!(Fixed::build(SimDevice::new(1 << 40), &w, &RunOptions::default())
        .unwrap_err()
        .contains("fixed:SIZE"));
    let host = RunOptions { upstream: UpstreamKind::Host, ..RunOptions::default() };
    assert!(VPool::build(HostMemory::new(), &w, &host).unwrap_err().contains("--upstream sim"));
    assert_eq!(select("fixed:1MiB").unwrap().1, Some(1 << 20));
    assert!(select("fixed").unwrap_err().contains("needs a size"));
    assert!(select("fixed:0").unwrap_err().contains("bad size"));
    assert_eq!(select("pool:1MiB").unwrap().1, Some(1 << 20), "the pool's initial size");
    assert_eq!(select("pool").unwrap().1, None);
    assert_eq!(select("arena:1MiB").unwrap().1, Some(1 << 20), "the arena's initial size");
    assert!(select("binning:1MiB").unwrap_err().contains("takes no parameter"));
}

#[test]
fn shared_entries_run_on_threads_and_the_rest_say_why_not() {
    let w = Workload::load("random:2000:100000:8").unwrap();
    for r in RESOURCES.iter().filter(|r| !r.cuda) {
        let options = RunOptions { threads: Some(2), param: Some(1 << 20), ..RunOptions::default() };
        match r.run(&w, &options, &mut |_| {}) {
            Ok(m) => {
                assert!(r.shared.is_some(), "{}", r.name);
                assert_eq!((m.ops, m.peak_live), (2 * w.ops.len() as u64, 2 * w.peak_live), "{}", r.name);
                assert!(m.peak_upstream >= w.peak_live, "{}", r.name);
            }
            Err(RunError::Unsupported(e)) => {
                assert!(r.shared.is_none(), "{}: {e}", r.name);
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
            if r.cuda {
                // Runs only with the feature `cuda` and a device; without
                // either it says why, never an op failure.
                match r.run(&w, &options, &mut |_| {}) {
                    Ok(m) if cfg!(feature = "cuda") => {
                        assert_eq!((m.ops, m.peak_live), (w.ops.len() as u64, w.peak_live), "{}", r.name);
                    }
                    Ok(_) => panic!("{} ran without the feature `cuda`", r.name),
                    Err(RunError::Unsupported(e)) => {
                        assert!(!cfg!(feature = "cuda") || e.contains("no CUDA device"), "{}: {e}", r.name)
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
