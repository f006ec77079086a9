"""On a GPU: CUDA resources, DeviceBuffer contents, CuPy, Numba and
PyTorch training through memres. Skipped without a GPU; failures with
MEMRES_REQUIRE_GPU=1."""

import gc
import json
import os
import subprocess
import sys

import pytest

import memres
from memres import mr

from conftest import need

HERE = os.path.dirname(__file__)
MiB = 1 << 20


def cuda_leaves():
    return [mr.CudaMemoryResource(), mr.CudaAsyncMemoryResource(), mr.ManagedMemoryResource(),
            mr.PoolMemoryResource(mr.CudaMemoryResource(), initial_pool_size=64 * MiB),
            mr.PoolMemoryResource(mr.CudaAsyncMemoryResource(), per_stream=True),
            mr.ArenaMemoryResource(mr.CudaMemoryResource()),
            mr.BinningMemoryResource(mr.PoolMemoryResource(mr.CudaMemoryResource()), 10, 20),
            mr.VirtualMemoryResource(reserve=1 << 30),
            mr.VirtualMemoryResource(reserve=1 << 30, per_stream=True)]


def test_cuda_resources_allocate_and_hold_contents(gpu):
    data = os.urandom(3 * MiB + 5)
    for res in cuda_leaves():
        ptrs = [res.allocate(n) for n in (1, 1000, MiB)]
        assert all(ptrs) and len(set(ptrs)) == 3, res
        for p, n in zip(ptrs, (1, 1000, MiB)):
            res.deallocate(p, n)
        buf = memres.DeviceBuffer.to_device(data, mr=res)
        assert bytes(buf.copy_to_host()) == data, res
        other = memres.DeviceBuffer(size=len(data) + 10, mr=res)
        other.copy_from_device(buf)
        assert bytes(other.copy_to_host())[: len(data)] == data
        other.resize(10)
        assert bytes(other.copy_to_host()) == data[:10]


def test_available_device_memory_is_what_the_driver_says(gpu):
    free, total = mr.available_device_memory()
    assert 0 < free <= total and mr.available_device_memory(0)[1] == total
    buf = memres.DeviceBuffer(size=1 << 30, mr=mr.CudaMemoryResource())
    assert mr.available_device_memory()[0] <= free - (1 << 30) + (64 << 20)  # the driver's own rounding
    del buf


def test_current_resource_defaults_to_cuda(gpu):
    assert isinstance(mr.get_current_device_resource(), mr.CudaMemoryResource)
    memres.reinitialize(pool_allocator=True, initial_pool_size=128 * MiB)
    assert mr.get_current_device_resource().pool_size() == 128 * MiB
    held = memres.statistics.get_device_statistics().current_bytes
    assert held >= 128 * MiB


def test_a_device_pytorchs_allocations_reach_first_gets_the_c_librarys_default_stack(gpu):
    # In a child: device 0's registry entry outlives the tests here.
    code = (
        "import ctypes, memres\n"
        "from memres.allocators.torch import DEFAULT_STACK\n"
        "so = ctypes.CDLL(memres._native.cuda().__file__)\n"
        "so.memres_py_alloc.restype = ctypes.c_void_p\n"
        "so.memres_py_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]\n"
        "so.memres_py_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]\n"
        "p = so.memres_py_alloc(1000, 0, None)\n"
        "assert p, memres.allocators.torch.last_error()\n"
        "res = memres.mr.get_current_device_resource()\n"
        "assert res.stack == DEFAULT_STACK, res.stack\n"
        "assert res._native.statistics()[0][0] == 1000\n"
        "so.memres_py_free(p, 1000, 0, None)\n"
        "print('done')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stdout + out.stderr


def test_a_cuda_resource_replaced_by_a_simulated_one_is_let_go(gpu):
    import ctypes
    # From a device whose resource is simulated: what earlier tests left
    # on the CUDA side goes now, not within the count below.
    memres.reinitialize(stack="pool(sim(1GiB))")
    gc.collect()
    base = memres.statistics.get_device_statistics(0, backend="cuda").current_bytes
    memres.reinitialize(pool_allocator=True, initial_pool_size=64 * MiB)
    assert memres.statistics.get_device_statistics(0, backend="cuda").current_bytes == base + 64 * MiB
    memres.reinitialize(stack="pool(sim(1GiB))")
    gc.collect()
    assert memres.statistics.get_device_statistics(0, backend="cuda").current_bytes == base
    # PyTorch's allocations through memres are refused there, and say why.
    so = ctypes.CDLL(memres._native.cuda().__file__)
    so.memres_py_alloc.restype = ctypes.c_void_p
    so.memres_py_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    assert so.memres_py_alloc(1000, 0, None) is None
    assert "current resource is a simulated one" in memres._native.cuda().last_error(clear=True)


def test_device_statistics_see_what_the_driver_pool_reserves(gpu):
    before = memres.statistics.get_device_statistics(backend="cuda")
    res = mr.CudaAsyncMemoryResource()
    p = res.allocate(64 * MiB)
    st = memres.statistics.get_device_statistics(backend="cuda")
    # The leaf's own driver pool reserved at least the block.
    assert st.reserved_bytes - before.reserved_bytes >= 64 * MiB
    assert st.peak_reserved_bytes >= st.reserved_bytes
    res.deallocate(p, 64 * MiB)
    del res
    gc.collect()
    # A dropped leaf's pool no longer counts.
    assert memres.statistics.get_device_statistics(backend="cuda").reserved_bytes == before.reserved_bytes


def test_device_statistics_count_each_driver_pool_once_and_the_managed_one(gpu):
    # Two views of the device's default pool counted it twice, and the
    # pool of managed memory not at all.
    reserved = lambda: memres.statistics.get_device_statistics(backend="cuda").reserved_bytes
    before = reserved()
    a = mr.CudaAsyncViewMemoryResource()
    p = a.allocate(256 * MiB)
    one = reserved() - before
    assert one >= 256 * MiB
    b = mr.CudaAsyncViewMemoryResource()
    assert reserved() - before == one, "a second view of the same pool adds nothing"
    a.deallocate(p, 256 * MiB)
    del a, b
    gc.collect()
    import ctypes
    version = ctypes.c_int(0)
    assert ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0
    if version.value < 13000:
        pytest.skip(f"pools of managed memory need a CUDA 13 driver, not {version.value}")
    before = reserved()
    res = mr.experimental.CudaAsyncManagedMemoryResource()
    p = res.allocate(256 * MiB)
    assert reserved() - before >= 256 * MiB
    res.deallocate(p, 256 * MiB)


def test_out_of_memory_on_the_device(gpu):
    pool = mr.PoolMemoryResource(mr.CudaMemoryResource(), maximum_pool_size=64 * MiB)
    with pytest.raises(memres.OutOfMemory) as e:
        pool.allocate(128 * MiB)
    assert e.value.requested == 128 * MiB
    pool.deallocate(pool.allocate(MiB), MiB)


@pytest.mark.parametrize("mod", ["torch", "cupy"])
def test_streams_from_torch_and_cupy(gpu, mod):
    # Both are on the GPU machine: there a missing one is a failure.
    s = need(mod).cuda.Stream()
    pool = mr.PoolMemoryResource(mr.CudaAsyncMemoryResource(), per_stream=True)
    p = pool.allocate(MiB, stream=s)
    pool.deallocate(p, MiB, stream=s)
    buf = memres.DeviceBuffer.to_device(b"abc", stream=s, mr=pool)
    assert bytes(buf.copy_to_host()) == b"abc"


def test_a_bare_int_stream_never_reaches_the_driver_and_from_handle_does(gpu):
    t = mr.TrackingResourceAdaptor(mr.PoolMemoryResource(mr.CudaAsyncMemoryResource(), per_stream=True))
    with pytest.raises(TypeError, match="from_handle"):
        memres.DeviceBuffer(size=10, stream=12345, mr=t)
    with pytest.raises(TypeError, match="from_handle"):
        t.allocate(MiB, stream=12345)
    assert t.get_outstanding_count() == 0 and t.get_allocated_bytes() == 0
    # Handles of live streams, wrapped on purpose: the legacy default
    # stream's, and a framework's own where one is installed, which lives
    # as long as the resource that is given it (from_handle's promise).
    owners = []
    for mod, make in (("torch", lambda m: m.cuda.Stream()), ("cupy", lambda m: m.cuda.Stream())):
        try:
            owners.append(make(__import__(mod)))
        except ImportError:
            pass
    handles = [0] + [getattr(o, "cuda_stream", None) or o.ptr for o in owners]
    for h in handles:
        s = memres.Stream.from_handle(h)
        buf = memres.DeviceBuffer.to_device(b"abc", stream=s, mr=t)
        assert bytes(buf.copy_to_host()) == b"abc"
        p = t.allocate(MiB, stream=s)
        t.deallocate(p, MiB, stream=s)
        del buf
        gc.collect()
    assert t.get_outstanding_count() == 0
    del t
    gc.collect()
    owners.clear()  # after the resource that remembers their streams


def test_cupy_allocator_and_cuda_array_interface(gpu):
    cupy = need("cupy")
    from memres.allocators.cupy import memres_cupy_allocator
    stats = mr.StatisticsResourceAdaptor(mr.PoolMemoryResource(mr.CudaMemoryResource()))
    mr.set_current_device_resource(stats)
    cupy.cuda.set_allocator(memres_cupy_allocator)
    try:
        a = cupy.arange(1 << 20, dtype=cupy.float32)
        assert stats.allocation_counts.current_bytes >= 4 * MiB
        assert float((a * 2).sum()) == float(sum(range(1 << 20)) * 2)
        del a
    finally:
        cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    buf = memres.DeviceBuffer.to_device(bytes(range(256)))
    view = cupy.asarray(buf)
    assert view.dtype == cupy.uint8 and view.size == 256 and int(view[255]) == 255


def test_numba_memory_manager(gpu):
    pytest.importorskip("numba")
    code = ("import numpy as np; from numba import cuda; "
            "a = cuda.to_device(np.arange(1000)); print(int(a.copy_to_host().sum()))")
    env = dict(os.environ, NUMBA_CUDA_MEMORY_MANAGER="memres.allocators.numba")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(sum(range(1000)))


def test_a_numba_stream_is_read_under_either_binding(gpu):
    # numba-cuda's streams hold a ctypes pointer or, with NVIDIA's bindings,
    # a cuda-python CUstream; int() of the stream is its handle either way.
    numba_cuda = pytest.importorskip("numba.cuda")
    s = numba_cuda.stream()
    assert memres.Stream(s).handle == int(s) != 0
    buf = memres.DeviceBuffer.to_device(b"numba", stream=s)
    s.synchronize()
    assert bytes(buf.copy_to_host()) == b"numba"


def train(allocator, steps=30, stack=None, extra=()):
    out = subprocess.run([sys.executable, os.path.join(HERE, "gpu_train.py"), "--allocator",
                          allocator, "--steps", str(steps)] + (["--stack", stack] if stack else [])
                         + list(extra), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_torch_training_through_memres_gives_the_native_losses(gpu):
    need("torch")
    native = train("native")
    ours = train("memres")
    assert len(ours["losses"]) == 30
    assert ours["losses"] == native["losses"]
    assert ours["peak_device_bytes"] > 0
    # use() with no stack gave the device the default stack.
    from memres.allocators.torch import DEFAULT_STACK
    assert ours["stack"] == DEFAULT_STACK


def test_torch_training_laid_out_by_planned_steps_gives_the_native_losses(gpu):
    need("torch")
    from memres.allocators.torch import TRAINING_STACK
    native = train("native")
    ours = train("memres", stack=TRAINING_STACK)
    assert ours["planned_layers"] == 1, "memres.allocators.torch.step() reached the layer"
    assert ours["losses"] == native["losses"]
    # The loop repeats from its second step (the first makes Adam's state):
    # planned from the third, every step after it served from the plan.
    steps = ours["steps"]
    assert steps["steps"] == 30 and steps["plans"] >= 1, steps
    assert steps["followed"] >= 30 - 4, steps
    assert steps["planned_allocations"] >= steps["followed"], steps
    assert ours["memres_live_blocks"] > 0 and ours["peak_device_bytes"] > 0


def test_a_loop_stepped_after_its_optimizer_is_laid_out_too(gpu):
    need("torch")
    from memres.allocators.torch import TRAINING_STACK
    native = train("native")
    ours = train("memres", stack=TRAINING_STACK,
                 extra=["--step-after-optimizer"])
    assert ours["losses"] == native["losses"]
    # One step per optimizer step, the first once Adam made its state:
    # laid out as the loop that calls step() itself is.
    steps = ours["steps"]
    assert steps["steps"] == 30 and steps["plans"] >= 1, steps
    assert steps["followed"] >= 30 - 4, steps
    assert steps["planned_allocations"] >= steps["followed"], steps


def test_a_stack_string_over_a_cuda_resource_object_serves_buffers(gpu):
    # The upstream object's backend (CUDA) and device are the stack's; a
    # planned layer over a driver pool lays out the repeating steps.
    res = mr.StackMemoryResource("stats(planned(up0))", upstreams=[mr.CudaAsyncMemoryResource()])
    assert res._backend == "cuda"
    s = memres.Stream()
    for i in range(4):
        assert res.step(s) == 1
        a = memres.DeviceBuffer.to_device(bytes([i]) * 4096, stream=s, mr=res)
        b = memres.DeviceBuffer(size=MiB, stream=s, mr=res)
        b.copy_from_device(a, stream=s)
        assert bytes(b.copy_to_host())[:4096] == bytes([i]) * 4096
        del a, b
    steps = res.steps()
    assert (steps["steps"], steps["plans"], steps["followed"]) == (4, 1, 1), steps
    s.synchronize()
    assert res.release() > 0 and res.steps()["region"] == 0


def test_release_gives_free_chunks_back(gpu):
    pool = mr.PoolMemoryResource(mr.CudaMemoryResource())
    p = pool.allocate(100 * MiB)
    pool.deallocate(p, 100 * MiB)
    assert pool.release() >= 100 * MiB
    assert pool.pool_size() == 0
    gc.collect()


def test_release_unmaps_idle_granules_and_trims_the_driver_pool(gpu):
    # release() saw only `pool` layers: a `vmm` leaf kept every freed
    # granule mapped and an `async` leaf its driver pool's reserve.
    held = lambda: memres.statistics.get_device_statistics(backend="cuda")
    for res in [mr.VirtualMemoryResource(reserve=1 << 30),
                mr.VirtualMemoryResource(reserve=1 << 30, per_stream=True)]:
        p = res.allocate(100 * MiB)
        res.deallocate(p, 100 * MiB)
        before = held().current_bytes
        assert res.release() >= 100 * MiB, res.stack
        assert before - held().current_bytes >= 100 * MiB, res.stack
        assert res.release() == 0, res.stack
    res = mr.CudaAsyncMemoryResource()
    p = res.allocate(100 * MiB)
    res.deallocate(p, 100 * MiB)
    before = held().reserved_bytes
    assert res.release() >= 100 * MiB
    assert before - held().reserved_bytes >= 100 * MiB


TORCH_EMPTY_CACHE = """
import json, sys, torch, memres
from memres.allocators import torch as mt
mt.use(stack=sys.argv[1])
held = lambda: memres.statistics.get_device_statistics(backend="cuda").current_bytes
x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
x.fill_(1)
del x
before = held()
torch.cuda.empty_cache()
print(json.dumps({"before": before, "after": held()}))
"""


def test_torch_empty_cache_reaches_memres(gpu):
    # PyTorch's pluggable allocator does nothing in torch.cuda.empty_cache()
    # without a reset function; memres gives it one.
    need("torch")
    from memres.allocators.torch import DEFAULT_STACK, TRAINING_STACK
    for stack in (DEFAULT_STACK, TRAINING_STACK):
        out = subprocess.run([sys.executable, "-c", TORCH_EMPTY_CACHE, stack], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        held = json.loads(out.stdout.strip().splitlines()[-1])
        assert held["before"] - held["after"] >= 256 * MiB, (stack, held)


def last_prefetched_to(ptr, nbytes):
    """The device ``ptr`` was last prefetched to, once the device is idle
    (``cuMemRangeGetAttribute``; -2: never, -1: the host)."""
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    try:
        assert cuda.cuCtxSetCurrent(ctx) == 0
        assert cuda.cuCtxSynchronize() == 0
        to = ctypes.c_int(0)
        last_prefetch_location = 4  # CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION
        assert cuda.cuMemRangeGetAttribute(ctypes.byref(to), ctypes.c_size_t(4), last_prefetch_location,
                                           ctypes.c_uint64(ptr), ctypes.c_size_t(nbytes)) == 0
        return to.value
    finally:
        cuda.cuDevicePrimaryCtxRelease(0)


def test_a_prefetch_adaptor_moves_each_managed_block_it_hands_out(gpu):
    managed = mr.ManagedMemoryResource()
    plain = managed.allocate(4 * MiB)
    assert last_prefetched_to(plain, 4 * MiB) != 0
    res = mr.PrefetchResourceAdaptor(managed)
    assert res.upstream_mr is managed and res.stack == "prefetch(up0)"
    ptr = res.allocate(4 * MiB, stream=memres.DEFAULT_STREAM)
    assert last_prefetched_to(ptr, 4 * MiB) == 0
    data = os.urandom(4 * MiB)
    buf = memres.DeviceBuffer.to_device(data, mr=res)
    assert bytes(buf.copy_to_host()) == data
    res.deallocate(ptr, 4 * MiB)
    managed.deallocate(plain, 4 * MiB)
    # Over memory that does not migrate it hands blocks out as they are.
    over_cuda = mr.PrefetchResourceAdaptor(mr.CudaMemoryResource())
    over_cuda.deallocate(over_cuda.allocate(MiB), MiB)
    # Under statistics, as RMM's stacks it.
    stats = mr.StatisticsResourceAdaptor(mr.PrefetchResourceAdaptor(mr.PoolMemoryResource(managed)))
    ptr = stats.allocate(MiB)
    assert stats.allocation_counts.current_bytes == MiB
    assert last_prefetched_to(ptr, MiB) == 0
    stats.deallocate(ptr, MiB)


def test_an_async_view_serves_from_the_devices_default_pool_and_refuses_another(gpu):
    import cupy
    default = cupy.cuda.runtime.deviceGetDefaultMemPool(0)
    for view in (mr.CudaAsyncViewMemoryResource(default), mr.CudaAsyncViewMemoryResource()):
        assert view.pool_handle() == default and view.stack == "async(pool=default)"
        data = os.urandom(MiB + 3)
        buf = memres.DeviceBuffer.to_device(data, mr=view)
        assert bytes(buf.copy_to_host()) == data
        del buf
    with pytest.raises(ValueError, match="is not device 0's default memory pool"):
        mr.CudaAsyncViewMemoryResource(default + 4096)
    with pytest.raises(TypeError, match="pool_handle must be an int"):
        mr.CudaAsyncViewMemoryResource("default")


def test_an_async_managed_resource_serves_managed_memory_from_the_drivers_pool_as_rmms(gpu):
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    version = ctypes.c_int(0)
    assert cuda.cuDriverGetVersion(ctypes.byref(version)) == 0
    if version.value < 13000:
        pytest.skip(f"pools of managed memory need a CUDA 13 driver, not {version.value}")
    res = mr.experimental.CudaAsyncManagedMemoryResource()
    handle = res.pool_handle()
    assert isinstance(handle, int) and handle != 0 and res.stack == "async(pool=managed)"
    assert handle != mr.CudaAsyncViewMemoryResource().pool_handle(), "not the default pool of device memory"
    assert mr.experimental.CudaAsyncManagedMemoryResource().pool_handle() == handle, "the driver's one pool"
    mr.set_current_device_resource(res)
    stream = memres.Stream()
    for n in (1, 1000, MiB + 7):
        buf = memres.DeviceBuffer.to_device(b"\x05" * n, stream=stream)
        assert bytes(buf.copy_to_host()) == b"\x05" * n
        managed = ctypes.c_uint(0)
        assert cuda.cuPointerGetAttribute(ctypes.byref(managed), 8, ctypes.c_uint64(buf.ptr)) == 0  # IS_MANAGED
        assert managed.value == 1
        del buf
    stream.synchronize()


def test_copy_from_device_takes_cupy_and_torch_arrays_as_rmms(gpu):
    import cupy
    import torch
    buf = memres.DeviceBuffer(size=16, mr=mr.CudaMemoryResource())
    side = cupy.cuda.Stream(non_blocking=True)
    with side:  # the array's interface names this stream: the copy waits for it
        arr = cupy.arange(16, dtype=cupy.uint8) * 3
    buf.copy_from_device(arr)
    assert buf.tobytes() == bytes(i * 3 % 256 for i in range(16))
    words = torch.arange(3, dtype=torch.int32, device="cuda")
    buf.copy_from_device(words)
    assert buf.tobytes()[:12] == b"".join(i.to_bytes(4, "little") for i in range(3))
    for bad, says in [(cupy.zeros((2, 2), dtype=cupy.uint8), "1-D"),
                      (cupy.arange(8, dtype=cupy.uint8)[::2], "non-contiguous"),
                      (cupy.zeros(32, dtype=cupy.uint8), "32 bytes into a buffer of 16")]:
        with pytest.raises(ValueError, match=says):
            buf.copy_from_device(bad)
    assert buf.tobytes()[:12] == b"".join(i.to_bytes(4, "little") for i in range(3))


def test_an_async_pool_made_for_ipc_serves_as_rmms(gpu):
    res = mr.CudaAsyncMemoryResource(enable_ipc=True)
    assert res.stack == "async(ipc=posix_fd)"
    buf = memres.DeviceBuffer.to_device(b"shared", mr=res)
    assert buf.tobytes() == b"shared"
    # Fabric handles need a system with a fabric: made there, the driver's error elsewhere.
    try:
        fabric = mr.CudaAsyncMemoryResource(enable_fabric=True)
    except memres.MemresError as e:
        assert isinstance(e, RuntimeError) and "async(ipc=fabric)" in str(e), e
    else:
        assert memres.DeviceBuffer.to_device(b"fabric", mr=fabric).tobytes() == b"fabric"
