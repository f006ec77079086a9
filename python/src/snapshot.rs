//! `memres.snapshot`: what the package's resources hold, in the format of
//! PyTorch's `torch.cuda.memory._snapshot()` (for PyTorch's memory viewer).
//!
//! While recording is on, every stack built taps its leaves ([`Side::Segments`]:
//! what it takes from the device) and its program side ([`Side::Blocks`]:
//! what `allocate`, `DeviceBuffer` and the PyTorch entry hand out; not what
//! it hands to a stack it is the upstream of), all telling one map per
//! device. Starting a record starts new maps; stacks built before keep
//! telling the maps of their time. Watching costs a lock and a map update
//! per call, so it is off unless asked for.

use crate::backend::{Engine, Stream, MAX_DEVICES};
use memres_core::snapshot::{pickle_devices, MemoryMap, Side, Tap};
use memres_core::stack::StackBuilder;
use memres_core::{DynResource, Shared};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::{Arc, Mutex};

/// A device's map, shared by the taps of every stack built on it.
pub(crate) type Map = Arc<Shared<MemoryMap>>;

/// The maps of the current (or last) record, one per device (made on first
/// use), and how many events each keeps while recording (`None`: not
/// recording; the maps stay readable).
struct Record {
    recording: Option<usize>,
    maps: Vec<Option<Map>>,
}

static RECORD: Mutex<Record> = Mutex::new(Record { recording: None, maps: Vec::new() });

/// Starts a record keeping `max_entries` events per device (a positive
/// number), or stops recording (`0`).
#[pyfunction]
pub(crate) fn record(max_entries: usize) {
    let mut record = RECORD.lock().unwrap_or_else(|p| p.into_inner());
    record.recording = (max_entries > 0).then_some(max_entries);
    if record.recording.is_some() {
        record.maps = vec![None; MAX_DEVICES];
    }
}

/// The map of `device` in the record, made on first use; `None` when not
/// recording.
pub(crate) fn map(device: u32) -> Option<Map> {
    let mut record = RECORD.lock().unwrap_or_else(|p| p.into_inner());
    let max_entries = record.recording?;
    let slot = record.maps.get_mut(device as usize)?;
    Some(slot.get_or_insert_with(|| Arc::new(Shared::new(MemoryMap::new(max_entries)))).clone())
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
                Ok(cx.keep_leaf_of(call, Tap::new(leaf, map.clone(), Side::Segments)))
            });
        } else {
            builder.register(name, move |call, cx| {
                let leaf = cx.build_with(&inner, call)?;
                Ok(cx.keep(call, Tap::new(leaf, map.clone(), Side::Segments)))
            });
        }
    }
}

/// `resource` as the program sees it: its blocks told to `map` while a
/// snapshot is recorded, else `resource` itself.
pub(crate) fn program_side(resource: DynResource<Stream>, map: Option<Map>) -> DynResource<Stream> {
    match map {
        Some(map) => Arc::new(Tap::new(resource, map, Side::Blocks)),
        None => resource,
    }
}

/// Every device's map of the current (or last) record as one pickle in
/// the format of `torch.cuda.memory._snapshot()`; an empty snapshot when
/// nothing was recorded.
/// Writes `bytes` to the file `path` whole (`memres_core::snapshot::write_file`):
/// a reader, or a crash midway, never finds a truncated pickle.
#[pyfunction]
pub(crate) fn write_file(py: Python<'_>, path: std::path::PathBuf, bytes: Vec<u8>) -> PyResult<()> {
    Ok(crate::gil::detach(py, || memres_core::snapshot::write_file(&path, &bytes))?)
}

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
