//! Host memory and a simulated device for memres.
//!
//! - [`SimDevice`]: an address space of a chosen capacity with no bytes
//!   behind it, an upstream like `cuMemAlloc` whose chunks are separate; it
//!   counts what it holds and can be told to fail.
//!
//! Everything here implements [`memres_core::MemoryResource`] for every
//! stream type, so the core's algorithms can be tested, fuzzed and measured
//! without a GPU.

mod log;
mod sim;
mod stack;

pub use log::{parse_log, Action, LogRecord, Logging, LOG_HEADER};
pub use sim::SimDevice;
pub use stack::{Built, Constructor, Context, StackBuilder, DEFAULT_SIM_CAPACITY};
