//! A factory and a current-device query that the program registers before
//! its first call of `memres::device` are kept: the defaults go only where
//! none is. One it registers after replaces the default for good: the
//! defaults are installed once, so the calls after (each installs them
//! first) leave it. (A process of its own: the registry is process-wide.)

use memres::device::{
    current_device, get_per_device_resource, set_current_device_query, set_default_factory,
};
use memres::sim::SimDevice;
use memres::DynResource;
use std::sync::{Arc, OnceLock};

/// The program's own resource for `()`, one for every device.
fn mine() -> &'static DynResource {
    static MINE: OnceLock<DynResource> = OnceLock::new();
    MINE.get_or_init(|| Arc::new(SimDevice::new(1 << 20)))
}

#[test]
fn what_the_program_registers_before_or_after_the_defaults_is_kept() {
    assert!(!set_default_factory::<()>(|_| Ok(mine().clone())));
    assert!(!set_current_device_query::<()>(|| Ok(3)));
    // The first call of the front door installs the defaults.
    let got = get_per_device_resource::<()>(7).unwrap();
    assert!(Arc::ptr_eq(&got, mine()), "the program's factory was replaced by a default");
    assert_eq!(current_device::<()>(), Ok(3));
    // Stream types the program registered nothing for get the defaults.
    #[cfg(feature = "sim")]
    registered_after_replaces_the_default();
}

/// The program's own resource for `SimStream`, one for every device.
#[cfg(feature = "sim")]
fn mine_on_sim_streams() -> &'static DynResource<memres::sim::SimStream> {
    static MINE: OnceLock<DynResource<memres::sim::SimStream>> = OnceLock::new();
    MINE.get_or_init(|| Arc::new(SimDevice::new(1 << 20)))
}

/// Once the defaults are in, a factory the program registers replaces the
/// default for the devices with no resource yet, and stays through the
/// calls after (each installs the defaults first) and another
/// `install_defaults`.
#[cfg(feature = "sim")]
fn registered_after_replaces_the_default() {
    use memres::device::install_defaults;
    use memres::sim::SimStream;
    let default = get_per_device_resource::<SimStream>(7).unwrap();
    assert!(set_default_factory::<SimStream>(|_| Ok(mine_on_sim_streams().clone())), "no default was there");
    install_defaults();
    let got = get_per_device_resource::<SimStream>(8).unwrap();
    assert!(Arc::ptr_eq(&got, mine_on_sim_streams()), "the default came back over the program's factory");
    // The device whose default was made keeps it.
    assert!(Arc::ptr_eq(&get_per_device_resource::<SimStream>(7).unwrap(), &default));
}
