"""Checks a snapshot that `memres replay --snapshot` wrote, as PyTorch's
memory tools read it (`torch.cuda.memory._snapshot()`'s format).

    python3 benches/viz/check_snapshot.py FILE.pickle

Without PyTorch it checks what PyTorch's viewer and `_memory_viz` rely on:
the fields and their types, blocks that tile each segment from its address
(the viewer places blocks by adding sizes), `segsum`'s identity (allocated
plus free is the segment's size), that every `free_completed` comes right
after its block's `free_requested` (the viewer merges the pair into one
free; one alone it undoes into a block freed but waiting for a
`record_stream`), and that undoing the trace from the last event to the
first, as the viewer's "Allocator State History" does, finds every block in
a segment and every `segment_alloc`'s segment. With PyTorch installed it also runs
`torch.cuda._memory_viz`'s `segsum`, `trace` and `trace_plot` on it.
"""

import pickle
import sys

ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"}
SEGMENT_KEYS = {
    "device": int, "address": int, "total_size": int, "allocated_size": int, "active_size": int,
    "requested_size": int, "stream": int, "segment_type": str, "blocks": list, "frames": list,
}
BLOCK_KEYS = {"address": int, "size": int, "requested_size": int, "state": str, "frames": list}
EVENT_KEYS = {"action": str, "addr": int, "size": int, "stream": int, "frames": list}
# PyTorch's `oom` says the device's free bytes where the others say an address.
OOM_KEYS = {"action": str, "device_free": int, "size": int, "stream": int, "frames": list}


def _fields(what, d, keys):
    for k, t in keys.items():
        assert k in d, f"{what} lacks {k!r}: {d}"
        assert isinstance(d[k], t), f"{what}[{k!r}] is {type(d[k]).__name__}, not {t.__name__}"


def check(snapshot):
    """Asserts the structure; returns (reserved, allocated, requested, events)."""
    assert set(snapshot) >= {"segments", "device_traces"}, snapshot.keys()
    reserved = allocated = requested = 0
    for seg in snapshot["segments"]:
        _fields("segment", seg, SEGMENT_KEYS)
        assert seg["segment_type"] in ("small", "large")
        addr, used, asked = seg["address"], 0, 0
        for b in seg["blocks"]:
            _fields("block", b, BLOCK_KEYS)
            assert b["address"] == addr, f"blocks do not tile segment {seg['address']:#x}"
            assert b["state"] in ("active_allocated", "inactive"), b["state"]
            if b["state"] == "active_allocated":
                assert 0 < b["requested_size"] <= b["size"], b
                used += b["size"]
                asked += b["requested_size"]
            addr += b["size"]
        assert addr == seg["address"] + seg["total_size"], "blocks do not cover the segment"
        assert seg["allocated_size"] == used == seg["active_size"], seg
        assert seg["requested_size"] == asked, seg
        # segsum: free external + free internal + allocated == total
        free_external = sum(b["size"] for b in seg["blocks"] if b["state"] != "active_allocated")
        free_internal = used - asked
        assert free_external + free_internal + asked == seg["total_size"]
        reserved += seg["total_size"]
        allocated += used
        requested += asked
    traces = snapshot["device_traces"]
    # One trace per device, device 0's at least: the viewer opens it first.
    assert isinstance(traces, list) and len(traces) >= 1, "no device's trace"
    for d, trace in enumerate(traces):
        for i, e in enumerate(trace):
            assert e.get("action") in ACTIONS, e
            if e["action"] == "oom":
                _fields("oom event", e, OOM_KEYS)
                assert "addr" not in e, f"an oom with an address: {e}"
                continue
            _fields("event", e, EVENT_KEYS)
            # The first event may have lost its pair to the trace's length.
            if e["action"] == "free_completed" and i > 0:
                before = trace[i - 1]
                assert (before["action"], before.get("addr")) == ("free_requested", e["addr"]), \
                    f"device {d}, event {i}: a free_completed of {e['addr']:#x} without its free_requested before it"
        _undo(snapshot, d)
    return reserved, allocated, requested, [e for trace in traces for e in trace]


def _undo(snapshot, device):
    """The viewer's backward walk over `device`'s trace: after each event
    undone, every block lies in a live segment of the device, and each
    `segment_alloc` undone finds its segment.

    Only what an event changes is looked at (a block brought back, the
    blocks under a segment taken away or replaced), not every block against
    every segment after each event, which grew as events times blocks times
    segments."""
    own = [s for s in snapshot["segments"] if s["device"] == device]
    segments = {s["address"]: s["total_size"] for s in own}
    blocks = {b["address"]: b["size"] for s in own for b in s["blocks"] if b["state"] == "active_allocated"}

    def covered(addr):
        return any(s <= addr < s + n for s, n in segments.items())

    def in_range(addrs, start, size):
        return {a for a in addrs if start <= a < start + size}

    # The blocks in no live segment, kept exact as events are undone.
    orphans = {a for a in blocks if not covered(a)}
    for e in reversed(snapshot["device_traces"][device]):
        a, addr = e["action"], e.get("addr")
        if a == "alloc":
            blocks.pop(addr, None)
            orphans.discard(addr)
        elif a == "free_completed":
            blocks[addr] = e["size"]
            if covered(addr):
                orphans.discard(addr)
            else:
                orphans.add(addr)
        elif a == "segment_alloc":
            # The viewer removes the segment at that address, another where none is.
            size = segments.pop(addr, None)
            assert size is not None, f"segment_alloc of {addr:#x}: no segment"
            orphans |= {b for b in in_range(blocks, addr, size) if not covered(b)}
        elif a == "segment_free":
            old = segments.get(addr)
            segments[addr] = e["size"]
            # A segment put back over a live one at its address replaces it.
            if old is not None:
                orphans |= {b for b in in_range(blocks, addr, old) if not covered(b)}
            orphans -= in_range(orphans, addr, e["size"])
        assert not orphans, f"block {min(orphans):#x} in no segment"


def with_torch(snapshot):
    """PyTorch's own readers, where PyTorch is installed."""
    from torch.cuda import _memory_viz

    summary = _memory_viz.segsum(snapshot)
    listing = _memory_viz.trace(snapshot)
    page = _memory_viz.trace_plot(snapshot)
    assert "total_reserved" in summary and "entries" in listing and "snapshot.pickle" in page
    return summary


def main(argv):
    with open(argv[1], "rb") as f:
        snapshot = pickle.load(f)
    reserved, allocated, requested, events = check(snapshot)
    print(f"{len(snapshot['segments'])} segments, {reserved} bytes reserved, {allocated} allocated "
          f"({requested} requested), {len(events)} events: the structure PyTorch's tools read")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("PyTorch is not installed: torch.cuda._memory_viz not run")
        return 0
    print(with_torch(snapshot))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
