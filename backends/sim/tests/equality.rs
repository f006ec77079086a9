//! Equality of resources (RMM's `is_equal`) over the simulated device: two
//! handles of one resource are equal, a resource and its upstream are not,
//! two resources over one upstream are not, and an adaptor that keeps no
//! record of blocks is equal to one of its type over an equal upstream.

use memres_core::adaptor::{Aligned, FailureCallback, Statistics, Tracking};
use memres_core::device::Registry;
use memres_core::pool::CoalescingPool;
use memres_core::{DynResource, Error, Inspect, MemoryResource, Request, Shared};
use memres_sim::{builder, SimDevice};
use std::sync::Arc;

fn req(size: u64) -> Request {
    Request::new(size).unwrap()
}

/// Whether `a` and `b` are equal, checked to be so both ways round (the
/// `dyn` names the stream these resources are generic over).
fn eq(a: &dyn MemoryResource, b: &dyn MemoryResource) -> bool {
    let ab = a.is_equal(b);
    assert_eq!(ab, b.is_equal(a), "equality is symmetric");
    ab
}

#[test]
fn clones_of_a_shared_pool_are_equal_and_take_each_others_blocks() {
    let device = SimDevice::new(1 << 30);
    let a = Arc::new(Shared::new(CoalescingPool::new(&device)));
    let b = a.clone();
    assert!(eq(&a, &b));
    assert!(eq(&a, &&*b), "a reference is equal to what it names");
    let dynamic: DynResource = Arc::new(Shared::new(CoalescingPool::new(SimDevice::new(1 << 20))));
    assert!(eq(&dynamic, &dynamic.clone()), "through `dyn`");
    let block = a.allocate(req(1000), &()).unwrap();
    b.deallocate(block, &()).unwrap();
    a.with(|p| assert_eq!(p.usage().used, 0));
}

#[test]
fn a_resource_is_not_equal_to_its_upstream() {
    let device = Arc::new(SimDevice::new(1 << 30));
    let pool = Shared::new(CoalescingPool::new(device.clone()));
    assert!(!eq(&pool, &device));
    // Held by value, the upstream may sit at the adaptor's own address.
    let stats = Statistics::new(SimDevice::new(1 << 20));
    assert!(!eq(&stats, stats.upstream()));
    let retry = FailureCallback::new(SimDevice::new(1 << 20), (), |_, _: &()| false);
    assert!(!eq(&retry, retry.upstream()));
    assert!(eq(&retry, &retry));
}

#[test]
fn two_pools_over_one_device_are_not_equal() {
    let device = SimDevice::new(1 << 30);
    let a = Shared::new(CoalescingPool::new(&device));
    let b = Shared::new(CoalescingPool::new(&device));
    assert!(eq(&a, &a) && !eq(&a, &b));
    // Not equal, and indeed not interchangeable: `b` refuses `a`'s block.
    let block = a.allocate(req(1000), &()).unwrap();
    assert!(matches!(b.deallocate(block, &()), Err(Error::UnknownBlock { .. })));
    a.deallocate(block, &()).unwrap();
}

#[test]
fn adaptors_with_no_record_of_blocks_are_equal_over_an_equal_upstream() {
    let device = SimDevice::new(1 << 30);
    let pool = Arc::new(Shared::new(CoalescingPool::new(&device)));
    let (x, y) = (
        FailureCallback::new(pool.clone(), 1, |_, _: &i32| false),
        FailureCallback::new(pool.clone(), 2, |_, _: &i32| true),
    );
    assert!(eq(&x, &y), "the callback does not matter, as in RMM");
    assert!(!eq(&x, &pool));
    let other =
        FailureCallback::new(Arc::new(Shared::new(CoalescingPool::new(&device))), 1, |_, _: &i32| false);
    assert!(!eq(&x, &other), "over another pool");
    let (p, q) =
        (Aligned::new(pool.clone(), 4096, 1).unwrap(), Aligned::new(pool.clone(), 512, 1 << 20).unwrap());
    assert!(eq(&p, &q), "a block of one goes back to the upstream unchanged through the other");
    assert!(!eq(&p, &x), "adaptors of different types");
    let block = p.allocate(req(5000), &()).unwrap();
    q.deallocate(block, &()).unwrap();
    // Nested: equal when every layer is, never equal to a layer below.
    let (n, m) = (Aligned::new(&x, 4096, 1).unwrap(), Aligned::new(&y, 4096, 1).unwrap());
    assert!(eq(&n, &m) && !eq(&n, &p) && !eq(&n, &x));
}

#[test]
fn adaptors_that_keep_a_record_are_equal_only_to_themselves() {
    let device = SimDevice::new(1 << 30);
    let pool = Shared::new(CoalescingPool::new(&device));
    let (a, b) = (Tracking::new(&pool), Tracking::new(&pool));
    assert!(eq(&a, &a) && !eq(&a, &b));
    // The reason: a block of one, given to the other, is not in its record.
    let block = a.allocate(req(1000), &()).unwrap();
    assert!(b.deallocate(block, &()).is_err());
    a.deallocate(block, &()).unwrap();
    let (s, t) = (Statistics::new(&pool), Statistics::new(&pool));
    assert!(!eq(&s, &t));
}

#[test]
fn built_stacks_are_equal_to_their_clones_and_to_what_a_registry_hands_back() {
    let builder = builder::<()>();
    let a = builder.build("stats(pool(sim))", &()).unwrap();
    let b = builder.build("stats(pool(sim))", &()).unwrap();
    assert!(eq(&a, &a.clone()) && !eq(&a, &b));
    let registry = Registry::new();
    registry.set_per_device_resource(0, a.clone());
    assert!(registry.get_per_device_resource::<()>(0).unwrap().is_equal(&a));
}
