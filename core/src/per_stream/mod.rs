//! Per-stream pools: PyTorch's model of stream-ordered reuse, with RMM's
//! moves of memory between streams.
//!
//! [`PerStreamPool`] gives every stream a pool of its own (by default a
//! [`CoalescingPool`](crate::pool::CoalescingPool)), all over one upstream. A block freed on the stream
//! it was allocated on goes straight back to that stream's pool and is
//! reused on that stream at once: stream order makes that safe, and a
//! single stream costs one table lookup more than the bare pool. Memory
//! reaches another stream only as whole chunks, and only after that stream
//! is ordered after every free in them:
//!
//! - **A free on another stream** (a block of A's pool freed on B): an event
//!   is recorded on B, and A waits on it before its next allocation; until
//!   then no chunk is taken from A's pool.
//! - **Fences.** When a free on A leaves a chunk of A's pool wholly free and
//!   other streams have pools, an event is recorded on A, its *fence*: it
//!   covers every wholly free chunk of the pool. With one stream nothing is
//!   recorded; a stream that finds another's free chunks not covered asks
//!   it for a fence at its next allocation.
//! - **Growth.** When C's pool has no room, C takes the shortest wholly free
//!   chunk that could serve the request from another stream's pool (of the
//!   request's class, a large chunk of about its size; C waits on that
//!   pool's fence); failing that, the covered wholly free chunks of every other
//!   stream go back upstream (freed on C after a wait on their fence), and
//!   C's pool grows from upstream, giving back its own wholly free chunks
//!   first (the default of [`PoolConfig`](crate::pool::PoolConfig)). Footprint with many streams thus
//!   stays close to that of one pool.
//! - **Out of memory.** C synchronizes the device
//!   ([`Stream::synchronize_device`]), after which every pool's wholly free
//!   chunks may go back upstream, and tries once more (PyTorch's last
//!   resort; without a device synchronization, only C's own chunks go).
//!
//! **Virtual pools** ([`VirtualMaker`]): each stream's
//! [`VirtualPool`](crate::vpool::VirtualPool) maps a reservation of its
//! own, so no address reaches another stream; physical memory does, once a
//! pool unmaps it. A pool unmaps only in a call on its own stream, after
//! that stream waited on the frees of its blocks on other streams (a free
//! on another stream unmaps nothing, [`ChunkPool::deallocate_cross`], and
//! a free on the pool's stream settles first,
//! [`ChunkPool::frees_give_back`]), or once the device is synchronized
//! (out of memory).
//!
//! No stream handle is kept: every event is recorded on, and every wait
//! made by, the stream of the call in progress; what is kept are events. A
//! stream destroyed after its last call is never touched again (its handle
//! may even be reused for a new stream, which then finds the old pool: as in
//! PyTorch and RMM, synchronize a stream before destroying it if its handle
//! may come back).
//!
//! # Tags
//!
//! Each pool's tags are XORed with a number of its own before they reach
//! the caller, so that a stale block of one pool, freed after its chunk moved
//! to another pool, does not name a live node there by coincidence of two
//! indexes' numbering.

mod check;
mod pools;
#[cfg(test)]
mod tests;

pub use pools::{ChunkPool, MakePool, PoolMaker, VirtualMaker};

use crate::pool::FreeChunk;
use crate::splitmix::SplitMix64;
use crate::{Block, Error, Inspect, MemoryResourceMut, Request, Result, Stream};
use alloc::vec::Vec;
use core::fmt;
use core::marker::PhantomData;

/// Counts of the paths that moved memory between streams.
///
/// # Examples
///
/// ```
/// assert_eq!(memres_core::per_stream::Stats::default().chunks_moved, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Pools made, one per stream that allocated (again after its pool was
    /// emptied and dropped).
    pub pools_made: u64,
    /// Frees of a block on another stream than its pool's.
    pub cross_frees: u64,
    /// Events recorded as fences.
    pub fences: u64,
    /// Wholly free chunks taken from another stream's pool.
    pub chunks_moved: u64,
    /// Bytes of other streams' wholly free chunks given back upstream
    /// before a pool grew.
    pub bytes_released: u64,
    /// Times a pool gave back its wholly free chunks after upstream ran out
    /// of memory, to try once more.
    pub last_resorts: u64,
}

/// One stream's pool and what orders its memory for other streams.
struct Lane<P, E> {
    /// The stream's id.
    id: u64,
    pool: P,
    /// XORed into the pool's tags (see the module's *Tags*).
    stamp: u64,
    /// An event recorded on the stream after the frees before it.
    fence: Option<E>,
    /// Whether `fence` covers every wholly free chunk of `pool` (every
    /// free that left one wholly free came before it; with no fence, the
    /// pool has none): a stream that waits on it may take them.
    covered: bool,
    /// Whether the stream's next allocation (or free that leaves a chunk
    /// wholly free) settles the lane: waits on `waits` and records a fence
    /// if the pool has wholly free chunks. Set by a free of its block on
    /// another stream, by a stream that found its wholly free chunks not
    /// covered, by a record that failed.
    settle_next: bool,
    /// Per stream that freed blocks of `pool` since the lane last settled,
    /// an event recorded after the latest such free.
    waits: Vec<(u64, E)>,
}

impl<P, E> Lane<P, E> {
    /// The fence to wait on before taking this pool's wholly free chunks.
    fn fence_for_takers(&self) -> Option<&E> {
        self.fence.as_ref().filter(|_| self.covered)
    }

    /// Whether a free on the lane's stream must first wait for the frees
    /// of its blocks on other streams: when a free may give memory back.
    #[inline]
    fn settles_before_free<S: Stream + ?Sized>(&self) -> bool
    where
        P: ChunkPool<S>,
    {
        !self.waits.is_empty() && self.pool.frees_give_back()
    }
}

/// A pool per stream over one upstream: see the [module](self)'s
/// documentation.
///
/// ```text
///  lanes: [ Lane { id, pool: P, stamp, fence, covered, settle_next, waits } ... ]
///           ^ last: the lane of the latest call, looked at first
///  allocate(r, s) ─ lane of s (made by M on first use) ─ settle if needed
///                   ─ pool.try_allocate ─ none: a free chunk of another
///                   lane, else release theirs and grow
///  deallocate(b, s) ─ lane of s frees it ─ chunk now wholly free: fence
///                     (if other streams have pools)
///                   └ not its block: the owner's pool frees it; s records
///                     an event the owner waits on first
/// ```
///
/// # Examples
///
/// ```
/// use memres_core::per_stream::{PerStreamPool, PoolMaker};
/// use memres_core::pool::PoolConfig;
/// use memres_core::testing::IdStream;
/// use memres_core::{Inspect, MemoryResourceMut, Request};
/// # use memres_core::testing::BumpUpstream;
/// let up = BumpUpstream::new(1 << 30);
/// let mut pools = PerStreamPool::new(PoolMaker::new(&up));
/// let (a, b) = (IdStream(1), IdStream(2));
/// let x = pools.allocate(Request::new(1000)?, &a)?;
/// pools.deallocate(x, &a)?;
/// // Freed on `a`: reused on `a` at once.
/// let y = pools.allocate(Request::new(1000)?, &a)?;
/// assert_eq!(x.addr(), y.addr());
/// // `b` has a pool of its own: the chunk of `a` is not free.
/// let z = pools.allocate(Request::new(1000)?, &b)?;
/// assert_ne!(z.addr(), y.addr());
/// assert_eq!(pools.stream_count(), 2);
/// pools.deallocate(y, &a)?;
/// pools.deallocate(z, &b)?;
/// pools.check().unwrap();
/// # Ok::<(), memres_core::Error>(())
/// ```
pub struct PerStreamPool<M: MakePool<S>, S: Stream + ?Sized> {
    make: M,
    /// Distinct ids; chunks of different lanes are disjoint.
    lanes: Vec<Lane<M::Pool, S::Event>>,
    /// The lane of the latest call (any value when there is none).
    last: usize,
    /// Lanes ever made: seeds the stamps.
    serial: u64,
    /// The most bytes the pools held from upstream together, counted
    /// where they may have grown (a new pool, growth).
    peak_held: u64,
    /// Chunks the upstream handed one lane over memory another lane holds,
    /// then refused back (outside its contract twice): out of every pool,
    /// so that no stream is served from them, and counted as held. Nothing
    /// gives them back; they are the upstream's to lose.
    stranded: Vec<FreeChunk>,
    stats: Stats,
    _stream: PhantomData<fn(&S)>,
}

/// The caller's tag of `block`, or the pool's tag of a caller's block.
#[inline]
fn restamp(block: Block, stamp: u64) -> Block {
    if block.tag() == Block::NO_TAG {
        return block;
    }
    block.with_tag(block.tag() ^ stamp)
}

impl<M: MakePool<S>, S: Stream + ?Sized> PerStreamPool<M, S> {
    /// No stream has a pool yet; `make` makes each one's.
    pub fn new(make: M) -> Self {
        PerStreamPool {
            make,
            lanes: Vec::new(),
            last: 0,
            serial: 0,
            peak_held: 0,
            stranded: Vec::new(),
            stats: Stats::default(),
            _stream: PhantomData,
        }
    }

    /// What makes the pools.
    pub fn maker(&self) -> &M {
        &self.make
    }

    /// Counts of the paths that moved memory between streams.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Number of streams with a pool.
    pub fn stream_count(&self) -> usize {
        self.lanes.len()
    }

    /// The pool of stream `id`, if it has one.
    pub fn pool_of(&self, id: u64) -> Option<&M::Pool> {
        self.lanes.iter().find(|l| l.id == id).map(|l| &l.pool)
    }

    /// Makes `stream`'s pool now rather than on its first allocation: one
    /// with an initial size ([`PoolMaker::first_initial_size`]) takes it
    /// now. Every pool is the maker's: chunks move between them, so they
    /// must share one upstream (see the `MemoryOf` impls).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if the stream has a pool already; the
    /// maker's error.
    pub fn make_pool(&mut self, stream: &S) -> Result<()> {
        let id = stream.id();
        if self.find(id).is_some() {
            return Err(Error::InvalidConfig { what: "the stream has a pool already" });
        }
        let pool = self.make.make(stream)?;
        self.stats.pools_made += 1;
        self.push_lane_apart(id, stream, pool).map(drop)
    }

    /// Gives the wholly free chunks of the pools back upstream, freed on
    /// `stream` (RMM's `release`, PyTorch's `empty_cache`); returns the
    /// bytes given back. Once the device is synchronized
    /// ([`Stream::synchronize_device`]) every pool's go. Where the stream
    /// cannot synchronize it, `stream`'s own pool's go once `stream` waited
    /// on the frees of its blocks on other streams, and another pool's once
    /// `stream` waited on the fence that covers them; a pool whose free
    /// chunks no fence covers keeps them, and records one at its next call.
    /// Virtual pools unmap their idle granules (a pool of another stream
    /// only after a device synchronization: it unmaps only on its own
    /// stream otherwise).
    ///
    /// # Errors
    ///
    /// A stream's (the synchronization, a wait): nothing went back. The
    /// upstream's first: the chunks it refused stay, the others go back.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::per_stream::{PerStreamPool, PoolMaker};
    /// use memres_core::testing::IdStream;
    /// use memres_core::{Inspect, MemoryResourceMut, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let up = BumpUpstream::new(1 << 30);
    /// let mut pools = PerStreamPool::new(PoolMaker::new(&up));
    /// let (a, b) = (IdStream(1), IdStream(2));
    /// let x = pools.allocate(Request::new(1000)?, &a)?;
    /// let y = pools.allocate(Request::new(1000)?, &b)?;
    /// pools.deallocate(x, &a)?;
    /// pools.deallocate(y, &b)?;
    /// let held = pools.usage().held;
    /// assert_eq!(pools.release(&a)?, held); // `IdStream` synchronizes the device
    /// assert_eq!((pools.usage().held, up.usage().held), (0, 0));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn release(&mut self, stream: &S) -> Result<u64> {
        let synchronized = stream.synchronize_device()?;
        let own = self.find(stream.id());
        // Which pools may give their chunks back on `stream`, with `stream`
        // ordered after what they cover first.
        let mut may = Vec::with_capacity(self.lanes.len());
        for j in 0..self.lanes.len() {
            let ok = if synchronized {
                true
            } else if Some(j) == own {
                for (_, event) in &self.lanes[j].waits {
                    stream.wait(event)?;
                }
                true
            } else {
                let lane = &mut self.lanes[j];
                if lane.pool.shortest_free_chunk(None).is_none() {
                    false
                } else if let Some(fence) = lane.fence_for_takers() {
                    stream.wait(fence)?;
                    true
                } else {
                    // Asked for a fence at its next call, as by a taker.
                    lane.settle_next = true;
                    false
                }
            };
            may.push(ok);
        }
        let mut released = 0;
        let mut refused = None;
        for (lane, _) in self.lanes.iter_mut().zip(may).filter(|(_, ok)| *ok) {
            match lane.pool.release(stream) {
                Ok(n) => released += n,
                Err(e) => {
                    refused.get_or_insert(e);
                }
            }
        }
        refused.map_or(Ok(released), Err)
    }

    /// The lane of stream `id`.
    fn find(&self, id: u64) -> Option<usize> {
        self.lanes.iter().position(|l| l.id == id)
    }

    /// [`allocate`](MemoryResourceMut::allocate) on another stream than the
    /// latest call's, or one to settle, or with no room: the stream's lane
    /// (made now if it has none), settled, then its pool, then memory from
    /// elsewhere.
    #[cold]
    fn allocate_other(&mut self, request: Request, stream: &S, id: u64) -> Result<Block> {
        let i = match self.find(id) {
            Some(i) => i,
            None => {
                let pool = self.make.make(stream)?;
                self.stats.pools_made += 1;
                self.push_lane_apart(id, stream, pool)?
            }
        };
        self.last = i;
        if self.lanes[i].settle_next {
            self.settle(i, stream)?;
        }
        let got = self.lanes[i].pool.try_allocate(request, stream);
        self.count_held_if_grown();
        match got? {
            Some(block) => Ok(block.with_tag(block.tag() ^ self.lanes[i].stamp)),
            None => self.allocate_slow(i, request, stream),
        }
    }

    /// [`deallocate`](MemoryResourceMut::deallocate) on another stream than
    /// the latest call's, or on a lane that settles first
    /// ([`ChunkPool::frees_give_back`]).
    #[cold]
    fn deallocate_other(&mut self, block: Block, stream: &S, id: u64) -> Result<()> {
        let Some(i) = self.find(id) else { return self.deallocate_cross(block, stream, id) };
        self.last = i;
        if self.lanes[i].settles_before_free() && self.lanes[i].pool.holds(block.addr()) {
            self.settle(i, stream)?;
        }
        let lane = &mut self.lanes[i];
        match lane.pool.deallocate_reporting(restamp(block, lane.stamp), stream) {
            Ok(freed_chunk) => {
                if freed_chunk {
                    self.chunk_freed(i, stream);
                }
                Ok(())
            }
            Err(Error::UnknownBlock { .. }) => self.deallocate_cross(block, stream, id),
            Err(e) => Err(e),
        }
    }

    /// [`push_lane`](Self::push_lane), where no chunk of `pool` overlaps
    /// one of another lane's.
    ///
    /// # Errors
    ///
    /// [`Error::UpstreamMisbehaved`] where one does: the new pool's memory
    /// goes back upstream and it is dropped.
    fn push_lane_apart(&mut self, id: u64, stream: &S, mut pool: M::Pool) -> Result<usize> {
        if let Some(clash) = self.overlap(&pool, None) {
            // Wholly free: a new pool has handed nothing out.
            let _ = pool.release(stream);
            return Err(clash);
        }
        Ok(self.push_lane(id, stream, pool))
    }

    /// [`Error::UpstreamMisbehaved`] naming memory where a chunk of `pool`
    /// overlaps one of a lane other than `skip`'s, if one does:
    /// an upstream outside its contract handed the same memory to two
    /// pools, each of which checks only its own chunks. Asked after a pool
    /// took memory (made, or grown in [`grow`](Self::grow)); a chunk moved
    /// between lanes was one lane's, and a virtual pool's reservation is
    /// refused when it commits memory another pool committed.
    ///
    /// # Time Complexity
    ///
    /// O(chunks · log chunks).
    #[cold]
    fn overlap(&self, pool: &M::Pool, skip: Option<usize>) -> Option<Error> {
        if self.lanes.len() == usize::from(skip.is_some()) {
            return None;
        }
        // Each chunk, and whether it is `pool`'s; by start, then a sweep
        // that keeps the furthest end of each side's chunks so far.
        let mut chunks = Vec::new();
        pool.for_each_chunk(&mut |r| chunks.push((r, true)));
        for (_, lane) in self.lanes.iter().enumerate().filter(|&(j, _)| Some(j) != skip) {
            lane.pool.for_each_chunk(&mut |r| chunks.push((r, false)));
        }
        chunks.sort_unstable_by_key(|&(r, mine)| (r.start(), mine));
        let (mut mine_end, mut others_end) = (0, 0);
        for (r, mine) in chunks {
            let (own, other) = if mine { (&mut mine_end, others_end) } else { (&mut others_end, mine_end) };
            if r.start() < other {
                return Some(Error::UpstreamMisbehaved { addr: r.start(), size: r.len(), what: OVERLAP });
            }
            *own = (*own).max(r.end());
        }
        None
    }

    /// Adds a lane for `stream`, whose id its caller read once (`id`), with
    /// `pool`; returns its index.
    fn push_lane(&mut self, id: u64, stream: &S, pool: M::Pool) -> usize {
        let stamp = SplitMix64::new(self.serial).next_u64();
        self.serial += 1;
        let lane =
            Lane { id, pool, stamp, fence: None, covered: false, settle_next: false, waits: Vec::new() };
        // Frees on a lone stream tell no chunk freed: the others' fences may
        // not cover their free chunks now.
        if let [alone] = &mut self.lanes[..] {
            alone.covered = false;
        }
        self.lanes.push(lane);
        self.count_held();
        let i = self.lanes.len() - 1;
        // A new pool may hold a free chunk (its initial size), taken from
        // upstream on this stream.
        self.chunks_freed(i, stream);
        i
    }

    /// Lane `i`'s pool may have a wholly free chunk its fence does not
    /// cover; the call is on its stream.
    fn chunks_freed(&mut self, i: usize, stream: &S) {
        if self.lanes[i].pool.shortest_free_chunk(None).is_some() {
            self.chunk_freed(i, stream);
        }
    }

    /// A chunk of lane `i`'s pool is wholly free, perhaps not covered by its
    /// fence; the call is on its stream. Records a fence if another stream
    /// may want it (others have pools, or one asked).
    #[cold]
    fn chunk_freed(&mut self, i: usize, stream: &S) {
        let lane = &mut self.lanes[i];
        lane.covered = false;
        if lane.settle_next || self.lanes.len() > 1 {
            // On failure the lane stays to settle: nothing is lost.
            let _ = self.settle(i, stream);
        }
    }

    /// Orders lane `i`'s stream after the frees of its blocks on other
    /// streams and records its fence, if it has wholly free chunks for the
    /// fence to cover (a virtual pool never has: it moves none); the call
    /// is on its stream.
    ///
    /// # Errors
    ///
    /// A wait's or the record's; the lane stays to settle (waiting again
    /// is harmless).
    #[cold]
    fn settle(&mut self, i: usize, stream: &S) -> Result<()> {
        let lane = &mut self.lanes[i];
        lane.settle_next = true;
        for (_, event) in &lane.waits {
            stream.wait(event)?;
        }
        // With no wholly free chunk there is nothing to cover: a chunk that
        // goes wholly free later unsets `covered` (`chunk_freed`, or a free
        // on another stream), and the fence is recorded then.
        lane.fence = match lane.pool.shortest_free_chunk(None) {
            Some(_) => {
                let fence = stream.record()?;
                self.stats.fences += 1;
                Some(fence)
            }
            None => None,
        };
        lane.waits.clear();
        lane.covered = true;
        lane.settle_next = false;
        Ok(())
    }

    /// Frees `block` of another stream's pool on `stream`, whose id is `id`.
    #[cold]
    fn deallocate_cross(&mut self, block: Block, stream: &S, id: u64) -> Result<()> {
        let addr = block.addr();
        let owner = self
            .lanes
            .iter()
            .position(|l| l.id != id && l.pool.holds(addr))
            .ok_or(Error::UnknownBlock { addr })?;
        // After the free on `stream`: the owner's stream waits on it before
        // reusing the block. Recorded first, so that a failure changes nothing.
        let event = stream.record()?;
        let lane = &mut self.lanes[owner];
        lane.pool.deallocate_cross(restamp(block, lane.stamp), stream)?;
        // A later event of one stream covers its earlier ones.
        match lane.waits.iter_mut().find(|(s, _)| *s == id) {
            Some(w) => w.1 = event,
            None => lane.waits.push((id, event)),
        }
        lane.covered = false;
        lane.settle_next = true;
        self.stats.cross_frees += 1;
        Ok(())
    }

    /// Lane `i`'s pool has no room for `request`: memory from other
    /// streams, else growth. Returns the caller's block.
    #[cold]
    fn allocate_slow(&mut self, i: usize, request: Request, stream: &S) -> Result<Block> {
        let result = match self.take_chunk(i, request, stream) {
            Ok(Some(block)) => Ok(block),
            Ok(None) => self.grow(i, request, stream),
            Err(e) => Err(e),
        };
        // The lane's index after a growth that dropped others.
        let i = self.last;
        self.count_held();
        // Chunks moved in, or growth left one wholly free.
        self.chunks_freed(i, stream);
        let stamp = self.lanes[i].stamp;
        self.prune(i);
        result.map(|b| restamp(b, stamp))
    }

    /// The fence of lane `j`'s wholly free chunks, for lane `i`; a lane
    /// whose free chunks no fence covers is asked for one at its next call.
    fn fence_of(&mut self, i: usize, j: usize) -> Option<&S::Event> {
        let lane = &mut self.lanes[j];
        if j == i || lane.pool.shortest_free_chunk(None).is_none() {
            return None;
        }
        if !lane.covered {
            lane.settle_next = true;
        }
        lane.fence_for_takers()
    }

    /// Moves the shortest wholly free chunk that could serve `request` from
    /// another lane into lane `i` and allocates from it.
    fn take_chunk(&mut self, i: usize, request: Request, stream: &S) -> Result<Option<Block>> {
        let mut best: Option<(u64, usize)> = None;
        for j in 0..self.lanes.len() {
            if self.fence_of(i, j).is_none() {
                continue;
            }
            if let Some(len) = self.lanes[j].pool.shortest_free_chunk(Some(request)) {
                if best.is_none_or(|(shortest, _)| len < shortest) {
                    best = Some((len, j));
                }
            }
        }
        let Some((_, j)) = best else { return Ok(None) };
        if let Some(fence) = self.lanes[j].fence_for_takers() {
            stream.wait(fence)?;
        }
        // Lanes' pools are all the maker's (see the `MemoryOf` impls below).
        let leave = crate::pool::ChunkMove::granted();
        let Some(chunk) = self.lanes[j].pool.take_free_chunk(Some(request), leave) else { return Ok(None) };
        if let Err((e, chunk)) = self.lanes[i].pool.adopt_chunk(chunk, leave) {
            // Back where it came from, into the slots it just left.
            return match self.lanes[j].pool.adopt_chunk(chunk, leave) {
                Ok(()) => Ok(None),
                Err(_) => Err(e),
            };
        }
        self.stats.chunks_moved += 1;
        // Wholly free in lane `i`, and its fence was recorded before the
        // wait above: no taker may rely on it until the lane settles. Set
        // now, not by `chunks_freed` after a growth: a panic in between
        // (of the upstream, of a stream) would skip that.
        self.lanes[i].covered = false;
        self.lanes[i].pool.try_allocate(request, stream)
    }

    /// Gives the covered wholly free chunks of the other lanes back upstream
    /// (on `stream`, after a wait on each one's fence), then grows lane
    /// `i`'s pool; on out of memory, the last resort (every lane's free
    /// memory back, then the lanes left holding nothing dropped, which moves
    /// lane `i` to `self.last`) and once more.
    ///
    /// A chunk the upstream refuses to take back stays in its lane, and the
    /// growth goes on without the room it would have made, as a pool's own
    /// growth does: the refusal is the error only if the growth then runs
    /// out of memory.
    fn grow(&mut self, i: usize, request: Request, stream: &S) -> Result<Block> {
        let mut refused = None;
        // A lane's release: the bytes its pool holds less after it, also
        // where the upstream refused a chunk after taking others (the first
        // refusal kept).
        let mut release = |pool: &mut M::Pool| {
            let before = pool.held();
            if let Err(e) = pool.release(stream) {
                refused.get_or_insert(e);
            }
            before.saturating_sub(pool.held())
        };
        let mut given_back = 0;
        for j in 0..self.lanes.len() {
            if let Some(fence) = self.fence_of(i, j) {
                if let Err(e) = stream.wait(fence) {
                    // What the lanes before gave back went back all the same.
                    self.stats.bytes_released += given_back;
                    return Err(e);
                }
                given_back += release(&mut self.lanes[j].pool);
            }
        }
        self.stats.bytes_released += given_back;
        // A pool that grows in `try_allocate` tried just that on the fast
        // path: again only once other streams gave memory back.
        if !M::Pool::GROWS_IN_TRY_ALLOCATE || given_back > 0 {
            match self.allocate_apart(i, request, stream) {
                Err(e) if e.is_out_of_memory() => {}
                other => return other,
            }
        }
        // The last resort: with the device idle, every stream's wholly free
        // chunks may go back (on `stream`); else only this one's.
        self.stats.last_resorts += 1;
        let lanes_to_empty = if stream.synchronize_device()? { 0..self.lanes.len() } else { i..i + 1 };
        for j in lanes_to_empty {
            release(&mut self.lanes[j].pool);
        }
        // Lanes left holding nothing keep what a growth of this one may need
        // (a virtual pool's reservations of the shared address space): they
        // go first, as they would after this call.
        self.prune(i);
        let i = self.last;
        // Once more, whatever went back: besides the lanes' memory, the
        // upstream may hold memory that came free at the synchronization
        // (another user's frees done), a pool's own growth gives back again
        // what was refused, a virtual pool retries the trim that failed.
        match self.allocate_apart(i, request, stream) {
            Err(e) if e.is_out_of_memory() => Err(self.whole(refused.unwrap_or(e))),
            last => last,
        }
    }

    /// Lane `i`'s pool's `allocate`, which may take memory upstream:
    /// refused where that memory overlaps another lane's
    /// ([`overlap`](Self::overlap)), with the block given back to the pool
    /// and the pool's wholly free chunks upstream.
    fn allocate_apart(&mut self, i: usize, request: Request, stream: &S) -> Result<Block> {
        let held = self.lanes[i].pool.held();
        let block = self.lanes[i].pool.allocate(request, stream)?;
        if self.lanes[i].pool.held() <= held {
            return Ok(block);
        }
        let Some(clash) = self.overlap(&self.lanes[i].pool, Some(i)) else { return Ok(block) };
        let pool = &mut self.lanes[i].pool;
        let _ = pool.deallocate(block, stream);
        if pool.release(stream).is_err() && self.overlap(&self.lanes[i].pool, Some(i)).is_some() {
            self.strand_clashing(i);
        }
        Err(clash)
    }

    /// Takes the wholly free chunks of lane `i` that overlap another lane's
    /// out of its pool, into `stranded`, where no stream is served from
    /// them: the upstream handed them over memory another pool holds, then
    /// refused them back. The lane's other free chunks go back in.
    #[cold]
    fn strand_clashing(&mut self, i: usize) {
        let leave = crate::pool::ChunkMove::granted();
        let mut taken = Vec::new();
        while let Some(chunk) = self.lanes[i].pool.take_free_chunk(None, leave) {
            taken.push(chunk);
        }
        for chunk in taken {
            let r = chunk.range();
            let mut clashes = false;
            for (_, lane) in self.lanes.iter().enumerate().filter(|&(j, _)| j != i) {
                lane.pool.for_each_chunk(&mut |c| clashes |= c.overlaps(&r));
            }
            if clashes {
                self.stranded.push(chunk);
            } else if let Err((_, chunk)) = self.lanes[i].pool.adopt_chunk(chunk, leave) {
                // Into the slots it just left: not expected to fail, and
                // never served if it does.
                self.stranded.push(chunk);
            }
        }
    }

    /// An out-of-memory error of one lane's pool as the whole resource's:
    /// its pool size is what every stream's pool holds (one lane's was a
    /// part of what the resource held, and the message said less than the
    /// device had given). The largest free block stays the lane's: the one
    /// the failed request could have used.
    fn whole(&self, e: Error) -> Error {
        match e {
            Error::OutOfMemory { requested, largest_free, pool_size: _, max_size } => {
                Error::OutOfMemory { requested, largest_free, pool_size: self.held(), max_size }
            }
            other => other,
        }
    }

    /// After a `try_allocate` that may have taken memory, whether or not it
    /// succeeded (a failed one may keep granules it could not unmap): the
    /// peak held raised to what the pools hold now.
    #[inline]
    fn count_held_if_grown(&mut self) {
        if M::Pool::GROWS_IN_TRY_ALLOCATE {
            self.count_held();
        }
    }

    /// Raises the peak held to what the pools hold now.
    fn count_held(&mut self) {
        self.peak_held = self.peak_held.max(self.held());
    }

    /// What the pools hold together. The sum saturates, as `Usage::plus`'s
    /// does: a space outside the contract may hand two lanes the same
    /// reservation (the second keeps it where its commit is refused;
    /// chunks that overlap are refused: [`overlap`](Self::overlap)).
    pub(super) fn held(&self) -> u64 {
        self.lanes.iter().fold(self.stranded_bytes(), |sum, l| sum.saturating_add(l.pool.held()))
    }

    /// Bytes of the [`stranded`](Self::stranded) chunks.
    pub(super) fn stranded_bytes(&self) -> u64 {
        self.stranded.iter().fold(0, |sum, c| sum.saturating_add(c.range().len()))
    }

    /// Drops the lanes other than `keep` that hold no chunk (streams whose
    /// memory went elsewhere): they are made again if their stream comes back.
    fn prune(&mut self, keep: usize) {
        let id = self.lanes[keep].id;
        self.lanes.retain(|l| l.id == id || l.pool.held() > 0);
        self.last = self.lanes.iter().position(|l| l.id == id).unwrap_or(0);
    }
}

// SAFETY: every block is one that a stream's `CoalescingPool` handed out
// (`CoalescingPool<U>` is `MemoryOf<E>` where `U` is), with its address and
// size unchanged (only the tag is restamped, and restamped back before the
// block is freed), freed only through the pool whose chunk holds it. A
// chunk moves from one stream's pool to another's only while wholly free,
// so no live block is ever in two pools; and every pool is the maker's (a
// stream's first allocation and `make_pool` are the only ways a pool comes
// in), so every pool's upstream is a clone of one `Arc` (or a copy of one
// reference) to the same `R`, so a
// chunk taken from it stays `R`'s, held until a pool frees it to `R`,
// whichever pool that is. The lanes keep their records in their own
// vectors, never in the memory. (A maker of the user's, or an upstream
// whose clones are separate resources, is not covered: a chunk moved
// between pools would then outlive the resource it came from.)
unsafe impl<E, R, S> crate::copy::MemoryOf<E> for PerStreamPool<PoolMaker<alloc::sync::Arc<R>>, S>
where
    R: crate::copy::MemoryOf<E> + crate::MemoryResource<S> + ?Sized,
    S: Stream + ?Sized,
{
}

// SAFETY: as for `Arc<R>` above: copies of one reference are one `R`.
unsafe impl<E, R, S> crate::copy::MemoryOf<E> for PerStreamPool<PoolMaker<&R>, S>
where
    R: crate::copy::MemoryOf<E> + crate::MemoryResource<S> + ?Sized,
    S: Stream + ?Sized,
{
}

// SAFETY: every block is one that a stream's `VirtualPool<V>` (`MemoryOf<E>`
// where its space `V` is) handed out, address and size unchanged, freed
// only through that pool (the one whose reservation holds it). Virtual
// pools hand no chunk over: a block lives in its own pool's reservation of
// its own space from allocation to free, and a pool is dropped only once
// none of its blocks is live. The lanes keep their records in their own
// vectors, never in the memory.
unsafe impl<E, V, S> crate::copy::MemoryOf<E> for PerStreamPool<VirtualMaker<V>, S>
where
    V: crate::vmem::ReservableSpace + Clone + crate::copy::MemoryOf<E>,
    S: Stream + ?Sized,
{
}

/// What [`PerStreamPool::overlap`] says of the upstream.
const OVERLAP: &str = "memory another stream's pool holds";

impl<M: MakePool<S>, S: Stream + ?Sized> MemoryResourceMut<S> for PerStreamPool<M, S> {
    /// # Errors
    ///
    /// The pool maker's error for a stream's first allocation; a stream's
    /// from wait or record; the pool's out of memory after the last resort;
    /// [`Error::UpstreamMisbehaved`] for memory the upstream handed a pool
    /// that another stream's pool holds (given back); the pool's other
    /// errors. No block is handed out or changed then
    /// (waits and records made add only order; what other streams' pools
    /// gave back stays given back). A stream's first allocation that fails
    /// after its pool was made keeps that pool for the stream's next calls,
    /// with what the maker gave it: a chunk pool's initial chunk (the one
    /// [`first_initial_size`](PoolMaker::first_initial_size) is used up),
    /// a virtual pool's reservation (until a growth drops the pools that
    /// hold nothing).
    ///
    /// # Time Complexity
    ///
    /// O(1) when the stream's pool has room (one lookup of the stream,
    /// the latest one first); otherwise O(streams · chunks) and the
    /// upstream's calls.
    #[inline]
    fn allocate(&mut self, request: Request, stream: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        // Read once per call, as `Stream::id` says this pool does: a
        // stream may answer otherwise at the next read, and the lane found
        // must be the lane used.
        let id = stream.id();
        // The stream of the latest call, with room and nothing to settle.
        if let Some(lane) = self.lanes.get_mut(self.last) {
            if lane.id == id && !lane.settle_next {
                let stamp = lane.stamp;
                let got = lane.pool.try_allocate(request, stream);
                self.count_held_if_grown();
                return match got? {
                    // A pool's tag is never `NO_TAG`.
                    Some(block) => Ok(block.with_tag(block.tag() ^ stamp)),
                    // The lane is found and settled: not asked again.
                    None => self.allocate_slow(self.last, request, stream),
                };
            }
        }
        self.allocate_other(request, stream, id)
    }

    /// # Errors
    ///
    /// [`Error::UnknownBlock`] for a block no pool holds,
    /// [`Error::DoubleFree`], [`Error::SizeMismatch`]; for a block of
    /// another stream's pool, the stream's error from record. Nothing
    /// changes then.
    ///
    /// # Time Complexity
    ///
    /// O(1) on the stream the block was allocated on (O(log chunks) when
    /// the free joins a range as long as the shortest chunk); O(streams ·
    /// log chunks) on another.
    #[inline]
    fn deallocate(&mut self, block: Block, stream: &S) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let (last, id) = (self.last, stream.id());
        let alone = self.lanes.len() == 1;
        match self.lanes.get_mut(last) {
            // One stream: no other would take a chunk, none to tell of;
            // unless its fence says it covers every wholly free chunk
            // (recorded while another stream had a pool, or for a release
            // on another stream), which a free that leaves one must undo.
            Some(lane) if lane.id == id && alone && !lane.covered && !lane.settles_before_free() => {
                match lane.pool.deallocate(restamp(block, lane.stamp), stream) {
                    Err(Error::UnknownBlock { .. }) => self.deallocate_cross(block, stream, id),
                    other => other,
                }
            }
            Some(lane) if lane.id == id && !lane.settles_before_free() => {
                match lane.pool.deallocate_reporting(restamp(block, lane.stamp), stream) {
                    Ok(false) => Ok(()),
                    Ok(true) => {
                        self.chunk_freed(last, stream);
                        Ok(())
                    }
                    // Not in this stream's pool: another's, or none's.
                    Err(Error::UnknownBlock { .. }) => self.deallocate_cross(block, stream, id),
                    Err(e) => Err(e),
                }
            }
            _ => self.deallocate_other(block, stream, id),
        }
    }
}

impl<M: MakePool<S> + fmt::Debug, S: Stream + ?Sized> fmt::Debug for PerStreamPool<M, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerStreamPool")
            .field("make", &self.make)
            .field("streams", &self.lanes.iter().map(|l| l.id).collect::<Vec<_>>())
            .field("usage", &self.usage())
            .field("stats", &self.stats)
            .finish()
    }
}
