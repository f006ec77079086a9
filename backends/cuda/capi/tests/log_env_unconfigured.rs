//! With no `memres_configure`, a `MEMRES_LOG_FILE` that cannot be logged
//! to is named at the first allocation, before the device's stack is built:
//! the files of the stack's own `log` layers stay as they were (its own
//! process: the environment is process-wide).

mod common;

use common::{alloc, free, gpu, try_alloc};
use memres_core::stack::LOG_FILE_VAR;

#[test]
fn a_log_file_that_cannot_be_logged_to_leaves_the_stacks_own_log_files_as_they_were() {
    let dir = std::env::temp_dir().join(format!("memres-capi-log-env-unconfigured-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kept = dir.join("kept.csv");
    std::fs::write(&kept, "rows of another run\n").unwrap();
    std::env::set_var(memres::STACK_VAR, format!("log(pool(cuda), file={})", kept.display()));
    let bad = dir.join("no/such/dir/trace.csv");
    std::env::set_var(LOG_FILE_VAR, &bad);
    for _ in 0..2 {
        assert!(try_alloc(1 << 20).is_null());
        let message = memres::last_error();
        assert!(message.contains(LOG_FILE_VAR) && message.contains(&*bad.to_string_lossy()), "{message}");
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "rows of another run\n");
    }
    // Mended, the device is built (or its absence is the error), and the
    // stack's log starts its file anew.
    std::env::remove_var(LOG_FILE_VAR);
    let Some(_) = gpu("a_log_file_that_cannot_be_logged_to_leaves_the_stacks_own_log_files_as_they_were")
    else {
        assert!(try_alloc(1 << 20).is_null());
        assert!(memres::last_error().starts_with("memres: device 0: "), "{}", memres::last_error());
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    };
    let p = alloc(1 << 20);
    free(p, 1 << 20);
    assert_eq!(memres::memres_flush(), 0, "{}", memres::last_error());
    let text = std::fs::read_to_string(&kept).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(text.lines().next(), Some(memres_core::trace::HEADER), "{text}");
    assert!(!text.contains("rows of another run"), "{text}");
}
