//! What the tests of the C functions share: device 0 or a clear "skipped",
//! and the calls on its legacy default stream.
#![allow(dead_code, unreachable_pub)]

use memres::{memres_alloc, memres_free, memres_stats, MemresStats};
use memres_cuda::Device;
use std::ffi::c_void;
use std::ptr::null_mut;

/// Set it (to anything but `0`) on a machine with a GPU: a test that finds
/// none then fails instead of skipping its GPU part.
pub const REQUIRE_GPU: &str = "MEMRES_REQUIRE_GPU";

pub const MIB: isize = 1 << 20;

/// Device 0, or `None` after saying that the GPU part of `test` is skipped.
pub fn gpu(test: &str) -> Option<Device> {
    match Device::count() {
        Ok(n) if n > 0 => Some(Device::get(0).expect("listed device")),
        r => {
            let required = std::env::var(REQUIRE_GPU).is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(!required, "{test}: no GPU ({r:?}) and {REQUIRE_GPU} is set");
            eprintln!("SKIPPED {test} (GPU part): no GPU ({r:?}); only the no-GPU behaviour was tested");
            None
        }
    }
}

/// `memres_alloc` on device 0's legacy stream: NULL when it fails.
pub fn try_alloc(size: isize) -> *mut c_void {
    // SAFETY: the null stream is the legacy default stream.
    unsafe { memres_alloc(size, 0, null_mut()) }
}

/// [`try_alloc`] that must succeed.
pub fn alloc(size: isize) -> *mut c_void {
    let p = try_alloc(size);
    assert!(!p.is_null(), "{}", memres::last_error());
    p
}

/// `memres_free` on device 0's legacy stream.
pub fn free(p: *mut c_void, size: isize) {
    // SAFETY: frees on the legacy stream, after the work that used `p`
    // (the tests synchronize before freeing, or queue on that stream).
    unsafe { memres_free(p, size, 0, null_mut()) }
}

/// Device 0's figures, `None` while it has not been used.
pub fn stats() -> Option<MemresStats> {
    let mut s = MemresStats::default();
    // SAFETY: `s` is one writable struct.
    (unsafe { memres_stats(0, &mut s) } == 0).then_some(s)
}
