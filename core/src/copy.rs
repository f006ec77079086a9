//! Moving bytes: the small trait a backend implements so that containers can
//! fill and read the memory its resources hand out, and the promise a
//! resource makes that its blocks are such memory.
//!
//! ```text
//!  CopyEngine<S>            copies into, out of and within memory of one kind
//!    type Kind              the engine that names that kind (Self, or E for &E)
//!  unsafe MemoryOf<E>       a resource's promise: its blocks are memory E may touch,
//!                           and E stays sound on them after others free them
//!  AssumeMemoryOf<R, E>     the same promise made by hand (an unsafe constructor)
//!  LiveRanges               the live allocations an engine checks its accesses against
//! ```
//!
//! A container pairs a resource `R` with an engine `E` only where
//! `R: MemoryOf<E::Kind>`: host memory with the host's `memcpy`, CUDA memory
//! with CUDA's copies, never the numbers of a simulated device with either.
//!
//! # Checked access
//!
//! A container cannot stop other code from freeing its block through the
//! resource ([`Block`] is `Copy`, `deallocate` is safe) or ending the
//! resource under it. Where an engine's memory is host-addressable, it
//! therefore touches a range only while the range lies in one allocation
//! that is live at that moment, checked in a [`LiveRanges`] table under the
//! same lock under which the resources free; anything else is an
//! [`Error::NotLive`](crate::Error::NotLive) that touches nothing. A stale
//! container then reads or writes at worst bytes that another holder now
//! has (wrong data), never freed memory.

use crate::{Block, MemoryResource, Request, Result, Stream};
use core::fmt;
use core::marker::PhantomData;

/// Copies between host memory and a backend's memory, ordered on a stream.
///
/// Copies that involve a host slice ([`copy_from_host`](Self::copy_from_host),
/// [`copy_to_host`](Self::copy_to_host)) have completed when they return, so
/// the slice may be reused at once. Copies within the backend's memory
/// ([`copy`](Self::copy), [`fill`](Self::fill)) are only ordered on the
/// stream: later work on the stream sees their result.
///
/// The methods take ranges of memory the caller *holds*: inside a block that
/// a resource `R:` [`MemoryOf<Self::Kind>`](MemoryOf) handed out to the
/// caller and that the caller has not given back, or other live memory of
/// the backend. Other code may have freed such a block meanwhile;
/// [`MemoryOf`] makes the calls sound then too (an engine of host-addressable
/// memory checks every access, see [checked access](self#checked-access)).
///
/// The bytes are right when no other work on the ranges runs unordered with
/// `stream`. That order is the caller's to keep, but not a condition of
/// soundness: [`Stream`] is a safe trait, and a stream whose `wait` does
/// nothing leaves work unordered ([implementing](#implementing)).
///
/// # Implementing
///
/// The trait is safe to implement, and its callers (the containers, in
/// safe code) promise no more than the methods' `# Safety` sections say.
/// What they cannot promise is the engine's to answer for, in its own
/// `unsafe` code:
///
/// - **Blocks freed by other code.** The ranges are in blocks of resources
///   that are [`MemoryOf<Self::Kind>`](MemoryOf), whose promise is that the
///   engine named by `Kind` stays sound on them after other code frees
///   them. An engine whose `Kind` names another engine (a wrapper of
///   `memres_sim::HostCopy` with `type Kind = HostCopy`) is handed those
///   ranges too, and takes on that engine's duties: it checks its accesses
///   as that engine does ([checked access](self#checked-access)), most
///   simply by forwarding them to it.
/// - **Ranges that overlap in [`copy`](Self::copy).** Two blocks the caller
///   holds overlap once other code has freed one and the resource has
///   handed its address out again, to the same caller: a container that
///   grows or is cloned then copies between them. `copy` copies such
///   ranges as `memmove` does ([`core::ptr::copy`], never
///   `copy_nonoverlapping`), or refuses them with an error and touches
///   nothing (`memres_cuda::CudaCopy` answers
///   [`Error::NotLive`](crate::Error::NotLive)).
/// - **Work not ordered with `stream`.** The caller orders its work on the
///   ranges with the stream it passes, but it cannot make a stream keep
///   that order: a user's `Stream` (a wrapper of a CUDA stream whose
///   `wait` does nothing) may leave other work on the ranges running
///   meanwhile. Such work makes the bytes wrong, nothing worse: the engine
///   is done with a host slice when its call returns, and touches the
///   backend's memory only through the backend (`memres_cuda::CudaCopy`
///   waits for a copy into or out of host-visible memory before it returns).
///
/// # Examples
///
/// A host-memory backend can implement it with plain pointer copies checked
/// against its live allocations; see `memres_sim::HostCopy`. Calling it:
///
/// ```
/// use memres_core::{copy::CopyEngine, Result, Stream};
/// fn roundtrip<E: CopyEngine<S>, S: Stream>(e: &E, addr: u64, s: &S) -> Result<[u8; 4]> {
///     let mut out = [0u8; 4];
///     // SAFETY: the caller hands us 4 bytes of memory of this backend it
///     // holds at `addr`, used by nothing else.
///     unsafe {
///         e.copy_from_host(addr, &[1, 2, 3, 4], s)?;
///         e.copy_to_host(&mut out, addr, s)?;
///     }
///     Ok(out)
/// }
/// ```
pub trait CopyEngine<S: Stream + ?Sized> {
    /// The engine that names the memory this one may touch: `Self` for an
    /// engine, the engine behind it for a reference. Containers ask their
    /// resource for [`MemoryOf<Self::Kind>`](MemoryOf). An engine that
    /// names another takes on that engine's checked access (see
    /// [implementing](#implementing)).
    type Kind;

    /// Copies `src` to `dst..dst + src.len()`.
    ///
    /// # Safety
    ///
    /// The destination range must be memory of this backend that the caller
    /// holds (see the trait's documentation). For the bytes to be right, no
    /// other work uses it unordered with `stream`.
    unsafe fn copy_from_host(&self, dst: u64, src: &[u8], stream: &S) -> Result<()>;

    /// Copies `src..src + dst.len()` into `dst`.
    ///
    /// # Safety
    ///
    /// The source range must be memory of this backend that the caller
    /// holds. For the bytes to be right, no other work writes it unordered
    /// with `stream`.
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: &S) -> Result<()>;

    /// Copies `len` bytes from `src` to `dst`. The ranges may overlap (see
    /// [implementing](#implementing)): the engine then copies as `memmove`
    /// does, or returns an error and touches nothing.
    ///
    /// # Safety
    ///
    /// Both ranges must be memory of this backend that the caller holds. For
    /// the bytes to be right, only work ordered with `stream` uses them.
    unsafe fn copy(&self, dst: u64, src: u64, len: u64, stream: &S) -> Result<()>;

    /// Sets `len` bytes at `dst` to `value`.
    ///
    /// # Safety
    ///
    /// The range must be memory of this backend that the caller holds. For
    /// the bytes to be right, only work ordered with `stream` uses it.
    unsafe fn fill(&self, dst: u64, value: u8, len: u64, stream: &S) -> Result<()>;
}

impl<S: Stream + ?Sized, E: CopyEngine<S> + ?Sized> CopyEngine<S> for &E {
    type Kind = E::Kind;
    unsafe fn copy_from_host(&self, dst: u64, src: &[u8], stream: &S) -> Result<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { (**self).copy_from_host(dst, src, stream) }
    }
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: &S) -> Result<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { (**self).copy_to_host(dst, src, stream) }
    }
    unsafe fn copy(&self, dst: u64, src: u64, len: u64, stream: &S) -> Result<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { (**self).copy(dst, src, len, stream) }
    }
    unsafe fn fill(&self, dst: u64, value: u8, len: u64, stream: &S) -> Result<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { (**self).fill(dst, value, len, stream) }
    }
}

/// A resource whose blocks are memory that the copy engine `E` may read and
/// write: what the containers ask of their resource.
///
/// Implemented by each backend for its own resources and engine (host memory
/// for `memres_sim::HostCopy`, the CUDA resources for `memres_cuda::CudaCopy`),
/// and forwarded by everything that hands out its upstream's blocks or
/// sub-ranges of them: `&R`, `Box<R>`, `Arc<R>`, [`Shared`](crate::Shared),
/// the [adaptors](crate::adaptor), the [pool](crate::pool::CoalescingPool),
/// the [fixed-size resource](crate::fixed::FixedSizeResource), the
/// [arena](crate::arena::ArenaResource), the
/// [stream-ordered layer](crate::StreamOrdered), the
/// [per-stream pool](crate::per_stream::PerStreamPool) (its chunk pools
/// over one `Arc` or reference, or its virtual pools) and
/// [`Planned`](crate::planned::Planned). A resource of numbers with
/// no bytes behind them (a simulated device) must not implement it. Not
/// covered: `BinningResource` (a bin may be any boxed resource) and
/// [`DynResource`](crate::DynResource) (a stack chosen at run time); for
/// those [`AssumeMemoryOf`] makes the promise by hand.
///
/// A [`ReservableSpace`](crate::vmem::ReservableSpace) implements it to make
/// the same promise of the ranges it commits (the CUDA backend's virtual
/// space for `CudaCopy`): its reservations are disjoint, and each range
/// is, from a `commit` that succeeded until it is given to `decommit`,
/// memory of `E` that nothing else uses, and `E` stays sound on it after,
/// as below. A
/// [`VirtualPool`](crate::vpool::VirtualPool) over such a space forwards the
/// promise: it keeps every granule a live block touches committed.
///
/// # Safety
///
/// Every block `b` that the resource's `allocate` hands out (through
/// [`MemoryResource`] or [`MemoryResourceMut`](crate::MemoryResourceMut),
/// on any stream) must be, from then until it is given to `deallocate` or
/// the resource ends:
///
/// - live memory of `E`: the `b.size()` bytes at `b.addr()` are memory that
///   `E`'s methods may read and write;
/// - the holder's alone: no other live block of the resource overlaps them,
///   and the resource itself does not touch them.
///
/// A block may be shorter than asked: what is promised is `b.size()` bytes,
/// and users check that against their request (the containers do).
///
/// Its users hold the resource as long as they hold a block and free their
/// blocks only once, but they cannot stop other code from freeing their
/// blocks (a copy of the block, a forged [`Block`]) or ending the resource
/// early (dropped, or moved out from under a [`Shared`](crate::Shared) lock
/// through `with`). So the promise goes on: `E`'s methods called on ranges
/// of a block that other code has freed, or whose resource has ended, must
/// not reach undefined behaviour, and so must the methods of every engine
/// whose `Kind` is `E`, which are handed the same blocks (they take on
/// `E`'s duties: [implementing a `CopyEngine`](CopyEngine#implementing)).
/// What that takes depends on the memory:
///
/// - **Host-addressable memory** (`E`, or the driver it calls, reads and
///   writes host pages): *checked access*. `E` touches a range only while
///   it lies in one allocation that a resource of this kind holds at that
///   moment, checked in a [`LiveRanges`] table under the lock under which
///   those resources free, and completes the access before a free of
///   that allocation can go on (holding the lock meanwhile, or marking the
///   range in use, a mark the free waits for); any other range is
///   [`Error::NotLive`](crate::Error::NotLive) and nothing is touched. The
///   resources never give out references to their memory, and `E` writes
///   every byte it hands to Rust (`HostMemory` zeroes fresh allocations;
///   CUDA's are not zeroed, and its copies write the whole destination), so
///   the worst a stale holder does is read or write bytes another holder
///   has or had: wrong data, not undefined behaviour. Host memory (`memres_sim::HostMemory` with `HostCopy`) and
///   CUDA's pinned and managed memory (with `CudaCopy`) work so.
/// - **Memory only the engine's device copies reach** (plain device memory):
///   a stale address must name device memory or nothing, never host memory,
///   at the moment the device uses it; `CudaCopy` asks the driver that the
///   range is device memory before it queues the work.
///
/// Unsafe code that makes references to a block's bytes, or reads them
/// through raw pointers, gets no such protection, and keeping its own
/// resource away from other code is not enough: the check knows which
/// ranges are live, not whose, so a stale container of *another* resource
/// of the same memory writes the block once the allocator hands its freed
/// address to this one. Such code must hold no reference to the bytes while
/// a container over memory of the same engine may run elsewhere in the
/// process.
///
/// # Examples
///
/// A resource that hands out its upstream's blocks unchanged forwards the
/// promise:
///
/// ```
/// use memres_core::copy::MemoryOf;
/// use memres_core::{Block, MemoryResource, Request, Result, Stream};
/// struct Counting<R>(R, std::sync::atomic::AtomicU64);
/// impl<S: Stream + ?Sized, R: MemoryResource<S>> MemoryResource<S> for Counting<R> {
///     fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
///         self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         self.0.allocate(request, stream)
///     }
///     fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
///         self.0.deallocate(block, stream)
///     }
/// }
/// // SAFETY: every block is one of `R`'s, unchanged, given back to it only
/// // by `deallocate`.
/// unsafe impl<E, R: MemoryOf<E>> MemoryOf<E> for Counting<R> {}
/// ```
pub unsafe trait MemoryOf<E> {}

// SAFETY: the reference hands out `R`'s blocks unchanged and frees them only
// through `R::deallocate`.
unsafe impl<E, R: MemoryOf<E> + ?Sized> MemoryOf<E> for &R {}

// SAFETY: as for `&R`: the box forwards both calls to `R`.
#[cfg(feature = "alloc")]
unsafe impl<E, R: MemoryOf<E> + ?Sized> MemoryOf<E> for alloc::boxed::Box<R> {}

// SAFETY: as for `&R`: every clone of the `Arc` forwards to the same `R`.
#[cfg(feature = "alloc")]
unsafe impl<E, R: MemoryOf<E> + ?Sized> MemoryOf<E> for alloc::sync::Arc<R> {}

/// A resource promised by hand to be [`MemoryOf<E>`]: the escape hatch for
/// resources the types cannot vouch for, such as a stack built from a string
/// (`Arc<dyn MemoryResource>`).
///
/// It forwards both calls to the resource unchanged. The containers' crate
/// documentation shows it over a boxed host-memory resource.
pub struct AssumeMemoryOf<R, E> {
    resource: R,
    /// Invariant in `E`: the promise is for `E` alone, not for a type
    /// that differs from it by a lifetime. Holds no `E`: `Send` and `Sync`
    /// whatever `E` is.
    _engine: PhantomData<fn(&E) -> E>,
}

impl<R, E> AssumeMemoryOf<R, E> {
    /// Wraps `resource`, promising what [`MemoryOf<E>`] promises.
    ///
    /// # Safety
    ///
    /// Every block `resource` hands out must meet the contract of
    /// [`MemoryOf<E>`]: until it is deallocated, its `size()` bytes at its
    /// `addr()` are live memory that `E` may read and write, and no other
    /// live block of the resource overlaps them; and `E` stays sound on a
    /// block that other code has freed (it checks its accesses, as
    /// `memres_sim::HostCopy` and `memres_cuda::CudaCopy` do, or the memory
    /// is device memory only its device copies reach). So must every block
    /// of every clone of `resource`: the wrapper's [`Clone`] wraps
    /// `R::clone`'s result under the same promise (a handle whose clones
    /// share one resource, such as an `Arc` or a reference, keeps it).
    pub unsafe fn new(resource: R) -> Self {
        AssumeMemoryOf { resource, _engine: PhantomData }
    }

    /// The wrapped resource.
    pub fn inner(&self) -> &R {
        &self.resource
    }

    /// The wrapped resource, giving up the wrapper.
    pub fn into_inner(self) -> R {
        self.resource
    }
}

impl<R: Clone, E> Clone for AssumeMemoryOf<R, E> {
    fn clone(&self) -> Self {
        AssumeMemoryOf { resource: self.resource.clone(), _engine: PhantomData }
    }
}

impl<R: fmt::Debug, E> fmt::Debug for AssumeMemoryOf<R, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AssumeMemoryOf").field(&self.resource).finish()
    }
}

impl<S: Stream + ?Sized, R: MemoryResource<S>, E> MemoryResource<S> for AssumeMemoryOf<R, E> {
    #[inline]
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        self.resource.allocate(request, stream)
    }
    #[inline]
    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        self.resource.deallocate(block, stream)
    }
    /// The resource itself: this is a view of it.
    #[inline]
    fn id(&self) -> crate::ResourceId {
        self.resource.id()
    }
}

// SAFETY: the caller of `new` promised the contract for the blocks of
// `resource` and of its clones (the only other way to make one, `Clone`,
// wraps a clone), which are handed out unchanged.
unsafe impl<R, E> MemoryOf<E> for AssumeMemoryOf<R, E> {}

/// The allocations of one kind of host-addressable memory that are live now:
/// what an engine checks each access against ([checked access](self#checked-access)).
///
/// A backend keeps one table for all its resources of that kind, behind one
/// lock: a resource inserts an allocation once it has it and removes it
/// while holding the lock through the free itself; the engine checks a range
/// and performs the access while holding the same lock. Allocations never
/// overlap (they come from one allocator).
///
/// ```text
///  start ──► end        check(addr, len): the last start <= addr, and addr + len <= its end
/// ```
///
/// # Examples
///
/// ```
/// use memres_core::{copy::LiveRanges, Error};
/// let mut live = LiveRanges::new();
/// live.insert(0x1000, 0x100);
/// assert_eq!(live.check(0x1080, 0x80), Ok(()));
/// assert_eq!(live.check(0x1080, 0x81), Err(Error::NotLive { addr: 0x1080, len: 0x81 }));
/// assert_eq!(live.remove(0x1000), Some(0x100));
/// assert_eq!(live.check(0x1000, 1), Err(Error::NotLive { addr: 0x1000, len: 1 }));
/// ```
#[cfg(feature = "alloc")]
#[derive(Debug, Default)]
pub struct LiveRanges {
    /// Start of each live allocation to its length (not its end: a
    /// length that runs past the last address is given back unchanged).
    lens: alloc::collections::BTreeMap<u64, u64>,
}

#[cfg(feature = "alloc")]
impl LiveRanges {
    /// An empty table (a `const fn`, for a `static`).
    pub const fn new() -> Self {
        LiveRanges { lens: alloc::collections::BTreeMap::new() }
    }

    /// Records the allocation `start..start + len` (nothing for `len` 0).
    pub fn insert(&mut self, start: u64, len: u64) {
        if len > 0 {
            debug_assert!(self.check(start, 1).is_err(), "allocations overlap at {start:#x}");
            self.lens.insert(start, len);
        }
    }

    /// Forgets the allocation that starts at `start`, returning its length
    /// (`None` if there is none).
    pub fn remove(&mut self, start: u64) -> Option<u64> {
        self.lens.remove(&start)
    }

    /// Whether `addr..addr + len` lies in one live allocation (an empty range
    /// always does: it touches nothing).
    ///
    /// # Errors
    ///
    /// [`Error::NotLive`](crate::Error::NotLive) otherwise.
    pub fn check(&self, addr: u64, len: u64) -> Result<()> {
        let inside = len == 0
            || addr.checked_add(len).is_some_and(|end| {
                self.lens
                    .range(..=addr)
                    .next_back()
                    .is_some_and(|(&start, &live)| end <= start.saturating_add(live))
            });
        if inside {
            Ok(())
        } else {
            Err(crate::Error::NotLive { addr, len })
        }
    }

    /// Number of live allocations.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    /// Whether no allocation is live.
    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }
}

#[cfg(all(test, feature = "alloc", not(loom)))]
mod tests;
