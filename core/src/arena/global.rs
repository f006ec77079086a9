//! The global arena: upstream chunks cut into superblocks and large blocks.

use crate::check::Violation;
use crate::index::CoalescingIndex;
use crate::{Block, Error, MemoryResource, Range, Request, Result, Stream};
use alloc::collections::BTreeMap;
use alloc::vec::Vec;

/// The smallest superblock the global arena ever hands out (RMM's minimum).
pub(super) const MIN_SUPERBLOCK: u64 = 1 << 20;

/// One chunk taken from upstream.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    range: Range,
    /// The upstream's block, to give back.
    block: Block,
    /// The global index's node at the chunk's lowest address.
    first: u32,
}

/// A superblock held by an arena.
#[derive(Clone, Copy, Debug)]
pub(super) struct SuperOut {
    pub(super) len: u64,
    /// Slot of the arena that holds it.
    pub(super) owner: usize,
    /// The global index's tag for it.
    tag: u64,
}

/// What an address is, as the global arena sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Located {
    /// Inside a superblock held by arena `owner`, which starts at `start`.
    Super { owner: usize, start: u64 },
    /// The start of a large block; its index tag.
    Large { tag: u64 },
    /// Inside free space of the global arena.
    Free,
    /// Not in any chunk, or inside a large block but not at its start.
    Unknown,
}

/// The global arena's state (behind its own lock in `ArenaResource`).
///
/// Every byte of every chunk is in exactly one of: a free range of `index`,
/// a superblock out (a used range of `index` recorded in `supers`), or a
/// large block (a used range of `index` not in `supers`).
#[derive(Debug)]
pub(super) struct Global<U> {
    pub(super) upstream: U,
    /// Free ranges, superblocks out and large blocks, over the chunks.
    pub(super) index: CoalescingIndex,
    /// Chunks held from upstream, sorted by address.
    chunks: Vec<Chunk>,
    /// Superblocks held by arenas, by start address.
    pub(super) supers: BTreeMap<u64, SuperOut>,
    /// Sum of the chunks' lengths.
    pub(super) held: u64,
    /// Highest `held` ever.
    pub(super) peak_held: u64,
    /// Bytes (rounded to 256) and number of large blocks live.
    pub(super) large_bytes: u64,
    pub(super) large_count: u64,
    pub(super) maximum: Option<u64>,
    chunk_size: u64,
    superblock_size: u64,
}

impl<U> Global<U> {
    pub(super) fn new(upstream: U, maximum: Option<u64>, chunk_size: u64, superblock_size: u64) -> Self {
        Global {
            upstream,
            index: CoalescingIndex::new(256),
            chunks: Vec::new(),
            supers: BTreeMap::new(),
            held: 0,
            peak_held: 0,
            large_bytes: 0,
            large_count: 0,
            maximum,
            chunk_size,
            superblock_size,
        }
    }

    /// Takes a chunk of `bytes` from upstream.
    /// Returns the chunk's first index node.
    pub(super) fn add_chunk<S: Stream + ?Sized>(&mut self, bytes: u64, stream: &S) -> Result<u32>
    where
        U: MemoryResource<S>,
    {
        let block = self.upstream.allocate(Request::new(bytes)?, stream)?;
        let added = block.upstream_range(bytes).and_then(|r| self.index.add_range(r).map(|first| (r, first)));
        let (range, first) = match added {
            Ok(x) => x,
            Err(e) => {
                let _ = self.upstream.deallocate(block, stream);
                return Err(e);
            }
        };
        let at = self.chunks.partition_point(|c| c.range.start() < range.start());
        self.chunks.insert(at, Chunk { range, block, first });
        self.held += bytes;
        self.peak_held = self.peak_held.max(self.held);
        Ok(first)
    }

    /// Grows by at least `need` bytes: `max(need, chunk size, held / 8)`
    /// under the maximum, halved towards `need` while the upstream is out of memory.
    /// At the maximum, wholly free chunks go back upstream first.
    /// Returns the new chunk's first node: callers allocate from it
    /// directly, since a chunk of exactly `need` bytes lands in a size class
    /// below the one the index searches for `need` (found by fuzzing the pool,
    /// whose growth had the same flaw). `Ok(None)` when the maximum or the
    /// upstream leaves no room, or `need` is more than any request may ask
    /// (a valid size whose alignment padding takes it above
    /// `Request::MAX_SIZE`: out of memory, not the upstream's `InvalidSize`
    /// for a size the caller never asked for).
    fn grow<S: Stream + ?Sized>(&mut self, need: u64, stream: &S) -> Result<Option<u32>>
    where
        U: MemoryResource<S>,
    {
        let need = (need + 255) & !255;
        if need > Request::MAX_SIZE {
            return Ok(None);
        }
        let mut room = self.maximum.map_or(u64::MAX, |m| m - self.held);
        if need > room {
            // Wholly free chunks cannot hold a range larger than themselves:
            // give them back so that one chunk large enough can replace them.
            let _ = self.release(stream);
            room = self.maximum.map_or(u64::MAX, |m| m - self.held);
            if need > room {
                return Ok(None);
            }
        }
        // Geometric growth (ratio 9/8) in whole superblocks: the unused tail
        // of the newest chunk stays under 1/8 of what is held.
        let step = self.chunk_size.max(self.held / 8).div_ceil(self.superblock_size) * self.superblock_size;
        // Rounded up to superblocks, the step may pass what a request holds.
        let mut size = need.max(step).min(room).min(Request::MAX_SIZE);
        loop {
            match self.add_chunk(size, stream) {
                Ok(first) => return Ok(Some(first)),
                Err(e) if e.is_out_of_memory() && size > need => size = ((size / 2).max(need) + 255) & !255,
                Err(e) if e.is_out_of_memory() => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }

    /// A superblock for arena `owner` that holds `need` bytes at 256-byte
    /// alignment: the configured size if it can be had (growing if needed),
    /// else the largest that fits, down to `max(need, 1 MiB)`.
    pub(super) fn acquire<S: Stream + ?Sized>(
        &mut self,
        need: u64,
        owner: usize,
        stream: &S,
    ) -> Result<Option<Range>>
    where
        U: MemoryResource<S>,
    {
        let full = self.superblock_size.max((need + 255) & !255);
        let mut got = self.index.allocate(full, 256)?.map(|a| (a, full));
        if got.is_none() {
            if let Some(first) = self.grow(full, stream)? {
                got = self.index.allocate_in(first, full, 256)?.map(|a| (a, full));
            }
        }
        if got.is_none() {
            // At the maximum: a smaller superblock out of what is left.
            let small = MIN_SUPERBLOCK.max((need + 255) & !255);
            let fit = self.index.largest_free().min(full) & !255;
            if fit >= small {
                got = self.index.allocate(fit, 256)?.map(|a| (a, fit));
            }
        }
        Ok(got.map(|(a, len)| {
            self.supers.insert(a.addr, SuperOut { len, owner, tag: a.tag });
            Range::new(a.addr, len).unwrap_or_default()
        }))
    }

    /// Takes back the superblock that starts at `start`; it coalesces with
    /// free neighbours in its chunk.
    pub(super) fn give_back(&mut self, start: u64) -> Result<()> {
        let s = self.supers.remove(&start).ok_or(Error::UnknownBlock { addr: start })?;
        self.index.free(s.tag, start, s.len).map(|_| ())
    }

    /// A large block straight from the global arena.
    pub(super) fn allocate_large<S: Stream + ?Sized>(
        &mut self,
        size: u64,
        align: u64,
        stream: &S,
    ) -> Result<Option<crate::index::Allocation>>
    where
        U: MemoryResource<S>,
    {
        let mut got = self.index.allocate(size, align)?;
        if got.is_none() {
            if let Some(first) = self.grow(((size + 255) & !255) + align - 256, stream)? {
                got = self.index.allocate_in(first, size, align)?;
            }
        }
        if got.is_some() {
            self.large_bytes += (size + 255) & !255;
            self.large_count += 1;
        }
        Ok(got)
    }

    /// Frees a large block by its index tag.
    pub(super) fn free_large(&mut self, tag: u64, addr: u64, size: u64) -> Result<()> {
        // A forged tag must not free a superblock out from under its arena.
        if self.supers.contains_key(&addr) {
            return Err(Error::UnknownBlock { addr });
        }
        self.index.free(tag, addr, size)?;
        self.large_bytes -= (size + 255) & !255;
        self.large_count -= 1;
        Ok(())
    }

    fn chunk_of(&self, addr: u64) -> Option<&Chunk> {
        let i = self.chunks.partition_point(|c| c.range.start() <= addr);
        let c = self.chunks.get(i.checked_sub(1)?)?;
        c.range.contains(addr).then_some(c)
    }

    /// What `addr` is: for frees of blocks known only by their address.
    pub(super) fn locate(&self, addr: u64) -> Located {
        if let Some((&start, s)) = self.supers.range(..=addr).next_back() {
            if addr - start < s.len {
                return Located::Super { owner: s.owner, start };
            }
        }
        let Some(c) = self.chunk_of(addr) else { return Located::Unknown };
        match self.index.find_used(c.first, addr) {
            Some(tag) => Located::Large { tag },
            None if self.index.is_free_at(c.first, addr) => Located::Free,
            None => Located::Unknown,
        }
    }

    /// Gives every wholly free chunk back to upstream; returns the bytes.
    pub(super) fn release<S: Stream + ?Sized>(&mut self, stream: &S) -> Result<u64>
    where
        U: MemoryResource<S>,
    {
        let mut freed = 0;
        let mut i = 0;
        while i < self.chunks.len() {
            let c = self.chunks[i];
            if !self.index.is_region_free(c.first) {
                i += 1;
                continue;
            }
            self.index.remove_range(c.first)?;
            if let Err(e) = self.upstream.deallocate(c.block, stream) {
                self.chunks[i].first = self.index.add_range(c.range)?;
                return Err(e);
            }
            self.chunks.remove(i);
            self.held -= c.range.len();
            freed += c.range.len();
        }
        Ok(freed)
    }

    pub(super) fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// The global arena's own invariants (the arenas' are checked by the caller).
    pub(super) fn check(&self) -> core::result::Result<(), Violation> {
        self.index.check().map_err(Violation::new)?;
        let mut total = 0;
        let mut last_end = 0;
        for c in &self.chunks {
            if c.range.start() < last_end {
                return Err(Violation::new("global: chunks overlap or are not sorted"));
            }
            last_end = c.range.end();
            let mut cursor = c.range.start();
            self.index.for_each_in_region(c.first, |r, _| {
                cursor = if r.start() == cursor { r.end() } else { u64::MAX };
            });
            if cursor != c.range.end() {
                return Err(Violation::new("global: chunk not covered exactly by its ranges"));
            }
            total += c.range.len();
        }
        if total != self.held {
            return Err(Violation::new("global: chunk lengths do not add up to the bytes held"));
        }
        if self.maximum.is_some_and(|m| self.held > m) {
            return Err(Violation::new("global: holds more than its maximum"));
        }
        if self.index.used_bytes() + self.index.free_bytes() != self.held {
            return Err(Violation::new("global: bytes in use + bytes free != bytes held from upstream"));
        }
        let mut super_bytes = 0;
        let mut last_end = 0;
        for (&start, s) in &self.supers {
            if start < last_end {
                return Err(Violation::new("global: superblocks overlap"));
            }
            last_end = start + s.len;
            if s.len < MIN_SUPERBLOCK {
                return Err(Violation::new("global: superblock below the minimum size"));
            }
            let Some(c) = self.chunk_of(start) else {
                return Err(Violation::new("global: superblock outside every chunk"));
            };
            if !c.range.contains_range(&Range::new(start, s.len).unwrap_or_default()) {
                return Err(Violation::new("global: superblock spans two chunks"));
            }
            if self.index.find_used(c.first, start) != Some(s.tag) {
                return Err(Violation::new("global: superblock is not a used range of the index"));
            }
            super_bytes += s.len;
        }
        if super_bytes + self.large_bytes != self.index.used_bytes()
            || self.supers.len() as u64 + self.large_count != self.index.used_count()
        {
            return Err(Violation::new("global: superblocks + large blocks != ranges in use"));
        }
        Ok(())
    }
}
