"""``memres.DeviceBuffer``: bytes from a memres resource, as RMM's."""

import operator
import pickle

from ._integer import integer
from ._stream import Stream, as_handle
from . import _native, mr as _mr


# Bytes a copy to a host array holds besides it (`DeviceBuffer._into`).
_CHUNK = 64 << 20


class DeviceBuffer:
    """``size`` zeroed bytes from ``mr`` (the current device resource by
    default), ordered on ``stream`` (None: the default stream; a stream
    object, not a bare int, as every ``stream=``); freed on that stream
    when collected."""

    def __init__(self, *, ptr=None, size=0, stream=None, mr=None):
        # RMM's `ptr=0` is a null pointer: nothing to copy.
        if ptr not in (None, 0):
            raise ValueError("memres: DeviceBuffer(ptr=...) is not supported; use "
                             "copy_from_device or to_device")
        self._init(size, stream, mr, None)

    def _init(self, size, stream, mr, data):
        handle = as_handle(stream)
        # Checked before the default resource is asked for: a refused
        # buffer makes none.
        size = _mr._nbytes(size, "size")
        mr = _mr.get_current_device_resource() if mr is None else mr
        if not isinstance(mr, _mr.DeviceMemoryResource):
            raise TypeError(f"memres: mr must be a memres.mr resource, not {type(mr).__name__}")
        self.mr = mr
        self.stream = stream
        self._native_cls = type(mr._native)
        self._keep_stream(handle, size if data is None else len(data))
        # The native buffer holds what keeps the handle valid until its
        # block is freed on it (after this object, if freed from a
        # callback): the stream a memres `Stream` made (which the collector
        # cannot clear), or a framework's stream object.
        keeper = stream._owner if isinstance(stream, Stream) else stream
        self._buf = _native_buffer(mr)(mr._native, size, handle, data, keeper)

    def _keep_stream(self, handle, nbytes):
        """Has the resource keep the buffer's stream object (``mr._keep``),
        of ``handle``, before a call that asks its stack for ``nbytes``: a
        buffer made empty shows the stack its stream first when it grows."""
        # Not for a call the stack never sees: no bytes, or refused before.
        if self.mr._native.has_bytes and 0 < nbytes <= _native.sim.MAX_REQUEST:
            self.mr._keep(handle, self.stream)

    @classmethod
    def to_device(cls, b, stream=None, mr=None):
        """A buffer holding the bytes of ``b``: ``bytes`` or any 1-D
        contiguous buffer of an 8-bit type, as RMM's."""
        self = cls.__new__(cls)
        self._init(0, stream, mr, bytes(_host_bytes(b, "to_device")))
        return self

    def copy(self):
        """A new buffer holding a copy of the bytes, from the same resource
        on the same stream (RMM's ``DeviceBuffer.copy``)."""
        new = type(self).__new__(type(self))
        new._init(self.size, self.stream, self.mr, None)
        new.copy_from_device(self)
        return new

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce_ex__(self, protocol):
        # As RMM: the bytes, rebuilt into a buffer of the current resource
        # where it is unpickled; from protocol 5 they may travel out of
        # band (a `buffer_callback`), as RMM's NumPy array does.
        if protocol >= 5:
            data = bytearray(self.size)
            self._into(memoryview(data))
            return DeviceBuffer.to_device, (pickle.PickleBuffer(data),)
        return self.__reduce__()

    def __reduce__(self):
        # RMM's: the bytes, rebuilt by `to_device`.
        return DeviceBuffer.to_device, (self.tobytes(),)

    def __bytes__(self):
        return self.tobytes()

    @property
    def ptr(self):
        return self._buf.ptr

    @property
    def size(self):
        return self._buf.size

    @property
    def nbytes(self):
        return self._buf.size

    def __len__(self):
        return self._buf.size

    def __sizeof__(self):
        # As RMM's: the bytes the buffer holds on the device.
        return self._buf.size

    def capacity(self):
        return self._buf.capacity()

    # The methods below run on the buffer's own stream; a ``stream`` given
    # is checked as every ``stream=`` is (a bare int is a TypeError).

    def resize(self, new_size, stream=None):
        as_handle(stream)
        new_size = _mr._nbytes(new_size, "new_size")
        self._keep_stream(as_handle(self.stream), new_size)
        self._buf.resize(new_size)

    def reserve(self, new_capacity, stream=None):
        as_handle(stream)
        new_capacity = _mr._nbytes(new_capacity, "new_capacity")
        self._keep_stream(as_handle(self.stream), new_capacity)
        self._buf.reserve(new_capacity)

    def copy_to_host(self, ary=None, stream=None):
        """The bytes, as a NumPy ``uint8`` array as RMM's (a bytearray
        where NumPy is not installed: memres does not need it), or written
        into ``ary`` (a writable 1-D contiguous buffer of an 8-bit type, of
        at least ``size`` bytes), which is returned."""
        as_handle(stream)
        if ary is None:
            try:
                import numpy
            except ImportError:
                ary = bytearray(self.size)
            else:
                ary = numpy.empty(self.size, dtype=numpy.uint8)
        view = _host_bytes(ary, "copy_to_host")
        if view.readonly or len(view) < self.size:
            raise ValueError(f"memres: copy_to_host needs a writable buffer of {self.size} bytes")
        self._into(view)
        return ary

    def _into(self, view):
        """Copies the bytes to the start of ``view`` (a writable
        ``memoryview`` of bytes) a chunk at a time, so that a copy holds
        no more than a chunk on the host besides it."""
        n = min(self.size, len(view))
        for at in range(0, n, _CHUNK):
            view[at:min(at + _CHUNK, n)] = self._buf.copy_to_host(at, min(_CHUNK, n - at))

    def copy_from_host(self, ary, stream=None):
        """Writes the bytes of ``ary`` (as ``to_device`` takes them) at the
        start of the buffer."""
        as_handle(stream)
        view = _host_bytes(ary, "copy_from_host")
        if len(view) > self.size:
            # Refused whole, before any chunk is written (as each is).
            raise ValueError(f"memres: copy_from_host: {len(view)} bytes into a buffer of {self.size}")
        # A chunk at a time, so that no copy of all of `ary` is made.
        for at in range(0, len(view), _CHUNK):
            self._buf.copy_from_host(bytes(view[at:at + _CHUNK]), at)

    def copy_from_device(self, cuda_ary, stream=None):
        """Copies the bytes of ``cuda_ary`` to the start of this buffer: a
        memres DeviceBuffer, or on CUDA any 1-D contiguous array with
        ``__cuda_array_interface__`` (CuPy, Numba, PyTorch), as RMM's; the
        copy waits for the array's stream where its interface names one (1
        and 2, the default streams, of the array's device)."""
        as_handle(stream)
        if isinstance(cuda_ary, DeviceBuffer):
            if type(cuda_ary.mr._native) is not self._native_cls:
                raise ValueError("memres: copy_from_device between backends (CUDA and simulated)")
            self._buf.copy_from_device(cuda_ary._buf)
            return
        iface = getattr(cuda_ary, "__cuda_array_interface__", None)
        if iface is None:
            raise ValueError("memres: copy_from_device: expected a memres DeviceBuffer or an object "
                             "supporting the `__cuda_array_interface__` protocol")
        if self.mr._backend != "cuda":
            raise ValueError("memres: copy_from_device: a buffer of the simulated backend copies "
                             "only a memres DeviceBuffer")
        ptr, nbytes, stream_handle = _cuda_array(iface)
        # The default streams (1, 2) are those of the array's device, which
        # may not be this buffer's: the driver tells where its data lies.
        src_device = self.mr.device_id
        if stream_handle in (1, 2):
            found = _native.cuda().pointer_device(ptr)
            src_device = src_device if found is None else found
        # `cuda_ary` stays referenced through the call, which waits for its copy.
        self._buf.copy_from_cuda_array(ptr, nbytes, src_device, stream_handle)

    def prefetch(self, device=None, stream=None):
        """Prefetches managed memory to ``device`` (the current device; -1,
        RMM's ``cudaCpuDeviceId``, is the host) on ``stream`` (the
        buffer's own), as RMM's; returns True where the memory migrates and
        was prefetched, False (nothing done) otherwise."""
        from ._device import current_device, device_id
        device = current_device() if device is None else device
        host = integer(device) == -1
        if not host:
            try:
                device = device_id(device)
            except ValueError:
                raise ValueError(f"memres: prefetch: device must be a device number or -1 (the host), "
                                 f"not {device!r}") from None
        handle = None if stream is None else as_handle(stream)
        return self._buf.prefetch(self.mr.device_id, None if host else device, handle)

    def tobytes(self, stream=None):
        """The bytes, as ``bytes`` (``stream`` checked, as RMM's takes
        one, then not used: the copy runs on the buffer's own)."""
        as_handle(stream)
        return self._buf.copy_to_host()

    @property
    def __cuda_array_interface__(self):
        if self.mr._backend != "cuda":
            raise AttributeError("memres: a buffer of the simulated backend is host memory, "
                                 "not CUDA memory: it has no __cuda_array_interface__")
        # The zero fill and the copies run on the buffer's stream: version
        # 3's "stream" tells a consumer to wait for it (1 for the legacy
        # default stream, handle 0 here, which the protocol disallows).
        handle = as_handle(self.stream)
        return {"data": (self.ptr, False), "shape": (self.size,), "strides": None,
                "typestr": "|u1", "version": 3, "stream": handle or 1}

    def __repr__(self):
        return f"<memres.DeviceBuffer size={self.size} ptr={self.ptr:#x}>"


def _cuda_array(iface):
    """``(data pointer, bytes, stream handle or None)`` of a
    ``__cuda_array_interface__`` that describes a 1-D contiguous array
    without a mask; ValueError for another, or for one malformed."""
    try:
        shape, strides = tuple(operator.index(n) for n in iface["shape"]), iface.get("strides")
        strides = None if strides is None else tuple(strides)
        itemsize = int(iface["typestr"][2:])
        ptr = iface["data"][0]
        if strides is not None and len(strides) != len(shape):
            raise ValueError(f"{len(strides)} strides for {len(shape)} dimensions")
        # Version 3's "stream": the producer's stream to order after (None:
        # nothing to wait for; 1 and 2 name the default streams).
        stream = iface.get("stream") if iface.get("version", 0) >= 3 else None
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as e:
        raise ValueError(f"memres: copy_from_device: a malformed __cuda_array_interface__ "
                         f"({type(e).__name__}: {e})") from None
    if len(shape) > 1:
        raise ValueError(f"memres: copy_from_device: only 1-D contiguous arrays are supported, "
                         f"got {len(shape)}-D array")
    if strides is not None and shape and shape[0] > 1 and strides[0] != itemsize:
        raise ValueError("memres: copy_from_device: only 1-D contiguous arrays are supported, "
                         "got a non-contiguous array")
    if iface.get("mask") is not None:
        raise ValueError("memres: copy_from_device: a masked array is not supported")
    nbytes = (shape[0] if shape else 1) * itemsize
    if isinstance(stream, bool) or not (stream is None or isinstance(stream, int) and 0 <= stream < 1 << 64):
        raise ValueError(f"memres: copy_from_device: the interface's stream {stream!r} is no handle")
    return _mr._nbytes(ptr, "the interface's data pointer"), _mr._nbytes(nbytes, "nbytes"), stream


def _host_bytes(b, what):
    """``b`` as bytes on the host: a 1-D contiguous buffer of an 8-bit
    type (``bytes``, ``bytearray``, a ``uint8`` or ``int8`` array), as
    RMM's ``const unsigned char[::1]`` takes it; ValueError for another
    shape or type, TypeError for an object that is no buffer."""
    try:
        view = memoryview(b)
    except TypeError:
        raise TypeError(f"memres: {what} takes a bytes-like buffer, not {type(b).__name__}") from None
    if view.ndim != 1 or not view.c_contiguous or view.format.lstrip("@=<>!") not in ("B", "b", "c"):
        raise ValueError(f"memres: {what} takes a 1-D contiguous buffer of an 8-bit type, not "
                         f"format {view.format!r} of shape {view.shape}")
    return view.cast("B")


def _native_buffer(mr):
    return _native.backend(mr._backend).NativeBuffer
