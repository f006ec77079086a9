//! The index at the end of its generations, and its last-resort search.

use super::nodes::State;
use super::*;
use crate::{Error, Range};

/// The index of a tag.
fn slot(a: Allocation) -> u32 {
    a.tag as u32
}

/// A region's first node at the end of its generations: moved, with the
/// region still named by its handle, and the stale tags of both slots
/// never free the new owner (before, the generation wrapped and a tag
/// 2^32 allocations old freed the block of whoever held the slot).
#[test]
fn a_used_up_first_node_moves_and_its_stale_tags_never_match() {
    let mut index: CoalescingIndex = CoalescingIndex::new(256);
    let first = index.add_range(Range::new(0, 4096).unwrap()).unwrap();
    let a = index.allocate(4096, 256).unwrap().unwrap();
    assert_eq!(slot(a), first);
    index.free(a.tag, a.addr, 4096).unwrap();
    // As after 2^32 - 2 more allocations of this slot: the next one gets
    // its last generation; the one after that used to wrap to 0, and
    // the next to `a`'s generation.
    index.set_generation(first, u32::MAX - 1);
    for _ in 0..2 {
        let b = index.allocate(4096, 256).unwrap().unwrap();
        index.check().unwrap();
        index.free(b.tag, b.addr, 4096).unwrap();
    }
    let c = index.allocate(4096, 256).unwrap().unwrap();
    assert_eq!(c.addr, a.addr);
    assert_ne!(slot(c), first, "the used-up slot was handed out again");
    assert_eq!(index.free(a.tag, a.addr, 4096), Err(Error::UnknownBlock { addr: 0 }));
    assert_eq!(index.free_by_address(first, a.addr, 4096, true), Err(Error::DoubleFree { addr: 0 }));
    let last_of_first = ((u32::MAX as u64) << 32) | first as u64;
    assert_eq!(index.free(last_of_first, 0, 4096), Err(Error::UnknownBlock { addr: 0 }));
    assert_eq!(index.used_count(), 1);
    index.check().unwrap();
    // The handle still names the region.
    assert_eq!(index.find_used(first, 0), Some(c.tag));
    assert!(!index.is_region_free(first));
    index.free(c.tag, c.addr, 4096).unwrap();
    assert!(index.is_region_free(first) && index.is_free_at(first, 256));
    let (mut seen, mut n) = ([(Range::default(), false); 2], 0);
    index.for_each_in_region(first, |r, free| {
        seen[n] = (r, free);
        n += 1;
    });
    assert_eq!(seen[..n], [(Range::new(0, 4096).unwrap(), true)]);
    assert_eq!(index.remove_range(first), Ok(Range::new(0, 4096).unwrap()));
    index.check().unwrap();
    // The retired slot is never reused; the moved node's slot is.
    let again = index.add_range(Range::new(0, 4096).unwrap()).unwrap();
    assert_ne!(again, first);
    assert_eq!(index.nodes[first as usize].state, State::Retired);
    index.check().unwrap();
}

/// The same for a node inside a region, and for a used-up node that a
/// merge vacates: it is retired, not put on the vacant list.
#[test]
fn a_used_up_inner_node_moves_and_a_used_up_vacated_node_retires() {
    let mut index: CoalescingIndex = CoalescingIndex::new(256);
    index.add_range(Range::new(0, 8192).unwrap()).unwrap();
    let front = index.allocate(1024, 256).unwrap().unwrap();
    let a = index.allocate(1024, 256).unwrap().unwrap();
    let inner = slot(a);
    index.free(a.tag, a.addr, 1024).unwrap();
    index.set_generation(inner, u32::MAX);
    let b = index.allocate(1024, 256).unwrap().unwrap();
    assert_eq!(b.addr, a.addr);
    assert_ne!(slot(b), inner);
    assert_eq!(index.nodes[inner as usize].state, State::Retired);
    index.check().unwrap();
    let stale = ((u32::MAX as u64) << 32) | inner as u64;
    assert_eq!(index.free(stale, a.addr, 1024), Err(Error::UnknownBlock { addr: a.addr }));
    assert_eq!(index.used_count(), 2);
    // `b`'s slot at the end of its generations, freed: when the front's
    // free absorbs it, it is retired instead of vacated.
    index.free(b.tag, b.addr, 1024).unwrap();
    index.set_generation(slot(b), u32::MAX);
    index.free(front.tag, front.addr, 1024).unwrap();
    assert_eq!(index.nodes[slot(b) as usize].state, State::Retired);
    index.check().unwrap();
    for _ in 0..8 {
        let x = index.allocate(256, 256).unwrap().unwrap();
        assert!(slot(x) != slot(b) && slot(x) != inner);
    }
    index.check().unwrap();
}

/// The last resort finds the one range that holds an aligned request: in
/// a class above the request's own, below those that fit by construction,
/// behind ranges whose padding leaves too little. `allocate` misses it.
#[test]
fn the_exhaustive_search_finds_an_aligned_fit_that_allocate_misses() {
    let mut index: CoalescingIndex = CoalescingIndex::new(256);
    // 70 granules each; only the first, at an aligned address, holds 64 at
    // 4096 (the others would need 15 granules of padding).
    for k in 0..10u64 {
        let start = (k << 20) + if k == 0 { 0 } else { 256 };
        index.add_range(Range::new(start, 70 * 256).unwrap()).unwrap();
    }
    assert_eq!(index.allocate(64 * 256, 4096).unwrap(), None);
    assert!(matches!(index.allocate_exhaustive(64 * 256, 3000), Err(Error::InvalidAlignment { .. })));
    let a = index.allocate_exhaustive(64 * 256, 4096).unwrap().unwrap();
    assert_eq!((a.addr, index.used_bytes()), (0, 64 * 256));
    assert_eq!(index.allocate_exhaustive(64 * 256, 4096).unwrap(), None);
    index.check().unwrap();
    index.free(a.tag, a.addr, 64 * 256).unwrap();
    assert_eq!((index.used_bytes(), index.free_bytes()), (0, 10 * 70 * 256));
    index.check().unwrap();
}
