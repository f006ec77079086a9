extern crate std;

use super::*;

/// Tells the free of the block or segment (`side`) at `addr` ahead, as a
/// tap does, runs `meanwhile` on the map (what the map shows while the
/// memory below frees, or what other threads do then), and has the free
/// refused.
fn refused(map: &mut MemoryMap, side: Side, addr: u64, stream: u64, meanwhile: impl FnOnce(&mut MemoryMap)) {
    let shared = crate::Shared::new(core::mem::replace(map, MemoryMap::new(0)));
    let freeing = Freeing::new(&shared, side, addr, stream, None);
    shared.with(meanwhile);
    drop(freeing);
    *map = shared.into_inner();
}

#[test]
fn runs_tile_each_segment_and_stray_blocks_stand_alone() {
    let mut map = MemoryMap::new(0);
    map.segment_alloc(1000, 100, 7, None);
    map.alloc(1000, 10, 9, 0, None);
    map.alloc(1090, 10, 10, 0, None);
    map.alloc(5000, 64, 60, 3, None); // in no segment
    let runs = map.runs();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0].runs.iter().map(|r| r.size).sum::<u64>(), 100);
    assert_eq!(runs[0].runs[1], Run { addr: 1010, size: 80, requested: None });
    assert_eq!((runs[1].addr, runs[1].size, runs[1].stream), (5000, 64, 3));
    assert_eq!((runs[0].alone, runs[1].alone), (false, true));
    assert_eq!((map.held(), map.live(), map.largest_free()), (100, 79, 80));
    map.free(1000, 0, None);
    map.free(1000, 0, None); // twice: ignored
    assert_eq!((map.live(), map.largest_free()), (70, 90));
    map.segment_free(1000, 0, None);
    assert_eq!(map.held(), 0);
}

/// Sizes of a map fed from outside that sum past u64 (it is public) wrap
/// in its totals and saturate in the pickled segment: no panic, and each
/// total is exact again once its blocks are gone.
#[test]
fn sizes_that_sum_past_u64_are_mapped_without_a_panic() {
    let mut map = MemoryMap::new(0);
    map.segment_alloc(0, 1 << 63, 0, None);
    map.segment_alloc(1 << 63, 1 << 63, 0, None);
    map.alloc(0, 1, u64::MAX, 0, None);
    map.alloc(1, 1, u64::MAX, 0, None);
    assert!(!map.pickle().is_empty());
    map.free(0, 0, None);
    map.free(1, 0, None);
    map.segment_free(0, 0, None);
    map.segment_free(1 << 63, 0, None);
    assert_eq!((map.held(), map.live()), (0, 0));
}

/// A map fed by hand, whose frees are final (no one takes them back),
/// keeps nothing per free once it is told. Before, each free left its
/// number in flight at its address until the address was handed out
/// again: a caller that frees ever new addresses grew the map for good.
#[test]
fn frees_told_by_hand_keep_nothing_in_flight() {
    let mut map = MemoryMap::new(10);
    for i in 1..=1000u64 {
        let addr = i << 16;
        map.segment_alloc(addr, 4096, 0, None);
        map.alloc(addr, 256, 256, 0, None);
        assert!(map.free(addr, 0, None).is_some());
        assert!(map.segment_free(addr, 0, None).is_some());
    }
    assert_eq!((map.held(), map.live()), (0, 0));
    assert_eq!((map.blocks_freeing.len(), map.segments_freeing.len()), (0, 0), "nothing in flight");
}

/// A free is told as PyTorch tells one that waits for no stream: a
/// `free_requested` and its `free_completed`, adjacent, which its viewer
/// merges into one free. Before, the `free_completed` alone: the viewer,
/// stepping back over it, brought the block back "freed but waiting due
/// to record_stream" (drawn red). A refused free's undo takes both back.
#[test]
fn a_free_is_told_as_requested_then_completed_and_its_undo_takes_both_back() {
    let mut map = MemoryMap::new(100);
    map.segment_alloc(0x10000, 4096, 0, None);
    map.alloc(0x10000, 1024, 1000, 0, None);
    map.alloc(0x10400, 1024, 1024, 0, None);
    let before: Vec<TraceEntry> = map.trace().copied().collect();
    refused(&mut map, Side::Blocks, 0x10000, 0, |map| {
        let actions: Vec<&str> = map.trace().map(|e| e.action.as_str()).collect();
        assert_eq!(actions, ["segment_alloc", "alloc", "alloc", "free_requested", "free_completed"]);
        assert!(map.trace().skip(3).all(|e| (e.addr, e.size) == (0x10000, 1000)));
    });
    assert_eq!(map.trace().copied().collect::<Vec<_>>(), before, "the undo takes both events back");
    assert_eq!(map.live(), 2024);

    // A trace whose front cut the `free_requested` off: the undo takes
    // the `free_completed` alone, and puts back the `alloc` it pushed out.
    let mut map = MemoryMap::new(1);
    map.segment_alloc(0x10000, 1024, 0, None);
    map.alloc(0x10000, 1024, 1000, 0, None);
    refused(&mut map, Side::Blocks, 0x10000, 0, |map| {
        assert_eq!(map.trace().map(|e| e.action).collect::<Vec<_>>(), [Action::FreeCompleted]);
    });
    assert_eq!(map.trace().map(|e| e.action).collect::<Vec<_>>(), [Action::Alloc]);
    assert_eq!(map.live(), 1000);
}

/// What PyTorch's viewer does in its "Allocator State History": from the
/// snapshot's segments and live blocks, undoes the trace from its last
/// event to its first. Asserts that every block is in a segment at each
/// step, and that each `segment_alloc` undone finds its segment (the
/// viewer's `find_segment` returns null for a block in none and the whole
/// view fails).
fn assert_the_viewer_finds_every_block_in_a_segment(map: &MemoryMap) {
    use std::collections::BTreeMap;
    let runs = map.runs();
    let mut segments: BTreeMap<u64, u64> = runs.iter().map(|s| (s.addr, s.size)).collect();
    let mut blocks: BTreeMap<u64, u64> = runs
        .iter()
        .flat_map(|s| &s.runs)
        .filter(|r| r.requested.is_some())
        .map(|r| (r.addr, r.size))
        .collect();
    for (i, e) in map.trace().enumerate().collect::<Vec<_>>().into_iter().rev() {
        match e.action {
            Action::Alloc => drop(blocks.remove(&e.addr)),
            Action::FreeCompleted => drop(blocks.insert(e.addr, e.size)),
            Action::FreeRequested => assert!(blocks.contains_key(&e.addr), "event {i}: no block"),
            Action::SegmentAlloc => assert!(segments.remove(&e.addr).is_some(), "event {i}: no segment"),
            Action::SegmentFree => drop(segments.insert(e.addr, e.size)),
            Action::Oom => {}
        }
        for &b in blocks.keys() {
            let holder = segments.range(..=b).next_back();
            assert!(
                holder.is_some_and(|(&s, &n)| b - s < n),
                "undone to event {i}: block {b:#x} in no segment"
            );
        }
    }
}

/// A block that lies in no segment (its leaf is not tapped: an upstream
/// built before the record, a `vpool`) is a segment of its own in the
/// trace too, whose `segment_alloc` and `segment_free` surround the
/// block's events. Before, it was one only while live: once freed, a
/// viewer undoing its `free_completed` found it in no segment, and the
/// whole history view failed. A refused free's undo takes the segment's
/// end back with the free.
#[test]
fn a_block_in_no_segment_is_a_segment_of_its_own_in_the_trace_too() {
    let mut map = MemoryMap::new(100);
    map.segment_alloc(0x8000, 1024, 0, None);
    map.alloc(0x1000, 512, 256, 3, None);
    map.alloc(0x2000, 256, 256, 0, None);
    map.alloc(0x8000, 256, 256, 0, None); // in the segment
    assert_the_viewer_finds_every_block_in_a_segment(&map);
    let before: Vec<TraceEntry> = map.trace().copied().collect();
    refused(&mut map, Side::Blocks, 0x1000, 4, |map| {
        assert_the_viewer_finds_every_block_in_a_segment(map);
        let actions: Vec<&str> = map.trace().map(|e| e.action.as_str()).collect();
        assert_eq!(
            actions,
            [
                "segment_alloc",
                "segment_alloc",
                "alloc",
                "segment_alloc",
                "alloc",
                "alloc",
                "free_requested",
                "free_completed",
                "segment_free",
            ]
        );
        let own = |e: &TraceEntry| e.addr == 0x1000 && e.action.as_str().starts_with("segment");
        let told: Vec<(u64, u64)> = map.trace().filter(|e| own(e)).map(|e| (e.size, e.stream)).collect();
        assert_eq!(told, [(512, 3), (512, 3)], "the block's own segment: its size, its stream");
        assert_eq!((map.held(), map.runs().len()), (1024, 2), "held counts the leaves' segments alone");
    });
    assert_eq!(map.trace().copied().collect::<Vec<_>>(), before, "the undo takes the segment's end back");
    map.free(0x1000, 4, None).unwrap();
    map.free(0x2000, 0, None).unwrap();
    map.free(0x8000, 0, None).unwrap();
    map.segment_free(0x8000, 0, None);
    assert_the_viewer_finds_every_block_in_a_segment(&map);
    assert_eq!((map.held(), map.live(), map.runs().len()), (0, 0, 0));
}

#[test]
fn the_trace_keeps_the_last_entries() {
    let mut map = MemoryMap::new(2);
    map.segment_alloc(0, 512, 0, Some(5));
    map.alloc(0, 256, 200, 0, Some(6));
    map.oom(1 << 40, 0, 0, None);
    let kept: Vec<Action> = map.trace().map(|e| e.action).collect();
    assert_eq!(kept, [Action::Alloc, Action::Oom]);
    assert_eq!(map.trace().next().unwrap().time_us, Some(6));
}

/// A segment is what the leaf holds for it: a request aligned above 256
/// bytes (an `align` layer's) is held by the leaf rounded to 256, as the
/// leaf counts it, not to its alignment. Before, the tap rounded to the
/// alignment: the map of `align(sim, alignment=64KiB)` held 576 KiB at a
/// peak where the leaves held 353 KiB.
#[test]
fn a_segment_is_what_the_leaf_holds_whatever_the_alignment() {
    use crate::testing::BumpUpstream;
    use crate::{Inspect, MemoryResource, Request, Shared};
    use alloc::sync::Arc;
    let map = Arc::new(Shared::new(MemoryMap::new(100)));
    let up = BumpUpstream::new(1 << 20);
    let leaf = Tap::new(&up, map.clone(), Side::Segments);
    let b = leaf.allocate(Request::aligned(1000, 64 << 10).unwrap(), &()).unwrap();
    assert_eq!(b.addr() % (64 << 10), 0);
    assert_eq!(map.with(|m| m.held()), up.usage().held);
    assert_eq!(map.with(|m| m.held()), 1024);
    leaf.deallocate(b, &()).unwrap();
    assert_eq!(map.with(|m| m.held()), 0);
}

#[test]
fn taps_tell_a_block_free_before_its_segment_and_keep_a_refused_free_live() {
    use crate::testing::BumpUpstream;
    use crate::{Block, MemoryResource, Request, Shared};
    use alloc::sync::Arc;
    let map = Arc::new(Shared::new(MemoryMap::new(100)));
    // No pool between the taps: each block is a segment of its own, and
    // its free gives the segment back at once.
    let leaf = Tap::new(BumpUpstream::new(1 << 20), map.clone(), Side::Segments);
    let top = Tap::new(leaf, map.clone(), Side::Blocks);
    let b = top.allocate(Request::new(1000).unwrap(), &()).unwrap();
    assert_eq!(map.with(|m| (m.held(), m.live())), (1024, 1000));
    top.deallocate(b, &()).unwrap();
    let actions: Vec<Action> = map.with(|m| m.trace().map(|e| e.action).collect());
    use Action::{FreeCompleted, FreeRequested, SegmentAlloc, SegmentFree};
    assert_eq!(actions, [SegmentAlloc, Action::Alloc, FreeRequested, FreeCompleted, SegmentFree]);
    assert_eq!(map.with(|m| (m.held(), m.live())), (0, 0));
    assert!(top.allocate(Request::new(2 << 20).unwrap(), &()).is_err());
    assert_eq!(map.with(|m| m.trace().last().map(|e| (e.action, e.size))), Some((Action::Oom, 2 << 20)));

    // A free the resource refuses leaves the block live in the map.
    let pool = Tap::new(
        Shared::new(crate::pool::CoalescingPool::new(BumpUpstream::new(1 << 30))),
        map.clone(),
        Side::Blocks,
    );
    let b = pool.allocate(Request::new(4096).unwrap(), &()).unwrap();
    let wrong = Block::new(b.addr(), 4096, 12345);
    let stranger = Block::new(b.addr() + (1 << 20), 256, Block::NO_TAG);
    let before: Vec<Action> = map.with(|m| m.trace().map(|e| e.action).collect());
    assert!(pool.deallocate(stranger, &()).is_err() && pool.deallocate(wrong, &()).is_err());
    assert_eq!(map.with(|m| m.live()), 4096);
    let after: Vec<Action> = map.with(|m| m.trace().map(|e| e.action).collect());
    assert_eq!(after, before, "a refused free tells the trace nothing (it told a free and an allocation)");
    pool.deallocate(b, &()).unwrap();
    assert_eq!(map.with(|m| m.live()), 0);

    // So does a free that panics: the resource still holds the block.
    let up = BumpUpstream::new(1 << 20);
    let tap = Tap::new(&up, map.clone(), Side::Blocks);
    let b = tap.allocate(Request::new(4096).unwrap(), &()).unwrap();
    let before = map.with(|m| (m.live(), m.trace().copied().collect::<Vec<_>>()));
    up.panic_in("deallocate", 0);
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tap.deallocate(b, &()))).is_err());
    let after = map.with(|m| (m.live(), m.trace().copied().collect::<Vec<_>>()));
    assert_eq!(after, before, "a free that panicked leaves the block live in the map");
    tap.deallocate(b, &()).unwrap();
    assert_eq!(map.with(|m| m.live()), 0);
    let in_flight = map.with(|m| (m.blocks_freeing.len(), m.segments_freeing.len()));
    assert_eq!(in_flight, (0, 0), "frees done, refused or panicking keep nothing in flight");
}

/// An address space that starts at 0 (offsets in a heap, a user's safe
/// resource): a live block at 0, and the empty block of a zero-byte
/// request. The empty block's free is not told, as its allocation is not:
/// before, it told the map that the block at 0 was gone while the resource
/// still held it.
#[test]
fn freeing_the_empty_block_keeps_a_live_block_at_address_zero() {
    use crate::{Block, MemoryResource, Request, Shared};
    use alloc::sync::Arc;
    struct FromZero;
    impl MemoryResource for FromZero {
        fn allocate(&self, r: Request, _: &()) -> crate::Result<Block> {
            Ok(if r.is_zero() { Block::EMPTY } else { Block::new(0, r.size(), 0) })
        }
        fn deallocate(&self, _: Block, _: &()) -> crate::Result<()> {
            Ok(())
        }
    }
    let map = Arc::new(Shared::new(MemoryMap::new(100)));
    let tap = Tap::new(FromZero, map.clone(), Side::Blocks);
    let live = tap.allocate(Request::new(4096).unwrap(), &()).unwrap();
    let empty = tap.allocate(Request::new(0).unwrap(), &()).unwrap();
    assert_eq!((live.addr(), empty.addr()), (0, 0));
    let before: Vec<TraceEntry> = map.with(|m| m.trace().copied().collect());
    tap.deallocate(empty, &()).unwrap();
    assert_eq!(map.with(|m| m.live()), 4096, "the block at 0 is still live");
    assert_eq!(map.with(|m| m.trace().copied().collect::<Vec<_>>()), before, "nothing told");
    tap.deallocate(live, &()).unwrap();
    assert_eq!(map.with(|m| m.live()), 0);
}

/// Once its record is stopped, a tap tells its map nothing more, neither
/// side: the map stays as it was when the record stopped, and the stack
/// works on.
#[test]
fn a_stopped_record_tells_its_map_nothing_more() {
    use crate::testing::BumpUpstream;
    use crate::{Inspect, MemoryResource, Request, Shared};
    use alloc::sync::Arc;
    let (map, recording) = (Arc::new(Shared::new(MemoryMap::new(100))), Arc::new(Recording::new()));
    let up = BumpUpstream::new(1 << 30);
    let leaf = Tap::in_record(&up, map.clone(), Side::Segments, recording.clone());
    let top = Tap::in_record(&leaf, map.clone(), Side::Blocks, recording.clone());
    let b = top.allocate(Request::new(1000).unwrap(), &()).unwrap();
    let seen = |m: &mut MemoryMap| (m.held(), m.live(), m.runs(), m.trace().copied().collect::<Vec<_>>());
    let before = map.with(seen);
    recording.stop();
    let c = top.allocate(Request::new(2000).unwrap(), &()).unwrap();
    top.deallocate(b, &()).unwrap();
    assert!(top.allocate(Request::new(2 << 30).unwrap(), &()).is_err());
    assert_eq!(map.with(seen), before, "the map as the record stopped");
    assert_eq!(up.usage().held, 2048);
    top.deallocate(c, &()).unwrap();
    assert_eq!(up.usage().held, 0);
}

/// A stream whose `id` panics in a tapped allocation loses no block: it is
/// read before the resource is asked.
#[test]
fn a_tapped_allocation_whose_streams_id_panics_takes_nothing() {
    use crate::testing::{BumpUpstream, PanickingStream};
    use crate::{Inspect, MemoryResource, Request, Shared};
    let up = BumpUpstream::new(1 << 30);
    let tap = Tap::new(&up, alloc::sync::Arc::new(Shared::new(MemoryMap::new(100))), Side::Blocks);
    let s = PanickingStream::new(1);
    s.panic_in("id", 0);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tap.allocate(Request::new(1 << 20).unwrap(), &s)
    }));
    assert!(r.is_err());
    assert_eq!(up.usage().held, 0);
}

/// A tapped free whose stream's `id` panics still frees the block (the
/// caller gave it up), and the map tells the free on the stream the block
/// was allocated on, for want of the free's: nothing is lost below, and
/// the map does not keep a freed block live.
#[test]
fn a_tapped_free_whose_streams_id_panics_still_frees_the_block() {
    use crate::testing::{BumpUpstream, PanickingStream};
    use crate::{Inspect, MemoryResource, Request, Shared};
    for side in [Side::Blocks, Side::Segments] {
        let up = BumpUpstream::new(1 << 30);
        let map = alloc::sync::Arc::new(Shared::new(MemoryMap::new(100)));
        let tap = Tap::new(&up, map.clone(), side);
        let s = PanickingStream::new(7);
        let b = tap.allocate(Request::new(1 << 20).unwrap(), &s).unwrap();
        s.panic_in("id", 0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tap.deallocate(b, &s)));
        assert!(r.is_err(), "{side:?}: the panic goes on to the caller");
        assert_eq!(up.usage().held, 0, "{side:?}: the block went back");
        let freed = if side == Side::Blocks { Action::FreeCompleted } else { Action::SegmentFree };
        let told =
            |m: &mut MemoryMap| m.trace().any(|e| (e.action, e.addr, e.stream) == (freed, b.addr(), 7));
        assert_eq!(map.with(|m| (m.held(), m.live(), told(m))), (0, 0, true), "{side:?}");
        map.with(|m| assert_eq!((m.blocks_freeing.len(), m.segments_freeing.len()), (0, 0)));
    }
}

/// A leaf of one 1 KiB segment at 0x1000 that refuses to free any other
/// block, and whose free, once armed, hands the address out again through
/// a tap over it before it returns: what another thread does when the leaf
/// gives it the address between the leaf's free and the first tap's word.
struct OneSegment {
    map: alloc::sync::Arc<crate::Shared<MemoryMap>>,
    held: core::cell::Cell<bool>,
    again: core::cell::Cell<bool>,
    reused: core::cell::Cell<Option<crate::Block>>,
}

impl OneSegment {
    fn new(map: &alloc::sync::Arc<crate::Shared<MemoryMap>>) -> Self {
        OneSegment {
            map: map.clone(),
            held: core::cell::Cell::new(false),
            again: core::cell::Cell::new(false),
            reused: core::cell::Cell::new(None),
        }
    }
}

impl crate::MemoryResource for OneSegment {
    fn allocate(&self, request: crate::Request, _: &()) -> crate::Result<crate::Block> {
        if request.size() > 1024 || self.held.replace(true) {
            return Err(crate::Error::OutOfMemory {
                requested: request.size(),
                largest_free: 0,
                pool_size: 1024,
                max_size: Some(1024),
            });
        }
        Ok(crate::Block::new(0x1000, request.size(), 0))
    }

    fn deallocate(&self, block: crate::Block, _: &()) -> crate::Result<()> {
        if block.addr() != 0x1000 || !self.held.get() {
            return Err(crate::Error::UnknownBlock { addr: block.addr() });
        }
        self.held.set(false);
        if self.again.replace(false) {
            let tap = Tap::new(self, self.map.clone(), Side::Segments);
            self.reused.set(Some(tap.allocate(crate::Request::new(1024).unwrap(), &()).unwrap()));
        }
        Ok(())
    }
}

/// The address a leaf frees may be handed out again before its free
/// returns: the tap tells the segment's end first, so that the new
/// segment is never taken for the old one (it was deleted by the late
/// end, held fell to 0 under a live segment, and its own end was lost).
#[test]
fn a_segment_handed_out_again_inside_the_leafs_free_stays_held() {
    use crate::{MemoryResource, Request, Shared};
    use alloc::sync::Arc;
    let map = Arc::new(Shared::new(MemoryMap::new(100)));
    let leaf = OneSegment::new(&map);
    let tap = Tap::new(&leaf, map.clone(), Side::Segments);
    let b = tap.allocate(Request::new(1024).unwrap(), &()).unwrap();
    leaf.again.set(true);
    tap.deallocate(b, &()).unwrap();
    let again = leaf.reused.take().unwrap();
    assert_eq!(again.addr(), b.addr());
    assert_eq!(map.with(|m| (m.held(), m.runs().len())), (1024, 1), "the new segment is held");
    tap.deallocate(again, &()).unwrap();
    assert_eq!(map.with(|m| (m.held(), m.runs().len())), (0, 0));
    let actions: Vec<Action> = map.with(|m| m.trace().map(|e| e.action).collect());
    use Action::{SegmentAlloc as A, SegmentFree as F};
    assert_eq!(actions, [A, F, A, F], "each segment's end after it, before the next");
}

/// A segment free the leaf refuses, or panics in, leaves the map as it
/// was: the segment held, its end out of the trace; a later free ends it.
#[test]
fn a_segment_free_the_leaf_refuses_or_panics_in_leaves_the_map_as_it_was() {
    use crate::testing::BumpUpstream;
    use crate::{MemoryResource, Request, Shared};
    use alloc::sync::Arc;
    let map = Arc::new(Shared::new(MemoryMap::new(100)));
    let leaf = OneSegment::new(&map);
    let tap = Tap::new(&leaf, map.clone(), Side::Segments);
    let b = tap.allocate(Request::new(1000).unwrap(), &()).unwrap();
    let before = map.with(|m| (m.held(), m.runs(), m.trace().copied().collect::<Vec<_>>()));
    leaf.held.set(false); // the leaf no longer knows it: refused
    assert!(tap.deallocate(b, &()).is_err());
    let after = map.with(|m| (m.held(), m.runs(), m.trace().copied().collect::<Vec<_>>()));
    assert_eq!(after, before, "a refused free changes nothing in the map");
    leaf.held.set(true);
    tap.deallocate(b, &()).unwrap();
    assert_eq!(map.with(|m| m.held()), 0);

    let map = Arc::new(Shared::new(MemoryMap::new(100)));
    let up = BumpUpstream::new(1 << 20);
    let tap = Tap::new(&up, map.clone(), Side::Segments);
    let b = tap.allocate(Request::new(1000).unwrap(), &()).unwrap();
    let other = tap.allocate(Request::new(256).unwrap(), &()).unwrap();
    let before = map.with(|m| (m.held(), m.runs(), m.trace().copied().collect::<Vec<_>>()));
    up.panic_in("deallocate", 0);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tap.deallocate(b, &())));
    assert!(r.is_err());
    let after = map.with(|m| (m.held(), m.runs(), m.trace().copied().collect::<Vec<_>>()));
    assert_eq!(after, before, "a free that panicked changes nothing in the map");
    tap.deallocate(b, &()).unwrap();
    tap.deallocate(other, &()).unwrap();
    let actions: Vec<Action> = map.with(|m| m.trace().map(|e| e.action).collect());
    use Action::{SegmentAlloc as A, SegmentFree as F};
    assert_eq!((map.with(|m| m.held()), &actions[..]), (0, &[A, A, F, F][..]));
}

/// A refused free at a full trace, whose events pushed the oldest ones
/// out: its undo puts them back, so the trace is as before. Before, they
/// were lost for good (a trace that is full in any long run lost two or
/// three events at each refused free).
#[test]
fn a_refused_free_at_a_full_trace_gives_the_trace_back_as_it_was() {
    let mut map = MemoryMap::new(4);
    map.segment_alloc(0x1000, 4096, 0, None);
    map.alloc(0x1000, 256, 256, 0, None);
    map.alloc(0x1100, 256, 256, 0, None);
    map.alloc(0x9000, 256, 256, 0, None); // a segment of its own
    let before: Vec<TraceEntry> = map.trace().copied().collect();
    assert_eq!(before.len(), 4);
    refused(&mut map, Side::Blocks, 0x1000, 0, |_| {});
    assert_eq!(map.trace().copied().collect::<Vec<_>>(), before, "a block's free");
    refused(&mut map, Side::Blocks, 0x9000, 0, |_| {});
    assert_eq!(map.trace().copied().collect::<Vec<_>>(), before, "with its own segment's end");
    refused(&mut map, Side::Segments, 0x1000, 0, |_| {});
    assert_eq!(map.trace().copied().collect::<Vec<_>>(), before, "a segment's free");
    assert_eq!((map.held(), map.live()), (4096, 768));

    // Another event pushed one out meanwhile: the trace is the last four
    // events as if the free had never been told, the `oom` among them.
    refused(&mut map, Side::Blocks, 0x1100, 0, |map| map.oom(1 << 40, 0, 0, None));
    let mut expected = before[1..].to_vec();
    expected.extend(map.trace().last().copied().filter(|e| e.action == Action::Oom));
    assert_eq!(map.trace().copied().collect::<Vec<_>>(), expected, "an event told meanwhile");
}

/// The trace of a map fed through frees told ahead: each free done or
/// refused, other events told while they are in flight.
enum Step {
    /// A free of the block at the address told ahead.
    Tell(u64),
    /// Another event (an allocation that failed).
    Oom(u64),
    /// The free of the address refused.
    Refuse(u64),
    /// The free of the address done.
    Done(u64),
}

/// Runs `steps` over a map of five blocks (the first two in a segment, the
/// third a segment of its own) that keeps `entries` events; returns its
/// trace.
fn trace_after(entries: usize, steps: &[Step]) -> Vec<TraceEntry> {
    let map = crate::Shared::new(MemoryMap::new(entries));
    map.with(|m| {
        m.segment_alloc(0x1000, 4096, 0, None);
        m.alloc(0x1000, 256, 256, 0, None);
        m.alloc(0x1100, 256, 256, 0, None);
        m.alloc(0x9000, 256, 256, 0, None);
        m.alloc(0x1200, 256, 256, 0, None);
        m.alloc(0x1300, 256, 256, 0, None);
    });
    let mut in_flight = alloc::vec::Vec::new();
    for step in steps {
        match *step {
            Step::Tell(addr) => in_flight.push((addr, Freeing::new(&map, Side::Blocks, addr, 0, None))),
            Step::Oom(size) => map.with(|m| m.oom(size, 0, 0, None)),
            Step::Refuse(addr) | Step::Done(addr) => {
                let i = in_flight.iter().position(|(a, _)| *a == addr).unwrap();
                let (_, freeing) = in_flight.remove(i);
                match step {
                    Step::Done(_) => freeing.done(),
                    _ => drop(freeing),
                }
            }
        }
    }
    assert!(in_flight.is_empty());
    map.with(|m| {
        assert_eq!((m.told_ahead, m.pushed_out), (0, 0), "nothing kept aside once all are settled");
        m.trace().copied().collect()
    })
}

/// A refused free's undo gives the trace back as it would be had the free
/// never been told: the last events told, as many as it keeps, others told
/// while the free was in flight included, and frees refused in any order.
/// It puts back at the front as many events as it takes out of the trace,
/// those pushed out last (by the free's events, or by later ones that the
/// free's would not have let in). Before, an event pushed out since kept
/// the undo from putting back any, so the events the free had pushed out
/// were lost (a trace short of them for good, in a long run where other
/// threads allocate meanwhile).
#[test]
fn a_refused_free_gives_back_the_events_it_pushed_out_though_others_came_since() {
    use Step::{Done, Oom, Refuse, Tell};
    // Whatever is refused leaves the trace of the run without it.
    let runs: [(&[Step], &[Step]); 6] = [
        (&[Tell(0x1000), Oom(1), Refuse(0x1000)], &[Oom(1)]),
        (&[Tell(0x1000), Oom(1), Oom(2), Oom(3), Refuse(0x1000)], &[Oom(1), Oom(2), Oom(3)]),
        (&[Tell(0x9000), Oom(1), Refuse(0x9000)], &[Oom(1)]),
        (&[Tell(0x1000), Tell(0x1100), Oom(1), Refuse(0x1100), Refuse(0x1000)], &[Oom(1)]),
        (&[Tell(0x1000), Tell(0x1100), Oom(1), Refuse(0x1000), Oom(2), Refuse(0x1100)], &[Oom(1), Oom(2)]),
        (
            &[Tell(0x1000), Tell(0x9000), Oom(1), Done(0x1000), Oom(2), Refuse(0x9000)],
            &[Tell(0x1000), Oom(1), Done(0x1000), Oom(2)],
        ),
    ];
    for entries in [3, 5, 7, 100] {
        for (i, (run, without)) in runs.iter().enumerate() {
            assert_eq!(trace_after(entries, run), trace_after(entries, without), "run {i}, {entries} kept");
        }
    }
    // The first run at five events: the free pushed out the `alloc` of
    // 0x1100 and the `segment_alloc` of 0x9000, the `oom` then the `alloc`
    // of 0x9000. Without the free, the `oom` alone pushed out one, that
    // `alloc` of 0x1100: the two events after it come back.
    let events: Vec<(Action, u64)> = trace_after(5, runs[0].0).iter().map(|e| (e.action, e.addr)).collect();
    use Action::{Alloc, SegmentAlloc};
    assert_eq!(
        events,
        [(SegmentAlloc, 0x9000), (Alloc, 0x9000), (Alloc, 0x1200), (Alloc, 0x1300), (Action::Oom, 0)]
    );
}

/// A segment free taken back after the address was handed out again (a
/// leaf that freed, then panicked) keeps the new segment and the end of
/// the old one: the trace still tells what the map holds.
#[test]
fn a_segment_unfree_after_the_address_was_handed_out_again_changes_nothing() {
    let mut map = MemoryMap::new(10);
    map.segment_alloc(0x1000, 1024, 1, None);
    refused(&mut map, Side::Segments, 0x1000, 2, |map| map.segment_alloc(0x1000, 512, 3, None));
    assert_eq!((map.held(), map.runs()[0].stream), (512, 3));
    let actions: Vec<Action> = map.trace().map(|e| e.action).collect();
    assert_eq!(actions, [Action::SegmentAlloc, Action::SegmentFree, Action::SegmentAlloc]);
    assert_eq!(map.segment_free(0x1000, 3, None).map(|f| (f.size(), f.stream())), Some((512, 3)));
    assert_eq!(map.segment_free(0x1000, 3, None), None);
}

/// A leaf that holds a set of live addresses; its next free runs `hook`
/// first (another thread's free, at the same time).
#[derive(Default)]
struct Racy {
    live: std::sync::Mutex<std::collections::BTreeSet<u64>>,
    hook: std::sync::Mutex<Option<alloc::boxed::Box<dyn FnOnce() + Send>>>,
}

impl crate::MemoryResource for Racy {
    fn allocate(&self, r: crate::Request, _: &()) -> crate::Result<crate::Block> {
        let mut live = self.live.lock().unwrap();
        let addr = 0x10000 + 0x1000 * live.len() as u64;
        live.insert(addr);
        Ok(crate::Block::new(addr, r.size(), crate::Block::NO_TAG))
    }
    fn deallocate(&self, b: crate::Block, _: &()) -> crate::Result<()> {
        let hook = self.hook.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        match self.live.lock().unwrap().remove(&b.addr()) {
            true => Ok(()),
            false => Err(crate::Error::DoubleFree { addr: b.addr() }),
        }
    }
}

/// A block of `size` bytes through a tap of `side` over a [`Racy`] leaf,
/// then two frees of it at once: the first tells the map, the second (run
/// by the leaf first) finds nothing to tell and the leaf frees the block,
/// then refuses the first as a double free. The map, for the caller to
/// check.
fn refused_beside_a_racing_free(side: Side, size: u64) -> alloc::sync::Arc<crate::Shared<MemoryMap>> {
    use crate::{MemoryResource, Request, Shared};
    use alloc::sync::Arc;
    let map = Arc::new(Shared::new(MemoryMap::new(100)));
    let leaf = Arc::new(Racy::default());
    let tap = Arc::new(Tap::new(leaf.clone(), map.clone(), side));
    let x = tap.allocate(Request::new(size).unwrap(), &()).unwrap();
    let other = tap.clone();
    *leaf.hook.lock().unwrap() = Some(alloc::boxed::Box::new(move || other.deallocate(x, &()).unwrap()));
    assert_eq!(tap.deallocate(x, &()), Err(crate::Error::DoubleFree { addr: x.addr() }));
    assert!(leaf.live.lock().unwrap().is_empty(), "the leaf freed the block");
    let in_flight = map.with(|m| (m.blocks_freeing.len(), m.segments_freeing.len()));
    assert_eq!(in_flight, (0, 0), "both frees settled");
    map
}

/// Two frees of one block at once through the blocks' tap: the first tells
/// the map, the second finds nothing to tell and the leaf frees the block,
/// then refuses the first as a double free. Before, the first's undo put
/// the block back in the map, live for good though no one held it.
#[test]
fn a_free_refused_as_the_double_of_a_racing_free_leaves_the_block_freed() {
    let map = refused_beside_a_racing_free(Side::Blocks, 1000);
    assert_eq!(map.with(|m| (m.live(), m.runs().len())), (0, 0), "the block freed in the map");
    let actions: Vec<Action> = map.with(|m| m.trace().map(|e| e.action).collect());
    use Action::{Alloc, FreeCompleted, FreeRequested, SegmentAlloc, SegmentFree};
    assert_eq!(actions, [SegmentAlloc, Alloc, FreeRequested, FreeCompleted, SegmentFree], "freed once");

    // Handed out again before the refused free's undo: the new block stays.
    let mut map = MemoryMap::new(100);
    map.alloc(0x1000, 256, 256, 1, None);
    refused(&mut map, Side::Blocks, 0x1000, 1, |map| map.alloc(0x1000, 512, 500, 2, None));
    assert_eq!((map.live(), map.runs()[0].stream), (500, 2));
}

/// The same race at the leaf, through the segments' tap: the first free
/// tells the map, the second finds nothing to tell and the leaf gives the
/// segment back, then refuses the first. Before, the first's undo put the
/// segment back in the map, held for good though the leaf had it no more.
#[test]
fn a_segment_free_refused_as_the_double_of_a_racing_free_leaves_the_segment_given_back() {
    let map = refused_beside_a_racing_free(Side::Segments, 4096);
    assert_eq!(map.with(|m| (m.held(), m.runs().len())), (0, 0), "the segment given back in the map");
    let actions: Vec<Action> = map.with(|m| m.trace().map(|e| e.action).collect());
    assert_eq!(actions, [Action::SegmentAlloc, Action::SegmentFree], "given back once");

    // Taken again before the refused free's undo: the new segment stays.
    let mut map = MemoryMap::new(100);
    map.segment_alloc(0x1000, 4096, 1, None);
    refused(&mut map, Side::Segments, 0x1000, 1, |map| map.segment_alloc(0x1000, 8192, 2, None));
    assert_eq!(map.held(), 8192);
}

/// The same race settled in the other order: the first free's refusal
/// settles before the second (which found nothing to tell) is done. The
/// refusal brought the block or segment back, and the second's `done`
/// left it there: the map showed it held for good though the memory below
/// had freed it. Both refused, it stays.
#[test]
fn a_racing_free_done_after_the_others_refusal_settled_still_frees() {
    use crate::Shared;
    use Action::{Alloc, FreeCompleted, FreeRequested, SegmentAlloc, SegmentFree};
    for side in [Side::Blocks, Side::Segments] {
        let taken = |map: &Shared<MemoryMap>| match side {
            Side::Blocks => map.with(|m| m.alloc(0x1000, 256, 256, 7, None)),
            Side::Segments => map.with(|m| m.segment_alloc(0x1000, 4096, 7, None)),
        };
        let map = Shared::new(MemoryMap::new(100));
        taken(&map);
        let stale = Freeing::new(&map, side, 0x1000, 0, None); // tells the map
        let real = Freeing::new(&map, side, 0x1000, 3, Some(5)); // finds nothing
        drop(stale); // the memory below freed `real`'s, then refused this one
        real.done();
        let state = map.with(|m| (m.live(), m.held(), m.runs().len()));
        assert_eq!(state, (0, 0, 0), "{side:?}: freed in the map");
        let events: Vec<(Action, u64)> = map.with(|m| m.trace().map(|e| (e.action, e.stream)).collect());
        let told = match side {
            Side::Blocks => alloc::vec![
                (SegmentAlloc, 7),
                (Alloc, 7),
                (FreeRequested, 3),
                (FreeCompleted, 3),
                (SegmentFree, 7)
            ],
            Side::Segments => alloc::vec![(SegmentAlloc, 7), (SegmentFree, 3)],
        };
        assert_eq!(events, told, "{side:?}: freed once, by the free that went through");

        // Both refused: it is held still, and its next free frees it.
        let map = Shared::new(MemoryMap::new(100));
        taken(&map);
        let stale = Freeing::new(&map, side, 0x1000, 0, None);
        let other = Freeing::new(&map, side, 0x1000, 3, None);
        drop(stale);
        drop(other);
        assert_eq!(map.with(|m| m.runs().len()), 1, "{side:?}: held");
        Freeing::new(&map, side, 0x1000, 0, None).done();
        assert_eq!(map.with(|m| (m.live(), m.held(), m.runs().len())), (0, 0, 0));
    }
}

/// A refused free goes back into the map as the block it was: allocated on
/// its own stream, not the stream of the free that failed (which a block
/// outside every segment shows as its segment's stream).
#[test]
fn a_refused_free_on_another_stream_leaves_the_block_on_its_own() {
    use crate::testing::{BumpUpstream, IdStream};
    use crate::{Block, MemoryResource, Request, Shared};
    use alloc::sync::Arc;
    let map = Arc::new(Shared::new(MemoryMap::new(100)));
    let tap = Tap::new(
        Shared::new(crate::pool::CoalescingPool::new(BumpUpstream::new(1 << 30))),
        map.clone(),
        Side::Blocks,
    );
    let b = tap.allocate(Request::new(4096).unwrap(), &IdStream(1)).unwrap();
    let wrong = Block::new(b.addr(), 4096, b.tag().wrapping_add(1));
    assert!(tap.deallocate(wrong, &IdStream(2)).is_err());
    let streams: Vec<u64> = map.with(|m| m.runs().iter().map(|s| s.stream).collect());
    assert_eq!(streams, [1], "the block's own stream");
    tap.deallocate(b, &IdStream(1)).unwrap();
}

/// A fresh directory of its own for a test of snapshot files.
#[cfg(feature = "std")]
fn file_test_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(std::format!("memres-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The names in `dir`, sorted.
#[cfg(feature = "std")]
fn names_in(dir: &std::path::Path) -> Vec<std::string::String> {
    let mut names: Vec<_> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

/// A snapshot file written over a longer one holds the new bytes alone,
/// and no temporary file is left beside it.
#[cfg(feature = "std")]
#[test]
fn a_snapshot_file_holds_exactly_the_new_bytes_and_nothing_is_left_beside_it() {
    let dir = file_test_dir("snapshot-file");
    let path = dir.join("s.pickle");
    let mut map = MemoryMap::new(10);
    map.segment_alloc(0x1000, 4096, 0, None);
    let bytes = map.pickle();
    write_file(&path, &bytes).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    std::fs::write(&path, alloc::vec![b'x'; 3 * bytes.len()]).unwrap();
    write_file(&path, &bytes).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "the old, longer file is gone");
    assert_eq!(names_in(&dir), ["s.pickle"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A reader never sees a snapshot file part written: each read while
/// another thread rewrites it is one of the two whole files (written in
/// place, reads found it empty or cut short). Under Miri, which
/// interprets every byte copied, the files are smaller and rewritten
/// fewer times.
#[cfg(feature = "std")]
#[test]
fn a_reader_sees_a_whole_snapshot_file_while_it_is_rewritten() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (size, rewrites) = if cfg!(miri) { (4096, 6) } else { (1 << 20, 40) };
    let dir = file_test_dir("snapshot-file-reader");
    let path = dir.join("s.pickle");
    let (a, b) = (alloc::vec![b'a'; size], alloc::vec![b'b'; size + 4096]);
    write_file(&path, &a).unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            // One read at least, however the threads are scheduled.
            loop {
                let last = done.load(Ordering::Relaxed);
                let got = std::fs::read(&path).unwrap();
                assert!(got == a || got == b, "a read of {} bytes, neither file", got.len());
                if last {
                    break;
                }
            }
        });
        for i in 0..rewrites {
            write_file(&path, if i % 2 == 0 { &b } else { &a }).unwrap();
        }
        done.store(true, Ordering::Relaxed);
        reader.join().unwrap();
    });
    assert_eq!(names_in(&dir), ["s.pickle"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A snapshot file reached through a symbolic link is written where the
/// link leads, and the link stays (a user's `latest.pickle` pointing into
/// a run's directory); a file that was there keeps its permissions (it
/// was replaced by a link-less file of default permissions). A loop of
/// links is an error that leaves nothing.
#[cfg(all(feature = "std", unix))]
#[test]
fn a_snapshot_file_keeps_the_link_that_leads_to_it_and_its_permissions() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let dir = file_test_dir("snapshot-file-link");
    std::fs::create_dir(dir.join("run")).unwrap();
    let target = dir.join("run").join("s.pickle");
    std::fs::write(&target, b"old").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = dir.join("latest.pickle");
    symlink("run/s.pickle", &link).unwrap();
    let bytes = MemoryMap::new(3).pickle();
    write_file(&link, &bytes).unwrap();
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays");
    assert_eq!(std::fs::read(&target).unwrap(), bytes);
    assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(names_in(&dir.join("run")), ["s.pickle"]);
    // A link to a file not there yet makes it where the link points.
    let ahead = dir.join("ahead.pickle");
    symlink("run/new.pickle", &ahead).unwrap();
    write_file(&ahead, &bytes).unwrap();
    assert!(std::fs::symlink_metadata(&ahead).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(dir.join("run").join("new.pickle")).unwrap(), bytes);
    let (a, b) = (dir.join("a"), dir.join("b"));
    symlink("b", &a).unwrap();
    symlink("a", &b).unwrap();
    assert_eq!(write_file(&a, &bytes).unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(names_in(&dir), ["a", "ahead.pickle", "b", "latest.pickle", "run"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A chain of 40 symbolic links, as many as Linux follows in one lookup,
/// leads to the file written (the 40th link was taken for one too many);
/// a chain of 41 is an error that leaves nothing.
#[cfg(all(feature = "std", unix))]
#[test]
fn a_snapshot_file_is_written_through_forty_links_and_not_forty_one() {
    use std::os::unix::fs::symlink;
    let dir = file_test_dir("snapshot-file-forty-links");
    let bytes = MemoryMap::new(3).pickle();
    // `l0` -> `l1` -> ... -> `l{n-1}` -> `s.pickle`: `n` links.
    let chain = |n: usize| {
        for i in 0..n {
            let to = if i + 1 == n { "s.pickle".into() } else { std::format!("l{}", i + 1) };
            symlink(to, dir.join(std::format!("l{i}"))).unwrap();
        }
    };
    chain(40);
    write_file(&dir.join("l0"), &bytes).unwrap();
    assert_eq!(std::fs::read(dir.join("s.pickle")).unwrap(), bytes);
    check_file(&dir.join("l0")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    chain(41);
    let err = write_file(&dir.join("l0"), &bytes).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(names_in(&dir).len(), 41, "nothing made beside the links");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Where the file cannot be put in place (its path is a directory), the
/// error comes back, the temporary file goes and the directory is as it
/// was; a path that names no file, or in a directory that does not exist,
/// is an error that leaves nothing either.
#[cfg(feature = "std")]
#[test]
fn a_snapshot_file_that_cannot_be_put_in_place_leaves_no_temporary_file() {
    let dir = file_test_dir("snapshot-file-refused");
    let target = dir.join("d.pickle");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("inside"), b"kept").unwrap();
    assert!(write_file(&target, &MemoryMap::new(1).pickle()).is_err());
    assert_eq!(names_in(&dir), ["d.pickle"], "no temporary file left");
    assert_eq!(names_in(&target), ["inside"]);
    assert_eq!(std::fs::read(target.join("inside")).unwrap(), b"kept");
    let missing = dir.join("no-such-dir").join("s.pickle");
    assert_eq!(write_file(&missing, b"x").unwrap_err().kind(), std::io::ErrorKind::NotFound);
    let no_name = write_file(std::path::Path::new("/"), b"x").unwrap_err();
    assert_eq!(no_name.kind(), std::io::ErrorKind::IsADirectory);
    // `Path` drops a final `.`: the check passed beside `missing`, and the
    // write made its temporary file there and failed at the rename (or,
    // numbered by the replay tool, wrote `missing-0` beside it).
    for name in ["missing/.", "missing/..", "d.pickle/.", "new/"] {
        let path = dir.join(name);
        assert_eq!(check_file(&path).unwrap_err().kind(), std::io::ErrorKind::IsADirectory, "{name}");
        assert_eq!(write_file(&path, b"x").unwrap_err().kind(), std::io::ErrorKind::IsADirectory, "{name}");
    }
    assert_eq!(names_in(&dir), ["d.pickle"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A snapshot written to a named pipe goes into the pipe, which stays (a
/// device such as `/dev/null` alike); the check takes it as it is. Before,
/// a file renamed over the pipe took its place, and so over `/dev/null`
/// where the process could write to `/dev` (as root).
#[cfg(all(feature = "std", target_os = "linux", not(miri)))]
#[test]
fn a_snapshot_written_to_a_pipe_goes_into_it_and_the_pipe_stays() {
    use std::io::Read;
    use std::os::unix::fs::FileTypeExt;
    let dir = file_test_dir("snapshot-file-pipe");
    let pipe = dir.join("s.pickle");
    assert!(std::process::Command::new("mkfifo").arg(&pipe).status().unwrap().success());
    // Both ends at once (Linux opens a pipe so without waiting): the
    // write finds its reader, and the bytes wait here.
    let mut ends = std::fs::OpenOptions::new().read(true).write(true).open(&pipe).unwrap();
    let bytes = MemoryMap::new(2).pickle();
    check_file(&pipe).unwrap();
    write_file(&pipe, &bytes).unwrap();
    assert!(std::fs::symlink_metadata(&pipe).unwrap().file_type().is_fifo(), "the pipe stays");
    let mut got = alloc::vec![0; bytes.len()];
    ends.read_exact(&mut got).unwrap();
    assert_eq!(got, bytes);
    assert_eq!(names_in(&dir), ["s.pickle"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A snapshot written to a pipe with no name, as a shell's `>(...)` or a
/// `/dev/stdout` piped to another program gives it (`/dev/fd/N`, a link to
/// `pipe:[N]`), goes into the pipe: its links followed by hand led to a
/// file `pipe:[N]` that is not there, which the check refused.
#[cfg(all(feature = "std", target_os = "linux", not(miri)))]
#[test]
fn a_snapshot_written_to_a_pipe_with_no_name_goes_into_it() {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::process::{Command, Stdio};
    let mut cat = Command::new("cat").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let stdin = cat.stdin.take().unwrap();
    let path = std::path::PathBuf::from(std::format!("/proc/self/fd/{}", stdin.as_raw_fd()));
    let bytes = MemoryMap::new(2).pickle();
    let checked = check_file(&path);
    let written = write_file(&path, &bytes);
    drop(stdin);
    let mut got = alloc::vec::Vec::new();
    cat.stdout.take().unwrap().read_to_end(&mut got).unwrap();
    assert!(cat.wait().unwrap().success());
    checked.unwrap();
    written.unwrap();
    assert_eq!(got, bytes);
}

/// A socket where a snapshot should go cannot be written: the check says
/// so before the run, as the write would after it (the check took any path
/// that is neither a file nor a directory).
#[cfg(all(feature = "std", unix, not(miri)))]
#[test]
fn check_file_refuses_a_socket_as_write_file_does() {
    let dir = file_test_dir("snapshot-file-socket");
    let path = dir.join("s.pickle");
    let listening = std::os::unix::net::UnixListener::bind(&path).unwrap();
    assert!(write_file(&path, b"x").is_err());
    assert!(check_file(&path).is_err());
    drop(listening);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `check_file` meets what `write_file` would, and leaves nothing: a name
/// too long for the temporary file beside it, a directory, a directory
/// that does not exist, are refused; a file there, a new name, and a link
/// that leads to a file not made yet are not, and none is made.
#[cfg(all(feature = "std", unix))]
#[test]
fn checking_a_snapshot_file_meets_what_the_write_would_and_makes_nothing() {
    use std::os::unix::fs::symlink;
    let dir = file_test_dir("snapshot-file-check");
    // 252 bytes: a name the file system takes, the temporary one it does not.
    let long = dir.join("x".repeat(248) + ".pkl");
    assert!(check_file(&long).is_err());
    assert!(write_file(&long, b"x").is_err(), "as the write");
    assert_eq!(check_file(&dir).unwrap_err().kind(), std::io::ErrorKind::IsADirectory);
    assert_eq!(
        check_file(&dir.join("none").join("s.pickle")).unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
    std::fs::write(dir.join("old.pickle"), b"old").unwrap();
    check_file(&dir.join("old.pickle")).unwrap();
    check_file(&dir.join("new.pickle")).unwrap();
    symlink("later.pickle", dir.join("ahead.pickle")).unwrap();
    check_file(&dir.join("ahead.pickle")).unwrap();
    assert_eq!(names_in(&dir), ["ahead.pickle", "old.pickle"]);
    assert_eq!(std::fs::read(dir.join("old.pickle")).unwrap(), b"old");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A tapped allocation that fails for another reason than memory (a
/// backend's error) tells no `oom`: PyTorch records one on out of memory
/// only, and its viewer shows it as such. One over a limit does.
#[test]
fn a_tapped_allocation_that_fails_for_another_reason_than_memory_tells_no_oom() {
    use crate::adaptor::Limiting;
    use crate::testing::BumpUpstream;
    use crate::{MemoryResource, Request, Shared};
    use alloc::sync::Arc;
    let map = Arc::new(Shared::new(MemoryMap::new(100)));
    let up = BumpUpstream::new(1 << 20);
    up.fail_after(0); // every allocation: `Backend`
    let top = Tap::new(up, map.clone(), Side::Blocks);
    assert!(matches!(top.allocate(Request::new(1000).unwrap(), &()), Err(crate::Error::Backend { .. })));
    assert_eq!(map.with(|m| m.trace().count()), 0);
    let limited = Tap::new(Limiting::new(BumpUpstream::new(1 << 20), 256), map.clone(), Side::Blocks);
    assert!(limited.allocate(Request::new(1000).unwrap(), &()).unwrap_err().is_out_of_memory());
    assert_eq!(map.with(|m| m.trace().map(|e| e.action).collect::<Vec<_>>()), [Action::Oom]);
}

/// The temporary file is made new: a link planted under its name (by
/// another user of a shared directory) is neither followed nor renamed
/// over the snapshot. The bytes went through the link into the file it
/// led to, and the link took the snapshot's name.
#[cfg(all(feature = "std", unix))]
#[test]
fn a_link_planted_under_the_temporary_name_is_not_followed() {
    use std::os::unix::fs::symlink;
    let dir = file_test_dir("snapshot-file-planted");
    let victim = dir.join("victim");
    std::fs::write(&victim, b"kept").unwrap();
    // Every name the next writes of this process may take.
    let pid = std::process::id();
    for n in 0..256 {
        symlink(&victim, dir.join(std::format!(".s.pickle.{pid}.{n}.tmp"))).unwrap();
    }
    let path = dir.join("s.pickle");
    let bytes = MemoryMap::new(3).pickle();
    write_file(&path, &bytes).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"kept", "written through the planted link");
    assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_file(), "the link took its name");
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    check_file(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A block handed out over a live one (a free the map never saw) ends it:
/// its free is told first, so that PyTorch's viewer, undoing the trace,
/// finds the old block where the new one was. Before, the map kept both
/// and the trace told two `alloc`s of those bytes with no free between.
#[test]
fn a_block_handed_out_over_a_live_one_ends_it_first() {
    let mut map = MemoryMap::new(20);
    map.segment_alloc(0, 100, 0, None);
    map.alloc(0, 50, 50, 0, None);
    map.alloc(60, 10, 10, 0, None);
    map.alloc(10, 10, 10, 3, None);
    let told: Vec<_> = map.trace().map(|e| (e.action, e.addr, e.stream)).collect();
    assert_eq!(
        told[3..],
        [(Action::FreeRequested, 0, 3), (Action::FreeCompleted, 0, 3), (Action::Alloc, 10, 3)],
        "{told:?}"
    );
    let runs = &map.runs()[0].runs;
    let used: Vec<_> = runs.iter().filter(|r| r.requested.is_some()).map(|r| r.addr).collect();
    assert_eq!(used, [10, 60]);
    assert_eq!((map.live(), map.largest_free()), (20, 40));
    assert_the_viewer_finds_every_block_in_a_segment(&map);
}

/// A segment handed out over segments and blocks the map holds (a
/// simulated device dropped with blocks live, whose addresses the next
/// device took) ends them, from the highest address down: each one's
/// blocks' frees, then its `segment_free`, told before the new
/// `segment_alloc`. Before, the
/// viewer stepping back found a second `segment_alloc` of those addresses
/// and took out the wrong segment, and a block freed by no event stayed
/// live in its timeline for good.
#[test]
fn a_segment_handed_out_over_held_ones_ends_them_and_their_blocks_first() {
    let mut map = MemoryMap::new(20);
    map.segment_alloc(0, 100, 0, None);
    map.alloc(0, 50, 50, 0, None);
    map.alloc(90, 10, 10, 0, None);
    map.alloc(500, 10, 10, 0, None); // in no segment
    map.segment_alloc(1000, 100, 0, None); // untouched
    map.segment_alloc(95, 410, 2, None);
    let told: Vec<_> = map.trace().skip(6).map(|e| (e.action, e.addr, e.size)).collect();
    assert_eq!(
        told,
        [
            (Action::FreeRequested, 90, 10),
            (Action::FreeCompleted, 90, 10),
            (Action::FreeRequested, 0, 50),
            (Action::FreeCompleted, 0, 50),
            (Action::SegmentFree, 0, 100),
            (Action::FreeRequested, 500, 10),
            (Action::FreeCompleted, 500, 10),
            (Action::SegmentFree, 500, 10),
            (Action::SegmentAlloc, 95, 410),
        ]
    );
    assert_eq!((map.held(), map.live()), (510, 0));
    assert_eq!(map.runs().iter().map(|s| s.addr).collect::<Vec<_>>(), [95, 1000]);
    assert_the_viewer_finds_every_block_in_a_segment(&map);
}

#[test]
fn a_block_cut_short_keeps_no_more_requested_than_its_bytes() {
    let mut map = MemoryMap::new(10);
    map.segment_alloc(0, 100, 0, None);
    // Past the segment's end (a block fed from outside): cut at 100.
    map.alloc(80, 40, 40, 0, None);
    let runs = &map.runs()[0].runs;
    let used: Vec<_> = runs.iter().filter_map(|r| r.requested.map(|q| (r.addr, r.size, q))).collect();
    assert_eq!(used, [(80, 20, 20)], "{runs:?}");
}

#[test]
fn a_segment_ending_at_the_top_of_the_address_space_keeps_its_last_byte() {
    let mut map = MemoryMap::new(10);
    let addr = u64::MAX - 99;
    map.segment_alloc(addr, 100, 0, None);
    map.alloc(u64::MAX - 9, 10, 10, 0, None);
    let runs = &map.runs()[0].runs;
    let expected =
        [Run { addr, size: 90, requested: None }, Run { addr: u64::MAX - 9, size: 10, requested: Some(10) }];
    assert_eq!(runs, &expected);
    map.free(u64::MAX - 9, 0, None);
    assert_eq!(map.largest_free(), 100);
}

#[test]
fn a_segment_said_to_pass_the_top_of_the_address_space_is_laid_out_up_to_it() {
    let mut map = MemoryMap::new(10);
    let addr = u64::MAX - 99;
    map.segment_alloc(addr, 200, 0, None);
    map.alloc(u64::MAX - 9, 64, 10, 0, None);
    let runs = &map.runs()[0].runs;
    let expected =
        [Run { addr, size: 90, requested: None }, Run { addr: u64::MAX - 9, size: 10, requested: Some(10) }];
    assert_eq!(runs, &expected);
}

#[test]
fn a_refused_free_takes_out_its_own_events_not_another_of_its_address() {
    // A block that was a segment of its own at 0x1000, freed, then a
    // segment at the same address: both end in a `segment_free` of 0x1000.
    let mut map = MemoryMap::new(100);
    map.alloc(0x1000, 320, 192, 0, None);
    map.free(0x1000, 0, None).unwrap();
    map.segment_alloc(0x1000, 4096, 1, None);
    let actions = |map: &MemoryMap| map.trace().map(|e| (e.action.as_str(), e.size)).collect::<Vec<_>>();
    refused(&mut map, Side::Segments, 0x1000, 1, |_| {});
    assert_eq!(
        actions(&map),
        [
            ("segment_alloc", 320),
            ("alloc", 192),
            ("free_requested", 192),
            ("free_completed", 192),
            ("segment_free", 320),
            ("segment_alloc", 4096),
        ],
        "the refused free of the segment took out its own `segment_free` (of 4096 bytes)"
    );
    assert_eq!((map.held(), map.live()), (4096, 0));

    // The block's free told ahead, and refused after a segment at its
    // address came and went.
    let mut map = MemoryMap::new(100);
    map.alloc(0x1000, 320, 192, 0, None);
    refused(&mut map, Side::Blocks, 0x1000, 0, |map| {
        map.segment_alloc(0x1000, 4096, 1, None);
        map.segment_free(0x1000, 1, None).unwrap();
    });
    assert_eq!(
        actions(&map),
        [("segment_alloc", 320), ("alloc", 192), ("segment_alloc", 4096), ("segment_free", 4096)],
        "the refused free of the block took out its own three events"
    );
    assert_eq!((map.held(), map.live()), (0, 192));
}

/// An `oom` event says the device's free bytes under PyTorch's key,
/// `device_free`, and has no `addr`, as PyTorch writes it. Before, it had
/// `addr: 0` and `device_free: 0` whatever the device had free.
#[test]
fn an_oom_event_says_the_devices_free_bytes_and_no_address() {
    use super::pickle::{dumps, Py};
    let mut map = MemoryMap::new(10);
    map.oom(1 << 30, 7, 4096, None);
    let event = Py::Dict(alloc::vec![
        ("action", Py::Str("oom")),
        ("device_free", Py::Int(4096)),
        ("size", Py::Int(1 << 30)),
        ("stream", Py::Int(7)),
        ("frames", Py::List(Vec::new())),
    ]);
    let expected = Py::Dict(alloc::vec![
        ("segments", Py::List(Vec::new())),
        ("device_traces", Py::List(alloc::vec![Py::List(alloc::vec![event])])),
    ]);
    assert_eq!(map.pickle(), dumps(&expected));
}

/// A snapshot of no device has device 0's trace, empty: PyTorch's viewer
/// opens the first device's, and could not open `device_traces: []`.
#[test]
fn a_snapshot_of_no_device_has_an_empty_trace_of_device_0() {
    use super::pickle::{dumps, Py};
    let expected = Py::Dict(alloc::vec![
        ("segments", Py::List(Vec::new())),
        ("device_traces", Py::List(alloc::vec![Py::List(Vec::new())])),
    ]);
    assert_eq!(pickle_devices(&[]), dumps(&expected));
    assert_eq!(pickle_devices(&[None]), dumps(&expected));
}
