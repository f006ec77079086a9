//! The constructors without a resource: they take the current resource of
//! the stream's device from the process-wide registry, and only one that
//! was promised as memory of the engine. The tests share the registry, so
//! each uses devices (or a stream type) of its own.

use memres_containers::{ContainerError, Current, DeviceBuffer, DeviceScalar, DeviceUVector};
use memres_core::device::{global, promise_memory_of, set_per_device_resource_of, DeviceId, DeviceStream};
use memres_core::{DynResource, Error, Inspect, MemoryResource, Result as CoreResult, Stream};
use memres_sim::{HostCopy, HostMemory, SimDevice};
use std::sync::Arc;

/// A stream of device `self.0`, ordered with everything (as `()`), of a
/// stream type of its own per `KIND` (a default factory is per type).
#[derive(Clone, Copy, Debug)]
struct OnDevice<const KIND: u32 = 0>(DeviceId);

impl<const KIND: u32> Stream for OnDevice<KIND> {
    type Event = ();
    fn id(&self) -> u64 {
        0
    }
    fn record(&self) -> CoreResult<()> {
        Ok(())
    }
    fn wait(&self, _: &()) -> CoreResult<()> {
        Ok(())
    }
    fn query(&self, _: &()) -> CoreResult<bool> {
        Ok(true)
    }
    fn synchronize(&self) -> CoreResult<()> {
        Ok(())
    }
}

impl<const KIND: u32> DeviceStream for OnDevice<KIND> {
    type Key = Self;
    fn key(&self) -> &Self {
        self
    }
    fn device(&self) -> DeviceId {
        self.0
    }
}

/// A stream of device `device`, of the first stream type.
fn on(device: DeviceId) -> OnDevice {
    OnDevice(device)
}

/// What the containers answer when the device has no resource promised as
/// memory of `HostCopy`.
fn not_promised(e: ContainerError) -> bool {
    matches!(e, ContainerError::Memory(Error::InvalidConfig { .. }))
}

#[test]
fn containers_without_a_resource_use_the_current_resource_of_the_streams_device() {
    let (one, two) = (Arc::new(HostMemory::new()), Arc::new(HostMemory::new()));
    set_per_device_resource_of::<OnDevice, _, _>(1, one.clone(), HostCopy);
    set_per_device_resource_of::<OnDevice, _, _>(2, two.clone(), HostCopy);
    let s1 = on(1);
    let mut b: DeviceBuffer<_, HostCopy, _> = DeviceBuffer::from_slice(b"abc", s1).unwrap();
    let v = DeviceUVector::<u32, _, HostCopy, _>::new(10, s1).unwrap();
    let s = DeviceScalar::<u64, _, HostCopy, _>::from_value(&9, s1).unwrap();
    assert_eq!((one.live_count(), two.live_count()), (3, 0), "from device 1's resource");
    assert_eq!(
        (b.to_vec().unwrap(), v.to_vec().unwrap(), s.value().unwrap()),
        (b"abc".to_vec(), vec![0; 10], 9)
    );
    // A reference to the stream is a stream of the same device.
    let s2 = on(2);
    let w: DeviceUVector<u8, Current<&OnDevice, HostCopy>, HostCopy, &OnDevice> =
        DeviceUVector::from_slice(&[4, 5], &s2).unwrap();
    // SAFETY: `b`'s bytes: host memory this test holds, written above.
    let c = unsafe { DeviceBuffer::<_, HostCopy, _>::from_device_ptr(b.addr(), 3, &s2) }.unwrap();
    // SAFETY: as above, `v` zeroed on creation.
    let z = unsafe { DeviceScalar::<u32, _, HostCopy, _>::from_device_ptr(v.addr(), s2) }.unwrap();
    assert_eq!((one.live_count(), two.live_count()), (3, 3), "from device 2's");
    assert_eq!(
        (w.to_vec().unwrap(), c.to_vec().unwrap(), z.value().unwrap()),
        (vec![4, 5], b"abc".to_vec(), 0)
    );
    // Clones and growth stay with the resource they came from.
    let v2 = v.try_clone().unwrap();
    b.resize(1000).unwrap();
    assert_eq!((one.live_count(), two.live_count()), (4, 3));
    drop((b, v, s, w, c, z, v2));
    assert_eq!((one.live_count(), two.live_count()), (0, 0));
}

#[test]
fn a_current_resource_that_is_not_promised_memory_is_refused_not_touched() {
    let s = on(3);
    // Nothing set, no default factory for the type.
    assert!(not_promised(DeviceUVector::<u32, _, HostCopy, _>::new(4, s).unwrap_err()));
    // A simulated device, set as every user of the registry may set it:
    // numbers with no bytes behind them, which `HostCopy` must never touch.
    let sim = Arc::new(SimDevice::new(1 << 30));
    global().set_per_device_resource::<OnDevice>(3, sim.clone());
    assert!(not_promised(DeviceBuffer::<_, HostCopy, _>::new(64, s).unwrap_err()));
    assert!(not_promised(DeviceScalar::<u8, _, HostCopy, _>::from_value(&1, s).unwrap_err()));
    // SAFETY: refused before any copy (no resource to copy into).
    let e = unsafe { DeviceUVector::<u8, _, HostCopy, _>::from_device_ptr(0x1000, 4, s) };
    assert!(not_promised(e.unwrap_err()));
    assert_eq!(sim.usage().held, 0, "nothing was allocated from it");
    // Host memory set with its promise serves; set over without one, the
    // containers refuse again.
    let host = Arc::new(HostMemory::new());
    let previous = set_per_device_resource_of::<OnDevice, _, _>(3, host.clone(), HostCopy).unwrap();
    assert_eq!(Arc::as_ptr(&previous).cast::<()>(), Arc::as_ptr(&sim).cast::<()>(), "the one it replaces");
    let v = DeviceUVector::<u32, _, HostCopy, _>::new(4, s).unwrap();
    let plain: DynResource<OnDevice> = Arc::new(HostMemory::new());
    global().set_per_device_resource::<OnDevice>(3, plain);
    assert!(not_promised(DeviceUVector::<u32, _, HostCopy, _>::new(4, s).unwrap_err()));
    assert_eq!(v.to_vec().unwrap(), [0; 4], "a container made before keeps its resource");
    drop(v);
    assert_eq!(host.live_count(), 0);
}

#[test]
fn a_default_factory_that_promises_its_resources_serves_the_containers() {
    fn host_per_device(_: DeviceId) -> CoreResult<DynResource<OnDevice<1>>> {
        let host = Arc::new(HostMemory::new());
        promise_memory_of::<OnDevice<1>, _, _>(&host, HostCopy);
        Ok(host)
    }
    global().set_default_factory::<OnDevice<1>>(host_per_device);
    let a = DeviceUVector::<u16, _, HostCopy, _>::from_slice(&[1, 2], OnDevice::<1>(0)).unwrap();
    let b = DeviceUVector::<u16, _, HostCopy, _>::from_slice(&[3], OnDevice::<1>(0)).unwrap();
    let c = DeviceUVector::<u16, _, HostCopy, _>::from_slice(&[4], OnDevice::<1>(1)).unwrap();
    let resource = |v: &DeviceUVector<u16, Current<OnDevice<1>, HostCopy>, HostCopy, OnDevice<1>>| {
        Arc::as_ptr(v.as_buffer().resource().resource()).cast::<()>()
    };
    assert_eq!(resource(&a), resource(&b), "one default per device");
    assert_ne!(resource(&a), resource(&c));
    assert_eq!(
        (a.to_vec().unwrap(), b.to_vec().unwrap(), c.to_vec().unwrap()),
        (vec![1, 2], vec![3], vec![4])
    );
}

#[test]
fn the_unit_stream_is_device_zero() {
    let host = Arc::new(HostMemory::new());
    set_per_device_resource_of::<(), _, _>(0, host.clone(), HostCopy);
    let s = DeviceScalar::<i32, _, HostCopy>::from_value(&-1, ()).unwrap();
    assert_eq!((s.value().unwrap(), host.live_count()), (-1, 1));
}

#[test]
fn two_containers_of_one_current_resource_are_equal() {
    let host = Arc::new(HostMemory::new());
    set_per_device_resource_of::<OnDevice, _, _>(14, host.clone(), HostCopy);
    let a: DeviceBuffer<_, HostCopy, _> = DeviceBuffer::new(8, on(14)).unwrap();
    let b: DeviceBuffer<_, HostCopy, _> = DeviceBuffer::new(8, on(14)).unwrap();
    // A block of one may be given back to the other: they are equal.
    assert!(MemoryResource::<OnDevice>::is_equal(a.resource(), b.resource()));
    assert!(MemoryResource::<OnDevice>::is_equal(a.resource(), &host));
}
