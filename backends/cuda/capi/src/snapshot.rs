//! `memres_snapshot(path)`: a snapshot of every device's memory in the
//! format of PyTorch's `torch.cuda.memory._snapshot()`, for PyTorch's
//! memory viewer (see the repository's `docs/snapshots.md`).
//!
//! Watching costs a lock and a map update on every allocation and free, so
//! it is on only where [`SNAPSHOT_VAR`] is set (to anything but a blank,
//! `0`, `false`, `off` or `no`) when a
//! device is first used: then the device's CUDA leaves are tapped
//! ([`Tap`], [`Side::Segments`]) and its stack's top too
//! ([`Side::Blocks`]), all telling one [`MemoryMap`] per device. Without
//! it, `memres_snapshot` answers -1 and says why. A watched stack takes
//! the same stack strings as an unwatched one, and its `async` leaves'
//! driver pools are in `memres_stats` alike.

use memres_core::adaptor::Gauge;
use memres_core::snapshot::{pickle_devices, write_file, MemoryMap, Side, Tap};
use memres_core::stack::StackBuilder;
use memres_core::{DynResource, Shared};
use memres_cuda::{CudaStream, Device};
use std::ffi::{c_char, c_int, CStr};
use std::path::Path;
use std::sync::Arc;

/// The environment variable that turns watching on (read when a device is
/// first used).
pub const SNAPSHOT_VAR: &str = "MEMRES_SNAPSHOT";

/// The events a device's map keeps (PyTorch's `max_entries`).
pub const TRACE_ENTRIES: usize = 100_000;

/// A device's map, shared by its taps.
pub(crate) type Map = Arc<Shared<MemoryMap>>;

/// Whether [`SNAPSHOT_VAR`] asks for watching: any value but a blank one,
/// `0`, `false`, `off` or `no` (in any case).
pub(crate) fn enabled() -> bool {
    std::env::var_os(SNAPSHOT_VAR).is_some_and(|v| {
        let v = v.to_string_lossy().trim().to_ascii_lowercase();
        !matches!(v.as_str(), "" | "0" | "false" | "off" | "no")
    })
}

/// Registers the CUDA names of `device` in `builder`, as
/// [`memres_cuda::stack::register`] does, with the leaves tapped into a new
/// map; returns the map.
pub(crate) fn register_tapped(
    builder: &mut StackBuilder<CudaStream>,
    device: Device,
    gauge: Arc<Gauge>,
) -> Map {
    let map: Map = Arc::new(Shared::new(MemoryMap::new(TRACE_ENTRIES)));
    // Every name, layers (`prefetch`) too, then the leaves replaced.
    memres_cuda::stack::register(builder, device, gauge.clone());
    let mut leaves = StackBuilder::<CudaStream>::empty();
    memres_cuda::stack::register(&mut leaves, device, gauge);
    let leaves = Arc::new(leaves);
    for name in ["async", "cuda", "managed", "vmm"] {
        let (leaves, map) = (leaves.clone(), map.clone());
        builder.register(name, move |call, cx| {
            let leaf = cx.build_with(&leaves, call)?;
            Ok(cx.keep(call, Tap::new(leaf, map.clone(), Side::Segments)))
        });
    }
    map
}

/// `resource`, of `device`, its blocks told to `map` (an `oom` with the
/// bytes the device has free then; 0 where the driver cannot say).
pub(crate) fn tap_top(
    resource: DynResource<CudaStream>,
    map: &Map,
    device: Device,
) -> DynResource<CudaStream> {
    let device_free = move || device.memory_info().map_or(0, |info| info.free);
    Arc::new(Tap::new(resource, map.clone(), Side::Blocks).with_device_free(device_free))
}

/// Writes the snapshot of every device used so far to `path`.
fn write(path: &str) -> Result<(), String> {
    let why = || {
        format!("memres: snapshots need {SNAPSHOT_VAR}=1 in the environment before a device is first used")
    };
    // Per device: `None` not used yet, `Some(None)` used unwatched.
    let devices: Vec<Option<Option<Map>>> = (0..crate::MAX_DEVICES).map(crate::devices::device_map).collect();
    if devices.iter().any(|d| matches!(d, Some(None))) || (!enabled() && devices.iter().all(Option::is_none))
    {
        return Err(why());
    }
    let used = devices.iter().rposition(Option::is_some).map_or(0, |d| d + 1);
    // Copies, so that no device's lock is held while the file is written.
    let maps: Vec<Option<MemoryMap>> =
        devices[..used].iter().map(|d| d.clone().flatten().map(|m| m.with(|m| m.clone()))).collect();
    let bytes = pickle_devices(&maps.iter().map(Option::as_ref).collect::<Vec<_>>());
    // Whole or not at all: a viewer reading the file meanwhile, or a crash,
    // never finds a truncated pickle.
    write_file(Path::new(path), &bytes).map_err(|e| format!("memres: cannot write snapshot {path}: {e}"))
}

/// Writes a snapshot of every device used so far to the file `path`,
/// whole: into a temporary file beside it, then renamed over it, so that
/// a reader never sees part of one (a device or a pipe is written into as
/// it comes: `snapshot::write_file`). Returns 0, or -1 with a message
/// (`path` is NULL or not UTF-8, the file cannot be written, or
/// [`SNAPSHOT_VAR`] was not set when a device was first used); after a
/// failure a file at `path` is as it was and no temporary file is left.
///
/// # Safety
///
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memres_snapshot(path: *const c_char) -> c_int {
    crate::guard(-1, || {
        if path.is_null() {
            return Err("memres: memres_snapshot: path is NULL".into());
        }
        // SAFETY: not NULL, and NUL-terminated as the caller promises.
        let path = unsafe { CStr::from_ptr(path) };
        let path = path.to_str().map_err(|_| "memres: memres_snapshot: path is not UTF-8".to_string())?;
        write(path).map(|()| 0)
    })
}
