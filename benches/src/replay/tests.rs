use super::*;
use crate::workload::{parse_trace, Workload};
use memres_core::Error;

/// Hands out handles `1, 2, 3, ...` and checks that every free gets back the
/// handle its allocation got, with its size.
#[derive(Default)]
struct Recorder {
    next: u64,
    live: std::collections::HashMap<u64, u64>,
    calls: Vec<(bool, u64, u16)>,
    fail_at_call: Option<usize>,
    /// `Some`: counts as upstream allocations the allocations of the
    /// warm-up and of the passes after the first timed one.
    upstream: Option<u64>,
    pass: usize,
}

impl Replayer for Recorder {
    type Handle = u64;
    fn vacant(&self) -> u64 {
        0
    }
    fn allocate(&mut self, size: u64, stream: u16) -> Result<u64, Error> {
        if self.fail_at_call == Some(self.calls.len()) {
            return Err(Error::OutOfMemory {
                requested: size,
                largest_free: 0,
                pool_size: 0,
                max_size: None,
            });
        }
        self.calls.push((true, size, stream));
        if let Some(n) = self.upstream.as_mut().filter(|_| self.pass != 1) {
            *n += 1;
        }
        self.next += 1;
        self.live.insert(self.next, size);
        Ok(self.next)
    }
    fn deallocate(&mut self, handle: u64, size: u64, stream: u16) -> Result<(), Error> {
        assert_eq!(
            self.live.remove(&handle),
            Some(size),
            "free of handle {handle} that is not live with this size"
        );
        self.calls.push((false, size, stream));
        Ok(())
    }
    fn peak_upstream(&self) -> u64 {
        12345
    }
    fn upstream_allocations(&self) -> Option<u64> {
        self.upstream
    }
    fn begin_pass(&mut self, pass: usize) {
        self.pass = pass;
    }
}

fn small() -> Workload {
    let t = "0,1,allocate,0x10,100,s0\n0,2,allocate,0x20,200,s1\n0,3,free,0x10,100,s1\n0,4,allocate,0x30,300,s0\n";
    parse_trace("t", t.as_bytes()).unwrap()
}

#[test]
fn replay_runs_warm_up_then_timed_pass_in_op_order() {
    let w = small();
    let mut r = Recorder::default();
    let mut seen = Vec::new();
    let m = replay(&mut r, &w, 1, &mut |n| seen.push(n)).unwrap();
    let once: Vec<_> = w.ops.iter().map(|o| (o.alloc, o.size, o.stream)).collect();
    assert_eq!(r.calls, [once.clone(), once].concat());
    assert!(r.live.is_empty());
    assert_eq!(seen, [w.ops.len(), w.ops.len()]);
    assert_eq!((m.ops, m.peak_live, m.peak_upstream), (w.ops.len() as u64, 500, 12345));
    assert_eq!(m.footprint(), Some(12345.0 / 500.0));
    assert_eq!(m.upstream_allocations_per_pass, None, "not counted by default");
}

/// Upstream allocations: those of the timed passes (not the warm-up's),
/// over the number of timed passes.
#[test]
fn upstream_allocations_are_the_timed_passes_mean() {
    let w = small();
    let mut r = Recorder { upstream: Some(0), ..Recorder::default() };
    let m = replay(&mut r, &w, 4, &mut |_| {}).unwrap();
    // Three allocations a pass, counted in the warm-up and timed passes 2..4:
    // 9 in the timed passes, over 4 (the median pass would say 3).
    assert_eq!(r.upstream, Some(12));
    assert_eq!(m.upstream_allocations_per_pass, Some(2.25));
}

/// A `trace` line per op: `(alloc, pointer, size)`.
fn trace(ops: &[(bool, u64, u64)]) -> Workload {
    let mut t = String::new();
    for (i, (alloc, ptr, size)) in ops.iter().enumerate() {
        let what = if *alloc { "allocate" } else { "free" };
        t.push_str(&format!("0,{i},{what},{ptr:#x},{size},0\n"));
    }
    parse_trace("t", t.as_bytes()).unwrap()
}

/// Replays `text` over the tool's builder, as `memres replay --stack`.
fn stack(text: &str, w: &Workload, passes: u32, threads: Option<u32>) -> Measurement {
    let options = crate::resources::RunOptions { passes, threads, ..Default::default() };
    crate::stack::run_stack(text, w, &options, &mut |_| {}).unwrap()
}

/// A default pool grows in the warm-up and not after: 0 upstream
/// allocations a pass, typed or built by the builder, over `sim` or `host`;
/// a vpool's are its commits of granules.
/// The compact policy (large blocks in chunks of their own, free chunks
/// given back rather than grow past the peak in use) gives the free 20 MiB
/// chunk back to take one of 30 MiB, and that one back for 20 MiB in the
/// next pass: two upstream allocations every pass.
#[test]
fn a_warm_pool_allocates_nothing_upstream_and_a_compact_one_churns() {
    const MIB: u64 = 1 << 20;
    let steady = trace(&[(true, 0x10, 1000), (true, 0x20, 5000), (false, 0x10, 1000), (false, 0x20, 5000)]);
    for text in ["pool(sim)", "pool(host)", "stats(pool(sim))", "pool(limit(sim, 1TiB))", "binning(sim)"] {
        let m = stack(text, &steady, 3, None);
        assert_eq!(m.upstream_allocations_per_pass, Some(0.0), "{text}");
    }
    let churn = trace(&[
        (true, 0x10, 20 * MIB),
        (false, 0x10, 20 * MIB),
        (true, 0x20, 30 * MIB),
        (false, 0x20, 30 * MIB),
    ]);
    let compact = "pool(sim, growth=32, granule=2MiB, large=16MiB, release=peak)";
    let m = stack(compact, &churn, 3, None);
    assert_eq!(m.upstream_allocations_per_pass, Some(2.0), "{m:?}");
    // A vpool counts the granules it commits (maps): a warm one maps
    // nothing; with a release threshold of 0 it maps again every pass.
    assert_eq!(stack("vpool(sim(1TiB))", &steady, 3, None).upstream_allocations_per_pass, Some(0.0));
    let unkept = stack("vpool(sim(1TiB), release_threshold=0)", &churn, 3, None);
    assert_eq!(unkept.upstream_allocations_per_pass, Some(2.0), "{unkept:?}");
    // Not counted on threads.
    assert_eq!(stack("pool(sim)", &steady, 1, Some(2)).upstream_allocations_per_pass, None);
}

/// A `planned` stack steps before each pass, and after the last one, which
/// ends that pass's step: a step that lays a plan out for a pass that never
/// runs takes its region then. No pass held it, so the figures leave it
/// out: `--passes 1` gave this one 51 allocations a pass (50 and the region)
/// and a peak 1,024 bytes above what the replay held.
#[test]
fn figures_leave_out_the_region_a_step_after_the_last_pass_takes() {
    let w = Workload::load("random:50:10000:4").unwrap();
    let (planned, alone) = (stack("planned(sim)", &w, 1, None), stack("sim", &w, 1, None));
    // The warm-up and the timed pass are recorded: every block from `sim`.
    assert_eq!(planned.upstream_allocations_per_pass, Some(50.0));
    assert_eq!(planned.peak_upstream, alone.peak_upstream);
}

#[test]
fn progress_comes_in_chunks() {
    let w = Workload::load("random:70000:1000:3").unwrap();
    let mut seen = Vec::new();
    replay(&mut Recorder::default(), &w, 1, &mut |n| seen.push(n)).unwrap();
    let tail = w.ops.len() - 2 * CHUNK;
    assert_eq!(w.ops.len(), 140_000);
    assert_eq!(seen, [CHUNK, CHUNK, tail, CHUNK, CHUNK, tail]);
}

#[test]
fn a_failing_op_stops_the_replay_with_its_index() {
    let w = small();
    let mut r = Recorder { fail_at_call: Some(6 + 3), ..Recorder::default() };
    let Err(RunError::Replay(err)) = replay(&mut r, &w, 1, &mut |_| {}) else { panic!("no op failed") };
    // Call 8 is the timed pass's op 3 (the warm-up made 6 calls).
    assert_eq!((err.op, err.alloc, err.size), (3, true, 300));
    assert!(err.to_string().starts_with("op 3 (allocation of 300 B) failed: out of memory"), "{err}");
    // The block of id 1, still live when the pass stopped, is freed: a
    // resource's leak report names no block of the replay's.
    assert!(r.live.is_empty(), "left live: {:?}", r.live);
    assert_eq!(r.calls.last(), Some(&(false, 200, 1)), "freed on its allocation's stream");
}

/// A threaded replay that stops at a failed op frees what each of its
/// passes holds.
#[test]
fn a_threaded_replay_stopped_by_a_failed_op_frees_what_it_holds() {
    use memres_core::adaptor::Tracking;
    use memres_sim::SimDevice;
    let w = small();
    // 3 allocations a pass: the warm-up's, the counted round's (2
    // threads), the timed round's.
    for fail_at in 1..=3 + 6 + 6 {
        let dev = SimDevice::new(1 << 30);
        let tracked = Tracking::new(&dev);
        dev.fail_nth(fail_at);
        let streams: Vec<()> = vec![(); 2];
        let e = replay_threads(&tracked, streams, &w, 1, &|_| {}, |_| 0);
        assert!(e.is_err(), "call {fail_at}");
        assert_eq!(tracked.get_allocated_bytes(), 0, "call {fail_at}: {:?}", e);
        assert!(tracked.get_outstanding_allocations().is_empty());
    }
}

#[test]
fn pass_replays_once() {
    let w = small();
    let mut r = Recorder::default();
    let mut handles = vec![0; w.ids as usize];
    pass(&mut r, &w, &mut handles).unwrap();
    assert_eq!(r.calls.len(), w.ops.len());
    assert!(r.live.is_empty());
}

#[test]
fn figures_of_an_empty_workload() {
    let m = Measurement {
        ops: 0,
        passes: 1,
        elapsed: Duration::ZERO,
        fastest: Duration::ZERO,
        cpu: None,
        peak_live: 0,
        peak_upstream: 0,
        upstream_allocations_per_pass: None,
    };
    assert_eq!((m.ns_per_op(), m.footprint()), (0.0, None));
    let m = Measurement {
        ops: 4,
        passes: 1,
        elapsed: Duration::from_nanos(100),
        fastest: Duration::from_nanos(60),
        cpu: Some(Duration::from_nanos(80)),
        peak_live: 10,
        peak_upstream: 20,
        upstream_allocations_per_pass: Some(0.0),
    };
    assert_eq!((m.ns_per_op(), m.best_ns_per_op(), m.footprint()), (25.0, 15.0, Some(2.0)));
    assert_eq!(m.cpu_ns_per_op(), Some(20.0));
}

#[test]
fn more_passes_replay_more_and_report_one_pass() {
    let w = small();
    let mut r = Recorder::default();
    let mut seen = 0;
    let m = replay(&mut r, &w, 4, &mut |n| seen += n).unwrap();
    assert_eq!(r.calls.len(), 5 * w.ops.len());
    assert_eq!(seen, 5 * w.ops.len());
    assert_eq!((m.ops, m.passes), (w.ops.len() as u64, 4));
    assert!(m.fastest <= m.elapsed);
    // Zero passes means one.
    let m = replay(&mut Recorder::default(), &w, 0, &mut |_| {}).unwrap();
    assert_eq!(m.passes, 1);
}

#[cfg(target_os = "linux")]
#[test]
fn cpu_time_is_measured_on_linux() {
    let a = thread_cpu_time().unwrap();
    // Burn a little CPU: the thread's clock moves forward.
    let mut x = 0u64;
    for i in 0..2_000_000u64 {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
    }
    let b = thread_cpu_time().unwrap();
    assert!(b > a, "{a:?} -> {b:?} ({x})");
    let w = Workload::load("random:1000:5000:1").unwrap();
    let m = replay(&mut Recorder::default(), &w, 3, &mut |_| {}).unwrap();
    assert!(m.cpu.is_some());
}

/// With threads, the held peak is read right after the round that counts
/// the live bytes, not after the timed rounds: both figures cover the same
/// ops. Here the "held peak" is the number of allocations so far, which
/// only grows: the warm-up's one and the counted round's two, whatever the
/// timed rounds do after them.
#[test]
fn with_threads_the_held_peak_is_that_of_the_counted_round() {
    struct Counting(AtomicU64);
    impl MemoryResource for Counting {
        fn allocate(&self, request: Request, _: &()) -> memres_core::Result<Block> {
            let n = self.0.fetch_add(1, Ordering::Relaxed);
            Ok(Block::new((n + 1) << 20, request.size(), 0))
        }
        fn deallocate(&self, _: Block, _: &()) -> memres_core::Result<()> {
            Ok(())
        }
    }
    let w = trace(&[(true, 0x10, 1000), (false, 0x10, 1000)]);
    let counting = Counting(AtomicU64::new(0));
    let m = replay_threads(&counting, vec![(), ()], &w, 3, &|_| {}, |c| c.0.load(Ordering::Relaxed)).unwrap();
    assert_eq!(m.peak_upstream, 3, "{m:?}");
    assert_eq!(counting.0.load(Ordering::Relaxed), 3 + 3 * 2, "the timed rounds ran after it");
    assert!(m.peak_live == 1000 || m.peak_live == 2000, "{m:?}");
}

/// What a pass holds where it stopped: the blocks allocated and not freed
/// before, the last first; a free the resource refused is not asked again.
#[test]
fn held_blocks_are_those_allocated_and_not_freed_before_the_stop() {
    let w = small();
    let ids = |stopped, refused| {
        let held = held(&w.ops, stopped, refused, 3).expect("a table of 3 ids");
        held.map(|op| (op.id, op.size)).collect::<Vec<_>>()
    };
    assert_eq!(ids(0, true), []);
    assert_eq!(ids(2, false), [(1, 200), (0, 100)], "stopped after op 1");
    assert_eq!(ids(2, true), [(1, 200)], "op 2, the free of id 0, refused");
    assert_eq!(ids(3, true), [(1, 200)], "op 3, an allocation, failed");
    assert_eq!(ids(w.ops.len(), false), [], "a whole pass frees everything");
}

/// The table that finds the blocks a stopped pass holds has an entry per
/// id of the trace: one that cannot be allocated is a [`TableError`], as
/// the replay's own tables are, not an abort. (Asked for more ids than any
/// allocation can hold, it fails without taking memory: under a limit of
/// the process's memory, a table of a large trace's ids fails the same
/// way.) A replay stopped there leaves its blocks to the resource, and its
/// error says so. Before, `vec!` panicked (capacity overflow) or aborted
/// the process (out of memory).
#[test]
fn held_blocks_whose_table_does_not_fit_are_a_table_error() {
    let w = small();
    let Err(e) = held(&w.ops, 2, true, usize::MAX) else { panic!("a table of usize::MAX ids was allocated") };
    assert_eq!(e, TableError { of: TableOf::Held, ids: usize::MAX, bytes: usize::MAX as u64 });
    assert!(
        e.to_string().starts_with("cannot allocate the table of the blocks a stopped replay holds: "),
        "{e}"
    );
    // Handles of no size: a table of usize::MAX of them takes no memory,
    // and `held`'s, of as many ids, cannot be allocated.
    struct Unit(usize);
    impl Replayer for Unit {
        type Handle = ();
        fn vacant(&self) {}
        fn allocate(&mut self, _: u64, _: u16) -> Result<(), Error> {
            Ok(())
        }
        fn deallocate(&mut self, (): (), _: u64, _: u16) -> Result<(), Error> {
            self.0 += 1;
            Ok(())
        }
        fn peak_upstream(&self) -> u64 {
            0
        }
    }
    let mut unit = Unit(0);
    let error = ReplayError {
        op: 2,
        alloc: false,
        size: 100,
        error: Error::UnknownBlock { addr: 0x10 },
        unfreed: None,
    };
    let e = free_held(&mut unit, &w.ops, error, &[(); usize::MAX]);
    assert_eq!(e.unfreed.as_ref().map(|t| t.of), Some(TableOf::Held));
    let text = e.to_string();
    assert!(
        text.contains("; the blocks it held are left to the resource: cannot allocate the table of"),
        "{text}"
    );
    assert_eq!(unit.0, 0, "no block was asked to be freed");
}

/// With threads, a round's wall time spans every op of the round: it is
/// read by the workers themselves, from the earliest start to the latest
/// end. The resource reads the clock at each call, under a lock that
/// orders the readings: each round's span from its first call to its last
/// is a lower bound of its wall time, whatever the scheduler does. (The
/// main thread read the clock once woken after the start barrier, on a
/// busy machine after most of the round: 4.98 ns/op against 236.9 CPU.)
#[test]
fn with_threads_a_rounds_wall_time_covers_all_its_ops() {
    struct Clocked(std::sync::Mutex<Vec<Instant>>);
    impl MemoryResource for Clocked {
        fn allocate(&self, request: Request, _: &()) -> memres_core::Result<Block> {
            let mut calls = self.0.lock().unwrap();
            calls.push(Instant::now());
            Ok(Block::new((calls.len() as u64) << 20, request.size(), 0))
        }
        fn deallocate(&self, _: Block, _: &()) -> memres_core::Result<()> {
            let mut calls = self.0.lock().unwrap();
            calls.push(Instant::now());
            Ok(())
        }
    }
    let w = Workload::load("random:1000:1000:1").unwrap();
    let (threads, passes) = (8, 15);
    let clocked = Clocked(std::sync::Mutex::new(Vec::new()));
    let m = replay_threads(&clocked, vec![(); threads], &w, passes, &|_| {}, |_| 0).unwrap();
    let calls = clocked.0.into_inner().unwrap();
    let (n, round) = (w.ops.len(), w.ops.len() * threads);
    // The warm-up on one thread and the counted round come first.
    assert_eq!(calls.len(), n + round * (1 + passes as usize));
    let mut spans: Vec<Duration> =
        calls[n + round..].chunks(round).map(|c| c[c.len() - 1].duration_since(c[0])).collect();
    spans.sort_unstable();
    // Each round's wall time is at least its span, so the fastest and the
    // median rounds' are at least the shortest and the median span.
    assert!(m.fastest >= spans[0], "fastest round {:?}, spans {spans:?}", m.fastest);
    assert!(m.elapsed >= spans[spans.len() / 2], "median round {:?}, spans {spans:?}", m.elapsed);
}

/// A thread's `setup` that panics (before the start gate) lets the round's
/// other threads go, and its panic reaches the caller: before, they and the
/// caller waited at the gate for ever (the channel's timeout only keeps
/// such a hang from hanging the test run).
#[test]
fn a_setup_that_panics_on_a_thread_lets_the_round_go_and_reaches_the_caller() {
    use memres_sim::SimDevice;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let w = small();
        let dev = SimDevice::new(1 << 30);
        let setup = |i: usize| assert!(i != 1, "setup of thread 1");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            replay_threads(&dev, vec![(); 2], &w, 1, &setup, |_| 0).is_ok()
        }));
        let message = r.err().and_then(|p| p.downcast_ref::<&str>().map(|m| m.to_string()));
        let _ = tx.send(message);
    });
    let message = rx.recv_timeout(std::time::Duration::from_secs(20));
    let message = message.expect("replay_threads still waiting 20 s after thread 1's setup panicked");
    assert_eq!(message.as_deref(), Some("setup of thread 1"));
}
