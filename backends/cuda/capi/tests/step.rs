//! `memres_step` through its C signature: without a GPU it fails cleanly;
//! with one, a `planned` stack stops taking memory from the device once a
//! repeating step is laid out, `memres_steps` counts the steps it followed,
//! a release gives the regions back once nothing lives in them (the steps
//! are then laid out again), and a stack without `planned` steps nothing.

mod common;

use common::{alloc, free, gpu, stats, MIB};
use memres::{memres_configure, memres_release, memres_step, memres_steps, MemresSteps};
use std::ffi::{c_void, CString};
use std::ptr::null_mut;

fn step(device: i32) -> i32 {
    // SAFETY: the null stream is the legacy default stream.
    unsafe { memres_step(device, null_mut()) }
}

/// `memres_steps` of device 0: the planned layers' counts and how many
/// layers, or -1.
fn steps() -> (MemresSteps, i32) {
    let mut s = MemresSteps::default();
    // SAFETY: `s` is one writable struct.
    let layers = unsafe { memres_steps(0, &mut s) };
    (s, layers)
}

fn upstream_total() -> i64 {
    stats().expect("device 0 was used").upstream_total
}

/// One step of a training loop's shape: activations freed in the step, a
/// block that lives into the next.
fn one_step(carried: &mut Vec<*mut c_void>) {
    let a = alloc(8 * MIB);
    let b = alloc(24 * MIB);
    free(a, 8 * MIB);
    let c = alloc(4 * MIB);
    free(b, 24 * MIB);
    free(c, 4 * MIB);
    for p in carried.drain(..) {
        free(p, MIB);
    }
    carried.push(alloc(MIB));
}

// One test: the stack is process-wide and built once.
#[test]
fn a_planned_stack_takes_nothing_from_the_device_in_a_steady_step() {
    let text = CString::new("stats(planned(pool(cuda, granule=2MiB)))").unwrap();
    // SAFETY: a NUL-terminated string.
    assert_eq!(unsafe { memres_configure(text.as_ptr()) }, 0, "{}", memres::last_error());
    assert_eq!(step(1 << 20), -1);
    assert!(memres::last_error().contains("out of range"), "{}", memres::last_error());
    if gpu("a_planned_stack_takes_nothing_from_the_device_in_a_steady_step").is_none() {
        assert_eq!(step(0), -1, "the stack cannot be built");
        assert!(memres::last_error().contains("device 0"), "{}", memres::last_error());
        assert_eq!(steps().1, -1, "device 0 was never used");
        assert!(memres::last_error().contains("not been used"), "{}", memres::last_error());
        return;
    }
    let mut carried = Vec::new();
    assert_eq!(step(0), 1, "one planned layer");
    // Two steps recorded; the second repeats the first, so the next is
    // laid out (its region taken at this `step`).
    for _ in 0..2 {
        one_step(&mut carried);
        assert_eq!(step(0), 1);
    }
    let planned = upstream_total();
    for _ in 0..5 {
        one_step(&mut carried);
        assert_eq!(step(0), 1);
    }
    // The pool under the plan grew once for the region; after that the
    // steps ran from the region and the pool's chunks.
    assert_eq!(upstream_total(), planned, "no device memory taken in steady steps");
    // Eight calls; the third planned from the second step, which repeated
    // the first; the five steps after it followed the plan, each of its
    // four allocations served from a region (the carried one from the
    // carry region).
    let (s, layers) = steps();
    assert_eq!(layers, 1);
    assert_eq!((s.steps, s.plans, s.followed, s.planned_allocations), (8, 1, 5, 20), "{s:?}");
    assert!(s.region >= 24 * MIB as i64 && s.carry_region >= MIB as i64, "{s:?}");
    // SAFETY: a null `out` is refused, not written.
    assert_eq!(unsafe { memres_steps(0, null_mut()) }, -1);
    assert!(memres::last_error().contains("NULL"), "{}", memres::last_error());
    for p in carried.drain(..) {
        free(p, MIB);
    }
    // Nothing lives in the regions now: a release (`torch.cuda.empty_cache`)
    // gives them to the pool under the plan, which gives every chunk back.
    let held = stats().expect("device 0 was used").upstream_current;
    assert!(held >= 25 * MIB as i64, "{held}");
    // SAFETY: the null stream is the legacy default stream.
    assert_eq!(unsafe { memres_release(0, null_mut()) }, held, "{}", memres::last_error());
    assert_eq!(stats().unwrap().upstream_current, 0);
    assert_eq!((steps().0.region, steps().0.carry_region), (0, 0));
    // The plan went with them; the steps are recorded and laid out again.
    for _ in 0..4 {
        one_step(&mut carried);
        assert_eq!(step(0), 1);
    }
    let (s, _) = steps();
    assert_eq!((s.plans, s.followed), (2, 6), "{s:?}");
    for p in carried.drain(..) {
        free(p, MIB);
    }
}
