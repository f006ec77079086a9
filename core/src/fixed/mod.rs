//! The fixed-size resource: RMM's `fixed_size_memory_resource`.
//!
//! [`FixedSizeResource`] hands out blocks of one size, carved from chunks it
//! takes from an upstream resource. Allocate and free are a pop and a push on
//! an index stack kept outside the managed memory; wholly free chunks go back
//! upstream on [`release`](FixedSizeResource::release).

mod check;
mod config;
mod slots;
#[cfg(test)]
mod tests;

/// The chunk table's record, named where it always was.
pub use crate::chunks::Chunk;
pub use config::FixedConfig;
pub use slots::Slot;

use crate::chunks::{Carve, ChunkTable};
use crate::resource::{default_constructors, with_config_in};
use crate::storage::{DefaultStorage, Storage};
use crate::{Block, Error, MemoryResource, MemoryResourceMut, Request, Result, Stream};
use core::fmt;
use slots::{Slots, NIL};

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
///   [`alignment`](Self::alignment) (the chunk alignment, 256 by default,
///   or the largest power of two dividing the block size if that is
///   smaller).
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
///   never handed out again (nor counted in
///   [`free_blocks`](Self::free_blocks) or `usage().largest_free`; it is
///   in `usage().free`, the bytes held and not used), so a stale tag stays a
///   [`Error::DoubleFree`] for the life of the resource. The price is one
///   block per 2^32 - 1 reuses of one slot; a chunk with retired blocks is
///   still given back by [`release`](Self::release) once its other blocks
///   are free, and its slot group, when reused, keeps the retirements.
/// - Dropping the resource gives every chunk with no live block back
///   upstream, on the stream type's drop stream ([`Stream::at_drop`];
///   `()` at once), as the pool does; a chunk that holds a live block stays
///   with the upstream, and so does every chunk over a stream type with no
///   drop stream: call [`release`](Self::release) first.
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
/// assert!(matches!(fixed.allocate(Request::new(4097)?, &()), Err(Error::InvalidSize { size: 4097, .. })));
/// fixed.deallocate(a, &())?;
/// assert!(matches!(fixed.deallocate(a, &()), Err(Error::DoubleFree { .. })));
/// fixed.deallocate(b, &())?;
/// assert_eq!(fixed.release(&())?, 4096 * 128);
/// # Ok::<(), Error>(())
/// ```
///
/// Dropped, it gives its chunks back:
///
/// ```
/// use memres_core::fixed::FixedSizeResource;
/// use memres_core::{Inspect, MemoryResourceMut, Request};
/// # use memres_core::testing::BumpUpstream;
/// let up = BumpUpstream::new(1 << 30);
/// let mut fixed = FixedSizeResource::new(&up);
/// let b = fixed.allocate(Request::new(1000)?, &())?;
/// fixed.deallocate(b, &())?;
/// assert!(up.usage().held > 0);
/// drop(fixed);
/// assert_eq!(up.usage().held, 0);
/// # Ok::<(), memres_core::Error>(())
/// ```
pub struct FixedSizeResource<
    U,
    C: Storage<Chunk> = DefaultStorage<Chunk>,
    L: Storage<Slot> = DefaultStorage<Slot>,
> {
    /// Block size, from the configuration (cached for the hot path).
    block_size: u64,
    /// Alignment every block has (cached for the hot path).
    align: u64,
    /// The slots of the blocks and the free stack.
    slots: Slots<L>,
    /// Chunks held, each `config.chunk_size()` long.
    chunks: ChunkTable<U, C>,
    config: FixedConfig,
}

default_constructors! {
    FixedSizeResource, FixedConfig, empty;
    /// A resource with RMM's defaults (1 MiB blocks, 128 to a chunk) that
    /// takes nothing from `upstream` until the first request.
    ///
    /// ```
    /// use memres_core::fixed::FixedSizeResource;
    /// # use memres_core::testing::BumpUpstream;
    /// use memres_core::Inspect;
    /// let fixed = FixedSizeResource::new(BumpUpstream::new(1 << 30));
    /// assert_eq!((fixed.block_size(), fixed.usage().held), (1 << 20, 0));
    /// ```
    new;
    /// A resource over `upstream` with `config`; its initial chunks, if any,
    /// are taken from upstream now, on `stream`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a block size that is zero or not a
    /// multiple of 256, zero blocks per chunk or more than
    /// [`FixedConfig::MAX_BLOCKS_PER_CHUNK`], a chunk size that overflows or
    /// a bad chunk alignment; the upstream's error if it cannot supply the
    /// initial chunks.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::fixed::{FixedConfig, FixedSizeResource};
    /// use memres_core::Inspect;
    /// # use memres_core::testing::BumpUpstream;
    /// let config = FixedConfig::new(512).blocks_per_chunk(4).initial_chunks(2);
    /// let fixed = FixedSizeResource::with_config(BumpUpstream::new(1 << 20), config, &())?;
    /// assert_eq!((fixed.usage().held, fixed.free_blocks()), (4096, 8));
    /// assert!(FixedSizeResource::with_config(BumpUpstream::new(1), FixedConfig::new(100), &()).is_err());
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    with_config;
}

impl<U> FixedSizeResource<U> {
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
    /// use memres_core::Inspect;
    /// # use memres_core::testing::BumpUpstream;
    /// let fixed = FixedSizeResource::try_new(BumpUpstream::new(1 << 20), FixedConfig::new(512))?;
    /// assert_eq!((fixed.block_size(), fixed.usage().held), (512, 0));
    /// assert!(FixedSizeResource::try_new(BumpUpstream::new(0), FixedConfig::new(512).initial_chunks(1)).is_err());
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn try_new(upstream: U, config: FixedConfig) -> Result<Self> {
        config.validate()?;
        if config.initial() > 0 {
            return Err(Error::InvalidConfig { what: "initial chunks need a stream: use with_config" });
        }
        Ok(Self::empty(upstream, config))
    }
}

impl<U, C: Storage<Chunk>, L: Storage<Slot>> FixedSizeResource<U, C, L> {
    fn empty(upstream: U, config: FixedConfig) -> Self {
        FixedSizeResource {
            block_size: config.block_size(),
            align: config.alignment(),
            slots: Slots::new(config.blocks(), config.block_size()),
            chunks: ChunkTable::new(upstream, None),
            config,
        }
    }

    /// Takes the initial memory `config` asks for, on `stream`
    /// (`with_config_in`'s last step); on failure it holds none.
    fn take_initial<S: Stream + ?Sized>(&mut self, stream: &S) -> Result<()>
    where
        U: MemoryResource<S>,
    {
        for _ in 0..self.config.initial() {
            if let Err(e) = self.grow(stream) {
                // Give back what was taken so that a failed construction
                // holds nothing.
                let _ = self.release(stream);
                return Err(e);
            }
        }
        Ok(())
    }

    /// The upstream resource.
    ///
    /// ```
    /// # use memres_core::Inspect;
    /// # use memres_core::fixed::FixedSizeResource;
    /// # use memres_core::testing::BumpUpstream;
    /// let fixed = FixedSizeResource::new(BumpUpstream::new(1 << 30));
    /// assert_eq!(fixed.upstream().usage().held, 0);
    /// ```
    pub fn upstream(&self) -> &U {
        self.chunks.upstream()
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

    /// Blocks handed out.
    ///
    /// ```
    /// # use memres_core::fixed::FixedSizeResource;
    /// # use memres_core::testing::BumpUpstream;
    /// assert_eq!(FixedSizeResource::new(BumpUpstream::new(0)).used_blocks(), 0);
    /// ```
    pub fn used_blocks(&self) -> u64 {
        self.slots.used
    }

    /// Blocks held and free to hand out (not the retired ones).
    ///
    /// ```
    /// # use memres_core::fixed::FixedSizeResource;
    /// # use memres_core::testing::BumpUpstream;
    /// assert_eq!(FixedSizeResource::new(BumpUpstream::new(0)).free_blocks(), 0);
    /// ```
    pub fn free_blocks(&self) -> u64 {
        self.chunks.len() as u64 * self.config.blocks() as u64 - self.slots.used - self.slots.retired
    }

    /// If one of its slots starts at `addr`, the size a free of it must
    /// give, as [`deallocate`](MemoryResourceMut::deallocate) expects it:
    /// a live block's, the size it was asked with; a free slot's, the
    /// block size. A block of it freed through a binning resource with a
    /// size that routes elsewhere is then one of its own (O(log chunks)).
    /// Only binning asks, which needs `alloc`.
    #[cfg(feature = "alloc")]
    pub(crate) fn expected_size_at(&self, addr: u64) -> Option<u64> {
        let slot = self.slots.table[self.slot_at(addr)?];
        Some(if slot.link == slots::USED { slot.size } else { self.block_size })
    }

    /// Whether a block of at most `size` bytes (the size it was asked
    /// with) is live: a binning resource does not put a bin of `size`
    /// below this one while one is, as its free would go there.
    ///
    /// # Time Complexity
    ///
    /// O(blocks held).
    #[cfg(feature = "alloc")]
    pub(crate) fn has_live_block_of_at_most(&self, size: u64) -> bool {
        self.slots.table.iter().any(|s| s.link == slots::USED && s.size <= size)
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

    /// Takes one chunk from upstream and pushes its blocks on the stack,
    /// lowest address on top.
    #[cold]
    fn grow<S: Stream + ?Sized>(&mut self, stream: &S) -> Result<()>
    where
        U: MemoryResource<S>,
    {
        // Room in the metadata first, so that a full table never strands an
        // upstream block.
        self.chunks.has_room()?;
        crate::chunks::Carve::reserve(&mut self.slots)?;
        let chunk_size = self.config.chunk_size();
        let align = self.config.chunk_align();
        // Not aligned as asked is the table's to refuse.
        let shape = |block: &Block| match block.size() == chunk_size {
            true => block.upstream_range(chunk_size),
            false => Err(block.misbehaved("not sized as asked")),
        };
        let request = Request::aligned(chunk_size, align)?;
        // A chunk the table could not record left its group vacant.
        let slots = Relinked(&mut self.slots);
        self.chunks.take(request, stream, &mut *slots.0, shape).map(|_| ())
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
                    pool_size: self.chunks.held(),
                    max_size: None,
                })
            }
            Err(e) => return Err(e),
        }
        Ok(self.slots.pop(request.size()))
    }

    /// The checks that the hot path does not make: zero bytes, too large,
    /// too aligned.
    #[cold]
    fn allocate_unusual(&self, request: Request) -> Result<Block> {
        if request.is_zero() {
            Ok(Block::EMPTY)
        } else if request.size() > self.block_size {
            Err(Error::InvalidSize { size: request.size(), what: "above the block size" })
        } else {
            Err(Error::InvalidAlignment { align: request.align() })
        }
    }

    /// The slot holding the block at `addr`, by binary search over chunks.
    fn slot_at(&self, addr: u64) -> Option<usize> {
        let c = self.chunks.chunk_of(addr)?;
        let offset = addr - c.range().start();
        if offset % self.block_size != 0 {
            return None;
        }
        Some(c.first() as usize + (offset / self.block_size) as usize)
    }

    /// A free that the tag did not settle: empty, stale, foreign or known
    /// only by its address (then looked up by binary search over chunks).
    #[cold]
    fn deallocate_by_address(&mut self, block: Block) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let addr = block.addr();
        let Some(i) = self.slot_at(addr) else {
            return Err(Error::UnknownBlock { addr });
        };
        let slot = self.slots.table[i];
        if slot.link != slots::USED {
            if block.size() > self.block_size {
                // A size no block of it has.
                return Err(Error::SizeMismatch { addr, expected: self.block_size, given: block.size() });
            }
            return Err(Error::DoubleFree { addr });
        }
        let tag_names_it = block.tag() as u32 as usize == i && self.slots.is_live(i, addr, block.tag());
        if block.tag() != Block::NO_TAG && !tag_names_it {
            // The slot is live again under a newer tag: this block was
            // freed before.
            return Err(Error::DoubleFree { addr });
        }
        if block.size() != slot.size {
            return Err(Error::SizeMismatch { addr, expected: slot.size, given: block.size() });
        }
        self.slots.push(i);
        Ok(())
    }

    /// Gives every wholly free chunk back to upstream; returns the bytes
    /// given back.
    ///
    /// # Errors
    ///
    /// The upstream's first error if it refuses a chunk; the chunks it
    /// refused stay in the resource, the others go back all the same.
    ///
    /// # Time Complexity
    ///
    /// O(blocks held + chunks²): it counts the free blocks of every chunk
    /// and keeps the chunk table sorted.
    ///
    /// # Examples
    ///
    /// ```
    /// # use memres_core::Inspect;
    /// use memres_core::fixed::{FixedConfig, FixedSizeResource};
    /// use memres_core::{MemoryResourceMut, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let config = FixedConfig::new(256).blocks_per_chunk(2);
    /// let mut f = FixedSizeResource::with_config(BumpUpstream::new(1 << 20), config, &())?;
    /// let blocks: Vec<_> = (0..4).map(|_| f.allocate(Request::new(256).unwrap(), &()).unwrap()).collect();
    /// f.deallocate(blocks[0], &())?;
    /// f.deallocate(blocks[1], &())?;
    /// assert_eq!(f.release(&())?, 512);
    /// assert_eq!((f.chunk_count(), f.upstream().usage().held), (1, 512));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    ///
    /// A chunk the upstream refuses stays; those after it go back:
    ///
    /// ```
    /// # use memres_core::Inspect;
    /// use memres_core::fixed::{FixedConfig, FixedSizeResource};
    /// use memres_core::{MemoryResourceMut, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let config = FixedConfig::new(256).blocks_per_chunk(1);
    /// let mut f = FixedSizeResource::with_config(BumpUpstream::new(1 << 20), config, &())?;
    /// let blocks: Vec<_> = (0..3).map(|_| f.allocate(Request::new(256).unwrap(), &()).unwrap()).collect();
    /// for b in &blocks {
    ///     f.deallocate(*b, &())?;
    /// }
    /// f.upstream().refuse_free_at(blocks[0].addr());
    /// assert!(f.release(&()).is_err());
    /// assert_eq!((f.chunk_count(), f.upstream().usage().held), (1, 256));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn release<S: Stream + ?Sized>(&mut self, stream: &S) -> Result<u64>
    where
        U: MemoryResource<S>,
    {
        // Chunks given back before an upstream's error or panic left their
        // groups vacant.
        let slots = Relinked(&mut self.slots);
        self.chunks.release(stream, &mut *slots.0)
    }
}

/// The slots while chunks come and go: the free stack is rebuilt when
/// dropped, however the call ends (the upstream's error, or its panic
/// midway, after other chunks went back), so that it never runs through a
/// group made vacant.
struct Relinked<'a, L: Storage<Slot>>(&'a mut Slots<L>);

impl<L: Storage<Slot>> Drop for Relinked<'_, L> {
    fn drop(&mut self) {
        self.0.relink();
    }
}

with_config_in! {
    impl[U, C: Storage<Chunk>, L: Storage<Slot>] FixedSizeResource<U, C, L>, FixedConfig, empty;
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
}

/// Gives every chunk with no live block back upstream, on the stream
/// type's [`Stream::at_drop`] stream, as the pool
/// does (see [`CoalescingPool`](crate::pool::CoalescingPool)'s `Drop`).
impl<U, C: Storage<Chunk>, L: Storage<Slot>> Drop for FixedSizeResource<U, C, L> {
    fn drop(&mut self) {
        let slots = &self.slots;
        self.chunks.give_back_on_drop(|c| slots.is_free(c));
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
        if self.slots.head == NIL {
            return self.grow_and_allocate(request, stream);
        }
        Ok(self.slots.pop(request.size()))
    }

    /// # Errors
    ///
    /// [`Error::DoubleFree`] for a block already free, [`Error::UnknownBlock`]
    /// for a block this resource did not hand out, [`Error::SizeMismatch`]
    /// for a size other than the one the block was asked with.
    ///
    /// # Time Complexity
    ///
    /// O(1) with the block's tag; O(log chunks) for a block known only by
    /// its address.
    #[inline]
    fn deallocate(&mut self, block: Block, _stream: &S) -> Result<()> {
        let i = block.tag() as u32 as usize;
        if self.slots.is_live_block(i, &block) {
            self.slots.push(i);
            return Ok(());
        }
        self.deallocate_by_address(block)
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
            .field("held", &self.chunks.held())
            .field("peak_held", &self.chunks.peak_held())
            .field("used_blocks", &self.slots.used)
            .field("chunks", &self.chunks.len())
            .field("config", &self.config)
            .finish()
    }
}
