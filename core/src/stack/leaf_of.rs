//! [`LeafOf`]: a leaf of a built stack whose type proved it memory of an
//! engine, so that a stack built from a string can say so without a
//! promise by hand.

use crate::copy::MemoryOf;
use crate::{Block, DynResource, MemoryResource, Request, Result, Stream};
use alloc::sync::Arc;
use core::fmt;
use core::marker::PhantomData;

/// A resource that [`Context::keep_leaf_of`](super::Context::keep_leaf_of)
/// kept: a resource of a type that is [`MemoryOf<E>`], behind a
/// [`DynResource`]. Only that function makes one, so holding one proves
/// what the type proved; the builder's [`register_leaf_of`] and
/// [`build_leaf_of`] carry the proof through a stack's names.
///
/// [`register_leaf_of`]: super::StackBuilder::register_leaf_of
/// [`build_leaf_of`]: super::StackBuilder::build_leaf_of
pub struct LeafOf<S: ?Sized, E> {
    resource: DynResource<S>,
    _engine: PhantomData<fn(&E)>,
}

impl<S: Stream + ?Sized, E> LeafOf<S, E> {
    /// `resource`, whose type is `MemoryOf<E>`, as a [`DynResource`].
    pub(super) fn of<R>(resource: Arc<R>) -> Self
    where
        R: MemoryResource<S> + MemoryOf<E> + Send + Sync + 'static,
    {
        LeafOf { resource, _engine: PhantomData }
    }

    /// The resource, without the proof.
    pub fn resource(&self) -> &DynResource<S> {
        &self.resource
    }

    /// The resource, giving up the proof.
    pub fn into_resource(self) -> DynResource<S> {
        self.resource
    }
}

impl<S: ?Sized, E> Clone for LeafOf<S, E> {
    fn clone(&self) -> Self {
        LeafOf { resource: self.resource.clone(), _engine: PhantomData }
    }
}

impl<S: ?Sized, E> fmt::Debug for LeafOf<S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeafOf").finish_non_exhaustive()
    }
}

impl<S: Stream + ?Sized, E> MemoryResource<S> for LeafOf<S, E> {
    #[inline]
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        self.resource.allocate(request, stream)
    }
    #[inline]
    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        self.resource.deallocate(block, stream)
    }
    /// The resource itself: this is a view of it.
    #[inline]
    fn id(&self) -> crate::ResourceId {
        self.resource.id()
    }
}

// SAFETY: a `LeafOf<S, E>` is made only by `LeafOf::of` (its field is
// private), from an `Arc<R>` with `R: MemoryOf<E>`: the `DynResource` is
// that `Arc`, the same resource, which `R`'s contract covers. Both calls go
// to it unchanged, and a clone is another `Arc` of it.
unsafe impl<S: ?Sized, E> MemoryOf<E> for LeafOf<S, E> {}
