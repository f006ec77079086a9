use super::*;

/// A folder of its own, removed on drop.
struct Folder(PathBuf);

impl Folder {
    fn new(name: &str) -> Folder {
        let dir = std::env::temp_dir().join(format!("memres-paths-{}-{name}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        Folder(dir)
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn one_file_under_any_name_is_the_same_and_two_are_not() {
    let dir = Folder::new("same");
    let (a, b) = (dir.0.join("a.csv"), dir.0.join("b.csv"));
    fs::write(&a, "x").unwrap();
    fs::write(&b, "x").unwrap();
    fs::create_dir(dir.0.join("sub")).unwrap();
    assert!(same_file(&a, &a));
    assert!(same_file(&a, &dir.0.join("sub/../a.csv")), "another spelling");
    assert!(!same_file(&a, &b), "two files of the same text");
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&a, dir.0.join("link.csv")).unwrap();
        fs::hard_link(&a, dir.0.join("hard.csv")).unwrap();
        assert!(same_file(&dir.0.join("link.csv"), &a), "a symbolic link");
        assert!(same_file(&dir.0.join("hard.csv"), &a), "a hard link");
        assert!(!same_file(Path::new("/dev/null"), Path::new("/dev/null")), "a device is no file to keep");
    }
    // Files not made yet: by their folder and name.
    let new = dir.0.join("new.html");
    assert!(same_file(&new, &dir.0.join("sub/../new.html")));
    assert!(!same_file(&new, &dir.0.join("other.html")));
    assert!(!same_file(&new, &a), "one there, one not");
}

#[test]
fn an_output_clashing_with_a_workload_or_another_output_is_named_with_it() {
    let dir = Folder::new("distinct");
    let trace = dir.0.join("t.csv");
    fs::write(&trace, "x").unwrap();
    fs::create_dir(dir.0.join("sub")).unwrap();
    let input = [Named::new(&trace, "the workload t.csv")];
    let timeline = Named::new(dir.0.join("sub/../t.csv"), "--timeline t.csv");
    let e = check_distinct(&input, &[timeline], &[]).unwrap_err();
    assert_eq!(e, "--timeline t.csv and the workload t.csv are the same file: it would be overwritten");
    let (x, y) = (
        Named::new(dir.0.join("x.csv"), "--snapshot x.csv"),
        Named::new(dir.0.join("x.csv"), "--timeline x.csv"),
    );
    let e = check_distinct(&input, &[x.clone(), y], &[]).unwrap_err();
    assert!(e.starts_with("--snapshot x.csv and --timeline x.csv"), "{e}");
    let log = Named::new(&trace, "the log t.csv");
    assert!(check_distinct(&input, &[], std::slice::from_ref(&log))
        .unwrap_err()
        .starts_with("the log t.csv and the workload"));
    assert!(check_distinct(
        &[],
        std::slice::from_ref(&x),
        &[Named::new(dir.0.join("x.csv"), "the log x.csv")]
    )
    .is_err());
    // Two logs may be one file; distinct files pass.
    assert_eq!(check_distinct(&[], &[], &[log.clone(), log]), Ok(()));
    assert_eq!(check_distinct(&input, &[x], &[Named::new(dir.0.join("l.csv"), "the log l.csv")]), Ok(()));
}

/// A symbolic link to a file not made yet is that file: writing either
/// writes the one file (a `--snapshot` through a dangling link to the
/// `--timeline` file was overwritten by it, with no clash told).
#[cfg(unix)]
#[test]
fn a_dangling_link_is_the_file_it_leads_to() {
    let dir = Folder::new("dangling");
    fs::create_dir(dir.0.join("sub")).unwrap();
    let target = dir.0.join("t.csv");
    std::os::unix::fs::symlink("t.csv", dir.0.join("link.csv")).unwrap();
    std::os::unix::fs::symlink("../link.csv", dir.0.join("sub/chain.csv")).unwrap();
    assert!(same_file(&dir.0.join("link.csv"), &target), "a relative link");
    assert!(same_file(&dir.0.join("sub/chain.csv"), &target), "a chain of links");
    assert!(!same_file(&dir.0.join("link.csv"), &dir.0.join("other.csv")));
    std::os::unix::fs::symlink("loop.csv", dir.0.join("loop.csv")).unwrap();
    assert!(!same_file(&dir.0.join("loop.csv"), &target), "a loop leads nowhere");
    let (snapshot, timeline) =
        (Named::new(dir.0.join("link.csv"), "--snapshot link.csv"), Named::new(&target, "--timeline t.csv"));
    assert!(check_distinct(&[], &[snapshot, timeline], &[]).is_err());
}

/// A log through a symbolic link to a file not made yet is written through
/// it (its file is made where the link leads): the check follows the link
/// too, and leaves both as they were (it said "File exists", the link
/// being there).
#[cfg(unix)]
#[test]
fn a_file_not_made_yet_can_be_written_through_a_dangling_link() {
    let dir = Folder::new("writable");
    let link = dir.0.join("link.csv");
    std::os::unix::fs::symlink("t.csv", &link).unwrap();
    check_writable(&link).unwrap();
    assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays");
    assert!(!dir.0.join("t.csv").exists(), "nothing made");
    std::os::unix::fs::symlink("loop.csv", dir.0.join("loop.csv")).unwrap();
    assert!(check_writable(&dir.0.join("loop.csv")).is_err());
}

/// A log to a named pipe is checked without opening it: the open waited
/// for a reader, and with one there its close was the end of the stream
/// the reader saw, before the log opened the pipe again.
#[cfg(target_os = "linux")]
#[test]
fn a_named_pipe_is_checked_without_opening_it() {
    let dir = Folder::new("pipe");
    let pipe = dir.0.join("log.csv");
    assert!(std::process::Command::new("mkfifo").arg(&pipe).status().unwrap().success());
    let (tx, rx) = std::sync::mpsc::channel();
    let checked = pipe.clone();
    let check = std::thread::spawn(move || tx.send(check_writable(&checked).map_err(|e| e.to_string())));
    // A check that opened the pipe waits for a reader: one is made to end it.
    let answer = rx.recv_timeout(std::time::Duration::from_secs(20));
    if answer.is_err() {
        drop(fs::File::open(&pipe));
    }
    check.join().unwrap().unwrap();
    assert_eq!(answer, Ok(Ok(())), "the check opened the pipe");
}
