use crate::{Error, Range, Result};
use alloc::collections::BTreeMap;

/// The pieces a simulated space holds its committed memory in, as CUDA
/// holds physical handles: each commit in pieces of up to a few granules
/// from its start, each given back whole only
/// ([`CommitLedger::hold_in_pieces`](super::CommitLedger::hold_in_pieces)).
///
/// ```text
///  commit of 6 granules, pieces of up to 4:  │ 0  1  2  3 │ 4  5 │
///  decommit of granules 2..6: refused (cuts the first piece)
///  releasable(2..6, want any): 4..6
/// ```
#[derive(Debug, Clone)]
pub(super) struct Pieces {
    /// Bytes of the longest piece: whole granules, at least one.
    most: u64,
    /// The committed pieces, start to length; they cover the committed
    /// granules exactly and never overlap.
    pieces: BTreeMap<u64, u64>,
    /// Decommits refused for taking part of a piece.
    refused: u64,
}

impl Pieces {
    /// Pieces of up to `granules` granules of `granule` bytes.
    ///
    /// # Panics
    ///
    /// If `granules` is 0.
    pub(super) fn new(granules: u64, granule: u64) -> Self {
        assert!(granules > 0, "a piece holds at least one granule");
        Pieces { most: granules.saturating_mul(granule), pieces: BTreeMap::new(), refused: 0 }
    }

    /// Decommits refused for taking part of a piece.
    pub(super) fn partial_decommits(&self) -> u64 {
        self.refused
    }

    /// Whether a decommit of `range` takes whole pieces only; counts it if
    /// not.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if a piece crosses either end of `range`.
    pub(super) fn check_decommit(&mut self, range: Range) -> Result<()> {
        let cut = |at: u64| self.pieces.range(..at).next_back().is_some_and(|(&p, &l)| p + l > at);
        if cut(range.start()) || cut(range.end()) {
            self.refused += 1;
            return Err(Error::InvalidConfig { what: "decommit of part of a piece" });
        }
        Ok(())
    }

    /// Records a successful commit of `range`: pieces of the longest length
    /// from its start, the last one shorter.
    pub(super) fn committed(&mut self, range: Range) {
        let mut at = range.start();
        while at < range.end() {
            let len = self.most.min(range.end() - at);
            self.pieces.insert(at, len);
            at += len;
        }
    }

    /// Records a successful decommit of `range`, which
    /// [`check_decommit`](Self::check_decommit) passed: its pieces go.
    pub(super) fn decommitted(&mut self, range: Range) {
        while let Some((&p, _)) = self.pieces.range(range.start()..range.end()).next() {
            self.pieces.remove(&p);
        }
    }

    /// The pieces wholly inside `range`, adjacent, from the highest down
    /// until they hold `want` bytes: what a space holding these gives back
    /// of `range`. `None` if no piece lies wholly inside it, or `want` is 0.
    pub(super) fn releasable(&self, range: Range, want: u64) -> Option<Range> {
        if want == 0 {
            return None;
        }
        let mut taken: Option<(u64, u64)> = None;
        for (&p, &l) in self.pieces.range(..range.end()).rev() {
            if p + l > range.end() {
                continue;
            }
            if p < range.start() || taken.is_some_and(|(lo, hi)| hi - lo >= want || p + l != lo) {
                break;
            }
            taken = Some((p, taken.map_or(p + l, |(_, hi)| hi)));
        }
        let (lo, hi) = taken?;
        Range::from_bounds(lo, hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 20;

    fn r(first: u64, granules: u64) -> Range {
        Range::new(first * G, granules * G).unwrap()
    }

    #[test]
    fn only_whole_pieces_go_back_the_highest_first() {
        let mut p = Pieces::new(4, G);
        p.committed(r(0, 10)); // 0..4, 4..8, 8..10
                               // A piece crossing either end of the range is not taken.
        assert_eq!(p.releasable(r(1, 9), 1), Some(r(8, 2)));
        assert_eq!(p.releasable(r(1, 9), 3 * G), Some(r(4, 6)));
        assert_eq!(p.releasable(r(1, 8), 100 * G), Some(r(4, 4)));
        assert_eq!(p.releasable(r(1, 6), G), None);
        // Pieces not adjacent (a granule never committed between) end the run.
        p.committed(r(11, 2));
        assert_eq!(p.releasable(r(0, 13), 100 * G), Some(r(11, 2)));
    }

    #[test]
    fn a_decommit_of_part_of_a_piece_is_refused_and_counted() {
        let mut p = Pieces::new(4, G);
        p.committed(r(0, 6)); // 0..4, 4..6
        for cut in [r(2, 4), r(0, 2), r(3, 1)] {
            assert!(p.check_decommit(cut).is_err());
        }
        assert_eq!(p.partial_decommits(), 3);
        assert!(p.check_decommit(r(4, 2)).is_ok());
        p.decommitted(r(4, 2));
        assert_eq!(p.releasable(r(0, 6), 100 * G), Some(r(0, 4)));
        assert!(p.check_decommit(r(0, 4)).is_ok());
        p.decommitted(r(0, 4));
        assert_eq!((p.releasable(r(0, 6), G), p.partial_decommits()), (None, 3));
    }
}
