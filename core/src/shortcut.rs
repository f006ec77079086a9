//! The short path: allocate a size, free a block, with no [`Request`] to
//! build and, for resources whose stream is `()`, no stream to pass
//! (RMM's Python `mr.allocate(size)`).
//!
//! Two extension traits with blanket impls, so every resource has them:
//!
//! | trait | for | methods |
//! | --- | --- | --- |
//! | [`Allocate`] | `R: MemoryResource<()>` | `allocate(size)`, `allocate_aligned(size, align)`, `deallocate(block)` |
//! | [`AllocateOn`] | `R: MemoryResource<S>` | `allocate_on(size, &stream)`, `allocate_aligned_on(size, align, &stream)`, `deallocate_on(block, &stream)` |
//!
//! The errors stay typed: a size above [`Request::MAX_SIZE`] is
//! [`Error::InvalidSize`](crate::Error::InvalidSize) from the request, an
//! alignment that is not a power of two or above [`Request::MAX_ALIGN`]
//! [`Error::InvalidAlignment`](crate::Error::InvalidAlignment), anything
//! else the resource's own error.
//!
//! `Allocate`'s methods have the names of [`MemoryResource`]'s, with
//! fewer arguments: import one of the two traits where a value is used
//! (`memres`'s prelude imports `Allocate` and `AllocateOn`, not
//! `MemoryResource`); with both in scope, name the trait
//! (`MemoryResource::allocate(&mr, request, &())`).

use crate::{Block, MemoryResource, Request, Result, Stream};

/// `allocate(size)` and `deallocate(block)` for every resource whose
/// stream is `()`.
///
/// ```
/// use memres_core::shortcut::Allocate;
/// use memres_core::{pool::CoalescingPool, Shared};
/// # use memres_core::testing::BumpUpstream;
/// let pool = Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 20)));
/// let block = pool.allocate(1000)?;
/// assert_eq!(block.size(), 1000);
/// pool.deallocate(block)?;
/// # Ok::<(), memres_core::Error>(())
/// ```
pub trait Allocate: MemoryResource<()> {
    /// Allocates `size` bytes at the default alignment (256 bytes).
    ///
    /// # Errors
    ///
    /// [`InvalidSize`](crate::Error::InvalidSize) above
    /// [`Request::MAX_SIZE`], nothing asked of the resource; the
    /// resource's error otherwise.
    #[inline]
    fn allocate(&self, size: u64) -> Result<Block> {
        MemoryResource::allocate(self, Request::new(size)?, &())
    }

    /// Allocates `size` bytes aligned to `align` (a power of two; at least
    /// 256 is given), as RMM's `allocate(bytes, alignment)`.
    ///
    /// # Errors
    ///
    /// As [`allocate`](Self::allocate), and
    /// [`InvalidAlignment`](crate::Error::InvalidAlignment) for an alignment
    /// no request can have, nothing asked of the resource.
    #[inline]
    fn allocate_aligned(&self, size: u64, align: u64) -> Result<Block> {
        MemoryResource::allocate(self, Request::aligned(size, align)?, &())
    }

    /// Frees `block`.
    ///
    /// # Errors
    ///
    /// The resource's: [`UnknownBlock`](crate::Error::UnknownBlock) or
    /// [`DoubleFree`](crate::Error::DoubleFree) for a block it does not
    /// hold, nothing changed.
    #[inline]
    fn deallocate(&self, block: Block) -> Result<()> {
        MemoryResource::deallocate(self, block, &())
    }
}

impl<R: MemoryResource<()> + ?Sized> Allocate for R {}

/// `allocate_on(size, &stream)` and `deallocate_on(block, &stream)` for
/// every resource.
///
/// ```
/// use memres_core::shortcut::AllocateOn;
/// use memres_core::{pool::CoalescingPool, Shared};
/// # use memres_core::testing::{BumpUpstream, IdStream};
/// let pool = Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 20)));
/// let stream = IdStream(1);
/// let block = pool.allocate_on(1000, &stream)?;
/// pool.deallocate_on(block, &stream)?;
/// # Ok::<(), memres_core::Error>(())
/// ```
pub trait AllocateOn<S: Stream + ?Sized>: MemoryResource<S> {
    /// Allocates `size` bytes at the default alignment, ordered on `stream`.
    ///
    /// # Errors
    ///
    /// As [`Allocate::allocate`].
    #[inline]
    fn allocate_on(&self, size: u64, stream: &S) -> Result<Block> {
        self.allocate(Request::new(size)?, stream)
    }

    /// Allocates `size` bytes aligned to `align`, ordered on `stream`.
    ///
    /// # Errors
    ///
    /// As [`Allocate::allocate_aligned`].
    #[inline]
    fn allocate_aligned_on(&self, size: u64, align: u64, stream: &S) -> Result<Block> {
        self.allocate(Request::aligned(size, align)?, stream)
    }

    /// Frees `block`, ordered on `stream`.
    ///
    /// # Errors
    ///
    /// As [`Allocate::deallocate`].
    #[inline]
    fn deallocate_on(&self, block: Block, stream: &S) -> Result<()> {
        self.deallocate(block, stream)
    }
}

impl<S: Stream + ?Sized, R: MemoryResource<S> + ?Sized> AllocateOn<S> for R {}

#[cfg(test)]
mod tests;
