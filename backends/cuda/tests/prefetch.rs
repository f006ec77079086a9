//! `cuMemPrefetchAsync` in both of its forms, looked up at run time: the
//! `CUmemLocation` form of CUDA 12.2 and later, and the device-ordinal form
//! that older drivers have (which newer drivers still give to programs built
//! for them). Each test reports itself SKIPPED without a GPU.

mod common;

use common::{expect_filled, fill, gpu};
use memres_core::{MemoryResource, Request, Stream};
use memres_cuda::sys::{self, MemPrefetchAsync, PrefetchTo};
use memres_cuda::{prefetch, prefetch_to_host, CudaStream, Device, ManagedMemory};

/// The device ordinal `addr` was last prefetched to, -2 (`CU_DEVICE_INVALID`) if none.
fn last_prefetched_to(addr: u64, size: u64) -> i32 {
    let mut to: i32 = 0;
    // SAFETY: `to` is a live `int`, the attribute's type, and its size is
    // the one passed; the driver checks the range.
    let code = unsafe {
        sys::cuMemRangeGetAttribute(
            (&mut to as *mut i32).cast(),
            4,
            sys::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION,
            addr,
            size as usize,
        )
    };
    assert_eq!(code, sys::CUDA_SUCCESS, "cuMemRangeGetAttribute");
    to
}

/// Whether prefetching means anything on `device`; prints why not.
fn can_prefetch(device: Device, test: &str) -> bool {
    let can = device.concurrent_managed_access().unwrap();
    if !can {
        eprintln!("SKIPPED {test}: the device cannot prefetch managed memory");
    }
    can
}

/// Prefetches a fresh managed block with `form` and checks that it got to
/// the device with its contents.
fn prefetch_with(form: MemPrefetchAsync, device: Device) {
    let mr = ManagedMemory::new(device).unwrap();
    let stream = CudaStream::new(device).unwrap();
    let size = 4 << 20;
    let block = mr.allocate(Request::new(size).unwrap(), &stream).unwrap();
    fill(&stream, &block, 0x5EED_F00D);
    stream.synchronize().unwrap();
    assert_ne!(last_prefetched_to(block.addr(), size), device.raw(), "not prefetched yet");
    let context = device.primary_context().unwrap();
    // SAFETY: the primary context is retained for the process; binding it
    // to this test's own thread disturbs no other.
    assert_eq!(unsafe { sys::cuCtxSetCurrent(context.raw()) }, sys::CUDA_SUCCESS);
    // SAFETY: `form` is the driver's (`get` or `as_of`); a stream of this
    // crate, alive while borrowed; the block is live managed memory of
    // `size` bytes.
    let code =
        unsafe { form.to(block.addr(), size as usize, PrefetchTo::Device(device.raw()), stream.raw()) };
    assert_eq!(code, sys::CUDA_SUCCESS, "{form:?}");
    stream.synchronize().unwrap();
    assert_eq!(last_prefetched_to(block.addr(), size), device.raw());
    expect_filled(&stream, &block, 0x5EED_F00D);
    // And back to the host, as each form says it.
    // SAFETY: as above.
    let code = unsafe { form.to(block.addr(), size as usize, PrefetchTo::Host, stream.raw()) };
    assert_eq!(code, sys::CUDA_SUCCESS, "{form:?} to the host");
    stream.synchronize().unwrap();
    assert_eq!(last_prefetched_to(block.addr(), size), sys::CU_DEVICE_CPU);
    expect_filled(&stream, &block, 0x5EED_F00D);
    mr.deallocate(block, &stream).unwrap();
}

#[test]
fn the_running_driver_gives_the_form_of_its_version() {
    let Some(device) = gpu("the_running_driver_gives_the_form_of_its_version") else { return };
    let version = memres_cuda::driver_version().unwrap();
    let form = MemPrefetchAsync::get().unwrap();
    assert_eq!(
        matches!(form, MemPrefetchAsync::Location(_)),
        version >= MemPrefetchAsync::LOCATION_SINCE,
        "driver {version}: {form:?}"
    );
    if can_prefetch(device, "the_running_driver_gives_the_form_of_its_version") {
        prefetch_with(form, device);
    }
}

#[test]
fn a_program_built_for_cuda_12_0_gets_the_ordinal_form_and_it_prefetches() {
    let Some(device) = gpu("a_program_built_for_cuda_12_0_gets_the_ordinal_form_and_it_prefetches") else {
        return;
    };
    let form = MemPrefetchAsync::as_of(12000).unwrap();
    assert!(matches!(form, MemPrefetchAsync::Ordinal(_)), "{form:?}");
    if can_prefetch(device, "a_program_built_for_cuda_12_0_gets_the_ordinal_form_and_it_prefetches") {
        prefetch_with(form, device);
    }
}

#[test]
fn the_public_prefetch_moves_managed_memory_and_skips_other_memory() {
    let test = "the_public_prefetch_moves_managed_memory_and_skips_other_memory";
    let Some(device) = gpu(test) else { return };
    if !can_prefetch(device, test) {
        return;
    }
    let context = device.primary_context().unwrap();
    let stream = CudaStream::new(device).unwrap();
    let managed = ManagedMemory::new(device).unwrap();
    let block = managed.allocate(Request::new(1 << 20).unwrap(), &stream).unwrap();
    assert_eq!(prefetch(block.addr(), 1 << 20, device, &context, &stream), Ok(true));
    stream.synchronize().unwrap();
    assert_eq!(last_prefetched_to(block.addr(), 1 << 20), device.raw());
    assert_eq!(prefetch_to_host(block.addr(), 1 << 20, &context, &stream), Ok(true));
    stream.synchronize().unwrap();
    assert_eq!(last_prefetched_to(block.addr(), 1 << 20), sys::CU_DEVICE_CPU);
    managed.deallocate(block, &stream).unwrap();
    let plain = memres_cuda::CudaMemory::new(device).unwrap();
    let block = plain.allocate(Request::new(1 << 20).unwrap(), &stream).unwrap();
    assert_eq!(prefetch(block.addr(), 1 << 20, device, &context, &stream), Ok(false));
    assert_eq!(prefetch_to_host(block.addr(), 1 << 20, &context, &stream), Ok(false));
    plain.deallocate(block, &stream).unwrap();
}

#[test]
fn asking_for_a_cuda_before_the_function_existed_is_an_error_not_a_wrong_form() {
    let Some(_) = gpu("asking_for_a_cuda_before_the_function_existed_is_an_error_not_a_wrong_form") else {
        return;
    };
    // cuMemPrefetchAsync came with CUDA 8.0.
    let got = MemPrefetchAsync::as_of(7050);
    assert!(got.is_err(), "{got:?}");
}

#[test]
fn the_prefetch_layer_of_a_stack_string_moves_each_block_it_hands_out() {
    let test = "the_prefetch_layer_of_a_stack_string_moves_each_block_it_hands_out";
    let Some(device) = gpu(test) else { return };
    if !can_prefetch(device, test) {
        return;
    }
    let gauge = std::sync::Arc::new(memres_core::adaptor::Gauge::default());
    let mut builder = memres_core::stack::StackBuilder::<CudaStream>::new();
    memres_cuda::stack::register(&mut builder, device, gauge.clone());
    let stream = CudaStream::new(device).unwrap();
    let stack = builder.build("stats(prefetch(managed))", &stream).unwrap();
    let block = stack.allocate(Request::new(4 << 20).unwrap(), &stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(last_prefetched_to(block.addr(), 4 << 20), device.raw());
    fill(&stream, &block, 0x00DD_BA11);
    expect_filled(&stream, &block, 0x00DD_BA11);
    assert_eq!(gauge.value(), 4 << 20);
    stack.deallocate(block, &stream).unwrap();
    assert_eq!(gauge.value(), 0);
    // Over memory that does not migrate, the layer hands blocks out as they are.
    let plain = builder.build("prefetch(cuda)", &stream).unwrap();
    let block = plain.allocate(Request::new(1 << 20).unwrap(), &stream).unwrap();
    plain.deallocate(block, &stream).unwrap();
    // One upstream, no options.
    let e = builder.build("prefetch(managed, cuda)", &stream).err().expect("two upstreams");
    assert_eq!((e.pos, &e.kind), (18, &memres_core::stack::StackErrorKind::ExtraArg), "{e}");
}
