"""RMM's Python user guide, example by example, on memres with only the
imports changed (`import memres as rmm`, and memres's names where RMM's
differ: docs/python.md lists each). Without a GPU the examples that need
CUDA skip (they fail under MEMRES_REQUIRE_GPU=1); those that need NumPy,
CuPy, Numba or PyTorch skip where the library is missing."""

import os
import subprocess
import sys
import textwrap

import pytest

import memres as rmm
import memres.statistics  # noqa: F401 (the guide's `import rmm.statistics`)

from conftest import need


def run_python(code, env=None):
    """Runs `code` in a fresh interpreter (allocator hooks of Numba and
    PyTorch are set once per process); returns its stdout."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, env=dict(os.environ, **(env or {})), timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


# ## DeviceBuffer objects


def test_a_device_buffer_of_a_size():
    buf = rmm.DeviceBuffer(size=100)
    assert buf.size == 100
    assert buf.ptr != 0


def test_a_device_buffer_from_host_memory_and_back():
    np = need("numpy")
    a = np.array([1, 2, 3], dtype="float64")
    buf = rmm.DeviceBuffer.to_device(a.view("int8"))  # to_device expects an 8-bit type or `bytes`
    assert buf.size == 24
    assert np.frombuffer(buf.tobytes()).tolist() == [1.0, 2.0, 3.0]


def test_prefetching_a_managed_device_buffer(gpu):
    rmm.reinitialize(managed_memory=True)
    buf = rmm.DeviceBuffer(size=100)
    assert buf.prefetch() is True  # RMM returns None; memres says whether it moved


def test_prefetching_to_a_device_on_a_stream(gpu):
    rmm.reinitialize(managed_memory=True)
    from memres import Stream  # RMM: from rmm._cuda.stream import Stream
    stream = Stream()
    buf = rmm.DeviceBuffer(size=100, stream=stream)
    assert buf.prefetch(device=0, stream=stream) is True  # the guide's device=3 needs four GPUs


def test_prefetching_to_the_host_with_rmms_cpu_device_id(gpu):
    rmm.reinitialize(managed_memory=True)
    buf = rmm.DeviceBuffer.to_device(b"host side")
    assert buf.prefetch(device=-1) is True  # cudaCpuDeviceId
    assert buf.tobytes() == b"host side"
    assert buf.prefetch(device=0) is True


def test_prefetching_memory_that_does_not_migrate_does_nothing(gpu):
    buf = rmm.DeviceBuffer(size=100, mr=rmm.mr.CudaMemoryResource())
    assert buf.prefetch() is False


# ## MemoryResource objects


def test_managed_memory_as_the_current_resource(gpu):
    rmm.mr.set_current_device_resource(rmm.mr.ManagedMemoryResource())
    buf = rmm.DeviceBuffer.to_device(b"managed")
    assert isinstance(rmm.mr.get_current_device_resource(), rmm.mr.ManagedMemoryResource)
    assert buf.tobytes() == b"managed"


@pytest.mark.parametrize("upstream", ["CudaMemoryResource", "ManagedMemoryResource"])
def test_a_pool_of_one_to_four_gib(gpu, upstream):
    pool = rmm.mr.PoolMemoryResource(
        getattr(rmm.mr, upstream)(),
        initial_pool_size=2**30,
        maximum_pool_size=2**32,
    )
    rmm.mr.set_current_device_resource(pool)
    buf = rmm.DeviceBuffer.to_device(b"pooled")
    assert buf.tobytes() == b"pooled"
    held = rmm.statistics.get_device_statistics(backend="cuda")
    assert held.current_bytes >= 2**30  # the initial pool, taken at once


def test_reinitialize_with_a_pool():
    rmm.reinitialize(pool_allocator=True, initial_pool_size=2**24, maximum_pool_size=2**26)
    assert isinstance(rmm.mr.get_current_device_resource(), rmm.mr.PoolMemoryResource)
    buf = rmm.DeviceBuffer.to_device(b"from the pool")
    assert buf.tobytes() == b"from the pool"
    with pytest.raises(rmm.OutOfMemory):
        rmm.DeviceBuffer(size=2**27)  # beyond maximum_pool_size


# ## Using RMM with third-party libraries


def test_cupy_allocates_through_the_current_resource(gpu):
    cupy = need("cupy")
    from memres.allocators.cupy import memres_cupy_allocator as rmm_cupy_allocator
    rmm.statistics.enable_statistics()
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    try:
        x = cupy.arange(1000, dtype=cupy.float32)
        assert float(x.sum()) == 499500.0
        assert rmm.statistics.get_statistics().current_count >= 1
    finally:
        cupy.cuda.set_allocator(None)


NUMBA_EXAMPLE = """
import numpy as np
import memres as rmm
from numba import cuda
SET_MANAGER
rmm.statistics.enable_statistics()
d = cuda.to_device(np.arange(10, dtype=np.int64))
assert d.copy_to_host().sum() == 45
print(rmm.statistics.get_statistics().current_count, type(cuda.current_context().memory_manager).__name__)
"""


@pytest.mark.parametrize("how", ["set_memory_manager", "environment"])
def test_numba_allocates_through_the_current_resource(gpu, how):
    need("numba")
    if how == "set_memory_manager":
        code = NUMBA_EXAMPLE.replace("SET_MANAGER", "from memres.allocators.numba import MemresNumbaManager "
                                     "as RMMNumbaManager\ncuda.set_memory_manager(RMMNumbaManager)")
        env = {}
    else:
        code = NUMBA_EXAMPLE.replace("SET_MANAGER", "")
        env = {"NUMBA_CUDA_MEMORY_MANAGER": "memres.allocators.numba"}
    count, manager = run_python(code, env).split()
    assert int(count) >= 1 and manager == "MemresNumbaManager"


def test_pytorch_allocates_through_the_current_resource(gpu):
    need("torch")
    out = run_python("""
        import memres as rmm
        from memres.allocators.torch import memres_torch_allocator as rmm_torch_allocator
        import torch

        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
        x = torch.arange(1000, device="cuda", dtype=torch.float32)
        assert float(x.sum()) == 499500.0
        print(rmm.statistics.get_device_statistics(backend="cuda").peak_bytes)
        """)
    assert int(out) >= 4000


# ## Memory statistics and profiling


def test_statistics_around_a_block_and_globally():
    assert not isinstance(rmm.mr.get_current_device_resource(), rmm.mr.StatisticsResourceAdaptor)
    with rmm.statistics.statistics():
        assert isinstance(rmm.mr.get_current_device_resource(), rmm.mr.StatisticsResourceAdaptor)
    assert not isinstance(rmm.mr.get_current_device_resource(), rmm.mr.StatisticsResourceAdaptor)

    rmm.statistics.enable_statistics()
    assert isinstance(rmm.mr.get_current_device_resource(), rmm.mr.StatisticsResourceAdaptor)
    buf = rmm.DeviceBuffer(size=10)
    stats = rmm.statistics.get_statistics()
    assert (stats.current_count, stats.peak_count, stats.total_count) == (1, 1, 1)
    assert stats.current_bytes == stats.peak_bytes == stats.total_bytes == buf.size


def test_the_profiler_as_a_decorator_a_block_and_nested():
    records = rmm.statistics.ProfilerRecords()  # the guide uses default_profiler_records
    rmm.statistics.enable_statistics()

    @rmm.statistics.profiler(records=records)
    def f(size):
        rmm.DeviceBuffer(size=size)

    f(1000)
    f(2000)
    with rmm.statistics.profiler(records=records, name="my code block"):
        rmm.DeviceBuffer(size=20)
    with rmm.statistics.profiler(records=records, name="outer"):
        buf1 = rmm.DeviceBuffer(size=10)
        with rmm.statistics.profiler(records=records, name="inner"):
            buf2 = rmm.DeviceBuffer(size=10)
    del buf1, buf2

    by_name = {("f" if name.endswith(".f)") else name): r for name, r in records.records.items()}
    report = records.report()
    assert report.startswith("Memory Profiling")
    rows = [line.split(None, 3) for line in report.splitlines()[11:]]
    assert [int(r[1].replace(",", "")) for r in rows] == [2000, 20, 20, 10]  # ordered by memory_peak, largest first
    assert rows[0][3].endswith(".f)") and rows[0][3].split(":")[0] == __file__
    assert rmm.statistics.default_profiler_records is not records
