//! The global arena: upstream chunks cut into superblocks and large blocks.

use crate::check::Violation;
use crate::chunks::{Carve, ChunkTable, GiveBack, Growth};
use crate::index::{Allocation, CoalescingIndex};
use crate::{Error, MemoryResource, Range, Request, Result, Stream};
use alloc::collections::BTreeMap;

/// The smallest superblock the global arena ever hands out (RMM's minimum).
pub(super) const MIN_SUPERBLOCK: u64 = 1 << 20;

/// A superblock held by an arena.
#[derive(Clone, Copy, Debug)]
struct SuperOut {
    len: u64,
    /// Slot of the arena that holds it.
    owner: usize,
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

/// The global arena's state (behind its own lock in `ArenaResource`): a
/// chunk table and an index over it, as the coalescing pool, whose used
/// ranges are superblocks lent to arenas and large blocks.
///
/// Every byte of every chunk is in exactly one of: a free range of `index`,
/// a superblock out (a used range of `index` recorded in `supers`), or a
/// large block (a used range of `index` not in `supers`).
#[derive(Debug)]
pub(super) struct Global<U> {
    /// Free ranges, superblocks out and large blocks, over the chunks.
    index: CoalescingIndex,
    /// Chunks held from upstream.
    chunks: ChunkTable<U>,
    /// Superblocks held by arenas, by start address.
    supers: BTreeMap<u64, SuperOut>,
    /// Bytes (rounded to 256) and number of large blocks live.
    large_bytes: u64,
    large_count: u64,
    /// Chunks of `max(need, chunk size, held / 8)`, the last two in whole
    /// superblocks ([`Growth`]: cut or halved, in multiples of 256).
    growth: Growth,
    superblock_size: u64,
    /// Superblock requests so far: the clock of the idle sweeps.
    requests: u64,
}

impl<U> Global<U> {
    pub(super) fn new(upstream: U, maximum: Option<u64>, chunk_size: u64, superblock_size: u64) -> Self {
        Global {
            index: CoalescingIndex::new(256),
            chunks: ChunkTable::new(upstream, maximum),
            supers: BTreeMap::new(),
            large_bytes: 0,
            large_count: 0,
            // The unused tail of the newest chunk stays under 1/8 of what
            // is held plus a chunk (its smallest growth).
            growth: Growth::Steps { minimum: chunk_size, divisor: 8, step: superblock_size },
            superblock_size,
            requests: 0,
        }
    }

    pub(super) fn upstream(&self) -> &U {
        self.chunks.upstream()
    }

    /// Bytes held from upstream.
    pub(super) fn held(&self) -> u64 {
        self.chunks.held()
    }

    /// The most bytes ever held from upstream at once.
    pub(super) fn peak_held(&self) -> u64 {
        self.chunks.peak_held()
    }

    pub(super) fn maximum(&self) -> Option<u64> {
        self.chunks.maximum()
    }

    /// The largest free range.
    pub(super) fn largest_free(&self) -> u64 {
        self.index.largest_free()
    }

    /// Bytes (rounded to 256) and number of large blocks live.
    pub(super) fn large(&self) -> (u64, u64) {
        (self.large_bytes, self.large_count)
    }

    /// The superblocks lent: start, length and the slot of the arena that
    /// holds each, by address.
    pub(super) fn lent(&self) -> impl Iterator<Item = (u64, u64, usize)> + '_ {
        self.supers.iter().map(|(&s, o)| (s, o.len, o.owner))
    }

    /// The global arena's figures for a dump.
    pub(super) fn stats(&self) -> super::ArenaStats {
        super::ArenaStats {
            owner: super::Owner::Global,
            superblocks: self.supers.len(),
            free_superblocks: 0,
            held: self.chunks.held(),
            used: self.index.used_bytes(),
            free: self.index.free_bytes(),
            largest_free: self.index.largest_free(),
        }
    }

    /// Takes a chunk of `bytes` from upstream (the initial size).
    pub(super) fn add_chunk<S: Stream + ?Sized>(&mut self, bytes: u64, stream: &S) -> Result<()>
    where
        U: MemoryResource<S>,
    {
        self.chunks
            .take(Request::new(bytes)?, stream, &mut self.index, |b| b.upstream_range(bytes))
            .map(|_| ())
    }

    /// Grows by a chunk that holds `need` bytes (see [`ChunkTable::grow`]);
    /// at the maximum, wholly free chunks go back upstream first. Returns
    /// the new chunk's first node, to allocate from directly.
    fn grow<S: Stream + ?Sized>(&mut self, need: u64, stream: &S) -> Result<Option<u32>>
    where
        U: MemoryResource<S>,
    {
        self.chunks.grow(need, self.growth, GiveBack::AtMaximum, stream, &mut self.index)
    }

    /// Counts one superblock request; says whether an idle sweep is due
    /// (every `period` requests; never for 0).
    pub(super) fn tick(&mut self, period: u32) -> bool {
        self.requests = self.requests.wrapping_add(1);
        period != 0 && self.requests % u64::from(period) == 0
    }

    /// A superblock for arena `owner` that holds `need` bytes at 256-byte
    /// alignment: the configured size if it can be had (growing if needed),
    /// else as long as the longest free range allows, down to
    /// `max(need, 1 MiB)`.
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
        let mut failed = None;
        if got.is_none() {
            match self.grow(full, stream) {
                Ok(Some(first)) => got = self.index.allocate_in(first, full, 256)?.map(|a| (a, full)),
                Ok(None) => {}
                // A failed growth leaves the arena as it was: what is free
                // may still hold a superblock, and the error stands where
                // nothing does.
                Err(e) => failed = Some(e),
            }
        }
        if got.is_none() {
            // At the maximum: a smaller superblock out of what is left, the
            // longest free range, wherever it lies in its class's list.
            let small = MIN_SUPERBLOCK.max((need + 255) & !255);
            let fit = self.index.largest_free().min(full) & !255;
            if fit >= small {
                got = match self.index.allocate_exhaustive(fit, 256) {
                    Ok(a) => a.map(|a| (a, fit)),
                    Err(e) => return Err(failed.unwrap_or(e)),
                };
            }
        }
        if let (None, Some(e)) = (&got, failed) {
            return Err(e);
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
    ) -> Result<Option<Allocation>>
    where
        U: MemoryResource<S>,
    {
        let mut got = self.index.allocate(size, align)?;
        if got.is_none() {
            match self.grow(((size + 255) & !255) + align - 256, stream) {
                Ok(Some(first)) => got = self.index.allocate_in(first, size, align)?,
                // At the maximum: any free range that holds it, beyond the
                // first ranges of its class that the search looks at.
                Ok(None) => got = self.index.allocate_exhaustive(size, align)?,
                // Also where the growth failed with an error (a chunk the
                // upstream refused back, metadata run out): a failed growth
                // leaves the arena as it was, and the error stands where
                // nothing free holds the block.
                Err(e) => match self.index.allocate_exhaustive(size, align) {
                    Ok(Some(a)) => got = Some(a),
                    _ => return Err(e),
                },
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

    /// What `addr` is: for frees of blocks known only by their address.
    pub(super) fn locate(&self, addr: u64) -> Located {
        if let Some((&start, s)) = self.supers.range(..=addr).next_back() {
            if addr - start < s.len {
                return Located::Super { owner: s.owner, start };
            }
        }
        let Some(c) = self.chunks.chunk_of(addr) else { return Located::Unknown };
        match self.index.find_used(c.first(), addr) {
            Some(tag) => Located::Large { tag },
            None if self.index.is_free_at(c.first(), addr) => Located::Free,
            None => Located::Unknown,
        }
    }

    /// Gives every wholly free chunk back to upstream; returns the bytes.
    pub(super) fn release<S: Stream + ?Sized>(&mut self, stream: &S) -> Result<u64>
    where
        U: MemoryResource<S>,
    {
        self.chunks.release(stream, &mut self.index)
    }

    /// For the arena's `Drop`: gives back every chunk wholly free in the
    /// index (the arenas gave their wholly free superblocks back first, so
    /// every chunk that holds no live block).
    pub(super) fn give_back_on_drop(&mut self) {
        let index = &self.index;
        self.chunks.give_back_on_drop(|c| index.is_free(c));
    }

    pub(super) fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// The global arena's own invariants (the arenas' are checked by the caller).
    pub(super) fn check(&self) -> core::result::Result<(), Violation> {
        self.index.check()?;
        self.chunks.check(&self.index)?;
        if self.index.used_bytes() + self.index.free_bytes() != self.chunks.held() {
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
            let Some(c) = self.chunks.chunk_of(start) else {
                return Err(Violation::new("global: superblock outside every chunk"));
            };
            if !c.range().contains_range(&Range::new(start, s.len).unwrap_or_default()) {
                return Err(Violation::new("global: superblock spans two chunks"));
            }
            if self.index.find_used(c.first(), start) != Some(s.tag) {
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
