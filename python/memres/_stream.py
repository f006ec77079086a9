"""Streams: a stream object of memres or of a framework becomes the integer
handle the native side takes. A bare int is not a stream: a handle is
wrapped only on purpose, with ``Stream.from_handle``."""

import enum
import itertools

from ._integer import integer

_WHAT_TO_PASS = ("pass a memres.Stream, a torch/CuPy/Numba stream, an object with "
                 "__cuda_stream__, or None for the default stream; wrap a raw cudaStream_t "
                 "you know to be valid with memres.Stream.from_handle(handle)")


class Stream:
    """memres's stream object, as RMM's ``rmm.pylibrmm.stream.Stream``.
    ``Stream()`` (or ``Stream(None)``) makes a new stream on the current
    device, as RMM's does (with CUDA: at the default priority, ordered
    with the legacy default stream unless ``flags`` is
    ``CudaStreamFlags.NON_BLOCKING``; without CUDA, a stream of the
    simulated device, where every call is ordered anyway). The
    stream is destroyed once this object, every ``Stream`` made of it and
    every buffer and resource given it are gone, whatever order the
    garbage collector clears a cycle through them in: a buffer holds the
    stream itself, which the collector never clears. ``DEFAULT_STREAM`` is
    the legacy default stream. ``Stream(obj)`` wraps the stream of ``obj``
    (a memres ``Stream``, a ``torch.cuda.Stream``, a ``cupy.cuda.Stream``,
    a Numba stream or an object with ``__cuda_stream__``) and keeps ``obj``
    alive as long as it is. A buffer made on such an object (wrapped or
    not) holds it out of the collector's sight until its block is freed, so
    that the collector cannot finalize it (destroying its handle) first: a
    cycle through the object and a buffer made on it (an object that keeps
    the buffers made on it) is therefore never collected, a leak until the
    cycle is broken. An int is refused with ``TypeError``, as RMM refuses
    it: a raw handle is wrapped with ``from_handle``."""

    __slots__ = ("handle", "_owner")

    def __init__(self, obj=None, flags=None):
        if obj is None:
            made = _make_stream(CudaStreamFlags.SYNC_DEFAULT if flags is None else flags)
            self.handle = made.handle
            # Owns the stream: it destroys it when its last holder (this
            # object, a buffer, a resource) lets it go.
            self._owner = made
            return
        if flags is not None:
            raise ValueError("memres: flags may only be specified when obj is None (a stream memres makes)")
        self.handle = as_handle(obj)
        # The object whose handle this is: torch's and CuPy's streams
        # destroy their handle when collected.
        self._owner = obj._owner if isinstance(obj, Stream) else obj

    @classmethod
    def from_handle(cls, handle):
        """A ``Stream`` of the raw ``cudaStream_t`` ``handle`` (an int, 0
        for the legacy default stream), as ``cupy.cuda.ExternalStream(ptr)``
        or Numba's ``cuda.external_stream(ptr)``: the one way to pass memres
        a handle that comes from elsewhere (C code, another library).
        memres cannot check it and hands it to the CUDA driver as it is, so
        the caller guarantees that it is a live stream of the context of
        the device it is used on (the current device's, for the current
        resource) for as long as it is used: by the call it is passed to,
        by a ``DeviceBuffer`` made on it until the buffer is freed, and by
        a resource given it (stream-ordered layers remember a stream) until
        the resource is gone. memres neither creates nor destroys it."""
        self = cls.__new__(cls)
        self.handle = _checked(handle)
        self._owner = None
        return self

    def __int__(self):
        return self.handle

    def __cuda_stream__(self):
        """The CUDA stream protocol's ``(version, handle)``: CuPy, Numba
        and cuda-python take a memres ``Stream`` as their own."""
        return (0, self.handle)

    def is_default(self):
        """Whether this is the default stream, the legacy one (handle 0 or
        1), as RMM's (built without per-thread default streams, as
        RMM's wheels are): the per-thread one (2) is not."""
        return self.handle in (0, _LEGACY)

    def synchronize(self):
        """Waits until the work queued on the stream so far has finished,
        as RMM's (on the current device; nothing to wait for without
        CUDA)."""
        from . import _native, cuda_available
        from ._device import current_device
        if cuda_available():
            _native.cuda().synchronize_stream(self.handle, current_device())

    def __eq__(self, other):
        return isinstance(other, Stream) and other.handle == self.handle

    def __hash__(self):
        return hash(self.handle)

    def __repr__(self):
        return f"memres.Stream.from_handle({self.handle:#x})"

    def __reduce__(self):
        # A handle is valid only in the process that has it: another one
        # would hand the driver a stream it does not have. The default
        # streams (0 and 1, the legacy one; 2, the per-thread one) are
        # every process's. RMM's Stream is not picklable at all.
        if self.handle in (0, _LEGACY, _PER_THREAD):
            return _default_stream, (self.handle,)
        raise TypeError("memres: a Stream cannot be pickled: its handle is valid only in this process")

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


def _make_stream(flags):
    """A new stream of the current device: CUDA's where CUDA is available,
    else the simulated device's; ``flags`` a ``CudaStreamFlags``."""
    from . import _native, cuda_available
    from ._device import current_device
    try:
        flags = CudaStreamFlags(flags)
    except ValueError:
        raise ValueError(f"memres: flags must be a CudaStreamFlags, not {flags!r}") from None
    module = _native.cuda() if cuda_available() else _native.sim
    return module.MadeStream(current_device(), non_blocking=flags is CudaStreamFlags.NON_BLOCKING)


class CudaStreamFlags(enum.IntEnum):
    """How a stream memres makes is ordered with the legacy default stream
    (RMM's names and CUDA's values)."""
    SYNC_DEFAULT = 0  # waits for it, and it for the stream
    NON_BLOCKING = 1  # runs beside it (``CU_STREAM_NON_BLOCKING``)


class CudaStreamPool:
    """``pool_size`` streams made once, handed out in turn, as RMM's
    ``rmm.pylibrmm.cuda_stream_pool.CudaStreamPool``: a program that wants
    a stream per task takes them from a pool, so that resources (which
    keep every stream given them) hold a few. The streams live as long as
    the pool or any ``Stream`` it handed out."""

    def __init__(self, pool_size=16, flags=CudaStreamFlags.SYNC_DEFAULT):
        if isinstance(pool_size, bool) or not isinstance(pool_size, int):
            raise TypeError(f"memres: pool_size must be an int, not {pool_size!r}")
        if pool_size <= 0:
            raise ValueError("memres: Pool size must be greater than zero")
        self._streams = tuple(Stream(flags=flags) for _ in range(pool_size))
        self._next = itertools.count()

    def get_stream(self, stream_id=None):
        """The stream ``stream_id`` (any integer from 0, NumPy's too, taken
        modulo ``get_pool_size()`` as RMM's: ``get_stream(task)``), or, with
        none, the next one in turn (safe from several threads: taking a
        number from ``itertools.count`` is one step under the GIL)."""
        if stream_id is None:
            return self._streams[next(self._next) % len(self._streams)]
        number = integer(stream_id)
        if number is None:
            raise TypeError(f"memres: stream_id must be an int, not {stream_id!r}")
        if number < 0:
            raise ValueError(f"memres: Stream id {number} is negative")
        return self._streams[number % len(self._streams)]

    def get_pool_size(self):
        return len(self._streams)


def _default_stream(handle=0):
    """What a pickled default stream becomes: ``DEFAULT_STREAM``,
    ``LEGACY_DEFAULT_STREAM`` or ``PER_THREAD_DEFAULT_STREAM``, by its
    handle (none: 0, as pickled before 1 and 2 pickled)."""
    return {0: DEFAULT_STREAM, _LEGACY: LEGACY_DEFAULT_STREAM, _PER_THREAD: PER_THREAD_DEFAULT_STREAM}[handle]


def _checked(handle):
    """``handle`` if it is an int a ``cudaStream_t`` can be."""
    if isinstance(handle, bool) or not isinstance(handle, int):
        raise TypeError(f"memres: a stream handle is an int, not {type(handle).__name__}")
    if not 0 <= handle < 1 << 64:
        raise ValueError(f"memres: stream handle {handle} out of range")
    return handle


def as_handle(stream):
    """The ``cudaStream_t`` of ``stream`` as an int: None (the default
    stream), a memres Stream, an object with ``__cuda_stream__``, a
    ``torch.cuda.Stream`` (``cuda_stream``), a ``cupy.cuda.Stream``
    (``ptr``) or a Numba stream (``handle``: a ctypes pointer or a
    cuda-python ``CUstream``), each told by its type's package. Anything
    else, a bare int or bool included, is a ``TypeError`` that says what
    to pass."""
    if stream is None:
        return 0
    if isinstance(stream, Stream):
        return stream.handle
    if isinstance(stream, int):  # bool too
        raise TypeError(f"memres: a bare {type(stream).__name__} ({stream!r}) is not a stream: "
                        + _WHAT_TO_PASS)
    # The handles below are the framework's own, of a stream object it made.
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        if not isinstance(value, tuple):
            return _checked(value)
        if len(value) != 2:
            raise ValueError(f"memres: __cuda_stream__() must return (version, handle), not {value!r}")
        version, handle = value
        if version != 0:
            # As RMM: a later version may mean the handle differently.
            raise NotImplementedError(f"memres: only version 0 of the CUDA stream protocol is "
                                      f"supported, not version: '{version}'")
        return _checked(handle)
    # Each framework's attribute only on its own streams, by the module of
    # their type (as RMM tells them by their class): a DeviceBuffer's
    # `ptr` is an address, not a stream.
    framework = type(stream).__module__.partition(".")[0]
    for attr, of in (("cuda_stream", "torch"), ("ptr", "cupy")):
        value = getattr(stream, attr, None)
        if isinstance(value, int) and framework == of:
            return _checked(value)
    # Numba: a ctypes c_void_p, or with NVIDIA's bindings (numba-cuda's
    # default) a cuda-python CUstream, whose int() is the handle.
    handle = getattr(stream, "handle", None)
    if handle is not None and framework == "numba":
        if type(handle).__module__.partition(".")[0] == "cuda":
            return _checked(int(handle))
        return _checked(getattr(handle, "value", handle) or 0)
    raise TypeError(f"memres: {type(stream).__name__} {stream!r} is not a stream: " + _WHAT_TO_PASS)


# The driver's names for the two default streams (``cudaStreamLegacy``,
# ``cudaStreamPerThread``).
_LEGACY, _PER_THREAD = 1, 2

DEFAULT_STREAM = Stream.from_handle(0)
LEGACY_DEFAULT_STREAM = Stream.from_handle(_LEGACY)
PER_THREAD_DEFAULT_STREAM = Stream.from_handle(_PER_THREAD)
