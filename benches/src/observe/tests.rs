use super::*;

/// A replay stopped by a failed op, or after the op asked for, keeps a
/// sample of the ops since the last stride boundary: the bucket is pushed
/// where the replay stops, not only at a boundary or the last op (the ops
/// just before a failure, where the peak usually is, were lost: the last
/// sample was op 929 of a replay that failed at op 951).
#[test]
fn a_replay_that_stops_early_keeps_the_samples_of_its_last_ops() {
    let w = Workload::load("random:30000:4194304:1").unwrap();
    let stride = w.ops.len().div_ceil(SAMPLES) as u64;
    let o = observe("pool(sim(64MiB))", &w, None).unwrap();
    let failed = o.failure.as_ref().expect("64 MiB is too little").op;
    assert_ne!(failed % stride, 0, "the op before the failure ends no bucket: {failed}");
    assert_eq!(o.samples.last().map(|s| s.op), Some(failed - 1), "{:?}", o.samples.last());
    let peak = o.peak.unwrap();
    assert_eq!(o.samples.iter().map(|s| s.held).max(), Some(peak.held), "the samples keep the peak");
    // Stopped after an op that ends no bucket: its bucket is the last sample.
    let stop = 10 * stride + 3;
    let o = observe("pool(sim(64MiB))", &w, Some(stop)).unwrap();
    assert_eq!(o.samples.last().map(|s| s.op), Some(stop));
    assert_eq!(o.samples.len(), 11);
}

/// A stack with a watched leaf beside an unwatched one (a `vpool`) is
/// watched while only blocks of the unwatched part are live: the replay
/// runs on (it stopped saying the stack had no watched leaf at all).
#[test]
fn a_stack_with_a_watched_leaf_is_watched_while_only_unwatched_blocks_live() {
    let w = Workload::load("random:2000:2048:7").unwrap();
    let o = observe("binning(sim, bin(768, vpool(sim)))", &w, None);
    let o = o.unwrap_or_else(|e| panic!("{e}"));
    assert!(o.peak.is_some());
    // A stack with no watched leaf at all still says so.
    let e = observe("vpool(sim)", &w, None).unwrap_err().to_string();
    assert!(e.contains("has no sim or host leaf"), "{e}");
}
