//! One set of figures for every resource ([`Usage`]) and the one trait that
//! reads them and runs the invariant checker ([`Inspect`]).

use crate::check::Violation;

/// What a resource holds and hands out, in bytes: the same five figures,
/// with the same meaning, for every resource and adaptor.
///
/// `used + free == held`, unless figures made with [`new`](Self::new) (or
/// summed from a user's resource) have more used than held: `free` is
/// then 0. A leaf (a device, host memory) holds what
/// it handed out: `used == held`, `free == 0`, `largest_free == 0`. An
/// adaptor reports the figures of the resource under it.
///
/// # Examples
///
/// ```
/// use memres_core::pool::CoalescingPool;
/// use memres_core::{Inspect, MemoryResourceMut, Request};
/// # use memres_core::testing::BumpUpstream;
/// let mut pool = CoalescingPool::new(BumpUpstream::new(1 << 30));
/// let b = pool.allocate(Request::new(1000)?, &())?;
/// let u = pool.usage();
/// assert_eq!(u.used, 1024); // the footprint: 1000 rounded up to 256
/// assert_eq!(u.used + u.free, u.held);
/// assert!(u.peak_held >= u.held && u.largest_free <= u.free);
/// pool.deallocate(b, &())?;
/// assert_eq!(pool.usage().used, 0);
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Usage {
    /// Bytes of the live blocks (handed out and not yet freed), each at its
    /// footprint: its size rounded up to what the resource sets aside for
    /// it (256 bytes for the pools, the block size of a fixed-size
    /// resource, the size class of the arena's small blocks).
    pub used: u64,
    /// Bytes held from the upstream now (a leaf: from the device, that is
    /// what it handed out; a virtual pool: its committed memory).
    pub held: u64,
    /// The most bytes held at once since the resource was made (a resource
    /// made of parts that grow apart, the binning resource, sums the peaks
    /// of its parts: at least the true peak).
    pub peak_held: u64,
    /// `held - used`: bytes held that no live block covers (a fixed-size
    /// resource's retired blocks count here).
    pub free: u64,
    /// The largest block the resource could hand out now without taking
    /// more from its upstream (a virtual pool: without reserving more
    /// addresses; it may commit memory for it). 0 for a leaf.
    pub largest_free: u64,
}

impl Usage {
    /// The figures of a leaf that has handed out `held` bytes (and held at
    /// most `peak_held` at once): all of it used, nothing free.
    ///
    /// ```
    /// use memres_core::Usage;
    /// let u = Usage::leaf(512, 1024);
    /// assert_eq!((u.used, u.held, u.peak_held, u.free, u.largest_free), (512, 512, 1024, 0, 0));
    /// ```
    pub const fn leaf(held: u64, peak_held: u64) -> Self {
        Usage { used: held, held, peak_held, free: 0, largest_free: 0 }
    }

    /// The figures of a resource that holds `held` bytes, `used` of them in
    /// live blocks (`free` is the rest).
    ///
    /// ```
    /// use memres_core::Usage;
    /// let u = Usage::new(256, 1024, 2048, 512);
    /// assert_eq!((u.free, u.largest_free), (768, 512));
    /// ```
    pub const fn new(used: u64, held: u64, peak_held: u64, largest_free: u64) -> Self {
        Usage { used, held, peak_held, free: held.saturating_sub(used), largest_free }
    }

    /// The figures of two parts of one resource together: bytes add up,
    /// peaks too (at least the true peak), the largest free block is the
    /// larger one. The sums saturate, as [`new`](Self::new)'s difference
    /// does: a part may be a user's, with any figures.
    #[cfg(feature = "alloc")]
    pub(crate) const fn plus(self, other: Usage) -> Usage {
        Usage {
            used: self.used.saturating_add(other.used),
            held: self.held.saturating_add(other.held),
            peak_held: self.peak_held.saturating_add(other.peak_held),
            free: self.free.saturating_add(other.free),
            largest_free: if self.largest_free > other.largest_free {
                self.largest_free
            } else {
                other.largest_free
            },
        }
    }
}

/// Reads a resource's figures and checks its invariants: implemented by
/// every resource and adaptor (adaptors forward to the resource under them,
/// [`Shared`](crate::Shared) reads through its lock).
///
/// # Examples
///
/// ```
/// use memres_core::pool::CoalescingPool;
/// use memres_core::{Inspect, MemoryResource, Request, Shared};
/// use memres_core::adaptor::Statistics;
/// # use memres_core::testing::BumpUpstream;
/// let stack = Statistics::new(Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 30))));
/// let b = stack.allocate(Request::new(100)?, &())?;
/// assert_eq!(stack.usage().used, 256); // the pool's figures, through the adaptor and the lock
/// stack.check().unwrap();
/// # stack.deallocate(b, &())?;
/// # Ok::<(), memres_core::Error>(())
/// ```
pub trait Inspect {
    /// The resource's figures now. Resources behind locks take them in
    /// turn: figures read while other threads allocate are each exact but
    /// need not be one snapshot.
    fn usage(&self) -> Usage;

    /// Walks the resource's metadata (O(n), never on the hot path: tests
    /// and fuzz targets run it after every step) and returns the first
    /// broken invariant. Run it while no other thread uses the resource.
    ///
    /// # Errors
    ///
    /// The first broken invariant.
    fn check(&self) -> Result<(), Violation>;
}

/// Implements [`Inspect`] for pointers to an `R: Inspect`: the figures and
/// checker of what they point to.
macro_rules! through_pointers {
    ($($pointer:ty),*) => {$(
        impl<R: Inspect + ?Sized> Inspect for $pointer {
            #[inline]
            fn usage(&self) -> Usage {
                (**self).usage()
            }
            fn check(&self) -> Result<(), Violation> {
                (**self).check()
            }
        }
    )*};
}

through_pointers!(&R);
#[cfg(feature = "alloc")]
through_pointers!(alloc::boxed::Box<R>, alloc::sync::Arc<R>);

/// Implements [`Inspect`] for an adaptor over `R` by forwarding to the
/// resource in its field `$field`.
macro_rules! forward_inspect {
    ($adaptor:ident < R $(, $param:ident $(: $bound:path)?)* >, $field:ident) => {
        impl<R: $crate::Inspect $(, $param $(: $bound)?)*> $crate::Inspect for $adaptor<R $(, $param)*> {
            #[inline]
            fn usage(&self) -> $crate::Usage {
                self.$field.usage()
            }
            fn check(&self) -> core::result::Result<(), $crate::check::Violation> {
                self.$field.check()
            }
        }
    };
}
pub(crate) use forward_inspect;
