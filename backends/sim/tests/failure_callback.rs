//! The failure callback over the simulated device: out of memory only by
//! default, any failure when asked (`RetryOn::AnyError`); a callback that
//! gives up gets the upstream's error unchanged, and the callback bounds
//! the retries.

use memres_core::adaptor::{FailureCallback, RetryOn};
use memres_core::pool::CoalescingPool;
use memres_core::{Error, Inspect, MemoryResource, Request, Shared};
use memres_sim::SimDevice;
use std::sync::atomic::{AtomicU64, Ordering};

const INJECTED: Error = Error::Backend { code: 2, what: "injected failure of the simulated device" };

fn req(size: u64) -> Request {
    Request::new(size).unwrap()
}

/// A callback that counts its calls and asks for a retry the first
/// `retries` times, making the device fail again before each retry when
/// `again` (a failure that lasts).
fn callback(device: &SimDevice, retries: u64, again: bool) -> impl Fn(u64, &AtomicU64) -> bool + '_ {
    move |_bytes, calls| {
        let n = calls.fetch_add(1, Ordering::Relaxed) + 1;
        if again {
            device.fail_nth(1);
        }
        n <= retries
    }
}

#[test]
fn other_errors_skip_the_callback_by_default() {
    let device = SimDevice::new(1 << 20);
    let r = FailureCallback::new(&device, AtomicU64::new(0), callback(&device, 1, false));
    assert_eq!(r.retry_on(), RetryOn::OutOfMemory);
    device.fail_nth(1);
    assert_eq!(r.allocate(req(4096), &()), Err(INJECTED));
    assert_eq!(r.data().load(Ordering::Relaxed), 0);
}

#[test]
fn any_error_reaches_the_callback_when_asked_and_the_retry_serves() {
    let device = SimDevice::new(1 << 20);
    let r = FailureCallback::new(&device, AtomicU64::new(0), callback(&device, 1, false))
        .with_retry_on(RetryOn::AnyError);
    device.fail_nth(1);
    let b = r.allocate(req(4096), &()).unwrap();
    assert_eq!(r.data().load(Ordering::Relaxed), 1);
    assert_eq!(device.usage().held, 4096);
    r.deallocate(b, &()).unwrap();
    assert_eq!(device.usage().held, 0);
}

#[test]
fn a_callback_that_gives_up_gets_the_original_typed_error_and_the_resource_serves_on() {
    let device = SimDevice::new(1 << 20);
    let pool = Shared::new(CoalescingPool::new(&device));
    let r = FailureCallback::new(&pool, AtomicU64::new(0), callback(&device, 0, false))
        .with_retry_on(RetryOn::AnyError);
    // A backend failure, through the pool's growth.
    device.fail_nth(1);
    assert_eq!(r.allocate(req(4096), &()), Err(INJECTED));
    // Out of memory, as the pool reports it without the adaptor.
    let alone = pool.allocate(req(2 << 20), &()).unwrap_err();
    let through = r.allocate(req(2 << 20), &());
    assert!(alone.is_out_of_memory());
    assert_eq!(through, Err(alone));
    assert_eq!(pool.with(|p| p.usage().used), 0, "nothing changed");
    let b = r.allocate(req(4096), &()).unwrap();
    r.deallocate(b, &()).unwrap();
    assert_eq!(pool.with(|p| p.usage().used), 0);
}

#[test]
fn retries_are_bounded_by_the_callback_and_by_the_cap() {
    let device = SimDevice::new(1 << 20);
    // The device fails on every attempt; the callback allows three retries.
    let r = FailureCallback::new(&device, AtomicU64::new(0), callback(&device, 3, true))
        .with_retry_on(RetryOn::AnyError);
    device.fail_nth(1);
    assert_eq!(r.allocate(req(4096), &()), Err(INJECTED));
    assert_eq!(r.data().load(Ordering::Relaxed), 4, "the first attempt and three retries");
    // A callback that always retries is stopped by the cap.
    let forever = FailureCallback::new(&device, AtomicU64::new(0), callback(&device, u64::MAX, true))
        .with_retry_on(RetryOn::AnyError)
        .with_max_retries(5);
    device.fail_nth(1);
    assert_eq!(forever.allocate(req(4096), &()), Err(INJECTED));
    assert_eq!(forever.data().load(Ordering::Relaxed), 6);
    device.fail_nth(0);
    assert_eq!(device.usage().held, 0);
    let b = forever.allocate(req(4096), &()).unwrap();
    forever.deallocate(b, &()).unwrap();
}
