//! What a promise of a resource as memory of an engine holds once the
//! resource is gone. The only test of its binary: every lookup prunes the
//! promises of all objects, and drops their engines once it lets go of the
//! lock, so a lookup of another test could drop this one's engine a moment
//! after this test looks.

use memres_containers::DeviceBuffer;
use memres_core::device::{promise_memory_of, set_per_device_resource_of};
use memres_core::{Block, MemoryResource, Request, Result as CoreResult};
use memres_sim::{HostCopy, HostMemory};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// An engine that says when it drops (a CUDA engine holds a context).
#[derive(Clone)]
struct Heavy(Arc<AtomicBool>);

impl Drop for Heavy {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Hands out nothing.
struct Nothing;

impl MemoryResource for Nothing {
    fn allocate(&self, _: Request, _: &()) -> CoreResult<Block> {
        Ok(Block::EMPTY)
    }
    fn deallocate(&self, _: Block, _: &()) -> CoreResult<()> {
        Ok(())
    }
}

// SAFETY: hands out no memory at all.
unsafe impl memres_core::copy::MemoryOf<Heavy> for Nothing {}

#[test]
fn a_promised_engine_drops_at_the_first_container_made_after_its_resource() {
    set_per_device_resource_of::<(), _, _>(0, Arc::new(HostMemory::new()), HostCopy);
    let dropped = Arc::new(AtomicBool::new(false));
    let mr = Arc::new(Nothing);
    promise_memory_of::<(), _, _>(&mr, Heavy(dropped.clone()));
    drop(mr);
    assert!(!dropped.load(Ordering::SeqCst), "held until a promise or a lookup, as documented");
    // A container made without a resource looks its resource's promise up.
    let _buf: DeviceBuffer<_, HostCopy> = DeviceBuffer::new(8, ()).unwrap();
    assert!(dropped.load(Ordering::SeqCst), "the engine of a promise whose resource is gone");
}
