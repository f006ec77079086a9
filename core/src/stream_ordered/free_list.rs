//! One stream's free list: blocks freed on it, found by footprint.

use crate::{Block, Range, Request, Stream, DEFAULT_ALIGNMENT};
use alloc::collections::{BTreeMap, VecDeque};

/// The blocks freed on one stream, by footprint, with the fence that
/// orders them for other streams.
pub(super) struct FreeList<S: Stream> {
    pub(super) stream: S,
    /// Listed blocks by footprint, each with its free sequence number; no
    /// bucket is empty, and each is in increasing sequence order.
    pub(super) buckets: BTreeMap<u64, VecDeque<(Block, u64)>>,
    /// Number of listed blocks.
    pub(super) len: usize,
    /// Sequence number of the next free; every listed block's seq is lower.
    pub(super) next_seq: u64,
    /// An event recorded on `stream` when `next_seq` was this number: it
    /// covers the blocks with a lower seq.
    pub(super) fence: Option<(S::Event, u64)>,
}

/// The bytes an inner block occupies: its size rounded up to the 256-byte
/// granule every resource works in. Every block the layer holds has one
/// that ends at an address (`StreamOrdered::inner_allocate` refuses the
/// others).
pub(super) fn footprint(block: &Block) -> u64 {
    block.size().div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT
}

/// [`footprint`], where it ends at an address (`None`: an inner block
/// longer than asked, within 255 bytes of the last address).
pub(super) fn checked_footprint(block: &Block) -> Option<u64> {
    let bytes = block.size().checked_next_multiple_of(DEFAULT_ALIGNMENT)?;
    Range::new(block.addr(), bytes).map(|_| bytes)
}

impl<S: Stream> FreeList<S> {
    pub(super) fn new(stream: S) -> Self {
        FreeList { stream, buckets: BTreeMap::new(), len: 0, next_seq: 0, fence: None }
    }

    /// A fit for `request` as (bucket, index): the smallest bucket that wastes
    /// at most half of its blocks, its newest aligned block (of the newest
    /// few; for the default alignment the newest).
    pub(super) fn find(&self, request: Request) -> Option<(u64, usize)> {
        let need = request.rounded_size(DEFAULT_ALIGNMENT).max(DEFAULT_ALIGNMENT);
        let limit = need.saturating_mul(2);
        self.buckets.range(need..=limit).take(8).find_map(|(&size, q)| {
            // Blocks in a bucket may be shorter than the request: only an
            // inner block's own size is promised to be memory.
            let fits = |b: &Block| b.addr() % request.align() == 0 && b.size() >= request.size();
            let back = q.iter().rev().take(8).position(|(b, _)| fits(b))?;
            Some((size, q.len() - 1 - back))
        })
    }

    pub(super) fn push(&mut self, block: Block) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.buckets.entry(footprint(&block)).or_default().push_back((block, seq));
        self.len += 1;
    }

    pub(super) fn remove(&mut self, size: u64, index: usize) -> Block {
        let q = self.buckets.get_mut(&size).expect("bucket found");
        let (block, _) = q.remove(index).expect("index found");
        if q.is_empty() {
            self.buckets.remove(&size);
        }
        self.len -= 1;
        block
    }
}
