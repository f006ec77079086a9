use super::ReservableSpace;
use crate::{Error, Range, Result, Stream};
use alloc::vec::Vec;
use core::cell::RefCell;

/// A reservable space of bare numbers that checks every call: the space of
/// examples and tests in the core (`memres-host` has a thread-safe one).
///
/// Reservations are handed out from a counter and never reused; each keeps a
/// bitmap of its committed granules, so a commit of committed memory or a
/// decommit of uncommitted memory is an error, not a silent miscount. It
/// counts committed bytes and their peak, holds at most `physical` bytes
/// committed, and can be told to fail the Nth commit or decommit from now.
/// It is not `Sync` (a `RefCell` inside).
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
    granule: u64,
    physical: u64,
    state: RefCell<State>,
}

#[derive(Debug)]
struct State {
    /// Next address to reserve from; the space ends at `CountingSpace::END`.
    next: u64,
    /// Live reservations and their committed-granule bitmaps.
    reservations: Vec<(Range, Vec<u64>)>,
    committed: u64,
    peak: u64,
    commits: u64,
    decommits: u64,
    /// Commits to let through before one fails (0: none pending).
    fail_in: u64,
    /// Decommits to let through before one fails (0: none pending).
    fail_decommit_in: u64,
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
        assert!(granule.is_power_of_two() && granule >= 256, "granule {granule} not a power of two >= 256");
        CountingSpace {
            granule,
            physical,
            state: RefCell::new(State {
                next: Self::BASE,
                reservations: Vec::new(),
                committed: 0,
                peak: 0,
                commits: 0,
                decommits: 0,
                fail_in: 0,
                fail_decommit_in: 0,
            }),
        }
    }

    /// Bytes of physical memory.
    pub fn physical_bytes(&self) -> u64 {
        self.physical
    }

    /// Bytes committed now.
    pub fn committed_bytes(&self) -> u64 {
        self.state.borrow().committed
    }

    /// The most bytes ever committed at once.
    pub fn peak_committed_bytes(&self) -> u64 {
        self.state.borrow().peak
    }

    /// Successful commit and decommit calls so far.
    pub fn call_counts(&self) -> (u64, u64) {
        let s = self.state.borrow();
        (s.commits, s.decommits)
    }

    /// Number of live reservations.
    pub fn reservation_count(&self) -> usize {
        self.state.borrow().reservations.len()
    }

    /// Whether every granule of `range` is committed (false for a range
    /// outside the reservations).
    pub fn is_committed(&self, range: Range) -> bool {
        let s = self.state.borrow();
        let g = self.granule;
        match s.reservations.iter().find(|(r, _)| r.contains_range(&range)) {
            Some((r, bits)) => {
                let first = (range.start() - r.start()) / g;
                (first..first + range.len().div_ceil(g)).all(|i| bits[i as usize / 64] >> (i % 64) & 1 == 1)
            }
            None => false,
        }
    }

    /// Makes the `n`th commit from now fail (`n = 1`: the next one) with an
    /// injected backend error; `n = 0` cancels.
    pub fn fail_nth(&self, n: u64) {
        self.state.borrow_mut().fail_in = n;
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
        self.state.borrow_mut().fail_decommit_in = n;
    }

    /// Flips the committed bits of `range`, which must all be `!to` first.
    fn flip(&self, s: &mut State, range: Range, to: bool) -> Result<()> {
        let g = self.granule;
        if range.is_empty() || range.start() % g != 0 || range.len() % g != 0 {
            return Err(Error::InvalidConfig { what: "range empty or not aligned to the granule" });
        }
        let Some((r, bits)) = s.reservations.iter_mut().find(|(r, _)| r.contains_range(&range)) else {
            return Err(Error::InvalidConfig { what: "range outside the reservations" });
        };
        let first = (range.start() - r.start()) / g;
        let granules = first..first + range.len() / g;
        if granules.clone().any(|i| (bits[i as usize / 64] >> (i % 64) & 1 == 1) == to) {
            return Err(Error::InvalidConfig {
                what: if to { "commit of committed memory" } else { "decommit of uncommitted memory" },
            });
        }
        for i in granules {
            bits[i as usize / 64] ^= 1 << (i % 64);
        }
        Ok(())
    }
}

impl ReservableSpace for CountingSpace {
    fn granule(&self) -> u64 {
        self.granule
    }

    fn reserve(&self, len: u64) -> Result<Range> {
        if len == 0 || len % self.granule != 0 {
            return Err(Error::InvalidSize { size: len });
        }
        let mut s = self.state.borrow_mut();
        let room = Self::END - s.next;
        if len > room {
            return Err(Error::OutOfMemory {
                requested: len,
                largest_free: room,
                pool_size: Self::END - Self::BASE,
                max_size: Some(Self::END - Self::BASE),
            });
        }
        let range = Range::new(s.next, len).ok_or(Error::InvalidSize { size: len })?;
        s.next += len;
        let words = (len / self.granule).div_ceil(64) as usize;
        s.reservations.push((range, alloc::vec![0; words]));
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
        let mut s = self.state.borrow_mut();
        if s.fail_in > 0 {
            s.fail_in -= 1;
            if s.fail_in == 0 {
                return Err(Error::Backend { code: 2, what: "injected commit failure" });
            }
        }
        if range.len() > self.physical - s.committed {
            return Err(Error::OutOfMemory {
                requested: range.len(),
                largest_free: self.physical - s.committed,
                pool_size: self.physical,
                max_size: Some(self.physical),
            });
        }
        self.flip(&mut s, range, true)?;
        s.committed += range.len();
        s.peak = s.peak.max(s.committed);
        s.commits += 1;
        Ok(())
    }

    fn decommit<S: Stream + ?Sized>(&self, range: Range, _stream: &S) -> Result<()> {
        let mut s = self.state.borrow_mut();
        if s.fail_decommit_in > 0 {
            s.fail_decommit_in -= 1;
            if s.fail_decommit_in == 0 {
                return Err(Error::Backend { code: 2, what: "injected decommit failure" });
            }
        }
        self.flip(&mut s, range, false)?;
        s.committed -= range.len();
        s.decommits += 1;
        Ok(())
    }
}
