//! A process that forks while its `log` stack has rows buffered, and
//! another thread logging: the child's exit writes none of the parent's
//! rows again, and does not wait for a log another thread held (its own
//! process: the stack is process-wide).

mod common;

use memres::memres_flush;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

extern "C" {
    fn fork() -> i32;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn kill(pid: i32, signal: i32) -> i32;
    fn exit(code: i32) -> !;
}

const WNOHANG: i32 = 1;
const SIGKILL: i32 = 9;

#[test]
fn a_forked_childs_exit_writes_no_row_of_the_parent_again() {
    let path = std::env::temp_dir().join(format!("memres-capi-log-fork-{}.csv", std::process::id()));
    let stack = format!("log(stats(pool(async)), file={})", path.display());
    assert_eq!(memres::configure(&stack), Ok(()));
    if common::gpu("a_forked_childs_exit_writes_no_row_of_the_parent_again").is_none() {
        return;
    }
    // Rows buffered at the fork: three allocations.
    let blocks: Vec<_> = (1..=3).map(|i| (common::alloc(i * 4096), i * 4096)).collect();
    // And a thread logging all the while, whose row may be half-way at the fork.
    let stop = Arc::new(AtomicBool::new(false));
    let logging = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                common::free(common::alloc(256), 256);
                rounds += 1;
            }
            rounds
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    // SAFETY: the child calls `exit` only: the C library's exit handlers
    // run (memres's flush among them), nothing else of this process.
    let child = unsafe { fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        // SAFETY: as above.
        unsafe { exit(0) };
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut status = 0;
    // SAFETY: waits for this process's own child, into a local.
    while unsafe { waitpid(child, &mut status, WNOHANG) } == 0 {
        if Instant::now() > deadline {
            // SAFETY: this process's own child.
            unsafe { kill(child, SIGKILL) };
            panic!("the child's exit hung for 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(status, 0, "the child's exit status");
    stop.store(true, Ordering::Relaxed);
    let rounds = logging.join().unwrap();
    for (p, s) in blocks {
        common::free(p, s);
    }
    assert_eq!(memres_flush(), 0, "{}", memres::last_error());
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let headers = text.lines().filter(|l| *l == memres_core::trace::HEADER).count();
    assert_eq!(headers, 1, "the header was written again");
    let rows: Vec<Vec<&str>> = text.lines().skip(1).map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len() as u64, 6 + 2 * rounds, "rows written twice (or lost)");
    // Each address alternates: allocated, freed, allocated...
    let mut live = HashMap::new();
    for r in &rows {
        let was = live.insert(r[3], r[2]);
        assert_ne!(was, Some(r[2]), "{} twice in a row at {}", r[2], r[3]);
    }
}
