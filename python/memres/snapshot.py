"""Snapshots of what memres's resources hold, in the format of PyTorch's
``torch.cuda.memory._snapshot()``, for PyTorch's memory viewer
(``pytorch.org/memory_viz``, ``torch.cuda._memory_viz``)::

    memres.snapshot.record_memory_history()
    ...  # build resources, allocate
    memres.snapshot.dump_snapshot("memres.pickle")

While recording, every resource built taps its leaves (the segments: what
it takes from the device) and its program side (the blocks: what its
``allocate``, a ``DeviceBuffer`` or PyTorch's allocator get from it), one
map per device. Resources built before recording started are not seen.
docs/snapshots.md lists the fields memres fills."""

import pickle
import sys

from . import _native
from . import mr as _mr
from ._device import current_device

DEFAULT_MAX_ENTRIES = 100_000
# The largest count the native side takes (its `usize`).
_MAX_COUNT = sys.maxsize * 2 + 1


def _backends():
    from . import cuda_available
    return [_native.sim] + ([_native.cuda()] if cuda_available() else [])


def record_memory_history(enabled="all", max_entries=DEFAULT_MAX_ENTRIES):
    """Starts a new record, or stops recording, as
    ``torch.cuda.memory._record_memory_history``: ``enabled="all"`` (or
    ``True``) records the segments and blocks and keeps the last
    ``max_entries`` events of each device; ``"state"`` records the segments
    and blocks only (each device's trace in ``device_traces`` stays empty); ``None``
    (or ``False``) stops recording: the resources built during the record
    tell it nothing more, and it stays readable as it was. A
    ``max_entries`` past what the native side counts (64 bits) keeps every
    event."""
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries <= 0:
        raise ValueError(f"memres: max_entries must be a positive int, not {max_entries!r}")
    if enabled is None or enabled is False:
        kept = None
    elif enabled is True or enabled == "all":
        kept = min(max_entries, _MAX_COUNT)
    elif enabled == "state":
        kept = 0
    else:
        raise ValueError(f"memres: enabled must be 'all', 'state', None, True or False, not {enabled!r}")
    for module in _backends():
        module.record(kept)


def _pickled(backend):
    """The record as the native side pickles it (protocol 2)."""
    backend = _mr._backend_of(current_device()) if backend is None else backend
    return _native.backend(backend).snapshot()


def snapshot(backend=None):
    """The record of every device as a dict with ``segments`` and
    ``device_traces``, as ``torch.cuda.memory._snapshot()`` (by default of
    the backend of the current device's resource, or of the default it
    would get where it has none yet, which this does not make)."""
    return pickle.loads(_pickled(backend))


def dump_snapshot(filename, backend=None):
    """Writes :func:`snapshot` to ``filename`` (a str, bytes or
    ``os.PathLike`` path, as ``open`` takes) as a pickle, as
    ``torch.cuda.memory._dump_snapshot``, but whole: into a temporary file
    beside it, renamed over it, so that a reader (or a crash midway) never
    finds a truncated pickle (a device or a named pipe, such as
    ``/dev/null``, is written into). An ``OSError`` where it cannot be written
    leaves ``filename`` as it was. The pickle is of protocol 2, which
    PyTorch's viewer reads (it refuses Python's default from 3.14 on, 5)."""
    _native.sim.write_file(_mr._path(filename, "filename"), _pickled(backend))
