//! loom models of memres's shared state. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p memres-tests --release --test loom`.
//! Each model states its preemption bound; loom explores every interleaving
//! within it.
#![cfg(loom)]

use loom::thread;
use memres_core::pool::CoalescingPool;
use memres_core::testing::BumpUpstream;
use memres_core::{MemoryResource, Request, Shared};
use std::sync::Arc;

fn model(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(bound);
    b.check(f);
}

/// Two threads increment through the lock wrapper: no update is lost.
/// Preemption bound: 3.
#[test]
fn shared_excludes() {
    model(3, || {
        let counter = Arc::new(Shared::<u32>::new(0));
        let c2 = counter.clone();
        let t = thread::spawn(move || c2.with(|c| *c += 1));
        counter.with(|c| *c += 1);
        t.join().unwrap();
        assert_eq!(counter.with(|c| *c), 2);
    });
}

/// Two threads allocate through a shared pool at once, one also frees: the
/// live blocks never overlap and the pool ends empty and consistent.
/// Preemption bound: 2.
#[test]
fn shared_pool_two_threads() {
    model(2, || {
        let pool = Arc::new(Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 30))));
        let p2 = pool.clone();
        let t = thread::spawn(move || {
            let freed = p2.allocate(Request::new(256).unwrap(), &()).unwrap();
            p2.deallocate(freed, &()).unwrap();
            p2.allocate(Request::new(1000).unwrap(), &()).unwrap()
        });
        let a = pool.allocate(Request::new(3000).unwrap(), &()).unwrap();
        let b = t.join().unwrap();
        assert!(!a.range().overlaps(&b.range()), "{a:?} overlaps {b:?}");
        pool.deallocate(a, &()).unwrap();
        pool.deallocate(b, &()).unwrap();
        pool.with(|p| {
            p.check().unwrap();
            assert_eq!(p.used_bytes(), 0);
        });
    });
}
