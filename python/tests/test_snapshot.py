"""memres.snapshot: a record of a running stack in the format of PyTorch's
memory snapshots, checked against the resource's own figures."""

import gc
import os
import pickle
import sys

import pytest

import memres
from memres import mr

# What PyTorch's viewer relies on, checked without PyTorch.
# benches/viz: in the repository, or beside the tests in the GPU bundle
# (python/gpu/bundle.sh).
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_here, "..", "..", "benches", "viz"), os.path.join(_here, "..", "benches", "viz")]
import check_snapshot  # noqa: E402


@pytest.fixture
def recording():
    memres.snapshot.record_memory_history()
    yield
    memres.snapshot.record_memory_history(enabled=False)


def live_blocks(snap):
    return [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]


def test_a_pool_and_its_buffers_as_segments_and_blocks(recording, tmp_path):
    pool = mr.PoolMemoryResource(mr.HostMemoryResource(), initial_pool_size=1 << 20)
    mr.set_current_device_resource(pool)
    bufs = [memres.DeviceBuffer(size=n) for n in (1000, 5000, 300_000)]
    ptr = pool.allocate(4096)
    snap = memres.snapshot.snapshot()
    # Segments: the pool's chunks, taken from its host-memory leaf.
    assert sum(s["total_size"] for s in snap["segments"]) == pool.pool_size()
    assert all(s["total_size"] == sum(b["size"] for b in s["blocks"]) for s in snap["segments"])
    # Blocks: what the program holds, at the addresses it got.
    got = sorted((b["address"], b["requested_size"]) for b in live_blocks(snap))
    assert got == sorted([(b.ptr, b.size) for b in bufs] + [(ptr, 4096)])
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert actions.count("segment_alloc") == len(snap["segments"]) and actions.count("alloc") == 4

    del bufs[0]
    pool.deallocate(ptr, 4096)
    after = memres.snapshot.snapshot()
    assert len(live_blocks(after)) == 2
    assert [e["action"] for e in after["device_traces"][0]].count("free_completed") == 2

    path = tmp_path / "memres.pickle"
    path.write_bytes(b"an older, longer file " * 1000)
    memres.snapshot.dump_snapshot(path)
    with open(path, "rb") as f:
        assert pickle.load(f) == after
    # Written whole, through a temporary file beside it that is gone.
    assert [p.name for p in tmp_path.iterdir()] == ["memres.pickle"]
    # Where it cannot be put (a directory of that name), an OSError, and the
    # directory as it was, with nothing left beside it.
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "inside").write_bytes(b"kept")
    with pytest.raises(OSError):
        memres.snapshot.dump_snapshot(tmp_path / "taken")
    assert (tmp_path / "taken" / "inside").read_bytes() == b"kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memres.pickle", "taken"]


def test_dump_snapshot_takes_a_bytes_path_and_else_names_what_it_takes(tmp_path):
    # Bytes, and what is no path, reached the native side's TypeError.
    memres.snapshot.dump_snapshot(os.fsencode(tmp_path / "s.pickle"), backend="sim")
    with open(tmp_path / "s.pickle", "rb") as f:
        assert pickle.load(f) == memres.snapshot.snapshot(backend="sim")
    with pytest.raises(TypeError, match=r"^memres: filename must be a path \(str, bytes or os.PathLike\), not int"):
        memres.snapshot.dump_snapshot(5, backend="sim")
    assert [p.name for p in tmp_path.iterdir()] == ["s.pickle"]


def test_an_upstream_shows_as_segments_not_as_blocks(recording):
    up = mr.HostMemoryResource()
    pool = mr.PoolMemoryResource(up)
    p = pool.allocate(1000)
    snap = memres.snapshot.snapshot(backend="sim")
    assert [b["requested_size"] for b in live_blocks(snap)] == [1000]
    assert len(snap["segments"]) == 1
    pool.deallocate(p, 1000)


def test_resources_built_before_the_record_are_not_seen():
    memres.snapshot.record_memory_history(enabled=False)
    before = mr.HostMemoryResource()
    memres.snapshot.record_memory_history()
    try:
        p = before.allocate(1000)
        assert memres.snapshot.snapshot(backend="sim")["segments"] == []
        before.deallocate(p, 1000)
    finally:
        memres.snapshot.record_memory_history(enabled=False)


def test_a_block_whose_leaf_is_not_tapped_is_a_segment_of_its_own_in_the_trace_too():
    # The upstream is built before the record, its pool after: the pool's
    # blocks lie in no segment. A freed one left its free in the trace,
    # which the viewer, stepping back, undid into a block in no segment
    # (its whole "Allocator State History" failed).
    memres.snapshot.record_memory_history(enabled=False)
    up = mr.HostMemoryResource()
    memres.snapshot.record_memory_history()
    try:
        pool = mr.PoolMemoryResource(up, initial_pool_size=1 << 20)
        p, q = pool.allocate(1000), pool.allocate(2000)
        pool.deallocate(p, 1000)
        snap = memres.snapshot.snapshot(backend="sim")
        check_snapshot.check(snap)
        assert [s["address"] for s in snap["segments"]] == [q]  # q's own
        actions = [e["action"] for e in snap["device_traces"][0] if e["addr"] == p]
        assert actions == ["segment_alloc", "alloc", "free_requested", "free_completed", "segment_free"]
        pool.deallocate(q, 2000)
        check_snapshot.check(memres.snapshot.snapshot(backend="sim"))
    finally:
        memres.snapshot.record_memory_history(enabled=False)


def test_a_simulated_device_dropped_with_a_block_live_ends_it_before_the_next_takes_its_addresses(recording):
    # A pool dropped with a block live keeps that chunk; its simulated
    # device goes with it, and the next device takes the same addresses.
    # Before, the trace told a second segment_alloc and alloc there with
    # no free between: PyTorch's viewer, stepping back, took out the wrong
    # segment, and kept the lost block live in its timeline.
    pool = mr.PoolMemoryResource(mr.SimulatedMemoryResource())
    lost = pool.allocate(5000)
    del pool
    gc.collect()
    pool = mr.PoolMemoryResource(mr.SimulatedMemoryResource())
    p = pool.allocate(7000)
    assert p == lost, "the test needs the next device at the same addresses"
    snap = memres.snapshot.snapshot(backend="sim")
    check_snapshot.check(snap)
    assert [b["requested_size"] for b in live_blocks(snap)] == [7000]
    actions = [(e["action"], e["size"]) for e in snap["device_traces"][0] if e["addr"] == p]
    assert actions[2:] == [
        ("free_requested", 5000),
        ("free_completed", 5000),
        ("segment_free", actions[0][1]),
        ("segment_alloc", actions[0][1]),
        ("alloc", 7000),
    ]
    pool.deallocate(p, 7000)


def test_a_stopped_record_records_nothing_more(recording):
    # The taps of the resources built during the record told it on after
    # it stopped: the last record changed under the reader.
    pool = mr.PoolMemoryResource(mr.HostMemoryResource(), initial_pool_size=1 << 20)
    p = pool.allocate(1000)
    memres.snapshot.record_memory_history(enabled=False)
    stopped = memres.snapshot.snapshot(backend="sim")
    q = pool.allocate(2000)
    pool.deallocate(p, 1000)
    pool.deallocate(q, 2000)
    pool.release()
    assert memres.snapshot.snapshot(backend="sim") == stopped
    assert [b["requested_size"] for b in live_blocks(stopped)] == [1000]


def test_a_dumped_snapshot_is_in_a_protocol_pytorchs_viewer_reads(recording, tmp_path):
    # It was re-pickled in Python's default protocol, 5 from Python 3.14 on,
    # which the viewer's unpickler (protocols 2 to 4) refuses.
    pool = mr.PoolMemoryResource(mr.HostMemoryResource(), initial_pool_size=1 << 20)
    p = pool.allocate(1000)
    path = tmp_path / "memres.pickle"
    memres.snapshot.dump_snapshot(path, backend="sim")
    written = path.read_bytes()
    assert written[:2] == b"\x80\x02"
    assert pickle.loads(written) == memres.snapshot.snapshot(backend="sim")
    pool.deallocate(p, 1000)


def test_enabled_takes_pytorchs_values():
    # As torch.cuda.memory._record_memory_history: "state" records the
    # segments and blocks but no events, None stops. Before, "state" kept
    # every event, as any true value did.
    try:
        memres.snapshot.record_memory_history("state")
        pool = mr.PoolMemoryResource(mr.HostMemoryResource(), initial_pool_size=1 << 20)
        p = pool.allocate(1000)
        snap = memres.snapshot.snapshot(backend="sim")
        assert [b["address"] for b in live_blocks(snap)] == [p]
        assert snap["device_traces"][0] == []
        memres.snapshot.record_memory_history(None)
        pool.deallocate(p, 1000)
        assert [b["address"] for b in live_blocks(memres.snapshot.snapshot(backend="sim"))] == [p]
        memres.snapshot.record_memory_history("all")
        pool = mr.PoolMemoryResource(mr.HostMemoryResource(), initial_pool_size=1 << 20)
        pool.deallocate(pool.allocate(1000), 1000)
        actions = [e["action"] for e in memres.snapshot.snapshot(backend="sim")["device_traces"][0]]
        assert actions == ["segment_alloc", "alloc", "free_requested", "free_completed"]
        with pytest.raises(ValueError, match="enabled"):
            memres.snapshot.record_memory_history("everything")
    finally:
        memres.snapshot.record_memory_history(enabled=False)


def test_bad_max_entries_is_a_value_error():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            memres.snapshot.record_memory_history(max_entries=bad)


def test_a_max_entries_past_64_bits_keeps_every_event(recording):
    # It reached the native side's 64-bit count, whose conversion raised
    # PyO3's OverflowError.
    memres.snapshot.record_memory_history(max_entries=1 << 64)
    pool = mr.PoolMemoryResource(mr.HostMemoryResource(), initial_pool_size=1 << 20)
    p = pool.allocate(1000)
    snap = memres.snapshot.snapshot(backend="sim")
    assert [b["requested_size"] for b in live_blocks(snap)] == [1000]
    pool.deallocate(p, 1000)


def test_a_cuda_pool_in_pytorchs_tools(gpu, recording):
    pool = mr.PoolMemoryResource(mr.CudaMemoryResource(), initial_pool_size=64 << 20)
    mr.set_current_device_resource(pool)
    bufs = [memres.DeviceBuffer(size=n) for n in (1 << 20, 3 << 20, 12345)]
    snap = memres.snapshot.snapshot()
    assert sum(s["total_size"] for s in snap["segments"]) == pool.pool_size()
    assert sorted(b["address"] for b in live_blocks(snap)) == sorted(b.ptr for b in bufs)
    try:
        from torch.cuda import _memory_viz
    except ImportError:
        return
    assert "snapshot.pickle" in _memory_viz.trace_plot(snap)
    assert "Allocator State History" in _memory_viz.segment_plot(snap)
    assert _memory_viz.segsum(snap)


def test_release_reaches_a_leaf_the_record_taps(gpu, recording):
    # While recording, each leaf is built inside a tap; its typed handle,
    # and with it the leaf's memory to give back, was lost: release() of a
    # `vmm` stack gave nothing back.
    held = lambda: memres.statistics.get_device_statistics(backend="cuda").current_bytes
    res = mr.VirtualMemoryResource(reserve=1 << 30)
    p = res.allocate(64 << 20)
    res.deallocate(p, 64 << 20)
    before = held()  # the granules stay mapped
    assert res.release() >= 64 << 20
    assert before - held() >= 64 << 20


def test_a_snapshot_makes_no_resource():
    # It took the backend of the current device's resource, making one
    # where there was none: a default (CudaMemoryResource with CUDA) that
    # was then the device's resource, so PyTorch's allocations there were
    # served by it, not by DEFAULT_STACK.
    memres.snapshot.snapshot()
    assert mr._existing(memres.current_device()) is None


def test_an_empty_record_has_device_0s_trace_for_the_viewer():
    # PyTorch's viewer opens the first device's trace; `device_traces: []`
    # it could not open (its device list empty, it read an undefined trace).
    memres.snapshot.record_memory_history()
    try:
        snap = memres.snapshot.snapshot(backend="sim")
        assert snap == {"segments": [], "device_traces": [[]]}
        check_snapshot.check(snap)
    finally:
        memres.snapshot.record_memory_history(enabled=False)


def test_an_oom_says_the_devices_free_bytes_and_no_address_as_pytorchs(recording):
    pool = mr.PoolMemoryResource(mr.SimulatedMemoryResource(64 << 20), initial_pool_size=1 << 20)
    with pytest.raises(memres.OutOfMemory):
        pool.allocate(1 << 30)
    snap = memres.snapshot.snapshot(backend="sim")
    check_snapshot.check(snap)
    oom = snap["device_traces"][0][-1]
    # The simulated device has no driver to ask.
    assert (oom["action"], oom["size"], oom["device_free"]) == ("oom", 1 << 30, 0)
    assert "addr" not in oom


def test_a_cuda_oom_says_the_free_bytes_the_driver_reports(gpu, recording):
    # Before, every oom said `device_free: 0`: PyTorch's viewer printed
    # "CUDA has 0.0B memory free" whatever the device had.
    limited = mr.LimitingResourceAdaptor(mr.CudaMemoryResource(), 1 << 20)
    with pytest.raises(memres.OutOfMemory):
        limited.allocate(2 << 20)
    oom = memres.snapshot.snapshot()["device_traces"][memres.current_device()][-1]
    free, total = memres.mr.available_device_memory()
    assert oom["action"] == "oom" and "addr" not in oom
    assert 0 < oom["device_free"] <= total and abs(oom["device_free"] - free) < total // 4, (oom, free)
