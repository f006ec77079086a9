//! The pool's two classes of blocks: large ones in chunks of their own,
//! the rest sharing chunks.
//!
//! A block of at least the large threshold never shares a chunk with a
//! smaller one: a small block left in the tail of a large block's chunk
//! would keep the whole chunk from going back when the large one is freed
//! (the excess measured on dynamic shapes, in `docs/measurements.md`).
//! Each class has its own [`CoalescingIndex`]; a chunk's handle says whose
//! it is.

use crate::chunks::{Carve, Chunk};
use crate::index::{CoalescingIndex, Node};
use crate::storage::Storage;
use crate::{Error, Range, Result};

/// The bit of a chunk's handle that says the chunk is the large class's.
const LARGE: u32 = 1 << 31;

/// Flipped in the tags of large blocks: both indexes number their nodes
/// from zero, and a stale tag of one class must not name a live node of
/// the other at the same address.
const LARGE_TAG: u64 = 1 << 31;

/// The two indexes of a pool and which of them the next chunk joins.
///
/// In declaration order (`repr(C)`): the threshold every call reads sits
/// beside the shared index's head, not 8 KiB further, after two bin tables.
#[repr(C)]
pub(crate) struct Classes<N: Storage<Node>> {
    /// Requests of at least this many bytes are large.
    pub(crate) threshold: u64,
    /// Whether the chunk attached next is the large class's.
    pub(crate) attach_large: bool,
    /// Blocks below `threshold`, sharing chunks.
    pub(crate) shared: CoalescingIndex<N>,
    /// Blocks of at least `threshold` bytes, each chunk sized for one.
    pub(crate) large: CoalescingIndex<N>,
}

impl<N: Storage<Node>> Classes<N> {
    pub(crate) fn new(threshold: u64) -> Self {
        Classes {
            shared: CoalescingIndex::new(256),
            large: CoalescingIndex::new(256),
            threshold,
            attach_large: false,
        }
    }

    /// Whether a request (or a block) of `size` bytes is large.
    #[inline]
    pub(crate) fn is_large(&self, size: u64) -> bool {
        size >= self.threshold
    }

    /// The index of the large class, or of the shared one.
    #[inline]
    pub(crate) fn of_class(&mut self, large: bool) -> &mut CoalescingIndex<N> {
        if large {
            &mut self.large
        } else {
            &mut self.shared
        }
    }

    /// The index of the large class, or of the shared one, to read.
    #[inline]
    pub(crate) fn class(&self, large: bool) -> &CoalescingIndex<N> {
        if large {
            &self.large
        } else {
            &self.shared
        }
    }

    /// Whether a chunk's handle names the large class, and the chunk's node
    /// in that class's index.
    #[inline]
    pub(crate) fn split_handle(handle: u32) -> (bool, u32) {
        (handle & LARGE != 0, handle & !LARGE)
    }

    /// The index a chunk's handle names, and the chunk's node in it.
    #[inline]
    pub(crate) fn of_handle(&mut self, handle: u32) -> (&mut CoalescingIndex<N>, u32) {
        let (large, node) = Self::split_handle(handle);
        (self.of_class(large), node)
    }

    /// `chunk` as the index of its class named it, and that index.
    fn of_chunk(&mut self, chunk: &Chunk) -> (&mut CoalescingIndex<N>, Chunk) {
        let (index, node) = self.of_handle(chunk.first());
        (index, chunk.with_first(node))
    }

    fn of_chunk_ref(&self, chunk: &Chunk) -> (&CoalescingIndex<N>, Chunk) {
        let (large, node) = Self::split_handle(chunk.first());
        (self.class(large), chunk.with_first(node))
    }

    /// The tag a block of the class has outside (`tag` as the index gave
    /// it), and back: large blocks' tags have [`LARGE_TAG`] flipped.
    #[inline]
    pub(crate) fn outer_tag(large: bool, tag: u64) -> u64 {
        tag ^ (LARGE_TAG * large as u64)
    }

    pub(crate) fn used_bytes(&self) -> u64 {
        self.shared.used_bytes() + self.large.used_bytes()
    }

    pub(crate) fn free_bytes(&self) -> u64 {
        self.shared.free_bytes() + self.large.free_bytes()
    }

    pub(crate) fn largest_free(&self) -> u64 {
        self.shared.largest_free().max(self.large.largest_free())
    }
}

impl<N: Storage<Node>> Carve for Classes<N> {
    fn reserve(&mut self) -> Result<()> {
        Carve::reserve(self.of_class(self.attach_large))
    }
    fn attach(&mut self, range: Range) -> Result<u32> {
        let (index, bit) = if self.attach_large { (&mut self.large, LARGE) } else { (&mut self.shared, 0) };
        let first = index.attach(range)?;
        if first & LARGE != 0 {
            // Never reached with real storage (2^31 nodes); refused rather
            // than confused with the other class.
            let _ = index.remove_range(first);
            return Err(Error::CapacityExhausted { capacity: LARGE });
        }
        Ok(first | bit)
    }
    fn is_free(&self, chunk: &Chunk) -> bool {
        let (index, own) = self.of_chunk_ref(chunk);
        index.is_free(&own)
    }
    fn detach(&mut self, chunk: &Chunk) {
        let (index, own) = self.of_chunk(chunk);
        index.detach(&own);
    }
    fn covers(&self, chunk: &Chunk) -> bool {
        let (index, own) = self.of_chunk_ref(chunk);
        index.covers(&own)
    }
    fn class_of(&self, chunk: &Chunk) -> usize {
        Self::split_handle(chunk.first()).0 as usize
    }
    fn attach_class(&self) -> usize {
        self.attach_large as usize
    }
    fn set_attach_class(&mut self, class: usize) {
        self.attach_large = class == 1;
    }
}
