//! The configuration of the arena resource.

use super::global::MIN_SUPERBLOCK;
use super::{size_class, ArenaDump, MAX_ARENAS};
use crate::{Error, Request, Result};

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

/// Sizes and policies of an [`ArenaResource`](super::ArenaResource).
///
/// | setting | default | why |
/// | --- | --- | --- |
/// | `initial_size` | 0 | RMM takes half the device's free memory up front; only the backend knows that figure, so the caller passes it here |
/// | `maximum_size` | none | the most bytes ever held from upstream (at least one superblock) |
/// | `chunk_size` | 32 MiB | the global arena grows by `max(request, chunk_size, held / 8)` (the last two rounded up to whole superblocks; a chunk cut to the room under the maximum, or halved while the upstream is out of memory, is rounded to 256 only): few chunks, yet the unused tail of the newest one stays under 1/8 of what is held plus one `chunk_size`; superblocks never span two chunks |
/// | `superblock_size` | 8 MiB | at least 8 blocks of the 1 MiB threshold per superblock: the tail left when a superblock fills is at most 1/8 of it, and an arena goes to the global arena once per 8 MiB of growth, not once per block (RMM's 1 MiB superblocks hold a single 1 MiB block) |
/// | `large_threshold` | 1 MiB | RMM's: larger requests are served by the global arena directly (so is one whose size class plus its alignment less 256 bytes exceeds the superblock size) |
/// | `max_arenas` | 64 | slots of the arena table (per-thread plus per-stream arenas in use at once), at most [`MAX_ARENAS`]; each slot costs about 8 KiB of metadata up front; an idle arena gives its slot to a new stream or thread (see *Slots change hands* in [`ArenaResource`](super::ArenaResource)); a stream that finds none, with blocks live in every arena, gets [`Error::CapacityExhausted`] (sharing an arena between two streams would break stream order) |
/// | `size_classes` | on | small requests rounded up to [`size_class`] |
/// | `idle_after` | 64 | superblock requests (of any arena) after which an arena that served no allocation meanwhile is *idle for long*: its wholly free superblocks go back to the global arena and, left empty, its slot is freed (see *Idle arenas* in [`ArenaResource`](super::ArenaResource)); 0: never. Large enough that busy arenas are never swept and the device synchronization it may take is rare; small enough that the superblocks of a stream that is gone serve others soon |
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
    pub(super) initial_size: u64,
    pub(super) maximum_size: Option<u64>,
    pub(super) chunk_size: u64,
    pub(super) superblock_size: u64,
    pub(super) large_threshold: u64,
    pub(super) max_arenas: u32,
    pub(super) size_classes: bool,
    pub(super) dump_on_failure: DumpTarget,
    pub(super) idle_after: u32,
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
            chunk_size: Self::DEFAULT_CHUNK_SIZE,
            superblock_size: Self::DEFAULT_SUPERBLOCK_SIZE,
            large_threshold: 1 << 20,
            max_arenas: 64,
            size_classes: true,
            dump_on_failure: DumpTarget::None,
            idle_after: 64,
        }
    }

    /// The default chunk size: 32 MiB.
    ///
    /// ```
    /// # use memres_core::arena::ArenaConfig;
    /// assert_eq!(ArenaConfig::DEFAULT_CHUNK_SIZE, 32 << 20);
    /// ```
    pub const DEFAULT_CHUNK_SIZE: u64 = 32 << 20;

    /// The default superblock size: 8 MiB.
    ///
    /// ```
    /// # use memres_core::arena::ArenaConfig;
    /// assert_eq!(ArenaConfig::DEFAULT_SUPERBLOCK_SIZE, 8 << 20);
    /// ```
    pub const DEFAULT_SUPERBLOCK_SIZE: u64 = 8 << 20;

    crate::config::setters! {
        /// Bytes taken from upstream when the resource is made (a multiple of
        /// 256, at most [`Request::MAX_SIZE`]).
        initial_size(bytes: u64) => initial_size;

        /// The most bytes ever held from upstream (a multiple of 256, at least
        /// the superblock size and the initial size).
        maximum_size(bytes: u64) => maximum_size Some;

        /// Smallest growth step of the global arena (a multiple of 256, at
        /// least the superblock size, at most [`Request::MAX_SIZE`]).
        chunk_size(bytes: u64) => chunk_size;

        /// Size of the superblocks lent to arenas (a multiple of 256, at least
        /// 1 MiB and at most 1 TiB).
        superblock_size(bytes: u64) => superblock_size;

        /// Requests above this many bytes go straight to the global arena (its
        /// size class, or with `size_classes(false)` its size rounded up to
        /// 256, must fit in a superblock).
        large_threshold(bytes: u64) => large_threshold;

        /// Number of arena slots (1 to [`MAX_ARENAS`]).
        max_arenas(n: u32) => max_arenas;

        /// Whether small requests are rounded up to size classes (else to 256 bytes).
        size_classes(yes: bool) => size_classes;

        /// Where to dump the state when an allocation runs out of memory.
        dump_on_failure(target: DumpTarget) => dump_on_failure;

        /// Superblock requests after which an arena that served no allocation
        /// meanwhile gives its wholly free superblocks back, and its slot if it
        /// is left empty (0: never).
        idle_after(requests: u32) => idle_after;
    }

    /// The maximum size, if any.
    pub const fn maximum(&self) -> Option<u64> {
        self.maximum_size
    }

    /// The number of arena slots (`max_arenas`).
    pub const fn slots(&self) -> u32 {
        self.max_arenas
    }

    /// What a small block of `size` bytes (at most [`Request::MAX_SIZE`])
    /// takes: its [`size_class`], or with `size_classes(false)` its size
    /// rounded up to 256.
    #[inline]
    pub(super) fn class_of(&self, size: u64) -> u64 {
        if self.size_classes {
            size_class(size)
        } else {
            (size.max(1) + 255) & !255
        }
    }

    pub(super) fn validate(&self) -> Result<()> {
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
            // No superblock could be had: no small request could be served.
            if max < self.superblock_size {
                return bad("maximum size below the superblock size");
            }
        }
        if self.large_threshold > Request::MAX_SIZE
            || self.class_of(self.large_threshold) > self.superblock_size
        {
            return bad("the size class of the large threshold does not fit in a superblock");
        }
        if self.max_arenas == 0 || self.max_arenas > MAX_ARENAS {
            return bad("max_arenas must be between 1 and 255");
        }
        Ok(())
    }
}
