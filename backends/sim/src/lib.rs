//! Host memory and a simulated device for memres.
//!
//! - [`SimDevice`]: an address space of a chosen capacity with no bytes
//!   behind it, an upstream like `cuMemAlloc` whose chunks are separate; it
//!   counts what it holds and can be told to fail.
//! - [`HostCopy`]: the copy engine of host memory (plain `memcpy`).
//! - [`SimWorld`], [`SimStream`], [`SimEvent`]: simulated streams and events
//!   whose work completes only when a test says so, ordered by vector clocks.
//! - [`HbChecked`]: a wrapper that checks every reuse of freed memory on
//!   another stream is ordered after the free, reporting [`HbViolation`]s.
//! - [`SimAddressSpace`]: a simulated virtual address space (reserve, commit,
//!   decommit granules) for `memres_core::vpool::VirtualPool`.
//!
//! Everything here implements [`memres_core::MemoryResource`] for every
//! stream type, so the core's algorithms can be tested, fuzzed and measured
//! without a GPU.

mod copy;
mod host;
mod log;
mod order;
mod device;
mod stack;
mod stream;
mod vspace;

pub use copy::HostCopy;
pub use host::HostMemory;
pub use log::{parse_log, Action, LogRecord, Logging, LOG_HEADER};
pub use order::{HbChecked, HbViolation};
pub use device::SimDevice;
pub use stack::{Built, Constructor, Context, OnStream, StackBuilder, DEFAULT_SIM_CAPACITY};
pub use stream::{SimEvent, SimStream, SimWorld};
pub use vspace::SimAddressSpace;
