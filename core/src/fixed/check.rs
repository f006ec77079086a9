//! The fixed-size resource's figures and invariant checker.

use super::slots::{is_free_link, Slot, NIL, RETIRED, USED, VACANT};
use super::{Chunk, FixedSizeResource};
use crate::check::Violation;
use crate::storage::Storage;
use crate::{Inspect, Usage};

impl<U, C: Storage<Chunk>, L: Storage<Slot>> Inspect for FixedSizeResource<U, C, L> {
    /// Used: whole blocks; held: the chunks; largest free: one block if
    /// any is free.
    ///
    /// ```
    /// # use memres_core::fixed::{FixedConfig, FixedSizeResource};
    /// # use memres_core::{Inspect, MemoryResourceMut, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let mut f = FixedSizeResource::with_config(BumpUpstream::new(1 << 20), FixedConfig::new(256).blocks_per_chunk(4), &())?;
    /// f.allocate(Request::new(1)?, &())?;
    /// let u = f.usage();
    /// assert_eq!((u.used, u.held, u.free, u.largest_free), (256, 1024, 3 * 256, 256));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    fn usage(&self) -> Usage {
        let used = self.slots.used * self.block_size;
        let largest_free = if self.free_blocks() > 0 { self.block_size } else { 0 };
        Usage::new(used, self.chunks.held(), self.chunks.peak_held(), largest_free)
    }

    /// Checks the invariants: chunks sorted, disjoint, aligned and each
    /// owning one whole slot group whose slots hold its block addresses;
    /// every other slot group vacant; the free stack a list without cycles
    /// through exactly the free slots; free count + used count = blocks
    /// held; bytes in use + bytes free = bytes held from upstream.
    ///
    /// # Time Complexity
    ///
    /// O(blocks held + chunks). Tests and fuzz targets run it after every
    /// step; the hot path never does.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::fixed::FixedSizeResource;
    /// use memres_core::{Inspect, MemoryResourceMut, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let mut f = FixedSizeResource::new(BumpUpstream::new(1 << 30));
    /// f.allocate(Request::new(1)?, &())?;
    /// assert!(f.check().is_ok());
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    fn check(&self) -> core::result::Result<(), Violation> {
        let bpc = self.config.blocks() as usize;
        let chunk_size = self.config.chunk_size();
        let slots = &self.slots.table;
        if slots.len() % bpc != 0 {
            return Err(Violation::new("slot table is not whole groups"));
        }
        let groups = slots.len() / bpc;
        // Sorted, disjoint, each owning a whole group with its addresses.
        self.chunks.check(&self.slots)?;
        for c in self.chunks.iter() {
            let base = c.range().start();
            if base % self.config.chunk_align() != 0 || base % self.align != 0 {
                return Err(Violation::new("chunk not aligned"));
            }
            if c.range().len() != chunk_size {
                return Err(Violation::new("chunk is not one chunk size long"));
            }
        }
        let owned = self.chunks.len();
        // Held groups are non-vacant and each chunk owns a distinct one
        // (distinct addresses, checked above), so the rest must be vacant.
        let vacant_groups =
            (0..groups).filter(|&g| slots[g * bpc..(g + 1) * bpc].iter().all(|s| s.link == VACANT));
        if vacant_groups.count() + owned != groups {
            return Err(Violation::new("slot group neither held nor wholly vacant"));
        }
        let used = slots.iter().filter(|s| s.link == USED).count() as u64;
        let free = slots.iter().filter(|s| is_free_link(s.link)).count() as u64;
        let retired = slots.iter().filter(|s| s.link == RETIRED).count() as u64;
        if used != self.slots.used || retired != self.slots.retired {
            return Err(Violation::new("used or retired count differs from the slots"));
        }
        if slots.iter().any(|s| s.link != VACANT && (s.link == RETIRED) != (s.generation == u32::MAX)) {
            return Err(Violation::new("slot retired with generations left, or in use with none"));
        }
        // A walk from the head that reaches NIL in exactly `free` steps
        // through free slots visits each free slot once.
        let mut steps = 0u64;
        let mut i = self.slots.head;
        while i != NIL {
            let Some(s) = slots.get(i as usize) else {
                return Err(Violation::new("free stack leads out of the slot table"));
            };
            if !is_free_link(s.link) {
                return Err(Violation::new("free stack holds a used, vacant or retired slot"));
            }
            steps += 1;
            if steps > free {
                return Err(Violation::new("free stack has a cycle or misses a free slot"));
            }
            i = s.link;
        }
        if steps != free {
            return Err(Violation::new("free stack misses a free slot"));
        }
        if free + used + retired != owned as u64 * bpc as u64 {
            return Err(Violation::new("free + used + retired count != blocks held"));
        }
        if (used + free + retired) * self.block_size != self.chunks.held() {
            return Err(Violation::new("bytes in use + free + retired != bytes held from upstream"));
        }
        Ok(())
    }
}
