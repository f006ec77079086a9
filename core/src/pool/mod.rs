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
mod tests;

/// The index the pool suballocates with, where the pool's users have always
/// found it.
pub use crate::index::{Allocation, CoalescingIndex, Node};

use crate::check::Violation;
use crate::storage::{DefaultStorage, Storage};
use crate::{Block, Error, MemoryResource, MemoryResourceMut, Range, Request, Result, Stream};
use core::fmt;

/// How a pool sizes the chunks it takes from its upstream when it runs dry.
///
/// Footprint (peak bytes held from upstream / peak live bytes) depends on it:
/// growth that doubles wastes up to the top half of the last chunk; growth in
/// tiny steps strands free space between chunks, which never coalesce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Growth {
    /// RMM's policy: grow by `max(request, current pool size)` without a
    /// maximum (the pool doubles), and by up to half the room left under a
    /// maximum. On upstream failure the attempt is halved down to the request.
    Double,
    /// Grow by `max(request, pool size / divisor)` rounded up to `granule`:
    /// geometric growth with ratio `1 + 1/divisor`, so the unused tail of the
    /// newest chunk is at most `1/divisor` of the pool.
    Fraction {
        /// The pool grows by at least `1/divisor` of its size.
        divisor: u32,
        /// Chunk sizes are multiples of this (a power of two, at least 256,
        /// at most [`Request::MAX_SIZE`]).
        granule: u64,
    },
}

impl Growth {
    /// The default policy: chunks of at least 1/8 of the pool, in 32 MiB
    /// steps. With wholly free chunks given back before growing (the default
    /// of [`PoolConfig`]), replaying the PyTorch training traces of the README
    /// held 1.11x (resnet), 1.08x (gpt) and 1.13x (transformer) of the peak
    /// live bytes, against 1.16x, 2.09x and 1.74x for [`Growth::Double`]
    /// (RMM), and 1.13x, 1.08x and 1.28x in 2 MiB steps.
    ///
    /// Why 32 MiB: CUDA's stream-ordered pool maps memory in 32 MiB units, so
    /// finer chunks save nothing there, and fewer, larger chunks strand less
    /// free space between them. The unused tail of the newest chunk is under
    /// `pool / 8 + 32 MiB`.
    pub const DEFAULT: Growth =
        Growth::Fraction { divisor: Self::DEFAULT_DIVISOR, granule: Self::DEFAULT_GRANULE };

    /// The divisor of [`Growth::DEFAULT`]: the pool grows by at least 1/8.
    pub const DEFAULT_DIVISOR: u32 = 8;

    /// The chunk granule of [`Growth::DEFAULT`]: 32 MiB.
    pub const DEFAULT_GRANULE: u64 = 32 << 20;
}

impl Default for Growth {
    fn default() -> Self {
        Growth::DEFAULT
    }
}

/// Sizes and policies of a [`CoalescingPool`].
///
/// # Examples
///
/// ```
/// use memres_core::pool::{Growth, PoolConfig};
/// let c = PoolConfig::new().initial_size(1 << 30).maximum_size(4 << 30).growth(Growth::Double);
/// assert_eq!(c.maximum(), Some(4 << 30));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PoolConfig {
    initial_size: u64,
    maximum_size: Option<u64>,
    growth: Growth,
    release_on_grow: bool,
}

impl PoolConfig {
    /// A pool that starts empty, has no maximum, grows by
    /// [`Growth::DEFAULT`] and gives wholly free chunks back before growing.
    pub const fn new() -> Self {
        PoolConfig { initial_size: 0, maximum_size: None, growth: Growth::DEFAULT, release_on_grow: true }
    }

    /// Bytes taken from upstream when the pool is made (a multiple of 256).
    pub const fn initial_size(mut self, bytes: u64) -> Self {
        self.initial_size = bytes;
        self
    }

    /// The most bytes the pool ever holds from upstream (a multiple of 256).
    pub const fn maximum_size(mut self, bytes: u64) -> Self {
        self.maximum_size = Some(bytes);
        self
    }

    /// How the pool grows.
    pub const fn growth(mut self, growth: Growth) -> Self {
        self.growth = growth;
        self
    }

    /// Whether wholly free chunks go back upstream before the pool grows, so
    /// that a new chunk replaces them instead of adding to them (default: yes;
    /// RMM: no). Free chunks too small for the request would otherwise sit
    /// beside the new chunk at the peak.
    pub const fn release_on_grow(mut self, yes: bool) -> Self {
        self.release_on_grow = yes;
        self
    }

    /// The maximum size, if any.
    pub const fn maximum(&self) -> Option<u64> {
        self.maximum_size
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.initial_size % 256 != 0 {
            return Err(Error::InvalidConfig { what: "initial pool size is not a multiple of 256" });
        }
        if self.initial_size > Request::MAX_SIZE {
            return Err(Error::InvalidConfig { what: "initial pool size above the largest request" });
        }
        if let Some(max) = self.maximum_size {
            if max % 256 != 0 {
                return Err(Error::InvalidConfig { what: "maximum pool size is not a multiple of 256" });
            }
            if max < self.initial_size {
                return Err(Error::InvalidConfig { what: "maximum pool size below the initial size" });
            }
        }
        if let Growth::Fraction { divisor, granule } = self.growth {
            if divisor == 0 || !granule.is_power_of_two() || granule < 256 {
                return Err(Error::InvalidConfig {
                    what: "growth divisor is zero or granule not a power of two >= 256",
                });
            }
            // Every chunk would be asked with more bytes than a request holds.
            if granule > Request::MAX_SIZE {
                return Err(Error::InvalidConfig { what: "growth granule above the largest request" });
            }
        }
        Ok(())
    }
}

/// One chunk taken from upstream.
#[derive(Clone, Copy, Debug, Default)]
pub struct Chunk {
    /// The addresses of the chunk.
    range: Range,
    /// The block the upstream handed out, to give back.
    block: Block,
    /// The index node at the chunk's lowest address (never moves).
    first: u32,
}

/// A wholly free chunk taken out of a pool by
/// [`take_free_chunk`](CoalescingPool::take_free_chunk), for another pool over
/// the same upstream to [`adopt`](CoalescingPool::adopt_chunk): how the
/// per-stream pools ([`crate::per_stream`]) move memory between streams.
/// Only a pool makes one, so an adopted chunk is always a real upstream block.
#[derive(Debug, PartialEq, Eq)]
pub struct FreeChunk {
    range: Range,
    block: Block,
}

impl FreeChunk {
    /// The chunk's addresses.
    pub fn range(&self) -> Range {
        self.range
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
/// use memres_core::{Error, MemoryResourceMut, Request};
/// # use memres_core::testing::BumpUpstream;
/// let config = PoolConfig::new().initial_size(1 << 20).maximum_size(2 << 20);
/// let mut pool = CoalescingPool::with_config(BumpUpstream::new(1 << 30), config, &())?;
/// let a = pool.allocate(Request::new(1 << 20)?, &())?;
/// let err = pool.allocate(Request::new(2 << 20)?, &()).unwrap_err();
/// assert!(matches!(err, Error::OutOfMemory { max_size: Some(m), .. } if m == 2 << 20));
/// pool.deallocate(a, &())?;
/// assert_eq!(pool.used_bytes(), 0);
/// # Ok::<(), Error>(())
/// ```
pub struct CoalescingPool<
    U,
    N: Storage<Node> = DefaultStorage<Node>,
    C: Storage<Chunk> = DefaultStorage<Chunk>,
> {
    upstream: U,
    index: CoalescingIndex<N>,
    /// Chunks held from upstream, sorted by address.
    chunks: C,
    config: PoolConfig,
    /// Sum of the chunks' lengths: bytes held from upstream.
    held: u64,
    /// Highest `held` ever.
    peak_held: u64,
    /// Length of the shortest chunk (`u64::MAX` with none): a free range
    /// shorter than this is no whole chunk, with no search.
    shortest_chunk: u64,
}

impl<U> CoalescingPool<U> {
    /// An empty pool over `upstream` with the default configuration (no
    /// initial size, no maximum, [`Growth::DEFAULT`]).
    pub fn new(upstream: U) -> Self {
        Self::empty(upstream, PoolConfig::new())
    }

    /// A pool over `upstream` with `config`; the initial size, if any, is
    /// taken from upstream now, on `stream`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for sizes that are not multiples of 256 or a
    /// maximum below the initial size; the upstream's error if it cannot
    /// supply the initial size.
    pub fn with_config<S: Stream + ?Sized>(upstream: U, config: PoolConfig, stream: &S) -> Result<Self>
    where
        U: MemoryResource<S>,
    {
        Self::with_config_in(upstream, config, stream)
    }
}

impl<U, N: Storage<Node>, C: Storage<Chunk>> CoalescingPool<U, N, C> {
    fn empty(upstream: U, config: PoolConfig) -> Self {
        CoalescingPool {
            upstream,
            index: CoalescingIndex::new(256),
            chunks: C::default(),
            config,
            held: 0,
            peak_held: 0,
            shortest_chunk: u64::MAX,
        }
    }

    /// [`with_config`](CoalescingPool::with_config) for any metadata storage
    /// (fixed-capacity storage for builds with no allocator).
    ///
    /// A pool over `upstream` with `config`; the initial size, if any, is
    /// taken from upstream now, on `stream`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for sizes that are not multiples of 256 or a
    /// maximum below the initial size; the upstream's error if it cannot
    /// supply the initial size.
    pub fn with_config_in<S: Stream + ?Sized>(upstream: U, config: PoolConfig, stream: &S) -> Result<Self>
    where
        U: MemoryResource<S>,
    {
        config.validate()?;
        let mut pool = Self::empty(upstream, config);
        if config.initial_size > 0 {
            pool.add_chunk(config.initial_size, stream)?;
        }
        Ok(pool)
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// The configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// Bytes held from upstream (RMM's pool size).
    pub fn pool_size(&self) -> u64 {
        self.held
    }

    /// The most bytes ever held from upstream at once.
    pub fn peak_pool_size(&self) -> u64 {
        self.peak_held
    }

    /// Bytes handed out (sizes rounded up to 256).
    pub fn used_bytes(&self) -> u64 {
        self.index.used_bytes()
    }

    /// Bytes held from upstream and free.
    pub fn free_bytes(&self) -> u64 {
        self.index.free_bytes()
    }

    /// The largest block that could be handed out without growing.
    pub fn largest_free(&self) -> u64 {
        self.index.largest_free()
    }

    /// Number of chunks held from upstream.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// The index, for inspection.
    pub fn index(&self) -> &CoalescingIndex<N> {
        &self.index
    }

    fn out_of_memory(&self, requested: u64) -> Error {
        Error::OutOfMemory {
            requested,
            largest_free: self.index.largest_free(),
            pool_size: self.held,
            max_size: self.config.maximum_size,
        }
    }

    /// Takes a chunk of `bytes` from upstream and adds it to the index;
    /// returns its first node.
    fn add_chunk<S: Stream + ?Sized>(&mut self, bytes: u64, stream: &S) -> Result<u32>
    where
        U: MemoryResource<S>,
    {
        // Room for the chunk record first, so that a full table never
        // strands an upstream block.
        if self.chunks.len() as u64 >= self.chunks.max_len() as u64 {
            return Err(Error::CapacityExhausted { capacity: self.chunks.max_len() });
        }
        let block = self.upstream.allocate(Request::new(bytes)?, stream)?;
        let added = block.upstream_range(bytes).and_then(|range| self.insert_chunk(range, block));
        if added.is_err() {
            // Upstream misbehaved or our metadata is full: give it back.
            let _ = self.upstream.deallocate(block, stream);
        }
        added
    }

    /// Indexes `range`, upstream's `block`, as a chunk; returns its first
    /// node. Changes nothing on error.
    fn insert_chunk(&mut self, range: Range, block: Block) -> Result<u32> {
        if self.chunks.len() as u64 >= self.chunks.max_len() as u64 {
            return Err(Error::CapacityExhausted { capacity: self.chunks.max_len() });
        }
        let first = self.index.add_range(range)?;
        let chunk = Chunk { range, block, first };
        if self.chunks.try_push(chunk).is_err() {
            let _ = self.index.remove_range(first);
            return Err(Error::CapacityExhausted { capacity: self.chunks.max_len() });
        }
        // Keep the table sorted by address for lookups by address.
        let mut i = self.chunks.len() - 1;
        while i > 0 && self.chunks[i - 1].range.start() > range.start() {
            self.chunks.swap(i - 1, i);
            i -= 1;
        }
        self.held += range.len();
        self.peak_held = self.peak_held.max(self.held);
        self.shortest_chunk = self.shortest_chunk.min(range.len());
        Ok(first)
    }

    /// Takes the wholly free chunk at table index `i` out of the index and
    /// the table (which stays sorted).
    fn remove_chunk(&mut self, i: usize) -> Result<Chunk> {
        let chunk = self.chunks[i];
        self.index.remove_range(chunk.first)?;
        for j in i..self.chunks.len() - 1 {
            self.chunks.swap(j, j + 1);
        }
        self.chunks.pop();
        self.held -= chunk.range.len();
        if chunk.range.len() == self.shortest_chunk {
            self.shortest_chunk = self.chunks.iter().map(|c| c.range.len()).min().unwrap_or(u64::MAX);
        }
        Ok(chunk)
    }

    /// The chunk sizes to try, largest first, for a request needing `need`
    /// bytes: the growth policy's choice, then halves down to `need`.
    fn growth_size(&self, need: u64) -> u64 {
        let room = self.config.maximum_size.map(|m| m - self.held);
        let want = match self.config.growth {
            Growth::Double => match room {
                Some(room) => need.max(room / 2),
                None => need.max(self.held),
            },
            Growth::Fraction { divisor, granule } => {
                let g = need.max(self.held / divisor as u64);
                (g + granule - 1) & !(granule - 1)
            }
        };
        let want = (want + 255) & !255;
        match room {
            Some(room) => want.min(room),
            None => want,
        }
    }

    /// Grows the pool so that `request` fits, then allocates it.
    #[cold]
    fn grow_and_allocate<S: Stream + ?Sized>(&mut self, request: Request, stream: &S) -> Result<Block>
    where
        U: MemoryResource<S>,
    {
        // Bytes that surely hold the request at its alignment in a fresh chunk
        // (upstream chunks are 256-aligned).
        let pad = request.align() - 256;
        let need = request.rounded_size(256) + pad;
        if need > Request::MAX_SIZE {
            // No upstream can be asked for such a chunk: out of memory, not
            // an invalid request (the request itself is valid).
            return Err(self.out_of_memory(request.size()));
        }
        if let Some(max) = self.config.maximum_size {
            if need > max - self.held {
                if self.config.release_on_grow {
                    self.release(stream)?;
                }
                if need > max - self.held {
                    return Err(self.out_of_memory(request.size()));
                }
            }
        }
        if self.config.release_on_grow {
            self.release(stream)?;
        }
        // Slots for the chunk's range and the split of the block out of it,
        // before taking anything from upstream: a failed call changes nothing.
        self.index.reserve(3)?;
        let mut size = self.growth_size(need);
        let first = loop {
            match self.add_chunk(size, stream) {
                Ok(first) => break first,
                Err(e) if e.is_out_of_memory() && size > need => {
                    // Halve towards the request, as RMM does.
                    size = ((size / 2).max(need) + 255) & !255;
                }
                Err(Error::OutOfMemory { .. }) | Err(Error::LimitExceeded { .. }) => {
                    return Err(self.out_of_memory(request.size()))
                }
                Err(e) => return Err(e),
            }
        };
        // From the new chunk itself: one of exactly `need` bytes may sit in a
        // size class that the index's class search skips.
        match self.index.allocate_in(first, request.size(), request.align())? {
            Some(a) => Ok(Block::new(a.addr, request.size(), a.tag)),
            None => Err(self.out_of_memory(request.size())),
        }
    }

    /// Gives every wholly free chunk back to upstream; returns the bytes
    /// given back.
    ///
    /// # Errors
    ///
    /// The upstream's error if it refuses a chunk; that chunk stays in the pool.
    pub fn release<S: Stream + ?Sized>(&mut self, stream: &S) -> Result<u64>
    where
        U: MemoryResource<S>,
    {
        let mut freed = 0;
        let mut i = 0;
        while i < self.chunks.len() {
            let chunk = self.chunks[i];
            if !self.index.is_region_free(chunk.first) {
                i += 1;
                continue;
            }
            self.remove_chunk(i)?;
            if let Err(e) = self.upstream.deallocate(chunk.block, stream) {
                // Keep the chunk: index it again (its slots were just vacated).
                self.insert_chunk(chunk.range, chunk.block)?;
                return Err(e);
            }
            freed += chunk.range.len();
        }
        Ok(freed)
    }

    /// The address ranges of the chunks, by address.
    pub fn chunk_ranges(&self) -> impl Iterator<Item = Range> + '_ {
        self.chunks.iter().map(|c| c.range)
    }

    /// Whether `addr` lies in one of the pool's chunks.
    pub fn holds(&self, addr: u64) -> bool {
        self.chunk_of(addr).is_some()
    }

    /// The length of the shortest wholly free chunk of at least `min_len`
    /// bytes, if any.
    ///
    /// # Time Complexity
    ///
    /// O(chunks).
    pub fn shortest_free_chunk(&self, min_len: u64) -> Option<u64> {
        self.free_chunk_index(min_len).map(|i| self.chunks[i].range.len())
    }

    /// The table index of the shortest wholly free chunk of at least `min_len` bytes.
    fn free_chunk_index(&self, min_len: u64) -> Option<usize> {
        (0..self.chunks.len())
            .filter(|&i| {
                self.chunks[i].range.len() >= min_len && self.index.is_region_free(self.chunks[i].first)
            })
            .min_by_key(|&i| self.chunks[i].range.len())
    }

    /// Takes the shortest wholly free chunk of at least `min_len` bytes out
    /// of the pool, still held from upstream, for another pool over the same
    /// upstream to [`adopt`](Self::adopt_chunk). The pool no longer counts it.
    ///
    /// # Time Complexity
    ///
    /// O(chunks).
    pub fn take_free_chunk(&mut self, min_len: u64) -> Option<FreeChunk> {
        let i = self.free_chunk_index(min_len)?;
        let chunk = self.remove_chunk(i).ok()?;
        Some(FreeChunk { range: chunk.range, block: chunk.block })
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
    pub fn adopt_chunk(&mut self, chunk: FreeChunk) -> core::result::Result<(), (Error, FreeChunk)> {
        let len = chunk.range.len();
        if let Some(max) = self.config.maximum_size.filter(|&m| len > m - self.held) {
            return Err((Error::LimitExceeded { requested: len, used: self.held, limit: max }, chunk));
        }
        match self.insert_chunk(chunk.range, chunk.block) {
            Ok(_) => Ok(()),
            Err(e) => Err((e, chunk)),
        }
    }

    /// The chunk holding `addr`, by binary search.
    fn chunk_of(&self, addr: u64) -> Option<&Chunk> {
        let i = self.chunks.partition_point(|c| c.range.start() <= addr);
        let c = self.chunks.get(i.checked_sub(1)?)?;
        c.range.contains(addr).then_some(c)
    }

    /// Free of a block whose tag did not name a live node: look the address up.
    #[cold]
    fn deallocate_by_address(&mut self, block: Block) -> Result<Range> {
        let addr = block.addr();
        let Some(chunk) = self.chunk_of(addr) else {
            return Err(Error::UnknownBlock { addr });
        };
        let first = chunk.first;
        let had_tag = block.tag() != Block::NO_TAG;
        self.index.free_by_address(first, addr, block.size(), had_tag)
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
        Ok(self
            .index
            .allocate(request.size(), request.align())?
            .map(|a| Block::new(a.addr, request.size(), a.tag)))
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
        let merged = match self.index.free(block.tag(), block.addr(), block.size()) {
            Ok(r) => r,
            Err(Error::UnknownBlock { .. }) => self.deallocate_by_address(block)?,
            Err(e) => return Err(e),
        };
        Ok(merged.len() >= self.shortest_chunk
            && self.chunk_of(merged.start()).is_some_and(|c| c.range == merged))
    }

    /// Checks the pool's invariants: those of its index, plus every chunk
    /// covered exactly by its nodes, chunks disjoint and sorted, and bytes
    /// in use + bytes free = bytes held from upstream.
    pub fn check(&self) -> core::result::Result<(), Violation> {
        self.index.check().map_err(Violation::new)?;
        let mut total = 0u64;
        let mut last_end = 0u64;
        for c in self.chunks.iter() {
            if c.range.start() < last_end {
                return Err(Violation::new("chunks overlap or are not sorted"));
            }
            last_end = c.range.end();
            let mut cursor = c.range.start();
            self.index.for_each_in_region(c.first, |r, _| {
                if r.start() == cursor {
                    cursor = r.end();
                } else {
                    cursor = u64::MAX;
                }
            });
            if cursor != c.range.end() {
                return Err(Violation::new("chunk not covered exactly by its nodes"));
            }
            total += c.range.len();
        }
        if total != self.held {
            return Err(Violation::new("chunk lengths do not add up to the pool size"));
        }
        if self.chunks.iter().map(|c| c.range.len()).min().unwrap_or(u64::MAX) != self.shortest_chunk {
            return Err(Violation::new("shortest chunk length is stale"));
        }
        if self.index.used_bytes() + self.index.free_bytes() != self.held {
            return Err(Violation::new("bytes in use + bytes free != bytes held from upstream"));
        }
        if self.config.maximum_size.is_some_and(|m| self.held > m) {
            return Err(Violation::new("pool holds more than its maximum"));
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
        match self.index.free(block.tag(), block.addr(), block.size()) {
            Ok(_) => Ok(()),
            Err(Error::UnknownBlock { .. }) => self.deallocate_by_address(block).map(|_| ()),
            Err(e) => Err(e),
        }
    }
}

// SAFETY: the pool hands out only ranges its index allocated, at least
// `request.size()` long, inside the chunks' ranges; each chunk range is the
// first bytes of a block of `U` no shorter than it (`upstream_range` refuses
// a shorter one), which the pool holds until no block in it is live
// (`release` gives back only wholly free chunks) and frees only through
// `U::deallocate`. The index keeps live ranges disjoint, and the pool keeps
// its metadata outside the managed memory, never touching it.
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

impl<U, N: Storage<Node>, C: Storage<Chunk>> fmt::Debug for CoalescingPool<U, N, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoalescingPool")
            .field("pool_size", &self.held)
            .field("peak_pool_size", &self.peak_held)
            .field("used_bytes", &self.index.used_bytes())
            .field("free_bytes", &self.index.free_bytes())
            .field("chunks", &self.chunks.len())
            .field("config", &self.config)
            .finish()
    }
}
