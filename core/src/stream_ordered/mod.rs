//! The stream-ordered layer: RMM's `stream_ordered_memory_resource` over any
//! stream-agnostic algorithm.
//!
//! [`StreamOrdered`] keeps the blocks freed on each stream in a free list of
//! that stream. A block freed on stream A is reused on A at once (stream
//! order makes that safe); another stream B takes it only after B waits on an
//! event recorded on A after the free. Blocks whose free has completed go
//! back to the inner algorithm, where they coalesce.

mod check;
mod free_list;
#[cfg(test)]
mod tests;

use crate::{Block, Error, MemoryResourceMut, Request, Result, Stream};
use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;
use core::fmt;
use core::ops::Bound::{Excluded, Unbounded};
use free_list::{checked_footprint, footprint, FreeList};

/// How blocks move between streams.
///
/// # Examples
///
/// ```
/// use memres_core::stream_ordered::CrossStream;
/// assert_eq!(CrossStream::default(), CrossStream::Wait);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CrossStream {
    /// The taker waits on an event recorded on the freeing stream (correct).
    #[default]
    Wait,
    /// Deliberately wrong: take another stream's block without waiting.
    /// It exists so that tests can show that a happens-before checker
    /// catches the race (feature `testing`); never use it for real work.
    #[cfg(any(test, feature = "testing"))]
    Unordered,
}

/// Counts of the paths allocations took.
///
/// # Examples
///
/// ```
/// use memres_core::stream_ordered::Stats;
/// assert_eq!(Stats::default().steals, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Allocations served from the stream's own free list.
    pub own_hits: u64,
    /// Allocations served from another stream's free list (after a wait).
    pub steals: u64,
    /// Allocations served by the inner algorithm.
    pub inner_allocations: u64,
    /// Blocks given back to the inner algorithm because their free completed.
    pub reclaimed: u64,
    /// Times every stream was synchronized and every list merged back before
    /// out of memory (RMM's last resort).
    pub last_resorts: u64,
    /// Listed blocks the inner algorithm refused back (its `deallocate`
    /// failed, outside its contract); each stays listed and is offered again.
    pub refused: u64,
}

/// RMM's stream-ordered memory resource over a stream-agnostic algorithm `A`
/// (any [`MemoryResourceMut<()>`], such as the
/// [`CoalescingPool`](crate::pool::CoalescingPool)), on streams `S`.
///
/// # Data structure
///
/// ```text
///            inner: A (stream-agnostic; coalesces what it gets back)
///               ^  allocate                    ^ deallocate
///               |                              | (free completed, or
///   slots: [ inner block | size | gen ] ...    |  last resort)
///          ^ tag = gen << 32 | slot            |
///   lists: stream id -> FreeList  -------------+
///          +------------------------------------------------------+
///          | stream: S             (to record, query, synchronize) |
///          | buckets: footprint -> [(inner block, seq), ...]       |
///          |          (oldest free first, newest last)             |
///          | fence:   (event, seq)  covers blocks freed before seq |
///          +------------------------------------------------------+
/// ```
///
/// - A user's block carries a *tag* naming its slot and the slot's
///   generation, so `deallocate` finds the inner block in O(1) and tells a
///   double free (older generation) from a foreign block: at the slot's
///   address, or where the slot went on to another address, at one where
///   the layer holds a block (listed, or served again); an older generation
///   at any other address is a foreign block. Generations never
///   wrap: after 2^32 - 1 frees of one slot the slot is retired (one slot,
///   40 bytes, per 2^32 - 1 reuses), so a stale tag stays a double free.
/// - `deallocate(b, s)` puts the inner block at the back of its bucket in
///   `s`'s list (O(log b)); a
///   block may be freed on another stream than the one it was allocated on.
/// - `allocate(r, s)` tries, in order: `s`'s own list (the smallest bucket
///   that fits, its newest block: O(log b) in the number of distinct sizes);
///   another stream's list (record an event on that stream, make `s` wait on
///   it, O(streams · log b)); the inner algorithm; the blocks whose free is
///   known complete given back to the inner algorithm and the inner tried
///   again; finally RMM's last resort: synchronize every stream known, give
///   every listed block back, try the inner algorithm once more.
/// - A listed block serves a request only if it wastes at most half of
///   itself counted in footprints, sizes rounded up to 256 (`round(size)
///   <= 2 · round(request)`: a 1000-byte block serves a 257-byte request,
///   512 bytes rounded), since listed blocks are not split.
/// - [`reclaim`](StreamOrdered::reclaim) gives back the blocks covered by a
///   completed fence (one event query per stream; they are the fronts of the
///   buckets) and fences the rest.
/// - A listed block the inner refuses back (its `deallocate` fails, outside
///   its contract) is still the inner's block held by this layer: it stays
///   listed and serves as before, goes to the back of its bucket, and is
///   offered again after the next fence (or at the last resort, or on
///   drop); the others go back all the same ([`Stats::refused`]).
///
/// # Examples
///
/// ```
/// use memres_core::pool::CoalescingPool;
/// use memres_core::stream_ordered::StreamOrdered;
/// use memres_core::{Inspect, MemoryResourceMut, Request};
/// # use memres_core::testing::BumpUpstream;
/// let mut so = StreamOrdered::<_, ()>::new(CoalescingPool::new(BumpUpstream::new(1 << 30)));
/// let a = so.allocate(Request::new(1000)?, &())?;
/// so.deallocate(a, &())?;
/// // Freed on this stream: reused at once.
/// let b = so.allocate(Request::new(1000)?, &())?;
/// assert_eq!(a.addr(), b.addr());
/// assert_eq!(so.stats().own_hits, 1);
/// so.deallocate(b, &())?;
/// so.check().unwrap(); // the layer's invariants, then the pool's
/// # Ok::<(), memres_core::Error>(())
/// ```
pub struct StreamOrdered<A, S: Stream> {
    /// The algorithm that owns all memory; holds every block that is neither
    /// live nor listed.
    inner: A,
    /// Free lists by stream id. Listed blocks are disjoint from each other
    /// and from live blocks.
    lists: BTreeMap<u64, FreeList<S>>,
    /// Live blocks; a vacant slot has `live == false` and its index is in
    /// `vacant`, unless its generations are used up (then it is retired).
    slots: Vec<Slot>,
    /// Indices of vacant slots, each once.
    vacant: Vec<u32>,
    /// Number of live slots.
    live: usize,
    /// Sum of the footprints (sizes rounded up to 256) of the inner blocks
    /// behind live blocks.
    live_bytes: u64,
    /// Sum of the footprints of listed blocks.
    listed_bytes: u64,
    cross: CrossStream,
    stats: Stats,
    /// How a listed block goes back to `inner` when the layer is dropped:
    /// set by the first free (a `fn` of `A`'s free, which `Drop` cannot
    /// name).
    at_drop: Option<fn(&mut A, Block)>,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    /// The block as the inner algorithm handed it out (its tag is the
    /// inner's).
    inner: Block,
    /// The size the user asked for.
    size: u64,
    /// Bumped on each free; part of the user's tag. At `u32::MAX` the slot
    /// is retired: never on the vacant list again.
    generation: u32,
    live: bool,
}

impl<A, S: Stream> StreamOrdered<A, S> {
    /// A layer over `inner`, with no stream known yet.
    pub fn new(inner: A) -> Self {
        StreamOrdered {
            inner,
            lists: BTreeMap::new(),
            slots: Vec::new(),
            vacant: Vec::new(),
            live: 0,
            live_bytes: 0,
            listed_bytes: 0,
            cross: CrossStream::Wait,
            stats: Stats::default(),
            at_drop: None,
        }
    }

    /// The layer, moving blocks between streams as `cross` says
    /// (`CrossStream::Unordered`, feature `testing`, only to test checkers).
    pub fn with_cross_stream(mut self, cross: CrossStream) -> Self {
        self.cross = cross;
        self
    }

    /// The inner algorithm.
    pub fn inner(&self) -> &A {
        &self.inner
    }

    /// Counts of the paths allocations took.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Number of live blocks.
    pub fn live_count(&self) -> usize {
        self.live
    }

    /// Bytes in the free lists (not in the inner algorithm), each block
    /// rounded up to 256.
    pub fn listed_bytes(&self) -> u64 {
        self.listed_bytes
    }

    /// Bytes of the inner algorithm's blocks that the layer holds, live or
    /// listed, each block rounded up to 256.
    pub fn held_bytes(&self) -> u64 {
        self.live_bytes + self.listed_bytes
    }

    /// Number of blocks in the free lists.
    pub fn listed_count(&self) -> usize {
        self.lists.values().map(|l| l.len).sum()
    }

    /// Number of streams with a free list.
    pub fn stream_count(&self) -> usize {
        self.lists.len()
    }

    /// Hands out `inner` for `request` under a fresh tag.
    fn hand_out(&mut self, inner: Block, request: Request) -> Block {
        let slot = Slot { inner, size: request.size(), generation: 0, live: true };
        let index = match self.vacant.pop() {
            Some(i) => {
                let s = &mut self.slots[i as usize];
                *s = Slot { generation: s.generation, ..slot };
                i
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.live += 1;
        self.live_bytes += footprint(&inner);
        let generation = self.slots[index as usize].generation;
        Block::new(inner.addr(), request.size(), (u64::from(generation) << 32) | u64::from(index))
    }

    /// The slot of a user's block.
    fn slot_of(&self, block: &Block) -> Result<usize> {
        let addr = block.addr();
        let index = (block.tag() & 0xffff_ffff) as usize;
        let generation = (block.tag() >> 32) as u32;
        let s = match self.slots.get(index) {
            Some(s) if block.tag() != Block::NO_TAG => s,
            _ => return Err(Error::UnknownBlock { addr }),
        };
        if s.inner.addr() == addr {
            if s.live && s.generation == generation {
                if s.size != block.size() {
                    return Err(Error::SizeMismatch { addr, expected: s.size, given: block.size() });
                }
                return Ok(index);
            }
            if generation < s.generation {
                return Err(Error::DoubleFree { addr });
            }
        } else if generation < s.generation && self.holds(addr) {
            // The slot went on to a block at another address; this one's
            // is still the layer's (listed, or served again): freed before.
            return Err(Error::DoubleFree { addr });
        }
        Err(Error::UnknownBlock { addr })
    }

    /// Whether a block the layer holds, live or listed, starts at `addr`:
    /// a stale tag's address held so was freed through this layer, any
    /// other is not the layer's (a forged tag, another resource's block).
    /// O(blocks held), on the path of a refused free only.
    #[cold]
    fn holds(&self, addr: u64) -> bool {
        let live = self.slots.iter().any(|s| s.live && s.inner.addr() == addr);
        let mut listed = self.lists.values().flat_map(|l| l.buckets.values().flatten());
        live || listed.any(|(b, _)| b.addr() == addr)
    }

    fn take(&mut self, id: u64, (size, index): (u64, usize)) -> Block {
        let list = self.lists.get_mut(&id).expect("list exists");
        let block = list.remove(size, index);
        self.listed_bytes -= footprint(&block);
        block
    }
}

/// Takes the oldest block of `list`'s bucket `size` (which has one) off the
/// list, then gives it back to `inner`; a block `inner` refuses goes back on
/// the list, last, and its error is returned. Off the list first: the inner
/// free is the user's code, which may take the block and then panic, and a
/// block still listed would then be served beside the inner's own (it is
/// lost at worst, never handed out twice).
fn unlist_and_free<S: Stream>(
    list: &mut FreeList<S>,
    size: u64,
    inner: &mut impl MemoryResourceMut<()>,
    listed_bytes: &mut u64,
) -> Option<Error> {
    let block = list.remove(size, 0);
    *listed_bytes -= size;
    let e = inner.deallocate(block, &()).err()?;
    list.push(block);
    *listed_bytes += size;
    Some(e)
}

impl<A: MemoryResourceMut<()>, S: Stream + Clone> StreamOrdered<A, S> {
    /// Gives back to the inner algorithm every listed block whose free is
    /// known to have completed, then records a fence on each stream with
    /// blocks not yet covered; returns the blocks given back.
    ///
    /// A block freed at a time `t` is given back by the first call after a
    /// fence recorded after `t` has completed. A block the inner algorithm
    /// refuses back (its `deallocate` fails, outside its contract) stays
    /// listed, serving as before, at the back of its bucket, to be offered
    /// again after the next fence; counted in [`Stats::refused`].
    ///
    /// # Errors
    ///
    /// The first error met, once every other list was handled: a stream's
    /// error from query (its list stays as it was) or record (its list
    /// stays unfenced, to be fenced by the next call), or the inner
    /// algorithm's refusal. What was given back stays given back.
    ///
    /// # Time Complexity
    ///
    /// One query (and at most one record) per stream, plus O(log n) per
    /// block given back.
    pub fn reclaim(&mut self) -> Result<usize> {
        let (given, failed) = self.reclaim_past_failures();
        failed.map_or(Ok(given), Err)
    }

    /// [`reclaim`](Self::reclaim), with its first error beside the count:
    /// one stream's failure does not keep the others' blocks listed, as
    /// an allocation may need them.
    fn reclaim_past_failures(&mut self) -> (usize, Option<Error>) {
        let (mut given, mut failed) = (0, None);
        for list in self.lists.values_mut() {
            if let Some((event, upto)) = &list.fence {
                match list.stream.query(event) {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        failed.get_or_insert(e);
                        continue;
                    }
                }
                let upto = *upto;
                let mut next = list.buckets.keys().next().copied();
                while let Some(size) = next {
                    next = list.buckets.range((Excluded(size), Unbounded)).next().map(|(&k, _)| k);
                    while list.buckets.get(&size).and_then(|q| q.front()).is_some_and(|&(_, seq)| seq < upto)
                    {
                        // A refused block goes to the back, past `upto`.
                        let refused = unlist_and_free(list, size, &mut self.inner, &mut self.listed_bytes);
                        if let Some(e) = refused {
                            failed.get_or_insert(e);
                            self.stats.refused += 1;
                            continue;
                        }
                        self.stats.reclaimed += 1;
                        given += 1;
                    }
                }
                list.fence = None;
            }
            if list.len > 0 {
                match list.stream.record() {
                    Ok(event) => list.fence = Some((event, list.next_seq)),
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
        }
        (given, failed)
    }

    /// RMM's last resort: synchronizes every stream with a free list and
    /// gives every listed block back to the inner algorithm. A block the
    /// inner refuses back stays listed, as in [`reclaim`](Self::reclaim).
    ///
    /// # Errors
    ///
    /// The first error met, once every other list was merged: a stream's
    /// error from synchronize (its list stays as it was), or the inner
    /// algorithm's refusal.
    ///
    /// # Time Complexity
    ///
    /// One synchronize per stream, O(log n) per listed block.
    pub fn synchronize_and_merge(&mut self) -> Result<()> {
        self.merge_past_failures().map_or(Ok(()), Err)
    }

    /// [`synchronize_and_merge`](Self::synchronize_and_merge), with its
    /// first error apart.
    fn merge_past_failures(&mut self) -> Option<Error> {
        let mut failed = None;
        for list in self.lists.values_mut() {
            if list.len == 0 {
                continue;
            }
            if let Err(e) = list.stream.synchronize() {
                failed.get_or_insert(e);
                continue;
            }
            let mut next = list.buckets.keys().next().copied();
            while let Some(size) = next {
                next = list.buckets.range((Excluded(size), Unbounded)).next().map(|(&k, _)| k);
                // Each block once: a refused one goes to the back.
                for _ in 0..list.buckets.get(&size).map_or(0, VecDeque::len) {
                    if let Some(e) = unlist_and_free(list, size, &mut self.inner, &mut self.listed_bytes) {
                        failed.get_or_insert(e);
                        self.stats.refused += 1;
                    }
                }
            }
            list.fence = None;
        }
        failed
    }

    /// A fitting block from the list of another stream than `stream`
    /// (whose id is `me`), ordered after its free.
    fn steal(&mut self, request: Request, me: u64, stream: &S) -> Result<Option<Block>> {
        let found =
            self.lists.iter().filter(|(&id, _)| id != me).find_map(|(&id, l)| Some((id, l.find(request)?)));
        let Some((id, key)) = found else { return Ok(None) };
        if self.cross == CrossStream::Wait && !crate::plant::MISSING_WAIT {
            // An event after the free (the block is in the list, so the free
            // came before), then the taker waits on it. Either call failing
            // leaves the block where it was.
            let event = self.lists[&id].stream.record()?;
            stream.wait(&event)?;
        }
        self.stats.steals += 1;
        Ok(Some(self.take(id, key)))
    }

    fn inner_allocate(&mut self, request: Request) -> Result<Block> {
        let block = self.inner.allocate(request, &())?;
        // Handed out whole as the request's block: it must hold it, aligned
        // as asked. Kept whole, and counted by its footprint: that must end
        // at an address, and leave the bytes held countable (the inner, the
        // user's code, may hand out a block longer than asked up to the last
        // address).
        // A mask, not a division, on this path of every fresh block: the
        // alignment is a power of two (`Request`'s invariant).
        let aligned = match block.addr() & (request.align() - 1) {
            0 => Ok(()),
            _ => Err(block.misbehaved("not aligned as asked")),
        };
        let counted = checked_footprint(&block)
            .and_then(|bytes| self.held_bytes().checked_add(bytes))
            .ok_or(block.misbehaved("its footprint, with the bytes held, past the last address"));
        if let Err(e) = block.upstream_range(request.size()).and(aligned).and(counted) {
            let _ = self.inner.deallocate(block, &());
            return Err(e);
        }
        self.stats.inner_allocations += 1;
        Ok(block)
    }

    fn allocate_slow(&mut self, request: Request, id: u64, stream: &S) -> Result<Block> {
        if let Some(b) = self.steal(request, id, stream)? {
            return Ok(b);
        }
        let err = match self.inner_allocate(request) {
            Err(e) if e.is_out_of_memory() => e,
            other => return other,
        };
        if self.listed_bytes == 0 {
            return Err(err);
        }
        // Past a block the inner refuses back or a stream that fails, as a
        // pool's growth goes on past a chunk refused: the failure is the
        // error only where no room was made.
        let (given, mut failed) = self.reclaim_past_failures();
        let err = match given {
            0 => err,
            _ => match self.inner_allocate(request) {
                Err(e) if e.is_out_of_memory() => e,
                other => return other,
            },
        };
        if self.listed_bytes == 0 {
            return Err(failed.unwrap_or(err));
        }
        self.stats.last_resorts += 1;
        if let Some(e) = self.merge_past_failures() {
            failed.get_or_insert(e);
        }
        match self.inner_allocate(request) {
            Err(e) if e.is_out_of_memory() => Err(failed.unwrap_or(e)),
            other => other,
        }
    }
}

impl<A: MemoryResourceMut<()>, S: Stream + Clone> MemoryResourceMut<S> for StreamOrdered<A, S> {
    /// # Errors
    ///
    /// The inner algorithm's out of memory after the last resort; a
    /// stream's error from record or wait taking another stream's block;
    /// the first error of a stream's query, record or synchronize in the
    /// reclaim and the last resort, where they made no room (a stream that
    /// fails keeps its list; the others' blocks go back all the same); the
    /// inner's other errors.
    ///
    /// # Time Complexity
    ///
    /// O(log n) from the own list; O(streams · log n) from another list;
    /// plus the inner algorithm's cost, and on its failure one query per
    /// stream, then one synchronize per stream.
    fn allocate(&mut self, request: Request, stream: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        // Read once: `find` and `take` must see the same list, and `steal`
        // must leave it out, whatever a stream's `id` answers from read to
        // read.
        let id = stream.id();
        let own = self.lists.get(&id).and_then(|l| l.find(request));
        let inner = match own {
            Some(key) => {
                self.stats.own_hits += 1;
                self.take(id, key)
            }
            None => self.allocate_slow(request, id, stream)?,
        };
        Ok(self.hand_out(inner, request))
    }

    /// # Errors
    ///
    /// [`Error::UnknownBlock`] for a block this layer did not hand out
    /// (blocks with [`Block::NO_TAG`] included), [`Error::DoubleFree`] for
    /// a block's tag after its free (see the type's documentation),
    /// [`Error::SizeMismatch`]; nothing changes then.
    ///
    /// # Time Complexity
    ///
    /// O(log n) in the stream's list; a stale tag whose slot went on to
    /// another address, O(blocks the layer holds).
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::pool::CoalescingPool;
    /// use memres_core::stream_ordered::StreamOrdered;
    /// use memres_core::testing::BumpUpstream;
    /// use memres_core::{Block, Error, MemoryResourceMut, Request};
    /// let mut so = StreamOrdered::<_, ()>::new(CoalescingPool::new(BumpUpstream::new(1 << 30)));
    /// let a = so.allocate(Request::new(1000)?, &())?;
    /// so.deallocate(a, &())?;
    /// let b = so.allocate(Request::new(1 << 20)?, &())?; // `a`'s slot, another address
    /// assert_eq!(so.deallocate(a, &()), Err(Error::DoubleFree { addr: a.addr() }));
    /// let never = Block::new(0xdead_0000, 1000, a.tag());
    /// assert_eq!(so.deallocate(never, &()), Err(Error::UnknownBlock { addr: 0xdead_0000 }));
    /// so.deallocate(b, &())?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    fn deallocate(&mut self, block: Block, stream: &S) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let index = self.slot_of(&block)?;
        // The stream's list first: its `id` and `clone` are the user's and
        // may panic, and then nothing has changed (a slot retired before
        // them lost its inner block for good).
        let list = self.lists.entry(stream.id()).or_insert_with(|| FreeList::new(stream.clone()));
        let slot = &mut self.slots[index];
        slot.live = false;
        slot.generation += 1;
        let inner = slot.inner;
        // A slot whose generations are used up is never handed out again
        // (never wrapped), so its tags stay double frees.
        if slot.generation != u32::MAX {
            self.vacant.push(index as u32);
        }
        self.live -= 1;
        self.live_bytes -= footprint(&inner);
        self.listed_bytes += footprint(&inner);
        list.push(inner);
        if self.at_drop.is_none() {
            self.at_drop = Some(|inner, block| {
                let _ = inner.deallocate(block, &());
            });
        }
        Ok(())
    }
}

/// Gives every listed block back to the inner algorithm, so that it,
/// dropped next, can give its memory back too: as for a pool, synchronize
/// the streams that used the layer before dropping it. Live blocks stay
/// the inner algorithm's.
impl<A, S: Stream> Drop for StreamOrdered<A, S> {
    fn drop(&mut self) {
        let Some(give_back) = self.at_drop else { return };
        for list in core::mem::take(&mut self.lists).into_values() {
            for (block, _) in list.buckets.into_values().flatten() {
                crate::resource::in_destructor(|| give_back(&mut self.inner, block));
            }
        }
    }
}

// SAFETY: every block handed out starts at an inner block of `A` no shorter
// than the request (fresh from `A`, checked by `inner_allocate`, or from a
// free list, checked by `find`) and is `request.size()` long; an inner block is
// handed out only while no block of it is live (off the lists, or taken off
// them), and goes back to `A` only through `A::deallocate` once freed, taken
// off its list first (`unlist_and_free`; the drop takes the lists whole), so
// that a free of `A`'s that unwinds leaves it listed nowhere.
unsafe impl<E, A: crate::copy::MemoryOf<E>, S: Stream> crate::copy::MemoryOf<E> for StreamOrdered<A, S> {}

impl<A: fmt::Debug, S: Stream> fmt::Debug for StreamOrdered<A, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamOrdered")
            .field("inner", &self.inner)
            .field("streams", &self.lists.len())
            .field("live", &self.live)
            .field("live_bytes", &self.live_bytes)
            .field("listed_bytes", &self.listed_bytes)
            .field("cross", &self.cross)
            .field("stats", &self.stats)
            .finish()
    }
}
