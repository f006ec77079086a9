#[cfg(feature = "alloc")]
use super::pieces::Pieces;
use crate::check::FailNth;
use crate::{Error, Range, Result};

/// The checked bookkeeping of a simulated [`ReservableSpace`](super::ReservableSpace):
/// which granules of a reservation are committed, the committed bytes and
/// their peak, a budget of physical memory, call counts, and injected
/// failures. A space finds the reservation a range lies in (its own way:
/// [`CountingSpace`](super::CountingSpace) hands addresses out from a
/// counter, `memres-sim`'s `SimAddressSpace` from an index, behind a lock)
/// and lets the ledger judge and count the call.
///
/// A reservation's committed granules are a bitmap of `u64` words, one bit
/// per granule from its start ([`words`](Self::words) says how many; a
/// shorter one is misuse, refused).
///
/// With [`hold_in_pieces`](Self::hold_in_pieces) (feature `alloc`) the
/// ledger also keeps the pieces the memory is held in, as CUDA holds
/// physical handles: each commit in pieces of a few granules from its
/// start, each given back whole only.
///
/// # Examples
///
/// ```
/// use memres_core::vmem::CommitLedger;
/// use memres_core::Range;
/// let mut ledger = CommitLedger::new(4 << 20, 1 << 20);
/// let reservation = Range::new(1 << 30, 8 << 20).unwrap();
/// let mut bits = vec![0; CommitLedger::words(8)];
/// let two = Range::new(1 << 30, 2 << 20).unwrap();
/// ledger.commit(Some((&mut bits, reservation)), two)?;
/// assert!(ledger.commit(Some((&mut bits, reservation)), two).is_err()); // committed already
/// assert!(ledger.is_committed(&bits, reservation, two));
/// assert!(ledger.decommit(None, two).is_err()); // in no reservation
/// ledger.decommit(Some((&mut bits, reservation)), two)?;
/// assert_eq!((ledger.committed_bytes(), ledger.peak_committed_bytes()), (0, 2 << 20));
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct CommitLedger {
    granule: u64,
    physical: u64,
    /// Bytes committed: the bits set over all reservations, in bytes.
    committed: u64,
    peak: u64,
    commits: u64,
    decommits: u64,
    /// The injected commit failure, armed or delivered.
    fail_commit: FailNth,
    /// The injected decommit failure, armed or delivered.
    fail_decommit: FailNth,
    /// With pieces: the pieces of the committed memory.
    #[cfg(feature = "alloc")]
    pieces: Option<Pieces>,
}

impl CommitLedger {
    /// A ledger of `physical` bytes to commit in granules of `granule` bytes.
    ///
    /// # Panics
    ///
    /// If `granule` is not a power of two of at least 256.
    pub fn new(physical: u64, granule: u64) -> Self {
        assert!(granule.is_power_of_two() && granule >= 256, "granule {granule} not a power of two >= 256");
        CommitLedger {
            granule,
            physical,
            committed: 0,
            peak: 0,
            commits: 0,
            decommits: 0,
            fail_commit: FailNth::new(),
            fail_decommit: FailNth::new(),
            #[cfg(feature = "alloc")]
            pieces: None,
        }
    }

    /// From now on, holds each commit in pieces of up to `granules`
    /// granules from its start and gives back whole pieces only: a
    /// decommit that takes part of a piece is refused
    /// ([`Error::InvalidConfig`], counted in
    /// [`partial_decommits`](Self::partial_decommits)), and
    /// [`releasable`](Self::releasable) answers whole pieces.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if `granules` is 0, or if memory is
    /// committed (its pieces would be unknown); the ledger is unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::CommitLedger;
    /// use memres_core::Range;
    /// let g = 1 << 20;
    /// let mut ledger = CommitLedger::new(64 * g, g);
    /// assert!(ledger.hold_in_pieces(0).is_err());
    /// ledger.hold_in_pieces(4)?;
    /// let reservation = Range::new(1 << 30, 16 * g).unwrap();
    /// let mut bits = vec![0; CommitLedger::words(16)];
    /// let at = |first: u64, n: u64| Range::new((1 << 30) + first * g, n * g).unwrap();
    /// ledger.commit(Some((&mut bits, reservation)), at(0, 6))?; // pieces of 4 and 2 granules
    /// assert!(ledger.decommit(Some((&mut bits, reservation)), at(2, 4)).is_err());
    /// assert_eq!((ledger.partial_decommits(), ledger.committed_bytes()), (1, 6 * g));
    /// // Of granules 2..6, only the piece 4..6 comes back whole.
    /// assert_eq!(ledger.releasable(at(2, 4), g), Some(at(4, 2)));
    /// ledger.decommit(Some((&mut bits, reservation)), at(4, 2))?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    #[cfg(feature = "alloc")]
    pub fn hold_in_pieces(&mut self, granules: u64) -> Result<()> {
        let bad = |what| Err(Error::InvalidConfig { what });
        if granules == 0 {
            return bad("a piece holds at least one granule");
        }
        if self.committed != 0 {
            return bad("pieces are chosen before anything is committed");
        }
        self.pieces = Some(Pieces::new(granules, self.granule));
        Ok(())
    }

    /// Decommits refused for taking part of a piece
    /// ([`hold_in_pieces`](Self::hold_in_pieces)); 0 without pieces.
    pub fn partial_decommits(&self) -> u64 {
        #[cfg(feature = "alloc")]
        if let Some(pieces) = &self.pieces {
            return pieces.partial_decommits();
        }
        0
    }

    /// What of `range` (committed granules, none in use) to decommit to
    /// give back at least `want` bytes, as
    /// [`ReservableSpace::releasable`](super::ReservableSpace::releasable)
    /// asks: with pieces, whole pieces inside `range` from the highest
    /// down; else the highest `want` bytes ([`highest`](super::highest)).
    /// `None` where that is nothing: `want` 0 included.
    pub fn releasable(&self, range: Range, want: u64) -> Option<Range> {
        #[cfg(feature = "alloc")]
        if let Some(pieces) = &self.pieces {
            return pieces.releasable(range, want);
        }
        super::highest(range, want)
    }

    /// The error of an injected commit failure.
    pub const INJECTED_COMMIT_FAILURE: Error = Error::Backend { code: 2, what: "injected commit failure" };
    /// The error of an injected decommit failure.
    pub const INJECTED_DECOMMIT_FAILURE: Error =
        Error::Backend { code: 2, what: "injected decommit failure" };

    /// Words of the bitmap of a reservation of `granules` granules.
    pub const fn words(granules: u64) -> usize {
        granules.div_ceil(64) as usize
    }

    /// The granule.
    pub fn granule(&self) -> u64 {
        self.granule
    }

    /// Bytes of physical memory.
    pub fn physical_bytes(&self) -> u64 {
        self.physical
    }

    /// Bytes committed now.
    pub fn committed_bytes(&self) -> u64 {
        self.committed
    }

    /// The most bytes ever committed at once.
    pub fn peak_committed_bytes(&self) -> u64 {
        self.peak
    }

    /// Forgets the peak: it restarts from what is committed now.
    pub fn reset_peak(&mut self) {
        self.peak = self.committed;
    }

    /// Successful commit and decommit calls so far.
    pub fn call_counts(&self) -> (u64, u64) {
        (self.commits, self.decommits)
    }

    /// Injected commit and decommit failures delivered so far: how many
    /// calls failed with [`INJECTED_COMMIT_FAILURE`](Self::INJECTED_COMMIT_FAILURE)
    /// and [`INJECTED_DECOMMIT_FAILURE`](Self::INJECTED_DECOMMIT_FAILURE). A
    /// caller that compares them before and after a call knows whether an
    /// error of that call is an injected one, since an armed failure may
    /// fire in a later call or never.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::CommitLedger;
    /// use memres_core::Range;
    /// let mut ledger = CommitLedger::new(4 << 20, 1 << 20);
    /// let reservation = Range::new(1 << 30, 4 << 20).unwrap();
    /// let mut bits = vec![0; CommitLedger::words(4)];
    /// let one = Range::new(1 << 30, 1 << 20).unwrap();
    /// ledger.fail_nth_commit(2);
    /// ledger.commit(Some((&mut bits, reservation)), one)?;
    /// assert_eq!(ledger.injected_failures(), (0, 0)); // armed, not delivered
    /// let two = Range::new((1 << 30) + (1 << 20), 1 << 20).unwrap();
    /// let err = ledger.commit(Some((&mut bits, reservation)), two).unwrap_err();
    /// assert_eq!(err, CommitLedger::INJECTED_COMMIT_FAILURE);
    /// ledger.fail_nth_decommit(1);
    /// let err = ledger.decommit(Some((&mut bits, reservation)), one).unwrap_err();
    /// assert_eq!(err, CommitLedger::INJECTED_DECOMMIT_FAILURE);
    /// assert_eq!(ledger.injected_failures(), (1, 1));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn injected_failures(&self) -> (u64, u64) {
        (self.fail_commit.delivered(), self.fail_decommit.delivered())
    }

    /// Makes the `n`th commit from now fail (`n = 1`: the next one) with an
    /// injected backend error; `n = 0` cancels.
    pub fn fail_nth_commit(&mut self, n: u64) {
        self.fail_commit.arm(n);
    }

    /// Makes the `n`th decommit from now fail with an injected backend
    /// error, the memory left committed; `n = 0` cancels.
    pub fn fail_nth_decommit(&mut self, n: u64) {
        self.fail_decommit.arm(n);
    }

    /// Checks that `range` is granule-aligned and not empty.
    fn check_shape(&self, range: Range) -> Result<()> {
        let g = self.granule;
        if range.is_empty() || range.start() % g != 0 || range.len() % g != 0 {
            return Err(Error::InvalidConfig { what: "range empty or not aligned to the granule" });
        }
        Ok(())
    }

    /// Whether every granule `range` touches is committed in `bits`, the
    /// bitmap of `reservation` (false for a range not inside it, or a
    /// bitmap shorter than it).
    pub fn is_committed(&self, bits: &[u64], reservation: Range, range: Range) -> bool {
        if !reservation.contains_range(&range) || !self.fits(bits, reservation) {
            return false;
        }
        let first = (range.start() - reservation.start()) / self.granule;
        let last = (range.end() - reservation.start()).div_ceil(self.granule);
        words_of(first, last).all(|(w, mask)| bits[w] & mask == mask)
    }

    /// Commits `range` in the reservation the space found for it (its
    /// bitmap and range; `None` when it lies in none): the bits first,
    /// which must all be clear, then an injected failure, then the
    /// physical budget. Misuse is told before any other failure, as
    /// [`ReservableSpace::commit`](super::ReservableSpace::commit) asks: a
    /// pool learns from it which granules a decommit that failed half-way
    /// kept.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a misshapen range, one outside
    /// `reservation`, or one partly committed, or a bitmap shorter than
    /// `reservation`; an injected
    /// [`Error::Backend`]; [`Error::OutOfMemory`] beyond the physical
    /// memory. Nothing changes on error.
    pub fn commit(&mut self, mut reservation: Option<(&mut [u64], Range)>, range: Range) -> Result<()> {
        self.flip(reservation.as_mut().map(|(bits, r)| (&mut **bits, *r)), range, true)?;
        let failed = if self.fail_commit.fires() {
            Some(Self::INJECTED_COMMIT_FAILURE)
        } else if range.len() > self.physical - self.committed {
            Some(Error::OutOfMemory {
                requested: range.len(),
                largest_free: self.physical - self.committed,
                pool_size: self.physical,
                max_size: Some(self.physical),
            })
        } else {
            None
        };
        if let Some(e) = failed {
            // Cannot fail: the bits were just set.
            let _ = self.flip(reservation, range, false);
            return Err(e);
        }
        #[cfg(feature = "alloc")]
        if let Some(pieces) = &mut self.pieces {
            pieces.committed(range);
        }
        self.committed += range.len();
        self.peak = self.peak.max(self.committed);
        self.commits += 1;
        Ok(())
    }

    /// Decommits `range` in the reservation the space found for it: the
    /// bits first, which must all be set, then with pieces that no piece
    /// crosses its ends, then an injected failure. Misuse is told before
    /// an injected failure, as for [`commit`](Self::commit): it neither
    /// fires nor uses up an armed one.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] as for [`commit`](Self::commit), or for a
    /// decommit of part of a piece (counted in
    /// [`partial_decommits`](Self::partial_decommits)); an injected
    /// [`Error::Backend`] (the memory stays committed). Nothing else
    /// changes on error.
    pub fn decommit(&mut self, mut reservation: Option<(&mut [u64], Range)>, range: Range) -> Result<()> {
        self.flip(reservation.as_mut().map(|(bits, r)| (&mut **bits, *r)), range, false)?;
        #[cfg(feature = "alloc")]
        let misuse = self.pieces.as_mut().and_then(|pieces| pieces.check_decommit(range).err());
        #[cfg(not(feature = "alloc"))]
        let misuse = None;
        let failed = misuse.or_else(|| self.fail_decommit.fires().then_some(Self::INJECTED_DECOMMIT_FAILURE));
        if let Some(e) = failed {
            // Cannot fail: the bits were just cleared.
            let _ = self.flip(reservation, range, true);
            return Err(e);
        }
        #[cfg(feature = "alloc")]
        if let Some(pieces) = &mut self.pieces {
            pieces.decommitted(range);
        }
        self.committed -= range.len();
        self.decommits += 1;
        Ok(())
    }

    /// Whether `bits` has a bit for every granule of `reservation`.
    fn fits(&self, bits: &[u64], reservation: Range) -> bool {
        // In `u64`: `words` is cut to `usize` on 32-bit targets.
        bits.len() as u64 >= (reservation.len() / self.granule).div_ceil(64)
    }

    /// Sets the bits of `range` to `to`; they must all be `!to`.
    fn flip(&self, reservation: Option<(&mut [u64], Range)>, range: Range, to: bool) -> Result<()> {
        self.check_shape(range)?;
        let Some((bits, reservation)) = reservation.filter(|(_, r)| r.contains_range(&range)) else {
            return Err(Error::InvalidConfig { what: "range outside the reservations" });
        };
        if !self.fits(bits, reservation) {
            return Err(Error::InvalidConfig { what: "a bitmap shorter than its reservation" });
        }
        let first = (range.start() - reservation.start()) / self.granule;
        let last = first + range.len() / self.granule;
        // A word at a time: a commit of a large block flips hundreds of bits.
        let clear = if to { 0 } else { u64::MAX };
        if words_of(first, last).any(|(w, mask)| (bits[w] ^ clear) & mask != 0) {
            return Err(Error::InvalidConfig {
                what: if to { "commit of committed memory" } else { "decommit of uncommitted memory" },
            });
        }
        for (w, mask) in words_of(first, last) {
            bits[w] ^= mask;
        }
        Ok(())
    }
}

/// The words of a bitmap that bits `first..last` lie in, each with the
/// mask of those bits in it.
fn words_of(first: u64, last: u64) -> impl Iterator<Item = (usize, u64)> {
    let words = if first < last { first / 64..(last - 1) / 64 + 1 } else { 0..0 };
    words.map(move |w| {
        let lo = first.max(w * 64) - w * 64;
        let hi = last.min(w * 64 + 64) - w * 64;
        // Bits lo..hi of the word (hi - lo in 1..=64).
        (w as usize, (u64::MAX >> (64 - (hi - lo))) << lo)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 20;

    fn range(first: u64, granules: u64) -> Range {
        Range::new((1 << 40) + first * G, granules * G).unwrap()
    }

    #[test]
    fn words_of_masks_exactly_the_bits_asked_for() {
        let bits = |first, last| {
            let mut v = [0u64; 4];
            words_of(first, last).for_each(|(w, m)| v[w] |= m);
            v
        };
        assert_eq!(bits(0, 64), [u64::MAX, 0, 0, 0]);
        assert_eq!(bits(3, 5), [0b11000, 0, 0, 0]);
        assert_eq!(bits(60, 130), [0xF << 60, u64::MAX, 0b11, 0]);
        assert_eq!(bits(64, 65), [0, 1, 0, 0]);
        assert_eq!(bits(255, 256), [0, 0, 0, 1 << 63]);
        assert_eq!(bits(7, 7), [0; 4]);
    }

    #[test]
    fn commits_across_words_are_checked_and_counted_granule_by_granule() {
        let reservation = range(0, 256);
        let mut bits = [0; CommitLedger::words(256)];
        let mut ledger = CommitLedger::new(256 * G, G);
        ledger.commit(Some((&mut bits, reservation)), range(60, 70)).unwrap();
        assert_eq!(ledger.committed_bytes(), 70 * G);
        assert!(ledger.is_committed(&bits, reservation, range(60, 70)));
        assert!(ledger.is_committed(&bits, reservation, range(129, 1)));
        assert!(!ledger.is_committed(&bits, reservation, range(59, 2)));
        assert!(!ledger.is_committed(&bits, reservation, range(129, 2)));
        // Overlapping by one granule at either end: refused, nothing changes.
        let before = bits;
        for overlap in [range(129, 10), range(0, 61), range(100, 1)] {
            assert!(ledger.commit(Some((&mut bits, reservation)), overlap).is_err());
            assert_eq!((bits, ledger.committed_bytes()), (before, 70 * G));
        }
        assert!(ledger.decommit(Some((&mut bits, reservation)), range(59, 2)).is_err());
        assert!(ledger.decommit(Some((&mut bits, reservation)), range(129, 2)).is_err());
        assert_eq!(bits, before);
        // A hole in the middle, then the rest.
        ledger.decommit(Some((&mut bits, reservation)), range(64, 64)).unwrap();
        assert_eq!(bits[..3], [0xF << 60, 0, 0b11]);
        ledger.decommit(Some((&mut bits, reservation)), range(60, 4)).unwrap();
        ledger.decommit(Some((&mut bits, reservation)), range(128, 2)).unwrap();
        assert_eq!(
            (bits.iter().sum::<u64>(), ledger.committed_bytes(), ledger.peak_committed_bytes()),
            (0, 0, 70 * G)
        );
    }

    #[test]
    fn a_misused_decommit_is_refused_before_an_armed_failure_fires() {
        let reservation = range(0, 8);
        let mut bits = [0; CommitLedger::words(8)];
        let mut ledger = CommitLedger::new(8 * G, G);
        ledger.commit(Some((&mut bits, reservation)), range(0, 2)).unwrap();
        ledger.fail_nth_decommit(1);
        let before = bits;
        let misaligned = Range::new((1 << 40) + 1, G).unwrap();
        for (inside, bad, what) in [
            (true, range(1, 2), "decommit of uncommitted memory"),
            (false, range(0, 2), "range outside the reservations"),
            (true, misaligned, "range empty or not aligned to the granule"),
        ] {
            let r = inside.then_some((&mut bits[..], reservation));
            assert_eq!(ledger.decommit(r, bad), Err(Error::InvalidConfig { what }));
        }
        assert_eq!((bits, ledger.committed_bytes(), ledger.injected_failures()), (before, 2 * G, (0, 0)));
        // The armed failure is still the next decommit's.
        let err = ledger.decommit(Some((&mut bits, reservation)), range(0, 2)).unwrap_err();
        assert_eq!(
            (err, ledger.injected_failures(), bits),
            (CommitLedger::INJECTED_DECOMMIT_FAILURE, (0, 1), before)
        );
        ledger.decommit(Some((&mut bits, reservation)), range(0, 2)).unwrap();
        assert_eq!((ledger.committed_bytes(), ledger.call_counts()), (0, (1, 1)));
    }

    /// A bitmap shorter than its reservation (a space's own bug) is
    /// misuse, told as such with nothing changed: a commit, decommit or
    /// question past its end panicked on an index out of bounds.
    #[test]
    fn a_bitmap_shorter_than_its_reservation_is_misuse_not_a_panic() {
        let reservation = range(0, 128);
        let mut bits = [0; CommitLedger::words(64)];
        let mut ledger = CommitLedger::new(128 * G, G);
        let short = Err(Error::InvalidConfig { what: "a bitmap shorter than its reservation" });
        for r in [range(100, 1), range(0, 1)] {
            assert_eq!(ledger.commit(Some((&mut bits, reservation)), r), short);
            assert_eq!(ledger.decommit(Some((&mut bits, reservation)), r), short);
            assert!(!ledger.is_committed(&bits, reservation, r));
        }
        assert_eq!((bits, ledger.committed_bytes(), ledger.call_counts()), ([0], 0, (0, 0)));
        // Long enough, it serves.
        let mut bits = [0; CommitLedger::words(128)];
        ledger.commit(Some((&mut bits, reservation)), range(100, 1)).unwrap();
        assert!(ledger.is_committed(&bits, reservation, range(100, 1)));
    }

    #[cfg(feature = "alloc")]
    #[test]
    fn a_decommit_of_part_of_a_piece_is_refused_before_an_armed_failure_fires() {
        let reservation = range(0, 8);
        let mut bits = [0; CommitLedger::words(8)];
        let mut ledger = CommitLedger::new(8 * G, G);
        ledger.hold_in_pieces(4).unwrap();
        ledger.commit(Some((&mut bits, reservation)), range(0, 4)).unwrap();
        ledger.fail_nth_decommit(1);
        let err = ledger.decommit(Some((&mut bits, reservation)), range(0, 2)).unwrap_err();
        assert_eq!(err, Error::InvalidConfig { what: "decommit of part of a piece" });
        assert_eq!((ledger.injected_failures(), ledger.partial_decommits()), ((0, 0), 1));
        assert!(ledger.is_committed(&bits, reservation, range(0, 4)));
        // Uncommitted and cutting no piece: told as uncommitted, not counted as partial.
        let err = ledger.decommit(Some((&mut bits, reservation)), range(4, 4)).unwrap_err();
        assert_eq!(err, Error::InvalidConfig { what: "decommit of uncommitted memory" });
        assert_eq!((ledger.injected_failures(), ledger.partial_decommits()), ((0, 0), 1));
    }
}
