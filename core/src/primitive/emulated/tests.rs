extern crate std;

use super::{AtomicBool, AtomicU64};
use core::sync::atomic::Ordering::SeqCst;

/// What `core`'s atomics answer, call by call, including wrapping and a
/// failed exchange that changes nothing.
#[test]
fn each_call_answers_as_cores_atomics() {
    let mut a = AtomicU64::new(5);
    let b = core::sync::atomic::AtomicU64::new(5);
    assert_eq!(a.fetch_sub(7, SeqCst), b.fetch_sub(7, SeqCst));
    assert_eq!(a.fetch_add(3, SeqCst), b.fetch_add(3, SeqCst));
    assert_eq!(a.compare_exchange(9, 1, SeqCst, SeqCst), b.compare_exchange(9, 1, SeqCst, SeqCst));
    assert_eq!(a.compare_exchange(1, 9, SeqCst, SeqCst), b.compare_exchange(1, 9, SeqCst, SeqCst));
    assert_eq!(a.compare_exchange_weak(9, 4, SeqCst, SeqCst), Ok(9));
    assert_eq!(a.fetch_update(SeqCst, SeqCst, |v| v.checked_sub(5)), Err(4));
    assert_eq!(a.fetch_update(SeqCst, SeqCst, |v| v.checked_sub(3)), Ok(4));
    assert_eq!((a.swap(8, SeqCst), a.load(SeqCst)), (1, 8));
    *a.get_mut() += 1;
    assert_eq!((std::format!("{a:?}"), a.into_inner()), ("9".into(), 9));
    let f = AtomicBool::default();
    assert_eq!(f.compare_exchange_weak(false, true, SeqCst, SeqCst), Ok(false));
    assert_eq!(f.compare_exchange(false, true, SeqCst, SeqCst), Err(true));
    f.store(false, SeqCst);
    assert!(!f.swap(true, SeqCst) && f.load(SeqCst));
}

/// Read-modify-writes from several threads lose nothing, and a flag taken
/// by compare-and-swap is held by one thread at a time, as the spin lock
/// over emulated atomics takes it.
#[test]
fn threads_lose_no_update_and_the_flag_excludes() {
    let (n, flag, inside) = (AtomicU64::new(0), AtomicBool::new(false), AtomicU64::new(0));
    let rounds = crate::testing::steps(2_000) as u64;
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..rounds {
                    n.fetch_add(3, SeqCst);
                    n.fetch_sub(1, SeqCst);
                    while flag.compare_exchange_weak(false, true, SeqCst, SeqCst).is_err() {}
                    assert_eq!(inside.fetch_add(1, SeqCst), 0, "two threads hold the flag");
                    inside.fetch_sub(1, SeqCst);
                    flag.store(false, SeqCst);
                }
            });
        }
    });
    assert_eq!(n.into_inner(), 4 * 2 * rounds);
}
