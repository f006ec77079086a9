//! A factory and a current-device query that the program registers before
//! its first call of `memres::device` are kept: the defaults go only where
//! none is. (A process of its own: the registry is process-wide.)

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
fn what_the_program_registered_before_the_defaults_is_kept() {
    assert!(!set_default_factory::<()>(|_| Ok(mine().clone())));
    assert!(!set_current_device_query::<()>(|| Ok(3)));
    // The first call of the front door installs the defaults.
    let got = get_per_device_resource::<()>(7).unwrap();
    assert!(Arc::ptr_eq(&got, mine()), "the program's factory was replaced by a default");
    assert_eq!(current_device::<()>(), Ok(3));
    // Stream types the program registered nothing for get the defaults.
    #[cfg(feature = "sim")]
    assert!(get_per_device_resource::<memres::sim::SimStream>(7).is_ok());
}
