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

#[cfg(test)]
mod tests;

use crate::check::Violation;
use crate::pool::CoalescingIndex;
use crate::vmem::ReservableSpace;
use crate::{Block, Error, MemoryResourceMut, Range, Request, Result, Stream};
use alloc::vec::Vec;
use core::fmt;

/// "No run" in the idle list's links.
const NONE: u32 = u32::MAX;

/// Sizes and policies of a [`VirtualPool`].
///
/// # Examples
///
/// ```
/// use memres_core::vpool::VirtualConfig;
/// let c = VirtualConfig::new(64 << 30).keep(256 << 20).max_reservations(4);
/// assert_eq!((c.reserve_size(), c.keep_bytes()), (64 << 30, 256 << 20));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtualConfig {
    reserve: u64,
    keep: u64,
    max_reservations: u32,
    trim_on_commit: bool,
    slack_permille: u32,
}

impl VirtualConfig {
    /// One reservation of `reserve` bytes (rounded up to the space's
    /// granule), no free committed memory kept, no growth.
    pub const fn new(reserve: u64) -> Self {
        VirtualConfig { reserve, keep: 0, max_reservations: 1, trim_on_commit: true, slack_permille: 0 }
    }

    /// The release threshold: up to `bytes` of committed memory that no
    /// live block touches stay committed (the CUDA pool's
    /// `cudaMemPoolAttrReleaseThreshold`). 0 decommits at once: correct,
    /// just more map and unmap calls.
    pub const fn keep(mut self, bytes: u64) -> Self {
        self.keep = bytes;
        self
    }

    /// How many reservations the pool may hold (at least 1). When the first
    /// is full, the pool reserves another of the same size (or of the
    /// request's size if larger); blocks never span reservations.
    pub const fn max_reservations(mut self, n: u32) -> Self {
        self.max_reservations = n;
        self
    }

    /// Whether an allocation that needs fresh granules first decommits Idle
    /// ones, as many as the commit would take committed memory beyond its
    /// peak so far, plus the [slack](Self::slack_permille) (default: yes).
    /// With no slack, kept free memory then never raises the peak:
    /// committed memory goes beyond its peak only when nothing is Idle, so
    /// the peak is that of the granules live blocks touch, whatever
    /// `keep`. Below the peak, Idle granules stay, and blocks that
    /// land on them need no map or unmap call, as with alternating allocate
    /// and free of one size. Without it, up to `keep` bytes add to the peak
    /// (the CUDA pool's behaviour).
    pub const fn trim_on_commit(mut self, yes: bool) -> Self {
        self.trim_on_commit = yes;
        self
    }

    /// How far committed memory may go beyond the peak of bytes in use
    /// before [`trim_on_commit`](Self::trim_on_commit) gives Idle memory
    /// back, in thousandths of that peak (default 0).
    ///
    /// With a slack of 0, an allocation that needs fresh granules beyond
    /// the peak of committed memory decommits Idle ones, even those the
    /// next blocks would land on: the granules a workload touches over time
    /// outnumber those it touches at once (on the `gpt_train` trace, 7 %
    /// more), so a replayed workload maps and unmaps on every pass. With a
    /// slack `s`, Idle memory stays while committed memory is at most
    /// `(1 + s / 1000) ×` the peak of bytes in use (in whole granules), and
    /// the peak of committed memory is at most that or the peak of
    /// granules live blocks touch, whichever is more. With `keep(u64::MAX)`
    /// the slack alone bounds the kept memory. Measured on the two training
    /// traces of the benches (2 MiB granules, two passes): a slack of 40
    /// left committed memory at 1.040 and 1.028 times the peak of bytes in
    /// use and committed nothing new in the second pass.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vpool::VirtualConfig;
    /// let c = VirtualConfig::new(64 << 30).keep(u64::MAX).slack_permille(40); // 4 %
    /// assert_eq!(c.slack(), 40);
    /// ```
    pub const fn slack_permille(mut self, permille: u32) -> Self {
        self.slack_permille = permille;
        self
    }

    /// The slack in thousandths of the peak of bytes in use.
    pub const fn slack(&self) -> u32 {
        self.slack_permille
    }

    /// Whether [`trim_on_commit`](Self::trim_on_commit) is on.
    pub const fn trims_on_commit(&self) -> bool {
        self.trim_on_commit
    }

    /// The size of a reservation.
    pub const fn reserve_size(&self) -> u64 {
        self.reserve
    }

    /// The release threshold.
    pub const fn keep_bytes(&self) -> u64 {
        self.keep
    }

    /// The most reservations the pool holds.
    pub const fn reservations(&self) -> u32 {
        self.max_reservations
    }
}

/// What a granule of a reservation holds: [`UNCOMMITTED`](Self::UNCOMMITTED),
/// [`BUSY`](Self::BUSY), or Idle in one [`Run`] of the idle list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot(u32);

impl Slot {
    /// Not committed; no live block touches it.
    const UNCOMMITTED: Slot = Slot(0);
    /// Committed, touched by at least one live block.
    const BUSY: Slot = Slot(1);

    /// Committed, no live block touches it: in idle run `run`.
    #[inline]
    const fn idle(run: u32) -> Slot {
        Slot(run + 2)
    }

    /// The idle run that holds the granule, if it is Idle.
    #[inline]
    const fn run(self) -> Option<u32> {
        self.0.checked_sub(2)
    }
}

/// Granules that turned Idle in one call, or what is left of them: one
/// entry of the idle list. A large block turns Idle, and is taken again, at
/// the cost of one entry, not one per granule.
#[derive(Clone, Copy, Debug)]
struct Run {
    /// The run's slots are `start..end` (never empty, in one reservation),
    /// each `Slot::idle` of this run.
    start: u32,
    end: u32,
    /// Neighbours in the idle list (`NONE` at the ends); a free record's
    /// `next` is the next free record.
    prev: u32,
    next: u32,
}

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
///  allocate: index (O(1)) ─► the block's Idle granules leave the idle
///            list, a run at a time; beyond the peak (+ slack), decommit as
///            many other Idle ones as needed; commit its Uncommitted
///            granules (in runs) ─► all Busy
///  free:     index (O(1)) returns the coalesced free range F; the block's
///            granules wholly inside F turn Idle, one run (the others still
///            touch a live block) ─► over `keep`: decommit the oldest Idle
///            granules
/// ```
///
/// - Every block is aligned to 256 bytes, or more when asked; sizes are
///   rounded up to 256 bytes. Every granule a live block touches is
///   committed before the block is handed out.
/// - A granule is Busy exactly when a live block touches it; then it stays
///   committed. Whether it is after a free needs no count of the blocks in
///   it: a granule of the freed block is untouched exactly when it lies
///   wholly inside the coalesced free range that the index returns.
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
/// Allocate and free are O(1) plus the idle runs a new block takes, plus
/// rewriting the slots of the granules that change state (a fill): a block
/// within one granule costs O(1); mapping a large one costs more.
/// Each Idle granule is decommitted at most once per time it turns Idle, so
/// trimming is O(1) amortized.
///
/// # Examples
///
/// ```
/// use memres_core::vmem::CountingSpace;
/// use memres_core::vpool::VirtualPool;
/// use memres_core::{MemoryResourceMut, Request};
/// let space = CountingSpace::new(1 << 30, 2 << 20);
/// let mut pool = VirtualPool::new(&space, 64 << 20, 0)?;
/// let a = pool.allocate(Request::new(3 << 20)?, &())?;
/// assert_eq!(space.committed_bytes(), 4 << 20); // two granules
/// let b = pool.allocate(Request::new(1000)?, &())?;
/// pool.deallocate(a, &())?;
/// assert_eq!(space.committed_bytes(), 2 << 20); // the one `b` touches
/// pool.deallocate(b, &())?;
/// assert_eq!((space.committed_bytes(), pool.peak_committed_bytes()), (0, 4 << 20));
/// # Ok::<(), memres_core::Error>(())
/// ```
pub struct VirtualPool<V: ReservableSpace> {
    space: V,
    index: CoalescingIndex,
    /// The live reservations, sorted by address; each is one region of the
    /// index, covered exactly by its nodes.
    reservations: Vec<Reservation>,
    /// One slot per granule of every reservation.
    slots: Vec<Slot>,
    /// The records of the idle runs, and free records linked from
    /// `free_run`. The runs linked from `idle_head` to `idle_tail` hold every
    /// Idle granule once; their granules, each run in ascending order, in
    /// list order, are the Idle granules oldest first (least recently
    /// freed).
    runs: Vec<Run>,
    idle_head: u32,
    idle_tail: u32,
    /// The first free record of `runs` (`NONE`: none).
    free_run: u32,
    /// Number of Idle slots.
    idle: u64,
    /// Number of Idle and Busy slots.
    committed: u64,
    /// Highest `committed` ever.
    peak_committed: u64,
    /// Highest number of Busy slots ever (at most `peak_committed`).
    peak_busy: u64,
    /// Highest bytes handed out at once (sizes rounded up to 256), counted
    /// when a block is handed out.
    peak_used: u64,
    /// log2 of the space's granule.
    shift: u32,
    config: VirtualConfig,
    /// A decommit failed and Idle bytes may exceed `keep` until a trim
    /// brings them down to it.
    trim_pending: bool,
}

impl<V: ReservableSpace> VirtualPool<V> {
    /// A pool over one reservation of `reserve` bytes of `space` (rounded up
    /// to its granule), keeping up to `keep` bytes of free committed memory.
    ///
    /// # Errors
    ///
    /// The space's error if it cannot reserve `reserve` bytes;
    /// [`Error::InvalidConfig`] for a reservation of zero bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::CountingSpace;
    /// use memres_core::vpool::VirtualPool;
    /// let space = CountingSpace::new(1 << 30, 2 << 20);
    /// let pool = VirtualPool::new(&space, 64 << 30, 256 << 20)?;
    /// assert_eq!((pool.reserved_bytes(), pool.committed_bytes()), (64 << 30, 0));
    /// assert!(VirtualPool::new(&space, 1 << 60, 0).is_err()); // larger than the address space
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn new(space: V, reserve: u64, keep: u64) -> Result<Self> {
        Self::with_config(space, VirtualConfig::new(reserve).keep(keep))
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
            slots: Vec::new(),
            runs: Vec::new(),
            idle_head: NONE,
            idle_tail: NONE,
            free_run: NONE,
            idle: 0,
            committed: 0,
            peak_committed: 0,
            peak_busy: 0,
            peak_used: 0,
            shift: granule.trailing_zeros(),
            config,
            trim_pending: false,
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
        self.slots.len() as u64 * self.granule()
    }

    /// Bytes committed now: the pool's physical footprint.
    pub fn committed_bytes(&self) -> u64 {
        self.committed << self.shift
    }

    /// The most bytes ever committed at once.
    pub fn peak_committed_bytes(&self) -> u64 {
        self.peak_committed << self.shift
    }

    /// Committed bytes that no live block touches (at most `keep`).
    pub fn idle_bytes(&self) -> u64 {
        self.idle << self.shift
    }

    /// Bytes handed out (sizes rounded up to 256).
    pub fn used_bytes(&self) -> u64 {
        self.index.used_bytes()
    }

    /// Reserved bytes not handed out, committed or not.
    pub fn free_bytes(&self) -> u64 {
        self.index.free_bytes()
    }

    /// The largest block that could be handed out without a new reservation.
    pub fn largest_free(&self) -> u64 {
        self.index.largest_free()
    }

    /// Number of reservations held.
    pub fn reservation_count(&self) -> usize {
        self.reservations.len()
    }

    fn out_of_memory(&self, requested: u64) -> Error {
        Error::OutOfMemory {
            requested,
            largest_free: self.index.largest_free(),
            pool_size: self.committed_bytes(),
            max_size: Some(self.reserved_bytes()),
        }
    }

    /// Reserves `bytes` (rounded up to the granule) and adds the range to
    /// the index and the slots; returns the range's first index node.
    fn add_reservation(&mut self, bytes: u64) -> Result<u32> {
        let g = self.granule();
        let len = bytes.checked_next_multiple_of(g).ok_or(Error::InvalidSize { size: bytes })?;
        let granules = len >> self.shift;
        if self.slots.len() as u64 + granules >= NONE as u64 {
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
        let base = self.slots.len() as u32;
        self.slots.resize(self.slots.len() + granules as usize, Slot::UNCOMMITTED);
        let at = self.reservations.partition_point(|r| r.range.start() < range.start());
        self.reservations.insert(at, Reservation { range, first, base });
        Ok(first)
    }

    /// The reservation holding `addr`, by binary search.
    #[inline]
    fn reservation_of(&self, addr: u64) -> Option<&Reservation> {
        let i = self.reservations.partition_point(|r| r.range.start() <= addr);
        let r = self.reservations.get(i.checked_sub(1)?)?;
        r.range.contains(addr).then_some(r)
    }

    /// The reservation holding slot `s`.
    fn reservation_of_slot(&self, s: u32) -> &Reservation {
        self.reservations
            .iter()
            .find(|r| s >= r.base && ((s - r.base) as u64) < r.range.len() >> self.shift)
            .expect("every slot belongs to a reservation")
    }

    /// The slots of the granules that `start..end` (inside `r`) touches.
    #[inline]
    fn slots_touched(&self, r: &Reservation, start: u64, end: u64) -> (u32, u32) {
        let lo = (start - r.range.start()) >> self.shift;
        let hi = (end - r.range.start()).div_ceil(self.granule());
        (r.base + lo as u32, r.base + hi as u32)
    }

    /// The address range of slots `lo..hi` of reservation `r`.
    fn slot_range(&self, r: &Reservation, lo: u32, hi: u32) -> Range {
        let start = r.range.start() + (((lo - r.base) as u64) << self.shift);
        Range::new(start, ((hi - lo) as u64) << self.shift).unwrap_or_default()
    }

    /// Makes slots `start..end` Idle, as one run at the back of the idle
    /// list (the newest) or at its front (the oldest).
    fn push_idle(&mut self, start: u32, end: u32, front: bool) {
        let id = self.new_run(start, end);
        if front {
            self.link(id, NONE, self.idle_head);
        } else {
            self.link(id, self.idle_tail, NONE);
        }
        self.idle += (end - start) as u64;
    }

    /// A record for the run of slots `start..end`, not linked yet; marks
    /// the slots Idle in it.
    fn new_run(&mut self, start: u32, end: u32) -> u32 {
        let run = Run { start, end, prev: NONE, next: NONE };
        let id = match self.free_run {
            NONE => {
                self.runs.push(run);
                (self.runs.len() - 1) as u32
            }
            id => {
                self.free_run = self.runs[id as usize].next;
                self.runs[id as usize] = run;
                id
            }
        };
        self.slots[start as usize..end as usize].fill(Slot::idle(id));
        id
    }

    /// Links run `id` between `prev` and `next` (`NONE`: an end).
    #[inline]
    fn link(&mut self, id: u32, prev: u32, next: u32) {
        let run = &mut self.runs[id as usize];
        (run.prev, run.next) = (prev, next);
        match prev {
            NONE => self.idle_head = id,
            p => self.runs[p as usize].next = id,
        }
        match next {
            NONE => self.idle_tail = id,
            n => self.runs[n as usize].prev = id,
        }
    }

    /// Takes run `id` out of the list and frees its record.
    #[inline]
    fn drop_run(&mut self, id: u32) {
        let Run { prev, next, .. } = self.runs[id as usize];
        match prev {
            NONE => self.idle_head = next,
            p => self.runs[p as usize].next = next,
        }
        match next {
            NONE => self.idle_tail = prev,
            n => self.runs[n as usize].prev = prev,
        }
        self.runs[id as usize].next = self.free_run;
        self.free_run = id;
    }

    /// Takes the Idle slots from `s` up to `hi` or the end of their run `id`
    /// off the idle list and marks them `to`; returns where they end. What
    /// is left of the run on either side keeps its place in the list.
    #[inline]
    fn take_idle(&mut self, id: u32, s: u32, hi: u32, to: Slot) -> u32 {
        let Run { start, end, prev, next } = self.runs[id as usize];
        let e = end.min(hi);
        match (start < s, e < end) {
            (false, false) => self.drop_run(id),
            (true, false) => self.runs[id as usize].end = s,
            (false, true) => self.runs[id as usize].start = e,
            (true, true) => {
                // Both sides stay: the record keeps the larger one, the
                // smaller one gets a record of its own (its slots rewritten)
                // next to it, the left one older as before.
                if s - start <= end - e {
                    self.runs[id as usize].start = e;
                    let left = self.new_run(start, s);
                    self.link(left, prev, id);
                } else {
                    self.runs[id as usize].end = s;
                    let right = self.new_run(e, end);
                    self.link(right, id, next);
                }
            }
        }
        self.slots[s as usize..e as usize].fill(to);
        self.idle -= (e - s) as u64;
        e
    }

    /// Pins the granules of slots `lo..hi`, those of a block just carved:
    /// its Idle ones turn Busy, off the idle list, so that no trim takes
    /// them. Returns how many are Uncommitted.
    #[inline]
    fn pin(&mut self, lo: u32, hi: u32) -> u64 {
        // Only the first and last granule may be Busy (shared with another
        // block); the others are Idle, a run at a time, or Uncommitted.
        let (mut fresh, mut s) = (0, lo);
        while s < hi {
            let slot = self.slots[s as usize];
            match slot.run() {
                Some(id) => s = self.take_idle(id, s, hi, Slot::BUSY),
                None => {
                    fresh += (slot == Slot::UNCOMMITTED) as u64;
                    s += 1;
                }
            }
        }
        fresh
    }

    /// The rest of an allocate whose block `a` (of `request`, in slots
    /// `lo..hi` of `r`, pinned) has Uncommitted granules: commits them. Out
    /// of physical memory, it decommits the Idle granules and tries once
    /// more. If that fails too, the block goes back to the index, its
    /// granules that no live block touches turn Idle, and the error is
    /// returned.
    #[inline(never)]
    fn commit_fresh<S: Stream + ?Sized>(
        &mut self,
        r: &Reservation,
        a: &crate::pool::Allocation,
        request: Request,
        (lo, hi): (u32, u32),
        stream: &S,
    ) -> Result<()> {
        let mut committed = self.commit_pinned(r, lo, hi, stream);
        if matches!(committed, Err(e) if e.is_out_of_memory())
            && self.idle > 0
            && self.trim_to(0, stream).is_ok()
        {
            // Out of physical memory: give the idle granules back and try
            // once more, as the CUDA pool trims before it fails.
            committed = self.commit_pinned(r, lo, hi, stream);
        }
        if let Err(e) = committed {
            // The index takes the block back; granules it pinned turn Idle.
            let free = self.index.free(a.tag, a.addr, request.size())?;
            self.unpin_failed(r, a.addr, request.rounded_size(256), free);
            // The pinned granules are Idle again: beyond `keep` only if an
            // earlier decommit failed (a trim of this call may have cleared
            // that); retry it as a free does.
            if self.idle > self.config.keep >> self.shift {
                let _ = self.trim_to(self.config.keep, stream);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Commits the Uncommitted granules of slots `lo..hi` of `r` (the
    /// others pinned): under `trim_on_commit`, first decommits as many Idle
    /// granules as the commit would take committed memory beyond its limit
    /// (ordered on `stream`), then commits in runs. If a commit fails, what
    /// this call committed is decommitted and the error returned; the
    /// pinned granules stay Busy until [`unpin_failed`](Self::unpin_failed).
    fn commit_pinned<S: Stream + ?Sized>(
        &mut self,
        r: &Reservation,
        lo: u32,
        hi: u32,
        stream: &S,
    ) -> Result<()> {
        let slots = &self.slots[lo as usize..hi as usize];
        let fresh = slots.iter().filter(|&&t| t == Slot::UNCOMMITTED).count() as u64;
        let busy = self.committed - self.idle + fresh;
        let used = self.peak_used.max(self.index.used_bytes());
        let excess =
            (self.committed + fresh).saturating_sub(self.commit_limit(self.peak_busy.max(busy), used));
        if self.config.trim_on_commit && self.idle > 0 && excess > 0 {
            // Idle memory is a cache that raises the peak by at most the
            // slack: give back as much of it as the commit would go beyond
            // that. A failed decommit only leaves more of it.
            let _ = self.trim_to(self.idle.saturating_sub(excess) << self.shift, stream);
        }
        let mut s = lo;
        while s < hi {
            if self.slots[s as usize] != Slot::UNCOMMITTED {
                s += 1;
                continue;
            }
            let run = s;
            while s < hi && self.slots[s as usize] == Slot::UNCOMMITTED {
                s += 1;
            }
            if let Err(e) = self.space.commit(self.slot_range(r, run, s)) {
                self.undo_commits(r, lo, run);
                return Err(e);
            }
        }
        for slot in &mut self.slots[lo as usize..hi as usize] {
            if *slot == Slot::UNCOMMITTED {
                *slot = Slot::BUSY;
            }
        }
        self.committed += fresh;
        self.peak_committed = self.peak_committed.max(self.committed);
        self.peak_busy = self.peak_busy.max(busy);
        self.peak_used = used;
        Ok(())
    }

    /// Under `trim_on_commit`, the most granules committed while some are
    /// Idle: the peak of bytes in use plus the slack, in whole granules, or
    /// the peak of Busy granules if more (so that a slack of 0 never raises
    /// the peak of committed memory).
    #[inline]
    fn commit_limit(&self, peak_busy: u64, peak_used: u64) -> u64 {
        let slack = peak_used.saturating_mul(self.config.slack_permille as u64) / 1000;
        (peak_used.saturating_add(slack) >> self.shift).max(peak_busy)
    }

    /// The most bytes ever touched by live blocks at once (whole granules):
    /// the peak committed bytes would have been with nothing kept Idle.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::CountingSpace;
    /// use memres_core::vpool::VirtualPool;
    /// use memres_core::{MemoryResourceMut, Request};
    /// let space = CountingSpace::new(1 << 30, 2 << 20);
    /// let mut pool = VirtualPool::new(&space, 64 << 20, 64 << 20)?;
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
    /// use memres_core::vpool::VirtualPool;
    /// use memres_core::{MemoryResourceMut, Request};
    /// let space = CountingSpace::new(1 << 30, 2 << 20);
    /// let mut pool = VirtualPool::new(&space, 64 << 20, 0)?;
    /// let a = pool.allocate(Request::new(1000)?, &())?;
    /// pool.deallocate(a, &())?;
    /// assert_eq!(pool.peak_used_bytes(), 1024);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn peak_used_bytes(&self) -> u64 {
        self.peak_used
    }

    /// After the index freed the range `addr..addr + len` of reservation
    /// `r` and returned the coalesced free range `free`: the slots of the
    /// granules of the range wholly inside `free`, which no live block
    /// touches any more (empty when `lo >= hi`).
    #[inline]
    fn untouched(&self, r: &Reservation, addr: u64, len: u64, free: Range) -> (u32, u32) {
        let g = self.granule();
        let (lo, hi) = self.slots_touched(r, addr, addr + len);
        let start = free.start().next_multiple_of(g);
        let end = free.end() & !(g - 1);
        if end <= start {
            return (lo, lo);
        }
        let (flo, _) = self.slots_touched(r, start, start);
        let fhi = flo + ((end - start) >> self.shift) as u32;
        (lo.max(flo), hi.min(fhi))
    }

    /// After a free: the granules of the block that no live block touches
    /// any more, all Busy, turn Idle as one run (the newest).
    #[inline]
    fn unpin(&mut self, r: &Reservation, addr: u64, len: u64, free: Range) {
        let (lo, hi) = self.untouched(r, addr, len, free);
        if lo < hi {
            self.push_idle(lo, hi, false);
        }
    }

    /// After a failed allocate gave its block back: as [`unpin`](Self::unpin),
    /// but only the Busy granules turn Idle (in runs, oldest first); the
    /// others the call did not commit, or failed to decommit (Idle).
    #[cold]
    fn unpin_failed(&mut self, r: &Reservation, addr: u64, len: u64, free: Range) {
        let (mut s, hi) = self.untouched(r, addr, len, free);
        while s < hi {
            if self.slots[s as usize] != Slot::BUSY {
                s += 1;
                continue;
            }
            let run = s;
            while s < hi && self.slots[s as usize] == Slot::BUSY {
                s += 1;
            }
            self.push_idle(run, s, false);
        }
    }

    /// Decommits the granules of `lo..upto` that are still Uncommitted in
    /// the slots: those a failed `commit_block` committed. Memory no block
    /// ever used needs no stream order. If the space refuses, they stay
    /// committed and Idle, counted, for a later trim.
    fn undo_commits(&mut self, r: &Reservation, lo: u32, upto: u32) {
        let mut s = lo;
        while s < upto {
            if self.slots[s as usize] != Slot::UNCOMMITTED {
                s += 1;
                continue;
            }
            let run = s;
            while s < upto && self.slots[s as usize] == Slot::UNCOMMITTED {
                s += 1;
            }
            if self.space.decommit(self.slot_range(r, run, s), &()).is_err() {
                self.push_idle(run, s, true);
                self.committed += (s - run) as u64;
                self.peak_committed = self.peak_committed.max(self.committed);
                self.trim_pending = true;
            }
        }
    }

    /// Decommits the oldest Idle granules, each with its Idle neighbours,
    /// until at most `keep` bytes are Idle; the decommits are ordered on
    /// `stream`. Returns the bytes decommitted.
    ///
    /// # Errors
    ///
    /// The space's error if a decommit fails; those granules stay
    /// committed and Idle, and the pool stays usable.
    fn trim_to<S: Stream + ?Sized>(&mut self, keep: u64, stream: &S) -> Result<u64> {
        let limit = keep >> self.shift;
        let mut freed = 0;
        // How many more granules to take (at most all of them: a u32).
        let excess = |p: &Self| (p.idle - limit) as u32;
        while self.idle > limit {
            // The oldest granule, the first of the head run, then its Idle
            // neighbours above, then below, as many as needed.
            let head = self.idle_head;
            let s = self.runs[head as usize].start;
            let r = *self.reservation_of_slot(s);
            let end = r.base + (r.range.len() >> self.shift) as u32;
            let mut hi = self.take_idle(head, s, s.saturating_add(excess(self)), Slot::UNCOMMITTED);
            while hi < end && self.idle > limit {
                let Some(id) = self.slots[hi as usize].run() else { break };
                hi = self.take_idle(id, hi, hi.saturating_add(excess(self)), Slot::UNCOMMITTED);
            }
            let mut lo = s;
            while lo > r.base && self.idle > limit {
                let Some(id) = self.slots[lo as usize - 1].run() else { break };
                let from = self.runs[id as usize].start.max(lo - excess(self).min(lo));
                self.take_idle(id, from, lo, Slot::UNCOMMITTED);
                lo = from;
            }
            if let Err(e) = self.space.decommit(self.slot_range(&r, lo, hi), stream) {
                self.push_idle(lo, hi, true);
                self.trim_pending = true;
                return Err(e);
            }
            self.committed -= (hi - lo) as u64;
            freed += ((hi - lo) as u64) << self.shift;
        }
        // A trim to more than `keep` (on commit) leaves a failed one pending.
        self.trim_pending &= self.idle_bytes() > self.config.keep;
        Ok(freed)
    }

    /// Decommits every committed granule that no live block touches,
    /// ordered on `stream`, whatever the release threshold (the CUDA pool's
    /// `cudaMemPoolTrimTo(pool, 0)`). Returns the bytes decommitted.
    ///
    /// # Errors
    ///
    /// The space's error if a decommit fails; those granules stay committed
    /// and the pool stays usable.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::CountingSpace;
    /// use memres_core::vpool::VirtualPool;
    /// use memres_core::{MemoryResourceMut, Request};
    /// let space = CountingSpace::new(1 << 30, 2 << 20);
    /// let mut pool = VirtualPool::new(&space, 64 << 20, 8 << 20)?;
    /// let a = pool.allocate(Request::new(4 << 20)?, &())?;
    /// pool.deallocate(a, &())?;
    /// assert_eq!(pool.idle_bytes(), 4 << 20); // kept: under the threshold
    /// assert_eq!(pool.trim(&())?, 4 << 20);
    /// assert_eq!(space.committed_bytes(), 0);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn trim<S: Stream + ?Sized>(&mut self, stream: &S) -> Result<u64> {
        self.trim_to(0, stream)
    }

    /// Reserves another range so that `request` fits, then allocates it.
    #[cold]
    fn grow_and_allocate(&mut self, request: Request) -> Result<crate::pool::Allocation> {
        if self.reservations.len() >= self.config.max_reservations as usize {
            return Err(self.out_of_memory(request.size()));
        }
        // Reservations start on a granule: only alignment beyond it pads.
        let pad = request.align().saturating_sub(self.granule());
        let need = request.rounded_size(256) + pad;
        let first = self.add_reservation(need.max(self.config.reserve))?;
        // From the new reservation itself: one of exactly `need` bytes may
        // sit in a size class that the index's class search skips.
        self.index
            .allocate_in(first, request.size(), request.align())?
            .ok_or_else(|| self.out_of_memory(request.size()))
    }

    /// Free of a block whose tag did not name a live node: look the address up.
    #[cold]
    fn free_by_address(&mut self, block: Block) -> Result<Range> {
        let addr = block.addr();
        let Some(r) = self.reservation_of(addr) else {
            return Err(Error::UnknownBlock { addr });
        };
        let first = r.first;
        match self.index.find_used(first, addr) {
            Some(tag) if block.tag() == Block::NO_TAG => self.index.free(tag, addr, block.size()),
            Some(_) => Err(Error::DoubleFree { addr }),
            None if self.index.is_free_at(first, addr) => Err(Error::DoubleFree { addr }),
            None => Err(Error::UnknownBlock { addr }),
        }
    }

    /// Checks the pool's invariants and returns the first broken one.
    ///
    /// Checked: those of the index; reservations sorted, disjoint, each
    /// covered exactly by its nodes, with slots for exactly its granules;
    /// a granule is Busy exactly when a live block touches it (so every
    /// granule a live block touches is committed); the idle list holds
    /// exactly the Idle granules, linked both ways; the committed and idle
    /// counts match the slots; at most `keep` bytes are Idle unless a
    /// decommit failed; bytes used + free = bytes reserved; committed bytes
    /// = used bytes + the free bytes of Busy granules + Idle bytes.
    ///
    /// # Time Complexity
    ///
    /// O(nodes + granules): for tests and fuzzing, not the hot path.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::vmem::CountingSpace;
    /// use memres_core::vpool::VirtualPool;
    /// use memres_core::{MemoryResourceMut, Request};
    /// let space = CountingSpace::new(1 << 30, 2 << 20);
    /// let mut pool = VirtualPool::new(&space, 64 << 20, 0)?;
    /// let a = pool.allocate(Request::new(5000)?, &())?;
    /// assert_eq!(pool.check(), Ok(()));
    /// # pool.deallocate(a, &())?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn check(&self) -> core::result::Result<(), Violation> {
        self.index.check().map_err(Violation::new)?;
        let g = self.granule();
        let mut touched = alloc::vec![false; self.slots.len()];
        let (mut reserved, mut last_end, mut granules) = (0u64, 0u64, 0usize);
        let mut used_in_busy = 0u64;
        let mut bases: Vec<(u32, u32)> = Vec::new();
        for r in &self.reservations {
            if r.range.start() < last_end {
                return Err(Violation::new("reservations overlap or are not sorted"));
            }
            last_end = r.range.end();
            if r.range.start() % g != 0 || r.range.len() % g != 0 {
                return Err(Violation::new("reservation not aligned to the granule"));
            }
            bases.push((r.base, r.base + (r.range.len() / g) as u32));
            granules += (r.range.len() / g) as usize;
            let mut cursor = r.range.start();
            let mut bad = false;
            self.index.for_each_in_region(r.first, |n, free| {
                bad |= n.start() != cursor;
                cursor = n.end();
                if !free && !bad {
                    let (lo, hi) = self.slots_touched(r, n.start(), n.end());
                    for t in &mut touched[lo as usize..hi as usize] {
                        *t = true;
                    }
                    used_in_busy += n.len();
                }
            });
            if bad || cursor != r.range.end() {
                return Err(Violation::new("reservation not covered exactly by its nodes"));
            }
            reserved += r.range.len();
        }
        bases.sort_unstable();
        if granules != self.slots.len() || bases.windows(2).any(|w| w[0].1 != w[1].0) {
            return Err(Violation::new("slots do not match the reservations' granules"));
        }
        // Every listed run once, linked both ways, its granules Idle in it
        // and in one reservation; then every Idle granule in a listed run.
        let mut listed_run = alloc::vec![false; self.runs.len()];
        let (mut listed, mut runs, mut prev, mut id) = (0u64, 0usize, NONE, self.idle_head);
        while id != NONE {
            let Some(run) = self.runs.get(id as usize) else {
                return Err(Violation::new("idle list names no run record"));
            };
            if core::mem::replace(&mut listed_run[id as usize], true) || run.prev != prev {
                return Err(Violation::new("idle list holds a run twice or its links are not symmetric"));
            }
            let in_one_reservation = bases.iter().any(|&(lo, hi)| lo <= run.start && run.end <= hi);
            if run.start >= run.end
                || !in_one_reservation
                || self.slots[run.start as usize..run.end as usize].iter().any(|&t| t != Slot::idle(id))
            {
                return Err(Violation::new("idle run empty, across reservations, or not Idle in it"));
            }
            listed += (run.end - run.start) as u64;
            runs += 1;
            prev = id;
            id = run.next;
        }
        if prev != self.idle_tail {
            return Err(Violation::new("idle list does not end at its tail"));
        }
        let mut free = 0;
        let mut id = self.free_run;
        while id != NONE && free <= self.runs.len() {
            if listed_run.get(id as usize) != Some(&false) {
                return Err(Violation::new("a free run record is listed or out of range"));
            }
            free += 1;
            id = self.runs[id as usize].next;
        }
        if runs + free != self.runs.len() {
            return Err(Violation::new("run records neither listed nor free, or free ones in a cycle"));
        }
        let (mut busy, mut idle) = (0u64, 0u64);
        for (&slot, &t) in self.slots.iter().zip(&touched) {
            match (slot, slot.run(), t) {
                (Slot::BUSY, _, true) => busy += 1,
                (_, Some(id), false) if listed_run.get(id as usize) == Some(&true) => idle += 1,
                (Slot::UNCOMMITTED, _, false) => {}
                (_, _, true) => return Err(Violation::new("a granule touched by a live block is not Busy")),
                (Slot::BUSY, _, false) => {
                    return Err(Violation::new("a Busy granule is touched by no live block"))
                }
                _ => return Err(Violation::new("an Idle granule names a run not in the idle list")),
            }
        }
        if listed != idle || idle != self.idle {
            return Err(Violation::new("idle runs or count do not match the Idle granules"));
        }
        if busy + idle != self.committed
            || self.committed > self.peak_committed
            || busy > self.peak_busy
            || self.peak_busy > self.peak_committed
        {
            return Err(Violation::new("committed count does not match the granules"));
        }
        if !self.trim_pending && self.idle_bytes() > self.config.keep {
            return Err(Violation::new("more idle committed memory than the release threshold"));
        }
        if self.index.used_bytes() + self.index.free_bytes() != reserved || reserved != self.reserved_bytes()
        {
            return Err(Violation::new("bytes in use + bytes free != bytes reserved"));
        }
        if used_in_busy != self.index.used_bytes() || self.index.used_bytes() > (busy << self.shift) {
            return Err(Violation::new("live bytes exceed the Busy granules"));
        }
        Ok(())
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
    /// still fails, what this call
    /// committed is decommitted, the block goes back to the index, and the
    /// error is returned: no block is ever handed out over unmapped memory.
    fn allocate(&mut self, request: Request, stream: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        let a = match self.index.allocate(request.size(), request.align())? {
            Some(a) => a,
            None => self.grow_and_allocate(request)?,
        };
        let r = *self.reservation_of(a.addr).expect("the index hands out reserved addresses");
        let touched = self.slots_touched(&r, a.addr, a.addr + request.rounded_size(256));
        if self.pin(touched.0, touched.1) > 0 {
            self.commit_fresh(&r, &a, request, touched, stream)?;
        }
        self.peak_busy = self.peak_busy.max(self.committed - self.idle);
        self.peak_used = self.peak_used.max(self.index.used_bytes());
        Ok(Block::new(a.addr, request.size(), a.tag))
    }

    /// Frees the block; its granules that no live block touches any more
    /// turn Idle, and the oldest Idle granules beyond `keep` are decommitted,
    /// ordered on `stream`. A failed decommit does not fail the free: the
    /// granules stay committed and counted, and a later free or
    /// [`trim`](VirtualPool::trim) retries.
    fn deallocate(&mut self, block: Block, stream: &S) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let free = match self.index.free(block.tag(), block.addr(), block.size()) {
            Ok(f) => f,
            Err(Error::UnknownBlock { .. }) => self.free_by_address(block)?,
            Err(e) => return Err(e),
        };
        let r = *self.reservation_of(block.addr()).expect("a freed block lies in a reservation");
        self.unpin(&r, block.addr(), (block.size() + 255) & !255, free);
        if self.idle > self.config.keep >> self.shift {
            let _ = self.trim_to(self.config.keep, stream);
        }
        Ok(())
    }
}

/// Decommits everything and releases every reservation. The decommits are
/// ordered on no stream (`()`): synchronize the streams that used the pool
/// before dropping it, as before freeing any device memory. Blocks still
/// live dangle, as with every pool; errors of the space are ignored.
impl<V: ReservableSpace> Drop for VirtualPool<V> {
    fn drop(&mut self) {
        for r in core::mem::take(&mut self.reservations) {
            let end = r.base + (r.range.len() >> self.shift) as u32;
            let mut s = r.base;
            while s < end {
                if self.slots[s as usize] == Slot::UNCOMMITTED {
                    s += 1;
                    continue;
                }
                let run = s;
                while s < end && self.slots[s as usize] != Slot::UNCOMMITTED {
                    s += 1;
                }
                let _ = self.space.decommit(self.slot_range(&r, run, s), &());
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
            .field("committed_bytes", &self.committed_bytes())
            .field("peak_committed_bytes", &self.peak_committed_bytes())
            .field("idle_bytes", &self.idle_bytes())
            .field("used_bytes", &self.index.used_bytes())
            .field("reservations", &self.reservations.len())
            .field("config", &self.config)
            .finish()
    }
}
