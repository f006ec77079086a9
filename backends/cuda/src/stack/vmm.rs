//! The `vmm` leaf: a [`VirtualPool`] over the driver's virtual memory
//! management ([`CudaVirtualSpace`]), counted in the bytes held from the
//! device by what it has mapped; how it orders its unmaps on streams is in
//! [`VmmPool`]'s documentation.

use crate::{CudaStream, CudaVirtualSpace, Device};
use memres_core::adaptor::Gauge;
use memres_core::lock::StdLock;
use memres_core::per_stream::{PerStreamPool, VirtualMaker};
use memres_core::stack::{Call, StackError, StackErrorKind};
use memres_core::vmem::ReservableSpace;
use memres_core::vpool::{VirtualConfig, VirtualPool};
use memres_core::{Range, Result, Shared, Stream};
use std::fmt;
use std::sync::{Arc, Mutex};

/// The typed handle of a `vmm` leaf in a built stack
/// (`built.get::<VmmPool>("vmm")`).
///
/// # Streams
///
/// The pool unmaps memory only in a decommit, which [`CudaVirtualSpace`]
/// orders after the work submitted so far to the stream of the call in
/// progress (it synchronizes that stream first; the legacy default stream
/// too when the stream is the legacy one). Through the C functions that
/// stream is the caller's: PyTorch's `CUDAPluggableAllocator` passes to
/// `memres_free` the stream that was current when the block was allocated,
/// and to `memres_alloc` the current stream. So a decommit waits for every
/// kernel queued on that stream, and in a program that works on one stream
/// (the default stream, as a plain training loop does) no kernel can touch
/// memory after it is unmapped.
///
/// The granules a decommit unmaps may have been freed earlier, by a free on
/// another stream, and the decommit is ordered on the stream of the call
/// that triggers it (a free over `release_threshold=`, or an allocation that trims before
/// it maps past the peak), not on the stream of the free that made them
/// idle. The unmap is therefore safe under the same condition as reuse of a
/// freed block by any plain memres pool (see the C library's *Streams*): one
/// stream, or blocks freed only once every stream that used them is done.
/// A breach of that condition is a data race with a plain pool; with `vmm`
/// it is a fault on unmapped memory. A pluggable allocator never sees
/// PyTorch's `record_stream`, so programs that share tensors between streams
/// must synchronize before they drop them, whatever the stack.
///
/// A decommit that unmaps holds the pool's lock while it waits for the
/// stream, so other threads' calls wait too; with `release_threshold=` above the
/// device's memory and `trim_on_commit=false` the pool unmaps nothing
/// unless the device runs out of memory (then it gives its idle granules
/// back, ordered on the allocating stream, and retries once).
pub type VmmPool = Shared<VirtualPool<CountedSpace<CudaVirtualSpace>>, StdLock>;

/// The typed handle of a `vmm(per_stream=true)` leaf: a virtual pool per
/// stream, each in a reservation of its own, over one space
/// (`built.get::<VmmPools>("vmm")`).
///
/// # Streams
///
/// Stream-ordered, as [`PerStreamPool`] is: a block freed on the stream it
/// was allocated on is reused there at once; another stream never gets its
/// addresses, only physical memory that the first stream's pool unmapped.
/// A pool unmaps (synchronizing its stream first) only in a call on its
/// own stream, and only after that stream waited on an event recorded
/// after every free of its blocks on other streams; so the granules it
/// unmaps are done with on every stream that freed a block there. On out of
/// memory the device is synchronized, and every pool unmaps its idle
/// granules before the allocation is tried again.
pub type VmmPools =
    Shared<PerStreamPool<VirtualMaker<Arc<CountedSpace<CudaVirtualSpace>>>, CudaStream>, StdLock>;

/// The options of `vmm`: `reserve=` (bytes of addresses per reservation,
/// rounded up to the device's granule; default twice the device's memory), `release_threshold=` (free committed bytes kept
/// mapped, the release threshold; default all of them, under the slack),
/// `slack=` (free committed memory is trimmed only above 1 + slack/1000
/// times the peak in use; default 40), `handle_granules=` (the most granules one
/// physical handle spans, 1 to 64; default 32), `large_handles=` (`false`,
/// the default, or `true`: a long fresh run may be mapped in handles longer
/// than `handle_granules`, up to an eighth of it and a sixty-fourth of the space,
/// [`CudaVirtualSpace::with_large_handles`]), `trim_on_commit=`
/// (`true`, the default, or `false`: see [`VirtualConfig::trim_on_commit`])
/// and `per_stream=` (`false`, the default, or `true`: a pool per stream,
/// stream-ordered, [`VmmPools`]).
///
/// **Choosing them.** A decommit that unmaps synchronizes the stream, so a
/// training loop wants steady steps that map nothing: `release_threshold=` above the
/// device's memory with `trim_on_commit=false` maps only while the peak
/// grows and never unmaps; the pool then holds its highest committed
/// bytes, all of them mapped. The commits, decommits and footprints of
/// each setting on the PyTorch traces are in the repository's
/// `docs/measurements.md`.
///
/// # Examples
///
/// ```
/// use memres_cuda::stack::{vmm_config, VmmConfig};
/// use memres_core::stack::parse;
/// let c = vmm_config(&parse("vmm(reserve=64GiB, release_threshold=1GiB, handle_granules=8, trim_on_commit=false)")?)?;
/// assert_eq!(c, VmmConfig { reserve: Some(64 << 30), release_threshold: 1 << 30, handle_granules: 8, large_handles: false, trim_on_commit: false, slack_permille: 40, per_stream: false });
/// assert!(vmm_config(&parse("vmm(per_stream=true)")?)?.per_stream);
/// assert!(vmm_config(&parse("vmm(handle_granules=1, large_handles=true)")?)?.large_handles);
/// assert_eq!(vmm_config(&parse("vmm")?)?, VmmConfig::default());
/// assert!(vmm_config(&parse("vmm(handle_granules=65)")?).is_err());
/// assert!(vmm_config(&parse("vmm(slack=4%)")?).is_err());
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmmConfig {
    /// Bytes of addresses per reservation; `None`: twice the device's
    /// memory, so that the place of blocks in the range rarely fails a
    /// request that physical memory could serve.
    pub reserve: Option<u64>,
    /// The release threshold: free committed bytes kept mapped.
    pub release_threshold: u64,
    /// The most granules one physical handle spans (1 to 64).
    pub handle_granules: u32,
    /// Whether a long fresh run may be mapped in handles longer than
    /// `handle_granules`, up to an eighth of it and a sixty-fourth of the space
    /// ([`CudaVirtualSpace::with_large_handles`]).
    pub large_handles: bool,
    /// Whether an allocation that maps past the peak first decommits idle
    /// granules ([`VirtualConfig::trim_on_commit`]).
    pub trim_on_commit: bool,
    /// Free committed memory is trimmed only above (1 + slack/1000) x the
    /// peak of bytes in use ([`VirtualConfig::slack_permille`]).
    pub slack_permille: u32,
    /// A pool per stream ([`VmmPools`]) rather than one for all.
    pub per_stream: bool,
}

impl Default for VmmConfig {
    fn default() -> Self {
        VmmConfig {
            reserve: None,
            // Keep everything under the slack bound: on the PyTorch traces
            // a 4 % slack leaves steady-state steps mapping nothing
            // (docs/measurements.md).
            release_threshold: u64::MAX,
            handle_granules: CudaVirtualSpace::DEFAULT_HANDLE_GRANULES,
            large_handles: false,
            trim_on_commit: true,
            slack_permille: 40,
            per_stream: false,
        }
    }
}

/// The most reservations a `vmm` pool takes: when one is full it reserves
/// another, as large, rather than fail.
pub const VMM_RESERVATIONS: u32 = 4;

impl VmmConfig {
    /// The pool's configuration on a device of `device_bytes` bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_cuda::stack::VmmConfig;
    /// let c = VmmConfig::default().virtual_config(80 << 30);
    /// assert_eq!((c.reserve_size(), c.release_threshold_bytes(), c.slack()), (160 << 30, u64::MAX, 40));
    /// ```
    pub fn virtual_config(&self, device_bytes: u64) -> VirtualConfig {
        let reserve = self.reserve.unwrap_or(device_bytes.saturating_mul(2));
        VirtualConfig::new(reserve)
            .release_threshold(self.release_threshold)
            .max_reservations(VMM_RESERVATIONS)
            .trim_on_commit(self.trim_on_commit)
            .slack_permille(self.slack_permille)
    }

    /// Builds the pool on `device`, counting its mapped bytes in `gauge`.
    ///
    /// # Errors
    ///
    /// The driver's error (no device, no virtual memory management), or
    /// the pool's when it cannot reserve.
    pub fn build(&self, device: Device, gauge: Arc<Gauge>) -> Result<VmmPool> {
        let (space, config) = self.space(device, gauge)?;
        Ok(Shared::new_in(VirtualPool::with_config(space, config)?))
    }

    /// Builds a pool per stream on `device` ([`VmmPools`]), counting the
    /// bytes they map in `gauge`; each stream's pool reserves its range at
    /// the stream's first allocation.
    ///
    /// # Errors
    ///
    /// The driver's error (no device, no virtual memory management);
    /// [`Error::InvalidConfig`](memres_core::Error::InvalidConfig) for a
    /// reservation no stream's pool could take
    /// ([`VirtualConfig::check`](memres_core::vpool::VirtualConfig::check)).
    pub fn build_per_stream(&self, device: Device, gauge: Arc<Gauge>) -> Result<VmmPools> {
        let (space, config) = self.space(device, gauge)?;
        Ok(Shared::new_in(PerStreamPool::new(VirtualMaker::new(Arc::new(space), config)?)))
    }

    /// The space of `device`, counted in `gauge`, and the pools'
    /// configuration.
    fn space(
        &self,
        device: Device,
        gauge: Arc<Gauge>,
    ) -> Result<(CountedSpace<CudaVirtualSpace>, VirtualConfig)> {
        let space = CudaVirtualSpace::with_handle_granules(device, self.handle_granules)?
            .with_large_handles(self.large_handles);
        let config = self.virtual_config(device.total_memory()?);
        Ok((CountedSpace::new(space, CudaVirtualSpace::mapped_bytes, gauge), config))
    }
}

/// Reads the options of a `vmm` call (see [`VmmConfig`]).
///
/// # Errors
///
/// A positional argument, an unknown key, a bad size, a reservation of 0
/// bytes, `handle_granules=` not a whole number from 1 to 64, `slack=` not
/// a whole number (of permille, below 2^32), or `large_handles=`,
/// `trim_on_commit=` or `per_stream=` neither `true` nor `false`, at its
/// position.
pub fn vmm_config(call: &Call) -> std::result::Result<VmmConfig, StackError> {
    call.expect_args(
        0,
        &[
            "reserve",
            "release_threshold",
            "handle_granules",
            "large_handles",
            "trim_on_commit",
            "slack",
            "per_stream",
        ],
    )?;
    let mut config = VmmConfig::default();
    if let Some(reserve) = call.size_arg("reserve")? {
        if reserve == 0 {
            let at = call.keyed("reserve").map_or(call.pos, |v| v.pos());
            return Err(StackError::new(
                at,
                StackErrorKind::BadValue("reserve=0: no addresses to pool".into()),
            ));
        }
        config.reserve = Some(reserve);
    }
    if let Some(threshold) = call.size_arg("release_threshold")? {
        config.release_threshold = threshold;
    }
    // `u32_arg` reads digits only: `str::parse` takes a sign (`+8`).
    let granules = "a whole number of granules per handle, 1 to 64";
    if let (Some(n), Some(v)) = (call.u32_arg("handle_granules", granules)?, call.keyed("handle_granules")) {
        if !(1..=64).contains(&n) {
            let why = format!("handle_granules `{}`: {granules}", v.text()?);
            return Err(StackError::new(v.pos(), StackErrorKind::BadValue(why)));
        }
        config.handle_granules = n;
    }
    if let Some(slack) = call.u32_arg("slack", "a whole number of permille")? {
        config.slack_permille = slack;
    }
    if let Some(trim) = call.bool_arg("trim_on_commit")? {
        config.trim_on_commit = trim;
    }
    if let Some(per_stream) = call.bool_arg("per_stream")? {
        config.per_stream = per_stream;
    }
    if let Some(large) = call.bool_arg("large_handles")? {
        config.large_handles = large;
    }
    Ok(config)
}

/// A [`ReservableSpace`] that counts the physical memory it holds in an
/// [`Gauge`]: after every commit and decommit, the change of `held(space)`
/// is added to or taken from the gauge.
///
/// For [`CudaVirtualSpace`], `held` is
/// [`mapped_bytes`](CudaVirtualSpace::mapped_bytes): the memory of a handle
/// stays with the process until its last granule is decommitted, so the
/// mapped bytes, not the committed ones, are what the device has lent.
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::Gauge;
/// use memres_cuda::stack::CountedSpace;
/// use memres_core::vmem::CountingSpace;
/// use memres_core::vpool::{VirtualConfig, VirtualPool};
/// use memres_core::{MemoryResourceMut, Request};
/// use std::sync::Arc;
/// let gauge = Arc::new(Gauge::default());
/// let space = CountedSpace::new(CountingSpace::new(1 << 30, 2 << 20), CountingSpace::committed_bytes, gauge.clone());
/// let mut pool = VirtualPool::with_config(space, VirtualConfig::new(64 << 20))?;
/// let b = pool.allocate(Request::new(3 << 20)?, &())?;
/// assert_eq!(gauge.value(), 4 << 20);
/// pool.deallocate(b, &())?;
/// assert_eq!((gauge.value(), gauge.peak()), (0, 4 << 20));
/// # Ok::<(), memres_core::Error>(())
/// ```
pub struct CountedSpace<V> {
    space: V,
    held: fn(&V) -> u64,
    gauge: Arc<Gauge>,
    /// `held(space)` as last counted in `gauge`. Its lock is held across
    /// each call that may change it (all but `releasable`), so that the
    /// counts of concurrent calls never cross.
    counted: Mutex<u64>,
}

impl<V> CountedSpace<V> {
    /// Counts the bytes `held` says `space` holds in `gauge` (counted
    /// from now on: what it holds already is counted at once).
    pub fn new(space: V, held: fn(&V) -> u64, gauge: Arc<Gauge>) -> Self {
        let now = held(&space);
        gauge.add(now);
        CountedSpace { space, held, gauge, counted: Mutex::new(now) }
    }

    /// The space.
    pub fn inner(&self) -> &V {
        &self.space
    }

    /// Runs `f` on the space, then counts the change of its held bytes.
    fn counting<T>(&self, f: impl FnOnce(&V) -> T) -> T {
        let mut counted = self.counted.lock().unwrap_or_else(|p| p.into_inner());
        let r = f(&self.space);
        let now = (self.held)(&self.space);
        if now > *counted {
            self.gauge.add(now - *counted);
        } else {
            self.gauge.sub(*counted - now);
        }
        *counted = now;
        r
    }
}

impl<V: fmt::Debug> fmt::Debug for CountedSpace<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountedSpace")
            .field("space", &self.space)
            .field("counted", &*self.counted.lock().unwrap_or_else(|p| p.into_inner()))
            .finish_non_exhaustive()
    }
}

impl<V: ReservableSpace> ReservableSpace for CountedSpace<V> {
    fn granule(&self) -> u64 {
        self.space.granule()
    }

    /// Counted too: a reserve, as a release, may unmap a mapping an
    /// earlier failed unmap left in place.
    fn reserve(&self, len: u64) -> Result<Range> {
        self.counting(|s| s.reserve(len))
    }

    /// Counted too: a release may unmap a mapping an earlier failed
    /// unmap left in place.
    fn release(&self, range: Range) -> Result<()> {
        self.counting(|s| s.release(range))
    }

    fn commit(&self, range: Range) -> Result<()> {
        self.counting(|s| s.commit(range))
    }

    fn decommit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
        self.counting(|s| s.decommit(range, stream))
    }

    fn decommit_for_commit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
        self.counting(|s| s.decommit_for_commit(range, stream))
    }

    fn release_kept(&self) {
        self.counting(|s| s.release_kept());
    }

    fn releasable(&self, range: Range, want: u64) -> Option<Range> {
        self.space.releasable(range, want)
    }
}

// SAFETY: every call goes to `V` unchanged (counting only the bytes `V`
// reports mapped), so what `V` commits is what it promised.
unsafe impl<E, V: memres_core::copy::MemoryOf<E>> memres_core::copy::MemoryOf<E> for CountedSpace<V> {}

/// What the space still holds is given back when it drops.
impl<V> Drop for CountedSpace<V> {
    fn drop(&mut self) {
        let counted = self.counted.get_mut().unwrap_or_else(|p| p.into_inner());
        self.gauge.sub(*counted);
        *counted = 0;
    }
}

#[cfg(test)]
mod tests;
