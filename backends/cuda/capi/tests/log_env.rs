//! `MEMRES_LOG_FILE`: checked by `memres_configure` (a name that cannot be
//! logged to is -1 with a message, never an abort), then each device's
//! stack logs to its own file in RMM's format (its own process: the
//! environment is process-wide).

use memres::{memres_alloc, memres_configure, memres_flush, memres_free};
use memres_core::stack::LOG_FILE_VAR;
use memres_cuda::Device;
use std::ffi::CString;
use std::ptr::null_mut;

fn configure(text: &str) -> i32 {
    let c = CString::new(text).unwrap();
    // SAFETY: a NUL-terminated string.
    unsafe { memres_configure(c.as_ptr()) }
}

// One test: the environment and the configuration are process-wide.
#[test]
fn the_log_file_is_checked_at_configure_then_each_device_logs_to_its_own() {
    let dir = std::env::temp_dir().join(format!("memres-capi-log-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for bad in [dir.join("no/such/dir/trace.csv"), dir.clone()] {
        std::env::set_var(LOG_FILE_VAR, &bad);
        assert_eq!(configure("pool(cuda)"), -1, "{}", bad.display());
        let message = memres::last_error();
        assert!(message.contains(LOG_FILE_VAR) && message.contains(&*bad.to_string_lossy()), "{message}");
        assert!(memres::configure("pool(cuda)").is_err());
    }
    std::env::set_var(LOG_FILE_VAR, dir.join("trace.csv"));
    assert_eq!(configure("stats(pool(cuda))"), 0, "{}", memres::last_error());
    if !matches!(Device::count(), Ok(n) if n > 0) {
        let required = std::env::var("MEMRES_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0");
        assert!(!required, "no GPU and MEMRES_REQUIRE_GPU is set");
        eprintln!("SKIPPED the_log_file_is_checked_at_configure_then_each_device_logs_to_its_own: no GPU; only the checks at configure were tested");
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    // SAFETY: the legacy stream; the block is freed once, unused.
    let p = unsafe { memres_alloc(4096, 0, null_mut()) };
    assert!(!p.is_null(), "{}", memres::last_error());
    // SAFETY: as above.
    unsafe { memres_free(p, 4096, 0, null_mut()) };
    assert_eq!(memres_flush(), 0, "{}", memres::last_error());
    let text = std::fs::read_to_string(dir.join("trace.dev0.csv")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().skip(1).map(|l| l.split(',').collect()).collect();
    assert_eq!(text.lines().next(), Some(memres_core::trace::HEADER));
    assert_eq!(rows.len(), 2, "{text}");
    assert_eq!((rows[0][2], rows[1][2]), ("allocate", "free"));
    assert_eq!((rows[0][3], rows[1][3]), (format!("{:#x}", p as usize).as_str(), rows[0][3]));
    assert_eq!((rows[0][4], rows[1][4]), ("4096", "4096"));
}
