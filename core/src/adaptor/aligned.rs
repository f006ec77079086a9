//! RMM's `aligned_resource_adaptor`: larger alignment for large allocations.

use crate::{Block, Error, MemoryResource, Request, Result, Stream};

/// Gives allocations of at least `threshold` bytes an alignment of at least
/// `alignment`: RMM's `aligned_resource_adaptor`.
///
/// ```text
///  allocate(size, align) ─► size >= threshold ? ─yes─► upstream(size, max(align, alignment))
///                                               └no──► upstream(size, align)
///  deallocate(block) ─────► upstream(block)      (the very block upstream made)
/// ```
///
/// RMM's adaptor pads each request and keeps a table from the aligned
/// pointer back to the upstream one, because `cudaMalloc` cannot be asked
/// for an alignment. A memres upstream can: every [`MemoryResource`]
/// honours [`Request::align`]. So this adaptor asks the upstream for the
/// alignment directly: no padding, no table, and a free hands the upstream
/// exactly the block (address, size, tag) it made.
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::Aligned;
/// use memres_core::{MemoryResource, Request};
/// # use memres_core::testing::BumpUpstream;
/// let aligned = Aligned::new(BumpUpstream::new(1 << 30), 1 << 16, 1 << 20)?;
/// let big = aligned.allocate(Request::new(2 << 20)?, &())?;
/// assert_eq!(big.addr() % (1 << 16), 0);
/// aligned.deallocate(big, &())?;
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct Aligned<R> {
    upstream: R,
    /// A power of two, at least 256 and at most [`Request::MAX_ALIGN`].
    alignment: u64,
    /// Requests of at least this many bytes get `alignment`.
    threshold: u64,
}

impl<R> Aligned<R> {
    /// RMM's default alignment: 256 bytes.
    pub const DEFAULT_ALIGNMENT: u64 = crate::DEFAULT_ALIGNMENT;
    /// RMM's default threshold: 0 (every allocation is aligned).
    pub const DEFAULT_THRESHOLD: u64 = 0;

    /// Requests of at least `threshold` bytes get an alignment of at least
    /// `alignment`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidAlignment`] if `alignment` is not a power of two or is
    /// above [`Request::MAX_ALIGN`].
    ///
    /// ```
    /// # use memres_core::adaptor::Aligned;
    /// assert!(Aligned::new((), 4096, 1 << 20).is_ok());
    /// assert!(Aligned::new((), 3000, 0).is_err());
    /// ```
    pub fn new(upstream: R, alignment: u64, threshold: u64) -> Result<Self> {
        if !alignment.is_power_of_two() || alignment > Request::MAX_ALIGN {
            return Err(Error::InvalidAlignment { align: alignment });
        }
        Ok(Aligned { upstream, alignment: alignment.max(crate::DEFAULT_ALIGNMENT), threshold })
    }

    /// The alignment given to large allocations.
    ///
    /// ```
    /// # use memres_core::adaptor::Aligned;
    /// assert_eq!(Aligned::new((), 4096, 0)?.alignment(), 4096);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The size from which allocations get [`alignment`](Self::alignment).
    ///
    /// ```
    /// # use memres_core::adaptor::Aligned;
    /// assert_eq!(Aligned::new((), 4096, 100)?.threshold(), 100);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    /// The upstream resource.
    ///
    /// ```
    /// # use memres_core::adaptor::Aligned;
    /// assert_eq!(*Aligned::new(7u8, 256, 0)?.upstream(), 7);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn upstream(&self) -> &R {
        &self.upstream
    }
}

impl<S: Stream + ?Sized, R: MemoryResource<S>> MemoryResource<S> for Aligned<R> {
    #[inline]
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        if request.is_zero() || request.size() < self.threshold || request.align() >= self.alignment {
            return self.upstream.allocate(request, stream);
        }
        self.upstream.allocate(Request::aligned(request.size(), self.alignment)?, stream)
    }

    // Equal whatever the alignment: RMM compares that too, because its
    // adaptor pads; this one gives the upstream its very block back.
    crate::resource::pass_blocks_through!(upstream);
}

crate::inspect::forward_inspect!(Aligned<R>, upstream);

// SAFETY: `Aligned` hands out `R`'s blocks unchanged (asked of `R` with a
// larger alignment) and gives them back only through `R::deallocate`.
unsafe impl<E, R: crate::copy::MemoryOf<E>> crate::copy::MemoryOf<E> for Aligned<R> {}
