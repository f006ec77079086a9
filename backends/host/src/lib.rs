//! Host memory and a simulated device for memres.
//!
//! - [`SimDevice`]: an address space of a chosen capacity with no bytes
//!   behind it, an upstream like `cuMemAlloc` whose chunks are separate; it
//!   counts what it holds and can be told to fail.
//!
//! Everything here implements [`memres_core::MemoryResource`] for every
//! stream type, so the core's algorithms can be tested, fuzzed and measured
//! without a GPU.

mod host;
mod sim;

pub use host::HostMemory;
pub use sim::SimDevice;
