//! Running dry, idle arenas and giving memory back: wholly free superblocks
//! go back to the global arena, wholly free chunks back upstream.

use super::local::Local;
use super::slots::OwnerKey;
use super::ArenaResource;
use crate::lock::RawLock;
use crate::{MemoryResource, Range, Result, Stream};
use alloc::vec::Vec;

/// A superblock on its way from an arena to the global arena.
struct Moved {
    slot: usize,
    range: Range,
    /// Its arena serves the caller's stream id: the caller's stream orders
    /// its frees.
    mine: bool,
}

/// Superblocks in transit, put back in their arenas if the call that took
/// them unwinds (a stream whose synchronization panics): else they would
/// stay in transit for good, their arenas never idle, their chunks never
/// free.
struct Taken<'a, U, L: RawLock> {
    arena: &'a ArenaResource<U, L>,
    moved: Vec<Moved>,
}

impl<U, L: RawLock> Drop for Taken<'_, U, L> {
    fn drop(&mut self) {
        for m in core::mem::take(&mut self.moved) {
            self.arena.arrive(&m, false);
        }
    }
}

impl<U, L: RawLock> ArenaResource<U, L> {
    /// Takes the wholly free superblocks of the arenas `pick` names back
    /// into the global arena, ordered after every free into them: those of
    /// the caller's stream id after the caller's stream synchronized, those
    /// of other streams after the device synchronized
    /// ([`Stream::synchronize_device`]); a stream that cannot synchronize
    /// the device leaves those where they are. Returns the bytes taken.
    ///
    /// Superblocks are taken out first and synchronized after, so that any
    /// free into them happened before the synchronization; if it fails, they
    /// go back to their arenas and nothing changes.
    #[cold]
    pub(super) fn reclaim<S: Stream + ?Sized>(
        &self,
        stream: &S,
        mut pick: impl FnMut(usize, &mut Local) -> bool,
    ) -> Result<u64> {
        let sid = stream.id();
        let mut moved: Vec<Moved> = Vec::new();
        for i in self.claimed() {
            // The owner as the arena's lock sees it: the slot may have
            // changed hands since the table was read. An arena whose lock
            // the call this one comes from holds (through the upstream) is
            // in use: it keeps its superblocks.
            let _ = self.arenas[i].0.try_with(|a| {
                if a.owner() != OwnerKey::NOBODY && pick(i, a) {
                    let mine = a.owner().stream_id() == sid;
                    a.take_free(|range| moved.push(Moved { slot: i, range, mine }));
                }
            });
        }
        if moved.is_empty() {
            return Ok(0);
        }
        let mut taken = Taken { arena: self, moved };
        let moved = &taken.moved;
        let (own, foreign) = (moved.iter().any(|m| m.mine), moved.iter().any(|m| !m.mine));
        // Ok(true): all may go; Ok(false): only the caller's stream's.
        let synced = match foreign {
            true => stream.synchronize_device(),
            false => Ok(false),
        };
        let synced = match synced {
            Ok(false) if own => stream.synchronize().map(|()| false),
            other => other,
        };
        let goes = |m: &Moved| synced == Ok(true) || (m.mine && synced.is_ok());
        // Refused from inside the upstream's call: every superblock goes
        // back to its arena.
        let bytes = self.global.0.try_with(|g| {
            moved
                .iter()
                .filter(|m| goes(m) && g.give_back(m.range.start()).is_ok())
                .map(|m| m.range.len())
                .sum()
        });
        for m in core::mem::take(&mut taken.moved) {
            self.arrive(&m, bytes.is_ok() && goes(&m));
        }
        let bytes = bytes?;
        synced.map(|_| bytes)
    }

    /// Ends `m`'s transit: back in its arena, which cannot have changed
    /// hands meanwhile, unless it went to the global arena (`gone`).
    fn arrive(&self, m: &Moved, gone: bool) {
        self.arenas[m.slot].0.with(|a| {
            a.arrived();
            if !gone && a.add(m.range).is_err() {
                let _ = self.global.0.with(|g| g.give_back(m.range.start()));
            }
        });
    }

    /// The idle sweep: arenas that served no allocation since the last
    /// sweep give their wholly free superblocks back (as [`reclaim`]
    /// orders them) and, left idle, their slots; the others start a new
    /// period.
    ///
    /// [`reclaim`]: Self::reclaim
    #[cold]
    pub(super) fn sweep_idle<S: Stream + ?Sized>(&self, stream: &S) -> Result<()> {
        let mut idle: Vec<usize> = Vec::new();
        self.reclaim(stream, |i, a| {
            let used = a.touched_since();
            if !used {
                idle.push(i);
            }
            !used
        })?;
        // An arena used since (a new owner's included) stays.
        self.retire(|i, a| !a.touched() && idle.contains(&i));
        Ok(())
    }

    /// Gives every wholly free superblock back to the global arena (those
    /// of other streams only if `stream` can synchronize the device: see
    /// *Running dry* in [`ArenaResource`]), frees the slot of every arena
    /// left idle (nothing live, no superblock), then gives every wholly free
    /// chunk back to upstream; returns the bytes given upstream.
    ///
    /// # Errors
    ///
    /// The stream's error if it cannot synchronize (nothing changes); the
    /// upstream's error if it refuses a chunk (that chunk stays);
    /// [`Error::Reentrant`](crate::Error::Reentrant) from inside the
    /// upstream's call, under a lock that refuses re-entry (nothing goes back).
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
    pub fn release<S: Stream + ?Sized>(&self, stream: &S) -> Result<u64>
    where
        U: MemoryResource<S>,
    {
        self.reclaim(stream, |_, _| true)?;
        self.retire_idle();
        self.global.0.try_with(|g| g.release(stream))?
    }
}

/// Gives the global arena's chunks back upstream, on the stream type's
/// [`Stream::at_drop`] stream, as the pool does (see
/// [`CoalescingPool`](crate::pool::CoalescingPool)'s `Drop`): every chunk
/// that holds no live block, the arenas' wholly free superblocks taken back
/// first. A chunk that still holds a live block stays with the upstream
/// (leaked).
impl<U, L: RawLock> Drop for ArenaResource<U, L> {
    fn drop(&mut self) {
        // No call runs (`&mut self`), so no stream is needed to take the
        // superblocks back: their chunks go back on the drop stream, which
        // orders them after the work of the frees into them as it orders
        // every chunk of an arena dropped with nothing live (those chunks
        // went back so already). They stay counted in transit: the arenas
        // go with the resource.
        let global = self.global.0.get_mut();
        for arena in self.arenas.iter_mut() {
            arena.0.get_mut().take_free(|range| {
                let _ = global.give_back(range.start());
            });
        }
        global.give_back_on_drop();
    }
}
