//! The pools a [`PerStreamPool`](super::PerStreamPool) holds, one per
//! stream: what it needs of them ([`ChunkPool`]) and how it makes them
//! ([`MakePool`], [`PoolMaker`]).

use crate::pool::{CoalescingPool, FreeChunk, PoolConfig};
use crate::storage::Storage;
use crate::{Block, Error, Inspect, MemoryResource, MemoryResourceMut, Range, Request, Result, Stream};

/// What [`PerStreamPool`](super::PerStreamPool) needs of each stream's pool: a pool of chunks from
/// an upstream that can allocate without growing, tell when a free leaves a
/// chunk wholly free, and hand a wholly free chunk to another pool over the
/// same upstream; its figures and checker are its [`Inspect`].
/// [`CoalescingPool`] is one.
pub trait ChunkPool<S: Stream + ?Sized>: MemoryResourceMut<S> + Inspect {
    /// Allocates from what the pool holds, without growing: `Ok(None)` when
    /// nothing fits.
    ///
    /// # Errors
    ///
    /// The pool's own (metadata storage full).
    fn try_allocate(&mut self, request: Request) -> Result<Option<Block>>;

    /// Frees `block` (a free on the stream of the pool) and says whether
    /// that left its chunk wholly free.
    ///
    /// # Errors
    ///
    /// As [`MemoryResourceMut::deallocate`]; nothing changes then.
    fn deallocate_reporting(&mut self, block: Block) -> Result<bool>;

    /// Whether `addr` lies in one of the pool's chunks.
    fn holds(&self, addr: u64) -> bool;

    /// The length of the shortest wholly free chunk of at least `min_len`
    /// bytes.
    fn shortest_free_chunk(&self, min_len: u64) -> Option<u64>;

    /// Takes the shortest wholly free chunk of at least `min_len` bytes out
    /// of the pool.
    fn take_free_chunk(&mut self, min_len: u64) -> Option<FreeChunk>;

    /// Adopts a chunk taken from another pool over the same upstream.
    ///
    /// # Errors
    ///
    /// Why it cannot (a maximum size, full metadata storage); the chunk
    /// comes back and nothing changed.
    #[allow(clippy::result_large_err)] // the chunk must come back
    fn adopt_chunk(&mut self, chunk: FreeChunk) -> core::result::Result<(), (Error, FreeChunk)>;

    /// Gives every wholly free chunk back upstream, freed on `stream`;
    /// returns the bytes given back.
    ///
    /// # Errors
    ///
    /// The upstream's; the chunk it refused stays.
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
    fn try_allocate(&mut self, request: Request) -> Result<Option<Block>> {
        CoalescingPool::try_allocate(self, request)
    }
    #[inline]
    fn deallocate_reporting(&mut self, block: Block) -> Result<bool> {
        CoalescingPool::deallocate_reporting(self, block)
    }
    fn holds(&self, addr: u64) -> bool {
        CoalescingPool::holds(self, addr)
    }
    fn shortest_free_chunk(&self, min_len: u64) -> Option<u64> {
        CoalescingPool::shortest_free_chunk(self, min_len)
    }
    fn take_free_chunk(&mut self, min_len: u64) -> Option<FreeChunk> {
        CoalescingPool::take_free_chunk(self, min_len)
    }
    fn adopt_chunk(&mut self, chunk: FreeChunk) -> core::result::Result<(), (Error, FreeChunk)> {
        CoalescingPool::adopt_chunk(self, chunk)
    }
    fn release(&mut self, stream: &S) -> Result<u64> {
        CoalescingPool::release(self, stream)
    }
    fn for_each_chunk(&self, f: &mut dyn FnMut(Range)) {
        self.chunk_ranges().for_each(f)
    }
}

/// Makes the pool of a stream the first time the stream allocates.
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
}

impl<U> PoolMaker<U> {
    /// Pools over clones of `upstream` with the default configuration.
    pub fn new(upstream: U) -> Self {
        PoolMaker { upstream, config: PoolConfig::default() }
    }

    /// Pools over clones of `upstream` with `config` (each takes the
    /// initial size, if any, when made).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a configuration no pool accepts.
    pub fn with_config(upstream: U, config: PoolConfig) -> Result<Self> {
        config.validate()?;
        Ok(PoolMaker { upstream, config })
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
        CoalescingPool::with_config(self.upstream.clone(), self.config, stream)
    }
}
