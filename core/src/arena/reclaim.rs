//! Running dry and giving memory back: wholly free superblocks go back to
//! the global arena, wholly free chunks back upstream.

use super::slots::OwnerKey;
use super::ArenaResource;
use crate::lock::RawLock;
use crate::{MemoryResource, Range, Result, Stream};
use alloc::vec::Vec;

impl<U, L: RawLock> ArenaResource<U, L> {
    /// Takes wholly free superblocks back into the global arena: from the
    /// arenas of the caller's stream id, or from all arenas when a
    /// `synchronize_all` function is configured. Returns the bytes taken.
    ///
    /// Superblocks are taken out first and synchronized after, so that any
    /// free into them happened before the synchronization; if it fails, they
    /// go back to their arenas and nothing changes.
    #[cold]
    pub(super) fn reclaim<S: Stream + ?Sized>(&self, stream: &S) -> Result<u64> {
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
    /// use memres_core::{Inspect, MemoryResource, Request};
    /// use memres_core::testing::BumpUpstream;
    /// let arena = ArenaResource::new(BumpUpstream::new(1 << 30));
    /// let b = arena.allocate(Request::new(1000)?, &())?;
    /// arena.deallocate(b, &())?;
    /// assert!(arena.release(&())? > 0);
    /// assert_eq!((arena.usage().held, arena.upstream_with(|u| u.usage().held)), (0, 0));
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
}
