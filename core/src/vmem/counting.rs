use super::{CommitLedger, ReservableSpace};
use crate::{Error, Range, Result, Stream};
use alloc::vec::Vec;
use core::cell::RefCell;

/// A reservable space of bare numbers that checks every call: the space of
/// examples and tests in the core (`memres-sim` has a thread-safe one).
///
/// Reservations are handed out from a counter, each on a granule boundary,
/// and never reused; each keeps a bitmap of its committed granules, so a
/// commit of committed memory or a decommit of uncommitted memory is an
/// error, not a silent miscount. It
/// counts committed bytes and their peak, holds at most `physical` bytes
/// committed, and can be told to fail the Nth commit or decommit from now.
/// It is not `Sync` (a `RefCell` inside).
///
/// With [`with_pieces`](Self::with_pieces) it holds memory as CUDA holds
/// physical handles: each commit in pieces of a few granules, given back
/// whole only.
///
/// # Examples
///
/// ```
/// use memres_core::vmem::{CountingSpace, ReservableSpace};
/// use memres_core::{Error, Range};
/// let space = CountingSpace::new(4 << 20, 1 << 20);
/// assert!(matches!(space.reserve(1 << 50), Err(Error::OutOfMemory { .. })));
/// let r = space.reserve(8 << 20)?;
/// space.fail_nth(1);
/// assert!(space.commit(Range::new(r.start(), 1 << 20).unwrap()).is_err());
/// // Past the physical memory:
/// assert!(space.commit(Range::new(r.start(), 5 << 20).unwrap()).unwrap_err().is_out_of_memory());
/// space.commit(Range::new(r.start(), 4 << 20).unwrap())?;
/// assert_eq!((space.committed_bytes(), space.peak_committed_bytes()), (4 << 20, 4 << 20));
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug)]
pub struct CountingSpace {
    state: RefCell<State>,
}

#[derive(Debug)]
struct State {
    /// Next address to reserve from; the space ends at `CountingSpace::END`.
    next: u64,
    /// Live reservations and their committed-granule bitmaps.
    reservations: Vec<(Range, Vec<u64>)>,
    ledger: CommitLedger,
}

/// The reservation `range` lies in, with its bitmap.
fn reservation_of(reservations: &mut [(Range, Vec<u64>)], range: Range) -> Option<(&mut [u64], Range)> {
    let (r, bits) = reservations.iter_mut().find(|(r, _)| r.contains_range(&range))?;
    Some((bits.as_mut_slice(), *r))
}

impl CountingSpace {
    /// Where the space starts (far from 0).
    pub const BASE: u64 = 1 << 32;
    /// Where the space ends: 2^47 bytes of addresses, as a GPU's.
    pub const END: u64 = 1 << 47;

    /// A space with `physical` bytes of memory to commit and granules of
    /// `granule` bytes.
    ///
    /// # Panics
    ///
    /// If `granule` is not a power of two of at least 256.
    pub fn new(physical: u64, granule: u64) -> Self {
        let ledger = CommitLedger::new(physical, granule);
        let state = State { next: Self::BASE, reservations: Vec::new(), ledger };
        CountingSpace { state: RefCell::new(state) }
    }

    /// Commits each range in pieces of up to `granules` granules from its
    /// start, and gives back whole pieces only: a decommit that takes part
    /// of a piece fails with [`Error::InvalidConfig`] (counted in
    /// [`partial_decommits`](Self::partial_decommits)), and
    /// [`releasable`](ReservableSpace::releasable) answers whole pieces.
    ///
    /// # Errors
    ///
    /// As [`CommitLedger::hold_in_pieces`](super::CommitLedger::hold_in_pieces).
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::{CountingSpace, ReservableSpace};
    /// use memres_core::Range;
    /// let mib = 1 << 20;
    /// let space = CountingSpace::new(64 * mib, mib).with_pieces(4)?;
    /// let r = space.reserve(16 * mib)?;
    /// space.commit(Range::new(r.start(), 6 * mib).unwrap())?; // pieces of 4 and 2 granules
    /// let tail = Range::new(r.start() + 2 * mib, 4 * mib).unwrap();
    /// assert!(space.decommit(tail, &()).is_err());
    /// assert_eq!(space.partial_decommits(), 1);
    /// // Of granules 2..6, only the piece 4..6 comes back whole.
    /// assert_eq!(space.releasable(tail, mib), Range::new(r.start() + 4 * mib, 2 * mib));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn with_pieces(self, granules: u64) -> Result<Self> {
        self.state.borrow_mut().ledger.hold_in_pieces(granules)?;
        Ok(self)
    }

    /// Decommits refused for taking part of a piece
    /// ([`with_pieces`](Self::with_pieces)).
    pub fn partial_decommits(&self) -> u64 {
        self.state.borrow().ledger.partial_decommits()
    }

    /// Bytes of physical memory.
    pub fn physical_bytes(&self) -> u64 {
        self.state.borrow().ledger.physical_bytes()
    }

    /// Bytes committed now.
    pub fn committed_bytes(&self) -> u64 {
        self.state.borrow().ledger.committed_bytes()
    }

    /// The most bytes ever committed at once.
    pub fn peak_committed_bytes(&self) -> u64 {
        self.state.borrow().ledger.peak_committed_bytes()
    }

    /// Successful commit and decommit calls so far.
    pub fn call_counts(&self) -> (u64, u64) {
        self.state.borrow().ledger.call_counts()
    }

    /// Injected commit and decommit failures delivered so far (see
    /// [`CommitLedger::injected_failures`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::{CountingSpace, ReservableSpace};
    /// use memres_core::Range;
    /// let space = CountingSpace::new(4 << 20, 1 << 20);
    /// let r = space.reserve(4 << 20)?;
    /// space.fail_nth(1);
    /// assert!(space.commit(Range::new(r.start(), 1 << 20).unwrap()).is_err());
    /// assert_eq!(space.injected_failures(), (1, 0));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn injected_failures(&self) -> (u64, u64) {
        self.state.borrow().ledger.injected_failures()
    }

    /// Number of live reservations.
    pub fn reservation_count(&self) -> usize {
        self.state.borrow().reservations.len()
    }

    /// Whether every granule of `range` is committed (false for a range
    /// outside the reservations).
    pub fn is_committed(&self, range: Range) -> bool {
        let s = self.state.borrow();
        s.reservations
            .iter()
            .find(|(r, _)| r.contains_range(&range))
            .is_some_and(|(r, bits)| s.ledger.is_committed(bits, *r, range))
    }

    /// Makes the `n`th commit from now fail (`n = 1`: the next one) with an
    /// injected backend error; `n = 0` cancels.
    pub fn fail_nth(&self, n: u64) {
        self.state.borrow_mut().ledger.fail_nth_commit(n);
    }

    /// Makes the `n`th decommit from now fail (`n = 1`: the next one) with
    /// an injected backend error, the memory left committed; `n = 0`
    /// cancels.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::{CountingSpace, ReservableSpace};
    /// use memres_core::Range;
    /// let space = CountingSpace::new(4 << 20, 1 << 20);
    /// let r = space.reserve(4 << 20)?;
    /// let first = Range::new(r.start(), 1 << 20).unwrap();
    /// space.commit(first)?;
    /// space.fail_nth_decommit(1);
    /// assert!(space.decommit(first, &()).is_err());
    /// assert!(space.is_committed(first));
    /// space.decommit(first, &())?; // the next one goes through
    /// assert_eq!(space.committed_bytes(), 0);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn fail_nth_decommit(&self, n: u64) {
        self.state.borrow_mut().ledger.fail_nth_decommit(n);
    }
}

impl ReservableSpace for CountingSpace {
    fn granule(&self) -> u64 {
        self.state.borrow().ledger.granule()
    }

    fn reserve(&self, len: u64) -> Result<Range> {
        let mut s = self.state.borrow_mut();
        let g = s.ledger.granule();
        if len == 0 || len % g != 0 {
            return Err(Error::InvalidSize { size: len, what: "not a non-zero multiple of the granule" });
        }
        // Reservations start on a granule boundary (the space's base is
        // one only for granules up to 4 GiB); none past the end.
        let start = s.next.checked_next_multiple_of(g).filter(|&at| at <= Self::END).unwrap_or(Self::END);
        let room = Self::END - start;
        if len > room {
            return Err(Error::OutOfMemory {
                requested: len,
                largest_free: room,
                pool_size: Self::END - Self::BASE,
                max_size: Some(Self::END - Self::BASE),
            });
        }
        let range =
            Range::new(start, len).ok_or(Error::InvalidSize { size: len, what: "past the last address" })?;
        // The reservation's bitmap, a word per 64 granules (32 GiB for 2^46
        // bytes of 256-byte granules): host memory it cannot have is out
        // of memory, not an abort, and takes nothing.
        let mut bits = Vec::new();
        let words = CommitLedger::words(len / g);
        if bits.try_reserve_exact(words).is_err() || s.reservations.try_reserve(1).is_err() {
            return Err(Error::OutOfMemory {
                requested: len,
                largest_free: room,
                pool_size: Self::END - Self::BASE,
                max_size: Some(Self::END - Self::BASE),
            });
        }
        bits.resize(words, 0);
        s.next = start + len;
        s.reservations.push((range, bits));
        Ok(range)
    }

    fn release(&self, range: Range) -> Result<()> {
        let mut s = self.state.borrow_mut();
        let Some(i) = s.reservations.iter().position(|(r, _)| *r == range) else {
            return Err(Error::UnknownBlock { addr: range.start() });
        };
        if s.reservations[i].1.iter().any(|&w| w != 0) {
            return Err(Error::InvalidConfig { what: "release of a reservation with committed memory" });
        }
        s.reservations.swap_remove(i);
        Ok(())
    }

    fn commit(&self, range: Range) -> Result<()> {
        let s = &mut *self.state.borrow_mut();
        s.ledger.commit(reservation_of(&mut s.reservations, range), range)
    }

    fn decommit<S: Stream + ?Sized>(&self, range: Range, _stream: &S) -> Result<()> {
        let s = &mut *self.state.borrow_mut();
        s.ledger.decommit(reservation_of(&mut s.reservations, range), range)
    }

    fn releasable(&self, range: Range, want: u64) -> Option<Range> {
        self.state.borrow().ledger.releasable(range, want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reservation starts on a granule boundary, as the trait's
    /// contract asks, whatever the granule: with granules above the space's
    /// base (4 GiB) reservations started off the boundary, and no commit
    /// in them was taken.
    #[test]
    fn reservations_start_on_a_granule_boundary_for_every_granule() {
        for shift in [8, 21, 32, 33, 40, 45] {
            let g = 1u64 << shift;
            let space = CountingSpace::new(3 * g, g);
            let (a, b) = (space.reserve(g).unwrap(), space.reserve(2 * g).unwrap());
            for r in [a, b] {
                assert_eq!(r.start() % g, 0, "granule 2^{shift}: {r:?}");
                space.commit(r).unwrap();
                space.decommit(r, &()).unwrap();
                space.release(r).unwrap();
            }
            assert_eq!((space.committed_bytes(), space.peak_committed_bytes()), (0, 2 * g));
        }
        // The last boundary that leaves room for a granule, then none:
        // out of addresses, not a panic.
        let g = 1u64 << 46;
        let space = CountingSpace::new(g, g);
        assert_eq!(space.reserve(g), Ok(Range::new(g, g).unwrap()));
        assert!(space.reserve(g).unwrap_err().is_out_of_memory());
        for shift in [47, 63] {
            let g = 1u64 << shift;
            let e = CountingSpace::new(g, g).reserve(g).unwrap_err();
            assert!(e.is_out_of_memory(), "granule 2^{shift}: {e}");
        }
    }

    /// Nothing to give back is `None`, as `ReservableSpace::releasable`
    /// says: the default answered an empty range (`Some`) to a `want` of 0
    /// or an empty `range`, which no decommit takes.
    #[test]
    fn releasable_of_nothing_is_none() {
        let space = CountingSpace::new(4 << 20, 1 << 20);
        let r = space.reserve(4 << 20).unwrap();
        space.commit(r).unwrap();
        assert_eq!(space.releasable(r, 1 << 20), Range::new(r.start() + (3 << 20), 1 << 20));
        assert_eq!(space.releasable(r, 0), None);
        assert_eq!(space.releasable(Range::new(r.start(), 0).unwrap(), 1 << 20), None);
        space.decommit(r, &()).unwrap();
    }

    /// A space that holds memory in pieces answers nothing to a `want` of
    /// 0 too, as the default does: it answered a whole piece, which a
    /// caller would decommit for nothing.
    #[test]
    fn releasable_of_nothing_is_none_with_pieces() {
        let space = CountingSpace::new(4 << 20, 1 << 20).with_pieces(2).unwrap();
        let r = space.reserve(4 << 20).unwrap();
        space.commit(r).unwrap();
        assert_eq!(space.releasable(r, 1), Range::new(r.start() + (2 << 20), 2 << 20));
        assert_eq!(space.releasable(r, 0), None);
        assert_eq!(space.releasable(Range::new(r.start(), 0).unwrap(), 1 << 20), None);
        space.decommit(r, &()).unwrap();
    }
}
