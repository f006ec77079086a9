//! Giving back what a built stack keeps free: the layers that keep memory
//! freed through them ([`Release`]: the pools, the fixed-size, binning and
//! arena resources, the stream-ordered layer, the virtual pool, `planned`'s
//! regions, a backend's driver pool), which constructors register with
//! [`Context::keep_releasing`](super::Context::keep_releasing), and the
//! list of them a [`Built`](super::Built) stack hands out
//! ([`ReleaseLayers`]), what PyTorch's `empty_cache` reaches.

use crate::adaptor::Counted;
use crate::arena::ArenaResource;
use crate::binning::BinningResource;
use crate::fixed::{FixedSizeResource, Slot};
use crate::index::Node;
use crate::lock::RawLock;
use crate::per_stream::{ChunkPool, MakePool, PerStreamPool};
use crate::planned::Planned;
use crate::pool::{Chunk, CoalescingPool};
use crate::storage::Storage;
use crate::stream_ordered::StreamOrdered;
use crate::vmem::ReservableSpace;
use crate::vpool::VirtualPool;
use crate::{Inspect, MemoryResource, MemoryResourceMut, Result, Shared, Stream};
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;

/// A layer of a stack that keeps memory freed through it and can give it
/// back: a `pool` (one, or one per stream), `fixed`, `binning` or `arena`
/// (wholly free chunks), a `stream` layer (the blocks listed for reuse), a
/// virtual pool (`vpool`, memres-cuda's `vmm`: mapped granules no block
/// uses), `planned` (its regions that no block lives in), a
/// backend's leaf over a driver's pool (memres-cuda's `async`).
pub trait Release<S: ?Sized>: Send + Sync {
    /// Gives back what the layer keeps free, ordered on `stream`, once
    /// every stream of the device is done where `stream` can wait for
    /// that ([`Stream::synchronize_device`]; else the layer's own stream
    /// rules hold). Returns the bytes given back.
    ///
    /// # Errors
    ///
    /// The stream's or the memory below's; what could not go back stays
    /// and the layer stays usable.
    fn release(&self, stream: &S) -> Result<u64>;

    /// Bytes the layer holds from below it: from its upstream (its call's
    /// first resource argument). Resources it serves from that it built
    /// from other arguments (a binning resource's counted bins) are layers
    /// of their own, or their leaves' memory.
    fn held(&self) -> u64;

    /// Of those, the bytes of blocks from below that it handed out as they
    /// are (`planned`'s outside its regions): what the layers over it free
    /// into them leaves the stack at once, not at this layer's release.
    /// None by default.
    fn passed_through(&self) -> u64 {
        0
    }
}

/// A pool behind its lock.
impl<S, U, N, C, L> Release<S> for Shared<CoalescingPool<U, N, C>, L>
where
    S: Stream + ?Sized,
    U: MemoryResource<S>,
    N: Storage<Node>,
    C: Storage<Chunk>,
    CoalescingPool<U, N, C>: Send,
    L: RawLock + Send + Sync,
{
    fn release(&self, stream: &S) -> Result<u64> {
        self.with(|p| release_one(p, stream))
    }
    fn held(&self) -> u64 {
        self.with(|p| p.held_bytes())
    }
}

/// A virtual pool behind its lock: what it keeps is its mapped granules
/// that no block uses.
impl<S, V, L> Release<S> for Shared<VirtualPool<V>, L>
where
    S: Stream + ?Sized,
    V: ReservableSpace + Send,
    L: RawLock + Send + Sync,
{
    fn release(&self, stream: &S) -> Result<u64> {
        self.with(|p| release_one(p, stream))
    }
    fn held(&self) -> u64 {
        self.with(|p| p.committed_bytes())
    }
}

/// A fixed-size resource behind its lock: its wholly free chunks.
impl<S, U, C, F, L> Release<S> for Shared<FixedSizeResource<U, C, F>, L>
where
    S: Stream + ?Sized,
    U: MemoryResource<S>,
    C: Storage<Chunk>,
    F: Storage<Slot>,
    FixedSizeResource<U, C, F>: Send,
    L: RawLock + Send + Sync,
{
    fn release(&self, stream: &S) -> Result<u64> {
        self.with(|f| {
            stream.synchronize_device()?;
            f.release(stream)
        })
    }
    fn held(&self) -> u64 {
        self.with(|f| f.usage().held)
    }
}

/// Binning: the wholly free chunks of its fixed-size bins. It holds what
/// its upstream lent it, those chunks and its large blocks; the other bins
/// are layers of their own (their resources' layers count what they hold).
impl<S, U> Release<S> for BinningResource<'_, U, S>
where
    S: Stream + ?Sized,
    U: MemoryResource<S>,
    Self: Send + Sync,
{
    fn release(&self, stream: &S) -> Result<u64> {
        stream.synchronize_device()?;
        BinningResource::release(self, stream)
    }
    fn held(&self) -> u64 {
        self.held_as_layer(|_| false)
    }
}

/// `binning` as a layer of a built stack: the resource, and the sizes of
/// its counted bins whose resources keep no layer of the stack (a leaf's
/// bin), whose live blocks it counts as held too: no layer under them
/// would. A counted bin over a layer (a pool) is left to that layer.
pub(super) struct BinningLayer<B> {
    pub(super) bins: Arc<B>,
    pub(super) own: Vec<u64>,
}

impl<S, U> Release<S> for BinningLayer<BinningResource<'static, U, S>>
where
    S: Stream + ?Sized,
    U: MemoryResource<S>,
    BinningResource<'static, U, S>: Send + Sync,
{
    fn release(&self, stream: &S) -> Result<u64> {
        Release::release(&*self.bins, stream)
    }
    fn held(&self) -> u64 {
        self.bins.held_as_layer(|size| self.own.contains(&size))
    }
}

/// The arena: its idle arenas' superblocks, then the global arena's wholly
/// free chunks.
impl<S, U, L> Release<S> for ArenaResource<U, L>
where
    S: Stream + ?Sized,
    U: MemoryResource<S>,
    L: RawLock,
    Self: Send + Sync,
{
    fn release(&self, stream: &S) -> Result<u64> {
        stream.synchronize_device()?;
        ArenaResource::release(self, stream)
    }
    fn held(&self) -> u64 {
        self.usage().held
    }
}

/// The stream-ordered layer behind its lock: its listed blocks go back to
/// the memory under it once the streams that freed them are done
/// ([`StreamOrdered::synchronize_and_merge`]), for the layers under it to
/// give on.
impl<S, A, L> Release<S> for Shared<StreamOrdered<A, S>, L>
where
    S: Stream + Clone,
    A: MemoryResourceMut<()>,
    StreamOrdered<A, S>: Send,
    L: RawLock + Send + Sync,
{
    fn release(&self, _: &S) -> Result<u64> {
        self.with(|so| {
            let listed = so.listed_bytes();
            so.synchronize_and_merge()?;
            Ok(listed - so.listed_bytes())
        })
    }
    fn held(&self) -> u64 {
        self.with(|so| so.held_bytes())
    }
}

/// One pool's release, once the device is done where the stream can wait
/// for that: its blocks may have been freed on other streams.
fn release_one<S: Stream + ?Sized, P: ChunkPool<S>>(pool: &mut P, stream: &S) -> Result<u64> {
    stream.synchronize_device()?;
    pool.release(stream)
}

/// A pool per stream behind its lock; [`PerStreamPool::release`]
/// synchronizes the device itself.
impl<S, M, L> Release<S> for Shared<PerStreamPool<M, S>, L>
where
    S: Stream + ?Sized,
    M: MakePool<S>,
    PerStreamPool<M, S>: Send,
    L: RawLock + Send + Sync,
{
    fn release(&self, stream: &S) -> Result<u64> {
        self.with(|p| p.release(stream))
    }
    fn held(&self) -> u64 {
        self.with(|p| p.usage().held)
    }
}

/// `planned`: its regions that no block lives in, once the step's region
/// is free (the plan goes then).
impl<S, R> Release<S> for Planned<R>
where
    S: Stream + ?Sized,
    R: MemoryResource<S> + Send + Sync,
{
    fn release(&self, stream: &S) -> Result<u64> {
        Planned::release(self, stream)
    }
    fn held(&self) -> u64 {
        Planned::held(self)
    }
    fn passed_through(&self) -> u64 {
        Planned::passed_through(self)
    }
}

/// A counted leaf is its leaf.
impl<S: ?Sized, R: Release<S>> Release<S> for Counted<R> {
    fn release(&self, stream: &S) -> Result<u64> {
        self.inner().release(stream)
    }
    fn held(&self) -> u64 {
        self.inner().held()
    }
}

/// The layers of a built stack that keep freed memory, outermost first,
/// each with its name: what [`Built::release_layers`](super::Built::release_layers)
/// hands out, to give that memory back later.
///
/// A layer gives back to the memory under it, which may be another such
/// layer (a pool over a pool, over `vmm`, over an `async` leaf): that one
/// keeps what it got until it gives back in turn. So a release goes
/// outermost first, and the bytes the stack gave back are those its
/// innermost layers gave: what left the stack. A layer is innermost when
/// no such layer is in its upstream, its call's first resource argument:
/// `binning(UP, bin(4KiB, pool(...)))` over a bare `UP` is, beside its
/// counted bin's pool.
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::Statistics;
/// use memres_core::stack::{StackBuilder, Unbacked};
/// use memres_core::{DynResource, MemoryResource, Request};
/// let mut b = StackBuilder::<()>::new();
/// b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
/// let built = b.build_with_handles("pool(pool(stats(leaf)), initial=1MiB)", &())?;
/// let layers = built.release_layers();
/// assert_eq!(layers.len(), 2);
/// let x = built.resource.allocate(Request::new(4 << 20)?, &())?; // the outer pool grows
/// built.resource.deallocate(x, &())?;
/// let below = built.get::<Statistics<DynResource>>("stats").unwrap();
/// let from_leaf = below.get_bytes_counter().value;
/// // The outer pool's chunks, and the inner's under them; the inner's
/// // are what the stack holds from the leaf.
/// assert!(layers.held_by("pool") >= 2 * (4 << 20));
/// assert_eq!(layers.held(), from_leaf as u64);
/// // The outer pool's chunks go to the inner one first, which gives them on.
/// assert_eq!(layers.release(&())?, from_leaf as u64);
/// assert_eq!((layers.held_by("pool"), below.get_bytes_counter().value), (0, 0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ReleaseLayers<S: ?Sized> {
    /// Outermost first: a layer gives back to the layers under it, which
    /// give it on.
    layers: Vec<Layer<S>>,
}

/// A layer of a stack that keeps freed memory, with its call's name and
/// position in the stack's text.
pub(super) struct Layer<S: ?Sized> {
    pub(super) name: String,
    pub(super) pos: usize,
    /// No other such layer is under it: what it gives back leaves the
    /// stack.
    pub(super) innermost: bool,
    /// Released when the build fails: a layer the build made over an
    /// upstream, which may be shared beyond the stack. Not another built
    /// stack's layers ([`Context::keep_releasing_of`](super::Context::keep_releasing_of)),
    /// which keep what they hold, nor a leaf of the driver's memory
    /// ([`Context::keep_leaf_of_releasing`](super::Context::keep_leaf_of_releasing)):
    /// its drop gives back what it holds, or it fronts a pool of the
    /// driver's shared beyond the stack (a device's default memory pool),
    /// which a release would trim after waiting for the device.
    pub(super) let_go: bool,
    pub(super) layer: Arc<dyn Release<S>>,
}

impl<S: ?Sized> Clone for Layer<S> {
    fn clone(&self) -> Self {
        Layer {
            name: self.name.clone(),
            pos: self.pos,
            innermost: self.innermost,
            let_go: self.let_go,
            layer: self.layer.clone(),
        }
    }
}

impl<S: ?Sized> ReleaseLayers<S> {
    /// The layers of a stack, in the order they were kept.
    pub(super) fn new(mut layers: Vec<Layer<S>>) -> Self {
        // A call's upstreams are written after its name: by position is
        // outermost first. Layers of one call (one that wraps what it built
        // of that call with another builder) are kept upstream first: of
        // those, the last kept is the outermost.
        layers.reverse();
        layers.sort_by_key(|l| l.pos);
        ReleaseLayers { layers }
    }

    /// Gives back what every layer keeps free, outermost first; returns the
    /// bytes that left the stack: those its innermost layers gave back (an
    /// outer layer's bytes count once, when the layer under it gives them
    /// on), and those the outer layers freed through an innermost layer
    /// that passes blocks through (`planned` outside its regions; frees
    /// through it by other threads meanwhile count too).
    ///
    /// # Errors
    ///
    /// The first layer's error; the layers after it still give back.
    pub fn release(&self, stream: &S) -> Result<u64> {
        let through: Vec<u64> = self.layers.iter().map(|l| l.layer.passed_through()).collect();
        let (mut given, mut first) = (0u64, None);
        for (l, before) in self.layers.iter().zip(through) {
            // Saturating: a layer registered from outside may report any figure.
            if l.innermost {
                given = given.saturating_add(before.saturating_sub(l.layer.passed_through()));
            }
            match l.layer.release(stream) {
                Ok(n) if l.innermost => given = given.saturating_add(n),
                Ok(_) => {}
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(given), Err)
    }

    /// Bytes the stack holds from the memory under it: those its innermost
    /// layers hold.
    pub fn held(&self) -> u64 {
        // Saturating: a layer registered from outside may report any figure.
        self.layers.iter().filter(|l| l.innermost).map(|l| l.layer.held()).fold(0, u64::saturating_add)
    }

    /// Bytes the layers named `name` hold, summed.
    pub fn held_by(&self, name: &str) -> u64 {
        self.layers.iter().filter(|l| l.name == name).map(|l| l.layer.held()).fold(0, u64::saturating_add)
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether the stack keeps nothing it could give back.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

/// Another stack's layers as one layer of a stack built over it
/// ([`Context::keep_releasing_of`](super::Context::keep_releasing_of)).
impl<S: ?Sized> Release<S> for ReleaseLayers<S> {
    fn release(&self, stream: &S) -> Result<u64> {
        ReleaseLayers::release(self, stream)
    }
    fn held(&self) -> u64 {
        ReleaseLayers::held(self)
    }
}

impl<S: ?Sized> Clone for ReleaseLayers<S> {
    fn clone(&self) -> Self {
        ReleaseLayers { layers: self.layers.clone() }
    }
}

impl<S: ?Sized> fmt::Debug for ReleaseLayers<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.layers.iter().map(|l| &l.name)).finish()
    }
}
