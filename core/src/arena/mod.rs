//! The arena: RMM's `arena_memory_resource`, built to scale with threads.
//!
//! [`ArenaResource`] keeps a global arena of upstream chunks, cut into
//! superblocks of at least 1 MiB that it lends to per-thread arenas (for the
//! default stream, id 0) and per-stream arenas (every other stream). Small
//! requests are rounded up to a [`size_class`] and served by the caller's own
//! arena under that arena's own lock; large ones go straight to the global
//! arena. Threads on different arenas share no lock and write no shared
//! cache line on the common path.

mod check;
mod class;
mod config;
#[cfg(test)]
mod config_tests;
mod dump;
mod global;
mod local;
mod reclaim;
#[cfg(test)]
mod slot_tests;
mod slots;
#[cfg(test)]
mod tests;

pub use class::size_class;
pub use config::{ArenaConfig, DumpTarget};
pub use dump::{ArenaDump, ArenaStats, Owner};

use crate::lock::{RawLock, Shared, SpinLock};
use crate::primitive::{AtomicU64, Ordering};
use crate::resource::{default_constructors, with_config_in};
use crate::{Block, Error, MemoryResource, Request, Result, Stream};
use alloc::boxed::Box;
use core::cell::Cell;
use core::fmt;
use global::{Global, Located};
use local::Local;
use slots::{OwnerKey, SlotKey, EMPTY, STREAM, THREAD};

/// Whether every thread that took a number for the default stream's
/// per-thread arenas has given it back (run its thread-locals'
/// destructors): the loom models wait for it ([`crate::testing::loom::model`]).
#[cfg(all(loom, feature = "std"))]
pub(crate) fn thread_numbers_given_back() -> bool {
    slots::thread_no::all_given_back()
}

/// The most arenas a resource can have: tags name an arena in 8 bits, and
/// the value 255 names the global arena.
pub const MAX_ARENAS: u32 = 255;

/// Tags: `generation << 32 | slot << 24 | node`, so an arena's index may
/// hold up to 2^24 ranges.
const SLOT_SHIFT: u32 = 24;
const SLOT_MASK: u64 = 0xff << SLOT_SHIFT;
const GLOBAL_SLOT: usize = 0xff;

/// What a free with a size above [`Request::MAX_SIZE`] is checked as: a
/// multiple of 256 that no block has (and that rounds without overflow).
const NO_SIZE: u64 = !255;

/// The size a free is checked with: the size itself (a block's index
/// keeps the size it was asked with), or one no block has.
#[inline]
fn free_size(size: u64) -> u64 {
    if size > Request::MAX_SIZE {
        NO_SIZE
    } else {
        size
    }
}

#[inline]
fn pack(slot: usize, index_tag: u64) -> Option<u64> {
    (index_tag & SLOT_MASK == 0).then_some(index_tag | (slot as u64) << SLOT_SHIFT)
}

/// Where a small allocation stands with the idle sweep: its first
/// superblock request counts (and may make a sweep due), later ones in the
/// same call do not, so a call sweeps at most once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sweep {
    NotAsked,
    Due,
    Done,
}

/// Keeps each arena's lock and state on cache lines of its own.
#[derive(Debug)]
#[repr(align(128))]
struct Padded<T>(T);

/// RMM's `arena_memory_resource`: a global arena of superblocks lent to
/// per-thread and per-stream arenas, written to scale with threads.
///
/// ```text
///  upstream ── chunks: initial size, then max(request, chunk_size, held/8)
///     │
///     ▼
///  global arena  [Shared<Global, L>]: one lock, touched rarely
///  ┌──────────────── chunk 0 ─────────────────┐ ┌──── chunk 1 ──────┐
///  │ sb → T1 │ sb → S7 │ LARGE │ free │ sb → T2 │ │ LARGE │   free    │
///  └────┬─────────┬──────────────────────┬─────┘ └───────────────────┘
///       │ superblocks lent and taken back whole (never spanning chunks)
///       ▼         ▼                      ▼
///  arena table: slot keys (read-only once claimed) + padded arenas
///  ┌────────────────────┐ ┌────────────────────┐ ┌────────────────────┐
///  │ thread 1, stream 0 │ │ stream 7           │ │ thread 2, stream 0 │
///  │ lock + index over  │ │ lock + index over  │ │ lock + index over  │
///  │ its superblocks    │ │ its superblocks    │ │ its superblocks    │
///  └────────────────────┘ └────────────────────┘ └────────────────────┘
///  allocate(req, stream):
///    size > large_threshold ──────► global arena (a range of its own)
///    else size_class(size) ──► arena of (stream 0 ? this thread : stream)
///         └ no room: one superblock from the global arena (grows upstream;
///           every idle_after-th request first sweeps idle arenas)
///    none: synchronize, take back every wholly free superblock, retry, else OOM
///  deallocate(block, stream): the tag names the arena ──► that arena, O(1)
/// ```
///
/// - **Arenas.** Stream id 0 is the default stream, one stream for all
///   threads (the legacy default stream, or `()`): each thread gets an
///   arena of its own for it (with `std`; without it, all threads share
///   one), and a thread's number, with its arena, passes to the next new
///   thread when it exits. Every other stream id gets an arena of its own. Arenas live in a
///   fixed table of `max_arenas` slots found by hashing the id: the lookup
///   reads two atomics of a slot that is written only when it changes
///   hands, so it takes no lock; under the arena's lock, the arena's owner
///   is checked before it serves (a lookup racing with a change of hands
///   looks again).
/// - **Slots change hands.** An arena is *idle* when nothing is live in it
///   and it holds no superblock. [`release`](ArenaResource::release) frees
///   the slot of every idle arena (after taking back the superblocks it
///   may, as when running dry). A stream or thread that finds the table
///   full frees the slots of idle arenas; if there are none, it first takes
///   back the wholly free superblocks of the arenas with nothing live (as
///   when running dry), then frees the slots of the arenas that left idle.
///   So any number of streams and threads may use the resource over its
///   life, `max_arenas` with blocks live at once; beyond that the request is
///   [`Error::CapacityExhausted`] (so it is, too, when the caller's stream
///   cannot synchronize the device and every slot is held by an arena of
///   another stream that keeps its free superblocks).
///   Each arena has its own lock and index (the O(1) two-level segregated
///   fit [`CoalescingIndex`](crate::index::CoalescingIndex)) over the
///   superblocks it holds, each a region of its own; the arena's state is
///   padded to its own cache lines, so two threads on two arenas share
///   nothing written on the common path.
/// - **Size classes.** Requests up to `large_threshold` (1 MiB) are rounded
///   up to a [`size_class`] (RMM's jemalloc-style classes) and served by the
///   caller's arena; larger ones get a range of their own from the global
///   arena, as RMM's. So does a request whose size class plus its alignment
///   less 256 bytes exceeds `superblock_size` (no superblock could hold it
///   aligned), however small. A block of the caller's arena occupies its
///   size class (256-byte multiples with `size_classes(false)`); a block of
///   the global arena (a *large* block) its size rounded up to 256 bytes:
///   that is what [`Usage::used`](crate::Usage::used) counts. A valid
///   request that needs a chunk above [`Request::MAX_SIZE`] (a size near it
///   with its alignment's padding) is [`Error::OutOfMemory`].
/// - **Superblocks** are `superblock_size` (8 MiB) unless the global arena
///   is at its maximum and only smaller room is left (never below 1 MiB);
///   a superblock never spans two upstream chunks. A maximum below
///   `superblock_size` is [`Error::InvalidConfig`]: no superblock, so no
///   small request, could ever be served.
/// - **Frees.** A block's tag names the arena it came from, and the block
///   goes back there whatever stream frees it (as RMM, which looks the
///   block up in every arena). When the freeing stream is not the arena's
///   stream, the freeing stream is synchronized first, as in RMM, so that
///   the arena's stream may reuse the block at once. Large blocks may be
///   reused by any stream: their free synchronizes the freeing stream, as
///   RMM's global arena does.
/// - **Sizes of frees.** A free states the size the block was asked with,
///   exactly, as with every resource (an adaptor above counts off the size
///   a free states): any other size, one of the same size class or one
///   that rounds up to the same multiple of 256, 0 and one above
///   [`Request::MAX_SIZE`] included, is [`Error::SizeMismatch`] naming the
///   size asked for as `expected` and the size given, and frees nothing.
///   The size is checked once the block is found: a free of a block
///   already freed is [`Error::DoubleFree`], one of an address that is no
///   block's [`Error::UnknownBlock`], whatever the size. Only the empty
///   block ([`Block::is_empty`]: no address, no bytes) frees with nothing
///   done.
/// - **Running dry.** When an arena cannot get a superblock, or a large
///   request finds no room, the resource takes every wholly free superblock
///   of every arena back to the global arena, then retries once, as RMM's
///   arena. The superblocks go back ordered after every free into them:
///   those of the caller's stream id (all per-thread arenas for the default
///   stream) after the caller's stream is synchronized, those of other
///   streams after the device is ([`Stream::synchronize_device`], as RMM's
///   `cudaDeviceSynchronize`; an arena keeps no stream handle to wait on an
///   event of its stream). A stream that cannot synchronize the device
///   (`Ok(false)`) takes back only its own stream id's. A failed
///   synchronization fails the request with its error and changes nothing.
///   Then the request is [`Error::OutOfMemory`] with the largest free block
///   (its usage's: an arena's free range counts up to the large threshold),
///   the bytes held and the maximum (and a dump of the state if configured).
/// - **Idle arenas.** Every [`idle_after`](ArenaConfig::idle_after)
///   superblock requests (64; requests of every arena count), the arena
///   asking first sweeps: an arena that served no allocation since the
///   previous sweep (between `idle_after` and twice that many requests)
///   gives back its wholly free superblocks, ordered as when running dry,
///   and, left idle, its slot. The arenas of streams that are gone, or
///   unused for long, so give their memory to the others and their slots
///   to new streams: neither waits for the table to fill or the memory to
///   run out. A sweep locks every arena in turn; it synchronizes only when
///   it has something to take back. It is housekeeping: a sweep whose
///   synchronization fails takes nothing back and fails nothing (the
///   request goes on to the global arena), and the next sweep asks again.
/// - **Giving memory back.** Wholly free chunks go back upstream when the
///   global arena needs room under its maximum for a larger chunk, and on
///   [`release`](ArenaResource::release). Dropping the resource gives
///   them back on the stream type's drop stream ([`Stream::at_drop`]; `()`
///   at once), as the pool does: every chunk that holds no live block,
///   the arenas' wholly free superblocks taken back first; a chunk that
///   holds a live block stays with the upstream. Over a stream type with
///   no drop stream every chunk stays: call `release` first.
/// - **Re-entry.** Under a lock that refuses re-entry
///   (`CriticalSectionLock`), an allocate, free or
///   [`release`](ArenaResource::release) called from inside the upstream's
///   call (an upstream that calls back into the arena) is
///   [`Error::Reentrant`]: no block is handed out or freed, as for a
///   [`Shared`] resource.
///
/// # Examples
///
/// ```
/// use memres_core::arena::{ArenaConfig, ArenaResource};
/// use memres_core::{Inspect, MemoryResource, Request};
/// # use memres_core::testing::BumpUpstream;
/// let config = ArenaConfig::new().initial_size(64 << 20);
/// let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &())?;
/// std::thread::scope(|s| {
///     for _ in 0..2 {
///         s.spawn(|| {
///             let small = arena.allocate(Request::new(1000).unwrap(), &()).unwrap();
///             let large = arena.allocate(Request::new(3 << 20).unwrap(), &()).unwrap();
///             arena.deallocate(small, &()).unwrap();
///             arena.deallocate(large, &()).unwrap();
///         });
///     }
/// });
/// arena.check().unwrap();
/// assert_eq!(arena.usage().used, 0);
/// # Ok::<(), memres_core::Error>(())
/// ```
///
/// A free states the size asked for, exactly; dropping the resource gives
/// its chunks back:
///
/// ```
/// use memres_core::arena::ArenaResource;
/// use memres_core::{Block, Error, Inspect, MemoryResource, Request};
/// # use memres_core::testing::BumpUpstream;
/// let up = BumpUpstream::new(1 << 30);
/// let arena = ArenaResource::new(&up);
/// let b = arena.allocate(Request::new(1000)?, &())?; // in the 1024-byte class
/// for given in [1024, 0] {
///     let wrong = Block::new(b.addr(), given, b.tag());
///     assert_eq!(arena.deallocate(wrong, &()), Err(Error::SizeMismatch { addr: b.addr(), expected: 1000, given }));
/// }
/// arena.deallocate(b, &())?;
/// assert!(up.usage().held > 0);
/// drop(arena);
/// assert_eq!(up.usage().held, 0);
/// # Ok::<(), memres_core::Error>(())
/// ```
pub struct ArenaResource<U, L: RawLock = SpinLock> {
    /// The global arena.
    global: Padded<Shared<Global<U>, L>>,
    /// Where each caller's arena is (a hint: each arena's `owner` decides).
    keys: Box<[SlotKey]>,
    /// The arenas; slot `i` serves the owner set when `keys[i]` was claimed.
    arenas: Box<[Padded<Shared<Local, L>>]>,
    config: ArenaConfig,
}

default_constructors! {
    ArenaResource, ArenaConfig, build;
    /// An arena resource over `upstream` with the default configuration
    /// (nothing taken from upstream until the first allocation).
    ///
    /// ```
    /// use memres_core::arena::ArenaResource;
    /// use memres_core::Inspect;
    /// # use memres_core::testing::BumpUpstream;
    /// let arena = ArenaResource::new(BumpUpstream::new(1 << 30));
    /// assert_eq!(arena.usage().held, 0);
    /// ```
    new;
    /// An arena resource over `upstream` with `config`; the initial size,
    /// if any, is taken from upstream now, on `stream`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a configuration that makes no sense (see
    /// [`ArenaConfig`]); the upstream's error if it cannot supply the
    /// initial size.
    ///
    /// ```
    /// use memres_core::arena::{ArenaConfig, ArenaResource};
    /// use memres_core::Inspect;
    /// # use memres_core::testing::BumpUpstream;
    /// let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), ArenaConfig::new().initial_size(32 << 20), &())?;
    /// assert_eq!(arena.usage().held, 32 << 20);
    /// assert!(ArenaResource::with_config(BumpUpstream::new(1 << 30), ArenaConfig::new().superblock_size(4096), &()).is_err());
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    with_config;
}

impl<U, L: RawLock> ArenaResource<U, L> {
    fn build(upstream: U, config: ArenaConfig) -> Self {
        let global = Global::new(upstream, config.maximum_size, config.chunk_size, config.superblock_size);
        let n = config.max_arenas as usize;
        ArenaResource {
            global: Padded(Shared::new_in(global)),
            keys: (0..n).map(|_| SlotKey { state: AtomicU64::new(EMPTY), key: AtomicU64::new(0) }).collect(),
            arenas: (0..n).map(|_| Padded(Shared::new_in(Local::new()))).collect(),
            config,
        }
    }

    /// Takes the initial memory `config` asks for, on `stream`
    /// (`with_config_in`'s last step); on failure it holds none.
    fn take_initial<S: Stream + ?Sized>(&mut self, stream: &S) -> Result<()>
    where
        U: MemoryResource<S>,
    {
        if self.config.initial_size > 0 {
            self.global.0.get_mut().add_chunk(self.config.initial_size, stream)?;
        }
        Ok(())
    }

    /// The configuration.
    ///
    /// ```
    /// # use memres_core::arena::ArenaResource;
    /// # use memres_core::testing::BumpUpstream;
    /// assert_eq!(ArenaResource::new(BumpUpstream::new(1 << 30)).config().maximum(), None);
    /// ```
    pub fn config(&self) -> &ArenaConfig {
        &self.config
    }

    /// Number of arenas in use (per-thread and per-stream).
    ///
    /// ```
    /// # use memres_core::arena::ArenaResource;
    /// # use memres_core::testing::BumpUpstream;
    /// assert_eq!(ArenaResource::new(BumpUpstream::new(1 << 30)).arena_count(), 0);
    /// ```
    pub fn arena_count(&self) -> usize {
        self.claimed().count()
    }

    #[inline]
    fn class_of(&self, size: u64) -> u64 {
        self.config.class_of(size)
    }

    #[inline]
    fn is_large(&self, request: &Request) -> bool {
        request.size() > self.config.large_threshold
            || self.class_of(request.size()) + request.align() - 256 > self.config.superblock_size
    }

    /// A small block from the arena of `me`, with a superblock from the
    /// global arena if it has no room (after the idle sweep, when one is
    /// due). `Ok(None)`: no superblock to be had.
    #[inline]
    fn allocate_small<S: Stream + ?Sized>(
        &self,
        me: OwnerKey,
        request: Request,
        stream: &S,
    ) -> Result<Option<Block>>
    where
        U: MemoryResource<S>,
    {
        let sweep = Cell::new(Sweep::NotAsked);
        loop {
            let slot = match self.find_slot(me) {
                Some(i) => i,
                None => self.claim_slot(me, stream)?,
            };
            // `None`: the slot changed hands since it was looked up.
            match self.allocate_in(slot, me, request, stream, &sweep) {
                Some(Ok(None)) if sweep.get() == Sweep::Due => {
                    sweep.set(Sweep::Done);
                    // Housekeeping: a sweep that cannot synchronize changes
                    // nothing, and the request goes on to the global arena.
                    let _ = self.sweep_idle(stream);
                }
                Some(got) => return got,
                None => {}
            }
        }
    }

    /// [`allocate_small`](Self::allocate_small) in arena `slot`, if it is
    /// still `me`'s (else `None`). A superblock request that makes an idle
    /// sweep due says so in `sweep` and answers `Ok(None)`.
    #[inline]
    fn allocate_in<S: Stream + ?Sized>(
        &self,
        slot: usize,
        me: OwnerKey,
        request: Request,
        stream: &S,
        sweep: &Cell<Sweep>,
    ) -> Option<Result<Option<Block>>>
    where
        U: MemoryResource<S>,
    {
        let class = self.class_of(request.size());
        let align = request.align();
        let pack_or_free = |a: &mut Local, got: crate::index::Allocation| -> Result<Option<Block>> {
            match pack(slot, got.tag) {
                Some(tag) => Ok(Some(Block::new(got.addr, request.size(), tag))),
                None => {
                    let _ = a.free(got.tag, got.addr, request.size());
                    Err(Error::CapacityExhausted { capacity: 1 << SLOT_SHIFT })
                }
            }
        };
        let serve = |a: &mut Local| -> Result<Option<Block>> {
            let got = match a.allocate(request.size(), class, align)? {
                Some(got) => got,
                None => {
                    // Lock order: arena, then global (never the reverse).
                    // Refused where this call comes from inside the
                    // upstream's, under the global lock.
                    let acquired = self.global.0.try_with(|g| {
                        if sweep.get() == Sweep::NotAsked {
                            let due = g.tick(self.config.idle_after);
                            sweep.set(if due { Sweep::Due } else { Sweep::Done });
                            if due {
                                return Ok(None);
                            }
                        }
                        g.acquire(class + align - 256, slot, stream)
                    })?;
                    let range = match acquired {
                        Ok(range) => range,
                        // A failed growth leaves the global arena as it
                        // was: any free range of this arena that holds it,
                        // the growth's error standing where none does.
                        Err(e) => match a.allocate_exhaustive(request.size(), class, align) {
                            Ok(Some(got)) => return pack_or_free(a, got),
                            _ => return Err(e),
                        },
                    };
                    let Some(range) = range else {
                        // No superblock to be had: any free range of this
                        // arena that holds it, past the first ranges of its
                        // class that the search looks at.
                        match a.allocate_exhaustive(request.size(), class, align)? {
                            Some(got) => return pack_or_free(a, got),
                            None => return Ok(None),
                        }
                    };
                    let first = match a.add(range) {
                        Ok(first) => first,
                        Err(e) => {
                            let _ = self.global.0.with(|g| g.give_back(range.start()));
                            return Err(e);
                        }
                    };
                    // From the new superblock itself: one of exactly the
                    // bytes needed sits in a class below the one searched.
                    match a.allocate_in(first, request.size(), class, align)? {
                        Some(got) => got,
                        None => return Ok(None),
                    }
                }
            };
            pack_or_free(a, got)
        };
        match self.arenas[slot].0.try_with(|a| (a.owner() == me).then(|| serve(a))) {
            Ok(served) => served,
            // Held by the call this one comes from (through the upstream).
            Err(e) => Some(Err(e)),
        }
    }

    /// A large block from the global arena. `Ok(None)`: no room.
    fn allocate_large<S: Stream + ?Sized>(&self, request: Request, stream: &S) -> Result<Option<Block>>
    where
        U: MemoryResource<S>,
    {
        self.global.0.try_with(|g| {
            let Some(got) = g.allocate_large(request.size(), request.align(), stream)? else {
                return Ok(None);
            };
            match pack(GLOBAL_SLOT, got.tag) {
                Some(tag) => Ok(Some(Block::new(got.addr, request.size(), tag))),
                None => {
                    let _ = g.free_large(got.tag, got.addr, request.size());
                    Err(Error::CapacityExhausted { capacity: 1 << SLOT_SHIFT })
                }
            }
        })?
    }

    /// Runs `f` with the upstream resource (under the global arena's lock).
    ///
    /// ```
    /// # use memres_core::Inspect;
    /// # use memres_core::arena::ArenaResource;
    /// # use memres_core::testing::BumpUpstream;
    /// let arena = ArenaResource::new(BumpUpstream::new(1 << 30));
    /// assert_eq!(arena.upstream_with(|u| u.usage().held), 0);
    /// ```
    pub fn upstream_with<T>(&self, f: impl FnOnce(&U) -> T) -> T {
        self.global.0.with(|g| f(g.upstream()))
    }

    /// Frees a block found by its address: blocks with no tag, and those
    /// whose tag did not name a live block (`tag` is then `Some`).
    #[cold]
    fn deallocate_by_address<S: Stream + ?Sized>(
        &self,
        block: Block,
        stream: &S,
        tag: Option<u64>,
    ) -> Result<()> {
        let addr = block.addr();
        match self.global.0.try_with(|g| g.locate(addr))? {
            Located::Super { owner, start } => {
                if self.stream_of(owner) != stream.id() {
                    stream.synchronize()?;
                }
                let size = free_size(block.size());
                let freed = self.arenas[owner].0.try_with(|a| a.free_at(start, addr, size, tag));
                freed.and_then(|r| r).map_err(|e| given(e, block))
            }
            Located::Large { .. } if tag.is_some() => Err(Error::DoubleFree { addr }),
            Located::Large { tag } => {
                stream.synchronize()?;
                self.global
                    .0
                    .try_with(|g| g.free_large(tag, addr, free_size(block.size())))
                    .and_then(|r| r)
                    .map_err(|e| given(e, block))
            }
            Located::Free => Err(Error::DoubleFree { addr }),
            Located::Unknown => Err(Error::UnknownBlock { addr }),
        }
    }
}

with_config_in! {
    impl[U, L: RawLock] ArenaResource<U, L>, ArenaConfig, build;
    /// [`with_config`](ArenaResource::with_config) with a lock of type `L`
    /// for the global arena and every arena (`StdLock` to sleep rather than
    /// spin under contention).
    ///
    /// # Errors
    ///
    /// As [`with_config`](ArenaResource::with_config).
    ///
    /// ```
    /// use memres_core::arena::{ArenaConfig, ArenaResource};
    /// use memres_core::lock::SpinLock;
    /// # use memres_core::testing::BumpUpstream;
    /// let arena: ArenaResource<_, SpinLock> =
    ///     ArenaResource::with_config_in(BumpUpstream::new(1 << 30), ArenaConfig::new(), &())?;
    /// # let _ = arena;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
}

/// A size mismatch reported with the size the caller gave, not its class.
fn given(e: Error, block: Block) -> Error {
    match e {
        Error::SizeMismatch { addr, expected, .. } => {
            Error::SizeMismatch { addr, expected, given: block.size() }
        }
        e => e,
    }
}

impl<S, U, L> MemoryResource<S> for ArenaResource<U, L>
where
    S: Stream + ?Sized,
    U: MemoryResource<S>,
    L: RawLock,
{
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        let large = self.is_large(&request);
        let attempt = || {
            if large {
                self.allocate_large(request, stream)
            } else {
                self.allocate_small(OwnerKey::of_caller(stream.id()), request, stream)
            }
        };
        if let Some(b) = attempt()? {
            return Ok(b);
        }
        if self.reclaim(stream, |_, _| true)? > 0 {
            if let Some(b) = attempt()? {
                return Ok(b);
            }
        }
        Err(self.out_of_memory(request.size()))
    }

    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let addr = block.addr();
        let tag = block.tag();
        if tag == Block::NO_TAG {
            return self.deallocate_by_address(block, stream, None);
        }
        let slot = ((tag & SLOT_MASK) >> SLOT_SHIFT) as usize;
        let inner = tag & !SLOT_MASK;
        let freed = if slot == GLOBAL_SLOT {
            stream.synchronize()?;
            self.global.0.try_with(|g| g.free_large(inner, addr, free_size(block.size()))).and_then(|r| r)
        } else if slot < self.arenas.len()
            && matches!(self.keys[slot].state.load(Ordering::Acquire), STREAM | THREAD)
        {
            if self.stream_of(slot) != stream.id() {
                stream.synchronize()?;
            }
            self.arenas[slot].0.try_with(|a| a.free(inner, addr, free_size(block.size()))).and_then(|r| r)
        } else {
            Err(Error::UnknownBlock { addr })
        };
        match freed {
            Err(Error::UnknownBlock { .. }) => self.deallocate_by_address(block, stream, Some(tag)),
            r => r.map_err(|e| given(e, block)),
        }
    }
}

// SAFETY: the arena hands out only ranges that its global index or a local
// arena's index allocated, at least `request.size()` long, inside superblocks
// lent from the global arena's chunks; each chunk range is the first bytes of
// a block of `U` no shorter than it (`upstream_range` refuses a shorter one),
// held until the chunk is wholly free and then freed only through
// `U::deallocate`. The indexes keep live ranges disjoint, and all metadata
// lives outside the managed memory.
unsafe impl<E, U: crate::copy::MemoryOf<E>, L: RawLock> crate::copy::MemoryOf<E> for ArenaResource<U, L> {}

impl<U, L: RawLock> fmt::Debug for ArenaResource<U, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // From inside a call on the arena (its upstream's), as `Shared`'s.
        let Ok(held) = self.global.0.try_with(|g| g.held()) else {
            return f.write_str("ArenaResource { <in use by the caller> }");
        };
        f.debug_struct("ArenaResource")
            .field("held", &held)
            .field("arenas", &self.arena_count())
            .field("config", &self.config)
            .finish()
    }
}
