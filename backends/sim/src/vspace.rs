use memres_core::index::CoalescingIndex;
use memres_core::vmem::{self, CommitLedger, ReservableSpace};
use memres_core::{Error, Range, Request, Result, Stream};
use std::collections::BTreeMap;
use std::sync::Mutex;

#[cfg(test)]
mod tests;

/// A simulated virtual address space: reservations of addresses with no
/// bytes behind them, and a budget of physical memory that commits draw on.
/// The [`ReservableSpace`] that stands in for CUDA's virtual memory
/// management (`cuMemAddressReserve`, `cuMemMap`, `cuMemUnmap`) in tests,
/// fuzzing and replays.
///
/// It checks every call: a commit of committed memory, a decommit of
/// uncommitted memory, a range outside the reservations, a release of a
/// reservation with memory still committed are errors, never miscounts. It
/// counts committed bytes and their peak, refuses commits beyond its
/// physical memory ([`Error::OutOfMemory`]) and reservations beyond its
/// address space, beyond the granules it keeps bitmaps for
/// ([`MAX_RESERVED_GRANULES`](Self::MAX_RESERVED_GRANULES)) or longer than
/// [`Request::MAX_SIZE`], and can be
/// told to fail the Nth commit or decommit. As the
/// CUDA backend may, `decommit` synchronizes the stream before unmapping;
/// as it does, only to unmap: a decommit of a range misshapen, outside the
/// reservations or not wholly committed synchronizes nothing.
/// With [`with_pieces`](Self::with_pieces) it holds memory as CUDA holds
/// physical handles: in pieces given back whole only.
/// It is `Sync`: one space can serve several pools and be inspected while
/// they use it.
///
/// # Examples
///
/// ```
/// use memres_core::vpool::{VirtualConfig, VirtualPool};
/// use memres_core::{MemoryResourceMut, Request};
/// use memres_sim::SimAddressSpace;
/// // 80 GiB of physical memory, 2 MiB granules; the pool reserves 64 GiB
/// // of addresses and keeps up to 256 MiB of free memory committed.
/// let space = SimAddressSpace::new(80 << 30, SimAddressSpace::DEFAULT_GRANULE)?;
/// let mut pool = VirtualPool::with_config(&space, VirtualConfig::new(64 << 30).release_threshold(256 << 20))?;
/// let b = pool.allocate(Request::new(5 << 20)?, &())?;
/// assert_eq!(space.committed_bytes(), 6 << 20);
/// pool.deallocate(b, &())?;
/// assert_eq!((space.committed_bytes(), space.peak_committed_bytes()), (6 << 20, 6 << 20)); // kept
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct SimAddressSpace {
    granule: u64,
    /// Where its addresses start: a multiple of `MAX_GRANULE`, so of
    /// every granule.
    base: u64,
    span: u64,
    /// Whether `State::pieces` is set: a space without pieces answers
    /// `releasable` without taking the lock.
    pieced: bool,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Free and reserved ranges of the address space.
    space: CoalescingIndex,
    /// Live reservations by start address: their index tag and a bitmap of
    /// committed granules.
    reservations: BTreeMap<u64, Reservation>,
    /// Committed bytes, physical memory, counts, injected failures and
    /// the pieces, if any.
    ledger: CommitLedger,
}

#[derive(Debug)]
struct Reservation {
    len: u64,
    tag: u64,
    committed: Vec<u64>,
}

/// The reservation `range` lies in, with its bitmap.
fn reservation_of(
    reservations: &mut BTreeMap<u64, Reservation>,
    range: Range,
) -> Option<(&mut [u64], Range)> {
    let (&start, r) = reservations.range_mut(..=range.start()).next_back()?;
    let whole = Range::new(start, r.len)?;
    whole.contains_range(&range).then_some((r.committed.as_mut_slice(), whole))
}

impl SimAddressSpace {
    /// Where the simulated address space starts.
    pub const BASE: u64 = 0x2000_0000_0000;
    /// The default size of the address space: 2^46 bytes (64 TiB).
    pub const DEFAULT_SPAN: u64 = 1 << 46;
    /// The granule of CUDA's virtual memory on current GPUs: 2 MiB.
    pub const DEFAULT_GRANULE: u64 = 2 << 20;
    /// The largest granule: [`Request::MAX_ALIGN`], the largest alignment
    /// a reservation may ask (a granule above it could never be reserved).
    pub const MAX_GRANULE: u64 = Request::MAX_ALIGN;
    /// The most granules reserved at once: each reservation keeps a bitmap
    /// of its committed granules, and these 2^30 bits take 128 MiB of host
    /// memory. So a reservation of 2^46 bytes in granules of 256 bytes is
    /// refused ([`Error::OutOfMemory`]) rather than a bitmap of 32 GiB
    /// allocated; with granules of 64 KiB or more, the whole default span
    /// may be reserved.
    pub const MAX_RESERVED_GRANULES: u64 = 1 << 30;

    /// A space with `physical` bytes of memory to commit, granules of
    /// `granule` bytes, and [`DEFAULT_SPAN`](Self::DEFAULT_SPAN) bytes of
    /// addresses.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if `granule` is not a power of two from 256
    /// to [`MAX_GRANULE`](Self::MAX_GRANULE).
    ///
    /// ```
    /// use memres_core::Error;
    /// use memres_sim::SimAddressSpace;
    /// assert!(SimAddressSpace::new(1 << 30, 2 << 20).is_ok());
    /// for bad in [0, 128, 3 << 20, SimAddressSpace::MAX_GRANULE << 1] {
    ///     assert!(matches!(SimAddressSpace::new(1 << 30, bad), Err(Error::InvalidConfig { .. })));
    /// }
    /// ```
    pub fn new(physical: u64, granule: u64) -> Result<Self> {
        Self::with_span(physical, granule, Self::DEFAULT_SPAN)
    }

    /// A space as [`new`](Self::new) with `span` bytes of addresses
    /// (rounded down to the granule, at least one granule, at most the
    /// addresses above [`BASE`](Self::BASE)).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn with_span(physical: u64, granule: u64, span: u64) -> Result<Self> {
        if !granule.is_power_of_two() || !(256..=Self::MAX_GRANULE).contains(&granule) {
            return Err(Error::InvalidConfig {
                what: "a simulated space's granule is a power of two from 256 to 2^40",
            });
        }
        let span = (span.min(u64::MAX - Self::BASE) & !(granule - 1)).max(granule);
        let mut space = CoalescingIndex::new(granule);
        space.add_range(Range::new(Self::BASE, span).expect("the span fits above BASE")).expect("one node");
        Ok(SimAddressSpace {
            granule,
            base: Self::BASE,
            span,
            pieced: false,
            state: Mutex::new(State {
                space,
                reservations: BTreeMap::new(),
                ledger: CommitLedger::new(physical, granule),
            }),
        })
    }

    /// Commits each range in pieces of up to `granules` granules from its
    /// start, and gives back whole pieces only, as CUDA's physical handles
    /// of that many granules: a decommit that takes part of a piece is
    /// refused ([`Error::InvalidConfig`], counted in
    /// [`partial_decommits`](Self::partial_decommits)), and
    /// [`releasable`](ReservableSpace::releasable) answers whole pieces.
    ///
    /// # Errors
    ///
    /// As [`CommitLedger::hold_in_pieces`].
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vpool::{VirtualConfig, VirtualPool};
    /// use memres_core::{Inspect, MemoryResourceMut, Request};
    /// use memres_sim::SimAddressSpace;
    /// let mib = 1 << 20;
    /// let space = SimAddressSpace::new(1 << 30, 2 * mib)?.with_pieces(4)?;
    /// let mut pool = VirtualPool::with_config(&space, VirtualConfig::new(64 * mib))?;
    /// let a = pool.allocate(Request::new(3 * mib)?, &())?; // one piece of two granules
    /// let b = pool.allocate(Request::new(mib)?, &())?; // in a's second granule
    /// pool.deallocate(a, &())?;
    /// // a's first granule is free, but b keeps its piece: nothing goes back,
    /// // and the pool counts what the space holds.
    /// assert_eq!((space.committed_bytes(), pool.usage().held), (4 * mib, 4 * mib));
    /// pool.deallocate(b, &())?;
    /// assert_eq!((space.committed_bytes(), space.partial_decommits()), (0, 0));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn with_pieces(mut self, granules: u64) -> Result<Self> {
        self.lock().ledger.hold_in_pieces(granules)?;
        self.pieced = true;
        Ok(self)
    }

    /// The space with its addresses from `base` rather than
    /// [`BASE`](Self::BASE): a second space beside a first, whose
    /// reservations the first never makes too. Its
    /// [`addresses`](Self::addresses) must not meet the other's.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if `base` is zero or not a multiple of
    /// [`MAX_GRANULE`](Self::MAX_GRANULE) (to which every granule's
    /// alignment is owed), its addresses would run past `u64::MAX`, or a
    /// reservation is made already.
    ///
    /// ```
    /// use memres_core::Error;
    /// use memres_sim::SimAddressSpace;
    /// let space = SimAddressSpace::new(1 << 30, 2 << 20)?.at(1 << 63)?;
    /// assert_eq!(space.addresses().start(), 1 << 63);
    /// assert!(matches!(SimAddressSpace::new(1 << 30, 2 << 20)?.at(3 << 20), Err(Error::InvalidConfig { .. })));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn at(mut self, base: u64) -> Result<Self> {
        let bad = |what| Err(Error::InvalidConfig { what });
        if base == 0 || base % Self::MAX_GRANULE != 0 {
            return bad("a simulated space's base is a non-zero multiple of 2^40");
        }
        let Some(addresses) = Range::new(base, self.span) else {
            return bad("a simulated space's addresses run past u64::MAX");
        };
        let mut s = self.lock();
        if !s.reservations.is_empty() {
            return bad("a simulated space with reservations cannot move");
        }
        let mut space = CoalescingIndex::new(self.granule);
        space.add_range(addresses)?;
        s.space = space;
        drop(s);
        self.base = base;
        Ok(self)
    }

    /// The addresses it reserves from: [`BASE`](Self::BASE) (or the base
    /// given to [`at`](Self::at)) and its span.
    pub fn addresses(&self) -> Range {
        Range::new(self.base, self.span).expect("checked when made")
    }

    /// Decommits refused for taking part of a piece
    /// ([`with_pieces`](Self::with_pieces)).
    pub fn partial_decommits(&self) -> u64 {
        self.lock().ledger.partial_decommits()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes of physical memory.
    pub fn physical_bytes(&self) -> u64 {
        self.lock().ledger.physical_bytes()
    }

    /// Bytes of addresses.
    pub fn span(&self) -> u64 {
        self.span
    }

    /// Bytes committed now.
    pub fn committed_bytes(&self) -> u64 {
        self.lock().ledger.committed_bytes()
    }

    /// The most bytes ever committed at once.
    pub fn peak_committed_bytes(&self) -> u64 {
        self.lock().ledger.peak_committed_bytes()
    }

    /// Forgets the peak: it restarts from what is committed now.
    pub fn reset_peak(&self) {
        self.lock().ledger.reset_peak();
    }

    /// Bytes of addresses reserved now.
    pub fn reserved_bytes(&self) -> u64 {
        self.lock().reservations.values().map(|r| r.len).sum()
    }

    /// The longest run of addresses not reserved: reservations released
    /// leave gaps, so a reservation may not fit where the bytes would.
    pub fn largest_unreserved(&self) -> u64 {
        self.lock().space.largest_free()
    }

    /// Successful commit and decommit calls so far.
    pub fn call_counts(&self) -> (u64, u64) {
        self.lock().ledger.call_counts()
    }

    /// Injected commit and decommit failures delivered so far: an armed
    /// failure fires in a later call, or never.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::{CommitLedger, ReservableSpace};
    /// use memres_core::Range;
    /// use memres_sim::SimAddressSpace;
    /// let space = SimAddressSpace::new(1 << 30, 1 << 20)?;
    /// let r = space.reserve(4 << 20)?;
    /// let one = Range::new(r.start(), 1 << 20).unwrap();
    /// space.commit(one)?;
    /// space.fail_nth_decommit(1);
    /// assert_eq!(space.decommit(one, &()), Err(CommitLedger::INJECTED_DECOMMIT_FAILURE));
    /// assert_eq!(space.injected_failures(), (0, 1));
    /// # space.decommit(one, &())?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn injected_failures(&self) -> (u64, u64) {
        self.lock().ledger.injected_failures()
    }

    /// Whether every granule of `range` is committed (false for a range that
    /// is not inside one reservation).
    pub fn is_committed(&self, range: Range) -> bool {
        let s = &mut *self.lock();
        reservation_of(&mut s.reservations, range)
            .is_some_and(|(bits, r)| s.ledger.is_committed(bits, r, range))
    }

    /// Makes the `n`th commit from now fail (`n = 1`: the next one) with an
    /// injected backend error; `n = 0` cancels.
    pub fn fail_nth_commit(&self, n: u64) {
        self.lock().ledger.fail_nth_commit(n);
    }

    /// Makes the `n`th decommit from now fail with an injected backend
    /// error; `n = 0` cancels.
    pub fn fail_nth_decommit(&self, n: u64) {
        self.lock().ledger.fail_nth_decommit(n);
    }
}

impl ReservableSpace for SimAddressSpace {
    fn granule(&self) -> u64 {
        self.granule
    }

    fn reserve(&self, len: u64) -> Result<Range> {
        if len == 0 || len % self.granule != 0 {
            return Err(Error::InvalidSize { size: len, what: "not a non-zero multiple of the granule" });
        }
        let mut s = self.lock();
        let granules = len / self.granule;
        let reserved: u64 = s.reservations.values().map(|r| r.len / self.granule).sum();
        // The granules a bitmap may still be made for, in bytes.
        let room = (Self::MAX_RESERVED_GRANULES - reserved).saturating_mul(self.granule);
        // The longest reservation ever made: the span, the granules kept
        // bitmaps for, and the longest range the index hands out.
        let longest =
            self.span.min(Self::MAX_RESERVED_GRANULES.saturating_mul(self.granule)).min(Request::MAX_SIZE);
        let out_of_memory = |s: &State| Error::OutOfMemory {
            requested: len,
            largest_free: s.space.largest_free().min(room).min(longest),
            pool_size: self.span,
            max_size: Some(longest),
        };
        if len > longest || len > room {
            return Err(out_of_memory(&s));
        }
        // The bitmap before the addresses: a failure leaves nothing to undo.
        let mut committed = Vec::new();
        if committed.try_reserve_exact(CommitLedger::words(granules)).is_err() {
            return Err(out_of_memory(&s));
        }
        committed.resize(CommitLedger::words(granules), 0);
        match s.space.allocate(len, self.granule)? {
            Some(a) => {
                s.reservations.insert(a.addr, Reservation { len, tag: a.tag, committed });
                Ok(Range::new(a.addr, len).expect("inside the span"))
            }
            None => Err(out_of_memory(&s)),
        }
    }

    fn release(&self, range: Range) -> Result<()> {
        let mut s = self.lock();
        let Some(r) = s.reservations.get(&range.start()).filter(|r| r.len == range.len()) else {
            return Err(Error::UnknownBlock { addr: range.start() });
        };
        if r.committed.iter().any(|&w| w != 0) {
            return Err(Error::InvalidConfig { what: "release of a reservation with committed memory" });
        }
        let tag = r.tag;
        s.space.free(tag, range.start(), range.len())?;
        s.reservations.remove(&range.start());
        Ok(())
    }

    fn commit(&self, range: Range) -> Result<()> {
        let s = &mut *self.lock();
        s.ledger.commit(reservation_of(&mut s.reservations, range), range)
    }

    fn decommit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
        let g = self.granule;
        let aligned = !range.is_empty() && range.start() % g == 0 && range.len() % g == 0;
        if aligned && self.is_committed(range) {
            // As a CUDA backend may: let the stream's work finish, then unmap.
            stream.synchronize()?;
        }
        // Misuse is told unsynchronized, as the CUDA space tells it: a
        // decommit that unmaps nothing orders no work.
        let s = &mut *self.lock();
        s.ledger.decommit(reservation_of(&mut s.reservations, range), range)
    }

    fn releasable(&self, range: Range, want: u64) -> Option<Range> {
        match self.pieced {
            true => self.lock().ledger.releasable(range, want),
            false => vmem::highest(range, want),
        }
    }
}
