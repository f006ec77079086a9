//! Reservable address spaces: reserve a large range of addresses once, then
//! map physical memory into granules of it on demand.
//!
//! This is what CUDA's virtual memory management (`cuMemAddressReserve`,
//! `cuMemMap`, `cuMemUnmap`) and `mmap` with `PROT_NONE` offer, and what a
//! [`VirtualPool`](crate::vpool::VirtualPool) is built on: one address range
//! in which free space never strands between upstream chunks, because there
//! are no chunks, only granules mapped where live blocks are.
//!
//! [`ReservableSpace`] is the trait a backend implements; [`CountingSpace`]
//! is a space of bare numbers that checks every call, for examples and tests,
//! on the bookkeeping of [`CommitLedger`], which simulated spaces share
//! (and which can hold memory in pieces, as CUDA holds physical handles).

#[cfg(feature = "alloc")]
mod counting;
mod ledger;
#[cfg(feature = "alloc")]
mod pieces;
#[cfg(feature = "alloc")]
pub use counting::CountingSpace;
pub use ledger::CommitLedger;

use crate::{Range, Result, Stream};

/// An address space in which ranges are reserved first and backed by
/// physical memory later, granule by granule.
///
/// ```text
///  reserve(len) ─► ┌──────────────── reservation ─────────────────┐
///                  │ granule │ granule │ granule │ granule │ ...  │
///  commit(r)   ─►  │ mapped  │ mapped  │         │ mapped  │      │
///  decommit(r, s)  │         │   ◄── unmapped after the work on s │
///                  └──────────────────────────────────────────────┘
///  release(reservation): every granule decommitted first
/// ```
///
/// # Contract
///
/// - [`granule`](Self::granule) is a power of two of at least 256 bytes and
///   never changes. Reservations, and the ranges given to `commit` and
///   `decommit`, start and end on granule boundaries.
/// - [`reserve`](Self::reserve) returns a fresh range of exactly the asked
///   length, disjoint from every other live reservation, with nothing
///   committed in it.
/// - [`commit`](Self::commit) backs a range of one reservation, none of it
///   committed yet, with physical memory; when it returns `Ok` the memory is
///   usable by work on any stream. It may fail (out of physical memory, a
///   driver error, an injected fault); **a failed commit commits nothing**.
///   `commit` and `decommit` work on any granule-aligned subrange: a backend
///   whose mappings cannot be split (CUDA's `cuMemUnmap` takes whole
///   mappings) maps each granule on its own.
/// - [`decommit`](Self::decommit) takes the physical memory of a wholly
///   committed range away, **ordered after the work submitted to `stream`
///   so far**: the backend must not unmap before that work has completed. A
///   CUDA backend synchronizes the stream and then unmaps (what PyTorch's
///   expandable segments do), or defers the unmap behind an event recorded
///   on the stream and completes it before the range is committed again.
///   When `decommit` returns, the range counts as uncommitted and may be
///   committed again. A failed decommit leaves the range committed, but
///   for one that failed after it took part of the range and could not
///   undo that: it returns [`Error::Backend`](crate::Error::Backend) whose
///   `what` is [`DECOMMITTED_IN_PART`], and a commit of each granule of the
///   range then commits those it took and refuses the others as committed
///   already.
///
///   A method that panics is taken as one that failed: a commit or
///   decommit that panics leaves its range as it was. (A pool cannot
///   count on that from a safe trait: `VirtualPool` asks each granule of
///   such a range afterwards, as after [`DECOMMITTED_IN_PART`].)
/// - [`decommit_for_commit`](Self::decommit_for_commit) is a decommit by a
///   caller that commits next (a pool making room for a block): the space
///   may keep the physical memory for those commits (CUDA: the handles it
///   unmapped, mapped again without `cuMemCreate`) and counts it as its
///   own until [`release_kept`](Self::release_kept), which the caller calls
///   once its commits are done.
/// - [`release`](Self::release) gives a whole reservation back; it must
///   have nothing committed.
///
/// The caller's side of the stream contract: the `stream` given to
/// `decommit` is one after whose submitted work no other work uses the
/// range. A [`VirtualPool`](crate::vpool::VirtualPool) passes the stream of
/// the `allocate` or `deallocate` call in progress, under the same rule as every plain
/// memres pool: memory freed on one stream is reused by the next request on
/// any stream, so the caller (or a stream-ordered layer above the pool)
/// orders the work on a freed block before the work on the stream of later
/// calls.
///
/// `decommit` is generic over the stream type, so one space serves pools of
/// every stream type: what any [`Stream`] offers (`synchronize`, or `record`
/// and `query`) is enough to honour the ordering. The trait is therefore not
/// object safe; pools hold their space by type.
///
/// The methods take `&self` so that the space can be shared and inspected
/// while a pool uses it; the trait is implemented for `&T`, and for `Box<T>`
/// and `Arc<T>` with the `alloc` feature.
///
/// # Examples
///
/// ```
/// # #[cfg(not(feature = "alloc"))] fn main() {}
/// # #[cfg(feature = "alloc")] fn main() -> Result<(), memres_core::Error> {
/// use memres_core::vmem::{CountingSpace, ReservableSpace};
/// let space = CountingSpace::new(1 << 30, 2 << 20);
/// let r = space.reserve(8 << 20)?;
/// let g = space.granule();
/// let first = memres_core::Range::new(r.start(), 2 * g).unwrap();
/// space.commit(first)?;
/// assert_eq!(space.committed_bytes(), 4 << 20);
/// space.decommit(first, &())?;
/// space.release(r)?;
/// # Ok(())
/// # }
/// ```
pub trait ReservableSpace {
    /// The granule: the unit of reservation, commit and decommit (a power of
    /// two, at least 256 bytes).
    fn granule(&self) -> u64;

    /// Reserves `len` bytes of addresses (a multiple of the granule), with
    /// nothing committed.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSize`](crate::Error::InvalidSize) for a length of zero
    /// or not a multiple of the granule;
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the address
    /// space has no free range that long (a reservation larger than the
    /// whole address space included); a backend error otherwise.
    fn reserve(&self, len: u64) -> Result<Range>;

    /// Gives back a reservation made by [`reserve`](Self::reserve), whole.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownBlock`](crate::Error::UnknownBlock) if `range` is not
    /// a live reservation; [`Error::InvalidConfig`](crate::Error::InvalidConfig)
    /// if part of it is still committed. Nothing changes on error.
    fn release(&self, range: Range) -> Result<()>;

    /// Backs `range` (granule-aligned, inside one reservation, none of it
    /// committed) with physical memory.
    ///
    /// # Errors
    ///
    /// Out of physical memory or a backend failure; then nothing is
    /// committed. Misuse (a range not aligned, outside the reservations, or
    /// partly committed already) is [`Error::InvalidConfig`](crate::Error::InvalidConfig),
    /// told before any other failure: a pool commits the granules of a
    /// decommit that failed half-way ([`DECOMMITTED_IN_PART`]) one by one,
    /// and counts those refused so as the ones the space kept.
    fn commit(&self, range: Range) -> Result<()>;

    /// Takes the physical memory of `range` (granule-aligned, wholly
    /// committed) away once the work submitted to `stream` so far has
    /// completed.
    ///
    /// # Errors
    ///
    /// A backend failure, or misuse as for [`commit`](Self::commit); then
    /// the range stays committed.
    fn decommit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()>;

    /// As [`decommit`](Self::decommit), for a caller about to
    /// [`commit`](Self::commit) other granules (a pool making room for a
    /// block): the space may keep the physical memory for those commits
    /// rather than give it back and ask for it again, until
    /// [`release_kept`](Self::release_kept). Kept memory is the space's and
    /// counts as what it holds. The default: `decommit`.
    ///
    /// # Errors
    ///
    /// As [`decommit`](Self::decommit).
    fn decommit_for_commit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
        self.decommit(range, stream)
    }

    /// Gives back the physical memory that
    /// [`decommit_for_commit`](Self::decommit_for_commit) kept and no
    /// commit has taken since; the caller's commits are done. The default:
    /// nothing kept, nothing to do.
    fn release_kept(&self) {}

    /// The part of `range` (committed granules, none of them in use) to
    /// decommit so as to give back at least `want` bytes of it, the highest
    /// first: less if all of `range` gives back less, `None` if none of it
    /// would give anything back. A space that holds its memory in pieces
    /// longer than a granule (CUDA's physical handles) frees only whole
    /// pieces, so it answers whole pieces that lie inside `range`. A
    /// [`VirtualPool`](crate::vpool::VirtualPool) decommits only what this
    /// returns (clipped to `range`). The default: the highest `want` bytes
    /// of `range`, all of it if shorter.
    fn releasable(&self, range: Range, want: u64) -> Option<Range> {
        highest(range, want)
    }
}

/// The `what` of the [`Error::Backend`](crate::Error::Backend) of a
/// [`decommit`](ReservableSpace::decommit) that failed half-way and could
/// not commit again all that it had decommitted: part of the range is
/// decommitted, the rest committed. A
/// [`VirtualPool`](crate::vpool::VirtualPool) then commits each granule of
/// the range again (the space refuses those it kept as committed already),
/// so that what it counts is what the space holds.
///
/// ```
/// use memres_core::vmem::DECOMMITTED_IN_PART;
/// use memres_core::Error;
/// let e = Error::Backend { code: 1, what: DECOMMITTED_IN_PART };
/// assert!(matches!(e, Error::Backend { what, .. } if what == DECOMMITTED_IN_PART));
/// ```
pub const DECOMMITTED_IN_PART: &str =
    "decommit failed half-way, and part of the range could not be mapped again: it is decommitted";

/// The highest `want` bytes of `range`, all of it if shorter: what a space
/// that frees any granule answers to [`ReservableSpace::releasable`] (the
/// trait's default, for a space that answers otherwise only at times);
/// `None` where that is nothing (an empty range, or `want` 0).
///
/// ```
/// use memres_core::vmem::highest;
/// use memres_core::Range;
/// let r = Range::new(1 << 20, 4 << 20).unwrap();
/// assert_eq!(highest(r, 1 << 20), Range::new(4 << 20, 1 << 20));
/// assert_eq!(highest(r, u64::MAX), Some(r));
/// assert_eq!(highest(r, 0), None);
/// ```
#[inline]
pub fn highest(range: Range, want: u64) -> Option<Range> {
    let len = want.min(range.len());
    Range::new(range.end() - len, len).filter(|r| !r.is_empty())
}

macro_rules! forward {
    ($($ty:ty),*) => {$(
        impl<T: ReservableSpace + ?Sized> ReservableSpace for $ty {
            #[inline]
            fn granule(&self) -> u64 {
                (**self).granule()
            }
            #[inline]
            fn reserve(&self, len: u64) -> Result<Range> {
                (**self).reserve(len)
            }
            #[inline]
            fn release(&self, range: Range) -> Result<()> {
                (**self).release(range)
            }
            #[inline]
            fn commit(&self, range: Range) -> Result<()> {
                (**self).commit(range)
            }
            #[inline]
            fn decommit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
                (**self).decommit(range, stream)
            }
            #[inline]
            fn decommit_for_commit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
                (**self).decommit_for_commit(range, stream)
            }
            #[inline]
            fn release_kept(&self) {
                (**self).release_kept()
            }
            #[inline]
            fn releasable(&self, range: Range, want: u64) -> Option<Range> {
                (**self).releasable(range, want)
            }
        }
    )*};
}

forward!(&T);
#[cfg(feature = "alloc")]
forward!(alloc::boxed::Box<T>, alloc::sync::Arc<T>);
