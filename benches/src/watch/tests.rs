use super::*;
use crate::replay::{TableError, TableOf};

/// A watched pair whose second replay, to the peak, fails (its table of
/// handles refused where the first replay's fit) is noted as the first
/// replay's failure is, naming its stack and workload, and the other pairs
/// and the notes of the files already written stay. Before, the run
/// stopped with the bare error (`cannot allocate a watched replay's table
/// of handles: ...`), the notes of the snapshots written lost.
#[test]
fn a_replay_to_the_peak_that_fails_is_noted_with_its_pair() {
    let dir = std::env::temp_dir().join(format!("memres-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut workloads =
        [Workload::load("random:50:1000:1").unwrap(), Workload::load("random:50:1000:2").unwrap()];
    workloads[0].name = "a".into();
    workloads[1].name = "b".into();
    let targets = [Target { name: "pool".into(), stack: Some("pool(sim)".into()), watched: true }];
    let outputs = Outputs { snapshot: Some(dir.join("s.pickle")), map: true, ..Outputs::default() };
    let refused = |text: &str, w: &Workload, stop: Option<u64>| match (w.name.as_str(), stop) {
        ("b", Some(_)) => Err(RunError::Table(TableError { of: TableOf::Watched, ids: 50, bytes: 800 })),
        _ => observe(text, w, stop),
    };
    let written = write_with(&targets, &workloads, &outputs, &refused);
    let _ = std::fs::remove_dir_all(&dir);
    let (map, notes) = written.unwrap_or_else(|e| panic!("{e}"));
    assert!(map.starts_with("map of pool on a at the peak"), "{map}");
    assert!(!map.contains(" on b "), "{map}");
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes[0].starts_with("wrote snapshot ") && notes[0].contains("(pool on a, "), "{notes:?}");
    let refused = "pool on b: cannot allocate a watched replay's table of handles: 800 B for 50 ids: \
                   no timeline, snapshot or map";
    assert_eq!(notes[1], refused);
}
