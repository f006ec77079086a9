//! The table of arenas: slots change hands (full tables, `release`, idle
//! sweeps, threads that come and go), and what a full table answers.

extern crate std;

use super::tests::{req, small_config};
use super::*;
use crate::testing::{BumpUpstream, TestStream};
use crate::Inspect;
use std::sync::Barrier;
use std::vec::Vec;

#[test]
fn arena_table_full_is_a_typed_error() {
    let arena =
        ArenaResource::with_config(BumpUpstream::new(1 << 30), small_config().max_arenas(2), &()).unwrap();
    let s: Vec<TestStream> = (1..=3).map(TestStream::new).collect();
    let a = arena.allocate(req(10), &s[0]).unwrap();
    let b = arena.allocate(req(10), &s[1]).unwrap();
    assert_eq!(arena.allocate(req(10), &s[2]), Err(Error::CapacityExhausted { capacity: 2 }));
    // Large requests need no arena.
    let c = arena.allocate(req(2 << 20), &s[2]).unwrap();
    for (x, st) in [(a, &s[0]), (b, &s[1]), (c, &s[2])] {
        arena.deallocate(x, st).unwrap();
    }
    arena.check().unwrap();
}

/// A full table whose arenas all have blocks live: no slot can be freed,
/// so a new stream synchronizes nothing (its failure cannot turn the
/// answer into the stream's error) and gets `CapacityExhausted`, even though
/// those arenas hold wholly free superblocks (fuzz artifact of #15 item 10,
/// `fuzz/corpus/arena/regression-full-table-synchronized-for-arenas-with-live-blocks`).
#[test]
fn a_full_table_of_busy_arenas_synchronizes_nothing() {
    let config = small_config().max_arenas(2);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    let faults = std::sync::Arc::new(crate::testing::SyncFaults::new());
    let s: Vec<TestStream> =
        (1..=3).map(|id| TestStream::with_faults(id, faults.clone()).device_sync(true)).collect();
    // Each arena: two superblocks of four blocks, the first wholly free.
    let mut live = Vec::new();
    for st in &s[..2] {
        let mut blocks: Vec<Block> = (0..8).map(|_| arena.allocate(req(200 << 10), st).unwrap()).collect();
        for x in blocks.drain(..4) {
            arena.deallocate(x, st).unwrap();
        }
        live.extend(blocks.into_iter().map(|x| (x, st)));
    }
    assert!(arena.dump().arenas.iter().all(|a| a.free_superblocks == 1 && a.used > 0));
    let (before, syncs) = (arena.dump(), faults.syncs());
    faults.fail_nth(1);
    assert_eq!(arena.allocate(req(1000), &s[2]), Err(Error::CapacityExhausted { capacity: 2 }));
    assert_eq!((faults.syncs() - syncs, faults.failed_syncs()), (0, 0));
    faults.fail_nth(0);
    assert_eq!(arena.dump().arenas, before.arenas);
    arena.check().unwrap();
    for (x, st) in live {
        arena.deallocate(x, st).unwrap();
    }
    // With nothing live, the same request takes a slot.
    let b = arena.allocate(req(1000), &s[2]).unwrap();
    arena.deallocate(b, &s[2]).unwrap();
    arena.check().unwrap();
}

/// The case: after `max_arenas` streams have come and gone (every
/// block freed, each stream's superblocks taken back by its `release`),
/// a new stream gets an arena; any number of streams over the resource's
/// life, at most `max_arenas` at once.
#[test]
fn slots_of_released_arenas_go_to_new_streams() {
    let arena =
        ArenaResource::with_config(BumpUpstream::new(1 << 30), small_config().max_arenas(2), &()).unwrap();
    // (Under Miri 30: still fifteen times the slots.)
    for id in 1..=if cfg!(miri) { 30 } else { 1000u64 } {
        let s = TestStream::new(id);
        let b = arena.allocate(req(1000), &s).unwrap_or_else(|e| panic!("stream {id}: {e}"));
        arena.deallocate(b, &s).unwrap();
        arena.release(&s).unwrap();
        assert!(arena.arena_count() <= 2);
        arena.check().unwrap();
    }
    // Released, an idle arena gives up its slot at once.
    assert_eq!((arena.arena_count(), arena.usage().held), (0, 0));
}

/// Idle arenas of other streams give their superblocks back (after one
/// device synchronization) and their slots when a new stream needs one: no
/// `release` needed. A stream that cannot synchronize the device cannot
/// take another stream's superblocks, whose frees that stream may not have
/// run yet: the table stays full until their stream releases them.
#[test]
fn idle_arenas_give_their_slots_to_new_streams() {
    for device in [false, true] {
        let config = small_config().max_arenas(2);
        let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
        let faults = std::sync::Arc::new(crate::testing::SyncFaults::new());
        // (Under Miri 30 streams: still fifteen times the slots.)
        let count: u64 = if cfg!(miri) { 30 } else { 300 };
        let streams: Vec<TestStream> =
            (1..=count).map(|id| TestStream::with_faults(id, faults.clone()).device_sync(device)).collect();
        for (n, s) in streams.iter().enumerate() {
            match arena.allocate(req(5000), s) {
                Ok(b) => arena.deallocate(b, s).unwrap(),
                Err(e) => {
                    assert!(!device && n == 2, "stream {n}: {e}");
                    assert_eq!(e, Error::CapacityExhausted { capacity: 2 });
                    // Its stream takes back its superblocks: the slot is free.
                    arena.release(&streams[0]).unwrap();
                    let b = arena.allocate(req(5000), s).unwrap();
                    arena.deallocate(b, s).unwrap();
                    break;
                }
            }
            arena.check().unwrap();
        }
        if device {
            // One synchronization frees every idle slot: one per two new streams.
            assert_eq!(faults.device_syncs(), (count - 2) / 2);
        }
        assert!(arena.arena_count() <= 2);
        arena.check().unwrap();
    }
}

/// "Idle for long", with `idle_after(4)`: every 4th superblock request
/// sweeps; an arena that served no allocation between two sweeps gives its
/// wholly free superblocks back (after one device synchronization) and,
/// left empty, its slot. Stream 1 uses its arena once; stream 2 keeps
/// asking for superblocks (4 blocks of 200 KiB fill one of 1 MiB): the
/// first sweep (request 4) finds both used, the second (request 8) finds
/// stream 1's idle. Stream 1 kept busy, or `idle_after(0)`, keeps it.
#[test]
fn an_arena_idle_for_long_gives_its_superblocks_and_slot_back() {
    for (idle_after, busy) in [(4, false), (4, true), (0, false)] {
        let config = small_config().idle_after(idle_after);
        let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
        let (a, b) = (TestStream::new(1).device_sync(true), TestStream::new(2).device_sync(true));
        let x = arena.allocate(req(1000), &a).unwrap(); // request 1
        arena.deallocate(x, &a).unwrap();
        let mut blocks = Vec::new();
        for n in 0..25 {
            if busy {
                let x = arena.allocate(req(1000), &a).unwrap();
                arena.deallocate(x, &a).unwrap();
            }
            // Requests 2 to 8, at the 1st, 5th, ..., 25th block.
            blocks.push(arena.allocate(req(200 << 10), &b).unwrap());
            let gone = idle_after != 0 && !busy && n == 24;
            assert_eq!(arena.arena_count(), if gone { 1 } else { 2 }, "after block {n}");
            arena.check().unwrap();
        }
        let swept = idle_after != 0 && !busy;
        assert_eq!(a.faults().syncs() + b.faults().syncs(), swept as u64);
        assert_eq!(b.faults().device_syncs(), swept as u64);
        // Stream 1's superblock went to the global arena (and on to stream 2).
        let lent: usize = arena.dump().arenas.iter().map(|s| s.superblocks).sum();
        assert_eq!(lent, 7 + !swept as usize);
        for x in blocks {
            arena.deallocate(x, &b).unwrap();
        }
        arena.check().unwrap();
    }
}

/// The idle sweep is housekeeping: one whose device synchronization fails
/// changes nothing and fails no allocation. As above, the second sweep
/// (request 8, at the 25th block) finds stream 1's arena idle and
/// synchronizes the device; that fails, and the block comes from a new
/// superblock all the same.
#[test]
fn an_idle_sweep_whose_synchronization_fails_fails_no_allocation() {
    let config = small_config().idle_after(4);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    let (a, b) = (TestStream::new(1).device_sync(true), TestStream::new(2).device_sync(true));
    let x = arena.allocate(req(1000), &a).unwrap();
    arena.deallocate(x, &a).unwrap();
    b.faults().fail_nth(1);
    let blocks: Vec<_> = (0..25).map(|_| arena.allocate(req(200 << 10), &b).unwrap()).collect();
    assert_eq!(b.faults().failed_syncs(), 1);
    // Stream 1's arena kept its superblock and its slot.
    assert_eq!(arena.arena_count(), 2);
    let lent: usize = arena.dump().arenas.iter().map(|s| s.superblocks).sum();
    assert_eq!(lent, 8);
    arena.check().unwrap();
    for x in blocks {
        arena.deallocate(x, &b).unwrap();
    }
    arena.check().unwrap();
}

/// Streams that come and go with no `release` (the case: only
/// `max_arenas` distinct streams could ever use one arena): 1000 streams,
/// each allocating and freeing in turn, 64 slots, all served; the slots
/// and superblocks of the arenas of streams gone go to the next ones, so
/// the memory held stays within a superblock per slot.
#[test]
fn a_thousand_streams_in_turn_share_sixty_four_slots() {
    let config = ArenaConfig::new().max_arenas(64);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 40), config, &()).unwrap();
    let faults = std::sync::Arc::new(crate::testing::SyncFaults::new());
    // (Under Miri 30: still fifteen times the slots.)
    for id in 1..=if cfg!(miri) { 30 } else { 1000u64 } {
        let s = TestStream::with_faults(id, faults.clone()).device_sync(true);
        let b = arena.allocate(req(1000), &s).unwrap_or_else(|e| panic!("stream {id}: {e}"));
        arena.deallocate(b, &s).unwrap();
        assert!(arena.arena_count() <= 64);
    }
    arena.check().unwrap();
    // A superblock per slot and the claimer's, and the unused tail of the
    // newest chunk (under 1/8 of what is held).
    assert!(arena.usage().peak_held <= 65 * (8 << 20) * 9 / 8, "{}", arena.usage().peak_held);
    // One device synchronization per table of streams gone, not per stream.
    assert!(faults.device_syncs() <= 1000 / 64 + 1, "{}", faults.device_syncs());
}

/// An arena with a live block keeps its slot; once the block is freed and
/// its stream released, the slot serves another stream.
#[test]
fn a_live_block_keeps_its_arena() {
    let arena =
        ArenaResource::with_config(BumpUpstream::new(1 << 30), small_config().max_arenas(2), &()).unwrap();
    let s: Vec<TestStream> = (1..=3).map(TestStream::new).collect();
    let a = arena.allocate(req(10), &s[0]).unwrap();
    let b = arena.allocate(req(10), &s[1]).unwrap();
    arena.release(&s[0]).unwrap();
    arena.release(&s[1]).unwrap();
    assert_eq!(arena.allocate(req(10), &s[2]), Err(Error::CapacityExhausted { capacity: 2 }));
    arena.deallocate(a, &s[0]).unwrap();
    arena.release(&s[0]).unwrap();
    let c = arena.allocate(req(10), &s[2]).unwrap();
    let owners: Vec<Owner> = arena.dump().arenas.iter().map(|a| a.owner).collect();
    assert!(owners.len() == 2 && owners.contains(&Owner::Stream(2)) && owners.contains(&Owner::Stream(3)));
    for (x, st) in [(b, &s[1]), (c, &s[2])] {
        arena.deallocate(x, st).unwrap();
    }
    arena.check().unwrap();
}

/// Threads on the default stream: more threads alive at once than slots,
/// each done with its blocks. A new thread takes back the free superblocks
/// of the others (its own stream, the default one, orders their frees) and
/// a slot.
#[test]
fn idle_thread_arenas_give_their_slots_to_new_threads() {
    let arena =
        ArenaResource::with_config(BumpUpstream::new(1 << 30), small_config().max_arenas(2), &()).unwrap();
    let (done, turn) = (Barrier::new(4), std::sync::Mutex::new(()));
    std::thread::scope(|sc| {
        for _ in 0..4 {
            sc.spawn(|| {
                // One thread at a time uses the arena; all stay alive (their
                // thread numbers taken) until every one has had its turn.
                let mine = turn.lock().unwrap();
                let got = arena.allocate(req(3000), &()).map(|b| arena.deallocate(b, &()));
                drop(mine);
                done.wait();
                assert_eq!(got, Ok(Ok(())));
            });
        }
    });
    arena.check().unwrap();
    assert!(arena.arena_count() <= 2);
}
