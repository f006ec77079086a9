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
    assert!(matches!(reg.get_per_device_resource::<()>(0), Err(Error::InvalidConfig { .. })));
    let a = bump(1 << 20);
    let b = bump(1 << 20);
    assert!(reg.set_per_device_resource::<()>(0, a.clone()).is_none());
    assert!(Arc::ptr_eq(&reg.get_per_device_resource::<()>(0).unwrap(), &a));
    // Other devices and other stream types are separate.
    assert!(reg.get_per_device_resource::<()>(1).is_err());
    assert!(reg.get_per_device_resource::<OtherStream>(0).is_err());
    let old = reg.set_per_device_resource::<()>(0, b.clone()).unwrap();
    assert!(Arc::ptr_eq(&old, &a));
    assert!(Arc::ptr_eq(&reg.get_per_device_resource::<()>(0).unwrap(), &b));
    assert!(Arc::ptr_eq(&reg.reset_per_device_resource::<()>(0).unwrap(), &b));
    assert!(reg.get_per_device_resource::<()>(0).is_err());
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
    let d0 = reg.get_per_device_resource::<OtherStream>(0).unwrap();
    assert!(Arc::ptr_eq(&d0, &reg.get_per_device_resource::<OtherStream>(0).unwrap()));
    assert!(!Arc::ptr_eq(&d0, &reg.get_per_device_resource::<OtherStream>(1).unwrap()));
    assert_eq!(
        reg.get_per_device_resource::<OtherStream>(9).err(),
        Some(Error::Backend { code: 100, what: "no such device" })
    );
    // The unit stream has no factory in this registry.
    assert!(reg.get_per_device_resource::<()>(0).is_err());
    let s = OtherStream::default();
    let b = d0.allocate(Request::new(10).unwrap(), &s).unwrap();
    d0.deallocate(b, &s).unwrap();
}

#[test]
fn concurrent_gets_agree() {
    let reg = Registry::new();
    reg.set_default_factory::<()>(|_| Ok(bump(1 << 20)));
    let got: Vec<DynResource> = std::thread::scope(|s| {
        let handles: Vec<_> =
            (0..4).map(|_| s.spawn(|| reg.get_per_device_resource::<()>(3).unwrap())).collect();
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
    assert!(set_per_device_resource::<GlobalOnly>(0, r.clone()).is_none());
    assert!(Arc::ptr_eq(&get_per_device_resource::<GlobalOnly>(0).unwrap(), &r));
    assert!(Arc::ptr_eq(&global().get_per_device_resource::<GlobalOnly>(0).unwrap(), &r));
}

/// RMM's current-device pair: the device is the one the stream type's query
/// names (device 0 without one); setting returns what it replaces; a query
/// that fails sets nothing.
#[test]
fn current_device_resource_follows_the_query() {
    let reg = Registry::new();
    let (a, b) = (bump(1 << 20), bump(1 << 20));
    assert!(reg.set_current_device_resource::<()>(a.clone()).unwrap().is_none());
    assert!(Arc::ptr_eq(&reg.get_per_device_resource::<()>(0).unwrap(), &a));
    assert!(!reg.set_current_device_query::<()>(|| Ok(5)));
    assert!(reg.get_current_device_resource::<()>().is_err(), "device 5 has none");
    assert!(reg.set_current_device_resource::<()>(b.clone()).unwrap().is_none());
    assert!(Arc::ptr_eq(&reg.get_current_device_resource::<()>().unwrap(), &b));
    assert!(Arc::ptr_eq(&reg.set_current_device_resource::<()>(a.clone()).unwrap().unwrap(), &b));
    // Other stream types keep device 0.
    assert_eq!(reg.current_device::<OtherStream>(), Ok(0));
    assert!(reg.set_current_device_query::<()>(|| Err(Error::Backend { code: 3, what: "no device" })));
    assert_eq!(
        reg.set_current_device_resource::<()>(b).err(),
        Some(Error::Backend { code: 3, what: "no device" })
    );
    assert!(Arc::ptr_eq(&reg.get_per_device_resource::<()>(5).unwrap(), &a), "nothing set on failure");
}

/// A default factory that wraps its own device's resource (asking for it
/// before it is stored), and a current-device query that asks for the
/// current device: each ran itself again without end, until the stack
/// overflowed and the process aborted. Now the inner call is refused, the
/// factory's error is the outer call's, and nothing is stored; a factory
/// that wraps another device's resource still works.
#[test]
fn a_factory_or_query_that_asks_for_what_it_makes_is_refused() {
    // A stream type of its own: no other test may register it globally.
    type Wrapping = TestStream<12>;
    fn wraps(device: DeviceId) -> Result<DynResource<Wrapping>> {
        let inner = match device {
            0 => Arc::new(BumpUpstream::new(1 << 20)) as DynResource<Wrapping>,
            _ => get_per_device_resource::<Wrapping>(device - 1)?,
        };
        let wrapped = get_per_device_resource::<Wrapping>(device).map(|_| ()).err();
        assert!(matches!(wrapped, Some(Error::InvalidConfig { .. })), "{wrapped:?}");
        Ok(Arc::new(Statistics::new(inner)))
    }
    set_default_factory::<Wrapping>(wraps);
    let one = get_per_device_resource::<Wrapping>(1).unwrap();
    let b = one.allocate(Request::new(256).unwrap(), &Wrapping::default()).unwrap();
    one.deallocate(b, &Wrapping::default()).unwrap();
    assert!(Arc::ptr_eq(&get_per_device_resource::<Wrapping>(1).unwrap(), &one), "stored once");

    let reg = Registry::new();
    reg.set_current_device_query::<Wrapping>(|| Ok(global().current_device::<Wrapping>()? + 1));
    assert_eq!(reg.current_device::<Wrapping>(), Ok(1), "the global registry has no query");
    set_current_device_query::<Wrapping>(|| global().current_device::<Wrapping>());
    assert!(matches!(global().current_device::<Wrapping>(), Err(Error::InvalidConfig { .. })));
    assert!(matches!(get_current_device_resource::<Wrapping>(), Err(Error::InvalidConfig { .. })));
}
