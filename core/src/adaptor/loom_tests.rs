//! loom models of the adaptors' atomics and tables: `RUSTFLAGS="--cfg loom" cargo test
//! -p memres-core --features std --lib loom`.

use super::*;
use crate::testing::BumpUpstream;
use crate::{Inspect, MemoryResource, Request};
use alloc::sync::Arc;
use loom::thread;

/// Explores interleavings with at most three preemptions.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// Two threads allocate and hold: whatever the interleaving, the peak is the
/// sum (a load-then-store peak update would lose the larger one).
#[test]
fn statistics_peak_exact() {
    model(|| {
        let s = Arc::new(Statistics::new(BumpUpstream::new(1 << 20)));
        let t = {
            let s = s.clone();
            thread::spawn(move || s.allocate(Request::new(512).unwrap(), &()).unwrap())
        };
        let a = s.allocate(Request::new(256).unwrap(), &()).unwrap();
        let b = t.join().unwrap();
        assert_eq!(s.get_bytes_counter(), Counter { value: 768, peak: 768, total: 768 });
        s.deallocate(a, &()).unwrap();
        s.deallocate(b, &()).unwrap();
        assert_eq!(s.get_bytes_counter(), Counter { value: 0, peak: 768, total: 768 });
    });
}

/// Two threads race for the last room under a limit: exactly one wins, and
/// the count never passes the limit.
#[test]
fn limiting_one_winner() {
    model(|| {
        let l = Arc::new(Limiting::new(BumpUpstream::new(1 << 20), 512));
        let t = {
            let l = l.clone();
            thread::spawn(move || l.allocate(Request::new(512).unwrap(), &()).is_ok())
        };
        let mine = l.allocate(Request::new(512).unwrap(), &()).is_ok();
        let theirs = t.join().unwrap();
        assert!(mine ^ theirs);
        assert_eq!(l.get_allocated_bytes(), 512);
        assert_eq!(l.upstream().usage().held, 512);
    });
}

/// A stale copy of a block freed again (a double free) races the live
/// block at its address being freed and the address being handed out once
/// more: whatever the interleaving, the live block's free succeeds, the
/// stale one fails, and the charges are the live blocks'.
#[test]
fn limiting_double_free_beside_the_live_blocks_free() {
    use crate::{pool::CoalescingPool, Shared};
    // Threads with room for a pool on their stacks (two 8 KiB bin tables),
    // which loom's default coroutine stack of 32 KiB is not.
    fn big_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
        thread::Builder::new().stack_size(1 << 20).spawn(f).unwrap()
    }
    model(|| {
        big_stack(|| {
            let pool = Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 20)));
            let l = Arc::new(Limiting::new(pool, 1 << 20));
            let r = Request::new(1000).unwrap();
            let x = l.allocate(r, &()).unwrap();
            l.deallocate(x, &()).unwrap();
            let y = l.allocate(r, &()).unwrap();
            let stale = {
                let l = l.clone();
                big_stack(move || l.deallocate(x, &()))
            };
            assert_eq!(l.deallocate(y, &()), Ok(()));
            let z = l.allocate(r, &()).unwrap();
            assert!(stale.join().unwrap().is_err());
            assert_eq!((l.get_allocated_bytes(), l.upstream().usage().used), (1024, 1024));
            l.check().unwrap();
            l.deallocate(z, &()).unwrap();
            assert_eq!((l.get_allocated_bytes(), l.upstream().usage().used), (0, 0));
        })
        .join()
        .unwrap();
    });
}
