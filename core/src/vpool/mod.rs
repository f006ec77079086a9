//! The virtual-memory pool: reserved address ranges (one unless
//! `max_reservations` allows more), physical memory mapped only where live
//! blocks are.
//!
//! A pool over separate upstream chunks strands the free space between
//! chunks: blocks never span two chunks, so a large request may need a new
//! chunk while the old ones hold enough free bytes in pieces. The CUDA
//! driver's pool and PyTorch's expandable segments avoid this with virtual
//! memory, and so does [`VirtualPool`]: it reserves one large range of a
//! [`ReservableSpace`], suballocates it with the same O(1) index as the
//! coalescing pool, commits the granules a new block touches and decommits
//! granules that no live block touches, keeping a bounded amount of free
//! committed memory so that alternating allocate and free does not map and
//! unmap on every call.

mod bits;
mod check;
mod commit;
mod config;
mod idle;
#[cfg(test)]
mod idle_tests;
#[cfg(test)]
mod panic_tests;
#[cfg(test)]
mod tests;

pub use config::VirtualConfig;

use crate::index::{Allocation, CoalescingIndex};
use crate::resource::in_destructor;
use crate::vmem::ReservableSpace;
use crate::{Block, Error, Inspect, MemoryResourceMut, Range, Request, Result, Stream};
use alloc::vec::Vec;
use bits::Bits;
use core::fmt;

/// One reservation of the space.
#[derive(Clone, Copy, Debug)]
struct Reservation {
    range: Range,
    /// The index node at the reservation's lowest address (never moves).
    first: u32,
    /// The slot of the reservation's first granule; its granules are the
    /// slots `base .. base + range.len() / granule`.
    base: u32,
}

/// How many free ranges a block smaller than a granule may look at for a
/// place that maps nothing new (see [`VirtualPool::move_small`]).
const PLACE_TRIES: u32 = 8;

/// The reservation of `reservations` (sorted by address) holding `addr`.
#[inline(always)]
fn reservation_at(reservations: &[Reservation], addr: u64) -> Option<&Reservation> {
    if let [r] = reservations {
        return r.range.contains(addr).then_some(r);
    }
    let i = reservations.partition_point(|r| r.range.start() <= addr);
    let r = reservations.get(i.checked_sub(1)?)?;
    r.range.contains(addr).then_some(r)
}

/// The slots of the granules (of `1 << shift` bytes) that `start..end`,
/// inside `r`, touches.
#[inline]
fn slots_touched(r: &Reservation, shift: u32, start: u64, end: u64) -> (u32, u32) {
    let lo = (start - r.range.start()) >> shift;
    let hi = (end - r.range.start()).div_ceil(1 << shift);
    (r.base + lo as u32, r.base + hi as u32)
}

/// A pool over reserved address ranges (one unless
/// [`VirtualConfig::max_reservations`] allows more) that maps physical memory
/// only where live blocks are: the design of the CUDA driver's pool and of
/// PyTorch's expandable segments, with the O(1) index of
/// [`CoalescingPool`](crate::pool::CoalescingPool).
///
/// ```text
///  reservation ┌──────────────────────────────────────────────────────────┐
///  index       │ used │  free  │used│used│          free          │ used  │
///  granules    │ Busy │ Busy │ Idle │Busy│ Idle │ Unc. │ Unc. │Busy│ Busy │
///  committed   │  1   │  1   │  1   │ 1  │  1   │  0   │  0   │ 1  │  1   │
///              └──────────────────────────────────────────────────────────┘
///  candidates: Idle runs the last search found, taken highest first
///
///  allocate: index (O(1)); a block under a granule that would touch one
///            no live block does moves, if it can, to the end of a free
///            range where a live block keeps the granule ─► all its
///            granules committed? done. Else, beyond the peak (+ slack),
///            decommit candidates (searching again if they run short);
///            commit its Uncommitted granules (in runs)
///  free:     index (O(1)); only with a release threshold: count the
///            granules the block leaves Idle ─► over `keep`: decommit
///  search:   the index's free ranges of a granule or more ─► the
///            committed granules wholly inside them are the Idle ones
/// ```
///
/// - Every block is aligned to 256 bytes, or more when asked; sizes are
///   rounded up to 256 bytes. Every granule a live block touches is
///   committed before the block is handed out.
/// - A granule is Busy exactly when a live block touches it; then it stays
///   committed. The pool keeps no per-granule record of that: a granule is
///   Idle exactly when it is committed and lies wholly inside a free range
///   of the index, and the pool looks for such granules only when it gives
///   memory back. Between two searches, a block placed over a granule
///   marks it touched, and no trim takes a touched granule.
/// - Kept Idle memory never raises the peak of committed memory beyond the
///   [slack](VirtualConfig::slack_permille) (with
///   [`VirtualConfig::trim_on_commit`], the default): an allocation that
///   would commit beyond `(1 + slack) ×` the peak of bytes in use, or
///   beyond the peak of granules live blocks touch if that is more, first
///   decommits Idle granules.
/// - A failed allocate hands out nothing and changes no block; it may have
///   decommitted Idle memory (to stay under the peak, or to retry after the
///   space ran out of physical memory), and granules that it committed and
///   then failed to decommit stay committed and Idle.
/// - A method of the space that panics is taken as one that failed: the
///   panic propagates, and an allocate gives its block back to the index,
///   counting the granules it committed before as committed and Idle; a
///   trim it interrupted is pending. A decommit that failed having taken
///   part of its range
///   ([`DECOMMITTED_IN_PART`](crate::vmem::DECOMMITTED_IN_PART)), and a
///   commit or decommit that panicked (which may have changed its range,
///   outside the space's contract), are followed by a commit of each of
///   their granules, so that the pool counts what the space holds.
/// - A space that frees memory only in pieces longer than a granule (CUDA's
///   physical handles; [`ReservableSpace::releasable`]) is asked only to
///   decommit whole pieces. An Idle granule whose piece a live block holds
///   stays committed, and the pool counts it with the Busy ones, for the
///   slack and the release threshold alike: what it keeps and its peak are
///   then those of the memory the space holds. (With a release threshold,
///   a free then searches while such granules exceed it.)
/// - At most `keep` bytes of committed memory are Idle after every call
///   unless a decommit failed: its granules stay committed and Idle, and
///   the next free, failed allocate or [`trim`](Self::trim) retries
///   (`trim` returns the space's error). Idle granules are decommitted
///   highest address first, a run of them in one call; a free that leaves
///   the first Idle granules gives back its own.
/// - Out of physical memory (the space's [`Error::OutOfMemory`] on a
///   commit): the pool decommits its Idle granules and tries once more, as
///   the CUDA pool trims before it fails; the space's error if it still
///   does not fit. If a decommit of that trim fails, it retries only if
///   the other decommits gave memory back, and an allocation that still
///   does not fit fails with the decommit's error, not out of memory: the
///   Idle granules the space kept committed might have made room. If it
///   still does not fit, the block goes back to the index and the pool
///   decommits every Idle granule once more; if that gave memory back,
///   it places the block once more. (A space that frees memory in pieces
///   gives back only then the Idle granules that share a piece with the
///   block: while it was placed, it held them.)
/// - Out of reserved room: another reservation when the configuration
///   allows one. Where none can be added (at `max_reservations`, the space
///   out of addresses for it (its out-of-memory error), or its granules
///   would take the pool's to `u32::MAX`), any free range that holds the
///   block, past the first ranges of its size class that the O(1) search
///   looks at; else [`Error::OutOfMemory`] with the request, the largest
///   free block, the committed bytes and the bytes reserved. Where adding
///   one fails with another error (the space's, or a reservation of the
///   wrong shape or overlapping one the pool holds: `UpstreamMisbehaved`),
///   which changes nothing, any free range that holds the block as well;
///   else that error.
///
/// **Streams.** A decommit is ordered on the stream of the call in progress
/// (see [`ReservableSpace::decommit`]). As every plain memres pool, the
/// pool reuses a freed block for the next request whatever its stream: with
/// several streams it belongs under a stream-ordered layer.
///
/// # Time Complexity
///
/// When no granule needs mapping or unmapping, allocate and free are O(1)
/// whatever the block's size, plus, for a block under a granule that the
/// index places on a granule no live block touches, a look at up to 8
/// other free ranges. Where the O(1) search finds no room and no
/// reservation can be added (or adding one fails), allocate looks at every
/// free range that may hold the block: O(free ranges). A call that maps
/// or unmaps costs what that costs, plus O(granules / 64) over the
/// bitmaps, plus, where it searches for Idle granules (a commit beyond the
/// limit whose candidates ran short, a trim, a free beyond `keep` after
/// other Idle granules), O(free ranges of a granule or more + their
/// granules / 64).
///
/// # Examples
///
/// ```
/// use memres_core::vmem::CountingSpace;
/// use memres_core::vpool::{VirtualConfig, VirtualPool};
/// use memres_core::{Inspect, MemoryResourceMut, Request};
/// let space = CountingSpace::new(1 << 30, 2 << 20);
/// let mut pool = VirtualPool::with_config(&space, VirtualConfig::new(64 << 20))?;
/// let a = pool.allocate(Request::new(3 << 20)?, &())?;
/// assert_eq!(space.committed_bytes(), 4 << 20); // two granules
/// let b = pool.allocate(Request::new(1000)?, &())?;
/// pool.deallocate(a, &())?;
/// assert_eq!(space.committed_bytes(), 2 << 20); // the one `b` touches
/// pool.deallocate(b, &())?;
/// assert_eq!((space.committed_bytes(), pool.usage().peak_held), (0, 4 << 20));
/// # Ok::<(), memres_core::Error>(())
/// ```
pub struct VirtualPool<V: ReservableSpace> {
    space: V,
    index: CoalescingIndex,
    /// The live reservations, sorted by address; each is one region of the
    /// index, covered exactly by its nodes.
    reservations: Vec<Reservation>,
    /// Per slot: whether the granule is committed. Every granule a live
    /// block touches is; the others are Idle.
    committed_bits: Bits,
    /// Idle granules that the last search found and no trim took yet, as
    /// runs of slots by address, disjoint, each in one reservation: taken
    /// from the last (highest) down. Each of their granules that
    /// `touched` does not mark is committed and Idle.
    candidates: Vec<(u32, u32)>,
    /// Per slot: whether a block was placed over the granule since the
    /// last search (set only while there are candidates), or a free gave
    /// it back without a search.
    touched: Bits,
    /// Number of committed granules.
    committed: u64,
    /// Highest `committed` ever.
    peak_committed: u64,
    /// Highest number of committed granules not Idle that a search found
    /// (at most `peak_committed`): the limit of trim on commit knows no
    /// more than that.
    peak_busy: u64,
    /// Highest bytes handed out at once (sizes rounded up to 256), counted
    /// when a block is handed out.
    peak_used: u64,
    /// At least the number of Idle granules, where the pool counts them
    /// ([`counts_idle`](Self::counts_idle)): set by each search, raised by
    /// each free by the granules it leaves Idle, lowered by decommits, not
    /// lowered when a block is placed over Idle granules.
    idle_bound: u64,
    /// log2 of the space's granule.
    shift: u32,
    config: VirtualConfig,
    /// A decommit failed, or a free left its trim to a later call
    /// ([`deallocate_keeping`](Self::deallocate_keeping)), and Idle bytes
    /// may exceed `keep` until a trim brings them down to it.
    trim_pending: bool,
    /// Whole granules in `config.keep`: the most Idle granules after a call.
    keep: u64,
}

impl<V: ReservableSpace> VirtualPool<V> {
    /// A pool over `space` with the default configuration: one reservation
    /// of [`VirtualConfig::DEFAULT_RESERVE`] bytes, made now, and no free
    /// committed memory kept.
    ///
    /// # Errors
    ///
    /// As [`with_config`](Self::with_config).
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::CountingSpace;
    /// use memres_core::vpool::{VirtualConfig, VirtualPool};
    /// use memres_core::Inspect;
    /// let space = CountingSpace::new(1 << 30, 2 << 20);
    /// let pool = VirtualPool::new(&space)?;
    /// assert_eq!((pool.reserved_bytes(), pool.usage().held), (64 << 30, 0));
    /// // Larger than the address space:
    /// assert!(VirtualPool::with_config(&space, VirtualConfig::new(1 << 60)).is_err());
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn new(space: V) -> Result<Self> {
        Self::with_config(space, VirtualConfig::default())
    }

    /// A pool over `space` with `config`; the first reservation is made now.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a configuration the space's granule
    /// does not allow ([`VirtualConfig::check`]); the space's error if it
    /// cannot reserve.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::CountingSpace;
    /// use memres_core::vpool::{VirtualConfig, VirtualPool};
    /// use memres_core::{MemoryResourceMut, Request};
    /// let space = CountingSpace::new(1 << 30, 1 << 20);
    /// let mut pool = VirtualPool::with_config(&space, VirtualConfig::new(4 << 20).max_reservations(2))?;
    /// let a = pool.allocate(Request::new(3 << 20)?, &())?;
    /// let b = pool.allocate(Request::new(3 << 20)?, &())?; // a second reservation
    /// assert_eq!(pool.reserved_bytes(), 8 << 20);
    /// assert!(pool.allocate(Request::new(3 << 20)?, &()).unwrap_err().is_out_of_memory());
    /// # pool.deallocate(a, &())?; pool.deallocate(b, &())?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn with_config(space: V, config: VirtualConfig) -> Result<Self> {
        let granule = space.granule();
        config.check(granule)?;
        let mut pool = VirtualPool {
            space,
            index: CoalescingIndex::new(256),
            reservations: Vec::new(),
            committed_bits: Bits::default(),
            candidates: Vec::new(),
            touched: Bits::default(),
            committed: 0,
            peak_committed: 0,
            peak_busy: 0,
            peak_used: 0,
            idle_bound: 0,
            shift: granule.trailing_zeros(),
            config,
            trim_pending: false,
            keep: config.keep >> granule.trailing_zeros(),
        };
        pool.add_reservation(config.reserve)?;
        Ok(pool)
    }

    /// The space.
    pub fn space(&self) -> &V {
        &self.space
    }

    /// The configuration.
    pub fn config(&self) -> &VirtualConfig {
        &self.config
    }

    /// The space's granule.
    pub fn granule(&self) -> u64 {
        1 << self.shift
    }

    /// Bytes reserved (committed or not).
    pub fn reserved_bytes(&self) -> u64 {
        self.reservations.iter().map(|r| r.range.len()).sum()
    }

    /// Committed bytes: the pool's physical footprint (its usage's `held`).
    #[inline]
    pub fn committed_bytes(&self) -> u64 {
        self.committed << self.shift
    }

    /// Committed bytes that no live block touches, counted afresh: O(ranges
    /// of the index). At most `keep` where the space frees any granule; see
    /// [`releasable_bytes`](Self::releasable_bytes).
    pub fn idle_bytes(&self) -> u64 {
        self.count_idle() << self.shift
    }

    /// The Idle bytes the space can give back
    /// ([`ReservableSpace::releasable`]): all of
    /// [`idle_bytes`](Self::idle_bytes), unless the space frees memory in
    /// pieces longer than a granule and live blocks hold some of them. At
    /// most `keep` after every call unless a decommit failed. Counted
    /// afresh: O(ranges of the index).
    ///
    /// ```
    /// use memres_core::vmem::CountingSpace;
    /// use memres_core::vpool::{VirtualConfig, VirtualPool};
    /// use memres_core::{MemoryResourceMut, Request};
    /// let mib = 1 << 20;
    /// // Memory in pieces of 4 granules, given back whole only.
    /// let space = CountingSpace::new(1 << 30, mib).with_pieces(4)?;
    /// let mut pool = VirtualPool::with_config(&space, VirtualConfig::new(64 * mib).release_threshold(u64::MAX))?;
    /// let x = pool.allocate(Request::new(4 * mib)?, &())?; // one piece
    /// pool.deallocate(x, &())?;
    /// assert_eq!(pool.releasable_bytes(), 4 * mib);
    /// let y = pool.allocate(Request::new(mib)?, &())?; // on the piece's first granule
    /// assert_eq!((pool.idle_bytes(), pool.releasable_bytes()), (3 * mib, 0));
    /// assert_eq!(pool.trim(&())?, 0); // `y` holds the piece
    /// pool.deallocate(y, &())?;
    /// assert_eq!(pool.trim(&())?, 4 * mib);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn releasable_bytes(&self) -> u64 {
        self.count_releasable() << self.shift
    }

    /// Frees the block as [`deallocate`](MemoryResourceMut::deallocate)
    /// does, but decommits nothing: Idle granules beyond `keep` stay, as
    /// after a failed decommit, until the next free, failed allocate or
    /// [`trim`](Self::trim), whose stream must be ordered after this free
    /// (a free on another stream than the one the pool serves, which the
    /// pool's stream waits on before its next call).
    ///
    /// # Errors
    ///
    /// As `deallocate`; nothing changes then.
    pub fn deallocate_keeping(&mut self, block: Block) -> Result<()> {
        self.free_block(block, false, &())
    }

    /// Gives `block` back to the index; its granules that no live block
    /// touches any more are Idle. Beyond `keep`, a trim ordered on
    /// `stream` if `now`, else a trim pending.
    #[inline]
    fn free_block<S: Stream + ?Sized>(&mut self, block: Block, now: bool, stream: &S) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let freed = match self.index.free(block.tag(), block.addr(), block.size()) {
            Ok(freed) => freed,
            Err(Error::UnknownBlock { .. }) => self.deallocate_by_address(block)?,
            Err(e) => return Err(e),
        };
        self.after_free(freed, block.addr(), (block.size() + 255) & !255, now, stream);
        Ok(())
    }

    /// Number of reservations held.
    pub fn reservation_count(&self) -> usize {
        self.reservations.len()
    }

    /// The reserved ranges, by address.
    pub fn reservations(&self) -> impl Iterator<Item = Range> + '_ {
        self.reservations.iter().map(|r| r.range)
    }

    /// Whether `addr` lies in one of the pool's reservations.
    #[inline]
    pub fn holds(&self, addr: u64) -> bool {
        self.reservation_of(addr).is_some()
    }

    fn out_of_memory(&self, requested: u64) -> Error {
        Error::OutOfMemory {
            requested,
            largest_free: self.index.largest_free(),
            pool_size: self.committed << self.shift,
            max_size: Some(self.reserved_bytes()),
        }
    }

    /// Reserves `bytes` (rounded up to the granule) and adds the range to
    /// the index and the slots; returns the range's first index node. Out
    /// of memory where the granules of all reservations would number
    /// `u32::MAX` or more (`with_config` refuses a first one that large).
    fn add_reservation(&mut self, bytes: u64) -> Result<u32> {
        let g = self.granule();
        let base = self.reserved_bytes() >> self.shift;
        let len = match bytes.checked_next_multiple_of(g) {
            Some(len) if base + (len >> self.shift) < u32::MAX as u64 => len,
            _ => return Err(self.out_of_memory(bytes)),
        };
        let granules = len >> self.shift;
        let (base, slots) = (base as u32, (base + granules) as usize);
        let range = self.space.reserve(len)?;
        // The space's fault, not the request's.
        let misbehaved = |what| Error::UpstreamMisbehaved { addr: range.start(), size: range.len(), what };
        // Not given back: the range is, in part, one the pool holds (told
        // before its shape, so that one the pool holds never goes back).
        let at = self.reservations.partition_point(|r| r.range.start() < range.start());
        let overlaps = self.reservations.get(at).is_some_and(|r| r.range.start() < range.end())
            || at.checked_sub(1).is_some_and(|i| self.reservations[i].range.end() > range.start());
        if overlaps {
            return Err(misbehaved("a reservation overlapping one the pool holds"));
        }
        if range.len() != len || range.start() % g != 0 {
            let _ = self.space.release(range);
            return Err(misbehaved("a reservation not sized or aligned as asked"));
        }
        // The bitmaps after the space's yes, so that a request the space
        // refuses takes no host memory (a bitmap of 2^30 granules is 128
        // MiB); host memory they cannot have is out of memory, not an
        // abort. Bits grown and left unused are clear: nothing to undo.
        if self.committed_bits.grow(slots).is_err() || self.touched.grow(slots).is_err() {
            let _ = self.space.release(range);
            return Err(self.out_of_memory(bytes));
        }
        let first = match self.index.add_range(range) {
            Ok(first) => first,
            Err(e) => {
                let _ = self.space.release(range);
                return Err(e);
            }
        };
        let at = self.reservations.partition_point(|r| r.range.start() < range.start());
        self.reservations.insert(at, Reservation { range, first, base });
        Ok(first)
    }

    /// The reservation holding `addr`, by binary search.
    #[inline(always)]
    fn reservation_of(&self, addr: u64) -> Option<&Reservation> {
        reservation_at(&self.reservations, addr)
    }

    /// The reservation holding slot `s`.
    fn reservation_of_slot(&self, s: u32) -> &Reservation {
        self.reservations
            .iter()
            .find(|r| s >= r.base && ((s - r.base) as u64) < r.range.len() >> self.shift)
            .expect("every slot belongs to a reservation")
    }

    /// The slots of the granules that `len` bytes at `addr` touch, in the
    /// reservation that holds them (as every block the index hands out).
    #[inline(always)]
    fn slots_of(&self, addr: u64, len: u64) -> (u32, u32) {
        let r = self.reservation_of(addr).expect("the index hands out reserved addresses");
        self.slots_touched(r, addr, addr + len)
    }

    /// The slots of the granules that `start..end` (inside `r`) touches.
    #[inline]
    fn slots_touched(&self, r: &Reservation, start: u64, end: u64) -> (u32, u32) {
        slots_touched(r, self.shift, start, end)
    }

    /// The address range of slots `lo..hi` of reservation `r`.
    fn slot_range(&self, r: &Reservation, lo: u32, hi: u32) -> Range {
        let start = r.range.start() + (((lo - r.base) as u64) << self.shift);
        Range::new(start, ((hi - lo) as u64) << self.shift).unwrap_or_default()
    }

    /// The most bytes touched by live blocks at once (whole granules) that
    /// the pool has seen: it counts them when it searches for Idle granules
    /// (a commit beyond its limit, a trim), so the true peak may be higher.
    /// With nothing kept Idle, the peak of committed bytes is the true one.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::CountingSpace;
    /// use memres_core::vpool::{VirtualConfig, VirtualPool};
    /// use memres_core::{MemoryResourceMut, Request};
    /// let space = CountingSpace::new(1 << 30, 2 << 20);
    /// let mut pool = VirtualPool::with_config(&space, VirtualConfig::new(64 << 20).release_threshold(64 << 20))?;
    /// let a = pool.allocate(Request::new(3 << 20)?, &())?;
    /// pool.deallocate(a, &())?;
    /// assert_eq!(pool.peak_busy_bytes(), 4 << 20);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn peak_busy_bytes(&self) -> u64 {
        self.peak_busy << self.shift
    }

    /// The most bytes ever handed out at once (sizes rounded up to 256): the
    /// base of the [slack](VirtualConfig::slack_permille).
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::CountingSpace;
    /// use memres_core::vpool::{VirtualConfig, VirtualPool};
    /// use memres_core::{MemoryResourceMut, Request};
    /// let space = CountingSpace::new(1 << 30, 2 << 20);
    /// let mut pool = VirtualPool::with_config(&space, VirtualConfig::new(64 << 20))?;
    /// let a = pool.allocate(Request::new(1000)?, &())?;
    /// pool.deallocate(a, &())?;
    /// assert_eq!(pool.peak_used(), 1024);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn peak_used(&self) -> u64 {
        self.peak_used
    }

    /// Whether a block of `len` bytes at `addr`, carved from the free range
    /// `from`, touches a granule that no other live block touches: one
    /// that the nearest live blocks, which end and begin at `from`'s ends,
    /// do not reach into (a reservation's ends lie on granules).
    #[inline(always)]
    fn takes_own_granule(&self, addr: u64, len: u64, from: Range) -> bool {
        let g = self.granule();
        let (first, last) = (addr & !(g - 1), (addr + len - 1) & !(g - 1));
        let (shared_first, shared_last) = (from.start() > first, from.end() < last + g);
        match first == last {
            true => !(shared_first || shared_last),
            false => !(shared_first && shared_last),
        }
    }

    /// The place of `request`, smaller than a granule, that the index
    /// carved at `a` over a granule no live block touches: where it touches
    /// only granules that live blocks do, at the start or the end of one of
    /// [`PLACE_TRIES`] free ranges ([`CoalescingIndex::move_where`]), if
    /// there is such a place; else `a`'s.
    ///
    /// Without this, small blocks of one shape scatter over granules each
    /// kept by a block or two of another, and the pool maps granules that
    /// the live bytes would not need.
    #[inline(never)]
    fn move_small(&mut self, a: Allocation, request: Request) -> Allocation {
        let (len, g) = (request.rounded_size(256), self.granule());
        // In a free range a granule is touched by a live block exactly when
        // the live block below the range ends in it or the one above
        // begins in it (a reservation's ends lie on granules).
        let kept = |addr: u64, free: Range| {
            let first = addr & !(g - 1);
            let last = (addr + len - 1) & !(g - 1);
            let touched = |start: u64| free.start() > start || free.end() < start + g;
            touched(first) && (first == last || touched(last))
        };
        // On an error the index changed nothing: `a` stays.
        self.index.move_where(a, request.size(), request.align(), PLACE_TRIES, kept).unwrap_or(a)
    }

    /// [`allocate`](MemoryResourceMut::allocate) of a request of more than
    /// 0 bytes; after running out of physical memory, once more if `retry`
    /// and the trim after the block went back gave memory back.
    #[inline]
    fn place<S: Stream + ?Sized>(&mut self, request: Request, stream: &S, retry: bool) -> Result<Block> {
        let (mut a, from) = match self.index.allocate_with_range(request.size(), request.align()) {
            Ok(Some(found)) => found,
            Ok(None) => self.grow_and_allocate(request, stream)?,
            Err(e) => {
                self.retry_trim(stream);
                return Err(e);
            }
        };
        let len = request.rounded_size(256);
        if request.size() < self.granule() && self.takes_own_granule(a.addr, len, from) {
            // It would take a granule no live block touches: look for one
            // that a live block keeps.
            a = self.move_small(a, request);
        }
        let (lo, hi) = self.slots_of(a.addr, len);
        if !self.candidates.is_empty() {
            // No trim may take these granules, whatever the last search saw.
            self.touched.set(lo, hi, true);
        }
        if !self.committed_bits.all(lo, hi) {
            let fresh = self.uncommitted(lo, hi);
            if let Err(failed) = self.commit_fresh(&a, request, (lo, hi), fresh, stream) {
                return match retry && failed.gave_back {
                    true => self.place_again(request, stream, failed.error),
                    false => Err(failed.error),
                };
            }
        }
        self.peak_used = self.peak_used.max(self.index.used_bytes());
        Ok(Block::new(a.addr, request.size(), a.tag))
    }

    /// The second try of an allocate that ran out of physical memory;
    /// `first` is the first try's error. If this one runs out of physical
    /// memory too, a decommit's failure of the first stays the error.
    #[cold]
    #[inline(never)]
    fn place_again<S: Stream + ?Sized>(
        &mut self,
        request: Request,
        stream: &S,
        first: Error,
    ) -> Result<Block> {
        match self.place(request, stream, false) {
            Err(e) if e.is_out_of_memory() && !first.is_out_of_memory() => Err(first),
            got => got,
        }
    }

    /// Reserves another range so that `request` fits, then allocates it;
    /// where no reservation can be added, or adding one failed, from any
    /// free range that holds it. If that fails, retries a pending trim
    /// (ordered on `stream`), as every failed allocate does.
    #[cold]
    fn grow_and_allocate<S: Stream + ?Sized>(
        &mut self,
        request: Request,
        stream: &S,
    ) -> Result<(Allocation, Range)> {
        let added = if self.reservations.len() >= self.config.max_reservations as usize {
            Ok(None)
        } else {
            // Reservations start on a granule: only alignment beyond it pads.
            let pad = request.align().saturating_sub(self.granule());
            let need = request.rounded_size(256) + pad;
            match self.add_reservation(need.max(self.config.reserve)) {
                Ok(first) => Ok(Some(first)),
                // Out of room for it (the space's addresses, or the pool's
                // slots): the request's error, below, not the reservation's.
                Err(e) if e.is_out_of_memory() => Ok(None),
                Err(e) => Err(e),
            }
        };
        let grown = match added {
            Ok(Some(first)) => {
                let range = self.reservations.iter().find(|r| r.first == first).map(|r| r.range);
                // From the new reservation itself (it was one free range):
                // one of exactly `need` bytes may sit in a size class that
                // the index's class search skips.
                self.index.allocate_in(first, request.size(), request.align()).map(|a| a.zip(range))
            }
            // No reservation to be had: any free range that holds it, past
            // the first ranges of its class that the class search looks at.
            // Only here, so that the hot path places blocks as before. Also
            // where adding one failed with an error (the space's, one of
            // the wrong shape or overlapping, the index's): that changed
            // nothing, and a request a free range holds needs no
            // reservation. The reservation's error stands where none does.
            Ok(None) => self.index.allocate_exhaustive_with_range(request.size(), request.align()),
            Err(e) => match self.index.allocate_exhaustive_with_range(request.size(), request.align()) {
                Ok(Some(found)) => Ok(Some(found)),
                _ => Err(e),
            },
        };
        if let Ok(Some(a)) = grown {
            return Ok(a);
        }
        self.retry_trim(stream);
        // Out of room: the figures as the call leaves them.
        Err(grown.err().unwrap_or_else(|| self.out_of_memory(request.size())))
    }

    /// Free of a block whose tag did not name a live node: look the address
    /// up. Returns the free range the block became part of.
    #[cold]
    fn deallocate_by_address(&mut self, block: Block) -> Result<Range> {
        let addr = block.addr();
        let Some(r) = self.reservation_of(addr) else {
            return Err(Error::UnknownBlock { addr });
        };
        let first = r.first;
        let had_tag = block.tag() != Block::NO_TAG;
        self.index.free_by_address(first, addr, block.size(), had_tag)
    }
}

impl<S, V> MemoryResourceMut<S> for VirtualPool<V>
where
    S: Stream + ?Sized,
    V: ReservableSpace,
{
    /// Allocates from the index, then commits the granules the block touches
    /// that are not committed yet. Out of physical memory, it decommits the
    /// Idle granules (ordered on `stream`) and tries once more. If a commit
    /// still fails, what this call committed is decommitted, the block goes
    /// back to the index, and every Idle granule is decommitted; if that
    /// gave any back (a space that frees memory in pieces could not give
    /// back those that shared a piece with the block while it was placed),
    /// the block is placed once more. If that fails too, the error is
    /// returned (a failed decommit's if a trim could not give every Idle
    /// granule back and the pool is still out of physical memory): no
    /// block is ever handed out over unmapped memory. Every failed allocate
    /// retries a trim that a failed decommit left pending.
    #[inline]
    fn allocate(&mut self, request: Request, stream: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        self.place(request, stream, true)
    }

    /// Frees the block; its granules that no live block touches any more
    /// are Idle, and Idle granules beyond `keep` are decommitted, the
    /// block's own first, ordered on `stream`. A failed decommit does not
    /// fail the free: the granules stay committed, and a later free or
    /// [`trim`](VirtualPool::trim) retries.
    #[inline]
    fn deallocate(&mut self, block: Block, stream: &S) -> Result<()> {
        self.free_block(block, true, stream)
    }
}

/// Decommits everything and releases every reservation. The decommits are
/// ordered on no stream (`()`): synchronize the streams that used the pool
/// before dropping it, as before freeing any device memory. Blocks still
/// live dangle, as with every pool; errors of the space are ignored.
// SAFETY: every block is a range of the index inside one of the pool's
// reservations, handed out only once every granule it touches is committed
// (`allocate` commits the Uncommitted ones first), and while the pool lives
// a granule stays committed while a live block touches it: after a
// decommit that took part of its range and failed (`recount_in_part`, on
// Idle granules or the call's own), the pool counts committed only the
// granules that the space then committed or refused as committed already.
// The pool decommits only (the drop aside, which decommits everything and then
// releases the reservations): granules that the call in progress committed
// for a block it does not hand out (`Uncounted::undo`); granules wholly inside
// the free range that the index returned for a block just freed
// (`after_free`, `decommit_freed`), which no live block touches; and candidates
// (`take_candidate`), each wholly inside a free range of the index when a
// search (`scan`) found it. A search replaces the candidates and clears
// `touched`; from then on, while candidates remain, every allocate marks
// in `touched` each granule its block touches before it decommits
// anything, frees make no granule Busy, and `take_candidate` skips marked
// granules: so an unmarked candidate still lies wholly inside free space,
// and no live block touches it. Where the space chooses the part to
// decommit (`ReservableSpace::releasable`, a safe method that may answer
// anything), `releasable` clips its answer to the granules it asked
// about. So a live block lies in ranges the space committed and either
// was not asked to decommit or, asked in a decommit that failed half-way,
// refused to commit again as committed already (the pool trusts that
// answer of a safe method; were it false, the block would lie in a range
// of the space that is not committed, on which `V: MemoryOf<E>` still
// keeps `E` sound, as on a freed block's). `MemoryOf<E>` promises those
// ranges are memory of `E`; once freed, its bytes are a range of the space,
// committed or not, on which the same promise keeps `E` sound. The index
// keeps live ranges disjoint, and the pool's records live in its own
// vectors, never in the space.
unsafe impl<E, V: ReservableSpace + crate::copy::MemoryOf<E>> crate::copy::MemoryOf<E> for VirtualPool<V> {}

impl<V: ReservableSpace> Drop for VirtualPool<V> {
    fn drop(&mut self) {
        for r in core::mem::take(&mut self.reservations) {
            let end = r.base + (r.range.len() >> self.shift) as u32;
            let mut s = r.base;
            while s < end {
                let run = self.committed_bits.find(s, end, true);
                s = self.committed_bits.find(run, end, false);
                if run < s {
                    let range = self.slot_range(&r, run, s);
                    in_destructor(|| {
                        let _ = self.space.decommit(range, &());
                    });
                }
            }
            in_destructor(|| {
                let _ = self.space.release(r.range);
            });
        }
    }
}

impl<V: ReservableSpace> fmt::Debug for VirtualPool<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VirtualPool")
            .field("granule", &self.granule())
            .field("reserved_bytes", &self.reserved_bytes())
            .field("usage", &self.usage())
            .field("idle_bytes", &self.idle_bytes())
            .field("reservations", &self.reservations.len())
            .field("config", &self.config)
            .finish()
    }
}
