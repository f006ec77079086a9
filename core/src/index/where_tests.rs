//! [`CoalescingIndex::move_where`]: the places it offers, in order, and
//! what it leaves.

extern crate std;

use super::*;
use crate::{Error, Range};
use std::vec::Vec;

const K: u64 = 1024;

/// A region of 16 KiB with three free ranges between used blocks:
/// `[0, 1K)`, `[2K, 5K)` and `[6K, 14K)`.
fn three_ranges() -> (CoalescingIndex, u32) {
    let mut index: CoalescingIndex = CoalescingIndex::new(256);
    let first = index.add_range(Range::new(0, 16 * K).unwrap()).unwrap();
    let sizes = [1, 1, 3, 1, 8, 2].map(|k| k * K);
    let blocks = sizes.map(|s| index.allocate(s, 256).unwrap().unwrap());
    for i in [0, 2, 4] {
        index.free(blocks[i].tag, blocks[i].addr, sizes[i]).unwrap();
    }
    assert_eq!(free_ranges(&index, first), [(0, K), (2 * K, 5 * K), (6 * K, 14 * K)]);
    (index, first)
}

fn free_ranges(index: &CoalescingIndex, first: u32) -> Vec<(u64, u64)> {
    let mut free = Vec::new();
    index.for_each_in_region(first, |r, is_free| {
        if is_free {
            free.push((r.start(), r.end()));
        }
    });
    free
}

/// Allocates `size` at `align` and moves it by `move_where`, accepting
/// only `accept`; returns every place offered, and the block's address.
fn offered(index: &mut CoalescingIndex, size: u64, align: u64, tries: u32, accept: u64) -> (Vec<u64>, u64) {
    let a = index.allocate(size, align).unwrap().unwrap();
    let mut seen = Vec::new();
    let b = index
        .move_where(a, size, align, tries, |addr, free| {
            // Each place is offered with the free range that holds it.
            assert!(free.start() <= addr && addr + size <= free.end(), "{addr} outside {free:?}");
            seen.push(addr);
            addr == accept
        })
        .unwrap();
    assert_ne!(b.tag, a.tag, "a moved or re-carved block has a new tag");
    assert!(index.free(a.tag, a.addr, size).is_err(), "the old tag frees nothing");
    index.free(b.tag, b.addr, size).unwrap();
    index.check().unwrap();
    (seen, b.addr)
}

#[test]
fn each_range_that_fits_is_offered_at_its_start_then_its_end_smaller_first() {
    let (mut index, first) = three_ranges();
    let before = (index.free_bytes(), index.used_bytes(), free_ranges(&index, first));
    // 1.5 KiB fits the 3 KiB and the 8 KiB ranges, not the 1 KiB one.
    // `allocate` takes the 3 KiB range's start; refused everywhere, it
    // stays there.
    let (seen, at) = offered(&mut index, 1536, 256, 8, u64::MAX);
    assert_eq!(seen, [2 * K, 5 * K - 1536, 6 * K, 14 * K - 1536]);
    assert_eq!(at, 2 * K);
    assert_eq!((index.free_bytes(), index.used_bytes(), free_ranges(&index, first)), before);
    // `tries` bounds the ranges looked at.
    assert_eq!(offered(&mut index, 1536, 256, 1, u64::MAX).0, [2 * K, 5 * K - 1536]);
    // Ends are aligned down: 14K - 1.5K at 1 KiB is 12K.
    assert_eq!(offered(&mut index, 1536, K, 8, u64::MAX).0, [2 * K, 3 * K, 6 * K, 12 * K]);
    // The request's own class comes first: 1 KiB fits the 1 KiB range.
    // An exact fit's start is its end: offered once.
    assert_eq!(offered(&mut index, K, 256, 2, u64::MAX).0, [0, 2 * K, 4 * K]);
}

#[test]
fn the_place_accepted_is_carved_and_frees_as_any_block() {
    let (mut index, first) = three_ranges();
    let used = index.used_bytes();
    let a = index.allocate(1536, 256).unwrap().unwrap();
    let b = index.move_where(a, 1536, 256, 8, |addr, _| addr == 14 * K - 1536).unwrap();
    assert_eq!(b.addr, 14 * K - 1536);
    assert_eq!(index.used_bytes(), used + 1536);
    // Where `a` was is free again; what is left of the 8 KiB range, before it.
    assert_eq!(free_ranges(&index, first), [(0, K), (2 * K, 5 * K), (6 * K, 14 * K - 1536)]);
    index.check().unwrap();
    index.free(b.tag, b.addr, 1536).unwrap();
    assert_eq!(free_ranges(&index, first), [(0, K), (2 * K, 5 * K), (6 * K, 14 * K)]);
    index.check().unwrap();
}

#[test]
fn a_block_that_is_not_live_is_refused_and_nothing_changes() {
    let (mut index, first) = three_ranges();
    let a = index.allocate(1536, 256).unwrap().unwrap();
    index.free(a.tag, a.addr, 1536).unwrap();
    let before = free_ranges(&index, first);
    assert!(index.move_where(a, 1536, 256, 8, |_, _| true).is_err());
    let b = index.allocate(1536, 256).unwrap().unwrap();
    assert!(matches!(index.move_where(b, 2048, 256, 8, |_, _| true), Err(Error::SizeMismatch { .. })));
    index.free(b.tag, b.addr, 1536).unwrap();
    assert_eq!(free_ranges(&index, first), before);
    index.check().unwrap();
}

#[test]
fn a_block_of_a_size_class_keeps_its_class_where_it_goes() {
    let mut index: CoalescingIndex = CoalescingIndex::new(256);
    let first = index.add_range(Range::new(0, 4 * K).unwrap()).unwrap();
    let a = index.allocate_class(300, K, 256).unwrap().unwrap();
    // Refused everywhere: re-carved where it was, a class as before.
    let a = index.move_where(a, 300, 256, 8, |_, _| false).unwrap();
    assert_eq!((a.addr, index.used_bytes()), (0, K));
    // Moved to the range's end: the class goes with it.
    let b = index.move_where(a, 300, 256, 8, |addr, _| addr != 0).unwrap();
    assert_eq!((b.addr, index.used_bytes()), (3 * K, K));
    assert_eq!(free_ranges(&index, first), [(0, 3 * K)]);
    index.check().unwrap();
    index.free(b.tag, b.addr, 300).unwrap();
    assert_eq!(free_ranges(&index, first), [(0, 4 * K)]);
}

#[test]
fn a_block_not_at_the_alignment_asked_is_refused_unmoved() {
    let (mut index, first) = three_ranges();
    let a = index.allocate(256, 256).unwrap().unwrap();
    let b = index.allocate(256, 256).unwrap().unwrap();
    assert_eq!((a.addr, b.addr), (0, 256), "the test wants a block off 2 KiB");
    let before = (index.free_bytes(), index.used_bytes(), free_ranges(&index, first));
    // Refused everywhere, it would stay at its own place: not at 2 KiB.
    let refused = index.move_where(b, 256, 2 * K, 8, |_, _| false);
    assert!(matches!(refused, Err(Error::InvalidAlignment { align }) if align == 2 * K), "{refused:?}");
    assert_eq!((index.free_bytes(), index.used_bytes(), free_ranges(&index, first)), before);
    // Still live under its tag, and movable at its own alignment.
    let b = index.move_where(b, 256, 256, 8, |_, _| false).unwrap();
    index.free(b.tag, b.addr, 256).unwrap();
    index.free(a.tag, a.addr, 256).unwrap();
    index.check().unwrap();
}
