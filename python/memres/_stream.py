"""Streams: whatever names a CUDA stream becomes its integer handle."""


class Stream:
    """memres's stream object: a ``cudaStream_t`` handle it does not own
    (0 is the legacy default stream). Streams of PyTorch, CuPy and Numba,
    and plain integers, are accepted wherever a stream is."""

    __slots__ = ("handle",)

    def __init__(self, handle=0):
        self.handle = as_handle(handle)

    def __int__(self):
        return self.handle

    def __eq__(self, other):
        return isinstance(other, Stream) and other.handle == self.handle

    def __hash__(self):
        return hash(self.handle)

    def __repr__(self):
        return f"memres.Stream({self.handle:#x})"


def as_handle(stream):
    """The ``cudaStream_t`` of ``stream`` as an int: None (the default
    stream), an int, a memres Stream, an object with ``__cuda_stream__``,
    a ``torch.cuda.Stream`` (``cuda_stream``), a ``cupy.cuda.Stream``
    (``ptr``) or a Numba stream (``handle``)."""
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise ValueError(f"memres: {stream!r} is not a stream")
    if isinstance(stream, int):
        if stream < 0 or stream >= 1 << 64:
            raise ValueError(f"memres: stream handle {stream} out of range")
        return stream
    if isinstance(stream, Stream):
        return stream.handle
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        return as_handle(value[1] if isinstance(value, tuple) else value)
    for attr in ("cuda_stream", "ptr"):
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return as_handle(value)
    handle = getattr(stream, "handle", None)  # Numba: a ctypes c_void_p
    if handle is not None:
        return as_handle(getattr(handle, "value", handle) or 0)
    raise ValueError(f"memres: {stream!r} is not a stream (an int, memres.Stream, "
                     "torch/cupy/numba stream)")


DEFAULT_STREAM = Stream(0)
