//! The size classes of the index: 32 bins per power of two, found through
//! a two-level bitmap, and the bin lists of free nodes.

use super::nodes::{Node, State, NONE};
use super::CoalescingIndex;
use crate::storage::Storage;
use crate::Range;

/// log2 of the number of second-level classes per power of two.
pub(super) const SL_BITS: u32 = 5;
pub(super) const SL_COUNT: usize = 1 << SL_BITS;
/// First-level classes: enough for every size in units below 2^64.
pub(super) const FL_COUNT: usize = 64 - SL_BITS as usize + 1;
pub(super) const BIN_COUNT: usize = FL_COUNT * SL_COUNT;

/// The bin of a size in granules, rounded down: every range in a bin is at
/// least the bin's lower bound.
///
/// Sizes below `2 * SL_COUNT` map to themselves (one bin per granule); above,
/// the top `SL_BITS + 1` bits of the size name the bin. Written without a
/// branch: random sizes would mispredict one.
#[inline]
pub(super) fn bin_floor(units: u64) -> usize {
    // `e` is at least SL_BITS; then `units >> s` is below 2 * SL_COUNT.
    let e = 63 - (units | SL_COUNT as u64).leading_zeros();
    let s = e - SL_BITS;
    ((s as usize) << SL_BITS) + (units >> s) as usize
}

/// The first bin whose every range holds `units` granules.
#[inline]
pub(super) fn bin_ceil(units: u64) -> usize {
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
    #[inline]
    pub(super) fn insert_free(&mut self, i: u32) {
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
        self.free_bytes += u128::from(self.node(i).size);
    }

    #[inline]
    pub(super) fn remove_free(&mut self, i: u32) {
        let Node { prev_free, next_free, size, bin, .. } = *self.node(i);
        let bin = bin as usize;
        // Which word points at `i`: its predecessor's link or the bin's head.
        let to_i =
            if prev_free != NONE { &mut self.node_mut(prev_free).next_free } else { &mut self.heads[bin] };
        *to_i = next_free;
        *self.link_of(next_free, |n| &mut n.prev_free) = prev_free;
        // Clear the bin's bits if it became empty, without a branch.
        let (fl, sl) = (bin / SL_COUNT, bin % SL_COUNT);
        self.sl_bitmap[fl] &= !(((self.heads[bin] == NONE) as u32) << sl);
        self.fl_bitmap &= !(((self.sl_bitmap[fl] == 0) as u64) << fl);
        self.free_bytes -= u128::from(size);
    }

    /// The first non-empty bin at or above `bin`, or `None`.
    #[inline]
    pub(super) fn find_bin_from(&self, bin: usize) -> Option<usize> {
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

    /// Visits every free range of at least `min` bytes (and some shorter
    /// ones of the same size class), class by class: the index's free
    /// lists, not its used ranges.
    ///
    /// # Time Complexity
    ///
    /// O(free ranges of `min`'s class and above + classes).
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::index::CoalescingIndex;
    /// use memres_core::Range;
    /// let mut index: CoalescingIndex = CoalescingIndex::new(256);
    /// index.add_range(Range::new(0, 1 << 20).unwrap())?;
    /// let a = index.allocate(1024, 256)?.unwrap();
    /// let b = index.allocate(1024, 256)?.unwrap();
    /// index.free(a.tag, a.addr, 1024)?;
    /// let mut seen = Vec::new();
    /// index.for_each_free_from(4096, |r| seen.push(r));
    /// assert_eq!(seen, [Range::new(2048, (1 << 20) - 2048).unwrap()]);
    /// # index.free(b.tag, b.addr, 1024)?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn for_each_free_from(&self, min: u64, mut f: impl FnMut(Range)) {
        let mut bin = self.find_bin_from(bin_floor(min.max(1) >> self.shift));
        while let Some(b) = bin {
            let mut i = self.heads[b];
            while i != NONE {
                let n = self.node(i);
                f(Range::new(n.addr, n.size).unwrap_or_default());
                i = n.next_free;
            }
            bin = self.find_bin_from(b + 1);
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for u in (1..5_000u64)
            .chain((0..crate::testing::steps(100_000)).map(|_| rng.next_u64() >> (rng.next_u64() % 64)))
        {
            let u = u.clamp(1, u64::MAX >> 8);
            assert_eq!(bin_floor(u), bin_reference(u), "units {u}");
        }
    }

    #[test]
    fn bins_are_monotonic_and_ceil_fits() {
        let mut last = 0;
        // Quadratic: under Miri the first eight powers of two.
        for u in 1..if cfg!(miri) { 300 } else { 3_000u64 } {
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
