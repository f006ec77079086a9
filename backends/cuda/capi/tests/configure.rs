//! `memres_configure`, `memres_stack`, `memres_last_error` and
//! `memres_stats` through their C signatures. Nothing here touches a
//! device, so it runs the same with or without a GPU.

use memres::{memres_configure, memres_last_error, memres_stack, memres_stats, MemresStats};
use std::ffi::{c_char, CString};

fn configure(text: &str) -> i32 {
    let c = CString::new(text).unwrap();
    // SAFETY: a NUL-terminated string.
    unsafe { memres_configure(c.as_ptr()) }
}

fn last_error() -> String {
    // SAFETY: NULL asks for the length.
    let n = unsafe { memres_last_error(std::ptr::null_mut(), 0) };
    let mut buf = vec![0 as c_char; n + 1];
    // SAFETY: `buf` holds `n + 1` bytes.
    assert_eq!(unsafe { memres_last_error(buf.as_mut_ptr(), buf.len()) }, n);
    let bytes: Vec<u8> = buf[..n].iter().map(|&c| c as u8).collect();
    assert_eq!(buf[n], 0, "terminated");
    String::from_utf8(bytes).unwrap()
}

fn stack_of(device: i32) -> String {
    let mut buf = vec![0 as c_char; 256];
    // SAFETY: `buf` holds 256 bytes.
    let n = unsafe { memres_stack(device, buf.as_mut_ptr(), buf.len()) };
    buf[..n].iter().map(|&c| c as u8 as char).collect()
}

// One test: the configuration is process-wide, so the steps run in order.
#[test]
fn configure_checks_the_stack_and_reports_errors() {
    std::env::remove_var(memres::STACK_VAR);
    assert_eq!(stack_of(0), memres::DEFAULT_STACK, "nothing configured, MEMRES_STACK unset");

    for good in [
        "pool(async)",
        "stats(pool(async(initial=1GiB, release_threshold=4GiB), max=8GiB))",
        "limit(stats(pool(cuda, max=2GiB, growth=double)), 1GiB)",
        "log(track(managed), file=/nonexistent/dir/never-opened.csv)",
        "align(async, alignment=4096)",
        "stats(vmm(reserve=64GiB, release_threshold=256MiB, handle_granules=32))",
        "stats(vmm(release_threshold=1TiB, trim_on_commit=false))",
        memres::DEFAULT_STACK,
        "pool(limit(async, 4GiB), per_stream=true, initial=1GiB, granule=64MiB)",
    ] {
        assert_eq!(configure(good), 0, "{good}: {}", last_error());
        assert_eq!(stack_of(0), good);
        assert_eq!(stack_of(5), good, "every device");
    }
    assert!(!std::path::Path::new("/nonexistent/dir/never-opened.csv").exists());

    let before = stack_of(0);
    for (bad, says) in [
        ("pool(asink)", "at byte 5: unknown resource `asink`"),
        ("pool(async", "at byte 10: expected"),
        ("async(initial=lots)", "at byte 14: bad size `lots`"),
        ("async(initial=1GiB, pools=2)", "unknown key `pools`"),
        ("async(initial=1GiB, pool=2)", "at byte 25: bad value: pool `2`: own, default or managed"),
        ("async(pool=default, initial=1GiB)", "`initial=` with `pool=default`"),
        ("async(ipc=shm)", "ipc `shm`: none, posix_fd or fabric"),
        ("cuda(1GiB)", "too many positional arguments"),
        ("log(async)", "missing argument: file="),
        ("pool(async, growth=fast)", "growth `fast`"),
        ("", "empty name"),
        ("stats(vmm(handle_granules=99))", "handle_granules `99`"),
        ("vmm(reserve=0)", "reserve=0"),
        // Not device memory: a kernel would crash on these pointers.
        (
            "stats(pool(sim))",
            "at byte 11: bad value: `sim` is a simulated device, whose addresses are made up",
        ),
        ("host", "at byte 0: bad value: `host` is host memory, which kernels cannot use"),
        ("pool(vpool(sim))", "at byte 5: bad value: `vpool` is a pool over a simulated address space"),
        ("pool(async, per_stream=true, max=1GiB)", "max= bounds one pool"),
    ] {
        assert_eq!(configure(bad), -1, "{bad}");
        let e = last_error();
        assert!(e.contains(says), "{bad}: {e}");
        assert!(e.contains(&format!("`{bad}`")), "the message quotes the stack: {e}");
        assert_eq!(stack_of(0), before, "a refused stack changes nothing");
    }

    // SAFETY: NULL is allowed and refused.
    assert_eq!(unsafe { memres_configure(std::ptr::null()) }, -1);
    assert!(last_error().contains("NULL"));
    let not_utf8 = [0xffu8 as c_char, 0];
    // SAFETY: a NUL-terminated string.
    assert_eq!(unsafe { memres_configure(not_utf8.as_ptr()) }, -1);
    assert!(last_error().contains("UTF-8"));

    // No device was used: no figures, and nothing written.
    let mut s = MemresStats { bytes_peak: 99, ..MemresStats::default() };
    // SAFETY: `s` is one writable struct.
    assert_eq!(unsafe { memres_stats(0, &mut s) }, -1);
    assert!(last_error().contains("has not been used"));
    assert_eq!(s.bytes_peak, 99);
    // SAFETY: NULL is refused.
    assert_eq!(unsafe { memres_stats(0, std::ptr::null_mut()) }, -1);
    // SAFETY: `s` is one writable struct.
    assert_eq!(unsafe { memres_stats(1000, &mut s) }, -1);
    assert!(last_error().contains("out of range"), "{}", last_error());

    // No device, no log: nothing to flush.
    assert_eq!(memres::memres_flush(), 0);

    // A message longer than the buffer is cut and terminated.
    let mut small = [0x41 as c_char; 8];
    // SAFETY: `small` holds 8 bytes.
    let n = unsafe { memres_last_error(small.as_mut_ptr(), small.len()) };
    assert!(n > 8);
    assert_eq!(small[7], 0);
}
