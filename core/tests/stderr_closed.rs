//! What memres prints on standard error by itself (`Tracking`'s leak
//! report, the arena's dump on failure), where standard error cannot be
//! written. Each test runs this binary again, as a child that runs the
//! test alone with its standard error a pipe that nobody reads.
#![cfg(feature = "std")]

use memres_core::adaptor::Tracking;
use memres_core::arena::{ArenaConfig, ArenaResource, DumpTarget};
use memres_core::testing::BumpUpstream;
use memres_core::{Error, MemoryResource, Request};
use std::process::{Command, Stdio};

/// Set in the child, which then runs the test's own part.
const CHILD: &str = "MEMRES_STDERR_CLOSED_CHILD";

/// Runs `test` in a child with its standard error closed for reading;
/// asserts that the child ran `test` to its end (it prints `done`).
fn in_a_child_without_stderr(test: &str) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Nobody reads standard error from here on: a write to it fails.
    drop(child.stderr.take());
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}: {stdout}", out.status);
    assert!(stdout.contains("done"), "{stdout}");
}

/// A tracking adaptor with an outstanding block dropped while its thread
/// unwinds, whose report cannot be written (standard error a closed
/// pipe): the write's error is dropped. Before, `eprint!` panicked on it,
/// a second panic in a destructor, and the process aborted.
#[test]
fn a_leak_report_that_cannot_be_written_does_not_abort() {
    if std::env::var_os(CHILD).is_some() {
        let unwound = std::panic::catch_unwind(|| {
            let tracking = Tracking::new(BumpUpstream::new(1 << 20));
            let _leaked = tracking.allocate(Request::new(256).unwrap(), &()).unwrap();
            std::panic::resume_unwind(Box::new("unwinding with a leak"));
        });
        assert!(unwound.is_err());
        println!("done");
        return;
    }
    in_a_child_without_stderr("a_leak_report_that_cannot_be_written_does_not_abort");
}

/// An arena whose dump on failure goes to standard error, which cannot
/// be written: the allocation fails with its out-of-memory error all the
/// same. Before, `eprint!` panicked on the write's error.
#[test]
fn an_arena_dump_that_cannot_be_written_leaves_the_error() {
    if std::env::var_os(CHILD).is_some() {
        let config = ArenaConfig::new().dump_on_failure(DumpTarget::Stderr);
        let arena = ArenaResource::with_config(BumpUpstream::new(1 << 20), config, &()).unwrap();
        let e = arena.allocate(Request::new(64 << 20).unwrap(), &()).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { requested, .. } if requested == 64 << 20), "{e}");
        println!("done");
        return;
    }
    in_a_child_without_stderr("an_arena_dump_that_cannot_be_written_leaves_the_error");
}
