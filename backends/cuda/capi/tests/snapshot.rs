//! `memres_snapshot` through its C signature. With `MEMRES_SNAPSHOT` set
//! and no device used yet it writes an empty snapshot, so this runs the same
//! with or without a GPU: the file is replaced whole, and a path it cannot
//! be put at is refused with nothing left behind; with a GPU, after an
//! allocation, the device's segment and block are in it (without one that
//! part is reported skipped, and fails under `MEMRES_REQUIRE_GPU`).

mod common;

use common::{alloc, free, gpu, try_alloc, MIB};
use memres::snapshot::{memres_snapshot, SNAPSHOT_VAR};
use std::ffi::CString;

fn snapshot(path: &std::path::Path) -> i32 {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated string.
    unsafe { memres_snapshot(c.as_ptr()) }
}

/// The int that `bytes` starts with, as the core's pickle writes one: `J`
/// and 4 bytes, or LONG1 (`0x8a`), its length and the bytes, little-endian
/// and signed.
fn pickled_int(bytes: &[u8]) -> i128 {
    let digits = match bytes[0] {
        b'J' => &bytes[1..5],
        0x8a => &bytes[2..2 + bytes[1] as usize],
        op => panic!("no int: opcode {op:#x}"),
    };
    let fill = if digits.last().is_some_and(|&b| b >= 0x80) { 0xff } else { 0 };
    let mut le = [fill; 16];
    le[..digits.len()].copy_from_slice(digits);
    i128::from_le_bytes(le)
}

/// The names in `dir`, sorted.
fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

// One test: the environment and the devices are process-wide.
#[test]
fn a_snapshot_needs_the_variable_is_written_whole_and_holds_what_was_allocated() {
    let dir = std::env::temp_dir().join(format!("memres-capi-snapshot-{}", std::process::id()));
    // Empty: the test counts what is in it.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.pickle");
    std::env::remove_var(SNAPSHOT_VAR);
    assert_eq!(snapshot(&path), -1);
    assert!(memres::last_error().contains(SNAPSHOT_VAR), "{}", memres::last_error());
    // SAFETY: NULL is refused, not read.
    assert_eq!(unsafe { memres_snapshot(std::ptr::null()) }, -1);
    std::env::set_var(SNAPSHOT_VAR, "1");
    assert_eq!(snapshot(&path), 0, "{}", memres::last_error());
    let empty = std::fs::read(&path).unwrap();
    assert!(empty.starts_with(b"\x80\x02}") && empty.ends_with(b"."));
    // Written whole: over a longer file it holds the new bytes alone, and
    // no temporary file is left beside it.
    std::fs::write(&path, vec![b'x'; 4 * empty.len()]).unwrap();
    assert_eq!(snapshot(&path), 0, "{}", memres::last_error());
    assert_eq!(std::fs::read(&path).unwrap(), empty);
    assert_eq!(names_in(&dir), ["s.pickle"]);
    // A path that is a directory: refused with the path in the message, the
    // directory as it was, and no temporary file left.
    let taken = dir.join("d.pickle");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("inside"), b"kept").unwrap();
    assert_eq!(snapshot(&taken), -1);
    let message = memres::last_error();
    assert!(
        message.contains("cannot write snapshot") && message.contains(taken.to_str().unwrap()),
        "{message}"
    );
    assert_eq!(names_in(&dir), ["d.pickle", "s.pickle"]);
    assert_eq!(names_in(&taken), ["inside"]);
    assert_eq!(std::fs::read(taken.join("inside")).unwrap(), b"kept");
    // Watched, a stack takes every CUDA name, layers too (`prefetch` was
    // unknown there, so every allocation failed).
    assert_eq!(memres::configure("stats(prefetch(pool(async, per_stream=true)))"), Ok(()));
    if gpu("a_snapshot_needs_the_variable_is_written_whole_and_holds_what_was_allocated").is_some() {
        let p = alloc(MIB);
        assert_eq!(snapshot(&path), 0, "{}", memres::last_error());
        let bytes = std::fs::read(&path).unwrap();
        // The block's address, as the pickle writes an int of 8 bytes or
        // fewer: little-endian after LONG1 and its length.
        let addr = (p as u64).to_le_bytes();
        let len = 8 - addr.iter().rev().take_while(|&&b| b == 0).count();
        assert!(bytes.windows(len).any(|w| w == &addr[..len]), "the block's address is in the snapshot");
        assert!(bytes.windows(16).any(|w| w == b"active_allocated"));
        // The `async` leaf's driver pool is found through its tap.
        let s = memres::stats(0).unwrap();
        assert!(s.reserved_current >= 1 << 20, "{s:?}");
        free(p, MIB);
        // An allocation past the device's memory is an `oom` that says the
        // bytes the driver reports free (it said 0), and no address.
        assert!(try_alloc(1 << 60).is_null());
        assert!(memres::last_error().contains("out of memory"), "{}", memres::last_error());
        assert_eq!(snapshot(&path), 0, "{}", memres::last_error());
        let bytes = std::fs::read(&path).unwrap();
        let key = b"device_free";
        let at = bytes.windows(key.len()).position(|w| w == key).expect("an oom's device_free") + key.len();
        assert!(pickled_int(&bytes[at..]) > 0, "device_free is 0: {:?}", &bytes[at..at + 9]);
        // Right after the action, where the other events say `addr`.
        let oom = b"oomX\x0b\x00\x00\x00device_free";
        assert!(bytes.windows(oom.len()).any(|w| w == oom), "an oom with device_free after its action");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
