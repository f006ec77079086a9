//! RMM's `callback_memory_resource`: a leaf resource whose allocate and
//! deallocate are two closures given by the program, with a context.

use crate::{Block, MemoryResource, Request, Result, Stream};
use core::fmt;

/// A resource that allocates and frees through two closures, each given the
/// request or block, the stream and the context: RMM's
/// `callback_memory_resource` (its two `void*` arguments are one typed
/// context here, which the resource owns; share one by giving `&T` or
/// `Arc<T>`).
///
/// The resource keeps the contract of [`MemoryResource`] whatever the
/// closures do: a zero-byte request is [`Block::EMPTY`] and the empty
/// block's free does nothing, neither reaching a closure; a block the
/// allocate closure returns that does not answer the request (another size
/// than asked, an address not aligned to the request's alignment, a range
/// that wraps around the address space) is handed to the deallocate
/// closure at once (unless it is the empty block) and the allocation fails
/// with [`Error::UpstreamMisbehaved`](crate::Error::UpstreamMisbehaved) naming the block and what is wrong
/// with it: the closures' fault, not the request's. The resource counts
/// nothing and keeps no state, so a closure that panics leaves nothing to
/// put right, and a block whose give-back the deallocate closure refuses
/// stays with the closures' owner, never handed to the caller. Everything else (which blocks are
/// live, a double free) is the closures' to check and answer.
///
/// A stack string cannot hold one (it has no syntax for code): register
/// one under a name of the program's with
/// [`StackBuilder::register_resource`](crate::stack::StackBuilder::register_resource).
///
/// # Examples
///
/// ```
/// use memres_core::callback::CallbackResource;
/// use memres_core::{Block, MemoryResource, Request};
/// use std::sync::atomic::{AtomicU64, Ordering};
/// // A bump allocator: the context is the next free address.
/// let r = CallbackResource::new(
///     AtomicU64::new(1 << 20),
///     |req: Request, _: &(), next: &AtomicU64| {
///         let size = req.rounded_size(req.align());
///         let at = next.fetch_add(size + req.align(), Ordering::Relaxed).next_multiple_of(req.align());
///         Ok(Block::from_addr(at, req.size()))
///     },
///     |_: Block, _: &(), _: &AtomicU64| Ok(()),
/// );
/// let b = r.allocate(Request::aligned(1000, 4096)?, &())?;
/// assert_eq!((b.addr() % 4096, b.size()), (0, 1000));
/// r.deallocate(b, &())?;
/// # Ok::<(), memres_core::Error>(())
/// ```
pub struct CallbackResource<C, A, D> {
    context: C,
    allocate: A,
    deallocate: D,
}

impl<C, A, D> CallbackResource<C, A, D> {
    /// Allocates with `allocate(request, stream, &context)` and frees with
    /// `deallocate(block, stream, &context)`.
    pub fn new(context: C, allocate: A, deallocate: D) -> Self {
        CallbackResource { context, allocate, deallocate }
    }

    /// The context both closures are given.
    ///
    /// ```
    /// # use memres_core::callback::CallbackResource;
    /// let r = CallbackResource::new(7, (), ());
    /// assert_eq!(*r.context(), 7);
    /// ```
    pub fn context(&self) -> &C {
        &self.context
    }
}

impl<C: fmt::Debug, A, D> fmt::Debug for CallbackResource<C, A, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallbackResource").field("context", &self.context).finish_non_exhaustive()
    }
}

/// Whether `block` answers `request` (its size, its alignment, a range that
/// does not wrap); if not, the closures' fault.
fn answers(block: Block, request: Request) -> Result<()> {
    if block.size() < request.size() {
        Err(block.misbehaved("shorter than asked"))
    } else if block.size() > request.size() {
        Err(block.misbehaved("not sized as asked"))
    } else if block.addr() % request.align() != 0 {
        Err(block.misbehaved("not aligned as asked"))
    } else if block.addr().checked_add(block.size()).is_none() {
        Err(block.misbehaved("running past the last address"))
    } else {
        Ok(())
    }
}

impl<S, C, A, D> MemoryResource<S> for CallbackResource<C, A, D>
where
    S: Stream + ?Sized,
    A: Fn(Request, &S, &C) -> Result<Block>,
    D: Fn(Block, &S, &C) -> Result<()>,
{
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        let block = (self.allocate)(request, stream, &self.context)?;
        if let Err(e) = answers(block, request) {
            // Given back so that nothing is lost (the empty block holds
            // nothing, and its free reaches no closure); the free's own
            // answer cannot change the allocation's.
            if !block.is_empty() {
                let _ = (self.deallocate)(block, stream, &self.context);
            }
            return Err(e);
        }
        Ok(block)
    }

    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        (self.deallocate)(block, stream, &self.context)
    }
}

#[cfg(test)]
mod tests;
