extern crate std;

use super::*;
use crate::check::LiveBlocks;
use crate::testing::SplitMix64;
use crate::vmem::CountingSpace;
use alloc::vec::Vec;

pub(super) const MIB: u64 = 1 << 20;

pub(super) fn req(size: u64) -> Request {
    Request::new(size).unwrap()
}

pub(super) fn range(start: u64, len: u64) -> Range {
    Range::new(start, len).unwrap()
}

/// The granules a block touches, as one range.
pub(super) fn granules_of(b: &Block, g: u64) -> Range {
    let start = b.addr() & !(g - 1);
    let end = (b.addr() + ((b.size() + 255) & !255)).next_multiple_of(g);
    range(start, end - start)
}

/// Everything the pool reports that a failed call must leave as it was.
pub(super) fn figures<V: ReservableSpace>(p: &VirtualPool<V>) -> (u64, u64, u64, u64, u64, usize) {
    (
        p.usage().used,
        // Reserved bytes not handed out, committed or not.
        p.reserved_bytes() - p.usage().used,
        p.usage().held,
        p.releasable_bytes(),
        p.reserved_bytes(),
        p.reservation_count(),
    )
}

/// Random allocate/free/trim with random sizes, alignments and injected
/// commit and decommit failures; the pool's checker, the caller's view and the space's own
/// count of committed memory checked after every step.
pub(super) fn randomized(config: VirtualConfig, granule: u64, ops: usize, seed: u64) -> u64 {
    randomized_in(CountingSpace::new(1 << 40, granule), config, ops, seed)
}

/// Returns how many allocations failed for want of memory. At least one
/// trim must have met a failed decommit (a full run).
pub(super) fn randomized_in(space: CountingSpace, config: VirtualConfig, ops: usize, seed: u64) -> u64 {
    let (out_of_room, trim_failures) = randomized_run(space, config, ops, seed);
    assert!(trim_failures > 0 || cfg!(miri), "no trim failed");
    out_of_room
}

/// As [`randomized_in`]; returns how many allocations failed for want of
/// memory and how many trims failed, which may be none.
fn randomized_run(space: CountingSpace, config: VirtualConfig, ops: usize, seed: u64) -> (u64, u64) {
    let granule = space.granule();
    let mut p = VirtualPool::with_config(&space, config).unwrap();
    let mut rng = SplitMix64::new(seed);
    let mut live = LiveBlocks::new();
    let mut blocks: Vec<Block> = Vec::new();
    let (mut failed_commits, mut out_of_room, mut decommit_failures) = (0, 0, 0);
    for step in 0..crate::testing::steps(ops) {
        if blocks.is_empty() || rng.below(100) < 55 {
            let size = match rng.below(4) {
                0 => rng.below(512),
                1 => rng.below(granule),
                2 => rng.below(3 * granule),
                _ => 1 << rng.below(24),
            };
            let align = match rng.below(16) {
                0 => granule << rng.below(2),
                1..=2 => 256 << rng.below(8),
                _ => 256,
            };
            let r = Request::aligned(size, align).unwrap();
            let inject = rng.below(20) == 0;
            if inject {
                space.fail_nth(1 + rng.below(2));
            }
            // A failed decommit (of a trim on commit, of the retry after
            // running out of physical memory, or of the undo of a failed
            // commit) leaves its granules committed and Idle.
            let decommit_fails = rng.below(20) == 0;
            if decommit_fails {
                space.fail_nth_decommit(1 + rng.below(2));
            }
            let before = figures(&p);
            match p.allocate(r, &()) {
                Ok(b) => {
                    live.insert(b, r).unwrap_or_else(|v| panic!("step {step}: {v}"));
                    if !b.is_empty() {
                        assert!(
                            space.is_committed(granules_of(&b, granule)),
                            "step {step}: block over unmapped memory"
                        );
                        blocks.push(b);
                    }
                }
                Err(e) => {
                    // Whether the call may have given idle memory back.
                    let may_trim = match e {
                        Error::Backend { .. } => {
                            failed_commits += 1;
                            // Trim on commit, or a retry after running out
                            // of physical memory, may precede the failure.
                            config.trims_on_commit() || space.physical_bytes() < 1 << 40
                        }
                        // Out of reserved room: the pool's figures.
                        Error::OutOfMemory { requested, max_size, .. }
                            if max_size == Some(p.reserved_bytes()) =>
                        {
                            assert_eq!(requested, size);
                            out_of_room += 1;
                            // Nothing committed; a trim that a failed
                            // decommit left pending is retried.
                            before.3 > config.release_threshold_bytes()
                        }
                        // Out of physical memory: the space's; the pool
                        // trimmed and retried.
                        Error::OutOfMemory { max_size, .. } if max_size == Some(space.physical_bytes()) => {
                            out_of_room += 1;
                            true
                        }
                        e => panic!("step {step}: unexpected {e}"),
                    };
                    // No block changed. A reservation made for the request
                    // stays when its commit then fails (address space only).
                    let now = figures(&p);
                    let grown = now.4 - before.4;
                    let out_of_room_now =
                        matches!(e, Error::OutOfMemory { max_size, .. } if max_size == Some(now.4));
                    assert!(grown == 0 || !out_of_room_now, "step {step}: {r:?} {e}: grew");
                    assert_eq!(
                        (now.0, now.1 - grown, now.2 - now.3, now.4 - grown),
                        (before.0, before.1, before.2 - before.3, before.4),
                        "step {step}: a failed allocate changed the pool: {r:?} {e}"
                    );
                    if decommit_fails {
                        // Granules whose decommit failed stay Idle.
                    } else if may_trim {
                        // Idle memory may have gone, nothing else; a
                        // failed allocate retries a pending trim.
                        assert!(now.2 <= before.2, "step {step}");
                        assert!(now.3 <= config.release_threshold_bytes(), "step {step}: {r:?} {e}");
                    } else {
                        assert_eq!((now.2, now.3), (before.2, before.3), "step {step}: {r:?} {e}");
                    }
                }
            }
            space.fail_nth(0);
        } else if rng.below(50) == 0 {
            // A trim whose decommit may fail: the error comes back, the
            // granules stay committed and Idle.
            let fails = rng.below(2) == 0;
            if fails {
                space.fail_nth_decommit(1 + rng.below(2));
            }
            let idle = p.releasable_bytes();
            match p.trim(&()) {
                Ok(freed) => assert_eq!((freed, p.releasable_bytes()), (idle, 0), "step {step}"),
                Err(e) => {
                    assert!(fails && matches!(e, Error::Backend { .. }), "step {step}: {e}");
                    assert!(p.releasable_bytes() > 0, "step {step}");
                    decommit_failures += 1;
                }
            }
        } else {
            let i = rng.below(blocks.len() as u64) as usize;
            let b = blocks.swap_remove(i);
            let b = if rng.below(4) == 0 { Block::from_addr(b.addr(), b.size()) } else { b };
            // A failed decommit does not fail the free.
            if rng.below(20) == 0 {
                space.fail_nth_decommit(1);
            }
            p.deallocate(b, &()).unwrap();
            live.remove(&b).unwrap();
        }
        space.fail_nth_decommit(0);
        p.check().unwrap_or_else(|v| panic!("step {step}: {v}"));
        assert_eq!(space.committed_bytes(), p.usage().held, "step {step}");
        assert!(p.usage().used >= live.bytes());
    }
    // The test must have exercised the fault path (a full run does; a short
    // one, under Miri, need not).
    assert!(failed_commits > 0 || cfg!(miri), "no commit failed");
    for b in blocks.drain(..) {
        p.deallocate(b, &()).unwrap();
        p.check().unwrap();
    }
    assert_eq!(p.usage().used, 0);
    assert_eq!(p.usage().held, p.idle_bytes());
    assert!(p.idle_bytes() <= config.release_threshold_bytes());
    p.trim(&()).unwrap();
    assert_eq!((p.usage().held, space.committed_bytes()), (0, 0));
    p.check().unwrap();
    assert_eq!(space.partial_decommits(), 0, "the pool asked to decommit part of a piece");
    (out_of_room, decommit_failures)
}

#[test]
pub(super) fn randomized_keep_nothing() {
    // Keeping nothing, a trim finds Idle memory only while a failed
    // decommit is pending, and the next free or failed allocate retries
    // it: a seed whose trims meet a few of those windows.
    randomized(VirtualConfig::new(256 * MIB), MIB, 100_000, 6);
}

#[test]
pub(super) fn randomized_in_pieces() {
    // Memory held in pieces of up to 4 granules, given back whole only (as
    // CUDA's physical handles): the pool never asks for part of one.
    for (config, seed) in [
        (VirtualConfig::new(256 * MIB).release_threshold(u64::MAX).slack_permille(40), 8),
        (VirtualConfig::new(256 * MIB).release_threshold(5 * MIB + 4096), 9),
    ] {
        randomized_in(CountingSpace::new(1 << 40, MIB).with_pieces(4).unwrap(), config, 30_000, seed);
    }
    // Keeping nothing, as `randomized_keep_nothing`. In pieces, a trim
    // meets a pending failed decommit in about one run in ten, so this
    // run need not: `a_trim_in_pieces_that_meets_a_failed_decommit_says_so`
    // builds that.
    randomized_run(
        CountingSpace::new(1 << 40, MIB).with_pieces(4).unwrap(),
        VirtualConfig::new(256 * MIB),
        100_000,
        38,
    );
    let config = VirtualConfig::new(256 * MIB).release_threshold(16 * MIB);
    let out_of_room =
        randomized_in(CountingSpace::new(40 * MIB, MIB).with_pieces(3).unwrap(), config, 20_000, 11);
    assert!(out_of_room > 0 || cfg!(miri), "memory never ran short");
}

#[test]
pub(super) fn randomized_keep_some() {
    randomized(VirtualConfig::new(256 * MIB).release_threshold(5 * MIB + 4096), MIB, 30_000, 2);
}

#[test]
pub(super) fn randomized_keep_some_without_trim_on_commit() {
    randomized(
        VirtualConfig::new(256 * MIB).release_threshold(5 * MIB + 4096).trim_on_commit(false),
        MIB,
        30_000,
        5,
    );
}

#[test]
pub(super) fn randomized_short_of_physical_memory() {
    // Commits fail for want of memory; the pool trims its idle granules
    // and retries, and fails cleanly when even that is not enough.
    for trim in [true, false] {
        let config = VirtualConfig::new(256 * MIB).release_threshold(16 * MIB).trim_on_commit(trim);
        let out_of_room = randomized_in(CountingSpace::new(40 * MIB, MIB), config, 20_000, 7);
        assert!(out_of_room > 0 || cfg!(miri), "memory never ran short");
    }
}

#[test]
pub(super) fn randomized_keep_much_small_granules() {
    randomized(VirtualConfig::new(64 * MIB).release_threshold(16 * MIB), 64 << 10, 30_000, 3);
}

#[test]
pub(super) fn randomized_several_reservations() {
    // Small reservations: requests overflow into new ones, and some find
    // no room at all (out of memory with figures).
    randomized(VirtualConfig::new(24 * MIB).release_threshold(2 * MIB).max_reservations(6), MIB, 30_000, 4);
    randomized(
        VirtualConfig::new(24 * MIB).release_threshold(8 * MIB).max_reservations(6).trim_on_commit(false),
        MIB,
        30_000,
        6,
    );
}

#[test]
pub(super) fn reservation_larger_than_the_address_space() {
    let space = CountingSpace::new(1 << 30, 2 * MIB);
    let err = VirtualPool::with_config(&space, VirtualConfig::new(1 << 50)).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { requested, .. } if requested == 1 << 50), "{err}");
    assert_eq!(space.reservation_count(), 0);
    assert!(matches!(
        VirtualPool::with_config(&space, VirtualConfig::new(0)),
        Err(Error::InvalidConfig { .. })
    ));
    // Growth that would need too large a reservation fails the same way and
    // leaves the pool as it was.
    let mut p = VirtualPool::with_config(&space, VirtualConfig::new(4 * MIB).max_reservations(2)).unwrap();
    let err = p.allocate(req(1 << 49), &()).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert_eq!((p.reservation_count(), p.reserved_bytes()), (1, 4 * MIB));
    p.check().unwrap();
}

#[test]
fn reservations_of_u32_max_granules_or_more_are_refused_with_what_to_change() {
    let space = CountingSpace::new(1 << 30, 256);
    // 2^32 granules of 256 bytes: refused when made, naming the remedy.
    let err = VirtualPool::with_config(&space, VirtualConfig::new(1 << 40)).unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { what } if what.contains("larger granules")), "{err}");
    assert_eq!(space.reservation_count(), 0);
    // Growth past that count is out of memory, and leaves the pool as it was.
    let mut p = VirtualPool::with_config(&space, VirtualConfig::new(MIB).max_reservations(2)).unwrap();
    let err = p.allocate(req(1 << 42), &()).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { requested, .. } if requested == 1 << 42), "{err}");
    assert_eq!((p.reservation_count(), p.reserved_bytes()), (1, MIB));
    let a = p.allocate(req(1000), &()).unwrap();
    p.deallocate(a, &()).unwrap();
    p.check().unwrap();
}

#[test]
pub(super) fn reservation_full_is_out_of_memory_with_figures() {
    let space = CountingSpace::new(1 << 30, MIB);
    let mut p = VirtualPool::with_config(&space, VirtualConfig::new(4 * MIB)).unwrap();
    let a = p.allocate(req(3 * MIB), &()).unwrap();
    let err = p.allocate(req(2 * MIB), &()).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: 2 * MIB,
            largest_free: MIB,
            pool_size: 3 * MIB,
            max_size: Some(4 * MIB)
        }
    );
    p.deallocate(a, &()).unwrap();
    assert_eq!(space.committed_bytes(), 0);
    p.check().unwrap();
}

/// Leaves granule 1 Idle between Uncommitted granules 0 and 2 (keep = one
/// granule), so that a block over granules 0..3 needs two commits.
pub(super) fn idle_between_uncommitted(space: &CountingSpace) -> (VirtualPool<&CountingSpace>, Block) {
    let mut p = VirtualPool::with_config(space, VirtualConfig::new(64 * MIB).release_threshold(MIB)).unwrap();
    let base = p.reservations[0].range.start();
    let a = p.allocate(req(MIB), &()).unwrap();
    let b = p.allocate(req(MIB), &()).unwrap();
    let c = p.allocate(req(MIB), &()).unwrap();
    let anchor = p.allocate(req(256), &()).unwrap();
    assert_eq!([a.addr(), b.addr(), c.addr(), anchor.addr()], [0, 1, 2, 3].map(|i| base + i * MIB));
    p.deallocate(a, &()).unwrap(); // granule 0 Idle, kept
    assert_eq!(p.trim(&()), Ok(MIB)); // and given back
    p.deallocate(c, &()).unwrap(); // granule 2 Idle, kept
    p.deallocate(b, &()).unwrap(); // granule 1 Idle; granule 2, the highest, goes
    assert!(!space.is_committed(range(base, MIB)));
    assert!(space.is_committed(range(base + MIB, MIB)));
    assert!(!space.is_committed(range(base + 2 * MIB, MIB)));
    assert_eq!(p.usage().held, 2 * MIB); // granule 1 (Idle) and 3 (anchor)
    p.check().unwrap();
    (p, anchor)
}

#[test]
pub(super) fn commit_failing_half_way_hands_out_nothing() {
    let space = CountingSpace::new(1 << 30, MIB);
    let (mut p, anchor) = idle_between_uncommitted(&space);
    let base = p.reservations[0].range.start();
    let before = figures(&p);
    let (commits, decommits) = space.call_counts();
    // The first commit (granule 0) succeeds, the second (granule 2) fails.
    space.fail_nth(2);
    let err = p.allocate(req(3 * MIB), &()).unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    assert_eq!(space.call_counts(), (commits + 1, decommits + 1), "granule 0 committed, then decommitted");
    assert_eq!(figures(&p), before);
    assert_eq!(space.committed_bytes(), 2 * MIB);
    assert!(!space.is_committed(range(base, MIB)));
    assert!(space.is_committed(range(base + MIB, MIB)));
    p.check().unwrap();
    // The same request now succeeds in the same place, over mapped memory.
    let b = p.allocate(req(3 * MIB), &()).unwrap();
    assert_eq!(b.addr(), base);
    assert!(space.is_committed(range(base, 4 * MIB)));
    assert_eq!((p.idle_bytes(), p.usage().held), (0, 4 * MIB));
    p.check().unwrap();
    p.deallocate(b, &()).unwrap();
    p.deallocate(anchor, &()).unwrap();
    p.check().unwrap();
    assert_eq!(p.usage().held, MIB);
}

/// A reservation the space refuses takes no host memory for bitmaps: a
/// request of 2^50 bytes over 1 MiB granules would have grown two bitmaps
/// of 128 MiB each, kept for good (and under Miri, zeroed for hours).
#[test]
fn a_reservation_the_space_refuses_grows_no_bitmap() {
    let space = CountingSpace::new(1 << 30, MIB);
    let config = VirtualConfig::new(64 * MIB).max_reservations(2);
    let mut p = VirtualPool::with_config(&space, config).unwrap();
    let a = p.allocate(req(MIB), &()).unwrap();
    let words = (p.committed_bits.words(), p.touched.words());
    assert_eq!(words, (1, 1));
    assert!(p.allocate(req(1 << 50), &()).unwrap_err().is_out_of_memory());
    assert_eq!((p.committed_bits.words(), p.touched.words()), words);
    assert_eq!(p.reservation_count(), 1);
    p.deallocate(a, &()).unwrap();
    p.check().unwrap();
}

#[test]
pub(super) fn out_of_physical_memory_trims_idle_granules_and_retries() {
    let space = CountingSpace::new(5 * MIB, MIB);
    let mut p =
        VirtualPool::with_config(&space, VirtualConfig::new(64 * MIB).release_threshold(4 * MIB)).unwrap();
    let a = p.allocate(req(2 * MIB), &()).unwrap();
    let b = p.allocate(req(2 * MIB), &()).unwrap();
    p.deallocate(a, &()).unwrap();
    assert_eq!((p.idle_bytes(), space.committed_bytes()), (2 * MIB, 4 * MIB));
    // 3 MiB do not fit in the 2 MiB hole: they need 3 fresh granules, and
    // only 1 MiB of physical memory is left until the idle ones go.
    let c = p.allocate(req(3 * MIB), &()).unwrap();
    assert_eq!((p.idle_bytes(), space.committed_bytes(), p.usage().held), (0, 5 * MIB, 5 * MIB));
    assert!(space.is_committed(granules_of(&c, MIB)));
    p.check().unwrap();
    // Beyond the physical memory even then: an error, nothing changed.
    let before = figures(&p);
    assert!(p.allocate(req(MIB), &()).unwrap_err().is_out_of_memory());
    assert_eq!(figures(&p), before);
    p.deallocate(b, &()).unwrap();
    p.deallocate(c, &()).unwrap();
    p.check().unwrap();
}

#[test]
pub(super) fn out_of_physical_memory_with_a_failing_trim_is_the_decommit_failure() {
    // 6 granules of physical memory; blocks on granules 0 to 3, then 0 and
    // 2 freed: two Idle runs, 4 granules committed. 3 MiB need 3 fresh
    // granules and only 2 are free until the Idle ones go.
    let space = CountingSpace::new(6 * MIB, MIB);
    let config = VirtualConfig::new(64 * MIB).release_threshold(4 * MIB).trim_on_commit(false);
    let mut p = VirtualPool::with_config(&space, config).unwrap();
    let base = p.reservations[0].range.start();
    let [a, x, b, y] = [0; 4].map(|_| p.allocate(req(MIB), &()).unwrap());
    assert_eq!([a, x, b, y].map(|k| k.addr()), [0, 1, 2, 3].map(|i| base + i * MIB));
    p.deallocate(a, &()).unwrap();
    p.deallocate(b, &()).unwrap();
    assert_eq!((p.idle_bytes(), space.committed_bytes()), (2 * MIB, 4 * MIB));
    // The trim's first decommit fails: nothing was given back, no retry,
    // and the call fails with the space's error, not out of memory (the
    // Idle granules would have made room).
    let before = figures(&p);
    space.fail_nth_decommit(1);
    let err = p.allocate(req(3 * MIB), &()).unwrap_err();
    assert!(matches!(err, Error::Backend { what: "injected decommit failure", .. }), "{err}");
    assert_eq!(figures(&p), before);
    p.check().unwrap();
    // Its second decommit fails: the first made room enough, the retry
    // succeeds, the granule whose decommit failed stays Idle.
    space.fail_nth_decommit(2);
    let c = p.allocate(req(3 * MIB), &()).unwrap();
    assert_eq!(c.addr(), base + 4 * MIB);
    assert!(space.is_committed(granules_of(&c, MIB)));
    assert_eq!((p.idle_bytes(), p.usage().held, space.committed_bytes()), (MIB, 6 * MIB, 6 * MIB));
    p.check().unwrap();
    // With every Idle granule given back and still no room: out of memory.
    space.fail_nth_decommit(0);
    assert!(p.allocate(req(2 * MIB), &()).unwrap_err().is_out_of_memory());
    assert_eq!((p.idle_bytes(), space.committed_bytes()), (0, 5 * MIB));
    p.check().unwrap();
    for k in [x, y, c] {
        p.deallocate(k, &()).unwrap();
    }
    p.check().unwrap();
}

#[test]
fn a_second_try_after_running_out_of_memory_counts_each_busy_granule_once() {
    // Granules 0, 1 and 3 Uncommitted, 2 and 4 Idle, after five blocks at
    // once; then another user of the space holds one of its five granules.
    // A block over granules 0..4 commits 0..2, runs out of physical memory
    // at 3, and cannot decommit 0..2: they stay committed. The trim gives 4
    // back and the second try commits 3 alone, once counted Busy.
    let space = CountingSpace::new(5 * MIB, MIB);
    let mut p =
        VirtualPool::with_config(&space, VirtualConfig::new(64 * MIB).release_threshold(8 * MIB)).unwrap();
    let base = p.reservations[0].range.start();
    let blocks = [0; 5].map(|_| p.allocate(req(MIB), &()).unwrap());
    assert_eq!(blocks.map(|b| b.addr()), [0, 1, 2, 3, 4].map(|i| base + i * MIB));
    for i in [0, 1, 3] {
        p.deallocate(blocks[i], &()).unwrap();
    }
    assert_eq!(p.trim(&()), Ok(3 * MIB));
    for i in [2, 4] {
        p.deallocate(blocks[i], &()).unwrap();
    }
    let other = space.reserve(MIB).unwrap();
    space.commit(other).unwrap();
    space.fail_nth_decommit(1);
    let b = p.allocate(req(4 * MIB), &()).unwrap();
    assert_eq!(b.addr(), base);
    assert!(space.is_committed(granules_of(&b, MIB)));
    assert_eq!((p.idle_bytes(), p.usage().held, space.committed_bytes()), (0, 4 * MIB, 5 * MIB));
    // Never more than the five first blocks' granules Busy at once.
    assert!(p.peak_busy_bytes() <= 5 * MIB, "Busy peak {} MiB", p.peak_busy_bytes() / MIB);
    p.check().unwrap();
    p.deallocate(b, &()).unwrap();
    space.decommit(other, &()).unwrap();
    space.release(other).unwrap();
    p.check().unwrap();
}

#[test]
pub(super) fn keep_zero_decommits_every_time_and_keep_avoids_it() {
    let rounds = crate::testing::steps(1000);
    for (keep, commits) in [(0, rounds as u64), (2 * MIB, 1)] {
        let space = CountingSpace::new(1 << 30, 2 * MIB);
        let mut p =
            VirtualPool::with_config(&space, VirtualConfig::new(64 * MIB).release_threshold(keep)).unwrap();
        for _ in 0..rounds {
            let b = p.allocate(req(100_000), &()).unwrap();
            assert!(space.is_committed(granules_of(&b, 2 * MIB)));
            p.deallocate(b, &()).unwrap();
            p.check().unwrap();
            assert_eq!(space.committed_bytes(), keep);
        }
        assert_eq!(space.call_counts().0, commits, "keep {keep}");
    }
}

#[test]
pub(super) fn free_straddling_shared_granules_keeps_them_mapped() {
    let space = CountingSpace::new(1 << 30, MIB);
    let mut p = VirtualPool::with_config(&space, VirtualConfig::new(64 * MIB)).unwrap();
    let base = p.reservations[0].range.start();
    let a = p.allocate(req(256), &()).unwrap();
    // Starts in granule 0 (shared with `a`), covers granule 1, ends in granule 2.
    let b = p.allocate(req(2 * MIB), &()).unwrap();
    let c = p.allocate(req(256), &()).unwrap();
    assert_eq!((a.addr(), b.addr(), c.addr()), (base, base + 256, base + 2 * MIB + 256));
    assert_eq!(space.committed_bytes(), 3 * MIB);
    p.deallocate(b, &()).unwrap();
    p.check().unwrap();
    assert!(space.is_committed(range(base, MIB)), "granule 0 holds a");
    assert!(!space.is_committed(range(base + MIB, MIB)), "granule 1 is wholly free");
    assert!(space.is_committed(range(base + 2 * MIB, MIB)), "granule 2 holds c");
    assert_eq!(p.usage().held, 2 * MIB);
    p.deallocate(a, &()).unwrap();
    assert_eq!(p.usage().held, MIB);
    p.deallocate(c, &()).unwrap();
    assert_eq!((p.usage().held, space.committed_bytes(), p.usage().peak_held), (0, 0, 3 * MIB));
    p.check().unwrap();
}

#[test]
pub(super) fn bad_frees_are_errors_and_change_nothing() {
    let space = CountingSpace::new(1 << 30, MIB);
    let mut p = VirtualPool::with_config(&space, VirtualConfig::new(64 * MIB)).unwrap();
    let a = p.allocate(req(5000), &()).unwrap();
    let b = p.allocate(req(5000), &()).unwrap();
    let before = figures(&p);
    assert_eq!(p.deallocate(Block::from_addr(1, 256), &()), Err(Error::UnknownBlock { addr: 1 }));
    let inside = a.addr() + 256;
    assert_eq!(p.deallocate(Block::from_addr(inside, 256), &()), Err(Error::UnknownBlock { addr: inside }));
    assert!(matches!(
        p.deallocate(Block::new(a.addr(), 100_000, a.tag()), &()),
        Err(Error::SizeMismatch { .. })
    ));
    // A size whose rounding overflows (it panicked in the index's free).
    for tag in [a.tag(), Block::NO_TAG] {
        let wrong = Block::new(a.addr(), u64::MAX, tag);
        assert!(matches!(p.deallocate(wrong, &()), Err(Error::SizeMismatch { given: u64::MAX, .. })));
        assert!(matches!(p.deallocate_keeping(wrong), Err(Error::SizeMismatch { given: u64::MAX, .. })));
    }
    assert_eq!(figures(&p), before);
    p.deallocate(a, &()).unwrap();
    assert_eq!(p.deallocate(a, &()), Err(Error::DoubleFree { addr: a.addr() }));
    assert_eq!(
        p.deallocate(Block::from_addr(a.addr(), a.size()), &()),
        Err(Error::DoubleFree { addr: a.addr() })
    );
    // Address-only free of a live block works.
    p.deallocate(Block::from_addr(b.addr(), b.size()), &()).unwrap();
    assert_eq!((p.usage().used, space.committed_bytes()), (0, 0));
    p.check().unwrap();
}

#[test]
pub(super) fn blocks_never_span_reservations() {
    let space = CountingSpace::new(1 << 30, MIB);
    let mut p = VirtualPool::with_config(&space, VirtualConfig::new(4 * MIB).max_reservations(8)).unwrap();
    // Two 3 MiB blocks never fit in one 4 MiB reservation, even where two
    // reservations are adjacent in the address space.
    let mut blocks = Vec::new();
    for n in 1..=8 {
        blocks.push(p.allocate(req(3 * MIB), &()).unwrap());
        assert_eq!(p.reservation_count(), n);
    }
    let err = p.allocate(req(3 * MIB), &()).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: 3 * MIB,
            largest_free: MIB,
            pool_size: 24 * MIB,
            max_size: Some(32 * MIB)
        }
    );
    // A 1 MiB block still fits in the tail of a reservation.
    blocks.push(p.allocate(req(MIB), &()).unwrap());
    for b in &blocks {
        let r = p.reservation_of(b.addr()).unwrap();
        assert!(r.range.contains_range(&b.range()));
    }
    p.check().unwrap();
    for b in blocks.drain(..) {
        p.deallocate(b, &()).unwrap();
    }
    p.check().unwrap();
    assert_eq!(space.committed_bytes(), 0);
}

#[test]
pub(super) fn trim_on_commit_keeps_idle_memory_out_of_the_peak() {
    for (trim, peak) in [(true, 7 * MIB), (false, 11 * MIB)] {
        let space = CountingSpace::new(1 << 30, MIB);
        let mut p = VirtualPool::with_config(
            &space,
            VirtualConfig::new(64 * MIB).release_threshold(64 * MIB).trim_on_commit(trim),
        )
        .unwrap();
        let a = p.allocate(req(4 * MIB), &()).unwrap();
        let anchor = p.allocate(req(256), &()).unwrap();
        p.deallocate(a, &()).unwrap();
        assert_eq!(p.idle_bytes(), 4 * MIB);
        // Too large for the hole: 6 fresh granules past the anchor.
        let b = p.allocate(req(6 * MIB), &()).unwrap();
        assert!(b.addr() > anchor.addr());
        p.check().unwrap();
        assert_eq!(
            (p.usage().peak_held, space.peak_committed_bytes()),
            (peak, peak),
            "trim_on_commit {trim}"
        );
        assert_eq!(p.idle_bytes(), if trim { 0 } else { 4 * MIB });
        // `c` lands in the hole of `a`: Idle without trim on commit, else
        // committed afresh in place of 3 of the 6 Idle granules of `b`.
        let commits = space.call_counts().0;
        p.deallocate(b, &()).unwrap();
        assert_eq!(p.idle_bytes(), if trim { 6 * MIB } else { 10 * MIB });
        let c = p.allocate(req(3 * MIB), &()).unwrap();
        assert_eq!(c.addr(), a.addr());
        assert_eq!(space.call_counts().0 - commits, trim as u64, "trim_on_commit {trim}");
        assert_eq!(p.idle_bytes(), if trim { 3 * MIB } else { 7 * MIB });
        assert_eq!(p.usage().peak_held, peak);
        p.deallocate(c, &()).unwrap();
        p.deallocate(anchor, &()).unwrap();
        p.check().unwrap();
    }
}

#[test]
pub(super) fn drop_decommits_and_releases_everything() {
    let space = CountingSpace::new(1 << 30, MIB);
    {
        let config = VirtualConfig::new(8 * MIB).release_threshold(4 * MIB).max_reservations(3);
        let mut p = VirtualPool::with_config(&space, config).unwrap();
        let a = p.allocate(req(6 * MIB), &()).unwrap();
        let b = p.allocate(req(6 * MIB), &()).unwrap();
        let _live = p.allocate(req(300), &()).unwrap();
        p.deallocate(a, &()).unwrap();
        p.deallocate(b, &()).unwrap();
        assert_eq!((space.reservation_count(), space.committed_bytes()), (2, 5 * MIB));
    }
    assert_eq!((space.reservation_count(), space.committed_bytes()), (0, 0));
}

#[test]
fn a_small_block_goes_where_a_live_neighbour_keeps_its_granule_mapped() {
    let space = CountingSpace::new(1 << 30, 2 * MIB);
    let mut p = VirtualPool::new(&space).unwrap();
    // Granule 0: y. Granules 1 and 2: z. Granule 2: w, after z.
    let y = p.allocate(req(2 * MIB), &()).unwrap();
    let z = p.allocate(req(3 * MIB), &()).unwrap();
    let w = p.allocate(req(MIB), &()).unwrap();
    assert_eq!((y.addr() % (2 * MIB), z.addr() - y.addr(), w.addr() - y.addr()), (0, 2 * MIB, 5 * MIB));
    let base = y.addr();
    p.deallocate(z, &()).unwrap();
    assert_eq!(space.committed_bytes(), 4 * MIB, "granule 1 went back");
    // The index's fit is z's start, in granule 1; the end of z's range is
    // in granule 2, which w keeps mapped.
    let a = p.allocate(req(MIB), &()).unwrap();
    assert_eq!(a.addr() - base, 4 * MIB);
    assert_eq!((space.committed_bytes(), p.usage().peak_held), (4 * MIB, 6 * MIB));
    p.check().unwrap();
    // 1.5 MiB has no such place (at the range's end it would reach into
    // granule 1): it takes the index's fit and maps granule 1.
    let b = p.allocate(req(3 * MIB / 2), &()).unwrap();
    assert_eq!(b.addr() - base, 2 * MIB);
    assert_eq!(space.committed_bytes(), 6 * MIB);
    p.check().unwrap();
    for blk in [y, w, a, b] {
        p.deallocate(blk, &()).unwrap();
    }
    assert_eq!((p.usage().used, space.committed_bytes()), (0, 0));
    p.check().unwrap();
}

#[test]
fn a_small_block_that_only_a_new_reservation_holds_stays_there() {
    // Aligned to 64 MiB, 1000 bytes fit only the reservation made for
    // them, and a class search over that reservation would skip it: a
    // small block placed on a new granule that finds no better place must
    // keep the place it was given.
    let space = CountingSpace::new(1 << 30, 2 * MIB);
    let mut p = VirtualPool::with_config(&space, VirtualConfig::new(4 * MIB).max_reservations(2)).unwrap();
    let r = Request::aligned(1000, 64 * MIB).unwrap();
    let a = p.allocate(r, &()).unwrap();
    assert_eq!((a.addr() % (64 * MIB), p.reservation_count()), (0, 2));
    assert_eq!(space.committed_bytes(), 2 * MIB);
    p.check().unwrap();
    p.deallocate(a, &()).unwrap();
    assert_eq!((p.usage().used, space.committed_bytes()), (0, 0));
}

/// Out of physical memory, a block whose range shares a piece with Idle
/// granules outside it kept the space from giving that piece back while
/// it was placed: the allocate failed with out of memory though the
/// device could hold it. The pool now puts the block back, gives every
/// Idle granule back and places it once more.
#[test]
fn idle_granules_in_a_piece_the_failed_block_shared_go_back_and_the_block_fits() {
    // Seven granules of physical memory, held in pieces of up to four.
    let space = CountingSpace::new(7 * MIB, MIB).with_pieces(4).unwrap();
    let mut pool =
        VirtualPool::with_config(&space, VirtualConfig::new(16 * MIB).release_threshold(1 << 40)).unwrap();
    // Granules 0..3 (one piece) and, aligned past a gap, 4..8 (another).
    let a = pool.allocate(req(3 * MIB), &()).unwrap();
    let b = pool.allocate(Request::aligned(4 * MIB, 4 * MIB).unwrap(), &()).unwrap();
    assert_eq!((a.addr() % (16 * MIB), b.addr() - a.addr()), (0, 4 * MIB));
    pool.deallocate(a, &()).unwrap();
    pool.deallocate(b, &()).unwrap();
    assert_eq!((space.committed_bytes(), pool.idle_bytes()), (7 * MIB, 7 * MIB), "kept, all Idle");
    // Six granules at 0..6 need granule 3 besides the five committed, and
    // granules 6 and 7 share their piece with the block.
    let y = pool.allocate(req(6 * MIB), &()).unwrap();
    assert!(space.is_committed(granules_of(&y, MIB)));
    assert!(space.committed_bytes() <= 7 * MIB);
    pool.check().unwrap();
    pool.deallocate(y, &()).unwrap();
    // Seven granules still fit; eight are out of memory, and leave the
    // pool as usable as before.
    let z = pool.allocate(req(7 * MIB), &()).unwrap();
    assert!(matches!(pool.allocate(req(MIB), &()), Err(Error::OutOfMemory { .. })));
    pool.deallocate(z, &()).unwrap();
    pool.check().unwrap();
}

/// A space (a safe trait of the user's) that hands out a new reservation
/// shorter than asked or not aligned to its granule: the space's fault
/// (`UpstreamMisbehaved`), not the request's; the range goes back to the
/// space, nothing is counted, and the pool serves on. Before, it was
/// `InvalidConfig`, as if the caller had asked for something wrong.
#[test]
fn a_reservation_of_the_wrong_shape_is_the_spaces_fault() {
    use core::cell::Cell;
    /// Once armed, hands out the next reservation moved by `skew.0` and
    /// shortened by `skew.1`; takes it back as the range it reserved.
    struct Skewed<'a> {
        inner: &'a CountingSpace,
        skew: (u64, u64),
        armed: Cell<bool>,
        /// The range handed out skewed, and the one reserved for it.
        skewed: Cell<Option<(Range, Range)>>,
    }
    impl ReservableSpace for Skewed<'_> {
        fn granule(&self) -> u64 {
            self.inner.granule()
        }
        fn reserve(&self, len: u64) -> Result<Range> {
            let r = self.inner.reserve(len)?;
            if !self.armed.replace(false) {
                return Ok(r);
            }
            let skewed = range(r.start() + self.skew.0, r.len() - self.skew.1);
            self.skewed.set(Some((skewed, r)));
            Ok(skewed)
        }
        fn release(&self, range: Range) -> Result<()> {
            match self.skewed.get() {
                Some((skewed, reserved)) if skewed == range => self.inner.release(reserved),
                _ => self.inner.release(range),
            }
        }
        fn commit(&self, range: Range) -> Result<()> {
            self.inner.commit(range)
        }
        fn decommit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
            self.inner.decommit(range, stream)
        }
    }
    for skew in [(0, MIB), (256, 0), (MIB / 2, MIB / 2)] {
        let inner = CountingSpace::new(1 << 30, MIB);
        let space = Skewed { inner: &inner, skew, armed: Cell::new(false), skewed: Cell::new(None) };
        let mut p =
            VirtualPool::with_config(&space, VirtualConfig::new(4 * MIB).max_reservations(3)).unwrap();
        let a = p.allocate(req(3 * MIB), &()).unwrap();
        let before = figures(&p);
        space.armed.set(true);
        let err = p.allocate(req(3 * MIB), &()).unwrap_err();
        let (skewed, _) = space.skewed.get().unwrap();
        let what = "a reservation not sized or aligned as asked";
        assert_eq!(
            err,
            Error::UpstreamMisbehaved { addr: skewed.start(), size: skewed.len(), what },
            "{skew:?}"
        );
        assert_eq!((figures(&p), inner.reservation_count()), (before, 1), "{skew:?}: given back");
        p.check().unwrap();
        // The same request, from a reservation as asked.
        let b = p.allocate(req(3 * MIB), &()).unwrap();
        assert_eq!(p.reservation_count(), 2, "{skew:?}");
        p.deallocate(a, &()).unwrap();
        p.deallocate(b, &()).unwrap();
        p.check().unwrap();
        drop(p);
        assert_eq!((inner.committed_bytes(), inner.reservation_count()), (0, 0), "{skew:?}");
    }
}

/// A space (a safe trait of the user's) whose first reservation is
/// `inner`'s and every later one what `then(inner, first, len)` answers:
/// refused, misshapen, or a range the pool holds handed out again.
struct AfterFirst<'a, F> {
    inner: &'a CountingSpace,
    first: core::cell::Cell<Option<Range>>,
    then: F,
}

impl<'a, F: Fn(&CountingSpace, Range, u64) -> Result<Range>> AfterFirst<'a, F> {
    fn new(inner: &'a CountingSpace, then: F) -> Self {
        AfterFirst { inner, first: core::cell::Cell::new(None), then }
    }
}

impl<F: Fn(&CountingSpace, Range, u64) -> Result<Range>> ReservableSpace for AfterFirst<'_, F> {
    fn granule(&self) -> u64 {
        self.inner.granule()
    }
    fn reserve(&self, len: u64) -> Result<Range> {
        match self.first.get() {
            Some(first) => (self.then)(self.inner, first, len),
            None => {
                let r = self.inner.reserve(len)?;
                self.first.set(Some(r));
                Ok(r)
            }
        }
    }
    fn release(&self, range: Range) -> Result<()> {
        self.inner.release(range)
    }
    fn commit(&self, range: Range) -> Result<()> {
        self.inner.commit(range)
    }
    fn decommit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
        self.inner.decommit(range, stream)
    }
}

/// A space (a safe trait of the user's) that hands out, as a new
/// reservation, a range overlapping one the pool holds: refused, typed,
/// and not given back (it is the pool's own); the pool serves on and its
/// checker holds. Before, the pool took it: two live blocks at one
/// address, and freeing them took its committed count below zero (a panic
/// in debug builds).
#[test]
fn a_reservation_overlapping_one_the_pool_holds_is_refused() {
    for shift in [0, MIB, 3 * MIB] {
        let inner = CountingSpace::new(1 << 30, MIB);
        // Later reservations: the first one shifted, of the length asked.
        let space = AfterFirst::new(&inner, move |_, first, len| Ok(range(first.start() + shift, len)));
        let mut p =
            VirtualPool::with_config(&space, VirtualConfig::new(4 * MIB).max_reservations(3)).unwrap();
        let a = p.allocate(req(3 * MIB), &()).unwrap();
        let err = p.allocate(req(3 * MIB), &()).unwrap_err();
        assert!(
            matches!(
                err,
                Error::UpstreamMisbehaved { what: "a reservation overlapping one the pool holds", .. }
            ),
            "{shift}: {err}"
        );
        assert_eq!((p.reservation_count(), inner.reservation_count()), (1, 1), "{shift}");
        p.check().unwrap();
        let b = p.allocate(req(MIB), &()).unwrap();
        p.deallocate(a, &()).unwrap();
        p.deallocate(b, &()).unwrap();
        p.check().unwrap();
        drop(p);
        assert_eq!((inner.committed_bytes(), inner.reservation_count()), (0, 0), "{shift}");
    }
    // The pool's own reservation whole for a longer one: not sized as
    // asked, and overlapping; not given back either. Before, the pool
    // gave its own reservation back to the space, and served from it.
    let inner = CountingSpace::new(1 << 30, MIB);
    let space = AfterFirst::new(&inner, |_, first, _| Ok(first));
    let mut p = VirtualPool::with_config(&space, VirtualConfig::new(4 * MIB).max_reservations(3)).unwrap();
    let err = p.allocate(req(5 * MIB), &()).unwrap_err();
    let what = "a reservation overlapping one the pool holds";
    assert!(matches!(err, Error::UpstreamMisbehaved { what: w, .. } if w == what), "{err}");
    assert_eq!((p.reservation_count(), inner.reservation_count()), (1, 1));
    let b = p.allocate(req(3 * MIB), &()).unwrap();
    assert!(inner.is_committed(granules_of(&b, MIB)));
    p.deallocate(b, &()).unwrap();
    p.check().unwrap();
    drop(p);
    assert_eq!((inner.committed_bytes(), inner.reservation_count()), (0, 0));
}

/// Out of the space's addresses for another reservation that the
/// configuration allows, the error is the request's (the space's error
/// named the reservation, and the space's figures).
#[test]
fn out_of_addresses_for_a_reservation_the_error_is_the_requests() {
    // Granules of 1 GiB: one reservation of 2^46 bytes fills the space's
    // addresses as far as a second one goes.
    let space = CountingSpace::new(1 << 47, 1 << 30);
    let mut p = VirtualPool::with_config(&space, VirtualConfig::new(1 << 46).max_reservations(8)).unwrap();
    let a = p.allocate(req(1 << 46), &()).unwrap();
    let e = p.allocate(req(1000), &()).unwrap_err();
    let expected =
        Error::OutOfMemory { requested: 1000, largest_free: 0, pool_size: 1 << 46, max_size: Some(1 << 46) };
    assert_eq!(e, expected);
    assert_eq!((p.reservation_count(), space.reservation_count()), (1, 1));
    p.deallocate(a, &()).unwrap();
    p.check().unwrap();
}

/// Out of slots for another reservation (its granules would take all the
/// pool's to `u32::MAX`), the error is the request's, not the
/// reservation's.
#[test]
fn out_of_slots_for_a_reservation_the_error_is_the_requests() {
    // Granules of 256 bytes: a request aligned to 2^40 needs 2^32 of them.
    let space = CountingSpace::new(1 << 30, 256);
    let mut p = VirtualPool::with_config(&space, VirtualConfig::new(MIB).max_reservations(8)).unwrap();
    let aligned = Request::aligned(1000, Request::MAX_ALIGN).unwrap();
    let e = p.allocate(aligned, &()).unwrap_err();
    let expected =
        Error::OutOfMemory { requested: 1000, largest_free: MIB, pool_size: 0, max_size: Some(MIB) };
    assert_eq!(e, expected);
    assert_eq!((p.reservation_count(), space.reservation_count()), (1, 1));
    let b = p.allocate(req(1000), &()).unwrap();
    p.deallocate(b, &()).unwrap();
    p.check().unwrap();
}

/// The longest of [`ten_holes_the_longest_last`]'s holes.
const LONG_HOLE: u64 = 407 << 8;

/// Fills the pool's one reservation, leaving ten holes of one size class
/// (400 to 407 units of 256 bytes) kept apart, the longest last in its
/// class's list, past the ranges the class search looks at. Returns its
/// address and the blocks live.
fn ten_holes_the_longest_last<V: ReservableSpace>(p: &mut VirtualPool<V>) -> (u64, Vec<Block>) {
    let reserve = p.reserved_bytes();
    let mut holes = Vec::new();
    let mut kept = Vec::new();
    for k in 0..10 {
        holes.push(p.allocate(req(if k == 0 { LONG_HOLE } else { 400 << 8 }), &()).unwrap());
        kept.push(p.allocate(req(256), &()).unwrap());
    }
    while p.usage().used < reserve {
        kept.push(p.allocate(req((reserve - p.usage().used).min(MIB)), &()).unwrap());
    }
    // Freed longest first: it ends last in its class's list.
    let at = holes[0].addr();
    for h in holes {
        p.deallocate(h, &()).unwrap();
    }
    (at, kept)
}

/// With no reservation to be added (at `max_reservations`, or the space
/// out of addresses), a request comes from any free range that holds it:
/// the index's class search looks only at the first ranges of a class,
/// and the request failed with `OutOfMemory` though a range held it.
#[test]
fn with_no_reservation_to_add_a_block_comes_from_any_free_range_that_holds_it() {
    // One granule per reservation: the bitmap of the taken addresses
    // stays small enough for Miri.
    let reserve = 32 * MIB;
    for out_of_addresses in [false, true] {
        let space = CountingSpace::new(1 << 30, reserve);
        // The space's addresses, all but one reservation, taken first.
        let taken = out_of_addresses
            .then(|| space.reserve(CountingSpace::END - CountingSpace::BASE - reserve).unwrap());
        let max = if out_of_addresses { 4 } else { 1 };
        let config = VirtualConfig::new(reserve).max_reservations(max);
        let mut p = VirtualPool::with_config(&space, config).unwrap();
        let (at, kept) = ten_holes_the_longest_last(&mut p);
        let b = p.allocate(req(LONG_HOLE), &()).unwrap_or_else(|e| panic!("{out_of_addresses}: {e}"));
        assert_eq!(b.addr(), at);
        assert!(space.is_committed(granules_of(&b, p.granule())));
        assert_eq!((p.reservation_count(), space.committed_bytes()), (1, p.usage().held));
        p.check().unwrap();
        // Nothing free holds more: out of memory, with the figures.
        let e = p.allocate(req(LONG_HOLE + 256), &()).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { max_size: Some(m), .. } if m == reserve), "{e}");
        p.deallocate(b, &()).unwrap();
        for b in kept {
            p.deallocate(b, &()).unwrap();
        }
        assert_eq!((p.usage().used, space.committed_bytes()), (0, 0));
        p.check().unwrap();
        drop(p);
        if let Some(r) = taken {
            space.release(r).unwrap();
        }
    }
}

/// A space that refuses another reservation with an error (its own, or one
/// of the wrong shape or overlapping one the pool holds, which the pool
/// refuses): a request that a free range holds comes from it, as with no
/// reservation to add; the reservation's error stands where none holds it.
/// Before, the request failed with that error though a range held it, past
/// the first ranges of its class that the class search looks at.
#[test]
fn a_reservation_refused_with_an_error_still_lets_a_block_come_from_any_free_range_that_holds_it() {
    const REFUSED: Error = Error::Backend { code: -3, what: "injected refusal of a reservation" };
    // One granule per reservation, as above.
    let reserve = 32 * MIB;
    for how in 0..3 {
        let inner = CountingSpace::new(1 << 30, reserve);
        // Later reservations: refused (0), a granule longer than asked (1),
        // or the first one again (2).
        let space = AfterFirst::new(&inner, move |inner, first, len| match how {
            0 => Err(REFUSED),
            1 => inner.reserve(len + inner.granule()),
            _ => Ok(first),
        });
        let config = VirtualConfig::new(reserve).max_reservations(4);
        let mut p = VirtualPool::with_config(&space, config).unwrap();
        let (at, kept) = ten_holes_the_longest_last(&mut p);
        let b = p.allocate(req(LONG_HOLE), &()).unwrap_or_else(|e| panic!("{how}: {e}"));
        assert_eq!(b.addr(), at, "{how}");
        assert!(inner.is_committed(granules_of(&b, p.granule())), "{how}");
        assert_eq!((p.reservation_count(), inner.reservation_count()), (1, 1), "{how}");
        p.check().unwrap();
        // Nothing free holds more: the reservation's error.
        let before = figures(&p);
        let e = p.allocate(req(LONG_HOLE + 256), &()).unwrap_err();
        let expected = match how {
            0 => e == REFUSED,
            1 => matches!(
                e,
                Error::UpstreamMisbehaved { what: "a reservation not sized or aligned as asked", .. }
            ),
            _ => matches!(
                e,
                Error::UpstreamMisbehaved { what: "a reservation overlapping one the pool holds", .. }
            ),
        };
        assert!(expected, "{how}: {e}");
        assert_eq!((figures(&p), inner.reservation_count()), (before, 1), "{how}");
        p.deallocate(b, &()).unwrap();
        for b in kept {
            p.deallocate(b, &()).unwrap();
        }
        assert_eq!((p.usage().used, inner.committed_bytes()), (0, 0), "{how}");
        p.check().unwrap();
        drop(p);
        assert_eq!(inner.reservation_count(), 0, "{how}");
    }
}
