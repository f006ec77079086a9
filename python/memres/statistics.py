"""Allocation statistics, as RMM's ``rmm.statistics``: counters of the
current resource's StatisticsResourceAdaptor, in levels, a context manager
around a block of code, and a per-function profiler; also the bytes held
from the device (``get_device_statistics``)."""

import collections
import contextlib
import functools
import inspect
import threading
from dataclasses import dataclass

from . import _native
from . import mr as _mr


@dataclass
class Statistics:
    current_bytes: int = 0
    current_count: int = 0
    peak_bytes: int = 0
    peak_count: int = 0
    total_bytes: int = 0
    total_count: int = 0


def _stats_native():
    """The native stack of the current resource if its outermost resource
    counts (a StatisticsResourceAdaptor, or a stack string with ``stats``
    outermost), else None."""
    native = _mr.get_current_device_resource()._native
    return native if native.statistics() is not None else None


def enable_statistics():
    """Puts a StatisticsResourceAdaptor over the current device resource
    (unless its outermost resource counts already), in one step for other
    threads (the registry held): none sets the device's resource between
    the adaptor's making and its setting."""
    with _mr._REGISTRY:
        if _stats_native() is None:
            _mr.set_current_device_resource(_mr.StatisticsResourceAdaptor(_mr.get_current_device_resource()))




def get_statistics():
    """The counts of the current level, or None when statistics are off."""
    native = _stats_native()
    return None if native is None else _mr._counts(native.statistics())


def push_statistics():
    """Starts a new level of counts; returns those of the level left (None
    when statistics are off)."""
    native = _stats_native()
    return None if native is None else _mr._counts(native.push_statistics())


def pop_statistics():
    """Ends the newest level; returns its counts (None when off)."""
    native = _stats_native()
    return None if native is None else _mr._counts(native.pop_statistics())


@contextlib.contextmanager
def statistics():
    """Counts the allocations of a block in a level of its own; where
    statistics are off, puts a StatisticsResourceAdaptor over the current
    resource for the block and takes it off after. As RMM's, a change of
    the current resource inside the block (another resource set, or
    another device made current) is a ``ValueError`` at its end; unlike
    RMM's, the block's level is popped from the resource it was pushed on
    even then, and an adaptor it put on is taken off its device where it
    is still that device's resource."""
    from ._device import current_device
    # Each end one step for other threads, as `enable_statistics`.
    with _mr._REGISTRY:
        device = current_device()
        pushed = _stats_native()
        if pushed is not None:
            pushed.push_statistics()
            previous = None
        else:
            previous = _mr.get_current_device_resource()
            enable_statistics()
        current = _mr.get_current_device_resource()
    try:
        yield
    finally:
        with _mr._REGISTRY:
            # Looked up without making one: a default made on another
            # device would be its resource from then on.
            changed = _mr._existing(current_device()) is not current
            try:
                if pushed is not None:
                    pushed.pop_statistics()
                elif _mr._existing(device) is current:
                    _mr.set_per_device_resource(device, previous)
            finally:
                if changed:
                    raise ValueError("memres: the current resource was changed inside a statistics() block")


@dataclass
class DeviceStatistics:
    """Bytes held from a device by every memres resource of a backend, and
    what CUDA's stream-ordered pools under its ``async`` leaves reserve
    (they keep memory a resource gave back until the next synchronization,
    so the device may hold more than ``peak_bytes``; 0 without such
    leaves). Each pool counts once, however many leaves view it;
    ``peak_reserved_bytes`` is the sum of each pool's own peak."""
    current_bytes: int
    peak_bytes: int
    total_bytes: int
    reserved_bytes: int = 0
    peak_reserved_bytes: int = 0


def get_device_statistics(device=None, backend=None):
    """Bytes held from ``device`` (the current device) now, at peak and
    ever, by the leaves of ``backend`` (``"cuda"`` or ``"sim"``; by
    default that of ``device``'s resource, or where it has none yet, of
    the default it would get, which this does not make)."""
    from ._device import current_device, device_id
    device = current_device() if device is None else device_id(device)
    backend = _mr._backend_of(device) if backend is None else backend
    return DeviceStatistics(*_native.backend(backend).device_bytes(device))


# The figures a report can be ordered by.
_FIGURES = ("num_calls", "memory_peak", "memory_total")


class ProfilerRecords:
    """Memory figures per profiled name (RMM's ``ProfilerRecords``)."""

    @dataclass
    class MemoryRecord:
        """The figures of one name: calls, bytes allocated in all, the
        largest peak of one call."""
        num_calls: int = 0
        memory_total: int = 0
        memory_peak: int = 0

        def add(self, memory_total, memory_peak):
            self.num_calls += 1
            self.memory_total += memory_total
            self.memory_peak = max(self.memory_peak, memory_peak)

    def __init__(self):
        self._lock = threading.Lock()
        self._records = collections.defaultdict(ProfilerRecords.MemoryRecord)

    def add(self, name, data):
        """Adds the ``Statistics`` of one call of ``name`` (thread-safe)."""
        with self._lock:
            self._records[name].add(data.total_bytes, data.peak_bytes)

    @property
    def records(self):
        with self._lock:
            return dict(self._records)

    def report(self, ordered_by="memory_peak"):
        """A table of the records, largest first by ``ordered_by``
        (``num_calls``, ``memory_peak`` or ``memory_total``; another is a
        ``ValueError``), in RMM's words and layout: the legend, the order,
        then a row per name with thousands separated by commas; no final
        newline."""
        if ordered_by not in _FIGURES:
            raise ValueError(f"memres: ordered_by must be one of {', '.join(_FIGURES)}, not {ordered_by!r}")
        rows = sorted(self.records.items(), key=lambda kv: getattr(kv[1], ordered_by), reverse=True)
        head = "Memory Profiling\n================\n\n"
        if not rows:
            return head + "No data, maybe profiling wasn't enabled?"
        lines = [
            "Legends:",
            "  ncalls       - number of times the function or code block was called",
            "  memory_peak  - peak memory allocated in function or code block (in bytes)",
            "  memory_total - total memory allocated in function or code block (in bytes)",
            "",
            f"Ordered by: {ordered_by}",
            "",
            "ncalls     memory_peak    memory_total  filename:lineno(function)",
        ]
        lines += [f"{r.num_calls:6,d} {r.memory_peak:15,d} {r.memory_total:15,d}  {name}" for name, r in rows]
        return head + "\n".join(lines)

    def __str__(self):
        return self.report()

    def __repr__(self):
        return f"{type(self).__name__}({self.records})"


def _get_descriptive_name_of_object(obj):
    """``file:line(qualified name)`` of a function (RMM's name of a
    profiled function). Where its source cannot be read (a function made
    by ``exec``, a builtin), the file and line its code names, else
    ``<unknown>:0`` (RMM's raises ``OSError`` or ``TypeError`` there: such a
    function can be profiled only with ``name=``)."""
    obj = inspect.unwrap(obj)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    try:
        _, line = inspect.getsourcelines(obj)
        return f"{inspect.getfile(obj)}:{line}({qualname})"
    except (OSError, TypeError):
        code = getattr(obj, "__code__", None)
        where = f"{code.co_filename}:{code.co_firstlineno}" if code is not None else "<unknown>:0"
        return f"{where}({qualname})"


default_profiler_records = ProfilerRecords()


def profiler(*, records=default_profiler_records, name=""):
    """A ``ProfilerContext`` that records into ``records`` under ``name``,
    as RMM's: ``@profiler()``, ``with profiler(name="block"):``."""
    return ProfilerContext(records, name)


class ProfilerContext:
    """Records the statistics of a function (as a decorator; named by
    ``name`` or else by ``_get_descriptive_name_of_object``) or of a block
    (as a context manager, ``name`` required), each call in a level of
    its own, into ``records``. As RMM's, it records nothing where
    statistics are off when the call begins (``enable_statistics``,
    ``statistics()``). Each call's level is popped from the resource it was
    pushed on, even if the current resource changed meanwhile (statistics
    put on inside the call, or another resource set): popped from the
    current one, it was a level the call did not push, or none
    (``IndexError``)."""

    def __init__(self, records, name):
        self.records = records
        self.name = name
        # Per thread, innermost last: the native stack each open call
        # pushed a level on (None where statistics were off).
        self._pushed = threading.local()

    def __call__(self, func):
        name = self.name or _get_descriptive_name_of_object(func)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with ProfilerContext(self.records, name):
                return func(*args, **kwargs)
        return wrapper

    def __enter__(self):
        if not self.name:
            raise ValueError("memres: a profiler used as a context manager needs name=")
        native = _stats_native()
        if native is not None:
            native.push_statistics()
        self._open().append(native)
        return self

    def __exit__(self, *exc):
        native = self._open().pop()
        if native is not None:
            self.records.add(self.name, _mr._counts(native.pop_statistics()))
        return False

    def _open(self):
        """This thread's open calls (``_pushed``)."""
        if not hasattr(self._pushed, "natives"):
            self._pushed.natives = []
        return self._pushed.natives
