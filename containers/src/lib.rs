//! Stream-ordered RAII containers over any memres resource, as RMM's
//! `device_buffer`, `device_uvector<T>` and `device_scalar<T>`.
//!
//! A container holds a block from a [`MemoryResource`](memres_core::MemoryResource),
//! the stream it belongs to and the backend's [`CopyEngine`](memres_core::copy::CopyEngine);
//! dropping it frees the block on that stream to the resource it came from.
//!
//! | type | what it is |
//! | --- | --- |
//! | [`DeviceBuffer`] | untyped bytes: size, capacity, resize, deep copy, change of stream |
//! | [`DeviceUVector`] | a vector of plain-old-data `T`, uninitialized on creation as in RMM |
//! | [`DeviceScalar`] | one `T` in device memory |
//!
//! The resource `R` may be a reference (`&Pool`) or an `Arc`: both are
//! resources through the core's forwarding impls.

mod buffer;
mod error;
mod scalar;
mod uvector;

pub use buffer::DeviceBuffer;
pub use error::{ContainerError, Result};
pub use scalar::DeviceScalar;
pub use uvector::DeviceUVector;
