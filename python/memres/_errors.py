"""memres's exceptions (the native module raises these by name)."""


class MemresError(RuntimeError):
    """A backend failed (the CUDA driver said no, a callback raised, an
    upstream resource handed out memory outside its contract...)."""


class InvalidArgument(MemresError, ValueError):
    """A call or a configuration the resource refuses, changing nothing:
    a free of a block it did not hand out or with another size, a pool
    whose maximum is below its initial size, a bad alignment. A
    ``ValueError``, and a ``RuntimeError`` as RMM raises its C++ errors in
    Python, so that either ``except`` catches it."""


class CudaUnavailable(MemresError, ImportError):
    """A CUDA resource was asked for where the CUDA side cannot load."""


class RMMError(Exception):
    """RMM's ``rmm.RMMError``, which neither RMM nor memres raises: here so
    that code that names it (``except rmm.RMMError``) runs unchanged."""

    def __init__(self, errcode, msg):
        self.errcode = errcode
        super().__init__(msg)


class OutOfMemory(MemoryError):
    """An allocation could not be served. Carries the figures the resource
    reported: ``requested`` (bytes asked for), and where known
    ``largest_free`` and ``pool_size`` (of the pool that refused),
    ``max_size``, or ``used`` and ``limit`` (of a limiting adaptor)."""

    def __init__(self, message, requested=None, largest_free=None, pool_size=None,
                 max_size=None, used=None, limit=None):
        super().__init__(message)
        self.requested = requested
        self.largest_free = largest_free
        self.pool_size = pool_size
        self.max_size = max_size
        self.used = used
        self.limit = limit
