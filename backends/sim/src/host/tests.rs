use super::{host_tests_together, HostMemory};
use memres_core::testing::{steps, SplitMix64};
use memres_core::Inspect;
use memres_core::{Block, Error, MemoryResource, Request};

#[test]
fn blocks_are_aligned_writable_and_counted() {
    let _together = host_tests_together();
    let host = HostMemory::new();
    let mut blocks = Vec::new();
    // (Under Miri, which reads the bytes one by one, 64 KiB for 1 MiB.)
    let big = if cfg!(miri) { 64 << 10 } else { 1 << 20 };
    for (i, &(size, align)) in
        [(1u64, 256u64), (256, 256), (257, 512), (5000, 1 << 16), (big, 4096)].iter().enumerate()
    {
        let b = host.allocate(Request::aligned(size, align).unwrap(), &()).unwrap();
        assert_eq!(b.addr() % align, 0);
        assert_eq!(b.size(), size);
        // SAFETY: the block is `size` bytes of live memory from the global
        // allocator that nothing else refers to.
        let bytes = unsafe { std::slice::from_raw_parts_mut(b.addr() as *mut u8, size as usize) };
        bytes.fill(i as u8);
        blocks.push(b);
    }
    let held: u64 = [256u64, 256, 512, 5120, big].iter().sum();
    assert_eq!(host.usage().held, held);
    assert_eq!(host.live_count(), 5);
    for (i, b) in blocks.iter().enumerate() {
        // SAFETY: still live, as above.
        let bytes = unsafe { std::slice::from_raw_parts(b.addr() as *const u8, b.size() as usize) };
        assert!(bytes.iter().all(|&x| x == i as u8), "block {i} was overwritten");
    }
    for b in blocks {
        host.deallocate(b, &()).unwrap();
    }
    assert_eq!((host.usage().held, host.usage().peak_held, host.live_count()), (0, held, 0));
    assert_eq!(host.call_counts(), (5, 5));
}

#[test]
fn zero_sized_requests_take_nothing() {
    let _together = host_tests_together();
    let host = HostMemory::new();
    let b = host.allocate(Request::new(0).unwrap(), &()).unwrap();
    assert!(b.is_empty());
    host.deallocate(b, &()).unwrap();
    assert_eq!(host.call_counts(), (0, 0));
}

#[test]
fn bad_frees_are_errors_and_change_nothing() {
    let _together = host_tests_together();
    let host = HostMemory::new();
    let b = host.allocate(Request::new(1000).unwrap(), &()).unwrap();
    let stray = Block::from_addr(b.addr() + 256, 256);
    assert_eq!(host.deallocate(stray, &()), Err(Error::UnknownBlock { addr: b.addr() + 256 }));
    let wrong_size = Block::from_addr(b.addr(), 999);
    assert_eq!(
        host.deallocate(wrong_size, &()),
        Err(Error::SizeMismatch { addr: b.addr(), expected: 1000, given: 999 })
    );
    assert_eq!((host.usage().held, host.live_count()), (1024, 1));
    host.deallocate(b, &()).unwrap();
    assert_eq!(host.deallocate(b, &()), Err(Error::UnknownBlock { addr: b.addr() }));
    assert_eq!((host.usage().held, host.live_count()), (0, 0));
}

// Not under Miri: CI runs it with address reuse off, so no freed address
// comes back.
#[cfg(not(miri))]
#[test]
fn a_stale_block_whose_address_was_handed_out_again_is_a_double_free() {
    // The table knew addresses only: a second free of a block whose
    // address the allocator had handed out again, to this resource, freed
    // the new holder's block.
    let _together = host_tests_together();
    let host = HostMemory::new();
    let one = || host.allocate(Request::new(1000).unwrap(), &()).unwrap();
    let freed: Vec<Block> = (0..64).map(|_| one()).collect();
    for &b in &freed {
        host.deallocate(b, &()).unwrap();
    }
    // The allocator hands some of those addresses out again.
    let live: Vec<Block> = (0..64).map(|_| one()).collect();
    let (a, b) = freed
        .iter()
        .find_map(|a| live.iter().find(|b| b.addr() == a.addr()).map(|b| (*a, *b)))
        .expect("the allocator handed no freed address out again");
    assert_eq!(host.deallocate(a, &()), Err(Error::DoubleFree { addr: a.addr() }));
    assert_eq!((host.usage().held, host.live_count()), (64 * 1024, 64));
    // The live blocks go back, by their tags or by their bare addresses.
    host.deallocate(b, &()).unwrap();
    for &c in live.iter().filter(|c| c.addr() != b.addr()) {
        host.deallocate(Block::from_addr(c.addr(), c.size()), &()).unwrap();
    }
    assert_eq!((host.usage().held, host.live_count(), host.check()), (0, 0, Ok(())));
}

// Not under Miri: it stops at an allocation larger than memory instead of
// failing it.
#[cfg(not(miri))]
#[test]
fn impossible_requests_fail_cleanly() {
    let _together = host_tests_together();
    let host = HostMemory::new();
    // Larger than any address space: the layout is refused or alloc fails.
    let err = host.allocate(Request::new(Request::MAX_SIZE).unwrap(), &()).unwrap_err();
    assert!(matches!(err, Error::InvalidSize { .. } | Error::OutOfMemory { .. }), "{err:?}");
    assert_eq!((host.usage().held, host.live_count()), (0, 0));
    let b = host.allocate(Request::new(10).unwrap(), &()).unwrap();
    host.deallocate(b, &()).unwrap();
}

#[test]
fn random_sequence_keeps_exact_accounting() {
    let _together = host_tests_together();
    let host = HostMemory::new();
    let mut rng = SplitMix64::new(3);
    let mut live: Vec<Block> = Vec::new();
    let mut expect_held = 0u64;
    let mut peak = 0u64;
    for _ in 0..steps(2000) {
        if live.is_empty() || rng.below(2) == 0 {
            let size = 1 + rng.below(1 << 16);
            let align = 256u64 << rng.below(5);
            let b = host.allocate(Request::aligned(size, align).unwrap(), &()).unwrap();
            assert_eq!(b.addr() % align, 0);
            assert!(live.iter().all(|o| b.addr() + b.size() <= o.addr() || o.addr() + o.size() <= b.addr()));
            expect_held += size.div_ceil(256) * 256;
            live.push(b);
        } else {
            let b = live.swap_remove(rng.below(live.len() as u64) as usize);
            host.deallocate(b, &()).unwrap();
            expect_held -= b.size().div_ceil(256) * 256;
        }
        peak = peak.max(expect_held);
        assert_eq!(host.usage().held, expect_held);
        assert_eq!(host.live_count(), live.len());
    }
    assert_eq!(host.usage().peak_held, peak);
    // Dropping with blocks outstanding frees them (Miri/ASan would flag a leak).
    drop(host);
}

#[test]
fn reset_peak_restarts_from_held() {
    let _together = host_tests_together();
    let host = HostMemory::new();
    let a = host.allocate(Request::new(4096).unwrap(), &()).unwrap();
    let b = host.allocate(Request::new(256).unwrap(), &()).unwrap();
    host.deallocate(a, &()).unwrap();
    host.reset_peak();
    assert_eq!(host.usage().peak_held, 256);
    host.deallocate(b, &()).unwrap();
}

#[test]
fn fresh_blocks_are_zeroed_even_in_reused_memory() {
    let _together = host_tests_together();
    // Heap memory full of 0xAB, freed: the allocator carves the next
    // allocations out of it. A stale holder of a freed block may read a
    // fresh one at its address, so every byte handed out is initialized.
    let junk: Vec<Vec<u8>> = (0..64).map(|_| vec![0xAB; 4096]).collect();
    drop(junk);
    let host = HostMemory::new();
    let blocks: Vec<Block> =
        (0..64).map(|_| host.allocate(Request::new(1000).unwrap(), &()).unwrap()).collect();
    for b in &blocks {
        // SAFETY: a live block of 1000 bytes that nothing else refers to
        // (the resource is this test's alone).
        let bytes = unsafe { std::slice::from_raw_parts(b.addr() as *const u8, 1000) };
        assert!(bytes.iter().all(|&x| x == 0), "block {:#x} holds old bytes", b.addr());
    }
    for b in blocks {
        host.deallocate(b, &()).unwrap();
    }
}

/// While the table is locked (a fork handler holds it across `fork`), no
/// allocation of any `HostMemory` goes through; once it is let go, they do.
#[test]
fn the_locked_table_holds_every_allocation_until_let_go() {
    let _together = host_tests_together();
    let allocation = || {
        let h = HostMemory::new();
        let b = h.allocate(Request::new(64).unwrap(), &()).unwrap();
        h.deallocate(b, &()).unwrap();
    };
    assert!(memres_core::testing::waits_for(HostMemory::lock_table(), allocation));
}
