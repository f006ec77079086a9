//! A malformed `MEMRES_STACK` is named as such at the first allocation,
//! before the device is touched (its own process: the environment is
//! process-wide).

mod common;

use common::{alloc, free, gpu, stats, try_alloc};

#[test]
fn a_malformed_variable_is_named_before_the_device_is_touched() {
    for (bad, why) in
        [("stats(pool(cuda)", "at byte 16"), ("stats(pool(sim))", "`sim` is a simulated device")]
    {
        std::env::set_var(memres::STACK_VAR, bad);
        assert!(try_alloc(1 << 20).is_null());
        let e = memres::last_error();
        assert!(e.starts_with(&format!("memres: {} `{bad}`: ", memres::STACK_VAR)), "{e}");
        assert!(e.contains(why), "{e}");
        assert_eq!(stats(), None, "no device was built");
    }
    // Mended, the device is built (or its absence is the error).
    std::env::set_var(memres::STACK_VAR, "stats(pool(cuda))");
    let Some(_) = gpu("a_malformed_variable_is_named_before_the_device_is_touched") else {
        assert!(try_alloc(1 << 20).is_null());
        assert!(memres::last_error().starts_with("memres: device 0: "), "{}", memres::last_error());
        return;
    };
    let p = alloc(1 << 20);
    free(p, 1 << 20);
    assert_eq!(stats().map(|s| s.count_total), Some(1));
}
