use std::fmt;

/// Shorthand for the containers' results.
pub type Result<T, E = ContainerError> = std::result::Result<T, E>;

/// What can go wrong with a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ContainerError {
    /// The resource, the copy engine or a stream failed; the container is
    /// as it was (but where the method says otherwise: a `resize` whose
    /// zeros were not written keeps the capacity it grew to, its length
    /// and bytes as they were).
    Memory(memres_core::Error),
    /// An element index at or past the length (a byte offset, for a
    /// buffer).
    IndexOutOfRange {
        /// The last element (byte, for a buffer) the call would touch, or
        /// the start of a reversed range (`usize::MAX` for a byte past what
        /// a `usize` counts).
        index: usize,
        /// The number of elements (of bytes, `usize::MAX` where more).
        len: usize,
    },
    /// A byte length that is not a whole number of elements.
    NotWholeElements {
        /// The buffer's length in bytes.
        bytes: u64,
        /// The element size in bytes.
        element_size: usize,
    },
    /// A length whose size in bytes overflows a `usize`.
    LengthOverflow {
        /// The number of elements asked for (`usize::MAX` where more).
        len: usize,
    },
    /// The resource handed out a block shorter than asked (a resource that
    /// breaks its size promise); the block went back to it and the
    /// container is unchanged.
    BlockTooShort {
        /// Bytes asked for.
        requested: u64,
        /// The block's size.
        size: u64,
    },
    /// The resource handed out a block that does not start at a multiple
    /// of the alignment asked for (an alignment it cannot honour and does
    /// not refuse), or a buffer to be viewed as elements of an alignment its
    /// block does not have; the block went back to the resource (or the
    /// buffer comes back) and the container is unchanged.
    Misaligned {
        /// The alignment asked for, in bytes.
        align: u64,
        /// The block's address.
        addr: u64,
    },
    /// The host could not allocate a copy of the contents (`to_vec`,
    /// `slice_to_vec`); nothing was read.
    HostOutOfMemory {
        /// Bytes asked of the host.
        bytes: u64,
    },
}

/// `n` zeroed elements in a vector the host may refuse: a copy of device
/// memory can be larger than the host can hold, which `vec!` would abort
/// on. Zeroed where they lie: no element passes through the stack, which a
/// large one (a `Pod` of megabytes) would overflow.
pub(crate) fn host_vec<T: bytemuck::Zeroable>(n: usize) -> Result<Vec<T>> {
    let bytes = (n as u64).saturating_mul(std::mem::size_of::<T>() as u64);
    bytemuck::allocation::try_zeroed_vec(n).map_err(|()| ContainerError::HostOutOfMemory { bytes })
}

impl From<memres_core::Error> for ContainerError {
    fn from(e: memres_core::Error) -> Self {
        ContainerError::Memory(e)
    }
}

impl fmt::Display for ContainerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContainerError::Memory(e) => write!(f, "{e}"),
            ContainerError::IndexOutOfRange { index, len } => {
                write!(f, "index {index} out of range for length {len}")
            }
            ContainerError::NotWholeElements { bytes, element_size } => {
                write!(f, "{bytes} bytes is not a whole number of {element_size}-byte elements")
            }
            ContainerError::LengthOverflow { len } => write!(f, "length {len} overflows in bytes"),
            ContainerError::BlockTooShort { requested, size } => {
                write!(f, "the resource handed out a block of {size} bytes for a request of {requested}")
            }
            ContainerError::Misaligned { align, addr } => {
                write!(f, "the block at {addr:#x} is not aligned to {align} bytes")
            }
            ContainerError::HostOutOfMemory { bytes } => {
                write!(f, "the host cannot allocate {bytes} bytes for a copy")
            }
        }
    }
}

impl std::error::Error for ContainerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ContainerError::Memory(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{host_vec, ContainerError};

    #[test]
    fn a_copy_larger_than_the_host_can_hold_is_an_error_not_an_abort() {
        assert_eq!(host_vec::<u16>(usize::MAX), Err(ContainerError::HostOutOfMemory { bytes: u64::MAX }));
        assert_eq!(host_vec::<u16>(3), Ok(vec![0, 0, 0]));
    }
}
