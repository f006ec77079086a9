//! The arena: RMM's `arena_memory_resource`, built to scale with threads.
//!
//! [`ArenaResource`] keeps a global arena of upstream chunks, cut into
//! superblocks of at least 1 MiB that it lends to per-thread arenas (for the
//! default stream, id 0) and per-stream arenas (every other stream). Small
//! requests are rounded up to a [`size_class`] and served by the caller's own
//! arena under that arena's own lock; large ones go straight to the global
//! arena. Threads on different arenas share no lock and write no shared
//! cache line on the common path.

mod class;
mod global;
mod local;
#[cfg(test)]
mod tests;

pub use class::size_class;

use crate::check::Violation;
use crate::lock::{RawLock, Shared, SpinLock};
use crate::primitive::{spin_loop, AtomicU64, Ordering};
use crate::{Block, Error, MemoryResource, Range, Request, Result, Stream};
use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt;
use global::{Global, Located, MIN_SUPERBLOCK};
use local::Local;

/// The most arenas a resource can have: tags name an arena in 8 bits, and
/// the value 255 names the global arena.
pub const MAX_ARENAS: u32 = 255;

/// Where the state dump goes when an allocation runs out of memory.
///
/// # Examples
///
/// ```
/// use memres_core::arena::{ArenaConfig, ArenaDump, DumpTarget};
/// fn log(dump: &ArenaDump) {
///     let _ = dump.arenas.len();
/// }
/// let config = ArenaConfig::new().dump_on_failure(DumpTarget::Callback(log));
/// # let _ = config;
/// ```
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub enum DumpTarget {
    /// No dump (the default).
    #[default]
    None,
    /// Call this function with the dump (works without `std`; the dump
    /// implements `Display`).
    Callback(fn(&ArenaDump)),
    /// Write the dump to standard error.
    #[cfg(feature = "std")]
    Stderr,
}

/// Sizes and policies of an [`ArenaResource`].
///
/// | setting | default | why |
/// | --- | --- | --- |
/// | `initial_size` | 0 | RMM takes half the device's free memory up front; only the backend knows that figure, so the caller passes it here |
/// | `maximum_size` | none | the most bytes ever held from upstream |
/// | `chunk_size` | 32 MiB | the global arena grows by `max(request, chunk_size, held / 8)` (in whole superblocks): few chunks, yet the unused tail of the newest one stays under 1/8 of what is held; superblocks never span two chunks |
/// | `superblock_size` | 8 MiB | at least 8 blocks of the 1 MiB threshold per superblock: the tail left when a superblock fills is at most 1/8 of it, and an arena goes to the global arena once per 8 MiB of growth, not once per block (RMM's 1 MiB superblocks hold a single 1 MiB block) |
/// | `large_threshold` | 1 MiB | RMM's: larger requests are served by the global arena directly (so is one whose size class plus its alignment less 256 bytes exceeds the superblock size) |
/// | `max_arenas` | 64 | slots of the arena table (per-thread plus per-stream arenas in use at once), at most [`MAX_ARENAS`]; each slot costs about 8 KiB of metadata up front; an idle arena gives its slot to a new stream or thread (see *Arenas* in [`ArenaResource`]); a stream that finds none gets [`Error::CapacityExhausted`] (sharing an arena between two streams would break stream order) |
/// | `size_classes` | on | small requests rounded up to [`size_class`] |
///
/// # Examples
///
/// ```
/// use memres_core::arena::ArenaConfig;
/// let c = ArenaConfig::new().initial_size(1 << 30).maximum_size(4 << 30).superblock_size(4 << 20);
/// assert_eq!(c.maximum(), Some(4 << 30));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ArenaConfig {
    initial_size: u64,
    maximum_size: Option<u64>,
    chunk_size: u64,
    superblock_size: u64,
    large_threshold: u64,
    max_arenas: u32,
    size_classes: bool,
    dump_on_failure: DumpTarget,
    synchronize_all: Option<fn() -> Result<()>>,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl ArenaConfig {
    /// The defaults of the table above.
    pub const fn new() -> Self {
        ArenaConfig {
            initial_size: 0,
            maximum_size: None,
            chunk_size: 32 << 20,
            superblock_size: 8 << 20,
            large_threshold: 1 << 20,
            max_arenas: 64,
            size_classes: true,
            dump_on_failure: DumpTarget::None,
            synchronize_all: None,
        }
    }

    /// Bytes taken from upstream when the resource is made (a multiple of
    /// 256, at most [`Request::MAX_SIZE`]).
    pub const fn initial_size(mut self, bytes: u64) -> Self {
        self.initial_size = bytes;
        self
    }

    /// The most bytes ever held from upstream (a multiple of 256).
    pub const fn maximum_size(mut self, bytes: u64) -> Self {
        self.maximum_size = Some(bytes);
        self
    }

    /// Smallest growth step of the global arena (a multiple of 256, at
    /// least the superblock size, at most [`Request::MAX_SIZE`]).
    pub const fn chunk_size(mut self, bytes: u64) -> Self {
        self.chunk_size = bytes;
        self
    }

    /// Size of the superblocks lent to arenas (a multiple of 256, at least 1 MiB).
    pub const fn superblock_size(mut self, bytes: u64) -> Self {
        self.superblock_size = bytes;
        self
    }

    /// Requests above this many bytes go straight to the global arena (its
    /// size class must fit in a superblock).
    pub const fn large_threshold(mut self, bytes: u64) -> Self {
        self.large_threshold = bytes;
        self
    }

    /// Number of arena slots (1 to [`MAX_ARENAS`]).
    pub const fn max_arenas(mut self, n: u32) -> Self {
        self.max_arenas = n;
        self
    }

    /// Whether small requests are rounded up to size classes (else to 256 bytes).
    pub const fn size_classes(mut self, yes: bool) -> Self {
        self.size_classes = yes;
        self
    }

    /// Where to dump the state when an allocation runs out of memory.
    pub const fn dump_on_failure(mut self, target: DumpTarget) -> Self {
        self.dump_on_failure = target;
        self
    }

    /// A function that waits for all work on every stream (RMM calls
    /// `cudaDeviceSynchronize` here). With it, an arena that runs dry may
    /// take wholly free superblocks from the arenas of *other* streams;
    /// without it, only from arenas of its own stream id (the per-thread
    /// arenas of the default stream), whose frees its own stream orders.
    pub const fn synchronize_all(mut self, f: fn() -> Result<()>) -> Self {
        self.synchronize_all = Some(f);
        self
    }

    /// The maximum size, if any.
    pub const fn maximum(&self) -> Option<u64> {
        self.maximum_size
    }

    fn validate(&self) -> Result<()> {
        let bad = |what| Err(Error::InvalidConfig { what });
        if self.initial_size % 256 != 0 || self.chunk_size % 256 != 0 || self.superblock_size % 256 != 0 {
            return bad("arena sizes must be multiples of 256");
        }
        if self.superblock_size < MIN_SUPERBLOCK || self.superblock_size > 1 << 40 {
            return bad("superblock size must be between 1 MiB and 1 TiB");
        }
        if self.chunk_size < self.superblock_size {
            return bad("chunk size below the superblock size");
        }
        // Chunks are asked for with requests: above the largest, every
        // growth would fail.
        if self.chunk_size > Request::MAX_SIZE || self.initial_size > Request::MAX_SIZE {
            return bad("chunk or initial size above the largest request");
        }
        if let Some(max) = self.maximum_size {
            if max % 256 != 0 || max < self.initial_size {
                return bad("maximum size not a multiple of 256 or below the initial size");
            }
        }
        if self.large_threshold > Request::MAX_SIZE || size_class(self.large_threshold) > self.superblock_size
        {
            return bad("the size class of the large threshold does not fit in a superblock");
        }
        if self.max_arenas == 0 || self.max_arenas > MAX_ARENAS {
            return bad("max_arenas must be between 1 and 255");
        }
        Ok(())
    }
}

/// Who holds the memory an [`ArenaStats`] describes.
///
/// # Examples
///
/// ```
/// use memres_core::arena::Owner;
/// assert_ne!(Owner::Thread(1), Owner::Stream(1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// The global arena.
    Global,
    /// The arena of one thread on the default stream (a small number that
    /// identifies the thread while it lives; numbers are reused).
    Thread(u64),
    /// The arena of the stream with this id.
    Stream(u64),
}

/// An arena's [`Owner`] as the slot table names it: (`STREAM`, stream id)
/// or (`THREAD`, thread number); `NOBODY` for a free slot. Two words to
/// compare on the hot path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct OwnerKey {
    kind: u64,
    key: u64,
}

impl OwnerKey {
    const NOBODY: OwnerKey = OwnerKey { kind: EMPTY, key: 0 };

    /// The caller's: its thread on the default stream, else its stream.
    #[inline]
    fn of_caller(stream_id: u64) -> Self {
        if stream_id == 0 {
            OwnerKey { kind: THREAD, key: thread_no::current() }
        } else {
            OwnerKey { kind: STREAM, key: stream_id }
        }
    }

    fn owner(self) -> Option<Owner> {
        match self.kind {
            STREAM => Some(Owner::Stream(self.key)),
            THREAD => Some(Owner::Thread(self.key)),
            _ => None,
        }
    }

    /// The stream id whose work the arena's frees are ordered on.
    fn stream_id(self) -> u64 {
        if self.kind == STREAM {
            self.key
        } else {
            0
        }
    }
}

/// Figures of one arena (or of the global arena) in an [`ArenaDump`].
///
/// # Examples
///
/// ```
/// use memres_core::arena::{ArenaStats, Owner};
/// let s = ArenaStats { owner: Owner::Stream(7), superblocks: 2, free_superblocks: 0, held: 4096, used: 1024, free: 3072, largest_free: 1024 };
/// assert!((s.fragmentation() - 2.0 / 3.0).abs() < 1e-9);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArenaStats {
    /// Whose figures these are.
    pub owner: Owner,
    /// Superblocks held (for the global arena: superblocks lent to arenas).
    pub superblocks: usize,
    /// Superblocks with no block in use (0 for the global arena).
    pub free_superblocks: usize,
    /// Bytes held: the superblocks' sum (for the global arena: bytes from upstream).
    pub held: u64,
    /// Bytes in use (for the global arena: superblocks lent and large blocks).
    pub used: u64,
    /// Bytes free.
    pub free: u64,
    /// The largest free range.
    pub largest_free: u64,
}

impl ArenaStats {
    /// RMM's fragmentation: `1 - largest free / total free` (0 when nothing is free).
    pub fn fragmentation(&self) -> f64 {
        if self.free == 0 {
            0.0
        } else {
            1.0 - self.largest_free as f64 / self.free as f64
        }
    }
}

/// A snapshot of an [`ArenaResource`]: the global arena and every arena.
/// `Display` writes one line per arena.
///
/// # Examples
///
/// ```
/// use memres_core::arena::ArenaResource;
/// use memres_core::{MemoryResource, Request};
/// # use memres_core::testing::BumpUpstream;
/// let arena = ArenaResource::new(BumpUpstream::new(1 << 30));
/// let b = arena.allocate(Request::new(1000)?, &())?;
/// let dump = arena.dump();
/// assert_eq!(dump.arenas.len(), 1);
/// assert_eq!(dump.arenas[0].used, 1024);
/// assert!(dump.to_string().contains("fragmentation"));
/// # arena.deallocate(b, &())?;
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ArenaDump {
    /// The request that failed, for a dump made on failure.
    pub requested: Option<u64>,
    /// Chunks held from upstream.
    pub chunks: usize,
    /// Large blocks live in the global arena, and their bytes.
    pub large_blocks: u64,
    /// Bytes of the large blocks (rounded to 256).
    pub large_bytes: u64,
    /// The global arena.
    pub global: ArenaStats,
    /// Every arena in use, in slot order.
    pub arenas: Vec<ArenaStats>,
}

impl fmt::Display for ArenaDump {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(r) = self.requested {
            writeln!(f, "arena: out of memory allocating {r} bytes")?;
        }
        let g = &self.global;
        writeln!(
            f,
            "global: {} bytes held in {} chunks, {} superblocks lent, {} large blocks ({} bytes), {} free, largest free {}, fragmentation {:.2}%",
            g.held,
            self.chunks,
            g.superblocks,
            self.large_blocks,
            self.large_bytes,
            g.free,
            g.largest_free,
            g.fragmentation() * 100.0
        )?;
        for a in &self.arenas {
            match a.owner {
                Owner::Thread(n) => write!(f, "thread {n}")?,
                Owner::Stream(s) => write!(f, "stream {s:#x}")?,
                Owner::Global => write!(f, "global")?,
            }
            writeln!(
                f,
                ": {} superblocks ({} wholly free), {} bytes held, {} in use, {} free, largest free {}, fragmentation {:.2}%",
                a.superblocks,
                a.free_superblocks,
                a.held,
                a.used,
                a.free,
                a.largest_free,
                a.fragmentation() * 100.0
            )?;
        }
        Ok(())
    }
}

/// Slot states of the arena table.
const EMPTY: u64 = 0;
const CLAIMING: u64 = 1;
const STREAM: u64 = 2;
const THREAD: u64 = 3;

/// Tags: `generation << 32 | slot << 24 | node`, so an arena's index may
/// hold up to 2^24 ranges.
const SLOT_SHIFT: u32 = 24;
const SLOT_MASK: u64 = 0xff << SLOT_SHIFT;
const GLOBAL_SLOT: usize = 0xff;

/// What a free with a size above [`Request::MAX_SIZE`] is checked as: a
/// multiple of 256 that no block has (and that rounds without overflow).
const NO_SIZE: u64 = !255;

/// The size a free of a large block is checked with.
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

/// One entry of the arena table: written when claimed or retired, else
/// only read, so lookups by every thread share its cache line without
/// contention. It only points callers to an arena: the arena's `owner`,
/// read under its lock, decides (a lookup racing with a change of hands may
/// read a stale entry).
#[derive(Debug)]
struct SlotKey {
    /// `EMPTY`, `CLAIMING`, `STREAM` or `THREAD`; back to `EMPTY` when the
    /// arena is retired (under its lock).
    state: AtomicU64,
    /// The stream id or thread number; valid once `state` is `STREAM` or `THREAD`.
    key: AtomicU64,
}

/// Keeps each arena's lock and state on cache lines of its own.
#[derive(Debug)]
#[repr(align(128))]
struct Padded<T>(T);

/// The calling thread's number: small, unique among live threads, reused
/// after a thread exits (so that its arena, and the superblocks it holds,
/// go to the next new thread rather than being stranded).
#[cfg(all(feature = "std", not(loom)))]
mod thread_no {
    use alloc::vec::Vec;
    use core::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    static NEXT: AtomicU64 = AtomicU64::new(1);
    static FREED: Mutex<Vec<u64>> = Mutex::new(Vec::new());

    struct No(u64);

    impl Drop for No {
        fn drop(&mut self) {
            FREED.lock().unwrap_or_else(|p| p.into_inner()).push(self.0);
        }
    }

    std::thread_local! {
        static NO: No = No(FREED.lock().unwrap_or_else(|p| p.into_inner()).pop()
            .unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed)));
    }

    /// This thread's number (0 while its thread-locals are being destroyed).
    #[inline]
    pub(super) fn current() -> u64 {
        NO.try_with(|n| n.0).unwrap_or(0)
    }
}

/// Without `std` there is no thread identity: all threads share one arena
/// for the default stream.
#[cfg(not(all(feature = "std", not(loom))))]
mod thread_no {
    #[inline]
    pub(super) fn current() -> u64 {
        0
    }
}

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
///         └ no room: one superblock from the global arena (grows upstream)
///         └ still none: take back wholly free superblocks, retry, else OOM
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
///   may, below). A stream or thread that finds the table full frees the
///   slots of idle arenas; if there are none, it first takes back the
///   wholly free superblocks it may (as when running dry: of its own stream
///   id, or of every arena with `synchronize_all`, synchronizing first),
///   then frees the slots of the arenas that left idle. An arena of another
///   stream that holds free superblocks keeps them, and its slot, without
///   `synchronize_all`: frees on that stream may still be pending there,
///   and only that stream (its `release`) or `synchronize_all` orders them.
///   So any number of streams and threads may use the resource over its
///   life, `max_arenas` with blocks live at once; beyond that, or with every
///   slot held by an arena of another stream keeping its superblocks, the
///   request is [`Error::CapacityExhausted`].
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
///   that is what [`used_bytes`](ArenaResource::used_bytes) counts. A valid
///   request that needs a chunk above [`Request::MAX_SIZE`] (a size near it
///   with its alignment's padding) is [`Error::OutOfMemory`].
/// - **Superblocks** are `superblock_size` (8 MiB) unless the global arena
///   is at its maximum and only smaller room is left (never below 1 MiB);
///   a superblock never spans two upstream chunks.
/// - **Frees.** A block's tag names the arena it came from, and the block
///   goes back there whatever stream frees it (as RMM, which looks the
///   block up in every arena). When the freeing stream is not the arena's
///   stream, the freeing stream is synchronized first, as in RMM, so that
///   the arena's stream may reuse the block at once. Large blocks may be
///   reused by any stream: their free synchronizes the freeing stream, as
///   RMM's global arena does.
/// - **Sizes of frees.** A free is checked against what the block occupies:
///   a small block is freed by any size of its size class, a large block by
///   any size that rounds up to the same multiple of 256; another size,
///   one above [`Request::MAX_SIZE`] included, is [`Error::SizeMismatch`]
///   naming the class or rounded size as `expected` and the size given, and
///   frees nothing. The size is checked once the block is found: a free of
///   a block already freed is [`Error::DoubleFree`], one of an address that
///   is no block's [`Error::UnknownBlock`], whatever the size. A size of 0
///   is an empty block ([`Block::is_empty`]): its free does nothing, as
///   with every resource.
/// - **Running dry.** When an arena cannot get a superblock, the resource
///   takes every wholly free superblock back to the global arena from the
///   arenas of the caller's stream id (all per-thread arenas for the default
///   stream), or from all arenas if a [`synchronize_all`](ArenaConfig::synchronize_all)
///   function is configured; it synchronizes first (the caller's stream, or
///   all), so superblocks enter the global arena with their work complete.
///   Then it retries once, and reports [`Error::OutOfMemory`] with the
///   largest free range anywhere, the bytes held and the maximum (and dumps
///   its state if configured).
/// - **Giving memory back.** Wholly free chunks go back upstream when the
///   global arena needs room under its maximum for a larger chunk, and on
///   [`release`](ArenaResource::release). Dropping the resource does not
///   give its chunks back (that needs a stream): call `release` first.
///
/// # Examples
///
/// ```
/// use memres_core::arena::{ArenaConfig, ArenaResource};
/// use memres_core::{MemoryResource, Request};
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
/// assert_eq!(arena.used_bytes(), 0);
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

impl<U> ArenaResource<U> {
    /// An arena resource over `upstream` with the default configuration
    /// (nothing taken from upstream until the first allocation).
    ///
    /// ```
    /// use memres_core::arena::ArenaResource;
    /// # use memres_core::testing::BumpUpstream;
    /// let arena = ArenaResource::new(BumpUpstream::new(1 << 30));
    /// assert_eq!(arena.held_bytes(), 0);
    /// ```
    pub fn new(upstream: U) -> Self {
        Self::build(upstream, ArenaConfig::new())
    }

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
    /// # use memres_core::testing::BumpUpstream;
    /// let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), ArenaConfig::new().initial_size(32 << 20), &())?;
    /// assert_eq!(arena.held_bytes(), 32 << 20);
    /// assert!(ArenaResource::with_config(BumpUpstream::new(1 << 30), ArenaConfig::new().superblock_size(4096), &()).is_err());
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn with_config<S: Stream + ?Sized>(upstream: U, config: ArenaConfig, stream: &S) -> Result<Self>
    where
        U: MemoryResource<S>,
    {
        Self::with_config_and_lock(upstream, config, stream)
    }
}

impl<U, L: RawLock> ArenaResource<U, L> {
    fn build(upstream: U, config: ArenaConfig) -> Self {
        let global = Global::new(upstream, config.maximum_size, config.chunk_size, config.superblock_size);
        let n = config.max_arenas as usize;
        ArenaResource {
            global: Padded(Shared::new_with_lock(global)),
            keys: (0..n).map(|_| SlotKey { state: AtomicU64::new(EMPTY), key: AtomicU64::new(0) }).collect(),
            arenas: (0..n).map(|_| Padded(Shared::new_with_lock(Local::new()))).collect(),
            config,
        }
    }

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
    ///     ArenaResource::with_config_and_lock(BumpUpstream::new(1 << 30), ArenaConfig::new(), &())?;
    /// # let _ = arena;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn with_config_and_lock<S: Stream + ?Sized>(
        upstream: U,
        config: ArenaConfig,
        stream: &S,
    ) -> Result<Self>
    where
        U: MemoryResource<S>,
    {
        config.validate()?;
        let mut arena = Self::build(upstream, config);
        if config.initial_size > 0 {
            arena.global.0.get_mut().add_chunk(config.initial_size, stream)?;
        }
        Ok(arena)
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

    /// Bytes held from upstream.
    ///
    /// ```
    /// # use memres_core::arena::ArenaResource;
    /// # use memres_core::testing::BumpUpstream;
    /// assert_eq!(ArenaResource::new(BumpUpstream::new(1 << 30)).held_bytes(), 0);
    /// ```
    pub fn held_bytes(&self) -> u64 {
        self.global.0.with(|g| g.held())
    }

    /// The most bytes ever held from upstream at once.
    ///
    /// ```
    /// # use memres_core::arena::ArenaResource;
    /// # use memres_core::testing::BumpUpstream;
    /// assert_eq!(ArenaResource::new(BumpUpstream::new(1 << 30)).peak_held_bytes(), 0);
    /// ```
    pub fn peak_held_bytes(&self) -> u64 {
        self.global.0.with(|g| g.peak_held())
    }

    /// Bytes handed out (small blocks at their size class, large ones
    /// rounded to 256). Locks every arena in turn: not for the hot path.
    ///
    /// ```
    /// # use memres_core::arena::ArenaResource;
    /// # use memres_core::{MemoryResource, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let arena = ArenaResource::new(BumpUpstream::new(1 << 30));
    /// let b = arena.allocate(Request::new(2100)?, &())?;
    /// assert_eq!(arena.used_bytes(), 2560);
    /// # arena.deallocate(b, &())?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn used_bytes(&self) -> u64 {
        let large = self.global.0.with(|g| g.large().0);
        self.claimed().map(|i| self.arenas[i].0.with(|a| a.used_bytes())).sum::<u64>() + large
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

    fn claimed(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.keys.len())
            .filter(|&i| matches!(self.keys[i].state.load(Ordering::Acquire), STREAM | THREAD))
    }

    /// The stream id that slot `i` serves (0 for per-thread arenas).
    #[inline]
    fn stream_of(&self, i: usize) -> u64 {
        let k = &self.keys[i];
        match k.state.load(Ordering::Acquire) {
            STREAM => k.key.load(Ordering::Relaxed),
            _ => 0,
        }
    }

    /// The slot the table names for `me`, if any: probes from the hash of
    /// `me`, past empty slots (slots are retired), so a miss reads them all.
    #[inline]
    fn find_slot(&self, me: OwnerKey) -> Option<usize> {
        let OwnerKey { kind, key } = me;
        for i in self.probe_order(me) {
            let k = &self.keys[i];
            loop {
                match k.state.load(Ordering::Acquire) {
                    CLAIMING => spin_loop(),
                    s => {
                        if s == kind && k.key.load(Ordering::Relaxed) == key {
                            return Some(i);
                        }
                        break;
                    }
                }
            }
        }
        None
    }

    /// Every slot, from `me`'s home slot (found by hashing) on.
    #[inline]
    fn probe_order(&self, me: OwnerKey) -> impl Iterator<Item = usize> {
        let n = self.keys.len();
        let start = ((me.key ^ me.kind).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % n;
        (0..n).map(move |p| if start + p >= n { start + p - n } else { start + p })
    }

    /// A slot for `me`, who has none: an empty one, else one freed by
    /// retiring idle arenas (after taking back the wholly free superblocks
    /// the caller's stream may take, as when running dry).
    #[cold]
    fn claim_slot<S: Stream + ?Sized>(&self, me: OwnerKey, stream: &S) -> Result<usize> {
        for round in 0..2 {
            if let Some(i) = self.find_slot(me).or_else(|| self.claim_empty(me)) {
                return Ok(i);
            }
            if round == 0 && self.retire_idle() == 0 {
                self.reclaim(stream)?;
                self.retire_idle();
            }
        }
        Err(Error::CapacityExhausted { capacity: self.keys.len() as u32 })
    }

    /// Claims an empty slot for `me`, the first in `me`'s probe order.
    fn claim_empty(&self, me: OwnerKey) -> Option<usize> {
        let OwnerKey { kind, key } = me;
        for i in self.probe_order(me) {
            let k = &self.keys[i];
            if k.state.load(Ordering::Relaxed) != EMPTY
                || k.state.compare_exchange(EMPTY, CLAIMING, Ordering::Acquire, Ordering::Relaxed).is_err()
            {
                continue;
            }
            // An empty slot's arena is idle (it was retired so): it only
            // needs its owner.
            self.arenas[i].0.with(|a| a.set_owner(me));
            k.key.store(key, Ordering::Relaxed);
            k.state.store(kind, Ordering::Release);
            return Some(i);
        }
        None
    }

    /// Frees the slots of idle arenas (nothing live, no superblock): each
    /// may serve a new stream or thread. Returns how many.
    fn retire_idle(&self) -> usize {
        let mut freed = 0;
        for (k, arena) in self.keys.iter().zip(&self.arenas[..]) {
            if !matches!(k.state.load(Ordering::Relaxed), STREAM | THREAD) {
                continue;
            }
            arena.0.with(|a| {
                // Under the arena's lock, so no allocation of its owner is
                // under way; a slot still being claimed is left alone.
                if a.owner() != OwnerKey::NOBODY
                    && a.is_idle()
                    && matches!(k.state.load(Ordering::Acquire), STREAM | THREAD)
                {
                    a.set_owner(OwnerKey::NOBODY);
                    k.state.store(EMPTY, Ordering::Release);
                    freed += 1;
                }
            });
        }
        freed
    }

    #[inline]
    fn class_of(&self, size: u64) -> u64 {
        if self.config.size_classes {
            size_class(size)
        } else {
            (size.max(1) + 255) & !255
        }
    }

    /// The size class a free of a small block of `size` bytes is checked
    /// with.
    #[inline]
    fn free_class(&self, size: u64) -> u64 {
        if size > Request::MAX_SIZE {
            NO_SIZE
        } else {
            self.class_of(size)
        }
    }

    #[inline]
    fn is_large(&self, request: &Request) -> bool {
        request.size() > self.config.large_threshold
            || self.class_of(request.size()) + request.align() - 256 > self.config.superblock_size
    }

    /// A small block from the arena of `me`, with a superblock from the
    /// global arena if it has no room. `Ok(None)`: no superblock to be had.
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
        loop {
            let slot = match self.find_slot(me) {
                Some(i) => i,
                None => self.claim_slot(me, stream)?,
            };
            // `None`: the slot changed hands since it was looked up.
            if let Some(got) = self.allocate_in(slot, me, request, stream) {
                return got;
            }
        }
    }

    /// [`allocate_small`](Self::allocate_small) in arena `slot`, if it is
    /// still `me`'s (else `None`).
    #[inline]
    fn allocate_in<S: Stream + ?Sized>(
        &self,
        slot: usize,
        me: OwnerKey,
        request: Request,
        stream: &S,
    ) -> Option<Result<Option<Block>>>
    where
        U: MemoryResource<S>,
    {
        let class = self.class_of(request.size());
        let align = request.align();
        let serve = |a: &mut Local| -> Result<Option<Block>> {
            let got = match a.allocate(class, align)? {
                Some(got) => got,
                None => {
                    // Lock order: arena, then global (never the reverse).
                    let Some(range) = self.global.0.with(|g| g.acquire(class + align - 256, slot, stream))?
                    else {
                        return Ok(None);
                    };
                    if let Err(e) = a.add(range) {
                        let _ = self.global.0.with(|g| g.give_back(range.start()));
                        return Err(e);
                    }
                    match a.allocate(class, align)? {
                        Some(got) => got,
                        None => return Ok(None),
                    }
                }
            };
            match pack(slot, got.tag) {
                Some(tag) => Ok(Some(Block::new(got.addr, request.size(), tag))),
                None => {
                    let _ = a.free(got.tag, got.addr, class);
                    Err(Error::CapacityExhausted { capacity: 1 << SLOT_SHIFT })
                }
            }
        };
        self.arenas[slot].0.with(|a| (a.owner() == me).then(|| serve(a)))
    }

    /// A large block from the global arena. `Ok(None)`: no room.
    fn allocate_large<S: Stream + ?Sized>(&self, request: Request, stream: &S) -> Result<Option<Block>>
    where
        U: MemoryResource<S>,
    {
        self.global.0.with(|g| {
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
        })
    }

    /// Takes wholly free superblocks back into the global arena: from the
    /// arenas of the caller's stream id, or from all arenas when a
    /// `synchronize_all` function is configured. Returns the bytes taken.
    ///
    /// Superblocks are taken out first and synchronized after, so that any
    /// free into them happened before the synchronization; if it fails, they
    /// go back to their arenas and nothing changes.
    #[cold]
    fn reclaim<S: Stream + ?Sized>(&self, stream: &S) -> Result<u64> {
        let sid = stream.id();
        let all = self.config.synchronize_all;
        let mut moved: Vec<(usize, Range)> = Vec::new();
        for i in self.claimed() {
            // The owner as the arena's lock sees it: the slot may have
            // changed hands since the table was read.
            self.arenas[i].0.with(|a| {
                if a.owner() != OwnerKey::NOBODY && (all.is_some() || a.owner().stream_id() == sid) {
                    a.take_free(i, &mut moved);
                }
            });
        }
        if moved.is_empty() {
            return Ok(0);
        }
        let synced = match all {
            Some(f) => f(),
            None => stream.synchronize(),
        };
        let bytes = match synced {
            // Back to their arenas, which cannot have changed hands while
            // they were in transit.
            Err(_) => 0,
            Ok(()) => self.global.0.with(|g| {
                moved.iter().filter(|(_, r)| g.give_back(r.start()).is_ok()).map(|(_, r)| r.len()).sum()
            }),
        };
        for &(i, r) in &moved {
            self.arenas[i].0.with(|a| {
                a.arrived();
                if synced.is_err() && a.add(r).is_err() {
                    let _ = self.global.0.with(|g| g.give_back(r.start()));
                }
            });
        }
        synced.map(|()| bytes)
    }

    /// Gives every wholly free superblock (of the arenas [`reclaim`] may take
    /// from, for this stream) back to the global arena, frees the slot of
    /// every arena left idle (nothing live, no superblock), then gives every
    /// wholly free chunk back to upstream; returns the bytes given upstream.
    ///
    /// # Errors
    ///
    /// The stream's error if it cannot synchronize (nothing changes); the
    /// upstream's error if it refuses a chunk (that chunk stays).
    ///
    /// ```
    /// use memres_core::arena::ArenaResource;
    /// use memres_core::{MemoryResource, Request};
    /// use memres_core::testing::BumpUpstream;
    /// let arena = ArenaResource::new(BumpUpstream::new(1 << 30));
    /// let b = arena.allocate(Request::new(1000)?, &())?;
    /// arena.deallocate(b, &())?;
    /// assert!(arena.release(&())? > 0);
    /// assert_eq!((arena.held_bytes(), arena.upstream_with(|u| u.outstanding())), (0, 0));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    ///
    /// [`reclaim`]: ArenaResource#running-dry
    pub fn release<S: Stream + ?Sized>(&self, stream: &S) -> Result<u64>
    where
        U: MemoryResource<S>,
    {
        self.reclaim(stream)?;
        self.retire_idle();
        self.global.0.with(|g| g.release(stream))
    }

    /// Runs `f` with the upstream resource (under the global arena's lock).
    ///
    /// ```
    /// # use memres_core::arena::ArenaResource;
    /// # use memres_core::testing::BumpUpstream;
    /// let arena = ArenaResource::new(BumpUpstream::new(1 << 30));
    /// assert_eq!(arena.upstream_with(|u| u.outstanding()), 0);
    /// ```
    pub fn upstream_with<T>(&self, f: impl FnOnce(&U) -> T) -> T {
        self.global.0.with(|g| f(g.upstream()))
    }

    /// Frees a block found by its address: blocks with no tag, and those
    /// whose tag did not name a live block (`tag` is then `Some`).
    #[cold]
    fn free_by_address<S: Stream + ?Sized>(&self, block: Block, stream: &S, tag: Option<u64>) -> Result<()> {
        let addr = block.addr();
        match self.global.0.with(|g| g.locate(addr)) {
            Located::Super { owner, start } => {
                if self.stream_of(owner) != stream.id() {
                    stream.synchronize()?;
                }
                let class = self.free_class(block.size());
                self.arenas[owner].0.with(|a| a.free_at(start, addr, class, tag)).map_err(|e| given(e, block))
            }
            Located::Large { .. } if tag.is_some() => Err(Error::DoubleFree { addr }),
            Located::Large { tag } => {
                stream.synchronize()?;
                self.global
                    .0
                    .with(|g| g.free_large(tag, addr, free_size(block.size())))
                    .map_err(|e| given(e, block))
            }
            Located::Free => Err(Error::DoubleFree { addr }),
            Located::Unknown => Err(Error::UnknownBlock { addr }),
        }
    }

    /// The out-of-memory error with figures (and the dump, if configured).
    #[cold]
    fn out_of_memory(&self, requested: u64) -> Error {
        let (held, max_size, mut largest) = self.global.0.with(|g| (g.held(), g.maximum(), g.largest_free()));
        for i in self.claimed() {
            largest = largest.max(self.arenas[i].0.with(|a| a.largest_free()));
        }
        match self.config.dump_on_failure {
            DumpTarget::None => {}
            DumpTarget::Callback(f) => f(&self.snapshot(Some(requested))),
            #[cfg(feature = "std")]
            DumpTarget::Stderr => std::eprint!("{}", self.snapshot(Some(requested))),
        }
        Error::OutOfMemory { requested, largest_free: largest, pool_size: held, max_size }
    }

    /// A snapshot of the global arena and every arena (RMM's failure dump:
    /// superblocks, free bytes, fragmentation per arena). Locks each in turn.
    ///
    /// ```
    /// # use memres_core::arena::ArenaResource;
    /// # use memres_core::testing::BumpUpstream;
    /// let dump = ArenaResource::new(BumpUpstream::new(1 << 30)).dump();
    /// assert!(dump.arenas.is_empty() && dump.requested.is_none());
    /// ```
    pub fn dump(&self) -> ArenaDump {
        self.snapshot(None)
    }

    fn snapshot(&self, requested: Option<u64>) -> ArenaDump {
        let mut dump = self.global.0.with(|g| ArenaDump {
            requested,
            chunks: g.chunk_count(),
            large_blocks: g.large().1,
            large_bytes: g.large().0,
            global: g.stats(),
            arenas: Vec::new(),
        });
        for i in self.claimed() {
            dump.arenas.extend(self.arenas[i].0.with(|a| a.stats()));
        }
        dump
    }

    /// Checks every invariant: the global arena's index and chunks; every
    /// superblock lent is held by exactly the arena it was lent to, lies in
    /// one chunk and overlaps no other superblock or large block; each
    /// arena's blocks cover its superblocks exactly without overlap; and
    /// bytes in use + bytes free = bytes held, for each arena and for the
    /// global arena (whose bytes in use are the superblocks and large blocks).
    ///
    /// It locks the global arena and each arena in turn: run it while no
    /// other thread uses the resource, or it may report a superblock in
    /// transit.
    ///
    /// # Errors
    ///
    /// The first broken invariant.
    ///
    /// ```
    /// # use memres_core::arena::ArenaResource;
    /// # use memres_core::testing::BumpUpstream;
    /// assert!(ArenaResource::new(BumpUpstream::new(1 << 30)).check().is_ok());
    /// ```
    pub fn check(&self) -> core::result::Result<(), Violation> {
        let lent: Vec<(u64, u64, usize)> = self.global.0.with(|g| {
            g.check()?;
            Ok::<_, Violation>(g.lent().collect())
        })?;
        let mut matched = 0;
        for i in 0..self.arenas.len() {
            let k = &self.keys[i];
            let (state, key) = (k.state.load(Ordering::Acquire), k.key.load(Ordering::Relaxed));
            self.arenas[i].0.with(|a| {
                if a.owner() == OwnerKey::NOBODY {
                    return match state == EMPTY && a.is_idle() {
                        true => Ok(()),
                        false => Err(Violation::new("an unclaimed arena slot is in use")),
                    };
                }
                if a.owner() != (OwnerKey { kind: state, key }) {
                    return Err(Violation::new("an arena's slot names another owner"));
                }
                if a.in_transit() {
                    return Err(Violation::new("an arena's superblocks are in transit"));
                }
                a.check()?;
                for h in a.superblocks() {
                    match lent.binary_search_by_key(&h.start(), |l| l.0) {
                        Ok(j) if lent[j].1 == h.len() && lent[j].2 == i => matched += 1,
                        _ => return Err(Violation::new("an arena holds a superblock not lent to it")),
                    }
                }
                Ok(())
            })?;
        }
        if matched != lent.len() {
            return Err(Violation::new("a superblock lent is held by no arena"));
        }
        Ok(())
    }
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
        if self.reclaim(stream)? > 0 {
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
            return self.free_by_address(block, stream, None);
        }
        let slot = ((tag & SLOT_MASK) >> SLOT_SHIFT) as usize;
        let inner = tag & !SLOT_MASK;
        let freed = if slot == GLOBAL_SLOT {
            stream.synchronize()?;
            self.global.0.with(|g| g.free_large(inner, addr, free_size(block.size())))
        } else if slot < self.arenas.len()
            && matches!(self.keys[slot].state.load(Ordering::Acquire), STREAM | THREAD)
        {
            if self.stream_of(slot) != stream.id() {
                stream.synchronize()?;
            }
            let class = self.free_class(block.size());
            self.arenas[slot].0.with(|a| a.free(inner, addr, class))
        } else {
            Err(Error::UnknownBlock { addr })
        };
        match freed {
            Err(Error::UnknownBlock { .. }) => self.free_by_address(block, stream, Some(tag)),
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
        f.debug_struct("ArenaResource")
            .field("held_bytes", &self.held_bytes())
            .field("arenas", &self.arena_count())
            .field("config", &self.config)
            .finish()
    }
}
