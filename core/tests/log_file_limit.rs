//! A stack's `log` layer over an old log that takes the room its trial
//! write needs: the process's limit of file size, which a child of this
//! binary runs under (the limit is the whole process's, and the other
//! tests run in threads of it).
#![cfg(all(feature = "std", unix))]

use memres_core::stack::{StackBuilder, Unbacked};
use memres_core::trace::{read_all, Action, HEADER};
use std::process::Command;

/// Set in the child to the log's path; the child then runs the test's
/// own part.
const CHILD: &str = "MEMRES_LOG_FILE_LIMIT_CHILD";

/// A stack whose `log` file holds more than the process may write to a
/// file (`ulimit -f`; the old log of a run that filled the disk is the
/// same case): its trial write after those rows fails (EFBIG), but the
/// build goes on, cuts the file and writes the new log. Before, the trial
/// refused the build ("File too large"), where cutting first, as
/// `Logging::to_file` does, left room.
#[test]
fn a_stack_whose_old_log_is_past_the_limit_of_file_size_cuts_it_and_starts() {
    if let Some(path) = std::env::var_os(CHILD) {
        let mut b = StackBuilder::<()>::new();
        b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
        let text = format!("pool(log(leaf, file={}), initial=1MiB)", path.to_str().unwrap());
        drop(b.build(&text, &()).unwrap());
        println!("done");
        return;
    }
    let path = std::env::temp_dir().join(format!("memres-log-limit-{}.csv", std::process::id()));
    std::fs::write(&path, vec![b'x'; 1 << 20]).unwrap();
    // At most 64 blocks (32 or 64 KiB, as the shell counts them) per file;
    // the signal of a write past it ignored (which an exec keeps), so that
    // the write fails instead.
    let out = Command::new("sh")
        .args(["-c", "trap '' XFSZ; ulimit -f 64 && exec \"$0\" \"$@\""])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_stack_whose_old_log_is_past_the_limit_of_file_size_cuts_it_and_starts",
            "--nocapture",
        ])
        .env(CHILD, &path)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    let log = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(out.status.success() && said.contains("done"), "{:?}: {said}", out.status);
    assert!(log.starts_with(format!("{HEADER}\n").as_bytes()));
    let rows = read_all(&log[..]).unwrap();
    assert_eq!(
        rows.iter().map(|r| (r.action, r.size)).collect::<Vec<_>>(),
        [(Action::Allocate, 1 << 20), (Action::Free, 1 << 20)]
    );
}
