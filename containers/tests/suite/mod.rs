//! Every container method with data round trips, written once over a
//! [`Setup`] (a resource, a copy engine and two streams) so that each
//! backend runs the same assertions over its own memory.
#![allow(dead_code, unreachable_pub)]

use memres_containers::{ContainerError, DeviceBuffer, DeviceScalar, DeviceUVector};
use memres_core::copy::{CopyEngine, MemoryOf};
use memres_core::{Block, Error, MemoryResource, Request, Stream};

/// What the assertions run over. Each test takes a fresh one: nothing is
/// allocated from it yet.
pub trait Setup {
    /// The stream type of the containers.
    type S<'a>: Stream + Clone
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
    let mut b = DeviceBuffer::from_slice_in(&data, t.stream(), t.resource(), t.engine()).unwrap();
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
    // The error names the last byte the range would touch, as a vector's
    // names its last element (it said the byte after it: 11).
    assert_eq!(b.write(8, &[0; 3]), Err(ContainerError::IndexOutOfRange { index: 10, len: 10 }));
    assert_eq!(b.read(9, &mut out), Err(ContainerError::IndexOutOfRange { index: 12, len: 10 }));
    let past_all = ContainerError::IndexOutOfRange { index: usize::MAX, len: 10 };
    assert_eq!(b.write(u64::MAX - 1, &[0; 3]), Err(past_all));
    assert_eq!(
        b.to_vec().unwrap(),
        [0xAB, 0xAB, 1, 2, 3, 0xAB, 0xAB, 0xAB, 0xAB, 0xAB],
        "failed calls wrote nothing"
    );
    b.clear();
    assert_eq!((b.len(), b.capacity()), (0, 10), "clearing keeps the memory");
    b.resize(0).unwrap();
    assert_eq!(b.capacity(), 10, "so does resizing to zero");
    expect_one_block(t, 10);
    b.shrink_to_fit().unwrap();
    assert_eq!((b.capacity(), b.block()), (0, Block::EMPTY));
    assert_eq!(t.used(), 0, "an empty buffer shrunk to fit holds no memory");
    drop(b);
    assert_eq!(t.used(), 0, "drop frees to the resource");
}

pub fn zero_length_containers_allocate_nothing<T: Setup>(t: &T) {
    let held = t.held();
    let b = DeviceBuffer::new_in(0, t.stream(), t.resource(), t.engine()).unwrap();
    assert_eq!((b.len(), b.capacity(), b.addr()), (0, 0, 0));
    assert_eq!(b.to_vec().unwrap(), Vec::<u8>::new());
    let v = DeviceUVector::<u32, _, _, _>::new_in(0, t.stream(), t.resource(), t.engine()).unwrap();
    assert!(v.is_empty());
    assert_eq!(v.addr(), 0);
    assert_eq!(v.to_vec().unwrap(), Vec::<u32>::new());
    let w = DeviceUVector::<u64, _, _, _>::from_slice_in(&[], t.stream(), t.resource(), t.engine()).unwrap();
    assert_eq!(w.addr(), 0);
    let c = b.try_clone_on(t.other_stream()).unwrap();
    assert_eq!(c.addr(), 0);
    assert_eq!(t.used(), 0);
    assert_eq!(t.held(), held, "no memory taken");
    drop((b, v, w, c));
    assert_eq!(t.used(), 0);
}

pub fn resize_beyond_the_limit_is_an_error_and_leaves_the_container_unchanged<T: Setup>(t: &T) {
    let mut v = DeviceUVector::from_slice_in(&[1u64, 2, 3, 4], t.stream(), t.resource(), t.engine()).unwrap();
    let before = (v.len(), v.capacity(), v.addr());
    let e = v.resize(t.too_many_u64()).unwrap_err();
    assert!(matches!(e, ContainerError::Memory(Error::OutOfMemory { .. })), "{e:?}");
    assert_eq!((v.len(), v.capacity(), v.addr()), before);
    assert_eq!(v.to_vec().unwrap(), vec![1, 2, 3, 4]);
    assert!(v.reserve(t.too_many_u64()).is_err());
    assert_eq!((v.len(), v.capacity(), v.addr()), before);
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
    let mut v = DeviceUVector::<f32, _, _, _>::new_in(3, t.stream(), t.resource(), t.engine()).unwrap();
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
    assert_ne!(v.addr(), 0);
    v.clear();
    assert_eq!(v.len(), 0);
    drop(v);
    assert_eq!(t.used(), 0);
}

pub fn buffer_vector_conversions<T: Setup>(t: &T) {
    let v = DeviceUVector::from_slice_in(&[1u32, 2, 3], t.stream(), t.resource(), t.engine()).unwrap();
    let addr = v.addr();
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
    let mut a = DeviceBuffer::from_slice_in(&data, t.stream(), t.resource(), t.engine()).unwrap();
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
    let mut v = DeviceUVector::from_slice_in(&[7u32; 1000], t.stream(), t.resource(), t.engine()).unwrap();
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
    let mut s = DeviceScalar::<i64, _, _, _>::new_in(t.stream(), t.resource(), t.engine()).unwrap();
    assert_eq!(s.value().unwrap(), 0, "a new scalar is zero");
    s.set_value_async(&-5).unwrap();
    assert_eq!(s.value().unwrap(), -5);
    let mut u = DeviceScalar::from_value_in(&[1u8, 2], t.stream(), t.resource(), t.engine()).unwrap();
    assert_eq!(u.value().unwrap(), [1, 2]);
    assert_ne!(s.addr(), u.addr());
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

/// An element type aligned above the default 256 bytes: the case.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(512))]
pub struct Big([u64; 64]);

fn big(i: u64) -> Big {
    Big([i; 64])
}

pub fn element_types_aligned_above_256_get_blocks_of_their_alignment<T: Setup>(t: &T) {
    // Blocks at offsets 256 apart mod 512 (a suballocator at 256-byte
    // granularity): without asking for 512, one of the two would be misplaced.
    let a = DeviceUVector::from_slice_in(&[big(1)], t.stream(), t.resource(), t.engine()).unwrap();
    let filler = DeviceBuffer::new_in(256, t.stream(), t.resource(), t.engine()).unwrap();
    let b = DeviceUVector::from_slice_in(&[big(2), big(3)], t.stream(), t.resource(), t.engine()).unwrap();
    let s = DeviceScalar::from_value_in(&big(4), t.stream(), t.resource(), t.engine()).unwrap();
    for (what, ptr) in [("a", a.addr()), ("b", b.addr()), ("scalar", s.addr())] {
        assert_eq!(ptr % 512, 0, "{what} at {ptr:#x}");
    }
    assert_eq!((a.alignment(), b.alignment(), filler.alignment()), (512, 512, 256));
    assert_eq!(b.to_vec().unwrap(), [big(2), big(3)]);
    assert_eq!(s.value().unwrap(), big(4));
    // Growth, clones and a trip through the untyped buffer keep it.
    let clone = b.try_clone_on(t.other_stream()).unwrap();
    drop(b);
    let mut b = clone;
    assert_eq!(b.addr() % 512, 0);
    b.resize(5).unwrap();
    assert_eq!((b.addr() % 512, b.element(1).unwrap(), b.element(4).unwrap()), (0, big(3), big(0)));
    let buf = b.into_buffer();
    assert_eq!(buf.alignment(), 512);
    let b: DeviceUVector<Big, _, _, _> = buf.try_into_uvector().unwrap();
    drop((a, filler, b, s));
    assert_eq!(t.used(), 0);
}

pub fn explicit_alignment_is_kept_through_growth_and_clones<T: Setup>(t: &T) {
    let mut v = DeviceUVector::<u32, _, _, _>::new_in(0, t.stream(), t.resource(), t.engine()).unwrap();
    assert_eq!(v.alignment(), 256);
    v.set_alignment(4096).unwrap();
    assert_eq!((v.alignment(), v.addr()), (4096, 0), "an empty vector takes no memory");
    v.resize(100).unwrap();
    assert_eq!(v.addr() % 4096, 0);
    v.copy_from_slice_at(0, &[1, 2, 3]).unwrap();
    for n in [5000, 20_000] {
        v.reserve(n).unwrap();
        assert_eq!(v.addr() % 4096, 0, "reserve({n})");
    }
    v.shrink_to_fit().unwrap();
    assert_eq!(v.addr() % 4096, 0);
    let c = v.try_clone().unwrap();
    assert_eq!((c.alignment(), c.addr() % 4096), (4096, 0));
    assert_eq!(c.slice_to_vec(..4).unwrap(), [1, 2, 3, 0]);
    // A held block moves only if it is not aligned so: the elements with it.
    let mut b = DeviceBuffer::from_slice_in(&[7u8; 300], t.stream(), t.resource(), t.engine()).unwrap();
    b.set_alignment(1 << 16).unwrap();
    assert_eq!((b.addr() % (1 << 16), b.capacity(), b.to_vec().unwrap()), (0, 300, vec![7; 300]));
    let at = b.addr();
    b.set_alignment(512).unwrap();
    assert_eq!((b.addr(), b.alignment()), (at, 512), "already aligned: nothing moves");
    // Alignments no request can hold change nothing.
    for bad in [0, 3, 768, Request::MAX_ALIGN * 2] {
        assert_eq!(
            v.set_alignment(bad),
            Err(ContainerError::Memory(Error::InvalidAlignment { align: bad })),
            "{bad}"
        );
        assert_eq!(b.set_alignment(bad), Err(ContainerError::Memory(Error::InvalidAlignment { align: bad })));
    }
    assert_eq!((v.alignment(), b.alignment(), b.addr()), (4096, 512, at));
    // Below the element type's alignment, a vector keeps the element's.
    let mut w = DeviceUVector::<Big, _, _, _>::new_in(1, t.stream(), t.resource(), t.engine()).unwrap();
    w.set_alignment(64).unwrap();
    assert_eq!(w.alignment(), 512);
    drop((v, c, b, w));
    assert_eq!(t.used(), 0);
}

pub fn copies_from_raw_device_pointers<T: Setup>(t: &T) {
    let data: Vec<u32> = (0..1000).map(|i| i * 3 + 1).collect();
    let v = DeviceUVector::from_slice_in(&data, t.stream(), t.resource(), t.engine()).unwrap();
    // SAFETY: the ranges lie in `v`'s block, memory of the engine that this
    // test holds, written above on the same stream.
    let (w, b, s, e) = unsafe {
        (
            DeviceUVector::<u32, _, _, _>::from_device_ptr_in(
                v.element_addr(10).unwrap(),
                500,
                t.stream(),
                t.resource(),
                t.engine(),
            )
            .unwrap(),
            DeviceBuffer::from_device_ptr_in(v.addr() + 1, 7, t.stream(), t.resource(), t.engine()).unwrap(),
            DeviceScalar::<u32, _, _, _>::from_device_ptr_in(
                v.element_addr(999).unwrap(),
                t.stream(),
                t.resource(),
                t.engine(),
            )
            .unwrap(),
            DeviceBuffer::from_device_ptr_in(0, 0, t.stream(), t.resource(), t.engine()).unwrap(),
        )
    };
    assert_eq!(w.to_vec().unwrap(), &data[10..510]);
    let bytes: &[u8] = bytemuck::cast_slice(&data);
    assert_eq!(b.to_vec().unwrap(), &bytes[1..8]);
    assert_eq!(s.value().unwrap(), data[999]);
    assert_eq!((e.len(), e.addr()), (0, 0), "nothing copied, nothing taken");
    assert_ne!(w.addr(), v.addr(), "a copy, in a block of its own");
    drop(v);
    assert_eq!(w.element(0).unwrap(), data[10], "the copy outlives its source");
    drop((w, b, s, e));
    assert_eq!(t.used(), 0);
}

pub fn clones_are_deep_copies_on_the_containers_own_stream<T: Setup>(t: &T) {
    let mut b =
        DeviceBuffer::from_slice_in(b"device bytes", t.other_stream(), t.resource(), t.engine()).unwrap();
    let mut v =
        DeviceUVector::from_slice_in(&[1.5f64, 2.5, 3.5], t.stream(), t.resource(), t.engine()).unwrap();
    let mut s = DeviceScalar::from_value_in(&-7i16, t.stream(), t.resource(), t.engine()).unwrap();
    let (b2, v2, s2) = (b.try_clone().unwrap(), v.try_clone().unwrap(), s.try_clone().unwrap());
    assert_eq!(b2.stream().id(), t.other_stream().id(), "on the buffer's own stream");
    assert_eq!((v2.stream().id(), s2.stream().id()), (t.stream().id(), t.stream().id()));
    assert_ne!((b2.addr(), v2.addr(), s2.addr()), (b.addr(), v.addr(), s.addr()));
    b.fill(0).unwrap();
    v.fill_zero().unwrap();
    s.set_value_to_zero_async().unwrap();
    assert_eq!(b2.to_vec().unwrap(), b"device bytes", "deep");
    assert_eq!(v2.to_vec().unwrap(), [1.5, 2.5, 3.5]);
    assert_eq!(s2.value().unwrap(), -7);
    assert_eq!(
        (b.to_vec().unwrap(), v.to_vec().unwrap(), s.value().unwrap()),
        (vec![0; 12], vec![0.0; 3], 0)
    );
    drop((b, v, s, b2, v2, s2));
    assert_eq!(t.used(), 0);
}

pub fn clones_into_another_resource_over_the_same_memory<T: Setup>(t: &T) {
    use memres_core::adaptor::Limiting;
    let data = payload();
    let n = data.len() as u64;
    // Another resource type over the same memory, with room for the three
    // copies below and no more: the buffer's bytes, and a granule each for
    // the vector's and the scalar's.
    let kept = Limiting::new(t.resource(), n + 2 * memres_core::DEFAULT_ALIGNMENT);
    let mut a = DeviceBuffer::from_slice_in(&data, t.stream(), t.resource(), t.engine()).unwrap();
    // Queued on the source's stream: the copy on the other stream sees it.
    a.fill(0x11).unwrap();
    let b = a.try_clone_in(t.other_stream(), &kept).unwrap();
    assert_eq!((b.len(), b.alignment(), b.stream().id()), (n, a.alignment(), t.other_stream().id()));
    assert!(kept.get_allocated_bytes() >= n, "the copy's block is the other resource's");
    // And the source's later work comes after the copy: it stays deep.
    a.fill(0x22).unwrap();
    assert_eq!(b.to_vec().unwrap(), vec![0x11; data.len()]);
    assert_eq!(a.to_vec().unwrap(), vec![0x22; data.len()]);

    let v = DeviceUVector::from_slice_in(&[3u64, 1, 4], t.stream(), t.resource(), t.engine()).unwrap();
    let s = DeviceScalar::from_value_in(&-5i32, t.stream(), t.resource(), t.engine()).unwrap();
    let (v2, s2) =
        (v.try_clone_in(t.stream(), &kept).unwrap(), s.try_clone_in(t.other_stream(), &kept).unwrap());
    drop((v, s));
    assert_eq!((v2.to_vec().unwrap(), s2.value().unwrap()), (vec![3, 1, 4], -5));

    // A resource that refuses: a typed error, the source unchanged, nothing kept.
    let used = kept.get_allocated_bytes();
    let e = a.try_clone_in(t.other_stream(), &kept).map(|_| ()).unwrap_err();
    assert!(matches!(e, ContainerError::Memory(Error::LimitExceeded { .. })), "{e:?}");
    assert_eq!(kept.get_allocated_bytes(), used);
    assert_eq!(a.to_vec().unwrap(), vec![0x22; data.len()]);
    drop((b, v2, s2));
    assert_eq!(kept.get_allocated_bytes(), 0);
    drop(a);
    assert_eq!(t.used(), 0);
}

pub fn clone_is_the_deep_copy_of_try_clone<T: Setup>(t: &T) {
    let b = DeviceBuffer::from_slice_in(b"cloned bytes", t.other_stream(), t.resource(), t.engine()).unwrap();
    let mut v = DeviceUVector::from_slice_in(&[4u32, 5, 6], t.stream(), t.resource(), t.engine()).unwrap();
    let s = DeviceScalar::from_value_in(&9u8, t.stream(), t.resource(), t.engine()).unwrap();
    let (mut b2, v2, mut s2) = (b.clone(), v.clone(), s.clone());
    assert_eq!((b2.stream().id(), v2.stream().id()), (t.other_stream().id(), t.stream().id()), "own streams");
    assert_ne!((b2.addr(), v2.addr(), s2.addr()), (b.addr(), v.addr(), s.addr()));
    assert_eq!(
        (b2.to_vec().unwrap(), v2.to_vec().unwrap(), s2.value().unwrap()),
        (b"cloned bytes".to_vec(), vec![4, 5, 6], 9)
    );
    // Independent storage, both ways.
    v.set_element_to_zero_async(0).unwrap();
    b2.fill(b'x').unwrap();
    s2.set_value_to_zero_async().unwrap();
    assert_eq!((v.to_vec().unwrap(), v2.to_vec().unwrap()), (vec![0, 5, 6], vec![4, 5, 6]));
    assert_eq!(
        (b.to_vec().unwrap(), s.value().unwrap(), s2.value().unwrap()),
        (b"cloned bytes".to_vec(), 9, 0)
    );
    drop(v);
    assert_eq!(v2.element(2).unwrap(), 6, "the clone outlives its source");
    drop((b, s, b2, v2, s2));
    assert_eq!(t.used(), 0);
}

pub fn host_view_elements_ranges_and_iteration<T: Setup>(t: &T) {
    // More than one batch of the iterator (64 KiB).
    let n = if cfg!(miri) { 20_000 } else { 50_000 };
    let data: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let mut v = DeviceUVector::from_slice_in(&data, t.stream(), t.resource(), t.engine()).unwrap();
    assert_eq!((v.front_element().unwrap(), v.back_element().unwrap()), (data[0], data[n - 1]));
    assert_eq!(v.element_addr(0).unwrap(), v.addr());
    assert_eq!(v.element_addr(n - 1).unwrap(), v.addr() + 4 * (n as u64 - 1));
    assert_eq!(v.element_addr(n), Err(ContainerError::IndexOutOfRange { index: n, len: n }));
    let it = v.iter();
    assert_eq!(it.size_hint(), (1, Some(n)));
    assert_eq!(it.collect::<Result<Vec<u32>, _>>().unwrap(), data);
    assert_eq!(v.iter().skip(n - 2).map(Result::unwrap).collect::<Vec<_>>(), &data[n - 2..]);
    assert_eq!(v.slice_to_vec(5..9).unwrap(), &data[5..9]);
    assert_eq!(v.slice_to_vec(..=2).unwrap(), &data[..3]);
    assert_eq!(v.slice_to_vec(n - 1..).unwrap(), &data[n - 1..]);
    assert_eq!(v.slice_to_vec(n..).unwrap(), Vec::<u32>::new());
    let mut out = [0u32; 3];
    v.copy_to_slice_at(100, &mut out).unwrap();
    assert_eq!(out, data[100..103]);
    // Ranges outside the length are errors that touch nothing.
    let oob = |index| ContainerError::IndexOutOfRange { index, len: n };
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = v.slice_to_vec(9..5);
    assert_eq!(reversed, Err(oob(9)));
    assert_eq!(v.slice_to_vec(n - 1..=n), Err(oob(n)));
    assert_eq!(v.copy_to_slice_at(n - 2, &mut out), Err(oob(n)));
    assert_eq!(out, data[100..103], "a failed read wrote nothing");
    assert_eq!(v.set_element_to_zero_async(n), Err(oob(n)));
    // So are indices whose byte offsets pass any integer: the range is
    // checked before an offset is computed.
    let huge = usize::MAX / 2;
    assert_eq!(v.element(huge), Err(oob(huge)));
    assert_eq!(v.element_addr(usize::MAX), Err(oob(usize::MAX)));
    assert_eq!(v.copy_to_slice_at(huge, &mut out), Err(oob(huge + 2)));
    assert_eq!(v.copy_from_slice_at(usize::MAX, &out), Err(oob(usize::MAX)));
    assert_eq!(v.set_element_to_zero_async(huge), Err(oob(huge)));
    assert_eq!(v.slice_to_vec(huge..=huge), Err(oob(huge)));
    // The last index there is: named as it is (it was one less).
    assert_eq!(v.slice_to_vec(..=usize::MAX), Err(oob(usize::MAX)));
    // Zero-fill: one element, then all.
    v.set_element_to_zero_async(1).unwrap();
    assert_eq!(v.slice_to_vec(..3).unwrap(), [data[0], 0, data[2]]);
    v.fill_zero().unwrap();
    assert!(v.iter().all(|x| x == Ok(0)));
    v.clear();
    let empty = Err(ContainerError::IndexOutOfRange { index: 0, len: 0 });
    assert_eq!((v.front_element(), v.back_element()), (empty, empty));
    assert_eq!(v.iter().next(), None);
    assert_eq!(v.to_vec().unwrap(), Vec::<u32>::new());
    drop(v);
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
            scalar_round_trip,
            element_types_aligned_above_256_get_blocks_of_their_alignment,
            explicit_alignment_is_kept_through_growth_and_clones,
            copies_from_raw_device_pointers,
            clones_are_deep_copies_on_the_containers_own_stream,
            clone_is_the_deep_copy_of_try_clone,
            clones_into_another_resource_over_the_same_memory,
            host_view_elements_ranges_and_iteration
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
