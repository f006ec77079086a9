//! The binning resource: RMM's `binning_memory_resource`, with bins that can
//! be chosen from a measured size histogram.
//!
//! [`BinningResource`] routes each request to the smallest bin whose size
//! holds it and everything larger to its upstream. Bins are
//! [`FixedSizeResource`]s over the same upstream (one per power of two, as
//! RMM's constructor makes them, or sizes picked by a [`BinPlan`] from a
//! [`SizeHistogram`]), or any resource added with
//! [`add_bin`](BinningResource::add_bin) (or, for one whose figures cannot
//! be read, [`add_counted_bin`](BinningResource::add_counted_bin)).

mod plan;
#[cfg(test)]
mod tests;

pub use plan::{BinPlan, SizeHistogram};

use crate::addr_map::Records;
use crate::check::Violation;
use crate::fixed::{FixedConfig, FixedSizeResource};
use crate::{Block, Error, Inspect, MemoryResource, Request, Result, Shared, Stream, Usage};
use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt;

/// A resource given as a bin: one the binning resource can read the
/// figures of and check.
trait BinResource<S: Stream + ?Sized>: MemoryResource<S> + Inspect {}

impl<S: Stream + ?Sized, R: MemoryResource<S> + Inspect> BinResource<S> for R {}

/// One bin: a fixed-size resource made by the binning resource (which it can
/// release), a resource given by the caller, or one given with no figures
/// to read, whose blocks the binning resource counts itself.
enum Bin<'a, U, S: Stream + ?Sized> {
    Fixed(Shared<FixedSizeResource<U>>),
    Other(Box<dyn BinResource<S> + Send + Sync + 'a>),
    Counted(Box<dyn MemoryResource<S> + Send + Sync + 'a>, Tally),
}

/// The blocks handed out from a resource whose figures the binning resource
/// keeps itself (the upstream's large blocks, a counted bin's): their
/// footprints (sizes rounded up to 256), and each live one by address with
/// its size, so that a free is passed on only for a block that came from
/// there.
struct Tally {
    live: Shared<Live>,
}

/// A tally's blocks and bytes, under one lock. The bytes are counted in
/// 128 bits: the footprints of a resource of the user's may add up past
/// `u64::MAX` (four disjoint blocks may cover the address space), and
/// counted exactly they never wrap, nor undercount once they fall back;
/// [`Tally::usage`] reads them saturated.
struct Live {
    /// Each live block's footprint and size, by address.
    blocks: Records<(u64, u64)>,
    held: u128,
    peak: u128,
}

impl Tally {
    fn new() -> Self {
        Tally { live: Shared::new(Live { blocks: Records::new(), held: 0, peak: 0 }) }
    }

    /// A block of `from` for `request`, of at most `most` bytes, counted.
    #[inline]
    fn allocate<S, R>(&self, from: &R, request: Request, most: u64, stream: &S) -> Result<Block>
    where
        S: Stream + ?Sized,
        R: MemoryResource<S> + ?Sized,
    {
        let block = from.allocate(request, stream)?;
        if let Err(e) = answers(&block, request, most) {
            let _ = from.deallocate(block, stream);
            return Err(e);
        }
        let footprint = request.rounded_size(256);
        self.live.with(|l| {
            l.held += u128::from(footprint);
            l.peak = l.peak.max(l.held);
            if let Some((stale, _)) = l.blocks.insert(block.addr(), (footprint, block.size())) {
                // `from` freed that block (behind this resource's back, or
                // for a free not yet back from it) and handed its address
                // out again.
                l.held -= u128::from(stale);
            }
        });
        Ok(block)
    }

    /// Frees `block` to `to` if it is one of the tally's; `None` (nothing
    /// freed) if it is not.
    #[inline]
    fn deallocate<S, R>(&self, to: &R, block: Block, stream: &S) -> Option<Result<()>>
    where
        S: Stream + ?Sized,
        R: MemoryResource<S> + ?Sized,
    {
        // The footprint stays while `to` frees the block: on its error or
        // panic the block is still live.
        let (freeing, recorded) =
            self.live.with(|l| l.blocks.freeing(block.addr()).map(|(f, &(_, s))| (f, s)))?;
        let size = block.size();
        // Refused here, whatever `to` checks: an upstream that frees by
        // address took it, and a layer under it counted the size given.
        if size != recorded {
            return Some(Err(Error::SizeMismatch { addr: block.addr(), expected: recorded, given: size }));
        }
        Some(to.deallocate(block, stream).map(|()| {
            // Not there if an allocation at the address took its place (and
            // counted it off) or a double free took it out first.
            self.live.with(|l| {
                if let Some((footprint, _)) = l.blocks.freed(freeing) {
                    l.held -= u128::from(if crate::plant::TALLY_FREES_SIZE { size } else { footprint });
                }
            })
        }))
    }

    /// A leaf's figures: what was handed out through the tally.
    fn usage(&self) -> Usage {
        let saturated = |n: u128| u64::try_from(n).unwrap_or(u64::MAX);
        self.live.with(|l| Usage::leaf(saturated(l.held), saturated(l.peak)))
    }

    /// Whether a live block is of at most `size` bytes.
    fn has_live_block_of_at_most(&self, size: u64) -> bool {
        self.live.with(|l| l.blocks.iter().any(|(_, &(_, s))| s <= size))
    }

    /// Whether the bytes counted are the live blocks' footprints.
    fn check(&self) -> core::result::Result<(), Violation> {
        let (live, held) =
            self.live.with(|l| (l.blocks.iter().map(|(_, &(f, _))| u128::from(f)).sum::<u128>(), l.held));
        match live == held {
            true => Ok(()),
            false => Err(Violation::new("bytes counted are not the live blocks' footprints")),
        }
    }
}

/// Whether `block`, handed out whole as the request's block, holds it,
/// aligned as asked (a mask: the alignment is a power of two, `Request`'s
/// invariant), in at most `most` bytes (a bin's size: a free goes to the
/// bin its size routes to, and that of a longer block would never come
/// back); else the fault of whoever handed it out.
fn answers(block: &Block, request: Request, most: u64) -> Result<()> {
    let aligned = match block.addr() & (request.align() - 1) {
        0 => Ok(()),
        _ => Err(block.misbehaved("not aligned as asked")),
    };
    let routed = match block.size() > most {
        true => Err(block.misbehaved("longer than its bin")),
        false => Ok(()),
    };
    block.upstream_range(request.size()).and(aligned).and(routed).map(|_| ())
}

impl<U, S: Stream + ?Sized> Bin<'_, U, S>
where
    U: MemoryResource<S>,
{
    /// Allocates from the bin of `size` bytes.
    #[inline]
    fn allocate(&self, size: u64, request: Request, stream: &S) -> Result<Block> {
        match self {
            Bin::Fixed(f) => f.allocate(request, stream),
            Bin::Other(r) => {
                let block = r.allocate(request, stream)?;
                if let Err(e) = answers(&block, request, size) {
                    let _ = r.deallocate(block, stream);
                    return Err(e);
                }
                Ok(block)
            }
            Bin::Counted(r, tally) => tally.allocate(&**r, request, size, stream),
        }
    }

    /// `None`: a counted bin's free of a block it did not hand out.
    #[inline]
    fn deallocate(&self, block: Block, stream: &S) -> Option<Result<()>> {
        match self {
            Bin::Fixed(f) => Some(f.deallocate(block, stream)),
            Bin::Other(r) => Some(r.deallocate(block, stream)),
            Bin::Counted(r, tally) => tally.deallocate(&**r, block, stream),
        }
    }
}

impl<U, S: Stream + ?Sized> Bin<'_, U, S> {
    fn usage(&self) -> Usage {
        match self {
            Bin::Fixed(f) => f.usage(),
            Bin::Other(r) => r.usage(),
            Bin::Counted(_, tally) => tally.usage(),
        }
    }

    fn check(&self) -> core::result::Result<(), Violation> {
        match self {
            Bin::Fixed(f) => f.check(),
            Bin::Other(r) => r.check(),
            Bin::Counted(_, tally) => tally.check(),
        }
    }
}

impl<U, S: Stream + ?Sized> fmt::Debug for Bin<'_, U, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bin::Fixed(fixed) => fixed.fmt(f),
            Bin::Other(_) | Bin::Counted(..) => f.write_str("MemoryResource"),
        }
    }
}

/// Routes each request by size to the smallest bin that holds it, and
/// everything larger to its upstream: RMM's `binning_memory_resource`.
///
/// ```text
///   request(size) ──► sizes: [ 256 | 512 | 1024 | 3000 | 4096 ]   (sorted)
///                        smallest bin >= size (binary search)
///                  ┌───────┬──────┬──────┬──────┬──────┐
///                  ▼       ▼      ▼      ▼      ▼      │ none: larger
///                 bin     bin    bin    bin    bin     ▼ than every bin
///                 Fixed   Fixed  Fixed  Other  Fixed   upstream U
///                (own lock each)               │
///                  └── chunks from upstream U ─┘  (bins share U: U: Clone)
///   deallocate(block) ──► the same route, by block.size()
/// ```
///
/// - **Routing.** A request goes to the smallest bin whose size is at least
///   the request's size; a request larger than every bin goes to the
///   upstream. A free takes the same route by the block's size (the size as
///   requested), so a block goes back to the bin it came from. Alignment
///   does not route: a bin that cannot give the alignment asked refuses it
///   ([`Error::InvalidAlignment`] for fixed-size bins).
/// - **Bins and upstream share the upstream.** The bins the resource makes
///   are [`FixedSizeResource`]s over clones of `U`, so `U` is a handle:
///   `&R` or `Arc<R>` of a shareable resource (a `SimDevice`, a
///   [`Shared`] pool...). They take nothing until first used (RMM takes one
///   chunk per bin up front).
/// - **Thread safety: `&self`, a lock per bin.** The binning resource is a
///   [`MemoryResource`] (not a `&mut self` algorithm): routing reads only the
///   bin table, which is fixed once the resource is shared (adding a bin
///   takes `&mut self`). Each bin it makes is a [`Shared`] fixed-size
///   resource behind its own [`SpinLock`](crate::lock::SpinLock), so
///   threads working on different sizes never contend. Its critical
///   section is a pop or a push, except when the bin grows or is released:
///   the upstream's allocation or free of a chunk runs with the bin's lock
///   held, and threads of that size spin until it returns (an upstream that
///   calls back into the same bin spins forever, as documented for
///   [`Shared`]). The large path takes whatever lock the upstream has (and
///   that of its count of the large blocks, around the count only). Bins given by
///   the caller must be `Send + Sync` and bring their own locking. The
///   resource is `Send + Sync` when `U` is.
/// - **Bins from a histogram.** [`from_histogram`](Self::from_histogram)
///   picks the bin sizes from measured request sizes with a [`BinPlan`]:
///   bins for the sizes that are frequent enough, covering as many requests
///   as a padding budget allows, with the least padding.
///
/// # Examples
///
/// ```
/// # use memres_core::Inspect;
/// use memres_core::binning::BinningResource;
/// use memres_core::{MemoryResource, Request};
/// # use memres_core::testing::BumpUpstream;
/// let upstream = BumpUpstream::new(1 << 40);
/// // Bins of 256 B, 512 B, ... 1 MiB (2^8 ..= 2^20), larger requests upstream.
/// let bins = BinningResource::with_exponents(&upstream, 8, 20)?;
/// let small = bins.allocate(Request::new(600)?, &())?; // the 1 KiB bin
/// let large = bins.allocate(Request::new(3 << 20)?, &())?; // upstream
/// assert_eq!(upstream.usage().held, (128 << 10) + (3 << 20));
/// bins.deallocate(small, &())?;
/// bins.deallocate(large, &())?;
/// bins.release(&())?;
/// assert_eq!(upstream.usage().held, 0);
/// # Ok::<(), memres_core::Error>(())
/// ```
pub struct BinningResource<'a, U, S: Stream + ?Sized = ()> {
    upstream: U,
    /// The blocks larger than every bin, served by the upstream: a free
    /// that routes to the upstream is passed on only for one of them, never
    /// for a bin's memory (a bin over the same upstream holds chunks that
    /// the upstream would free whole).
    large: Tally,
    /// Bin sizes: ascending, distinct, non-zero; `sizes[i]` is `bins[i]`'s.
    sizes: Vec<u64>,
    /// The bins, in the order of `sizes`.
    bins: Vec<Bin<'a, U, S>>,
}

impl<'a, U, S: Stream + ?Sized> BinningResource<'a, U, S> {
    /// A resource with no bins: everything goes to `upstream` until bins are
    /// added.
    ///
    /// ```
    /// use memres_core::binning::BinningResource;
    /// # use memres_core::testing::BumpUpstream;
    /// let bins: BinningResource<_> = BinningResource::new(BumpUpstream::new(1 << 20));
    /// assert!(bins.bin_sizes().is_empty());
    /// ```
    pub fn new(upstream: U) -> Self {
        BinningResource { upstream, large: Tally::new(), sizes: Vec::new(), bins: Vec::new() }
    }

    /// RMM's constructor: one [`FixedSizeResource`] bin (128 blocks per
    /// chunk) for each power of two from `2^min_exponent` to
    /// `2^max_exponent`, over clones of `upstream`, which also serves every
    /// request above `2^max_exponent`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if `min_exponent > max_exponent`,
    /// `min_exponent < 8` (blocks are multiples of 256 bytes: the 256-byte
    /// bin already serves every smaller request) or a bin's chunk would
    /// overflow.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::binning::BinningResource;
    /// use memres_core::Error;
    /// # use memres_core::testing::BumpUpstream;
    /// let up = BumpUpstream::new(1 << 30);
    /// let bins = BinningResource::<_>::with_exponents(&up, 10, 12)?;
    /// assert_eq!(bins.bin_sizes(), &[1024, 2048, 4096]);
    /// assert!(matches!(BinningResource::<_>::with_exponents(&up, 12, 10), Err(Error::InvalidConfig { .. })));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn with_exponents(upstream: U, min_exponent: u32, max_exponent: u32) -> Result<Self>
    where
        U: MemoryResource<S> + Clone,
    {
        if min_exponent > max_exponent {
            return Err(Error::InvalidConfig { what: "smallest bin exponent above the largest" });
        }
        if min_exponent < 8 {
            return Err(Error::InvalidConfig {
                what: "smallest bin exponent below 8 (bins hold multiples of 256 bytes)",
            });
        }
        if max_exponent > 62 {
            return Err(Error::InvalidConfig { what: "largest bin exponent above 62" });
        }
        let mut bins = Self::new(upstream);
        for e in min_exponent..=max_exponent {
            bins.add_fixed_bin(FixedConfig::new(1 << e))?;
        }
        Ok(bins)
    }

    /// Bins chosen by `plan` from a histogram of request sizes (see
    /// [`BinPlan::choose`]): one [`FixedSizeResource`] per chosen size over
    /// clones of `upstream`, which also serves everything larger.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a plan whose bins could not all be made,
    /// whatever the histogram holds (an empty one too): blocks per chunk 0
    /// or above [`FixedConfig::MAX_BLOCKS_PER_CHUNK`], or a chunk of the
    /// largest bin size it allows ([`BinPlan::max_bin_size`] rounded down to
    /// 256) above [`Request::MAX_SIZE`]. Nothing is taken from `upstream`.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::binning::{BinPlan, BinningResource, SizeHistogram};
    /// # use memres_core::testing::BumpUpstream;
    /// // A workload of 512-byte and 4 KiB requests, and a few odd sizes:
    /// // 1000 rides in the 4 KiB bin, 70 000 goes upstream.
    /// let sample = [512; 900].into_iter().chain([4096; 900]).chain([1000, 70_000]);
    /// let hist: SizeHistogram = sample.collect();
    /// let up = BumpUpstream::new(1 << 30);
    /// let bins = BinningResource::<_>::from_histogram(&up, &hist, &BinPlan::new())?;
    /// assert_eq!(bins.bin_sizes(), &[512, 4096]);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn from_histogram(upstream: U, histogram: &SizeHistogram, plan: &BinPlan) -> Result<Self>
    where
        U: MemoryResource<S> + Clone,
    {
        plan.validate()?;
        let mut bins = Self::new(upstream);
        for size in plan.choose(histogram) {
            bins.add_fixed_bin(FixedConfig::new(size).blocks_per_chunk(plan.blocks()))?;
        }
        Ok(bins)
    }

    /// Adds a bin of `size` bytes served by `resource`: requests of up to
    /// `size` bytes that no smaller bin holds go to it. Its figures count
    /// in the binning resource's [`Usage`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if `size` is zero or above
    /// [`Request::MAX_SIZE`], a bin of that size exists, or a live block
    /// of at most `size` bytes came from the next bin up (or the upstream,
    /// for a bin above all): its free would come to the new bin. A bin
    /// given with [`add_bin`](Self::add_bin) cannot tell its live blocks:
    /// add no bin below it while it has one of the new bin's sizes. The
    /// resource is unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::binning::BinningResource;
    /// use memres_core::pool::CoalescingPool;
    /// use memres_core::{Error, MemoryResource, Request, Shared};
    /// # use memres_core::testing::BumpUpstream;
    /// let up = BumpUpstream::new(1 << 30);
    /// let mut bins: BinningResource<_> = BinningResource::new(&up);
    /// bins.add_bin(64 << 10, Shared::new(CoalescingPool::new(&up)))?;
    /// assert!(matches!(bins.add_bin(64 << 10, Shared::new(CoalescingPool::new(&up))), Err(Error::InvalidConfig { .. })));
    /// let b = bins.allocate(Request::new(5000)?, &())?; // the pool bin
    /// bins.deallocate(b, &())?;
    /// # Ok::<(), Error>(())
    /// ```
    pub fn add_bin<R>(&mut self, size: u64, resource: R) -> Result<()>
    where
        R: MemoryResource<S> + Inspect + Send + Sync + 'a,
    {
        self.insert(size, Bin::Other(Box::new(resource)))
    }

    /// Adds a bin of `size` bytes served by `resource`, whose figures cannot
    /// be read (a [`DynResource`](crate::DynResource), a stack built from a
    /// string): the binning resource counts what it hands out through it,
    /// as it counts the upstream's large blocks (each block used and held
    /// at its footprint), and passes a free on to it only for a block that
    /// came from it.
    ///
    /// # Errors
    ///
    /// As [`add_bin`](Self::add_bin).
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::binning::BinningResource;
    /// use memres_core::pool::CoalescingPool;
    /// use memres_core::{DynResource, Inspect, MemoryResource, Request, Shared};
    /// # use memres_core::testing::BumpUpstream;
    /// use std::sync::Arc;
    /// let pool: DynResource = Arc::new(Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 30))));
    /// let mut bins: BinningResource<_> = BinningResource::new(BumpUpstream::new(1 << 30));
    /// bins.add_counted_bin(64 << 10, pool)?;
    /// let b = bins.allocate(Request::new(5000)?, &())?; // the pool bin
    /// assert_eq!((bins.usage().used, bins.usage().held), (5120, 5120));
    /// bins.deallocate(b, &())?;
    /// assert_eq!(bins.usage().held, 0);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn add_counted_bin<R>(&mut self, size: u64, resource: R) -> Result<()>
    where
        R: MemoryResource<S> + Send + Sync + 'a,
    {
        self.insert(size, Bin::Counted(Box::new(resource), Tally::new()))
    }

    /// Adds a [`FixedSizeResource`] bin over a clone of the upstream, of
    /// `config`'s block size (RMM's `add_bin(size)` with no resource).
    ///
    /// # Errors
    ///
    /// As [`add_bin`](Self::add_bin), and [`Error::InvalidConfig`] for a
    /// configuration [`FixedSizeResource`] refuses.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::binning::BinningResource;
    /// use memres_core::fixed::FixedConfig;
    /// use memres_core::{Inspect, MemoryResource, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let up = BumpUpstream::new(1 << 30);
    /// let mut bins: BinningResource<_> = BinningResource::new(&up);
    /// bins.add_fixed_bin(FixedConfig::new(768).blocks_per_chunk(16))?;
    /// let b = bins.allocate(Request::new(700)?, &())?;
    /// assert_eq!(up.usage().held, 768 * 16);
    /// assert_eq!(bins.fixed_bin(768).unwrap().with(|f| f.used_blocks()), 1);
    /// assert_eq!(bins.usage().used, 768);
    /// bins.deallocate(b, &())?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn add_fixed_bin(&mut self, config: FixedConfig) -> Result<()>
    where
        U: MemoryResource<S> + Clone,
    {
        let size = config.block_size();
        self.vacancy(size)?;
        let fixed = FixedSizeResource::try_new(self.upstream.clone(), config.initial_chunks(0))?;
        self.insert(size, Bin::Fixed(Shared::new(fixed)))
    }

    /// Where a bin of `size` goes in the table.
    fn vacancy(&self, size: u64) -> Result<usize> {
        if size == 0 || size > Request::MAX_SIZE {
            return Err(Error::InvalidConfig { what: "bin size is zero or too large" });
        }
        match self.sizes.binary_search(&size) {
            Ok(_) => Err(Error::InvalidConfig { what: "a bin of this size exists" }),
            Err(i) => Ok(i),
        }
    }

    fn insert(&mut self, size: u64, bin: Bin<'a, U, S>) -> Result<()> {
        let i = self.vacancy(size)?;
        // The frees of the blocks of up to `size` bytes that the next bin
        // up (or the upstream) handed out would come to the new bin, which
        // never had them: they could never be freed.
        let takes_over = match self.bins.get(i) {
            None => self.large.has_live_block_of_at_most(size),
            Some(Bin::Fixed(f)) => f.with(|f| f.has_live_block_of_at_most(size)),
            Some(Bin::Counted(_, tally)) => tally.has_live_block_of_at_most(size),
            // Its blocks cannot be read: the caller's to keep apart.
            Some(Bin::Other(_)) => false,
        };
        if takes_over {
            return Err(Error::InvalidConfig { what: "a live block would be freed to the new bin" });
        }
        self.sizes.insert(i, size);
        self.bins.insert(i, bin);
        Ok(())
    }

    /// The bin sizes, ascending.
    ///
    /// ```
    /// # use memres_core::binning::BinningResource;
    /// # use memres_core::testing::BumpUpstream;
    /// let up = BumpUpstream::new(1 << 30);
    /// assert_eq!(BinningResource::<_>::with_exponents(&up, 8, 9)?.bin_sizes(), &[256, 512]);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn bin_sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// The upstream (the large path, and the source of the bins it made).
    ///
    /// ```
    /// # use memres_core::Inspect;
    /// # use memres_core::binning::BinningResource;
    /// # use memres_core::testing::BumpUpstream;
    /// let bins: BinningResource<_> = BinningResource::new(BumpUpstream::new(1 << 20));
    /// assert_eq!(bins.upstream().usage().held, 0);
    /// ```
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// The fixed-size bin of `size` bytes that this resource made, if any
    /// (to read its figures or check it).
    ///
    /// ```
    /// # use memres_core::binning::BinningResource;
    /// # use memres_core::testing::BumpUpstream;
    /// let up = BumpUpstream::new(1 << 30);
    /// let bins = BinningResource::<_>::with_exponents(&up, 8, 9)?;
    /// assert_eq!(bins.fixed_bin(512).unwrap().with(|f| f.block_size()), 512);
    /// assert!(bins.fixed_bin(1024).is_none());
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn fixed_bin(&self, size: u64) -> Option<&Shared<FixedSizeResource<U>>> {
        match &self.bins[self.sizes.binary_search(&size).ok()?] {
            Bin::Fixed(f) => Some(f),
            Bin::Other(_) | Bin::Counted(..) => None,
        }
    }

    /// The index of the bin that serves `size` bytes, or `None` for the
    /// upstream.
    #[inline]
    fn route(&self, size: u64) -> Option<usize> {
        let i = self.sizes.partition_point(|&s| s < size);
        (i < self.sizes.len()).then_some(i)
    }

    /// The size of the bin that serves a request of `size` bytes, or `None`
    /// if the upstream serves it.
    ///
    /// ```
    /// # use memres_core::binning::BinningResource;
    /// # use memres_core::testing::BumpUpstream;
    /// let up = BumpUpstream::new(1 << 30);
    /// let bins = BinningResource::<_>::with_exponents(&up, 8, 10)?;
    /// assert_eq!(bins.bin_for(300), Some(512));
    /// assert_eq!(bins.bin_for(1025), None);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn bin_for(&self, size: u64) -> Option<u64> {
        self.route(size).map(|i| self.sizes[i])
    }

    /// The bytes held from the upstream, the fixed-size bins' chunks and
    /// the large blocks, and those counted for the live blocks of the
    /// counted bins whose sizes `counts` picks: what this resource holds as
    /// a layer of a stack, where a bin with a layer under it leaves its
    /// blocks to that layer.
    pub(crate) fn held_as_layer(&self, counts: impl Fn(u64) -> bool) -> u64 {
        let bins = self.sizes.iter().zip(&self.bins).map(|(&size, bin)| match bin {
            Bin::Fixed(f) => f.usage().held,
            Bin::Counted(_, tally) if counts(size) => tally.usage().held,
            Bin::Other(_) | Bin::Counted(..) => 0,
        });
        // Saturating, as `Usage::plus`: a tally's figures may be any.
        bins.fold(self.large.usage().held, u64::saturating_add)
    }

    /// Gives every wholly free chunk of the fixed-size bins this resource
    /// made back to the upstream; returns the bytes given back.
    ///
    /// # Errors
    ///
    /// The first error of a bin's [`release`](FixedSizeResource::release);
    /// the other bins are still released.
    ///
    /// # Examples
    ///
    /// ```
    /// # use memres_core::binning::BinningResource;
    /// # use memres_core::{MemoryResource, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let up = BumpUpstream::new(1 << 30);
    /// let bins = BinningResource::with_exponents(&up, 8, 8)?;
    /// let b = bins.allocate(Request::new(10)?, &())?;
    /// bins.deallocate(b, &())?;
    /// assert_eq!(bins.release(&())?, 256 * 128);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn release(&self, stream: &S) -> Result<u64>
    where
        U: MemoryResource<S>,
    {
        let mut freed = 0;
        let mut first_error = None;
        for bin in &self.bins {
            if let Bin::Fixed(f) = bin {
                match f.with(|f| f.release(stream)) {
                    Ok(n) => freed += n,
                    Err(e) => first_error = first_error.or(Some(e)),
                }
            }
        }
        first_error.map_or(Ok(freed), Err)
    }
}

impl<U, S: Stream + ?Sized> Inspect for BinningResource<'_, U, S> {
    /// The bins' figures and the large blocks' (each its footprint, used and
    /// held) added up: the peak held is the sum of the parts' peaks (at
    /// least the true peak).
    ///
    /// ```
    /// # use memres_core::binning::BinningResource;
    /// # use memres_core::{Inspect, MemoryResource, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let up = BumpUpstream::new(1 << 30);
    /// let bins = BinningResource::with_exponents(&up, 8, 8)?;
    /// let (small, large) = (bins.allocate(Request::new(10)?, &())?, bins.allocate(Request::new(1000)?, &())?);
    /// let u = bins.usage();
    /// assert_eq!((u.used, u.held), (256 + 1024, 256 * 128 + 1024));
    /// # bins.deallocate(small, &())?;
    /// # bins.deallocate(large, &())?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    fn usage(&self) -> Usage {
        self.bins.iter().map(Bin::usage).fold(self.large.usage(), Usage::plus)
    }

    /// Runs the invariant checker of every bin, and checks the bin table
    /// (sizes ascending, distinct, non-zero; fixed-size bins at least their
    /// size) and the bytes counted for the large blocks and counted bins
    /// (the live blocks' footprints).
    ///
    /// ```
    /// # use memres_core::binning::BinningResource;
    /// # use memres_core::Inspect;
    /// # use memres_core::testing::BumpUpstream;
    /// let up = BumpUpstream::new(1 << 30);
    /// assert!(BinningResource::<_>::with_exponents(&up, 8, 12)?.check().is_ok());
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    fn check(&self) -> core::result::Result<(), Violation> {
        if self.sizes.len() != self.bins.len() {
            return Err(Violation::new("bin table and bin sizes differ in length"));
        }
        if self.sizes.first() == Some(&0) || self.sizes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Violation::new("bin sizes not ascending, distinct and non-zero"));
        }
        for (size, bin) in self.sizes.iter().zip(&self.bins) {
            if let Bin::Fixed(f) = bin {
                if f.with(|f| f.block_size()) < *size {
                    return Err(Violation::new("fixed-size bin smaller than its size"));
                }
            }
            bin.check()?;
        }
        self.large.check()
    }
}

impl<U, S> MemoryResource<S> for BinningResource<'_, U, S>
where
    S: Stream + ?Sized,
    U: MemoryResource<S>,
{
    /// # Errors
    ///
    /// The bin's or the upstream's error.
    ///
    /// # Time Complexity
    ///
    /// O(log bins) to route, plus the bin's or upstream's cost.
    #[inline]
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        match self.route(request.size()) {
            Some(i) => self.bins[i].allocate(self.sizes[i], request, stream),
            None => self.large.allocate(&self.upstream, request, u64::MAX, stream),
        }
    }

    /// # Errors
    ///
    /// The bin's or the upstream's error. A block freed with another size
    /// than it was asked for may reach the wrong bin: the error is then
    /// the one that bin gives to a foreign block. One that reaches the
    /// upstream's large blocks or its counted bin with another size is
    /// [`Error::SizeMismatch`], nothing freed. One too large for every
    /// bin that did not come from the upstream through this resource, or
    /// one routed to a counted bin that did not come from it, is refused
    /// here ([`Error::UnknownBlock`], or [`Error::SizeMismatch`] for a
    /// fixed bin's block), nothing freed.
    #[inline]
    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let freed = match self.route(block.size()) {
            Some(i) => self.bins[i].deallocate(block, stream),
            None => self.large.deallocate(&self.upstream, block, stream),
        };
        freed.unwrap_or_else(|| Err(self.foreign(block)))
    }
}

impl<U, S: Stream + ?Sized> BinningResource<'_, U, S> {
    /// Why `block`, routed to the upstream's large blocks or to a counted
    /// bin, is none of theirs: a fixed bin's block freed with a larger size,
    /// or no block of this resource.
    #[cold]
    fn foreign(&self, block: Block) -> Error {
        let addr = block.addr();
        for bin in &self.bins {
            if let Bin::Fixed(f) = bin {
                if let Some(expected) = f.with(|f| f.expected_size_at(addr)) {
                    return Error::SizeMismatch { addr, expected, given: block.size() };
                }
            }
        }
        Error::UnknownBlock { addr }
    }
}

impl<U, S: Stream + ?Sized> fmt::Debug for BinningResource<'_, U, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for (size, bin) in self.sizes.iter().zip(&self.bins) {
            m.entry(size, bin);
        }
        m.finish()
    }
}
