//! The index's operations: regions, allocate (class search and carving),
//! free (coalescing), and the slow paths that find a block by its address.

use super::bins::{bin_ceil, bin_floor};
use super::nodes::{Node, State, NONE};
use super::{Allocation, CoalescingIndex};
use crate::plant;
use crate::storage::Storage;
use crate::{Error, Range, Request, Result};

/// How many blocks of the request's own class (and, where asked, of the
/// class of its size plus the worst padding) are looked at for a fit before
/// falling back to a class that fits by construction; a range beyond them
/// is found only by `allocate_exhaustive`, the last resort.
const SCAN_LIMIT: u32 = 8;

/// Refuses what the index cannot carve: a size of 0 or above
/// [`Request::MAX_SIZE`], an alignment not a power of two or above
/// [`Request::MAX_ALIGN`]. Within these, no rounding or padding overflows.
/// One branch on the hot path; the error is made out of line.
#[inline(always)]
fn check_request(size: u64, align: u64) -> Result<()> {
    let bad_size = size.wrapping_sub(1) >= Request::MAX_SIZE;
    let bad_align = align & align.wrapping_sub(1) != 0 || align.wrapping_sub(1) >= Request::MAX_ALIGN;
    if bad_size | bad_align {
        return Err(request_error(size, align));
    }
    Ok(())
}

/// `check_request` for a block of `size` bytes that takes `class`: a size
/// of zero is refused as `allocate` refuses it, whatever the class.
#[inline(always)]
fn check_class(size: u64, class: u64, align: u64) -> Result<()> {
    check_request(size, align)?;
    if class < size {
        return Err(Error::InvalidSize { size: class, what: "a size class below the size it serves" });
    }
    check_request(class, align)
}

#[cold]
#[inline(never)]
fn request_error(size: u64, align: u64) -> Error {
    match Request::aligned(size, align) {
        Err(e) => e,
        Ok(_) => Error::InvalidSize { size, what: "zero bytes" },
    }
}

/// How far `addr` is below the next multiple of `align` (a power of two):
/// the front padding, computed without the `addr + align - 1` that
/// overflows near the top of the address space. For a checked request,
/// `pad_to(..) + bytes` does not overflow either: the pad is below 2^40
/// (or 0 when the alignment is the granule: addresses are its multiples)
/// and the rounded size is at most 2^63.
#[inline(always)]
fn pad_to(addr: u64, align: u64) -> u64 {
    addr.wrapping_neg() & (align - 1)
}

impl<N: Storage<Node>> CoalescingIndex<N> {
    /// Adds a free region. Regions are never merged with each other, even
    /// when adjacent: each is given back whole by [`remove_range`](Self::remove_range).
    /// Returns the region's handle: the index of its first node, which names
    /// the region while it lives (if that node is retired, as its header).
    ///
    /// The range must not overlap a region already added: the index cannot
    /// tell in O(1), and would hand out the shared addresses twice (its own
    /// lists stay consistent, and its byte counts exact: they are kept in
    /// 128 bits and read saturated, as overlapping regions may hold more
    /// than `u64::MAX` bytes).
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
        self.region_start(first).is_some_and(|start| {
            let n = self.node(start);
            n.state == State::Free && n.next_phys == NONE
        })
    }

    /// The first range of the region whose handle is `first`, or `None` if
    /// `first` names no region: out of range, a vacant slot (its links are
    /// stale), a retired slot that heads no region, or a range inside one.
    /// The public walks start here: from any other node they would follow
    /// links that need not end.
    fn region_start(&self, first: u32) -> Option<u32> {
        let start = self.skip_header(first);
        let n = self.nodes.get(start as usize)?;
        // Either `first` starts the region, or it is the retired header
        // before it (`skip_header` moved past it).
        let starts = n.prev_phys == NONE || start != first;
        (matches!(n.state, State::Free | State::Used) && starts).then_some(start)
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
    /// [`Error::InvalidSize`] if `size` is 0 or above [`Request::MAX_SIZE`];
    /// [`Error::InvalidAlignment`] if `align` is not a power of two or is
    /// above [`Request::MAX_ALIGN`]; [`Error::CapacityExhausted`] when the
    /// metadata storage is full. Nothing changes on error.
    ///
    /// # Time Complexity
    ///
    /// O(1): at most 8 list entries and two bitmap scans.
    #[inline]
    pub fn allocate(&mut self, size: u64, align: u64) -> Result<Option<Allocation>> {
        let Some(found) = self.find_fit(size, align, false)? else { return Ok(None) };
        Ok(Some(self.carve(found, size, self.bytes_of(size), align.max(self.granule()))))
    }

    /// [`allocate`](Self::allocate), also returning the free range the
    /// allocation was carved from: the nearest live ranges below and above
    /// the allocation end and begin at its ends, or the region does.
    ///
    /// The virtual pool learns from it whether a new block shares a granule
    /// with a live one.
    ///
    /// # Errors
    ///
    /// As `allocate`.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::index::CoalescingIndex;
    /// use memres_core::Range;
    /// let mut index: CoalescingIndex = CoalescingIndex::new(256);
    /// index.add_range(Range::new(0, 4096).unwrap())?;
    /// let (a, from) = index.allocate_with_range(1024, 256)?.unwrap();
    /// assert_eq!((a.addr, from), (0, Range::new(0, 4096).unwrap()));
    /// let (b, from) = index.allocate_with_range(1024, 256)?.unwrap();
    /// assert_eq!((b.addr, from), (1024, Range::new(1024, 3072).unwrap()));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    #[inline]
    pub fn allocate_with_range(&mut self, size: u64, align: u64) -> Result<Option<(Allocation, Range)>> {
        let Some(found) = self.find_fit(size, align, false)? else { return Ok(None) };
        let n = *self.node(found);
        let a = self.carve(found, size, self.bytes_of(size), align.max(self.granule()));
        Ok(Some((a, Range::new(n.addr, n.size).unwrap_or_default())))
    }

    /// [`allocate`](Self::allocate) that looks at every range of the classes
    /// that may hold the request, not only the first ones: `Ok(None)` only
    /// when no free range fits. The last resort of a caller that cannot add
    /// a range (at its maximum), after `allocate` found none: it is not
    /// O(1), so the hot path never takes it.
    ///
    /// # Errors
    ///
    /// As [`allocate`](Self::allocate).
    ///
    /// # Time Complexity
    ///
    /// O(free ranges in the classes from the request's own up to the first
    /// whose every range fits it) plus a bitmap scan per class.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::index::CoalescingIndex;
    /// use memres_core::Range;
    /// let mut index: CoalescingIndex = CoalescingIndex::new(256);
    /// // Ten ranges of one class (64 and 65 granules), kept apart; only the
    /// // first added fits.
    /// for k in 0..10u64 {
    ///     index.add_range(Range::new(k << 20, if k == 0 { 65 * 256 } else { 64 * 256 }).unwrap())?;
    /// }
    /// assert_eq!(index.allocate(65 * 256, 256)?, None); // the search stops at 8
    /// assert_eq!(index.allocate_exhaustive(65 * 256, 256)?.unwrap().addr, 0);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn allocate_exhaustive(&mut self, size: u64, align: u64) -> Result<Option<Allocation>> {
        let Some(found) = self.find_exhaustive(size, align)? else { return Ok(None) };
        Ok(Some(self.carve(found, size, self.bytes_of(size), align.max(self.granule()))))
    }

    /// [`allocate_exhaustive`](Self::allocate_exhaustive) of `size` bytes
    /// that takes `class` bytes, as [`allocate_class`](Self::allocate_class):
    /// the last resort of a caller that hands out size classes.
    ///
    /// # Errors
    ///
    /// As [`allocate_class`](Self::allocate_class).
    ///
    /// # Time Complexity
    ///
    /// As [`allocate_exhaustive`](Self::allocate_exhaustive) for `class`.
    pub fn allocate_class_exhaustive(
        &mut self,
        size: u64,
        class: u64,
        align: u64,
    ) -> Result<Option<Allocation>> {
        check_class(size, class, align)?;
        let Some(found) = self.find_exhaustive(class, align)? else { return Ok(None) };
        Ok(Some(self.carve(found, size, self.bytes_of(class), align.max(self.granule()))))
    }

    /// [`allocate_exhaustive`](Self::allocate_exhaustive), also returning
    /// the free range the allocation was carved from, as
    /// [`allocate_with_range`](Self::allocate_with_range): the last resort
    /// of the virtual pool.
    ///
    /// # Errors
    ///
    /// As [`allocate`](Self::allocate).
    ///
    /// # Time Complexity
    ///
    /// As `allocate_exhaustive`.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::index::CoalescingIndex;
    /// use memres_core::Range;
    /// let mut index: CoalescingIndex = CoalescingIndex::new(256);
    /// // Ten ranges of one class, kept apart; only the first added fits.
    /// for k in 0..10u64 {
    ///     index.add_range(Range::new(k << 20, if k == 0 { 65 * 256 } else { 64 * 256 }).unwrap())?;
    /// }
    /// let (a, from) = index.allocate_exhaustive_with_range(65 * 256, 256)?.unwrap();
    /// assert_eq!((a.addr, from), (0, Range::new(0, 65 * 256).unwrap()));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn allocate_exhaustive_with_range(
        &mut self,
        size: u64,
        align: u64,
    ) -> Result<Option<(Allocation, Range)>> {
        let Some(found) = self.find_exhaustive(size, align)? else { return Ok(None) };
        let n = *self.node(found);
        let a = self.carve(found, size, self.bytes_of(size), align.max(self.granule()));
        Ok(Some((a, Range::new(n.addr, n.size).unwrap_or_default())))
    }

    /// The free range `allocate_exhaustive` carves from, with two vacant
    /// nodes ready for the carve; `None` if none fits.
    fn find_exhaustive(&mut self, size: u64, align: u64) -> Result<Option<u32>> {
        let (units, align, pad_units) = self.prepare_fit(size, align)?;
        // Below `ceil` a range fits or not by its size and address: look at
        // them all, smaller classes first (the best fit, as `scan_bin`).
        let ceil = bin_ceil(units + pad_units);
        let mut bin = self.find_bin_from(bin_floor(units));
        let mut found = None;
        while let Some(b) = bin.filter(|&b| b < ceil) {
            found = self.best_in_bin(b, units, align, u32::MAX);
            if found.is_some() {
                break;
            }
            bin = self.find_bin_from(b + 1);
        }
        Ok(found.or_else(|| self.find_bin_from(ceil).map(|b| self.heads[b])))
    }

    /// [`allocate`](Self::allocate) from a free range of at most `longest`
    /// bytes: `Ok(None)` when the range it would carve is longer (a pool
    /// keeps a large block's chunk for a request of about its size).
    ///
    /// For an alignment above the granule it also looks at the class of
    /// `size` plus the worst padding, which `allocate` skips: a range just
    /// long enough for the request at any address (the chunk a pool grows
    /// for it) is found again, within the scan limit of its class.
    ///
    /// # Errors
    ///
    /// As [`allocate`](Self::allocate).
    ///
    /// # Time Complexity
    ///
    /// O(1): at most 16 list entries and two bitmap scans.
    #[inline]
    pub fn allocate_from_at_most(
        &mut self,
        size: u64,
        align: u64,
        longest: u64,
    ) -> Result<Option<Allocation>> {
        let Some(found) = self.find_fit(size, align, true)? else { return Ok(None) };
        if self.node(found).size > longest {
            return Ok(None);
        }
        Ok(Some(self.carve(found, size, self.bytes_of(size), align.max(self.granule()))))
    }

    /// [`allocate`](Self::allocate) of `size` bytes that takes `class` bytes
    /// (rounded up to the granule; at least `size`), for a caller that hands
    /// out size classes. A free states `size`, as for any allocation.
    ///
    /// # Errors
    ///
    /// As [`allocate`](Self::allocate) for `size`, then for `class`;
    /// [`Error::InvalidSize`] for a `class` below `size`.
    ///
    /// ```
    /// use memres_core::index::CoalescingIndex;
    /// use memres_core::Range;
    /// let mut index: CoalescingIndex = CoalescingIndex::new(256);
    /// index.add_range(Range::new(0, 4096).unwrap())?;
    /// let a = index.allocate_class(300, 1024, 256)?.unwrap();
    /// assert_eq!(index.used_bytes(), 1024);
    /// assert!(index.free(a.tag, a.addr, 1024).is_err());
    /// index.free(a.tag, a.addr, 300)?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    #[inline]
    pub fn allocate_class(&mut self, size: u64, class: u64, align: u64) -> Result<Option<Allocation>> {
        check_class(size, class, align)?;
        let Some(found) = self.find_fit(class, align, false)? else { return Ok(None) };
        Ok(Some(self.carve(found, size, self.bytes_of(class), align.max(self.granule()))))
    }

    /// `size` rounded up to the granule; `size` passed `check_request`, so
    /// this does not overflow.
    #[inline(always)]
    fn bytes_of(&self, size: u64) -> u64 {
        ((size + self.granule() - 1) >> self.shift) << self.shift
    }

    /// What a search for `size` bytes at `align` works with, once the
    /// request is checked: its granules, its alignment (at least the
    /// granule) and the granules of the worst-case padding, with two
    /// vacant nodes ready for the carve.
    #[inline(always)]
    fn prepare_fit(&mut self, size: u64, align: u64) -> Result<(u64, u64, u64)> {
        check_request(size, align)?;
        let units = (size + self.granule() - 1) >> self.shift;
        let align = align.max(self.granule());
        // Worst-case padding to reach the alignment.
        let pad_units = (align >> self.shift) - 1;
        // A split may need two new nodes (front padding and tail).
        if self.vacant_len < 2 {
            self.reserve_nodes(2)?;
        }
        Ok((units, align, pad_units))
    }

    /// The free range `allocate` carves `size` bytes at `align` from, with
    /// two vacant nodes ready for the carve; `None` if none fits. With
    /// `padded_class`, as `allocate_from_at_most` searches.
    #[inline(always)]
    fn find_fit(&mut self, size: u64, align: u64, padded_class: bool) -> Result<Option<u32>> {
        let (units, align, pad_units) = self.prepare_fit(size, align)?;
        let own = bin_floor(units);
        // With `padded_class`: the bin of a range just long enough at the
        // worst padding, when neither the own bin's scan nor the bins that
        // fit by construction cover it.
        let padded = bin_floor(units + pad_units);
        let ceil = bin_ceil(units + pad_units);
        let scan_padded = padded_class && padded != own && padded < ceil;
        let found = self.scan_bin(own, units, align).or_else(|| {
            if scan_padded {
                self.scan_bin(padded, units, align)
            } else {
                None
            }
        });
        Ok(found.or_else(|| self.find_bin_from(ceil).map(|bin| self.heads[bin])))
    }

    /// Moves `a`, an allocation of `size` bytes at `align` not yet handed
    /// out, to the first place that `fits` accepts (`fits(addr, free)` for
    /// the block at `addr` in the free range `free`), if any; else it stays
    /// where it is. It takes the bytes it took before (its class, for one
    /// of [`allocate_class`](Self::allocate_class)). The places,
    /// with `a` freed: the ranges of the request's own class that fit, then
    /// those of the classes above, smaller classes first (at most `tries`
    /// ranges looked at), each at its start, then at its end. Either way
    /// the allocation has a new tag.
    ///
    /// The virtual pool moves a small block that would map a new granule to
    /// a place where a live neighbour keeps its granule mapped: the ragged
    /// end of a free range.
    ///
    /// # Errors
    ///
    /// As [`allocate`](Self::allocate) for `size` and `align`;
    /// [`Error::InvalidAlignment`] if `a` is not at `align` (it was placed
    /// at a smaller one); the errors of [`free`](Self::free) if `a` is not
    /// live with `size`. Nothing changed then.
    ///
    /// # Panics
    ///
    /// Only if `fits` panics; `a` is free then (the index stays consistent).
    ///
    /// # Time Complexity
    ///
    /// O(`tries`) calls of `fits`, plus two bitmap scans per class looked at.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::index::CoalescingIndex;
    /// use memres_core::Range;
    /// let mut index: CoalescingIndex = CoalescingIndex::new(256);
    /// index.add_range(Range::new(0, 4096).unwrap())?;
    /// let a = index.allocate(1024, 256)?.unwrap();
    /// let a = index.move_where(a, 1024, 256, 4, |addr, free| addr >= 2048 && free.len() == 4096)?;
    /// assert_eq!(a.addr, 3072); // the range's end: its start was refused
    /// let a = index.move_where(a, 1024, 256, 4, |addr, _| addr == 1024)?;
    /// assert_eq!(a.addr, 3072); // 1024 was never offered: it stays
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn move_where(
        &mut self,
        a: Allocation,
        size: u64,
        align: u64,
        tries: u32,
        mut fits: impl FnMut(u64, Range) -> bool,
    ) -> Result<Allocation> {
        check_request(size, align)?;
        let align = align.max(self.granule());
        if a.addr & (align - 1) != 0 {
            // Its own place, where it stays if no other is accepted, would
            // not be at `align`.
            return Err(Error::InvalidAlignment { align });
        }
        // A carve needs two nodes at most, wherever it goes.
        if self.vacant_len < 2 {
            self.reserve_nodes(2)?;
        }
        // The bytes `a` takes go with it: its class, for one of
        // `allocate_class`. Read before the free, which refuses a tag that
        // names no used range (then this is never used).
        let bytes = self.resolve(a.tag, a.addr).map_or(0, |i| self.node(i).size);
        let home = self.free_node(a.tag, a.addr, size)?;
        let units = bytes >> self.shift;
        let mut left = tries;
        let mut bin = self.find_bin_from(bin_floor(units));
        while let Some(b) = bin.filter(|_| left > 0) {
            let mut i = self.heads[b];
            while i != NONE && left > 0 {
                let n = *self.node(i);
                let pad = pad_to(n.addr, align);
                if pad + bytes <= n.size {
                    let start = n.addr + pad;
                    // At or above `start`, which is aligned and leaves room.
                    let end = (n.addr + n.size - bytes) & !(align - 1);
                    let places = 1 + (end != start) as usize;
                    let free = Range::new(n.addr, n.size).unwrap_or_default();
                    if let Some(at) = [start, end].into_iter().take(places).find(|&at| fits(at, free)) {
                        return Ok(self.carve_at(i, at, size, bytes));
                    }
                }
                left -= 1;
                i = n.next_free;
            }
            bin = self.find_bin_from(b + 1);
        }
        // The range that took `a` back holds its place.
        Ok(self.carve_at(home, a.addr, size, bytes))
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
    /// As [`allocate`](Self::allocate).
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::index::CoalescingIndex;
    /// use memres_core::Range;
    /// let mut index: CoalescingIndex = CoalescingIndex::new(256);
    /// // 33 granules: the request (32) plus the worst-case padding (1).
    /// let first = index.add_range(Range::new(256, 33 * 256).unwrap())?;
    /// let a = index.allocate_in(first, 32 * 256, 512)?.unwrap();
    /// assert_eq!(a.addr, 512);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn allocate_in(&mut self, node: u32, size: u64, align: u64) -> Result<Option<Allocation>> {
        self.allocate_class_in(node, size, size, align)
    }

    /// [`allocate_in`](Self::allocate_in) of `size` bytes that takes `class`
    /// bytes, as [`allocate_class`](Self::allocate_class): an arena carves a
    /// small block from the superblock it just took with it.
    ///
    /// # Errors
    ///
    /// As [`allocate_class`](Self::allocate_class).
    ///
    /// ```
    /// use memres_core::index::CoalescingIndex;
    /// use memres_core::Range;
    /// let mut index: CoalescingIndex = CoalescingIndex::new(256);
    /// let first = index.add_range(Range::new(0, 4096).unwrap())?;
    /// let a = index.allocate_class_in(first, 300, 1024, 256)?.unwrap();
    /// assert_eq!((a.addr, index.used_bytes()), (0, 1024));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn allocate_class_in(
        &mut self,
        node: u32,
        size: u64,
        class: u64,
        align: u64,
    ) -> Result<Option<Allocation>> {
        check_class(size, class, align)?;
        let node = self.skip_header(node);
        let bytes = self.bytes_of(class);
        let Some(n) = self.nodes.get(node as usize) else { return Ok(None) };
        let align = align.max(self.granule());
        if n.state != State::Free || pad_to(n.addr, align) + bytes > n.size {
            return Ok(None);
        }
        self.reserve_nodes(2)?;
        Ok(Some(self.carve(node, size, bytes, align)))
    }

    /// Looks at up to `SCAN_LIMIT` ranges of `bin` and picks the smallest
    /// that holds `units` granules at `align` (an exact fit at once).
    #[inline]
    fn scan_bin(&self, bin: usize, units: u64, align: u64) -> Option<u32> {
        self.best_in_bin(bin, units, align, SCAN_LIMIT)
    }

    /// Looks at up to `limit` ranges of `bin` and picks the smallest that
    /// holds `units` granules at `align` (an exact fit at once).
    #[inline(always)]
    fn best_in_bin(&self, bin: usize, units: u64, align: u64, limit: u32) -> Option<u32> {
        let bytes = units << self.shift;
        let mut i = self.heads[bin];
        let mut best = NONE;
        let mut best_size = u64::MAX;
        let mut seen = 0;
        while i != NONE && seen < limit {
            let n = self.node(i);
            if pad_to(n.addr, align) + bytes <= n.size && n.size < best_size {
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

    /// Takes `bytes` (a multiple of the granule, at least `size`, the size
    /// asked for) at `align` out of free node `i`, splitting off the front
    /// padding and the tail as free nodes.
    #[inline]
    fn carve(&mut self, i: u32, size: u64, bytes: u64, align: u64) -> Allocation {
        let addr = self.node(i).addr;
        self.carve_at(i, addr + pad_to(addr, align), size, bytes)
    }

    /// Takes `bytes` (as for [`carve`](Self::carve)) at `aligned` out of
    /// free node `i`, which holds them, splitting off what is left before
    /// and after as free nodes.
    #[inline]
    fn carve_at(&mut self, mut i: u32, aligned: u64, size: u64, bytes: u64) -> Allocation {
        let n = *self.node(i);
        // Checked before anything changes: a carve outside the range would
        // hand out addresses that are not free. The callers prove it holds.
        // One comparison: below `addr`, `front` wraps past any size.
        let front = aligned.wrapping_sub(n.addr);
        assert!(
            front as u128 + bytes as u128 <= n.size as u128,
            "carve of {bytes} at {aligned} outside its range"
        );
        self.remove_free(i);
        if front != 0 {
            // The front keeps index `i` (a region's first node never moves).
            let front_node = i;
            i = self.split_after(front_node, front);
            self.insert_free(front_node);
        }
        if self.node(i).size > bytes {
            let at = if plant::SPLIT_OFF_BY_ONE { bytes - self.granule() } else { bytes };
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
        Node::set_rounding(node, bytes - size);
        let tag = ((node.gen as u64) << 32) | i as u64;
        self.used_bytes += u128::from(bytes);
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
    /// [`Error::SizeMismatch`] if `size` is not the size the allocation
    /// asked for. Nothing changes on error.
    ///
    /// # Time Complexity
    ///
    /// O(1).
    #[inline]
    pub fn free(&mut self, tag: u64, addr: u64, size: u64) -> Result<Range> {
        let i = self.free_node(tag, addr, size)?;
        let n = self.node(i);
        Ok(Range::new(n.addr, n.size).unwrap_or_default())
    }

    /// [`free`](Self::free), returning the free node that holds the range.
    #[inline]
    fn free_node(&mut self, tag: u64, addr: u64, size: u64) -> Result<u32> {
        let Some(i) = self.resolve(tag, addr) else {
            return Err(Error::UnknownBlock { addr });
        };
        let n = *self.node(i);
        if n.state == State::Free {
            return Err(Error::DoubleFree { addr });
        }
        // The size asked for, exactly: an adaptor above counts off the size
        // a free states, so one that rounds the same would leave it off.
        let asked = n.size - n.rounding();
        if size != asked {
            return Err(Error::SizeMismatch { addr, expected: asked, given: size });
        }
        self.used_bytes -= u128::from(n.size);
        self.used_count -= 1;
        let mut i = i;
        if n.next_phys != NONE && self.node(n.next_phys).state == State::Free && !plant::SKIP_COALESCE {
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
        Ok(i)
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
    /// path for callers that only know the address. `None` where `first`
    /// names no region (out of range, a slot that is vacant or was never
    /// used, a range inside a region).
    ///
    /// # Time Complexity
    ///
    /// O(number of ranges in the region).
    pub fn find_used(&self, first: u32, addr: u64) -> Option<u64> {
        let (i, n) = self.region(first).find(|(_, n)| n.addr >= addr)?;
        (n.addr == addr && n.state == State::Used).then_some(((n.gen as u64) << 32) | i as u64)
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
    /// range starts at `addr`, or `first` names no region (out of range, a
    /// slot that is vacant or was never used, a range inside a region); as
    /// [`free`](Self::free) otherwise. Nothing changes on error.
    ///
    /// # Time Complexity
    ///
    /// O(number of ranges in the region).
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::index::CoalescingIndex;
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
    /// is `first` (to tell a double free from a foreign address); false
    /// where `first` names no region (out of range, a slot that is vacant or
    /// was never used, a range inside a region).
    pub fn is_free_at(&self, first: u32, addr: u64) -> bool {
        self.region(first)
            .find(|(_, n)| addr >= n.addr && addr - n.addr < n.size)
            .is_some_and(|(_, n)| n.state == State::Free)
    }

    /// Visits the ranges of the region whose first node is `first`, in address
    /// order, with whether each is free. Visits none where `first` names no
    /// region: out of range, a slot that is vacant or was never used (one
    /// that [`reserve`](Self::reserve) made), a range inside a region.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::index::CoalescingIndex;
    /// use memres_core::Range;
    /// let mut index: CoalescingIndex = CoalescingIndex::new(256);
    /// index.reserve(1)?; // slot 0: vacant, no region starts there
    /// let mut visits = 0;
    /// index.for_each_in_region(0, |_, _| visits += 1);
    /// assert_eq!(visits, 0);
    /// let first = index.add_range(Range::new(0, 4096).unwrap())?;
    /// let _a = index.allocate(1024, 256)?.unwrap();
    /// let b = index.allocate(1024, 256)?.unwrap();
    /// let mut ranges = Vec::new();
    /// index.for_each_in_region(first, |r, free| ranges.push((r.start(), free)));
    /// assert_eq!(ranges, [(0, false), (1024, false), (2048, true)]);
    /// // `b`'s node lies inside the region: no region starts there.
    /// index.for_each_in_region(b.tag as u32, |_, _| visits += 1);
    /// assert_eq!(visits, 0);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn for_each_in_region(&self, first: u32, mut f: impl FnMut(Range, bool)) {
        for (_, n) in self.region(first) {
            f(Range::new(n.addr, n.size).unwrap_or_default(), n.state == State::Free);
        }
    }

    /// The nodes of the region whose first node is `first`, in address
    /// order, with their indices (none for a handle that names no region,
    /// see [`region_start`](Self::region_start)).
    fn region(&self, first: u32) -> impl Iterator<Item = (u32, &Node)> + '_ {
        let mut i = self.region_start(first).unwrap_or(NONE);
        core::iter::from_fn(move || {
            if i == NONE {
                return None;
            }
            let (at, n) = (i, self.node(i));
            i = n.next_phys;
            Some((at, n))
        })
    }
}
