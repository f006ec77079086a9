//! The pools a [`PerStreamPool`](super::PerStreamPool) holds, one per
//! stream: what it needs of them ([`ChunkPool`]) and how it makes them
//! ([`MakePool`], [`PoolMaker`], [`VirtualMaker`]).

use crate::pool::{ChunkMove, CoalescingPool, FreeChunk, PoolConfig};
use crate::storage::Storage;
use crate::vmem::ReservableSpace;
use crate::vpool::{VirtualConfig, VirtualPool};
use crate::{Block, Error, Inspect, MemoryResource, MemoryResourceMut, Range, Request, Result, Stream};

/// What [`PerStreamPool`](super::PerStreamPool) needs of each stream's pool: a pool of chunks from
/// an upstream that can allocate without growing, tell when a free leaves a
/// chunk wholly free, and hand a wholly free chunk to another pool over the
/// same upstream; its figures and checker are its [`Inspect`].
/// [`CoalescingPool`] is one. A [`VirtualPool`] is one with no chunk to
/// hand over: each stream's pool maps its own reservation, and memory
/// reaches another stream only as physical memory it unmapped.
pub trait ChunkPool<S: Stream + ?Sized>: MemoryResourceMut<S> + Inspect {
    /// Allocates from what the pool holds, without taking a chunk from
    /// upstream (a virtual pool maps memory in its reservation, ordering
    /// any unmap on `stream`): `Ok(None)` when nothing fits.
    ///
    /// # Errors
    ///
    /// The pool's own (metadata storage full, a backend failure).
    fn try_allocate(&mut self, request: Request, stream: &S) -> Result<Option<Block>>;

    /// Frees `block` on `stream` (the stream of the pool, or one the pool's
    /// stream will wait on before its next call) and says whether that left
    /// its chunk wholly free.
    ///
    /// # Errors
    ///
    /// As [`MemoryResourceMut::deallocate`]; nothing changes then.
    fn deallocate_reporting(&mut self, block: Block, stream: &S) -> Result<bool>;

    /// Frees `block` on another stream than the pool's, one that the pool's
    /// stream waits on before its next call, and says whether that left its
    /// chunk wholly free. A pool that gives memory back on a free leaves
    /// that to its next call on its own stream: memory that blocks freed on
    /// several streams touched goes back only once one stream is ordered
    /// after all of them. The default: as
    /// [`deallocate_reporting`](Self::deallocate_reporting).
    ///
    /// # Errors
    ///
    /// As [`MemoryResourceMut::deallocate`]; nothing changes then.
    fn deallocate_cross(&mut self, block: Block, stream: &S) -> Result<bool> {
        self.deallocate_reporting(block, stream)
    }

    /// Whether [`try_allocate`](Self::try_allocate) may take memory, as
    /// much as `allocate` would (a virtual pool maps granules): the
    /// per-stream pool then counts the peak of what its pools hold after
    /// every allocation, not only where they grew from upstream, and when
    /// `try_allocate` finds no room it calls `allocate` only after other
    /// streams' memory went back, and once after its last resort.
    const GROWS_IN_TRY_ALLOCATE: bool = false;

    /// Whether a free may give memory back (a virtual pool over its release
    /// threshold unmaps idle granules): the per-stream pool then orders the
    /// pool's stream after the frees of its blocks on other streams before
    /// it frees there, as it does before every allocation. The default:
    /// no.
    fn frees_give_back(&self) -> bool {
        false
    }

    /// Whether `addr` lies in one of the pool's chunks.
    fn holds(&self, addr: u64) -> bool;

    /// Bytes the pool holds from upstream: its usage's `held`, which the
    /// per-stream pool adds up after every allocation that may take memory
    /// (so it must be cheap, unlike a whole usage with its largest free
    /// range).
    fn held(&self) -> u64;

    /// The length of the shortest wholly free chunk that could serve
    /// `serving` once adopted by a pool like this one (any, if `None`).
    fn shortest_free_chunk(&self, serving: Option<Request>) -> Option<u64>;

    /// Takes the chunk [`shortest_free_chunk`](Self::shortest_free_chunk)
    /// names out of the pool. Only the per-stream pool calls it
    /// ([`ChunkMove`]).
    fn take_free_chunk(&mut self, serving: Option<Request>, leave: ChunkMove) -> Option<FreeChunk>;

    /// Adopts a chunk taken from another pool over the same upstream. Only
    /// the per-stream pool calls it ([`ChunkMove`]).
    ///
    /// # Errors
    ///
    /// Why it cannot (a maximum size, full metadata storage); the chunk
    /// comes back and nothing changed.
    #[allow(clippy::result_large_err)] // the chunk must come back
    fn adopt_chunk(
        &mut self,
        chunk: FreeChunk,
        leave: ChunkMove,
    ) -> core::result::Result<(), (Error, FreeChunk)>;

    /// Gives every wholly free chunk back upstream, freed on `stream`;
    /// returns the bytes given back. The per-stream pool counts what went
    /// back by [`held`](Self::held) before and after, refused or not.
    ///
    /// # Errors
    ///
    /// The upstream's first; the chunks it refused stay, the others go back.
    fn release(&mut self, stream: &S) -> Result<u64>;

    /// Calls `f` with each chunk's range.
    fn for_each_chunk(&self, f: &mut dyn FnMut(Range));
}

impl<S, U, N, C> ChunkPool<S> for CoalescingPool<U, N, C>
where
    S: Stream + ?Sized,
    U: MemoryResource<S>,
    N: Storage<crate::index::Node>,
    C: Storage<crate::pool::Chunk>,
{
    #[inline]
    fn try_allocate(&mut self, request: Request, _: &S) -> Result<Option<Block>> {
        CoalescingPool::try_allocate(self, request)
    }
    #[inline]
    fn deallocate_reporting(&mut self, block: Block, _: &S) -> Result<bool> {
        CoalescingPool::deallocate_reporting(self, block)
    }
    fn holds(&self, addr: u64) -> bool {
        CoalescingPool::holds(self, addr)
    }
    fn held(&self) -> u64 {
        self.held_bytes()
    }
    fn shortest_free_chunk(&self, serving: Option<Request>) -> Option<u64> {
        CoalescingPool::shortest_free_chunk(self, serving)
    }
    fn take_free_chunk(&mut self, serving: Option<Request>, leave: ChunkMove) -> Option<FreeChunk> {
        CoalescingPool::take_free_chunk(self, serving, leave)
    }
    fn adopt_chunk(
        &mut self,
        chunk: FreeChunk,
        leave: ChunkMove,
    ) -> core::result::Result<(), (Error, FreeChunk)> {
        CoalescingPool::adopt_chunk(self, chunk, leave)
    }
    fn release(&mut self, stream: &S) -> Result<u64> {
        CoalescingPool::release(self, stream)
    }
    fn for_each_chunk(&self, f: &mut dyn FnMut(Range)) {
        self.chunk_ranges().for_each(f)
    }
}

/// Makes the pool of a stream the first time the stream allocates.
///
/// Every pool a maker makes must be over one upstream: the per-stream pool
/// moves wholly free chunks between its pools, so a chunk one pool took
/// from its upstream may be handed out, and freed, by another. The types
/// cannot hold a maker to it: a closure (`FnMut(&S) -> Result<P>` is a
/// maker) may make pools over different upstreams, and then a chunk moved
/// between them goes back to an upstream that never gave it. So only
/// [`PoolMaker`] over an `Arc` or a reference, and [`VirtualMaker`] (whose
/// pools hand no chunk over), make a per-stream pool that vouches for its
/// memory ([`MemoryOf`](crate::copy::MemoryOf)).
pub trait MakePool<S: Stream + ?Sized> {
    /// The pool of one stream.
    type Pool: ChunkPool<S>;

    /// A new, empty pool for `stream`.
    ///
    /// # Errors
    ///
    /// Why it cannot be made; the allocation that wanted it fails with it.
    fn make(&mut self, stream: &S) -> Result<Self::Pool>;
}

impl<S: Stream + ?Sized, P: ChunkPool<S>, F: FnMut(&S) -> Result<P>> MakePool<S> for F {
    type Pool = P;
    fn make(&mut self, stream: &S) -> Result<P> {
        self(stream)
    }
}

/// Makes [`CoalescingPool`]s over clones of one upstream (an `Arc`, a
/// `&R`, a [`DynResource`](crate::DynResource)), all with one
/// configuration.
///
/// # Examples
///
/// ```
/// use memres_core::per_stream::PoolMaker;
/// use memres_core::pool::PoolConfig;
/// # use memres_core::testing::BumpUpstream;
/// let up = BumpUpstream::new(1 << 30);
/// assert_eq!(PoolMaker::new(&up).config(), &PoolConfig::default());
/// assert!(PoolMaker::with_config(&up, PoolConfig::new().initial_size(100)).is_err());
/// ```
#[derive(Clone, Debug)]
pub struct PoolMaker<U> {
    upstream: U,
    config: PoolConfig,
    /// The initial size of the next pool made, in place of the
    /// configuration's; 0 once that pool is made.
    first_initial: u64,
}

impl<U> PoolMaker<U> {
    /// Pools over clones of `upstream` with the default configuration.
    pub fn new(upstream: U) -> Self {
        PoolMaker { upstream, config: PoolConfig::default(), first_initial: 0 }
    }

    /// Pools over clones of `upstream` with `config` (each takes the
    /// initial size, if any, when made).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a configuration no pool accepts.
    pub fn with_config(upstream: U, config: PoolConfig) -> Result<Self> {
        config.validate()?;
        Ok(PoolMaker { upstream, config, first_initial: 0 })
    }

    /// The first pool made takes `bytes` from upstream when made (RMM's
    /// initial pool size, for the first stream: see
    /// [`PerStreamPool::make_pool`](super::PerStreamPool::make_pool)); the
    /// others take the configuration's initial size.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a size no pool of the configuration
    /// accepts.
    ///
    /// ```
    /// # use memres_core::per_stream::PoolMaker;
    /// # use memres_core::pool::PoolConfig;
    /// # use memres_core::testing::BumpUpstream;
    /// let up = BumpUpstream::new(1 << 30);
    /// assert!(PoolMaker::new(&up).first_initial_size(1 << 20).is_ok());
    /// assert!(PoolMaker::new(&up).first_initial_size(100).is_err(), "not a multiple of 256");
    /// ```
    pub fn first_initial_size(mut self, bytes: u64) -> Result<Self> {
        self.config.initial_size(bytes).validate()?;
        self.first_initial = bytes;
        Ok(self)
    }

    /// The configuration of every pool.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// The upstream every pool takes its chunks from.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }
}

impl<S: Stream + ?Sized, U: MemoryResource<S> + Clone> MakePool<S> for PoolMaker<U> {
    type Pool = CoalescingPool<U>;
    fn make(&mut self, stream: &S) -> Result<CoalescingPool<U>> {
        let config = match self.first_initial {
            0 => self.config,
            first => self.config.initial_size(first),
        };
        let pool = CoalescingPool::with_config(self.upstream.clone(), config, stream)?;
        self.first_initial = 0;
        Ok(pool)
    }
}

/// Each stream's virtual pool maps its own reservation: nothing moves
/// between streams but physical memory, which a pool unmaps (ordered on
/// the stream of the call, after the waits its lane settled) before
/// another maps it. So a free never leaves a chunk to hand over.
impl<S: Stream + ?Sized, V: ReservableSpace> ChunkPool<S> for VirtualPool<V> {
    const GROWS_IN_TRY_ALLOCATE: bool = true;

    /// The pool's allocate; out of memory is `Ok(None)`, so that the
    /// per-stream pool's last resort (other streams' idle memory unmapped
    /// once the device is idle) runs.
    #[inline]
    fn try_allocate(&mut self, request: Request, stream: &S) -> Result<Option<Block>> {
        match self.allocate(request, stream) {
            Ok(block) => Ok(Some(block)),
            Err(e) if e.is_out_of_memory() => Ok(None),
            Err(e) => Err(e),
        }
    }
    #[inline]
    fn deallocate_reporting(&mut self, block: Block, stream: &S) -> Result<bool> {
        self.deallocate(block, stream).map(|()| false)
    }
    /// Unmaps nothing: the pool's own stream does, once it waited.
    fn deallocate_cross(&mut self, block: Block, _: &S) -> Result<bool> {
        self.deallocate_keeping(block).map(|()| false)
    }
    /// Over its release threshold.
    fn frees_give_back(&self) -> bool {
        self.config().release_threshold_bytes() != u64::MAX
    }
    fn holds(&self, addr: u64) -> bool {
        VirtualPool::holds(self, addr)
    }
    fn held(&self) -> u64 {
        self.committed_bytes()
    }
    fn shortest_free_chunk(&self, _: Option<Request>) -> Option<u64> {
        None
    }
    fn take_free_chunk(&mut self, _: Option<Request>, _: ChunkMove) -> Option<FreeChunk> {
        None
    }
    fn adopt_chunk(
        &mut self,
        chunk: FreeChunk,
        _: ChunkMove,
    ) -> core::result::Result<(), (Error, FreeChunk)> {
        Err((
            Error::InvalidConfig { what: "a virtual pool maps its own reservation and adopts no chunk" },
            chunk,
        ))
    }
    /// Unmaps every idle granule, ordered on `stream`.
    fn release(&mut self, stream: &S) -> Result<u64> {
        self.trim(stream)
    }
    fn for_each_chunk(&self, f: &mut dyn FnMut(Range)) {
        self.reservations().for_each(f)
    }
}

/// Makes [`VirtualPool`]s over clones of one address space (an `Arc`, a
/// `&V`), all with one configuration: each reserves its own range.
///
/// # Examples
///
/// ```
/// use memres_core::per_stream::{PerStreamPool, VirtualMaker};
/// use memres_core::testing::IdStream;
/// use memres_core::vmem::CountingSpace;
/// use memres_core::vpool::VirtualConfig;
/// use memres_core::{Inspect, MemoryResourceMut, Request};
/// let space = CountingSpace::new(1 << 30, 2 << 20);
/// let mut pools = PerStreamPool::new(VirtualMaker::new(&space, VirtualConfig::new(256 << 20))?);
/// let (a, b) = (IdStream(1), IdStream(2));
/// let x = pools.allocate(Request::new(3 << 20)?, &a)?;
/// let y = pools.allocate(Request::new(3 << 20)?, &b)?;
/// assert_eq!(space.committed_bytes(), 8 << 20); // two granules each
/// assert!(y.addr().abs_diff(x.addr()) >= 256 << 20); // reservations of their own
/// pools.deallocate(x, &a)?;
/// pools.deallocate(y, &b)?;
/// pools.check().unwrap();
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct VirtualMaker<V> {
    space: V,
    config: VirtualConfig,
}

impl<V: ReservableSpace> VirtualMaker<V> {
    /// Pools over clones of `space` with `config`, checked now (each pool
    /// is made at its stream's first allocation).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a configuration no pool over `space`
    /// could take ([`VirtualConfig::check`]).
    pub fn new(space: V, config: VirtualConfig) -> Result<Self> {
        config.check(space.granule())?;
        Ok(VirtualMaker { space, config })
    }
}

impl<V> VirtualMaker<V> {
    /// The configuration of every pool.
    pub fn config(&self) -> &VirtualConfig {
        &self.config
    }

    /// The space every pool maps.
    pub fn space(&self) -> &V {
        &self.space
    }
}

impl<S: Stream + ?Sized, V: ReservableSpace + Clone> MakePool<S> for VirtualMaker<V> {
    type Pool = VirtualPool<V>;
    fn make(&mut self, _: &S) -> Result<VirtualPool<V>> {
        VirtualPool::with_config(self.space.clone(), self.config)
    }
}
