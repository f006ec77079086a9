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
    let shorter = |addr, size| Err(Error::UpstreamMisbehaved { addr, size, what: "shorter than asked" });
    assert_eq!(r.allocate(req(1000), &()), shorter(0, 0));
    assert_eq!(frees.load(Ordering::Relaxed), 0);
    assert_eq!(r.allocate(req(2000), &()), shorter(1 << 20, 10));
    assert_eq!(frees.load(Ordering::Relaxed), 1);
}

/// A block that does not answer the request is the closures' fault
/// (`UpstreamMisbehaved`, naming the block and what is wrong), not a
/// backend's: it goes back to the deallocate closure, nothing stays
/// lent, and the resource serves on.
#[test]
fn a_bad_block_is_the_closures_fault_and_goes_back() {
    let top = u64::MAX - 255;
    let cases = [
        ((1 << 30) + 128, 1000, req(1000), "not aligned as asked"),
        ((1 << 30) + 1024, 1000, Request::aligned(1000, 4096).unwrap(), "not aligned as asked"),
        (1 << 30, 999, req(1000), "shorter than asked"),
        (1 << 30, 1256, req(1000), "not sized as asked"),
        (top, 1000, req(1000), "running past the last address"),
    ];
    for (addr, size, request, what) in cases {
        // Lends the one block, and takes it back once.
        let lent = AtomicU64::new(0);
        let r = CallbackResource::new(
            &lent,
            |r: Request, _: &(), lent: &&AtomicU64| {
                lent.fetch_add(1, Ordering::Relaxed);
                Ok(Block::from_addr(addr, if r.size() == 1 { 1 } else { size }))
            },
            |b: Block, _: &(), lent: &&AtomicU64| {
                assert_eq!(b, Block::from_addr(addr, b.size()), "{what}: another block given back");
                lent.fetch_sub(1, Ordering::Relaxed);
                Ok(())
            },
        );
        let err = r.allocate(request, &()).unwrap_err();
        assert_eq!(err, Error::UpstreamMisbehaved { addr, size, what }, "{what}");
        assert_eq!(lent.load(Ordering::Relaxed), 0, "{what}: the block went back");
        // Serves on: a request the closure answers as asked.
        if addr % 256 == 0 {
            let b = r.allocate(req(1), &()).unwrap();
            r.deallocate(b, &()).unwrap();
            assert_eq!(lent.load(Ordering::Relaxed), 0, "{what}");
        }
    }
}
