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

/// A name with a control character (a trace's file name may hold a line
/// break, a stack's text too) is escaped in the map's heading and in the
/// notes as in the table, so that each stays one line. Before, the heading
/// and the snapshot's note broke in two.
#[test]
fn the_map_heading_and_the_notes_escape_control_characters() {
    let dir = std::env::temp_dir().join(format!("memres-watch-names-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut w = Workload::load("random:50:1000:1").unwrap();
    w.name = "a\nb\u{1b}".into();
    let targets = [
        Target { name: "pool(\tsim)".into(), stack: Some("pool(\tsim)".into()), watched: true },
        Target { name: "off\nset".into(), stack: None, watched: false },
    ];
    let outputs = Outputs { snapshot: Some(dir.join("s.pickle")), map: true, ..Outputs::default() };
    let written = write(&targets, std::slice::from_ref(&w), &outputs);
    let _ = std::fs::remove_dir_all(&dir);
    let (map, notes) = written.unwrap_or_else(|e| panic!("{e}"));
    assert!(map.starts_with("map of pool(\\tsim) on a\\nb\\u{1b} at the peak ("), "{map}");
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes[0].contains("(pool(\\tsim) on a\\nb\\u{1b}, at the peak"), "{notes:?}");
    assert!(notes[1].starts_with("off\\nset is not a memres stack"), "{notes:?}");
    assert!(notes.iter().all(|n| !n.contains(char::is_control)), "{notes:?}");
}

/// A snapshot that cannot be written after others were (a full disk; here
/// a directory in its place) fails the run with its file, and the notes of
/// the files written before it stay, to be printed. Before, they were lost
/// with the error: `s-0.pickle` written and not said.
#[test]
fn a_file_that_cannot_be_written_keeps_the_notes_of_those_written() {
    let dir = std::env::temp_dir().join(format!("memres-watch-unwritten-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("s-1.pickle")).unwrap();
    let w = [Workload::load("random:50:1000:1").unwrap(), Workload::load("random:50:1000:2").unwrap()];
    let targets = [Target { name: "pool".into(), stack: Some("pool(sim)".into()), watched: true }];
    let outputs = Outputs { snapshot: Some(dir.join("s.pickle")), ..Outputs::default() };
    let written = write(&targets, &w, &outputs);
    let _ = std::fs::remove_dir_all(&dir);
    let e = written.unwrap_err();
    assert!(e.error.starts_with("cannot write ") && e.error.contains("s-1.pickle"), "{}", e.error);
    assert_eq!(e.notes.len(), 1, "{:?}", e.notes);
    assert!(e.notes[0].starts_with("wrote snapshot ") && e.notes[0].contains("s-0.pickle"), "{:?}", e.notes);
}

/// A snapshot's numbered name keeps the bytes of the name asked for: one
/// not UTF-8 had them replaced (`\xff` by U+FFFD), and wrote, and checked,
/// another file than the one named.
#[cfg(unix)]
#[test]
fn a_numbered_name_keeps_bytes_that_are_not_utf8() {
    use std::os::unix::ffi::OsStrExt;
    let path = Path::new(std::ffi::OsStr::from_bytes(b"dir/\xffs.pic\xfekle"));
    assert_eq!(numbered(path, 1, 2).as_os_str().as_bytes(), b"dir/\xffs-1.pic\xfekle");
    let bare = Path::new(std::ffi::OsStr::from_bytes(b"\xff"));
    assert_eq!(numbered(bare, 0, 2).as_os_str().as_bytes(), b"\xff-0");
    assert_eq!(numbered(bare, 0, 1), bare);
}
