use super::*;

#[test]
fn every_held_out_name_is_a_trace_of_the_family_and_comes_last() {
    let dir = Path::new(DATA_DIR);
    let held = held_out_names(dir).unwrap();
    assert!(held.len() >= 3, "{held:?}");
    let traces = traces(dir).unwrap();
    let names: Vec<&str> = traces.iter().map(|p| trace_name(p).unwrap()).collect();
    for name in &held {
        assert!(names.contains(&name.as_str()), "{name} is held out but no trace of {DATA_DIR}");
    }
    let first_held = names.len() - held.len();
    assert!(names[..first_held].iter().all(|n| !held.iter().any(|h| h == n)), "{names:?}");
    assert!(traces[first_held..].iter().all(|p| is_held_out(p).unwrap()));
    assert!(traces[..first_held].iter().all(|p| !is_held_out(p).unwrap()));
}

#[test]
fn a_list_beside_the_traces_marks_them_and_orders_them_last() {
    let dir = std::env::temp_dir().join(format!("memres-family-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["b.csv.gz", "a.csv", "c.csv.gz", "notes.txt"] {
        std::fs::write(dir.join(f), "").unwrap();
    }
    assert!(!is_held_out(&dir.join("a.csv")).unwrap(), "no list: nothing is held out");
    std::fs::write(dir.join(HELD_OUT_FILE), "# held out\nb   # the second\n\n").unwrap();
    let names: Vec<String> =
        traces(&dir).unwrap().iter().map(|p| trace_name(p).unwrap().to_string()).collect();
    assert_eq!(names, ["a", "c", "b"]);
    assert!(is_held_out(&dir.join("b.csv.gz")).unwrap());
    assert!(!is_held_out(&dir.join("c.csv.gz")).unwrap());
    assert!(!is_held_out(Path::new("random:10:100:1")).unwrap(), "a generator spec");
    assert_eq!(trace_name(&dir.join("notes.txt")), None);
    // A list that cannot be read is an error, not "nothing held out".
    std::fs::remove_file(dir.join(HELD_OUT_FILE)).unwrap();
    std::fs::create_dir(dir.join(HELD_OUT_FILE)).unwrap();
    assert!(is_held_out(&dir.join("b.csv.gz")).is_err());
    assert!(traces(&dir).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A list saved with a byte-order mark (as some editors save text) names
/// its first trace all the same: the mark was part of the name, and that
/// trace passed for a tuning one.
#[test]
fn a_byte_order_mark_is_no_part_of_the_first_name() {
    let dir = std::env::temp_dir().join(format!("memres-family-bom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(HELD_OUT_FILE), "\u{feff}b\nc\n").unwrap();
    assert_eq!(held_out_names(&dir).unwrap(), ["b", "c"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A trace listed by its file name, extension and all, is held out as by
/// its name: it matched no trace, and passed, silently, for a tuning one.
#[test]
fn a_trace_listed_by_its_file_name_is_held_out() {
    let dir = std::env::temp_dir().join(format!("memres-family-ext-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["a.csv.gz", "b.csv.gz", "c.csv"] {
        std::fs::write(dir.join(f), "").unwrap();
    }
    std::fs::write(dir.join(HELD_OUT_FILE), "b.csv.gz\nc.csv\n").unwrap();
    assert!(is_held_out(&dir.join("b.csv.gz")).unwrap());
    assert!(is_held_out(&dir.join("c.csv")).unwrap());
    assert!(!is_held_out(&dir.join("a.csv.gz")).unwrap());
    let names: Vec<String> =
        traces(&dir).unwrap().iter().map(|p| trace_name(p).unwrap().to_string()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    std::fs::remove_dir_all(&dir).unwrap();
}
