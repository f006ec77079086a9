//! Blocks aligned inside runs of idle granules.

extern crate std;

use super::idle::LONG_RUN;
use super::tests::*;
use super::*;
use crate::testing::SplitMix64;
use crate::vmem::CountingSpace;
use alloc::vec::Vec;

#[test]
fn a_block_aligned_inside_an_idle_run_takes_its_middle() {
    let space = CountingSpace::new(1 << 30, MIB);
    let mut p =
        VirtualPool::with_config(&space, VirtualConfig::new(64 * MIB).release_threshold(64 * MIB)).unwrap();
    let base = p.reservations[0].range.start();
    let x = p.allocate(req(256), &()).unwrap();
    let a = p.allocate(req(8 * MIB), &()).unwrap();
    let anchor = p.allocate(req(256), &()).unwrap();
    assert_eq!([x, a, anchor].map(|b| b.addr() - base), [0, 256, 8 * MIB + 256]);
    // Granules 1..8 are `a`'s alone: one idle run.
    p.deallocate(a, &()).unwrap();
    assert_eq!(p.idle_bytes(), 7 * MIB);
    let calls = space.call_counts();
    // Aligned to 4 MiB, `b` starts in granule 4, inside the run.
    let b = p.allocate(Request::aligned(MIB, 4 * MIB).unwrap(), &()).unwrap();
    assert_eq!(b.addr() - base, 4 * MIB);
    p.check().unwrap();
    assert_eq!((p.idle_bytes(), space.call_counts()), (6 * MIB, calls));
    p.deallocate(b, &()).unwrap();
    p.check().unwrap();
    assert_eq!(p.idle_bytes(), 7 * MIB);
    // Oldest first: the left side (granules 1..4), then its Idle neighbour
    // above (granule 4, the newest), in one call; the right side stays.
    let decommits = space.call_counts().1;
    assert_eq!(p.trim_to(3 * MIB, false, &()), Ok(4 * MIB));
    assert_eq!(space.call_counts().1, decommits + 1);
    assert!(!space.is_committed(range(base + MIB, 4 * MIB)));
    assert!(space.is_committed(range(base + 5 * MIB, 3 * MIB)));
    p.check().unwrap();
    for blk in [x, anchor] {
        p.deallocate(blk, &()).unwrap();
        p.check().unwrap();
    }
    let idle = p.idle_bytes();
    assert_eq!((p.trim(&()), p.usage().held, space.committed_bytes()), (Ok(idle), 0, 0));
}

#[test]
fn blocks_aligned_inside_long_idle_runs_find_their_run() {
    // One idle run of 638 granules, ten words of the bitmap of run starts:
    // a block aligned far inside it looks its start up words below.
    let space = CountingSpace::new(1 << 32, MIB);
    let mut p =
        VirtualPool::with_config(&space, VirtualConfig::new(640 * MIB).release_threshold(640 * MIB)).unwrap();
    let base = p.reservations[0].range.start();
    let x = p.allocate(req(256), &()).unwrap();
    let a = p.allocate(req(640 * MIB - 512), &()).unwrap();
    let anchor = p.allocate(req(256), &()).unwrap();
    assert_eq!(anchor.addr() - base, 640 * MIB - 256);
    p.deallocate(a, &()).unwrap();
    p.check().unwrap();
    assert_eq!(p.idle_bytes(), 638 * MIB);
    // Every granule stays committed from now on (`keep` holds them all):
    // each block lands on Idle or Busy granules, never maps.
    let calls = space.call_counts();
    let mut placed = Vec::new();
    for (size, align) in [(MIB, 512), (3 * MIB, 256), (256, 128), (5 * MIB, 64), (MIB, 32), (2 * MIB, 16)] {
        let align = align * MIB;
        let b = p.allocate(Request::aligned(size, align).unwrap(), &()).unwrap();
        p.check().unwrap();
        assert_eq!(b.addr() % align, 0);
        assert!(b.addr() > base + MIB && b.addr() + size < base + 639 * MIB);
        placed.push(b);
    }
    assert_eq!(space.call_counts(), calls);
    // Free and place again at random: the runs left between blocks, and
    // those freed blocks add next to them (runs are never merged), each
    // found from granules far inside them.
    let mut rng = SplitMix64::new(7);
    for step in 0..crate::testing::steps(2000) {
        if placed.is_empty() || rng.below(100) < 50 {
            let size = 1 + rng.below(6 * MIB);
            let align = MIB << rng.below(10);
            match p.allocate(Request::aligned(size, align).unwrap(), &()) {
                Ok(b) => {
                    assert_eq!(b.addr() % align, 0);
                    placed.push(b);
                }
                Err(e) => assert!(e.is_out_of_memory(), "step {step}: {e}"),
            }
        } else {
            let b = placed.swap_remove(rng.below(placed.len() as u64) as usize);
            p.deallocate(b, &()).unwrap();
        }
        p.check().unwrap_or_else(|v| panic!("step {step}: {v}"));
        every_idle_granule_finds_its_run(&p);
    }
    assert_eq!(space.call_counts(), calls);
    for b in placed.into_iter().chain([x, anchor]) {
        p.deallocate(b, &()).unwrap();
        p.check().unwrap();
    }
    assert_eq!(p.idle_bytes(), 640 * MIB);
    assert_eq!((p.trim(&()), space.committed_bytes()), (Ok(640 * MIB), 0));
    p.check().unwrap();
}

/// `run_holding` names the run of every Idle granule.
fn every_idle_granule_finds_its_run<V: ReservableSpace>(p: &VirtualPool<V>) {
    // Under Miri, where each lookup is slow: every 32nd granule and the last of each run.
    let stride = if cfg!(miri) { 32 } else { 1 };
    let mut id = p.runs[SENTINEL as usize].next;
    while id != SENTINEL {
        let run = p.runs[id as usize];
        for s in (run.start..run.end).step_by(stride).chain([run.end - 1]) {
            assert_eq!(p.run_holding(s), id, "slot {s} of run {}..{}", run.start, run.end);
        }
        id = run.next;
    }
}

#[test]
fn runs_just_short_and_just_long_are_found_from_their_last_granule() {
    let space = CountingSpace::new(1 << 32, MIB);
    let mut p =
        VirtualPool::with_config(&space, VirtualConfig::new(256 * MIB).release_threshold(256 * MIB)).unwrap();
    let x = p.allocate(req(256), &()).unwrap();
    // Touching granules 0..=65, 65..=129 and 129..=194; `anchor` shares 194.
    let blocks = [65, 64, 65].map(|mib| p.allocate(req(mib * MIB), &()).unwrap());
    let anchor = p.allocate(req(256), &()).unwrap();
    for b in blocks {
        p.deallocate(b, &()).unwrap();
        p.check().unwrap();
    }
    // One run per free (never merged): two of LONG_RUN granules, not
    // marked, and one of a granule more, marked.
    let mut lens = Vec::new();
    let mut id = p.runs[SENTINEL as usize].next;
    while id != SENTINEL {
        lens.push((p.runs[id as usize].start, p.runs[id as usize].end));
        id = p.runs[id as usize].next;
    }
    assert_eq!(lens, [(1, 65), (65, 129), (129, 194)]);
    assert_eq!(LONG_RUN, 64);
    assert_eq!(p.long_starts.count(0, 256), 1);
    every_idle_granule_finds_its_run(&p);
    for b in [x, anchor] {
        p.deallocate(b, &()).unwrap();
        p.check().unwrap();
    }
    every_idle_granule_finds_its_run(&p);
}
