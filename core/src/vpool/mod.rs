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
#[cfg(test)]
mod tests;

use crate::check::Violation;
use crate::index::CoalescingIndex;
use crate::vmem::ReservableSpace;
use crate::{Block, Error, MemoryResourceMut, Range, Request, Result, Stream};
use alloc::vec::Vec;
use bits::Bits;
use core::fmt;

/// "None": the `start` of a record that holds no run, the end of the list
/// of free records.
const NONE: u32 = u32::MAX;
/// The record that heads the idle list (a circle through it); it holds no
/// run.
const SENTINEL: u32 = 0;
/// Idle runs of more granules than this have their start marked in a
/// bitmap: the start of a shorter one lies less than this many slots below
/// any of its granules, close enough to look up slot by slot. Most runs
/// are shorter (over 96 % on the training traces of the benches), and the
/// calls that make and take them touch no bitmap.
const LONG_RUN: u32 = 64;

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

/// Granules that turned Idle in one call, or what is left of them: one
/// entry of the idle list. A large block turns Idle, and is taken again, at
/// the cost of one entry, not one per granule.
#[derive(Clone, Copy, Debug)]
struct Run {
    /// The run's granules are the slots `start..end`, never empty, in one
    /// reservation; `start` is `NONE` in a free record and the sentinel.
    start: u32,
    end: u32,
    /// Neighbours in the idle list, a circle through the sentinel; a free
    /// record's `next` is the next free record.
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
/// (usually one). A call that maps or unmaps costs what that costs, plus
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
    /// A decommit failed and Idle bytes may exceed `keep` until a trim
    /// brings them down to it.
    trim_pending: bool,
    /// Whole granules in `config.keep`: the most Idle granules after a call.
    keep: u64,
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
        if let [r] = &self.reservations[..] {
            return r.range.contains(addr).then_some(r);
        }
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
        let lo = (start - r.range.start()) >> self.shift;
        let hi = (end - r.range.start()).div_ceil(self.granule());
        (r.base + lo as u32, r.base + hi as u32)
    }

    /// The address range of slots `lo..hi` of reservation `r`.
    fn slot_range(&self, r: &Reservation, lo: u32, hi: u32) -> Range {
        let start = r.range.start() + (((lo - r.base) as u64) << self.shift);
        Range::new(start, ((hi - lo) as u64) << self.shift).unwrap_or_default()
    }

    /// The idle run that starts at slot `s`, if one does.
    #[inline(always)]
    fn run_starting(&self, s: u32) -> Option<u32> {
        let id = self.tags[s as usize];
        (self.runs[id as usize].start == s).then_some(id)
    }

    /// The idle run that ends at slot `s` (its last granule), if one does.
    #[inline]
    fn run_ending(&self, s: u32) -> Option<u32> {
        let id = self.tags[s as usize];
        let r = self.runs[id as usize];
        (r.start != NONE && r.end == s + 1).then_some(id)
    }

    /// The idle run that holds slot `s`, an Idle granule: the one that
    /// starts at the last run start at or below it (runs are disjoint).
    /// A short run starts at most `LONG_RUN - 1` slots below, found slot by
    /// slot; a long one is marked, found a word of `long_starts` at a time.
    /// Only a block placed at an alignment inside a run starts inside one.
    #[cold]
    fn run_holding(&self, s: u32) -> u32 {
        let near = (s.saturating_sub(LONG_RUN - 1)..=s).rev().find_map(|t| self.run_starting(t));
        let start = || self.long_starts.find_back(0, s + 1, true).and_then(|t| self.run_starting(t));
        near.or_else(start).expect("an Idle granule lies in a run")
    }

    /// Makes the committed slots `start..end` Idle, as one run at the back
    /// of the idle list (the newest) or at its front (the oldest). Out of
    /// line: half the frees of a training trace leave no granule Idle, and
    /// a free without it is small enough to inline into its caller.
    #[inline(never)]
    fn push_idle(&mut self, start: u32, end: u32, front: bool) {
        let id = self.new_run(start, end);
        let after = if front { SENTINEL } else { self.runs[SENTINEL as usize].prev };
        self.link_after(id, after);
        self.idle += (end - start) as u64;
        if end - start > LONG_RUN {
            self.long_starts.put(start, true);
        }
    }

    /// A record for the run `start..end`, not linked yet (nor marked if
    /// long).
    #[inline(always)]
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
        self.tags[start as usize] = id;
        self.tags[end as usize - 1] = id;
        id
    }

    /// Links run `id` into the idle list after `prev` (the sentinel: first).
    #[inline(always)]
    fn link_after(&mut self, id: u32, prev: u32) {
        let next = self.runs[prev as usize].next;
        let run = &mut self.runs[id as usize];
        (run.prev, run.next) = (prev, next);
        self.runs[prev as usize].next = id;
        self.runs[next as usize].prev = id;
    }

    /// Takes the granules from slot `s` up to `hi` or the end of their run
    /// `id` (which starts at or below `s`) off the idle list; returns where
    /// they end. What is left of the run on either side keeps its place in
    /// the list.
    #[inline(always)]
    fn take_idle(&mut self, id: u32, s: u32, hi: u32) -> u32 {
        let Run { start, end, prev, next } = self.runs[id as usize];
        let e = end.min(hi);
        match (start < s, e < end) {
            (false, false) => {
                self.runs[prev as usize].next = next;
                self.runs[next as usize].prev = prev;
                let run = &mut self.runs[id as usize];
                (run.start, run.next) = (NONE, self.free_run);
                self.free_run = id;
            }
            (true, false) => {
                self.runs[id as usize].end = s;
                self.tags[s as usize - 1] = id;
            }
            (false, true) => {
                self.runs[id as usize].start = e;
                self.tags[e as usize] = id;
            }
            (true, true) => {
                // Both sides stay, the right one (newer) in a record of its
                // own just after this one.
                self.runs[id as usize].end = s;
                self.tags[s as usize - 1] = id;
                let right = self.new_run(e, end);
                self.link_after(right, id);
            }
        }
        self.idle -= (e - s) as u64;
        // Last: a store to the bitmap before the cases above makes them
        // reload `self`'s vectors even where none happened (measured).
        if end - start > LONG_RUN {
            self.mark_parts(start, end, s, e);
        }
        e
    }

    /// Marks what is left of the long run `start..end` once `s..e` is
    /// taken from it: `start..s` and `e..end` (each maybe empty), only
    /// those still long.
    #[inline(always)]
    fn mark_parts(&mut self, start: u32, end: u32, s: u32, e: u32) {
        self.long_starts.put(start, s - start > LONG_RUN);
        if end - e > LONG_RUN {
            self.long_starts.put(e, true);
        }
    }

    /// The slots of the granules a block of `lo..hi` shares with no other
    /// live block: all but the first and last if other blocks count there.
    #[inline(always)]
    fn own_slots(&self, lo: u32, hi: u32) -> (u32, u32) {
        let first = lo + (self.edges[lo as usize] != 0) as u32;
        (first, hi - (self.edges[hi as usize - 1] != 0) as u32)
    }

    /// Pins the granules of slots `s..hi` that a block just carved shares
    /// with no other live block: the Idle ones, a run at a time, leave the
    /// idle list, so that no trim takes them. Returns whether some are
    /// Uncommitted. Out of line, as [`push_idle`](Self::push_idle).
    #[inline(never)]
    fn pin(&mut self, mut s: u32, hi: u32) -> bool {
        let mut fresh = false;
        while s < hi {
            if let Some(id) = self.run_starting(s) {
                s = self.take_idle(id, s, hi);
            } else if self.committed_bits.get(s) {
                s = self.take_idle(self.run_holding(s), s, hi);
            } else {
                fresh = true;
                s = self.committed_bits.find(s, hi, true);
            }
        }
        fresh
    }

    /// Counts a new block of slots `lo..hi` at its first and last granule.
    #[inline(always)]
    fn count_edges(&mut self, lo: u32, hi: u32) {
        self.edges[lo as usize] += 1;
        self.edges[hi as usize - 1] += (hi - 1 != lo) as u32;
    }

    /// The rest of an allocate whose block `a` (of `request`, in slots
    /// `lo..hi`, pinned) has Uncommitted granules: commits them. Out
    /// of physical memory, it decommits the Idle granules and tries once
    /// more, also when a decommit failed after others gave memory back. If
    /// that fails too, the block goes back to the index, its granules that
    /// no live block touches turn Idle, and the error is returned: the
    /// failed decommit's if the pool is still out of physical memory after
    /// a trim that could not give back all its Idle granules (it is then
    /// not out of memory for want of memory but because the space failed).
    #[inline(never)]
    fn commit_fresh<S: Stream + ?Sized>(
        &mut self,
        a: &crate::index::Allocation,
        request: Request,
        (lo, hi): (u32, u32),
        stream: &S,
    ) -> Result<()> {
        let r = &self.reservation_of(a.addr).copied().expect("the index hands out reserved addresses");
        let mut committed = self.commit_pinned(r, lo, hi, stream);
        if matches!(committed, Err(e) if e.is_out_of_memory()) && self.idle > 0 {
            // Out of physical memory: give the idle granules back and try
            // once more, as the CUDA pool trims before it fails. A trim
            // that fails part way may still have made room.
            let before = self.committed;
            let trimmed = self.trim_to(0, stream);
            if self.committed < before {
                committed = self.commit_pinned(r, lo, hi, stream);
            }
            // Still out of memory with Idle granules left committed: the
            // space's failure to decommit them is why.
            if let (Err(e), Err(t)) = (committed, trimmed) {
                if e.is_out_of_memory() {
                    committed = Err(t);
                }
            }
        }
        if let Err(e) = committed {
            // The index takes the block back; the granules it pinned, or
            // committed and failed to decommit, turn Idle.
            self.index.free(a.tag, a.addr, request.size())?;
            let (mut s, hi) = self.own_slots(lo, hi);
            while s < hi {
                let run = self.committed_bits.find(s, hi, true);
                s = self.committed_bits.find(run, hi, false);
                if run < s {
                    self.push_idle(run, s, false);
                }
            }
            // Beyond `keep` only if an earlier decommit failed (a trim of
            // this call may have cleared that); retry it as a free does.
            self.retry_trim(stream);
            return Err(e);
        }
        Ok(())
    }

    /// Commits the Uncommitted granules of slots `lo..hi` of `r` (the
    /// others pinned or Busy): under `trim_on_commit`, first decommits as
    /// many Idle granules as the commit would take committed memory beyond
    /// its limit (ordered on `stream`), then commits in runs. If a commit
    /// fails, what this call committed is decommitted and the error
    /// returned; the pinned granules stay pinned.
    fn commit_pinned<S: Stream + ?Sized>(
        &mut self,
        r: &Reservation,
        lo: u32,
        hi: u32,
        stream: &S,
    ) -> Result<()> {
        let fresh = (hi - lo - self.committed_bits.count(lo, hi)) as u64;
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
            let run = self.committed_bits.find(s, hi, false);
            s = self.committed_bits.find(run, hi, true);
            if run == s {
                continue;
            }
            if let Err(e) = self.space.commit(self.slot_range(r, run, s)) {
                self.undo_commits(r, lo, run);
                return Err(e);
            }
        }
        self.committed_bits.set(lo, hi, true);
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

    /// After a free of a block of slots `lo..hi`: uncounts it; its granules
    /// that no other live block counts, all committed, turn Idle as one run
    /// (the newest).
    #[inline(always)]
    fn unpin(&mut self, lo: u32, hi: u32) {
        self.edges[lo as usize] -= 1;
        self.edges[hi as usize - 1] -= (hi - 1 != lo) as u32;
        let (lo, hi) = self.own_slots(lo, hi);
        if lo < hi {
            self.push_idle(lo, hi, false);
        }
    }

    /// Decommits the granules of `lo..upto` that are not committed in the
    /// bitmap: those a failed `commit_pinned` committed. Memory no block
    /// ever used needs no stream order. If the space refuses, they stay
    /// committed and counted, pinned with the block's other granules.
    fn undo_commits(&mut self, r: &Reservation, lo: u32, upto: u32) {
        let mut s = lo;
        while s < upto {
            let run = self.committed_bits.find(s, upto, false);
            s = self.committed_bits.find(run, upto, true);
            if run < s && self.space.decommit(self.slot_range(r, run, s), &()).is_err() {
                self.committed_bits.set(run, s, true);
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
    #[inline(never)]
    fn trim_to<S: Stream + ?Sized>(&mut self, keep: u64, stream: &S) -> Result<u64> {
        let limit = keep >> self.shift;
        let mut freed = 0;
        // How many more granules to take (at most all of them: a u32).
        let excess = |p: &Self| (p.idle - limit) as u32;
        while self.idle > limit {
            // The oldest granule, the first of the head run, then its Idle
            // neighbours above, then below, as many as needed.
            let head = self.runs[SENTINEL as usize].next;
            let s = self.runs[head as usize].start;
            let r = *self.reservation_of_slot(s);
            let end = r.base + (r.range.len() >> self.shift) as u32;
            let mut hi = self.take_idle(head, s, s.saturating_add(excess(self)));
            while hi < end && self.idle > limit {
                let Some(id) = self.run_starting(hi) else { break };
                hi = self.take_idle(id, hi, hi.saturating_add(excess(self)));
            }
            let mut lo = s;
            while lo > r.base && self.idle > limit {
                let Some(id) = self.run_ending(lo - 1) else { break };
                let from = self.runs[id as usize].start.max(lo - excess(self).min(lo));
                self.take_idle(id, from, lo);
                lo = from;
            }
            if let Err(e) = self.space.decommit(self.slot_range(&r, lo, hi), stream) {
                self.push_idle(lo, hi, true);
                self.trim_pending = true;
                return Err(e);
            }
            self.committed_bits.set(lo, hi, false);
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

    /// After a failed allocate: decommits the oldest Idle granules beyond
    /// `keep`, ordered on `stream`, if a failed decommit left some (a trim
    /// pending). A failure of this trim leaves it pending.
    #[cold]
    fn retry_trim<S: Stream + ?Sized>(&mut self, stream: &S) {
        if self.idle > self.keep {
            let _ = self.trim_to(self.config.keep, stream);
        }
    }

    /// Free of a block whose tag did not name a live node: look the address up.
    #[cold]
    fn free_by_address(&mut self, block: Block) -> Result<()> {
        let addr = block.addr();
        let Some(r) = self.reservation_of(addr) else {
            return Err(Error::UnknownBlock { addr });
        };
        let first = r.first;
        let had_tag = block.tag() != Block::NO_TAG;
        self.index.free_by_address(first, addr, block.size(), had_tag).map(|_| ())
    }

    /// Checks the pool's invariants and returns the first broken one.
    ///
    /// Checked: those of the index; reservations sorted, disjoint, each
    /// covered exactly by its nodes, with slots for exactly its granules;
    /// each granule counts the live blocks that begin or end in it; every
    /// granule a live block touches is committed; the runs of the idle
    /// list, linked both ways, disjoint, each in one reservation and found
    /// from its first and last granule, hold exactly the committed granules
    /// that no live block touches; the bitmap of long runs' starts marks
    /// exactly the first granules of the runs of more than 64 granules; the
    /// committed and idle counts match; every run record is listed or free;
    /// at most `keep` bytes are Idle unless a decommit failed; bytes used +
    /// free = bytes reserved; committed bytes = used bytes + the free bytes
    /// of Busy granules + Idle bytes.
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
        let slots = self.edges.len();
        let mut touched = alloc::vec![false; slots];
        let mut edges = alloc::vec![0u32; slots];
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
                    edges[lo as usize] += 1;
                    edges[hi as usize - 1] += (hi - 1 != lo) as u32;
                    used_in_busy += n.len();
                }
            });
            if bad || cursor != r.range.end() {
                return Err(Violation::new("reservation not covered exactly by its nodes"));
            }
            reserved += r.range.len();
        }
        bases.sort_unstable();
        if granules != slots
            || bases.windows(2).any(|w| w[0].1 != w[1].0)
            || self.tags.len() != slots
            || self.committed_bits.count(0, slots as u32) as u64 != self.committed
        {
            return Err(Violation::new("slots or committed count do not match the reservations' granules"));
        }
        if edges != self.edges {
            return Err(Violation::new("a granule's count of blocks beginning or ending there is wrong"));
        }
        let (mut busy, mut untouched) = (0u64, 0u64);
        for (i, &t) in touched.iter().enumerate() {
            match (self.committed_bits.get(i as u32), t) {
                (true, true) => busy += 1,
                (true, false) => untouched += 1,
                (false, true) => {
                    return Err(Violation::new("a granule touched by a live block is not committed"))
                }
                (false, false) => {}
            }
        }
        // Every listed run once, linked both ways, on committed granules
        // that no live block touches, in one reservation, found from both
        // ends; runs disjoint.
        let mut listed_run = alloc::vec![false; self.runs.len()];
        let mut in_run = alloc::vec![false; slots];
        let (mut idle, mut runs, mut long_runs, mut prev) = (0u64, 0usize, 0usize, SENTINEL);
        let mut id = self.runs[SENTINEL as usize].next;
        while id != SENTINEL {
            let Some(run) = self.runs.get(id as usize) else {
                return Err(Violation::new("idle list names no run record"));
            };
            if core::mem::replace(&mut listed_run[id as usize], true) || run.prev != prev {
                return Err(Violation::new("idle list holds a run twice or its links are not symmetric"));
            }
            if run.start >= run.end
                || !bases.iter().any(|&(lo, hi)| lo <= run.start && run.end <= hi)
                || self.run_starting(run.start) != Some(id)
                || self.run_ending(run.end - 1) != Some(id)
            {
                return Err(Violation::new(
                    "idle run empty, across reservations, or not found from its ends",
                ));
            }
            let long = run.end - run.start > LONG_RUN;
            if self.long_starts.get(run.start) != long {
                return Err(Violation::new("a long idle run's start is not marked, or a short one's is"));
            }
            long_runs += long as usize;
            for s in run.start..run.end {
                if touched[s as usize]
                    || !self.committed_bits.get(s)
                    || core::mem::replace(&mut in_run[s as usize], true)
                {
                    return Err(Violation::new(
                        "idle run over a Busy or Uncommitted granule, or over another run",
                    ));
                }
            }
            idle += (run.end - run.start) as u64;
            runs += 1;
            prev = id;
            id = run.next;
        }
        if self.runs[SENTINEL as usize].prev != prev || self.runs[SENTINEL as usize].start != NONE {
            return Err(Violation::new("idle list does not end at the sentinel's tail"));
        }
        let mut free = 0;
        let mut id = self.free_run;
        while id != NONE && free <= self.runs.len() {
            if id == SENTINEL
                || listed_run.get(id as usize) != Some(&false)
                || self.runs[id as usize].start != NONE
            {
                return Err(Violation::new("a free run record is listed, holds a run, or is out of range"));
            }
            free += 1;
            id = self.runs[id as usize].next;
        }
        if 1 + runs + free != self.runs.len() {
            return Err(Violation::new("run records neither listed nor free, or free ones in a cycle"));
        }
        // Each long run's start is marked (above): no other slot may be.
        if self.long_starts.count(0, slots as u32) as usize != long_runs {
            return Err(Violation::new("the bitmap of long runs' starts marks a slot where none starts"));
        }
        if idle != untouched || idle != self.idle {
            return Err(Violation::new(
                "idle runs or count do not match the committed granules no block touches",
            ));
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
        let a = match self.index.allocate(request.size(), request.align()) {
            Ok(Some(a)) => a,
            Ok(None) => self.grow_and_allocate(request, stream)?,
            Err(e) => {
                self.retry_trim(stream);
                return Err(e);
            }
        };
        let (lo, hi) = self.slots_of(a.addr, request.rounded_size(256));
        let (s, e) = self.own_slots(lo, hi);
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
        if block.is_empty() {
            return Ok(());
        }
        match self.index.free(block.tag(), block.addr(), block.size()) {
            Ok(_) => {}
            Err(Error::UnknownBlock { .. }) => self.free_by_address(block)?,
            Err(e) => return Err(e),
        }
        let (lo, hi) = self.slots_of(block.addr(), (block.size() + 255) & !255);
        self.unpin(lo, hi);
        if self.idle > self.keep {
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
            .field("committed_bytes", &self.committed_bytes())
            .field("peak_committed_bytes", &self.peak_committed_bytes())
            .field("idle_bytes", &self.idle_bytes())
            .field("used_bytes", &self.index.used_bytes())
            .field("reservations", &self.reservations.len())
            .field("config", &self.config)
            .finish()
    }
}
