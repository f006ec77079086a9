//! The driver's virtual memory management as a reservable space: reserve,
//! commit, write and read, decommit in stream order, out of memory, and a
//! `VirtualPool` over it. Each test reports itself SKIPPED (and tests
//! nothing) without a GPU.

mod common;

use common::{expect_filled, fill, gpu, pattern, Gate};
use memres_core::testing::SplitMix64;
use memres_core::vmem::ReservableSpace;
use memres_core::vpool::{VirtualConfig, VirtualPool};
use memres_core::Inspect;
use memres_core::{Block, Error, MemoryResourceMut, Range, Request};
use memres_cuda::{CudaStream, CudaVirtualSpace};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// One test at a time: the out-of-memory test takes all device memory for
/// a moment, and the ordering test holds the legacy default stream.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A block over `range` (committed memory) for the fill and read helpers.
fn block(range: Range) -> Block {
    Block::new(range.start(), range.len(), Block::NO_TAG)
}

fn sub(r: Range, from: u64, len: u64) -> Range {
    Range::new(r.start() + from, len).unwrap()
}

#[test]
fn commit_write_read_and_decommit_granules_of_a_large_reservation() {
    let _serial = serial();
    let Some(device) = gpu("commit_write_read_and_decommit_granules_of_a_large_reservation") else { return };
    let space = CudaVirtualSpace::new(device).unwrap();
    let g = space.granule();
    assert!(g.is_power_of_two() && g >= 256, "granule {g}");
    let stream = CudaStream::new(device).unwrap();
    let r = space.reserve(64 << 30).unwrap();
    assert_eq!((r.len(), r.start() % g), (64 << 30, 0));
    let a = sub(r, 0, 3 * g);
    let b = sub(r, 10 * g, g);
    space.commit(a).unwrap();
    space.commit(b).unwrap();
    assert_eq!((space.committed_bytes(), space.mapped_bytes()), (4 * g, 4 * g));
    fill(&stream, &block(a), pattern(1));
    fill(&stream, &block(b), pattern(2));
    expect_filled(&stream, &block(a), pattern(1));
    expect_filled(&stream, &block(b), pattern(2));
    space.decommit(a, &stream).unwrap();
    assert_eq!((space.committed_bytes(), space.mapped_bytes()), (g, g));
    // Committed again, the range is usable again.
    space.commit(a).unwrap();
    fill(&stream, &block(a), pattern(3));
    expect_filled(&stream, &block(a), pattern(3));
    expect_filled(&stream, &block(b), pattern(2));
    space.decommit(a, &stream).unwrap();
    space.decommit(b, &stream).unwrap();
    assert_eq!((space.committed_bytes(), space.mapped_bytes(), space.handle_count()), (0, 0, 0));
    assert_eq!(space.peak_committed_bytes(), 4 * g);
    space.release(r).unwrap();
    assert_eq!(space.reservation_count(), 0);
}

#[test]
fn a_partial_decommit_keeps_the_rest_of_the_handle_and_its_contents() {
    let _serial = serial();
    let Some(device) = gpu("a_partial_decommit_keeps_the_rest_of_the_handle_and_its_contents") else {
        return;
    };
    let stream = CudaStream::new(device).unwrap();
    for handle_granules in [1, 4, 64] {
        let space = CudaVirtualSpace::with_handle_granules(device, handle_granules).unwrap();
        let g = space.granule();
        let r = space.reserve(256 * g).unwrap();
        let all = sub(r, 0, 8 * g);
        space.commit(all).unwrap();
        let handles = space.handle_count();
        assert_eq!(handles as u64, 8u64.div_ceil(u64::from(handle_granules)));
        for i in 0..8 {
            fill(&stream, &block(sub(r, i * g, g)), pattern(i));
        }
        let middle = sub(r, 2 * g, 3 * g);
        space.decommit(middle, &stream).unwrap();
        assert_eq!(space.committed_bytes(), 5 * g);
        // Retained at most handle_granules - 1 granules per handle touched.
        let retained = space.mapped_bytes() - space.committed_bytes();
        assert!(retained <= 2 * u64::from(handle_granules - 1) * g, "{retained} retained");
        if handle_granules == 1 {
            assert_eq!(retained, 0);
        }
        for i in [0, 1, 5, 6, 7] {
            expect_filled(&stream, &block(sub(r, i * g, g)), pattern(i));
        }
        // Part committed, part not: a commit over it is misuse and changes nothing.
        assert!(matches!(space.commit(sub(r, g, 2 * g)), Err(Error::InvalidConfig { .. })));
        assert!(matches!(space.decommit(sub(r, g, 2 * g), &stream), Err(Error::InvalidConfig { .. })));
        let calls = space.driver_calls();
        space.commit(middle).unwrap();
        // Retained granules come back with no new handle.
        let new_handles = space.driver_calls().maps - calls.maps;
        assert!(new_handles <= 3, "{new_handles}");
        if handle_granules == 64 {
            assert_eq!(new_handles, 0);
        }
        fill(&stream, &block(middle), pattern(9));
        expect_filled(&stream, &block(middle), pattern(9));
        expect_filled(&stream, &block(sub(r, 0, g)), pattern(0));
        expect_filled(&stream, &block(sub(r, 7 * g, g)), pattern(7));
        space.decommit(all, &stream).unwrap();
        assert_eq!((space.committed_bytes(), space.mapped_bytes(), space.handle_count()), (0, 0, 0));
        space.release(r).unwrap();
    }
}

#[test]
fn misuse_is_an_error_and_changes_nothing() {
    let _serial = serial();
    let Some(device) = gpu("misuse_is_an_error_and_changes_nothing") else { return };
    let space = CudaVirtualSpace::new(device).unwrap();
    let g = space.granule();
    assert!(matches!(space.reserve(0), Err(Error::InvalidSize { .. })));
    assert!(matches!(space.reserve(g + 256), Err(Error::InvalidSize { .. })));
    let r = space.reserve(16 * g).unwrap();
    let outside = Range::new(r.end(), g).unwrap();
    let unaligned = Range::new(r.start() + 256, g).unwrap();
    let straddling = Range::new(r.end() - g, 2 * g).unwrap();
    for bad in [outside, unaligned, straddling] {
        assert!(matches!(space.commit(bad), Err(Error::InvalidConfig { .. })), "{bad:?}");
    }
    let a = sub(r, g, 2 * g);
    assert!(matches!(space.decommit(a, &()), Err(Error::InvalidConfig { .. })));
    space.commit(a).unwrap();
    assert!(matches!(space.commit(sub(r, 2 * g, 2 * g)), Err(Error::InvalidConfig { .. })));
    assert!(matches!(space.release(r), Err(Error::InvalidConfig { .. })));
    assert!(matches!(space.release(sub(r, 0, g)), Err(Error::UnknownBlock { .. })));
    assert_eq!((space.committed_bytes(), space.reservation_count()), (2 * g, 1));
    space.decommit(a, &()).unwrap();
    space.release(r).unwrap();
    assert!(matches!(space.release(r), Err(Error::UnknownBlock { .. })));
}

#[test]
fn decommit_waits_for_the_work_on_its_stream() {
    let _serial = serial();
    let Some(device) = gpu("decommit_waits_for_the_work_on_its_stream") else { return };
    let space = CudaVirtualSpace::with_handle_granules(device, 1).unwrap();
    let g = space.granule();
    let stream = CudaStream::new(device).unwrap();
    let r = space.reserve(4 * g).unwrap();
    let a = sub(r, 0, 2 * g);
    space.commit(a).unwrap();
    let gate = Gate::block(&stream);
    // Queued behind the gate: runs only once it opens.
    fill(&stream, &block(a), pattern(5));
    let opened = Arc::new(AtomicBool::new(false));
    let opener = {
        let opened = opened.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            opened.store(true, Ordering::SeqCst);
            gate.open();
        })
    };
    space.decommit(a, &stream).unwrap();
    assert!(opened.load(Ordering::SeqCst), "decommit returned before the stream's work could run");
    opener.join().unwrap();
    assert_eq!(space.mapped_bytes(), 0);
    space.release(r).unwrap();
}

/// A decommit on the legacy default stream from a thread where no context
/// is current (a pool dropped on a collector's thread, a fresh Rust
/// thread): the unmap waits in the space's own context. Before, the
/// stream's synchronization came before the space's context was entered
/// and was refused (`CUDA_ERROR_INVALID_CONTEXT`), so the memory stayed
/// mapped.
#[test]
fn a_decommit_on_the_legacy_stream_from_a_thread_with_no_context_unmaps() {
    let _serial = serial();
    let Some(device) = gpu("a_decommit_on_the_legacy_stream_from_a_thread_with_no_context_unmaps") else {
        return;
    };
    let space = CudaVirtualSpace::with_handle_granules(device, 1).unwrap();
    let g = space.granule();
    let r = space.reserve(4 * g).unwrap();
    let a = sub(r, 0, 2 * g);
    space.commit(a).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut current = std::ptr::null_mut();
            // SAFETY: the out parameter points at a live local.
            assert_eq!(unsafe { memres_cuda::sys::cuCtxGetCurrent(&mut current) }, 0);
            assert!(current.is_null(), "a fresh thread has no current context");
            space.decommit(a, &CudaStream::legacy()).unwrap();
        })
        .join()
        .unwrap()
    });
    assert_eq!((space.committed_bytes(), space.mapped_bytes()), (0, 0));
    space.release(r).unwrap();
}

#[test]
fn committing_more_than_the_device_holds_is_out_of_memory_and_commits_nothing() {
    let _serial = serial();
    let Some(device) = gpu("committing_more_than_the_device_holds_is_out_of_memory_and_commits_nothing")
    else {
        return;
    };
    let space = CudaVirtualSpace::with_handle_granules(device, 64).unwrap();
    let g = space.granule();
    let total = device.total_memory().unwrap();
    let len = (total + total / 4).next_multiple_of(g);
    let r = space.reserve(len).unwrap();
    let before = device.memory_info().unwrap().free;
    let err = space.commit(r).unwrap_err();
    match err {
        Error::OutOfMemory { requested, largest_free, pool_size, max_size } => {
            assert_eq!(requested, len);
            assert_eq!(pool_size, 0, "nothing was mapped before");
            let max = max_size.expect("the device's memory");
            assert!(max > 0 && max <= total && largest_free <= max, "{err:?}");
        }
        other => panic!("expected out of memory, got {other:?}"),
    }
    assert_eq!((space.committed_bytes(), space.mapped_bytes(), space.handle_count()), (0, 0, 0));
    // Everything mapped on the way was given back.
    let after = device.memory_info().unwrap().free;
    assert!(after + (64 << 20) >= before, "free memory {before} before, {after} after");
    // And the space still works.
    let a = sub(r, 0, g);
    space.commit(a).unwrap();
    let stream = CudaStream::new(device).unwrap();
    fill(&stream, &block(a), pattern(7));
    expect_filled(&stream, &block(a), pattern(7));
    space.decommit(a, &stream).unwrap();
    space.release(r).unwrap();
}

#[test]
fn dropping_the_space_gives_everything_back() {
    let _serial = serial();
    let Some(device) = gpu("dropping_the_space_gives_everything_back") else { return };
    let context = device.primary_context().unwrap();
    let before = context.memory_info().unwrap().free;
    let space = CudaVirtualSpace::new(device).unwrap();
    let g = space.granule();
    let r = space.reserve(1 << 30).unwrap();
    space.commit(sub(r, 0, 100 * g)).unwrap();
    let during = context.memory_info().unwrap().free;
    assert!(during + 100 * g <= before + (64 << 20), "{before} free before, {during} with 100 granules");
    drop(space);
    let after = context.memory_info().unwrap().free;
    assert!(after + (64 << 20) >= before, "{before} free before, {after} after the drop");
}

/// Randomized allocate and free through a `VirtualPool` on device memory:
/// the pool's checker after every step, every live block written with its
/// own pattern and read back before it is freed, and the pool's committed
/// bytes equal to the space's.
fn pool_run(device: memres_cuda::Device, handle_granules: u32, config: VirtualConfig, seed: u64) {
    let space = CudaVirtualSpace::with_handle_granules(device, handle_granules).unwrap();
    let g = space.granule();
    let stream = CudaStream::new(device).unwrap();
    let mut pool = VirtualPool::with_config(&space, config).unwrap();
    let mut rng = SplitMix64::new(seed);
    let mut live: Vec<(Block, u32)> = Vec::new();
    let mut peak_live_granules = 0u64;
    for step in 0..400u64 {
        if live.is_empty() || rng.below(100) < 55 {
            // Sizes from 1 byte to 24 MiB, log-uniform.
            let bits = rng.below(25);
            let size = 1 + rng.below(1u64 << bits);
            let b = pool.allocate(Request::new(size).unwrap(), &stream).unwrap();
            let p = pattern(step);
            if b.size() >= 4 {
                fill(&stream, &b, p);
            }
            live.push((b, p));
        } else {
            let (b, p) = live.swap_remove(rng.below(live.len() as u64) as usize);
            if b.size() >= 4 {
                expect_filled(&stream, &b, p);
            }
            pool.deallocate(b, &stream).unwrap();
        }
        pool.check().unwrap_or_else(|v| panic!("step {step}: {v}"));
        assert_eq!(pool.usage().held, space.committed_bytes(), "step {step}");
        // The pool gives back whole handles only: the space maps what it
        // counts committed, and keeps no more than the threshold of what
        // it could give back (free granules of a handle that a live block
        // holds stay).
        assert_eq!(space.mapped_bytes(), space.committed_bytes(), "step {step}");
        let touched: u64 = live.iter().map(|(b, _)| b.size().div_ceil(g) + 1).sum();
        peak_live_granules = peak_live_granules.max(touched);
        assert!(pool.releasable_bytes() <= config.release_threshold_bytes(), "step {step}");
    }
    for (b, p) in live.drain(..) {
        if b.size() >= 4 {
            expect_filled(&stream, &b, p);
        }
        pool.deallocate(b, &stream).unwrap();
        pool.check().unwrap();
    }
    assert_eq!(pool.usage().used, 0);
    assert!(pool.usage().held <= config.release_threshold_bytes());
    assert!(
        pool.usage().peak_held <= peak_live_granules * g,
        "peak committed beyond the granules live blocks touched"
    );
    assert_eq!(space.peak_committed_bytes(), pool.usage().peak_held);
    pool.trim(&stream).unwrap();
    assert_eq!((space.committed_bytes(), space.mapped_bytes()), (0, 0));
    drop(pool);
    assert_eq!(space.reservation_count(), 0);
}

#[test]
fn a_virtual_pool_on_device_memory_keeps_its_invariants_and_contents() {
    let _serial = serial();
    let Some(device) = gpu("a_virtual_pool_on_device_memory_keeps_its_invariants_and_contents") else {
        return;
    };
    pool_run(
        device,
        CudaVirtualSpace::DEFAULT_HANDLE_GRANULES,
        VirtualConfig::new(64 << 30).release_threshold(64 << 20),
        1,
    );
    pool_run(device, 1, VirtualConfig::new(64 << 30), 2);
    pool_run(device, 8, VirtualConfig::new(1 << 30).release_threshold(16 << 20).max_reservations(8), 3);
}
