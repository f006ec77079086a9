use super::*;
use crate::workload::Op;

const MIB: u64 = 1 << 20;

fn workload(steps: &[(bool, u32, u64)]) -> Workload {
    let ops = steps.iter().map(|&(alloc, id, size)| Op { size, id, stream: 0, alloc }).collect();
    Workload::from_ops("test".into(), ops, 0)
}

#[test]
fn knowing_lifetimes_places_what_an_online_allocator_cannot() {
    // a and b side by side, a freed, then c of twice the size: an online
    // allocator must put c after b (3 MiB live, 4 MiB held); knowing that
    // a dies before c is born, c goes first and a takes its place.
    let w = workload(&[(true, 0, MIB), (true, 1, MIB), (false, 0, MIB), (true, 2, 2 * MIB)]);
    let blocks = lifetimes(&w);
    assert_eq!(blocks[0], Lifetime { start: 0, end: 2, size: MIB });
    assert_eq!(blocks[2], Lifetime { start: 3, end: 4, size: 2 * MIB });
    for order in Order::ALL {
        let p = place(&blocks, order);
        assert_eq!(p.top, 3 * MIB, "{order:?}");
        assert_eq!(p.top, w.peak_live);
        assert_eq!(first_conflict(&blocks, &p), None);
        assert_eq!(p.offsets[0], p.offsets[2], "a sits where c will be");
    }
}

#[test]
fn sizes_round_up_to_the_granule_and_unfreed_blocks_live_to_the_end() {
    let w = workload(&[(true, 0, 1), (true, 1, 300), (false, 0, 1)]);
    assert_eq!(
        lifetimes(&w),
        [Lifetime { start: 0, end: 2, size: 256 }, Lifetime { start: 1, end: 3, size: 512 }]
    );
    let (_, p) = best(&w);
    assert_eq!(p.top, 768);
    assert_eq!(first_conflict(&lifetimes(&w), &p), None);
}

#[test]
fn the_checker_finds_blocks_that_share_addresses_while_live() {
    let w = workload(&[(true, 0, 512), (true, 1, 512), (false, 0, 512), (false, 1, 512)]);
    let blocks = lifetimes(&w);
    // Overlapping by one granule: caught from either side.
    let bad = Placement { offsets: vec![0, 256], top: 768 };
    assert_eq!(first_conflict(&blocks, &bad), Some((0, 1)));
    let bad = Placement { offsets: vec![256, 0], top: 768 };
    assert_eq!(first_conflict(&blocks, &bad), Some((0, 1)));
    // Touching is fine; so is sharing addresses one after the other.
    let good = Placement { offsets: vec![0, 512], top: 1024 };
    assert_eq!(first_conflict(&blocks, &good), None);
    let w = workload(&[(true, 0, 512), (false, 0, 512), (true, 1, 512), (false, 1, 512)]);
    let after = Placement { offsets: vec![0, 0], top: 512 };
    assert_eq!(first_conflict(&lifetimes(&w), &after), None);
}

#[test]
fn generated_workloads_are_placed_without_conflict_and_at_least_at_the_peak() {
    for spec in ["random:3000:1048576:7", "lograndom:5000:256:16777216:3", "random:6000:65536:11"] {
        let w = Workload::load(spec).unwrap();
        let blocks = lifetimes(&w);
        for order in Order::ALL {
            let p = place(&blocks, order);
            assert_eq!(first_conflict(&blocks, &p), None, "{spec} {order:?}");
            assert!(p.top >= w.peak_live, "{spec} {order:?}: {} < {}", p.top, w.peak_live);
            let end = blocks.iter().zip(&p.offsets).map(|(b, o)| o + b.size).max().unwrap();
            assert_eq!(p.top, end, "{spec} {order:?}");
        }
        let (order, p) = best(&w);
        assert!(Order::ALL.iter().all(|&o| place(&blocks, o).top >= p.top), "{spec}: {order:?}");
    }
}
