//! loom models of [`Planned`] shared by threads: `RUSTFLAGS="--cfg loom"
//! cargo test -p memres-core --features std --release --lib loom`.

use super::*;
use crate::pool::CoalescingPool;
use crate::testing::loom::{model, spawn};
use crate::testing::BumpUpstream;
use alloc::sync::Arc;
use std::sync::Mutex;

type Up = Shared<CoalescingPool<BumpUpstream>>;

fn planned() -> Arc<Planned<Up>> {
    Arc::new(Planned::new(Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 30)))))
}

const N: u64 = 1024;

fn req() -> Request {
    Request::new(N).unwrap()
}

/// The blocks the program holds, apart from one another: taken as
/// `allocate` returns, left before `deallocate` is called (the block may
/// be handed out again before that returns). A plain mutex: it only
/// watches, and loom need not interleave it.
#[derive(Default)]
struct Live(Mutex<Vec<Block>>);

impl Live {
    fn take(&self, b: Block) -> Block {
        let mut live = self.0.lock().unwrap();
        assert!(live.iter().all(|l| !l.range().overlaps(&b.range())), "{b:?} over one of {live:?}");
        live.push(b);
        b
    }

    fn leave(&self, b: Block) -> Block {
        self.0.lock().unwrap().retain(|l| *l != b);
        b
    }
}

/// Nothing in use, what the layer holds is what the pool has in use, and
/// the checkers hold.
fn settled(p: &Planned<Up>) {
    p.check().unwrap();
    assert_eq!(p.usage().used, 0);
    assert_eq!(p.held(), p.upstream().usage().used);
}

/// In a recorded step one thread frees a block of the upstream while
/// another allocates one of its size, which the pool may hand out at the
/// freed address: whatever the interleaving, the record ends the freed
/// block's life and keeps the new one live under its address.
/// Preemption bound: 4.
#[test]
fn loom_planned_records_a_free_beside_an_allocation_at_its_address() {
    model(Some(4), || {
        let p = planned();
        p.step(&()).unwrap();
        let a = p.allocate(req(), &()).unwrap();
        let t = {
            let p = p.clone();
            spawn(move || p.allocate(req(), &()).unwrap())
        };
        p.deallocate(a, &()).unwrap();
        let b = t.join().unwrap();
        p.state.with(|s| {
            assert_ne!(s.record[0].0.end, OPEN, "a ended");
            assert_eq!(s.record[1].0.end, OPEN, "b lives");
            assert_eq!(s.born.iter().map(|(&at, &k)| (at, k)).collect::<Vec<_>>(), [(b.addr(), 1)]);
        });
        p.deallocate(b, &()).unwrap();
        settled(&p);
    });
}

/// A planned step (x, x freed, y, y freed: both at the region's start):
/// one thread frees x and begins the next step while another allocates
/// and frees y and then gives back what it can: whatever the interleaving,
/// no block lies over a live one, and at the end nothing is in use, the
/// layer holds what the pool has in use, and a release gives everything
/// back. Preemption bound: 3 (4 takes ten times as long: 20 s).
#[test]
fn loom_planned_step_beside_an_allocation_and_a_release() {
    model(Some(3), || {
        let p = planned();
        let shape = |p: &Planned<Up>| {
            let x = p.allocate(req(), &()).unwrap();
            p.deallocate(x, &()).unwrap();
            let y = p.allocate(req(), &()).unwrap();
            p.deallocate(y, &()).unwrap();
        };
        for _ in 0..2 {
            p.step(&()).unwrap();
            shape(&p);
        }
        p.step(&()).unwrap();
        assert_eq!(p.steps().region, N, "laid out");
        let live = Arc::new(Live::default());
        let x = live.take(p.allocate(req(), &()).unwrap());
        let t = {
            let (p, live) = (p.clone(), live.clone());
            spawn(move || {
                let y = live.take(p.allocate(req(), &()).unwrap());
                p.deallocate(live.leave(y), &()).unwrap();
                p.release(&()).unwrap();
            })
        };
        p.deallocate(live.leave(x), &()).unwrap();
        // Refused while the release gives regions back.
        assert!(matches!(p.step(&()), Ok(()) | Err(Error::Reentrant)));
        t.join().unwrap();
        settled(&p);
        p.release(&()).unwrap();
        assert_eq!((p.held(), p.upstream().usage().used), (0, 0));
        p.check().unwrap();
    });
}

/// Two gradients carried from step to step (`N` and `2 N` bytes): in the
/// first planned step, after the recorded step's gradients are freed, two
/// threads allocate one each at once, and each may take the carry region
/// (one of the two then goes back): whatever the interleaving, the
/// gradients lie apart, and once freed nothing is in use, the layer holds
/// what the pool has in use, and a release gives everything back.
/// Preemption bound: 4.
#[test]
fn loom_planned_carried_blocks_allocated_at_once() {
    model(Some(4), || {
        let p = planned();
        let mut grads: Vec<Block> = Vec::new();
        for _ in 0..3 {
            p.step(&()).unwrap();
            for g in grads.drain(..) {
                p.deallocate(g, &()).unwrap();
            }
            if p.steps().steps < 3 {
                grads =
                    [N, 2 * N].iter().map(|&n| p.allocate(Request::new(n).unwrap(), &()).unwrap()).collect();
            }
        }
        let live = Arc::new(Live::default());
        let t = {
            let (p, live) = (p.clone(), live.clone());
            spawn(move || live.take(p.allocate(Request::new(2 * N).unwrap(), &()).unwrap()))
        };
        let g1 = live.take(p.allocate(req(), &()).unwrap());
        let g2 = t.join().unwrap();
        p.check().unwrap();
        for g in [g1, g2] {
            p.deallocate(live.leave(g), &()).unwrap();
        }
        settled(&p);
        p.release(&()).unwrap();
        assert_eq!((p.held(), p.upstream().usage().used), (0, 0));
    });
}
