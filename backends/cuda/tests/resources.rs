//! Every CUDA resource: allocate, write a pattern, read it back, free.
//! Each test reports itself SKIPPED (and tests nothing) without a GPU.

mod common;

use common::{expect_filled, fill, gpu, pattern};
use memres_core::{Block, MemoryResource, Request};
use memres_cuda::{
    ops, sys, AsyncConfig, CudaAsyncManagedMemory, CudaAsyncMemory, CudaMemory, CudaStream, ManagedMemory,
    PinnedMemory, Prefetch,
};

/// Sizes with the odd ones a pool never sees: 4 bytes, not a multiple of
/// 256, just over a 2 MiB page.
const SIZES: [u64; 5] = [4, 1000, 4096, 1 << 20, (2 << 20) + 4];

/// Allocates each size from `mr`, fills every block with its own pattern,
/// reads all back, frees them: the round trip every resource must pass.
fn round_trip<R: MemoryResource<CudaStream>>(mr: &R, stream: &CudaStream) {
    let blocks: Vec<Block> = SIZES
        .iter()
        .map(|&s| {
            let b = mr.allocate(Request::new(s).unwrap(), stream).expect("allocate");
            assert_eq!(b.addr() % 256, 0, "256-byte alignment");
            assert_eq!(b.size(), s);
            b
        })
        .collect();
    for (i, b) in blocks.iter().enumerate() {
        fill(stream, b, pattern(i as u64));
    }
    for (i, b) in blocks.iter().enumerate() {
        expect_filled(stream, b, pattern(i as u64));
    }
    // Over-aligned requests keep their alignment and free cleanly.
    for align in [4096u64, 1 << 16, 1 << 21] {
        let b = mr.allocate(Request::aligned(3000, align).unwrap(), stream).expect("aligned allocate");
        assert_eq!(b.addr() % align, 0, "alignment {align}");
        fill(stream, &b, 0xA11C_0000 | align as u32 >> 8);
        expect_filled(stream, &b, 0xA11C_0000 | align as u32 >> 8);
        mr.deallocate(b, stream).expect("aligned free");
    }
    assert_eq!(mr.allocate(Request::new(0).unwrap(), stream), Ok(Block::EMPTY));
    mr.deallocate(Block::EMPTY, stream).expect("free of the empty block");
    for b in blocks {
        mr.deallocate(b, stream).expect("free");
    }
    memres_core::Stream::synchronize(stream).expect("synchronize");
}

#[test]
fn device_memory_round_trip() {
    let Some(device) = gpu("device_memory_round_trip") else { return };
    let mr = CudaMemory::new(device).unwrap();
    let stream = CudaStream::new(device).unwrap();
    round_trip(&mr, &stream);
}

#[test]
fn async_memory_round_trip_and_pool_attributes() {
    let Some(device) = gpu("async_memory_round_trip_and_pool_attributes") else { return };
    let config = AsyncConfig::new().initial_size(16 << 20).release_threshold(64 << 20);
    let mr = CudaAsyncMemory::with_config(device, config).unwrap();
    assert!(mr.owns_pool());
    assert_eq!(mr.release_threshold().unwrap(), 64 << 20);
    assert!(mr.reserved_bytes().unwrap() >= 16 << 20, "the initial size was reserved");
    let stream = CudaStream::new(device).unwrap();
    round_trip(&mr, &stream);
    let b = mr.allocate(Request::new(8 << 20).unwrap(), &stream).unwrap();
    assert!(mr.used_bytes().unwrap() >= 8 << 20);
    mr.deallocate(b, &stream).unwrap();
    memres_core::Stream::synchronize(&stream).unwrap();
    assert_eq!(mr.used_bytes().unwrap(), 0, "every block freed");
    mr.trim_to(0).unwrap();
}

#[test]
fn async_memory_on_the_legacy_stream() {
    let Some(device) = gpu("async_memory_on_the_legacy_stream") else { return };
    let mr = CudaAsyncMemory::new(device).unwrap();
    // `()` is the legacy stream of the resource's context.
    let b = mr.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    let legacy = device.default_stream().unwrap();
    fill(&legacy, &b, 0x1E6A_C700);
    expect_filled(&legacy, &b, 0x1E6A_C700);
    mr.deallocate(b, &()).unwrap();
}

#[test]
fn default_pool_view_leaves_the_pool_alive() {
    let Some(device) = gpu("default_pool_view_leaves_the_pool_alive") else { return };
    let stream = CudaStream::new(device).unwrap();
    let first = CudaAsyncMemory::default_pool(device).unwrap();
    assert!(!first.owns_pool());
    round_trip(&first, &stream);
    let handle = first.pool_handle();
    drop(first);
    let second = CudaAsyncMemory::default_pool(device).unwrap();
    assert_eq!(second.pool_handle(), handle, "the same driver pool, not destroyed");
    round_trip(&second, &stream);
}

#[test]
fn a_stack_strings_async_views_the_default_pool_with_pool_default() {
    let Some(device) = gpu("a_stack_strings_async_views_the_default_pool_with_pool_default") else { return };
    let stream = CudaStream::new(device).unwrap();
    let gauge = std::sync::Arc::new(memres_core::adaptor::Gauge::default());
    let mut builder = memres_core::stack::StackBuilder::<CudaStream>::new();
    memres_cuda::stack::register(&mut builder, device, gauge.clone());
    let default = CudaAsyncMemory::default_pool(device).unwrap().pool_handle();
    for (text, views) in [("async(pool=default)", true), ("async(pool=own)", false), ("async", false)] {
        let built = builder.build_with_handles(text, &stream).unwrap();
        let leaf = built.get::<memres_core::adaptor::Counted<CudaAsyncMemory>>("async").unwrap();
        assert_eq!(leaf.inner().pool_handle() == default, views, "{text}");
        assert_eq!(leaf.inner().owns_pool(), !views, "{text}");
        round_trip(&built.resource, &stream);
        assert_eq!(gauge.value(), 0, "{text}");
    }
    let e = builder
        .build("async(pool=default, release_threshold=1GiB)", &stream)
        .err()
        .expect("a view's attributes");
    assert!(e.to_string().contains("with `pool=default`: a view leaves the device's pool as it is"), "{e}");
}

/// The device's default pool of managed memory (CUDA 13), or `None` with
/// the test reported SKIPPED on an older driver.
fn managed_pool(test: &str, device: memres_cuda::Device) -> Option<CudaAsyncManagedMemory> {
    match CudaAsyncManagedMemory::default_pool(device) {
        Ok(mr) => Some(mr),
        Err(memres_core::Error::InvalidConfig { what }) if memres_cuda::driver_version().unwrap() < 13000 => {
            eprintln!("SKIPPED {test}: {what}");
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

#[test]
fn async_managed_memory_round_trip_host_access_and_stack_string() {
    let test = "async_managed_memory_round_trip_host_access_and_stack_string";
    let Some(device) = gpu(test) else { return };
    let Some(mr) = managed_pool(test, device) else { return };
    let stream = CudaStream::new(device).unwrap();
    // The driver's own default pool of managed memory, whoever asks.
    assert_eq!(CudaAsyncManagedMemory::default_pool(device).unwrap().pool_handle(), mr.pool_handle());
    assert!(
        !mr.pool_handle().is_null()
            && mr.pool_handle() != CudaAsyncMemory::default_pool(device).unwrap().pool_handle()
    );
    round_trip(&mr, &stream);
    let b = read_back_on_the_host(&mr, &stream, 0x4153_4D47);
    let mut managed: u32 = 0;
    // SAFETY: `managed` is a live `u32` the attribute writes (a boolean).
    let code = unsafe {
        sys::cuPointerGetAttribute(
            (&mut managed as *mut u32).cast(),
            sys::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            b.addr(),
        )
    };
    assert_eq!((code, managed), (sys::CUDA_SUCCESS, 1), "managed memory");
    mr.deallocate(b, &stream).unwrap();
    assert_eq!(mr.deallocate(b, &stream), Err(memres_core::Error::UnknownBlock { addr: b.addr() }), "twice");

    let gauge = std::sync::Arc::new(memres_core::adaptor::Gauge::default());
    let mut builder = memres_core::stack::StackBuilder::<CudaStream>::new();
    memres_cuda::stack::register(&mut builder, device, gauge.clone());
    let built = builder.build_with_handles("async(pool=managed)", &stream).unwrap();
    let leaf = built.get::<memres_core::adaptor::Counted<CudaAsyncManagedMemory>>("async").unwrap();
    assert_eq!(leaf.inner().pool_handle(), mr.pool_handle());
    round_trip(&built.resource, &stream);
    assert_eq!(gauge.value(), 0);
    let e = builder.build("async(pool=managed, initial=1GiB)", &stream).err().expect("a view's attributes");
    assert!(e.to_string().contains("with `pool=managed`: a view leaves the device's pool as it is"), "{e}");
}

/// Exports `pool` as a POSIX file descriptor: the descriptor, or the
/// driver's error code.
fn export_fd(context: &memres_cuda::Context, pool: sys::CUmemoryPool) -> Result<i32, i32> {
    context.bind().unwrap();
    let mut fd: i32 = -1;
    // SAFETY: a context is current on this thread; `fd` is a live `int`,
    // what the POSIX handle type writes; `pool` is a live pool of it.
    let code = unsafe {
        sys::cuMemPoolExportToShareableHandle(
            (&mut fd as *mut i32).cast(),
            pool,
            sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    };
    if code == sys::CUDA_SUCCESS {
        Ok(fd)
    } else {
        Err(code)
    }
}

#[test]
fn a_stack_strings_async_with_ipc_posix_fd_makes_a_pool_other_processes_can_open() {
    let test = "a_stack_strings_async_with_ipc_posix_fd_makes_a_pool_other_processes_can_open";
    let Some(device) = gpu(test) else { return };
    let mask = device.attribute(sys::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES).unwrap();
    if mask & sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == 0 {
        eprintln!("SKIPPED {test}: the device's pools cannot be exported as file descriptors");
        return;
    }
    let stream = CudaStream::new(device).unwrap();
    let gauge = std::sync::Arc::new(memres_core::adaptor::Gauge::default());
    let mut builder = memres_core::stack::StackBuilder::<CudaStream>::new();
    memres_cuda::stack::register(&mut builder, device, gauge);
    let context = device.primary_context().unwrap();
    for (text, exports) in [("async(ipc=posix_fd)", true), ("async", false), ("async(ipc=none)", false)] {
        let built = builder.build_with_handles(text, &stream).unwrap();
        let leaf = built.get::<memres_core::adaptor::Counted<CudaAsyncMemory>>("async").unwrap();
        round_trip(&built.resource, &stream);
        match export_fd(&context, leaf.inner().pool_handle()) {
            Ok(fd) => {
                assert!(exports && fd >= 0, "{text}: exported as {fd}");
                // SAFETY: the driver handed this descriptor to us; closed once.
                assert_eq!(unsafe { close(fd) }, 0);
            }
            Err(code) => assert!(!exports, "{text}: the export failed with {code}"),
        }
    }
    let e = builder.build("async(ipc=posix_fd, pool=default)", &stream).err().expect("a view's handle types");
    assert!(e.to_string().contains("`ipc=` with `pool=default`"), "{e}");
}

extern "C" {
    fn close(fd: i32) -> i32;
}

#[test]
fn managed_memory_round_trip_and_host_access() {
    let Some(device) = gpu("managed_memory_round_trip_and_host_access") else { return };
    let mr = ManagedMemory::new(device).unwrap();
    let stream = CudaStream::new(device).unwrap();
    round_trip(&mr, &stream);
    let b = read_back_on_the_host(&mr, &stream, 0x4D41_4E47);
    mr.deallocate(b, &stream).unwrap();
}

/// A 4096-byte block of `mr`, managed memory, filled with `word` on
/// `stream` and read on the host once the stream is done.
fn read_back_on_the_host<R: MemoryResource<CudaStream>>(mr: &R, stream: &CudaStream, word: u32) -> Block {
    let b = mr.allocate(Request::new(4096).unwrap(), stream).unwrap();
    fill(stream, &b, word);
    memres_core::Stream::synchronize(stream).unwrap();
    // SAFETY: managed memory is host-accessible once the device work on it
    // has completed (the stream was synchronized); the block is 4096 bytes.
    let words = unsafe { std::slice::from_raw_parts(b.addr() as *const u32, 1024) };
    assert!(words.iter().all(|&w| w == word));
    b
}

#[test]
fn prefetched_managed_memory_round_trip() {
    let Some(device) = gpu("prefetched_managed_memory_round_trip") else { return };
    if !device.concurrent_managed_access().unwrap() {
        eprintln!("SKIPPED prefetched_managed_memory_round_trip: the device cannot prefetch managed memory");
        return;
    }
    let mr = Prefetch::new(ManagedMemory::new(device).unwrap(), device).unwrap();
    assert_eq!(mr.device(), device);
    let stream = CudaStream::new(device).unwrap();
    round_trip(&mr, &stream);
    // Over memory that is not managed, prefetching is skipped, not an error.
    let plain = Prefetch::new(CudaMemory::new(device).unwrap(), device).unwrap();
    round_trip(&plain, &stream);
}

#[test]
fn pinned_memory_round_trip_through_the_device() {
    let Some(device) = gpu("pinned_memory_round_trip_through_the_device") else { return };
    let pinned = PinnedMemory::new(device).unwrap();
    let dmem = CudaMemory::new(device).unwrap();
    let stream = CudaStream::new(device).unwrap();
    for (i, &size) in SIZES.iter().enumerate() {
        let h = pinned.allocate(Request::new(size).unwrap(), &stream).unwrap();
        assert_eq!(h.addr() % 256, 0);
        let words = (size / 4) as usize;
        // SAFETY: a live pinned block of `size` bytes, host memory that
        // nothing else uses.
        let host = unsafe { std::slice::from_raw_parts_mut(h.addr() as *mut u32, words) };
        host.fill(pattern(i as u64));
        let d = dmem.allocate(Request::new(size).unwrap(), &stream).unwrap();
        // SAFETY: both blocks are live and `size` bytes long until freed below,
        // after the stream is synchronized by `expect_filled`.
        unsafe { ops::copy(&stream, d.addr(), h.addr(), words * 4) }.unwrap();
        expect_filled(&stream, &Block::new(d.addr(), words as u64 * 4, d.tag()), pattern(i as u64));
        dmem.deallocate(d, &stream).unwrap();
        pinned.deallocate(h, &stream).unwrap();
    }
    let aligned = pinned.allocate(Request::aligned(100, 1 << 16).unwrap(), &stream).unwrap();
    assert_eq!(aligned.addr() % (1 << 16), 0);
    pinned.deallocate(aligned, &stream).unwrap();
}

#[test]
fn any_thread_without_setup_gets_the_primary_context_bound() {
    let Some(device) = gpu("any_thread_without_setup_gets_the_primary_context_bound") else { return };
    let mr = CudaAsyncMemory::new(device).unwrap();
    let stream = CudaStream::new(device).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            // A fresh thread has no current context; the resource needs none.
            let b = mr.allocate(Request::new(1 << 16).unwrap(), &stream).unwrap();
            fill(&stream, &b, 7);
            expect_filled(&stream, &b, 7);
            mr.deallocate(b, &stream).unwrap();
            let b = mr.allocate(Request::new(256).unwrap(), &()).unwrap();
            mr.deallocate(b, &()).unwrap();
            let mut current = std::ptr::null_mut();
            // SAFETY: the out parameter is a live local.
            assert_eq!(unsafe { sys::cuCtxGetCurrent(&mut current) }, 0);
            // As with the CUDA runtime, a thread that had no context keeps the
            // device's primary context bound (threads that had another get it
            // back: see multi_device.rs).
            assert!(!current.is_null(), "the primary context stays bound");
        });
    });
}

/// Whether `a` and `b` are equal, checked both ways round.
fn equal(a: &dyn MemoryResource<CudaStream>, b: &dyn MemoryResource<CudaStream>) -> bool {
    let ab = a.is_equal(b);
    assert_eq!(ab, b.is_equal(a), "equality is symmetric");
    ab
}

#[test]
fn clones_of_a_leaf_are_equal_and_take_each_others_blocks_but_two_leaves_are_not() {
    let Some(device) = gpu("clones_of_a_leaf_are_equal_and_take_each_others_blocks_but_two_leaves_are_not")
    else {
        return;
    };
    let stream = CudaStream::new(device).unwrap();
    let (cuda, managed, pinned) = (
        CudaMemory::new(device).unwrap(),
        ManagedMemory::new(device).unwrap(),
        PinnedMemory::new(device).unwrap(),
    );
    let leaves: [&dyn MemoryResource<CudaStream>; 3] = [&cuda, &managed, &pinned];
    let clones: [Box<dyn MemoryResource<CudaStream>>; 3] =
        [Box::new(cuda.clone()), Box::new(managed.clone()), Box::new(pinned.clone())];
    let others: [Box<dyn MemoryResource<CudaStream>>; 3] = [
        Box::new(CudaMemory::new(device).unwrap()),
        Box::new(ManagedMemory::new(device).unwrap()),
        Box::new(PinnedMemory::new(device).unwrap()),
    ];
    for ((leaf, clone), other) in leaves.iter().zip(&clones).zip(&others) {
        assert!(equal(*leaf, &**clone) && !equal(*leaf, &**other));
        let b = leaf.allocate(Request::new(1000).unwrap(), &stream).unwrap();
        assert!(other.deallocate(b, &stream).is_err(), "another leaf refuses the block");
        clone.deallocate(b, &stream).unwrap();
    }
    assert!(!equal(&cuda, &managed));
    let (p, q) = (Prefetch::new(&managed, device).unwrap(), Prefetch::new(managed.clone(), device).unwrap());
    assert!(!equal(&p, &q), "adaptors of different upstream types");
    let r = Prefetch::new(&managed, device).unwrap();
    assert!(equal(&p, &r) && !equal(&p, &managed));
}
