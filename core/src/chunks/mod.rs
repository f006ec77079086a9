//! Chunks taken from an upstream: the table that the pool, the fixed-size
//! resource and the arena's global arena keep of the blocks their upstream
//! lent them, and the policy that sizes new ones.
//!
//! The table keeps the chunks sorted by address (to find the chunk of an
//! address by binary search), counts the bytes held and their peak, checks
//! its metadata capacity before it asks the upstream for anything (so a
//! full table never strands an upstream block), gives back a chunk it
//! could not record, gives wholly free chunks back upstream, and grows by a
//! [`Growth`] policy, halving the size asked while the upstream is out of
//! memory. What the chunks are cut into (a [`CoalescingIndex`], the
//! fixed-size resource's slots) is the resource's, seen through a crate-private `Carve` trait.

#[cfg(all(test, feature = "alloc"))]
mod drop_tests;
mod growth;
#[cfg(all(test, feature = "alloc"))]
mod upstream_tests;

pub use growth::Growth;

use crate::check::Violation;
use crate::index::{CoalescingIndex, Node};
use crate::storage::{DefaultStorage, Storage};
use crate::{Block, Error, MemoryResource, Range, Request, Result, Stream};

/// One chunk taken from upstream. Public only so that the chunk storage of
/// a resource can be named; its fields are private.
///
/// # Examples
///
/// ```
/// use memres_core::chunks::Chunk;
/// use memres_core::storage::{ArrayStorage, Storage};
/// let table: ArrayStorage<Chunk, 8> = Default::default();
/// assert_eq!(table.max_len(), 8);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chunk {
    /// The addresses of the chunk: the first bytes of `block`.
    range: Range,
    /// The block the upstream handed out, to give back.
    block: Block,
    /// What the resource carving the chunk names it by (the index node at
    /// its lowest address, or its first slot): it never changes.
    first: u32,
}

impl Chunk {
    /// The chunk's addresses.
    pub fn range(&self) -> Range {
        self.range
    }

    /// The handle the carving resource gave the chunk.
    pub(crate) fn first(&self) -> u32 {
        self.first
    }

    /// The same chunk under another handle (a resource with several
    /// carvers names each chunk's carver in its handle).
    pub(crate) fn with_first(&self, first: u32) -> Chunk {
        Chunk { first, ..*self }
    }
}

/// When a growing table gives its wholly free chunks back upstream first,
/// so that one new chunk replaces them rather than adding to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GiveBack {
    /// Never (RMM's pool).
    Never,
    /// Only when the maximum leaves no room for the request (the arena).
    #[cfg_attr(not(feature = "alloc"), allow(dead_code))] // the arena needs `alloc`
    AtMaximum,
    /// Wholly free chunks, largest first, while the table would hold more
    /// than this many bytes with the new chunk (the pool's: its peak in use;
    /// 0 gives them all back).
    Above(u64),
}

/// The most classes of blocks a resource carves its chunks for (a pool's:
/// blocks below its large threshold, and large ones).
const CLASSES: usize = 2;

/// What giving free chunks back did: the bytes that went back, by the class
/// their chunks were carved for, and the upstream's first refusal (the
/// chunks it refused stay).
#[derive(Clone, Copy, Debug, Default)]
struct GaveBack {
    bytes: [u64; CLASSES],
    refused: Option<Error>,
}

impl GaveBack {
    /// The bytes given back, of every class.
    fn total(&self) -> u64 {
        self.bytes.iter().sum()
    }

    /// The bytes given back, or the refusal.
    fn result(self) -> Result<u64> {
        self.refused.map_or(Ok(self.total()), Err)
    }
}

/// What a resource cuts its chunks into, as the chunk table needs to see it.
pub(crate) trait Carve {
    /// Makes sure that a chunk can be attached and a block carved from it
    /// without running out of metadata: asked before the upstream is.
    fn reserve(&mut self) -> Result<()>;
    /// Starts carving `range`, a new chunk; returns the chunk's handle.
    /// Changes nothing on error.
    fn attach(&mut self, range: Range) -> Result<u32>;
    /// Whether no block of the chunk is live.
    fn is_free(&self, chunk: &Chunk) -> bool;
    /// Stops carving a wholly free chunk (`is_free` said so).
    fn detach(&mut self, chunk: &Chunk);
    /// Whether the chunk is covered exactly by what is carved of it.
    fn covers(&self, chunk: &Chunk) -> bool;
    /// The class of blocks `chunk` is carved for, below [`CLASSES`] (0 for
    /// a resource of one class).
    fn class_of(&self, chunk: &Chunk) -> usize {
        let _ = chunk;
        0
    }
    /// The class the chunks attached next are carved for.
    fn attach_class(&self) -> usize {
        0
    }
    /// Makes the chunks attached next carved for `class` (as
    /// [`class_of`](Self::class_of) numbers it).
    fn set_attach_class(&mut self, class: usize) {
        let _ = class;
    }
}

impl<N: Storage<Node>> Carve for CoalescingIndex<N> {
    fn reserve(&mut self) -> Result<()> {
        // The chunk's range, and the split of a block out of it.
        CoalescingIndex::reserve(self, 3)
    }
    fn attach(&mut self, range: Range) -> Result<u32> {
        self.add_range(range)
    }
    fn is_free(&self, chunk: &Chunk) -> bool {
        self.is_region_free(chunk.first)
    }
    fn detach(&mut self, chunk: &Chunk) {
        let removed = self.remove_range(chunk.first);
        debug_assert!(removed.is_ok(), "detached a chunk that is not wholly free");
    }
    fn covers(&self, chunk: &Chunk) -> bool {
        let mut cursor = chunk.range.start();
        self.for_each_in_region(chunk.first, |r, _| {
            cursor = if r.start() == cursor { r.end() } else { u64::MAX };
        });
        cursor == chunk.range.end()
    }
}

/// Chunks held from an upstream, sorted by address, with the bytes they
/// hold, their peak and the maximum.
#[derive(Debug)]
pub(crate) struct ChunkTable<U, C: Storage<Chunk> = DefaultStorage<Chunk>> {
    upstream: U,
    /// Sorted by address, never overlapping.
    chunks: C,
    /// Sum of the chunks' lengths: bytes held from upstream.
    held: u64,
    /// Highest `held` ever.
    peak_held: u64,
    /// The most bytes ever held.
    maximum: Option<u64>,
    /// Length of the shortest chunk (`u64::MAX` with none).
    shortest: u64,
    /// How a chunk goes back upstream when the resource is dropped: set by
    /// the first chunk taken on a stream type with a [`Stream::at_drop`]
    /// stream (a `fn` of the stream type, which the table does not name).
    at_drop: Option<fn(&U, Block)>,
}

/// Gives `block` back to `upstream` on the stream type's drop stream.
pub(crate) fn give_back_at_drop<S: Stream + ?Sized, U: MemoryResource<S>>(upstream: &U, block: Block) {
    // Dropping: an error of the upstream cannot be reported any more, and
    // a panic while unwinding leaves the chunk to the upstream.
    // Once, whatever the stream type does with the closure: `at_drop` is
    // a safe trait's, and a second call would free the chunk twice.
    let mut once = Some(block);
    crate::resource::in_destructor(|| {
        S::at_drop(&mut |stream| {
            if let Some(block) = once.take() {
                let _ = upstream.deallocate(block, stream);
            }
        });
    });
}

/// The chunks [`ChunkTable::give_back_on_drop`] has yet to visit. Its own
/// drop visits the rest: a free that panics leaves the loop, not the chunks
/// after it.
struct DropRest<'t, U, C: Storage<Chunk>, F: Fn(&Chunk) -> bool> {
    table: &'t mut ChunkTable<U, C>,
    free: F,
    give_back: fn(&U, Block),
    /// The table index of the next chunk to visit.
    next: usize,
}

impl<U, C: Storage<Chunk>, F: Fn(&Chunk) -> bool> DropRest<'_, U, C, F> {
    fn give_back(&mut self) {
        while self.next < self.table.chunks.len() {
            if (self.free)(&self.table.chunks[self.next]) {
                // Out of the table first: a chunk whose free panics is
                // not visited again.
                let chunk = self.table.remove(self.next);
                (self.give_back)(&self.table.upstream, chunk.block);
            } else {
                self.next += 1;
            }
        }
    }
}

impl<U, C: Storage<Chunk>, F: Fn(&Chunk) -> bool> Drop for DropRest<'_, U, C, F> {
    fn drop(&mut self) {
        // Chunks are left only when a free panicked: this runs while that
        // panic unwinds, and `give_back_at_drop` catches further panics.
        // Without `std` none could be caught (a second one would abort):
        // the rest stays with the upstream.
        #[cfg(feature = "std")]
        self.give_back();
    }
}

impl<U, C: Storage<Chunk>> ChunkTable<U, C> {
    pub(crate) fn new(upstream: U, maximum: Option<u64>) -> Self {
        ChunkTable {
            upstream,
            chunks: C::default(),
            held: 0,
            peak_held: 0,
            maximum,
            shortest: u64::MAX,
            at_drop: None,
        }
    }

    pub(crate) fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Bytes held from upstream.
    #[inline]
    pub(crate) fn held(&self) -> u64 {
        self.held
    }

    /// The most bytes ever held at once.
    pub(crate) fn peak_held(&self) -> u64 {
        self.peak_held
    }

    #[cfg(feature = "alloc")]
    pub(crate) fn maximum(&self) -> Option<u64> {
        self.maximum
    }

    /// Bytes left under the maximum (`None`: no maximum).
    pub(crate) fn room(&self) -> Option<u64> {
        self.maximum.map(|m| m - self.held)
    }

    /// Whether `bytes` more would take the table past its maximum.
    fn no_room_for(&self, bytes: u64) -> bool {
        self.room().is_some_and(|room| bytes > room)
    }

    pub(crate) fn len(&self) -> usize {
        self.chunks.len()
    }

    /// The chunks, by address.
    pub(crate) fn iter(&self) -> core::slice::Iter<'_, Chunk> {
        self.chunks.iter()
    }

    /// Length of the shortest chunk (`u64::MAX` with none): a free range
    /// shorter than this is no whole chunk, with no search.
    #[inline]
    pub(crate) fn shortest(&self) -> u64 {
        self.shortest
    }

    /// The chunk holding `addr`, by binary search.
    #[inline]
    pub(crate) fn chunk_of(&self, addr: u64) -> Option<&Chunk> {
        let i = self.chunks.partition_point(|c| c.range.start() <= addr);
        let c = self.chunks.get(i.checked_sub(1)?)?;
        c.range.contains(addr).then_some(c)
    }

    /// [`Error::CapacityExhausted`] if the table is full.
    pub(crate) fn has_room(&self) -> Result<()> {
        if self.chunks.len() as u64 >= self.chunks.max_len() as u64 {
            return Err(Error::CapacityExhausted { capacity: self.chunks.max_len() });
        }
        Ok(())
    }

    /// Takes a chunk of `request` from upstream, whose addresses `shape`
    /// picks out of the upstream's block (or refuses), and attaches it to
    /// `carve`; returns its handle. On error nothing is held: a block the
    /// table could not record goes back upstream. A block whose addresses
    /// are not aligned as `request` asks, or overlap a chunk held, is
    /// [`Error::UpstreamMisbehaved`].
    pub(crate) fn take<S: Stream + ?Sized>(
        &mut self,
        request: Request,
        stream: &S,
        carve: &mut impl Carve,
        shape: impl FnOnce(&Block) -> Result<Range>,
    ) -> Result<u32>
    where
        U: MemoryResource<S>,
    {
        // Room for the chunk record first, so that a full table never
        // strands an upstream block.
        self.has_room()?;
        self.learn_drop::<S>();
        let block = self.upstream.allocate(request, stream)?;
        let added = shape(&block)
            .and_then(|range| match range.start() % request.align() {
                0 => Ok(range),
                _ => Err(block.misbehaved("not aligned as asked")),
            })
            .and_then(|range| self.insert(range, block, carve));
        if added.is_err() {
            // Upstream misbehaved or our metadata is full: give it back.
            let _ = self.upstream.deallocate(block, stream);
        }
        added
    }

    /// Learns from the stream type `S` of a call how chunks go back upstream
    /// when the resource is dropped.
    pub(crate) fn learn_drop<S: Stream + ?Sized>(&mut self)
    where
        U: MemoryResource<S>,
    {
        if self.at_drop.is_none() && S::at_drop(&mut |_| {}) {
            self.at_drop = Some(give_back_at_drop::<S, U>);
        }
    }

    /// For the resource's `Drop`: gives every chunk that `free` says holds
    /// no live block back upstream, on the drop stream learnt from the
    /// calls (none learnt: nothing goes back). A chunk that still holds a
    /// live block stays held: never freed under a block someone may use.
    ///
    /// A free that panics (not while unwinding) loses only its own chunk:
    /// the chunks after it still go back, and the panic goes on once they
    /// did.
    pub(crate) fn give_back_on_drop(&mut self, free: impl Fn(&Chunk) -> bool) {
        let Some(give_back) = self.at_drop else { return };
        DropRest { table: self, free, give_back, next: 0 }.give_back();
    }

    /// Records `range`, upstream's `block`, as a chunk attached to `carve`;
    /// returns its handle. Changes nothing on error.
    pub(crate) fn insert(&mut self, range: Range, block: Block, carve: &mut impl Carve) -> Result<u32> {
        self.has_room()?;
        // An upstream outside the contract may hand out memory it lent
        // already: carved twice, it would be handed out twice.
        let at = self.chunks.partition_point(|c| c.range.start() < range.start());
        let after = self.chunks.get(at).is_some_and(|c| c.range.start() < range.end());
        let before = at > 0 && self.chunks[at - 1].range.end() > range.start();
        if before || after {
            return Err(block.misbehaved("overlapping memory a chunk already holds"));
        }
        let first = carve.attach(range)?;
        let chunk = Chunk { range, block, first };
        if self.chunks.try_push(chunk).is_err() {
            carve.detach(&chunk);
            return Err(Error::CapacityExhausted { capacity: self.chunks.max_len() });
        }
        // Keep the table sorted by address for lookups by address.
        let mut i = self.chunks.len() - 1;
        while i > 0 && self.chunks[i - 1].range.start() > range.start() {
            self.chunks.swap(i - 1, i);
            i -= 1;
        }
        self.held += range.len();
        self.peak_held = self.peak_held.max(self.held);
        self.shortest = self.shortest.min(range.len());
        Ok(first)
    }

    /// Takes the chunk at table index `i` out of the table (which stays
    /// sorted); it is no longer counted.
    fn remove(&mut self, i: usize) -> Chunk {
        let chunk = self.chunks[i];
        for j in i..self.chunks.len() - 1 {
            self.chunks.swap(j, j + 1);
        }
        self.chunks.pop();
        self.held -= chunk.range.len();
        if chunk.range.len() == self.shortest {
            self.shortest = self.chunks.iter().map(|c| c.range.len()).min().unwrap_or(u64::MAX);
        }
        chunk
    }

    /// The table index of the shortest wholly free chunk that `wanted`
    /// (given its class, as [`Carve::class_of`] numbers it, and its length)
    /// accepts.
    fn free_chunk_index(&self, carve: &impl Carve, wanted: impl Fn(usize, u64) -> bool) -> Option<usize> {
        (0..self.chunks.len())
            .filter(|&i| {
                let c = &self.chunks[i];
                wanted(carve.class_of(c), c.range.len()) && carve.is_free(c)
            })
            .min_by_key(|&i| self.chunks[i].range.len())
    }

    /// The length of the shortest wholly free chunk that `wanted` accepts,
    /// if any. O(chunks).
    pub(crate) fn shortest_free(
        &self,
        carve: &impl Carve,
        wanted: impl Fn(usize, u64) -> bool,
    ) -> Option<u64> {
        self.free_chunk_index(carve, wanted).map(|i| self.chunks[i].range.len())
    }

    /// Detaches the shortest wholly free chunk that `wanted` accepts and
    /// takes it out of the table, still held from upstream (with the
    /// handle it had): for another table over the same upstream to
    /// [`insert`](Self::insert). O(chunks).
    #[cfg(feature = "alloc")]
    pub(crate) fn take_free(
        &mut self,
        carve: &mut impl Carve,
        wanted: impl Fn(usize, u64) -> bool,
    ) -> Option<(Range, Block, u32)> {
        let i = self.free_chunk_index(carve, wanted)?;
        carve.detach(&self.chunks[i]);
        let chunk = self.remove(i);
        Some((chunk.range, chunk.block, chunk.first))
    }

    /// Gives every wholly free chunk back to upstream, detached from
    /// `carve`; returns the bytes given back.
    ///
    /// # Errors
    ///
    /// The upstream's first error if it refuses a chunk; the chunks it
    /// refused stay, the others go back all the same.
    pub(crate) fn release<S: Stream + ?Sized>(&mut self, stream: &S, carve: &mut impl Carve) -> Result<u64>
    where
        U: MemoryResource<S>,
    {
        self.give_back_free(stream, carve).result()
    }

    /// [`release`](Self::release), counting what went back even where the
    /// upstream refused a chunk.
    fn give_back_free<S: Stream + ?Sized>(&mut self, stream: &S, carve: &mut impl Carve) -> GaveBack
    where
        U: MemoryResource<S>,
    {
        let mut gave = GaveBack::default();
        let mut i = 0;
        while i < self.chunks.len() {
            if !carve.is_free(&self.chunks[i]) {
                i += 1;
                continue;
            }
            if let Err(e) = self.give_back_chunk(i, stream, carve, &mut gave) {
                gave.refused.get_or_insert(e);
                i += 1;
            }
        }
        gave
    }

    /// Gives the wholly free chunk at table index `i` back upstream,
    /// counted in `gave`. It leaves the table and `carve` first: the
    /// upstream's free is the user's code (or `Logging`'s, which frees
    /// before its writer's panic goes on), which may take the chunk and then
    /// panic, and a chunk still here would then be carved again while the
    /// upstream hands it out (lost at worst, never handed out twice). A
    /// chunk the upstream refuses comes back in, at index `i` again.
    ///
    /// # Errors
    ///
    /// The upstream's refusal.
    fn give_back_chunk<S: Stream + ?Sized>(
        &mut self,
        i: usize,
        stream: &S,
        carve: &mut impl Carve,
        gave: &mut GaveBack,
    ) -> Result<()>
    where
        U: MemoryResource<S>,
    {
        let chunk = self.chunks[i];
        let class = carve.class_of(&chunk);
        carve.detach(&chunk);
        self.remove(i);
        let Err(e) = self.upstream.deallocate(chunk.block, stream) else {
            gave.bytes[class] += chunk.range.len();
            return Ok(());
        };
        // Into the slots it just left, of its own class.
        let growing = carve.attach_class();
        carve.set_attach_class(class);
        let back = self.insert(chunk.range, chunk.block, carve);
        carve.set_attach_class(growing);
        debug_assert!(back.is_ok(), "a chunk refused back did not fit where it was: {back:?}");
        Err(e)
    }

    /// Gives wholly free chunks back upstream, largest first, until at most
    /// `bound` bytes are held or none is left. A chunk the upstream refuses
    /// stays, and the next largest go back in its place. O(chunks) per
    /// chunk given back or refused.
    fn give_back_above<S: Stream + ?Sized>(
        &mut self,
        bound: u64,
        stream: &S,
        carve: &mut impl Carve,
    ) -> GaveBack
    where
        U: MemoryResource<S>,
    {
        if bound == 0 {
            // All of them, in one pass.
            return self.give_back_free(stream, carve);
        }
        let mut gave = GaveBack::default();
        // Chunks are tried in falling (length, start): every chunk at or
        // above the last one refused has been tried already.
        let key = |c: &Chunk| (c.range.len(), c.range.start());
        let mut below = (u64::MAX, u64::MAX);
        while self.held > bound {
            let largest = (0..self.chunks.len())
                .filter(|&i| key(&self.chunks[i]) < below && carve.is_free(&self.chunks[i]))
                .max_by_key(|&i| key(&self.chunks[i]));
            let Some(i) = largest else { break };
            let refused = key(&self.chunks[i]);
            if let Err(e) = self.give_back_chunk(i, stream, carve, &mut gave) {
                gave.refused.get_or_insert(e);
                below = refused;
            }
        }
        gave
    }

    /// Takes a chunk that holds `need` bytes (rounded up to 256): the size
    /// `growth` picks under the maximum, halved towards `need` while the
    /// upstream is out of memory, after giving wholly free chunks back as
    /// `give_back` says (taken again if the growth fails: see
    /// [`take_back`](Self::take_back)). Returns the new chunk's handle:
    /// callers carve their block from it, since a chunk of exactly `need`
    /// bytes may sit in a size class below the one the index searches for
    /// `need`.
    ///
    /// `Ok(None)`: the maximum or the upstream leaves no room, or `need`
    /// is more than any request may ask.
    ///
    /// # Errors
    ///
    /// The upstream's error if it refuses a chunk given back and then has
    /// no room for the new one (with room, the chunk stays and the growth
    /// succeeds); any other error of the upstream, or of `carve` running
    /// out of metadata.
    #[cold]
    pub(crate) fn grow<S: Stream + ?Sized>(
        &mut self,
        need: u64,
        growth: Growth,
        give_back: GiveBack,
        stream: &S,
        carve: &mut impl Carve,
    ) -> Result<Option<u32>>
    where
        U: MemoryResource<S>,
    {
        let need = (need + 255) & !255;
        if need > Request::MAX_SIZE {
            // No upstream can be asked for such a chunk: out of memory, not
            // an invalid request (the request itself is valid).
            return Ok(None);
        }
        // Giving back only makes room: a chunk the upstream refuses stays,
        // and the growth goes on without the room it would have made.
        let gave_back = match give_back {
            GiveBack::Above(bound) => {
                let size = growth.chunk_size(need, self.held, self.room());
                self.give_back_above(bound.saturating_sub(size), stream, carve)
            }
            GiveBack::AtMaximum if self.no_room_for(need) => self.give_back_free(stream, carve),
            GiveBack::AtMaximum | GiveBack::Never => GaveBack::default(),
        };
        let grown = self.take_growth(need, growth, stream, carve, gave_back.refused);
        if !matches!(grown, Ok(Some(_))) {
            self.take_back(gave_back, stream, carve);
        }
        grown
    }

    /// Takes again what a failed growth gave back, as one chunk of its
    /// bytes per class, each carved for the class its chunks were: a failed
    /// growth leaves the pool holding what it held (a request no upstream
    /// could serve emptied a pool of its free chunks; later, their bytes
    /// came back in the failing request's class, where the other class's
    /// requests could not use them), as far as the upstream allows: also
    /// where it refused some of them.
    fn take_back<S: Stream + ?Sized>(&mut self, gave_back: GaveBack, stream: &S, carve: &mut impl Carve)
    where
        U: MemoryResource<S>,
    {
        let growing = carve.attach_class();
        for (class, bytes) in gave_back.bytes.into_iter().enumerate() {
            carve.set_attach_class(class);
            if bytes > 0 && carve.reserve().is_ok() {
                let _ = Request::new(bytes)
                    .and_then(|r| self.take(r, stream, carve, |b| b.upstream_range(bytes)));
            }
        }
        carve.set_attach_class(growing);
    }

    /// [`grow`](Self::grow) once the chunks to give back went back, but
    /// for those the upstream `refused`.
    fn take_growth<S: Stream + ?Sized>(
        &mut self,
        need: u64,
        growth: Growth,
        stream: &S,
        carve: &mut impl Carve,
        refused: Option<Error>,
    ) -> Result<Option<u32>>
    where
        U: MemoryResource<S>,
    {
        // Out of memory after a refusal: the refusal is the cause to report.
        let out_of_memory = || refused.map_or(Ok(None), Err);
        if self.no_room_for(need) {
            return out_of_memory();
        }
        // Slots for the chunk and the block carved from it, before taking
        // anything from upstream: a failed call changes nothing.
        carve.reserve()?;
        let mut size = growth.chunk_size(need, self.held, self.room());
        loop {
            match self.take(Request::new(size)?, stream, carve, |b| b.upstream_range(size)) {
                Ok(first) => return Ok(Some(first)),
                Err(e) if e.is_out_of_memory() && size > need => size = ((size / 2).max(need) + 255) & !255,
                Err(e) if e.is_out_of_memory() => return out_of_memory(),
                Err(e) => return Err(e),
            }
        }
    }

    /// Checks the table: chunks sorted and disjoint, each covered exactly
    /// by what `carve` cut of it, their lengths adding up to the bytes held,
    /// the shortest length current, and no more held than the maximum.
    pub(crate) fn check(&self, carve: &impl Carve) -> core::result::Result<(), Violation> {
        let mut total = 0u64;
        let mut last_end = 0u64;
        for c in self.chunks.iter() {
            if c.range.start() < last_end {
                return Err(Violation::new("chunks overlap or are not sorted"));
            }
            last_end = c.range.end();
            if !carve.covers(c) {
                return Err(Violation::new("chunk not covered exactly by what is carved of it"));
            }
            total += c.range.len();
        }
        if total != self.held {
            return Err(Violation::new("chunk lengths do not add up to the bytes held"));
        }
        if self.chunks.iter().map(|c| c.range.len()).min().unwrap_or(u64::MAX) != self.shortest {
            return Err(Violation::new("shortest chunk length is stale"));
        }
        if self.maximum.is_some_and(|m| self.held > m) {
            return Err(Violation::new("holds more than its maximum"));
        }
        Ok(())
    }
}
