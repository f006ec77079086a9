//! A default stream used while a context that is not primary is current
//! must not make the device's primary context. In a file of its own: the
//! test needs a process in which nothing has made it yet.

mod common;

use common::gpu;
use memres_core::Stream;
use memres_cuda::{sys, CudaStream};
use std::ffi::{c_int, c_uint};
use std::ptr;

extern "C" {
    fn cuCtxCreate_v2(ctx: *mut sys::CUcontext, flags: c_uint, dev: sys::CUdevice) -> c_int;
    fn cuCtxDestroy_v2(ctx: sys::CUcontext) -> c_int;
    fn cuDeviceGet(dev: *mut sys::CUdevice, ordinal: c_int) -> c_int;
}

/// Whether the primary context of `dev` is active.
fn primary_active(dev: sys::CUdevice) -> bool {
    let (mut flags, mut active) = (0, 0);
    // SAFETY: the driver is initialized and `dev` came from `cuDeviceGet`;
    // both out parameters point at live locals.
    assert_eq!(unsafe { sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) }, 0);
    active != 0
}

#[test]
fn a_default_stream_in_a_created_context_makes_no_primary_context() {
    let Some(device) = gpu("a_default_stream_in_a_created_context_makes_no_primary_context") else { return };
    let mut dev = 0;
    // SAFETY: the driver is initialized (by `gpu`); the out parameter points at a live local.
    assert_eq!(unsafe { cuDeviceGet(&mut dev, device.ordinal() as c_int) }, 0);
    assert!(!primary_active(dev), "nothing in this process made the primary context yet");

    let mut created = ptr::null_mut();
    // SAFETY: as above; the new context becomes current on this thread.
    assert_eq!(unsafe { cuCtxCreate_v2(&mut created, 0, dev) }, 0);
    let _per_thread = CudaStream::per_thread();
    let e = CudaStream::legacy().record().expect_err("no event for a context that is not primary");
    assert!(e.to_string().contains("not primary"), "{e}");
    assert!(!primary_active(dev), "asking made the primary context");

    // Once the primary context is made and current, the default stream records in it.
    let primary = device.primary_context().unwrap();
    assert!(primary_active(dev));
    // With the primary context active but the created one current: still refused.
    assert!(CudaStream::legacy().record().is_err());
    primary.bind().unwrap();
    CudaStream::legacy().record().expect("an event in the primary context");
    // SAFETY: the created context is not current on any thread any more
    // and nothing of this test uses it again.
    assert_eq!(unsafe { cuCtxDestroy_v2(created) }, 0);
}
