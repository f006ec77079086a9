//! Bad arguments to the index: refused with a typed error, nothing changed.

extern crate std;

use super::*;
use crate::{Error, Range, Request};

/// What a refused call must leave as it was.
fn state(index: &CoalescingIndex) -> (u64, u64, u64, u64, usize) {
    let s = (
        index.free_bytes(),
        index.used_bytes(),
        index.used_count(),
        index.largest_free(),
        index.node_slots(),
    );
    index.check().unwrap();
    s
}

/// The path an audit traced by hand: an alignment of 513 made `move_where`
/// compute a place below the range, after `carve_at` had taken it out of
/// its bin; `aligned - addr` then underflowed (a wrapped address in
/// release, a panic mid-update with overflow checks).
#[test]
fn move_where_with_an_alignment_not_a_power_of_two_changes_nothing() {
    let mut index: CoalescingIndex = CoalescingIndex::new(256);
    index.add_range(Range::new(256, 512).unwrap()).unwrap();
    let a = index.allocate(256, 256).unwrap().unwrap();
    let before = state(&index);
    let r = index.move_where(a, 256, 513, 8, |at, _| at == 0);
    assert_eq!(r, Err(Error::InvalidAlignment { align: 513 }));
    assert_eq!(state(&index), before);
    // `a` is still live under its tag.
    index.free(a.tag, a.addr, 256).unwrap();
    assert_eq!(index.largest_free(), 512);
    index.check().unwrap();
}

/// Every entry point that takes a size and an alignment refuses the ones
/// no request can have: a debug assertion before, arithmetic that wraps
/// or overflows after.
#[test]
fn every_sized_entry_point_refuses_bad_sizes_and_alignments() {
    const MAX: &str = "above Request::MAX_SIZE";
    let bad = [
        (0, 256, Error::InvalidSize { size: 0, what: "zero bytes" }),
        (Request::MAX_SIZE + 1, 256, Error::InvalidSize { size: Request::MAX_SIZE + 1, what: MAX }),
        (u64::MAX, 256, Error::InvalidSize { size: u64::MAX, what: MAX }),
        (256, 0, Error::InvalidAlignment { align: 0 }),
        (256, 3, Error::InvalidAlignment { align: 3 }),
        (256, 513, Error::InvalidAlignment { align: 513 }),
        (256, Request::MAX_ALIGN << 1, Error::InvalidAlignment { align: Request::MAX_ALIGN << 1 }),
        (256, u64::MAX, Error::InvalidAlignment { align: u64::MAX }),
    ];
    let mut index: CoalescingIndex = CoalescingIndex::new(256);
    let first = index.add_range(Range::new(0, 1 << 20).unwrap()).unwrap();
    let a = index.allocate(1024, 256).unwrap().unwrap();
    let before = state(&index);
    for (size, align, e) in bad {
        assert_eq!(index.allocate(size, align), Err(e), "allocate({size}, {align})");
        assert_eq!(index.allocate_with_range(size, align), Err(e));
        assert_eq!(index.allocate_from_at_most(size, align, u64::MAX), Err(e));
        assert_eq!(index.allocate_in(first, size, align), Err(e));
        assert_eq!(index.move_where(a, size, align, 8, |_, _| true), Err(e));
        assert_eq!(state(&index), before, "after ({size}, {align})");
    }
    // The limits themselves are served.
    let b = index.allocate(256, Request::MAX_ALIGN).unwrap();
    assert_eq!(b, None, "no 2^40-aligned place in the first MiB but 0, which is used");
    assert_eq!(index.allocate(Request::MAX_SIZE, 256), Ok(None));
    index.free(a.tag, a.addr, 1024).unwrap();
    // (`allocate` wants a range that holds the worst-case padding.)
    assert_eq!(index.allocate_in(first, 256, Request::MAX_ALIGN).unwrap().map(|b| b.addr), Some(0));
    index.check().unwrap();
}

/// `allocate_class` errs as `allocate` does: a size of zero is refused
/// whatever its class (a class of 256 carved a block stating 0 bytes).
#[test]
fn allocate_class_refuses_a_size_of_zero_whatever_the_class() {
    let mut index: CoalescingIndex = CoalescingIndex::new(256);
    let first = index.add_range(Range::new(0, 4096).unwrap()).unwrap();
    let before = state(&index);
    let e = Err(Error::InvalidSize { size: 0, what: "zero bytes" });
    for class in [0, 256, 1024] {
        assert_eq!(index.allocate_class(0, class, 256), e, "class {class}");
        assert_eq!(index.allocate_class_in(first, 0, class, 256), e, "class {class}");
        assert_eq!(state(&index), before);
    }
    let a = index.allocate_class(300, 1024, 256).unwrap().unwrap();
    index.free(a.tag, a.addr, 300).unwrap();
    assert_eq!((index.used_bytes(), index.free_bytes()), (0, 4096));
    index.check().unwrap();
}

/// A free whose size rounds past `u64::MAX` is a size mismatch (it
/// overflowed), as is one that rounds as the allocation's did, and the
/// block can still be freed with its size.
#[test]
fn a_free_with_a_size_whose_rounding_overflows_is_a_mismatch() {
    let mut index: CoalescingIndex = CoalescingIndex::new(256);
    let first = index.add_range(Range::new(0, 4096).unwrap()).unwrap();
    let a = index.allocate(1000, 256).unwrap().unwrap();
    let before = state(&index);
    // 1001 and 1024 round as 1000 does: still not the size asked for.
    for size in [u64::MAX, u64::MAX - 254, u64::MAX - 255 + 1, 1001, 1024, 0] {
        let e = Err(Error::SizeMismatch { addr: 0, expected: 1000, given: size });
        assert_eq!(index.free(a.tag, a.addr, size), e);
        assert_eq!(index.free_by_address(first, a.addr, size, false), e);
        assert_eq!(state(&index), before);
    }
    index.free(a.tag, a.addr, 1000).unwrap();
    assert_eq!((index.used_bytes(), index.free_bytes()), (0, 4096));
}

/// A region at the top of the address space with alignments larger than
/// its distance to 2^64: `addr + align - 1` overflowed in the fit.
#[test]
fn a_region_at_the_top_of_the_address_space_fits_without_overflow() {
    let mut index: CoalescingIndex = CoalescingIndex::new(256);
    let start = 0u64.wrapping_sub(1 << 20);
    let first = index.add_range(Range::new(start, 1 << 16).unwrap()).unwrap();
    let huge = Request::MAX_ALIGN;
    assert_eq!(index.allocate(256, huge), Ok(None));
    assert_eq!(index.allocate_in(first, 256, huge), Ok(None));
    let a = index.allocate(256, 256).unwrap().unwrap();
    assert_eq!(a.addr, start);
    // Not at `huge`, it is refused; at 1 MiB (the region's start is)
    // nowhere else fits: it stays.
    assert_eq!(index.move_where(a, 256, huge, 8, |_, _| true), Err(Error::InvalidAlignment { align: huge }));
    let a = index.move_where(a, 256, 1 << 20, 8, |_, _| true).unwrap();
    assert_eq!(a.addr, start);
    let b = index.allocate(4096, 1 << 12).unwrap().unwrap();
    assert_eq!(b.addr, start + 4096);
    index.check().unwrap();
    index.free(a.tag, a.addr, 256).unwrap();
    index.free(b.tag, b.addr, 4096).unwrap();
    assert!(index.is_region_free(first));
    index.check().unwrap();
}

/// The one call that runs caller code mid-update: a `fits` that panics
/// leaves `a` freed and the index consistent and usable.
#[test]
fn a_panic_in_move_where_leaves_the_index_consistent() {
    let mut index: CoalescingIndex = CoalescingIndex::new(256);
    index.add_range(Range::new(0, 8192).unwrap()).unwrap();
    let keep = index.allocate(1024, 256).unwrap().unwrap();
    let a = index.allocate(1024, 256).unwrap().unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        index.move_where(a, 1024, 256, 8, |_, _| panic!("fits panics"))
    }));
    assert!(r.is_err());
    index.check().unwrap();
    assert_eq!((index.used_count(), index.used_bytes()), (1, 1024));
    assert_eq!(index.free(a.tag, a.addr, 1024), Err(Error::DoubleFree { addr: a.addr }));
    // Usable: fill it, empty it.
    let mut held = std::vec::Vec::new();
    while let Some(b) = index.allocate(256, 256).unwrap() {
        held.push(b);
    }
    assert_eq!(held.len(), 28);
    for b in held {
        index.free(b.tag, b.addr, 256).unwrap();
    }
    index.free(keep.tag, keep.addr, 1024).unwrap();
    assert_eq!(index.largest_free(), 8192);
    index.check().unwrap();
}

#[test]
fn a_list_cut_short_panics_at_its_end_and_reads_nothing_past_it() {
    // As a panic caught mid-update could leave it: the vacant list counts
    // slots but ends at once. Taking one panics reading `NONE`, never
    // reading past the storage (Miri checks), and changes nothing.
    let mut index = CoalescingIndex::<DefaultStorage<Node>>::new(256);
    index.reserve(4).unwrap();
    index.vacant = NONE;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| index.take_vacant()));
    let message = *r.unwrap_err().downcast::<&str>().unwrap();
    assert!(message.contains("a list ends early"), "{message}");
    assert_eq!((index.vacant, index.vacant_len), (NONE, 4));
}

/// What every walk answers for `handle`, checking that the walk visits
/// nothing: a handle that names no region's start is a region of no ranges.
fn assert_no_region(index: &mut CoalescingIndex, handle: u32, addr: u64) {
    index.for_each_in_region(handle, |r, free| panic!("slot {handle} walked to {r:?} (free: {free})"));
    assert_eq!(index.find_used(handle, addr), None);
    assert!(!index.is_free_at(handle, addr));
    assert!(!index.is_region_free(handle));
    for had_tag in [false, true] {
        assert_eq!(index.free_by_address(handle, addr, 1024, had_tag), Err(Error::UnknownBlock { addr }));
    }
}

/// A handle that starts no region: a slot that `reserve`, or an `allocate`
/// of an empty index, made and no range ever used; a range inside a
/// region; a slot a merge vacated. The walks answer as for a handle out of
/// range, with no ranges, and change nothing. Before, a slot never used
/// linked to slot 0 (its links were 0, not `NONE`), so a walk from slot 0
/// went round it for ever; a range inside a region was walked as if it
/// started one (`free_by_address` freed a block there), and a vacated slot
/// by its stale links.
#[test]
fn a_handle_that_starts_no_region_is_a_region_of_no_ranges() {
    let mut index: CoalescingIndex = CoalescingIndex::new(256);
    index.reserve(2).unwrap();
    for handle in [0, 1, 2, u32::MAX] {
        assert_no_region(&mut index, handle, 0);
    }
    let mut index: CoalescingIndex = CoalescingIndex::new(256);
    assert_eq!(index.allocate(1024, 256), Ok(None));
    assert_eq!(index.node_slots(), 2);
    for handle in [0, 1] {
        assert_no_region(&mut index, handle, 0);
    }

    let first = index.add_range(Range::new(0, 4096).unwrap()).unwrap();
    let a = index.allocate(1024, 256).unwrap().unwrap();
    let b = index.allocate(1024, 256).unwrap().unwrap();
    let inner = b.tag as u32;
    assert_ne!(inner, first);
    let before = state(&index);
    assert_no_region(&mut index, inner, b.addr);
    assert_eq!(state(&index), before);
    // The region's handle still walks it.
    assert_eq!(index.find_used(first, b.addr), Some(b.tag));
    index.free(b.tag, b.addr, 1024).unwrap();
    index.free(a.tag, a.addr, 1024).unwrap();
    // `b`'s slot was merged into `a`'s: vacant, its links stale.
    assert_no_region(&mut index, inner, b.addr);
    let mut ranges = 0;
    index.for_each_in_region(first, |r, free| {
        assert_eq!((r, free), (Range::new(0, 4096).unwrap(), true));
        ranges += 1;
    });
    assert_eq!(ranges, 1);
    assert!(index.is_region_free(first));
    index.check().unwrap();
}

/// Regions added overlapping (against `add_range`'s contract) may hold more
/// than `u64::MAX` bytes: the counts read saturated and stay exact beneath,
/// the lists consistent (before, the free count overflowed: a panic in a
/// debug build, a wrap in a release one).
#[test]
fn overlapping_regions_past_u64_max_are_counted_saturated() {
    let mut index: CoalescingIndex = CoalescingIndex::new(256);
    let r = Range::new(0, 1 << 63).unwrap();
    let first = index.add_range(r).unwrap();
    let second = index.add_range(r).unwrap();
    index.check().unwrap();
    assert_eq!(index.free_bytes(), u64::MAX);
    let a = index.allocate(Request::MAX_SIZE, 256).unwrap().unwrap();
    index.check().unwrap();
    assert_eq!((index.used_bytes(), index.free_bytes()), (1 << 62, 3 << 62));
    index.free(a.tag, a.addr, Request::MAX_SIZE).unwrap();
    assert_eq!(index.free_bytes(), u64::MAX);
    assert_eq!((index.remove_range(first), index.remove_range(second)), (Ok(r), Ok(r)));
    assert_eq!((index.used_bytes(), index.free_bytes()), (0, 0));
    index.check().unwrap();
}
