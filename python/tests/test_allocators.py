"""The framework allocators over host memory, with stand-ins for the
frameworks (the GPU tests run them with the real ones)."""

import gc
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
