//! The arena resource's figures and invariant checker.

use super::slots::{OwnerKey, EMPTY};
use super::ArenaResource;
use crate::check::Violation;
use crate::lock::RawLock;
use crate::primitive::Ordering;
use crate::{Inspect, Usage};
use alloc::vec::Vec;

impl<U, L: RawLock> Inspect for ArenaResource<U, L> {
    /// Used: small blocks at their size class, large ones rounded up to
    /// 256; held: the global arena's chunks; largest free: the longest free
    /// range of the global arena, or of any arena's superblocks up to the
    /// large threshold (larger requests go to the global arena). Locks the
    /// global arena and every arena in turn: not for the hot path. Called
    /// from inside a call on the arena (its upstream's) under a lock that
    /// refuses re-entry, it panics, as [`Shared`](crate::Shared)'s does.
    ///
    /// ```
    /// # use memres_core::arena::ArenaResource;
    /// # use memres_core::{Inspect, MemoryResource, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let arena = ArenaResource::new(BumpUpstream::new(1 << 30));
    /// assert_eq!(arena.usage().held, 0);
    /// let b = arena.allocate(Request::new(2100)?, &())?;
    /// assert_eq!(arena.usage().used, 2560);
    /// # arena.deallocate(b, &())?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    fn usage(&self) -> Usage {
        let (held, peak_held, large, mut largest_free) =
            self.global.0.with(|g| (g.held(), g.peak_held(), g.large().0, g.largest_free()));
        let mut used = large;
        for i in self.claimed() {
            self.arenas[i].0.with(|a| {
                used += a.used_bytes();
                largest_free = largest_free.max(a.largest_free().min(self.config.large_threshold));
            });
        }
        Usage::new(used, held, peak_held, largest_free)
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
    /// transit. Called from inside a call on the arena (its upstream's)
    /// under a lock that refuses re-entry, it reports that as a violation.
    ///
    /// # Errors
    ///
    /// The first broken invariant.
    ///
    /// ```
    /// # use memres_core::arena::ArenaResource;
    /// # use memres_core::Inspect;
    /// # use memres_core::testing::BumpUpstream;
    /// assert!(ArenaResource::new(BumpUpstream::new(1 << 30)).check().is_ok());
    /// ```
    fn check(&self) -> core::result::Result<(), Violation> {
        // From inside a call on the resource (its upstream's), under a lock
        // that refuses re-entry: a violation, as `Shared`'s, not a panic.
        let in_use = |_| Violation::new("checked from inside a call on the same resource");
        let lent: Vec<(u64, u64, usize)> = self
            .global
            .0
            .try_with(|g| {
                g.check()?;
                Ok::<_, Violation>(g.lent().collect())
            })
            .map_err(in_use)??;
        let mut matched = 0;
        for i in 0..self.arenas.len() {
            let k = &self.keys[i];
            let (state, key) = (k.state.load(Ordering::Acquire), k.key.load(Ordering::Relaxed));
            self.arenas[i]
                .0
                .try_with(|a| {
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
                })
                .map_err(in_use)??;
        }
        if matched != lent.len() {
            return Err(Violation::new("a superblock lent is held by no arena"));
        }
        Ok(())
    }
}
