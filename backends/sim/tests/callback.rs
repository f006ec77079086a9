//! The callback resource over the simulated device: as a leaf, under a
//! pool, in a built stack under a name of the program's, and refusing the
//! blocks that do not answer a request.

use memres_core::adaptor::Statistics;
use memres_core::callback::CallbackResource;
use memres_core::pool::CoalescingPool;
use memres_core::stack::StackErrorKind;
use memres_core::{Block, DynResource, Error, Inspect, MemoryResource, Request, Shared};
use memres_sim::{builder, SimDevice};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

fn req(size: u64) -> Request {
    Request::new(size).unwrap()
}

/// The context of [`over`]: the device, and how the closures misplace its
/// blocks.
struct Moved {
    device: SimDevice,
    shift: u64,
    grow: u64,
}

type Leaf = CallbackResource<
    Moved,
    fn(Request, &(), &Moved) -> memres_core::Result<Block>,
    fn(Block, &(), &Moved) -> memres_core::Result<()>,
>;

/// A callback resource over `device`, whose allocate closure moves each
/// block it gets by `shift` bytes and states `grow` more bytes than it has
/// (0 and 0: the device's blocks as they are).
fn over(device: SimDevice, shift: u64, grow: u64) -> Leaf {
    CallbackResource::new(
        Moved { device, shift, grow },
        |r, s, m| {
            let b = m.device.allocate(r, s)?;
            Ok(Block::new(b.addr() + m.shift, b.size() + m.grow, b.tag()))
        },
        |b, s, m| m.device.deallocate(Block::new(b.addr() - m.shift, b.size() - m.grow, b.tag()), s),
    )
}

#[test]
fn a_leaf_over_the_device_and_a_pool_over_it() {
    let leaf = over(SimDevice::new(1 << 30), 0, 0);
    let b = leaf.allocate(Request::aligned(1000, 4096).unwrap(), &()).unwrap();
    assert_eq!((b.addr() % 4096, b.size()), (0, 1000));
    assert_eq!(leaf.context().device.usage().held, 1024);
    leaf.deallocate(b, &()).unwrap();
    // The device's answer to a double free comes back as it is.
    assert!(matches!(leaf.deallocate(b, &()), Err(Error::DoubleFree { .. } | Error::UnknownBlock { .. })));
    let pool = Shared::new(CoalescingPool::new(&leaf));
    let blocks: Vec<Block> = (1..50).map(|i| pool.allocate(req(i * 1000), &()).unwrap()).collect();
    for b in blocks {
        pool.deallocate(b, &()).unwrap();
    }
    assert!(leaf.context().device.usage().held > 0);
    pool.with(|p| p.release(&())).unwrap();
    assert_eq!(leaf.context().device.usage().held, 0, "the pool gave its chunks back through the closure");
}

#[test]
fn a_block_that_does_not_answer_the_request_is_given_back_and_refused() {
    for (shift, grow, what) in [(64, 0, "not aligned as asked"), (0, 256, "not sized as asked")] {
        let leaf = over(SimDevice::new(1 << 30), shift, grow);
        let calls = leaf.context().device.call_counts();
        let err = leaf.allocate(req(1000), &()).unwrap_err();
        assert!(
            matches!(err, Error::UpstreamMisbehaved { addr, size, what: w } if addr % 256 == shift && size == 1000 + grow && w == what),
            "{err}"
        );
        assert_eq!(leaf.context().device.usage().held, 0, "{what}: given back");
        assert_eq!(leaf.context().device.call_counts(), (calls.0 + 1, calls.1 + 1), "{what}");
    }
    // Usable after a refusal: a closure that answers wrongly once.
    let wrong_once = AtomicU64::new(1);
    let device = SimDevice::new(1 << 30);
    let leaf = CallbackResource::new(
        &device,
        |r: Request, s: &(), d: &&SimDevice| {
            let b = d.allocate(r, s)?;
            Ok(if wrong_once.fetch_sub(1, Ordering::Relaxed) == 1 {
                Block::new(b.addr() + 1, b.size(), b.tag())
            } else {
                b
            })
        },
        |b: Block, s: &(), d: &&SimDevice| d.deallocate(Block::new(b.addr() & !255, b.size(), b.tag()), s),
    );
    assert!(leaf.allocate(req(1000), &()).is_err());
    let b = leaf.allocate(req(1000), &()).unwrap();
    leaf.deallocate(b, &()).unwrap();
    assert_eq!(device.usage().held, 0);
}

#[test]
fn a_stack_uses_one_under_a_name_of_the_programs() {
    let leaf = Arc::new(over(SimDevice::new(1 << 30), 0, 0));
    let mut b = builder::<()>();
    b.register_resource("mine", leaf.clone());
    let built = b.build_with_handles("stats(pool(mine, initial=1MiB))", &()).unwrap();
    let x = built.resource.allocate(req(1000), &()).unwrap();
    assert_eq!(built.get::<Statistics<DynResource>>("stats").unwrap().get_bytes_counter().value, 1000);
    assert_eq!(
        leaf.context().device.usage().held,
        1 << 20,
        "the pool's initial chunk came through the closure"
    );
    built.resource.deallocate(x, &()).unwrap();
    let pool = built.get::<Shared<CoalescingPool<DynResource>>>("pool").unwrap();
    pool.with(|p| p.release(&())).unwrap();
    assert_eq!(leaf.context().device.usage().held, 0);
    // The name takes no arguments: there is nothing a string could say to it.
    let e = b.build("pool(mine(1GiB))", &()).err().unwrap();
    assert_eq!(e.kind, StackErrorKind::ExtraArg, "{e}");
    assert_eq!(e.pos, 10);
}
