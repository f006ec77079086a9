//! `memres::device::get_per_device_resource_of` as a program's first call
//! of `memres::device` installs the defaults first, as every get of the
//! module does. (A process of its own: the defaults are installed once.)
#![cfg(not(feature = "cuda"))]

use memres::device::{get_per_device_resource_of, global};
use memres::sim::HostCopy;
use memres::Error;

#[test]
fn the_typed_get_installs_the_defaults_first() {
    // It was the core's function: no default factory, so the error told the
    // program to install the defaults that `memres::device` promises to.
    let got = get_per_device_resource_of::<(), HostCopy>(9).map(|_| ());
    let Err(Error::InvalidConfig { what }) = got else { panic!("{got:?}") };
    assert!(what.contains("not promised"), "{what}");
    // The device's default was made: the simulated device, which is not
    // host memory.
    assert!(global().existing_per_device_resource::<()>(9).is_some());
}
