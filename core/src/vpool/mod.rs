//! The virtual-memory pool: one reserved address range, physical memory
//! mapped only where live blocks are.
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
mod run_tests;
#[cfg(test)]
mod tests;

pub use config::VirtualConfig;

use crate::index::{Allocation, CoalescingIndex};
use crate::vmem::ReservableSpace;
use crate::{Block, Error, Inspect, MemoryResourceMut, Range, Request, Result, Stream};
use alloc::vec::Vec;
use bits::Bits;
use core::fmt;
use idle::{Run, NONE, SENTINEL};

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

/// A pool over one reserved address range that maps physical memory only
/// where live blocks are: the design of the CUDA driver's pool and of
/// PyTorch's expandable segments, with the O(1) index of
/// [`CoalescingPool`](crate::pool::CoalescingPool).
///
/// ```text
///  reservation ┌──────────────────────────────────────────────────────────┐
///  index       │ used │  free  │used│used│          free          │ used  │
///  granules    │ Busy │ Busy │ Idle │Busy│ Idle │ Unc. │ Unc. │Busy│ Busy │
///              └──────────────────────────────────────────────────────────┘
///  idle list (oldest first): run ◄─► run ◄─► ...   at most `keep` bytes
///            (a run: the Idle granules that one free left, or what is
///            left of them)
///
///  allocate: index (O(1)); a block under a granule that would touch one
///            no live block does moves, if it can, to the end of a free
///            range where a live block keeps the granule ─► the block's
///            Idle granules leave the idle list, a run at a time; beyond
///            the peak (+ slack), decommit as
///            many other Idle ones as needed; commit its Uncommitted
///            granules (in runs) ─► all Busy; count the block at its
///            first and last granule
///  free:     index (O(1)) ─► uncount the block; its granules that no
///            other live block counts turn Idle, one run ─► over `keep`:
///            decommit the oldest Idle granules
/// ```
///
/// - Every block is aligned to 256 bytes, or more when asked; sizes are
///   rounded up to 256 bytes. Every granule a live block touches is
///   committed before the block is handed out.
/// - A granule is Busy exactly when a live block touches it; then it stays
///   committed. Each granule counts the live blocks that begin or end in
///   it: a block touches other blocks' granules only there, so a new or
///   freed block updates two counts, whatever its size, and its granules
///   in between change state as runs, never one by one.
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
/// - At most `keep` bytes of committed memory are Idle after every call
///   unless a decommit failed: its granules stay committed, Idle and
///   counted, and the next free, failed allocate or [`trim`](Self::trim)
///   retries (`trim` returns the space's error). Idle granules are
///   decommitted oldest first (least recently freed), with their Idle
///   neighbours in one call.
/// - Out of physical memory (the space's [`Error::OutOfMemory`] on a
///   commit): the pool decommits its Idle granules and tries once more, as
///   the CUDA pool trims before it fails; the space's error if it still
///   does not fit. If a decommit of that trim fails, it retries only if
///   the other decommits gave memory back, and an allocation that still
///   does not fit fails with the decommit's error, not out of memory: the
///   Idle granules the space kept committed might have made room.
/// - Out of reserved room: another reservation when the configuration
///   allows one, else [`Error::OutOfMemory`] with the request, the largest
///   free block, the committed bytes and the bytes reserved.
///
/// **Streams.** A decommit is ordered on the stream of the call in progress
/// (see [`ReservableSpace::decommit`]). As every plain memres pool, the
/// pool reuses a freed block for the next request whatever its stream: with
/// several streams it belongs under a stream-ordered layer.
///
/// # Time Complexity
///
/// When no granule needs mapping or unmapping, allocate and free are O(1)
/// whatever the block's size, plus O(1) per idle run a new block takes
/// (usually one), plus, for a block under a granule that the index places
/// on a granule no live block touches, a look at up to 8 other free
/// ranges. A call that maps or unmaps costs what that costs, plus
/// O(granules / 64) over the bitmap of committed granules. A block placed
/// at an alignment inside an idle run first looks up the run's start: at
/// most 64 slots, then, for a longer run, a backward search 64 granules at
/// a time over a bitmap of long runs' starts: O(1 + granules of the run /
/// 64). Each Idle granule is decommitted at most once per time it turns
/// Idle, so trimming is O(1) amortized.
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
    /// Per granule of every reservation (its slot): how many live blocks
    /// have their first or last granule there (a block within one granule
    /// counts once). A granule is touched by a live block exactly when its
    /// count is not 0 or it lies strictly inside one.
    edges: Vec<u32>,
    /// Per slot: whether the granule is committed. A committed granule is
    /// Busy (touched by a live block), Idle (in exactly one run of the idle
    /// list), or, only inside an allocate, pinned for the block being
    /// committed.
    committed_bits: Bits,
    /// Per slot: the record of the idle run that starts or ends there;
    /// meaningful only where a run does (checked against its record),
    /// stale elsewhere, so that no call rewrites a run's granules.
    tags: Vec<u32>,
    /// Per slot: whether a long idle run starts there; set exactly at the
    /// `start` of each run of the idle list of more than `LONG_RUN`
    /// granules.
    long_starts: Bits,
    /// The records of the idle runs: the sentinel, the runs, free records
    /// linked from `free_run`. The runs in the list, from the sentinel's
    /// `next` to its `prev`, hold every Idle granule once; their granules,
    /// each run in ascending order, in list order, are the Idle granules
    /// oldest first (least recently freed).
    runs: Vec<Run>,
    /// The first free record (`NONE`: none).
    free_run: u32,
    /// Number of Idle granules.
    idle: u64,
    /// Number of committed granules.
    committed: u64,
    /// Highest `committed` ever.
    peak_committed: u64,
    /// Highest number of committed granules not Idle ever (at most
    /// `peak_committed`).
    peak_busy: u64,
    /// Highest bytes handed out at once (sizes rounded up to 256), counted
    /// when a block is handed out.
    peak_used: u64,
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
    /// [`Error::InvalidConfig`] for a reservation of zero bytes or zero
    /// reservations; the space's error if it cannot reserve.
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
        if !granule.is_power_of_two() || granule < 256 {
            return Err(Error::InvalidConfig { what: "space granule not a power of two >= 256" });
        }
        if config.reserve == 0 || config.max_reservations == 0 {
            return Err(Error::InvalidConfig { what: "reservation of zero bytes or zero reservations" });
        }
        let mut pool = VirtualPool {
            space,
            index: CoalescingIndex::new(256),
            reservations: Vec::new(),
            edges: Vec::new(),
            committed_bits: Bits::default(),
            tags: Vec::new(),
            long_starts: Bits::default(),
            runs: alloc::vec![Run { start: NONE, end: NONE, prev: SENTINEL, next: SENTINEL }],
            free_run: NONE,
            idle: 0,
            committed: 0,
            peak_committed: 0,
            peak_busy: 0,
            peak_used: 0,
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
        self.edges.len() as u64 * self.granule()
    }

    /// Committed bytes: the pool's physical footprint (its usage's `held`).
    #[inline]
    pub fn committed_bytes(&self) -> u64 {
        self.committed << self.shift
    }

    /// Committed bytes that no live block touches (at most `keep`).
    pub fn idle_bytes(&self) -> u64 {
        self.idle << self.shift
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
        self.free_block(block)?;
        self.trim_pending |= self.idle > self.keep;
        Ok(())
    }

    /// Gives `block` back to the index and turns the granules no live
    /// block touches any more Idle.
    #[inline]
    fn free_block(&mut self, block: Block) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        match self.index.free(block.tag(), block.addr(), block.size()) {
            Ok(_) => {}
            Err(Error::UnknownBlock { .. }) => self.deallocate_by_address(block)?,
            Err(e) => return Err(e),
        }
        let (lo, hi) = self.slots_of(block.addr(), (block.size() + 255) & !255);
        self.unpin(lo, hi);
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
    /// the index and the slots; returns the range's first index node.
    fn add_reservation(&mut self, bytes: u64) -> Result<u32> {
        let g = self.granule();
        let len = bytes.checked_next_multiple_of(g).ok_or(Error::InvalidSize { size: bytes })?;
        let granules = len >> self.shift;
        if self.edges.len() as u64 + granules >= NONE as u64 {
            return Err(Error::InvalidSize { size: bytes });
        }
        let range = self.space.reserve(len)?;
        if range.len() != len || range.start() % g != 0 {
            let _ = self.space.release(range);
            return Err(Error::InvalidConfig { what: "space returned a reservation of the wrong shape" });
        }
        let first = match self.index.add_range(range) {
            Ok(first) => first,
            Err(e) => {
                let _ = self.space.release(range);
                return Err(e);
            }
        };
        let base = self.edges.len() as u32;
        let slots = self.edges.len() + granules as usize;
        self.edges.resize(slots, 0);
        self.tags.resize(slots, SENTINEL);
        self.committed_bits.grow(slots);
        self.long_starts.grow(slots);
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

    /// The most bytes ever touched by live blocks at once (whole granules):
    /// the peak committed bytes would have been with nothing kept Idle.
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
        let len = request.rounded_size(256);
        let (reservations, edges, shift) = (&self.reservations[..], &self.edges[..], self.shift);
        let kept = |addr: u64| {
            let Some(r) = reservation_at(reservations, addr) else { return false };
            let (lo, hi) = slots_touched(r, shift, addr, addr + len);
            // In a free range no granule lies inside a live block: a granule
            // there is touched exactly when a live block ends or begins in
            // it. A block under a granule touches one or two.
            edges[lo as usize] != 0 && (hi - lo == 1 || edges[lo as usize + 1] != 0)
        };
        // On an error the index changed nothing: `a` stays.
        self.index.move_where(a, request.size(), request.align(), PLACE_TRIES, kept).unwrap_or(a)
    }

    /// Reserves another range so that `request` fits, then allocates it.
    /// If that fails, retries a pending trim (ordered on `stream`), as
    /// every failed allocate does.
    #[cold]
    fn grow_and_allocate<S: Stream + ?Sized>(
        &mut self,
        request: Request,
        stream: &S,
    ) -> Result<crate::index::Allocation> {
        let grown = if self.reservations.len() >= self.config.max_reservations as usize {
            Ok(None)
        } else {
            // Reservations start on a granule: only alignment beyond it pads.
            let pad = request.align().saturating_sub(self.granule());
            let need = request.rounded_size(256) + pad;
            // From the new reservation itself: one of exactly `need` bytes
            // may sit in a size class that the index's class search skips.
            self.add_reservation(need.max(self.config.reserve))
                .and_then(|first| self.index.allocate_in(first, request.size(), request.align()))
        };
        if let Ok(Some(a)) = grown {
            return Ok(a);
        }
        self.retry_trim(stream);
        // Out of room: the figures as the call leaves them.
        Err(grown.err().unwrap_or_else(|| self.out_of_memory(request.size())))
    }

    /// Free of a block whose tag did not name a live node: look the address up.
    #[cold]
    fn deallocate_by_address(&mut self, block: Block) -> Result<()> {
        let addr = block.addr();
        let Some(r) = self.reservation_of(addr) else {
            return Err(Error::UnknownBlock { addr });
        };
        let first = r.first;
        let had_tag = block.tag() != Block::NO_TAG;
        self.index.free_by_address(first, addr, block.size(), had_tag).map(|_| ())
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
    /// back to the index, and the error is returned (a failed decommit's if
    /// the trim could not give every Idle granule back and the pool is
    /// still out of physical memory): no block is ever handed out over
    /// unmapped memory. Every failed allocate retries a trim that a failed
    /// decommit left pending.
    #[inline]
    fn allocate(&mut self, request: Request, stream: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        let mut a = match self.index.allocate(request.size(), request.align()) {
            Ok(Some(a)) => a,
            Ok(None) => self.grow_and_allocate(request, stream)?,
            Err(e) => {
                self.retry_trim(stream);
                return Err(e);
            }
        };
        let (mut lo, mut hi) = self.slots_of(a.addr, request.rounded_size(256));
        let (mut s, mut e) = self.own_slots(lo, hi);
        if s < e && request.size() < self.granule() {
            // It would take a granule no live block touches: look for one
            // that a live block keeps.
            a = self.move_small(a, request);
            (lo, hi) = self.slots_of(a.addr, request.rounded_size(256));
            (s, e) = self.own_slots(lo, hi);
        }
        if s < e {
            if self.pin(s, e) {
                self.commit_fresh(&a, request, (lo, hi), stream)?;
            }
            self.peak_busy = self.peak_busy.max(self.committed - self.idle);
        }
        self.count_edges(lo, hi);
        self.peak_used = self.peak_used.max(self.index.used_bytes());
        Ok(Block::new(a.addr, request.size(), a.tag))
    }

    /// Frees the block; its granules that no live block touches any more
    /// turn Idle, and the oldest Idle granules beyond `keep` are decommitted,
    /// ordered on `stream`. A failed decommit does not fail the free: the
    /// granules stay committed and counted, and a later free or
    /// [`trim`](VirtualPool::trim) retries.
    #[inline]
    fn deallocate(&mut self, block: Block, stream: &S) -> Result<()> {
        self.free_block(block)?;
        if self.idle > self.keep {
            let _ = self.trim_to(self.config.keep, false, stream);
        }
        Ok(())
    }
}

/// Decommits everything and releases every reservation. The decommits are
/// ordered on no stream (`()`): synchronize the streams that used the pool
/// before dropping it, as before freeing any device memory. Blocks still
/// live dangle, as with every pool; errors of the space are ignored.
// SAFETY: every block is a range of the index inside one of the pool's
// reservations, handed out only once every granule it touches is committed
// (`allocate` commits the Uncommitted ones first), and while the pool lives
// a granule stays committed while a live block touches it: only Idle
// granules, which no live block touches, are given to `decommit` (the drop
// decommits the rest, and then releases the reservations). So a live block lies in ranges the
// space committed and was not asked to decommit, which `V: MemoryOf<E>`
// promises are memory of `E`; once freed, its bytes are a range of the
// space, committed or not, on which the same promise keeps `E` sound. The
// index keeps live ranges disjoint, and the pool's records live in its own
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
                    let _ = self.space.decommit(self.slot_range(&r, run, s), &());
                }
            }
            let _ = self.space.release(r.range);
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
