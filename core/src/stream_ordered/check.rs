//! The stream-ordered layer's figures and invariant checker, with the
//! inner algorithm's.

use super::{footprint, StreamOrdered};
use crate::check::Violation;
use crate::{Inspect, Stream, Usage};
use alloc::vec::Vec;

impl<A: Inspect, S: Stream> Inspect for StreamOrdered<A, S> {
    /// Used: the footprints of the live blocks (the inner blocks behind
    /// them, rounded up to 256); held: the inner algorithm's; free: the
    /// inner's free bytes and the listed blocks; largest free: the inner's
    /// or the longest listed block.
    fn usage(&self) -> Usage {
        let inner = self.inner.usage();
        let listed = self.lists.values().filter_map(|l| l.buckets.values().next_back());
        let longest = listed.flat_map(|q| q.iter().map(|(b, _)| b.size())).max().unwrap_or(0);
        Usage::new(self.live_bytes, inner.held, inner.peak_held, inner.largest_free.max(longest))
    }

    /// Checks the layer's invariants ([`check_layer`](StreamOrdered::check_layer))
    /// and the inner algorithm's.
    ///
    /// # Errors
    ///
    /// The first broken invariant.
    ///
    /// # Time Complexity
    ///
    /// O(n log n) in the number of live and listed blocks, and the inner
    /// algorithm's check.
    fn check(&self) -> core::result::Result<(), Violation> {
        self.check_layer()?;
        self.inner.check()
    }
}

impl<A, S: Stream> StreamOrdered<A, S> {
    /// Checks the layer's own invariants, not the inner algorithm's (for an
    /// inner algorithm without a checker, as a built stack's `stream` over
    /// the resources under it, checked each on its own): slots and counters
    /// agree, a live block is no longer than its inner block, listed blocks
    /// are keyed by their size and address and have a sequence number below
    /// their list's next one, live and listed blocks are pairwise disjoint.
    ///
    /// # Errors
    ///
    /// The first broken invariant.
    ///
    /// # Time Complexity
    ///
    /// O(n log n) in the number of live and listed blocks.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::stream_ordered::StreamOrdered;
    /// use memres_core::pool::CoalescingPool;
    /// use memres_core::testing::IdStream;
    /// use memres_core::{MemoryResourceMut, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let mut layer = StreamOrdered::new(CoalescingPool::new(BumpUpstream::new(1 << 20)));
    /// let b = layer.allocate(Request::new(1000)?, &IdStream(1))?;
    /// layer.deallocate(b, &IdStream(1))?;
    /// layer.check_layer().unwrap();
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn check_layer(&self) -> core::result::Result<(), Violation> {
        let mut ranges = Vec::new();
        let (mut live, mut live_bytes) = (0usize, 0u64);
        for s in self.slots.iter().filter(|s| s.live) {
            live += 1;
            live_bytes += footprint(&s.inner);
            if s.size > s.inner.size() || s.inner.is_empty() {
                return Err(Violation::new("live block larger than its inner block, or empty"));
            }
            ranges.push((s.inner.addr(), footprint(&s.inner)));
        }
        if live != self.live || live_bytes != self.live_bytes {
            return Err(Violation::new("live count or bytes disagree with the slots"));
        }
        let retired = self.slots.iter().filter(|s| s.generation == u32::MAX).count();
        if live + self.vacant.len() + retired != self.slots.len() {
            return Err(Violation::new("vacant list does not match the vacant slots"));
        }
        let mut seen = Vec::from_iter(self.vacant.iter().copied());
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != self.vacant.len()
            || seen
                .iter()
                .any(|&i| self.slots.get(i as usize).is_none_or(|s| s.live || s.generation == u32::MAX))
        {
            return Err(Violation::new("vacant list names a live or retired slot, or one twice"));
        }
        let mut listed = 0u64;
        for list in self.lists.values() {
            let mut count = 0;
            for (&size, q) in &list.buckets {
                if q.is_empty() {
                    return Err(Violation::new("empty bucket kept"));
                }
                if q.iter().zip(q.iter().skip(1)).any(|(a, b)| a.1 >= b.1) {
                    return Err(Violation::new("bucket not in free order"));
                }
                for &(block, seq) in q {
                    if footprint(&block) != size || block.is_empty() {
                        return Err(Violation::new("listed block in the wrong bucket"));
                    }
                    if seq >= list.next_seq {
                        return Err(Violation::new("listed block with a sequence number from the future"));
                    }
                    listed += size;
                    count += 1;
                    ranges.push((block.addr(), size));
                }
            }
            if count != list.len {
                return Err(Violation::new("list length disagrees with its buckets"));
            }
            if list.fence.as_ref().is_some_and(|f| f.1 > list.next_seq) {
                return Err(Violation::new("fence beyond the list's next sequence number"));
            }
        }
        if listed != self.listed_bytes {
            return Err(Violation::new("listed bytes disagree with the lists"));
        }
        ranges.sort_unstable();
        if ranges.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
            return Err(Violation::new("live or listed blocks overlap"));
        }
        Ok(())
    }
}
