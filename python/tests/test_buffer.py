"""memres.DeviceBuffer over host memory (the simulated backend's memory
with bytes)."""

import array
import copy
import gc
import pickle
import types

import pytest

import memres
from memres import mr


def tracked():
    t = mr.TrackingResourceAdaptor(mr.PoolMemoryResource(mr.HostMemoryResource()))
    return t


def test_to_device_and_back():
    buf = memres.DeviceBuffer.to_device(b"hello memres")
    assert buf.size == buf.nbytes == len(buf) == 12
    assert bytes(buf.copy_to_host()) == b"hello memres"
    out = bytearray(20)
    assert buf.copy_to_host(out) is out and out[:12] == b"hello memres"
    with pytest.raises(ValueError):
        buf.copy_to_host(bytearray(3))


def test_copy_to_host_is_a_numpy_array_as_rmms_and_a_bytearray_without_numpy(monkeypatch):
    buf = memres.DeviceBuffer.to_device(b"abc")
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        got = buf.copy_to_host()
        assert isinstance(got, np.ndarray) and got.dtype == np.uint8 and got.tolist() == [97, 98, 99]
        got[0] = 0  # its own bytes, writable as RMM's
        assert bytes(buf.copy_to_host()) == b"abc"
    monkeypatch.setitem(__import__("sys").modules, "numpy", None)  # as if NumPy were not installed
    got = buf.copy_to_host()
    assert type(got) is bytearray and got == b"abc"


def test_a_copy_to_the_host_holds_a_chunk_at_most_besides_its_array(monkeypatch):
    # It held the bytes twice more (a `bytes`, then a `bytearray`), even
    # to fill an array the caller had made: 2 GiB more for 1 GiB.
    import tracemalloc
    from memres import _buffer
    monkeypatch.setattr(_buffer, "_CHUNK", 1 << 20)
    data = bytes(range(256)) * (8 << 12) + b"tail"  # 8 MiB and a part chunk
    buf = memres.DeviceBuffer.to_device(data, mr=mr.HostMemoryResource())
    out = bytearray(len(data) + 3)
    tracemalloc.start()
    try:
        assert buf.copy_to_host(out) is out
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out[:len(data)] == data and out[len(data):] == bytes(3)
    assert peak < 3 << 20, f"{peak} bytes held besides the array"
    assert bytes(buf.copy_to_host()) == data and buf.tobytes() == data
    assert pickle.loads(pickle.dumps(buf, protocol=5)).tobytes() == data
    assert pickle.loads(pickle.dumps(buf, protocol=2)).tobytes() == data
    assert buf._buf.copy_to_host(len(data) - 4) == b"tail" and buf._buf.copy_to_host(3, 2) == data[3:5]
    back = bytes(reversed(data))
    tracemalloc.start()
    try:
        buf.copy_from_host(bytearray(back))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert buf.tobytes() == back and peak < len(data) + (3 << 20), f"{peak} bytes held besides the array"
    with pytest.raises(ValueError, match="copy_to_host"):
        buf._buf.copy_to_host(len(data) - 4, 5)


def test_new_buffer_is_zeroed_and_resizes_keeping_contents():
    buf = memres.DeviceBuffer(size=8)
    assert bytes(buf.copy_to_host()) == bytes(8)
    buf.copy_from_host(b"abcd")
    buf.resize(16)
    assert bytes(buf.copy_to_host()) == b"abcd" + bytes(12)
    assert buf.capacity() >= 16
    buf.resize(2)
    assert buf.size == 2 and bytes(buf.copy_to_host()) == b"ab"
    buf.reserve(100)
    assert buf.capacity() >= 100 and bytes(buf.copy_to_host()) == b"ab"


def test_resize_to_zero_keeps_the_memory_and_its_ptr_as_rmms():
    # RMM's resize within the capacity changes only the size: `ptr` (its
    # `data()`) stays; a buffer made with no bytes has none.
    assert memres.DeviceBuffer().ptr == 0 and memres.DeviceBuffer().capacity() == 0
    buf = memres.DeviceBuffer.to_device(b"abcd")
    ptr = buf.ptr
    buf.resize(0)
    assert buf.size == 0 and buf.capacity() == 4 and buf.ptr == ptr != 0
    assert buf.tobytes() == b"" and f"ptr={ptr:#x}" in repr(buf)
    buf.resize(3)
    assert buf.ptr == ptr and buf.tobytes() == bytes(3)


# As RMM's `size_t` arguments: no int is a TypeError, one out of range an OverflowError.
BAD_SIZES = [(-1, OverflowError), (1 << 64, OverflowError), (1.5, TypeError), ("10", TypeError),
             (True, TypeError)]


@pytest.mark.parametrize("bad, error", BAD_SIZES)
def test_bad_sizes_are_rmms_errors_and_leave_the_buffer_as_it_was(bad, error):
    with pytest.raises(error, match="size must be an int"):
        memres.DeviceBuffer(size=bad)
    buf = memres.DeviceBuffer.to_device(b"abc")
    with pytest.raises(error, match="new_size must be an int"):
        buf.resize(bad)
    with pytest.raises(error, match="new_capacity must be an int"):
        buf.reserve(bad)
    assert buf.size == 3 and bytes(buf.copy_to_host()) == b"abc"


def test_copy_from_device():
    a = memres.DeviceBuffer.to_device(b"xyz")
    b = memres.DeviceBuffer(size=5)
    b.copy_from_device(a)
    assert bytes(b.copy_to_host()) == b"xyz\0\0"
    with pytest.raises(ValueError):
        a.copy_from_device(memres.DeviceBuffer(size=10))
    # As RMM's: what has no __cuda_array_interface__ is a ValueError.
    with pytest.raises(ValueError, match="__cuda_array_interface__"):
        a.copy_from_device(b"xyz")
    # A host buffer copies only memres buffers: an array's pointer is device memory.
    fake = types.SimpleNamespace(__cuda_array_interface__={
        "data": (1 << 40, False), "shape": (3,), "typestr": "|u1", "version": 3})
    host = memres.DeviceBuffer.to_device(b"xyz", mr=mr.HostMemoryResource())
    with pytest.raises(ValueError, match="simulated backend copies only a memres DeviceBuffer"):
        host.copy_from_device(fake)
    assert host.tobytes() == b"xyz"


def test_an_arrays_default_stream_is_named_on_the_arrays_device(monkeypatch):
    # A CUDA buffer of device 0 and an array of device 1 (as the driver
    # tells its data pointer's device), recorded where the native copy is
    # asked for. The legacy (1) and per-thread (2) default streams of the
    # array's interface were named on the buffer's device, 0: the copy
    # waited for the wrong device's stream.
    from memres import _native
    buf = memres.DeviceBuffer(size=8)
    asked = []
    monkeypatch.setattr(buf, "mr", types.SimpleNamespace(_backend="cuda", device_id=0))
    monkeypatch.setattr(buf, "_buf", types.SimpleNamespace(copy_from_cuda_array=lambda *a: asked.append(a)))
    devices = {1 << 40: 1}  # another address: the driver does not know it
    monkeypatch.setattr(_native, "cuda", lambda: types.SimpleNamespace(pointer_device=devices.get))
    for ptr in (1 << 40, 1 << 41):
        for stream in (1, 2, 0x5000, None):
            buf.copy_from_device(types.SimpleNamespace(__cuda_array_interface__={
                "data": (ptr, False), "shape": (3,), "typestr": "|u1", "version": 3, "stream": stream}))
    assert asked == [(1 << 40, 3, 1, 1), (1 << 40, 3, 1, 2), (1 << 40, 3, 0, 0x5000), (1 << 40, 3, 0, None),
                     (1 << 41, 3, 0, 1), (1 << 41, 3, 0, 2), (1 << 41, 3, 0, 0x5000), (1 << 41, 3, 0, None)]


def test_an_interfaces_stream_no_handle_can_be_is_a_clear_error(monkeypatch):
    # A "stream" below 0 or past 64 bits reached the native call, whose
    # argument conversion raised PyO3's OverflowError. The buffer's native
    # side is the real one (its conversion runs first), told it is CUDA's.
    buf = memres.DeviceBuffer.to_device(b"abc")
    monkeypatch.setattr(buf, "mr", types.SimpleNamespace(_backend="cuda", device_id=0))
    for stream in (-1, 1 << 64):
        with pytest.raises(ValueError, match=f"the interface's stream {stream} is no handle"):
            buf.copy_from_device(types.SimpleNamespace(__cuda_array_interface__={
                "data": (1 << 40, False), "shape": (3,), "typestr": "|u1", "version": 3, "stream": stream}))
    assert buf.tobytes() == b"abc"


@pytest.mark.parametrize("change", [{"shape": None}, {"typestr": "<f"}, {"typestr": 4}, {"data": None},
                                    {"shape": 3}, {"shape": (2.5,)}, {"strides": 1}, {"strides": ()},
                                    {"version": "3"}])
def test_a_malformed_array_interface_is_a_clear_error(monkeypatch, change):
    # Read as it came: a KeyError, a TypeError or an IndexError of the
    # reading, or int()'s ValueError on the type string.
    buf = memres.DeviceBuffer.to_device(b"abc")
    monkeypatch.setattr(buf, "mr", types.SimpleNamespace(_backend="cuda", device_id=0))
    iface = {"data": (1 << 40, False), "shape": (3,), "typestr": "|u1", "version": 3, **change}
    iface = {k: v for k, v in iface.items() if v is not None or k != "shape"}
    with pytest.raises(ValueError, match="copy_from_device: a malformed __cuda_array_interface__"):
        buf.copy_from_device(types.SimpleNamespace(__cuda_array_interface__=iface))
    assert buf.tobytes() == b"abc"


def test_copy_from_host_past_the_end_changes_nothing():
    buf = memres.DeviceBuffer.to_device(b"1234")
    # As RMM's, naming both sizes (it said "index 5 out of range for length 4").
    with pytest.raises(ValueError, match="memres: copy_from_host: 6 bytes into a buffer of 4$"):
        buf.copy_from_host(b"123456")
    assert bytes(buf.copy_to_host()) == b"1234"


def test_collected_buffer_frees_its_block():
    t = tracked()
    buf = memres.DeviceBuffer(size=1000, mr=t)
    assert t.get_outstanding_count() == 1
    del buf
    gc.collect()
    assert t.get_outstanding_count() == 0


def test_buffer_on_the_current_resource():
    t = tracked()
    mr.set_current_device_resource(t)
    buf = memres.DeviceBuffer(size=64)
    assert buf.mr is t and t.get_allocated_bytes() == 64


def test_simulated_device_has_no_bytes_for_a_buffer():
    with pytest.raises(ValueError, match="HostMemoryResource"):
        memres.DeviceBuffer(size=10, mr=mr.PoolMemoryResource(mr.SimulatedMemoryResource(1 << 30)))


def test_host_buffer_has_no_cuda_array_interface():
    with pytest.raises(AttributeError):
        memres.DeviceBuffer(size=4, mr=mr.HostMemoryResource()).__cuda_array_interface__


@pytest.mark.parametrize("stream, exported", [(None, 1), (memres.Stream.from_handle(0), 1),
                                             (memres.Stream.from_handle(2), 2),
                                             (memres.Stream.from_handle(0x7F00), 0x7F00),
                                             (type("Stream", (), {"__module__": "cupy.cuda.stream", "ptr": 0x55})(), 0x55)])
def test_the_cuda_array_interface_names_the_buffers_stream(stream, exported):
    # A host buffer passed off as a CUDA one: the dict is the same.
    buf = memres.DeviceBuffer(size=4, mr=mr.HostMemoryResource(), stream=stream)
    buf.mr = types.SimpleNamespace(_backend="cuda")
    cai = buf.__cuda_array_interface__
    assert cai == {"data": (buf.ptr, False), "shape": (4,), "strides": None, "typestr": "|u1",
                   "version": 3, "stream": exported}


def test_bad_arguments():
    with pytest.raises(OverflowError):
        memres.DeviceBuffer(size=-1)
    with pytest.raises(TypeError):
        memres.DeviceBuffer(size=1, mr="pool")
    with pytest.raises(ValueError, match="use copy_from_device or to_device"):
        memres.DeviceBuffer(ptr=1234, size=4)
    # RMM's null pointer: nothing to copy from.
    assert memres.DeviceBuffer(ptr=0, size=4).size == 4
    assert memres.DeviceBuffer(size=1000).__sizeof__() == 1000  # as RMM's
    buf = memres.DeviceBuffer(size=4)
    assert buf.prefetch(device=-1) is False  # host memory does not migrate
    for bad in (-2, "0", 1.0):
        with pytest.raises(ValueError, match="device must be a device number or -1"):
            buf.prefetch(device=bad)


def test_out_of_memory_buffer():
    lim = mr.LimitingResourceAdaptor(mr.HostMemoryResource(), 100)
    with pytest.raises(memres.OutOfMemory):
        memres.DeviceBuffer(size=1000, mr=lim)
    with pytest.raises(memres.OutOfMemory):  # a size nothing serves: MemoryError, as RMM
        memres.DeviceBuffer(size=1 << 63)


def test_buffers_over_every_stack_of_host_memory():
    for res in [mr.PoolMemoryResource(mr.HostMemoryResource(), per_stream=True),
                mr.StackMemoryResource("pool(host, growth=double, release=true)", backend="sim"),
                mr.BinningMemoryResource(mr.PoolMemoryResource(mr.HostMemoryResource()), 8, 12),
                mr.LimitingResourceAdaptor(mr.FixedSizeMemoryResource(mr.HostMemoryResource(), 4096), 1 << 20)]:
        buf = memres.DeviceBuffer.to_device(b"stack", mr=res)
        assert bytes(buf.copy_to_host()) == b"stack", res


@pytest.mark.parametrize("how", ["copy", "copy.copy", "copy.deepcopy"])
def test_a_copy_is_a_new_buffer_of_the_same_resource(how):
    t = tracked()
    buf = memres.DeviceBuffer.to_device(b"abc", mr=t)
    dup = {"copy": lambda b: b.copy(), "copy.copy": copy.copy, "copy.deepcopy": copy.deepcopy}[how](buf)
    assert isinstance(dup, memres.DeviceBuffer) and dup.mr is t and dup.ptr != buf.ptr
    assert t.get_outstanding_count() == 2
    dup.copy_from_host(b"X")
    assert bytes(buf.copy_to_host()) == b"abc" and bytes(dup.copy_to_host()) == b"Xbc"
    del dup
    gc.collect()
    assert t.get_outstanding_count() == 1 and bytes(buf.copy_to_host()) == b"abc"


def test_a_buffer_pickles_as_its_bytes_rebuilt_on_the_current_resource():
    t = tracked()
    buf = memres.DeviceBuffer.to_device(b"pickled", mr=mr.HostMemoryResource())
    mr.set_current_device_resource(t)
    back = pickle.loads(pickle.dumps(buf))
    assert bytes(back.copy_to_host()) == b"pickled" and back.mr is t and back.ptr != buf.ptr
    assert t.get_outstanding_count() == 1


def test_reduce_called_directly_gives_rmms_recipe():
    # RMM's `__reduce__`: `to_device` of the bytes (Python's default one,
    # which `__reduce_ex__` alone left, made a buffer with nothing in it).
    buf = memres.DeviceBuffer.to_device(b"reduced", mr=mr.HostMemoryResource())
    make, args = buf.__reduce__()
    assert make == memres.DeviceBuffer.to_device and args == (b"reduced",)
    assert bytes(make(*args).copy_to_host()) == b"reduced"


def test_a_buffer_pickles_out_of_band_from_protocol_5_and_converts_to_bytes():
    buf = memres.DeviceBuffer.to_device(b"out of band", mr=mr.HostMemoryResource())
    assert bytes(buf) == b"out of band"
    buffers = []
    data = pickle.dumps(buf, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1 and bytes(buffers[0]) == b"out of band"
    assert pickle.loads(data, buffers=buffers).tobytes() == b"out of band"
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(buf, protocol=protocol)).tobytes() == b"out of band"


@pytest.mark.parametrize("bad", [array.array("H", [1, 2]), memoryview(b"abcd").cast("B", (2, 2)),
                                 memoryview(b"abcdef")[::2], array.array("d", [1.0])])
def test_host_bytes_are_one_dimensional_contiguous_and_of_an_8_bit_type_as_rmms(bad):
    with pytest.raises(ValueError, match="1-D contiguous buffer of an 8-bit type"):
        memres.DeviceBuffer.to_device(bad, mr=mr.HostMemoryResource())
    buf = memres.DeviceBuffer(size=16, mr=mr.HostMemoryResource())
    with pytest.raises(ValueError, match="1-D contiguous buffer of an 8-bit type"):
        buf.copy_from_host(bad)
    with pytest.raises(TypeError, match="takes a bytes-like buffer"):
        buf.copy_from_host(12)
    # An 8-bit type of either sign, as RMM's guide passes int8.
    assert memres.DeviceBuffer.to_device(array.array("b", [-1, 2])).tobytes() == b"\xff\x02"
    assert buf.tobytes() == bytes(16)


@pytest.mark.parametrize("size, error", BAD_SIZES)
def test_a_refused_buffer_makes_no_default_resource(size, error):
    # The current device's default was made before the size was checked.
    assert not memres.is_initialized()
    with pytest.raises(error):
        memres.DeviceBuffer(size=size)
    assert not memres.is_initialized()

