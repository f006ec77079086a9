extern crate std;

use super::*;
use crate::adaptor::Statistics;
use crate::testing::{BumpUpstream, TestStream};
use crate::{MemoryResource, Request};
use alloc::sync::Arc;
use alloc::vec::Vec;

/// A second stream type, to check that registrations do not mix.
type OtherStream = TestStream<1>;

fn bump(cap: u64) -> DynResource {
    Arc::new(BumpUpstream::new(cap))
}

#[test]
fn set_get_replace_reset() {
    let reg = Registry::new();
    assert!(matches!(reg.get::<()>(0), Err(Error::InvalidConfig { .. })));
    let a = bump(1 << 20);
    let b = bump(1 << 20);
    assert!(reg.set::<()>(0, a.clone()).is_none());
    assert!(Arc::ptr_eq(&reg.get::<()>(0).unwrap(), &a));
    // Other devices and other stream types are separate.
    assert!(reg.get::<()>(1).is_err());
    assert!(reg.get::<OtherStream>(0).is_err());
    let old = reg.set::<()>(0, b.clone()).unwrap();
    assert!(Arc::ptr_eq(&old, &a));
    assert!(Arc::ptr_eq(&reg.get::<()>(0).unwrap(), &b));
    assert!(Arc::ptr_eq(&reg.reset::<()>(0).unwrap(), &b));
    assert!(reg.get::<()>(0).is_err());
}

#[test]
fn default_factory_makes_once_per_device() {
    let reg = Registry::new();
    fn factory(device: DeviceId) -> Result<DynResource<OtherStream>> {
        if device == 9 {
            return Err(Error::Backend { code: 100, what: "no such device" });
        }
        Ok(Arc::new(Statistics::new(BumpUpstream::new(1 << 20))))
    }
    assert!(!reg.set_default_factory::<OtherStream>(factory));
    let d0 = reg.get::<OtherStream>(0).unwrap();
    assert!(Arc::ptr_eq(&d0, &reg.get::<OtherStream>(0).unwrap()));
    assert!(!Arc::ptr_eq(&d0, &reg.get::<OtherStream>(1).unwrap()));
    assert_eq!(reg.get::<OtherStream>(9).err(), Some(Error::Backend { code: 100, what: "no such device" }));
    // The unit stream has no factory in this registry.
    assert!(reg.get::<()>(0).is_err());
    let s = OtherStream::default();
    let b = d0.allocate(Request::new(10).unwrap(), &s).unwrap();
    d0.deallocate(b, &s).unwrap();
}

#[test]
fn concurrent_gets_agree() {
    let reg = Registry::new();
    reg.set_default_factory::<()>(|_| Ok(bump(1 << 20)));
    let got: Vec<DynResource> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(|| reg.get::<()>(3).unwrap())).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &got {
        assert!(Arc::ptr_eq(r, &got[0]));
    }
}

#[test]
fn global_functions() {
    // A stream type of its own: no other test may register it globally.
    type GlobalOnly = TestStream<2>;
    assert!(get_per_device_resource::<GlobalOnly>(0).is_err());
    let r: DynResource<GlobalOnly> = Arc::new(BumpUpstream::new(1 << 20));
    assert!(set_current_device_resource::<GlobalOnly>(0, r.clone()).is_none());
    assert!(Arc::ptr_eq(&get_per_device_resource::<GlobalOnly>(0).unwrap(), &r));
    assert!(Arc::ptr_eq(&global().get::<GlobalOnly>(0).unwrap(), &r));
}
