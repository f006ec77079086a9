"""memres.statistics, as RMM's rmm.statistics."""

import gc
import sys
import types

import pytest

import memres
from memres import mr, statistics
from conftest import registry_free_to_another_thread


@pytest.fixture
def pool():
    p = mr.PoolMemoryResource(mr.HostMemoryResource(), initial_pool_size=1 << 20)
    mr.set_current_device_resource(p)
    return p


def test_statistics_off_then_on(pool):
    assert statistics.get_statistics() is None
    statistics.enable_statistics()
    statistics.enable_statistics()  # once is enough
    assert isinstance(mr.get_current_device_resource(), mr.StatisticsResourceAdaptor)
    assert mr.get_current_device_resource().upstream_mr is pool
    a = memres.DeviceBuffer(size=1000)
    b = memres.DeviceBuffer(size=24)
    del a
    s = statistics.get_statistics()
    assert s == statistics.Statistics(current_bytes=24, current_count=1, peak_bytes=1024,
                                      peak_count=2, total_bytes=1024, total_count=2)
    del b


def test_statistics_are_put_on_in_one_step_for_other_threads(pool, monkeypatch):
    # Building the adaptor gives the GIL up: another thread could set the
    # device's resource meanwhile, which the adaptor over the old resource
    # then replaced.
    free = []

    class Watched(mr.StatisticsResourceAdaptor):
        def __init__(self, upstream_mr):
            free.append(registry_free_to_another_thread())
            super().__init__(upstream_mr)

    monkeypatch.setattr(mr, "StatisticsResourceAdaptor", Watched)
    statistics.enable_statistics()
    with statistics.statistics():
        pass
    mr.set_current_device_resource(pool)
    with statistics.statistics():
        pass
    assert free == [False, False] and mr.get_current_device_resource() is pool


def test_push_and_pop(pool):
    statistics.enable_statistics()
    a = memres.DeviceBuffer(size=100)
    statistics.push_statistics()
    b = memres.DeviceBuffer(size=50)
    assert statistics.get_statistics().total_bytes == 50
    popped = statistics.pop_statistics()
    assert popped.peak_bytes == 50 and popped.total_count == 1
    assert statistics.get_statistics().current_bytes == 150
    del a, b
    with pytest.raises(IndexError, match="cannot pop the last counter pair"):  # RMM's error and message
        statistics.pop_statistics()
    with pytest.raises(IndexError):
        mr.get_current_device_resource().pop_counters()
    assert statistics.get_statistics().current_bytes == 0  # and the base level counts on


def test_context_manager_counts_a_block_and_restores_the_resource(pool):
    with statistics.statistics():
        buf = memres.DeviceBuffer(size=300)
        assert statistics.get_statistics().current_bytes == 300
        del buf
    assert mr.get_current_device_resource() is pool


def test_a_resource_changed_inside_a_statistics_block_is_a_value_error_at_its_end(pool):
    other = mr.PoolMemoryResource(mr.HostMemoryResource())
    with pytest.raises(ValueError, match="changed inside a statistics"):
        with statistics.statistics():
            mr.set_current_device_resource(other)
    assert mr.get_current_device_resource() is other  # as RMM: the change stays


def test_a_statistics_block_undoes_its_level_where_the_resource_changed_inside(pool, monkeypatch):
    # At the ValueError it left the level it pushed on the adaptor for ever
    # (every later level off by one), and where it had put statistics on,
    # the adaptor stayed the resource of the device it began on.
    statistics.enable_statistics()
    counting = mr.get_current_device_resource()
    buf = memres.DeviceBuffer(size=64)
    with pytest.raises(ValueError, match="changed inside a statistics"):
        with statistics.statistics():
            memres.DeviceBuffer(size=32)
            mr.set_current_device_resource(mr.StatisticsResourceAdaptor(pool))
    with pytest.raises(IndexError):
        counting.pop_counters()  # back at its base level
    assert counting.allocation_counts.current_bytes == 64
    mr.set_current_device_resource(counting)
    # Another device made current inside the block: each device's resource
    # is left as it was, and nothing is made for the other. The device is
    # memres's own: PyTorch's or CuPy's, where another test imported them,
    # would be the current one (and device 1 need not exist).
    for framework in ("torch", "cupy"):
        monkeypatch.delitem(sys.modules, framework, raising=False)
    for counts in (True, False):
        mr.set_current_device_resource(counting if counts else pool)
        try:
            with pytest.raises(ValueError, match="changed inside a statistics"):
                with statistics.statistics():
                    memres.set_device(1)
        finally:
            memres.set_device(0)
        assert mr.get_current_device_resource() is (counting if counts else pool)
        assert mr._existing(1) is None
    with pytest.raises(IndexError):
        counting.pop_counters()
    del buf


def test_the_profiler_records_only_while_statistics_are_on_as_rmms(pool):
    records = statistics.ProfilerRecords()

    @statistics.profiler(records=records, name="named")
    def f():
        return memres.DeviceBuffer(size=64).size

    f()
    with statistics.profiler(records=records, name="block"):
        memres.DeviceBuffer(size=10)
    assert records.records == {}
    assert records.report() == "Memory Profiling\n================\n\nNo data, maybe profiling wasn't enabled?"
    with statistics.statistics():
        f()
    assert list(records.records) == ["named"]  # the name given, not the function's
    assert records.records["named"] == statistics.ProfilerRecords.MemoryRecord(1, 64, 64)
    # A function whose source cannot be read, named or not (unnamed, it
    # raised OSError, as RMM's does), and a builtin.
    namespace = {"memres": memres}
    exec("def g():\n    return memres.DeviceBuffer(size=8)", namespace)
    with statistics.statistics():
        statistics.profiler(records=records, name="g")(namespace["g"])()
        statistics.profiler(records=records)(namespace["g"])()
        statistics.profiler(records=records)(len)([])
    assert records.records["g"].memory_total == 8
    assert records.records["<string>:1(g)"].memory_total == 8
    assert records.records["<unknown>:0(len)"] == statistics.ProfilerRecords.MemoryRecord(1, 0, 0)


def test_profiler_is_a_function_that_makes_a_profiler_context_as_rmms(pool):
    records = statistics.ProfilerRecords()
    context = statistics.profiler(records=records, name="block")
    assert isinstance(context, statistics.ProfilerContext)
    statistics.enable_statistics()
    with statistics.ProfilerContext(records, "block"):
        memres.DeviceBuffer(size=32)
    assert records.records["block"].memory_total == 32
    with pytest.raises(TypeError):
        statistics.profiler(records, "block")  # keywords only, as RMM's


def test_profiler_report(pool):
    statistics.enable_statistics()
    records = statistics.ProfilerRecords()

    @statistics.profiler(records=records)
    def f():
        return memres.DeviceBuffer(size=4096).size

    f()
    f()
    with statistics.profiler(records=records, name="block"):
        memres.DeviceBuffer(size=10)
    recs = records.records
    name = statistics._get_descriptive_name_of_object(f)
    assert name.endswith("test_statistics.py:" + name.split(":")[-1]) and name.endswith("(test_profiler_report.<locals>.f)")
    assert recs[name].num_calls == 2 and recs[name].memory_total == 8192
    assert recs[name].memory_peak == 4096
    assert recs["block"].memory_total == 10
    assert "block" in records.report() and "ncalls" in records.report()


def test_the_report_is_laid_out_as_rmms():
    # RMM's own: its legend and order named, thousands separated by commas,
    # no final newline (memres printed none of the first three, and ended
    # with a newline).
    records = statistics.ProfilerRecords()
    records.add("a.py:1(f)", types.SimpleNamespace(total_bytes=2_500_000, peak_bytes=1_234_567))
    records.add("a.py:1(f)", types.SimpleNamespace(total_bytes=10, peak_bytes=10))
    records.add("block", types.SimpleNamespace(total_bytes=20, peak_bytes=20))
    assert records.report(ordered_by="num_calls") == (
        "Memory Profiling\n"
        "================\n"
        "\n"
        "Legends:\n"
        "  ncalls       - number of times the function or code block was called\n"
        "  memory_peak  - peak memory allocated in function or code block (in bytes)\n"
        "  memory_total - total memory allocated in function or code block (in bytes)\n"
        "\n"
        "Ordered by: num_calls\n"
        "\n"
        "ncalls     memory_peak    memory_total  filename:lineno(function)\n"
        "     2       1,234,567       2,500,010  a.py:1(f)\n"
        "     1              20              20  block"
    )


def test_a_report_ordered_by_no_figure_is_a_value_error():
    # It was getattr()'s AttributeError on a record, and only where there
    # were records: without any, the bad name passed unnoticed.
    records = statistics.ProfilerRecords()
    for filled in (False, True):
        with pytest.raises(ValueError, match="ordered_by must be one of"):
            records.report(ordered_by="memory")
        records.add("f", statistics.Statistics(total_bytes=8, peak_bytes=8))
    assert records.report(ordered_by="num_calls").splitlines()[-1].split()[:3] == ["2", "8", "16"]


def test_bytes_held_from_the_device():
    # The figures are the whole simulated device's: garbage of earlier tests
    # (pools in cycles) is collected first, and not in the middle.
    gc.collect()
    gc.disable()
    try:
        before = statistics.get_device_statistics(backend="sim")
        p = mr.PoolMemoryResource(mr.SimulatedMemoryResource(1 << 30), initial_pool_size=3 << 20)
        after = statistics.get_device_statistics(backend="sim")
        assert after.current_bytes - before.current_bytes == 3 << 20
        assert after.total_bytes - before.total_bytes == 3 << 20
        del p
        # A dropped pool gives its chunks back (the core pool does, on drop).
        assert statistics.get_device_statistics(backend="sim").current_bytes == before.current_bytes
        # No driver pool under the simulated device.
        assert (after.reserved_bytes, after.peak_reserved_bytes) == (0, 0)
    finally:
        gc.enable()


def test_a_stack_with_stats_outermost_counts():
    memres.reinitialize(stack="stats(pool(host))")
    buf = memres.DeviceBuffer(size=77)
    assert statistics.get_statistics().current_bytes == 77
    statistics.enable_statistics()  # counts already: not wrapped again
    assert isinstance(mr.get_current_device_resource(), mr.StackMemoryResource)
    del buf


def test_a_stats_layer_under_adaptors_that_pass_calls_on_counts_the_stacks_calls():
    # Above it only adaptors that pass every call on unchanged: it sees the
    # program's blocks, so it is the stack's statistics.
    memres.reinitialize(stack="track(stats(pool(host, initial=1MiB)))")
    buf = memres.DeviceBuffer(size=10)
    stats = memres.statistics.get_statistics()
    assert (stats.current_bytes, stats.current_count) == (10, 1), stats
    del buf


def test_a_stats_layer_under_the_root_does_not_count_the_stacks_calls():
    # The stats under the pool counts the pool's chunk, not the program's
    # blocks: enable_statistics puts a StatisticsResourceAdaptor on top.
    memres.reinitialize(stack="pool(stats(host), initial=1MiB)")
    assert memres.statistics.get_statistics() is None
    memres.statistics.enable_statistics()
    assert isinstance(mr.get_current_device_resource(), mr.StatisticsResourceAdaptor)
    buf = memres.DeviceBuffer(size=10)
    stats = memres.statistics.get_statistics()
    assert (stats.current_bytes, stats.current_count) == (10, 1), stats
    del buf


def test_the_profiler_pops_the_level_it_pushed_where_statistics_changed_inside(pool):
    # It popped the current resource's newest level at its end: statistics
    # put on inside the block (a profiled main() that enables them) had no
    # level to pop (IndexError), and a resource replaced inside lost its
    # base level while the old one kept the block's for ever.
    records = statistics.ProfilerRecords()

    @statistics.profiler(records=records, name="main")
    def main():
        statistics.enable_statistics()
        return memres.DeviceBuffer(size=64)

    buf = main()
    assert records.records == {}  # off when it began: nothing recorded, as RMM's
    assert statistics.get_statistics().current_bytes == 64
    counting = mr.get_current_device_resource()
    with statistics.profiler(records=records, name="block"):
        memres.DeviceBuffer(size=32)
        mr.set_current_device_resource(mr.StatisticsResourceAdaptor(pool))
    assert records.records["block"] == statistics.ProfilerRecords.MemoryRecord(1, 32, 32)
    # Each adaptor is back at its base level.
    for res in (counting, mr.get_current_device_resource()):
        with pytest.raises(IndexError):
            res.pop_counters()
    assert counting.allocation_counts.current_bytes == 64
    del buf


def test_device_statistics_read_the_devices_backend_and_make_no_resource():
    # It took the backend of the current device's resource, making one
    # (CudaMemoryResource with CUDA) where there was none: PyTorch's
    # allocations there were then served by it, not by DEFAULT_STACK.
    # Device 3's resource simulated, device 0's default CUDA's where CUDA is.
    sim = mr.SimulatedMemoryResource(1 << 30, device=3)
    mr.set_per_device_resource(3, sim)
    before = statistics.get_device_statistics(3).current_bytes
    p = sim.allocate(1 << 20)
    assert statistics.get_device_statistics(3).current_bytes == before + (1 << 20)
    sim.deallocate(p, 1 << 20)
    statistics.get_device_statistics(0)
    assert mr._existing(0) is None
