"""Streams from every framework become handles; bad ones are ValueErrors."""

import ctypes

import pytest

import memres
from memres import mr
from memres._stream import as_handle


class TorchLike:
    cuda_stream = 0x1234


class CupyLike:
    ptr = 0x5678


class NumbaLike:
    handle = ctypes.c_void_p(0x9ABC)


class Protocol:
    def __cuda_stream__(self):
        return (0, 0xDEF0)


def test_handles():
    assert as_handle(None) == 0
    assert as_handle(7) == 7
    assert as_handle(memres.Stream(9)) == 9
    assert as_handle(TorchLike()) == 0x1234
    assert as_handle(CupyLike()) == 0x5678
    assert as_handle(NumbaLike()) == 0x9ABC
    assert as_handle(Protocol()) == 0xDEF0
    assert memres.DEFAULT_STREAM == memres.Stream(0)


@pytest.mark.parametrize("bad", [-1, 1 << 64, "s", 1.0, True, object()])
def test_bad_streams(bad):
    with pytest.raises(ValueError):
        as_handle(bad)


def test_resources_take_stream_objects():
    pool = memres.mr.PoolMemoryResource(memres.mr.SimulatedMemoryResource(1 << 30))
    p = pool.allocate(100, stream=TorchLike())
    pool.deallocate(p, 100, stream=CupyLike())
    with pytest.raises(ValueError):
        pool.allocate(100, stream="default")


def test_a_stack_keeps_its_stream_objects_alive_as_long_as_it_lives():
    class Handle:  # a stream object as torch's or cupy's: its handle dies with it
        def __init__(self, handle):
            self.handle_value = handle

        def __cuda_stream__(self):
            return (0, self.handle_value)

    import gc
    import weakref
    s = Handle(7)
    alive = weakref.ref(s)
    res = mr.HostMemoryResource()
    res.allocate(100, stream=s)
    mr.set_current_device_resource(res)
    del s
    mr._current.clear()  # the Python side lets go; the device registry still holds the stack
    del res
    gc.collect()
    assert alive() is not None
    mr.set_current_device_resource(mr.HostMemoryResource())  # and now the registry too
    gc.collect()
    assert alive() is None
