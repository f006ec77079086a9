//! A `log` stack records what C callers do, in RMM's format, flushed on
//! request (its own process: the stack is process-wide).

use memres::{memres_alloc, memres_flush, memres_free};
use memres_cuda::Device;
use std::ptr::null_mut;

#[test]
fn a_logged_stack_writes_every_allocation_and_free() {
    let path = std::env::temp_dir().join(format!("memres-capi-log-{}.csv", std::process::id()));
    let stack = format!("log(stats(pool(async)), file={})", path.display());
    assert_eq!(memres::configure(&stack), Ok(()));
    if !matches!(Device::count(), Ok(n) if n > 0) {
        let required = std::env::var("MEMRES_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0");
        assert!(!required, "no GPU and MEMRES_REQUIRE_GPU is set");
        eprintln!("SKIPPED a_logged_stack_writes_every_allocation_and_free: no GPU; nothing was tested");
        return;
    }
    let sizes = [1000isize, 4096, 1 << 20];
    // SAFETY: the legacy stream; each block is freed once, unused.
    let ptrs: Vec<_> = sizes.iter().map(|&s| unsafe { memres_alloc(s, 0, null_mut()) }).collect();
    for (&p, &s) in ptrs.iter().zip(&sizes) {
        assert!(!p.is_null(), "{}", memres::last_error());
        // SAFETY: as above.
        unsafe { memres_free(p, s, 0, null_mut()) };
    }
    assert_eq!(memres_flush(), 0, "{}", memres::last_error());
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let rows: Vec<Vec<&str>> = text.lines().skip(1).map(|l| l.split(',').collect()).collect();
    assert_eq!(text.lines().next(), Some(memres_core::trace::HEADER));
    assert_eq!(rows.len(), 6, "{text}");
    for (i, (&p, &s)) in ptrs.iter().zip(&sizes).enumerate() {
        // All allocations come first, then the frees in the same order.
        let (a, f) = (&rows[i], &rows[sizes.len() + i]);
        assert_eq!((a[2], f[2]), ("allocate", "free"));
        assert_eq!(a[3], format!("{:#x}", p as usize));
        assert_eq!(f[3], a[3]);
        assert_eq!((a[4], f[4]), (s.to_string().as_str(), s.to_string().as_str()));
        assert_eq!(a[5], "0", "the legacy stream");
    }
}
