//! A leaf counted in a shared [`Gauge`]: the bytes a stack holds from its
//! devices, whatever its leaves (feature `alloc`).

use super::Gauge;
use crate::{Block, MemoryResource, Request, Result, Stream};
use alloc::sync::Arc;

/// Counts the bytes its upstream hands out in a [`Gauge`] that other
/// `Counted` resources may share: put over each leaf of a stack, one gauge
/// tells what the whole stack holds from its devices now, its peak (the
/// footprint's numerator) and its total, whatever sits above the leaves.
/// Sizes are the blocks' ([`Block::size`]), so a leaf's own rounding is not
/// counted.
///
/// A free is taken off the gauge before the upstream frees the block, so
/// that a racing allocation of the same memory cannot raise the peak above
/// what the device lent; a free the upstream refuses is counted back.
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::{Counted, Gauge};
/// use memres_core::{MemoryResource, Request};
/// # use memres_core::testing::BumpUpstream;
/// use std::sync::Arc;
/// let gauge = Arc::new(Gauge::default());
/// let (a, b) = (Counted::new(BumpUpstream::new(1 << 20), gauge.clone()), Counted::new(BumpUpstream::new(1 << 20), gauge.clone()));
/// let x = a.allocate(Request::new(1000)?, &())?;
/// let y = b.allocate(Request::new(3000)?, &())?;
/// assert_eq!(gauge.current(), 4000);
/// a.deallocate(x, &())?;
/// b.deallocate(y, &())?;
/// assert_eq!((gauge.current(), gauge.peak(), gauge.total()), (0, 4000, 4000));
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct Counted<R> {
    inner: R,
    gauge: Arc<Gauge>,
}

impl<R> Counted<R> {
    /// Counts what `inner` hands out in `gauge`.
    pub fn new(inner: R, gauge: Arc<Gauge>) -> Self {
        Counted { inner, gauge }
    }

    /// The leaf.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// The gauge it counts in.
    pub fn gauge(&self) -> &Arc<Gauge> {
        &self.gauge
    }
}

impl<S: Stream + ?Sized, R: MemoryResource<S>> MemoryResource<S> for Counted<R> {
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        let b = self.inner.allocate(request, stream)?;
        self.gauge.add(b.size());
        Ok(b)
    }

    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        self.gauge.sub(block.size());
        self.inner.deallocate(block, stream).inspect_err(|_| self.gauge.unsub(block.size()))
    }
}

// SAFETY: `Counted` hands out `R`'s blocks unchanged and gives them back only
// through `R::deallocate`.
unsafe impl<E, R: crate::copy::MemoryOf<E>> crate::copy::MemoryOf<E> for Counted<R> {}
