//! `CudaCopy` checks every range before the driver sees it: a container
//! whose block other code freed gets `Error::NotLive`, and the driver never
//! writes freed host memory. Reports itself SKIPPED (and tests nothing)
//! without a GPU.
//!
//! This binary holds one test on purpose: a freed address is only
//! guaranteed unknown to the driver while no other thread of the process can
//! be handed it in between, which tests running side by side could be.

mod common;

use common::{gpu, Owned};
use memres_containers::{ContainerError, DeviceBuffer};
use memres_core::copy::{CopyEngine, MemoryOf};
use memres_core::vmem::ReservableSpace;
use memres_core::vpool::{VirtualConfig, VirtualPool};
use memres_core::{Block, Error, MemoryResource, Range, Request, Shared};
use memres_cuda::{CudaCopy, CudaMemory, CudaStream, CudaVirtualSpace, ManagedMemory, PinnedMemory};

fn not_live(addr: u64, len: u64) -> Error {
    Error::NotLive { addr, len }
}

/// A buffer over `mr` whose block is freed through `mr` by hand: every later
/// access is refused, and the buffer is unchanged.
fn freed_under_a_buffer<R>(mr: &R, stream: &CudaStream, engine: &CudaCopy)
where
    R: for<'a> MemoryResource<&'a CudaStream> + MemoryOf<CudaCopy>,
{
    let mut buf = DeviceBuffer::from_slice_in(b"hello", stream, mr, engine).unwrap();
    assert_eq!(buf.to_vec().unwrap(), b"hello");
    let addr = buf.addr();
    mr.deallocate(Block::from_addr(addr, 5), &stream).unwrap();
    let refused = ContainerError::Memory(not_live(addr, 5));
    assert_eq!(buf.to_vec().unwrap_err(), refused);
    assert_eq!(buf.fill(0).unwrap_err(), refused);
    assert_eq!(buf.write(0, b"HELLO").unwrap_err(), refused);
    assert_eq!(buf.resize(1 << 16).unwrap_err(), refused, "the copy out of the freed block");
    assert_eq!((buf.addr(), buf.len()), (addr, 5));
    drop(buf); // its free is refused, and ignored
}

/// A buffer over a resource that is replaced (and so dropped) under it:
/// every later access is refused, as a resource's drop takes its host
/// allocations out of the table `CudaCopy` checks (the memory itself stays
/// allocated: the buffer's block is never freed twice).
fn ended_under_a_buffer<'s, R>(make: impl Fn() -> R, stream: &'s CudaStream, engine: &CudaCopy)
where
    R: MemoryResource<&'s CudaStream> + MemoryOf<CudaCopy>,
{
    let mr = Shared::new(Owned(make()));
    let mut buf = DeviceBuffer::from_slice_in(b"hello", stream, &mr, engine).unwrap();
    assert_eq!(buf.to_vec().unwrap(), b"hello");
    let addr = buf.addr();
    mr.with(|r| *r = Owned(make()));
    let refused = ContainerError::Memory(not_live(addr, 5));
    assert_eq!(buf.to_vec().unwrap_err(), refused);
    assert_eq!(buf.fill(0).unwrap_err(), refused);
    assert_eq!(buf.write(0, b"HELLO").unwrap_err(), refused);
    assert_eq!((buf.addr(), buf.len()), (addr, 5));
    drop(buf); // its free goes to the new resource, which refuses it: ignored
}

#[test]
fn cuda_copy_touches_only_memory_it_can_vouch_for() {
    let Some(device) = gpu("cuda_copy_touches_only_memory_it_can_vouch_for") else { return };
    let stream = CudaStream::new(device).unwrap();
    let engine = CudaCopy::new(device).unwrap();

    // Host-visible memory freed under a container: refused by the table of
    // live pinned and managed allocations.
    freed_under_a_buffer(&PinnedMemory::new(device).unwrap(), &stream, &engine);
    freed_under_a_buffer(&ManagedMemory::new(device).unwrap(), &stream, &engine);
    // Host-visible memory of a resource that has ended: refused too.
    ended_under_a_buffer(|| PinnedMemory::new(device).unwrap(), &stream, &engine);
    ended_under_a_buffer(|| ManagedMemory::new(device).unwrap(), &stream, &engine);
    // Device memory freed under a container: the driver no longer knows it.
    freed_under_a_buffer(&CudaMemory::new(device).unwrap(), &stream, &engine);
    // Virtual memory freed under a container and unmapped at once (no idle
    // memory kept): its addresses stay reserved, but nothing backs them.
    let space = CudaVirtualSpace::new(device).unwrap();
    let config = VirtualConfig::new(1 << 30).release_threshold(0);
    let pool = Shared::new(VirtualPool::with_config(&space, config).unwrap());
    freed_under_a_buffer(&pool, &stream, &engine);
    assert_eq!(space.mapped_bytes(), 0, "the freed block's granule was unmapped");

    // A range of one reservation mapped in part: refused, though the driver
    // reports the whole reservation as the pointer's range. Mapped all
    // through, by two handles, it is served.
    let space = CudaVirtualSpace::with_handle_granules(device, 1).unwrap();
    let g = space.granule();
    let r = space.reserve(4 * g).unwrap();
    space.commit(Range::new(r.start(), g).unwrap()).unwrap();
    // SAFETY: the range is refused untouched, or lies in committed memory
    // that nothing else uses.
    unsafe {
        assert_eq!(engine.fill(r.start(), 0, 2 * g, &stream), Err(not_live(r.start(), 2 * g)));
        assert_eq!(engine.fill(r.start() + g, 0, 8, &stream), Err(not_live(r.start() + g, 8)));
        space.commit(Range::new(r.start() + g, g).unwrap()).unwrap();
        engine.fill(r.start(), 0x5A, 2 * g, &stream).unwrap();
        let mut out = [0u8; 16];
        engine.copy_to_host(&mut out, r.start() + g - 8, &stream).unwrap();
        assert_eq!(out, [0x5A; 16]);
    }
    space.decommit(Range::new(r.start(), 2 * g).unwrap(), &stream).unwrap();
    space.release(r).unwrap();

    // Memory no resource of this crate handed out, or past a device
    // allocation's end, or two ranges that overlap: refused, nothing queued.
    let mr = CudaMemory::new(device).unwrap();
    let b = mr.allocate(Request::new(2 << 20).unwrap(), &&stream).unwrap();
    let mut heap = vec![7u8; 64];
    let heap_addr = heap.as_mut_ptr() as u64;
    let mut out = [0u8; 64];
    // SAFETY: `b` is held here; the other ranges are refused untouched.
    unsafe {
        assert_eq!(
            engine.fill(heap_addr, 0, 64, &stream),
            Err(not_live(heap_addr, 64)),
            "pageable host memory"
        );
        assert_eq!(engine.copy(b.addr(), heap_addr, 64, &stream), Err(not_live(heap_addr, 64)));
        let past = b.addr() + (1 << 20);
        assert_eq!(engine.fill(past, 0, 2 << 20, &stream), Err(not_live(past, 2 << 20)), "past the end");
        assert_eq!(
            engine.copy(b.addr() + 8, b.addr(), 64, &stream),
            Err(not_live(b.addr(), 64)),
            "overlapping"
        );
        // What is live works.
        engine.fill(b.addr(), 0xA5, 64, &stream).unwrap();
        engine.copy(b.addr() + 64, b.addr(), 64, &stream).unwrap();
        engine.copy_to_host(&mut out, b.addr() + 64, &stream).unwrap();
    }
    assert_eq!(heap, [7; 64], "the heap was not written");
    assert_eq!(out, [0xA5; 64]);
    mr.deallocate(b, &&stream).unwrap();
}
