use super::CallbackResource;
use crate::testing::BumpUpstream;
use crate::{Block, Error, Inspect, MemoryResource, Request, Result};
use core::sync::atomic::{AtomicU64, Ordering};

fn req(size: u64) -> Request {
    Request::new(size).unwrap()
}

/// Calls of each closure, and the upstream they delegate to.
struct Calls {
    up: BumpUpstream,
    allocs: AtomicU64,
    frees: AtomicU64,
}

type Counted =
    CallbackResource<Calls, fn(Request, &(), &Calls) -> Result<Block>, fn(Block, &(), &Calls) -> Result<()>>;

fn counted() -> Counted {
    CallbackResource::new(
        Calls { up: BumpUpstream::new(1 << 20), allocs: AtomicU64::new(0), frees: AtomicU64::new(0) },
        |r, s, c| {
            c.allocs.fetch_add(1, Ordering::Relaxed);
            c.up.allocate(r, s)
        },
        |b, s, c| {
            c.frees.fetch_add(1, Ordering::Relaxed);
            c.up.deallocate(b, s)
        },
    )
}

#[test]
fn each_call_goes_to_its_closure_with_the_context() {
    let r = counted();
    let b = r.allocate(req(1000), &()).unwrap();
    assert_eq!(r.context().up.usage().held, 1024, "bytes, rounded to 256");
    r.deallocate(b, &()).unwrap();
    let c = r.context();
    assert_eq!((c.allocs.load(Ordering::Relaxed), c.frees.load(Ordering::Relaxed)), (1, 1));
    assert_eq!(c.up.usage().held, 0);
}

#[test]
fn zero_bytes_and_the_empty_block_reach_no_closure() {
    let r = counted();
    assert_eq!(r.allocate(req(0), &()), Ok(Block::EMPTY));
    r.deallocate(Block::EMPTY, &()).unwrap();
    let c = r.context();
    assert_eq!((c.allocs.load(Ordering::Relaxed), c.frees.load(Ordering::Relaxed)), (0, 0));
}

#[test]
fn the_closures_errors_come_back_unchanged() {
    let r = counted();
    let too_big = r.allocate(req(2 << 20), &()).unwrap_err();
    assert!(matches!(too_big, Error::OutOfMemory { requested, .. } if requested == 2 << 20));
    r.context().up.fail_after(0);
    assert!(matches!(
        r.allocate(req(1000), &()),
        Err(Error::Backend { what: "injected upstream failure", .. })
    ));
    assert_eq!(r.context().up.usage().held, 0);
}

/// A block that does not answer the request goes back to the free
/// closure at once; an empty one (no memory) reaches no closure, as the
/// empty block's free never does.
#[test]
fn a_block_that_does_not_answer_is_given_back_unless_empty() {
    let frees = AtomicU64::new(0);
    let r = CallbackResource::new(
        &frees,
        |req: Request, _: &(), _: &&AtomicU64| {
            Ok(if req.size() == 1000 { Block::EMPTY } else { Block::from_addr(1 << 20, 10) })
        },
        |b: Block, _: &(), frees: &&AtomicU64| {
            assert!(!b.is_empty(), "the empty block reached the free closure");
            frees.fetch_add(1, Ordering::Relaxed);
            Ok(())
        },
    );
    assert_eq!(r.allocate(req(1000), &()), Err(Counted::BAD_BLOCK));
    assert_eq!(frees.load(Ordering::Relaxed), 0);
    assert_eq!(r.allocate(req(2000), &()), Err(Counted::BAD_BLOCK));
    assert_eq!(frees.load(Ordering::Relaxed), 1);
}
