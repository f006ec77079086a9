//! The two-level segregated-fit index over bare address ranges.

use crate::storage::{DefaultStorage, Storage};
use crate::{Error, Range, Result};
use core::fmt;

/// log2 of the number of second-level classes per power of two.
const SL_BITS: u32 = 5;
const SL_COUNT: usize = 1 << SL_BITS;
/// First-level classes: enough for every size in units below 2^64.
const FL_COUNT: usize = 64 - SL_BITS as usize + 1;
const BIN_COUNT: usize = FL_COUNT * SL_COUNT;
/// How many blocks of the request's own class are looked at for a fit before
/// falling back to a class that fits by construction.
const SCAN_LIMIT: u32 = 8;
/// "No node" in links and list heads.
const NONE: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// A free range, in the bin list of its size class.
    Free,
    /// A range handed out.
    Used,
    /// A slot on the vacant list, not describing any range.
    #[default]
    Vacant,
    /// A slot whose generation is used up: never handed out or reused
    /// again, so no tag of it can match. A region's first node retired this
    /// way stays as the region's zero-length *header*: its `next_phys` leads
    /// to the region's first range, so the region keeps its handle.
    Retired,
}

/// One range of the index: free, used, or a vacant slot. Public only so that
/// the storage type can be named; its fields are private.
#[derive(Clone, Copy, Debug, Default)]
pub struct Node {
    addr: u64,
    size: u64,
    /// Neighbour at the next lower address in the same region, or `NONE`.
    prev_phys: u32,
    /// Neighbour at the next higher address in the same region, or `NONE`.
    next_phys: u32,
    /// Bin list links (free nodes) or vacant-list link (`next_free`, vacant nodes).
    prev_free: u32,
    next_free: u32,
    /// Bumped on every allocation, never wrapped: a slot whose generation
    /// is used up is retired (see `relocate`), so a tag matches only the one
    /// allocation it was made for.
    gen: u32,
    /// The bin list holding the node while it is free (fits in the padding
    /// after `state`; saves recomputing the class on removal).
    bin: u16,
    state: State,
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
/// algorithm of [`CoalescingPool`](super::CoalescingPool), usable on its own
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
/// first non-empty bin whose every range fits. Both steps are O(1).
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
/// [`Error::DoubleFree`] or [`Error::UnknownBlock`], for the life of the
/// index. The price is one slot per 2^32 allocations of one slot (40 bytes
/// with `Vec` storage); with fixed-capacity storage a retired slot is lost
/// to the capacity for good, so after as many retirements as there are
/// slots the index answers [`Error::CapacityExhausted`].
///
/// # Examples
///
/// ```
/// use memres_core::pool::CoalescingIndex;
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
    /// Sum of the sizes of free nodes.
    free_bytes: u64,
    /// Sum of the sizes of used nodes.
    used_bytes: u64,
    /// Number of used nodes.
    used_count: u64,
}

/// The bin of a size in granules, rounded down: every range in a bin is at
/// least the bin's lower bound.
///
/// Sizes below `2 * SL_COUNT` map to themselves (one bin per granule); above,
/// the top `SL_BITS + 1` bits of the size name the bin. Written without a
/// branch: random sizes would mispredict one.
#[inline]
fn bin_floor(units: u64) -> usize {
    // `e` is at least SL_BITS; then `units >> s` is below 2 * SL_COUNT.
    let e = 63 - (units | SL_COUNT as u64).leading_zeros();
    let s = e - SL_BITS;
    ((s as usize) << SL_BITS) + (units >> s) as usize
}

/// The first bin whose every range holds `units` granules.
#[inline]
fn bin_ceil(units: u64) -> usize {
    if units < SL_COUNT as u64 {
        units as usize
    } else {
        let e = 63 - units.leading_zeros();
        let step = 1u64 << (e - SL_BITS);
        // Sizes near u64::MAX never reach here: requests are at most 2^62 bytes.
        bin_floor(units + step - 1)
    }
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

    /// Bytes in free ranges.
    #[inline]
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Bytes in used ranges (sizes rounded up to the granule).
    #[inline]
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
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

    #[inline]
    fn node(&self, i: u32) -> &Node {
        debug_assert!((i as usize) < self.nodes.len(), "node {i} out of range");
        // SAFETY: every `i` that reaches here is in range. It is a list head,
        // a link read from a node, the vacant-list head, or a slot index that
        // the public entry points checked against `nodes.len()` (`resolve`,
        // `allocate_in`, `remove_range`, `is_region_free`, the region walks).
        // Links are only ever written from indices of existing slots, and
        // slots are never removed: the index only calls `try_push`, and the
        // `unsafe trait Storage` promises that the length changes only there
        // (by one, on `Ok`) and that the elements keep what was written, so
        // a link stays in range for the index's life; `check` verifies it.
        unsafe { self.nodes.get_unchecked(i as usize) }
    }

    #[inline]
    fn node_mut(&mut self, i: u32) -> &mut Node {
        debug_assert!((i as usize) < self.nodes.len(), "node {i} out of range");
        // SAFETY: as in `node`: `i` is a head, a link or a checked index.
        unsafe { self.nodes.get_unchecked_mut(i as usize) }
    }

    /// The link `field` picks out of node `i`, or a scratch word when `i` is
    /// `NONE`: list and neighbour updates then store without a branch that
    /// random sizes would mispredict.
    #[inline(always)]
    fn link_of(&mut self, i: u32, field: fn(&mut Node) -> &mut u32) -> &mut u32 {
        if i != NONE {
            debug_assert!(self.in_range(i), "node {i} out of range");
            // SAFETY: `i` is a link (see `node`).
            field(unsafe { self.nodes.get_unchecked_mut(i as usize) })
        } else {
            &mut self.scratch
        }
    }

    /// Whether `i` names a slot: the check at the public entry points that
    /// take a node index from the caller.
    #[inline]
    fn in_range(&self, i: u32) -> bool {
        (i as usize) < self.nodes.len()
    }

    /// Makes sure `n` node slots can be had without failing.
    fn reserve_nodes(&mut self, n: u32) -> Result<()> {
        let mut have = 0;
        let mut v = self.vacant;
        while v != NONE && have < n {
            have += 1;
            v = self.node(v).next_free;
        }
        while have < n {
            let i = self.nodes.len() as u32;
            if i == NONE || self.nodes.try_push(Node::default()).is_err() {
                return Err(Error::CapacityExhausted { capacity: self.nodes.max_len() });
            }
            let vacant = self.vacant;
            let node = self.node_mut(i);
            node.next_free = vacant;
            self.vacant = i;
            self.vacant_len += 1;
            have += 1;
        }
        Ok(())
    }

    /// Makes sure `n` more ranges can be made (by splits or
    /// [`add_range`](Self::add_range)) without running out of metadata: a
    /// caller that must not fail halfway (a pool about to take a chunk from
    /// upstream) asks first.
    ///
    /// # Errors
    ///
    /// [`Error::CapacityExhausted`] if the storage cannot hold `n` more.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::pool::{CoalescingIndex, Node};
    /// use memres_core::storage::ArrayStorage;
    /// let mut index: CoalescingIndex<ArrayStorage<Node, 2>> = CoalescingIndex::new(256);
    /// assert!(index.reserve(2).is_ok());
    /// assert!(index.reserve(3).is_err());
    /// ```
    pub fn reserve(&mut self, n: u32) -> Result<()> {
        self.reserve_nodes(n)
    }

    /// Takes a vacant slot; `reserve_nodes` must have made sure there is one.
    #[inline]
    fn take_vacant(&mut self) -> u32 {
        let i = self.vacant;
        debug_assert!(i != NONE, "take_vacant without reserve_nodes");
        self.vacant = self.node(i).next_free;
        self.vacant_len -= 1;
        i
    }

    /// Puts slot `i` on the vacant list, or retires it if its generation is
    /// used up: a slot taken from the vacant list must be carvable without
    /// moving (`carve` counts on it to stay within two slots).
    #[inline]
    fn make_vacant(&mut self, i: u32) {
        if self.node(i).gen == u32::MAX {
            self.retire(i);
            return;
        }
        let vacant = self.vacant;
        let node = self.node_mut(i);
        node.state = State::Vacant;
        node.next_free = vacant;
        node.prev_free = NONE;
        self.vacant = i;
        self.vacant_len += 1;
    }

    /// Takes slot `i` out of use for good.
    #[cold]
    fn retire(&mut self, i: u32) {
        let node = self.node_mut(i);
        *node = Node {
            state: State::Retired,
            prev_phys: NONE,
            next_phys: NONE,
            prev_free: NONE,
            next_free: NONE,
            size: 0,
            ..*node
        };
    }

    /// Moves free node `i` (in no list, its generation used up) to a vacant
    /// slot and retires `i`, so that no tag of `i` ever matches again: the
    /// price is one slot per 2^32 allocations of one slot. Returns the new
    /// slot. A region's first node stays as the region's header (see
    /// [`State::Retired`]).
    #[cold]
    fn relocate(&mut self, i: u32) -> u32 {
        let j = self.take_vacant();
        let n = *self.node(i);
        let gen = self.node(j).gen;
        *self.node_mut(j) = Node { gen, ..n };
        *self.link_of(n.next_phys, |m| &mut m.prev_phys) = j;
        self.retire(i);
        if n.prev_phys == NONE {
            self.node_mut(j).prev_phys = i;
            self.node_mut(i).next_phys = j;
        } else {
            self.node_mut(n.prev_phys).next_phys = j;
        }
        j
    }

    /// The node where the region whose handle is `first` starts: `first`
    /// itself, or the node after it if `first` is a retired header.
    #[inline]
    fn skip_header(&self, first: u32) -> u32 {
        match self.nodes.get(first as usize) {
            Some(n) if n.state == State::Retired => n.next_phys,
            _ => first,
        }
    }

    #[inline]
    fn insert_free(&mut self, i: u32) {
        let bin = bin_floor(self.node(i).size >> self.shift);
        let head = self.heads[bin];
        {
            let node = self.node_mut(i);
            node.state = State::Free;
            node.bin = bin as u16;
            node.prev_free = NONE;
            node.next_free = head;
        }
        *self.link_of(head, |n| &mut n.prev_free) = i;
        self.heads[bin] = i;
        self.fl_bitmap |= 1 << (bin / SL_COUNT);
        self.sl_bitmap[bin / SL_COUNT] |= 1 << (bin % SL_COUNT);
        self.free_bytes += self.node(i).size;
    }

    #[inline]
    fn remove_free(&mut self, i: u32) {
        let Node { prev_free, next_free, size, bin, .. } = *self.node(i);
        let bin = bin as usize;
        // Which word points at `i`: its predecessor's link or the bin's head.
        let to_i = if prev_free != NONE {
            // SAFETY: `prev_free` is a link (see `node`).
            unsafe { &mut self.nodes.get_unchecked_mut(prev_free as usize).next_free }
        } else {
            &mut self.heads[bin]
        };
        *to_i = next_free;
        *self.link_of(next_free, |n| &mut n.prev_free) = prev_free;
        // Clear the bin's bits if it became empty, without a branch.
        let (fl, sl) = (bin / SL_COUNT, bin % SL_COUNT);
        self.sl_bitmap[fl] &= !(((self.heads[bin] == NONE) as u32) << sl);
        self.fl_bitmap &= !(((self.sl_bitmap[fl] == 0) as u64) << fl);
        self.free_bytes -= size;
    }

    /// The first non-empty bin at or above `bin`, or `None`.
    #[inline]
    fn find_bin_from(&self, bin: usize) -> Option<usize> {
        let (fl, sl) = (bin / SL_COUNT, bin % SL_COUNT);
        if fl >= FL_COUNT {
            return None;
        }
        let row = self.sl_bitmap[fl] & (u32::MAX << sl);
        if row != 0 {
            return Some(fl * SL_COUNT + row.trailing_zeros() as usize);
        }
        let above = if fl + 1 >= 64 { 0 } else { self.fl_bitmap & (u64::MAX << (fl + 1)) };
        if above == 0 {
            return None;
        }
        let fl = above.trailing_zeros() as usize;
        Some(fl * SL_COUNT + self.sl_bitmap[fl].trailing_zeros() as usize)
    }

    /// Adds a free region. Regions are never merged with each other, even
    /// when adjacent: each is given back whole by [`remove_range`](Self::remove_range).
    /// Returns the region's handle: the index of its first node, which names
    /// the region while it lives (if that node is retired, as its header).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if the range is empty or not granule-aligned;
    /// [`Error::CapacityExhausted`] if there is no room for its node.
    pub fn add_range(&mut self, range: Range) -> Result<u32> {
        let g = self.granule();
        if range.is_empty() || range.start() % g != 0 || range.len() % g != 0 {
            return Err(Error::InvalidConfig { what: "region empty or not aligned to the granule" });
        }
        self.reserve_nodes(1)?;
        let i = self.take_vacant();
        let gen = self.node(i).gen;
        *self.node_mut(i) = Node {
            addr: range.start(),
            size: range.len(),
            prev_phys: NONE,
            next_phys: NONE,
            prev_free: NONE,
            next_free: NONE,
            gen,
            bin: 0,
            state: State::Free,
        };
        self.insert_free(i);
        Ok(i)
    }

    /// Whether the region whose first node is `first` is wholly free.
    pub fn is_region_free(&self, first: u32) -> bool {
        let start = self.skip_header(first);
        if !self.in_range(start) {
            return false;
        }
        let n = self.node(start);
        // Either `first` starts the region, or it is the header before it.
        let starts = n.prev_phys == NONE || start != first;
        n.state == State::Free && n.next_phys == NONE && starts
    }

    /// Removes a wholly free region and returns its range.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if the region is not wholly free.
    pub fn remove_range(&mut self, first: u32) -> Result<Range> {
        if !self.is_region_free(first) {
            return Err(Error::InvalidConfig { what: "region is not wholly free" });
        }
        let start = self.skip_header(first);
        let n = *self.node(start);
        self.remove_free(start);
        self.make_vacant(start);
        if start != first {
            // The header goes with its region (it stays retired).
            self.node_mut(first).next_phys = NONE;
        }
        Ok(Range::new(n.addr, n.size).unwrap_or_default())
    }

    /// Allocates `size` bytes (rounded up to the granule) aligned to `align`
    /// (a power of two). `Ok(None)` when no free range fits.
    ///
    /// # Errors
    ///
    /// [`Error::CapacityExhausted`] when the metadata storage is full.
    ///
    /// # Time Complexity
    ///
    /// O(1): at most 8 list entries and two bitmap scans.
    #[inline]
    pub fn allocate(&mut self, size: u64, align: u64) -> Result<Option<Allocation>> {
        debug_assert!(size > 0 && align.is_power_of_two());
        let g_mask = self.granule() - 1;
        let units = (size + g_mask) >> self.shift;
        let align = align.max(self.granule());
        // Worst-case padding to reach the alignment.
        let pad_units = (align >> self.shift) - 1;
        // A split may need two new nodes (front padding and tail).
        if self.vacant_len < 2 {
            self.reserve_nodes(2)?;
        }
        let found = match self.scan_own_bin(units, align) {
            Some(i) => i,
            None => {
                let Some(bin) = self.find_bin_from(bin_ceil(units + pad_units)) else {
                    return Ok(None);
                };
                self.heads[bin]
            }
        };
        Ok(Some(self.carve(found, units << self.shift, align)))
    }

    /// Allocates `size` bytes at `align` from the free range whose node is
    /// `node` (a region's first node, as [`add_range`](Self::add_range)
    /// returns it), whatever its size class. `Ok(None)` if that range is not
    /// free or does not hold the request.
    ///
    /// A pool that grows by a chunk of exactly the bytes a request needs
    /// allocates from it with this: [`allocate`](Self::allocate) looks only
    /// in classes whose every range fits, which a range of exactly the
    /// needed size may be just below.
    ///
    /// # Errors
    ///
    /// [`Error::CapacityExhausted`] when the metadata storage is full.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::pool::CoalescingIndex;
    /// use memres_core::Range;
    /// let mut index: CoalescingIndex = CoalescingIndex::new(256);
    /// // 33 granules: the request (32) plus the worst-case padding (1).
    /// let first = index.add_range(Range::new(256, 33 * 256).unwrap())?;
    /// let a = index.allocate_in(first, 32 * 256, 512)?.unwrap();
    /// assert_eq!(a.addr, 512);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn allocate_in(&mut self, node: u32, size: u64, align: u64) -> Result<Option<Allocation>> {
        debug_assert!(size > 0 && align.is_power_of_two());
        let node = self.skip_header(node);
        let Some(n) = self.nodes.get(node as usize) else { return Ok(None) };
        let bytes = ((size + self.granule() - 1) >> self.shift) << self.shift;
        let align = align.max(self.granule());
        let start = (n.addr + align - 1) & !(align - 1);
        if n.state != State::Free || start + bytes > n.addr + n.size {
            return Ok(None);
        }
        self.reserve_nodes(2)?;
        Ok(Some(self.carve(node, bytes, align)))
    }

    /// Looks at up to `SCAN_LIMIT` ranges of the request's own bin and picks
    /// the smallest that fits (an exact fit at once).
    #[inline]
    fn scan_own_bin(&self, units: u64, align: u64) -> Option<u32> {
        let bytes = units << self.shift;
        let mut i = self.heads[bin_floor(units)];
        let mut best = NONE;
        let mut best_size = u64::MAX;
        let mut seen = 0;
        while i != NONE && seen < SCAN_LIMIT {
            let n = self.node(i);
            let start = (n.addr + align - 1) & !(align - 1);
            let end = n.addr + n.size;
            if start + bytes <= end && n.size < best_size {
                if n.size == bytes {
                    return Some(i);
                }
                best = i;
                best_size = n.size;
            }
            i = n.next_free;
            seen += 1;
        }
        (best != NONE).then_some(best)
    }

    /// Takes `bytes` at `align` out of free node `i`, splitting off the front
    /// padding and the tail as free nodes.
    #[inline]
    fn carve(&mut self, mut i: u32, bytes: u64, align: u64) -> Allocation {
        self.remove_free(i);
        let addr = self.node(i).addr;
        let aligned = (addr + align - 1) & !(align - 1);
        if aligned != addr {
            // The front keeps index `i` (a region's first node never moves).
            let front = i;
            i = self.split_after(front, aligned - addr);
            self.insert_free(front);
        }
        if self.node(i).size > bytes {
            // Off unless built with the planted bug: the tail one granule early.
            let at = if cfg!(memres_plant = "split_off_by_one") { bytes - self.granule() } else { bytes };
            let tail = self.split_after(i, at);
            self.insert_free(tail);
        }
        let gen = match self.node(i).gen.checked_add(1) {
            Some(gen) => gen,
            None => {
                // Its last tag was handed out: move it to a fresh slot. Only
                // a node carved without a front split can get here (a split
                // takes a vacant slot, whose generation is never used up),
                // so with the tail split this takes at most the two slots
                // the callers reserve.
                i = self.relocate(i);
                self.node(i).gen + 1
            }
        };
        let node = self.node_mut(i);
        node.state = State::Used;
        node.gen = gen;
        let tag = ((node.gen as u64) << 32) | i as u64;
        self.used_bytes += bytes;
        self.used_count += 1;
        Allocation { addr: aligned, tag }
    }

    /// Cuts node `i` after `at` bytes; the second part is a new node (not in
    /// any list yet), returned.
    #[inline]
    fn split_after(&mut self, i: u32, at: u64) -> u32 {
        let j = self.take_vacant();
        let n = *self.node(i);
        let gen = self.node(j).gen;
        *self.node_mut(j) = Node {
            addr: n.addr + at,
            size: n.size - at,
            prev_phys: i,
            next_phys: n.next_phys,
            prev_free: NONE,
            next_free: NONE,
            gen,
            bin: 0,
            state: State::Used,
        };
        *self.link_of(n.next_phys, |n| &mut n.prev_phys) = j;
        let node = self.node_mut(i);
        node.size = at;
        node.next_phys = j;
        j
    }

    /// The node a tag names, if it still describes the block at `addr`.
    #[inline]
    fn resolve(&self, tag: u64, addr: u64) -> Option<u32> {
        let i = tag as u32;
        let n = self.nodes.get(i as usize)?;
        let live = matches!(n.state, State::Free | State::Used);
        (n.gen == (tag >> 32) as u32 && n.addr == addr && live).then_some(i)
    }

    /// Frees the range handed out as `tag` at `addr`, of `size` bytes as asked
    /// for at allocation, and merges it with its free neighbours. Returns the
    /// free range it became part of.
    ///
    /// # Errors
    ///
    /// [`Error::DoubleFree`] if the range is free already;
    /// [`Error::UnknownBlock`] if the tag names no range at `addr`;
    /// [`Error::SizeMismatch`] if `size` rounds to another size than the
    /// allocation's. Nothing changes on error.
    ///
    /// # Time Complexity
    ///
    /// O(1).
    #[inline]
    pub fn free(&mut self, tag: u64, addr: u64, size: u64) -> Result<Range> {
        let Some(i) = self.resolve(tag, addr) else {
            return Err(Error::UnknownBlock { addr });
        };
        let n = *self.node(i);
        if n.state == State::Free {
            return Err(Error::DoubleFree { addr });
        }
        let g_mask = self.granule() - 1;
        if (size + g_mask) & !g_mask != n.size {
            return Err(Error::SizeMismatch { addr, expected: n.size, given: size });
        }
        self.used_bytes -= n.size;
        self.used_count -= 1;
        let mut i = i;
        // Off unless built with the planted bug: no merge with the next range.
        let plant = cfg!(memres_plant = "skip_coalesce");
        if n.next_phys != NONE && self.node(n.next_phys).state == State::Free && !plant {
            let j = n.next_phys;
            self.remove_free(j);
            self.absorb_next(i, j);
        }
        let prev = self.node(i).prev_phys;
        if prev != NONE && self.node(prev).state == State::Free {
            self.remove_free(prev);
            self.absorb_next(prev, i);
            i = prev;
        }
        self.insert_free(i);
        let n = self.node(i);
        Ok(Range::new(n.addr, n.size).unwrap_or_default())
    }

    /// Merges node `j` (the next neighbour of `i`) into `i` and vacates `j`.
    #[inline]
    fn absorb_next(&mut self, i: u32, j: u32) {
        let nj = *self.node(j);
        let node = self.node_mut(i);
        node.size += nj.size;
        node.next_phys = nj.next_phys;
        *self.link_of(nj.next_phys, |n| &mut n.prev_phys) = i;
        self.make_vacant(j);
    }

    /// Finds the used node that starts at `addr` in the region whose first
    /// node is `first`, and returns its tag. A walk of the region: the slow
    /// path for callers that only know the address.
    ///
    /// # Time Complexity
    ///
    /// O(number of ranges in the region).
    pub fn find_used(&self, first: u32, addr: u64) -> Option<u64> {
        let first = self.skip_header(first);
        if !self.in_range(first) {
            return None;
        }
        let mut i = first;
        while i != NONE {
            let n = self.node(i);
            if n.addr == addr {
                return (n.state == State::Used).then_some(((n.gen as u64) << 32) | i as u64);
            }
            if n.addr > addr {
                return None;
            }
            i = n.next_phys;
        }
        None
    }

    /// Frees the block at `addr` in the region whose first node is `first`,
    /// found by its address: the slow path when a caller's tag names no
    /// live range. `had_tag` says whether the caller held a tag (one that
    /// no longer matched: its block was freed, and the range now at `addr`
    /// is another's) or only the address ([`Block::NO_TAG`](crate::Block::NO_TAG)).
    ///
    /// # Errors
    ///
    /// [`Error::DoubleFree`] if `addr` is in a free range, or if the caller
    /// held a stale tag for a used range there; [`Error::UnknownBlock`] if no
    /// range starts at `addr`; as [`free`](Self::free) otherwise.
    ///
    /// # Time Complexity
    ///
    /// O(number of ranges in the region).
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::pool::CoalescingIndex;
    /// use memres_core::{Error, Range};
    /// let mut index: CoalescingIndex = CoalescingIndex::new(256);
    /// let first = index.add_range(Range::new(0, 4096).unwrap())?;
    /// let a = index.allocate(1000, 256)?.unwrap();
    /// assert!(matches!(index.free_by_address(first, a.addr, 1000, true), Err(Error::DoubleFree { .. })));
    /// index.free_by_address(first, a.addr, 1000, false)?;
    /// assert!(matches!(index.free_by_address(first, a.addr, 1000, false), Err(Error::DoubleFree { .. })));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn free_by_address(&mut self, first: u32, addr: u64, size: u64, had_tag: bool) -> Result<Range> {
        match self.find_used(first, addr) {
            Some(tag) if !had_tag => self.free(tag, addr, size),
            // A tag that no longer matches: this block was freed before.
            Some(_) => Err(Error::DoubleFree { addr }),
            None if self.is_free_at(first, addr) => Err(Error::DoubleFree { addr }),
            None => Err(Error::UnknownBlock { addr }),
        }
    }

    /// Whether `addr` lies inside a free range of the region whose first node
    /// is `first` (to tell a double free from a foreign address).
    pub fn is_free_at(&self, first: u32, addr: u64) -> bool {
        let first = self.skip_header(first);
        if !self.in_range(first) {
            return false;
        }
        let mut i = first;
        while i != NONE {
            let n = self.node(i);
            if addr >= n.addr && addr - n.addr < n.size {
                return n.state == State::Free;
            }
            i = n.next_phys;
        }
        false
    }

    /// The size of the largest free range.
    ///
    /// # Time Complexity
    ///
    /// O(ranges in the largest non-empty bin): for error reports, not the hot path.
    pub fn largest_free(&self) -> u64 {
        if self.fl_bitmap == 0 {
            return 0;
        }
        let fl = 63 - self.fl_bitmap.leading_zeros() as usize;
        let sl = 31 - self.sl_bitmap[fl].leading_zeros() as usize;
        let mut i = self.heads[fl * SL_COUNT + sl];
        let mut best = 0;
        while i != NONE {
            best = best.max(self.node(i).size);
            i = self.node(i).next_free;
        }
        best
    }

    /// Visits the ranges of the region whose first node is `first`, in address
    /// order, with whether each is free.
    pub fn for_each_in_region(&self, first: u32, mut f: impl FnMut(Range, bool)) {
        let first = self.skip_header(first);
        if !self.in_range(first) {
            return;
        }
        let mut i = first;
        while i != NONE {
            let n = self.node(i);
            f(Range::new(n.addr, n.size).unwrap_or_default(), n.state == State::Free);
            i = n.next_phys;
        }
    }

    /// A node by a link that [`check`](Self::check) has not verified yet.
    fn checked(&self, i: u32) -> core::result::Result<&Node, &'static str> {
        self.nodes.get(i as usize).ok_or("link out of range")
    }

    /// Checks every invariant of the index and returns the first broken one.
    ///
    /// Checked: links are symmetric; every free node is in the bin of its
    /// size and every bin list holds only free nodes; bitmap bits match
    /// non-empty bins; no two free nodes are neighbours (coalescing); physical
    /// neighbours are contiguous; sizes and addresses are granule multiples;
    /// the byte counters equal the sums over the nodes.
    ///
    /// # Time Complexity
    ///
    /// O(nodes): for tests and fuzzing, not the hot path.
    pub fn check(&self) -> core::result::Result<(), &'static str> {
        let g_mask = self.granule() - 1;
        let (mut free, mut used, mut used_n, mut listed) = (0u64, 0u64, 0u64, 0usize);
        for (idx, n) in self.nodes.iter().enumerate() {
            let i = idx as u32;
            match n.state {
                State::Vacant => continue,
                State::Retired => {
                    // A header leads to its region's first range, and back.
                    let header_ok = n.next_phys == NONE
                        || self.checked(n.next_phys).is_ok_and(|m| {
                            m.prev_phys == i
                                && m.addr == n.addr
                                && matches!(m.state, State::Free | State::Used)
                        });
                    if !header_ok || n.prev_phys != NONE || n.size != 0 {
                        return Err("retired slot linked into a region but as its header");
                    }
                    continue;
                }
                State::Free => free += n.size,
                State::Used => {
                    used += n.size;
                    used_n += 1;
                }
            }
            if n.size == 0 || n.size & g_mask != 0 || n.addr & g_mask != 0 {
                return Err("node size or address not a granule multiple");
            }
            if n.next_phys != NONE {
                let m = self.checked(n.next_phys)?;
                if m.prev_phys != i || !matches!(m.state, State::Free | State::Used) {
                    return Err("physical links not symmetric");
                }
                if n.addr + n.size != m.addr {
                    return Err("physical neighbours not contiguous");
                }
                if n.state == State::Free && m.state == State::Free {
                    return Err("free neighbours not coalesced");
                }
            }
            if n.prev_phys != NONE && self.checked(n.prev_phys)?.next_phys != i {
                return Err("physical links not symmetric");
            }
        }
        for bin in 0..BIN_COUNT {
            let (fl, sl) = (bin / SL_COUNT, bin % SL_COUNT);
            let bit = self.sl_bitmap[fl] >> sl & 1 == 1;
            if bit != (self.heads[bin] != NONE) {
                return Err("second-level bitmap does not match bin");
            }
            let mut i = self.heads[bin];
            let mut prev = NONE;
            while i != NONE {
                let n = self.checked(i)?;
                if n.state != State::Free {
                    return Err("non-free node in a bin list");
                }
                if bin_floor(n.size >> self.shift) != bin || n.bin as usize != bin {
                    return Err("free node in the wrong bin");
                }
                if n.prev_free != prev {
                    return Err("bin list links not symmetric");
                }
                listed += 1;
                if listed > self.nodes.len() {
                    return Err("cycle in a bin list");
                }
                prev = i;
                i = n.next_free;
            }
        }
        for fl in 0..FL_COUNT {
            if (self.fl_bitmap >> fl & 1 == 1) != (self.sl_bitmap[fl] != 0) {
                return Err("first-level bitmap does not match its row");
            }
        }
        let vacant = self.nodes.iter().filter(|n| n.state == State::Vacant).count();
        let (mut i, mut on_list) = (self.vacant, 0usize);
        while i != NONE {
            let n = self.checked(i)?;
            if n.state != State::Vacant {
                return Err("non-vacant node on the vacant list");
            }
            on_list += 1;
            if on_list > vacant {
                return Err("cycle in the vacant list");
            }
            i = n.next_free;
        }
        if on_list != vacant || vacant != self.vacant_len as usize {
            return Err("vacant-slot count does not match the nodes");
        }
        let free_nodes = self.nodes.iter().filter(|n| n.state == State::Free).count();
        if listed != free_nodes {
            return Err("free node missing from the bins");
        }
        if free != self.free_bytes || used != self.used_bytes || used_n != self.used_count {
            return Err("byte counters do not match the nodes");
        }
        Ok(())
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

#[cfg(test)]
impl<N: Storage<Node>> CoalescingIndex<N> {
    /// Sets slot `i`'s generation, as 2^32 allocations would: for the tests
    /// of what happens at the end of the generations.
    pub(crate) fn set_generation(&mut self, i: u32, gen: u32) {
        self.node_mut(i).gen = gen;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The index of a tag.
    fn slot(a: Allocation) -> u32 {
        a.tag as u32
    }

    /// A region's first node at the end of its generations: moved, with the
    /// region still named by its handle, and the stale tags of both slots
    /// never free the new owner (before, the generation wrapped and a tag
    /// 2^32 allocations old freed the block of whoever held the slot).
    #[test]
    fn a_used_up_first_node_moves_and_its_stale_tags_never_match() {
        let mut index: CoalescingIndex = CoalescingIndex::new(256);
        let first = index.add_range(Range::new(0, 4096).unwrap()).unwrap();
        let a = index.allocate(4096, 256).unwrap().unwrap();
        assert_eq!(slot(a), first);
        index.free(a.tag, a.addr, 4096).unwrap();
        // As after 2^32 - 2 more allocations of this slot: the next one gets
        // its last generation; the one after that used to wrap to 0, and
        // the next to `a`'s generation.
        index.set_generation(first, u32::MAX - 1);
        for _ in 0..2 {
            let b = index.allocate(4096, 256).unwrap().unwrap();
            index.check().unwrap();
            index.free(b.tag, b.addr, 4096).unwrap();
        }
        let c = index.allocate(4096, 256).unwrap().unwrap();
        assert_eq!(c.addr, a.addr);
        assert_ne!(slot(c), first, "the used-up slot was handed out again");
        assert_eq!(index.free(a.tag, a.addr, 4096), Err(Error::UnknownBlock { addr: 0 }));
        assert_eq!(index.free_by_address(first, a.addr, 4096, true), Err(Error::DoubleFree { addr: 0 }));
        let last_of_first = ((u32::MAX as u64) << 32) | first as u64;
        assert_eq!(index.free(last_of_first, 0, 4096), Err(Error::UnknownBlock { addr: 0 }));
        assert_eq!(index.used_count(), 1);
        index.check().unwrap();
        // The handle still names the region.
        assert_eq!(index.find_used(first, 0), Some(c.tag));
        assert!(!index.is_region_free(first));
        index.free(c.tag, c.addr, 4096).unwrap();
        assert!(index.is_region_free(first) && index.is_free_at(first, 256));
        let mut seen = alloc::vec::Vec::new();
        index.for_each_in_region(first, |r, free| seen.push((r, free)));
        assert_eq!(seen, [(Range::new(0, 4096).unwrap(), true)]);
        assert_eq!(index.remove_range(first), Ok(Range::new(0, 4096).unwrap()));
        index.check().unwrap();
        // The retired slot is never reused; the moved node's slot is.
        let again = index.add_range(Range::new(0, 4096).unwrap()).unwrap();
        assert_ne!(again, first);
        assert_eq!(index.nodes[first as usize].state, State::Retired);
        index.check().unwrap();
    }

    /// The same for a node inside a region, and for a used-up node that a
    /// merge vacates: it is retired, not put on the vacant list.
    #[test]
    fn a_used_up_inner_node_moves_and_a_used_up_vacated_node_retires() {
        let mut index: CoalescingIndex = CoalescingIndex::new(256);
        index.add_range(Range::new(0, 8192).unwrap()).unwrap();
        let front = index.allocate(1024, 256).unwrap().unwrap();
        let a = index.allocate(1024, 256).unwrap().unwrap();
        let inner = slot(a);
        index.free(a.tag, a.addr, 1024).unwrap();
        index.set_generation(inner, u32::MAX);
        let b = index.allocate(1024, 256).unwrap().unwrap();
        assert_eq!(b.addr, a.addr);
        assert_ne!(slot(b), inner);
        assert_eq!(index.nodes[inner as usize].state, State::Retired);
        index.check().unwrap();
        let stale = ((u32::MAX as u64) << 32) | inner as u64;
        assert_eq!(index.free(stale, a.addr, 1024), Err(Error::UnknownBlock { addr: a.addr }));
        assert_eq!(index.used_count(), 2);
        // `b`'s slot at the end of its generations, freed: when the front's
        // free absorbs it, it is retired instead of vacated.
        index.free(b.tag, b.addr, 1024).unwrap();
        index.set_generation(slot(b), u32::MAX);
        index.free(front.tag, front.addr, 1024).unwrap();
        assert_eq!(index.nodes[slot(b) as usize].state, State::Retired);
        index.check().unwrap();
        for _ in 0..8 {
            let x = index.allocate(256, 256).unwrap().unwrap();
            assert!(slot(x) != slot(b) && slot(x) != inner);
        }
        index.check().unwrap();
    }

    /// The class map as TLSF states it: one bin per granule below
    /// `SL_COUNT`, then `SL_COUNT` bins per power of two.
    fn bin_reference(units: u64) -> usize {
        if units < SL_COUNT as u64 {
            units as usize
        } else {
            let e = 63 - units.leading_zeros();
            let fl = (e - SL_BITS + 1) as usize;
            fl * SL_COUNT + ((units >> (e - SL_BITS)) as usize & (SL_COUNT - 1))
        }
    }

    #[test]
    fn branchless_bins_equal_the_reference() {
        let mut rng = crate::testing::SplitMix64::new(7);
        for u in (1..5_000u64).chain((0..100_000).map(|_| rng.next_u64() >> (rng.next_u64() % 64))) {
            let u = u.clamp(1, u64::MAX >> 8);
            assert_eq!(bin_floor(u), bin_reference(u), "units {u}");
        }
    }

    #[test]
    fn bins_are_monotonic_and_ceil_fits() {
        let mut last = 0;
        for u in 1..3_000u64 {
            let b = bin_floor(u);
            assert!(b >= last);
            last = b;
            // Everything in bin_ceil(u) is at least u.
            let c = bin_ceil(u);
            let lower = (1..=u * 2).find(|&v| bin_floor(v) == c).unwrap();
            assert!(lower >= u, "u={u} ceil bin lower bound {lower}");
        }
        assert!(bin_floor(u64::MAX >> 8) < BIN_COUNT);
    }
}
