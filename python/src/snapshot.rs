//! `memres.snapshot`: what the package's resources hold, in the format of
//! PyTorch's `torch.cuda.memory._snapshot()` (for PyTorch's memory viewer).
//!
//! While recording is on, every stack built taps its leaves ([`Side::Segments`]:
//! what it takes from the device) and its program side ([`Side::Blocks`]:
//! what `allocate`, `DeviceBuffer` and the PyTorch entry hand out; not what
//! it hands to a stack it is the upstream of), all telling one map per
//! device. Stopping a record (or starting another) stops the taps of every
//! stack built during it: its maps stay as they were then, readable. A new
//! record starts new maps. Watching costs a lock and a map update per call,
//! so it is off unless asked for.

use crate::backend::{Engine, Stream, MAX_DEVICES};
use memres_core::snapshot::{pickle_devices, MemoryMap, Recording, Side, Tap};
use memres_core::stack::StackBuilder;
use memres_core::{DynResource, Shared};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::{Arc, Mutex};

/// A device's map in a record, for the taps of every stack built on it
/// while the record runs.
#[derive(Clone)]
pub(crate) struct Map {
    map: Arc<Shared<MemoryMap>>,
    recording: Arc<Recording>,
}

impl Map {
    /// `inner`, told to the map as `side` while its record runs.
    fn tap<R>(&self, inner: R, side: Side) -> Tap<R> {
        Tap::in_record(inner, self.map.clone(), side, self.recording.clone())
    }
}

/// The maps of the current (or last) record, one per device (made on first
/// use); while recording, how many events each keeps and the flag its taps
/// check (`None`: not recording; the maps stay readable).
struct Record {
    recording: Option<(usize, Arc<Recording>)>,
    maps: Vec<Option<Arc<Shared<MemoryMap>>>>,
}

static RECORD: Mutex<Record> = Mutex::new(Record { recording: None, maps: Vec::new() });

/// Starts a record keeping the last `max_entries` events per device (`0`:
/// none, the segments and blocks only), or stops recording (`None`).
/// Either stops the record running: its taps tell nothing more, and its
/// maps stay as they are.
#[pyfunction]
pub(crate) fn record(max_entries: Option<usize>) {
    let mut record = RECORD.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, running)) = record.recording.take() {
        running.stop();
    }
    if let Some(max_entries) = max_entries {
        record.recording = Some((max_entries, Arc::new(Recording::new())));
        record.maps = vec![None; MAX_DEVICES];
    }
}

/// The map of `device` in the record, made on first use; `None` when not
/// recording.
pub(crate) fn map(device: u32) -> Option<Map> {
    let mut record = RECORD.lock().unwrap_or_else(|p| p.into_inner());
    let (max_entries, recording) = record.recording.clone()?;
    let slot = record.maps.get_mut(device as usize)?;
    let map = slot.get_or_insert_with(|| Arc::new(Shared::new(MemoryMap::new(max_entries)))).clone();
    Some(Map { map, recording })
}

/// `builder` with each of `leaves` (names registered in `inner`) tapped
/// into `map` as segments. A leaf of the engine's memory stays one: the
/// tap hands out its blocks unchanged.
pub(crate) fn tap_leaves(
    builder: &mut StackBuilder<Stream>,
    inner: StackBuilder<Stream>,
    leaves: &[&str],
    map: &Map,
) {
    let inner = Arc::new(inner);
    for &name in leaves {
        let (inner, map) = (inner.clone(), map.clone());
        if inner.is_leaf_of::<Engine>(name) {
            builder.register_leaf_of::<Engine>(name, move |call, cx| {
                let leaf = cx.build_leaf_of_with::<Engine>(&inner, call)?;
                Ok(cx.keep_leaf_of(call, map.tap(leaf, Side::Segments)))
            });
        } else {
            builder.register(name, move |call, cx| {
                let leaf = cx.build_with(&inner, call)?;
                Ok(cx.keep(call, map.tap(leaf, Side::Segments)))
            });
        }
    }
}

/// `resource`, of `device`, as the program sees it: its blocks told to
/// `map` while its record runs (an `oom` with the device's free bytes),
/// else `resource` itself.
pub(crate) fn program_side(
    resource: DynResource<Stream>,
    map: Option<Map>,
    device: u32,
) -> DynResource<Stream> {
    match map {
        Some(map) => Arc::new(
            map.tap(resource, Side::Blocks).with_device_free(move || crate::backend::device_free(device)),
        ),
        None => resource,
    }
}

/// Writes `bytes` to the file `path` whole (`memres_core::snapshot::write_file`):
/// a reader, or a crash midway, never finds a truncated pickle.
#[pyfunction]
pub(crate) fn write_file(py: Python<'_>, path: std::path::PathBuf, bytes: Vec<u8>) -> PyResult<()> {
    Ok(crate::gil::detach(py, || memres_core::snapshot::write_file(&path, &bytes))?)
}

/// Every device's map of the current (or last) record as one pickle in
/// the format of `torch.cuda.memory._snapshot()`; an empty snapshot when
/// nothing was recorded.
#[pyfunction]
pub(crate) fn snapshot(py: Python<'_>) -> Bound<'_, PyBytes> {
    // With the GIL released: a map's lock is held while a stack's call
    // runs, which may be in a Python callback.
    let bytes = crate::gil::detach(py, || {
        let maps = RECORD.lock().unwrap_or_else(|p| p.into_inner()).maps.clone();
        let used = maps.iter().rposition(Option::is_some).map_or(0, |d| d + 1);
        // Copies, so that no device's lock is held while pickling.
        let copies: Vec<Option<MemoryMap>> =
            maps[..used].iter().map(|m| m.as_ref().map(|m| m.with(|m| m.clone()))).collect();
        pickle_devices(&copies.iter().map(Option::as_ref).collect::<Vec<_>>())
    });
    PyBytes::new(py, &bytes)
}
