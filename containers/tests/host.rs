//! Every container method over host memory, through a coalescing pool with
//! a maximum size, with data round trips. The assertions are shared with
//! the other backends' container tests (`suite/mod.rs`).

#[macro_use]
mod suite;

use memres_core::pool::{CoalescingPool, PoolConfig};
use memres_core::{Inspect, Shared};
use memres_sim::{HostCopy, HostMemory};
use suite::Setup;

/// The pool's maximum size.
const MAX: u64 = 4 << 20;

struct HostPool {
    pool: Shared<CoalescingPool<HostMemory>>,
}

fn host_pool(_test: &str) -> Option<HostPool> {
    let config = PoolConfig::new().maximum_size(MAX);
    Some(HostPool { pool: Shared::new(CoalescingPool::with_config(HostMemory::new(), config, &()).unwrap()) })
}

impl Setup for HostPool {
    type S<'a> = ();
    type R<'a> = &'a Shared<CoalescingPool<HostMemory>>;
    type E<'a> = HostCopy;

    fn stream(&self) {}
    fn other_stream(&self) {}
    fn resource(&self) -> Self::R<'_> {
        &self.pool
    }
    fn engine(&self) -> HostCopy {
        HostCopy
    }
    fn used(&self) -> u64 {
        self.pool.with(|p| {
            p.check().unwrap();
            p.usage().used
        })
    }
    fn charge(&self, size: u64) -> Option<u64> {
        Some(size.div_ceil(256) * 256)
    }
    fn held(&self) -> u64 {
        self.pool.with(|p| p.usage().held)
    }
    fn too_many_u64(&self) -> usize {
        (MAX / 8 + 1) as usize
    }
}

container_suite!(host_pool);

/// `Clone` panics with `try_clone`'s typed error where the copy cannot be
/// made, and the source is untouched.
#[test]
fn clone_that_cannot_be_made_panics_with_the_typed_error() {
    let t = host_pool("clone panics").unwrap();
    let half = (MAX / 8 / 2 + 1) as usize;
    let v = memres_containers::DeviceUVector::from_slice_in(&vec![3u64; half], (), t.resource(), HostCopy)
        .unwrap();
    let expected = v.try_clone().map(|_| ()).unwrap_err();
    assert!(matches!(
        expected,
        memres_containers::ContainerError::Memory(memres_core::Error::OutOfMemory { .. })
    ));
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| v.clone())).unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(message.contains(&format!("{expected:?}")), "{message}");
    assert_eq!(v.element(half - 1).unwrap(), 3);
    drop(v);
    assert_eq!(t.used(), 0);
}
