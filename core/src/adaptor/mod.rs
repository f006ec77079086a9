//! Resource adaptors: resources that wrap an upstream resource and add one
//! concern (RMM's `*_resource_adaptor`s).
//!
//! Every adaptor is a `&self` [`MemoryResource`](crate::MemoryResource) over
//! an upstream `R: MemoryResource<S>`, so adaptors stack in any order. The
//! upstream may be held by value, by reference (`&R`) or through `Arc<R>`:
//! the forwarding impls make all three resources.
//!
//! | adaptor | RMM | what it adds |
//! | --- | --- | --- |
//! | [`Statistics`] | `statistics_resource_adaptor` | current, peak and total bytes and allocation counts; a stack of counters for regions |
//! | [`Tracking`] | `tracking_resource_adaptor` | every outstanding allocation, a leak report (alloc) |
//! | [`Limiting`] | `limiting_resource_adaptor` | a byte limit (alloc: a table of what each block was charged) |
//! | [`Aligned`] | `aligned_resource_adaptor` | a larger alignment for large allocations |
//! | [`FailureCallback`] | `failure_callback_resource_adaptor` | a callback that decides whether to retry after out of memory (or any failure, [`RetryOn`]) |
//! | [`Counted`] | (the `upstream_*` figures of memres's C library) | counts what a leaf lends in a [`Gauge`] that the leaves of a stack share (alloc) |
//! | `Logging` | `logging_resource_adaptor` | every call as a row of RMM's log format, `memres_core::trace` (feature `std`) |
//!
//! # Examples
//!
//! ```
//! # #[cfg(feature = "alloc")] // `Limiting` keeps a table
//! # fn main() -> Result<(), memres_core::Error> {
//! use memres_core::adaptor::{Limiting, Statistics};
//! use memres_core::{pool::CoalescingPool, MemoryResource, Request, Shared};
//! # use memres_core::testing::BumpUpstream;
//! let pool = Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 30)));
//! let stack = Statistics::new(Limiting::new(&pool, 1 << 20));
//! let b = stack.allocate(Request::new(1000)?, &())?;
//! assert_eq!(stack.get_bytes_counter().value, 1000);
//! stack.deallocate(b, &())?;
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "alloc"))]
//! # fn main() {}
//! ```

mod aligned;
mod failure;
mod gauge;
#[cfg(feature = "alloc")]
mod limiting;
#[cfg(feature = "std")]
mod logging;
#[cfg(feature = "std")]
mod on_thread;
mod statistics;
#[cfg(feature = "alloc")]
mod tracking;

pub use aligned::Aligned;
pub use failure::{FailureCallback, RetryOn};
#[cfg(feature = "alloc")]
pub use gauge::Counted;
pub use gauge::Gauge;
#[cfg(feature = "alloc")]
pub use limiting::Limiting;
#[cfg(feature = "std")]
pub(crate) use logging::LogFile;
#[cfg(feature = "std")]
pub use logging::{LockedLog, Logging};
pub use statistics::{Counter, Statistics};
#[cfg(feature = "alloc")]
pub use tracking::{LeakReport, Outstanding, Tracking};

/// A resource chosen at run time and shared between threads: what stacks
/// built from a description and the per-device registry hand out.
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::{DynResource, Statistics};
/// use memres_core::{MemoryResource, Request};
/// # use memres_core::testing::BumpUpstream;
/// use std::sync::Arc;
/// let r: DynResource = Arc::new(Statistics::new(BumpUpstream::new(1 << 20)));
/// let b = r.allocate(Request::new(64)?, &())?;
/// r.deallocate(b, &())?;
/// # Ok::<(), memres_core::Error>(())
/// ```
#[cfg(feature = "alloc")]
pub type DynResource<S = ()> = alloc::sync::Arc<dyn crate::MemoryResource<S> + Send + Sync>;

#[cfg(all(test, feature = "std", not(loom)))]
mod counting_tests;
#[cfg(all(test, feature = "std", loom))]
mod loom_tests;
#[cfg(all(test, feature = "std", not(loom)))]
mod tests;
