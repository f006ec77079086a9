//! Host memory the core's own books cannot have, under a limit of the
//! process's address space (`ulimit -v`), which a child of this binary
//! runs under (the limit is the whole process's, and the other tests run
//! in threads of it): an error, not an abort.
#![cfg(all(feature = "std", unix, not(miri)))]

use memres_core::vmem::{CountingSpace, ReservableSpace};
use memres_core::Error;
use std::process::Command;

/// Set in the child, which then runs the test's own part.
const CHILD: &str = "MEMRES_HOST_MEMORY_LIMIT_CHILD";

/// A reservation of 2^44 bytes in 256-byte granules needs a bitmap of
/// 8 GiB, past the child's 2 GB of address space: `OutOfMemory`, the
/// space unchanged (a reservation that fits is still made, where the
/// refused one would have started). Before, `vec!` aborted the process
/// (`memory allocation of 8589934592 bytes failed`).
#[test]
fn a_reservation_whose_bitmap_the_host_cannot_hold_is_out_of_memory() {
    if std::env::var_os(CHILD).is_some() {
        let space = CountingSpace::new(1 << 40, 256);
        let e = space.reserve(1 << 44).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { requested, .. } if requested == 1 << 44), "{e}");
        assert_eq!(space.reservation_count(), 0);
        let r = space.reserve(1 << 20).unwrap();
        assert_eq!(r.start(), CountingSpace::BASE);
        println!("done");
        return;
    }
    let out = Command::new("sh")
        .args(["-c", "ulimit -v 2000000 && exec \"$0\" \"$@\""])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "a_reservation_whose_bitmap_the_host_cannot_hold_is_out_of_memory", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.contains("done"), "{:?}: {said}", out.status);
}
