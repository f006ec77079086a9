//! The default resource of every device over the simulator, set and got
//! from many threads, and bad input through the short path.
//!
//! The tests run in parallel over the process's one registry: each uses
//! devices no other test uses (device 0, the current one, only
//! `setting_returns_the_previous_resource`), below `SIM_DEVICES` (64) where
//! a default is made.
#![cfg(not(feature = "cuda"))]

use memres::device::{
    get_current_device_resource, get_per_device_resource, set_current_device_resource,
    set_per_device_resource,
};
use memres::prelude::*;
use memres::sim::{SimDevice, SimStream, SimWorld, SIM_DEVICES};
use memres::DynResource;
use std::sync::{Arc, Barrier};

#[test]
fn every_device_has_a_simulated_default_without_registration() {
    let a = get_per_device_resource(10).unwrap();
    assert!(Arc::ptr_eq(&a, &get_per_device_resource(10).unwrap()), "made once, then kept");
    assert!(!Arc::ptr_eq(&a, &get_per_device_resource(11).unwrap()), "one per device");
    let b = a.allocate(1 << 20).unwrap();
    a.deallocate(b).unwrap();
    // Simulated streams have a default too.
    let s: DynResource<SimStream> = get_per_device_resource(10).unwrap();
    let stream = SimWorld::new().stream();
    s.deallocate_on(s.allocate_on(256, &stream).unwrap(), &stream).unwrap();
}

#[test]
fn setting_returns_the_previous_resource() {
    let default = get_per_device_resource(20).unwrap();
    let pool: DynResource = Arc::new(Shared::new(CoalescingPool::new(SimDevice::new(1 << 30))));
    let previous = set_per_device_resource(20, pool.clone()).unwrap();
    assert!(Arc::ptr_eq(&previous, &default));
    assert!(Arc::ptr_eq(&get_per_device_resource(20).unwrap(), &pool));
    // A device whose default was never made had nothing to replace.
    assert!(set_per_device_resource(21, pool.clone()).is_none());
    // The current device's, through the same registry: device 0 without
    // CUDA. (Another test read device 0 twice, and this one's set could
    // land between its reads.)
    let mine: DynResource = Arc::new(SimDevice::new(1 << 20));
    let before = set_current_device_resource(mine.clone()).unwrap();
    assert!(Arc::ptr_eq(&get_current_device_resource().unwrap(), &mine));
    assert!(Arc::ptr_eq(&get_per_device_resource(0).unwrap(), &mine));
    if let Some(before) = before {
        set_current_device_resource(before).unwrap();
    }
}

#[test]
fn per_device_resources_from_many_threads() {
    const THREADS: u32 = 8;
    let start = Barrier::new(THREADS as usize);
    let firsts: Vec<DynResource> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    // All threads race for the default of one fresh device...
                    let first = get_per_device_resource(30).unwrap();
                    // ...and each sets and gets its own device many times.
                    let device = 40 + t;
                    for i in 0..200 {
                        let mine: DynResource = Arc::new(SimDevice::new(1 << 20));
                        let previous = set_per_device_resource(device, mine.clone());
                        assert_eq!(previous.is_some(), i > 0, "thread {t}");
                        let got = get_per_device_resource(device).unwrap();
                        assert!(Arc::ptr_eq(&got, &mine), "thread {t}: another thread's resource");
                        got.deallocate(got.allocate(1000).unwrap()).unwrap();
                    }
                    first
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(firsts.iter().all(|f| Arc::ptr_eq(f, &firsts[0])), "every thread got the one default stored");
}

#[test]
fn bad_input_through_the_short_path_is_typed_and_changes_nothing() {
    let mr = Statistics::new(Shared::new(CoalescingPool::new(get_per_device_resource(50).unwrap())));
    let live = mr.allocate(1000).unwrap();
    let too_big = Request::MAX_SIZE + 1;
    assert_eq!(
        mr.allocate(too_big),
        Err(Error::InvalidSize { size: too_big, what: "above Request::MAX_SIZE" })
    );
    let e = mr.allocate(1 << 50).unwrap_err(); // larger than the simulated device
    assert!(e.is_out_of_memory(), "{e:?}");
    let forged = Block::from_addr(live.addr() + (1 << 40), 256);
    assert!(matches!(mr.deallocate(forged), Err(Error::UnknownBlock { .. })));
    assert_eq!(
        (mr.get_bytes_counter().value, mr.get_allocations_counter().total),
        (1000, 1),
        "nothing changed"
    );
    mr.deallocate(live).unwrap();
    assert!(mr.deallocate(live).is_err(), "a second free");
    assert_eq!((mr.get_bytes_counter().value, mr.get_bytes_counter().peak), (0, 1000));
    mr.deallocate(mr.allocate(1000).unwrap()).unwrap();
    mr.check().unwrap(); // the pool's checker, through the adaptor and the lock
}

#[test]
fn a_block_of_one_device_is_foreign_to_another() {
    // Every device's default had the same addresses: device 0 took device
    // 1's block, and freed its own live one under it.
    let d0: DynResource = get_per_device_resource(56).unwrap();
    let d1: DynResource = get_per_device_resource(57).unwrap();
    let a = d0.allocate(1000).unwrap();
    let b = d1.allocate(1000).unwrap();
    let freed = d0.deallocate(b);
    let c = d0.allocate(1000).unwrap();
    assert!(freed.is_err() && a.addr() != c.addr(), "freed {freed:?}; a {a:?} b {b:?} c {c:?}");
    for (mr, block) in [(&d0, a), (&d1, b), (&d0, c)] {
        mr.deallocate(block).unwrap();
    }
}

#[test]
fn only_devices_with_addresses_of_their_own_have_a_simulated_default() {
    // Any device number was taken, each device kept for ever.
    let last = u32::try_from(SIM_DEVICES - 1).unwrap();
    let top: DynResource = get_per_device_resource(last).unwrap();
    assert!(top.deallocate(top.allocate(1000).unwrap()).is_ok());
    for device in [last + 1, u32::MAX] {
        let got = get_per_device_resource::<()>(device).map(|_| ());
        assert!(matches!(got, Err(Error::InvalidConfig { .. })), "{device}: {got:?}");
    }
}
