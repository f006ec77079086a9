//! RMM's `limiting_resource_adaptor`: a byte limit.

use crate::addr_map::Records;
use crate::check::Violation;
use crate::lock::Shared;
use crate::primitive::{AtomicU64, Ordering::Relaxed};
use crate::{Block, Error, Inspect, MemoryResource, Request, Result, Stream, Usage};

/// Refuses allocations that would take the bytes in use above a limit: RMM's
/// `limiting_resource_adaptor`.
///
/// ```text
///  allocate(req) ─► used + round(req) <= limit ? ─no─► Error::LimitExceeded
///                     │ yes: reserve (compare-exchange)
///                     ▼
///                  upstream ─error─► give the reservation back, return the error
///                     │ ok
///                     ▼
///                  table.insert(addr, charge)
///  deallocate(block) ─► table.freeing(addr) ─► upstream ─ok─► table.freed: used -= charge
///                       └ not there: Error::UnknownBlock  └ error: nothing changes
/// ```
///
/// Bytes are counted as RMM counts them: each size rounded up to the
/// granule (256 bytes, the alignment every resource guarantees). The
/// reservation is made before the upstream is asked, with a compare-exchange
/// loop, so concurrent callers can never take the total above the limit
/// together, and a refused or failed request changes nothing: there is
/// never a partial allocation. A limit of zero is valid and refuses every
/// request but zero-byte ones.
///
/// A free counts off what the block was *charged* when it was handed out,
/// kept in a table by address, never a figure derived from the size the
/// free states: an upstream that frees a block by a range of sizes (none
/// of memres's does; a user's may) would otherwise let the count drift,
/// below zero or under what is in use. A block the table does not hold (never handed out by
/// this adaptor, taken from the upstream directly, or freed already) is
/// [`Error::UnknownBlock`] before the upstream sees it. A free the upstream
/// refuses (a wrong size, say) keeps the block and its charge. The charge
/// stays in the table while the upstream frees the block, so a double free
/// made meanwhile (a stale copy of a block whose address was handed out
/// again) never hides the live block from its own free: both go to the
/// upstream, which tells them apart. A block freed straight to the
/// upstream, behind the adaptor's back, stays counted until the upstream
/// hands its address out again through the adaptor. The table
/// ([`AddrMap`](crate::addr_map::AddrMap)) costs one short lock and a probe
/// or two per call; the reservation stays lock-free.
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::Limiting;
/// use memres_core::{Error, MemoryResource, Request};
/// # use memres_core::testing::BumpUpstream;
/// let limited = Limiting::new(BumpUpstream::new(1 << 30), 4096);
/// let a = limited.allocate(Request::new(4000)?, &())?;
/// assert_eq!(limited.get_allocated_bytes(), 4096);
/// let err = limited.allocate(Request::new(1)?, &()).unwrap_err();
/// assert_eq!(err, Error::LimitExceeded { requested: 1, used: 4096, limit: 4096 });
/// limited.deallocate(a, &())?;
/// assert_eq!(limited.get_allocated_bytes(), 0);
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug)]
pub struct Limiting<R> {
    upstream: R,
    /// The most bytes that may be in use at once.
    limit: u64,
    /// Rounded bytes of live allocations plus reservations of calls in
    /// flight; never above `limit`.
    used: AtomicU64,
    /// What each live block handed out was charged, by address.
    charged: Shared<Records<u64>>,
}

impl<R> Limiting<R> {
    /// The granule sizes are rounded up to before they count.
    pub const GRANULE: u64 = crate::DEFAULT_ALIGNMENT;

    /// At most `limit` bytes in use through this adaptor.
    ///
    /// ```
    /// # use memres_core::adaptor::Limiting;
    /// let l = Limiting::new((), 1 << 20);
    /// assert_eq!(l.get_allocation_limit(), 1 << 20);
    /// ```
    pub fn new(upstream: R, limit: u64) -> Self {
        Limiting { upstream, limit, used: AtomicU64::new(0), charged: Shared::new(Records::new()) }
    }

    /// The limit in bytes (RMM's `get_allocation_limit`).
    ///
    /// ```
    /// # use memres_core::adaptor::Limiting;
    /// assert_eq!(Limiting::new((), 0).get_allocation_limit(), 0);
    /// ```
    pub fn get_allocation_limit(&self) -> u64 {
        self.limit
    }

    /// Bytes counted against the limit: the live blocks' sizes rounded up
    /// to [`GRANULE`](Self::GRANULE), and the requests in flight (RMM's
    /// `get_allocated_bytes`).
    ///
    /// ```
    /// # use memres_core::adaptor::Limiting;
    /// assert_eq!(Limiting::new((), 10).get_allocated_bytes(), 0);
    /// ```
    pub fn get_allocated_bytes(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// The upstream resource.
    ///
    /// ```
    /// # use memres_core::Inspect;
    /// # use memres_core::adaptor::Limiting;
    /// # use memres_core::testing::BumpUpstream;
    /// let l = Limiting::new(BumpUpstream::new(1 << 20), 10);
    /// assert_eq!(l.upstream().usage().held, 0);
    /// ```
    pub fn upstream(&self) -> &R {
        &self.upstream
    }

    fn charge(size: u64) -> u64 {
        size.div_ceil(Self::GRANULE) * Self::GRANULE
    }
}

/// A charge taken from the limit for an allocation under way, given back
/// when dropped; forgotten once the block is handed out.
struct Reservation<'a> {
    used: &'a AtomicU64,
    charge: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.used.fetch_sub(self.charge, Relaxed);
    }
}

impl<S: Stream + ?Sized, R: MemoryResource<S>> MemoryResource<S> for Limiting<R> {
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        // A zero-byte request is charged nothing, but its block is recorded
        // like any other unless it is the empty block: an upstream outside
        // the contract may answer it at an address, and its free must work.
        let charge = Self::charge(request.size());
        let mut used = self.used.load(Relaxed);
        loop {
            if charge > self.limit - used {
                return Err(Error::LimitExceeded { requested: request.size(), used, limit: self.limit });
            }
            match self.used.compare_exchange_weak(used, used + charge, Relaxed, Relaxed) {
                Ok(_) => break,
                Err(actual) => used = actual,
            }
        }
        // Refunded unless the block is handed out: on an error, on an
        // empty block (an upstream outside the contract), on an upstream
        // that panics.
        let reserved = Reservation { used: &self.used, charge };
        let block = self.upstream.allocate(request, stream)?;
        if block.is_empty() {
            return Ok(block);
        }
        if let Some(stale) = self.charged.with(|t| t.insert(block.addr(), charge)) {
            // The upstream handed out an address this adaptor still counts:
            // that block was freed (behind its back, or by a free not yet
            // back from the upstream), so its charge goes.
            self.used.fetch_sub(stale, Relaxed);
        }
        core::mem::forget(reserved);
        Ok(block)
    }

    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        if block.is_empty() {
            return self.upstream.deallocate(block, stream);
        }
        let addr = block.addr();
        // The charge stays while the upstream frees the block: on its error
        // or panic the block is still live and counted.
        let freeing = self.charged.with(|t| t.freeing(addr).map(|(f, _)| f));
        let freeing = freeing.ok_or(Error::UnknownBlock { addr })?;
        self.upstream.deallocate(block, stream)?;
        // Not there if an allocation at the address took its place (and
        // counted it off) or a double free took it out first.
        if let Some(charge) = self.charged.with(|t| t.freed(freeing)) {
            self.used.fetch_sub(charge, Relaxed);
        }
        Ok(())
    }
}

/// The upstream's figures; the checker is the layer's
/// ([`check_layer`](Limiting::check_layer)) and the upstream's.
impl<R: Inspect> Inspect for Limiting<R> {
    fn usage(&self) -> Usage {
        self.upstream.usage()
    }

    fn check(&self) -> core::result::Result<(), Violation> {
        self.check_layer()?;
        self.upstream.check()
    }
}

impl<R> Limiting<R> {
    /// Checks the adaptor's own invariants, not the upstream's (for an
    /// upstream without a checker, as a built stack's `limit` over the
    /// resources under it, checked each on its own): every block it holds
    /// is charged its size rounded up to [`GRANULE`](Self::GRANULE), so
    /// whole granules (none for a zero-byte request's); the bytes in use are the sum of those charges; they
    /// are at most the limit. Run it while no call is under way: a call
    /// in flight holds a charge no block has yet.
    ///
    /// # Errors
    ///
    /// The first broken invariant.
    ///
    /// # Time Complexity
    ///
    /// O(n) in the number of live blocks.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::adaptor::Limiting;
    /// use memres_core::{MemoryResource, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let limited = Limiting::new(BumpUpstream::new(1 << 20), 4096);
    /// let a = limited.allocate(Request::new(1000)?, &())?;
    /// limited.check_layer().unwrap();
    /// limited.deallocate(a, &())?;
    /// limited.check_layer().unwrap();
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn check_layer(&self) -> core::result::Result<(), Violation> {
        let charged = self.charged.with(|t| {
            let mut sum = 0u64;
            for (_, &c) in t.iter() {
                if c % Self::GRANULE != 0 {
                    return Err(Violation::new("a block charged part of a granule"));
                }
                sum = sum.checked_add(c).ok_or(Violation::new("the charges add up past u64::MAX"))?;
            }
            Ok(sum)
        })?;
        let used = self.used.load(Relaxed);
        if charged != used {
            return Err(Violation::new("bytes in use under the limit differ from the charges"));
        }
        if used > self.limit {
            return Err(Violation::new("bytes in use above the limit"));
        }
        Ok(())
    }
}

// SAFETY: `Limiting` hands out `R`'s blocks unchanged and gives them back only through
// `R::deallocate`.
unsafe impl<E, R: crate::copy::MemoryOf<E>> crate::copy::MemoryOf<E> for Limiting<R> {}

#[cfg(all(test, feature = "std", not(loom)))]
mod tests {
    use super::Limiting;
    use crate::testing::BumpUpstream;
    use crate::{MemoryResource, Request};

    /// What the layer's checker says of `l` with its charges and bytes in
    /// use set to `charged` and `used`; they are put back after.
    fn checked_with<R>(l: &Limiting<R>, addr: u64, charged: u64, used: u64) -> &'static str {
        let was = (l.charged.with(|t| *t.get(addr).unwrap()), l.get_allocated_bytes());
        l.charged.with(|t| t.insert(addr, charged));
        l.used.store(used, super::Relaxed);
        let got = l.check_layer();
        l.charged.with(|t| t.insert(addr, was.0));
        l.used.store(was.1, super::Relaxed);
        l.check_layer().expect("the counts are whole again");
        got.expect_err("the checker finds the change").what()
    }

    /// The layer's checker runs over an upstream without one (a built
    /// stack's, behind `DynResource`) and finds bytes in use that the
    /// charges of the blocks it holds, or the limit, do not allow.
    #[test]
    fn the_layer_checker_finds_bytes_in_use_that_the_charges_or_the_limit_do_not_allow() {
        let up: crate::DynResource = alloc::sync::Arc::new(BumpUpstream::new(1 << 20));
        let l = Limiting::new(up, 4096);
        let a = l.allocate(Request::new(1000).unwrap(), &()).unwrap();
        let b = l.allocate(Request::new(2000).unwrap(), &()).unwrap();
        l.check_layer().unwrap();
        let differ = "bytes in use under the limit differ from the charges";
        assert_eq!(checked_with(&l, a.addr(), 1024, 1024 + 2048 + 256), differ);
        assert_eq!(checked_with(&l, a.addr(), 1024, 2048), differ);
        assert_eq!(checked_with(&l, a.addr(), 1000, 1000 + 2048), "a block charged part of a granule");
        assert_eq!(checked_with(&l, a.addr(), 4096, 4096 + 2048), "bytes in use above the limit");
        l.deallocate(a, &()).unwrap();
        l.deallocate(b, &()).unwrap();
        l.check_layer().unwrap();
    }
}
