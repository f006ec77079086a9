"""memres as CuPy's allocator, as RMM's ``rmm.allocators.cupy``:

    cupy.cuda.set_allocator(memres_cupy_allocator)
"""

from .._buffer import DeviceBuffer

try:
    import cupy
except ImportError:
    cupy = None


def memres_cupy_allocator(nbytes):
    """A ``cupy.cuda.MemoryPointer`` to ``nbytes`` from the current memres
    resource, on CuPy's current stream, freed when CuPy lets go of it."""
    if cupy is None:
        raise ModuleNotFoundError("memres: no module named cupy")
    stream = cupy.cuda.get_current_stream()
    # The stream object, not its handle: the buffer and the resource keep
    # it alive, so that its handle is not destroyed before the block's
    # free on it.
    buf = DeviceBuffer(size=nbytes, stream=stream)
    dev_id = -1 if buf.ptr else cupy.cuda.device.get_device_id()
    mem = cupy.cuda.UnownedMemory(ptr=buf.ptr, size=buf.size, owner=buf, device_id=dev_id)
    return cupy.cuda.MemoryPointer(mem, 0)
