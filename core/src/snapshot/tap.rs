//! [`Tap`]: a layer that tells a [`MemoryMap`] what passes through it, so
//! that a running stack can dump a snapshot whatever its algorithm.

use super::{MemoryMap, Told};
use crate::primitive::{AtomicBool, Ordering::Relaxed};
use crate::{Block, MemoryResource, Request, Result, Shared, Stream, DEFAULT_ALIGNMENT};
use alloc::sync::Arc;

/// What a [`Tap`] reports its blocks as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Placed over a stack's leaf: what the stack takes from its upstream
    /// (PyTorch's segments), each counted at its request's size rounded up
    /// to [`DEFAULT_ALIGNMENT`] (256 bytes) whatever the request's
    /// alignment, as a device counts what it holds.
    Segments,
    /// Placed at a stack's top: what the program holds (PyTorch's blocks).
    Blocks,
}

/// `inner`, with each allocation and free told to a shared [`MemoryMap`]
/// (an allocation after it succeeds, one of [`Side::Blocks`] that fails
/// for want of memory ([`Error::is_out_of_memory`](crate::Error::is_out_of_memory):
/// `OutOfMemory`, `LimitExceeded`) as an `oom` event, one that fails
/// otherwise not at all; a free before it, taken back if refused, unless another
/// free of the block or segment went through meanwhile (a racing double
/// free; a free whose stream's `id` panics still goes to `inner`, told on
/// the stream the block was taken on); the
/// empty block of a zero-byte request neither way). Two taps over
/// one map, one at the leaf and one at the top, map the stack between them.
///
/// ```
/// use memres_core::pool::CoalescingPool;
/// use memres_core::snapshot::{MemoryMap, Side, Tap};
/// use memres_core::{MemoryResource, Request, Shared};
/// # use memres_core::testing::BumpUpstream;
/// use std::sync::Arc;
/// let map = Arc::new(Shared::new(MemoryMap::new(1000)));
/// let leaf = Tap::new(BumpUpstream::new(1 << 30), map.clone(), Side::Segments);
/// let stack = Tap::new(Shared::new(CoalescingPool::new(leaf)), map.clone(), Side::Blocks);
/// let b = stack.allocate(Request::new(1000)?, &())?;
/// let (held, live) = map.with(|m| (m.held(), m.live()));
/// assert!(held >= 1000 && live == 1000);
/// let pickle: Vec<u8> = map.with(|m| m.pickle()); // torch.cuda.memory._snapshot()'s format
/// # stack.deallocate(b, &())?;
/// # assert!(!pickle.is_empty());
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct Tap<R> {
    inner: R,
    map: Arc<Shared<MemoryMap>>,
    side: Side,
    /// The record it tells while on; `None`: for as long as it lives.
    recording: Option<Arc<Recording>>,
    /// Asks the bytes the device has free, for an `oom` event; `None`: 0.
    device_free: Option<DeviceFree>,
}

/// What asks a device's free bytes (see [`Tap::with_device_free`]).
struct DeviceFree(Arc<dyn Fn() -> u64 + Send + Sync>);

impl core::fmt::Debug for DeviceFree {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("DeviceFree")
    }
}

/// Whether the taps of one record tell their map, shared by them: on when
/// made, until [`stop`](Self::stop)ped, as PyTorch's
/// `_record_memory_history(enabled=None)` stops a record. A stopped
/// record's map stays as it was then, readable.
///
/// ```
/// use memres_core::snapshot::{MemoryMap, Recording, Side, Tap};
/// use memres_core::{MemoryResource, Request, Shared};
/// # use memres_core::testing::BumpUpstream;
/// use std::sync::Arc;
/// let (map, recording) = (Arc::new(Shared::new(MemoryMap::new(1000))), Arc::new(Recording::new()));
/// let tap = Tap::in_record(BumpUpstream::new(1 << 30), map.clone(), Side::Blocks, recording.clone());
/// let b = tap.allocate(Request::new(1000)?, &())?;
/// recording.stop();
/// tap.deallocate(b, &())?;
/// assert_eq!(map.with(|m| m.live()), 1000); // the map as the record stopped
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct Recording(AtomicBool);

impl Recording {
    /// A record running.
    pub fn new() -> Self {
        Recording(AtomicBool::new(true))
    }

    /// Stops it: its taps tell nothing more.
    pub fn stop(&self) {
        self.0.store(false, Relaxed);
    }

    /// Whether it runs.
    pub fn is_on(&self) -> bool {
        self.0.load(Relaxed)
    }
}

impl Default for Recording {
    fn default() -> Self {
        Recording::new()
    }
}

impl<R> Tap<R> {
    /// `inner`, told to `map` as `side`.
    pub fn new(inner: R, map: Arc<Shared<MemoryMap>>, side: Side) -> Self {
        Tap { inner, map, side, recording: None, device_free: None }
    }

    /// `inner`, told to `map` as `side` while `recording` is on.
    pub fn in_record(inner: R, map: Arc<Shared<MemoryMap>>, side: Side, recording: Arc<Recording>) -> Self {
        Tap { inner, map, side, recording: Some(recording), device_free: None }
    }

    /// Tells each `oom` event what `device_free` answers then: the bytes
    /// the device has free, as PyTorch's `oom` events say (without it, 0).
    ///
    /// ```
    /// use memres_core::snapshot::{MemoryMap, Side, Tap};
    /// use memres_core::{MemoryResource, Request, Shared};
    /// # use memres_core::testing::BumpUpstream;
    /// use std::sync::Arc;
    /// let map = Arc::new(Shared::new(MemoryMap::new(10)));
    /// let tap = Tap::new(BumpUpstream::new(1 << 20), map.clone(), Side::Blocks).with_device_free(|| 4096);
    /// assert!(tap.allocate(Request::new(2 << 20)?, &()).is_err());
    /// assert_eq!(map.with(|m| m.trace().last().map(|e| e.addr)), Some(4096)); // an `oom`'s `device_free`
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn with_device_free(mut self, device_free: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        self.device_free = Some(DeviceFree(Arc::new(device_free)));
        self
    }

    /// Whether it tells its map now.
    fn tells(&self) -> bool {
        self.recording.as_ref().is_none_or(|r| r.is_on())
    }

    /// The resource tapped.
    pub fn inner(&self) -> &R {
        &self.inner
    }
}

impl<S: Stream + ?Sized, R: MemoryResource<S>> MemoryResource<S> for Tap<R> {
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        if !self.tells() {
            return self.inner.allocate(request, stream);
        }
        // Read before the inner call: `id` is the user's and may panic,
        // which after it would lose the block it took.
        let id = stream.id();
        let block = match self.inner.allocate(request, stream) {
            Ok(block) => block,
            Err(e) => {
                // PyTorch records an `oom` on out of memory only, and its
                // viewer shows it as such: a backend's error is none.
                if self.side == Side::Blocks && e.is_out_of_memory() {
                    // Asked with the map's lock let go: a driver's call.
                    let free = self.device_free.as_ref().map_or(0, |f| (f.0)());
                    self.map.with(|m| m.oom(request.size(), id, free, None));
                }
                return Err(e);
            }
        };
        if !block.is_empty() {
            self.map.with(|m| match self.side {
                // What a leaf holds for a block: its size in the unit of
                // every request, whatever the block's alignment.
                Side::Segments => {
                    m.segment_alloc(block.addr(), request.rounded_size(DEFAULT_ALIGNMENT), id, None)
                }
                Side::Blocks => m.alloc(block.addr(), block.size(), request.size(), id, None),
            });
        }
        Ok(block)
    }

    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        // The empty block was never told (see `allocate`): its address may
        // be a live block's. A stopped record tells nothing more.
        if block.is_empty() || !self.tells() {
            return self.inner.deallocate(block, stream);
        }
        // The caller gave the block up: should the stream's `id` (the
        // user's) panic, the block still goes back, told on its own stream.
        let unread = GivenUp { tap: self, block, stream };
        let id = stream.id();
        core::mem::forget(unread);
        // Told before the inner resource frees: a block goes before what
        // holds it may go (the free can give a segment back), so that a
        // viewer that undoes the trace event by event never finds a block
        // outside the segments; and once freed, the address may be handed
        // to another thread, whose allocation a late free would end.
        // Refused, or panicking (the inner resource still holds it, as
        // every adaptor takes a free that panicked), the free is taken
        // back as the guard drops.
        let freeing = Freeing::new(&self.map, self.side, block.addr(), id, None);
        self.inner.deallocate(block, stream)?;
        freeing.done();
        Ok(())
    }
}

/// A block given to [`Tap::deallocate`] before the free's stream is known:
/// dropped (the stream's `id` panicked), it is freed and told as freed on
/// the stream it was taken on.
struct GivenUp<'a, R: MemoryResource<S>, S: Stream + ?Sized> {
    tap: &'a Tap<R>,
    block: Block,
    stream: &'a S,
}

impl<R: MemoryResource<S>, S: Stream + ?Sized> Drop for GivenUp<'_, R, S> {
    fn drop(&mut self) {
        let GivenUp { tap, block, stream } = *self;
        crate::resource::in_destructor(|| {
            let freeing = Freeing::on_its_stream(&tap.map, tap.side, block.addr());
            if tap.inner.deallocate(block, stream).is_ok() {
                freeing.done();
            }
        });
    }
}

/// A free told to a shared [`MemoryMap`] before the memory below frees it,
/// as a [`Tap`] tells one: once freed, the address may be handed to
/// another thread and told as its block or segment at once, which a free
/// told afterwards would end. [`done`](Self::done) once the memory below
/// freed it; dropped otherwise (refused, or panicking), it is taken back:
/// the block or segment is back in the map and the free's events leave the
/// trace, as if it had never been told ([`MemoryMap`] says how). Either
/// way, once settled, the map keeps nothing for it; and as the guard
/// settles it when dropped, no free told ahead is left in flight (short of
/// `mem::forget`, which leaks what the free holds in the map: a number at
/// its address until the address is handed out again, and the room of its
/// events among those the trace keeps aside).
///
/// Another free of the address may run at the same time (a double free):
/// the first tells the map, the second finds nothing to tell, and the
/// memory below takes one of them. The second's `done` answers the first,
/// which, refused, then brings nothing back; nor does one refused after
/// the address was told handed out again.
///
/// Settled under the map's lock: done or dropped outside a closure of the
/// same map.
///
/// ```
/// use memres_core::snapshot::{Freeing, MemoryMap, Side};
/// use memres_core::Shared;
/// let map = Shared::new(MemoryMap::new(100));
/// map.with(|m| m.segment_alloc(0x1000, 4096, 0, None));
/// map.with(|m| m.alloc(0x1000, 256, 256, 0, None));
/// let refused = Freeing::new(&map, Side::Blocks, 0x1000, 0, None);
/// assert_eq!(map.with(|m| m.live()), 0);
/// drop(refused); // the memory below refused it
/// assert_eq!(map.with(|m| (m.live(), m.trace().count())), (256, 2));
/// let freeing = Freeing::new(&map, Side::Blocks, 0x1000, 0, None);
/// freeing.done(); // the memory below freed it
/// assert_eq!(map.with(|m| (m.live(), m.trace().count())), (0, 4));
/// ```
#[derive(Debug)]
#[must_use = "dropped, it takes the free back; `done` once the memory below freed it"]
pub struct Freeing<'a> {
    map: &'a Shared<MemoryMap>,
    side: Side,
    addr: u64,
    /// What the free told and its number in flight; `None`: the map held
    /// nothing at the address.
    told: Option<(Told, u64)>,
    /// The stream and time it was told on (`None`: the stream the block or
    /// segment was taken on): a free that told nothing is told when done,
    /// if another's refusal brought the address back meanwhile.
    stream: Option<u64>,
    time_us: Option<u64>,
}

impl<'a> Freeing<'a> {
    /// Tells `map` the free of the block or segment (`side`) at `addr`, on
    /// stream `stream` (as [`MemoryMap::free`] or
    /// [`MemoryMap::segment_free`]), before the memory below frees it.
    pub fn new(map: &'a Shared<MemoryMap>, side: Side, addr: u64, stream: u64, time_us: Option<u64>) -> Self {
        let told = map.with(|m| m.tell_ahead(side, addr, stream, time_us));
        Freeing { map, side, addr, told, stream: Some(stream), time_us }
    }

    /// As [`new`](Self::new), told on the stream the block or segment was
    /// taken on.
    fn on_its_stream(map: &'a Shared<MemoryMap>, side: Side, addr: u64) -> Self {
        let told = map.with(|m| m.tell_ahead(side, addr, m.stream_of(side, addr)?, None));
        Freeing { map, side, addr, told, stream: None, time_us: None }
    }

    /// The memory below freed it: the free stands. A free of the address
    /// told before this one and still in flight (a racing double free)
    /// can no longer be taken back.
    pub fn done(self) {
        let this = core::mem::ManuallyDrop::new(self);
        this.map.with(|m| m.answered(this.side, this.addr, this.told, this.stream, this.time_us));
    }
}

impl Drop for Freeing<'_> {
    fn drop(&mut self) {
        if let Some((told, number)) = self.told.take() {
            self.map.with(|m| m.take_back(self.addr, told, number));
        }
    }
}

// SAFETY: every block is one of `inner`'s, handed out unchanged once
// `inner` has handed it out, and given back only through
// `inner.deallocate`; the map records addresses and never touches the
// memory.
unsafe impl<E, R: crate::copy::MemoryOf<E>> crate::copy::MemoryOf<E> for Tap<R> {}
