extern crate std;

use super::*;
use crate::testing::{BumpUpstream, TestStream};
use crate::Request;

/// An engine type of these tests; the value tells which one was promised.
#[derive(Clone, Debug, PartialEq)]
struct Engine(u32);
/// Another engine type, never promised.
#[derive(Clone, Debug)]
struct OtherEngine;

/// Numbers from a bump upstream, promised (in these tests only) as memory
/// of `Engine`.
struct Numbers(BumpUpstream);

impl<S: Stream + ?Sized> MemoryResource<S> for Numbers {
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        self.0.allocate(request, stream)
    }
    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        self.0.deallocate(block, stream)
    }
}

// SAFETY: `Engine` is no copy engine: nothing ever touches these blocks.
unsafe impl MemoryOf<Engine> for Numbers {}

fn numbers() -> Arc<Numbers> {
    Arc::new(Numbers(BumpUpstream::new(1 << 20)))
}

fn is_not_promised<T>(r: Result<T>) -> bool {
    matches!(r, Err(e) if e == NOT_PROMISED)
}

#[test]
fn a_resource_set_with_its_promise_is_handed_out_for_its_engine_only() {
    let reg = Registry::new();
    let mr = numbers();
    assert!(reg.set_per_device_resource_of::<(), _, _>(3, mr.clone(), Engine(7)).is_none());
    let (current, engine) = reg.get_per_device_resource_of::<(), Engine>(3).unwrap();
    assert_eq!(engine, Engine(7));
    assert_eq!(address(current.resource()), Arc::as_ptr(&mr) as usize);
    // It serves the stream and references to it (a container's `&S`).
    let b = current.allocate(Request::new(100).unwrap(), &&()).unwrap();
    current.deallocate(b, &()).unwrap();
    assert!(
        is_not_promised(reg.get_per_device_resource_of::<(), OtherEngine>(3)),
        "promised for one engine only"
    );
    assert!(reg.get_per_device_resource_of::<(), Engine>(4).is_err(), "and for the device it was set on");
    assert!(reg.get_per_device_resource_of::<TestStream, Engine>(3).is_err(), "and for its stream type");
}

#[test]
fn a_resource_set_without_a_promise_is_refused_and_the_promised_one_comes_back() {
    let reg = Registry::new();
    let mr = numbers();
    reg.set_per_device_resource_of::<(), _, _>(0, mr.clone(), Engine(1));
    // The same kind of object, set without the promise.
    let plain: DynResource = numbers();
    reg.set_per_device_resource::<()>(0, plain.clone());
    assert!(is_not_promised(reg.get_per_device_resource_of::<(), Engine>(0)));
    // Every other user of the registry sees the plain one, as set.
    assert!(Arc::ptr_eq(&reg.get_per_device_resource::<()>(0).unwrap(), &plain));
    // The promise stayed with its object.
    reg.set_per_device_resource::<()>(0, mr);
    assert_eq!(reg.get_per_device_resource_of::<(), Engine>(0).unwrap().1, Engine(1));
    // A second promise of the object replaces its engine.
    let mr = numbers();
    reg.set_per_device_resource_of::<(), _, _>(0, mr.clone(), Engine(2));
    promise_memory_of::<(), _, _>(&mr, Engine(3));
    assert_eq!(reg.get_per_device_resource_of::<(), Engine>(0).unwrap().1, Engine(3));
}

#[test]
fn a_default_factory_that_promises_serves_the_engine() {
    fn promising(_: DeviceId) -> Result<DynResource<TestStream<2>>> {
        let mr = numbers();
        promise_memory_of::<TestStream<2>, _, _>(&mr, Engine(9));
        Ok(mr)
    }
    fn plain(_: DeviceId) -> Result<DynResource<TestStream<3>>> {
        Ok(numbers())
    }
    let reg = Registry::new();
    reg.set_default_factory::<TestStream<2>>(promising);
    reg.set_default_factory::<TestStream<3>>(plain);
    let (current, engine) = reg.get_per_device_resource_of::<TestStream<2>, Engine>(5).unwrap();
    assert_eq!(engine, Engine(9));
    assert!(
        Arc::ptr_eq(current.resource(), &reg.get_per_device_resource::<TestStream<2>>(5).unwrap()),
        "the device's default"
    );
    assert!(is_not_promised(reg.get_per_device_resource_of::<TestStream<3>, Engine>(5)));
    assert!(
        matches!(
            reg.get_per_device_resource_of::<TestStream<4>, Engine>(5),
            Err(Error::InvalidConfig { .. })
        ),
        "no factory"
    );
}

#[test]
fn a_promise_ends_with_its_object() {
    let mr = numbers();
    let erased: DynResource<TestStream<5>> = mr.clone();
    let key = (TypeId::of::<TestStream<5>>(), TypeId::of::<Engine>(), address(&erased));
    promise_memory_of::<TestStream<5>, _, _>(&mr, Engine(0));
    assert!(PROMISES.read().unwrap().contains_key(&key));
    drop((mr, erased));
    // The next promise prunes it (its object is gone).
    let other = numbers();
    promise_memory_of::<TestStream<6>, _, _>(&other, Engine(0));
    assert!(!PROMISES.read().unwrap().contains_key(&key));
}

#[test]
fn a_lookup_prunes_the_promises_whose_objects_are_gone() {
    let reg = Registry::new();
    reg.set_per_device_resource_of::<TestStream<11>, _, _>(0, numbers(), Engine(1));
    let mr = numbers();
    let erased: DynResource<TestStream<10>> = mr.clone();
    let key = (TypeId::of::<TestStream<10>>(), TypeId::of::<Engine>(), address(&erased));
    promise_memory_of::<TestStream<10>, _, _>(&mr, Engine(0));
    drop((mr, erased));
    // A lookup of another object, with no promise made since.
    assert_eq!(reg.get_per_device_resource_of::<TestStream<11>, Engine>(0).unwrap().1, Engine(1));
    assert!(!PROMISES.read().unwrap().contains_key(&key));
}

#[test]
fn a_current_resource_is_equal_to_the_resource_it_views_and_its_clones() {
    let reg = Registry::new();
    let mr = numbers();
    reg.set_per_device_resource_of::<(), _, _>(6, mr.clone(), Engine(0));
    let (a, _) = reg.get_per_device_resource_of::<(), Engine>(6).unwrap();
    let (b, _) = reg.get_per_device_resource_of::<(), Engine>(6).unwrap();
    assert!(MemoryResource::<()>::is_equal(&a, &b), "two views of one current resource");
    assert!(MemoryResource::<()>::is_equal(&a, &a.clone()));
    assert!(MemoryResource::<()>::is_equal(&a, &mr), "a view and what it views");
    assert!(!MemoryResource::<()>::is_equal(&a, &numbers()), "another object");
}

#[test]
fn global_functions() {
    let mr = numbers();
    set_per_device_resource_of::<TestStream<7>, _, _>(1, mr, Engine(4));
    assert_eq!(get_per_device_resource_of::<TestStream<7>, Engine>(1).unwrap().1, Engine(4));
    assert!(is_not_promised(get_per_device_resource_of::<TestStream<7>, OtherEngine>(1)));
}

/// Runs `f` on a thread of its own; whether it ended within five seconds
/// (a thread stuck on the promises' lock holds it for good, so a failing
/// run also hangs the tests that come after it in this binary).
fn ends(f: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(std::time::Duration::from_secs(5)).is_ok()
}

/// An engine whose `Clone` and `Drop` use the promises, as a user's engine may.
#[derive(Debug)]
struct Busy(u32);

impl Clone for Busy {
    fn clone(&self) -> Self {
        promise_memory_of::<TestStream<9>, _, _>(&numbers(), Engine(self.0));
        Busy(self.0)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = Registry::new().get_per_device_resource_of::<TestStream<9>, Engine>(0);
        promise_memory_of::<TestStream<9>, _, _>(&numbers(), Engine(self.0));
    }
}

// SAFETY: `Busy` is no copy engine: nothing ever touches these blocks.
unsafe impl MemoryOf<Busy> for Numbers {}

#[test]
fn an_engine_whose_clone_or_drop_uses_the_promises_does_not_hang() {
    assert!(ends(|| {
        let reg = Registry::new();
        let mr = numbers();
        reg.set_per_device_resource_of::<TestStream<8>, _, _>(0, mr.clone(), Busy(1));
        // The engine is cloned for the caller: `Busy::clone` promises.
        let (_, engine) = reg.get_per_device_resource_of::<TestStream<8>, Busy>(0).unwrap();
        assert_eq!(engine.0, 1);
        // A second promise of the object replaces the engine: the old one drops.
        promise_memory_of::<TestStream<8>, _, _>(&mr, Busy(2));
        assert_eq!(reg.get_per_device_resource_of::<TestStream<8>, Busy>(0).unwrap().1 .0, 2);
        // With the object gone, the next promise prunes its entry: its engine drops.
        drop(reg);
        drop(mr);
        promise_memory_of::<TestStream<8>, _, _>(&numbers(), Engine(0));
        // So does the next lookup.
        let reg = Registry::new();
        reg.set_per_device_resource_of::<TestStream<8>, _, _>(0, numbers(), Engine(1));
        promise_memory_of::<TestStream<8>, _, _>(&numbers(), Busy(3));
        assert!(reg.get_per_device_resource_of::<TestStream<8>, Engine>(0).is_ok());
    }));
}
