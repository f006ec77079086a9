//! `MEMRES_STACK` is read when a device is first used (its own process:
//! the environment is process-wide).

use std::ffi::c_char;

fn stack_of(device: i32) -> String {
    let mut buf = vec![0 as c_char; 256];
    // SAFETY: `buf` holds 256 bytes.
    let n = unsafe { memres::memres_stack(device, buf.as_mut_ptr(), buf.len()) };
    buf[..n].iter().map(|&c| c as u8 as char).collect()
}

#[test]
fn the_variable_names_the_stack_until_configure_does() {
    std::env::set_var(memres::STACK_VAR, "limit(pool(cuda), 1GiB)");
    assert_eq!(stack_of(0), "limit(pool(cuda), 1GiB)");
    std::env::set_var(memres::STACK_VAR, "  ");
    assert_eq!(stack_of(0), memres::DEFAULT_STACK, "blank is unset");
    // Not UTF-8: no stack, and a message (the default ran in its place).
    std::env::set_var(
        memres::STACK_VAR,
        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"pool(\xff)"),
    );
    assert_eq!(stack_of(0), "");
    assert!(memres::last_error().contains("is not UTF-8"), "{}", memres::last_error());
    std::env::set_var(memres::STACK_VAR, "pool(cuda)");
    assert_eq!(memres::configure("pool(managed)"), Ok(()));
    assert_eq!(stack_of(0), "pool(managed)", "configure wins");
}
