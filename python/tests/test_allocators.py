"""The framework allocators over host memory, with stand-ins for the
frameworks (the GPU tests run them with the real ones)."""

import ctypes
import gc
import sys
import types
import weakref

import pytest

import memres
from memres import mr
from memres.allocators import cupy as memres_cupy


class FakeCupyStream:
    """As ``cupy.cuda.Stream``: its handle is destroyed when collected."""
    __module__ = "cupy.cuda.stream"

    def __init__(self, ptr):
        self.ptr = ptr


def fake_cupy(stream):
    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id):
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr = mem, mem.ptr + offset

    cuda = types.SimpleNamespace(get_current_stream=lambda: stream, UnownedMemory=UnownedMemory,
                                 MemoryPointer=MemoryPointer,
                                 device=types.SimpleNamespace(get_device_id=lambda: 0))
    return types.SimpleNamespace(cuda=cuda)


def test_the_cupy_allocator_keeps_cupys_stream_alive_as_long_as_the_block(monkeypatch):
    stream = FakeCupyStream(0x1234)
    monkeypatch.setattr(memres_cupy, "cupy", fake_cupy(stream))
    t = mr.TrackingResourceAdaptor(mr.HostMemoryResource())
    mr.set_current_device_resource(t)
    p = memres_cupy.memres_cupy_allocator(100)
    assert t.get_outstanding_count() == 1 and p.ptr == p.mem.owner.ptr
    alive = weakref.ref(stream)
    monkeypatch.undo()
    del stream
    gc.collect()
    assert alive() is not None, "the stream the block is freed on was collected"
    del p
    gc.collect()
    assert t.get_outstanding_count() == 0


def test_the_numba_manager_without_numba_says_what_it_needs():
    from memres.allocators import numba as memres_numba
    if memres_numba._NO_NUMBA is None:
        pytest.skip("Numba is installed here")
    with pytest.raises(ImportError, match="needs Numba"):
        memres_numba.MemresNumbaManager()


class FakeCUdeviceptr:
    """As NVIDIA's binding's ``CUdeviceptr``: an address ``int()`` reads."""

    def __init__(self, addr):
        self.addr = addr

    def __int__(self):
        return self.addr


class NumbaCudaMemoryPointer:
    """What numba-cuda 0.30's ``MemoryPointer`` does with the address it
    is given: a ``c_void_p`` becomes a ``CUdeviceptr``, anything else is
    kept, and both figures read it with ``int()``."""

    def __init__(self, context, pointer, size, owner=None, finalizer=None):
        if isinstance(pointer, ctypes.c_void_p):
            pointer = FakeCUdeviceptr(pointer.value)
        self.context, self.device_pointer, self.size, self.finalizer = context, pointer, size, finalizer

    @property
    def device_ctypes_pointer(self):
        return ctypes.c_size_t(int(self.device_pointer))

    @property
    def device_pointer_value(self):
        return int(self.device_pointer) or None


def fake_numba_driver(**attrs):
    """Modules ``numba.cuda.cudadrv.driver`` and ``drvapi`` with ``attrs``."""
    cudadrv = types.ModuleType("numba.cuda.cudadrv")
    driver = types.ModuleType("numba.cuda.cudadrv.driver")
    drvapi = types.ModuleType("numba.cuda.cudadrv.drvapi")
    driver.__dict__.update(attrs)
    drvapi.cu_device_ptr = ctypes.c_size_t
    cudadrv.driver, cudadrv.drvapi = driver, drvapi
    cuda = types.ModuleType("numba.cuda")
    cuda.cudadrv = cudadrv
    numba = types.ModuleType("numba")
    numba.cuda = cuda
    return {"numba": numba, "numba.cuda": cuda, "numba.cuda.cudadrv": cudadrv,
            "numba.cuda.cudadrv.driver": driver, "numba.cuda.cudadrv.drvapi": drvapi}


def numba_manager(memres_numba, device):
    """A manager over a stand-in for the Numba context of ``device``, as
    Numba's ``HostOnlyCUDAMemoryManager.__init__`` leaves it."""
    manager = memres_numba.MemresNumbaManager.__new__(memres_numba.MemresNumbaManager)
    manager.context = types.SimpleNamespace(device=types.SimpleNamespace(id=device))
    manager.allocations = {}
    return manager


def test_the_numba_manager_serves_its_contexts_device_and_its_reset_frees_what_it_holds(monkeypatch):
    # After `numba.cuda.select_device(1)` its context is device 1's, while
    # memres's current device stays 0: device-1 arrays got device-0 memory.
    from memres.allocators import numba as memres_numba
    for name, module in fake_numba_driver(binding=types.SimpleNamespace(CUdeviceptr=FakeCUdeviceptr)).items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(memres_numba, "MemoryPointer", NumbaCudaMemoryPointer)
    t = {d: mr.TrackingResourceAdaptor(mr.HostMemoryResource(device=d)) for d in (0, 1)}
    for d, res in t.items():
        mr.set_per_device_resource(d, res)
    manager = numba_manager(memres_numba, device=1)
    mp = manager.memalloc(4096)
    assert (t[0].get_outstanding_count(), t[1].get_outstanding_count()) == (0, 1)
    # Numba's context reset() clears the manager's allocations (as RMM's):
    # their memory goes back, and a finalizer run after finds nothing.
    manager.allocations.clear()
    gc.collect()
    assert t[1].get_outstanding_count() == 0
    mp.finalizer()


def test_a_numba_finalizer_run_after_a_reset_leaves_a_new_block_at_its_address_alone(monkeypatch):
    # After Numba's context reset() the address of a block it freed is
    # handed out again; the old pointer's finalizer, run later, took the
    # new block out of the allocations, freeing it under its live array.
    from memres.allocators import numba as memres_numba
    for name, module in fake_numba_driver(binding=types.SimpleNamespace(CUdeviceptr=FakeCUdeviceptr)).items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(memres_numba, "MemoryPointer", NumbaCudaMemoryPointer)
    # A pool hands the address of a block freed out again.
    t = mr.TrackingResourceAdaptor(mr.PoolMemoryResource(mr.HostMemoryResource(), initial_pool_size=1 << 20))
    mr.set_current_device_resource(t)
    manager = numba_manager(memres_numba, device=0)
    old = manager.memalloc(4096)
    manager.allocations.clear()  # reset()
    gc.collect()
    assert t.get_outstanding_count() == 0
    new = manager.memalloc(4096)
    assert new.device_pointer_value == old.device_pointer_value  # the address reused
    old.finalizer()
    gc.collect()
    assert t.get_outstanding_count() == 1
    assert list(manager.allocations) == [new.device_pointer_value]
    new.finalizer()
    gc.collect()
    assert t.get_outstanding_count() == 0 and not manager.allocations


def test_the_numba_manager_hands_numba_cuda_an_address_it_reads(monkeypatch):
    # numba-cuda (no USE_NV_BINDING: NVIDIA's binding only) reads the
    # address with int(): a ctypes c_uint64 raised, and every array failed.
    from memres.allocators import numba as memres_numba
    for name, module in fake_numba_driver(binding=types.SimpleNamespace(CUdeviceptr=FakeCUdeviceptr)).items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(memres_numba, "MemoryPointer", NumbaCudaMemoryPointer)
    t = mr.TrackingResourceAdaptor(mr.HostMemoryResource())
    mr.set_current_device_resource(t)
    manager = numba_manager(memres_numba, device=0)
    mp = manager.memalloc(4096)
    (ptr,) = manager.allocations
    assert mp.device_pointer_value == ptr and mp.device_ctypes_pointer.value == ptr
    assert t.get_outstanding_count() == 1
    mp.finalizer()
    gc.collect()
    assert t.get_outstanding_count() == 0


def test_the_numba_manager_hands_numbas_ctypes_binding_its_own_pointer_type(monkeypatch):
    # Numba's built-in CUDA target with its ctypes binding passes the
    # address to the driver's functions, whose argument type is c_size_t.
    from memres.allocators import numba as memres_numba
    for name, module in fake_numba_driver(USE_NV_BINDING=False).items():
        monkeypatch.setitem(sys.modules, name, module)
    assert type(memres_numba._device_pointer(0x1000)) is ctypes.c_size_t
    assert memres_numba._device_pointer(0x1000).value == 0x1000


class FakeDriver:
    """Numba's driver object: ``cuMemGetInfo`` as NVIDIA's binding returns
    the figures (``nv=True``), or as Numba's ctypes binding takes two
    pointers to write them into (called without them, ctypes raises)."""

    def __init__(self, nv):
        self.nv = nv

    def cuMemGetInfo(self, *pointers):  # noqa: N802 (the driver's name)
        if self.nv:
            return 3 << 30, 80 << 30
        if len(pointers) != 2:
            raise TypeError(f"this function takes at least 2 arguments ({len(pointers)} given)")
        pointers[0]._obj.value, pointers[1]._obj.value = 3 << 30, 80 << 30


@pytest.mark.parametrize("nv", [True, False])
def test_the_numba_managers_memory_info_is_numbas_through_either_binding(monkeypatch, nv):
    # Numba's contexts answer get_memory_info() with a MemoryInfo, whose
    # `free` and `total` callers read; the manager gave a bare tuple, and
    # under Numba's ctypes binding called cuMemGetInfo without its pointers.
    import collections
    from memres.allocators import numba as memres_numba
    info = collections.namedtuple("MemoryInfo", "free,total")
    binding = {} if nv else {"USE_NV_BINDING": False}
    for name, module in fake_numba_driver(driver=FakeDriver(nv), MemoryInfo=info, **binding).items():
        monkeypatch.setitem(sys.modules, name, module)
    got = numba_manager(memres_numba, device=0).get_memory_info()
    assert type(got) is info and (got.free, got.total) == (3 << 30, 80 << 30)


def test_the_numba_manager_with_the_numba_installed_here_hands_out_addresses_it_reads():
    # Where numba.cuda imports (numba-cuda needs the CUDA runtime library
    # to import, not a GPU): its own MemoryPointer, over host memory.
    try:
        from numba.cuda.cudadrv import driver  # noqa: F401
    except Exception as e:  # noqa: BLE001 (any failure to import: no Numba here)
        pytest.skip(f"numba.cuda does not import here: {e}")
    from memres.allocators.numba import MemresNumbaManager
    mr.set_current_device_resource(mr.HostMemoryResource())
    manager = MemresNumbaManager(context=types.SimpleNamespace(device=types.SimpleNamespace(id=0)))
    mp = manager.memalloc(4096)
    (ptr,) = manager.allocations
    assert mp.device_pointer_value == ptr and mp.device_ctypes_pointer.value == ptr


def test_torch_use_keeps_in_one_step_a_resource_another_thread_sets(monkeypatch):
    # use() without a stack gives DEFAULT_STACK only to a device that has
    # no resource: it looked, built the stack and changed PyTorch's
    # allocator without the registry, so a resource another thread set
    # meanwhile was replaced by DEFAULT_STACK.
    from conftest import registry_free_to_another_thread
    import memres.allocators.torch as mt
    free = []
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(
        is_initialized=lambda: False,
        memory=types.SimpleNamespace(change_current_allocator=lambda a: free.append(registry_free_to_another_thread())))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(mt, "memres_torch_allocator", object())
    monkeypatch.setattr(mt, "DEFAULT_STACK", "stats(pool(host))")
    mt.use()
    assert free == [False] and mr.get_current_device_resource().stack == "stats(pool(host))"
