use super::{Allocate, AllocateOn};
use crate::adaptor::Statistics;
use crate::pool::CoalescingPool;
use crate::testing::{BumpUpstream, IdStream};
// Not `MemoryResource`: its methods have `Allocate`'s names.
use crate::{Block, Error, Inspect, MemoryResourceMut, Request, Shared};

#[test]
fn allocate_and_deallocate_by_size_serve_as_the_long_form() {
    let stats = Statistics::new(Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 30))));
    let a = stats.allocate(1000).unwrap();
    assert_eq!((a.size(), a.addr() % 256), (1000, 0));
    let s = IdStream(3);
    let b = stats.allocate_on(24, &s).unwrap();
    assert_eq!(stats.get_bytes_counter().value, 1024);
    stats.deallocate_on(b, &s).unwrap();
    stats.deallocate(a).unwrap();
    assert_eq!((stats.get_bytes_counter().value, stats.get_bytes_counter().peak), (0, 1024));
}

#[test]
fn bad_input_through_the_short_path_is_typed_and_changes_nothing() {
    let stats = Statistics::new(Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 30))));
    let live = stats.allocate(100).unwrap();
    let too_big = Request::MAX_SIZE + 1;
    assert_eq!(
        stats.allocate(too_big),
        Err(Error::InvalidSize { size: too_big, what: "above Request::MAX_SIZE" })
    );
    assert_eq!(
        stats.allocate_on(too_big, &IdStream(1)),
        Err(Error::InvalidSize { size: too_big, what: "above Request::MAX_SIZE" })
    );
    assert!(stats.allocate(u64::MAX).is_err());
    // A block the pool never handed out, and one freed twice.
    let forged = Block::from_addr(live.addr() + (1 << 40), 256);
    let e = stats.deallocate(forged);
    assert!(matches!(e, Err(Error::UnknownBlock { .. })), "{e:?}");
    assert_eq!(
        (
            stats.get_bytes_counter().value,
            stats.get_allocations_counter().value,
            stats.get_allocations_counter().total
        ),
        (100, 1, 1)
    );
    stats.deallocate(live).unwrap();
    assert!(stats.deallocate(live).is_err());
    assert_eq!(stats.get_bytes_counter().value, 0);
    stats.check().unwrap();

    // Still usable.
    let again = stats.allocate(100).unwrap();
    stats.deallocate(again).unwrap();
}

#[test]
fn a_plain_pool_borrowed_mutably_goes_under_shared_and_adaptors_without_moving() {
    let mut pool = CoalescingPool::new(BumpUpstream::new(1 << 30));
    {
        let stats = Statistics::new(Shared::new(&mut pool));
        let b = stats.allocate(4096).unwrap();
        stats.deallocate(b).unwrap();
        assert_eq!(stats.get_bytes_counter().peak, 4096);
    }
    // The pool kept what it grew and is ours again.
    let held = pool.usage().held;
    assert!(held >= 4096);
    let b = MemoryResourceMut::allocate(&mut pool, Request::new(4096).unwrap(), &()).unwrap();
    assert_eq!(pool.usage().held, held, "served from what it kept");
    MemoryResourceMut::deallocate(&mut pool, b, &()).unwrap();
    // And a shared pool under an adaptor by reference.
    let shared = Shared::new(pool);
    let stats = Statistics::new(&shared);
    let b = stats.allocate(10).unwrap();
    assert!(crate::MemoryResource::<()>::is_equal(&shared, &&shared));
    stats.deallocate(b).unwrap();
}

#[test]
fn allocate_aligned_asks_for_the_alignment_and_refuses_one_no_request_can_have() {
    let stats = Statistics::new(Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 30))));
    let s = IdStream(2);
    let a = stats.allocate_aligned(1000, 1 << 16).unwrap();
    let b = stats.allocate_aligned_on(10, 1 << 20, &s).unwrap();
    assert_eq!((a.size(), a.addr() % (1 << 16), b.size(), b.addr() % (1 << 20)), (1000, 0, 10, 0));
    for align in [0, 3, Request::MAX_ALIGN << 1] {
        assert_eq!(stats.allocate_aligned(1, align), Err(Error::InvalidAlignment { align }));
        assert_eq!(stats.allocate_aligned_on(1, align, &s), Err(Error::InvalidAlignment { align }));
    }
    assert_eq!(stats.get_allocations_counter().value, 2);
    stats.deallocate_on(b, &s).unwrap();
    stats.deallocate(a).unwrap();
    assert_eq!(stats.get_bytes_counter().value, 0);
}
