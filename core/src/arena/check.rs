//! The arena resource's invariant checker.

use super::slots::{OwnerKey, EMPTY};
use super::ArenaResource;
use crate::check::Violation;
use crate::lock::RawLock;
use crate::primitive::Ordering;
use alloc::vec::Vec;

impl<U, L: RawLock> ArenaResource<U, L> {
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
