//! loom models of the adaptors' atomics: `RUSTFLAGS="--cfg loom" cargo test
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
