//! The fixed-size resource: RMM's `fixed_size_memory_resource`.
//!
//! [`FixedSizeResource`] hands out blocks of one size, carved from chunks it
//! takes from an upstream resource. Allocate and free are a pop and a push on
//! an index stack kept outside the managed memory; wholly free chunks go back
//! upstream on [`release`](FixedSizeResource::release).

#[cfg(test)]
mod tests;

use crate::check::Violation;
use crate::storage::{DefaultStorage, Storage};
use crate::{Block, Error, MemoryResource, MemoryResourceMut, Request, Result, Stream, DEFAULT_ALIGNMENT};
use core::fmt;

/// `Slot::link` of the last free slot on the stack (and of an empty stack).
const NIL: u32 = u32::MAX;
/// `Slot::link` of a slot handed out.
const USED: u32 = u32::MAX - 1;
/// `Slot::link` of a slot whose chunk went back upstream.
const VACANT: u32 = u32::MAX - 2;
/// `Slot::link` of a slot of a held chunk whose generations are used up: its
/// block is never handed out again.
const RETIRED: u32 = u32::MAX - 3;
/// Slot indices stay below the markers.
const MAX_SLOTS: u64 = RETIRED as u64;

/// Whether a `Slot::link` is that of a free slot (on the stack).
#[inline]
fn is_free_link(link: u32) -> bool {
    !matches!(link, USED | VACANT | RETIRED)
}

/// Sizes of a [`FixedSizeResource`].
///
/// # Examples
///
/// ```
/// use memres_core::fixed::FixedConfig;
/// let c = FixedConfig::new(4096).blocks_per_chunk(64).chunk_alignment(4096);
/// assert_eq!(c.chunk_size(), 4096 * 64);
/// assert_eq!(c.alignment(), 4096);
/// assert_eq!(FixedConfig::default().block_size(), 1 << 20);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedConfig {
    block_size: u64,
    blocks_per_chunk: u32,
    chunk_align: u64,
    initial_chunks: u32,
}

impl Default for FixedConfig {
    /// RMM's defaults: 1 MiB blocks, 128 blocks per chunk, 256-byte aligned
    /// chunks, nothing taken up front.
    fn default() -> Self {
        FixedConfig::new(FixedConfig::DEFAULT_BLOCK_SIZE)
    }
}

impl FixedConfig {
    /// RMM's default block size: 1 MiB.
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::default().block_size(), FixedConfig::DEFAULT_BLOCK_SIZE);
    /// ```
    pub const DEFAULT_BLOCK_SIZE: u64 = 1 << 20;
    /// RMM's default number of blocks per upstream chunk.
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::new(256).blocks(), FixedConfig::DEFAULT_BLOCKS_PER_CHUNK);
    /// ```
    pub const DEFAULT_BLOCKS_PER_CHUNK: u32 = 128;

    /// Blocks of `block_size` bytes (a multiple of 256), 128 to a chunk.
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::new(512).blocks(), 128);
    /// ```
    pub const fn new(block_size: u64) -> Self {
        FixedConfig {
            block_size,
            blocks_per_chunk: Self::DEFAULT_BLOCKS_PER_CHUNK,
            chunk_align: DEFAULT_ALIGNMENT,
            initial_chunks: 0,
        }
    }

    /// Blocks carved from each upstream chunk (at least 1).
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::new(512).blocks_per_chunk(8).blocks(), 8);
    /// ```
    pub const fn blocks_per_chunk(mut self, n: u32) -> Self {
        self.blocks_per_chunk = n;
        self
    }

    /// The alignment asked of upstream for each chunk (a power of two, at
    /// least 256; 256 by default, as RMM).
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::new(8192).chunk_alignment(4096).alignment(), 4096);
    /// ```
    pub const fn chunk_alignment(mut self, align: u64) -> Self {
        self.chunk_align = align;
        self
    }

    /// Chunks taken from upstream when the resource is made (RMM takes one).
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::new(512).initial_chunks(1).initial(), 1);
    /// ```
    pub const fn initial_chunks(mut self, n: u32) -> Self {
        self.initial_chunks = n;
        self
    }

    /// The block size.
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::new(768).block_size(), 768);
    /// ```
    pub const fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Blocks per chunk.
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::default().blocks(), 128);
    /// ```
    pub const fn blocks(&self) -> u32 {
        self.blocks_per_chunk
    }

    /// Chunks taken up front.
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::default().initial(), 0);
    /// ```
    pub const fn initial(&self) -> u32 {
        self.initial_chunks
    }

    /// Bytes of one upstream chunk: block size times blocks per chunk
    /// (saturating; a configuration where it overflows is refused).
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::default().chunk_size(), 128 << 20);
    /// ```
    pub const fn chunk_size(&self) -> u64 {
        self.block_size.saturating_mul(self.blocks_per_chunk as u64)
    }

    /// The alignment every block has: the chunk alignment, or the largest
    /// power of two dividing the block size if that is smaller.
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::new(768).chunk_alignment(4096).alignment(), 256);
    /// ```
    pub const fn alignment(&self) -> u64 {
        let natural = self.block_size & self.block_size.wrapping_neg();
        if natural != 0 && natural < self.chunk_align {
            natural
        } else {
            self.chunk_align
        }
    }

    fn validate(&self) -> Result<()> {
        if self.block_size == 0 || self.block_size % 256 != 0 || self.block_size > Request::MAX_SIZE {
            return Err(Error::InvalidConfig {
                what: "block size is zero, not a multiple of 256 or too large",
            });
        }
        if self.blocks_per_chunk == 0 || self.blocks_per_chunk as u64 >= MAX_SLOTS {
            return Err(Error::InvalidConfig { what: "blocks per chunk is zero or too large" });
        }
        if self.block_size.checked_mul(self.blocks_per_chunk as u64).is_none_or(|c| c > Request::MAX_SIZE) {
            return Err(Error::InvalidConfig { what: "chunk size overflows" });
        }
        if !self.chunk_align.is_power_of_two()
            || self.chunk_align < 256
            || self.chunk_align > Request::MAX_ALIGN
        {
            return Err(Error::InvalidConfig { what: "chunk alignment is not a power of two in 256..=2^40" });
        }
        Ok(())
    }
}

/// Metadata of one block: where it is, and whether it is free.
///
/// Kept outside the managed memory; one per block of every chunk held. It is
/// public only to name the slot storage of a [`FixedSizeResource`].
///
/// # Examples
///
/// ```
/// use memres_core::fixed::{Chunk, FixedSizeResource, Slot};
/// use memres_core::storage::ArrayStorage;
/// # use memres_core::testing::BumpUpstream;
/// // Metadata for at most 4 chunks and 512 blocks, with no allocator.
/// type NoHeap = FixedSizeResource<BumpUpstream, ArrayStorage<Chunk, 4>, ArrayStorage<Slot, 512>>;
/// assert_eq!(Slot::default(), Slot::default());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    /// The block's address (meaningless while vacant).
    addr: u64,
    /// The next free slot on the stack (`NIL` at the bottom) while free;
    /// `USED` while handed out; `VACANT` while its chunk is not held;
    /// `RETIRED` once its generations are used up (while its chunk is held).
    link: u32,
    /// Bumped at every free, so that the tag of a block freed before does
    /// not match the slot any more; never wrapped: at `u32::MAX` the slot is
    /// retired for good.
    generation: u32,
}

/// One chunk taken from upstream: the block to give back and the index of
/// its first slot. Public only to name the chunk storage of a
/// [`FixedSizeResource`].
///
/// # Examples
///
/// ```
/// use memres_core::fixed::Chunk;
/// use memres_core::storage::{ArrayStorage, Storage};
/// let table: ArrayStorage<Chunk, 8> = Default::default();
/// assert_eq!(table.max_len(), 8);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chunk {
    /// The block the upstream handed out (to give back); its address is the
    /// address of the chunk's first block.
    block: Block,
    /// Index of the chunk's first slot: a multiple of blocks per chunk.
    first: u32,
}

/// Blocks of one size carved from upstream chunks: RMM's
/// `fixed_size_memory_resource`, with O(1) allocate and free.
///
/// ```text
///  upstream ──chunks──► chunk A (addr a)         chunk B (addr b)
///                       ┌────┬────┬────┬────┐    ┌────┬────┬────┬────┐
///                       │ a0 │ a1 │ a2 │ a3 │    │ b0 │ b1 │ b2 │ b3 │
///                       └────┴────┴────┴────┘    └────┴────┴────┴────┘
///  slots (metadata):    [a0 U][a1 ·][a2 U][a3 ·]  [b0 ·][b1 U][b2 ·][b3 ·]
///                              ▲       │    │       ▲ │          ▲
///  head ──► b2 ─► b3 ─► a1 ─► a3 ─► b0 ─► NIL   (U: used; the free slots form
///                                              a stack linked through `link`)
///  allocate ─ pop the head: Block { addr, size, tag = generation:slot }
///  deallocate ─ tag names the slot: check address, used bit, generation; push
/// ```
///
/// - Every block is `block_size` bytes at an address aligned to
///   [`alignment`](Self::alignment) (the chunk alignment, 256 by default).
/// - A request larger than the block size is [`Error::InvalidSize`]; one
///   aligned above [`alignment`](Self::alignment) is
///   [`Error::InvalidAlignment`]: neither is ever silently truncated.
/// - The resource grows by one chunk when its stack is empty; a chunk goes
///   back upstream only on [`release`](Self::release), and only when all its
///   blocks are free.
/// - A free checks the tag's slot: a stale tag (a double free) is
///   [`Error::DoubleFree`], a block of another resource is
///   [`Error::UnknownBlock`]. A block known only by its address is looked up
///   by binary search over the chunks.
/// - A slot's generation is bumped at every free and never wraps: after
///   2^32 - 1 frees of one slot the slot is retired, its block held but
///   never handed out again (nor counted free), so a stale tag stays a
///   [`Error::DoubleFree`] for the life of the resource. The price is one
///   block per 2^32 - 1 reuses of one slot; a chunk with retired blocks is
///   still given back by [`release`](Self::release) once its other blocks
///   are free, and its slot group, when reused, keeps the retirements.
/// - Dropping the resource does not give its chunks back (that needs a
///   stream): call [`release`](Self::release) first.
///
/// The resource is a plain state machine (`&mut self`): wrap it in
/// [`Shared`](crate::Shared) to share it between threads.
///
/// # Examples
///
/// ```
/// use memres_core::fixed::{FixedConfig, FixedSizeResource};
/// use memres_core::{Error, MemoryResourceMut, Request};
/// # use memres_core::testing::BumpUpstream;
/// let mut fixed = FixedSizeResource::with_config(BumpUpstream::new(1 << 30), FixedConfig::new(4096), &())?;
/// let a = fixed.allocate(Request::new(4000)?, &())?;
/// let b = fixed.allocate(Request::new(10)?, &())?;
/// assert_eq!(b.addr() - a.addr(), 4096);
/// assert!(matches!(fixed.allocate(Request::new(4097)?, &()), Err(Error::InvalidSize { size: 4097 })));
/// fixed.deallocate(a, &())?;
/// assert!(matches!(fixed.deallocate(a, &()), Err(Error::DoubleFree { .. })));
/// fixed.deallocate(b, &())?;
/// assert_eq!(fixed.release(&())?, 4096 * 128);
/// # Ok::<(), Error>(())
/// ```
pub struct FixedSizeResource<
    U,
    C: Storage<Chunk> = DefaultStorage<Chunk>,
    L: Storage<Slot> = DefaultStorage<Slot>,
> {
    upstream: U,
    /// Block size, from the configuration (cached for the hot path).
    block_size: u64,
    /// Alignment every block has (cached for the hot path).
    align: u64,
    /// Top of the free stack: a free slot's index, or `NIL`.
    head: u32,
    /// One slot per block; slots `k * bpc .. (k + 1) * bpc` form group `k`,
    /// owned by one chunk or all `VACANT`. Vacant groups are kept (with
    /// their generations, so that old tags stay stale) for the next grow.
    slots: L,
    /// Chunks held, sorted by address, never overlapping.
    chunks: C,
    /// Number of `USED` slots.
    used: u64,
    /// Number of `RETIRED` slots.
    retired: u64,
    /// Bytes held from upstream: `chunks.len() * chunk size`.
    held: u64,
    /// Highest `held` ever.
    peak_held: u64,
    config: FixedConfig,
}

impl<U> FixedSizeResource<U> {
    /// A resource with RMM's defaults (1 MiB blocks, 128 to a chunk) that
    /// takes nothing from `upstream` until the first request.
    ///
    /// ```
    /// use memres_core::fixed::FixedSizeResource;
    /// # use memres_core::testing::BumpUpstream;
    /// let fixed = FixedSizeResource::new(BumpUpstream::new(1 << 30));
    /// assert_eq!((fixed.block_size(), fixed.pool_size()), (1 << 20, 0));
    /// ```
    pub fn new(upstream: U) -> Self {
        Self::empty(upstream, FixedConfig::default())
    }

    /// A resource over `upstream` with `config`; its initial chunks, if any,
    /// are taken from upstream now, on `stream`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a block size that is zero or not a
    /// multiple of 256, zero blocks per chunk, a chunk size that overflows or
    /// a bad chunk alignment; the upstream's error if it cannot supply the
    /// initial chunks.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::fixed::{FixedConfig, FixedSizeResource};
    /// # use memres_core::testing::BumpUpstream;
    /// let config = FixedConfig::new(512).blocks_per_chunk(4).initial_chunks(2);
    /// let fixed = FixedSizeResource::with_config(BumpUpstream::new(1 << 20), config, &())?;
    /// assert_eq!((fixed.pool_size(), fixed.free_blocks()), (4096, 8));
    /// assert!(FixedSizeResource::with_config(BumpUpstream::new(1), FixedConfig::new(100), &()).is_err());
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn with_config<S: Stream + ?Sized>(upstream: U, config: FixedConfig, stream: &S) -> Result<Self>
    where
        U: MemoryResource<S>,
    {
        Self::with_config_in(upstream, config, stream)
    }

    /// A resource over `upstream` with `config` that takes nothing from
    /// upstream until the first request (so it needs no stream now).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] as [`with_config`](FixedSizeResource::with_config),
    /// and for a configuration that asks for initial chunks (taking them
    /// needs a stream: use `with_config`).
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::fixed::{FixedConfig, FixedSizeResource};
    /// # use memres_core::testing::BumpUpstream;
    /// let fixed = FixedSizeResource::try_new(BumpUpstream::new(1 << 20), FixedConfig::new(512))?;
    /// assert_eq!((fixed.block_size(), fixed.pool_size()), (512, 0));
    /// assert!(FixedSizeResource::try_new(BumpUpstream::new(0), FixedConfig::new(512).initial_chunks(1)).is_err());
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn try_new(upstream: U, config: FixedConfig) -> Result<Self> {
        Self::try_new_in(upstream, config)
    }
}

impl<U, C: Storage<Chunk>, L: Storage<Slot>> FixedSizeResource<U, C, L> {
    /// [`try_new`](FixedSizeResource::try_new) for any metadata storage.
    ///
    /// # Errors
    ///
    /// As [`try_new`](FixedSizeResource::try_new).
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::fixed::{Chunk, FixedConfig, FixedSizeResource, Slot};
    /// use memres_core::storage::ArrayStorage;
    /// # use memres_core::testing::BumpUpstream;
    /// type Small<U> = FixedSizeResource<U, ArrayStorage<Chunk, 2>, ArrayStorage<Slot, 8>>;
    /// let fixed = Small::try_new_in(BumpUpstream::new(1 << 20), FixedConfig::new(256).blocks_per_chunk(4))?;
    /// assert_eq!(fixed.pool_size(), 0);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn try_new_in(upstream: U, config: FixedConfig) -> Result<Self> {
        config.validate()?;
        if config.initial_chunks > 0 {
            return Err(Error::InvalidConfig { what: "initial chunks need a stream: use with_config" });
        }
        Ok(Self::empty(upstream, config))
    }

    fn empty(upstream: U, config: FixedConfig) -> Self {
        FixedSizeResource {
            upstream,
            block_size: config.block_size,
            align: config.alignment(),
            head: NIL,
            slots: L::default(),
            chunks: C::default(),
            used: 0,
            retired: 0,
            held: 0,
            peak_held: 0,
            config,
        }
    }

    /// [`with_config`](FixedSizeResource::with_config) for any metadata
    /// storage (fixed-capacity storage for builds with no allocator).
    ///
    /// # Errors
    ///
    /// As [`with_config`](FixedSizeResource::with_config), and
    /// [`Error::CapacityExhausted`] if the initial chunks do not fit the
    /// storage.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::fixed::{Chunk, FixedConfig, FixedSizeResource, Slot};
    /// use memres_core::storage::ArrayStorage;
    /// use memres_core::{Error, MemoryResourceMut, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// type Small<U> = FixedSizeResource<U, ArrayStorage<Chunk, 2>, ArrayStorage<Slot, 8>>;
    /// let config = FixedConfig::new(256).blocks_per_chunk(4);
    /// let mut fixed = Small::with_config_in(BumpUpstream::new(1 << 20), config, &())?;
    /// for _ in 0..8 {
    ///     fixed.allocate(Request::new(256)?, &())?;
    /// }
    /// let full = fixed.allocate(Request::new(256)?, &());
    /// assert!(matches!(full, Err(Error::CapacityExhausted { .. })));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn with_config_in<S: Stream + ?Sized>(upstream: U, config: FixedConfig, stream: &S) -> Result<Self>
    where
        U: MemoryResource<S>,
    {
        config.validate()?;
        let mut fixed = Self::empty(upstream, config);
        for _ in 0..config.initial_chunks {
            if let Err(e) = fixed.grow(stream) {
                // Give back what was taken so that a failed construction
                // holds nothing.
                let _ = fixed.release(stream);
                return Err(e);
            }
        }
        Ok(fixed)
    }

    /// The upstream resource.
    ///
    /// ```
    /// # use memres_core::fixed::FixedSizeResource;
    /// # use memres_core::testing::BumpUpstream;
    /// let fixed = FixedSizeResource::new(BumpUpstream::new(1 << 30));
    /// assert_eq!(fixed.upstream().outstanding(), 0);
    /// ```
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// The configuration.
    ///
    /// ```
    /// # use memres_core::fixed::FixedSizeResource;
    /// # use memres_core::testing::BumpUpstream;
    /// assert_eq!(FixedSizeResource::new(BumpUpstream::new(0)).config().blocks(), 128);
    /// ```
    pub fn config(&self) -> &FixedConfig {
        &self.config
    }

    /// The size of every block, and the largest request served.
    ///
    /// ```
    /// # use memres_core::fixed::FixedSizeResource;
    /// # use memres_core::testing::BumpUpstream;
    /// assert_eq!(FixedSizeResource::new(BumpUpstream::new(0)).block_size(), 1 << 20);
    /// ```
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// The alignment every block has; requests for more are refused.
    ///
    /// ```
    /// # use memres_core::fixed::FixedSizeResource;
    /// # use memres_core::testing::BumpUpstream;
    /// assert_eq!(FixedSizeResource::new(BumpUpstream::new(0)).alignment(), 256);
    /// ```
    pub fn alignment(&self) -> u64 {
        self.align
    }

    /// Bytes held from upstream.
    ///
    /// ```
    /// # use memres_core::fixed::{FixedConfig, FixedSizeResource};
    /// # use memres_core::{MemoryResourceMut, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let mut f = FixedSizeResource::with_config(BumpUpstream::new(1 << 20), FixedConfig::new(256).blocks_per_chunk(2), &())?;
    /// f.allocate(Request::new(1)?, &())?;
    /// assert_eq!(f.pool_size(), 512);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn pool_size(&self) -> u64 {
        self.held
    }

    /// The most bytes ever held from upstream at once.
    ///
    /// ```
    /// # use memres_core::fixed::FixedSizeResource;
    /// # use memres_core::testing::BumpUpstream;
    /// assert_eq!(FixedSizeResource::new(BumpUpstream::new(0)).peak_pool_size(), 0);
    /// ```
    pub fn peak_pool_size(&self) -> u64 {
        self.peak_held
    }

    /// Bytes of the blocks handed out (whole blocks).
    ///
    /// ```
    /// # use memres_core::fixed::{FixedConfig, FixedSizeResource};
    /// # use memres_core::{MemoryResourceMut, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let mut f = FixedSizeResource::with_config(BumpUpstream::new(1 << 20), FixedConfig::new(1024), &())?;
    /// f.allocate(Request::new(1)?, &())?;
    /// assert_eq!(f.used_bytes(), 1024);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn used_bytes(&self) -> u64 {
        self.used * self.block_size
    }

    /// Bytes held from upstream and free.
    ///
    /// ```
    /// # use memres_core::fixed::{FixedConfig, FixedSizeResource};
    /// # use memres_core::{MemoryResourceMut, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let mut f = FixedSizeResource::with_config(BumpUpstream::new(1 << 20), FixedConfig::new(256).blocks_per_chunk(4), &())?;
    /// f.allocate(Request::new(1)?, &())?;
    /// assert_eq!(f.free_bytes(), 3 * 256);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn free_bytes(&self) -> u64 {
        self.free_blocks() * self.block_size
    }

    /// Blocks handed out.
    ///
    /// ```
    /// # use memres_core::fixed::FixedSizeResource;
    /// # use memres_core::testing::BumpUpstream;
    /// assert_eq!(FixedSizeResource::new(BumpUpstream::new(0)).used_blocks(), 0);
    /// ```
    pub fn used_blocks(&self) -> u64 {
        self.used
    }

    /// Blocks held and free.
    ///
    /// ```
    /// # use memres_core::fixed::FixedSizeResource;
    /// # use memres_core::testing::BumpUpstream;
    /// assert_eq!(FixedSizeResource::new(BumpUpstream::new(0)).free_blocks(), 0);
    /// ```
    pub fn free_blocks(&self) -> u64 {
        self.chunks.len() as u64 * self.config.blocks_per_chunk as u64 - self.used - self.retired
    }

    /// Whether a chunk held from upstream starts at `addr` (the upstream
    /// knows that address as one of its blocks).
    ///
    /// # Time Complexity
    ///
    /// O(log chunks).
    ///
    /// ```
    /// # use memres_core::fixed::{FixedConfig, FixedSizeResource};
    /// # use memres_core::{MemoryResourceMut, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let mut f = FixedSizeResource::with_config(BumpUpstream::new(1 << 20), FixedConfig::new(256), &())?;
    /// let a = f.allocate(Request::new(10)?, &())?;
    /// let b = f.allocate(Request::new(10)?, &())?;
    /// assert!(f.has_chunk_at(a.addr()) && !f.has_chunk_at(b.addr()));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn has_chunk_at(&self, addr: u64) -> bool {
        self.chunks.binary_search_by_key(&addr, |c| c.block.addr()).is_ok()
    }

    /// Number of chunks held from upstream.
    ///
    /// ```
    /// # use memres_core::fixed::FixedSizeResource;
    /// # use memres_core::testing::BumpUpstream;
    /// assert_eq!(FixedSizeResource::new(BumpUpstream::new(0)).chunk_count(), 0);
    /// ```
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    fn bpc(&self) -> usize {
        self.config.blocks_per_chunk as usize
    }

    /// Takes one chunk from upstream and pushes its blocks on the stack,
    /// lowest address on top.
    #[cold]
    fn grow<S: Stream + ?Sized>(&mut self, stream: &S) -> Result<()>
    where
        U: MemoryResource<S>,
    {
        let bpc = self.bpc();
        // Room in the metadata first, so that a full table never strands an
        // upstream block: a vacant slot group, or room for a new one.
        if self.chunks.len() as u64 >= self.chunks.max_len() as u64 {
            return Err(Error::CapacityExhausted { capacity: self.chunks.max_len() });
        }
        // A vacant group with a slot left to hand out (its retired slots stay so).
        let vacant = (0..self.slots.len() / bpc).find(|&g| {
            let group = &self.slots[g * bpc..(g + 1) * bpc];
            group[0].link == VACANT && group.iter().any(|s| s.generation != u32::MAX)
        });
        let first = match vacant {
            Some(g) => g * bpc,
            None => {
                let len = self.slots.len() as u64;
                if len + bpc as u64 > self.slots.max_len() as u64 || len + bpc as u64 > MAX_SLOTS {
                    return Err(Error::CapacityExhausted { capacity: self.slots.max_len() });
                }
                self.slots.len()
            }
        };
        let chunk_size = self.config.chunk_size();
        let block = self.upstream.allocate(Request::aligned(chunk_size, self.config.chunk_align)?, stream)?;
        let misplaced = block.addr() % self.config.chunk_align != 0
            || block.addr().checked_add(chunk_size).is_none()
            || block.size() != chunk_size;
        if misplaced {
            let _ = self.upstream.deallocate(block, stream);
            return Err(Error::InvalidConfig { what: "upstream chunk not aligned or sized as asked" });
        }
        if vacant.is_none() {
            for _ in 0..bpc {
                if self.slots.try_push(Slot { addr: 0, link: VACANT, generation: 0 }).is_err() {
                    // Checked above; undo anyway rather than trust it.
                    self.trim_partial_group();
                    let _ = self.upstream.deallocate(block, stream);
                    return Err(Error::CapacityExhausted { capacity: self.slots.max_len() });
                }
            }
        }
        let chunk = Chunk { block, first: first as u32 };
        if self.chunks.try_push(chunk).is_err() {
            // The new group stays, vacant, for the next grow.
            let _ = self.upstream.deallocate(block, stream);
            return Err(Error::CapacityExhausted { capacity: self.chunks.max_len() });
        }
        // Keep the table sorted by address for lookups by address.
        let mut i = self.chunks.len() - 1;
        while i > 0 && self.chunks[i - 1].block.addr() > block.addr() {
            self.chunks.swap(i - 1, i);
            i -= 1;
        }
        for k in (0..bpc).rev() {
            let slot = &mut self.slots[first + k];
            slot.addr = block.addr() + k as u64 * self.block_size;
            if slot.generation == u32::MAX {
                slot.link = RETIRED;
                self.retired += 1;
            } else {
                slot.link = self.head;
                self.head = (first + k) as u32;
            }
        }
        self.held += chunk_size;
        self.peak_held = self.peak_held.max(self.held);
        Ok(())
    }

    /// Drops the slots of a partly pushed group (a failed grow).
    fn trim_partial_group(&mut self) {
        while self.slots.len() % self.bpc() != 0 {
            self.slots.pop();
        }
    }

    /// Grows by one chunk, then allocates.
    #[cold]
    fn grow_and_allocate<S: Stream + ?Sized>(&mut self, request: Request, stream: &S) -> Result<Block>
    where
        U: MemoryResource<S>,
    {
        match self.grow(stream) {
            Ok(()) => {}
            Err(Error::OutOfMemory { .. }) | Err(Error::LimitExceeded { .. }) => {
                return Err(Error::OutOfMemory {
                    requested: request.size(),
                    largest_free: 0,
                    pool_size: self.held,
                    max_size: None,
                })
            }
            Err(e) => return Err(e),
        }
        Ok(self.pop(request.size()))
    }

    /// Pops the free stack (not empty).
    #[inline(always)]
    fn pop(&mut self, size: u64) -> Block {
        let i = self.head;
        let slot = &mut self.slots[i as usize];
        self.head = slot.link;
        slot.link = USED;
        self.used += 1;
        Block::new(slot.addr, size, ((slot.generation as u64) << 32) | i as u64)
    }

    /// The checks that the hot path does not make: zero bytes, too large,
    /// too aligned.
    #[cold]
    fn allocate_unusual(&self, request: Request) -> Result<Block> {
        if request.is_zero() {
            Ok(Block::EMPTY)
        } else if request.size() > self.block_size {
            Err(Error::InvalidSize { size: request.size() })
        } else {
            Err(Error::InvalidAlignment { align: request.align() })
        }
    }

    /// The slot holding the block at `addr`, by binary search over chunks.
    fn slot_at(&self, addr: u64) -> Option<usize> {
        let i = self.chunks.partition_point(|c| c.block.addr() <= addr);
        let c = self.chunks.get(i.checked_sub(1)?)?;
        let offset = addr - c.block.addr();
        if offset >= self.config.chunk_size() || offset % self.block_size != 0 {
            return None;
        }
        Some(c.first as usize + (offset / self.block_size) as usize)
    }

    /// A free that the tag did not settle: empty, stale, foreign or known
    /// only by its address.
    #[cold]
    fn deallocate_unusual(&mut self, block: Block) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let addr = block.addr();
        let Some(i) = self.slot_at(addr) else {
            return Err(Error::UnknownBlock { addr });
        };
        if block.size() > self.block_size {
            return Err(Error::SizeMismatch { addr, expected: self.block_size, given: block.size() });
        }
        let slot = self.slots[i];
        if slot.link != USED {
            return Err(Error::DoubleFree { addr });
        }
        if block.tag() != Block::NO_TAG {
            // The slot is live again under a newer tag: this block was
            // freed before.
            return Err(Error::DoubleFree { addr });
        }
        self.push(i);
        Ok(())
    }

    #[inline(always)]
    fn push(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.generation += 1;
        self.used -= 1;
        if slot.generation == u32::MAX {
            return self.retire(i);
        }
        slot.link = self.head;
        self.head = i as u32;
    }

    /// Keeps slot `i`, whose last tag was just freed, off the stack for good.
    #[cold]
    fn retire(&mut self, i: usize) {
        self.slots[i].link = RETIRED;
        self.retired += 1;
    }

    /// Gives every wholly free chunk back to upstream; returns the bytes
    /// given back.
    ///
    /// # Errors
    ///
    /// The upstream's error if it refuses a chunk; that chunk, and those not
    /// yet visited, stay in the resource.
    ///
    /// # Time Complexity
    ///
    /// O(blocks held + chunks²): it counts the free blocks of every chunk
    /// and keeps the chunk table sorted.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::fixed::{FixedConfig, FixedSizeResource};
    /// use memres_core::{MemoryResourceMut, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let config = FixedConfig::new(256).blocks_per_chunk(2);
    /// let mut f = FixedSizeResource::with_config(BumpUpstream::new(1 << 20), config, &())?;
    /// let blocks: Vec<_> = (0..4).map(|_| f.allocate(Request::new(256).unwrap(), &()).unwrap()).collect();
    /// f.deallocate(blocks[0], &())?;
    /// f.deallocate(blocks[1], &())?;
    /// assert_eq!(f.release(&())?, 512);
    /// assert_eq!((f.chunk_count(), f.upstream().outstanding()), (1, 512));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn release<S: Stream + ?Sized>(&mut self, stream: &S) -> Result<u64>
    where
        U: MemoryResource<S>,
    {
        let bpc = self.bpc();
        let chunk_size = self.config.chunk_size();
        let mut freed = 0;
        let mut result = Ok(());
        let mut i = 0;
        while i < self.chunks.len() {
            let c = self.chunks[i];
            let group = &self.slots[c.first as usize..c.first as usize + bpc];
            if group.iter().any(|s| s.link == USED) {
                i += 1;
                continue;
            }
            if let Err(e) = self.upstream.deallocate(c.block, stream) {
                result = Err(e);
                break;
            }
            for s in &mut self.slots[c.first as usize..c.first as usize + bpc] {
                self.retired -= (s.link == RETIRED) as u64;
                s.link = VACANT;
            }
            // Remove while keeping the table sorted.
            for j in i..self.chunks.len() - 1 {
                self.chunks.swap(j, j + 1);
            }
            self.chunks.pop();
            self.held -= chunk_size;
            freed += chunk_size;
        }
        if freed > 0 {
            self.relink_free_stack();
        }
        result.map(|()| freed)
    }

    /// Rebuilds the free stack from the free slots, lowest index on top
    /// (the links of the slots just made vacant are gone).
    fn relink_free_stack(&mut self) {
        self.head = NIL;
        for i in (0..self.slots.len()).rev() {
            let slot = &mut self.slots[i];
            if is_free_link(slot.link) {
                slot.link = self.head;
                self.head = i as u32;
            }
        }
    }

    /// Checks the invariants: chunks sorted, disjoint, aligned and each
    /// owning one whole slot group whose slots hold its block addresses;
    /// every other slot group vacant; the free stack a list without cycles
    /// through exactly the free slots; free count + used count = blocks
    /// held; bytes in use + bytes free = bytes held from upstream.
    ///
    /// # Time Complexity
    ///
    /// O(blocks held + chunks). Tests and fuzz targets run it after every
    /// step; the hot path never does.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::fixed::FixedSizeResource;
    /// use memres_core::{MemoryResourceMut, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let mut f = FixedSizeResource::new(BumpUpstream::new(1 << 30));
    /// f.allocate(Request::new(1)?, &())?;
    /// assert!(f.check().is_ok());
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn check(&self) -> core::result::Result<(), Violation> {
        let bpc = self.bpc();
        let chunk_size = self.config.chunk_size();
        if self.slots.len() % bpc != 0 {
            return Err(Violation::new("slot table is not whole groups"));
        }
        let groups = self.slots.len() / bpc;
        let mut last_end = 0u64;
        let mut owned = 0usize;
        for c in self.chunks.iter() {
            let base = c.block.addr();
            if base < last_end {
                return Err(Violation::new("chunks overlap or are not sorted"));
            }
            if base % self.config.chunk_align != 0 || base % self.align != 0 {
                return Err(Violation::new("chunk not aligned"));
            }
            last_end = base + chunk_size;
            let first = c.first as usize;
            if first % bpc != 0 || first + bpc > self.slots.len() {
                return Err(Violation::new("chunk does not own a whole slot group"));
            }
            for (k, s) in self.slots[first..first + bpc].iter().enumerate() {
                if s.link == VACANT {
                    return Err(Violation::new("slot of a held chunk is vacant"));
                }
                if s.addr != base + k as u64 * self.block_size {
                    return Err(Violation::new("slot address is not its place in its chunk"));
                }
            }
            owned += 1;
        }
        // Held groups are non-vacant and each chunk owns a distinct one
        // (distinct addresses, checked above), so the rest must be vacant.
        let vacant_groups =
            (0..groups).filter(|&g| self.slots[g * bpc..(g + 1) * bpc].iter().all(|s| s.link == VACANT));
        if vacant_groups.count() + owned != groups {
            return Err(Violation::new("slot group neither held nor wholly vacant"));
        }
        let used = self.slots.iter().filter(|s| s.link == USED).count() as u64;
        let free = self.slots.iter().filter(|s| is_free_link(s.link)).count() as u64;
        let retired = self.slots.iter().filter(|s| s.link == RETIRED).count() as u64;
        if used != self.used || retired != self.retired {
            return Err(Violation::new("used or retired count differs from the slots"));
        }
        if self.slots.iter().any(|s| s.link != VACANT && (s.link == RETIRED) != (s.generation == u32::MAX)) {
            return Err(Violation::new("slot retired with generations left, or in use with none"));
        }
        // A walk from the head that reaches NIL in exactly `free` steps
        // through free slots visits each free slot once.
        let mut steps = 0u64;
        let mut i = self.head;
        while i != NIL {
            let Some(s) = self.slots.get(i as usize) else {
                return Err(Violation::new("free stack leads out of the slot table"));
            };
            if !is_free_link(s.link) {
                return Err(Violation::new("free stack holds a used, vacant or retired slot"));
            }
            steps += 1;
            if steps > free {
                return Err(Violation::new("free stack has a cycle or misses a free slot"));
            }
            i = s.link;
        }
        if steps != free {
            return Err(Violation::new("free stack misses a free slot"));
        }
        if free + used + retired != owned as u64 * bpc as u64 {
            return Err(Violation::new("free + used + retired count != blocks held"));
        }
        if self.held != owned as u64 * chunk_size {
            return Err(Violation::new("bytes held != chunks held * chunk size"));
        }
        if self.used_bytes() + (free + retired) * self.block_size != self.held {
            return Err(Violation::new("bytes in use + free + retired != bytes held from upstream"));
        }
        Ok(())
    }
}

impl<S, U, C, L> MemoryResourceMut<S> for FixedSizeResource<U, C, L>
where
    S: Stream + ?Sized,
    U: MemoryResource<S>,
    C: Storage<Chunk>,
    L: Storage<Slot>,
{
    /// # Errors
    ///
    /// [`Error::InvalidSize`] above the block size, [`Error::InvalidAlignment`]
    /// above [`alignment`](FixedSizeResource::alignment),
    /// [`Error::OutOfMemory`] when upstream has no chunk to give,
    /// [`Error::CapacityExhausted`] when fixed-capacity metadata is full.
    ///
    /// # Time Complexity
    ///
    /// O(1), plus one upstream call when the stack is empty.
    #[inline]
    fn allocate(&mut self, request: Request, stream: &S) -> Result<Block> {
        // One compare covers both zero and too large.
        if request.size().wrapping_sub(1) >= self.block_size || request.align() > self.align {
            return self.allocate_unusual(request);
        }
        if self.head == NIL {
            return self.grow_and_allocate(request, stream);
        }
        Ok(self.pop(request.size()))
    }

    /// # Errors
    ///
    /// [`Error::DoubleFree`] for a block already free, [`Error::UnknownBlock`]
    /// for a block this resource did not hand out, [`Error::SizeMismatch`]
    /// for a size above the block size.
    ///
    /// # Time Complexity
    ///
    /// O(1) with the block's tag; O(log chunks) for a block known only by
    /// its address.
    #[inline]
    fn deallocate(&mut self, block: Block, _stream: &S) -> Result<()> {
        let i = block.tag() as u32 as usize;
        if let Some(slot) = self.slots.get(i) {
            if slot.addr == block.addr()
                && slot.link == USED
                && slot.generation == (block.tag() >> 32) as u32
                && block.size().wrapping_sub(1) < self.block_size
            {
                self.push(i);
                return Ok(());
            }
        }
        self.deallocate_unusual(block)
    }
}

// SAFETY: every block handed out is a slot `addr..addr + block_size` (the
// request is at most `block_size`) of a chunk that is a block of `U` exactly
// `chunk_size` long (`grow` refuses another), cut into `blocks_per_chunk`
// disjoint slots; a slot is handed out only while free on the stack, chunks
// go back through `U::deallocate` only when all their slots are free, and
// the free stack lives outside the managed memory.
unsafe impl<E, U, C, L> crate::copy::MemoryOf<E> for FixedSizeResource<U, C, L>
where
    U: crate::copy::MemoryOf<E>,
    C: Storage<Chunk>,
    L: Storage<Slot>,
{
}

impl<U, C: Storage<Chunk>, L: Storage<Slot>> fmt::Debug for FixedSizeResource<U, C, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FixedSizeResource")
            .field("block_size", &self.block_size)
            .field("alignment", &self.align)
            .field("pool_size", &self.held)
            .field("peak_pool_size", &self.peak_held)
            .field("used_blocks", &self.used)
            .field("chunks", &self.chunks.len())
            .field("config", &self.config)
            .finish()
    }
}
