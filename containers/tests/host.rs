//! Every container method over host memory, with data round trips.

use memres_containers::{ContainerError, DeviceBuffer, DeviceScalar, DeviceUVector};
use memres_core::pool::{CoalescingPool, PoolConfig};
use memres_core::{Error, Shared};
use memres_host::{HostCopy, HostMemory};

type Pool<'a> = Shared<CoalescingPool<&'a HostMemory>>;

fn pool(mem: &HostMemory, max: u64) -> Pool<'_> {
    let config = PoolConfig::new().maximum_size(max);
    Shared::new(CoalescingPool::with_config(mem, config, &()).unwrap())
}

fn used(p: &Pool<'_>) -> u64 {
    p.with(|p| {
        p.check().unwrap();
        p.used_bytes()
    })
}

#[test]
fn buffer_round_trip_resize_reserve_shrink() {
    let mem = HostMemory::new();
    let p = pool(&mem, 64 << 20);
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    let mut b = DeviceBuffer::from_slice(&data, (), &p, HostCopy).unwrap();
    assert_eq!((b.len(), b.capacity()), (1000, 1000));
    assert_eq!(b.to_vec().unwrap(), data);
    assert_eq!(used(&p), 1024);

    b.resize(5000).unwrap();
    assert_eq!(b.len(), 5000);
    assert_eq!(&b.to_vec().unwrap()[..1000], &data[..], "resize keeps the prefix");
    b.resize(10).unwrap();
    assert_eq!((b.len(), b.capacity()), (10, 5000), "shrinking the length keeps the memory");
    assert_eq!(b.to_vec().unwrap(), &data[..10]);

    b.reserve(20_000).unwrap();
    assert_eq!((b.len(), b.capacity()), (10, 20_000));
    assert_eq!(b.to_vec().unwrap(), &data[..10]);
    b.shrink_to_fit().unwrap();
    assert_eq!(b.capacity(), 10);
    assert_eq!(b.to_vec().unwrap(), &data[..10]);
    assert_eq!(used(&p), 256);

    b.fill(0xAB).unwrap();
    assert_eq!(b.to_vec().unwrap(), vec![0xAB; 10]);
    b.write(2, &[1, 2, 3]).unwrap();
    let mut out = [0u8; 4];
    b.read(1, &mut out).unwrap();
    assert_eq!(out, [0xAB, 1, 2, 3]);
    assert!(matches!(b.write(8, &[0; 3]), Err(ContainerError::IndexOutOfRange { .. })));
    b.clear();
    assert!(b.is_empty());
    b.shrink_to_fit().unwrap();
    assert_eq!(b.capacity(), 0);
    drop(b);
    assert_eq!(used(&p), 0, "drop frees to the resource");
}

#[test]
fn zero_length_containers_allocate_nothing() {
    let mem = HostMemory::new();
    let p = pool(&mem, 1 << 20);
    let b = DeviceBuffer::new(0, (), &p, HostCopy).unwrap();
    assert_eq!((b.len(), b.capacity(), b.addr()), (0, 0, 0));
    assert_eq!(b.to_vec().unwrap(), Vec::<u8>::new());
    let v = DeviceUVector::<u32, _, _>::new(0, (), &p, HostCopy).unwrap();
    assert!(v.is_empty());
    assert_eq!(v.to_vec().unwrap(), Vec::<u32>::new());
    assert_eq!(p.with(|p| p.pool_size()), 0, "no memory taken");
    drop((b, v));
    assert_eq!(used(&p), 0);
}

#[test]
fn resize_beyond_the_limit_is_an_error_and_leaves_the_container_unchanged() {
    let mem = HostMemory::new();
    let p = pool(&mem, 1 << 20);
    let mut v = DeviceUVector::from_slice(&[1u64, 2, 3, 4], (), &p, HostCopy).unwrap();
    let before = (v.len(), v.capacity(), v.device_ptr());
    let e = v.resize(1 << 20).unwrap_err();
    assert!(matches!(e, ContainerError::Memory(Error::OutOfMemory { .. })), "{e:?}");
    assert_eq!((v.len(), v.capacity(), v.device_ptr()), before);
    assert_eq!(v.to_vec().unwrap(), vec![1, 2, 3, 4]);
    assert!(v.reserve(1 << 20).is_err());
    assert_eq!(v.to_vec().unwrap(), vec![1, 2, 3, 4]);
    drop(v);
    assert_eq!(used(&p), 0);
}

#[test]
fn uvector_elements_and_growth() {
    let mem = HostMemory::new();
    let p = pool(&mem, 64 << 20);
    let mut v = DeviceUVector::<f32, _, _>::new(3, (), &p, HostCopy).unwrap();
    for i in 0..3 {
        v.set_element_async(i, &(i as f32 * 1.5)).unwrap();
    }
    assert_eq!(v.to_vec().unwrap(), vec![0.0, 1.5, 3.0]);
    assert!(matches!(v.element(3), Err(ContainerError::IndexOutOfRange { index: 3, len: 3 })));
    assert!(matches!(
        v.set_element_async(7, &1.0),
        Err(ContainerError::IndexOutOfRange { index: 7, len: 3 })
    ));
    // Resize by doubling keeps the elements.
    let mut n = 3;
    while n < 3000 {
        n *= 2;
        v.resize(n).unwrap();
        assert_eq!(v.element(2).unwrap(), 3.0);
    }
    v.copy_from_slice_at(100, &[9.0, 8.0]).unwrap();
    assert_eq!((v.element(100).unwrap(), v.element(101).unwrap()), (9.0, 8.0));
    assert_eq!(v.size_bytes(), n as u64 * 4);
    v.reserve(10_000).unwrap();
    assert_eq!(v.capacity(), 10_000);
    v.shrink_to_fit().unwrap();
    assert_eq!(v.capacity(), n);
    assert_ne!(v.device_ptr(), 0);
    v.clear();
    assert_eq!(v.len(), 0);
}

#[test]
fn buffer_vector_conversions() {
    let mem = HostMemory::new();
    let p = pool(&mem, 1 << 20);
    let v = DeviceUVector::from_slice(&[1u32, 2, 3], (), &p, HostCopy).unwrap();
    let b = v.into_buffer();
    assert_eq!(b.len(), 12);
    let v: DeviceUVector<u16, _, _> = b.try_into_uvector().unwrap();
    assert_eq!(v.to_vec().unwrap(), vec![1, 0, 2, 0, 3, 0]);
    let b = v.into_buffer();
    let (e, b) = b.try_into_uvector::<[u8; 5]>().unwrap_err();
    assert_eq!(e, ContainerError::NotWholeElements { bytes: 12, element_size: 5 });
    assert_eq!(b.len(), 12, "the buffer comes back unchanged");
}

#[test]
fn deep_copy_and_stream_change() {
    let mem = HostMemory::new();
    let p = pool(&mem, 1 << 20);
    let mut a = DeviceBuffer::from_slice(b"memres", (), &p, HostCopy).unwrap();
    let b = a.try_clone_on(()).unwrap();
    assert_ne!(a.addr(), b.addr());
    a.fill(0).unwrap();
    assert_eq!(b.to_vec().unwrap(), b"memres", "the copy is deep");
    a.set_stream(()).unwrap();
    assert_eq!(a.to_vec().unwrap(), vec![0; 6]);
}

#[test]
fn scalar_round_trip() {
    let mem = HostMemory::new();
    let p = pool(&mem, 1 << 20);
    let mut s = DeviceScalar::<i64, _, _>::new((), &p, HostCopy).unwrap();
    s.set_value_async(&-5).unwrap();
    assert_eq!(s.value().unwrap(), -5);
    let t = DeviceScalar::from_value(&[1u8, 2], (), &p, HostCopy).unwrap();
    assert_eq!(t.value().unwrap(), [1, 2]);
    assert_ne!(s.device_ptr(), t.device_ptr());
    assert!(format!("{s:?}").contains("DeviceScalar"));
    drop((s, t));
    assert_eq!(used(&p), 0);
}
