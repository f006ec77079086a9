//! A bitmap with operations on ranges of bits, a word at a time.

use alloc::vec::Vec;

/// One bit per slot, packed in words.
#[derive(Clone, Debug, Default)]
pub(super) struct Bits(Vec<u64>);

/// The bits of word `w` that fall in `lo..hi`.
#[inline(always)]
fn mask(w: usize, lo: usize, hi: usize) -> u64 {
    let from = lo.saturating_sub(w * 64);
    let to = (hi - w * 64).min(64);
    (u64::MAX >> (64 - (to - from))) << from
}

impl Bits {
    /// Room for at least `n` bits; those added are clear.
    ///
    /// # Errors
    ///
    /// The host has not the memory: nothing changes.
    pub(super) fn grow(&mut self, n: usize) -> Result<(), alloc::collections::TryReserveError> {
        let words = n.div_ceil(64);
        if let Some(more) = words.checked_sub(self.0.len()) {
            self.0.try_reserve_exact(more)?;
            self.0.resize(words, 0);
        }
        Ok(())
    }

    /// The words it holds (what a test reads of its host memory).
    #[cfg(test)]
    pub(super) fn words(&self) -> usize {
        self.0.len()
    }

    /// Bit `i`.
    #[inline]
    pub(super) fn get(&self, i: u32) -> bool {
        self.0[i as usize / 64] >> (i % 64) & 1 == 1
    }

    /// Sets the bits of `lo..hi` (non-empty) to `to`.
    #[inline]
    pub(super) fn set(&mut self, lo: u32, hi: u32, to: bool) {
        let (lo, hi) = (lo as usize, hi as usize);
        if lo / 64 == (hi - 1) / 64 {
            // Most blocks lie in a granule or two: one word, no loop.
            let m = mask(lo / 64, lo, hi);
            let w = &mut self.0[lo / 64];
            *w = if to { *w | m } else { *w & !m };
            return;
        }
        for w in lo / 64..=(hi - 1) / 64 {
            let m = mask(w, lo, hi);
            self.0[w] = if to { self.0[w] | m } else { self.0[w] & !m };
        }
    }

    /// The first bit in `lo..hi` that is `want`, or `hi` if none is.
    #[inline]
    pub(super) fn find(&self, lo: u32, hi: u32, want: bool) -> u32 {
        let (mut i, hi) = (lo as usize, hi as usize);
        while i < hi {
            let word = if want { self.0[i / 64] } else { !self.0[i / 64] };
            let rest = word >> (i % 64);
            if rest != 0 {
                return (i + rest.trailing_zeros() as usize).min(hi) as u32;
            }
            i = (i / 64 + 1) * 64;
        }
        hi as u32
    }

    /// The last bit in `lo..hi` that is `want`, if one is.
    pub(super) fn find_back(&self, lo: u32, hi: u32, want: bool) -> Option<u32> {
        let (lo, mut i) = (lo as usize, hi as usize);
        while i > lo {
            let w = (i - 1) / 64;
            let word = if want { self.0[w] } else { !self.0[w] };
            // The bits of word `w` below `i`.
            let below = word & (u64::MAX >> (63 - (i - 1) % 64));
            if below != 0 {
                let at = w * 64 + 63 - below.leading_zeros() as usize;
                return (at >= lo).then_some(at as u32);
            }
            i = w * 64;
        }
        None
    }

    /// Whether every bit of `lo..hi` (non-empty) is set.
    #[inline(always)]
    pub(super) fn all(&self, lo: u32, hi: u32) -> bool {
        let (l, h) = (lo as usize, hi as usize);
        (l / 64..=(h - 1) / 64).all(|w| {
            let m = mask(w, l, h);
            self.0[w] & m == m
        })
    }

    /// Clears every bit.
    pub(super) fn clear(&mut self) {
        self.0.fill(0);
    }

    /// How many bits of `lo..hi` are set.
    pub(super) fn count(&self, lo: u32, hi: u32) -> u32 {
        let (lo, hi) = (lo as usize, hi as usize);
        if lo >= hi {
            return 0;
        }
        (lo / 64..=(hi - 1) / 64).map(|w| (self.0[w] & mask(w, lo, hi)).count_ones()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::Bits;

    /// Room for fewer bits than it has takes none away, and memory the
    /// host cannot give (2^61 bytes) is an error that changes nothing.
    #[test]
    fn growth_keeps_every_bit_and_growth_the_host_cannot_hold_changes_nothing() {
        let mut b = Bits::default();
        b.grow(300).unwrap();
        b.set(250, 260, true);
        b.grow(10).unwrap();
        assert_eq!((b.0.len(), b.count(0, 300)), (5, 10));
        // Not under Miri: it ends the interpreter at an allocation it
        // cannot make, and the path is safe code.
        #[cfg(not(miri))]
        assert!(b.grow(usize::MAX).is_err());
        assert_eq!((b.0.len(), b.count(0, 300)), (5, 10));
    }

    #[test]
    fn ranges_across_words() {
        let mut b = Bits::default();
        b.grow(300).unwrap();
        b.set(3, 200, true);
        b.set(64, 128, false);
        let naive = |i: u32| (3..64).contains(&i) || (128..200).contains(&i);
        for i in 0..300 {
            assert_eq!(b.get(i), naive(i), "bit {i}");
        }
        assert_eq!((b.count(0, 300), b.count(60, 130), b.count(5, 5)), (61 + 72, 4 + 2, 0));
        assert_eq!((b.find(0, 300, true), b.find(10, 300, false), b.find(64, 300, true)), (3, 64, 128));
        assert_eq!((b.find(200, 300, true), b.find(70, 100, true), b.find(3, 50, false)), (300, 100, 50));
        let all = [(3, 64), (3, 4), (130, 200), (60, 64), (3, 65), (128, 129), (2, 3), (63, 129)];
        for (lo, hi) in all {
            assert_eq!(b.all(lo, hi), (lo..hi).all(naive), "{lo}..{hi}");
        }
        b.set(0, 300, true);
        assert_eq!((b.count(0, 300), b.find(0, 300, false)), (300, 300));
        assert!(b.all(0, 300));
        b.clear();
        assert_eq!((b.count(0, 300), b.find(0, 300, true)), (0, 300));
    }

    #[test]
    fn single_bits_and_backward_search_against_a_naive_one() {
        let mut b = Bits::default();
        b.grow(300).unwrap();
        let set = [0, 1, 63, 64, 127, 130, 191, 192, 255, 299];
        for i in set {
            b.set(i, i + 1, true);
        }
        b.set(1, 2, false);
        b.set(2, 3, false); // clear already
        let naive = |i: u32| set.contains(&i) && i != 1;
        for i in 0..300 {
            assert_eq!(b.get(i), naive(i), "bit {i}");
        }
        // Every range; under Miri (cubic: hours) those between the bits
        // next to word edges and to set bits.
        let edges = [
            0, 1, 2, 62, 63, 64, 65, 126, 127, 128, 129, 130, 131, 190, 191, 192, 193, 254, 255, 256, 298,
            299, 300,
        ];
        let ends: alloc::vec::Vec<u32> = if cfg!(miri) { edges.to_vec() } else { (0..=300).collect() };
        for &lo in &ends {
            for &hi in ends.iter().filter(|&&hi| hi >= lo) {
                for want in [true, false] {
                    let expected = (lo..hi).rev().find(|&i| naive(i) == want);
                    assert_eq!(b.find_back(lo, hi, want), expected, "{lo}..{hi} {want}");
                }
            }
        }
        // Across many clear words to the one set bit at or below a slot.
        assert_eq!((b.find_back(0, 299, true), b.find_back(193, 255, true)), (Some(255), None));
        b.set(0, 300, false);
        assert_eq!((b.find_back(0, 300, true), b.find_back(0, 300, false)), (None, Some(299)));
    }
}
