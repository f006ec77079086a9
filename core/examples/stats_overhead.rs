//! A quick look at what the statistics adaptor costs over a bare pool:
//! `cargo run --release -p memres-core --example stats_overhead`.
//!
//! Both resources replay the same pre-decoded random workload (one warm-up
//! pass, then timed passes, alternating) on one thread. The benches give
//! the real figures; this is a sanity check.

use memres_core::adaptor::Statistics;
use memres_core::pool::CoalescingPool;
use memres_core::testing::{BumpUpstream, SplitMix64};
use memres_core::{Block, MemoryResource, Request, Shared};
use std::hint::black_box;
use std::time::Instant;

/// Allocate a size into a slot, or free a slot.
#[derive(Clone, Copy)]
enum Op {
    Alloc(usize, Request),
    Free(usize),
}

fn workload(n: usize, slots: usize) -> Vec<Op> {
    let mut rng = SplitMix64::new(7);
    let mut full = vec![false; slots];
    (0..n)
        .map(|_| {
            let i = rng.below(slots as u64) as usize;
            full[i] = !full[i];
            if full[i] {
                Op::Alloc(i, Request::new(256 + rng.below(64 << 10)).unwrap())
            } else {
                Op::Free(i)
            }
        })
        .collect()
}

fn run(r: &dyn MemoryResource, ops: &[Op], slots: &mut [Block]) -> f64 {
    let start = Instant::now();
    for &op in ops {
        match op {
            Op::Alloc(i, req) => slots[i] = r.allocate(req, &()).unwrap(),
            Op::Free(i) => r.deallocate(slots[i], &()).unwrap(),
        }
    }
    black_box(&slots);
    start.elapsed().as_nanos() as f64 / ops.len() as f64
}

fn main() {
    const SLOTS: usize = 4096;
    let mut ops = workload(2_000_000, SLOTS);
    // Free what is left so that every pass starts from an empty pool.
    let mut full = vec![false; SLOTS];
    for op in &ops {
        match *op {
            Op::Alloc(i, _) => full[i] = true,
            Op::Free(i) => full[i] = false,
        }
    }
    ops.extend((0..SLOTS).filter(|&i| full[i]).map(Op::Free));

    let bare = Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 40)));
    let stats = Statistics::new(Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 40))));
    let mut slots = vec![Block::EMPTY; SLOTS];
    run(&bare, &ops, &mut slots);
    run(&stats, &ops, &mut slots);
    let (mut b, mut s) = (f64::MAX, f64::MAX);
    for _ in 0..5 {
        b = b.min(run(&bare, &ops, &mut slots));
        s = s.min(run(&stats, &ops, &mut slots));
    }
    println!("bare pool:          {b:.1} ns/op");
    println!("stats over pool:    {s:.1} ns/op");
    println!("ratio:              {:.3}", s / b);
    assert_eq!(stats.get_bytes_counter().value, 0);
}
