//! `Clone` for the containers: RMM's copy construction, a deep copy on the
//! container's own stream from the same resource, that panics where the
//! copy fails, with `try_clone`'s typed error in its message (where
//! `Vec::clone` aborts the process when the allocator fails).
//!
//! A device copy fails where a host copy cannot (the resource out of
//! memory, a stream's error, a block that other code freed): code that
//! must go on after such a failure calls `try_clone` (or `try_clone_on`
//! for another stream), which returns the error instead, nothing leaked.
//!
//! ```
//! use memres_containers::{DeviceBuffer, DeviceScalar, DeviceUVector};
//! use memres_sim::{HostCopy, HostMemory};
//! let host = HostMemory::new();
//! let b = DeviceBuffer::from_slice_in(b"bytes", (), &host, HostCopy)?;
//! let v = DeviceUVector::from_slice_in(&[1u32, 2, 3], (), &host, HostCopy)?;
//! let s = DeviceScalar::from_value_in(&7u64, (), &host, HostCopy)?;
//! let (b2, v2, s2) = (b.clone(), v.clone(), s.clone());
//! assert_ne!(b.addr(), b2.addr());
//! assert_eq!((b2.to_vec()?, v2.to_vec()?, s2.value()?), (b"bytes".to_vec(), vec![1, 2, 3], 7));
//! # Ok::<(), memres_containers::ContainerError>(())
//! ```

use crate::{DeviceBuffer, DeviceScalar, DeviceUVector};
use bytemuck::Pod;
use memres_core::copy::{CopyEngine, MemoryOf};
use memres_core::{MemoryResource, Stream};

/// `Clone` for a container (with an element type parameter where it has
/// one) through its `try_clone`.
macro_rules! clone_through_try_clone {
    ($container:ident $(<$elem:ident>)?) => {
        /// A deep copy on the container's stream, from the same resource,
        /// through `try_clone` (RMM's copy construction; see
        /// [`DeviceBuffer::try_clone`]).
        ///
        /// # Panics
        ///
        /// Where `try_clone` returns an error, with that error; use it for
        /// a copy that may fail.
        impl<$($elem: Pod,)? R, E, S> Clone for $container<$($elem,)? R, E, S>
        where
            R: MemoryResource<S> + MemoryOf<E::Kind> + Clone,
            E: CopyEngine<S> + Clone,
            S: Stream + Clone,
        {
            fn clone(&self) -> Self {
                self.try_clone().unwrap_or_else(|e| {
                    panic!(concat!(stringify!($container), "::clone failed: {:?} (try_clone returns this error instead)"), e)
                })
            }
        }
    };
}

clone_through_try_clone!(DeviceBuffer);
clone_through_try_clone!(DeviceUVector<T>);
clone_through_try_clone!(DeviceScalar<T>);
