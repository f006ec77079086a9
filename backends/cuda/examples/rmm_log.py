"""Checks a trace in RMM's log format (`Thread,Time,Action,Pointer,Size,Stream`),
plain or gzip, as the `log` adaptor writes it.

    from rmm_log import check_trace
    report = check_trace("torch.csv")      # or "torch.csv.gz"
    assert report["ok"], report["problems"]

Every free must match a live allocation of the same size at that pointer
(whatever its stream: a block may be freed on another stream), no pointer
may be allocated twice while live, and no allocation may have failed.

The trace is read as memres reads it (`memres_core::trace::read`),
whatever the locale's encoding: lines end at `\n` (a `\r` before it is
dropped), each is UTF-8, and a byte-order mark that starts one is dropped.
"""

import gzip

HEADER = "Thread,Time,Action,Pointer,Size,Stream"


def _open(path):
    """The trace's bytes, gunzipped where it is gzip (told by its first bytes)."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")


def _lines(f):
    """(number, text, problem) for each line of the trace's bytes: its text
    without the line break, or None and why (in memres's words) where it is
    not UTF-8."""
    for n, raw in enumerate(f, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield n, None, f"line {n}: not UTF-8 (byte {e.start + 1} of the line)"
            continue
        text = text[1:] if text.startswith("\ufeff") else text
        yield n, text.rstrip("\r\n"), None


def check_trace(path):
    """Replays the trace's records; returns a dict of figures and problems.

    `ok` is true when the trace has a header, at least one allocation and
    no problem. `rows` counts records, `peak_live_bytes` the most bytes
    live at once, `live_at_end` the allocations never freed, `streams` the
    distinct values of the Stream column. `problems` holds the first ten:
    a wrong header, a line that is no record (not UTF-8, the wrong number
    of fields, a pointer or size that is not a number) or does not replay. Every key
    is there whatever the problems.
    """
    live, rows, allocs, frees, bad, peak, now, streams = {}, 0, 0, 0, [], 0, 0, set()
    with _open(path) as f:
        lines = _lines(f)
        _, header, problem = next(lines, (1, "", None))
        header = header.strip() if header is not None else None
        if header != HEADER:
            bad.append(problem or f"line 1: header {header!r}, not {HEADER!r}")
        # Under a wrong header no record is read: it is not this format.
        for n, line, problem in lines if header == HEADER else []:
            if problem:
                bad.append(problem)
                continue
            fields = line.split(",")
            if len(fields) != 6:
                bad.append(f"line {n}: {len(fields)} fields")
                continue
            _thread, _time, action, ptr, size, stream = fields
            try:
                ptr, size = int(ptr, 16), int(size)
            except ValueError:
                bad.append(f"line {n}: pointer {ptr!r} or size {size!r} is not a number")
                continue
            rows += 1
            streams.add(stream)
            if action == "allocate":
                allocs += 1
                if ptr in live:
                    bad.append(f"line {n}: {ptr:#x} allocated while live")
                live[ptr] = size
                now += size
                peak = max(peak, now)
            elif action == "free":
                frees += 1
                if live.get(ptr) != size:
                    bad.append(f"line {n}: free of {ptr:#x} ({size} bytes) not matching a live allocation")
                else:
                    del live[ptr]
                    now -= size
            elif action == "allocate failure":
                bad.append(f"line {n}: allocation failure of {size} bytes")
            else:
                bad.append(f"line {n}: unknown action {action!r}")
    return {
        "ok": not bad and allocs > 0,
        "rows": rows,
        "allocations": allocs,
        "frees": frees,
        "live_at_end": len(live),
        "peak_live_bytes": peak,
        "streams": len(streams),
        "problems": bad[:10],
    }
