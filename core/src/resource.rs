use crate::{Block, Request, Result, Stream};

/// The stream-ordered memory resource: the one trait every resource, adaptor
/// and backend implements.
///
/// As in RMM and CCCL, both calls take the stream the memory is used on. A
/// resource for which streams mean nothing is generic over `S` and ignores it;
/// `S = ()` is the stream of such resources.
///
/// The trait takes `&self` so that a resource can be shared between threads
/// and stacked under several others (through `&R`, `Arc<R>`). Plain
/// algorithms implement [`MemoryResourceMut`] instead and are made shareable
/// by [`Shared`](crate::Shared). The trait is object safe: stacks chosen at
/// run time are `dyn MemoryResource<S>`.
///
/// # Contract
///
/// - `allocate` of a zero-byte request returns [`Block::EMPTY`] and
///   `deallocate` of an empty block does nothing.
/// - A returned block is aligned to `request.align()` and does not overlap
///   any other live block of the resource.
/// - `deallocate` of a block the resource did not hand out, or handed out and
///   got back already, is an error ([`Error::UnknownBlock`](crate::Error::UnknownBlock),
///   [`Error::DoubleFree`](crate::Error::DoubleFree)), never corruption.
/// - A failed call changes nothing.
///
/// # Examples
///
/// ```
/// use memres_core::{pool::CoalescingPool, MemoryResource, Request, Shared};
/// # use memres_core::testing::BumpUpstream;
/// let pool = Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 20)));
/// let r: &dyn MemoryResource = &pool;
/// let b = r.allocate(Request::new(100)?, &())?;
/// r.deallocate(b, &())?;
/// # Ok::<(), memres_core::Error>(())
/// ```
pub trait MemoryResource<S: Stream + ?Sized = ()> {
    /// Allocates a block for `request`, ordered on `stream`.
    fn allocate(&self, request: Request, stream: &S) -> Result<Block>;

    /// Frees `block`, ordered on `stream`: the memory may be reused by work
    /// on `stream` at once, and by other streams once they are ordered after it.
    fn deallocate(&self, block: Block, stream: &S) -> Result<()>;
}

/// The `&mut self` form of [`MemoryResource`]: what a plain algorithm (a state
/// machine with no lock) implements.
///
/// [`Shared`](crate::Shared) puts one behind a lock and makes it a
/// [`MemoryResource`]; every `&R` where `R: MemoryResource` is a
/// `MemoryResourceMut`, so a shared resource can serve wherever a plain one can.
///
/// # Examples
///
/// ```
/// use memres_core::{pool::CoalescingPool, MemoryResourceMut, Request};
/// # use memres_core::testing::BumpUpstream;
/// let mut pool = CoalescingPool::new(BumpUpstream::new(1 << 20));
/// let b = pool.allocate(Request::new(100)?, &())?;
/// pool.deallocate(b, &())?;
/// # Ok::<(), memres_core::Error>(())
/// ```
pub trait MemoryResourceMut<S: Stream + ?Sized = ()> {
    /// Allocates a block for `request`, ordered on `stream`.
    fn allocate(&mut self, request: Request, stream: &S) -> Result<Block>;

    /// Frees `block`, ordered on `stream`.
    fn deallocate(&mut self, block: Block, stream: &S) -> Result<()>;
}

impl<S: Stream + ?Sized, R: MemoryResource<S> + ?Sized> MemoryResource<S> for &R {
    #[inline]
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        (**self).allocate(request, stream)
    }
    #[inline]
    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        (**self).deallocate(block, stream)
    }
}

impl<S: Stream + ?Sized, R: MemoryResource<S> + ?Sized> MemoryResourceMut<S> for &R {
    #[inline]
    fn allocate(&mut self, request: Request, stream: &S) -> Result<Block> {
        (**self).allocate(request, stream)
    }
    #[inline]
    fn deallocate(&mut self, block: Block, stream: &S) -> Result<()> {
        (**self).deallocate(block, stream)
    }
}

#[cfg(feature = "alloc")]
impl<S: Stream + ?Sized, R: MemoryResource<S> + ?Sized> MemoryResource<S> for alloc::boxed::Box<R> {
    #[inline]
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        (**self).allocate(request, stream)
    }
    #[inline]
    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        (**self).deallocate(block, stream)
    }
}

#[cfg(feature = "alloc")]
impl<S: Stream + ?Sized, R: MemoryResource<S> + ?Sized> MemoryResource<S> for alloc::sync::Arc<R> {
    #[inline]
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        (**self).allocate(request, stream)
    }
    #[inline]
    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        (**self).deallocate(block, stream)
    }
}
