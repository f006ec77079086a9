//! The coalescing pool: RMM's `pool_memory_resource` with an O(1) index.
//!
//! [`CoalescingPool`] takes chunks from an upstream resource and suballocates
//! them through a [`CoalescingIndex`], a two-level segregated-fit index of
//! free ranges (as TLSF and OffsetAllocator use). Allocate and free are O(1);
//! blocks of different chunks never coalesce; wholly free chunks go back
//! upstream on [`release`](CoalescingPool::release).

#[cfg(test)]
mod capacity_tests;
#[cfg(all(test, feature = "alloc"))]
mod class_tests;
mod classes;
mod config;

pub use config::PoolConfig;
#[cfg(all(test, feature = "alloc"))]
mod tests;

/// The chunk table's record and growth policy, named where they always were.
pub use crate::chunks::{Chunk, Growth};
/// The index the pool suballocates with, where the pool's users have always
/// found it.
pub use crate::index::{Allocation, CoalescingIndex, Node};

use crate::check::Violation;
use crate::chunks::{Carve, ChunkTable, GiveBack};
use crate::resource::{default_constructors, with_config_in};
use crate::storage::{DefaultStorage, Storage};
use crate::{
    Block, Error, Inspect, MemoryResource, MemoryResourceMut, Range, Request, Result, Stream, Usage,
};
use classes::Classes;
use core::fmt;

/// A wholly free chunk taken out of a pool by
/// [`ChunkPool::take_free_chunk`](crate::per_stream::ChunkPool::take_free_chunk),
/// for another pool over the same upstream to
/// [`adopt`](crate::per_stream::ChunkPool::adopt_chunk): how the per-stream
/// pools ([`crate::per_stream`]) move memory between streams. Only a pool
/// makes one, so an adopted chunk is always a real upstream block.
#[derive(Debug, PartialEq, Eq)]
pub struct FreeChunk {
    range: Range,
    block: Block,
    /// Whether it held a large block (and joins the large class again).
    large: bool,
}

impl FreeChunk {
    /// The chunk's addresses.
    pub fn range(&self) -> Range {
        self.range
    }
}

/// Leave to move a chunk between pools, which only this crate grants: a
/// chunk adopted by a pool over another upstream would be handed out as
/// that upstream's memory, and freed to it. So chunks move only between
/// the pools of one [`PerStreamPool`](crate::per_stream::PerStreamPool),
/// which its maker made over one upstream.
///
/// ```compile_fail,E0423
/// let leave = memres_core::pool::ChunkMove(());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ChunkMove(());

// Chunks move only inside a `PerStreamPool` (feature `alloc`).
#[cfg(feature = "alloc")]
impl ChunkMove {
    pub(crate) const fn granted() -> Self {
        ChunkMove(())
    }
}

/// A coalescing pool over chunks from an upstream resource: RMM's
/// `pool_memory_resource`, with O(1) allocate and free.
///
/// ```text
///  upstream ──chunks──► ┌───── chunk 0 ─────┐ ┌── chunk 1 ──┐ ┌ chunk 2 ┐
///                       │used│free│used│free│ │used│  free  │ │  free   │
///                       └───────────────────┘ └─────────────┘ └─────────┘
///  allocate(req) ──► CoalescingIndex (O(1)) ──► Block { addr, size, tag }
///                     └ nothing fits: grow by the Growth policy, retry
///  deallocate(block) ─ tag names the node: O(1) free and coalesce
///                     └ no tag (address only): find the chunk, walk it
/// ```
///
/// - Every block is aligned to 256 bytes, or more when asked; sizes are
///   rounded up to 256 bytes.
/// - Blocks of different chunks never coalesce: each chunk is one upstream
///   allocation and goes back whole.
/// - The pool never holds more than its maximum size from upstream.
/// - Out of memory is [`Error::OutOfMemory`] with the request, the largest
///   free block, the pool size and the maximum.
///
/// The pool is a plain state machine (`&mut self`): wrap it in
/// [`Shared`](crate::Shared) to share it between threads.
///
/// # Examples
///
/// ```
/// use memres_core::pool::{CoalescingPool, PoolConfig};
/// use memres_core::{Error, Inspect, MemoryResourceMut, Request};
/// # use memres_core::testing::BumpUpstream;
/// let config = PoolConfig::new().initial_size(1 << 20).maximum_size(2 << 20);
/// let mut pool = CoalescingPool::with_config(BumpUpstream::new(1 << 30), config, &())?;
/// let a = pool.allocate(Request::new(1 << 20)?, &())?;
/// let err = pool.allocate(Request::new(2 << 20)?, &()).unwrap_err();
/// assert!(matches!(err, Error::OutOfMemory { max_size: Some(m), .. } if m == 2 << 20));
/// pool.deallocate(a, &())?;
/// assert_eq!(pool.usage().used, 0);
/// # Ok::<(), Error>(())
/// ```
pub struct CoalescingPool<
    U,
    N: Storage<Node> = DefaultStorage<Node>,
    C: Storage<Chunk> = DefaultStorage<Chunk>,
> {
    /// The free and used ranges of the chunks, in two classes.
    index: Classes<N>,
    /// Chunks held from upstream.
    chunks: ChunkTable<U, C>,
    /// The most bytes ever in use at once (sizes rounded to 256), with
    /// `keep_under_peak` (else 0).
    peak_used: u64,
    config: PoolConfig,
}

default_constructors! {
    CoalescingPool, PoolConfig, empty;
    /// An empty pool over `upstream` with the default configuration (no
    /// initial size, no maximum, [`Growth::DEFAULT`]).
    new;
    /// A pool over `upstream` with `config`; the initial size, if any, is
    /// taken from upstream now, on `stream`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for sizes that are not multiples of 256, a
    /// maximum below the initial size, or a growth policy that
    /// [`PoolConfig`] refuses (see `docs/bad-input.md`); the upstream's
    /// error if it cannot supply the initial size, or
    /// [`Error::UpstreamMisbehaved`] for a block it hands out outside its
    /// contract (given back).
    with_config;
}

impl<U, N: Storage<Node>, C: Storage<Chunk>> CoalescingPool<U, N, C> {
    fn empty(upstream: U, config: PoolConfig) -> Self {
        CoalescingPool {
            index: Classes::new(config.large_threshold),
            chunks: ChunkTable::new(upstream, config.maximum_size),
            peak_used: 0,
            config,
        }
    }

    /// Takes the initial memory `config` asks for, on `stream`
    /// (`with_config_in`'s last step); on failure it holds none.
    fn take_initial<S: Stream + ?Sized>(&mut self, stream: &S) -> Result<()>
    where
        U: MemoryResource<S>,
    {
        self.chunks.learn_drop::<S>();
        let size = self.config.initial_size;
        if size > 0 {
            self.chunks.take(Request::new(size)?, stream, &mut self.index, |b| b.upstream_range(size))?;
        }
        Ok(())
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &U {
        self.chunks.upstream()
    }

    /// The configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// Bytes held from upstream (its usage's `held`, without the search
    /// for the largest free range).
    #[inline]
    pub fn held_bytes(&self) -> u64 {
        self.chunks.held()
    }

    /// Number of chunks held from upstream.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// The index of the blocks below the large threshold, for inspection.
    pub fn index(&self) -> &CoalescingIndex<N> {
        &self.index.shared
    }

    /// The index of the large blocks (each chunk sized for one), for
    /// inspection.
    pub fn large_index(&self) -> &CoalescingIndex<N> {
        &self.index.large
    }

    fn out_of_memory(&self, requested: u64) -> Error {
        Error::OutOfMemory {
            requested,
            largest_free: self.index.largest_free(),
            pool_size: self.chunks.held(),
            max_size: self.config.maximum_size,
        }
    }

    /// Bytes that surely hold `request` at its alignment in a fresh chunk
    /// (upstream chunks are 256-aligned): at most 2^62 + 2^40, no overflow.
    #[inline]
    fn need(request: Request) -> u64 {
        request.rounded_size(256) + (request.align() - 256)
    }

    /// Grows the pool so that `request` fits, then allocates it.
    #[cold]
    fn grow_and_allocate<S: Stream + ?Sized>(&mut self, request: Request, stream: &S) -> Result<Block>
    where
        U: MemoryResource<S>,
    {
        let need = Self::need(request);
        // The peak in use with this request: what the pool may hold.
        let peak = self.peak_used.max(self.index.used_bytes() + request.rounded_size(256));
        let give_back = match (self.config.release_on_grow, self.config.keep_under_peak) {
            (false, _) => GiveBack::Never,
            (true, false) => GiveBack::Above(0),
            (true, true) => GiveBack::Above(peak),
        };
        let large = self.index.is_large(request.size());
        let growth = if large { self.config.large_growth() } else { self.config.growth };
        self.index.attach_large = large;
        let grown = self.chunks.grow(need, growth, give_back, stream, &mut self.index);
        let Ok(Some(first)) = grown else {
            // No chunk to be had: any free range of its class that holds it
            // serves rather than the request failing, one beyond the first
            // ranges the class search looks at, or a free large chunk
            // longer than "about its size". Also where the growth failed
            // with an error (an upstream that refused a chunk given back,
            // metadata slots run out): a failed growth leaves the pool as
            // it was, and a request that its free ranges hold needs nothing
            // of the upstream. The growth's error stands where none does.
            let index = self.index.of_class(large);
            let found = index.allocate_exhaustive(request.size(), request.align());
            return match (found, grown) {
                (Ok(Some(a)), _) => {
                    let tag = Classes::<N>::outer_tag(large, a.tag);
                    Ok(self.used(Block::new(a.addr, request.size(), tag)))
                }
                (_, Err(e)) | (Err(e), _) => Err(e),
                (Ok(None), _) => Err(self.out_of_memory(request.size())),
            };
        };
        let (index, node) = self.index.of_handle(first);
        // From the new chunk itself: one of exactly `need` bytes may sit in a
        // size class that the index's class search skips.
        match index.allocate_in(node, request.size(), request.align())? {
            Some(a) => {
                Ok(self.used(Block::new(a.addr, request.size(), Classes::<N>::outer_tag(large, a.tag))))
            }
            None => Err(self.out_of_memory(request.size())),
        }
    }

    /// Gives every wholly free chunk back to upstream; returns the bytes
    /// given back.
    ///
    /// # Errors
    ///
    /// The upstream's first error if it refuses a chunk; the chunks it
    /// refused stay in the pool, the others go back all the same.
    pub fn release<S: Stream + ?Sized>(&mut self, stream: &S) -> Result<u64>
    where
        U: MemoryResource<S>,
    {
        self.chunks.release(stream, &mut self.index)
    }

    /// The address ranges of the chunks, by address.
    pub fn chunk_ranges(&self) -> impl Iterator<Item = Range> + '_ {
        self.chunks.iter().map(|c| c.range())
    }

    /// Whether `addr` lies in one of the pool's chunks.
    pub fn holds(&self, addr: u64) -> bool {
        self.chunks.chunk_of(addr).is_some()
    }

    /// The length of the shortest wholly free chunk that could serve
    /// `serving` (of its class, and for a large request not longer than
    /// [`try_allocate`](Self::try_allocate) takes for it), or of any if
    /// `None`.
    ///
    /// # Time Complexity
    ///
    /// O(chunks).
    pub fn shortest_free_chunk(&self, serving: Option<Request>) -> Option<u64> {
        let wanted = self.chunk_serves(serving);
        self.chunks.shortest_free(&self.index, wanted)
    }

    /// Takes the shortest wholly free chunk that could serve `serving`, as
    /// [`shortest_free_chunk`](Self::shortest_free_chunk) finds it, out of
    /// the pool, still held from upstream, for another pool over the same
    /// upstream to [`adopt`](Self::adopt_chunk). The pool no longer counts
    /// it.
    ///
    /// # Time Complexity
    ///
    /// O(chunks).
    #[cfg(feature = "alloc")]
    pub(crate) fn take_free_chunk(&mut self, serving: Option<Request>, _: ChunkMove) -> Option<FreeChunk> {
        let wanted = self.chunk_serves(serving);
        let (range, block, handle) = self.chunks.take_free(&mut self.index, wanted)?;
        Some(FreeChunk { range, block, large: Classes::<N>::split_handle(handle).0 })
    }

    /// Whether a wholly free chunk of a class (as `Carve::class_of` numbers
    /// it) and a length could serve `serving`: one of the request's class,
    /// at least [`need`](Self::need) long, and for a large request at most
    /// [`longest_large`](Self::longest_large). Any chunk for `None`.
    fn chunk_serves(&self, serving: Option<Request>) -> impl Fn(usize, u64) -> bool {
        let fit = serving.filter(|r| !r.is_zero()).map(|r| {
            let large = self.index.is_large(r.size());
            let longest = if large { self.longest_large(r) } else { u64::MAX };
            (large as usize, Self::need(r), longest)
        });
        move |class, len| fit.is_none_or(|(c, need, longest)| class == c && (need..=longest).contains(&len))
    }

    /// The longest free range of the large class that serves `request`, a
    /// large one: about its size, no longer (its tail would be stranded
    /// until that block is freed), nor shorter than the chunk growth takes
    /// for it (longer than that bound only by its alignment padding): else
    /// a chunk grown for a request never serves it again.
    #[inline]
    fn longest_large(&self, request: Request) -> u64 {
        let size = request.size();
        let about = size.saturating_add(size / 4).saturating_add(self.config.large_granule());
        let grown =
            self.config.large_growth().chunk_size(Self::need(request).min(Request::MAX_SIZE), 0, None);
        about.max(grown)
    }

    /// Makes `chunk`, taken from another pool over the same upstream, a free
    /// chunk of this one; it goes back upstream from here.
    ///
    /// # Errors
    ///
    /// [`Error::LimitExceeded`] when it would take the pool past its
    /// maximum size, [`Error::CapacityExhausted`] when the metadata storage
    /// is full; the chunk comes back with the error, and nothing changed.
    #[allow(clippy::result_large_err)] // the chunk must come back
    #[cfg(feature = "alloc")]
    pub(crate) fn adopt_chunk(
        &mut self,
        chunk: FreeChunk,
        _: ChunkMove,
    ) -> core::result::Result<(), (Error, FreeChunk)> {
        let len = chunk.range.len();
        if let Some(max) = self.config.maximum_size.filter(|&m| len > m - self.chunks.held()) {
            return Err((
                Error::LimitExceeded { requested: len, used: self.chunks.held(), limit: max },
                chunk,
            ));
        }
        self.index.attach_large = chunk.large;
        match self.chunks.insert(chunk.range, chunk.block, &mut self.index) {
            Ok(_) => Ok(()),
            Err(e) => Err((e, chunk)),
        }
    }

    /// Free of a block whose tag did not name a live node: look the address up.
    #[cold]
    fn deallocate_by_address(&mut self, block: Block) -> Result<Range> {
        let addr = block.addr();
        let Some(&chunk) = self.chunks.chunk_of(addr) else {
            return Err(Error::UnknownBlock { addr });
        };
        let (large, first) = Classes::<N>::split_handle(chunk.first());
        let index = self.index.of_class(large);
        let had_tag = block.tag() != Block::NO_TAG;
        if had_tag {
            // A size of the other class sent the tag to the wrong index.
            match index.free(Classes::<N>::outer_tag(large, block.tag()), addr, block.size()) {
                Err(Error::UnknownBlock { .. }) => {}
                other => return other,
            }
        }
        index.free_by_address(first, addr, block.size(), had_tag)
    }

    /// Allocates `request` from the free ranges held now, without growing:
    /// `Ok(None)` when none fits.
    ///
    /// # Errors
    ///
    /// [`Error::CapacityExhausted`] when the metadata storage is full.
    ///
    /// # Time Complexity
    ///
    /// O(1).
    #[inline]
    pub fn try_allocate(&mut self, request: Request) -> Result<Option<Block>> {
        if request.is_zero() {
            return Ok(Some(Block::EMPTY));
        }
        let size = request.size();
        let large = self.index.is_large(size);
        let found = if large {
            let longest = self.longest_large(request);
            self.index.large.allocate_from_at_most(size, request.align(), longest)?
        } else {
            self.index.shared.allocate(size, request.align())?
        };
        Ok(found.map(|a| self.used(Block::new(a.addr, size, Classes::<N>::outer_tag(large, a.tag)))))
    }

    /// Counts `block`, just handed out, in the peak in use (kept only by a
    /// pool that gives chunks back above it).
    #[inline]
    fn used(&mut self, block: Block) -> Block {
        if self.config.keep_under_peak {
            self.peak_used = self.peak_used.max(self.index.used_bytes());
        }
        block
    }

    /// Frees `block` in the index of its class, else by address.
    #[inline]
    fn free_block(&mut self, block: Block) -> Result<Range> {
        let large = self.index.is_large(block.size());
        let tag = Classes::<N>::outer_tag(large, block.tag());
        match self.index.of_class(large).free(tag, block.addr(), block.size()) {
            Err(Error::UnknownBlock { .. }) => self.deallocate_by_address(block),
            other => other,
        }
    }

    /// Frees `block` as [`deallocate`](MemoryResourceMut::deallocate) does,
    /// and says whether that left its chunk wholly free.
    ///
    /// # Errors
    ///
    /// As `deallocate`; nothing changes then.
    ///
    /// # Time Complexity
    ///
    /// O(1), plus O(log chunks) when the free range it joins is at least as
    /// long as the shortest chunk.
    #[inline]
    pub fn deallocate_reporting(&mut self, block: Block) -> Result<bool> {
        if block.is_empty() {
            return Ok(false);
        }
        let merged = self.free_block(block)?;
        Ok(merged.len() >= self.chunks.shortest()
            && self.chunks.chunk_of(merged.start()).is_some_and(|c| c.range() == merged))
    }
}

with_config_in! {
    impl[U, N: Storage<Node>, C: Storage<Chunk>] CoalescingPool<U, N, C>, PoolConfig, empty;
    /// [`with_config`](CoalescingPool::with_config) for any metadata storage
    /// (fixed-capacity storage for builds with no allocator).
    ///
    /// A pool over `upstream` with `config`; the initial size, if any, is
    /// taken from upstream now, on `stream`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for sizes that are not multiples of 256, a
    /// maximum below the initial size, or a growth policy that
    /// [`PoolConfig`] refuses (see `docs/bad-input.md`); the upstream's
    /// error if it cannot supply the initial size, or
    /// [`Error::UpstreamMisbehaved`] for a block it hands out outside its
    /// contract (given back).
}

impl<U, N: Storage<Node>, C: Storage<Chunk>> Inspect for CoalescingPool<U, N, C> {
    /// Used: sizes rounded up to 256; held: the chunks; largest free: the
    /// longest free range of the index.
    fn usage(&self) -> Usage {
        Usage {
            used: self.index.used_bytes(),
            held: self.held_bytes(),
            peak_held: self.chunks.peak_held(),
            free: self.index.free_bytes(),
            largest_free: self.index.largest_free(),
        }
    }

    /// Checks the pool's invariants: those of its two indexes, plus every
    /// chunk covered exactly by its nodes, chunks disjoint and sorted, bytes
    /// in use + bytes free = bytes held from upstream, and the peak in use
    /// (where kept) no lower than the bytes in use.
    fn check(&self) -> core::result::Result<(), Violation> {
        self.index.shared.check()?;
        self.index.large.check()?;
        if self.config.keep_under_peak && self.index.used_bytes() > self.peak_used {
            return Err(Violation::new("bytes in use above the recorded peak"));
        }
        self.chunks.check(&self.index)?;
        if self.index.used_bytes() + self.index.free_bytes() != self.chunks.held() {
            return Err(Violation::new("bytes in use + bytes free != bytes held from upstream"));
        }
        Ok(())
    }
}

impl<S, U, N, C> MemoryResourceMut<S> for CoalescingPool<U, N, C>
where
    S: Stream + ?Sized,
    U: MemoryResource<S>,
    N: Storage<Node>,
    C: Storage<Chunk>,
{
    #[inline]
    fn allocate(&mut self, request: Request, stream: &S) -> Result<Block> {
        match self.try_allocate(request)? {
            Some(b) => Ok(b),
            None => self.grow_and_allocate(request, stream),
        }
    }

    #[inline]
    fn deallocate(&mut self, block: Block, _stream: &S) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        self.free_block(block).map(|_| ())
    }
}

// SAFETY: the pool hands out only ranges one of its two indexes allocated,
// at least `request.size()` long, inside the chunks' ranges; each chunk range
// is the first bytes of a block of `U` no shorter than it (`upstream_range`
// refuses a shorter one), which the pool holds until no block in it is live
// (giving back, on release or before growing, takes only chunks the chunk's
// own index reports wholly free) and frees only through `U::deallocate`.
// Each index keeps its live ranges disjoint, each chunk is carved by exactly
// one index (its handle names which), and chunks are disjoint, so no two
// live ranges overlap; the pool keeps its metadata outside the managed
// memory, never touching it. A pool adopts a chunk only inside a
// per-stream pool (adopting takes a `ChunkMove`, which only this crate
// makes), and a pool there never hands a block to a caller but through the
// per-stream pool (`pool_of` lends it shared; allocating takes `&mut`), whose
// own `MemoryOf` impls cover only pools made over one upstream.
unsafe impl<E, U, N, C> crate::copy::MemoryOf<E> for CoalescingPool<U, N, C>
where
    U: crate::copy::MemoryOf<E>,
    N: Storage<Node>,
    C: Storage<Chunk>,
{
}

/// A pool whose metadata lives in fixed-capacity `heapless::Vec`s: at most
/// `NODES` ranges (free and used) and `CHUNKS` upstream chunks, no allocator.
/// Running out is [`Error::CapacityExhausted`].
///
/// # Examples
///
/// ```
/// use memres_core::pool::{HeaplessPool, PoolConfig};
/// use memres_core::{MemoryResourceMut, Request};
/// # use memres_core::testing::BumpUpstream;
/// let mut pool: HeaplessPool<_, 64, 4> = HeaplessPool::with_config_in(BumpUpstream::new(1 << 30), PoolConfig::new(), &())?;
/// let b = pool.allocate(Request::new(1000)?, &())?;
/// pool.deallocate(b, &())?;
/// # Ok::<(), memres_core::Error>(())
/// ```
#[cfg(feature = "heapless")]
pub type HeaplessPool<U, const NODES: usize, const CHUNKS: usize> =
    CoalescingPool<U, heapless::Vec<Node, NODES>, heapless::Vec<Chunk, CHUNKS>>;

/// Gives every wholly free chunk back upstream, on the stream type's
/// [`Stream::at_drop`] stream (`()`: at once), as RMM's pool releases its
/// chunks when destroyed. Synchronize the streams that used the pool before
/// dropping it. A chunk that still holds a live block stays with the
/// upstream (leaked) rather than being freed under it; so do all chunks of
/// a pool over a stream type without a drop stream: call
/// [`release`](CoalescingPool::release) before dropping such a pool.
impl<U, N: Storage<Node>, C: Storage<Chunk>> Drop for CoalescingPool<U, N, C> {
    fn drop(&mut self) {
        let index = &self.index;
        self.chunks.give_back_on_drop(|c| index.is_free(c));
    }
}

impl<U, N: Storage<Node>, C: Storage<Chunk>> fmt::Debug for CoalescingPool<U, N, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoalescingPool")
            .field("usage", &self.usage())
            .field("chunks", &self.chunks.len())
            .field("config", &self.config)
            .finish()
    }
}
