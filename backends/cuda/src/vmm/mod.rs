//! CUDA virtual memory management (`cuMemAddressReserve`, `cuMemCreate`,
//! `cuMemMap`) as the core's [`ReservableSpace`], so that a
//! [`VirtualPool`](memres_core::vpool::VirtualPool) runs on device memory.

mod driver;
#[cfg(test)]
mod tests;

use crate::context::{Device, MemoryInfo};
use crate::error::error_from_code;
use crate::sys;
use driver::{Code, CudaDriver, Driver};
use memres_core::vmem::ReservableSpace;
use memres_core::{Error, Range, Result, Stream};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// The most granules one physical handle spans: a mapping's committed
/// granules are a bitmap in one `u64`.
const MAX_HANDLE_GRANULES: u32 = 64;

/// A device's virtual address space through the driver's virtual memory
/// management: the [`ReservableSpace`] of a
/// [`VirtualPool`](memres_core::vpool::VirtualPool) on device memory.
///
/// ```text
///  reserve(len)  ── cuMemAddressReserve (aligned to the granule)
///  commit(r)     ── for each uncommitted run of r, in handles of at most
///                   `handle_granules` granules (with large handles, a
///                   long run's may be longer, up to an eighth of it):
///                   cuMemCreate + cuMemMap,
///                   then one cuMemSetAccess (read/write, this device)
///  decommit(r,s) ── s.synchronize(), then cuMemUnmap + cuMemRelease of
///                   every handle none of whose granules is committed now
///  release(r)    ── cuMemAddressFree
///
///  reservation ┌───────────────────────────────────────────────────────┐
///  handles     │ handle A (4 granules) │ B │        │ handle C (3)     │
///  granules    │  C  │  C  │  r  │  C  │ C │  none  │  r  │  r  │  C   │
///              └───────────────────────────────────────────────────────┘
///   C: committed   r: decommitted, still mapped (kept with its handle)
/// ```
///
/// **Handles and partial decommits.** The driver frees physical memory by
/// whole handles only: `cuMemUnmap` takes whole mappings, and a handle
/// cannot be mapped from an offset, so the memory of a handle cannot be
/// split without copying its live contents. One handle per granule makes
/// every decommit exact but costs a `cuMemCreate` and a `cuMemMap` per
/// granule (2 MiB on an H100): thousands of calls for a few GiB. So a run
/// is committed in handles of up to `handle_granules` granules, and a
/// decommit of part of a handle marks those granules decommitted while the
/// handle stays mapped, *retained*; the handle is unmapped and released when
/// its last committed granule is decommitted. Committing a retained granule
/// again costs no driver call. The memory thus held beyond the committed
/// bytes is bounded by one granule less than each handle, and shows
/// as [`mapped_bytes`](Self::mapped_bytes) minus
/// [`committed_bytes`](Self::committed_bytes). A
/// [`VirtualPool`](memres_core::vpool::VirtualPool) retains nothing: the
/// space answers [`ReservableSpace::releasable`] with whole handles, and
/// the pool decommits only those, counting the free granules of a handle
/// that a live block holds as committed. With
/// [`with_handle_granules`](Self::with_handle_granules)`(device, 1)` every
/// handle is a granule, unless [large handles](Self::with_large_handles)
/// map the long runs.
///
/// **Costs.** The driver's time goes by handles, not bytes: each handle
/// committed is a `cuMemCreate`, a `cuMemMap` and a `cuMemSetAccess`, each
/// given back a `cuMemUnmap` and a `cuMemRelease`, so the same bytes in
/// handles of one granule cost many times what they cost in large handles
/// (`docs/measurements.md`, "Figures the rustdoc quotes"). A pool over this
/// space is fast only while it rarely commits or decommits: give it a
/// release threshold above the swing of its live bytes.
///
/// **Handles kept for a commit.** A decommit that makes room for a commit
/// ([`ReservableSpace::decommit_for_commit`], what a
/// [`VirtualPool`](memres_core::vpool::VirtualPool) does when it gives back
/// Idle granules for a new block) unmaps its handles without releasing
/// them, and the commit maps them again where handles of the same length
/// go: no `cuMemCreate` and no `cuMemRelease` for them. What the commits
/// leave goes back at [`ReservableSpace::release_kept`]; until then it
/// counts in [`mapped_bytes`](Self::mapped_bytes).
///
/// **Stream order.** `decommit` synchronizes the stream it is given before
/// it unmaps (as PyTorch's expandable segments do): the unmap follows all
/// work submitted to that stream. A stream whose [`id`](Stream::id) is 0
/// (`()`, or the legacy default stream) also synchronizes the legacy
/// default stream of the device's primary context, which `()` stands for in
/// this crate. Retained granules are not unmapped, so their decommit does
/// not wait at all; the unmap of their handle, on whatever stream, then
/// waits for all work of the context (`cuCtxSynchronize`) where a decommit
/// on another stream retained some of them.
///
/// That order is only as good as the stream's [`Stream::synchronize`]: a
/// stream type whose `synchronize` returns before its work is done (the
/// trait is safe, so nothing makes it wait), or work on other streams not
/// ordered before the decommit, leaves device work using memory that is
/// unmapped under it. That work faults on the device (an illegal address,
/// after which the context fails) or reads and writes whatever is mapped
/// there next: wrong data on the device, never host memory, so no undefined
/// behaviour on the host.
///
/// Every method takes an internal lock; the driver calls are made with the
/// device's primary context current (and the caller's restored).
///
/// # Errors
///
/// Out of physical memory is [`Error::OutOfMemory`] with the range asked
/// for, the device's free memory (`largest_free`), this space's mapped
/// bytes (`pool_size`) and the device's memory (`max_size`); out of
/// addresses at a [`reserve`](ReservableSpace::reserve) is
/// [`Error::OutOfMemory`] too, with the length asked for, no free figure
/// (`largest_free` 0), the bytes this space has reserved (`pool_size`) and
/// no `max_size`; misuse (a range
/// not aligned, outside the reservations, committed twice) is
/// [`Error::InvalidConfig`]; other driver failures are [`Error::Backend`].
/// A failed call changes nothing, but for a decommit whose undo fails too
/// ([`DECOMMITTED_IN_PART`](Self::DECOMMITTED_IN_PART)). Where an undo's
/// `cuMemUnmap` fails too, the mapping stays the driver's: the space keeps
/// it aside, counted in [`mapped_bytes`](Self::mapped_bytes) (and its
/// peak) and in [`handle_count`](Self::handle_count), and tries its unmap
/// again at each later call that reaches the driver (`reserve`, `commit`,
/// `decommit`, `release`, `release_kept`) and at drop; a commit or a release over it is
/// refused ([`Error::Backend`] with [`STUCK`](Self::STUCK)) while the
/// driver still will not unmap it.
///
/// # Examples
///
/// ```no_run
/// use memres_core::vpool::{VirtualConfig, VirtualPool};
/// use memres_core::{MemoryResourceMut, Request};
/// use memres_cuda::{CudaStream, CudaVirtualSpace, Device};
/// let device = Device::get(0)?;
/// let space = CudaVirtualSpace::new(device)?;
/// let stream = CudaStream::new(device)?;
/// // 64 GiB of addresses, up to 256 MiB of unused memory kept mapped.
/// let mut pool = VirtualPool::with_config(&space, VirtualConfig::new(64 << 30).release_threshold(256 << 20))?;
/// let b = pool.allocate(Request::new(3 << 20)?, &stream)?;
/// pool.deallocate(b, &stream)?;
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct CudaVirtualSpace {
    /// The device's primary context (retained while the space lives) and
    /// the calls made in it.
    driver: Box<dyn Driver>,
    device: Device,
    /// The driver's minimum granularity for pinned memory on the device.
    granule: u64,
    /// The most granules per physical handle (1 to 64).
    handle_granules: u32,
    /// Whether a long fresh run may be mapped in handles longer than
    /// `handle_granules`, up to an eighth of it
    /// ([`with_large_handles`](Self::with_large_handles)).
    large_handles: bool,
    state: Mutex<State>,
}

/// One physical handle mapped into a reservation.
#[derive(Debug)]
struct Mapping {
    /// Bytes mapped (a multiple of the granule, at most 64 granules).
    len: u64,
    handle: u64,
    /// Bit `i`: granule `i` of the mapping is committed. Never 0: a mapping
    /// whose last granule is decommitted is unmapped and released.
    committed: u64,
    /// The streams of the decommits that retained granules of it (work on
    /// them may use those granules until the unmap, which waits for it).
    retained_by: Retainers,
}

/// The streams of the decommits that retained a mapping's granules.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Retainers {
    #[default]
    None,
    /// One stream, by its [`id`](Stream::id).
    One(u64),
    /// More than one.
    Several,
}

impl Retainers {
    /// With a decommit on the stream whose id is `id`.
    fn and(self, id: u64) -> Retainers {
        match self {
            Retainers::None => Retainers::One(id),
            Retainers::One(i) if i == id => self,
            _ => Retainers::Several,
        }
    }

    /// Whether the unmap, after a synchronize of the stream whose id is
    /// `id`, must wait for other streams too.
    fn beyond(self, id: u64) -> bool {
        match self {
            Retainers::None => false,
            Retainers::One(i) => i != id,
            Retainers::Several => true,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    /// Live reservations: start to length.
    reservations: BTreeMap<u64, u64>,
    /// Live mappings, by start; each lies inside one reservation, none overlap.
    mappings: BTreeMap<u64, Mapping>,
    /// Bytes of committed granules (the bits set in `mappings`).
    committed: u64,
    peak_committed: u64,
    /// Bytes mapped: the sum of the mappings' lengths.
    mapped: u64,
    /// Handles unmapped by `decommit_for_commit` and not released yet:
    /// length and handle, mapped again by the commits that follow.
    kept: Vec<(u64, u64)>,
    /// Mappings that an undo could not unmap. Mapped still (none overlaps
    /// `mappings`), used by nothing; each call of the space that reaches
    /// the driver tries their unmap again first.
    stuck: Vec<Stuck>,
    /// The most of [`held`](State::held) at once.
    peak_mapped: u64,
    /// What the driver last told of the device's memory, and
    /// [`held`](State::held) then; `None` after a map ran out of memory.
    seen: Option<(MemoryInfo, u64)>,
    calls: DriverCalls,
}

impl State {
    /// Bytes of the handles kept for the commits in progress.
    fn kept_bytes(&self) -> u64 {
        self.kept.iter().map(|&(len, _)| len).sum()
    }

    /// Device memory held: mapped, kept, and stuck.
    fn held(&self) -> u64 {
        self.mapped + self.kept_bytes() + self.stuck.iter().map(|m| m.len).sum::<u64>()
    }
}

/// A mapping of an undone call that the driver would not unmap.
#[derive(Clone, Copy, Debug)]
struct Stuck {
    start: u64,
    len: u64,
    handle: u64,
    /// The failed `cuMemUnmap`'s answer, the last time it was tried.
    code: Code,
}

/// Where an undo puts what it could not unmap, and the counts of what it
/// did: the parts of [`State`] that a call's undo changes.
struct Undo<'a> {
    stuck: &'a mut Vec<Stuck>,
    calls: &'a mut DriverCalls,
}

/// How many driver calls of each kind a [`CudaVirtualSpace`] made that
/// succeeded, those made by its calls that failed (and their undos)
/// included: a map or an unmap the driver refused is not counted.
///
/// # Examples
///
/// ```
/// let calls = memres_cuda::DriverCalls::default();
/// assert_eq!(calls.maps + calls.unmaps, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverCalls {
    /// Mappings made (`cuMemMap` calls that succeeded): of a new handle
    /// (after its `cuMemCreate`), or of a kept one (`reuses`).
    pub maps: u64,
    /// `cuMemSetAccess` calls that succeeded.
    pub set_access: u64,
    /// `cuMemUnmap` calls that succeeded.
    pub unmaps: u64,
    /// Of `maps`, handles mapped again after `decommit_for_commit` kept
    /// them: no `cuMemCreate` for them, and no `cuMemRelease` before.
    pub reuses: u64,
    /// Decommits (and `decommit_for_commit`s) that waited so as to unmap:
    /// one each, however many waits it took (the stream's, the legacy
    /// default stream's for a stream whose id is 0, the whole context's
    /// where other streams retained granules). One whose wait failed is not
    /// counted (it unmapped nothing).
    pub syncs: u64,
    /// `cuMemGetInfo` calls: before mapping fresh memory near full, and
    /// for the figures of an out of memory that a failed map found.
    pub memory_infos: u64,
}

/// A part of a range to commit.
#[derive(Clone, Copy, Debug)]
enum Piece {
    /// Granules `bits` of the mapping at `start`, retained: set the bits.
    Revive { start: u64, bits: u64 },
    /// No mapping there: map new handles.
    Fresh { start: u64, len: u64 },
}

/// Bits `from..to` of a `u64` (`to - from` at most 64).
fn mask(from: u64, to: u64) -> u64 {
    debug_assert!(from <= to && to <= 64);
    if to - from == 64 {
        u64::MAX
    } else {
        ((1u64 << (to - from)) - 1) << from
    }
}

impl CudaVirtualSpace {
    /// The `what` of the [`Error::Backend`] (with the failed `cuMemUnmap`'s
    /// code) of a decommit that failed half-way and then could not map again
    /// all that it had unmapped: unlike other failures, this one changes
    /// something. The handles it could not map again are gone, and their
    /// granules are no longer committed (nor counted in
    /// [`committed_bytes`](Self::committed_bytes), nor in
    /// [`mapped_bytes`](Self::mapped_bytes) unless the undo's own unmap
    /// failed too, which leaves that mapping in place, counted until an
    /// unmap of it succeeds); the rest of the range stays committed. Those granules can be committed again, and a decommit
    /// that covers them is refused as a decommit of uncommitted memory. It
    /// is the core's [`DECOMMITTED_IN_PART`](memres_core::vmem::DECOMMITTED_IN_PART),
    /// on which a [`VirtualPool`](memres_core::vpool::VirtualPool) over the
    /// space commits each granule of the range again, a commit of committed
    /// memory being refused, and so counts what the space holds.
    pub const DECOMMITTED_IN_PART: &'static str = memres_core::vmem::DECOMMITTED_IN_PART;

    /// The `what` of the [`Error::Backend`] (with the code of the failed
    /// `cuMemUnmap`) of a commit or a release over memory that an undone
    /// call left mapped and that the driver still will not unmap. Nothing
    /// changed; the space tries the unmap again at each call that reaches
    /// the driver.
    pub const STUCK: &'static str = "an undone mapping the driver will not unmap lies in the range";

    /// The handles spanned by default: 32 granules (64 MiB on an H100).
    pub const DEFAULT_HANDLE_GRANULES: u32 = 32;

    /// A space of `device`'s addresses in its primary context, committing
    /// in handles of up to [`DEFAULT_HANDLE_GRANULES`](Self::DEFAULT_HANDLE_GRANULES).
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`], e.g. on a device without
    /// virtual memory management.
    pub fn new(device: Device) -> Result<CudaVirtualSpace> {
        Self::with_handle_granules(device, Self::DEFAULT_HANDLE_GRANULES)
    }

    /// A space committing in handles of at most `granules` granules (1 to
    /// 64): 1 makes every decommit exact, more makes large commits cheaper.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for `granules` out of range; the driver's
    /// error as [`Error::Backend`].
    pub fn with_handle_granules(device: Device, granules: u32) -> Result<CudaVirtualSpace> {
        if granules == 0 || granules > MAX_HANDLE_GRANULES {
            return Err(Error::InvalidConfig { what: "handle granules must be 1 to 64" });
        }
        let driver = CudaDriver { context: device.primary_context()? };
        let granule = driver.granularity()?;
        Self::with_driver(Box::new(driver), device, granule, granules)
    }

    fn with_driver(
        driver: Box<dyn Driver>,
        device: Device,
        granule: u64,
        handle_granules: u32,
    ) -> Result<CudaVirtualSpace> {
        if !granule.is_power_of_two() || granule < 256 {
            return Err(Error::InvalidConfig {
                what: "the driver's granularity is not a power of two >= 256",
            });
        }
        Ok(CudaVirtualSpace {
            driver,
            device,
            granule,
            handle_granules,
            large_handles: false,
            state: Mutex::new(State::default()),
        })
    }

    /// Maps a fresh run of at least [`LARGE_RUN`](Self::LARGE_RUN)
    /// granules in handles of the largest power of two of granules within
    /// an eighth of it and a sixty-fourth of what the space has mapped (at
    /// most 64), or of `handle_granules` where that is more: large handles
    /// only ever lengthen handles, so they change something only where
    /// `handle_granules` is below that bound (the recommended stack has
    /// 1). Other runs are mapped in handles of up to `handle_granules`. A new peak of
    /// gigabytes then takes hundreds of handles rather than thousands, and
    /// the driver's time goes by handles (`docs/measurements.md`, "Large
    /// handles").
    ///
    /// The driver frees a handle's memory whole, once none of it is
    /// mapped: the space answers [`ReservableSpace::releasable`] with whole
    /// handles, so that a [`VirtualPool`](memres_core::vpool::VirtualPool)
    /// gives back only those, and counts the free granules of a handle
    /// that holds a live block as held. The bound on a small space (a
    /// sixty-fourth of it) keeps what such handles hold small beside it.
    ///
    /// ```no_run
    /// # use memres_cuda::{CudaVirtualSpace, Device};
    /// let space = CudaVirtualSpace::with_handle_granules(Device::get(0)?, 1)?.with_large_handles(true);
    /// assert!(space.large_handles());
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn with_large_handles(mut self, on: bool) -> Self {
        self.large_handles = on;
        self
    }

    /// Whether long fresh runs get large handles.
    pub fn large_handles(&self) -> bool {
        self.large_handles
    }

    /// The shortest fresh run, in granules, that [`with_large_handles`](Self::with_large_handles)
    /// maps in larger handles: 16, whose eighth is 2.
    pub const LARGE_RUN: u64 = 16;

    /// The length of the handles a fresh run of `len` bytes is mapped in,
    /// with `mapped` bytes mapped before it.
    fn handle_len(&self, len: u64, mapped: u64) -> u64 {
        let granules = u64::from(self.handle_granules);
        let run = len / self.granule;
        if !self.large_handles || run < Self::LARGE_RUN {
            return granules * self.granule;
        }
        // The largest power of two within an eighth of the run and a
        // sixty-fourth of the space.
        let most = (run / 8).min(mapped / self.granule / 64).clamp(1, u64::from(MAX_HANDLE_GRANULES));
        granules.max(1 << most.ilog2()) * self.granule
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The most granules one physical handle spans.
    pub fn handle_granules(&self) -> u32 {
        self.handle_granules
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent between calls: a panic cannot leave it torn.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes committed now.
    pub fn committed_bytes(&self) -> u64 {
        self.lock().committed
    }

    /// The most bytes committed at once.
    pub fn peak_committed_bytes(&self) -> u64 {
        self.lock().peak_committed
    }

    /// Bytes of device memory held now: mapped (the committed bytes and the
    /// retained granules of partly decommitted handles), kept for the
    /// commits in progress ([`ReservableSpace::decommit_for_commit`]), and
    /// mapped by undone calls that the driver would not unmap yet.
    pub fn mapped_bytes(&self) -> u64 {
        self.lock().held()
    }

    /// The most bytes of device memory held at once, as
    /// [`mapped_bytes`](Self::mapped_bytes) counts them: this space's
    /// physical footprint.
    pub fn peak_mapped_bytes(&self) -> u64 {
        self.lock().peak_mapped
    }

    /// Number of live reservations.
    pub fn reservation_count(&self) -> usize {
        self.lock().reservations.len()
    }

    /// Number of physical handles mapped now: those of committed and
    /// retained granules, and those of undone calls that the driver would
    /// not unmap yet (see [`STUCK`](Self::STUCK)).
    pub fn handle_count(&self) -> usize {
        let st = self.lock();
        st.mappings.len() + st.stuck.len()
    }

    /// The driver calls made so far.
    pub fn driver_calls(&self) -> DriverCalls {
        self.lock().calls
    }

    fn check_shape(&self, range: Range) -> Result<()> {
        let g = self.granule;
        if range.is_empty() || range.start() % g != 0 || range.len() % g != 0 {
            return Err(Error::InvalidConfig { what: "range empty or not aligned to the granule" });
        }
        Ok(())
    }

    /// Whether `new` more bytes are beyond the device's free memory. Asks
    /// the driver (`cuMemGetInfo`, timed in `docs/measurements.md`, "GPU:
    /// the virtual-memory pool") only when what it last told, less what
    /// this space took since, leaves less than a sixteenth of
    /// the device beyond `new`: far from full, a fresh commit costs no
    /// question, and near full each one asks. Other users of the device
    /// who take more than that between two questions make a map fail
    /// instead, which is out of memory all the same (and makes the next
    /// commit ask).
    fn beyond_free(&self, st: &mut State, new: u64) -> bool {
        if let Some((info, held)) = st.seen {
            let free = info.free.saturating_add(held).saturating_sub(st.held());
            if free >= new.saturating_add(info.total / 16) {
                return false;
            }
        }
        let info = self.memory_info(st);
        st.seen = info.map(|info| (info, st.held()));
        info.is_some_and(|info| new > info.free)
    }

    /// The device's memory, as the driver tells it now (counted).
    fn memory_info(&self, st: &mut State) -> Option<MemoryInfo> {
        st.calls.memory_infos += 1;
        self.driver.memory_info()
    }

    /// Out of memory for a commit of `requested` bytes, with the device's
    /// figures `info`.
    fn out_of_memory(requested: u64, mapped: u64, info: Option<MemoryInfo>) -> Error {
        Error::OutOfMemory {
            requested,
            largest_free: info.map_or(0, |i| i.free),
            pool_size: mapped,
            max_size: info.map(|i| i.total),
        }
    }

    /// Releases the `kept` handles that the fresh pieces of a commit cannot
    /// all take, the longest first, before it makes new ones: a handle held
    /// beside the new ones would raise the peak. Call with the context
    /// current.
    fn release_unfit(&self, kept: &mut Vec<(u64, u64)>, pieces: &[Piece]) {
        let mut room: Vec<u64> = pieces
            .iter()
            .filter_map(|p| if let Piece::Fresh { len, .. } = *p { Some(len) } else { None })
            .collect();
        kept.sort_unstable_by_key(|&(len, _)| core::cmp::Reverse(len));
        kept.retain(|&(len, handle)| match room.iter_mut().find(|r| **r >= len) {
            Some(r) => {
                *r -= len;
                true
            }
            None => {
                // A handle the driver would not release is lost to the
                // space, as at `release_kept`.
                let _ = self.driver.release(handle);
                false
            }
        });
    }

    /// Maps `start..start + len` (nothing mapped there), pushed on `made`:
    /// first the longest `kept` handles that fit what is left, then new
    /// handles of up to `chunk` bytes; and makes it read/write for the
    /// device, counting its calls in `undo.calls`. On failure, unmaps and
    /// releases what it mapped. Call with the context current.
    fn map_fresh(
        &self,
        (start, len, chunk): (u64, u64, u64),
        made: &mut Vec<(u64, u64, u64)>,
        kept: &mut Vec<(u64, u64)>,
        undo: &mut Undo<'_>,
    ) -> core::result::Result<(), Code> {
        let first = made.len();
        let undo_all = |made: &mut Vec<(u64, u64, u64)>, undo: &mut Undo<'_>| {
            for m in made.drain(first..).rev() {
                self.undo_map(m, undo);
            }
        };
        let mut at = start;
        while at < start + len {
            let rest = start + len - at;
            let fit = (0..kept.len()).filter(|&i| kept[i].0 <= rest).max_by_key(|&i| kept[i].0);
            let l = fit.map_or(chunk.min(rest), |i| kept[i].0);
            let mapped = match fit {
                Some(i) => {
                    let h = kept.swap_remove(i).1;
                    match self.driver.map_kept(at, l, h) {
                        sys::CUDA_SUCCESS => {
                            undo.calls.reuses += 1;
                            Ok(h)
                        }
                        rc => {
                            kept.push((l, h));
                            Err(rc)
                        }
                    }
                }
                None => self.driver.map(at, l),
            };
            match mapped {
                Ok(h) => {
                    undo.calls.maps += 1;
                    made.push((at, l, h));
                }
                Err(rc) => {
                    undo_all(made, undo);
                    return Err(rc);
                }
            }
            at += l;
        }
        match self.driver.set_access(start, len) {
            sys::CUDA_SUCCESS => {
                undo.calls.set_access += 1;
                Ok(())
            }
            rc => {
                undo_all(made, undo);
                Err(rc)
            }
        }
    }

    /// Checks that `range` lies wholly in one reservation.
    fn reservation_of(st: &State, range: Range) -> Result<()> {
        match st.reservations.range(..=range.start()).next_back() {
            Some((&s, &l)) if s + l >= range.end() => Ok(()),
            _ => Err(Error::InvalidConfig { what: "range outside the reservations" }),
        }
    }

    /// The mappings overlapping `range`, in address order.
    fn overlapping(st: &State, range: Range) -> impl Iterator<Item = (u64, &Mapping)> {
        let from = match st.mappings.range(..=range.start()).next_back() {
            Some((&s, m)) if s + m.len > range.start() => s,
            _ => range.start(),
        };
        st.mappings.range(from..range.end()).map(|(&s, m)| (s, m))
    }

    /// The bits of mapping `(s, m)` that `range` covers.
    fn bits_in(&self, s: u64, m: &Mapping, range: Range) -> u64 {
        let lo = range.start().max(s);
        let hi = range.end().min(s + m.len);
        mask((lo - s) / self.granule, (hi - s) / self.granule)
    }

    /// Unmaps and releases the mapping `(start, len, handle)` of an undone
    /// call, or keeps it in `undo.stuck` if the driver will not unmap it:
    /// forgotten, it would stay mapped, and every later map over it fail.
    /// Call with the context current.
    fn undo_map(&self, (start, len, handle): (u64, u64, u64), undo: &mut Undo<'_>) {
        match self.driver.unmap(start, len, handle, false) {
            sys::CUDA_SUCCESS => undo.calls.unmaps += 1,
            code => undo.stuck.push(Stuck { start, len, handle, code }),
        }
    }

    /// Tries again the unmap of every stuck mapping, with the context
    /// entered for it; keeps those the driver still refuses.
    fn unstick(&self, st: &mut State) {
        if st.stuck.is_empty() {
            return;
        }
        let Ok(_current) = self.driver.enter() else { return };
        let mut undo = Undo { stuck: &mut Vec::new(), calls: &mut st.calls };
        for m in core::mem::take(&mut st.stuck) {
            self.undo_map((m.start, m.len, m.handle), &mut undo);
        }
        st.stuck = core::mem::take(undo.stuck);
    }

    /// Refuses a call over `range` while a stuck mapping lies in it.
    fn clear_of_stuck(&self, st: &mut State, range: Range) -> Result<()> {
        self.unstick(st);
        match st.stuck.iter().find(|m| m.start < range.end() && range.start() < m.start + m.len) {
            Some(m) => Err(Error::Backend { code: i64::from(m.code), what: Self::STUCK }),
            None => Ok(()),
        }
    }
}

// SAFETY: reservations are the driver's (`cuMemAddressReserve`), disjoint
// while live. A committed range is device memory: `commit` returns only after
// every granule of it lies in a physical handle of the space's device mapped
// there (`cuMemMap`) with read and write access for that device
// (`cuMemSetAccess`), and it stays so until `decommit` takes the range (a
// handle is unmapped only once none of its granules is committed). The
// space never reads or writes it. Decommitted, released, or after the
// space ends, a range is reserved device addresses or nothing, never host
// memory, and `CudaCopy` has the driver confirm each range is mapped device
// memory before it queues a copy.
unsafe impl memres_core::copy::MemoryOf<crate::CudaCopy> for CudaVirtualSpace {}

impl ReservableSpace for CudaVirtualSpace {
    fn granule(&self) -> u64 {
        self.granule
    }

    fn reserve(&self, len: u64) -> Result<Range> {
        if len == 0 || len % self.granule != 0 {
            return Err(Error::InvalidSize { size: len, what: "not a non-zero multiple of the granule" });
        }
        if usize::try_from(len).is_err() {
            return Err(Error::InvalidSize { size: len, what: "more than a usize holds" });
        }
        let mut st = self.lock();
        self.unstick(&mut st);
        let _current = self.driver.enter()?;
        let start = match self.driver.reserve(len, self.granule) {
            Ok(start) => start,
            Err(sys::CUDA_ERROR_OUT_OF_MEMORY) => {
                return Err(Error::OutOfMemory {
                    requested: len,
                    largest_free: 0,
                    pool_size: st.reservations.values().sum(),
                    max_size: None,
                })
            }
            Err(rc) => return Err(error_from_code(rc)),
        };
        let Some(range) = Range::new(start, len) else {
            let _ = self.driver.free(start, len);
            return Err(Error::InvalidSize {
                size: len,
                what: "the driver's reservation runs past the last address",
            });
        };
        st.reservations.insert(start, len);
        Ok(range)
    }

    fn release(&self, range: Range) -> Result<()> {
        let mut st = self.lock();
        if st.reservations.get(&range.start()) != Some(&range.len()) {
            return Err(Error::UnknownBlock { addr: range.start() });
        }
        if Self::overlapping(&st, range).next().is_some() {
            return Err(Error::InvalidConfig { what: "release of a reservation with committed memory" });
        }
        self.clear_of_stuck(&mut st, range)?;
        let _current = self.driver.enter()?;
        match self.driver.free(range.start(), range.len()) {
            sys::CUDA_SUCCESS => {}
            rc => return Err(error_from_code(rc)),
        }
        st.reservations.remove(&range.start());
        Ok(())
    }

    fn commit(&self, range: Range) -> Result<()> {
        self.check_shape(range)?;
        let mut st = self.lock();
        Self::reservation_of(&st, range)?;
        self.clear_of_stuck(&mut st, range)?;
        let mut pieces = Vec::new();
        let mut cursor = range.start();
        for (s, m) in Self::overlapping(&st, range) {
            if s > cursor {
                pieces.push(Piece::Fresh { start: cursor, len: s - cursor });
            }
            let bits = self.bits_in(s, m, range);
            if m.committed & bits != 0 {
                return Err(Error::InvalidConfig { what: "commit of committed memory" });
            }
            pieces.push(Piece::Revive { start: s, bits });
            cursor = (s + m.len).min(range.end());
        }
        if cursor < range.end() {
            pieces.push(Piece::Fresh { start: cursor, len: range.end() - cursor });
        }
        let mut made = Vec::new();
        let fresh: u64 = pieces.iter().map(|p| if let Piece::Fresh { len, .. } = *p { len } else { 0 }).sum();
        if fresh > 0 {
            // More than the device has free cannot be mapped: answer without
            // a `cuMemCreate` that fails (which tools report as an error).
            let new = fresh.saturating_sub(st.kept_bytes());
            if new > 0 && self.beyond_free(&mut st, new) {
                // `beyond_free` has just asked the driver.
                return Err(Self::out_of_memory(range.len(), st.held(), st.seen.map(|(info, _)| info)));
            }
            let _current = self.driver.enter()?;
            let mut kept = core::mem::take(&mut st.kept);
            self.release_unfit(&mut kept, &pieces);
            for p in &pieces {
                let Piece::Fresh { start, len } = *p else { continue };
                let piece = (start, len, self.handle_len(len, st.mapped));
                let st = &mut *st;
                let mut undo = Undo { stuck: &mut st.stuck, calls: &mut st.calls };
                if let Err(rc) = self.map_fresh(piece, &mut made, &mut kept, &mut undo) {
                    // `map_fresh` undid its own piece; undo the earlier ones.
                    for m in made.drain(..).rev() {
                        self.undo_map(m, &mut undo);
                    }
                    st.kept = kept;
                    // What the undo could not unmap is held from now on.
                    st.peak_mapped = st.peak_mapped.max(st.held());
                    return Err(if rc == sys::CUDA_ERROR_OUT_OF_MEMORY {
                        // Others took memory since the driver was last asked.
                        st.seen = None;
                        let info = self.memory_info(st);
                        Self::out_of_memory(range.len(), st.held(), info)
                    } else {
                        error_from_code(rc)
                    });
                }
            }
            st.kept = kept;
        }
        let st = &mut *st;
        for p in &pieces {
            match *p {
                Piece::Revive { start, bits } => {
                    st.mappings.get_mut(&start).expect("planned under the lock").committed |= bits;
                }
                Piece::Fresh { len, .. } => st.mapped += len,
            }
        }
        for (s, len, handle) in made {
            st.mappings.insert(
                s,
                Mapping { len, handle, committed: mask(0, len / self.granule), retained_by: Retainers::None },
            );
        }
        st.committed += range.len();
        st.peak_committed = st.peak_committed.max(st.committed);
        st.peak_mapped = st.peak_mapped.max(st.held());
        Ok(())
    }

    /// Synchronizes `stream` before it unmaps, and trusts that it waited:
    /// see **Stream order** in [`CudaVirtualSpace`]'s documentation.
    fn decommit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
        self.decommit_in(range, stream, false)
    }

    /// Unmaps without releasing: the handles are kept for the commits that
    /// follow, which map them again (no `cuMemCreate`, and no
    /// `cuMemRelease` before), until [`release_kept`](Self::release_kept).
    fn decommit_for_commit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
        self.decommit_in(range, stream, true)
    }

    /// Whole handles only: those all of whose committed granules lie in
    /// `range`, from the highest down until they hold `want` bytes.
    fn releasable(&self, range: Range, want: u64) -> Option<Range> {
        let st = self.lock();
        let mut taken: Option<(u64, u64)> = None;
        for (&s, m) in st.mappings.range(..range.end()).rev() {
            if s + m.len <= range.start() {
                break;
            }
            if taken.is_some_and(|(lo, hi)| hi - lo >= want) {
                break;
            }
            // A handle that holds committed granules outside `range` is
            // skipped above the run and ends it below.
            if m.committed & !self.bits_in(s, m, range) != 0 {
                match taken {
                    None => continue,
                    Some(_) => break,
                }
            }
            let (lo, hi) = (s.max(range.start()), (s + m.len).min(range.end()));
            if taken.is_some_and(|(below, _)| below != hi) {
                break; // not adjacent: nothing mapped between
            }
            taken = Some((lo, taken.map_or(hi, |(_, top)| top)));
        }
        let (lo, hi) = taken?;
        Range::from_bounds(lo, hi)
    }

    fn release_kept(&self) {
        let mut st = self.lock();
        self.unstick(&mut st);
        if st.kept.is_empty() {
            return;
        }
        let Ok(_current) = self.driver.enter() else { return };
        // A handle the driver would not release is lost to the space, as
        // one whose unmap was not followed by a release would be.
        for (_, handle) in core::mem::take(&mut st.kept) {
            let _ = self.driver.release(handle);
        }
    }
}

impl CudaVirtualSpace {
    /// `decommit`, keeping the handles it unmaps if `keep`.
    fn decommit_in<S: Stream + ?Sized>(&self, range: Range, stream: &S, keep: bool) -> Result<()> {
        self.check_shape(range)?;
        let mut st = self.lock();
        self.unstick(&mut st);
        let st = &mut *st;
        // Per mapping: its start, the bits `range` covers, whether it empties.
        let mut plan = Vec::new();
        let mut cursor = range.start();
        for (s, m) in Self::overlapping(st, range) {
            let bits = self.bits_in(s, m, range);
            if s > cursor || m.committed & bits != bits {
                return Err(Error::InvalidConfig { what: "decommit of uncommitted memory" });
            }
            plan.push((s, bits, m.committed & !bits == 0));
            cursor = (s + m.len).min(range.end());
        }
        if cursor < range.end() {
            return Err(Error::InvalidConfig { what: "decommit of uncommitted memory" });
        }
        let id = stream.id();
        if plan.iter().any(|&(_, _, empties)| empties) {
            // The unmaps follow the work submitted to `stream` so far, and
            // that of the streams whose decommits retained granules of the
            // handles they unmap (all the context's work).
            let others =
                plan.iter().any(|&(s, _, empties)| empties && st.mappings[&s].retained_by.beyond(id));
            // The space's context first: a stream of no context of its
            // own (the legacy one) is that of the context current.
            let _current = self.driver.enter()?;
            stream.synchronize()?;
            let synced = |rc| match rc {
                sys::CUDA_SUCCESS => Ok(()),
                rc => Err(error_from_code(rc)),
            };
            if id == 0 {
                synced(self.driver.sync_legacy())?;
            }
            if others {
                synced(self.driver.sync_context())?;
            }
            st.calls.syncs += 1;
            let mut done = Vec::new();
            for &(s, _, empties) in &plan {
                if !empties {
                    continue;
                }
                let m = &st.mappings[&s];
                match self.driver.unmap(s, m.len, m.handle, keep) {
                    sys::CUDA_SUCCESS => {
                        st.calls.unmaps += 1;
                        done.push(s);
                    }
                    rc => {
                        // Map again what was unmapped (its contents were
                        // free memory), so that the whole range stays
                        // committed: a kept handle where it was, else a
                        // new one.
                        let (mut again, mut none) = (Vec::new(), Vec::new());
                        let mut lost = false;
                        for &s in &done {
                            let m = st.mappings.get_mut(&s).expect("planned under the lock");
                            let mut undo = Undo { stuck: &mut st.stuck, calls: &mut st.calls };
                            if keep && self.driver.map_kept(s, m.len, m.handle) == sys::CUDA_SUCCESS {
                                undo.calls.maps += 1;
                                undo.calls.reuses += 1;
                                if self.driver.set_access(s, m.len) == sys::CUDA_SUCCESS {
                                    undo.calls.set_access += 1;
                                    continue;
                                }
                                self.undo_map((s, m.len, m.handle), &mut undo);
                            } else if keep {
                                let _ = self.driver.release(m.handle);
                            }
                            again.clear();
                            // Within one mapping's length: exactly one handle;
                            // not over a mapping the driver would not unmap.
                            let clear = !undo.stuck.iter().any(|x| x.start == s);
                            if clear
                                && self.map_fresh((s, m.len, m.len), &mut again, &mut none, &mut undo).is_ok()
                            {
                                m.handle = again[0].2;
                                continue;
                            }
                            // Nothing of the space's is mapped there any more
                            // and its handle is gone: the mapping leaves the
                            // table, and its granules (all in `range`) the
                            // counts.
                            let m = st.mappings.remove(&s).expect("planned under the lock");
                            st.mapped -= m.len;
                            st.committed -= u64::from(m.committed.count_ones()) * self.granule;
                            lost = true;
                        }
                        return Err(match lost {
                            true => Error::Backend { code: i64::from(rc), what: Self::DECOMMITTED_IN_PART },
                            false => error_from_code(rc),
                        });
                    }
                }
            }
            for s in done {
                let m = st.mappings.remove(&s).expect("planned under the lock");
                st.mapped -= m.len;
                if keep {
                    st.kept.push((m.len, m.handle));
                }
            }
        }
        for (s, bits, _) in plan {
            if let Some(m) = st.mappings.get_mut(&s) {
                m.committed &= !bits;
                m.retained_by = m.retained_by.and(id);
            }
        }
        st.committed -= range.len();
        Ok(())
    }
}

/// Unmaps and releases everything, then frees every reservation, after the
/// work on the legacy default stream of the device's primary context (and
/// so on its blocking streams): synchronize other streams that used the
/// memory before. Driver errors are ignored, but for a reservation in which
/// an unmap failed: it is not freed (the driver frees only reservations
/// with nothing mapped in them), and its addresses and that memory stay the
/// context's.
impl Drop for CudaVirtualSpace {
    fn drop(&mut self) {
        let st = std::mem::take(&mut *self.lock());
        if st.mappings.is_empty() && st.reservations.is_empty() && st.kept.is_empty() && st.stuck.is_empty() {
            return;
        }
        let Ok(_current) = self.driver.enter() else { return };
        if !st.mappings.is_empty() {
            let _ = self.driver.sync_legacy();
        }
        let stuck = st.stuck.iter().map(|m| (m.start, m.len, m.handle));
        let mut still_mapped = Vec::new();
        for (s, len, handle) in st.mappings.iter().map(|(&s, m)| (s, m.len, m.handle)).chain(stuck) {
            if self.driver.unmap(s, len, handle, false) != sys::CUDA_SUCCESS {
                still_mapped.push(s);
            }
        }
        for &(_, handle) in &st.kept {
            let _ = self.driver.release(handle);
        }
        for (&s, &l) in &st.reservations {
            if !still_mapped.iter().any(|&m| s <= m && m < s + l) {
                let _ = self.driver.free(s, l);
            }
        }
    }
}
