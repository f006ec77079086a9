use crate::{Block, Request, Result, Stream};
use core::fmt;

/// What a resource is, for [`MemoryResource::is_equal`]: the address of
/// the state that serves its calls and the type that reads that state.
///
/// Compare ids of resources borrowed at the same time; do not keep one
/// (an id is an address, and a resource held by value moves).
///
/// ```
/// use memres_core::ResourceId;
/// let (a, b) = (1u64, 1u64);
/// assert_eq!(ResourceId::of(&a), ResourceId::of(&a));
/// assert_ne!(ResourceId::of(&a), ResourceId::of(&b));
/// ```
#[derive(Clone, Copy)]
pub struct ResourceId {
    /// The state's address.
    addr: usize,
    /// The type's name: a resource and a field of it at the same address
    /// (an adaptor and the upstream it holds first) are told apart by it.
    ty: &'static str,
}

impl ResourceId {
    /// The id of `resource` itself: its address and its type.
    #[inline]
    pub fn of<T: ?Sized>(resource: &T) -> Self {
        ResourceId::shared::<T>((resource as *const T).cast::<()>())
    }

    /// The id of a handle of type `T` whose clones share the state at
    /// `state` (an `Arc`'s pointee): every clone has this id.
    #[inline]
    pub fn shared<T: ?Sized>(state: *const ()) -> Self {
        ResourceId { addr: state as usize, ty: core::any::type_name::<T>() }
    }

    /// The id of an adaptor of type `T` that keeps no record of blocks and
    /// gives each one back to `upstream` unchanged: equal to another such
    /// adaptor of the same type over an equal upstream, as RMM's adaptors
    /// compare, never to the upstream itself.
    ///
    /// ```
    /// use memres_core::ResourceId;
    /// let pool = 0u8;
    /// let up = ResourceId::of(&pool);
    /// assert_eq!(ResourceId::over::<u16>(up), ResourceId::over::<u16>(up));
    /// assert_ne!(ResourceId::over::<u16>(up), up);
    /// ```
    #[inline]
    pub fn over<T: ?Sized>(upstream: ResourceId) -> Self {
        ResourceId { addr: upstream.addr, ty: core::any::type_name::<T>() }
    }
}

impl PartialEq for ResourceId {
    fn eq(&self, other: &Self) -> bool {
        // Names are compared by content: one type may get several copies of
        // its name, one per crate that names it.
        self.addr == other.addr && self.ty == other.ty
    }
}

impl Eq for ResourceId {}

impl fmt::Debug for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{:#x}", self.ty, self.addr)
    }
}

/// The stream-ordered memory resource: the one trait every resource, adaptor
/// and backend implements.
///
/// As in RMM and CCCL, both calls take the stream the memory is used on. A
/// resource for which streams mean nothing is generic over `S` and ignores it;
/// `S = ()` is the stream of such resources.
///
/// The trait takes `&self` so that a resource can be shared between threads
/// and stacked under several others (through `&R`, `Arc<R>`). Plain
/// algorithms implement [`MemoryResourceMut`] instead and are made shareable
/// by [`Shared`](crate::Shared). The trait is object safe: stacks chosen at
/// run time are `dyn MemoryResource<S>`.
///
/// # Contract
///
/// - `allocate` of a zero-byte request returns [`Block::EMPTY`] and
///   `deallocate` of an empty block does nothing.
/// - A returned block is aligned to `request.align()` and does not overlap
///   any other live block of the resource.
/// - `deallocate` of a block the resource did not hand out, or handed out and
///   got back already, is an error ([`Error::UnknownBlock`](crate::Error::UnknownBlock),
///   [`Error::DoubleFree`](crate::Error::DoubleFree)), never corruption.
/// - A failed call changes nothing.
///
/// # A free that panics
///
/// Code of the user's below a layer (an upstream, a stream, a log writer)
/// may panic in the middle of a free, before or after it gave the memory
/// back. The layer cannot tell which, so it takes the side that is safe
/// for what it keeps:
///
/// - A layer that serves memory (the pools, the fixed-size resource, the
///   arena, `StreamOrdered`, `Planned`, the per-stream pools) takes a
///   chunk, region or block whose free panicked as gone: it never serves
///   from it again, so it never hands out memory the layer below may have
///   taken back. (The virtual pool asks its space which granules it still
///   holds.) So do the C library's and the Python package's tables of the
///   pointers they handed out.
/// - A layer that counts or records (`Statistics`, `Counted`, `Tracking`,
///   `Limiting`, a snapshot's tap) keeps the block counted and recorded as
///   live: no figure falls below what may still be held, and a later free
///   of the block goes through (refused by the layer below if it did free).
///
/// The panic goes on to the caller either way.
///
/// # Equality
///
/// Two resources are equal ([`is_equal`](Self::is_equal), RMM's
/// `is_equal`) when a block of one may be given back to the other with the
/// same effect, every figure and record kept exact. By [`id`](Self::id):
///
/// | resource | equal to |
/// | --- | --- |
/// | any (the default) | itself only: two pools over one upstream are not equal, nor a pool and its upstream |
/// | `&R`, `Box<R>`, `Arc<R>` | what `R` is equal to: two clones of one `Arc` are equal |
/// | a view that hands out a resource's blocks unchanged and only vouches for them ([`AssumeMemoryOf`](crate::copy::AssumeMemoryOf), `CurrentResource`) | what the resource is equal to: two containers made from one current resource are equal |
/// | a handle whose clones share one state (`CudaMemory`, `ManagedMemory`, `PinnedMemory`) | its clones ([`ResourceId::shared`]) |
/// | an adaptor that keeps no record of blocks ([`Aligned`](crate::adaptor::Aligned), [`FailureCallback`](crate::adaptor::FailureCallback), `Prefetch`) | an adaptor of the same type over an equal upstream, as in RMM ([`ResourceId::over`]) |
/// | an adaptor that keeps one (`Statistics`, `Tracking`, `Limiting`, `Logging`, `Counted`) | itself only, where RMM says equal over an equal upstream: a block freed through the other would leave both adaptors' figures or records wrong |
///
/// # Examples
///
/// ```
/// use memres_core::{pool::CoalescingPool, MemoryResource, Request, Shared};
/// # use memres_core::testing::BumpUpstream;
/// let pool = Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 20)));
/// let r: &dyn MemoryResource = &pool;
/// let b = r.allocate(Request::new(100)?, &())?;
/// r.deallocate(b, &())?;
/// # Ok::<(), memres_core::Error>(())
/// ```
pub trait MemoryResource<S: Stream + ?Sized = ()> {
    /// Allocates a block for `request`, ordered on `stream`.
    fn allocate(&self, request: Request, stream: &S) -> Result<Block>;

    /// Frees `block`, ordered on `stream`: the memory may be reused by work
    /// on `stream` at once, and by other streams once they are ordered after it.
    fn deallocate(&self, block: Block, stream: &S) -> Result<()>;

    /// What this resource is, for [`is_equal`](Self::is_equal): by default
    /// the resource itself ([`ResourceId::of`]).
    #[inline]
    fn id(&self) -> ResourceId {
        ResourceId::of(self)
    }

    /// Whether a block of `self` may be given back to `other` (and the
    /// reverse) with the same effect: RMM's `is_equal`.
    ///
    /// A resource generic over its stream names the stream here, as
    /// `MemoryResource::<()>::is_equal(&a, &b)` (or through `dyn`).
    ///
    /// ```
    /// # #[cfg(feature = "alloc")] // the `Arc` handle
    /// # fn main() {
    /// use memres_core::{pool::CoalescingPool, MemoryResource, Shared};
    /// # use memres_core::testing::BumpUpstream;
    /// use std::sync::Arc;
    /// let up = BumpUpstream::new(1 << 20);
    /// let pool: Arc<dyn MemoryResource> = Arc::new(Shared::new(CoalescingPool::new(&up)));
    /// let other = Shared::new(CoalescingPool::new(&up));
    /// assert!(pool.is_equal(&pool.clone()));
    /// assert!(!pool.is_equal(&up));
    /// assert!(!MemoryResource::<()>::is_equal(&other, &*pool));
    /// # }
    /// # #[cfg(not(feature = "alloc"))]
    /// # fn main() {}
    /// ```
    #[inline]
    fn is_equal(&self, other: &dyn MemoryResource<S>) -> bool {
        self.id() == other.id()
    }
}

/// The `&mut self` form of [`MemoryResource`]: what a plain algorithm (a state
/// machine with no lock) implements.
///
/// [`Shared`](crate::Shared) puts one behind a lock and makes it a
/// [`MemoryResource`]; every `&R` where `R: MemoryResource` is a
/// `MemoryResourceMut`, so a shared resource can serve wherever a plain one can.
///
/// # Examples
///
/// ```
/// use memres_core::{pool::CoalescingPool, MemoryResourceMut, Request};
/// # use memres_core::testing::BumpUpstream;
/// let mut pool = CoalescingPool::new(BumpUpstream::new(1 << 20));
/// let b = pool.allocate(Request::new(100)?, &())?;
/// pool.deallocate(b, &())?;
/// # Ok::<(), memres_core::Error>(())
/// ```
pub trait MemoryResourceMut<S: Stream + ?Sized = ()> {
    /// Allocates a block for `request`, ordered on `stream`.
    fn allocate(&mut self, request: Request, stream: &S) -> Result<Block>;

    /// Frees `block`, ordered on `stream`.
    fn deallocate(&mut self, block: Block, stream: &S) -> Result<()>;
}

/// The `deallocate` and `id` of an adaptor that keeps no record of blocks:
/// each block goes back to the resource in its field `$field` unchanged,
/// and it is equal to another such adaptor of its type over an equal
/// upstream ([`ResourceId::over`]).
macro_rules! pass_blocks_through {
    ($field:ident) => {
        #[inline]
        fn deallocate(&self, block: $crate::Block, stream: &S) -> $crate::Result<()> {
            self.$field.deallocate(block, stream)
        }

        /// Equal to an adaptor of its type over an equal upstream, whatever
        /// its other settings (it gives the upstream its very blocks back).
        #[inline]
        fn id(&self) -> $crate::ResourceId {
            $crate::ResourceId::over::<Self>(self.$field.id())
        }
    };
}
pub(crate) use pass_blocks_through;

/// A constructor `$name(upstream, config, stream)` of a resource over an
/// upstream `U` that serves streams `S`: the one signature of
/// `with_config` and `with_config_in`.
macro_rules! configured_fn {
    ($(#[$doc:meta])* $name:ident, $config:ty, |$upstream:ident, $cfg:ident, $stream:ident| $body:block) => {
        $(#[$doc])*
        pub fn $name<S: $crate::Stream + ?Sized>($upstream: U, $cfg: $config, $stream: &S) -> $crate::Result<Self>
        where
            U: $crate::MemoryResource<S>,
        $body
    };
}
pub(crate) use configured_fn;

/// `new(upstream)` and `with_config(upstream, config, stream)` of a
/// resource whose parameters other than the upstream take their defaults
/// (lock, storage): `new` makes it empty with the default configuration
/// (through its `$empty(upstream, config)`), `with_config` is its
/// `with_config_in`. Each gets the doc comments written before its name.
macro_rules! default_constructors {
    ($ty:ident, $config:ident, $empty:ident; $(#[$new_doc:meta])* new; $(#[$with_doc:meta])* with_config;) => {
        impl<U> $ty<U> {
            $(#[$new_doc])*
            pub fn new(upstream: U) -> Self {
                Self::$empty(upstream, <$config>::default())
            }

            $crate::resource::configured_fn! {
                $(#[$with_doc])*
                with_config, $config, |upstream, config, stream| {
                    Self::with_config_in(upstream, config, stream)
                }
            }
        }
    };
}
pub(crate) use default_constructors;

/// `with_config_in(upstream, config, stream)` of a resource, for any lock
/// and storage: the configuration validated, the resource made empty
/// (through its `$empty(upstream, config)`), then its initial memory taken
/// on `stream` (its `take_initial`, which holds nothing when it fails).
/// Gets the doc comments written after the header.
macro_rules! with_config_in {
    (impl[$($gen:tt)*] $ty:ty, $config:ty, $empty:ident; $(#[$doc:meta])*) => {
        impl<$($gen)*> $ty {
            $crate::resource::configured_fn! {
                $(#[$doc])*
                with_config_in, $config, |upstream, config, stream| {
                    config.validate()?;
                    let mut made = Self::$empty(upstream, config);
                    made.take_initial(stream)?;
                    Ok(made)
                }
            }
        }
    };
}
pub(crate) use with_config_in;

/// Pointers to a resource are the resource: every call goes to the
/// pointee, and so does its id.
macro_rules! forward_through_pointer {
    ($($(#[$attr:meta])* $ptr:ty;)*) => {$(
        $(#[$attr])*
        impl<S: Stream + ?Sized, R: MemoryResource<S> + ?Sized> MemoryResource<S> for $ptr {
            #[inline]
            fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
                (**self).allocate(request, stream)
            }
            #[inline]
            fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
                (**self).deallocate(block, stream)
            }
            #[inline]
            fn id(&self) -> ResourceId {
                (**self).id()
            }
        }
    )*};
}

forward_through_pointer! {
    &R;
    #[cfg(feature = "alloc")]
    alloc::boxed::Box<R>;
    #[cfg(feature = "alloc")]
    alloc::sync::Arc<R>;
}

/// Borrowed resources are plain algorithms: every call goes to the pointee.
macro_rules! mut_through_borrow {
    ($($(#[$attr:meta])* $bound:ident for $ptr:ty;)*) => {$(
        $(#[$attr])*
        impl<S: Stream + ?Sized, R: $bound<S> + ?Sized> MemoryResourceMut<S> for $ptr {
            #[inline]
            fn allocate(&mut self, request: Request, stream: &S) -> Result<Block> {
                (**self).allocate(request, stream)
            }
            #[inline]
            fn deallocate(&mut self, block: Block, stream: &S) -> Result<()> {
                (**self).deallocate(block, stream)
            }
        }
    )*};
}

mut_through_borrow! {
    /// A shared resource borrowed is a plain algorithm.
    MemoryResource for &R;
    /// A plain algorithm borrowed mutably is one too, so that it can go under
    /// [`Shared`](crate::Shared) or any `MemoryResourceMut` consumer without
    /// being moved: `Shared::new(&mut pool)`.
    ///
    /// ```
    /// use memres_core::{pool::CoalescingPool, MemoryResource, MemoryResourceMut, Request, Shared};
    /// # use memres_core::testing::BumpUpstream;
    /// let mut pool = CoalescingPool::new(BumpUpstream::new(1 << 30));
    /// let shared = Shared::new(&mut pool);
    /// let b = shared.allocate(Request::new(100)?, &())?;
    /// shared.deallocate(b, &())?;
    /// drop(shared);
    /// let again = pool.allocate(Request::new(100)?, &())?; // still ours
    /// assert_eq!(again.addr(), b.addr()); // and it kept the freed block
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    MemoryResourceMut for &mut R;
}

/// A block taken from `resource` that nobody holds yet: freed back when
/// dropped, unless [`hand_over`](Self::hand_over) gives it to the caller.
/// So user code that runs between taking a block and handing it over (a
/// writer, a copy engine) cannot lose it by panicking or returning early.
///
/// The free in `drop` ignores the resource's answer: there is no one to
/// tell. While the thread unwinds, a panic of the resource's free is caught
/// (a second panic in a destructor would abort the process) and the block
/// left to the broken resource.
///
/// ```
/// use memres_core::{testing::BumpUpstream, Inspect, MemoryResource, Pending, Request};
/// let up = BumpUpstream::new(1 << 20);
/// let block = up.allocate(Request::new(256)?, &())?;
/// drop(Pending::new(&up, block, &())); // nobody took it: freed
/// assert_eq!(up.usage().held, 0);
/// let kept = Pending::new(&up, up.allocate(Request::new(256)?, &())?, &()).hand_over();
/// assert_eq!(up.usage().held, 256);
/// up.deallocate(kept, &())?;
/// # Ok::<(), memres_core::Error>(())
/// ```
#[cfg(feature = "std")]
#[must_use = "dropped at once, it frees the block"]
pub struct Pending<'a, R: MemoryResource<S> + ?Sized, S: Stream + ?Sized> {
    resource: &'a R,
    /// A live block of `resource`, given back by `drop`.
    block: Block,
    stream: &'a S,
}

#[cfg(feature = "std")]
impl<'a, R: MemoryResource<S> + ?Sized, S: Stream + ?Sized> Pending<'a, R, S> {
    /// Guards `block`, a live block of `resource`, to be freed on `stream`.
    pub fn new(resource: &'a R, block: Block, stream: &'a S) -> Self {
        Pending { resource, block, stream }
    }

    /// The block, for the caller, who now frees it.
    pub fn hand_over(self) -> Block {
        let block = self.block;
        core::mem::forget(self);
        block
    }
}

#[cfg(feature = "std")]
impl<R: MemoryResource<S> + ?Sized, S: Stream + ?Sized> core::fmt::Debug for Pending<'_, R, S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Pending").field("block", &self.block).finish_non_exhaustive()
    }
}

#[cfg(feature = "std")]
impl<R: MemoryResource<S> + ?Sized, S: Stream + ?Sized> Drop for Pending<'_, R, S> {
    fn drop(&mut self) {
        in_destructor(|| {
            let _ = self.resource.deallocate(self.block, self.stream);
        });
    }
}

/// Runs `f`, user code (an upstream's free, a stream's `at_drop`, a
/// space's decommit, a leak handler) that a destructor calls. While the
/// thread unwinds, a panic of `f` is caught and what `f` was doing is left
/// undone: a second panic in a destructor would abort the process. The
/// caught panic's payload is dropped under `catch_unwind` too, as its
/// `Drop`, the user's, may panic (that panic's payload is dropped the same
/// way, a few times, then leaked). Without `std` nothing can be caught, and
/// such a panic still aborts.
///
/// Public for the layers above the core (the containers) whose destructors
/// call user code too.
pub fn in_destructor(f: impl FnOnce()) {
    #[cfg(feature = "std")]
    if std::thread::panicking() {
        let mut caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).err();
        // Each payload's drop may panic with a payload of its own: a chain
        // as long as the user's code makes it. Past a few, one is leaked
        // rather than follow the chain for ever.
        const DROPS: usize = 4;
        for _ in 0..DROPS {
            let Some(payload) = caught else { return };
            caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload))).err();
        }
        core::mem::forget(caught);
        return;
    }
    f();
}

#[cfg(all(test, feature = "std"))]
mod tests {
    extern crate std;
    use super::*;

    /// A panic whose payload panics when dropped.
    struct Bomb;

    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("the payload, dropped");
        }
    }

    struct FreesPanic;

    impl MemoryResource for FreesPanic {
        fn allocate(&self, request: Request, _: &()) -> Result<Block> {
            Ok(Block::from_addr(1 << 20, request.size()))
        }
        fn deallocate(&self, _: Block, _: &()) -> Result<()> {
            std::panic::panic_any(Bomb)
        }
    }

    /// A free a destructor makes while the thread unwinds, whose panic's
    /// payload panics when dropped (a user's resource may panic with any
    /// value): that panic is caught too. Before, the payload was dropped
    /// where the first panic was caught, a second panic while unwinding:
    /// the process aborted.
    #[test]
    fn a_panic_whose_payload_panics_when_dropped_does_not_abort_an_unwinding_thread() {
        let up = FreesPanic;
        let b = up.allocate(Request::new(256).unwrap(), &()).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _freed_on_unwind = Pending::new(&up, b, &());
            panic!("the caller's code");
        }));
        assert_eq!(r.unwrap_err().downcast_ref::<&str>(), Some(&"the caller's code"));
    }
}
