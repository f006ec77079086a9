//! The two-level segregated-fit index over bare address ranges: the
//! algorithm of the coalescing pool, the arena (global and per-thread), the
//! per-stream pools and the virtual pool.

mod bins;
mod check;
#[cfg(test)]
mod input_tests;
mod nodes;
mod ops;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod where_tests;

pub use nodes::Node;

use crate::storage::{DefaultStorage, Storage};
use bins::{BIN_COUNT, FL_COUNT};
use core::fmt;
use nodes::NONE;

/// A byte count read as `u64`: `u64::MAX` if it is more.
#[inline]
fn saturated(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// What the index hands out: an address and the tag that frees it in O(1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// First address of the allocated range.
    pub addr: u64,
    /// Node index and generation, for [`CoalescingIndex::free`].
    pub tag: u64,
}

/// A two-level segregated-fit index of free ranges with coalescing: the
/// algorithm of [`CoalescingPool`](crate::pool::CoalescingPool), usable on its own
/// over any ranges (a heap inside one buffer, a Vulkan heap, a fuzzer's
/// integers).
///
/// ```text
///  regions (added with add_range; never merged with each other)
///  ┌────────────────────────────── region A ───────┐  ┌──── region B ───┐
///  │ used │   free   │ used │ used │      free     │  │ free      │used │
///  └──────┴──────────┴──────┴──────┴───────────────┘  └───────────┴─────┘
///     ◄──── prev_phys / next_phys links within a region ────►
///
///  bins: size classes, 32 per power of two (sizes in granules)
///  fl_bitmap:  ...0 1 0 1 1 0      bit f set iff some bin of row f is non-empty
///  sl_bitmap[f]: 32 bits           bit s set iff bin (f, s) is non-empty
///  heads[f*32+s] ──► free node ◄─► free node ◄─► ...
/// ```
///
/// Sizes and addresses are multiples of a power-of-two *granule* (256 bytes
/// in the pool). A free range sits in the bin of its size rounded down; a
/// request first looks at up to 8 ranges of its own bin for one that fits
/// (best fit among them, an exact fit at once), then takes the head of the
/// first non-empty bin whose every range fits (at the worst padding its
/// alignment may need). Both steps are O(1), so a free range that fits may
/// be missed when no bin from that one up holds a range: one beyond the
/// first 8 of the request's bin, or, for an alignment above the granule,
/// one in a bin between the request's and that one (a range that needs
/// no padding where it lies: 256 bytes aligned to 4096 in the only free
/// range, of 512 bytes at 4096). A caller that cannot add
/// a range then takes the O(free ranges) last resort,
/// [`allocate_exhaustive`](Self::allocate_exhaustive) (or
/// [`allocate_class_exhaustive`](Self::allocate_class_exhaustive)), which
/// misses none.
///
/// Freeing a range merges it with free neighbours in its region, so two free
/// ranges are never adjacent. Metadata lives in the `N` storage, outside the
/// managed ranges; the index [`add_range`](Self::add_range) returns names the
/// region for its whole life (splits keep the front, merges keep the lower).
///
/// A tag is a node's index and a 32-bit generation bumped at every
/// allocation of the node, and a generation never wraps: the allocation
/// after a node's last generation moves its range to another slot and
/// retires the old slot for good (a region's first node stays behind as the
/// region's zero-length header, so the region keeps its index). A stale tag
/// therefore never matches a later allocation: its free is
/// [`Error::DoubleFree`](crate::Error::DoubleFree) or [`Error::UnknownBlock`](crate::Error::UnknownBlock), for the life of the
/// index. The price is one slot per 2^32 allocations of one slot (40 bytes
/// with `Vec` storage); with fixed-capacity storage a retired slot is lost
/// to the capacity for good, so after as many retirements as there are
/// slots the index answers [`Error::CapacityExhausted`](crate::Error::CapacityExhausted).
///
/// # Examples
///
/// ```
/// use memres_core::index::CoalescingIndex;
/// use memres_core::Range;
/// let mut index: CoalescingIndex = CoalescingIndex::new(256);
/// index.add_range(Range::new(0, 4096).unwrap())?;
/// let a = index.allocate(1000, 256)?.unwrap();
/// let b = index.allocate(1000, 1024)?.unwrap();
/// assert_eq!((a.addr, b.addr), (0, 1024));
/// index.free(a.tag, a.addr, 1000)?;
/// index.free(b.tag, b.addr, 1000)?;
/// assert_eq!(index.largest_free(), 4096);
/// # Ok::<(), memres_core::Error>(())
/// ```
pub struct CoalescingIndex<N: Storage<Node> = DefaultStorage<Node>> {
    /// Every node ever made; vacant ones are linked through `next_free`.
    nodes: N,
    /// Head of the vacant-slot list, or `NONE`.
    vacant: u32,
    /// Length of the vacant-slot list.
    vacant_len: u32,
    /// Where link updates aimed at `NONE` land; never read.
    scratch: u32,
    /// Bit `f` set iff some bin of first level `f` is non-empty.
    fl_bitmap: u64,
    /// Bit `s` of `sl_bitmap[f]` set iff bin `f * SL_COUNT + s` is non-empty.
    sl_bitmap: [u32; FL_COUNT],
    /// First node of each bin's free list, or `NONE` (then its bit is clear).
    heads: [u32; BIN_COUNT],
    /// log2 of the granule.
    shift: u32,
    /// Sum of the sizes of free nodes: in 128 bits, as overlapping regions
    /// (a caller's mistake) may sum past `u64::MAX`.
    free_bytes: u128,
    /// Sum of the sizes of used nodes, likewise.
    used_bytes: u128,
    /// Number of used nodes.
    used_count: u64,
}

impl<N: Storage<Node>> CoalescingIndex<N> {
    /// An empty index whose sizes and addresses are multiples of `granule`.
    ///
    /// # Panics
    ///
    /// If `granule` is not a power of two.
    pub fn new(granule: u64) -> Self {
        assert!(granule.is_power_of_two(), "granule {granule} is not a power of two");
        CoalescingIndex {
            nodes: N::default(),
            vacant: NONE,
            vacant_len: 0,
            scratch: NONE,
            fl_bitmap: 0,
            sl_bitmap: [0; FL_COUNT],
            heads: [NONE; BIN_COUNT],
            shift: granule.trailing_zeros(),
            free_bytes: 0,
            used_bytes: 0,
            used_count: 0,
        }
    }

    /// The granule: every size and address is a multiple of it.
    #[inline]
    pub fn granule(&self) -> u64 {
        1 << self.shift
    }

    /// Bytes in free ranges (`u64::MAX` if more: only regions added
    /// overlapping, against [`add_range`](Self::add_range)'s contract, hold
    /// more).
    #[inline]
    pub fn free_bytes(&self) -> u64 {
        saturated(self.free_bytes)
    }

    /// Bytes in used ranges (sizes rounded up to the granule; `u64::MAX`
    /// if more, as for [`free_bytes`](Self::free_bytes)).
    #[inline]
    pub fn used_bytes(&self) -> u64 {
        saturated(self.used_bytes)
    }

    /// Number of ranges handed out and not freed.
    #[inline]
    pub fn used_count(&self) -> u64 {
        self.used_count
    }

    /// Node slots in use or vacant: the metadata's size.
    pub fn node_slots(&self) -> usize {
        self.nodes.len()
    }
}

impl<N: Storage<Node>> fmt::Debug for CoalescingIndex<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoalescingIndex")
            .field("granule", &self.granule())
            .field("free_bytes", &self.free_bytes)
            .field("used_bytes", &self.used_bytes)
            .field("used_count", &self.used_count)
            .field("node_slots", &self.nodes.len())
            .finish()
    }
}
