//! What an arena resource reports: the figures of each arena, the dump made
//! on failure, and the out-of-memory error.

use super::{ArenaResource, DumpTarget};
use crate::lock::RawLock;
use crate::Error;
use alloc::vec::Vec;
use core::fmt;

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

impl<U, L: RawLock> ArenaResource<U, L> {
    /// The out-of-memory error with figures (and the dump, if configured).
    /// Its largest free block is its usage's: the largest block it could
    /// hand out without growing, an arena's free range counted only up to
    /// the large threshold (a larger request goes to the global arena).
    #[cold]
    pub(super) fn out_of_memory(&self, requested: u64) -> Error {
        let (held, max_size, mut largest) = self.global.0.with(|g| (g.held(), g.maximum(), g.largest_free()));
        for i in self.claimed() {
            largest =
                largest.max(self.arenas[i].0.with(|a| a.largest_free()).min(self.config.large_threshold));
        }
        match self.config.dump_on_failure {
            DumpTarget::None => {}
            DumpTarget::Callback(f) => f(&self.snapshot(Some(requested))),
            #[cfg(feature = "std")]
            // A dump that cannot be written (standard error closed) is
            // dropped: the error is what the caller asked for.
            DumpTarget::Stderr => {
                use std::io::Write;
                let _ = write!(std::io::stderr().lock(), "{}", self.snapshot(Some(requested)));
            }
        }
        Error::OutOfMemory { requested, largest_free: largest, pool_size: held, max_size }
    }

    /// A snapshot of the global arena and every arena (RMM's failure dump:
    /// superblocks, free bytes, fragmentation per arena). Locks each in turn.
    ///
    /// # Panics
    ///
    /// Called from inside a call on the arena (its upstream's) under a lock
    /// that refuses re-entry, as [`usage`](crate::Inspect::usage).
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

    pub(super) fn snapshot(&self, requested: Option<u64>) -> ArenaDump {
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
}
