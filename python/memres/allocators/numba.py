"""memres as Numba's memory manager (an EMM plugin), as RMM's
``rmm.allocators.numba``:

    from numba import cuda
    cuda.set_memory_manager(MemresNumbaManager)

or ``NUMBA_CUDA_MEMORY_MANAGER=memres.allocators.numba``.
"""

import weakref

from .._buffer import DeviceBuffer
from ..mr import get_per_device_resource

try:
    from numba.cuda import HostOnlyCUDAMemoryManager, MemoryPointer
    _NO_NUMBA = None
except ImportError as e:
    # The module imports without Numba (`memres.allocators` lists it);
    # the manager is what needs it.
    HostOnlyCUDAMemoryManager = object
    MemoryPointer = None
    _NO_NUMBA = e


class MemresNumbaManager(HostOnlyCUDAMemoryManager):
    """Device memory from the memres resource of the device of the
    manager's Numba context; host memory as Numba's own."""

    def __init__(self, *args, **kwargs):
        if _NO_NUMBA is not None:
            raise ImportError(f"memres: MemresNumbaManager needs Numba's CUDA target "
                              f"(numba.cuda): {_NO_NUMBA}")
        super().__init__(*args, **kwargs)

    def memalloc(self, size):
        # The context's device (`numba.cuda.select_device`), as RMM's
        # current device is the context's.
        buf = DeviceBuffer(size=size, mr=get_per_device_resource(self.context.device.id))
        ptr = buf.ptr
        # Held in the manager's allocations, as RMM's: the context's
        # `reset()` clears them, and each buffer, collected, frees its block
        # (to the resource that made it, which it holds). An empty buffer
        # holds nothing.
        allocations = self.allocations
        if ptr:
            allocations[ptr] = buf
        # Weakly: a reset() frees the buffer. The finalizer then finds
        # another buffer (a block made since at the same address) or none,
        # and leaves it.
        mine = weakref.ref(buf)

        def finalizer():
            held = mine()
            if held is not None and allocations.get(ptr) is held:
                del allocations[ptr]

        return MemoryPointer(self.context, _device_pointer(ptr), size, finalizer=finalizer)

    def get_ipc_handle(self, memory):
        raise NotImplementedError("memres: IPC handles are not supported")

    def get_memory_info(self):
        """Free and total bytes of the current context's device as the
        driver tells them, as Numba's own manager answers: its
        ``MemoryInfo(free, total)``, through NVIDIA's binding (which returns
        the figures) or Numba's ctypes binding (which writes them)."""
        from numba.cuda.cudadrv import driver
        if getattr(driver, "USE_NV_BINDING", True):
            free, total = driver.driver.cuMemGetInfo()
        else:
            import ctypes
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            driver.driver.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total))
            free, total = free.value, total.value
        return driver.MemoryInfo(free=int(free), total=int(total))

    def initialize(self):
        super().initialize()

    @property
    def interface_version(self):
        return 1


def _device_pointer(ptr):
    """``ptr`` as Numba's ``MemoryPointer`` takes a device address, as its
    own allocations make one: NVIDIA's ``CUdeviceptr`` where Numba uses
    NVIDIA's binding (numba-cuda, which has no other and no
    ``USE_NV_BINDING``, and Numba's own CUDA target with
    ``NUMBA_CUDA_USE_NVIDIA_BINDING=1``), else the ctypes type of its
    driver API (``c_size_t``). numba-cuda reads the address with
    ``int()``, which a ctypes integer refuses; Numba's ctypes binding
    passes it to the driver's functions, which refuse a ``c_void_p``."""
    from numba.cuda.cudadrv import driver
    if getattr(driver, "USE_NV_BINDING", True):
        return driver.binding.CUdeviceptr(ptr)
    from numba.cuda.cudadrv import drvapi
    return drvapi.cu_device_ptr(ptr)


# Numba reads this name when NUMBA_CUDA_MEMORY_MANAGER names this module.
_numba_memory_manager = MemresNumbaManager
