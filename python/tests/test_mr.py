"""memres.mr over the simulated device: composition, errors, the current
resource, reinitialize."""

import gc
import os
import subprocess
import sys
import textwrap
import threading

import pytest

import memres
from memres import _native, mr
from conftest import OddError, fresh_state, need, registry_free_to_another_thread
from test_buffer import BAD_SIZES
from test_reentry import FREE_PANICS_ONCE, run_child
from test_streams import kept_after

GiB = 1 << 30
MiB = 1 << 20



def _default_type():
    """The type of a device's default resource here: RMM's where CUDA is."""
    return mr.CudaMemoryResource if memres.cuda_available() else mr.HostMemoryResource

def sim_pool(**kw):
    return mr.PoolMemoryResource(mr.SimulatedMemoryResource(GiB), **kw)


def test_allocate_and_deallocate_through_a_pool():
    pool = sim_pool(initial_pool_size=MiB)
    ptrs = [pool.allocate(1000) for _ in range(10)]
    assert len(set(ptrs)) == 10 and all(p % 256 == 0 for p in ptrs)
    assert pool.pool_size() == MiB
    for p in ptrs:
        pool.deallocate(p, 1000)
    assert pool._native.live_count() == 0
    assert pool.allocate(0) == 0


def test_a_zero_byte_allocation_reaches_no_layer(tmp_path):
    # What docs/python.md says where RMM differs: its statistics count one
    # and its log writes a row; memres's adaptors count no zero-byte request.
    stats = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    log = mr.LoggingResourceAdaptor(stats, log_file_name=str(tmp_path / "zero.csv"))
    assert log.allocate(0) == 0
    log.deallocate(0, 0)
    log.flush()
    assert stats.allocation_counts.total_count == 0
    assert len(open(log.get_file_name()).read().splitlines()) == 1  # the header alone


def test_a_per_stream_pool_tells_what_it_holds_and_gives_it_back():
    # pool_size() and release() saw only pools of one stream: a pool per
    # stream held 0 bytes and gave nothing back, whatever it held.
    host = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    pool = mr.PoolMemoryResource(host, initial_pool_size=MiB, per_stream=True)
    held = lambda: host.allocation_counts.current_bytes
    assert held() == MiB and pool.pool_size() == MiB
    p = pool.allocate(4 * MiB)  # the pool grows
    size = pool.pool_size()
    assert size == held() >= 4 * MiB
    pool.deallocate(p, 4 * MiB)
    assert pool.release() == size
    assert pool.pool_size() == 0 and held() == 0
    # A stack string's, as memres.allocators.torch.empty_cache() calls it.
    res = mr.StackMemoryResource("stats(pool(host, per_stream=true, initial=1MiB))", backend="sim")
    assert res._native.pool_size() == MiB
    assert res.release() == MiB and res._native.pool_size() == 0
    # A pool over a pool in one stack: the outer one's chunks go back to the
    # inner one first, which gives them on. What left the stack counts once.
    for text in ("pool(pool(host, per_stream=true), initial=2MiB)",
                 "pool(pool(host, initial=2MiB), per_stream=true, initial=1MiB)"):
        res = mr.StackMemoryResource(text, backend="sim")
        size = res._native.pool_size()
        assert size >= 3 * MiB, (text, size)
        before = sim_device_bytes()
        given = res.release()
        assert given == before - sim_device_bytes() and 0 < given < size, (text, given, size)
        assert res._native.pool_size() == 0, text


def sim_device_bytes():
    """Bytes every leaf of the simulated backend holds now."""
    return memres.statistics.get_device_statistics(backend="sim").current_bytes


def test_release_counts_once_what_goes_back_through_upstream_objects():
    # release() added up what each layer gave back, and then what each
    # upstream object gave: a pool's chunk that the pool or virtual pool
    # under it then gave on counted twice.
    for make in [lambda: mr.PoolMemoryResource(mr.PoolMemoryResource(mr.SimulatedMemoryResource(GiB))),
                 lambda: mr.StatisticsResourceAdaptor(mr.PoolMemoryResource(
                     mr.PoolMemoryResource(mr.SimulatedMemoryResource(GiB)), per_stream=True))]:
        res = make()
        ptrs = [res.allocate(3 * MiB) for _ in range(4)]
        for p in ptrs:
            res.deallocate(p, 3 * MiB)
        before = sim_device_bytes()
        given = res.release()
        assert given >= 12 * MiB, (res.stack, given)
        assert given == before - sim_device_bytes(), res.stack
        assert res.release() == 0, res.stack
    # A pool over a virtual pool (whose simulated space the device's
    # figures do not count): the pool's chunks are all the virtual pool
    # maps, and they go back once.
    res = mr.PoolMemoryResource(mr.VirtualMemoryResource(reserve=GiB, simulated_capacity=GiB))
    p = res.allocate(3 * MiB)
    res.deallocate(p, 3 * MiB)
    size = res.pool_size()
    assert size >= 3 * MiB
    assert res.release() == size
    assert res.release() == 0


def test_release_unmaps_what_a_virtual_pool_keeps_mapped():
    # release() (so empty_cache()) saw only `pool` layers: a virtual pool,
    # which keeps freed granules mapped up to its release threshold (by
    # default all of them), gave nothing back.
    for res in [mr.VirtualMemoryResource(reserve=GiB, simulated_capacity=GiB),
                mr.VirtualMemoryResource(reserve=GiB, simulated_capacity=GiB, per_stream=True),
                mr.StackMemoryResource("stats(vpool(sim(1GiB), granule=2MiB))", backend="sim")]:
        ptrs = [res.allocate(3 * MiB) for _ in range(4)]
        for p in ptrs:
            res.deallocate(p, 3 * MiB)
        assert res.release() == 12 * MiB, res.stack  # six granules of 2 MiB
        assert res.release() == 0, res.stack
        p = res.allocate(5 * MiB)  # maps again
        res.deallocate(p, 5 * MiB)
        # Over a statistics adaptor, through the object's upstreams.
        stats = mr.StatisticsResourceAdaptor(res)
        assert stats.release() == 6 * MiB, res.stack


def test_release_gives_back_what_fixed_binning_and_arena_resources_keep():
    # Their free chunks stayed: release() saw only pools.
    for make, size in [(lambda up: mr.FixedSizeMemoryResource(up, block_size=4096), 4096),
                       (lambda up: mr.BinningMemoryResource(up, 18, 20), 300 << 10),
                       (lambda up: mr.ArenaMemoryResource(up), 1000)]:
        host = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
        res = make(host)
        p = res.allocate(size)
        res.deallocate(p, size)
        held = host.allocation_counts.current_bytes
        assert held > 0, res.stack
        assert res.release() == held, res.stack
        assert host.allocation_counts.current_bytes == 0, res.stack


def test_an_adaptor_wraps_the_same_upstream_object():
    stats = mr.StatisticsResourceAdaptor(mr.SimulatedMemoryResource(GiB))
    pool = mr.PoolMemoryResource(stats, initial_pool_size=2 * MiB)
    # The pool's initial chunk came through the very adaptor we hold.
    assert stats.allocation_counts.current_bytes == 2 * MiB
    assert pool.upstream_mr is stats and pool.get_upstream() is stats
    p = stats.allocate(4096)
    assert stats.allocation_counts.current_count == 2
    stats.deallocate(p, 4096)
    assert "up0" in pool.stack


def test_a_refused_free_changes_nothing():
    pool = sim_pool()
    p = pool.allocate(1000)
    with pytest.raises(ValueError, match="allocated with 1000"):
        pool.deallocate(p, 999)
    with pytest.raises(ValueError, match="not allocated by this resource"):
        pool.deallocate(p + 256, 1000)
    pool.deallocate(p, 1000)
    with pytest.raises(ValueError, match="freed already"):
        pool.deallocate(p, 1000)
    assert pool._native.live_count() == 0


def test_a_free_that_fails_below_leaves_the_block_freeable():
    # The block left the object's table for its free and came back only on
    # an error: one whose free panicked below (PyO3 turned a PanicException
    # that Python raised into a panic) stayed live in the stack, which the
    # object no longer knew it by: "freed already" for ever. A callback's
    # PanicException is now its error, as any exception.
    run_child(FREE_PANICS_ONCE + textwrap.dedent("""
        p = top.allocate(4096)
        try:
            top.deallocate(p, 4096)
            raise SystemExit("freed")
        except memres.MemresError as e:
            assert isinstance(e.__cause__, PE), e.__cause__
        assert top.allocation_counts.current_count == 1  # live in the stack
        assert top._native.live_count() == 1
        top.deallocate(p, 4096)
        assert top.allocation_counts.current_count == 0 and top._native.live_count() == 0
        print("done")
    """))


def test_a_free_that_freed_and_then_failed_does_not_put_its_block_back_over_a_newer_one():
    # A deallocate_func that gives the memory back and then raises: another
    # thread may be handed the address meanwhile. The failed free put its
    # block back over the newer one, whose free was then refused as a size
    # mismatch (and a retried free of the old pointer would have freed it).
    free, raise_once, newer = [1 << 40], [False], []

    def dealloc(p, n):
        free.append(p)
        if raise_once[0]:
            raise_once[0] = False
            t = threading.Thread(target=lambda: newer.append(res.allocate(2000)))
            t.start()
            t.join()
            raise RuntimeError("failed after freeing")

    res = mr.CallbackMemoryResource(lambda n: free.pop(), dealloc, backend="sim")
    p = res.allocate(1000)
    raise_once[0] = True
    with pytest.raises(memres.MemresError):
        res.deallocate(p, 1000)
    assert newer == [p]
    res.deallocate(p, 2000)
    assert res._native.live_count() == 0


@pytest.mark.parametrize("bad, error", BAD_SIZES)
def test_bad_sizes_are_rmms_errors(bad, error):
    pool = sim_pool()
    with pytest.raises(error, match="nbytes must be an int"):
        pool.allocate(bad)
    p = pool.allocate(1000)
    with pytest.raises(error, match="nbytes must be an int"):
        pool.deallocate(p, bad)
    with pytest.raises(error, match="ptr must be an int"):
        pool.deallocate(bad, 1000)
    pool.deallocate(p, 1000)
    assert pool._native.live_count() == 0


@pytest.mark.parametrize("bad, error", [(b, e) for b, e in BAD_SIZES if not isinstance(b, str)]
                         + [(t, ValueError) for t in ("ten", "1 GiBB", "-1", "2k", "1ki", "MiB", ".5kib",
                                                      "1e3", " 1MB", "1MB ")])
def test_bad_configuration_sizes_are_errors_naming_the_argument(bad, error):
    with pytest.raises(error, match="initial_pool_size"):
        mr.PoolMemoryResource(mr.SimulatedMemoryResource(GiB), initial_pool_size=bad)
    with pytest.raises(error, match="allocation_limit"):
        mr.LimitingResourceAdaptor(sim_pool(), allocation_limit=bad)


def test_configuration_sizes_may_be_strings_as_in_rmm():
    pool = mr.PoolMemoryResource(mr.SimulatedMemoryResource("2 GiB"), initial_pool_size="32MiB",
                                 maximum_pool_size="1.5 GiB")
    assert pool.pool_size() == 32 * MiB
    assert mr.LimitingResourceAdaptor(pool, "500MB").get_allocation_limit() == 500 * 1000 ** 2
    memres.reinitialize(pool_allocator=True, initial_pool_size="4 MiB")
    assert mr.get_current_device_resource().pool_size() == 4 * MiB
    # RMM's parse_bytes: digits, a fraction, spaces or a tab, a unit ending in b, any case.
    for text, size in [("256", 256), ("512b", 512), ("2.5\tKiB", 2560), ("1.MB", 1000 ** 2), ("3 kb", 3000)]:
        assert mr._parse_bytes(text, "size") == size, text


def test_a_size_string_takes_and_refuses_what_rmms_parse_bytes_does():
    # RMM's pattern ends in `$`, which also matches before a newline that
    # ends the text: "2 GiB\n" is 2 GiB there, and was refused here. Nothing
    # before the digits, no unit alone, no exponent, nothing after the unit.
    assert mr._parse_bytes("2 GiB\n", "size") == 2 * GiB
    assert mr._parse_bytes("256\n", "size") == 256
    for text in (" 2 GiB", "MB", "1e9", "2 GiB ", "2 GiB\n\n", "\n2 GiB", "2 k", "-1"):
        with pytest.raises(ValueError, match="size: Could not parse"):
            mr._parse_bytes(text, "size")


def test_a_size_string_parses_exactly_and_one_past_2_64_names_itself():
    # Through a float, a 20-digit size lost its last digits, and one of 309
    # digits was infinity: an OverflowError about a float, naming nothing.
    assert mr._parse_bytes("12345678901234567891", "size") == 12345678901234567891
    assert mr._parse_bytes("18446744073709551615b", "size") == (1 << 64) - 1
    assert mr._parse_bytes("0.3 kb", "size") == 300
    for text in ("18446744073709551616", "16777216 TiB", "9" * 309, "1" * 5000 + " GiB"):
        with pytest.raises(OverflowError, match=r"memres: initial_pool_size: '[0-9]+.*' is more than 2\*\*64 - 1"):
            mr.PoolMemoryResource(mr.SimulatedMemoryResource(GiB), initial_pool_size=text)


def test_a_size_string_of_thousands_of_digits_parses_exactly():
    # Past 4300 digits, `int` refused it with a ValueError that named no
    # argument ("Exceeds the limit (4300 digits)"): leading zeros and a long
    # fraction included.
    assert mr._parse_bytes("0" * 5000 + "1", "size") == 1
    assert mr._parse_bytes("1." + "0" * 5000 + " KiB", "size") == 1024
    assert mr._parse_bytes("0." + "9" * 5000 + " KiB", "size") == 1023
    assert mr._parse_bytes("0." + "0" * 5000 + "1 PiB", "size") == 0
    # A fraction that ends past the 100th digit, at a unit's exact byte:
    assert mr._parse_bytes("0.5" + "0" * 5000 + " kb", "size") == 500
    assert mr._parse_bytes("1." + "0" * 5000 + "1 b", "size") == 1


def test_out_of_memory_is_a_memory_error_with_the_figures():
    pool = mr.PoolMemoryResource(mr.SimulatedMemoryResource(64 * MiB), maximum_pool_size=32 * MiB)
    p = pool.allocate(16 * MiB)
    with pytest.raises(memres.OutOfMemory) as e:
        pool.allocate(20 * MiB)
    assert isinstance(e.value, MemoryError)
    assert e.value.requested == 20 * MiB
    assert e.value.max_size == 32 * MiB
    # Nothing changed: the live block frees, the pool serves again.
    pool.deallocate(p, 16 * MiB)
    pool.deallocate(pool.allocate(20 * MiB), 20 * MiB)


def test_a_size_a_resource_never_serves_says_why():
    fixed = mr.FixedSizeMemoryResource(sim_pool(), block_size=4096)
    with pytest.raises(memres.OutOfMemory, match=r"4097 bytes \(above the block size\)") as e:
        fixed.allocate(4097)
    assert e.value.requested == 4097
    with pytest.raises(memres.OutOfMemory, match=r"above Request::MAX_SIZE"):
        sim_pool().allocate(1 << 63)
    fixed.deallocate(fixed.allocate(4096), 4096)


def test_sizes_and_pointers_take_numpy_integers_as_rmms_size_t():
    np = need("numpy")
    h = mr.HostMemoryResource()
    p = h.allocate(np.int64(100))
    h.deallocate(np.uint64(p), np.int32(100))
    buf = memres.DeviceBuffer(size=np.prod((10, 10)), mr=h)
    buf.resize(np.int32(20))
    assert buf.size == 20
    # Still refused: what is no integer, or out of range.
    for bad, error in ((np.float64(1.0), TypeError), (np.int64(-1), OverflowError), (True, TypeError)):
        with pytest.raises(error):
            h.allocate(bad)


def test_sizes_rmm_rounds_are_rounded_as_rmms():
    h = mr.HostMemoryResource()
    fixed = mr.FixedSizeMemoryResource(h, block_size=1000, blocks_to_preallocate=4)
    assert "size=1024" in fixed.stack
    fixed.deallocate(fixed.allocate(1024), 1024)
    bins = mr.BinningMemoryResource(h, 5, 10)  # RMM's bins of 32 to 128 bytes hand out 256
    assert "min_bin=256, max_bin=1024" in bins.stack
    for n in (1, 32, 200, 1024, 5000):
        bins.deallocate(bins.allocate(n), n)
    arena = mr.ArenaMemoryResource(h, arena_size=(1 << 20) + 100)
    assert f"initial={1 << 20}" in arena.stack
    arena.deallocate(arena.allocate(100), 100)


@pytest.mark.parametrize("size", [0, 100, 255, (1 << 20) - 1, "512 KiB"])
def test_an_arena_size_below_a_superblock_is_refused_as_rmms(size):
    # Rounded down to 256 it became initial=0 (or a chunk too small for a
    # superblock), accepted without a word; RMM refuses an arena below its
    # minimum superblock size (1 MiB).
    h = mr.HostMemoryResource()
    with pytest.raises(memres.InvalidArgument, match="arena_size .* must be at least 1 MiB"):
        mr.ArenaMemoryResource(h, arena_size=size)
    assert f"initial={1 << 20}" in mr.ArenaMemoryResource(h, arena_size="1 MiB").stack


def test_a_failed_growth_leaves_the_pool_holding_what_it_held():
    # The pool gives its free chunks back before it grows; when the growth
    # fails they are taken again (an impossible request emptied the pool).
    pool = mr.PoolMemoryResource(mr.HostMemoryResource(), initial_pool_size=4 * MiB)
    with pytest.raises(memres.OutOfMemory, match="pool size 4.00 MiB"):
        pool.allocate(1 << 50)
    assert pool.pool_size() == 4 * MiB
    pool.deallocate(pool.allocate(MiB), MiB)


def test_a_refused_resource_leaves_what_the_resource_it_is_built_over_holds():
    # A pool over a pool that cannot give it its initial size is refused;
    # the pool it was to be built over keeps its own initial size (the
    # refusal gave it back to the device).
    sim = mr.SimulatedMemoryResource(capacity=1 << 30)
    p = mr.PoolMemoryResource(sim, initial_pool_size=1 << 29)
    with pytest.raises(memres.OutOfMemory):
        mr.PoolMemoryResource(p, initial_pool_size=1 << 31)
    with pytest.raises(memres.InvalidArgument):
        mr.StackMemoryResource("align(up0, alignment=3)", backend="sim", upstreams=(p,))
    assert p.pool_size() == 1 << 29


def test_limiting_adaptor_reports_its_limit():
    lim = mr.LimitingResourceAdaptor(sim_pool(), allocation_limit=MiB)
    assert lim.get_allocation_limit() == MiB
    p = lim.allocate(MiB // 2)
    with pytest.raises(memres.OutOfMemory) as e:
        lim.allocate(MiB)
    assert (e.value.requested, e.value.used, e.value.limit) == (MiB, MiB // 2, MiB)
    assert lim.get_allocated_bytes() == MiB // 2
    q = lim.allocate(100)
    assert lim.get_allocated_bytes() == MiB // 2 + 256  # each block rounded up, as RMM's
    lim.deallocate(p, MiB // 2)
    lim.deallocate(q, 100)
    assert lim.get_allocated_bytes() == 0


def test_failure_callback_is_asked_and_retries():
    calls = []
    lim = mr.LimitingResourceAdaptor(sim_pool(), allocation_limit=MiB)
    held = [lim.allocate(MiB)]

    def on_failure(nbytes):
        calls.append(nbytes)
        if held:
            lim.deallocate(held.pop(), MiB)
            return True
        return False

    fc = mr.FailureCallbackResourceAdaptor(lim, on_failure)
    p = fc.allocate(4096)
    assert calls == [4096]
    fc.deallocate(p, 4096)
    with pytest.raises(TypeError):
        mr.FailureCallbackResourceAdaptor(lim, 42)


@pytest.mark.parametrize("error,raised", [
    (RuntimeError, RuntimeError),
    (ValueError, RuntimeError),
    (KeyError, RuntimeError),
    (MemoryError, MemoryError),
    (KeyboardInterrupt, KeyboardInterrupt),
])
def test_what_a_failure_callback_raises_is_what_the_allocation_raises(error, raised):
    # RMM's rule (its test_failure_callback_resource_adaptor_error): the
    # exception ends the call, however the stack above would recover (a
    # pool over the adaptor tries a smaller growth after a failed one), and
    # no other failure callback is asked. As RMM's, which turns it into a
    # C++ exception and back, a MemoryError stays one and any other
    # Exception is a RuntimeError saying it (a MemresError, caused by it);
    # Ctrl-C, which RMM's makes a RuntimeError too, is raised as it is.
    asked, outer_asked = [], []

    def on_failure(nbytes):
        asked.append(nbytes)
        raise error("from the callback")

    lim = mr.LimitingResourceAdaptor(mr.SimulatedMemoryResource(GiB), allocation_limit=4 * MiB)
    inner = mr.FailureCallbackResourceAdaptor(lim, on_failure)
    pool = mr.PoolMemoryResource(inner)
    outer = mr.StatisticsResourceAdaptor(
        mr.FailureCallbackResourceAdaptor(pool, lambda n: outer_asked.append(n) or False))
    with pytest.raises(raised, match="from the callback") as e:
        outer.allocate(4096)
    if error in (MemoryError, KeyboardInterrupt):
        assert type(e.value) is error
    else:
        assert isinstance(e.value, memres.MemresError) and type(e.value.__cause__) is error
        assert "the failure callback raised" in str(e.value)
    assert len(asked) == 1 and outer_asked == []
    assert outer.allocation_counts.current_bytes == 0 and pool.pool_size() == 0
    # The next call is its own: without a failure the pool serves it, and
    # a failure with a callback that declines is out of memory.
    inner_ok = mr.FailureCallbackResourceAdaptor(lim, lambda n: False)
    p = inner_ok.allocate(MiB)
    with pytest.raises(memres.OutOfMemory):
        inner_ok.allocate(8 * MiB)
    inner_ok.deallocate(p, MiB)


def test_a_failure_callback_that_collects_garbage_retries_into_the_memory_it_freed():
    # RMM's usual failure callback. The garbage holds buffers of the very
    # adaptor and of a statistics adaptor over it: neither holds a lock
    # while the callback runs, so their frees are applied at once and the
    # retry finds the memory.
    pool = mr.PoolMemoryResource(mr.HostMemoryResource(), initial_pool_size=8192, maximum_pool_size=8192)
    calls = []

    def on_failure(nbytes):
        calls.append(nbytes)
        gc.collect()
        return len(calls) < 3

    fc = mr.FailureCallbackResourceAdaptor(pool, on_failure)
    top = mr.StatisticsResourceAdaptor(fc)

    class Cycle:
        def __init__(self, resource):
            self.buf = memres.DeviceBuffer(size=4096, mr=resource)
            self.me = self

    gc.disable()
    try:
        Cycle(fc), Cycle(top)
        b = memres.DeviceBuffer(size=8192, mr=top)
    finally:
        gc.enable()
    assert len(calls) == 1
    assert top.allocation_counts.current_bytes == 8192 and top.allocation_counts.current_count == 1
    del b
    assert top.allocation_counts.current_bytes == 0


def test_a_cycle_through_a_resources_python_function_is_collected_and_its_memory_given_back():
    host = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())

    class Service:
        def __init__(self):
            self.mr = mr.FailureCallbackResourceAdaptor(
                mr.PoolMemoryResource(host, initial_pool_size=MiB), self.on_failure)
            self.cb = mr.CallbackMemoryResource(self.alloc, self.free, backend="sim")

        def on_failure(self, nbytes):
            return False

        def alloc(self, nbytes):
            return 1 << 40

        def free(self, ptr, nbytes):
            pass

    import weakref
    s = Service()
    alive = weakref.ref(s)
    assert host.allocation_counts.current_bytes == MiB
    del s
    gc.collect()
    assert alive() is None
    assert host.allocation_counts.current_bytes == 0


# Stacks over a CallbackMemoryResource that keep freed memory: pools, one
# through an object over it, the fixed-size, binning and arena resources.
OVER_A_CALLBACK = {
    "pool": lambda cb: mr.PoolMemoryResource(cb, initial_pool_size=MiB),
    "stats over a pool": lambda cb: mr.StatisticsResourceAdaptor(mr.PoolMemoryResource(cb, initial_pool_size=MiB)),
    "pool over a pool": lambda cb: mr.PoolMemoryResource(mr.PoolMemoryResource(cb, initial_pool_size=MiB),
                                                         initial_pool_size=1 << 16),
    "fixed": lambda cb: mr.FixedSizeMemoryResource(cb, block_size=4096, blocks_to_preallocate=4),
    "binning": lambda cb: mr.BinningMemoryResource(cb, 10, 14),
    "arena": lambda cb: mr.ArenaMemoryResource(cb, arena_size=MiB),
}


@pytest.mark.parametrize("over", OVER_A_CALLBACK)
def test_a_cycle_through_bound_methods_of_an_object_holding_pools_over_them_gives_their_memory_back(over):
    # The usual pattern: the collector cleared the object's __dict__ before
    # it dropped the pool, whose chunk then went back to `free`, which
    # raised AttributeError: the chunk was never freed.
    class Service:
        def __init__(self):
            self.live, self.next = {}, 1 << 40
            self.cb = mr.CallbackMemoryResource(self.alloc, self.free, backend="sim")
            self.top = OVER_A_CALLBACK[over](self.cb)
            self.top.deallocate(self.top.allocate(1000), 1000)

        def alloc(self, nbytes):
            p = self.next
            self.next += nbytes
            self.live[p] = nbytes
            return p

        def free(self, ptr, nbytes):
            del self.live[ptr]

    s = Service()
    live = s.live
    assert live
    seen, hook = [], sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        del s
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert live == {} and seen == [], (live, [u.exc_value for u in seen])


def test_a_block_kept_in_a_collected_cycle_is_given_back_before_its_function_is_cleared():
    # A block allocate kept (refused back) went back only at the stack's
    # drop, after the collector had cleared the function's object: refused
    # again, and lost.
    class Service:
        def __init__(self):
            self.refusing, self.freed = True, []
            self.cb = mr.CallbackMemoryResource(self.alloc, self.free, backend="sim")
            self.p = self.cb.allocate(100)
            with pytest.raises(memres.MemresError, match="kept"):
                self.cb.allocate(200)  # the same address again
            self.refusing = False

        def alloc(self, nbytes):
            return 1 << 40

        def free(self, ptr, nbytes):
            if self.refusing:
                raise RuntimeError("refused")
            self.freed.append((ptr, nbytes))

    s = Service()
    freed = s.freed
    seen, hook = [], sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        del s
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert freed == [(1 << 40, 200)] and seen == [], (freed, [u.exc_value for u in seen])


def refusing_free(ptr, nbytes):
    raise ValueError("refused")


def said_by_drops(seen):
    """What the hook was told of frees that drops made: each a
    ``MemresError`` whose cause is the function's exception."""
    return [(type(u.exc_value).__name__, type(u.exc_value.__cause__).__name__, str(u.exc_value.__cause__))
            for u in seen if u.object == "memres: the drop of a resource"]


def said_as_a_pool_over_is_dropped(deallocate_func):
    """What sys.unraisablehook is told as a pool of one chunk over
    ``deallocate_func`` is dropped."""
    pool = mr.PoolMemoryResource(mr.CallbackMemoryResource(lambda n: 1 << 40, deallocate_func, backend="sim"),
                                 initial_pool_size=MiB)
    seen, hook = [], sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        del pool
    finally:
        sys.unraisablehook = hook
    return seen


def test_a_free_that_a_python_function_refuses_as_a_resource_is_dropped_is_said():
    # The pool gives its chunk back to `refusing_free` when dropped; the
    # core drops the free's error, and the chunk was lost without a word.
    assert said_by_drops(said_as_a_pool_over_is_dropped(refusing_free)) == [("MemresError", "ValueError", "refused")]


def test_a_functions_exception_whose_type_has_no_qualname_is_still_the_cause():
    # Said in the error's text through PyO3's `Display` of an exception,
    # which fails where the type's `__qualname__` raises: `format!`
    # panicked, and the call raised a PanicException in place of the
    # function's exception (a drop said that panic).
    def fail(*args):
        raise OddError("odd")

    cb = mr.CallbackMemoryResource(fail, lambda p, n: None, backend="sim")
    with pytest.raises(memres.MemresError, match=r"allocate_func raised \(OddError: odd\)") as e:
        cb.allocate(4096)
    assert type(e.value.__cause__) is OddError
    seen = said_as_a_pool_over_is_dropped(fail)
    assert said_by_drops(seen) == [("MemresError", "OddError", "odd")]
    assert "(OddError: odd)" in str(seen[0].exc_value), seen[0].exc_value


def test_a_pool_over_python_functions_alive_at_exit_ends_without_a_panic():
    # Dropped while the interpreter is finalized, the pool's chunks cannot
    # go back to the Python function: the process is ending. PyO3 panicked.
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from memres import mr
        cb = mr.CallbackMemoryResource(lambda n: 1 << 40, lambda p, n: None, backend="sim")
        pool = mr.PoolMemoryResource(cb, initial_pool_size=1 << 20)
        p = pool.allocate(100)
        def keep(resource):
            raise ValueError("uncaught, its frame keeps the pool until the end")
        keep(pool)
    """)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert "ValueError: uncaught" in out.stderr and "panicked" not in out.stderr, out.stderr


def test_callback_resource_calls_python():
    calls = []
    base = 1 << 40

    def alloc(n):
        calls.append(("a", n))
        return base + 4096 * len(calls)

    def free(p, n):
        calls.append(("f", p, n))

    cb = mr.CallbackMemoryResource(alloc, free, backend="sim")
    p = cb.allocate(100)
    cb.deallocate(p, 100)
    assert calls == [("a", 100), ("f", p, 100)]


def test_a_memory_error_of_allocate_func_is_out_of_memory_and_asks_the_failure_callback():
    failures = []

    def alloc(n):
        if not failures:
            raise MemoryError("no more")
        return 1 << 40

    cb = mr.CallbackMemoryResource(alloc, lambda p, n: None, backend="sim")
    with pytest.raises(memres.OutOfMemory, match="allocate\\(100\\)") as e:
        cb.allocate(100)
    assert e.value.requested == 100
    fc = mr.FailureCallbackResourceAdaptor(cb, lambda n: failures.append(n) or True)
    p = fc.allocate(100)  # retried after the callback
    assert failures == [100] and p == 1 << 40
    fc.deallocate(p, 100)


def test_an_allocation_too_large_for_any_resource_is_out_of_memory_as_in_rmm():
    pool = sim_pool()
    with pytest.raises(memres.OutOfMemory) as e:
        pool.allocate(1 << 63)
    assert e.value.requested == 1 << 63
    assert pool._native.live_count() == 0 and pool.allocate(100) != 0


def test_a_misaligned_address_from_allocate_func_is_refused_and_given_back():
    freed = []
    cb = mr.CallbackMemoryResource(lambda n: (1 << 40) + 8, lambda p, n: freed.append((p, n)), backend="sim")
    with pytest.raises(memres.MemresError, match="misaligned"):
        cb.allocate(100)
    assert freed == [((1 << 40) + 8, 100)] and cb._native.live_count() == 0


def test_errors_say_memres_once():
    def bad(n):
        raise RuntimeError("nope")

    cb = mr.CallbackMemoryResource(bad, lambda p, n: None, backend="sim")
    with pytest.raises(memres.MemresError) as e:
        cb.allocate(10)
    assert str(e.value).startswith("memres: allocate(10): ") and "memres: memres" not in str(e.value)


def test_a_callbacks_own_exception_is_the_cause_of_the_memres_error():
    def alloc(n):
        raise KeyError("mine")

    def free(p, n):
        raise LookupError("free refused")

    cb = mr.CallbackMemoryResource(alloc, free, backend="sim")
    with pytest.raises(memres.MemresError, match="allocate_func raised") as e:
        cb.allocate(10)
    assert isinstance(e.value.__cause__, KeyError) and e.value.__cause__.args == ("mine",)
    ok = mr.CallbackMemoryResource(lambda n: 1 << 40, free, backend="sim")
    p = ok.allocate(10)
    with pytest.raises(memres.MemresError, match="deallocate_func raised") as e:
        ok.deallocate(p, 10)
    assert isinstance(e.value.__cause__, LookupError)
    assert ok._native.live_count() == 1  # a refused free changes nothing


@pytest.mark.parametrize("error, raised", [(RuntimeError, memres.MemresError), (Exception, memres.MemresError),
                                           (MemoryError, memres.OutOfMemory)])
def test_a_callbacks_own_words_are_in_what_is_raised_as_rmms(error, raised):
    # RMM's test_callback_mr_error: pytest.raises(..., match="My alloc error").
    def alloc(nbytes, stream):
        raise error("My alloc error")

    cb = mr.CallbackMemoryResource(alloc, lambda p, n, s: None, backend="sim")
    with pytest.raises(raised, match="My alloc error") as e:
        cb.allocate(256)
    assert type(e.value.__cause__) is error and e.value.__cause__.args == ("My alloc error",)
    # A later failure of another kind carries no stale cause.
    limited = mr.LimitingResourceAdaptor(mr.HostMemoryResource(), 1024)
    with pytest.raises(memres.OutOfMemory) as e:
        limited.allocate(4096)
    assert e.value.__cause__ is None and "My alloc error" not in str(e.value)


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_ctrl_c_or_exit_in_a_callback_resources_function_is_raised_as_it_is(error):
    # Ctrl-C while allocate_func or deallocate_func runs, or sys.exit() in
    # one, became a MemresError (a RuntimeError, an Exception), which
    # `except Exception` around the call swallowed: the program went on.
    # As a failure callback's, it is what the call raises; nothing changes.
    fail, freed = [True], []

    def alloc(nbytes):
        if fail[0]:
            raise error("stop")
        return 1 << 40

    def dealloc(ptr, nbytes):
        if fail[0]:
            raise error("stop")
        freed.append(ptr)

    cb = mr.CallbackMemoryResource(alloc, dealloc, backend="sim")
    pool = mr.PoolMemoryResource(cb)
    top = mr.StatisticsResourceAdaptor(pool)
    for r in (cb, top):
        with pytest.raises(error, match="stop"):
            r.allocate(4096)
    assert top.allocation_counts.current_count == 0 and pool.pool_size() == 0
    fail[0] = False
    p = cb.allocate(4096)
    fail[0] = True
    with pytest.raises(error, match="stop"):
        cb.deallocate(p, 4096)
    assert cb._native.live_count() == 1 and freed == []  # a refused free changes nothing
    fail[0] = False
    cb.deallocate(p, 4096)
    assert freed == [p] and cb._native.live_count() == 0
    q = top.allocate(4096)
    top.deallocate(q, 4096)


@pytest.mark.parametrize("returned, error, says", [
    ("4096", TypeError, "'4096' (a str)"),
    (4096.0, TypeError, "4096.0 (a float)"),
    (None, TypeError, "None (a NoneType)"),
    (True, TypeError, "True (a bool)"),
    (-256, ValueError, "-256"),
    (1 << 64, ValueError, str(1 << 64)),
])
def test_allocate_func_returning_no_int_address_says_what_it_returned(returned, error, says):
    freed = []
    cb = mr.CallbackMemoryResource(lambda n: returned, lambda p, n: freed.append(p), backend="sim")
    with pytest.raises(memres.MemresError, match="allocate_func returned no int address") as e:
        cb.allocate(4096)
    assert isinstance(e.value.__cause__, error) and says in str(e.value.__cause__), e.value.__cause__
    assert cb._native.live_count() == 0 and freed == []


class _ReprRaises:
    def __init__(self, error):
        self.error = error

    def __repr__(self):
        raise self.error("no repr")

    __str__ = __repr__


class _NegativeReprRaises(int):
    def __repr__(self):
        raise RuntimeError("no repr")

    __str__ = __repr__


@pytest.mark.parametrize("returned, error, says", [
    (_ReprRaises(RuntimeError), TypeError,
     "returned <_ReprRaises object, whose repr raised RuntimeError> (a _ReprRaises)"),
    # Raised from the repr, a MemoryError was out of memory for the call.
    (_ReprRaises(MemoryError), TypeError,
     "returned <_ReprRaises object, whose repr raised MemoryError> (a _ReprRaises)"),
    (_NegativeReprRaises(-256), ValueError,
     "returned <_NegativeReprRaises object, whose repr raised RuntimeError>, not an address"),
], ids=["object", "memory-error", "int"])
def test_an_address_whose_repr_raises_is_still_said_as_no_int_address(monkeypatch, returned, error, says):
    # The repr's exception was what the call raised, in place of the
    # TypeError (the str's, said on sys.unraisablehook, beside the
    # ValueError).
    said = []
    monkeypatch.setattr(sys, "unraisablehook", said.append)
    freed = []
    cb = mr.CallbackMemoryResource(lambda n: returned, lambda p, n: freed.append(p), backend="sim")
    with pytest.raises(memres.MemresError, match="allocate_func returned no int address") as e:
        cb.allocate(4096)
    assert type(e.value.__cause__) is error and says in str(e.value.__cause__), e.value.__cause__
    assert said == [] and cb._native.live_count() == 0 and freed == []


def test_a_refused_address_whose_give_back_raises_is_the_cause_of_the_refusal(capfd):
    # The exception was printed on stderr, and the call's error had no
    # cause.
    addrs, freed = [(1 << 40) + 8, 1 << 40], []

    def deallocate(p, n):
        freed.append(p)
        if p % 256:
            raise RuntimeError("no give-back")

    cb = mr.CallbackMemoryResource(lambda n: addrs.pop(0), deallocate, backend="sim")
    with pytest.raises(memres.MemresError, match="misaligned") as e:
        cb.allocate(4096)
    assert type(e.value.__cause__) is RuntimeError and "no give-back" in str(e.value), e.value
    assert "no give-back" not in capfd.readouterr().err
    assert cb._native.live_count() == 0 and freed == [(1 << 40) + 8]
    p = cb.allocate(4096)  # serves on
    cb.deallocate(p, 4096)
    assert freed == [(1 << 40) + 8, 1 << 40] and cb._native.live_count() == 0


def test_sys_exit_in_the_give_back_of_a_refused_address_is_what_the_call_raises():
    # Printed as the error was, SystemExit ended the process at once, from
    # inside the allocation.
    run_child("""
        import sys
        from memres import mr
        def deallocate(p, n):
            sys.exit(3)
        cb = mr.CallbackMemoryResource(lambda n: (1 << 40) + 8, deallocate, backend="sim")
        try:
            cb.allocate(4096)
        except SystemExit as e:
            assert e.code == 3
        else:
            raise AssertionError("no SystemExit")
        assert cb._native.live_count() == 0
        print("done")
    """)


@pytest.mark.parametrize("adaptor", ["track", "limit", "stats"])
def test_an_address_handed_out_while_live_under_an_adaptor_leaves_its_counts_exact(adaptor):
    # Refused by the object's table above the adaptor, the block went back
    # through it: the tracking and limiting adaptors had taken it for the
    # older block of its address, and forgot that one (then refused its
    # free: lost), the limit's charge went to 0 while it was live, and the
    # statistics counted the refused block in their peak and total. The
    # callback's leaf now refuses it, so no adaptor sees it.
    freed = []
    cb = mr.CallbackMemoryResource(lambda n: 1 << 40, lambda p, n: freed.append((p, n)), backend="sim")
    top = {"track": lambda: mr.TrackingResourceAdaptor(cb),
           "limit": lambda: mr.LimitingResourceAdaptor(cb, 1 << 20),
           "stats": lambda: mr.StatisticsResourceAdaptor(cb)}[adaptor]()

    def counts():
        return {"track": lambda: (top.get_outstanding_count(), top.get_allocated_bytes()),
                "limit": lambda: top.get_allocated_bytes(),
                "stats": lambda: (top.allocation_counts.current_bytes, top.allocation_counts.peak_bytes,
                                  top.allocation_counts.total_bytes)}[adaptor]()

    p = top.allocate(100)
    before = counts()
    with pytest.raises(memres.MemresError, match="a live address"):
        top.allocate(200)  # the same address again
    assert freed == [(1 << 40, 200)]  # the new block went back
    assert counts() == before
    top.deallocate(p, 100)  # the older block is still freeable, and freed once
    assert freed == [(1 << 40, 200), (1 << 40, 100)]
    assert top._native.live_count() == 0


def test_an_address_inside_a_live_block_is_refused_and_given_back():
    # Not only the same address: a block that overlaps a live one (a pool
    # over the callback would hand the same memory out twice).
    addresses, freed = iter([1 << 40, (1 << 40) + 256, (1 << 40) - 256, 1 << 41]), []
    cb = mr.CallbackMemoryResource(lambda n: next(addresses), lambda p, n: freed.append((p, n)), backend="sim")
    p = cb.allocate(1000)
    with pytest.raises(memres.MemresError, match="a live address"):
        cb.allocate(100)  # inside p
    with pytest.raises(memres.MemresError, match="a live address"):
        cb.allocate(512)  # ends inside p
    q = cb.allocate(100)
    assert q == 1 << 41 and freed == [((1 << 40) + 256, 100), ((1 << 40) - 256, 512)]
    cb.deallocate(p, 1000)
    cb.deallocate(q, 100)
    assert cb._native.live_count() == 0


def test_a_live_address_whose_give_back_raises_has_the_functions_exception_as_cause():
    # The error said "deallocate_func raised", without the function's
    # exception, which was lost.
    refuse = [True]

    def deallocate(p, n):
        if refuse[0]:
            raise RuntimeError("no give-back")

    cb = mr.CallbackMemoryResource(lambda n: 1 << 40, deallocate, backend="sim")
    p = cb.allocate(100)
    with pytest.raises(memres.MemresError, match="a live address") as e:
        cb.allocate(200)  # the same address again
    assert type(e.value.__cause__) is RuntimeError and "(RuntimeError: no give-back)" in str(e.value), e.value
    assert cb._native.live_count() == 1
    refuse[0] = False
    cb.deallocate(p, 100)
    assert cb._native.live_count() == 0
    cb.release()  # the block refused back, kept
    assert not cb._native.in_use()


def test_a_block_refused_back_at_a_live_address_is_kept_for_release():
    # Its give-back refused, the new block was lost: in no table, live in
    # its stack for good. It is kept, counts as use, and release() gives it
    # back first, keeping it while it is refused.
    refuse, freed = [True], []

    def deallocate(p, n):
        if refuse[0]:
            raise RuntimeError("no give-back")
        freed.append((p, n))

    cb = mr.CallbackMemoryResource(lambda n: 1 << 40, deallocate, backend="sim")
    p = cb.allocate(100)
    with pytest.raises(memres.MemresError, match="kept to give back at the next release") as e:
        cb.allocate(200)  # the same address again
    assert type(e.value.__cause__) is RuntimeError, e.value
    refuse[0] = False
    cb.deallocate(p, 100)
    assert freed == [(1 << 40, 100)] and cb._native.live_count() == 0
    assert cb._native.in_use()  # the kept block
    refuse[0] = True
    with pytest.raises(memres.MemresError, match="still kept") as e:
        cb.release()
    assert type(e.value.__cause__) is RuntimeError, e.value
    refuse[0] = False
    assert cb.release() == 0
    assert freed == [(1 << 40, 100), (1 << 40, 200)]
    assert not cb._native.in_use()


def test_a_deferred_free_that_a_python_function_refuses_is_said_with_its_exception():
    # Said on stderr as "deallocate_func raised", the function's exception
    # lost, where a drop's refused free is said on sys.unraisablehook.
    # A free into the object whose callback runs is applied at once: the
    # one that waits goes through a binning layer above it.
    state = {"next": 1 << 40}

    def allocate(n):
        if n == 16 << 20:
            binning.deallocate(state["q"], 8 << 20)  # re-entrant: applied once the allocation returns
        state["next"] += 1 << 30
        return state["next"]

    def deallocate(p, n):
        if p == state["q"]:
            raise RuntimeError("refused later")

    binning = mr.BinningMemoryResource(mr.CallbackMemoryResource(allocate, deallocate, backend="sim"))
    state["q"] = binning.allocate(8 << 20)
    seen, hook = [], sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        p = binning.allocate(16 << 20)
    finally:
        sys.unraisablehook = hook
    said = [(type(u.exc_value).__name__, repr(u.exc_value.__cause__)) for u in seen
            if u.object == "memres: a free deferred from a call inside a callback"]
    assert said == [("MemresError", "RuntimeError('refused later')")], seen
    assert "(RuntimeError: refused later)" in str(seen[0].exc_value), seen[0].exc_value
    binning.deallocate(p, 16 << 20)
    assert binning._native.live_count() == 0


def test_callback_functions_must_be_callable():
    with pytest.raises(TypeError, match="allocate_func must be callable"):
        mr.CallbackMemoryResource(1, lambda p, n: None, backend="sim")
    with pytest.raises(TypeError, match="deallocate_func must be callable"):
        mr.CallbackMemoryResource(lambda n: 1 << 40, 2, backend="sim")


def test_an_address_handed_out_while_live_is_refused_and_given_back():
    freed = []
    cb = mr.CallbackMemoryResource(lambda n: 1 << 40, lambda p, n: freed.append((p, n)), backend="sim")
    top = mr.StatisticsResourceAdaptor(cb)
    p = top.allocate(100)
    with pytest.raises(memres.MemresError, match="a live address"):
        top.allocate(200)  # the same address again
    assert freed == [(1 << 40, 200)]  # the new block went back
    assert top._native.live_count() == 1
    counts = top.allocation_counts
    assert counts.current_count == 1 and counts.current_bytes == 100, counts
    top.deallocate(p, 100)  # the older block is still freeable
    assert top.allocation_counts.current_bytes == 0 and top._native.live_count() == 0


def test_every_algorithm_and_the_tracking_adaptor():
    for res in [mr.BinningMemoryResource(sim_pool(), 10, 20),
                mr.FixedSizeMemoryResource(sim_pool(), block_size=4096),
                mr.ArenaMemoryResource(mr.SimulatedMemoryResource(GiB)),
                mr.PoolMemoryResource(mr.SimulatedMemoryResource(GiB), per_stream=True),
                mr.VirtualMemoryResource(reserve=GiB, simulated_capacity=GiB),
                mr.VirtualMemoryResource(reserve=GiB, simulated_capacity=GiB, per_stream=True),
                mr.StackMemoryResource("vpool(sim)", backend="sim")]:
        track = mr.TrackingResourceAdaptor(res)
        ptrs = [track.allocate(4000) for _ in range(3)]
        assert track.get_outstanding_count() == 3
        assert track.get_allocated_bytes() >= 12000
        for p in ptrs:
            track.deallocate(p, 4000)
        assert track.get_outstanding_count() == 0


def test_a_tracking_adaptor_dropped_with_allocations_outstanding_says_nothing_as_rmms():
    # The core's tracking layer writes a report to standard error, the
    # file descriptor itself, where no capture of Python's sees it.
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import gc
        from memres import mr
        t = mr.TrackingResourceAdaptor(mr.HostMemoryResource(), capture_stacks=True)
        t.allocate(1000)
        del t
        gc.collect()
        print("done")
    """)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "done", out
    assert out.stderr == "", out.stderr


def test_tracking_reports_its_outstanding_allocations_as_rmm(caplog):
    t = mr.TrackingResourceAdaptor(sim_pool())
    a, b = t.allocate(100), t.allocate(3000)
    report = t.get_outstanding_allocations_str()
    assert report.splitlines() == ["2 outstanding allocation(s), 3100 bytes",
                                   f"  {min(a, b):#x}: {100 if a < b else 3000} bytes",
                                   f"  {max(a, b):#x}: {3000 if a < b else 100} bytes"]
    with caplog.at_level("DEBUG", logger="memres"):
        t.log_outstanding_allocations()
    assert report in caplog.text
    t.deallocate(a, 100)
    t.deallocate(b, 3000)
    assert t.get_outstanding_allocations_str() == ""  # as RMM's
    # capture_stacks=True: each line has the backtrace of its allocation.
    traced = mr.TrackingResourceAdaptor(sim_pool(), capture_stacks=True)
    assert "backtraces=true" in traced.stack
    p = traced.allocate(10)
    assert len(traced.get_outstanding_allocations_str().splitlines()) > 2
    traced.deallocate(p, 10)


def test_a_planned_stack_lays_out_a_step_once_it_repeats():
    res = mr.StackMemoryResource("stats(planned(pool(sim(1GiB))))", backend="sim")

    def one_step():
        assert res.step() == 1
        a = res.allocate(MiB)
        b = res.allocate(MiB)
        res.deallocate(a, MiB)
        c = res.allocate(2 * MiB)  # a's hole is too small for it online
        res.deallocate(b, MiB)
        res.deallocate(c, 2 * MiB)
        return a, b, c

    recorded = [one_step() for _ in range(2)]
    assert all(c != a for a, _, c in recorded)
    # Steps 1 and 2 asked alike: step 3 on are laid out knowing that a is
    # freed before c comes, so c takes a's place.
    held = None
    for _ in range(3):
        a, b, c = one_step()
        assert c == a and b != a
        held = held or res._native.pool_size()
        assert res._native.pool_size() == held, "nothing more taken from the device"
    assert res._native.live_count() == 0
    # Five calls of step: the third planned from the second step, the
    # fourth and fifth ended steps that followed the plan; steps 3 to 5
    # took their three blocks each from the region, of 2 MiB (c over a).
    s = res.steps()
    assert (s["steps"], s["plans"], s["followed"], s["planned_allocations"]) == (5, 1, 2, 9), s
    assert (s["region"], s["carry_region"]) == (3 * MiB, 0), s
    # Nothing lives in the region: release() (empty_cache) gives it to the
    # pool, which gives its chunks to the device; the plan goes with it.
    held = res._native.pool_size()
    assert res.release() == held > 0
    assert res._native.pool_size() == 0
    assert res.steps()["region"] == 0
    for _ in range(3):
        one_step()
    assert res.steps()["plans"] == 2
    plain = mr.StackMemoryResource("pool(sim)", backend="sim")
    assert plain.step() == 0
    assert set(plain.steps().values()) == {0}


def test_a_planned_stack_under_an_adaptor_object_is_stepped_through_it():
    # step() and steps() read the planned layers of the object's own stack
    # only: enable_statistics() or enable_logging() over a planned stack
    # (TRAINING_STACK) put an object on top whose step() stepped nothing,
    # and the loop was never laid out, without a word.
    planned = mr.StackMemoryResource("planned(pool(sim(1GiB)))", backend="sim")
    top = mr.StatisticsResourceAdaptor(mr.LimitingResourceAdaptor(planned, 1 << 30))
    for _ in range(5):
        assert top.step() == 1
        a = top.allocate(MiB)
        b = top.allocate(MiB)
        top.deallocate(a, MiB)
        c = top.allocate(2 * MiB)
        top.deallocate(b, MiB)
        top.deallocate(c, 2 * MiB)
    s = top.steps()
    assert (s["steps"], s["plans"], s["followed"]) == (5, 1, 2), s
    assert top.steps() == planned.steps()
    # Two objects over one planned stack step it once each.
    both = mr.BinningMemoryResource(planned)
    both.add_bin(4096, planned)
    assert both.step() == 1


def test_a_stack_string_over_resource_objects_names_them_up0_up1():
    host, small = mr.HostMemoryResource(), mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    res = mr.StackMemoryResource("stats(binning(pool(up0), bin(4KiB, up1), powers=false))",
                                 upstreams=[host, small])
    assert res._backend == "sim", "the upstreams' backend, not the default CUDA"
    a, b = res.allocate(3000), res.allocate(MiB)
    assert small.allocation_counts.current_count == 1, "4 KiB and below from up1"
    del host, small
    gc.collect()
    res.deallocate(a, 3000)
    res.deallocate(b, MiB)
    assert res.release() > 0, "the pool over up0 gave back its chunk"


def test_a_stack_string_over_resource_objects_refuses_what_does_not_fit():
    host = mr.HostMemoryResource()
    with pytest.raises(ValueError, match=r"^memres: stack `pool\(up0\)`: upstream `up1` is given and not named"):
        mr.StackMemoryResource("pool(up0)", upstreams=[host, host])
    with pytest.raises(ValueError, match=r"^memres: stack `pool\(up1\)`: upstream `up0` is given and not named"):
        mr.StackMemoryResource("pool(up1)", upstreams=[host])
    with pytest.raises(ValueError, match=r"at byte 23: unknown resource `up1`"):
        mr.StackMemoryResource("binning(up0, bin(4KiB, up1))", upstreams=[host])
    with pytest.raises(ValueError, match=r"^memres: backend='cuda' over upstreams of the 'sim' backend"):
        mr.StackMemoryResource("pool(up0)", backend="cuda", upstreams=[host])
    with pytest.raises(TypeError, match=r"^memres: an upstream must be a memres.mr resource, not int"):
        mr.StackMemoryResource("pool(up0)", upstreams=[5])
    for bad in [host, "up0", 5]:
        with pytest.raises(TypeError, match=r"^memres: upstreams must be a list of memres.mr resources"):
            mr.StackMemoryResource("pool(up0)", upstreams=bad)
    # Nothing was taken from it meanwhile: it serves as before.
    host.deallocate(host.allocate(100), 100)


def test_a_planned_layer_whose_step_fails_raises_and_keeps_its_region():
    # A step gives back the region of a plan the steps no longer follow;
    # a refusal is the step's error, and the region stays held, counted
    # and given back by a later release: nothing is lost.
    refuse, freed = [False], []

    def free(ptr, nbytes):
        if refuse[0]:
            raise OddError("refused")
        host.deallocate(ptr, nbytes)
        freed.append((ptr, nbytes))

    host = mr.HostMemoryResource()
    below = mr.CallbackMemoryResource(host.allocate, free, backend="sim")
    res = mr.StackMemoryResource("planned(up0)", upstreams=[below])
    for _ in range(4):
        assert res.step() == 1
        a, b = res.allocate(1000), res.allocate(5000)
        res.deallocate(a, 1000)
        res.deallocate(b, 5000)
    s = res.steps()
    assert (s["plans"], s["followed"]) == (1, 1) and s["region"] > 0, s
    region = s["region"]
    res.deallocate(res.allocate(7000), 7000)  # no longer the plan's steps
    refuse[0] = True

    def failing_step(stream):
        with pytest.raises(memres.MemresError, match=r"^memres: step: .*deallocate_func raised \(OddError: refused\)") as e:
            res.step(stream)
        assert isinstance(e.value.__cause__, OddError)

    # The layer stepped on the stream, failing: the stack keeps it.
    assert kept_after(failing_step)
    assert res.steps()["steps"] == 5 and res.steps()["region"] == region, "counted; the region kept"
    refuse[0] = False
    c = res.allocate(2000)
    res.deallocate(c, 2000)
    assert res.release() == region
    assert res.steps()["region"] == 0
    assert sorted(n for _, n in freed).count(region) == 1, "the region given back once"
    assert host._native.live_count() == 0, "everything taken from the host given back"


def test_binning_takes_rmm_exponents_and_refuses_bad_ones():
    # RMM's exponents become the stack's bin sizes in bytes (min_bin=, max_bin=).
    b = mr.BinningMemoryResource(sim_pool(), 8, 22)
    b.deallocate(b.allocate(1 << 22), 1 << 22)
    for bad in [-2, 64, 1.5, True]:
        with pytest.raises(ValueError, match="size_exponent"):
            mr.BinningMemoryResource(sim_pool(), bad, 20)


def test_add_bin_routes_sizes_to_the_bins_added_as_rmms():
    # RMM's own test adds a 1 KiB bin over the constructor's and a 128 MiB one.
    up = sim_pool()
    b = mr.BinningMemoryResource(up, 10, 17)
    small, large = mr.StatisticsResourceAdaptor(up), mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    b.add_bin(1 << 10, small)  # replaces the constructor's 1 KiB bin
    b.add_bin(1 << 27, large)
    assert b.bin_mrs == [small, large] and b.upstream_mr is up
    assert b.stack == "binning(up0, bin(1024, up1), bin(134217728, up2), min_bin=1024, max_bin=131072)"
    ptrs = {n: b.allocate(n) for n in (700, 3000, 100 << 20, 200 << 20)}
    assert small.allocation_counts.current_bytes == 700  # the 1 KiB bin
    assert large.allocation_counts.current_bytes == 100 << 20  # the 128 MiB bin
    assert up.pool_size() >= (200 << 20) + 4096 * 128  # the 4 KiB power of two, and above every bin
    for n, p in ptrs.items():
        b.deallocate(p, n)
    assert small.allocation_counts.current_bytes == large.allocation_counts.current_bytes == 0
    # Without a resource: a fixed-size bin, the size rounded up to 256 as
    # RMM's; one of a size there already changes nothing.
    b.add_bin(3000)
    b.add_bin(2000)  # 2048, a power of two of the constructor's
    assert b.stack == ("binning(up0, bin(1024, up1), bin(3072), bin(134217728, up2), "
                       "min_bin=1024, max_bin=131072)")
    b.deallocate(b.allocate(3000), 3000)


def test_add_bin_without_exponents_makes_the_bins_added_the_only_ones():
    up = mr.StatisticsResourceAdaptor(sim_pool())
    # With one exponent, as with none: RMM's makes bins only given both.
    assert mr.BinningMemoryResource(up, 10).stack == mr.BinningMemoryResource(up, -1, 20).stack
    b = mr.BinningMemoryResource(up)
    assert b.stack == "binning(up0, powers=false)"
    # No bins, as RMM's: every size goes upstream as it is (a power-of-two
    # bin would take a chunk of 128 blocks).
    for n in (3000, 300 << 10, 3 << 20):
        p = b.allocate(n)
        assert up.allocation_counts.current_bytes == n
        b.deallocate(p, n)
    b.add_bin(1 << 20)
    b.add_bin(1 << 20)  # there already: nothing changes
    assert b.stack == "binning(up0, bin(1048576), powers=false)"  # as RMM's: only the bins added
    one = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    b.add_bin(4096, one)
    b.add_bin(8192, one)  # one resource, two bins
    assert b.stack == "binning(up0, bin(4096, up1), bin(8192, up1), bin(1048576), powers=false)"
    b.deallocate(b.allocate(5000), 5000)
    assert one.allocation_counts.total_count == 1


def test_add_bin_while_another_thread_allocates_loses_no_block():
    # add_bin checked that the resource was unused, then (the GIL released
    # while it built) replaced the stack: an allocation on the old stack
    # that ended after the check was a block the new stack refused to free,
    # lost for good.
    handed, freed = [], []
    inside, go = threading.Event(), threading.Event()

    def alloc(n):
        inside.set()
        go.wait()  # the allocation ends only once add_bin has checked
        handed.append(0x100000 * (len(handed) + 1))
        return handed[-1]

    b = mr.BinningMemoryResource(mr.CallbackMemoryResource(alloc, lambda p, n: freed.append(p),
                                                           backend="sim"))
    outcome = []

    def allocate():
        try:
            outcome.append(b.allocate(5000))
        except memres.MemresError as e:
            outcome.append(e)

    t = threading.Thread(target=allocate)
    t.start()
    inside.wait()
    try:
        b.add_bin(4096, mr.HostMemoryResource())
        added = True
    except memres.InvalidArgument:
        added = False
    go.set()
    t.join()
    # Either add_bin saw the allocation and changed nothing, or the
    # allocation on the stack it replaced was refused, its block given back.
    [got] = outcome
    if isinstance(got, int):
        assert not added and b.stack == "binning(up0, powers=false)"
        b.deallocate(got, 5000)
    else:
        assert added and "add_bin" in str(got)
    assert freed == handed


def test_a_stack_add_bin_replaced_takes_no_buffer_upstream_or_device():
    # Another thread that read the resource's stack before add_bin retired
    # it (`_native` read, then the GIL let go): a buffer made on it, a
    # stack built over it, or a device given it, used memory the object no
    # longer saw (in_use, release, statistics) and kept the old stack
    # alive; add_bin had checked the stack unused and succeeded all the same.
    sim = _native.backend("sim")
    b = mr.BinningMemoryResource(mr.HostMemoryResource())
    old = b._native
    b.add_bin(512)
    with pytest.raises(memres.InvalidArgument, match="add_bin rebuilt"):
        sim.NativeBuffer(old, 100)
    with pytest.raises(memres.InvalidArgument, match="add_bin rebuilt"):
        sim.NativeResource.build("pool(up0)", [old], 0)
    with pytest.raises(memres.InvalidArgument, match="add_bin rebuilt"):
        sim.set_per_device_resource(0, old)
    assert not old.in_use() and not b._native.in_use()
    # The object itself is whole: its new stack serves all three.
    buf = memres.DeviceBuffer(size=100, mr=b)
    assert b._native.in_use()
    del buf
    over = mr.PoolMemoryResource(b, initial_pool_size=1 << 20)
    over.deallocate(over.allocate(100), 100)


def test_of_two_add_bin_at_once_neither_loses_the_others_bin():
    # The GIL is released while add_bin builds: another thread's add_bin
    # that ended meanwhile was replaced by a stack without its bin, though
    # it had returned (it retired the stack this add_bin read, and this one
    # retired its unused new stack in turn).
    b = mr.BinningMemoryResource(sim_pool())
    other = []

    def build_while_another_adds(*args, **kwargs):
        if not other:
            other.append(threading.Thread(target=b.add_bin, args=(2048,)))
            other[0].start()
            other[0].join()
        return mr.BinningMemoryResource._stack_of(*args, **kwargs)

    b._stack_of = build_while_another_adds
    with pytest.raises(memres.InvalidArgument, match="in use"):
        b.add_bin(1024)
    assert b.stack == "binning(up0, bin(2048), powers=false)"
    b.add_bin(1024)
    assert b.stack == "binning(up0, bin(1024), bin(2048), powers=false)"


def test_simulated_devices_have_addresses_of_their_own():
    # Each is a device of its own, as two GPUs are: a bin over one beside an
    # upstream of another hands out blocks of both at once (their addresses
    # coincided, and the second block was refused as live already).
    a, b = mr.SimulatedMemoryResource(1 << 30), mr.SimulatedMemoryResource(1 << 30)
    pa, pb = a.allocate(1000), b.allocate(1000)
    assert pa != pb
    bins = mr.BinningMemoryResource(a)
    bins.add_bin(4096, b)
    x, y = bins.allocate(100000), bins.allocate(1000)
    assert abs(x - y) >= 1 << 40
    for res, p, n in ((bins, x, 100000), (bins, y, 1000), (a, pa, 1000), (b, pb, 1000)):
        res.deallocate(p, n)
    # And so in one stack string.
    s = mr.StackMemoryResource("binning(sim(1GiB), bin(4096, sim(1GiB)))", backend="sim")
    s.deallocate(s.allocate(1000), 1000)


def test_simulated_address_spaces_have_addresses_of_their_own():
    # As simulated devices: each virtual pool over a simulated space
    # reserves addresses no other has, so one can be the bin of a binning
    # resource over another (every space started at one address, and the
    # pools' first blocks coincided).
    a, b = (mr.VirtualMemoryResource(simulated_capacity=1 << 30) for _ in range(2))
    pa, pb = a.allocate(1000), b.allocate(1000)
    assert abs(pa - pb) >= 1 << 40
    dev = mr.SimulatedMemoryResource(1 << 30)
    pd = dev.allocate(1000)
    assert min(abs(pd - pa), abs(pd - pb)) >= 1 << 40
    bins = mr.BinningMemoryResource(a)
    bins.add_bin(4096, b)
    x, y = bins.allocate(100000), bins.allocate(1000)
    assert abs(x - y) >= 1 << 40
    for res, p, n in ((bins, x, 100000), (bins, y, 1000), (a, pa, 1000), (b, pb, 1000), (dev, pd, 1000)):
        res.deallocate(p, n)
    # And so in one stack string.
    s = mr.StackMemoryResource("binning(vpool(sim(1GiB)), bin(4096, vpool(sim(1GiB))))", backend="sim")
    s.deallocate(s.allocate(1000), 1000)


def test_the_addresses_of_a_dropped_simulated_resource_are_used_again_only_then():
    # A process may make and drop simulated devices and spaces without end:
    # each takes the lowest number no living one has, so a new one never
    # meets the addresses of one still alive, however many came before.
    import gc
    for make in (lambda: mr.SimulatedMemoryResource(1 << 30),
                 lambda: mr.VirtualMemoryResource(simulated_capacity=1 << 30)):
        def first_block(res):
            p = res.allocate(1000)
            res.deallocate(p, 1000)
            return p
        gc.collect()  # so that a takes the lowest number none of the others' garbage holds
        a, b = make(), make()
        pa, pb = first_block(a), first_block(b)
        del a
        gc.collect()
        c = make()
        assert first_block(c) == pa  # a's number, free again
        d = make()
        assert abs(first_block(d) - pb) >= 1 << 40 and abs(first_block(d) - pa) >= 1 << 40
        del b, c, d


def test_a_bin_too_large_for_the_stack_is_refused_as_invalid_and_changes_nothing():
    # 2**64 - 1 rounded up to 256 was 2**64: a `ValueError` that the stack
    # could not parse the number, where a larger 2**64 - 256 is the typed refusal.
    binning = mr.BinningMemoryResource(mr.SimulatedMemoryResource(GiB))
    before = binning.stack
    for size in (2**64 - 1, 2**64 - 256):
        with pytest.raises(memres.InvalidArgument, match="too large"):
            binning.add_bin(size)
        assert binning.stack == before
    binning.deallocate(binning.allocate(1000), 1000)


@pytest.mark.parametrize("blocks", [2**32 - 1, 2**32, 2**33, 2**64 - 1])
def test_blocks_to_preallocate_too_large_is_refused_as_invalid_saying_so(blocks):
    # Past 32 bits it was a `ValueError` that the value was no "whole number".
    with pytest.raises(memres.InvalidArgument, match="too large"):
        mr.FixedSizeMemoryResource(mr.SimulatedMemoryResource(GiB), block_size=256, blocks_to_preallocate=blocks)


def test_add_bin_is_refused_while_the_resource_is_used_and_changes_nothing():
    from memres import InvalidArgument
    b = mr.BinningMemoryResource(mr.PoolMemoryResource(mr.HostMemoryResource()), 10, 12)
    before = b.stack
    refused = pytest.raises(InvalidArgument, match="add its bins before it is used")
    p = b.allocate(100)
    with refused:
        b.add_bin(1 << 20)
    b.deallocate(p, 100)
    over = mr.StatisticsResourceAdaptor(b)
    with refused:
        b.add_bin(1 << 20)
    del over
    gc.collect()
    buf = memres.DeviceBuffer(size=10, mr=b)
    with refused:
        b.add_bin(1 << 20)
    del buf
    gc.collect()
    mr.set_current_device_resource(b)
    with refused:
        b.add_bin(1 << 20)
    mr.set_current_device_resource(mr.HostMemoryResource())
    assert b.stack == before and b.bin_mrs == []
    with pytest.raises(InvalidArgument, match="at least 1 byte"):
        b.add_bin(0)
    with pytest.raises(TypeError, match="bin_resource must be a memres.mr resource"):
        b.add_bin(1 << 20, object())
    for bad in (-1, 1.5, "1MiB"):
        with pytest.raises((TypeError, OverflowError)):
            b.add_bin(bad)
    assert b.stack == before and b.bin_mrs == []
    # Unused again: bins are added.
    b.add_bin(1 << 20)
    assert b.stack == "binning(up0, bin(1048576), min_bin=1024, max_bin=4096)"
    b.deallocate(b.allocate(1 << 20), 1 << 20)


def test_logging_adaptor_writes_rmm_csv(tmp_path):
    log = mr.LoggingResourceAdaptor(sim_pool(), log_file_name=str(tmp_path / "log.csv"))
    path = tmp_path / "log.dev0.csv"  # the device's number before the extension, as RMM's
    assert log.get_file_name() == str(path)
    log.deallocate(log.allocate(1234), 1234)
    log.flush()
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and "allocate" in lines[1] and "1234" in lines[1], lines
    with pytest.raises(ValueError):
        mr.LoggingResourceAdaptor(sim_pool(), log_file_name=str(tmp_path / "a b.csv"))


def test_a_log_file_name_ending_in_a_newline_is_refused(tmp_path):
    # The name is checked whole: a final newline is whitespace too.
    with pytest.raises(ValueError, match="may not hold spaces"):
        mr.LoggingResourceAdaptor(sim_pool(), log_file_name=str(tmp_path / "x.csv") + "\n")
    assert list(tmp_path.iterdir()) == []


def test_a_log_file_name_of_a_directory_is_refused(tmp_path):
    # The device's file would lie beside the directory (`d.dev0`).
    (tmp_path / "d").mkdir()
    for name in (tmp_path / "d", str(tmp_path / "d") + "/", str(tmp_path / "new") + "/", str(tmp_path / "d") + "/."):
        with pytest.raises(ValueError, match="names a directory"):
            mr.LoggingResourceAdaptor(sim_pool(), log_file_name=name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_bad_stack_is_a_value_error_naming_the_position():
    with pytest.raises(ValueError, match="pool"):
        mr.StackMemoryResource("pool(sim, bogus=1)", backend="sim")


def test_current_and_per_device_resources():
    assert not memres.is_initialized()
    default = mr.get_current_device_resource()
    # RMM's default: the CUDA resource of the device; host memory where there is none.
    expected = mr.CudaMemoryResource if memres.cuda_available() else mr.HostMemoryResource
    assert isinstance(default, expected)
    pool = sim_pool()
    assert mr.set_current_device_resource(pool) is default
    assert mr.get_current_device_resource() is pool
    assert mr.get_current_device_resource_type() is mr.PoolMemoryResource
    other = mr.PoolMemoryResource(mr.SimulatedMemoryResource(GiB, device=1))
    mr.set_per_device_resource(1, other)
    assert mr.get_per_device_resource(1) is other
    with pytest.raises(ValueError, match="device 1"):
        mr.set_per_device_resource(0, other)
    with pytest.raises(TypeError):
        mr.set_current_device_resource("pool")
    # Beyond the devices the package serves.
    with pytest.raises(ValueError, match="memres: 64 is not a device id"):
        memres.reinitialize(devices=[64])
    assert mr.get_current_device_resource() is pool


def test_reinitialize_reads_rmms_keywords_as_rmm_does():
    # RMM ignores the pool sizes without pool_allocator, and takes
    # devices=None as device 0.
    memres.reinitialize(pool_allocator=False, initial_pool_size=MiB, maximum_pool_size=2 * MiB)
    assert type(mr._current[0]) is _default_type()
    mr._current.clear()
    memres.reinitialize(pool_allocator=True, initial_pool_size=MiB, devices=None)
    assert list(mr._current) == [0] and mr._current[0].pool_size() == MiB


def test_an_initial_pool_size_above_the_maximum_is_refused_in_rmms_words():
    # RMM's test_reinitialize_initial_pool_size_gt_max matches these words.
    before = mr.get_current_device_resource()
    with pytest.raises(RuntimeError, match="Initial pool size exceeds the maximum pool size"):
        memres.reinitialize(pool_allocator=True, initial_pool_size=1 << 11, maximum_pool_size=1 << 10)
    assert mr.get_current_device_resource() is before
    with pytest.raises(memres.InvalidArgument, match="Initial pool size exceeds the maximum pool size"):
        mr.PoolMemoryResource(mr.HostMemoryResource(), initial_pool_size="2 KiB", maximum_pool_size=1024)
    # Equal sizes are a pool that never grows.
    assert mr.PoolMemoryResource(mr.HostMemoryResource(), initial_pool_size=1024,
                                 maximum_pool_size="1 KiB").pool_size() == 1024


def test_rmms_error_class_is_there_for_code_that_names_it():
    # Neither RMM nor memres raises it; `except rmm.RMMError` must run.
    e = memres.RMMError(3, "said")
    assert isinstance(e, Exception) and not isinstance(e, memres.MemresError)
    assert (e.errcode, str(e)) == (3, "said")


def test_flush_logs_writes_the_logs_of_the_devices_resources_as_rmms(tmp_path):
    # RMM's private `_flush_logs`, which its logging tests call.
    path = tmp_path / "rmm_log.csv"
    memres.reinitialize(logging=True, log_file_name=str(path))
    res = mr.get_current_device_resource()
    res.deallocate(res.allocate(100), 100)
    mr._flush_logs()
    rows = (tmp_path / "rmm_log.dev0.csv").read_text().splitlines()
    assert [r.split(",")[4] for r in rows[1:]] == ["100", "100"], rows


def test_reinitialize_with_rmm_keywords_and_with_a_stack():
    memres.reinitialize(pool_allocator=True, initial_pool_size=2 * MiB)
    cur = mr.get_current_device_resource()
    assert isinstance(cur, mr.PoolMemoryResource) and cur.pool_size() == 2 * MiB
    memres.reinitialize(stack="stats(pool(sim(1GiB)))")
    assert mr.get_current_device_resource().stack == "stats(pool(sim(1GiB)))"
    before = mr.get_current_device_resource()
    with pytest.raises(ValueError):
        memres.reinitialize(stack="stats(pool(sim(1GiB))")
    assert mr.get_current_device_resource() is before


@pytest.mark.parametrize("keywords", [dict(pool_allocator=True), dict(managed_memory=True),
                                      dict(initial_pool_size=MiB), dict(maximum_pool_size=MiB)])
def test_reinitialize_refuses_a_stack_with_rmms_keywords_and_changes_nothing(keywords):
    memres.reinitialize(stack="stats(pool(sim(1GiB)))")
    before = mr.get_current_device_resource()
    with pytest.raises(ValueError, match="stack= or RMM's keywords, not both"):
        memres.reinitialize(stack="pool(sim(1GiB))", **keywords)
    assert mr.get_current_device_resource() is before


@pytest.mark.parametrize("device_leaf", ["cuda", "host"])
def test_reinitialize_takes_the_backend_from_the_stacks_resources_not_the_words_of_its_paths(tmp_path, device_leaf):
    # The backend was told by the words of the whole text: a log in
    # /tmp/.../host.csv put `cuda` on the simulated backend ("unknown
    # resource 'cuda'", a ValueError), and one in .../cuda.csv did not
    # matter only because `host` came first.
    other = {"cuda": "host", "host": "cuda"}[device_leaf]
    stack = f"log({device_leaf}, file={tmp_path / other}.csv)"
    if device_leaf == "cuda" and not memres.cuda_available():
        with pytest.raises(memres.MemresError) as raised:  # CUDA's own refusal
            memres.reinitialize(stack=stack)
        assert not isinstance(raised.value, ValueError), raised.value
    else:
        memres.reinitialize(stack=stack)
        res = mr.get_current_device_resource()
        assert res.stack == stack and res._backend == {"cuda": "cuda", "host": "sim"}[device_leaf]
        res.deallocate(res.allocate(100), 100)
    assert _native.sim.stack_names(stack) == ["log", device_leaf]
    # Keys' values are no resources, bare names included.
    assert _native.sim.stack_names("log(cuda, file=host)") == ["log", "cuda"]


def test_reinitialize_with_logging(tmp_path):
    path = tmp_path / "rmm_log.csv"
    memres.reinitialize(pool_allocator=True, logging=True, log_file_name=str(path))
    buf = memres.DeviceBuffer(size=100)
    del buf
    gc.collect()
    mr.get_current_device_resource().flush()
    assert os.path.getsize(tmp_path / "rmm_log.dev0.csv") > 0  # as RMM's test reads it


def test_reinitialize_again_with_logging_to_the_same_file_replaces_the_log(tmp_path):
    # RMM's clears every device's resource first, so a second call that
    # logs to the same file works; memres's lets the resource whose log
    # writes the file go first (two logs of one process never write one).
    path = tmp_path / "x.csv"
    memres.reinitialize(pool_allocator=True, logging=True, log_file_name=str(path))
    first = mr.get_current_device_resource()
    first.deallocate(first.allocate(100), 100)
    first.flush()
    del first
    memres.reinitialize(logging=True, log_file_name=str(path))
    second = mr.get_current_device_resource()
    assert isinstance(second, mr.LoggingResourceAdaptor)
    assert not isinstance(second.get_upstream(), mr.PoolMemoryResource)
    second.deallocate(second.allocate(300), 300)
    second.flush()
    rows = (tmp_path / "x.dev0.csv").read_text().splitlines()
    # Made anew by the second log, as RMM's: its header and its own rows.
    assert rows[0].startswith("Thread,Time") and [r.split(",")[4] for r in rows[1:]] == ["300", "300"], rows


@pytest.mark.parametrize("from_env", [False, True])
def test_reinitialize_logs_each_device_to_its_own_file_named_as_rmm(tmp_path, monkeypatch, from_env):
    path = tmp_path / "x.csv"
    # Host memory on both devices: the naming is the point, and a GPU
    # machine may have one device.
    if from_env:
        monkeypatch.setenv("MEMRES_LOG_FILE", str(path))
        memres.reinitialize(logging=True, devices=[0, 1], stack="host")
    else:
        memres.reinitialize(logging=True, devices=[0, 1], log_file_name=str(path), stack="host")
    for device, nbytes in [(0, 100), (1, 200)]:
        res = mr.get_per_device_resource(device)
        assert res.get_file_name() == str(tmp_path / f"x.dev{device}.csv")
        res.deallocate(res.allocate(nbytes), nbytes)
        res.flush()
    for device, nbytes in [(0, 100), (1, 200)]:
        lines = (tmp_path / f"x.dev{device}.csv").read_text().splitlines()
        assert len(lines) == 3 and all(f",{nbytes}," in line for line in lines[1:]), lines
    assert not path.exists()


def test_enable_and_disable_logging_over_each_devices_resource_as_rmm(tmp_path):
    pool = sim_pool()
    mr.set_current_device_resource(pool)
    assert memres.get_log_filenames() == {0: None}
    memres.enable_logging(log_file_name=tmp_path / "log.csv")
    memres.enable_logging(log_file_name=tmp_path / "other.csv")  # once is enough
    logged = mr.get_current_device_resource()
    assert isinstance(logged, mr.LoggingResourceAdaptor) and logged.upstream_mr is pool
    assert memres.get_log_filenames() == {0: str(tmp_path / "log.dev0.csv")}
    logged.deallocate(logged.allocate(1000), 1000)
    memres.disable_logging()
    assert mr.get_current_device_resource() is pool and memres.get_log_filenames() == {0: None}
    lines = (tmp_path / "log.dev0.csv").read_text().splitlines()
    assert [line.split(",")[2] for line in lines[1:]] == ["allocate", "free"]


def test_a_stack_string_that_logs_outermost_is_a_log_to_the_logging_functions(tmp_path, monkeypatch):
    # Only a LoggingResourceAdaptor was seen: such a stack's file was None
    # to get_log_filenames, and enable_logging put a second log over it.
    monkeypatch.chdir(tmp_path)  # a relative file= is taken from the working directory
    memres.reinitialize(stack="log(pool(host), file=own.csv)")
    stack = mr.get_current_device_resource()
    assert memres.get_log_filenames() == {0: str(tmp_path / "own.csv")}
    memres.enable_logging(log_file_name=tmp_path / "other.csv")
    memres.disable_logging()
    assert mr.get_current_device_resource() is stack, "no second log, and the stack's own stays"
    stack.deallocate(stack.allocate(1000), 1000)
    stack._native.flush()
    lines = (tmp_path / "own.csv").read_text().splitlines()
    assert [line.split(",")[2] for line in lines[1:]] == ["allocate", "free"]
    assert not (tmp_path / "other.dev0.csv").exists()
    mr.set_current_device_resource(mr.StackMemoryResource("stats(log(host, file=inner.csv))", backend="sim"))
    assert memres.get_log_filenames() == {0: None}, "a log under another layer is not outermost"


def test_reinitialize_with_a_device_named_twice_makes_it_once(tmp_path):
    # Each device named made its own log of one file: the second was
    # refused, as a file another log writes.
    memres.reinitialize(logging=True, devices=[0, 0], log_file_name=str(tmp_path / "x.csv"), stack="host")
    assert memres.get_log_filenames() == {0: str(tmp_path / "x.dev0.csv")}


@pytest.mark.parametrize("bad", [5, b"pool(host)", ["pool(host)"]])
def test_a_stack_that_is_no_str_is_a_type_error_naming_it(bad):
    # It reached the native side, whose TypeError named its own argument.
    with pytest.raises(TypeError, match=r"^memres: stack must be a str \(a stack string"):
        mr.StackMemoryResource(bad, backend="sim")
    with pytest.raises(TypeError, match=r"^memres: stack must be a str \(a stack string"):
        memres.reinitialize(stack=bad)
    with pytest.raises(TypeError, match=r"^memres: stack must be a str \(a stack string"):
        mr.StackMemoryResource(None, backend="sim")


def test_a_log_file_name_may_be_bytes_or_a_path_and_else_is_a_type_error(tmp_path):
    # Bytes, and what is no path, reached the native side's TypeError.
    log = mr.LoggingResourceAdaptor(sim_pool(), log_file_name=os.fsencode(tmp_path / "b.csv"))
    assert log.get_file_name() == str(tmp_path / "b.dev0.csv")
    log = mr.LoggingResourceAdaptor(sim_pool(), log_file_name=tmp_path / "p.csv")
    assert log.get_file_name() == str(tmp_path / "p.dev0.csv")
    with pytest.raises(TypeError, match=r"^memres: log_file_name must be a path \(str, bytes or os.PathLike\), not int"):
        mr.LoggingResourceAdaptor(sim_pool(), log_file_name=5)


@pytest.mark.parametrize("bad", [0, [], (), False])
def test_a_falsy_log_file_name_that_is_no_path_is_a_type_error_not_the_environments(tmp_path, monkeypatch, bad):
    # It was taken as not given: the log went to $MEMRES_LOG_FILE.
    monkeypatch.setenv("MEMRES_LOG_FILE", str(tmp_path / "env.csv"))
    with pytest.raises(TypeError, match=r"^memres: log_file_name must be a path"):
        mr.LoggingResourceAdaptor(sim_pool(), log_file_name=bad)
    assert not (tmp_path / "env.dev0.csv").exists()


@pytest.mark.parametrize("empty", ["", b""])
def test_an_empty_log_file_name_is_refused_even_with_the_environments(tmp_path, monkeypatch, empty):
    # As RMM's: the environment names the file only where no name is given.
    monkeypatch.setenv("MEMRES_LOG_FILE", str(tmp_path / "env.csv"))
    with pytest.raises(ValueError, match="needs log_file_name or MEMRES_LOG_FILE"):
        mr.LoggingResourceAdaptor(sim_pool(), log_file_name=empty)
    assert not (tmp_path / "env.dev0.csv").exists()


def test_enable_logging_that_cannot_log_one_device_changes_no_device(tmp_path):
    # Device 1's file is written by a live log already: its adaptor is
    # refused, after device 0's was made.
    held = mr.LoggingResourceAdaptor(mr.HostMemoryResource(device=1), log_file_name=tmp_path / "x.csv")
    plain = {d: mr.HostMemoryResource(device=d) for d in (0, 1)}
    for d, res in plain.items():
        mr.set_per_device_resource(d, res)
    with pytest.raises(ValueError, match="written by another log"):
        memres.enable_logging(log_file_name=tmp_path / "x.csv")
    assert {d: mr.get_per_device_resource(d) for d in (0, 1)} == plain
    assert memres.get_log_filenames() == {0: None, 1: None}
    assert held.get_file_name() == str(tmp_path / "x.dev1.csv")


def test_disable_logging_whose_flush_fails_on_one_device_changes_no_device(tmp_path):
    # Device 1's log cannot be written out: device 0's adaptor was taken
    # off already, and the call left one device logged and the other not.
    for d in (0, 1):
        mr.set_per_device_resource(d, mr.HostMemoryResource(device=d))
    memres.enable_logging(log_file_name=tmp_path / "x.csv")
    logged = {d: mr.get_per_device_resource(d) for d in (0, 1)}

    def fail():
        raise OSError("no space left on device")

    logged[1].flush = fail
    with pytest.raises(OSError, match="no space left"):
        memres.disable_logging()
    assert {d: mr.get_per_device_resource(d) for d in (0, 1)} == logged
    del logged[1].flush
    memres.disable_logging()
    assert memres.get_log_filenames() == {0: None, 1: None}


def test_enable_and_disable_logging_are_one_step_for_other_threads(tmp_path, monkeypatch):
    # Making a log and writing one out give the GIL up: another thread could
    # set the device's resource meanwhile, which the call then replaced with
    # a log over the old resource (or with the old log's upstream).
    free = []

    class Watched(mr.LoggingResourceAdaptor):
        def __init__(self, *args, **kwargs):
            free.append(registry_free_to_another_thread())
            super().__init__(*args, **kwargs)

        def flush(self):
            free.append(registry_free_to_another_thread())
            super().flush()

    monkeypatch.setattr(mr, "LoggingResourceAdaptor", Watched)
    mr.set_per_device_resource(0, mr.HostMemoryResource())
    memres.enable_logging(log_file_name=tmp_path / "x.csv")
    memres.disable_logging()
    assert free == [False, False]


@pytest.mark.skipif(memres.cuda_available(), reason="the driver reserves more address space than the limit")
def test_reinitialize_out_of_memory_lets_the_old_resources_go_first_as_rmms():
    # RMM's clears every device's resource before it makes the new ones, so
    # a pool may replace one of its own size where there is room for one;
    # memres's makes the new ones first (a failure changes nothing), and
    # only for want of memory lets the old ones go and tries again.
    code = textwrap.dedent("""
        import resource, memres
        def vm():
            for line in open("/proc/self/status"):
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
        memres.reinitialize(pool_allocator=True, initial_pool_size=512 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (vm() + (256 << 20),) * 2)
        memres.reinitialize(pool_allocator=True, initial_pool_size=512 << 20)
        print(memres.mr.get_current_device_resource().pool_size())
        try:
            memres.reinitialize(pool_allocator=True, initial_pool_size=1 << 30)
        except memres.OutOfMemory:
            print(type(memres.mr.get_current_device_resource()).__name__)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    # No room for the larger pool even alone: the device is left its default.
    assert run.stdout.split() == [str(512 << 20), "HostMemoryResource"], run.stdout


def test_reinitialize_runs_the_hooks_last_registered_first():
    ran = []
    first = memres.register_reinitialize_hook(ran.append, "first")
    memres.register_reinitialize_hook(lambda: ran.append("second"))
    try:
        memres.reinitialize()
        assert ran == ["second", "first"] and first == ran.append
        memres.unregister_reinitialize_hook(ran.append)
        memres.reinitialize()
        assert ran == ["second", "first", "second"]
    finally:
        memres._reinitialize_hooks.clear()


def test_a_hook_that_unregisters_another_leaves_the_call_running_each_once():
    # As RMM's: the call runs the hooks registered when it began. The list
    # was changed in place under the loop: C, C, B (A skipped, C twice).
    ran = []
    memres.register_reinitialize_hook(ran.append, "A")
    memres.register_reinitialize_hook(lambda: ran.append("B"))
    memres.register_reinitialize_hook(lambda: (ran.append("C"), memres.unregister_reinitialize_hook(ran.append)))
    try:
        memres.reinitialize()
        assert ran == ["C", "B", "A"]
        memres.reinitialize()
        assert ran == ["C", "B", "A", "C", "B"]
    finally:
        memres._reinitialize_hooks.clear()


def test_the_fresh_state_of_each_test_takes_away_a_hook_and_a_device_left_behind():
    # What the tests' fixture runs each test in: a hook and a device set
    # within are gone after it, and what was set before is back (a hook
    # left over ran in every later test's reinitialize).
    from memres import _device

    memres.register_reinitialize_hook(len, "before")
    with fresh_state():
        assert memres._reinitialize_hooks == []
        memres.register_reinitialize_hook(print)
        memres.set_device(1)
        assert getattr(_device._local, "device", 0) == 1
    assert memres._reinitialize_hooks == [(len, ("before",), {})]
    assert getattr(_device._local, "device", 0) == 0


@pytest.mark.parametrize("refused", [dict(stack="pool(host)", pool_allocator=True), dict(devices=-1),
                                     dict(stack="pool(host"), dict(stack=5)])
def test_reinitialize_refused_for_its_arguments_runs_no_hook(refused):
    # The hooks (which free what holds memory) ran before the arguments
    # were checked.
    ran = []
    memres.register_reinitialize_hook(ran.append, "ran")
    try:
        with pytest.raises((ValueError, TypeError)):
            memres.reinitialize(**refused)
        assert ran == []
        memres.reinitialize()
        assert ran == ["ran"]
    finally:
        memres._reinitialize_hooks.clear()


def test_the_device_set_is_the_calling_threads(monkeypatch):
    # One module-wide number: a thread's set_device moved every thread.
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    seen = []

    def other():
        seen.append(memres.current_device())
        memres.set_device(1)
        seen.append(memres.current_device())

    memres.set_device(0)
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [0, 1] and memres.current_device() == 0


@pytest.mark.parametrize("bad", [-1, True, "0", 1.0])
def test_a_device_that_is_no_device_number_is_a_value_error_naming_it(bad):
    for call in (lambda: mr.get_per_device_resource(bad), lambda: mr.set_per_device_resource(bad, sim_pool()),
                 lambda: memres.reinitialize(devices=bad), lambda: memres.reinitialize(devices=[0, bad])):
        with pytest.raises(ValueError, match="is not a device id"):
            call()
    assert mr.get_per_device_resource_type(0) is _default_type()


class _Index:
    """An integer of another type that says its value, as NumPy's do."""

    def __init__(self, n):
        self.n = n

    def __index__(self):
        return self.n


def test_a_device_number_of_another_integer_type_is_taken_as_rmm_takes_it():
    # As NumPy's `np.int64(0)` or `np.arange(1)`'s items: refused as no
    # device id, where RMM's `int device` arguments take them.
    memres.set_device(_Index(0))
    assert memres.current_device() == 0 and type(memres.current_device()) is int
    res = sim_pool()
    mr.set_per_device_resource(_Index(0), res)
    assert mr.get_per_device_resource(_Index(0)) is res
    memres.reinitialize(devices=[_Index(0)])
    assert mr.get_per_device_resource_type(_Index(0)) is _default_type()
    buf = memres.DeviceBuffer(size=4, mr=mr.HostMemoryResource())
    assert buf.prefetch(device=_Index(-1)) is False and buf.prefetch(device=_Index(0)) is False
    for bad in (_Index(-2), _Index(64)):
        with pytest.raises(ValueError, match="is not a device id"):
            mr.get_per_device_resource(bad)


@pytest.mark.parametrize("bad", [-1, 64, 2**32, 2**40, 2**70])
def test_a_device_out_of_range_is_a_value_error_at_every_entry_point(bad):
    # Only some were checked: the rest reached the native side, whose
    # 32-bit device numbers made an OverflowError, and `set_device(2**40)`
    # was taken, failing every later call.
    from memres import statistics
    buf = memres.DeviceBuffer(size=4, mr=mr.HostMemoryResource())
    calls = {
        "set_device": lambda: memres.set_device(bad),
        "get_per_device_resource": lambda: mr.get_per_device_resource(bad),
        "get_per_device_resource_type": lambda: mr.get_per_device_resource_type(bad),
        "set_per_device_resource": lambda: mr.set_per_device_resource(bad, sim_pool()),
        "reinitialize": lambda: memres.reinitialize(devices=[0, bad]),
        "HostMemoryResource": lambda: mr.HostMemoryResource(device=bad),
        "SimulatedMemoryResource": lambda: mr.SimulatedMemoryResource(MiB, device=bad),
        "VirtualMemoryResource": lambda: mr.VirtualMemoryResource(simulated_capacity=MiB, device=bad),
        "CallbackMemoryResource": lambda: mr.CallbackMemoryResource(lambda n: 1 << 40, lambda p, n: None,
                                                                    backend="sim", device=bad),
        "StackMemoryResource": lambda: mr.StackMemoryResource("pool(sim(1GiB))", backend="sim", device=bad),
        "CudaAsyncViewMemoryResource": lambda: mr.CudaAsyncViewMemoryResource(device=bad),
        "CudaAsyncManagedMemoryResource": lambda: mr.CudaAsyncManagedMemoryResource(device=bad),
        "available_device_memory": lambda: mr.available_device_memory(device=bad),
        "get_device_statistics": lambda: statistics.get_device_statistics(device=bad, backend="sim"),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="is not a device id") as raised:
            call()
        assert not isinstance(raised.value, OverflowError), name
    if bad != -1:  # the host's number, for a prefetch
        with pytest.raises(ValueError, match="device must be a device number or -1"):
            buf.prefetch(device=bad)
    assert memres.current_device() == 0
    assert mr.get_per_device_resource_type(0) is _default_type()


def test_available_device_memory_needs_cuda():
    if memres.cuda_available():
        pytest.skip("CUDA is here: test_gpu.py asks the device")
    with pytest.raises(memres.CudaUnavailable):
        mr.available_device_memory()


def test_an_unknown_backend_is_a_value_error():
    with pytest.raises(ValueError, match="backend 'xx'"):
        mr.StackMemoryResource("host", backend="xx")


def test_logs_are_complete_when_the_interpreter_exits(tmp_path):
    # The resource stays current until exit, never dropped: without the
    # flush at exit the log's buffer (and the trace's last lines) is lost.
    # Rows logged after memres's exit handler (here by a handler registered
    # before memres's, which runs after it; PyTorch's frees at
    # finalization) are written too.
    path = tmp_path / "exit.csv"
    code = (
        "import atexit\n"
        "atexit.register(lambda: res.deallocate(res.allocate(12345), 12345))\n"
        "import memres\n"
        f"memres.reinitialize(stack='log(stats(pool(sim(1GiB))), file={path})')\n"
        "res = memres.mr.get_current_device_resource()\n"
        "for i in range(2000):\n"
        "    res.deallocate(res.allocate(256 + i), 256 + i)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + 2 * 2000 + 2, len(lines)
    assert all(len(line.split(",")) == 6 for line in lines), [x for x in lines if len(x.split(",")) != 6][:3]
    assert lines[-3].split(",")[2] == "free" and lines[-3].split(",")[4] == str(256 + 1999)
    assert [line.split(",")[2:5:2] for line in lines[-2:]] == [["allocate", "12345"], ["free", "12345"]]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
def test_a_forked_childs_exit_writes_no_row_of_the_parent_again(tmp_path):
    # Rows buffered at the fork, and a thread logging all the while: the
    # child inherits an empty buffer and an unlocked log, so its normal exit
    # (which flushes every log) neither writes the parent's rows again nor
    # waits for a lock the parent's thread held.
    path = tmp_path / "fork.csv"
    code = (
        "import os, sys, threading\n"
        "import memres\n"
        f"memres.reinitialize(stack='log(stats(pool(sim(1GiB))), file={path})')\n"
        "res = memres.mr.get_current_device_resource()\n"
        "blocks = [(res.allocate(4096 * i), 4096 * i) for i in range(1, 4)]\n"
        "stop, rounds = threading.Event(), [0]\n"
        "def churn():\n"
        "    while not stop.is_set():\n"
        "        res.deallocate(res.allocate(256), 256)\n"
        "        rounds[0] += 1\n"
        "t = threading.Thread(target=churn)\n"
        "t.start()\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    sys.exit(0)\n"
        "_, status = os.waitpid(child, 0)\n"
        "stop.set()\n"
        "t.join()\n"
        "for p, n in blocks:\n"
        "    res.deallocate(p, n)\n"
        "print(status, rounds[0])\n"
    )
    out = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", code], check=True,
                         capture_output=True, text=True, timeout=120)
    status, rounds = map(int, out.stdout.split())
    assert status == 0
    lines = path.read_text().splitlines()
    assert lines.count(lines[0]) == 1, "the header was written again"
    assert len(lines) == 1 + 6 + 2 * rounds, "rows written twice (or lost)"
    live = {}
    for row in lines[1:]:
        action, pointer = row.split(",")[2:4]
        assert live.get(pointer) != action, f"{action} twice in a row at {pointer}"
        live[pointer] = action


def test_a_chain_of_resources_deeper_than_the_stack_limit_is_refused():
    # Each object over the one before: thousands of them overflowed the
    # thread's stack in the first allocation (the process was killed). A
    # chain is refused past 64 nested calls, as a stack string is, and one
    # of 64 allocates, on a thread with a small stack too.
    r = mr.SimulatedMemoryResource(GiB)
    made = 1
    while True:
        try:
            r2 = mr.PoolMemoryResource(r, initial_pool_size=MiB)
        except ValueError as e:
            assert "nested 65 deep, more than 64" in str(e), e
            break
        r, made = r2, made + 1
    assert made == 64
    result = []

    def use():
        p = r.allocate(1000)
        r.deallocate(p, 1000)
        result.append(p != 0)

    old = threading.stack_size(1 << 20)
    try:
        t = threading.Thread(target=use)
        t.start()
        t.join()
    finally:
        threading.stack_size(old)
    assert result == [True]


def test_reinitialize_beside_a_callback_that_asks_for_the_current_resource_does_not_hang():
    # reinitialize dropped the old current resource (a pool over a
    # callback's pool) holding the registry; the drop waited for the
    # callback's pool, whose lock a thread held in a callback that waited
    # for the registry: the two hung for ever.
    code = textwrap.dedent("""
        import threading, memres
        from memres import mr
        inside, go = threading.Event(), threading.Event()
        addresses = iter(range(1 << 40, 1 << 50, 1 << 36))
        def alloc(n):
            if n > 1 << 30:
                inside.set()
                go.wait()
                memres.get_current_device_resource()
            return next(addresses)
        q = mr.PoolMemoryResource(mr.CallbackMemoryResource(alloc, lambda p, n: None, backend="sim"),
                                  initial_pool_size=1 << 20)
        mr.set_current_device_resource(mr.PoolMemoryResource(q, initial_pool_size=4096))
        t = threading.Thread(target=lambda: q.allocate(1 << 31))
        t.start()
        inside.wait()
        threading.Timer(0.5, go.set).start()
        memres.reinitialize(stack="host")
        t.join()
        print("done")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "done\n", out


FORKS = textwrap.dedent("""
    import os, sys, threading, time
    import memres
    from memres import mr
    def forks(child, n=10):
        # Each child must end within 10 s; say how many hung.
        hung = 0
        for _ in range(n):
            pid = os.fork()
            if pid == 0:
                try:
                    child()
                    os._exit(0)
                except BaseException:
                    os._exit(1)
            for _ in range(1000):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    assert status == 0, status
                    break
                time.sleep(0.01)
            else:
                hung += 1
                os.kill(pid, 9)
                os.waitpid(pid, 0)
        print(hung)
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
def test_a_forked_child_gets_the_registry_another_thread_was_setting():
    # The registry's lock, held by a thread setting the current resource at
    # the fork, stayed held in the child: its first
    # get_current_device_resource() waited for ever (20 of 20 forks).
    code = FORKS + textwrap.dedent("""
        h = mr.HostMemoryResource()
        def spin():
            while True:
                memres.set_current_device_resource(h)
        threading.Thread(target=spin, daemon=True).start()
        time.sleep(0.1)
        forks(lambda: memres.get_current_device_resource())
    """)
    out = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", code],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and out.stdout == "0\n", out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
def test_a_forked_child_uses_host_memory_while_another_thread_was_copying():
    # The table of live host allocations (of every HostMemoryResource),
    # held by a thread copying at the fork, stayed held in the child: its
    # first host allocation, even from a resource of its own, waited for
    # ever (some forks in 20). A resource that the thread was in a call of
    # may stay locked in the child: the child makes its own.
    code = FORKS + textwrap.dedent("""
        h = mr.HostMemoryResource()
        data = bytes(8 << 20)
        def spin():
            while True:
                memres.DeviceBuffer.to_device(data, mr=h)
        threading.Thread(target=spin, daemon=True).start()
        time.sleep(0.1)
        def child():
            b = memres.DeviceBuffer.to_device(b"bytes", mr=mr.HostMemoryResource())
            assert b.tobytes() == b"bytes"
        forks(child, 20)
    """)
    out = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", code],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and out.stdout == "0\n", out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
def test_a_collection_set_off_while_the_fork_holds_the_host_table_waits_until_after_it():
    # A fork hook registered before memres runs after memres's, which holds
    # the table of live host allocations: its allocations set off the
    # collector, which freed a buffer of a cycle, whose free waited for
    # that table, held by its own thread: the fork never came.
    code = textwrap.dedent("""
        import gc, os
        os.register_at_fork(before=lambda: [[] for _ in range(400)])
        import memres
        from memres import mr
        h = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
        gc.collect()
        gc.set_threshold(200)  # not before the hooks, in the last one
        cycle = [memres.DeviceBuffer(size=4096, mr=h)]
        cycle.append(cycle)
        del cycle
        child = os.fork()
        if child == 0:
            os._exit(0)
        _, status = os.waitpid(child, 0)
        gc.collect()
        print(status, h.allocation_counts.current_bytes, gc.isenabled())
    """)
    out = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", code],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["0", "0", "True"], out


def test_torch_use_without_pytorch_fails_and_changes_nothing():
    import importlib.util
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("PyTorch is installed here: test_gpu.py covers use()")
    import memres.allocators.torch as mt
    assert not memres.is_initialized()
    with pytest.raises(ImportError):
        mt.use(stack="stats(pool(sim(1GiB)))")
    with pytest.raises(ImportError):
        mt.use()
    assert not memres.is_initialized()


@pytest.mark.parametrize("kwargs", [{"stack": "stats(pool(host))"}, {"pool_allocator": True}, {}])
def test_torch_use_refused_by_pytorch_changes_no_resource(monkeypatch, kwargs):
    # A stand-in for PyTorch whose allocator is initialized already.
    import types
    import memres.allocators.torch as mt

    def refuse(allocator):
        raise RuntimeError("Can't swap an already initialized allocator")

    cuda = types.SimpleNamespace(is_initialized=lambda: True, current_device=lambda: 0,
                                 memory=types.SimpleNamespace(change_current_allocator=refuse))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(mt, "memres_torch_allocator", object())
    monkeypatch.setattr(mt, "DEFAULT_STACK", "stats(pool(host))")  # no CUDA needed
    if kwargs:
        before = mr.HostMemoryResource()
        mr.set_current_device_resource(before)
    with pytest.raises(RuntimeError, match="already initialized"):
        mt.use(**kwargs)
    if kwargs:
        assert mr.get_current_device_resource() is before
    else:
        assert not memres.is_initialized()


def fake_torch(monkeypatch):
    """``memres.allocators.torch`` over a stand-in for PyTorch that takes
    the allocator (its CUDA not initialized: the current device is
    memres's)."""
    import types
    import memres.allocators.torch as mt
    cuda = types.SimpleNamespace(is_initialized=lambda: False, current_device=lambda: 0,
                                 memory=types.SimpleNamespace(change_current_allocator=lambda a: None))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    # Nor CuPy's device (imported by other tests where a GPU is), nor CUDA
    # (device 1 need not exist).
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(memres, "cuda_available", lambda: False)
    monkeypatch.setattr(mt, "memres_torch_allocator", object())
    monkeypatch.setattr(mt, "DEFAULT_STACK", "stats(pool(host))")  # no CUDA needed
    return mt


@pytest.mark.parametrize("kwargs, stack", [({"stack": "stats(pool(host, initial=1MiB))"},
                                            "stats(pool(host, initial=1MiB))"),
                                           ({"pool_allocator": True}, "pool(up0)"),
                                           ({}, "stats(pool(host))")])
def test_torch_use_sets_the_current_devices_resource_in_every_form(monkeypatch, kwargs, stack):
    # The one-process-per-rank setup: the rank's device made current first.
    mt = fake_torch(monkeypatch)
    memres.set_device(1)
    try:
        mt.use(**kwargs)
    finally:
        memres.set_device(0)
    assert {d: r.stack for d, r in mr._current.items()} == {1: stack}


def test_torch_use_sets_the_devices_it_is_given(monkeypatch):
    mt = fake_torch(monkeypatch)
    mt.use(stack="stats(pool(host, initial=1MiB))", devices=[2, 3])
    assert {d: r.stack for d, r in mr._current.items()} == {d: "stats(pool(host, initial=1MiB))" for d in (2, 3)}
    kept = mr.get_per_device_resource(3)
    mt.use(devices=[3, 4])  # a device with a resource keeps it; the other gets DEFAULT_STACK
    assert mr.get_per_device_resource(3) is kept
    assert mr.get_per_device_resource(4).stack == "stats(pool(host))"


def test_torch_steps_reads_the_current_resources_planned_layers():
    # No PyTorch needed: the counts are the resource's.
    import memres.allocators.torch as mt
    memres.reinitialize(stack="stats(planned(pool(sim(1GiB))))")
    res = mr.get_current_device_resource()
    for _ in range(4):
        res.step()
        res.deallocate(res.allocate(MiB), MiB)
    # The third step planned from the second; the fourth ended none yet.
    s = mt.steps()
    assert s == res.steps() and (s["steps"], s["plans"], s["followed"]) == (4, 1, 1), s
    assert mt.steps(device=res.device_id) == s
    memres.reinitialize(stack="stats(pool(sim(1GiB)))")
    assert set(mt.steps().values()) == {0}


def test_torch_step_after_steps_once_per_optimizer_step(monkeypatch):
    # No PyTorch needed: an optimizer is what registers a post-step hook.
    import memres.allocators.torch as mt
    steps = []
    monkeypatch.setattr(mt, "step", lambda device=None: steps.append(device))

    class Optimizer:
        def __init__(self):
            self.hooks = []

        def register_step_post_hook(self, hook):
            self.hooks.append(hook)
            return ("handle", len(self.hooks))

        def step(self):
            for hook in self.hooks:
                hook(self, (), {})

    opt = Optimizer()
    assert mt.step_after(opt, device=3) == ("handle", 1)
    assert steps == [], "nothing before the optimizer steps"
    opt.step()
    opt.step()
    assert steps == [3, 3]


def test_the_torch_default_stack_is_the_c_librarys():
    # One default for PyTorch, whether through the C library or use().
    src = os.path.join(os.path.dirname(__file__), "..", "..", "backends", "cuda", "capi", "src", "lib.rs")
    if not os.path.exists(src):
        pytest.skip("the repository's sources are not here")
    import re
    import memres.allocators.torch as mt
    found = re.search(r'pub const DEFAULT_STACK: &str = "([^"]+)";', open(src).read())
    assert found is not None and found.group(1) == mt.DEFAULT_STACK


def test_the_torch_training_stack_is_the_one_the_c_librarys_docs_recommend():
    # One recommended stack for a training loop, through the C library or
    # the package: the string docs/cuda.md sets MEMRES_STACK to.
    doc = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "cuda.md")
    if not os.path.exists(doc):
        pytest.skip("the repository's docs are not here")
    import re
    import memres.allocators.torch as mt
    text = open(doc).read()
    section = text[text.index("### Training loops: the recommended stack"):]
    found = re.search(r"MEMRES_STACK='([^']+)' python3 train.py", section)
    assert found is not None and found.group(1) == mt.TRAINING_STACK


def test_a_sim_capacity_past_its_space_is_a_value_error():
    # The simulated device's space holds 64 TiB: a larger capacity is refused, not taken.
    with pytest.raises(ValueError, match="64 TiB"):
        mr.StackMemoryResource("pool(sim(18446744073709551615))", backend="sim")
    with pytest.raises(ValueError, match="64 TiB"):
        mr.SimulatedMemoryResource(1 << 47)
    largest = mr.SimulatedMemoryResource(1 << 46)
    largest.deallocate(largest.allocate(1 << 40), 1 << 40)


def test_release_of_a_resource_reaches_the_pools_it_is_built_over():
    # What enable_statistics() makes: statistics over a pool object. Its
    # release() (so empty_cache()) saw only its own stack, which has no pool.
    pool = mr.PoolMemoryResource(mr.HostMemoryResource(), initial_pool_size=1 << 20)
    stats = mr.StatisticsResourceAdaptor(pool)
    p = stats.allocate(4096)
    assert stats.release() == 0  # the chunk holds a live block
    stats.deallocate(p, 4096)
    assert pool.pool_size() == 1 << 20
    assert stats.release() == 1 << 20
    assert pool.pool_size() == 0
    # Still serves, growing again.
    stats.deallocate(stats.allocate(4096), 4096)
    assert pool.pool_size() > 0


def test_a_prefetch_adaptor_needs_the_cuda_backend():
    with pytest.raises(ValueError, match="PrefetchResourceAdaptor needs an upstream of the CUDA backend"):
        mr.PrefetchResourceAdaptor(mr.HostMemoryResource())
    with pytest.raises(TypeError, match="upstream_mr must be a memres.mr resource"):
        mr.PrefetchResourceAdaptor(object())


def test_an_async_view_needs_cuda(monkeypatch):
    monkeypatch.setattr(memres, "cuda_available", lambda: False)
    with pytest.raises(memres.CudaUnavailable, match="CudaAsyncViewMemoryResource needs CUDA"):
        mr.CudaAsyncViewMemoryResource()


def test_an_async_managed_resource_needs_cuda_and_is_in_experimental_as_rmms(monkeypatch):
    from memres.mr.experimental import CudaAsyncManagedMemoryResource
    assert CudaAsyncManagedMemoryResource is mr.experimental.CudaAsyncManagedMemoryResource
    assert CudaAsyncManagedMemoryResource is mr.CudaAsyncManagedMemoryResource
    monkeypatch.setattr(memres, "cuda_available", lambda: False)
    with pytest.raises(memres.CudaUnavailable, match="CudaAsyncManagedMemoryResource needs CUDA"):
        CudaAsyncManagedMemoryResource()


def test_the_algorithms_and_adaptors_are_upstream_resource_adaptors_as_rmms():
    host = mr.HostMemoryResource()
    pool = mr.PoolMemoryResource(host)
    over = [(pool, host), (mr.ArenaMemoryResource(host), host), (mr.BinningMemoryResource(pool), pool),
            (mr.FixedSizeMemoryResource(host), host), (mr.StatisticsResourceAdaptor(pool), pool),
            (mr.TrackingResourceAdaptor(pool), pool), (mr.LimitingResourceAdaptor(pool, 1 << 20), pool),
            (mr.FailureCallbackResourceAdaptor(pool, lambda n: False), pool)]
    for res, upstream in over:
        assert isinstance(res, mr.UpstreamResourceAdaptor), res
        assert res.upstream_mr is upstream and res.get_upstream() is upstream, res
    for leaf in (host, mr.SimulatedMemoryResource(1 << 30), mr.StackMemoryResource("pool(host)", backend="sim")):
        assert not isinstance(leaf, mr.UpstreamResourceAdaptor)
        assert not hasattr(leaf, "upstream_mr")
    with pytest.raises(TypeError, match="abstract"):
        mr.UpstreamResourceAdaptor(pool)


def test_a_logs_file_name_is_taken_from_the_working_directory_when_made(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    logged = mr.LoggingResourceAdaptor(mr.HostMemoryResource(), log_file_name="rel.csv")
    assert logged.get_file_name() == str(tmp_path / "rel.dev0.csv")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    logged.deallocate(logged.allocate(1000), 1000)
    logged.flush()
    assert "allocate" in (tmp_path / "rel.dev0.csv").read_text()
    assert not (tmp_path / "elsewhere" / "rel.dev0.csv").exists()


def test_callback_functions_get_the_calls_stream_as_rmms_or_none_if_they_take_none():
    seen = []
    host = mr.HostMemoryResource()

    def allocate(nbytes, stream):
        seen.append(("allocate", nbytes, stream))
        return host.allocate(nbytes)

    def deallocate(ptr, nbytes, stream):
        seen.append(("deallocate", nbytes, stream))
        host.deallocate(ptr, nbytes)

    res = mr.CallbackMemoryResource(allocate, deallocate, backend="sim")
    res.deallocate(res.allocate(1000), 1000)
    assert [(what, n) for what, n, _ in seen] == [("allocate", 1000), ("deallocate", 1000)]
    assert all(isinstance(s, memres.Stream) and s.handle == 0 for _, _, s in seen)
    # memres's earlier form, without the stream; and a stream with a default.
    short = mr.CallbackMemoryResource(lambda n: host.allocate(n), lambda p, n: host.deallocate(p, n), backend="sim")
    short.deallocate(short.allocate(100), 100)
    streams = []
    optional = mr.CallbackMemoryResource(lambda n, stream=None: streams.append(stream) or host.allocate(n),
                                         lambda p, n, *rest: streams.append(rest) or host.deallocate(p, n),
                                         backend="sim")
    optional.deallocate(optional.allocate(100), 100)
    assert isinstance(streams[0], memres.Stream) and len(streams[1]) == 1
    assert isinstance(streams[1][0], memres.Stream)


def test_what_a_resource_refuses_is_both_rmms_runtime_error_and_a_value_error():
    # RMM's test_reinitialize_initial_pool_size_gt_max catches RuntimeError.
    with pytest.raises(RuntimeError, match="maximum"):
        memres.reinitialize(pool_allocator=True, initial_pool_size=2048, maximum_pool_size=1024)
    with pytest.raises(ValueError) as e:
        mr.PoolMemoryResource(mr.HostMemoryResource(), initial_pool_size=2048, maximum_pool_size=1024)
    assert isinstance(e.value, memres.InvalidArgument) and isinstance(e.value, memres.MemresError)
    pool = mr.PoolMemoryResource(mr.HostMemoryResource())
    p = pool.allocate(1000)
    with pytest.raises(memres.InvalidArgument):
        pool.deallocate(p, 999)
    pool.deallocate(p, 1000)


def test_ipc_and_fabric_handles_at_once_are_refused_before_cuda_is_asked():
    with pytest.raises(RuntimeError, match="enable_ipc and enable_fabric at once") as e:
        mr.CudaAsyncMemoryResource(enable_ipc=True, enable_fabric=True)
    assert isinstance(e.value, ValueError)


def test_a_stack_the_resource_refuses_says_the_byte_as_a_malformed_one_does():
    # A malformed stack says the byte it is at; so does one whose resource
    # refuses it, keeping the exception of the resource's error.
    with pytest.raises(ValueError, match=r"^memres: stack `pool\(sim, bogus=1\)`: at byte 10: unknown key"):
        mr.StackMemoryResource("pool(sim, bogus=1)", backend="sim")
    with pytest.raises(memres.InvalidArgument,
                       match=r"^memres: stack `align\(sim, alignment=3000\)`: at byte 21: "):
        mr.StackMemoryResource("align(sim, alignment=3000)", backend="sim")
    with pytest.raises(memres.OutOfMemory,
                       match=r"^memres: stack `stats\(pool\(sim\(1GiB\), initial=2GiB\)\)`: at byte 6: "):
        mr.StackMemoryResource("stats(pool(sim(1GiB), initial=2GiB))", backend="sim")
