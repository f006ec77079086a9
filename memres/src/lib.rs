//! memres: a GPU memory manager in the spirit of RAPIDS RMM, in one crate.
//!
//! ```toml
//! [dependencies]
//! # Not on crates.io: the `memres/` directory of a checkout of this repository.
//! memres = { path = "../memres/memres", features = ["cuda"] }  # or no features: the simulated device
//! ```
//!
//! This crate re-exports the core ([`memres_core`]: the resources, the
//! adaptors, the traits, all at this crate's root), the containers
//! ([`DeviceBuffer`], [`DeviceUVector`], [`DeviceScalar`], and
//! [`containers`]), and behind features the simulator ([`sim`], feature
//! `sim`, on by default) and the CUDA backend (`cuda`, feature `cuda`).
//! [`device`] gives every device a default resource, as RMM does.
//!
//! # First program
//!
//! A pool over the current device, counted:
//!
//! ```
//! # #[cfg(not(feature = "cuda"))] { // over the simulated device
//! use memres::prelude::*;
//!
//! let mr = Statistics::new(Shared::new(CoalescingPool::new(get_current_device_resource()?)));
//! let block = mr.allocate(1000)?;
//! mr.deallocate(block)?;
//! assert_eq!(mr.get_bytes_counter().peak, 1000);
//! # }
//! # Ok::<(), memres::Error>(())
//! ```
//!
//! With the `cuda` feature the same lines serve from the GPU (the device's
//! `cuMemAlloc` resource under the pool; `memres/tests/cuda.rs` runs them
//! on a GPU) and the containers copy real bytes; with a stream,
//! `allocate_on(size, &stream)`:
//!
//! ```no_run
//! # #[cfg(feature = "cuda")] {
//! use memres::cuda::{CudaCopy, CudaStream, Device};
//! use memres::prelude::*;
//! let mr = Statistics::new(Shared::new(CoalescingPool::new(get_current_device_resource()?)));
//! let stream = CudaStream::new(Device::current()?)?;
//! let block = mr.allocate_on(1 << 20, &stream)?;
//! mr.deallocate_on(block, &stream)?;
//! // Containers made without a resource take the device's current one:
//! // here its default, not `mr` (`device::set_per_device_resource_of`
//! // makes a resource current for them, with the engine it serves).
//! let v = DeviceUVector::<f32, _, CudaCopy, _>::from_slice(&[1.0, 2.0], &stream).unwrap();
//! assert_eq!(v.clone().to_vec().unwrap(), [1.0, 2.0]);
//! # }
//! # Ok::<(), memres::Error>(())
//! ```
//!
//! # The prelude and the two forms of a call
//!
//! [`prelude`] brings the short path: [`Allocate`] (`allocate(size)`,
//! `allocate_aligned(size, align)`, `deallocate(block)` where the stream
//! is `()`) and [`AllocateOn`] (`allocate_on(size, &stream)`,
//! `allocate_aligned_on`); the errors are the typed [`Error`]. The full
//! form, [`MemoryResource`] (`allocate(Request, &stream)`), has the same
//! method names: it is not in the prelude, and a module that imports both
//! names the trait at the call
//! (`MemoryResource::allocate(&mr, Request::aligned(100, 4096)?, &())`).
//!
//! # The tour
//!
//! Every resource below is over the simulated device ([`SimDevice`](sim::SimDevice)),
//! whose addresses are numbers with no bytes behind them; host memory
//! ([`HostMemory`](sim::HostMemory)) has bytes. Plain algorithms
//! ([`MemoryResourceMut`], `&mut self`) go behind [`Shared`] (a lock) to be
//! shared; `&mut pool` and `&pool` serve as well as the pool, so adaptors
//! need not take it by value.
//!
//! [`CoalescingPool`](pool::CoalescingPool): the pool, O(1), coalescing.
//!
//! ```
//! use memres::{pool::CoalescingPool, prelude::*, sim::SimDevice};
//! let mut pool = CoalescingPool::new(SimDevice::new(1 << 30));
//! let shared = Shared::new(&mut pool); // borrowed, not moved
//! let b = shared.allocate(1000)?;
//! shared.deallocate(b)?;
//! # Ok::<(), memres::Error>(())
//! ```
//!
//! [`FixedSizeResource`](fixed::FixedSizeResource): blocks of one size.
//!
//! ```
//! use memres::{fixed::FixedSizeResource, prelude::*, sim::SimDevice};
//! let fixed = Shared::new(FixedSizeResource::new(SimDevice::new(1 << 30)));
//! let b = fixed.allocate(100)?;
//! assert_eq!(b.size(), 100);
//! fixed.deallocate(b)?;
//! # Ok::<(), memres::Error>(())
//! ```
//!
//! [`BinningResource`](binning::BinningResource): sizes routed to bins, the
//! rest upstream.
//!
//! ```
//! use memres::{binning::BinningResource, prelude::*, sim::SimDevice};
//! let device = SimDevice::new(1 << 30);
//! let bins = BinningResource::with_exponents(&device, 8, 16)?; // bins of 256 B to 64 KiB
//! let (small, large) = (bins.allocate(300)?, bins.allocate(1 << 20)?);
//! bins.deallocate(small)?;
//! bins.deallocate(large)?;
//! # Ok::<(), memres::Error>(())
//! ```
//!
//! [`ArenaResource`](arena::ArenaResource): arenas per thread and per
//! stream, for many threads.
//!
//! ```
//! use memres::{arena::ArenaResource, prelude::*, sim::SimDevice};
//! let arena = ArenaResource::new(SimDevice::new(1 << 30));
//! std::thread::scope(|s| {
//!     for _ in 0..4 {
//!         s.spawn(|| arena.deallocate(arena.allocate(4096).unwrap()).unwrap());
//!     }
//! });
//! ```
//!
//! [`StreamOrdered`]: per-stream free lists over any algorithm; a block
//! reaches another stream only after an event wait.
//!
//! ```
//! use memres::{pool::CoalescingPool, prelude::*, sim::{SimDevice, SimWorld}, StreamOrdered};
//! let world = SimWorld::new();
//! let (a, b) = (world.stream(), world.stream());
//! let so = Shared::new(StreamOrdered::new(CoalescingPool::new(SimDevice::new(1 << 30))));
//! let x = so.allocate_on(1000, &a)?;
//! so.deallocate_on(x, &a)?;
//! let y = so.allocate_on(1000, &b)?; // `x`'s memory only once `b` is ordered after `a`'s free
//! so.deallocate_on(y, &b)?;
//! # Ok::<(), memres::Error>(())
//! ```
//!
//! [`PerStreamPool`](per_stream::PerStreamPool): a pool per stream, as
//! PyTorch's allocator.
//!
//! ```
//! use memres::per_stream::{PerStreamPool, PoolMaker};
//! use memres::{prelude::*, sim::{SimDevice, SimWorld}};
//! let (world, device) = (SimWorld::new(), SimDevice::new(1 << 30));
//! let pools = Shared::new(PerStreamPool::new(PoolMaker::new(&device)));
//! let s = world.stream();
//! let b = pools.allocate_on(1000, &s)?;
//! pools.deallocate_on(b, &s)?;
//! # Ok::<(), memres::Error>(())
//! ```
//!
//! [`VirtualPool`](vpool::VirtualPool): one reserved range, memory
//! committed only under live blocks (CUDA VMM).
//!
//! ```
//! use memres::{prelude::*, sim::SimAddressSpace, vpool::{VirtualConfig, VirtualPool}};
//! let space = SimAddressSpace::new(1 << 30, 2 << 20)?;
//! let vpool = Shared::new(VirtualPool::with_config(&space, VirtualConfig::new(16 << 30))?);
//! let b = vpool.allocate(3 << 20)?;
//! vpool.deallocate(b)?;
//! # Ok::<(), memres::Error>(())
//! ```
//!
//! [`CallbackResource`](callback::CallbackResource): allocate and free as
//! two closures.
//!
//! ```
//! use memres::{callback::CallbackResource, prelude::*, sim::SimDevice};
//! let cb = CallbackResource::new(
//!     SimDevice::new(1 << 30),
//!     |r: Request, s: &(), dev: &SimDevice| MemoryResource::allocate(dev, r, s),
//!     |b: Block, s: &(), dev: &SimDevice| MemoryResource::deallocate(dev, b, s),
//! );
//! # use memres::MemoryResource;
//! let b = MemoryResource::allocate(&cb, Request::new(64)?, &())?;
//! MemoryResource::deallocate(&cb, b, &())?;
//! # Ok::<(), memres::Error>(())
//! ```
//!
//! The adaptors, each over a pool borrowed (`&pool`):
//!
//! ```
//! use memres::adaptor::{Aligned, Counted, FailureCallback, Gauge, Limiting, Logging, Statistics, Tracking};
//! use memres::{pool::CoalescingPool, prelude::*, sim::SimDevice};
//! use std::sync::Arc;
//! let pool = Shared::new(CoalescingPool::new(SimDevice::new(1 << 30)));
//! // Statistics: bytes and allocations, now, peak and total.
//! let stats = Statistics::new(&pool);
//! stats.deallocate(stats.allocate(100)?)?;
//! assert_eq!((stats.get_bytes_counter().peak, stats.get_allocations_counter().total), (100, 1));
//! // Tracking: every live block, for leak reports.
//! let tracked = Tracking::new(&pool);
//! let b = tracked.allocate(100)?;
//! assert_eq!(tracked.get_allocated_bytes(), 100);
//! tracked.deallocate(b)?;
//! // Limiting: an error, not a larger pool, past the limit.
//! let limited = Limiting::new(&pool, 1 << 20);
//! assert!(matches!(limited.allocate(2 << 20), Err(Error::LimitExceeded { .. })));
//! // Aligned: large blocks at a larger alignment.
//! let aligned = Aligned::new(&pool, 4096, 1 << 16)?;
//! let b = aligned.allocate(1 << 16)?;
//! assert_eq!(b.addr() % 4096, 0);
//! aligned.deallocate(b)?;
//! // FailureCallback: asked what to do when an allocation fails.
//! let retried = FailureCallback::new(&pool, (), |_bytes, _: &()| false);
//! assert!(retried.allocate(2 << 30).is_err());
//! // Counted: several resources against one gauge.
//! let gauge = Arc::new(Gauge::default());
//! let counted = Counted::new(&pool, gauge.clone());
//! counted.deallocate(counted.allocate(100)?)?;
//! assert_eq!(gauge.peak(), 100);
//! // Logging: RMM's CSV log of every call.
//! let log = Logging::new(&pool, Vec::new()).unwrap();
//! log.deallocate(log.allocate(100)?)?;
//! assert_eq!(log.into_parts().1.iter().filter(|&&c| c == b'\n').count(), 3);
//! # Ok::<(), memres::Error>(())
//! ```
//!
//! Stacks chosen at run time from a string ([`stack`]):
//!
//! ```
//! use memres::prelude::*;
//! let mr = memres::sim::builder().build("stats(pool(sim(1GiB)))", &()).unwrap();
//! mr.deallocate(mr.allocate(100)?)?;
//! # Ok::<(), memres::Error>(())
//! ```
//!
//! The containers, over host memory (bytes behind the addresses) made the
//! current resource of device 0:
//!
//! ```
//! use memres::device::set_per_device_resource_of;
//! use memres::sim::{HostCopy, HostMemory};
//! use memres::{DeviceScalar, DeviceUVector};
//! use std::sync::Arc;
//! set_per_device_resource_of::<(), _, _>(0, Arc::new(HostMemory::new()), HostCopy);
//! let v = DeviceUVector::<u32, _, HostCopy>::from_slice(&[1, 2, 3], ())?;
//! let w = v.clone(); // a deep copy on v's stream
//! let s: DeviceScalar<u64, _, HostCopy> = DeviceScalar::from_value(&7, ())?;
//! assert_eq!((w.to_vec()?, s.value()?), (vec![1, 2, 3], 7));
//! # Ok::<(), memres::containers::ContainerError>(())
//! ```
#![warn(missing_docs)]

pub use memres_core::*;

// Without a backend there is no default to make: its makers go unused.
#[cfg_attr(not(any(feature = "sim", feature = "cuda")), allow(dead_code, unused_imports))]
pub mod device;

pub use memres_containers as containers;
pub use memres_containers::{ContainerError, DeviceBuffer, DeviceScalar, DeviceUVector};
#[cfg(feature = "cuda")]
pub use memres_cuda as cuda;
#[cfg(feature = "sim")]
pub use memres_sim as sim;

/// What a program that allocates needs in scope: the short path, the
/// default resource of each device, the pool, `Shared` and the statistics
/// adaptor, the figures of every resource (`Inspect::usage`, a `Usage`),
/// the containers (not [`MemoryResource`]: its methods have the
/// short path's names).
pub mod prelude {
    pub use crate::adaptor::Statistics;
    pub use crate::device::{
        get_current_device_resource, get_per_device_resource, set_current_device_resource,
        set_per_device_resource,
    };
    pub use crate::pool::CoalescingPool;
    pub use crate::{
        Allocate, AllocateOn, Block, DeviceBuffer, DeviceScalar, DeviceUVector, Error, Inspect, Request,
        Shared, Stream, Usage,
    };
}
