//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the
//! harness on stable Rust, and runs each target over a few hundred
//! pseudo-random inputs.

use memres_core::testing::SplitMix64;
use memres_tests::fuzz;
use std::path::PathBuf;

use fuzz::TARGETS;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target)
}

/// The committed inputs of `target`, sorted.
fn corpus_files(target: &str) -> Vec<PathBuf> {
    let dir = corpus_dir(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("target {target} has no corpus at {}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "target {target} has an empty corpus at {}", dir.display());
    files
}

fn replay(target: &str, run: fuzz::Target) {
    for file in &corpus_files(target) {
        let data = std::fs::read(file).expect("read corpus file");
        let got = std::panic::catch_unwind(|| run(&data));
        assert!(got.is_ok(), "target {target}: corpus file {} fails", file.display());
    }
}

/// Every committed input of every target in `fuzz::TARGETS`.
#[test]
fn corpus_of_every_target() {
    for &(name, run) in TARGETS {
        replay(name, run);
    }
}

/// The `callback` target's committed inputs reach what its oracles judge:
/// a retry that serves an allocation once the callback made room, a
/// callback that declines, retries used up, frees the device refuses, and
/// bad blocks of the allocate closure.
#[test]
fn the_callback_corpus_retries_declines_and_meets_refused_frees_and_bad_blocks() {
    let mut reached = fuzz::CallbackOutcomes::default();
    for file in &corpus_files("callback") {
        reached += fuzz::callback_outcomes(&std::fs::read(file).expect("read corpus file"));
    }
    let fuzz::CallbackOutcomes { served_on_retry, declined, retries_used_up, refused_frees, bad_blocks } =
        reached;
    assert!(
        [served_on_retry, declined, retries_used_up, refused_frees, bad_blocks].iter().all(|&n| n > 0),
        "the callback corpus misses an outcome: {reached:?}"
    );
}

/// The `stack_string` target's committed inputs move freed memory to
/// another stream in stacks that promise stream order, where the
/// happens-before checker judges each such reuse, and race in stacks that
/// do not, where it sees the reuse unordered: the check has work to do.
#[test]
fn the_stack_string_corpus_reuses_memory_across_streams_ordered_where_promised() {
    let mut seen = fuzz::StackOrder::default();
    for file in &corpus_files("stack_string") {
        seen += fuzz::stack_string_order(&std::fs::read(file).expect("read corpus file"));
    }
    assert!(
        seen.ordered_reuses > 0 && seen.races_unpromised > 0,
        "the stack_string corpus misses a reuse across streams: {seen:?}"
    );
}

#[test]
fn every_fuzz_target_is_replayed() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/fuzz_targets");
    for entry in std::fs::read_dir(&dir).expect("fuzz_targets folder") {
        let path = entry.expect("entry").path();
        let name = path.file_stem().and_then(|s| s.to_str()).expect("target name");
        assert!(TARGETS.iter().any(|(t, _)| *t == name), "fuzz target {name} is missing from corpus.rs");
        assert!(corpus_dir(name).is_dir(), "fuzz target {name} has no corpus");
    }
}

#[test]
fn random_inputs() {
    let mut rng = SplitMix64::new(0x5eed);
    for &(_, run) in TARGETS {
        for _ in 0..200 {
            let len = rng.below(2048) as usize;
            let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            run(&data);
        }
    }
}
