//! A simulated GPU for memres, and host memory: everything the core's
//! algorithms need to be tested, fuzzed, measured and embedded without a
//! GPU.
//!
//! - [`SimDevice`]: an address space of a chosen capacity with no bytes
//!   behind it, an upstream like `cuMemAlloc` whose chunks are separate; it
//!   counts what it holds and can be told to fail.
//! - [`SimWorld`], [`SimStream`], [`SimEvent`]: simulated streams and events
//!   whose work completes only when a test says so, ordered by vector clocks.
//! - [`HbChecked`]: a wrapper that checks every reuse of freed memory on
//!   another stream is ordered after the free, reporting [`HbViolation`]s.
//! - [`SimAddressSpace`]: a simulated virtual address space (reserve, commit,
//!   decommit granules) for `memres_core::vpool::VirtualPool`;
//!   [`UnmapChecked`] checks that a space decommits memory only once the
//!   work that used it is done.
//! - [`HostMemory`] and [`HostCopy`]: real host memory and its copy engine
//!   (plain `memcpy`, every access checked), for containers, tests and
//!   replays that want bytes behind their addresses.
//! - [`register`] and [`builder`]: the leaves `sim`, `host` and `vpool` of
//!   the core's [`StackBuilder`](memres_core::stack::StackBuilder).
//!
//! The resources here, [`SimDevice`] and [`HostMemory`], implement
//! [`memres_core::MemoryResource`] for every stream type; [`HbChecked`],
//! which checks the order of simulated streams, for [`SimStream`] only.
//!
//! Host memory lives here rather than in a crate of its own: it is the
//! other backend that needs no GPU, used by the same tests and replays as
//! the simulated device, and its `host` leaf registers with the others.

mod copy;
mod device;
mod host;
mod order;
mod stack;
mod stream;
mod tally;
mod unmaps;
mod vspace;

pub use copy::HostCopy;
pub use device::SimDevice;
pub use host::HostMemory;
pub use order::{HbChecked, HbViolation};
pub use stack::{
    builder, keep_vpool, nth_sim_device, register, sim, sim_capacity, sim_device, vpool, ADDRESSES_END,
    DEFAULT_SIM_CAPACITY, SIM_DEVICES, VPOOL_SPACES,
};
pub use stream::{SimEvent, SimStream, SimWorld};
pub use unmaps::UnmapChecked;
pub use vspace::SimAddressSpace;
