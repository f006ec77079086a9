//! CUDA virtual memory management (`cuMemAddressReserve`, `cuMemCreate`,
//! `cuMemMap`) as the core's [`ReservableSpace`], so that a
//! [`VirtualPool`](memres_core::vpool::VirtualPool) runs on device memory.

use crate::context::{Context, Device};
use crate::error::{check, error_from_code};
use crate::sys;
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
///                   `handle_granules` granules: cuMemCreate + cuMemMap,
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
/// bytes is bounded by `handle_granules - 1` granules per handle, and shows
/// as [`mapped_bytes`](Self::mapped_bytes) minus
/// [`committed_bytes`](Self::committed_bytes). With
/// [`with_handle_granules`](Self::with_handle_granules)`(device, 1)` every
/// decommit is exact.
///
/// **Stream order.** `decommit` synchronizes the stream it is given before
/// it unmaps (as PyTorch's expandable segments do): the unmap follows all
/// work submitted to that stream. A stream whose [`id`](Stream::id) is 0
/// (`()`, or the legacy default stream) also synchronizes the legacy
/// default stream of the device's primary context, which `()` stands for in
/// this crate. Retained granules are not unmapped, so their decommit does
/// not wait at all.
///
/// Every method takes an internal lock; the driver calls are made with the
/// device's primary context current (and the caller's restored).
///
/// # Errors
///
/// Out of physical memory is [`Error::OutOfMemory`] with the range asked
/// for, the device's free memory (`largest_free`), this space's mapped
/// bytes (`pool_size`) and the device's memory (`max_size`); misuse (a range
/// not aligned, outside the reservations, committed twice) is
/// [`Error::InvalidConfig`]; other driver failures are [`Error::Backend`].
/// A failed call changes nothing.
///
/// # Examples
///
/// ```no_run
/// use memres_core::vpool::VirtualPool;
/// use memres_core::{MemoryResourceMut, Request};
/// use memres_cuda::{CudaStream, CudaVirtualSpace, Device};
/// let device = Device::get(0)?;
/// let space = CudaVirtualSpace::new(device)?;
/// let stream = CudaStream::new(device)?;
/// // 64 GiB of addresses, up to 256 MiB of unused memory kept mapped.
/// let mut pool = VirtualPool::new(&space, 64 << 30, 256 << 20)?;
/// let b = pool.allocate(Request::new(3 << 20)?, &stream)?;
/// pool.deallocate(b, &stream)?;
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct CudaVirtualSpace {
    /// The device's primary context, retained while the space lives.
    context: Context,
    /// The driver's minimum granularity for pinned memory on the device.
    granule: u64,
    /// The most granules per physical handle (1 to 64).
    handle_granules: u32,
    state: Mutex<State>,
}

/// One physical handle mapped into a reservation.
#[derive(Debug)]
struct Mapping {
    /// Bytes mapped (a multiple of the granule, at most 64 granules).
    len: u64,
    handle: sys::CuMemGenericAllocationHandle,
    /// Bit `i`: granule `i` of the mapping is committed. Never 0: a mapping
    /// whose last granule is decommitted is unmapped and released.
    committed: u64,
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
    peak_mapped: u64,
    calls: DriverCalls,
}

/// How many driver calls of each kind a [`CudaVirtualSpace`] made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverCalls {
    /// `cuMemCreate` + `cuMemMap` pairs that succeeded.
    pub maps: u64,
    /// `cuMemSetAccess` calls that succeeded.
    pub set_access: u64,
    /// `cuMemUnmap` + `cuMemRelease` pairs.
    pub unmaps: u64,
    /// Stream synchronizations made by `decommit`.
    pub syncs: u64,
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
        let context = device.primary_context()?;
        let prop = Self::prop_of(device);
        let granule = context.scope(|| {
            let mut granule = 0usize;
            // SAFETY: `prop` is a fully initialized `CUmemAllocationProp`
            // (zero where the driver wants zero); the out parameter is a
            // live local.
            check(unsafe {
                sys::cuMemGetAllocationGranularity(&mut granule, &prop, sys::CU_MEM_ALLOC_GRANULARITY_MINIMUM)
            })?;
            Ok(granule as u64)
        })?;
        if !granule.is_power_of_two() || granule < 256 {
            return Err(Error::InvalidConfig {
                what: "the driver's granularity is not a power of two >= 256",
            });
        }
        Ok(CudaVirtualSpace {
            context,
            granule,
            handle_granules: granules,
            state: Mutex::new(State::default()),
        })
    }

    /// Pinned device memory on `device`, no handle types to export.
    fn prop_of(device: Device) -> sys::CuMemAllocationProp {
        sys::CuMemAllocationProp {
            type_: sys::CU_MEM_ALLOCATION_TYPE_PINNED,
            requested_handle_types: 0,
            location: sys::CuMemLocation {
                type_: sys::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device.ordinal() as i32,
            },
            win32_handle_meta_data: core::ptr::null_mut(),
            alloc_flags: [0; 8],
        }
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.context.device()
    }

    /// The context the memory lives in.
    pub fn context(&self) -> &Context {
        &self.context
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

    /// Bytes of device memory mapped now: the committed bytes and the
    /// retained granules of partly decommitted handles.
    pub fn mapped_bytes(&self) -> u64 {
        self.lock().mapped
    }

    /// The most bytes of device memory mapped at once: this space's
    /// physical footprint.
    pub fn peak_mapped_bytes(&self) -> u64 {
        self.lock().peak_mapped
    }

    /// Number of live reservations.
    pub fn reservation_count(&self) -> usize {
        self.lock().reservations.len()
    }

    /// Number of physical handles mapped now.
    pub fn handle_count(&self) -> usize {
        self.lock().mappings.len()
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

    /// Out of memory for a commit of `requested` bytes, with the device's figures.
    fn out_of_memory(&self, requested: u64, mapped: u64) -> Error {
        let info = self.context.memory_info().ok();
        Error::OutOfMemory {
            requested,
            largest_free: info.map_or(0, |i| i.free),
            pool_size: mapped,
            max_size: info.map(|i| i.total),
        }
    }

    /// Creates and maps one handle of `len` bytes at `start` (no access set
    /// yet). Call with the context current.
    fn map_one(&self, start: u64, len: u64) -> core::result::Result<sys::CuMemGenericAllocationHandle, i32> {
        let prop = Self::prop_of(self.device());
        let mut handle = 0;
        // SAFETY: `prop` is fully initialized; `len` is a multiple of the
        // granularity the driver gave for these properties; the out
        // parameter is a live local.
        let rc = unsafe { sys::cuMemCreate(&mut handle, len as usize, &prop, 0) };
        if rc != sys::CUDA_SUCCESS {
            return Err(rc);
        }
        // SAFETY: `start..start + len` lies in a live reservation of this
        // space and no mapping covers it (the caller checked under the
        // lock); `handle` was just made, `len` long; offset and flags 0.
        let rc = unsafe { sys::cuMemMap(start, len as usize, 0, handle, 0) };
        if rc != sys::CUDA_SUCCESS {
            // SAFETY: the handle was just made and is mapped nowhere.
            let _ = unsafe { sys::cuMemRelease(handle) };
            return Err(rc);
        }
        Ok(handle)
    }

    /// Unmaps `start..start + len` (one whole mapping) and releases its
    /// handle. Call with the context current.
    fn unmap_one(start: u64, len: u64, handle: sys::CuMemGenericAllocationHandle) -> sys::CuResult {
        // SAFETY: `start..start + len` is exactly one mapping made by
        // `map_one`; the caller has ordered the unmap after all work that
        // may use it.
        let rc = unsafe { sys::cuMemUnmap(start, len as usize) };
        if rc != sys::CUDA_SUCCESS {
            return rc;
        }
        // SAFETY: the handle's one mapping is gone; it is released once.
        unsafe { sys::cuMemRelease(handle) }
    }

    /// Maps `start..start + len` (no mapping there) in handles of up to
    /// `handle_granules` granules and makes it read/write for the device.
    /// On failure, unmaps what it mapped. Call with the context current.
    fn map_fresh(
        &self,
        start: u64,
        len: u64,
        made: &mut Vec<(u64, u64, u64)>,
    ) -> core::result::Result<(), i32> {
        let chunk = u64::from(self.handle_granules) * self.granule;
        let first = made.len();
        let undo = |made: &mut Vec<(u64, u64, u64)>| {
            for (s, l, h) in made.drain(first..).rev() {
                let _ = Self::unmap_one(s, l, h);
            }
        };
        let mut at = start;
        while at < start + len {
            let l = chunk.min(start + len - at);
            match self.map_one(at, l) {
                Ok(h) => made.push((at, l, h)),
                Err(rc) => {
                    undo(made);
                    return Err(rc);
                }
            }
            at += l;
        }
        let desc = sys::CuMemAccessDesc {
            location: sys::CuMemLocation {
                type_: sys::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.device().ordinal() as i32,
            },
            flags: sys::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `start..start + len` is wholly mapped by the handles just
        // made; one descriptor is passed, and it lives across the call.
        let rc = unsafe { sys::cuMemSetAccess(start, len as usize, &desc, 1) };
        if rc != sys::CUDA_SUCCESS {
            undo(made);
            return Err(rc);
        }
        Ok(())
    }

    /// The start and length of the reservation holding `range`, wholly.
    fn reservation_of(st: &State, range: Range) -> Result<()> {
        match st.reservations.range(..=range.start()).next_back() {
            Some((&s, &l)) if s + l >= range.end() => Ok(()),
            _ => Err(Error::InvalidConfig { what: "range outside the reservations" }),
        }
    }

    /// Calls `f(start, mapping)` for each mapping overlapping `range`, in
    /// address order.
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
}

impl ReservableSpace for CudaVirtualSpace {
    fn granule(&self) -> u64 {
        self.granule
    }

    fn reserve(&self, len: u64) -> Result<Range> {
        if len == 0 || len % self.granule != 0 {
            return Err(Error::InvalidSize { size: len });
        }
        let size = usize::try_from(len).map_err(|_| Error::InvalidSize { size: len })?;
        let mut st = self.lock();
        let start = self.context.scope(|| {
            let mut ptr = 0;
            // SAFETY: the out parameter is a live local; a fixed address of
            // 0 lets the driver choose; alignment is the granularity.
            match unsafe { sys::cuMemAddressReserve(&mut ptr, size, self.granule as usize, 0, 0) } {
                sys::CUDA_SUCCESS => Ok(ptr),
                sys::CUDA_ERROR_OUT_OF_MEMORY => Err(Error::OutOfMemory {
                    requested: len,
                    largest_free: 0,
                    pool_size: st.reservations.values().sum(),
                    max_size: None,
                }),
                rc => Err(error_from_code(rc)),
            }
        })?;
        let range = Range::new(start, len).ok_or(Error::InvalidSize { size: len })?;
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
        self.context.scope(|| {
            // SAFETY: `range` is exactly a live reservation of this space,
            // with nothing mapped in it.
            check(unsafe { sys::cuMemAddressFree(range.start(), range.len() as usize) })
        })?;
        st.reservations.remove(&range.start());
        Ok(())
    }

    fn commit(&self, range: Range) -> Result<()> {
        self.check_shape(range)?;
        let mut st = self.lock();
        Self::reservation_of(&st, range)?;
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
        if pieces.iter().any(|p| matches!(p, Piece::Fresh { .. })) {
            let rc = self.context.scope(|| {
                for p in &pieces {
                    if let Piece::Fresh { start, len } = *p {
                        if let Err(rc) = self.map_fresh(start, len, &mut made) {
                            return Ok(rc);
                        }
                    }
                }
                Ok(sys::CUDA_SUCCESS)
            })?;
            if rc != sys::CUDA_SUCCESS {
                // `map_fresh` undid its own piece; undo the earlier ones.
                // SAFETY of the calls inside: see `unmap_one`; nothing used
                // the memory, which was never handed out.
                let _ = self.context.scope(|| {
                    for (s, l, h) in made.drain(..).rev() {
                        let _ = Self::unmap_one(s, l, h);
                    }
                    Ok(())
                });
                return Err(if rc == sys::CUDA_ERROR_OUT_OF_MEMORY {
                    self.out_of_memory(range.len(), st.mapped)
                } else {
                    error_from_code(rc)
                });
            }
        }
        let st = &mut *st;
        for p in &pieces {
            match *p {
                Piece::Revive { start, bits } => {
                    let m = st.mappings.get_mut(&start).expect("planned under the lock");
                    m.committed |= bits;
                }
                Piece::Fresh { len, .. } => {
                    st.calls.set_access += 1;
                    st.mapped += len;
                }
            }
        }
        for (s, l, handle) in made {
            let committed = mask(0, l / self.granule);
            st.mappings.insert(s, Mapping { len: l, handle, committed });
            st.calls.maps += 1;
        }
        st.committed += range.len();
        st.peak_committed = st.peak_committed.max(st.committed);
        st.peak_mapped = st.peak_mapped.max(st.mapped);
        Ok(())
    }

    fn decommit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
        self.check_shape(range)?;
        let mut st = self.lock();
        // Plan: (start, bits) per mapping; `range` must be wholly committed.
        let mut plan = Vec::new();
        let mut cursor = range.start();
        for (s, m) in Self::overlapping(&st, range) {
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
        if plan.iter().any(|&(_, _, unmap)| unmap) {
            // The unmaps follow the work submitted to `stream` so far.
            stream.synchronize()?;
            if stream.id() == 0 {
                // SAFETY: the null handle names the legacy default stream of
                // the current context, made current by `scope`.
                self.context.scope(|| check(unsafe { sys::cuStreamSynchronize(core::ptr::null_mut()) }))?;
            }
            st.calls.syncs += 1;
            let mut failed = None;
            let mut done = Vec::new();
            self.context.scope(|| {
                for &(s, _, unmap) in &plan {
                    if !unmap {
                        continue;
                    }
                    let m = &st.mappings[&s];
                    let rc = Self::unmap_one(s, m.len, m.handle);
                    if rc != sys::CUDA_SUCCESS {
                        failed = Some(rc);
                        break;
                    }
                    done.push(s);
                }
                Ok(())
            })?;
            if let Some(rc) = failed {
                // Put back what was unmapped (its contents are free memory,
                // not worth keeping), so that the whole range stays committed.
                let _ = self.context.scope(|| {
                    let mut scratch = Vec::new();
                    for &s in &done {
                        let m = st.mappings.get_mut(&s).expect("planned under the lock");
                        scratch.clear();
                        // `map_fresh` maps `len` in handles of up to
                        // `handle_granules` granules: exactly one here.
                        if self.map_fresh(s, m.len, &mut scratch).is_ok() {
                            m.handle = scratch[0].2;
                        }
                    }
                    Ok(())
                });
                return Err(error_from_code(rc));
            }
            for s in done {
                let m = st.mappings.remove(&s).expect("planned under the lock");
                st.mapped -= m.len;
                st.calls.unmaps += 1;
            }
        }
        for (s, bits, _) in plan {
            if let Some(m) = st.mappings.get_mut(&s) {
                m.committed &= !bits;
            }
        }
        st.committed -= range.len();
        Ok(())
    }
}

/// Unmaps and releases everything, then frees every reservation, after the
/// work on the legacy default stream of the device's primary context (and
/// so on its blocking streams): synchronize other streams that used the
/// memory before. Driver errors are ignored.
impl Drop for CudaVirtualSpace {
    fn drop(&mut self) {
        let st = std::mem::take(&mut *self.lock());
        if st.mappings.is_empty() && st.reservations.is_empty() {
            return;
        }
        let _ = self.context.scope(|| {
            if !st.mappings.is_empty() {
                // SAFETY: the null handle names the current context's legacy stream.
                let _ = unsafe { sys::cuStreamSynchronize(core::ptr::null_mut()) };
            }
            for (&s, m) in &st.mappings {
                let _ = Self::unmap_one(s, m.len, m.handle);
            }
            for (&s, &l) in &st.reservations {
                // SAFETY: a live reservation of this space, nothing mapped in
                // it any more; freed once.
                let _ = unsafe { sys::cuMemAddressFree(s, l as usize) };
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_cover_the_granules_asked() {
        assert_eq!(mask(0, 0), 0);
        assert_eq!(mask(0, 1), 1);
        assert_eq!(mask(2, 5), 0b11100);
        assert_eq!(mask(0, 64), u64::MAX);
        assert_eq!(mask(63, 64), 1 << 63);
    }

    #[test]
    fn handle_sizes_out_of_range_are_refused_before_any_driver_call() {
        // Device::get fails without a GPU; with one, the check comes first.
        if let Ok(d) = Device::get(0) {
            assert!(matches!(CudaVirtualSpace::with_handle_granules(d, 0), Err(Error::InvalidConfig { .. })));
            assert!(matches!(
                CudaVirtualSpace::with_handle_granules(d, 65),
                Err(Error::InvalidConfig { .. })
            ));
        }
    }
}
