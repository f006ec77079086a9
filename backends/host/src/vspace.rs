use memres_core::pool::CoalescingIndex;
use memres_core::vmem::ReservableSpace;
use memres_core::{Error, Range, Result, Stream};
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
/// address space, and can be told to fail the Nth commit or decommit. As the
/// CUDA backend may, `decommit` synchronizes the stream before unmapping.
/// It is `Sync`: one space can serve several pools and be inspected while
/// they use it.
///
/// # Examples
///
/// ```
/// use memres_core::vpool::VirtualPool;
/// use memres_core::{MemoryResourceMut, Request};
/// use memres_host::SimAddressSpace;
/// // 80 GiB of physical memory, 2 MiB granules; the pool reserves 64 GiB
/// // of addresses and keeps up to 256 MiB of free memory committed.
/// let space = SimAddressSpace::new(80 << 30, SimAddressSpace::DEFAULT_GRANULE);
/// let mut pool = VirtualPool::new(&space, 64 << 30, 256 << 20)?;
/// let b = pool.allocate(Request::new(5 << 20)?, &())?;
/// assert_eq!(space.committed_bytes(), 6 << 20);
/// pool.deallocate(b, &())?;
/// assert_eq!((space.committed_bytes(), space.peak_committed_bytes()), (6 << 20, 6 << 20)); // kept
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct SimAddressSpace {
    granule: u64,
    physical: u64,
    span: u64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Free and reserved ranges of the address space.
    space: CoalescingIndex,
    /// Live reservations by start address: their index tag and a bitmap of
    /// committed granules.
    reservations: BTreeMap<u64, Reservation>,
    committed: u64,
    peak: u64,
    commits: u64,
    decommits: u64,
    /// Commits to let through before one fails (0: none pending).
    fail_commit_in: u64,
    /// Decommits to let through before one fails (0: none pending).
    fail_decommit_in: u64,
}

#[derive(Debug)]
struct Reservation {
    len: u64,
    tag: u64,
    committed: Vec<u64>,
}

/// Counts down an injected failure; true when this call must fail.
fn injected(counter: &mut u64) -> bool {
    if *counter == 0 {
        return false;
    }
    *counter -= 1;
    *counter == 0
}

impl SimAddressSpace {
    /// Where the simulated address space starts.
    pub const BASE: u64 = 0x2000_0000_0000;
    /// The default size of the address space: 2^46 bytes (64 TiB).
    pub const DEFAULT_SPAN: u64 = 1 << 46;
    /// The granule of CUDA's virtual memory on current GPUs: 2 MiB.
    pub const DEFAULT_GRANULE: u64 = 2 << 20;

    /// A space with `physical` bytes of memory to commit, granules of
    /// `granule` bytes, and [`DEFAULT_SPAN`](Self::DEFAULT_SPAN) bytes of
    /// addresses.
    ///
    /// # Panics
    ///
    /// If `granule` is not a power of two of at least 256.
    pub fn new(physical: u64, granule: u64) -> Self {
        Self::with_span(physical, granule, Self::DEFAULT_SPAN)
    }

    /// A space as [`new`](Self::new) with `span` bytes of addresses
    /// (rounded down to the granule, at least one granule).
    ///
    /// # Panics
    ///
    /// If `granule` is not a power of two of at least 256.
    pub fn with_span(physical: u64, granule: u64, span: u64) -> Self {
        assert!(granule.is_power_of_two() && granule >= 256, "granule {granule} not a power of two >= 256");
        let span = (span & !(granule - 1)).max(granule);
        let mut space = CoalescingIndex::new(granule);
        space.add_range(Range::new(Self::BASE, span).expect("the span fits above BASE")).expect("one node");
        SimAddressSpace {
            granule,
            physical,
            span,
            state: Mutex::new(State {
                space,
                reservations: BTreeMap::new(),
                committed: 0,
                peak: 0,
                commits: 0,
                decommits: 0,
                fail_commit_in: 0,
                fail_decommit_in: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes of physical memory.
    pub fn physical_bytes(&self) -> u64 {
        self.physical
    }

    /// Bytes of addresses.
    pub fn span(&self) -> u64 {
        self.span
    }

    /// Bytes committed now.
    pub fn committed_bytes(&self) -> u64 {
        self.lock().committed
    }

    /// The most bytes ever committed at once.
    pub fn peak_committed_bytes(&self) -> u64 {
        self.lock().peak
    }

    /// Forgets the peak: it restarts from what is committed now.
    pub fn reset_peak(&self) {
        let mut s = self.lock();
        s.peak = s.committed;
    }

    /// Bytes of addresses reserved now.
    pub fn reserved_bytes(&self) -> u64 {
        self.lock().reservations.values().map(|r| r.len).sum()
    }

    /// Successful commit and decommit calls so far.
    pub fn call_counts(&self) -> (u64, u64) {
        let s = self.lock();
        (s.commits, s.decommits)
    }

    /// Whether every granule of `range` is committed (false for a range that
    /// is not inside one reservation).
    pub fn is_committed(&self, range: Range) -> bool {
        let s = self.lock();
        let Some((&start, r)) = s.reservations.range(..=range.start()).next_back() else {
            return false;
        };
        if range.end() > start + r.len {
            return false;
        }
        let first = (range.start() - start) / self.granule;
        let last = (range.end() - start).div_ceil(self.granule);
        (first..last).all(|i| r.committed[i as usize / 64] >> (i % 64) & 1 == 1)
    }

    /// Makes the `n`th commit from now fail (`n = 1`: the next one) with an
    /// injected backend error; `n = 0` cancels.
    pub fn fail_nth_commit(&self, n: u64) {
        self.lock().fail_commit_in = n;
    }

    /// Makes the `n`th decommit from now fail with an injected backend
    /// error; `n = 0` cancels.
    pub fn fail_nth_decommit(&self, n: u64) {
        self.lock().fail_decommit_in = n;
    }

    /// Sets the committed bits of `range` to `to`; they must all be `!to`.
    fn flip(&self, s: &mut State, range: Range, to: bool) -> Result<()> {
        let g = self.granule;
        if range.is_empty() || range.start() % g != 0 || range.len() % g != 0 {
            return Err(Error::InvalidConfig { what: "range empty or not aligned to the granule" });
        }
        let Some((&start, r)) = s.reservations.range_mut(..=range.start()).next_back() else {
            return Err(Error::InvalidConfig { what: "range outside the reservations" });
        };
        if range.end() > start + r.len {
            return Err(Error::InvalidConfig { what: "range outside the reservations" });
        }
        let granules = (range.start() - start) / g..(range.end() - start) / g;
        if granules.clone().any(|i| (r.committed[i as usize / 64] >> (i % 64) & 1 == 1) == to) {
            return Err(Error::InvalidConfig {
                what: if to { "commit of committed memory" } else { "decommit of uncommitted memory" },
            });
        }
        for i in granules {
            r.committed[i as usize / 64] ^= 1 << (i % 64);
        }
        Ok(())
    }
}

impl ReservableSpace for SimAddressSpace {
    fn granule(&self) -> u64 {
        self.granule
    }

    fn reserve(&self, len: u64) -> Result<Range> {
        if len == 0 || len % self.granule != 0 {
            return Err(Error::InvalidSize { size: len });
        }
        let mut s = self.lock();
        let out_of_addresses = |s: &State| Error::OutOfMemory {
            requested: len,
            largest_free: s.space.largest_free(),
            pool_size: self.span,
            max_size: Some(self.span),
        };
        if len > self.span {
            return Err(out_of_addresses(&s));
        }
        match s.space.allocate(len, self.granule)? {
            Some(a) => {
                let words = (len / self.granule).div_ceil(64) as usize;
                s.reservations.insert(a.addr, Reservation { len, tag: a.tag, committed: vec![0; words] });
                Ok(Range::new(a.addr, len).expect("inside the span"))
            }
            None => Err(out_of_addresses(&s)),
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
        let mut s = self.lock();
        if injected(&mut s.fail_commit_in) {
            return Err(Error::Backend { code: 2, what: "injected commit failure of the simulated space" });
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

    fn decommit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
        // As a CUDA backend may: let the stream's work finish, then unmap.
        stream.synchronize()?;
        let mut s = self.lock();
        if injected(&mut s.fail_decommit_in) {
            return Err(Error::Backend { code: 2, what: "injected decommit failure of the simulated space" });
        }
        self.flip(&mut s, range, false)?;
        s.committed -= range.len();
        s.decommits += 1;
        Ok(())
    }
}
