//! The peers the memres resources are compared with: allocators of offsets
//! in a range of their own, as [`Replayer`]s (sizes in units of 256 bytes,
//! as memres rounds them).

use crate::replay::{Replayer, GRANULE};
use crate::workload::Workload;
use memres_core::Error;
use std::fmt;

#[cfg(test)]
mod tests;

/// Sizes in 256-byte units, checked to fit `u32`.
#[inline]
fn units(size: u64) -> Result<u32, Error> {
    u32::try_from(size.div_ceil(GRANULE))
        .map_err(|_| Error::InvalidSize { size, what: "more 256-byte units than a u32 counts" })
}

/// `size` refused by a peer of `capacity_units` whose largest free range
/// is `largest_free_units` long.
fn peer_out_of_memory(size: u64, capacity_units: u64, largest_free_units: u64) -> Error {
    Error::OutOfMemory {
        requested: size,
        largest_free: largest_free_units * GRANULE,
        pool_size: capacity_units * GRANULE,
        max_size: Some(capacity_units * GRANULE),
    }
}

/// The `offset-allocator` crate, [`offset_allocator::Allocator`]:
/// OffsetAllocator's TLSF-like index over one range of `u32::MAX` units of
/// 256 bytes (1 TiB), as a [`Replayer`].
pub struct OffsetReplayer {
    inner: offset_allocator::Allocator,
    /// The highest end offset handed out, in units.
    peak_end: u64,
}

impl OffsetReplayer {
    /// An allocator with room for the nodes `workload` needs.
    pub fn new(workload: &Workload) -> Self {
        // Each live allocation and each free gap between them is a node.
        let nodes = (workload.peak_live_count as u64 * 2 + 1024).min(u32::MAX as u64 - 2) as u32;
        OffsetReplayer { inner: offset_allocator::Allocator::with_max_allocs(u32::MAX, nodes), peak_end: 0 }
    }
}

impl fmt::Debug for OffsetReplayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OffsetReplayer").field("peak_end", &self.peak_end).finish_non_exhaustive()
    }
}

impl Replayer for OffsetReplayer {
    type Handle = Option<offset_allocator::Allocation>;

    fn vacant(&self) -> Self::Handle {
        None
    }

    #[inline]
    fn allocate(&mut self, size: u64, _stream: u16) -> Result<Self::Handle, Error> {
        let n = units(size)?;
        if n == 0 {
            return Ok(None);
        }
        let a = self.inner.allocate(n).ok_or_else(|| {
            // The largest block it can hand out (its free ranges are
            // binned, each as the size of its bin).
            let largest = self.inner.storage_report().largest_free_region;
            peer_out_of_memory(size, u32::MAX as u64, largest.into())
        })?;
        self.peak_end = self.peak_end.max(a.offset as u64 + n as u64);
        Ok(Some(a))
    }

    #[inline]
    fn deallocate(&mut self, handle: Self::Handle, _size: u64, _stream: u16) -> Result<(), Error> {
        if let Some(a) = handle {
            self.inner.free(a);
        }
        Ok(())
    }

    fn peak_upstream(&self) -> u64 {
        self.peak_end * GRANULE
    }
}

/// The `range-alloc` crate, [`range_alloc::RangeAllocator`]: a sorted list
/// of free ranges, best fit, over one range of 2^32 units of 256 bytes
/// (1 TiB), as a [`Replayer`].
#[derive(Debug)]
pub struct RangeReplayer {
    inner: range_alloc::RangeAllocator<u64>,
    /// The highest end offset handed out, in units.
    peak_end: u64,
}

impl RangeReplayer {
    /// The range's length in units.
    pub const CAPACITY: u64 = 1 << 32;

    /// An allocator over the whole range.
    pub fn new() -> Self {
        RangeReplayer { inner: range_alloc::RangeAllocator::new(0..Self::CAPACITY), peak_end: 0 }
    }

    /// The longest free range, in units: the longest gap between the
    /// ranges handed out, or at either end (read only when out of memory:
    /// it walks them all).
    fn largest_free(&self) -> u64 {
        let mut largest = 0;
        let mut at = 0;
        for r in self.inner.allocated_ranges() {
            largest = largest.max(r.start - at);
            at = r.end;
        }
        largest.max(Self::CAPACITY - at)
    }
}

impl Default for RangeReplayer {
    fn default() -> Self {
        Self::new()
    }
}

impl Replayer for RangeReplayer {
    /// `(start, end)` in units; `(0, 0)` for nothing.
    type Handle = (u64, u64);

    fn vacant(&self) -> Self::Handle {
        (0, 0)
    }

    #[inline]
    fn allocate(&mut self, size: u64, _stream: u16) -> Result<Self::Handle, Error> {
        let n = size.div_ceil(GRANULE);
        if n == 0 {
            return Ok((0, 0));
        }
        let r = self
            .inner
            .allocate_range(n)
            .map_err(|_| peer_out_of_memory(size, Self::CAPACITY, self.largest_free()))?;
        self.peak_end = self.peak_end.max(r.end);
        Ok((r.start, r.end))
    }

    #[inline]
    fn deallocate(&mut self, (start, end): Self::Handle, _size: u64, _stream: u16) -> Result<(), Error> {
        if start < end {
            self.inner.free_range(start..end);
        }
        Ok(())
    }

    fn peak_upstream(&self) -> u64 {
        self.peak_end * GRANULE
    }
}
