//! Frees of addresses the driver does not know are errors and change
//! nothing. Reports itself SKIPPED (and tests nothing) without a GPU.
//!
//! This binary holds one test on purpose: a repeated free is only harmless
//! while no other thread of the process can be handed the same address in
//! between, which tests running side by side could be.

mod common;

use common::{expect_filled, fill, gpu};
use memres_core::{Block, Error, MemoryResource, Request};
use memres_cuda::{CudaMemory, CudaStream, PinnedMemory};

#[test]
fn unknown_and_repeated_frees_are_errors_and_change_nothing() {
    let Some(device) = gpu("unknown_and_repeated_frees_are_errors_and_change_nothing") else { return };
    let mr = CudaMemory::new(device).unwrap();
    let stream = CudaStream::new(device).unwrap();
    let keep = mr.allocate(Request::new(1 << 20).unwrap(), &stream).unwrap();
    let b = mr.allocate(Request::new(4096).unwrap(), &stream).unwrap();
    mr.deallocate(b, &stream).unwrap();
    assert_eq!(mr.deallocate(b, &stream), Err(Error::UnknownBlock { addr: b.addr() }));
    let bogus = Block::from_addr(keep.addr() + 256, 256);
    assert_eq!(mr.deallocate(bogus, &stream), Err(Error::UnknownBlock { addr: bogus.addr() }));
    // A block forged inside a live allocation: its address and its padding
    // 256 bytes higher name the same driver allocation, but it is not the
    // block handed out there.
    let aligned = Request::aligned(1000, 4096).unwrap();
    let a = mr.allocate(aligned, &stream).unwrap();
    let forged = Block::new(a.addr() + 256, a.size(), a.tag() + 256);
    assert_eq!(mr.deallocate(forged, &stream), Err(Error::UnknownBlock { addr: forged.addr() }));
    mr.deallocate(a, &stream).unwrap();
    let pinned = PinnedMemory::new(device).unwrap();
    let a = pinned.allocate(aligned, &stream).unwrap();
    let forged = Block::new(a.addr() + 256, a.size(), a.tag() + 256);
    assert_eq!(pinned.deallocate(forged, &stream), Err(Error::UnknownBlock { addr: forged.addr() }));
    pinned.deallocate(a, &stream).unwrap();
    // The live block is untouched and still usable.
    fill(&stream, &keep, 0x600D_600D);
    expect_filled(&stream, &keep, 0x600D_600D);
    mr.deallocate(keep, &stream).unwrap();
}
