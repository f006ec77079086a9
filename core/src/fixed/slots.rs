//! The slots of the fixed-size resource: one per block of every chunk
//! held, in groups of one chunk's blocks, with the free stack threaded
//! through them.

use crate::chunks::{Carve, Chunk};
use crate::storage::Storage;
use crate::{Block, Error, Range, Result};

/// `Slot::link` of the last free slot on the stack (and of an empty stack).
pub(super) const NIL: u32 = u32::MAX;
/// `Slot::link` of a slot handed out.
pub(super) const USED: u32 = u32::MAX - 1;
/// `Slot::link` of a slot whose chunk went back upstream.
pub(super) const VACANT: u32 = u32::MAX - 2;
/// `Slot::link` of a slot of a held chunk whose generations are used up: its
/// block is never handed out again.
pub(super) const RETIRED: u32 = u32::MAX - 3;
/// Slot indices stay below the markers.
pub(super) const MAX_SLOTS: u64 = RETIRED as u64;

/// Whether a `Slot::link` is that of a free slot (on the stack).
#[inline]
pub(super) fn is_free_link(link: u32) -> bool {
    !matches!(link, USED | VACANT | RETIRED)
}

/// Metadata of one block: where it is, and whether it is free.
///
/// Kept outside the managed memory; one per block of every chunk held. It is
/// public only to name the slot storage of a
/// [`FixedSizeResource`](super::FixedSizeResource).
///
/// # Examples
///
/// ```
/// use memres_core::fixed::{Chunk, FixedConfig, FixedSizeResource, Slot};
/// use memres_core::storage::ArrayStorage;
/// use memres_core::{MemoryResourceMut, Request};
/// # use memres_core::testing::BumpUpstream;
/// // Metadata for at most 4 chunks and 512 blocks, with no allocator.
/// type NoHeap = FixedSizeResource<BumpUpstream, ArrayStorage<Chunk, 4>, ArrayStorage<Slot, 512>>;
/// let mut f = NoHeap::with_config_in(BumpUpstream::new(1 << 30), FixedConfig::new(1024), &())?;
/// let b = f.allocate(Request::new(1000)?, &())?;
/// assert_eq!(f.used_blocks(), 1);
/// f.deallocate(b, &())?;
/// assert_eq!(f.used_blocks(), 0);
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    /// The block's address (meaningless while vacant).
    pub(super) addr: u64,
    /// The next free slot on the stack (`NIL` at the bottom) while free;
    /// `USED` while handed out; `VACANT` while its chunk is not held;
    /// `RETIRED` once its generations are used up (while its chunk is held).
    pub(super) link: u32,
    /// Bumped at every free, so that the tag of a block freed before does
    /// not match the slot any more; never wrapped: at `u32::MAX` the slot is
    /// retired for good.
    pub(super) generation: u32,
    /// The size the block was asked with while handed out: its free must
    /// state it (an adaptor above counts off the size a free states).
    pub(super) size: u64,
}

impl Slot {
    /// Whether the slot is used, at `addr`, under `tag`'s generation.
    #[inline(always)]
    fn holds(&self, addr: u64, tag: u64) -> bool {
        self.addr == addr && self.link == USED && self.generation == (tag >> 32) as u32
    }
}

/// The slot table and the free stack: what the fixed-size resource carves
/// its chunks into.
pub(super) struct Slots<L: Storage<Slot>> {
    /// One slot per block; slots `k * bpc .. (k + 1) * bpc` form group `k`,
    /// owned by one chunk or all `VACANT`. Vacant groups are kept (with
    /// their generations, so that old tags stay stale) for the next grow.
    pub(super) table: L,
    /// Top of the free stack: a free slot's index, or `NIL`.
    pub(super) head: u32,
    /// Number of `USED` slots.
    pub(super) used: u64,
    /// Number of `RETIRED` slots.
    pub(super) retired: u64,
    /// Blocks per chunk: the size of a group.
    bpc: usize,
    block_size: u64,
    /// A group was made vacant: the free stack still runs through it until
    /// [`relink`](Self::relink).
    stale_stack: bool,
}

impl<L: Storage<Slot>> Slots<L> {
    pub(super) fn new(blocks_per_chunk: u32, block_size: u64) -> Self {
        Slots {
            table: L::default(),
            head: NIL,
            used: 0,
            retired: 0,
            bpc: blocks_per_chunk as usize,
            block_size,
            stale_stack: false,
        }
    }

    /// Pops the free stack (not empty) for a block of `size` bytes.
    #[inline(always)]
    pub(super) fn pop(&mut self, size: u64) -> Block {
        let i = self.head;
        let slot = &mut self.table[i as usize];
        self.head = slot.link;
        slot.link = USED;
        slot.size = size;
        self.used += 1;
        Block::new(slot.addr, size, ((slot.generation as u64) << 32) | i as u64)
    }

    /// Whether `tag` names slot `i`, used, at `addr`.
    #[inline(always)]
    pub(super) fn is_live(&self, i: usize, addr: u64, tag: u64) -> bool {
        self.table.get(i).is_some_and(|s| s.holds(addr, tag))
    }

    /// Whether `block` is the live block of slot `i`, its size as asked.
    #[inline(always)]
    pub(super) fn is_live_block(&self, i: usize, block: &Block) -> bool {
        self.table.get(i).is_some_and(|s| s.holds(block.addr(), block.tag()) && s.size == block.size())
    }

    /// Frees used slot `i`.
    #[inline(always)]
    pub(super) fn push(&mut self, i: usize) {
        let slot = &mut self.table[i];
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
        self.table[i].link = RETIRED;
        self.retired += 1;
    }

    /// The slots of the group that starts at `first`.
    pub(super) fn group(&self, first: u32) -> &[Slot] {
        &self.table[first as usize..first as usize + self.bpc]
    }

    /// A vacant group with a slot left to hand out (its retired slots stay so).
    fn vacant_group(&self) -> Option<usize> {
        let bpc = self.bpc;
        (0..self.table.len() / bpc).find(|&g| {
            let group = &self.table[g * bpc..(g + 1) * bpc];
            group[0].link == VACANT && group.iter().any(|s| s.generation != u32::MAX)
        })
    }

    /// Drops the slots of a partly pushed group.
    fn trim_partial_group(&mut self) {
        while self.table.len() % self.bpc != 0 {
            self.table.pop();
        }
    }

    /// Rebuilds the free stack from the free slots, lowest index on top,
    /// if a group was made vacant since (its links are gone).
    pub(super) fn relink(&mut self) {
        if !core::mem::take(&mut self.stale_stack) {
            return;
        }
        self.head = NIL;
        for i in (0..self.table.len()).rev() {
            let slot = &mut self.table[i];
            if is_free_link(slot.link) {
                slot.link = self.head;
                self.head = i as u32;
            }
        }
    }
}

impl<L: Storage<Slot>> Carve for Slots<L> {
    /// Room in the metadata before the upstream is asked: a vacant slot
    /// group, or room for a new one.
    fn reserve(&mut self) -> Result<()> {
        let len = self.table.len() as u64 + self.bpc as u64;
        if self.vacant_group().is_none() && (len > self.table.max_len() as u64 || len > MAX_SLOTS) {
            return Err(Error::CapacityExhausted { capacity: self.table.max_len() });
        }
        Ok(())
    }

    /// Gives the chunk a vacant group (or a new one) and pushes its blocks
    /// on the stack, lowest address on top.
    fn attach(&mut self, range: Range) -> Result<u32> {
        self.reserve()?;
        let bpc = self.bpc;
        let first = match self.vacant_group() {
            Some(g) => g * bpc,
            None => {
                let first = self.table.len();
                for _ in 0..bpc {
                    if self.table.try_push(Slot { addr: 0, link: VACANT, generation: 0, size: 0 }).is_err() {
                        // Checked above; undo anyway rather than trust it.
                        self.trim_partial_group();
                        return Err(Error::CapacityExhausted { capacity: self.table.max_len() });
                    }
                }
                first
            }
        };
        for k in (0..bpc).rev() {
            let slot = &mut self.table[first + k];
            slot.addr = range.start() + k as u64 * self.block_size;
            if slot.generation == u32::MAX {
                slot.link = RETIRED;
                self.retired += 1;
            } else {
                slot.link = self.head;
                self.head = (first + k) as u32;
            }
        }
        Ok(first as u32)
    }

    fn is_free(&self, chunk: &Chunk) -> bool {
        !self.group(chunk.first()).iter().any(|s| s.link == USED)
    }

    /// Makes the chunk's group vacant; the free stack is rebuilt by the
    /// next [`relink`](Slots::relink).
    fn detach(&mut self, chunk: &Chunk) {
        let first = chunk.first() as usize;
        for s in &mut self.table[first..first + self.bpc] {
            self.retired -= (s.link == RETIRED) as u64;
            s.link = VACANT;
        }
        self.stale_stack = true;
    }

    /// The chunk owns one whole group, whose slots hold its block addresses.
    fn covers(&self, chunk: &Chunk) -> bool {
        let first = chunk.first() as usize;
        if first % self.bpc != 0 || first + self.bpc > self.table.len() {
            return false;
        }
        let base = chunk.range().start();
        self.group(chunk.first())
            .iter()
            .enumerate()
            .all(|(k, s)| s.link != VACANT && s.addr == base + k as u64 * self.block_size)
    }
}
