//! Every container method with data round trips, written once over a
//! [`Setup`] (a resource, a copy engine and two streams) so that each
//! backend runs the same assertions over its own memory.
#![allow(dead_code, unreachable_pub)]

use memres_containers::{ContainerError, DeviceBuffer, DeviceScalar, DeviceUVector};
use memres_core::copy::{CopyEngine, MemoryOf};
use memres_core::{Error, MemoryResource, Stream};

/// What the assertions run over. Each test takes a fresh one: nothing is
/// allocated from it yet.
pub trait Setup {
    /// The stream type of the containers.
    type S<'a>: Stream
    where
        Self: 'a;
    /// The resource under test: memory of the engine.
    type R<'a>: MemoryResource<Self::S<'a>> + MemoryOf<<Self::E<'a> as CopyEngine<Self::S<'a>>>::Kind> + Clone
    where
        Self: 'a;
    /// The backend's copy engine.
    type E<'a>: CopyEngine<Self::S<'a>> + Clone
    where
        Self: 'a;

    /// The stream the containers start on.
    fn stream(&self) -> Self::S<'_>;
    /// A second stream (the same one where the backend has only one).
    fn other_stream(&self) -> Self::S<'_>;
    fn resource(&self) -> Self::R<'_>;
    fn engine(&self) -> Self::E<'_>;

    /// Bytes handed out by the resource and not given back, once the work
    /// queued on both streams has completed; runs the resource's invariant
    /// checker where it has one.
    fn used(&self) -> u64;
    /// What [`used`](Self::used) counts for one live block of `size` bytes,
    /// where the resource's accounting is exact.
    fn charge(&self, size: u64) -> Option<u64>;
    /// Bytes the resource holds from the memory below it.
    fn held(&self) -> u64;
    /// A number of `u64`s the resource cannot hold.
    fn too_many_u64(&self) -> usize;
}

/// Checks that the resource counts exactly one live block of `size` bytes.
fn expect_one_block<T: Setup>(t: &T, size: u64) {
    let used = t.used();
    match t.charge(size) {
        Some(c) => assert_eq!(used, c, "one block of {size} bytes"),
        None => assert!(used >= size, "one block of {size} bytes, {used} counted"),
    }
}

pub fn buffer_round_trip_resize_reserve_shrink<T: Setup>(t: &T) {
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    let mut b = DeviceBuffer::from_slice(&data, t.stream(), t.resource(), t.engine()).unwrap();
    assert_eq!((b.len(), b.capacity()), (1000, 1000));
    assert_eq!(b.to_vec().unwrap(), data);
    expect_one_block(t, 1000);

    b.resize(5000).unwrap();
    assert_eq!(b.len(), 5000);
    let all = b.to_vec().unwrap();
    assert_eq!(&all[..1000], &data[..], "resize keeps the prefix");
    assert!(all[1000..].iter().all(|&x| x == 0), "and zeroes the rest");
    expect_one_block(t, 5000);
    b.resize(10).unwrap();
    assert_eq!((b.len(), b.capacity()), (10, 5000), "shrinking the length keeps the memory");
    assert_eq!(b.to_vec().unwrap(), &data[..10]);

    b.reserve(20_000).unwrap();
    assert_eq!((b.len(), b.capacity()), (10, 20_000));
    assert_eq!(b.to_vec().unwrap(), &data[..10]);
    b.shrink_to_fit().unwrap();
    assert_eq!(b.capacity(), 10);
    assert_eq!(b.to_vec().unwrap(), &data[..10]);
    expect_one_block(t, 10);

    b.fill(0xAB).unwrap();
    assert_eq!(b.to_vec().unwrap(), vec![0xAB; 10]);
    b.write(2, &[1, 2, 3]).unwrap();
    let mut out = [0u8; 4];
    b.read(1, &mut out).unwrap();
    assert_eq!(out, [0xAB, 1, 2, 3]);
    assert!(matches!(b.write(8, &[0; 3]), Err(ContainerError::IndexOutOfRange { .. })));
    assert!(matches!(b.read(9, &mut out), Err(ContainerError::IndexOutOfRange { .. })));
    assert_eq!(
        b.to_vec().unwrap(),
        [0xAB, 0xAB, 1, 2, 3, 0xAB, 0xAB, 0xAB, 0xAB, 0xAB],
        "failed calls wrote nothing"
    );
    b.clear();
    assert!(b.is_empty());
    b.shrink_to_fit().unwrap();
    assert_eq!(b.capacity(), 0);
    assert_eq!(t.used(), 0, "an empty buffer holds no memory");
    drop(b);
    assert_eq!(t.used(), 0, "drop frees to the resource");
}

pub fn zero_length_containers_allocate_nothing<T: Setup>(t: &T) {
    let held = t.held();
    let b = DeviceBuffer::new(0, t.stream(), t.resource(), t.engine()).unwrap();
    assert_eq!((b.len(), b.capacity(), b.addr()), (0, 0, 0));
    assert_eq!(b.to_vec().unwrap(), Vec::<u8>::new());
    let v = DeviceUVector::<u32, _, _, _>::new(0, t.stream(), t.resource(), t.engine()).unwrap();
    assert!(v.is_empty());
    assert_eq!(v.device_ptr(), 0);
    assert_eq!(v.to_vec().unwrap(), Vec::<u32>::new());
    let w = DeviceUVector::<u64, _, _, _>::from_slice(&[], t.stream(), t.resource(), t.engine()).unwrap();
    assert_eq!(w.device_ptr(), 0);
    let c = b.try_clone_on(t.other_stream()).unwrap();
    assert_eq!(c.addr(), 0);
    assert_eq!(t.used(), 0);
    assert_eq!(t.held(), held, "no memory taken");
    drop((b, v, w, c));
    assert_eq!(t.used(), 0);
}

pub fn resize_beyond_the_limit_is_an_error_and_leaves_the_container_unchanged<T: Setup>(t: &T) {
    let mut v = DeviceUVector::from_slice(&[1u64, 2, 3, 4], t.stream(), t.resource(), t.engine()).unwrap();
    let before = (v.len(), v.capacity(), v.device_ptr());
    let e = v.resize(t.too_many_u64()).unwrap_err();
    assert!(matches!(e, ContainerError::Memory(Error::OutOfMemory { .. })), "{e:?}");
    assert_eq!((v.len(), v.capacity(), v.device_ptr()), before);
    assert_eq!(v.to_vec().unwrap(), vec![1, 2, 3, 4]);
    assert!(v.reserve(t.too_many_u64()).is_err());
    assert_eq!((v.len(), v.capacity(), v.device_ptr()), before);
    assert_eq!(v.to_vec().unwrap(), vec![1, 2, 3, 4]);
    expect_one_block(t, 32);
    let e = v.resize(usize::MAX).unwrap_err();
    assert_eq!(e, ContainerError::LengthOverflow { len: usize::MAX });
    // The resource is still usable.
    v.resize(8).unwrap();
    assert_eq!(&v.to_vec().unwrap()[..4], &[1, 2, 3, 4]);
    drop(v);
    assert_eq!(t.used(), 0);
}

pub fn uvector_elements_and_growth<T: Setup>(t: &T) {
    let mut v = DeviceUVector::<f32, _, _, _>::new(3, t.stream(), t.resource(), t.engine()).unwrap();
    assert_eq!(v.to_vec().unwrap(), vec![0.0; 3], "a new vector is zero");
    for i in 0..3 {
        v.set_element_async(i, &(i as f32 * 1.5)).unwrap();
    }
    assert_eq!(v.to_vec().unwrap(), vec![0.0, 1.5, 3.0]);
    assert!(matches!(v.element(3), Err(ContainerError::IndexOutOfRange { index: 3, len: 3 })));
    assert!(matches!(
        v.set_element_async(7, &1.0),
        Err(ContainerError::IndexOutOfRange { index: 7, len: 3 })
    ));
    assert!(matches!(v.copy_from_slice_at(2, &[1.0, 2.0]), Err(ContainerError::IndexOutOfRange { .. })));
    assert_eq!(v.to_vec().unwrap(), vec![0.0, 1.5, 3.0], "failed writes wrote nothing");
    // Resize by doubling keeps the elements.
    let mut n = 3;
    while n < 3000 {
        n *= 2;
        v.resize(n).unwrap();
        assert_eq!(v.element(2).unwrap(), 3.0);
        assert_eq!(v.element(0).unwrap(), 0.0);
        assert_eq!(v.element(n - 1).unwrap(), 0.0, "new elements are zero");
        expect_one_block(t, n as u64 * 4);
    }
    let tail: Vec<f32> = (0..100).map(|i| i as f32 + 0.25).collect();
    v.copy_from_slice_at(n - 100, &tail).unwrap();
    v.copy_from_slice_at(100, &[9.0, 8.0]).unwrap();
    assert_eq!((v.element(100).unwrap(), v.element(101).unwrap()), (9.0, 8.0));
    assert_eq!(v.size_bytes(), n as u64 * 4);
    v.reserve(10_000).unwrap();
    assert_eq!(v.capacity(), 10_000);
    v.shrink_to_fit().unwrap();
    assert_eq!(v.capacity(), n);
    let all = v.to_vec().unwrap();
    assert_eq!(&all[..3], &[0.0, 1.5, 3.0]);
    assert_eq!(&all[n - 100..], &tail[..], "reallocations kept the last elements");
    assert_ne!(v.device_ptr(), 0);
    v.clear();
    assert_eq!(v.len(), 0);
    drop(v);
    assert_eq!(t.used(), 0);
}

pub fn buffer_vector_conversions<T: Setup>(t: &T) {
    let v = DeviceUVector::from_slice(&[1u32, 2, 3], t.stream(), t.resource(), t.engine()).unwrap();
    let addr = v.device_ptr();
    let b = v.into_buffer();
    assert_eq!((b.len(), b.addr()), (12, addr));
    assert_eq!(b.to_vec().unwrap(), [1u32, 2, 3].iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<_>>());
    let v: DeviceUVector<u16, _, _, _> = b.try_into_uvector().unwrap();
    let expected: Vec<u16> =
        if cfg!(target_endian = "little") { vec![1, 0, 2, 0, 3, 0] } else { vec![0, 1, 0, 2, 0, 3] };
    assert_eq!(v.to_vec().unwrap(), expected);
    assert_eq!(v.as_buffer().len(), 12);
    let b = v.into_buffer();
    let (e, b) = b.try_into_uvector::<[u8; 5]>().unwrap_err();
    assert_eq!(e, ContainerError::NotWholeElements { bytes: 12, element_size: 5 });
    assert_eq!((b.len(), b.addr()), (12, addr), "the buffer comes back unchanged");
    assert_eq!(b.to_vec().unwrap().len(), 12);
    drop(b);
    assert_eq!(t.used(), 0);
}

/// 64 KiB (4 KiB under Miri) of bytes that differ from their neighbours.
fn payload() -> Vec<u8> {
    let len: u32 = if cfg!(miri) { 4 << 10 } else { 64 << 10 };
    (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

pub fn deep_copy_and_stream_change<T: Setup>(t: &T) {
    let data = payload();
    let mut a = DeviceBuffer::from_slice(&data, t.stream(), t.resource(), t.engine()).unwrap();
    let b = a.try_clone_on(t.other_stream()).unwrap();
    assert_ne!(a.addr(), b.addr());
    assert_eq!(b.stream().id(), t.other_stream().id());
    assert_eq!((b.len(), b.capacity()), (a.len(), a.len()));
    assert_eq!(b.to_vec().unwrap(), data, "the copy has the data");
    a.fill(0).unwrap();
    assert_eq!(b.to_vec().unwrap(), data, "the copy is deep");
    // Work queued on the first stream is seen on the second after the change.
    a.set_stream(t.other_stream()).unwrap();
    assert_eq!(a.stream().id(), t.other_stream().id());
    assert_eq!(a.to_vec().unwrap(), vec![0; data.len()]);
    // And back: a fill on the second stream, read on the first.
    a.fill(0x5C).unwrap();
    a.set_stream(t.stream()).unwrap();
    assert_eq!(a.to_vec().unwrap(), vec![0x5C; data.len()]);

    // A clone of a clone, then the original's stream changes under a pending fill.
    let mut v = DeviceUVector::from_slice(&[7u32; 1000], t.stream(), t.resource(), t.engine()).unwrap();
    v.set_element_async(999, &8).unwrap();
    let w = v.as_buffer().try_clone_on(t.other_stream()).unwrap().try_into_uvector::<u32>().unwrap();
    let mut expected = vec![7u32; 1000];
    expected[999] = 8;
    assert_eq!(w.to_vec().unwrap(), expected);
    v.set_stream(t.other_stream()).unwrap();
    assert_eq!(v.to_vec().unwrap(), expected);
    drop((a, b, v, w));
    assert_eq!(t.used(), 0, "the blocks were freed on their last streams");
}

pub fn scalar_round_trip<T: Setup>(t: &T) {
    let mut s = DeviceScalar::<i64, _, _, _>::new(t.stream(), t.resource(), t.engine()).unwrap();
    assert_eq!(s.value().unwrap(), 0, "a new scalar is zero");
    s.set_value_async(&-5).unwrap();
    assert_eq!(s.value().unwrap(), -5);
    let mut u = DeviceScalar::from_value(&[1u8, 2], t.stream(), t.resource(), t.engine()).unwrap();
    assert_eq!(u.value().unwrap(), [1, 2]);
    assert_ne!(s.device_ptr(), u.device_ptr());
    assert!(format!("{s:?}").contains("DeviceScalar"));
    s.set_value_async(&i64::MIN).unwrap();
    s.set_stream(t.other_stream()).unwrap();
    assert_eq!(s.stream().id(), t.other_stream().id());
    assert_eq!(s.value().unwrap(), i64::MIN);
    u.set_value_async(&[3, 4]).unwrap();
    assert_eq!(u.value().unwrap(), [3, 4]);
    drop((s, u));
    assert_eq!(t.used(), 0);
}

/// A test for every assertion above, each over a fresh setup from `make`
/// (a function from the test's name to `Option<impl Setup>`; `None`: skipped).
macro_rules! container_suite {
    ($make:expr) => {
        container_suite!(@tests $make;
            buffer_round_trip_resize_reserve_shrink,
            zero_length_containers_allocate_nothing,
            resize_beyond_the_limit_is_an_error_and_leaves_the_container_unchanged,
            uvector_elements_and_growth,
            buffer_vector_conversions,
            deep_copy_and_stream_change,
            scalar_round_trip
        );
    };
    (@tests $make:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                if let Some(t) = $make(concat!(module_path!(), "::", stringify!($name))) {
                    $crate::suite::$name(&t);
                }
            }
        )*
    };
}
