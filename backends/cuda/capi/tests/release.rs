//! `memres_release` and `memres_empty_cache` through their C signatures:
//! without a GPU, a device not used gives back nothing and one out of
//! range fails cleanly; with one, a pool over `vmm` gives its free chunks
//! to the leaf, which unmaps them, so the device holds nothing once every
//! block is freed.

mod common;

use common::{alloc, free, gpu, stats, MIB};
use memres::{memres_configure, memres_empty_cache, memres_release};
use std::ffi::CString;
use std::ptr::null_mut;

fn release(device: i32) -> i64 {
    // SAFETY: the null stream is the device's legacy default stream.
    unsafe { memres_release(device, null_mut()) }
}

/// Bytes device 0's leaves hold from it now (mapped, for `vmm`).
fn held() -> i64 {
    stats().expect("device 0 was used").upstream_current
}

// One test: the stack is process-wide and built once.
#[test]
fn a_pool_over_vmm_gives_every_free_byte_back_to_the_device() {
    let text = CString::new("stats(pool(vmm(handle_granules=1), granule=2MiB))").unwrap();
    // SAFETY: a NUL-terminated string.
    assert_eq!(unsafe { memres_configure(text.as_ptr()) }, 0, "{}", memres::last_error());
    assert_eq!(release(1 << 20), -1);
    assert!(memres::last_error().contains("out of range"), "{}", memres::last_error());
    assert_eq!(release(0), 0, "a device not used yet keeps nothing");
    if gpu("a_pool_over_vmm_gives_every_free_byte_back_to_the_device").is_none() {
        memres_empty_cache();
        return;
    }
    let kept = alloc(MIB);
    let (a, b) = (alloc(64 * MIB), alloc(32 * MIB));
    free(a, 64 * MIB);
    free(b, 32 * MIB);
    let before = held();
    assert!(before >= 97 * MIB as i64, "{before}");
    // The pool's wholly free chunks go to `vmm`, which unmaps them with
    // what it kept mapped; the chunk under `kept` stays.
    let given = release(0);
    assert!(given >= 96 * MIB as i64, "{given}: {}", memres::last_error());
    let after = held();
    assert!(after <= before - 96 * MIB as i64 && after >= MIB as i64, "{before} -> {after}");
    assert_eq!(release(0), 0, "nothing left to give back");
    // PyTorch's reset function does the same for every device used.
    let c = alloc(48 * MIB);
    free(c, 48 * MIB);
    assert!(held() >= after + 48 * MIB as i64);
    memres_empty_cache();
    assert_eq!(held(), after);
    free(kept, MIB);
    assert!(release(0) >= after, "the last chunk goes too");
    assert_eq!(held(), 0);
}
