//! A stack nested too deep through `memres_configure` (its own process: the
//! configuration is process-wide). `stats(` 8,000 times used to overflow the
//! parser's stack and abort the host process; now it is refused with the
//! depth limit's message. Nothing here touches a device.

use memres::{memres_configure, memres_last_error};
use std::ffi::{c_char, CString};

#[test]
fn a_stack_nested_too_deep_is_refused_not_an_abort() {
    let deep = format!("{}pool(async){}", "stats(".repeat(8000), ")".repeat(8000));
    let c = CString::new(deep).unwrap();
    // SAFETY: a NUL-terminated string.
    assert_eq!(unsafe { memres_configure(c.as_ptr()) }, -1);
    // SAFETY: NULL asks for the length.
    let n = unsafe { memres_last_error(std::ptr::null_mut(), 0) };
    let mut buf = vec![0 as c_char; n + 1];
    // SAFETY: `buf` holds `n + 1` bytes.
    assert_eq!(unsafe { memres_last_error(buf.as_mut_ptr(), buf.len()) }, n);
    let e: String = buf[..n].iter().map(|&b| b as u8 as char).collect();
    assert!(
        e.ends_with("`: at byte 384: calls nested more than 64 deep"),
        "{}",
        &e[e.len().saturating_sub(200)..]
    );
    // The limit itself is fine.
    let ok = format!("{}pool(async){}", "stats(".repeat(63), ")".repeat(63));
    assert_eq!(memres::configure(&ok), Ok(()));
}
