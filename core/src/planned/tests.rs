extern crate std;

use super::placement::{best, first_conflict, place, place_around, Lifetime, Method, Order, Placement};
use super::*;
use crate::adaptor::Statistics;
use crate::splitmix::SplitMix64;
use crate::testing::{BumpUpstream, TestStream};
use alloc::vec;

const MIB: u64 = 1 << 20;

fn life(start: u32, end: u32, size: u64) -> Lifetime {
    Lifetime { start, end, size }
}

fn req(size: u64) -> Request {
    Request::new(size).unwrap()
}

fn upstream_allocations<R>(p: &Planned<Statistics<R>>) -> i64 {
    p.upstream().get_allocations_counter().total
}

// Placement.

#[test]
fn knowing_lifetimes_places_what_an_online_allocator_cannot() {
    // a and b side by side, a freed, then c of twice the size: an online
    // allocator puts c after b (3 MiB live, 4 MiB held); knowing that a
    // dies before c is born, c goes first and a takes its place.
    let blocks = [life(0, 2, MIB), life(1, 4, MIB), life(3, 4, 2 * MIB)];
    assert_eq!(place(&blocks, Method::BestFit).top, 4 * MIB, "the online allocator");
    for order in Method::ALL.into_iter().filter(|&m| m != Method::BestFit) {
        let p = place(&blocks, order);
        assert_eq!(p.top, 3 * MIB, "{order:?}");
        assert_eq!(first_conflict(&blocks, &p), None);
        assert_eq!(p.offsets[0], p.offsets[2], "a sits where c will be");
    }
}

#[test]
fn the_skyline_reaches_the_peak_where_every_lowest_offset_order_does_not() {
    // Peak 9 (a, b, e live at op 3). Largest first, d goes at 0 and b
    // beside it in time at 0; a goes over d, and e, live with a and b,
    // finds only 1 free unit between them and goes on top: 10. The other
    // orders do no better. The skyline fills the lowest stretch in time
    // first and leaves no such gap.
    let (a, b, c, d, e) = (life(1, 4, 3), life(2, 7, 3), life(0, 3, 1), life(0, 2, 4), life(3, 6, 3));
    let blocks = [a, b, c, d, e];
    for method in Method::ALL {
        let p = place(&blocks, method);
        assert_eq!(first_conflict(&blocks, &p), None, "{method:?}");
        match method {
            Method::Skyline(_) => assert_eq!(p.top, 9, "{method:?}"),
            Method::Lowest(_) | Method::BestFit => assert!(p.top >= 10, "{method:?}: {}", p.top),
        }
    }
    assert_eq!(best(&blocks), (Method::Skyline(Order::Size), place(&blocks, Method::Skyline(Order::Size))));
}

#[test]
fn best_fit_in_time_reaches_the_peak_where_the_offline_orders_do_not() {
    // Peak 8 (d and e at op 7). Every order places e, f and g (the
    // largest) at 0 first, then b and a beside each other below e's
    // offsets; c and d, live with both, end on top at 9. Best fit in time
    // puts d where a was, so that b and c free a stretch of 5 below e's
    // top, which e extends: 8.
    let (a, b, c, d) = (life(0, 3, 2), life(1, 6, 3), life(2, 5, 2), life(4, 8, 2));
    let (e, f, g) = (life(7, 9, 6), life(10, 11, 6), life(12, 13, 5));
    let blocks = [a, b, c, d, e, f, g];
    for method in Method::ALL {
        let p = place(&blocks, method);
        assert_eq!(first_conflict(&blocks, &p), None, "{method:?}");
        match method {
            Method::BestFit => assert_eq!(p.top, 8),
            _ => assert!(p.top >= 9, "{method:?}: {}", p.top),
        }
    }
    let p = place(&blocks, Method::BestFit);
    assert_eq!((p.offsets[0], p.offsets[3], p.offsets[4]), (0, 0, 2), "d where a was, e over b and c");
    assert_eq!(best(&blocks), (Method::BestFit, p));
}

/// Fixed blocks at or above `low` (nothing in `place_around` asks them to
/// lie below it): no method puts a block over one. Before, the skylines
/// and the best fit placed from `low` up without looking at them, and put
/// the block at 0, over the fixed one there, which `best_around` then
/// chose for its lower top.
#[test]
fn no_method_places_a_block_over_a_fixed_one_at_or_above_low() {
    let fixed = [(life(0, 10, 256), 0u64), (life(0, 10, 512), 1024)];
    let blocks = [life(1, 5, 256), life(2, 6, 768), life(3, 4, 256)];
    let all: Vec<Lifetime> = blocks.iter().copied().chain(fixed.iter().map(|&(f, _)| f)).collect();
    for low in [0, 256, 1024] {
        for method in Method::ALL {
            let p = place_around(&blocks, method, &fixed, low);
            let offsets = p.offsets.iter().copied().chain(fixed.iter().map(|&(_, o)| o)).collect();
            assert_eq!(
                first_conflict(&all, &Placement { offsets, top: 0 }),
                None,
                "{method:?} low {low}: {p:?}"
            );
        }
        let (method, p) = placement::best_around(&blocks, &fixed, low);
        let offsets = p.offsets.iter().copied().chain(fixed.iter().map(|&(_, o)| o)).collect();
        assert_eq!(first_conflict(&all, &Placement { offsets, top: 0 }), None, "best {method:?} low {low}");
    }
}

#[test]
fn blocks_placed_around_fixed_ones_go_below_low_only_where_they_end_by_it() {
    let mut rng = SplitMix64::new(11);
    for case in 0..if cfg!(miri) { 1 } else { 30 } {
        // Fixed blocks side by side below `low`, each busy for a while.
        let (mut fixed, mut low) = (Vec::new(), 0u64);
        for _ in 0..rng.below(4) + 1 {
            let size = (rng.below(8) + 1) * 256;
            let start = rng.below(40) as u32;
            fixed.push((life(start, start + rng.below(40) as u32 + 1, size), low));
            low += size;
        }
        let blocks: Vec<Lifetime> = (0..rng.below(if cfg!(miri) { 20 } else { 60 }) + 1)
            .map(|_| {
                let start = rng.below(80) as u32;
                life(start, start + rng.below(20) as u32 + 1, (rng.below(8) + 1) * 256)
            })
            .collect();
        let all: Vec<Lifetime> = blocks.iter().copied().chain(fixed.iter().map(|&(f, _)| f)).collect();
        for method in Method::ALL {
            let p = place_around(&blocks, method, &fixed, low);
            for (b, &o) in blocks.iter().zip(&p.offsets) {
                assert!(o >= low || o + b.size <= low, "case {case} {method:?}: {b:?} at {o} across {low}");
            }
            let offsets = p.offsets.iter().copied().chain(fixed.iter().map(|&(_, o)| o)).collect();
            assert_eq!(first_conflict(&all, &Placement { offsets, top: 0 }), None, "case {case} {method:?}");
            let end = blocks.iter().zip(&p.offsets).map(|(b, o)| o + b.size).max().unwrap();
            assert_eq!(p.top, end, "case {case} {method:?}");
        }
    }
}

#[test]
fn the_checker_finds_blocks_that_share_addresses_while_live() {
    let blocks = [life(0, 2, 512), life(1, 3, 512)];
    // Overlapping by 256 bytes: caught from either side.
    assert_eq!(first_conflict(&blocks, &Placement { offsets: vec![0, 256], top: 768 }), Some((0, 1)));
    assert_eq!(first_conflict(&blocks, &Placement { offsets: vec![256, 0], top: 768 }), Some((0, 1)));
    // Touching is fine; so is sharing addresses one after the other, and
    // blocks of no size or no life take nothing.
    assert_eq!(first_conflict(&blocks, &Placement { offsets: vec![0, 512], top: 1024 }), None);
    let apart = [life(0, 1, 512), life(2, 3, 512), life(1, 1, 512), life(0, 3, 0)];
    assert_eq!(first_conflict(&apart, &Placement { offsets: vec![0; 4], top: 512 }), None);
}

#[test]
fn random_sequences_are_placed_without_conflict_and_at_least_at_the_peak() {
    let mut rng = SplitMix64::new(7);
    for case in 0..if cfg!(miri) { 3 } else { 40 } {
        // A random sequence of allocations and frees, its peak live bytes.
        let (mut blocks, mut live, mut t) = (Vec::new(), Vec::new(), 0u32);
        let (mut now, mut peak) = (0u64, 0u64);
        // Under Miri, shorter sequences: each is placed twelve times.
        for _ in 0..rng.below(if cfg!(miri) { 40 } else { 300 }) + 1 {
            if !live.is_empty() && rng.below(2) == 0 {
                let i: usize = live.swap_remove(rng.below(live.len() as u64) as usize);
                let b: &mut Lifetime = &mut blocks[i];
                b.end = t;
                now -= b.size;
            } else {
                let size = ((rng.below(64) + 1) * 256) << rng.below(8);
                blocks.push(life(t, u32::MAX, size));
                live.push(blocks.len() - 1);
                now += size;
                peak = peak.max(now);
            }
            t += 1;
        }
        for order in Method::ALL {
            let p = place(&blocks, order);
            assert_eq!(first_conflict(&blocks, &p), None, "case {case} {order:?}");
            assert!(p.top >= peak, "case {case} {order:?}: {} < {peak}", p.top);
            let end = blocks.iter().zip(&p.offsets).map(|(b, o)| o + b.size).max().unwrap();
            assert_eq!(p.top, end, "case {case} {order:?}");
        }
        let (_, p) = best(&blocks);
        assert!(Method::ALL.iter().all(|&o| place(&blocks, o).top >= p.top), "case {case}");
    }
}

#[test]
fn lifetimes_users_write_wrong_are_placed_without_a_panic() {
    let odd = [life(5, 2, 256), life(0, u32::MAX, u64::MAX / 2), life(0, 1, u64::MAX / 2)];
    for order in Method::ALL {
        let p = place(&odd, order);
        assert!(p.top >= u64::MAX / 2);
        first_conflict(&odd, &p);
    }
    assert_eq!(first_conflict(&odd, &Placement { offsets: vec![], top: 0 }), None, "nothing to check");
}

// The adaptor.

/// One step of a script: allocate (a size) or free (the index of an
/// allocation of the step).
#[derive(Clone, Copy, Debug)]
enum Op {
    Alloc(u64),
    Free(usize),
}

/// Runs `script` as one step; returns the blocks left live.
fn run<R: MemoryResource + Inspect>(p: &Planned<R>, script: &[Op]) -> Vec<Option<Block>> {
    let mut blocks = Vec::new();
    for op in script {
        match *op {
            Op::Alloc(n) => blocks.push(Some(p.allocate(req(n), &()).unwrap())),
            Op::Free(i) => p.deallocate(blocks[i].take().unwrap(), &()).unwrap(),
        }
        p.check().unwrap();
    }
    blocks
}

/// Runs `script` as two recorded steps: the second repeats the first, so
/// the next `step` lays it out.
fn record_twice(p: &Planned<Statistics<BumpUpstream>>, script: &[Op]) {
    for _ in 0..2 {
        p.step(&()).unwrap();
        run(p, script);
    }
}

/// a, b; free a; c in a's place: every block freed in the step.
const FREED: [Op; 6] =
    [Op::Alloc(MIB), Op::Alloc(3 * MIB), Op::Free(0), Op::Alloc(MIB / 2), Op::Free(1), Op::Free(2)];

/// The same, and a 4 KiB block that outlives the step.
const STEP: [Op; 7] = [
    Op::Alloc(MIB),
    Op::Alloc(3 * MIB),
    Op::Free(0),
    Op::Alloc(MIB / 2),
    Op::Free(1),
    Op::Alloc(4096),
    Op::Free(2),
];

#[test]
fn a_repeating_step_asks_the_upstream_only_for_what_outlives_it() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    let mut kept = Vec::new();
    for _ in 0..2 {
        p.step(&()).unwrap();
        kept.extend(run(&p, &STEP).into_iter().flatten());
    }
    assert_eq!(upstream_allocations(&p), 8, "the first two steps are the upstream's");
    for i in 0..4 {
        p.step(&()).unwrap();
        let before = upstream_allocations(&p);
        kept.extend(run(&p, &STEP).into_iter().flatten());
        // The 4 KiB block outlives its step: always from upstream.
        assert_eq!(upstream_allocations(&p) - before, 1, "step {i}");
    }
    let s = p.steps();
    assert_eq!((s.steps, s.plans, s.followed, s.planned_allocations), (6, 1, 3, 12));
    // c fits in a's place: the region is b's and a's, not three blocks'.
    assert_eq!(s.region, 4 * MIB);
    // The upstream held the region and the blocks that outlived steps.
    let held = p.upstream().upstream().usage().held;
    assert_eq!(held, 4 * MIB + 6 * 4096);
    for b in kept {
        p.deallocate(b, &()).unwrap();
    }
    assert_eq!(p.usage().used, 0);
    assert_eq!(p.usage().held, 4 * MIB, "the region stays for the next step");
    p.check().unwrap();
}

#[test]
fn a_step_that_departs_from_its_plan_goes_upstream_and_is_planned_again() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    record_twice(&p, &FREED);
    p.step(&()).unwrap();
    run(&p, &FREED);
    assert_eq!(p.steps().planned_allocations, 3);
    // The third allocation asks for more than planned: it and the rest of
    // the step come from upstream.
    p.step(&()).unwrap();
    let before = upstream_allocations(&p);
    let other =
        [Op::Alloc(MIB), Op::Alloc(3 * MIB), Op::Free(0), Op::Alloc(2 * MIB), Op::Free(1), Op::Free(2)];
    run(&p, &other);
    assert_eq!(upstream_allocations(&p) - before, 1, "only the departing allocation");
    assert_eq!(p.steps().planned_allocations, 5);
    // A step that leaves its plan is not recorded (what followed the plan
    // was not), so the next two are, and the one after them is planned:
    // the 2 MiB block is live with b, so it goes beside b, and a under it.
    p.step(&()).unwrap();
    assert_eq!(p.steps().region, 0, "the region goes back with its plan");
    for _ in 0..2 {
        let before = upstream_allocations(&p);
        run(&p, &other);
        assert_eq!(upstream_allocations(&p) - before, 3, "recorded from upstream");
        p.step(&()).unwrap();
    }
    assert_eq!(p.steps().plans, 2);
    assert_eq!(p.steps().region, 5 * MIB);
    let before = upstream_allocations(&p);
    run(&p, &other);
    assert_eq!(upstream_allocations(&p) - before, 0);
    p.step(&()).unwrap();
    assert_eq!(p.steps().followed, 2);
    assert_eq!(p.usage().used, 0);
    assert_eq!(p.upstream().upstream().usage().held, 5 * MIB, "the first region went back");
    p.check().unwrap();
}

#[test]
fn a_planned_block_still_live_at_the_step_end_keeps_the_next_step_unplanned() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    record_twice(&p, &[Op::Alloc(MIB), Op::Free(0)]);
    p.step(&()).unwrap();
    let left = run(&p, &[Op::Alloc(MIB)]);
    assert_eq!(p.steps().planned_allocations, 1);
    p.step(&()).unwrap();
    let before = upstream_allocations(&p);
    let b = p.allocate(req(MIB), &()).unwrap();
    assert_eq!(upstream_allocations(&p) - before, 1, "the region is not free");
    p.deallocate(b, &()).unwrap();
    p.deallocate(left[0].unwrap(), &()).unwrap();
    // That step repeated the last recorded one: planned again at once.
    p.step(&()).unwrap();
    run(&p, &[Op::Alloc(MIB), Op::Free(0)]);
    assert_eq!(p.steps().planned_allocations, 2, "planned again once the region is free");
    p.check().unwrap();
}

#[test]
fn a_region_block_is_freed_with_its_own_tag_or_by_its_address_alone() {
    // Three blocks live at once, all laid out in the region: each with a
    // tag of its own, which names its slot.
    let script = [Op::Alloc(MIB), Op::Alloc(MIB), Op::Alloc(MIB), Op::Free(0), Op::Free(1), Op::Free(2)];
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    record_twice(&p, &script);
    p.step(&()).unwrap();
    let [a, b, c] = [(); 3].map(|_| p.allocate(req(MIB), &()).unwrap());
    assert_eq!(p.steps().planned_allocations, 3);
    let tags = [a.tag(), b.tag(), c.tag()];
    assert!(tags[0] != tags[1] && tags[1] != tags[2] && tags[0] != tags[2], "{tags:?}");
    assert!(!tags.contains(&Block::NO_TAG));
    // a with b's tag, b with a tag no block has: refused, nothing changed.
    for wrong in [Block::new(a.addr(), MIB, b.tag()), Block::new(b.addr(), MIB, 12345)] {
        assert_eq!(p.deallocate(wrong, &()), Err(Error::UnknownBlock { addr: wrong.addr() }));
    }
    assert_eq!(p.usage().used, 3 * MIB);
    p.check().unwrap();
    // Each with its own tag, c by its address alone.
    p.deallocate(a, &()).unwrap();
    assert_eq!(p.deallocate(a, &()), Err(Error::UnknownBlock { addr: a.addr() }), "a is gone");
    p.deallocate(b, &()).unwrap();
    p.deallocate(Block::from_addr(c.addr(), MIB), &()).unwrap();
    assert_eq!(p.usage().used, 0);
    p.check().unwrap();
    // The step followed its plan: the next one is served from it again.
    p.step(&()).unwrap();
    assert_eq!(p.steps().followed, 1);
}

#[test]
fn a_stale_block_whose_place_was_served_again_is_a_double_free() {
    // Every planned step serves the same slots at the same addresses: the
    // block of the step before is told from this step's by its tag.
    let script = [Op::Alloc(1000), Op::Alloc(3000), Op::Free(0), Op::Free(1)];
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    record_twice(&p, &script);
    p.step(&()).unwrap();
    let old = run(&p, &[Op::Alloc(1000)])[0].unwrap();
    let other = p.allocate(req(3000), &()).unwrap();
    p.deallocate(old, &()).unwrap();
    p.deallocate(other, &()).unwrap();
    p.step(&()).unwrap();
    let new = p.allocate(req(1000), &()).unwrap();
    let other = p.allocate(req(3000), &()).unwrap();
    assert_eq!(p.steps().planned_allocations, 4);
    assert_eq!(new.addr(), old.addr(), "the same place");
    let used = p.usage().used;
    assert_eq!(p.deallocate(old, &()), Err(Error::DoubleFree { addr: old.addr() }));
    assert_eq!(p.usage().used, used, "nothing changed");
    p.check().unwrap();
    p.deallocate(new, &()).unwrap();
    p.deallocate(other, &()).unwrap();
    assert_eq!(p.usage().used, 0);
}

#[test]
fn a_block_freed_twice_in_its_step_after_its_place_was_served_again_is_a_double_free() {
    // Three allocations in turn at one place: the tag tells the second
    // from the first within the step (it told steps apart only, so the
    // second free of `a` freed `b`, and `c` was placed over it).
    let script = [Op::Alloc(MIB), Op::Free(0), Op::Alloc(MIB), Op::Free(1), Op::Alloc(MIB), Op::Free(2)];
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    record_twice(&p, &script);
    p.step(&()).unwrap();
    let a = p.allocate(req(MIB), &()).unwrap();
    p.deallocate(a, &()).unwrap();
    let b = p.allocate(req(MIB), &()).unwrap();
    assert_eq!((b.addr(), p.steps().planned_allocations), (a.addr(), 2), "the same place, from the plan");
    let used = p.usage().used;
    assert_eq!(p.deallocate(a, &()), Err(Error::DoubleFree { addr: a.addr() }));
    assert_eq!(p.usage().used, used, "b is still live");
    p.check().unwrap();
    let c = p.allocate(req(MIB), &()).unwrap();
    assert!(c.addr() + MIB <= b.addr() || b.addr() + MIB <= c.addr(), "c is not placed over b");
    p.deallocate(b, &()).unwrap();
    p.deallocate(c, &()).unwrap();
    assert_eq!(p.usage().used, 0);
    p.check().unwrap();
}

/// What the layer's checker says of `p` with its state changed by
/// `change`; `undo` takes the change back, and the checker passes again.
fn checked_with<R>(
    p: &Planned<R>,
    change: impl FnOnce(&mut State<R>),
    undo: impl FnOnce(&mut State<R>),
) -> Violation {
    p.state.with(change);
    let got = p.check_layer();
    p.state.with(undo);
    p.check_layer().expect("the state is whole again");
    got.expect_err("the checker finds the change")
}

/// The layer's checker runs over an upstream without one (a built
/// stack's, behind `DynResource`) and finds each count, table and region
/// of the state put out of step with the rest.
#[test]
fn the_layer_checker_needs_no_upstream_checker_and_finds_a_broken_count_plan_or_region() {
    let up: crate::DynResource = alloc::sync::Arc::new(BumpUpstream::new(1 << 30));
    let p = Planned::new(up);
    let mut grads = Vec::new();
    for _ in 0..4 {
        train_step(&p, &mut grads);
        p.check_layer().unwrap();
    }
    // A block live in each region: the first activation, the gradients.
    p.step(&()).unwrap();
    let act = p.allocate(req(4 * MIB), &()).unwrap();
    let s = p.steps();
    assert!(s.region > 0 && s.carry_region > 0 && s.planned_allocations > 0);
    p.check_layer().unwrap();
    let what = |v: Violation| v.what();
    let miscounted = "planned blocks in use miscounted";
    assert_eq!(what(checked_with(&p, |s| s.live_bytes += UNIT, |s| s.live_bytes -= UNIT)), miscounted);
    assert_eq!(what(checked_with(&p, |s| s.live_count -= 1, |s| s.live_count += 1)), miscounted);
    assert_eq!(what(checked_with(&p, |s| s.overdue += 1, |s| s.overdue -= 1)), miscounted);
    // A mark past the plan's entries is found, not read (it panicked).
    let past = p.state.with(|s| s.plan.entries.len() as u32 + 5);
    let slot = p.state.with(|s| s.slot_live.iter().position(|&l| l != 0).unwrap());
    let mark = p.state.with(|s| s.slot_live[slot]);
    assert_eq!(
        what(checked_with(&p, |s| s.slot_live[slot] = past, |s| s.slot_live[slot] = mark)),
        "a live slot names no entry of the plan"
    );
    assert_eq!(
        what(checked_with(&p, |s| s.slot_live.push(0), |s| s.slot_live.truncate(s.slot_live.len() - 1))),
        "a table of live slots not one per slot of the plan"
    );
    assert_eq!(
        what(checked_with(&p, |s| s.recording = true, |s| s.recording = false)),
        "following an empty plan, or recording a step that follows one"
    );
    let region = p.state.with(|s| s.region);
    assert_eq!(
        what(checked_with(&p, |s| s.region.size = UNIT, |s| s.region = region)),
        "a planned offset past the region's end"
    );
    assert_eq!(
        what(checked_with(&p, |s| s.region.size = region.block.size() + UNIT, |s| s.region = region)),
        "a region longer than its block or than a request"
    );
    let carry = p.state.with(|s| s.carry.region);
    assert_eq!(
        what(checked_with(&p, |s| s.carry.region = region, |s| s.carry.region = carry)),
        "the step's region and the carry region overlap"
    );
    let (grad, (_, was, _)) = p.state.with(|s| s.carry.live.iter().map(|(&o, &b)| (o, b)).next().unwrap());
    let asked = |s: &mut State<_>, n: u64| s.carry.live.get_mut(&grad).unwrap().1 = n;
    assert_eq!(
        what(checked_with(&p, |s| asked(s, was + UNIT), |s| asked(s, was))),
        "blocks in the carry region overlap, leave it or miscount"
    );
    p.deallocate(act, &()).unwrap();
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    p.check_layer().unwrap();
}

#[test]
fn a_stale_block_of_the_carry_region_is_a_double_free() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    let mut grads = Vec::new();
    let mut stale = Vec::new();
    for _ in 0..4 {
        stale = grads.clone();
        train_step(&p, &mut grads);
    }
    // The gradients of the last two steps were served from the carry
    // region, at the same places.
    assert!(p.steps().carry_region > 0);
    let addrs = |b: &[Block]| b.iter().map(Block::addr).collect::<Vec<_>>();
    assert_eq!(addrs(&stale), addrs(&grads));
    let used = p.usage().used;
    for &g in &stale {
        assert_eq!(p.deallocate(g, &()), Err(Error::DoubleFree { addr: g.addr() }));
    }
    assert_eq!(p.usage().used, used, "nothing changed");
    p.check().unwrap();
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    assert_eq!(p.usage().used, 0);
}

/// A stream that runs what another thread does meanwhile, one call after
/// the other: at each `synchronize` (and `synchronize_device`, where it
/// can wait for the device), and where [`Reuses`] lets it run.
struct Meanwhile<'a> {
    id: u64,
    calls: core::cell::RefCell<alloc::collections::VecDeque<alloc::boxed::Box<dyn FnOnce() + 'a>>>,
    device: bool,
}

impl<'a> Meanwhile<'a> {
    fn new(id: u64) -> Self {
        Meanwhile { id, calls: Default::default(), device: false }
    }

    /// One that can wait for the whole device.
    fn waits_for_the_device(self) -> Self {
        Meanwhile { device: true, ..self }
    }

    /// With `f` to run after the calls given before.
    fn then(self, f: impl FnOnce() + 'a) -> Self {
        self.calls.borrow_mut().push_back(alloc::boxed::Box::new(f));
        self
    }

    /// Runs the next call, if any is left.
    fn now(&self) {
        let next = self.calls.borrow_mut().pop_front();
        if let Some(f) = next {
            f();
        }
    }
}

impl Stream for Meanwhile<'_> {
    type Event = ();
    fn id(&self) -> u64 {
        self.id
    }
    fn record(&self) -> Result<()> {
        Ok(())
    }
    fn wait(&self, _: &()) -> Result<()> {
        Ok(())
    }
    fn query(&self, _: &()) -> Result<bool> {
        Ok(true)
    }
    fn synchronize(&self) -> Result<()> {
        self.now();
        Ok(())
    }
    fn synchronize_device(&self) -> Result<bool> {
        if self.device {
            self.now();
        }
        Ok(self.device)
    }
}

/// An upstream of addresses alone (a safe one) that hands out the address
/// freed last first, as a pool may; it lets the stream's next call run
/// before an allocation and after a free.
struct Reuses {
    next: core::cell::Cell<u64>,
    freed: core::cell::Cell<Option<u64>>,
    held: core::cell::Cell<u64>,
}

impl Reuses {
    fn new() -> Self {
        Reuses { next: (1 << 30).into(), freed: None.into(), held: 0.into() }
    }
}

impl MemoryResource<Meanwhile<'_>> for Reuses {
    fn allocate(&self, request: Request, stream: &Meanwhile<'_>) -> Result<Block> {
        stream.now();
        let at = self.freed.take().unwrap_or_else(|| self.next.replace(self.next.get() + (1 << 30)));
        self.held.set(self.held.get() + request.size());
        Ok(Block::from_addr(at, request.size()))
    }
    fn deallocate(&self, block: Block, stream: &Meanwhile<'_>) -> Result<()> {
        self.held.set(self.held.get() - block.size());
        self.freed.set(Some(block.addr()));
        stream.now();
        Ok(())
    }
}

impl Inspect for Reuses {
    fn usage(&self) -> Usage {
        let held = self.held.get();
        Usage::new(held, held, held, 0)
    }
    fn check(&self) -> core::result::Result<(), Violation> {
        Ok(())
    }
}

#[test]
fn a_carried_block_freed_twice_at_once_leaves_its_successor_live() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    let mut grads = Vec::new();
    for _ in 0..4 {
        train_step(&p, &mut grads);
    }
    assert!(p.steps().carry_region > 0);
    let (g, rest) = (grads[0], grads[1]);
    let successor = core::cell::Cell::new(None);
    // A free on another stream waits for it; meanwhile another thread
    // frees the same block, the next step begins and g's successor is
    // served in its place.
    let other = Meanwhile::new(7).then(|| {
        p.deallocate(g, &()).unwrap();
        p.step(&()).unwrap();
        let act = p.allocate(req(4 * MIB), &()).unwrap();
        let act2 = p.allocate(req(2 * MIB), &()).unwrap();
        p.deallocate(rest, &()).unwrap();
        successor.set(Some(p.allocate(req(MIB), &()).unwrap()));
        p.deallocate(act2, &()).unwrap();
        p.deallocate(act, &()).unwrap();
    });
    assert_eq!(p.deallocate(g, &other), Err(Error::UnknownBlock { addr: g.addr() }));
    let successor = successor.get().unwrap();
    assert_eq!(successor.addr(), g.addr(), "in g's place");
    assert_eq!(p.usage().used, MIB, "the successor is live");
    p.check().unwrap();
    p.deallocate(successor, &()).unwrap();
    assert_eq!(p.usage().used, 0);
}

/// As in [`a_carried_block_whose_spare_regions_free_panics_takes_no_place`],
/// but while the spare region goes back, the block of the call, not handed
/// out yet, is freed by its address alone (the free of a stale copy), and
/// the next step's block is served in its place.
#[test]
fn a_carried_block_whose_spare_regions_free_panics_leaves_the_block_served_in_its_place_live() {
    let p = Planned::new(Reuses::new());
    let quiet = Meanwhile::new(0);
    let mut grads: Vec<Block> = Vec::new();
    for _ in 0..2 {
        p.step(&quiet).unwrap();
        for g in grads.drain(..) {
            p.deallocate(g, &quiet).unwrap();
        }
        grads = [MIB, MIB + 1000].iter().map(|&n| p.allocate(req(n), &quiet).unwrap()).collect();
    }
    p.step(&quiet).unwrap();
    for g in grads.drain(..) {
        p.deallocate(g, &quiet).unwrap();
    }
    // The first gradient's call takes the carry region; meanwhile the
    // second one's takes one too and serves from it first.
    let (second, successor) = (core::cell::Cell::new(None), core::cell::Cell::new(None));
    let first = Meanwhile::new(0)
        .then(|| second.set(Some(p.allocate(req(MIB + 1000), &quiet).unwrap())))
        .then(|| {
            let at = second.get().unwrap().addr() - MIB;
            p.deallocate(Block::from_addr(at, MIB), &quiet).unwrap();
            p.step(&quiet).unwrap();
            successor.set(Some(p.allocate(req(MIB), &quiet).unwrap()));
            panic!("the spare region's free panics");
        });
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.allocate(req(MIB), &first)));
    assert!(r.is_err());
    let successor = successor.get().unwrap();
    assert_eq!(successor.addr(), second.get().unwrap().addr() - MIB);
    assert_eq!(p.usage().used, MIB + (MIB + 1024), "the successor and the second gradient");
    p.check().unwrap();
    p.deallocate(successor, &quiet).unwrap();
    assert_eq!(p.usage().used, MIB + 1024);
}

#[test]
fn bad_frees_are_refused_and_change_nothing() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    record_twice(&p, &[Op::Alloc(MIB), Op::Alloc(MIB), Op::Free(0), Op::Free(1)]);
    p.step(&()).unwrap();
    run(&p, &[Op::Alloc(MIB), Op::Alloc(MIB), Op::Free(0), Op::Free(1)]);
    p.step(&()).unwrap();
    let a = p.allocate(req(MIB), &()).unwrap();
    assert_eq!(p.steps().planned_allocations, 3);
    let used = p.usage().used;
    let inside = Block::from_addr(a.addr() + 256, 256);
    assert_eq!(p.deallocate(inside, &()), Err(Error::UnknownBlock { addr: a.addr() + 256 }));
    let wrong = Block::from_addr(a.addr(), 512);
    assert_eq!(
        p.deallocate(wrong, &()),
        Err(Error::SizeMismatch { addr: a.addr(), expected: MIB, given: 512 })
    );
    // A size that rounds as the block's did is another size too.
    let wrong = Block::new(a.addr(), MIB - 1, a.tag());
    assert_eq!(
        p.deallocate(wrong, &()),
        Err(Error::SizeMismatch { addr: a.addr(), expected: MIB, given: MIB - 1 })
    );
    // A size whose rounding overflows (`div_ceil(UNIT) * UNIT` panicked).
    let wrong = Block::new(a.addr(), u64::MAX, a.tag());
    assert_eq!(
        p.deallocate(wrong, &()),
        Err(Error::SizeMismatch { addr: a.addr(), expected: MIB, given: u64::MAX })
    );
    assert_eq!(p.usage().used, used);
    p.check().unwrap();
    p.deallocate(a, &()).unwrap();
    assert_eq!(p.deallocate(a, &()), Err(Error::UnknownBlock { addr: a.addr() }), "a double free");
    assert_eq!(p.usage().used, 0);
    p.check().unwrap();
}

#[test]
fn a_region_the_upstream_refuses_leaves_the_steps_recorded_until_it_can_be_had() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    record_twice(&p, &FREED);
    p.upstream().upstream().fail_after(0);
    p.step(&()).unwrap();
    assert_eq!((p.steps().plans, p.steps().region), (0, 0));
    assert!(p.allocate(req(MIB), &()).is_err());
    assert_eq!((p.usage().used, p.usage().held), (0, 0));
    p.upstream().upstream().fail_after(u64::MAX);
    // Recorded again (with its failed allocation), and again: planned.
    run(&p, &FREED);
    record_twice(&p, &FREED);
    p.step(&()).unwrap();
    assert_eq!((p.steps().plans, p.steps().region), (1, 4 * MIB));
    p.check().unwrap();
}

#[test]
fn a_failed_allocation_takes_no_place_in_the_plan() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    for _ in 0..2 {
        p.step(&()).unwrap();
        run(&p, &[Op::Alloc(MIB), Op::Free(0)]);
        p.upstream().upstream().fail_after(0);
        assert!(p.allocate(req(8 * MIB), &()).is_err());
        p.upstream().upstream().fail_after(u64::MAX);
    }
    p.step(&()).unwrap();
    assert_eq!((p.steps().plans, p.steps().region), (1, MIB));
    // It is part of the step as recorded: asked again, it goes upstream.
    run(&p, &[Op::Alloc(MIB), Op::Free(0)]);
    let b = p.allocate(req(8 * MIB), &()).unwrap();
    p.deallocate(b, &()).unwrap();
    p.step(&()).unwrap();
    assert_eq!((p.steps().followed, p.steps().planned_allocations), (1, 1));
    p.check().unwrap();
}

#[test]
fn only_the_steps_stream_is_planned_and_a_free_elsewhere_waits_for_its_stream() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    let (s1, s2) = (TestStream::new(1), TestStream::new(2));
    let two = |p: &Planned<Statistics<BumpUpstream>>| {
        let a = p.allocate(req(MIB), &s1).unwrap();
        let b = p.allocate(req(MIB), &s2).unwrap();
        p.deallocate(b, &s2).unwrap();
        p.deallocate(a, &s1).unwrap();
    };
    for _ in 0..2 {
        p.step(&s1).unwrap();
        two(&p);
    }
    p.step(&s1).unwrap();
    let before = upstream_allocations(&p);
    two(&p);
    assert_eq!(upstream_allocations(&p) - before, 1, "s2's block from upstream");
    assert_eq!(p.steps().region, MIB);
    // A region block freed on s2 waits for s2 before its bytes are reused.
    let other_free = |p: &Planned<Statistics<BumpUpstream>>, fail: bool| {
        p.step(&s1).unwrap();
        let a = p.allocate(req(MIB), &s1).unwrap();
        let b = p.allocate(req(MIB), &s2).unwrap();
        p.deallocate(b, &s2).unwrap();
        let (syncs, failed) = (s2.faults().syncs(), s2.faults().failed_syncs());
        s2.faults().set_failing(fail);
        if fail {
            // A failed wait frees nothing.
            assert!(p.deallocate(a, &s2).is_err());
            assert_eq!(p.usage().used, MIB);
            s2.faults().set_failing(false);
        }
        p.deallocate(a, &s2).unwrap();
        assert_eq!(s2.faults().syncs(), syncs + 1);
        assert_eq!(s2.faults().failed_syncs(), failed + u64::from(fail));
        assert_eq!(p.usage().used, 0);
    };
    other_free(&p, false);
    other_free(&p, true);
    assert_eq!(p.steps().planned_allocations, 3);
    p.check().unwrap();
}

#[test]
fn before_the_first_step_nothing_is_recorded_and_the_region_goes_back_at_drop() {
    let up = Statistics::new(BumpUpstream::new(1 << 30));
    {
        let p = Planned::new(&up);
        for _ in 0..3 {
            let b = p.allocate(req(MIB), &()).unwrap();
            p.deallocate(b, &()).unwrap();
        }
        assert_eq!(p.steps(), Steps::default());
        for _ in 0..3 {
            p.step(&()).unwrap();
            let b = p.allocate(req(MIB), &()).unwrap();
            p.deallocate(b, &()).unwrap();
        }
        assert_eq!(up.usage().held, MIB);
    }
    assert_eq!(up.usage().held, 0);
}

/// Steps that repeat with random departures: every live block apart from
/// every other, the checker after each op, nothing lost at the end.
#[test]
fn randomized_steps_never_hand_out_overlapping_blocks() {
    let mut rng = SplitMix64::new(11);
    let (mut planned_cases, mut carry_cases) = (0, 0);
    let cases = if cfg!(miri) { 2 } else { 20 };
    for case in 0..cases {
        let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 40)));
        let script: Vec<u64> = (0..rng.below(40) + 2).map(|_| (rng.below(4096) + 1) * 256).collect();
        let mut live: BTreeMap<u64, u64> = BTreeMap::new();
        let mut carried: Vec<Block> = Vec::new();
        let carry_early = case % 2 == 0;
        let take = |live: &mut BTreeMap<u64, u64>, b: Block| {
            let end = b.addr() + b.size().max(1);
            assert!(live.range(..end).next_back().is_none_or(|(&a, &n)| a + n <= b.addr()), "case {case}");
            live.insert(b.addr(), b.size().max(1));
        };
        for step in 0..12 {
            p.step(&()).unwrap();
            // Blocks carried from the step before are freed at its start
            // (before their successors come) or at its end.
            if carry_early {
                for b in carried.drain(..) {
                    live.remove(&b.addr());
                    p.deallocate(b, &()).unwrap();
                }
            }
            let mut blocks: Vec<Block> = Vec::new();
            let depart = rng.below(4) == 0;
            for (i, &size) in script.iter().enumerate() {
                let size = if depart && rng.below(8) == 0 { size + 256 } else { size };
                let b = p.allocate(req(size), &()).unwrap();
                take(&mut live, b);
                blocks.push(b);
                // Free an earlier block now and then; which one moves a
                // little in departing steps.
                if i % 3 == 2 {
                    let j = if depart { rng.below(blocks.len() as u64) as usize } else { i - 1 };
                    let b = core::mem::take(&mut blocks[j]);
                    if !b.is_empty() || b.addr() != 0 {
                        live.remove(&b.addr());
                        p.deallocate(b, &()).unwrap();
                    }
                }
                p.check().unwrap();
            }
            // Most blocks end with the step; some live into the next (the
            // same ones while the step repeats).
            for (i, b) in blocks.into_iter().enumerate().filter(|(_, b)| b.addr() != 0) {
                if if depart { rng.below(4) == 0 } else { i % 4 == 1 } {
                    carried.push(b);
                } else {
                    live.remove(&b.addr());
                    p.deallocate(b, &()).unwrap();
                }
            }
            if !carry_early && step % 2 == 1 {
                for b in carried.drain(..) {
                    live.remove(&b.addr());
                    p.deallocate(b, &()).unwrap();
                }
            }
            p.check().unwrap();
        }
        for b in carried.drain(..) {
            p.deallocate(b, &()).unwrap();
        }
        assert_eq!(p.usage().used, 0, "case {case}");
        let s = p.steps();
        assert_eq!(p.upstream().upstream().usage().held, s.region + s.carry_region, "case {case}");
        planned_cases += u32::from(p.steps().planned_allocations > 0);
        carry_cases += u32::from(p.steps().carry_region > 0);
    }
    assert!(planned_cases * 2 >= cases, "only {planned_cases} of {cases} cases were ever planned");
    assert!(carry_cases * 4 >= cases, "only {carry_cases} of {cases} cases carried blocks in a region");
}

#[test]
fn a_block_freed_later_than_planned_is_never_placed_over() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    // Recorded: a freed before b is allocated, so both are planned at 0.
    let script = [Op::Alloc(MIB), Op::Free(0), Op::Alloc(MIB), Op::Free(1)];
    record_twice(&p, &script);
    p.step(&()).unwrap();
    run(&p, &script);
    assert_eq!((p.steps().region, p.steps().planned_allocations), (MIB, 2));
    // Now a is still live when b comes: b goes upstream, elsewhere.
    p.step(&()).unwrap();
    let before = upstream_allocations(&p);
    let a = p.allocate(req(MIB), &()).unwrap();
    let b = p.allocate(req(MIB), &()).unwrap();
    assert_eq!(upstream_allocations(&p) - before, 1);
    assert!(b.addr() >= a.addr() + MIB || b.addr() + MIB <= a.addr(), "{a:?} {b:?}");
    p.check().unwrap();
    p.deallocate(a, &()).unwrap();
    p.deallocate(b, &()).unwrap();
    assert_eq!(p.usage().used, 0);
    p.check().unwrap();
}

#[test]
fn a_region_goes_back_on_another_stream_only_when_the_device_can_be_waited_for() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    let s1 = TestStream::new(1);
    for _ in 0..3 {
        p.step(&s1).unwrap();
        let a = p.allocate(req(MIB), &s1).unwrap();
        p.deallocate(a, &s1).unwrap();
    }
    assert_eq!(p.steps().region, MIB);
    // The next step is on a stream that cannot wait for the device: the
    // region, in use on s1 until then, stays held.
    let blind = TestStream::new(2);
    p.step(&blind).unwrap();
    assert_eq!(p.steps().region, MIB);
    assert_eq!(p.upstream().upstream().usage().held, MIB);
    // One that can: the device is waited for, then the region goes back.
    let seeing = TestStream::new(3).device_sync(true);
    p.step(&seeing).unwrap();
    assert_eq!(seeing.faults().device_syncs(), 1);
    assert_eq!((p.steps().region, p.upstream().upstream().usage().held), (0, 0));
    p.check().unwrap();
}

// Blocks carried into the next step.

/// A training step on `stream`: the gradients of the step before are
/// freed after the forward pass (as `zero_grad` after the loss), the new
/// ones, of `sizes`, are allocated in backward (the second activation
/// freed after the first) and live into the next step.
fn grads_step<S: Stream + ?Sized, U: MemoryResource<S>>(
    p: &Planned<U>,
    stream: &S,
    grads: &mut Vec<Block>,
    sizes: &[u64],
) {
    p.step(stream).unwrap();
    let act = p.allocate(req(4 * MIB), stream).unwrap();
    let act2 = p.allocate(req(2 * MIB), stream).unwrap();
    for g in grads.drain(..) {
        p.deallocate(g, stream).unwrap();
    }
    let mut act2 = Some(act2);
    for &n in sizes {
        grads.push(p.allocate(req(n), stream).unwrap());
        if let Some(b) = act2.take() {
            p.deallocate(b, stream).unwrap();
        }
    }
    if let Some(b) = act2 {
        p.deallocate(b, stream).unwrap();
    }
    p.deallocate(act, stream).unwrap();
}

/// [`grads_step`] with two gradients, on `()`.
fn train_step<U: MemoryResource<()>>(p: &Planned<U>, grads: &mut Vec<Block>) {
    grads_step(p, &(), grads, &[MIB, MIB + 1000]);
}

/// Four training steps through `p`, their gradients then freed: both
/// regions held, laid out, no block live.
fn four_steps_freed<U: MemoryResource<()>>(p: &Planned<U>) {
    let mut grads = Vec::new();
    for _ in 0..4 {
        train_step(p, &mut grads);
    }
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
}

#[test]
fn blocks_carried_into_the_next_step_get_a_region_taken_after_the_last_ones_are_freed() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    let mut grads = Vec::new();
    let mut asked = Vec::new();
    for _ in 0..8 {
        let before = upstream_allocations(&p);
        train_step(&p, &mut grads);
        p.check().unwrap();
        asked.push(upstream_allocations(&p) - before);
    }
    // Steps 1 and 2 are recorded; step 3 takes the step's region (at its
    // `step`) and the carry region (at its first gradient); nothing after.
    assert_eq!(asked, [4, 4, 2, 0, 0, 0, 0, 0]);
    let s = p.steps();
    assert_eq!((s.plans, s.followed, s.planned_allocations), (1, 5, 6 * 4));
    assert_eq!((s.region, s.carry_region), (6 * MIB, 2 * MIB + 1024));
    // The carry region came once the recorded step's gradients were
    // freed: never both at once, so the upstream's peak is the two
    // regions (taken at step 3's `step`, the gradients would have been
    // held twice: 2 MiB more).
    let bytes = p.upstream().get_bytes_counter();
    assert_eq!((bytes.peak, bytes.value), ((8 * MIB + 1024) as i64, (8 * MIB + 1024) as i64));
    assert_eq!(p.usage().used, 2 * MIB + 1024, "the gradients, rounded");
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    assert_eq!(p.usage().used, 0);
    p.check().unwrap();
}

#[test]
fn a_carried_block_still_live_when_its_successor_comes_is_never_placed_over() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    let mut grads = Vec::new();
    for _ in 0..4 {
        train_step(&p, &mut grads);
    }
    assert_eq!(p.steps().carry_region, 2 * MIB + 1024);
    // Gradients accumulate: last step's are not freed before the new ones.
    p.step(&()).unwrap();
    let act = p.allocate(req(4 * MIB), &()).unwrap();
    let act2 = p.allocate(req(2 * MIB), &()).unwrap();
    let before = upstream_allocations(&p);
    let g1 = p.allocate(req(MIB), &()).unwrap();
    p.deallocate(act2, &()).unwrap();
    let g2 = p.allocate(req(MIB + 1000), &()).unwrap();
    assert_eq!(upstream_allocations(&p) - before, 2, "both slots are taken: from upstream");
    for (new, old) in [(g1, grads[0]), (g2, grads[1])] {
        assert!(new.addr() + new.size() <= old.addr() || old.addr() + old.size() <= new.addr());
    }
    p.deallocate(act, &()).unwrap();
    p.check().unwrap();
    // The step still followed its plan, whose in-step blocks it repeated.
    let planned = p.steps().planned_allocations;
    for b in grads.drain(..).chain([g1, g2]) {
        p.deallocate(b, &()).unwrap();
    }
    train_step(&p, &mut grads);
    assert_eq!(p.steps().planned_allocations, planned + 4);
    assert_eq!(p.steps().followed, 3);
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    assert_eq!(p.usage().used, 0);
    p.check().unwrap();
}

#[test]
fn a_carry_region_the_upstream_refuses_sends_the_carried_blocks_upstream() {
    /// An upstream out of memory for requests of one size.
    struct Refusing(Statistics<BumpUpstream>, u64);
    impl MemoryResource<()> for Refusing {
        fn allocate(&self, request: Request, stream: &()) -> Result<Block> {
            if request.size() == self.1 {
                return Err(Error::OutOfMemory {
                    requested: self.1,
                    largest_free: 0,
                    pool_size: 0,
                    max_size: None,
                });
            }
            self.0.allocate(request, stream)
        }
        fn deallocate(&self, block: Block, stream: &()) -> Result<()> {
            self.0.deallocate(block, stream)
        }
    }
    impl Inspect for Refusing {
        fn usage(&self) -> Usage {
            self.0.usage()
        }
        fn check(&self) -> core::result::Result<(), Violation> {
            self.0.check()
        }
    }
    let p = Planned::new(Refusing(Statistics::new(BumpUpstream::new(1 << 30)), 2 * MIB + 1024));
    let (mut grads, mut asked_per_step) = (Vec::new(), Vec::new());
    for step in 0..6 {
        let before = p.upstream().0.get_allocations_counter().total;
        train_step(&p, &mut grads);
        p.check().unwrap();
        let asked = p.upstream().0.get_allocations_counter().total - before;
        asked_per_step.push(asked);
        assert_eq!(p.steps().carry_region, 0, "step {step}");
    }
    // Refused at each planned step (from the third on, asked again in
    // each): the gradients come from upstream, the activations from the
    // step's region (taken at the third step's `step`).
    assert_eq!(asked_per_step, [4, 4, 3, 2, 2, 2]);
    assert_eq!(p.steps().planned_allocations, 4 * 2, "steps 3 to 6: the activations");
    assert_eq!(p.usage().used, 2 * MIB + 1024);
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    assert_eq!(p.usage().used, 0);
    assert_eq!(p.upstream().0.upstream().usage().held, 6 * MIB, "the step's region");
    p.check().unwrap();
}

#[test]
fn the_carry_region_goes_back_with_its_plan_and_at_drop() {
    let up = Statistics::new(BumpUpstream::new(1 << 30));
    {
        let p = Planned::new(&up);
        let mut grads = Vec::new();
        for _ in 0..4 {
            train_step(&p, &mut grads);
        }
        assert_eq!(up.usage().held, 8 * MIB + 1024);
        // A step of other sizes departs; at its end both regions go back
        // (the gradients are freed in it).
        p.step(&()).unwrap();
        for g in grads.drain(..) {
            p.deallocate(g, &()).unwrap();
        }
        let b = p.allocate(req(3 * MIB), &()).unwrap();
        p.deallocate(b, &()).unwrap();
        p.step(&()).unwrap();
        assert_eq!((p.steps().region, p.steps().carry_region), (0, 0));
        assert_eq!(up.usage().held, 0);
        // Planned again, then dropped with the gradients freed.
        for _ in 0..4 {
            train_step(&p, &mut grads);
        }
        assert_eq!(p.steps().carry_region, 2 * MIB + 1024);
        for g in grads.drain(..) {
            p.deallocate(g, &()).unwrap();
        }
        p.check().unwrap();
    }
    assert_eq!(up.usage().held, 0);
}

#[test]
fn a_layout_still_in_use_when_the_steps_change_stays_until_its_blocks_are_freed() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    let mut grads = Vec::new();
    // Steps 1 and 2 repeat; steps 3 and 4 are planned.
    for _ in 0..4 {
        train_step(&p, &mut grads);
    }
    assert_eq!(p.steps().plans, 1);
    let carry = p.steps().carry_region;
    assert_eq!(carry, 2 * MIB + 1024);
    // Then the steps change shape (an extra block at the end): step 4
    // departs at it, with its gradients in the layout.
    let extra = |p: &Planned<Statistics<BumpUpstream>>| {
        let b = p.allocate(req(4096), &()).unwrap();
        p.deallocate(b, &()).unwrap();
    };
    extra(&p);
    let mut asked = Vec::new();
    for _ in 0..5 {
        let before = upstream_allocations(&p);
        train_step(&p, &mut grads);
        extra(&p);
        p.check().unwrap();
        asked.push(upstream_allocations(&p) - before);
    }
    // Step 5 is recorded, all 5 allocations from upstream, while step 4's
    // gradients live in the layout: it stays. Step 6 does not repeat step
    // 5 (which followed a departed step) and the layout, empty now, goes
    // with its region. Step 7 repeats step 6: planned from it, its own
    // region and the carry region taken again; step 8 and 9 ask for
    // nothing.
    assert_eq!(asked, [5, 5, 2, 0, 0]);
    assert_eq!(p.steps().plans, 2);
    assert_eq!(p.steps().carry_region, carry);
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    assert_eq!(p.usage().used, 0);
    let s = p.steps();
    assert_eq!(
        p.upstream().upstream().usage().held,
        s.region + s.carry_region,
        "the first regions went back"
    );
    p.check().unwrap();
}

/// A training step whose backward needs a 2 MiB scratch block before the
/// first gradient: `late` frees the last step's gradients after it
/// instead of before.
fn scratch_step<U: MemoryResource<()>>(p: &Planned<U>, grads: &mut Vec<Block>, late: bool) -> Block {
    p.step(&()).unwrap();
    let act = p.allocate(req(4 * MIB), &()).unwrap();
    if !late {
        for g in grads.drain(..) {
            p.deallocate(g, &()).unwrap();
        }
    }
    let scratch = p.allocate(req(2 * MIB), &()).unwrap();
    p.deallocate(scratch, &()).unwrap();
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    grads.push(p.allocate(req(MIB), &()).unwrap());
    grads.push(p.allocate(req(MIB + 1000), &()).unwrap());
    p.deallocate(act, &()).unwrap();
    scratch
}

#[test]
fn a_step_block_is_placed_where_the_carried_blocks_are_freed_until_they_come_again() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    let mut grads = Vec::new();
    for _ in 0..4 {
        scratch_step(&p, &mut grads, false);
        p.check().unwrap();
    }
    // The scratch block lies where the gradients were: the step's region
    // is the activation's alone.
    let s = p.steps();
    assert_eq!((s.plans, s.region, s.carry_region), (1, 4 * MIB, 2 * MIB + 1024));
    let before = upstream_allocations(&p);
    let scratch = scratch_step(&p, &mut grads, false);
    assert_eq!(upstream_allocations(&p) - before, 0);
    assert!(grads
        .iter()
        .all(|g| g.addr() <= scratch.addr() + 2 * MIB && scratch.addr() <= g.addr() + g.size()));
    assert!(grads[0].addr() == scratch.addr(), "the first gradient's slot starts the carry region");
    // Last step's gradients freed late: the scratch block is not placed
    // over them but comes from upstream, and the step goes on.
    let old = grads.clone();
    let before = upstream_allocations(&p);
    let scratch = scratch_step(&p, &mut grads, true);
    assert_eq!(upstream_allocations(&p) - before, 1, "the scratch block only");
    assert!(old
        .iter()
        .all(|g| scratch.addr() >= g.addr() + g.size() || scratch.addr() + 2 * MIB <= g.addr()));
    p.check().unwrap();
    // The next step is as planned again.
    let before = upstream_allocations(&p);
    scratch_step(&p, &mut grads, false);
    assert_eq!(upstream_allocations(&p) - before, 0);
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    assert_eq!(p.usage().used, 0);
    p.check().unwrap();
}

#[test]
fn regions_last_used_on_another_stream_serve_no_plan_where_the_device_cannot_be_waited_for() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    let step = |stream: &TestStream, grads: &mut Vec<Block>, sizes: &[u64]| {
        grads_step(&p, stream, grads, sizes);
        p.check().unwrap();
    };
    let (s1, blind) = (TestStream::new(1), TestStream::new(2));
    let mut grads = Vec::new();
    for _ in 0..4 {
        step(&s1, &mut grads, &[MIB, MIB]);
    }
    assert_eq!(p.steps().carry_region, 2 * MIB);
    // Then the steps run on a stream that cannot wait for the device,
    // with more gradients than the carry region holds. The regions' blocks
    // were freed on s1 without a wait (its steps' stream), so they may
    // still be in use there: the regions neither go back nor serve a plan
    // on this stream (the step's region, which fits, served one: s1's work
    // could still write what this stream's blocks were given), and every
    // step runs from upstream.
    let before = upstream_allocations(&p);
    for _ in 0..4 {
        step(&blind, &mut grads, &[MIB, MIB, MIB]);
    }
    let s = p.steps();
    assert_eq!((s.plans, s.carry_region), (1, 2 * MIB));
    assert_eq!(upstream_allocations(&p) - before, 4 * 5);
    for g in grads.drain(..) {
        p.deallocate(g, &blind).unwrap();
    }
    assert_eq!(p.usage().used, 0);
    p.check().unwrap();
}

/// The steps move to another stream with the regions kept: the plan on
/// the new stream is served from them only after the device is waited
/// for (it was not: the blocks freed on the first stream, its steps'
/// stream then, without a wait were handed to the second at once), and
/// the regions are the second stream's from then on.
#[test]
fn a_region_kept_for_steps_on_another_stream_serves_them_after_the_device_is_waited_for() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    let (s1, s2) = (TestStream::new(1).device_sync(true), TestStream::new(2).device_sync(true));
    let mut grads = Vec::new();
    for _ in 0..4 {
        grads_step(&p, &s1, &mut grads, &[MIB, MIB]);
    }
    let s = p.steps();
    assert_eq!((s.plans, s.followed), (1, 1));
    let held = (s.region, s.carry_region);
    let syncs = (s1.faults().device_syncs(), s2.faults().device_syncs());
    for _ in 0..4 {
        grads_step(&p, &s2, &mut grads, &[MIB, MIB]);
        p.check().unwrap();
    }
    let s = p.steps();
    assert_eq!((s.region, s.carry_region), held, "the same regions, kept");
    assert!(s.plans >= 2 && s.followed >= 2, "{s:?}");
    assert_eq!(s1.faults().device_syncs(), syncs.0);
    assert!(s2.faults().device_syncs() > syncs.1, "the device waited for before s2's plan");
    // A free on s2 into the regions needs no wait now, and they go back on
    // s2 with no device wait.
    let before = s2.faults().syncs();
    for g in grads.drain(..) {
        p.deallocate(g, &s2).unwrap();
    }
    assert_eq!(s2.faults().syncs(), before);
    let device = s2.faults().device_syncs();
    assert_eq!(p.release(&s2).unwrap(), held.0 + held.1);
    assert_eq!(s2.faults().device_syncs(), device);
    assert_eq!(p.usage().used, 0);
    p.check().unwrap();
}

/// The helper's sequence of a kept region: a block of the region freed on
/// the steps' stream s1 without a wait, then a plan on s2 in the same
/// region hands its bytes to s2 only after the device is waited for.
#[test]
fn a_block_freed_on_the_steps_stream_is_not_handed_to_the_next_streams_plan_before_the_device_is_waited_for()
{
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    let (s1, s2) = (TestStream::new(1).device_sync(true), TestStream::new(2).device_sync(true));
    for _ in 0..2 {
        p.step(&s1).unwrap();
        let b = p.allocate(req(MIB), &s1).unwrap();
        p.deallocate(b, &s1).unwrap();
    }
    p.step(&s1).unwrap();
    let x = p.allocate(req(MIB), &s1).unwrap();
    assert_eq!(p.steps().planned_allocations, 1, "x is the region's");
    // x lives past the step's end: the next step is recorded, and x is
    // freed in it on s1, the steps' stream, with no wait.
    p.step(&s1).unwrap();
    p.deallocate(x, &s1).unwrap();
    let y = p.allocate(req(MIB), &s1).unwrap();
    p.deallocate(y, &s1).unwrap();
    assert_eq!(s1.faults().syncs(), 0);
    let device = s2.faults().device_syncs();
    p.step(&s2).unwrap();
    let z = p.allocate(req(MIB), &s2).unwrap();
    assert_eq!(z.addr(), x.addr(), "s2's plan in the same region");
    assert!(s2.faults().device_syncs() > device, "x's bytes handed to s2 with no wait for s1");
    p.deallocate(z, &s2).unwrap();
    p.check().unwrap();
}

/// A block of a region taken on one stream, freed on the steps' stream
/// when that is another, waits for its stream: the region may go back on
/// the first without a device wait (it did not wait, and went back while
/// the free's work could still use it).
#[test]
fn a_free_into_a_region_of_another_stream_waits_for_its_stream_though_it_is_the_steps() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    let (s1, s2) = (TestStream::new(1), TestStream::new(2));
    let mut grads = Vec::new();
    for _ in 0..4 {
        grads_step(&p, &s1, &mut grads, &[MIB, MIB]);
    }
    assert_eq!(p.steps().carry_region, 2 * MIB);
    // A step on s2, which cannot wait for the device: no plan, and the
    // gradients of s1's carry region are freed on s2, the steps' stream.
    p.step(&s2).unwrap();
    let before = s2.faults().syncs();
    let n = grads.len();
    for g in grads.drain(..) {
        p.deallocate(g, &s2).unwrap();
    }
    assert_eq!(s2.faults().syncs() - before, n as u64, "each free waited for s2");
    assert!(p.release(&s1).unwrap() > 0);
    assert_eq!(p.usage().used, 0);
    p.check().unwrap();
}

/// One step of a program whose second block comes from another thread
/// while the first one's free is under way (at once, or, where the first
/// block is a region's, just after): a; a freed while b is allocated; c;
/// b and c freed. Checks that b and c lie apart.
fn racing_step(p: &Planned<Reuses>) {
    let quiet = Meanwhile::new(0);
    p.step(&quiet).unwrap();
    let a = p.allocate(req(MIB), &quiet).unwrap();
    let b = core::cell::Cell::new(None);
    let freeing = Meanwhile::new(0).then(|| b.set(Some(p.allocate(req(MIB), &quiet).unwrap())));
    p.deallocate(a, &freeing).unwrap();
    freeing.now();
    let b = b.get().unwrap();
    let c = p.allocate(req(MIB), &quiet).unwrap();
    assert!(b.addr() + MIB <= c.addr() || c.addr() + MIB <= b.addr(), "{b:?} {c:?}");
    p.check().unwrap();
    p.deallocate(b, &quiet).unwrap();
    p.deallocate(c, &quiet).unwrap();
    p.check().unwrap();
}

/// The lifetimes in the record of the step in progress.
fn lifetimes<R>(p: &Planned<R>) -> Vec<(u32, u32)> {
    p.state.with(|s| s.record.iter().map(|(l, ..)| (l.start, l.end)).collect())
}

/// A free whose block the upstream hands at once to another thread's
/// allocation (b gets a's address): its record took the new block's
/// entry, so b was recorded as freed when a was, and a as live for good;
/// the plan made from that put c over b, and each planned step departed
/// at c.
#[test]
fn a_free_is_recorded_for_its_own_block_though_another_thread_gets_its_address_at_once() {
    let p = Planned::new(Reuses::new());
    racing_step(&p);
    // a: op 0, freed at op 1, before b comes (op 2); c at op 3; b freed,
    // then c.
    assert_eq!(lifetimes(&p), [(0, 1), (2, 4), (3, 5)]);
    for _ in 0..5 {
        racing_step(&p);
    }
    let s = p.steps();
    assert_eq!((s.plans, s.followed, s.planned_allocations, s.region), (1, 3, 4 * 3, 2 * MIB));
    assert_eq!((p.usage().used, p.held(), p.upstream().usage().held), (0, 2 * MIB, 2 * MIB));
}

/// As in [`a_free_is_recorded_for_its_own_block_though_another_thread_gets_its_address_at_once`],
/// the free of a block carried from the step before (a gradient), whose
/// address the next gradient gets at once: the new gradient was recorded
/// as freed and the old one's free was lost, so no carry layout was made.
#[test]
fn a_carried_blocks_free_is_recorded_for_it_though_its_successor_gets_its_address_at_once() {
    let p = Planned::new(Reuses::new());
    let quiet = Meanwhile::new(0);
    let mut grad: Option<Block> = None;
    for _ in 0..6 {
        p.step(&quiet).unwrap();
        let act = p.allocate(req(2 * MIB), &quiet).unwrap();
        let next = core::cell::Cell::new(None);
        let freeing = Meanwhile::new(0).then(|| next.set(Some(p.allocate(req(MIB), &quiet).unwrap())));
        if let Some(g) = grad {
            p.deallocate(g, &freeing).unwrap();
        }
        freeing.now();
        grad = next.get();
        p.deallocate(act, &quiet).unwrap();
        p.check().unwrap();
        if p.steps().steps == 2 {
            // The old gradient (allocation 1 of the step before) freed at
            // op 1, the new one allocated at op 2 and live into the next
            // step.
            assert_eq!(lifetimes(&p), [(0, 3), (2, OPEN)]);
            assert_eq!(p.state.with(|s| s.carried_frees.clone()), [(1, 1)]);
        }
    }
    let s = p.steps();
    assert_eq!((s.plans, s.carry_region), (1, MIB), "the gradient has its slot");
    p.deallocate(grad.unwrap(), &quiet).unwrap();
    assert_eq!(p.usage().used, 0);
    assert_eq!(p.held(), p.upstream().usage().held);
    p.check().unwrap();
}

/// A free recorded before the upstream frees the block is taken back where
/// the upstream refuses it or panics: the block lives on, and so does its
/// record, until a free the upstream takes. So for a block carried from
/// the step before.
#[test]
fn a_free_the_upstream_refuses_or_panics_in_is_not_recorded() {
    let p = Planned::new(BumpUpstream::new(1 << 30));
    p.step(&()).unwrap();
    let carried = p.allocate(req(MIB), &()).unwrap();
    p.step(&()).unwrap();
    let a = p.allocate(req(MIB), &()).unwrap();
    for b in [a, carried] {
        p.upstream().refuse_free_at(b.addr());
        assert!(matches!(p.deallocate(b, &()), Err(Error::Backend { .. })));
        p.upstream().refuse_free_at(0);
        p.upstream().panic_in("deallocate", 0);
        let freed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.deallocate(b, &())));
        assert!(freed.is_err());
    }
    assert_eq!(lifetimes(&p), [(0, OPEN)]);
    assert!(p.state.with(|s| s.carried_frees.is_empty() && s.born.len() == 1 && s.carried.len() == 1));
    p.deallocate(carried, &()).unwrap();
    p.deallocate(a, &()).unwrap();
    // Four ops of failed frees between, each ticked.
    assert_eq!(lifetimes(&p), [(0, 6)]);
    assert_eq!(p.state.with(|s| s.carried_frees.clone()), [(0, 5)]);
    assert_eq!((p.held(), p.upstream().usage().held), (0, 0));
}

/// An upstream whose free of a block of `hook_size` bytes calls `step` on
/// the planned resource above it, once: a user's upstream that calls back.
struct CallsBack {
    up: BumpUpstream,
    hook_size: u64,
    above: std::sync::Mutex<std::sync::Weak<Planned<std::sync::Arc<CallsBack>>>>,
    answer: std::sync::Mutex<Option<Result<()>>>,
}

impl Inspect for CallsBack {
    fn usage(&self) -> Usage {
        self.up.usage()
    }
    fn check(&self) -> core::result::Result<(), Violation> {
        self.up.check()
    }
}

impl MemoryResource for CallsBack {
    fn allocate(&self, request: Request, stream: &()) -> Result<Block> {
        self.up.allocate(request, stream)
    }
    fn deallocate(&self, block: Block, stream: &()) -> Result<()> {
        self.up.deallocate(block, stream)?;
        if block.size() == self.hook_size {
            let above = core::mem::take(&mut *self.above.lock().unwrap());
            if let Some(p) = above.upgrade() {
                *self.answer.lock().unwrap() = Some(p.step(&()));
            }
        }
        Ok(())
    }
}

/// A `step` from inside another's give-back once planned over the region
/// the outer one was giving back, which then went to the upstream: blocks
/// were handed out at offsets from address 0.
#[test]
fn a_step_within_a_step_is_refused_and_every_block_stays_in_memory_held() {
    use std::sync::{Arc, Mutex, Weak};
    let up = Arc::new(CallsBack {
        up: BumpUpstream::new(1 << 30),
        hook_size: 4096,
        above: Mutex::new(Weak::new()),
        answer: Mutex::new(None),
    });
    let p = Arc::new(Planned::new(up.clone()));
    let x = [Op::Alloc(1000), Op::Alloc(3000), Op::Free(0), Op::Alloc(500), Op::Free(1), Op::Free(2)];
    let x_and_one_more = || {
        let v = run(&*p, &x);
        assert!(v.iter().all(Option::is_none), "the script frees what it allocates");
        p.allocate(req(100), &()).unwrap()
    };
    for _ in 0..3 {
        p.step(&()).unwrap();
        run(&*p, &x);
    }
    p.step(&()).unwrap();
    assert_eq!(p.steps().region, 4096);
    // A region block live across the mark: the next step is recorded.
    let a = p.allocate(req(1000), &()).unwrap();
    p.step(&()).unwrap();
    p.deallocate(a, &()).unwrap();
    let one = x_and_one_more();
    // This step's plan differs: the 4096-byte region goes back, and the
    // upstream steps from inside that free.
    *up.above.lock().unwrap() = Arc::downgrade(&p);
    p.step(&()).unwrap();
    assert_eq!(up.answer.lock().unwrap().take(), Some(Err(Error::Reentrant)));
    p.check().unwrap();
    let two = x_and_one_more();
    p.step(&()).unwrap();
    let three = x_and_one_more();
    for b in [one, two, three] {
        assert!(b.addr() >= 1 << 20, "{b:?} lies below every address of the upstream");
        p.deallocate(b, &()).unwrap();
    }
    p.check().unwrap();
    drop(p);
    assert_eq!(up.up.usage().held, 0, "every region went back");
}

#[test]
fn a_block_the_upstream_serves_from_a_region_a_step_gives_back_is_freed_upstream() {
    let p = Planned::new(Reuses::new());
    let quiet = Meanwhile::new(0);
    for _ in 0..3 {
        p.step(&quiet).unwrap();
        let a = p.allocate(req(MIB), &quiet).unwrap();
        p.deallocate(a, &quiet).unwrap();
    }
    let region = p.state.with(|s| s.region);
    assert_eq!(region.size(), MIB);
    // Another shape: the step leaves its plan, and the region goes back at
    // the next step. Meanwhile another thread gets a block at its address
    // from the upstream and frees it.
    p.step(&quiet).unwrap();
    let other = p.allocate(req(2 * MIB), &quiet).unwrap();
    p.deallocate(other, &quiet).unwrap();
    let (at, freed) = (core::cell::Cell::new(0), core::cell::Cell::new(None));
    let going = Meanwhile::new(0).then(|| {
        let b = p.allocate(req(4096), &quiet).unwrap();
        at.set(b.addr());
        freed.set(Some(p.deallocate(b, &quiet)));
    });
    p.step(&going).unwrap();
    assert_eq!(at.get(), region.addr(), "served at the region's address");
    assert_eq!(freed.take(), Some(Ok(())));
    assert_eq!((p.steps().region, p.passed_through(), p.upstream().usage().held), (0, 0, 0));
    p.check().unwrap();
}

/// A step's region whose free fails stays held, with no plan; one whose
/// free panics is left to the upstream, which may have taken it first, and
/// is served no more.
#[test]
fn a_step_region_whose_free_fails_stays_held_with_no_plan_and_one_whose_free_panics_goes() {
    let p = Planned::new(BumpUpstream::new(1 << 30));
    let shape = |n: u64| {
        let a = p.allocate(req(n), &()).unwrap();
        p.deallocate(a, &()).unwrap();
    };
    for _ in 0..3 {
        p.step(&()).unwrap();
        shape(MIB);
    }
    let region = p.state.with(|s| s.region);
    p.step(&()).unwrap();
    shape(2 * MIB);
    p.upstream().refuse_free_at(region.addr());
    assert!(matches!(p.step(&()), Err(Error::Backend { .. })));
    assert_eq!(p.state.with(|s| (s.region, s.plan.entries.len())), (region, 0));
    p.upstream().refuse_free_at(0);
    p.upstream().panic_in("deallocate", 0);
    let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.step(&())));
    assert!(stepped.is_err());
    assert_eq!(p.state.with(|s| (s.region, s.plan.entries.len())), (Region::EMPTY, 0));
    p.check().unwrap();
    p.step(&()).unwrap();
    assert_eq!((p.steps().region, p.held(), p.upstream().usage().held), (0, 0, region.block.size()));
}

/// A region whose free panics in a release leaves the state: the upstream
/// may have taken it first (before, it stayed, held and served, as one
/// whose free fails). The carry region's free panics after the step's
/// region went back (`skip` 1), or the step's region's does and the carry
/// region is not tried, and stays held for the next release (`skip` 0).
#[test]
fn a_region_whose_free_panics_in_a_release_is_left_to_the_upstream() {
    let (step, carry) = (6 * MIB, 2 * MIB + 1024);
    for skip in [0, 1] {
        let p = Planned::new(BumpUpstream::new(1 << 30));
        let mut grads = Vec::new();
        for _ in 0..4 {
            train_step(&p, &mut grads);
        }
        for g in grads.drain(..) {
            p.deallocate(g, &()).unwrap();
        }
        p.upstream().panic_in("deallocate", skip);
        let released = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.release(&())));
        assert!(released.is_err());
        let (kept, lost) = if skip == 0 { (carry, step) } else { (0, carry) };
        let s = p.steps();
        assert_eq!(
            (s.region + s.carry_region, p.held(), p.upstream().usage().held),
            (kept, kept, kept + lost)
        );
        p.check().unwrap();
        assert_eq!(p.release(&()).unwrap(), kept, "skip {skip}");
        assert_eq!(p.upstream().usage().held, lost);
    }
}

/// An upstream whose free, when told, takes the block back and then panics,
/// as `Logging` does when its writer panics on the free's row.
struct FreesThenPanics {
    up: BumpUpstream,
    panic_next_free: core::sync::atomic::AtomicBool,
}

impl MemoryResource for FreesThenPanics {
    fn allocate(&self, request: Request, stream: &()) -> Result<Block> {
        self.up.allocate(request, stream)
    }
    fn deallocate(&self, block: Block, stream: &()) -> Result<()> {
        self.up.deallocate(block, stream)?;
        let panics = self.panic_next_free.swap(false, core::sync::atomic::Ordering::Relaxed);
        assert!(!panics, "after taking the block back");
        Ok(())
    }
}

/// A region the upstream takes back before its free panics is no longer
/// the layer's: not held, and the steps after take another. (Before, it was
/// put back as if the free had failed, and the next steps were served from
/// memory the upstream held no more.)
#[test]
fn a_region_the_upstream_takes_back_before_its_free_panics_is_served_no_more() {
    let up = FreesThenPanics { up: BumpUpstream::new(1 << 30), panic_next_free: false.into() };
    let p = Planned::new(&up);
    four_steps_freed(&p);
    let mut grads = Vec::new();
    let region = p.state.with(|s| s.region);
    up.panic_next_free.store(true, core::sync::atomic::Ordering::Relaxed);
    let released = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.release(&())));
    assert!(released.is_err());
    assert_eq!(p.held(), up.up.usage().held, "the step's region went back");
    p.check_layer().unwrap();
    for _ in 0..4 {
        train_step(&p, &mut grads);
        assert_ne!(p.state.with(|s| s.region.block.addr()), region.block.addr());
    }
    p.check_layer().unwrap();
}

/// A step that gives the old carry region back (the steps changed shape)
/// leaves it to the upstream if its free panics (before, it kept it, as if
/// the free failed), and keeps the step's region, with no layout.
#[test]
fn a_carry_region_whose_free_panics_in_a_step_is_left_to_the_upstream() {
    let (step, carry) = (6 * MIB, 2 * MIB + 1024);
    let p = Planned::new(BumpUpstream::new(1 << 30));
    let mut grads = Vec::new();
    for _ in 0..4 {
        train_step(&p, &mut grads);
    }
    // A step of another shape, whose end gives both regions back: the
    // carry region first.
    p.step(&()).unwrap();
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    let b = p.allocate(req(3 * MIB), &()).unwrap();
    p.deallocate(b, &()).unwrap();
    p.upstream().panic_in("deallocate", 0);
    let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.step(&())));
    assert!(stepped.is_err());
    let s = p.steps();
    assert_eq!((s.region, s.carry_region, p.held()), (step, 0, step));
    assert_eq!(p.state.with(|s| s.carry.slots.len()), 0, "no layout");
    p.check().unwrap();
    assert_eq!(p.release(&()).unwrap(), step);
    assert_eq!(p.upstream().usage().held, carry);
}

/// An upstream that serves blocks of up to `3 << 60` bytes at a few
/// addresses far apart, for steps whose blocks together exceed any request.
struct Huge(std::sync::Mutex<Vec<u64>>);

impl MemoryResource for Huge {
    fn allocate(&self, request: Request, _: &()) -> Result<Block> {
        let none =
            Error::OutOfMemory { requested: request.size(), largest_free: 0, pool_size: 0, max_size: None };
        if request.size() > 3 << 60 {
            return Err(none);
        }
        let addr = self.0.lock().unwrap().pop().ok_or(none)?;
        Ok(Block::new(addr, request.size(), 0))
    }
    fn deallocate(&self, block: Block, _: &()) -> Result<()> {
        self.0.lock().unwrap().push(block.addr());
        Ok(())
    }
}

impl Inspect for Huge {
    fn usage(&self) -> Usage {
        Usage::default()
    }
    fn check(&self) -> core::result::Result<(), Violation> {
        Ok(())
    }
}

/// Two blocks of `3 << 60` bytes live at once make a plan whose region no
/// request can ask for: the steps run from upstream, as under a region
/// the upstream refuses (`step` failed with `InvalidSize` for good).
#[test]
fn a_plan_larger_than_any_request_leaves_the_steps_to_the_upstream() {
    let p = Planned::new(Huge(std::sync::Mutex::new(vec![1 << 62, 1 << 60])));
    let n = 3 << 60;
    for _ in 0..5 {
        p.step(&()).unwrap();
        let a = p.allocate(req(n), &()).unwrap();
        let b = p.allocate(req(n), &()).unwrap();
        p.deallocate(a, &()).unwrap();
        p.deallocate(b, &()).unwrap();
    }
    assert_eq!((p.steps().plans, p.steps().region), (0, 0));
    p.check().unwrap();
}

/// An upstream of addresses alone that serves any size, each block 4 KiB
/// below the one before: none lies in a region it served before, however
/// large.
struct Downward(core::cell::Cell<u64>);

impl MemoryResource for Downward {
    fn allocate(&self, request: Request, _: &()) -> Result<Block> {
        self.0.set(self.0.get() - 4096);
        Ok(Block::from_addr(self.0.get(), request.size()))
    }
    fn deallocate(&self, _: Block, _: &()) -> Result<()> {
        Ok(())
    }
}

impl Inspect for Downward {
    fn usage(&self) -> Usage {
        Usage::default()
    }
    fn check(&self) -> core::result::Result<(), Violation> {
        Ok(())
    }
}

/// Four gradients of `Request::MAX_SIZE` bytes add up to 2^64: laying
/// them out at the third `step` panicked (debug) inside the lock, or
/// wrapped (release).
#[test]
fn carried_blocks_past_the_largest_request_in_all_go_upstream() {
    let p = Planned::new(Downward(core::cell::Cell::new(1 << 63)));
    let mut grads = Vec::new();
    for _ in 0..4 {
        p.step(&()).unwrap();
        for g in grads.drain(..) {
            p.deallocate(g, &()).unwrap();
        }
        grads = (0..4).map(|_| p.allocate(req(Request::MAX_SIZE), &()).unwrap()).collect();
    }
    // The first gradient is laid out in the carry region, the others go
    // upstream.
    let s = p.steps();
    assert_eq!((s.plans, s.followed, s.carry_region, s.planned_allocations), (1, 1, Request::MAX_SIZE, 2));
    p.check().unwrap();
    for g in grads {
        p.deallocate(g, &()).unwrap();
    }
    p.check().unwrap();
}

/// Training steps over a fresh `Planned`, each freeing the gradient of the
/// step before and allocating the next; in the second, recorded, the
/// gradient's allocation fails, by the upstream's panic if `panics`, else
/// by its error. The figures after each step.
fn steps_with_a_failed_gradient(panics: bool) -> Vec<Steps> {
    let p = Planned::new(BumpUpstream::new(1 << 30));
    let (mut grads, mut seen) = (Vec::new(), Vec::new());
    for i in 0..5 {
        p.step(&()).unwrap();
        let act = p.allocate(req(4 * MIB), &()).unwrap();
        for g in grads.drain(..) {
            p.deallocate(g, &()).unwrap();
        }
        match (i, panics) {
            (1, true) => p.upstream().panic_in("allocate", 0),
            (1, false) => p.upstream().fail_after(0),
            _ => {}
        }
        let grad = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.allocate(req(MIB), &())));
        assert_eq!(grad.is_err(), i == 1 && panics);
        p.upstream().fail_after(u64::MAX);
        grads.extend(grad.ok().and_then(Result::ok));
        p.deallocate(act, &()).unwrap();
        p.check().unwrap();
        seen.push(p.steps());
    }
    for g in grads {
        p.deallocate(g, &()).unwrap();
    }
    p.check().unwrap();
    seen
}

/// An allocation whose upstream panics is recorded as one it refuses:
/// the caller got no block. It was recorded as live at the step's end, a
/// block carried into the next step, and the steps after it were laid
/// out with a carry region for it.
#[test]
fn an_allocation_whose_upstream_panics_is_recorded_as_a_refused_one() {
    assert_eq!(steps_with_a_failed_gradient(true), steps_with_a_failed_gradient(false));
}

/// An upstream that, asked once for `hook_size` bytes, first allocates
/// `inner` bytes through the planned resource above it (as another thread
/// may meanwhile), then makes its next free panic.
struct TakesBeside {
    up: BumpUpstream,
    hook_size: u64,
    inner: u64,
    above: std::sync::Mutex<std::sync::Weak<Planned<std::sync::Arc<TakesBeside>>>>,
    got: std::sync::Mutex<Option<Block>>,
}

impl MemoryResource for TakesBeside {
    fn allocate(&self, request: Request, stream: &()) -> Result<Block> {
        if request.size() == self.hook_size {
            let above = core::mem::take(&mut *self.above.lock().unwrap());
            if let Some(p) = above.upgrade() {
                *self.got.lock().unwrap() = Some(p.allocate(req(self.inner), stream).unwrap());
                self.up.panic_in("deallocate", 0);
            }
        }
        self.up.allocate(request, stream)
    }
    fn deallocate(&self, block: Block, stream: &()) -> Result<()> {
        self.up.deallocate(block, stream)
    }
}

impl Inspect for TakesBeside {
    fn usage(&self) -> Usage {
        self.up.usage()
    }
    fn check(&self) -> core::result::Result<(), Violation> {
        self.up.check()
    }
}

/// Two gradients carried from step to step; in the first planned step the
/// carry region is taken by the second gradient while the first one's
/// call takes a region too, and the upstream panics giving that spare
/// region back: the first gradient's place in the carry region was kept
/// live for good, with no block to free it.
#[test]
fn a_carried_block_whose_spare_regions_free_panics_takes_no_place() {
    use std::sync::{Arc, Mutex, Weak};
    let up = Arc::new(TakesBeside {
        up: BumpUpstream::new(1 << 30),
        hook_size: 2 * MIB + 1024,
        inner: MIB + 1000,
        above: Mutex::new(Weak::new()),
        got: Mutex::new(None),
    });
    let p = Arc::new(Planned::new(up.clone()));
    let mut grads: Vec<Block> = Vec::new();
    for _ in 0..2 {
        p.step(&()).unwrap();
        for g in grads.drain(..) {
            p.deallocate(g, &()).unwrap();
        }
        grads = [MIB, MIB + 1000].iter().map(|&n| p.allocate(req(n), &()).unwrap()).collect();
    }
    p.step(&()).unwrap();
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    *up.above.lock().unwrap() = Arc::downgrade(&p);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.allocate(req(MIB), &())));
    assert!(r.is_err());
    let inner = up.got.lock().unwrap().take().unwrap();
    assert_eq!(p.steps().carry_region, 2 * MIB + 1024, "the inner call took the carry region");
    // In use: the inner block. The spare region whose free panicked is
    // left to the upstream (which may have taken it first): held there, in
    // use as far as the layer can tell, serving nothing.
    let spare = 2 * MIB + 1024;
    assert_eq!(up.up.usage().held, 2 * spare, "the carry region and the spare one");
    assert_eq!(p.usage().used, MIB + 1024 + spare);
    p.check().unwrap();
    p.deallocate(inner, &()).unwrap();
    assert_eq!(p.usage().used, spare);
    assert_eq!(p.steps().planned_allocations, 1);
    p.check().unwrap();
    // The carry region is given back by the next release.
    assert_eq!(p.held(), spare);
    assert_eq!(p.release(&()).unwrap(), spare);
    assert_eq!((p.held(), up.up.usage().held), (0, spare));
}

#[test]
fn release_gives_back_each_region_no_block_lives_in_and_the_steps_are_planned_again() {
    let up = Statistics::new(BumpUpstream::new(1 << 30));
    let p = Planned::new(&up);
    let mut grads = Vec::new();
    for _ in 0..4 {
        train_step(&p, &mut grads);
    }
    let (step, carry) = (6 * MIB, 2 * MIB + 1024);
    assert_eq!((p.steps().region, p.steps().carry_region, up.usage().held), (step, carry, step + carry));
    // The gradients live in the carry region: the step's region goes, the
    // plan with it; the carry region stays, and the gradients are freed
    // there.
    assert_eq!(p.release(&()).unwrap(), step);
    assert_eq!((p.steps().region, p.steps().carry_region, up.usage().held), (0, carry, carry));
    assert_eq!(p.held(), carry + p.passed_through());
    assert_eq!(p.release(&()).unwrap(), 0, "nothing more while the gradients live");
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    assert_eq!(p.usage().used, 0);
    p.check().unwrap();
    assert_eq!(p.release(&()).unwrap(), carry);
    assert_eq!((p.steps().carry_region, up.usage().held, p.held()), (0, 0, 0));
    // The next steps are recorded, then laid out again.
    let plans = p.steps().plans;
    for _ in 0..4 {
        train_step(&p, &mut grads);
        p.check().unwrap();
    }
    let s = p.steps();
    assert_eq!((s.plans, s.region, s.carry_region), (plans + 1, step, carry));
    // Released with the gradients live, and the steps going on: the carry
    // layout kept serves the next plan.
    assert_eq!(p.release(&()).unwrap(), step);
    for _ in 0..4 {
        train_step(&p, &mut grads);
        p.check().unwrap();
    }
    let s = p.steps();
    assert_eq!((s.plans, s.region, s.carry_region), (plans + 2, step, carry));
    assert_eq!(up.usage().held, step + carry);
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    assert_eq!(p.release(&()).unwrap(), step + carry);
    assert_eq!(up.usage().held, 0);
}

#[test]
fn release_keeps_a_region_a_block_lives_in_and_counts_what_passed_through() {
    let up = Statistics::new(BumpUpstream::new(1 << 30));
    let p = Planned::new(&up);
    four_steps_freed(&p);
    // In a laid-out step: its first block lives in the step's region.
    p.step(&()).unwrap();
    let planned = p.steps().planned_allocations;
    let act = p.allocate(req(4 * MIB), &()).unwrap();
    assert_eq!(p.steps().planned_allocations, planned + 1, "from the region");
    assert_eq!(p.release(&()).unwrap(), 0);
    assert_eq!(p.steps().region, 6 * MIB);
    // A block of another size goes upstream as it is: held, passed through.
    let other = p.allocate(req(MIB / 2), &()).unwrap();
    assert_eq!(p.passed_through(), MIB / 2);
    assert_eq!(p.held(), 8 * MIB + 1024 + MIB / 2);
    p.deallocate(other, &()).unwrap();
    p.deallocate(act, &()).unwrap();
    assert_eq!(p.passed_through(), 0);
    assert_eq!(p.release(&()).unwrap(), 8 * MIB + 1024);
    assert_eq!(up.usage().held, 0);
    p.check().unwrap();
}

#[test]
fn release_on_another_stream_gives_a_region_back_only_when_the_device_can_be_waited_for() {
    for device in [false, true] {
        let up = Statistics::new(BumpUpstream::new(1 << 30));
        let p = Planned::new(&up);
        let on = TestStream::new(1);
        let mut grads = Vec::new();
        for _ in 0..4 {
            grads_step(&p, &on, &mut grads, &[MIB]);
        }
        for g in grads.drain(..) {
            p.deallocate(g, &on).unwrap();
        }
        let held = up.usage().held;
        assert!(held > 0);
        let other = TestStream::new(2).device_sync(device);
        assert_eq!(p.release(&other).unwrap(), if device { held } else { 0 }, "device {device}");
        assert_eq!(up.usage().held, if device { 0 } else { held });
        assert_eq!(p.release(&on).unwrap(), if device { 0 } else { held });
        assert_eq!(up.usage().held, 0);
    }
}

/// A release on one stream while another stream's thread follows the plan
/// in its region: the region stops serving before the device is waited
/// for, so a block that thread takes meanwhile (its work queued after the
/// wait) comes from the upstream, and the region goes back with no block
/// served from it since. (Before, the wait came first: the block was
/// served from the region, freed on its stream at once, and the region
/// went back upstream with that block's work still to run.)
#[test]
fn a_release_stops_the_regions_serving_before_it_waits_for_the_device() {
    let up = Statistics::new(BumpUpstream::new(1 << 30));
    let p = Planned::new(&up);
    let theirs = TestStream::new(1);
    for _ in 0..4 {
        p.step(&theirs).unwrap();
        let (x, y) = (p.allocate(req(4 * MIB), &theirs).unwrap(), p.allocate(req(2 * MIB), &theirs).unwrap());
        p.deallocate(x, &theirs).unwrap();
        p.deallocate(y, &theirs).unwrap();
    }
    p.step(&theirs).unwrap();
    let before = p.steps();
    assert!(before.plans > 0 && before.region > 0, "{before:?}");
    let mine = Meanwhile::new(2).waits_for_the_device().then(|| {
        let x = p.allocate(req(4 * MIB), &theirs).unwrap();
        p.deallocate(x, &theirs).unwrap();
    });
    assert_eq!(p.release(&mine).unwrap(), before.region);
    let after = p.steps();
    assert_eq!(after.planned_allocations, before.planned_allocations, "served from the region meanwhile");
    assert_eq!((after.region, up.usage().held), (0, 0));
    p.check().unwrap();
}

/// An upstream (a safe trait of the user's) that hands out a step's or the
/// carry region's block shorter than asked: the region is given back and
/// taken as refused, so no block is laid out past its end (the checker
/// holds after every step) and nothing is lost. Before, the step's blocks
/// were served up to the plan's top in a region half as long: memory the
/// upstream did not give.
#[test]
fn regions_shorter_than_asked_are_given_back_and_taken_as_refused() {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    extern crate std;
    /// Blocks of 1 MiB or more come back half as long (their full size
    /// remembered for the free).
    struct Short {
        up: BumpUpstream,
        cut: Mutex<BTreeMap<u64, u64>>,
    }
    impl MemoryResource<()> for Short {
        fn allocate(&self, request: Request, stream: &()) -> Result<Block> {
            let b = self.up.allocate(request, stream)?;
            if b.size() < MIB {
                return Ok(b);
            }
            self.cut.lock().unwrap().insert(b.addr(), b.size());
            Ok(Block::new(b.addr(), b.size() / 2, b.tag()))
        }
        fn deallocate(&self, block: Block, stream: &()) -> Result<()> {
            let size = self.cut.lock().unwrap().remove(&block.addr()).unwrap_or(block.size());
            self.up.deallocate(Block::new(block.addr(), size, block.tag()), stream)
        }
    }
    impl Inspect for Short {
        fn usage(&self) -> crate::Usage {
            self.up.usage()
        }
        fn check(&self) -> core::result::Result<(), crate::check::Violation> {
            Ok(())
        }
    }
    let short = Short { up: BumpUpstream::new(1 << 30), cut: Default::default() };
    {
        let p = Planned::new(&short);
        let mut grads = Vec::new();
        for step in 0..6 {
            train_step(&p, &mut grads);
            p.check().unwrap_or_else(|v| panic!("step {step}: {v:?}"));
        }
        let s = p.steps();
        assert_eq!((s.region, s.carry_region, s.planned_allocations), (0, 0, 0), "every region refused");
        for g in grads.drain(..) {
            p.deallocate(g, &()).unwrap();
        }
        assert_eq!(p.usage().used, 0);
    }
    assert_eq!(short.up.usage().held, 0, "every short region went back");
}

/// An upstream (a safe trait of the user's) that serves a request of
/// `short` bytes with half as many, and refuses the free of such a block
/// while `refusing`.
struct CutShort {
    up: BumpUpstream,
    short: u64,
    cut: std::sync::Mutex<std::collections::BTreeSet<u64>>,
    refusing: core::sync::atomic::AtomicBool,
}

impl MemoryResource for CutShort {
    fn allocate(&self, request: Request, stream: &()) -> Result<Block> {
        if request.size() != self.short {
            return self.up.allocate(request, stream);
        }
        let b = self.up.allocate(req(self.short / 2), stream)?;
        self.cut.lock().unwrap().insert(b.addr());
        Ok(b)
    }
    fn deallocate(&self, block: Block, stream: &()) -> Result<()> {
        let short = self.cut.lock().unwrap().contains(&block.addr());
        if short && self.refusing.load(core::sync::atomic::Ordering::Relaxed) {
            return Err(Error::Backend { code: -2, what: "a short block's free refused" });
        }
        self.up.deallocate(block, stream)?;
        self.cut.lock().unwrap().remove(&block.addr());
        Ok(())
    }
}

impl CutShort {
    /// Serves 3 MiB requests (the carry region of [`spare_kept`]'s steps)
    /// with half as many bytes, and refuses their frees.
    fn refusing() -> Self {
        CutShort {
            up: BumpUpstream::new(1 << 30),
            short: 3 * MIB,
            cut: Default::default(),
            refusing: true.into(),
        }
    }
}

/// Three steps of gradients of 1 and 2 MiB through `p` over
/// [`CutShort::refusing`], after which the layer keeps a spare (a carry
/// region served short, whose free was refused). Returns the gradients
/// still live.
fn spare_kept(p: &Planned<&CutShort>) -> Vec<Block> {
    let mut grads = Vec::new();
    for _ in 0..3 {
        grads_step(p, &(), &mut grads, &[MIB, 2 * MIB]);
    }
    grads
}

impl Inspect for CutShort {
    fn usage(&self) -> Usage {
        self.up.usage()
    }
    fn check(&self) -> core::result::Result<(), Violation> {
        Ok(())
    }
}

/// A carry region shorter than asked whose free the upstream refuses is
/// kept, held and counted, and given back at the next step on its stream,
/// at a release, or on drop. Before, it dropped out of `held()` while the
/// upstream held it, and was never given back.
#[test]
fn a_short_carry_region_whose_free_is_refused_stays_held_until_it_can_go_back() {
    use core::sync::atomic::Ordering::Relaxed;
    let short = CutShort::refusing();
    let held = |p: &Planned<&CutShort>| (p.held(), short.up.usage().held);
    {
        let p = Planned::new(&short);
        let step = |grads: &mut Vec<Block>| grads_step(&p, &(), grads, &[MIB, 2 * MIB]);
        let mut grads = Vec::new();
        for n in 0..5 {
            step(&mut grads);
            let (mine, up) = held(&p);
            assert_eq!(mine, up, "step {n}");
            p.check().unwrap();
        }
        // Steps 3 to 5 each asked for the carry region: three kept.
        assert_eq!(short.cut.lock().unwrap().len(), 3);
        assert_eq!(p.steps().carry_region, 0);
        // The next step gives them back (and its own short region).
        short.refusing.store(false, Relaxed);
        step(&mut grads);
        assert!(short.cut.lock().unwrap().is_empty());
        assert_eq!(held(&p).0, held(&p).1);
        // A release gives back one kept meanwhile, once the upstream takes it.
        short.refusing.store(true, Relaxed);
        step(&mut grads);
        assert!(matches!(p.release(&()), Err(Error::Backend { .. })));
        assert_eq!(short.cut.lock().unwrap().len(), 1);
        assert_eq!(held(&p).0, held(&p).1);
        short.refusing.store(false, Relaxed);
        assert_eq!(p.release(&()).unwrap(), 3 * MIB / 2);
        assert!(short.cut.lock().unwrap().is_empty());
        assert_eq!(held(&p).0, held(&p).1);
        // And the drop one kept in the first step planned again.
        short.refusing.store(true, Relaxed);
        for _ in 0..3 {
            step(&mut grads);
        }
        for g in grads.drain(..) {
            p.deallocate(g, &()).unwrap();
        }
        short.refusing.store(false, Relaxed);
        assert_eq!(short.cut.lock().unwrap().len(), 1);
    }
    assert_eq!(short.up.usage().held, 0, "every region went back");
}

/// A spare region (a carry region shorter than asked, whose free the
/// upstream refused) is held and serves no block: `usage()` counts it held
/// and free, and no part of the largest free block. It was counted used.
#[test]
fn a_spare_region_is_counted_held_and_free_not_used() {
    let short = CutShort::refusing();
    let p = Planned::new(&short);
    let mut grads = spare_kept(&p);
    assert_eq!(short.cut.lock().unwrap().len(), 1, "a spare kept");
    let (spare, region) = (3 * MIB / 2, p.steps().region);
    assert_eq!(p.held(), region + spare + 3 * MIB, "the gradients passed through");
    let u = p.usage();
    assert_eq!((u.used, u.held, u.free), (3 * MIB, p.held(), region + spare), "the gradients in use");
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    let u = p.usage();
    assert_eq!((u.used, u.held, u.free, u.largest_free), (0, region + spare, region + spare, region));
    p.check().unwrap();
    short.refusing.store(false, core::sync::atomic::Ordering::Relaxed);
    assert_eq!(p.release(&()).unwrap(), region + spare);
    let u = p.usage();
    assert_eq!((u.used, u.held, u.free), (0, 0, 0));
}

/// The layer's checker finds a spare put out of step with the regions: one
/// longer than its block, one over the step's region, one over another
/// spare (spares were not checked).
#[test]
fn the_layer_checker_finds_a_spare_past_its_block_or_over_a_region_or_another_spare() {
    let short = CutShort::refusing();
    let p = Planned::new(&short);
    let mut grads = spare_kept(&p);
    let (spare, region) = p.state.with(|s| (s.spares[0], s.region));
    assert!(!region.is_empty(), "a step's region");
    p.check_layer().unwrap();
    let what = |v: Violation| v.what();
    let longer = |s: &mut State<_>| s.spares[0].0.size = spare.0.block.size() + UNIT;
    assert_eq!(what(checked_with(&p, longer, |s| s.spares[0] = spare)), "a spare longer than its block");
    let overlaps = "a spare overlaps a region or another spare";
    let over_region = |s: &mut State<_>| s.spares.push((region, 0));
    assert_eq!(what(checked_with(&p, over_region, |s| s.spares.truncate(s.spares.len() - 1))), overlaps);
    let twice = |s: &mut State<_>| s.spares.push(spare);
    assert_eq!(what(checked_with(&p, twice, |s| s.spares.truncate(s.spares.len() - 1))), overlaps);
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    short.refusing.store(false, core::sync::atomic::Ordering::Relaxed);
    p.release(&()).unwrap();
}

/// A spare whose free panics at a step that lays out is left to the
/// upstream (which may have taken it first), and the step after it lays
/// out as usual (the panic left no step laying out for good, which would
/// refuse every later one as `Reentrant`).
#[test]
fn a_spare_whose_free_panics_in_a_step_is_left_to_the_upstream_and_the_steps_go_on() {
    use core::sync::atomic::Ordering::Relaxed;
    let short = CutShort::refusing();
    let p = Planned::new(&short);
    let mut grads = spare_kept(&p);
    assert_eq!(short.cut.lock().unwrap().len(), 1, "a spare kept");
    // A step of another shape: the next one lays out.
    p.step(&()).unwrap();
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    let b = p.allocate(req(MIB), &()).unwrap();
    p.deallocate(b, &()).unwrap();
    short.refusing.store(false, Relaxed);
    short.up.panic_in("deallocate", 0);
    let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.step(&())));
    assert!(stepped.is_err());
    let lost = 3 * MIB / 2;
    assert_eq!(short.cut.lock().unwrap().len(), 1, "held upstream");
    assert_eq!(p.held() + lost, short.up.usage().held);
    p.step(&()).unwrap();
    assert_eq!(short.cut.lock().unwrap().len(), 1, "left to the upstream");
    assert_eq!(p.held() + lost, short.up.usage().held);
    p.check().unwrap();
}

/// An upstream (a safe trait of the user's) that hands out a step's region
/// longer than asked, `u64::MAX` bytes: the region is used and counted as
/// asked, as a pool's chunk is, and goes back whole. Before, it was
/// counted as it came, and `held()` and `usage()` added it to the carry
/// region past `u64::MAX` (a panic in a debug build).
#[test]
fn a_region_longer_than_asked_is_used_and_counted_as_asked() {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    /// Blocks above 4 MiB come back `u64::MAX` bytes long; their free must
    /// give that size back.
    struct Long {
        up: BumpUpstream,
        long: Mutex<BTreeMap<u64, u64>>,
    }
    impl MemoryResource<()> for Long {
        fn allocate(&self, request: Request, stream: &()) -> Result<Block> {
            let b = self.up.allocate(request, stream)?;
            if b.size() <= 4 * MIB {
                return Ok(b);
            }
            self.long.lock().unwrap().insert(b.addr(), b.size());
            Ok(Block::new(b.addr(), u64::MAX, b.tag()))
        }
        fn deallocate(&self, block: Block, stream: &()) -> Result<()> {
            let Some(&size) = self.long.lock().unwrap().get(&block.addr()) else {
                return self.up.deallocate(block, stream);
            };
            if block.size() != u64::MAX {
                return Err(Error::SizeMismatch {
                    addr: block.addr(),
                    expected: u64::MAX,
                    given: block.size(),
                });
            }
            self.long.lock().unwrap().remove(&block.addr());
            self.up.deallocate(Block::new(block.addr(), size, block.tag()), stream)
        }
    }
    impl Inspect for Long {
        fn usage(&self) -> crate::Usage {
            self.up.usage()
        }
        fn check(&self) -> core::result::Result<(), crate::check::Violation> {
            Ok(())
        }
    }
    let (step, carry) = (6 * MIB, 2 * MIB + 1024);
    let long = Long { up: BumpUpstream::new(1 << 30), long: Default::default() };
    let p = Planned::new(&long);
    let mut grads = Vec::new();
    for _ in 0..6 {
        train_step(&p, &mut grads);
        p.check().unwrap();
    }
    assert_eq!((p.held(), p.usage().used), (step + carry, carry));
    let s = p.steps();
    assert_eq!((s.plans, s.followed, s.region, s.carry_region), (1, 3, step, carry), "kept, as asked");
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    assert_eq!(p.release(&()).unwrap(), step + carry);
    assert_eq!(
        (long.up.usage().held, long.long.lock().unwrap().len()),
        (0, 0),
        "the long region went back whole"
    );
}

/// The figures of several layers (or made up) add up saturating: the
/// regions' bytes of layers over several devices may pass `u64::MAX`.
#[test]
fn the_steps_of_several_layers_add_up_saturating() {
    let a = Steps { steps: 2, region: u64::MAX - 1, carry_region: 1 << 62, ..Steps::default() };
    let total: Steps = [a; 4].into_iter().sum();
    assert_eq!((total.steps, total.region, total.carry_region), (8, u64::MAX, u64::MAX));
}

/// [`Reuses`] with tags, whose free lets the stream's next call run first
/// and then refuses a block that is not live with its tag: a double free
/// racing a free reaches it first.
struct Tagged {
    up: Reuses,
    live: core::cell::RefCell<BTreeMap<u64, u64>>,
    next_tag: core::cell::Cell<u64>,
}

impl MemoryResource<Meanwhile<'_>> for Tagged {
    fn allocate(&self, request: Request, stream: &Meanwhile<'_>) -> Result<Block> {
        let b = self.up.allocate(request, stream)?;
        let tag = self.next_tag.replace(self.next_tag.get() + 1);
        self.live.borrow_mut().insert(b.addr(), tag);
        Ok(Block::new(b.addr(), b.size(), tag))
    }
    fn deallocate(&self, block: Block, stream: &Meanwhile<'_>) -> Result<()> {
        stream.now();
        if self.live.borrow().get(&block.addr()) != Some(&block.tag()) {
            return Err(Error::DoubleFree { addr: block.addr() });
        }
        self.live.borrow_mut().remove(&block.addr());
        self.up.deallocate(Block::from_addr(block.addr(), block.size()), &Meanwhile::new(0))
    }
}

/// A free the upstream refuses because a double free racing it freed the
/// block first, and another allocation got the address, stands in the
/// record: taking it back put the freed block's entry over the new one's,
/// so the freed block was recorded live for good and the new block's free
/// ended the freed one's lifetime.
#[test]
fn a_free_refused_beside_a_racing_double_free_stands_and_the_new_block_keeps_its_entry() {
    let p = Planned::new(Tagged { up: Reuses::new(), live: Default::default(), next_tag: 1.into() });
    let quiet = Meanwhile::new(0);
    p.step(&quiet).unwrap();
    let a = p.allocate(req(MIB), &quiet).unwrap();
    let b = core::cell::Cell::new(None);
    let racing = Meanwhile::new(0).then(|| {
        p.deallocate(a, &Meanwhile::new(0)).unwrap();
        b.set(Some(p.allocate(req(MIB), &Meanwhile::new(0)).unwrap()));
    });
    assert_eq!(p.deallocate(a, &racing), Err(Error::DoubleFree { addr: a.addr() }));
    let b = b.get().unwrap();
    assert_eq!(b.addr(), a.addr(), "the address handed out again");
    let [(a_start, a_end), (b_start, OPEN)] = lifetimes(&p)[..] else { panic!("{:?}", lifetimes(&p)) };
    assert!(a_start < a_end && a_end <= b_start, "a freed before b came: {:?}", lifetimes(&p));
    p.deallocate(b, &quiet).unwrap();
    assert_ne!(lifetimes(&p)[1].1, OPEN, "b's free ended b's lifetime");
    assert!(p.upstream().live.borrow().is_empty());
    p.check_layer().unwrap();
}

/// A free the upstream refuses because a double free racing it freed the
/// block first stands in the record, though no block took the address:
/// taking it back recorded the freed block live for good (its lifetime
/// open, a block that every later step would carry).
#[test]
fn a_free_refused_as_the_double_of_a_racing_free_stands_in_the_record() {
    let p = Planned::new(Strict { next: (1 << 30).into(), live: Default::default() });
    let quiet = Meanwhile::new(0);
    p.step(&quiet).unwrap();
    let x = p.allocate(req(MIB), &quiet).unwrap();
    let racing = Meanwhile::new(0).then(|| p.deallocate(x, &quiet).unwrap());
    assert_eq!(p.deallocate(x, &racing), Err(Error::DoubleFree { addr: x.addr() }));
    assert!(p.upstream().live.borrow().is_empty(), "the upstream freed x");
    let [(start, end)] = lifetimes(&p)[..] else { panic!("{:?}", lifetimes(&p)) };
    assert!(start < end && end != OPEN, "x freed in the record: {:?}", lifetimes(&p));
    p.check_layer().unwrap();
}

/// The same race settled in the other order, on two threads: the first
/// free's refusal settles before the second (which found nothing recorded
/// to free) returns. The refusal took the free back, and the block was
/// recorded live for good though the upstream had freed it.
#[test]
fn a_racing_free_that_returns_after_the_others_refusal_settled_stands_in_the_record() {
    use std::collections::BTreeSet;
    use std::sync::{Barrier, Mutex};
    /// Its first free waits until a second free of the block has freed it,
    /// then refuses (a double free); the second answers only once the
    /// first's refusal has settled.
    struct Racing {
        live: Mutex<BTreeSet<u64>>,
        frees: core::sync::atomic::AtomicUsize,
        gate: Barrier,
    }
    impl MemoryResource for Racing {
        fn allocate(&self, request: Request, _: &()) -> Result<Block> {
            self.live.lock().unwrap().insert(1 << 30);
            Ok(Block::from_addr(1 << 30, request.size()))
        }
        fn deallocate(&self, block: Block, _: &()) -> Result<()> {
            if self.frees.fetch_add(1, core::sync::atomic::Ordering::SeqCst) == 0 {
                self.gate.wait(); // the second free may begin
                self.gate.wait(); // it has freed the block
                return Err(Error::DoubleFree { addr: block.addr() });
            }
            assert!(self.live.lock().unwrap().remove(&block.addr()));
            self.gate.wait();
            self.gate.wait(); // the first's refusal has settled
            Ok(())
        }
    }
    let p = Planned::new(Racing { live: Default::default(), frees: 0.into(), gate: Barrier::new(2) });
    p.step(&()).unwrap();
    let x = p.allocate(req(MIB), &()).unwrap();
    std::thread::scope(|scope| {
        let second = scope.spawn(|| {
            p.upstream().gate.wait();
            p.deallocate(x, &())
        });
        assert_eq!(p.deallocate(x, &()), Err(Error::DoubleFree { addr: x.addr() }));
        p.upstream().gate.wait();
        assert_eq!(second.join().unwrap(), Ok(()));
    });
    assert!(p.upstream().live.lock().unwrap().is_empty(), "the upstream freed x");
    let [(start, end)] = lifetimes(&p)[..] else { panic!("{:?}", lifetimes(&p)) };
    assert!(start < end && end != OPEN, "x freed in the record: {:?}", lifetimes(&p));
    p.check_layer().unwrap();
}

/// An upstream of addresses alone (a safe one) that refuses the free of a
/// block it does not hold; before it judges a free it lets the stream's
/// next call run (another thread's free of the same block arriving first).
struct Strict {
    next: core::cell::Cell<u64>,
    live: core::cell::RefCell<std::collections::BTreeMap<u64, u64>>,
}

impl MemoryResource<Meanwhile<'_>> for Strict {
    fn allocate(&self, request: Request, _: &Meanwhile<'_>) -> Result<Block> {
        let at = self.next.replace(self.next.get() + (1 << 30));
        self.live.borrow_mut().insert(at, request.size());
        Ok(Block::from_addr(at, request.size()))
    }
    fn deallocate(&self, block: Block, stream: &Meanwhile<'_>) -> Result<()> {
        stream.now();
        match self.live.borrow_mut().remove(&block.addr()) {
            Some(_) => Ok(()),
            None => Err(Error::DoubleFree { addr: block.addr() }),
        }
    }
}

/// A double free racing the free of a block that passed through reaches
/// the upstream first and is taken; the first is refused as a double free:
/// the block is counted off once (a table of the blocks passed through,
/// taking the block out before the free and putting it back when refused,
/// counted it for good).
#[test]
fn a_double_free_racing_a_passed_blocks_free_leaves_it_counted_off() {
    let p = Planned::new(Strict { next: (1 << 30).into(), live: Default::default() });
    let quiet = Meanwhile::new(0);
    let x = p.allocate(req(MIB), &quiet).unwrap();
    assert_eq!(p.passed_through(), MIB);
    let racing = Meanwhile::new(0).then(|| p.deallocate(x, &quiet).unwrap());
    assert_eq!(p.deallocate(x, &racing), Err(Error::DoubleFree { addr: x.addr() }));
    assert!(p.upstream().live.borrow().is_empty(), "the upstream freed x");
    assert_eq!((p.passed_through(), p.held()), (0, 0), "x is counted though freed");
}

/// Two live blocks the upstream (of addresses alone) hands out at one
/// address, of different sizes: each free counts off its own block.
#[test]
fn blocks_at_one_address_are_each_counted_off_by_their_own_free() {
    let a = 1 << 40;
    let p = Planned::new(Huge(std::sync::Mutex::new(vec![a, a])));
    let small = p.allocate(req(MIB), &()).unwrap();
    let large = p.allocate(req(4 * MIB), &()).unwrap();
    assert_eq!(p.passed_through(), 5 * MIB);
    p.deallocate(small, &()).unwrap();
    assert_eq!(p.passed_through(), 4 * MIB, "the large block is live");
    p.deallocate(large, &()).unwrap();
    assert_eq!(p.passed_through(), 0);
}

/// An upstream that serves a request of `bad` bytes with a block that runs
/// past the last address, `u64::MAX` bytes long, and refuses its free
/// while `refusing`.
struct RunsPast {
    up: BumpUpstream,
    bad: u64,
    refusing: core::sync::atomic::AtomicBool,
}

const PAST: u64 = u64::MAX - (1 << 20);

impl MemoryResource for RunsPast {
    fn allocate(&self, request: Request, stream: &()) -> Result<Block> {
        if request.size() == self.bad {
            return Ok(Block::new(PAST, u64::MAX, 0));
        }
        self.up.allocate(request, stream)
    }
    fn deallocate(&self, block: Block, stream: &()) -> Result<()> {
        if block.addr() == PAST {
            if self.refusing.load(core::sync::atomic::Ordering::Relaxed) {
                return Err(Error::Backend { code: -2, what: "refused" });
            }
            return Ok(());
        }
        self.up.deallocate(block, stream)
    }
}

/// A carry region that runs past the last address, whose free is refused,
/// is kept as a spare of `u64::MAX` bytes; a release that gives it back
/// and the step's region answers the bytes saturated (it overflowed).
#[test]
fn a_release_of_a_huge_spare_and_the_steps_region_adds_them_up_without_overflow() {
    let up = RunsPast { up: BumpUpstream::new(1 << 30), bad: 3 * MIB, refusing: true.into() };
    let p = Planned::new(&up);
    let mut grads = Vec::new();
    for _ in 0..3 {
        grads_step(&p, &(), &mut grads, &[MIB, 2 * MIB]);
    }
    assert!(p.steps().region > 0, "a step region");
    assert_eq!(p.held(), u64::MAX, "the spare, saturating");
    up.refusing.store(false, core::sync::atomic::Ordering::Relaxed);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.release(&())));
    assert_eq!(r.ok(), Some(Ok(u64::MAX)), "release panicked or failed");
}

/// An upstream (a safe trait of the user's) that answers every request
/// with a block of 2^63 bytes, each at its own address, and counts the
/// frees it takes.
struct HalfSpace {
    next: core::cell::Cell<u64>,
    freed: core::cell::Cell<u64>,
}

impl MemoryResource for HalfSpace {
    fn allocate(&self, _: Request, _: &()) -> Result<Block> {
        let n = self.next.get();
        self.next.set(n + 1);
        Ok(Block::new(n << 20, 1 << 63, 0))
    }
    fn deallocate(&self, _: Block, _: &()) -> Result<()> {
        self.freed.set(self.freed.get() + 1);
        Ok(())
    }
}

#[test]
fn the_bytes_passed_through_saturate_past_the_last_address() {
    let p = Planned::new(HalfSpace { next: core::cell::Cell::new(1), freed: core::cell::Cell::new(0) });
    let a = p.allocate(req(1000), &()).unwrap();
    assert_eq!((p.passed_through(), p.held()), (1 << 63, 1 << 63));
    // Two blocks of 2^63 bytes count 2^64: saturated, as `held` adds.
    let b = p.allocate(req(1000), &()).unwrap();
    assert_eq!((p.passed_through(), p.held()), (u64::MAX, u64::MAX), "the count wrapped");
    p.deallocate(a, &()).unwrap();
    assert_eq!(p.passed_through(), (1 << 63) - 1);
    p.deallocate(b, &()).unwrap();
    assert_eq!((p.passed_through(), p.held(), p.upstream().freed.get()), (0, 0, 2));
}

/// An upstream that hands a block of `again` bytes out over the last one
/// of `first` bytes (a safe trait of the user's, outside the contract).
struct HandsOutTwice {
    up: BumpUpstream,
    first: u64,
    again: u64,
    last: AtomicU64,
}

impl MemoryResource for HandsOutTwice {
    fn allocate(&self, request: Request, stream: &()) -> Result<Block> {
        let last = self.last.load(Ordering::Relaxed);
        if request.size() == self.again && last != 0 {
            return Ok(Block::new(last, request.size(), 0));
        }
        let b = self.up.allocate(request, stream)?;
        if request.size() == self.first {
            self.last.store(b.addr(), Ordering::Relaxed);
        }
        Ok(b)
    }
    fn deallocate(&self, block: Block, stream: &()) -> Result<()> {
        self.up.deallocate(block, stream)
    }
}

/// A region over one that `Planned` holds already is the upstream's fault:
/// taken as refused, and not given back (it is, in part, the other
/// region); the steps run from upstream, and no two blocks served from the
/// regions overlap.
#[test]
fn a_region_over_one_held_already_is_refused() {
    let up = BumpUpstream::new(1 << 30);
    let p =
        Planned::new(HandsOutTwice { up, first: 6 * MIB, again: 2 * MIB + 1024, last: AtomicU64::new(0) });
    let mut grads = Vec::new();
    for step in 0..4 {
        train_step(&p, &mut grads);
        p.check_layer().unwrap_or_else(|v| panic!("step {step}: {v}"));
    }
    // The step's region was taken first; the carry region came over it.
    let s = p.steps();
    assert_eq!((s.region, s.carry_region), (6 * MIB, 0));
    for g in grads.drain(..) {
        p.deallocate(g, &()).unwrap();
    }
    p.check_layer().unwrap();
}

/// A block aligned beyond the region's unit goes upstream: the region's
/// offsets are multiples of 256 only, and a region laid out for it would
/// sit idle beside the upstream's block that serves it.
#[test]
fn blocks_aligned_beyond_the_unit_go_upstream_and_take_no_room_in_the_region() {
    let p = Planned::new(Statistics::new(BumpUpstream::new(1 << 30)));
    for _ in 0..6 {
        p.step(&()).unwrap();
        let a = p.allocate(Request::aligned(3000, 4096).unwrap(), &()).unwrap();
        let b = p.allocate(Request::aligned(1000, 4096).unwrap(), &()).unwrap();
        let c = p.allocate(req(2000), &()).unwrap();
        assert_eq!((a.addr() % 4096, b.addr() % 4096), (0, 0));
        for x in [a, b, c] {
            p.deallocate(x, &()).unwrap();
        }
        p.check().unwrap();
    }
    // Steps 3 to 6 serve `c` from the region, which holds it alone.
    let s = p.steps();
    assert_eq!((s.plans, s.followed, s.planned_allocations, s.region), (1, 3, 4, 2048));
}
