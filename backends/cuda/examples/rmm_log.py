"""Checks a trace in RMM's log format (`Thread,Time,Action,Pointer,Size,Stream`),
plain or gzip, as the `log` adaptor writes it.

    from rmm_log import check_trace
    report = check_trace("torch.csv")      # or "torch.csv.gz"
    assert report["ok"], report["problems"]

Every free must match a live allocation of the same size at that pointer
(whatever its stream: a block may be freed on another stream), no pointer
may be allocated twice while live (but null for zero bytes: the empty
block, which any number of allocations hold at once, as memres reads
them), and no allocation may have failed.

The trace is read as memres reads it (`memres_core::trace::read`),
whatever the locale's encoding: lines end at `\n` (a `\r` before it is
dropped), each is UTF-8, and a byte-order mark that starts one is dropped;
blank lines and headers are skipped wherever they are, and none is
required (memres reads traces that `cat` joined, and rows under no
header), but a header of other columns or another order is a problem;
each row is parsed as
`memres_core::trace::Record::parse` parses it, a line it refuses a problem
in its words: its fields trimmed of white space, the pointer ASCII hex
digits after an optional `0x` (or `(nil)`), the size ASCII decimal digits,
each at most 64 bits (no sign, no `_`, no other script's digits, which
Python's `int` takes). What memres's workload reader
(`memres_bench::workload::parse_trace`) refuses is a problem in its words
too: an allocation above any request (2^62 bytes), the bytes live at once
past 2^64 - 1, more than 65535 distinct streams or 2^32 - 1 allocations.
"""

import gzip
import itertools
import zlib

HEADER = "Thread,Time,Action,Pointer,Size,Stream"

# What Rust's `str::trim` takes off (`char::is_whitespace`, Unicode's
# White_Space); Python's `str.strip()` takes \x1c-\x1f too.
WHITE_SPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
               "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
# The longest line memres reads (`memres_core::trace::MAX_LINE`).
MAX_LINE = 4096
HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
DIGITS = frozenset("0123456789")
ACTIONS = ("allocate", "free", "allocate failure")
# The most memres's workload reader takes; past them it refuses the trace.
MAX_SIZE = 1 << 62  # `Request::MAX_SIZE`
MAX_LIVE_BYTES = (1 << 64) - 1  # a figure of a workload: a u64
MAX_STREAMS = 65535  # numbered by a u16 below u16::MAX
MAX_ALLOCATIONS = (1 << 32) - 1  # ids: a u32 below u32::MAX


def _number(text, digits, base, what):
    """`text` as a number of 64 bits made of `digits` only; ValueError in
    memres's words (`what`: the field and what a number of it is)."""
    if not text or not set(text) <= digits:
        raise ValueError(f"{what[0]} `{what[1]}` is not a {what[2]}")
    value = int(text, base)
    if value >= 1 << 64:
        above = "0xffffffffffffffff" if base == 16 else str((1 << 64) - 1)
        raise ValueError(f"{what[0]} `{what[1]}` is past 64 bits (above {above})")
    return value


def parse_record(line):
    """(action, pointer, size, stream) of a row, as
    `memres_core::trace::Record::parse` reads it; ValueError with its words
    where it refuses the row."""
    fields = [f.strip(WHITE_SPACE) for f in line.split(",")]
    if len(fields) != 6:
        raise ValueError(f"expected 6 fields, found {len(fields)}")
    thread, time, action, pointer, size, stream = fields
    for name, text in (("Thread", thread), ("Time", time), ("Stream", stream)):
        if not text:
            raise ValueError(f"empty {name} field")
    if action not in ACTIONS:
        raise ValueError(f"unknown action `{action}`")
    if pointer == "(nil)":
        ptr = 0
    else:
        digits = pointer[2:] if pointer[:2] in ("0x", "0X") else pointer
        ptr = _number(digits, HEX_DIGITS, 16, ("pointer", pointer, "hex number"))
    # A failure allocated nothing: every writer logs it with the null pointer.
    if action == "allocate failure" and ptr != 0:
        raise ValueError(f"an allocate failure with pointer `{pointer}` (a failure's is null)")
    value = _number(size, DIGITS, 10, ("size", size, "number"))
    return action, ptr, value, stream


def _past_memres_limits(action, size, stream, live_bytes, allocations, streams):
    """Why memres's workload reader refuses the row (in its words, in its
    order), or None. `stream`: the row's where memres numbers it (an
    allocation's, a free's of a live pointer), else None; `streams`: those
    it has numbered."""
    if action == "allocate":
        if allocations == MAX_ALLOCATIONS:
            return "more than 2^32 - 1 allocations"
        if size > MAX_SIZE:
            return f"a size of {size} bytes, above any request (2^62 bytes)"
        if live_bytes + size > MAX_LIVE_BYTES:
            return f"{live_bytes + size} bytes live at once, past the most a workload counts (2^64 - 1)"
    if stream is not None and stream not in streams and len(streams) == MAX_STREAMS:
        return "more than 65535 distinct streams"
    return None


def _skipped(line):
    """Whether memres skips the line (`memres_core::trace::is_skipped`):
    blank, or the header (its fields trimmed, as a row's are)."""
    line = line.strip(WHITE_SPACE)
    return not line or [f.strip(WHITE_SPACE) for f in line.split(",")] == HEADER.split(",")


def _other_header(line):
    """Whether memres refuses the line as a header of other columns, or of
    these in another order: its first field is `Thread`."""
    return line.split(",")[0].strip(WHITE_SPACE) == "Thread"


def _open(path):
    """The trace's bytes, gunzipped where it is gzip (told by its first bytes)."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")


def _lines(f):
    """(number, text, problem) for each line of the trace's bytes: its text
    without the line break (`\n` or `\r\n`), or None and why (in memres's
    words) where it is longer than memres reads or not UTF-8. A longer line
    is the last: as memres, nothing past its first MAX_LINE + 2 bytes is
    read (a file with no line break, a gzip of zeros, would be read into
    memory whole). So is a gzip cut short or corrupt, where memres's
    reading ends with the decoder's error."""
    for n in itertools.count(1):
        # One byte past the longest line and its longest break (`\r\n`)
        # tells a longer one.
        try:
            raw = f.readline(MAX_LINE + 2)
        except (EOFError, OSError, zlib.error) as e:
            yield n, None, f"line {n}: the gzip data is cut short or corrupt ({e})"
            return
        if not raw:
            return
        if raw.endswith(b"\n"):
            raw = raw[:-1]
            raw = raw[:-1] if raw.endswith(b"\r") else raw
        if len(raw) > MAX_LINE:
            yield n, None, f"line {n}: longer than {MAX_LINE} bytes"
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield n, None, f"line {n}: not UTF-8 (byte {e.start + 1} of the line)"
            continue
        yield n, text[1:] if text.startswith("\ufeff") else text, None


def check_trace(path):
    """Replays the trace's records; returns a dict of figures and problems.

    `ok` is true when the trace has at least one allocation and no
    problem. `rows` counts records, `peak_live_bytes` the most bytes live
    at once, `live_at_end` the allocations never freed, `streams` the
    distinct values of the Stream column. `problems` holds the first ten:
    a line that is no record (as memres refuses it: not UTF-8, longer than
    it reads, the wrong number of fields, an unknown action, a pointer or
    size that is not a number, a failure whose pointer is not null;
    `parse_record`), a gzip cut short or corrupt
    (that and a line longer than memres reads end the reading, as they end
    memres's), or a row past what memres's workload reader takes (a size above 2^62, the bytes live past 2^64 - 1, more
    than 65535 streams or 2^32 - 1 allocations: such a row is left out),
    or does not replay. Every key is there whatever the problems.
    """
    live, rows, allocs, frees, bad, peak, now, streams = {}, 0, 0, 0, [], 0, 0, set()
    # The live empty blocks (zero bytes at the null pointer: RMM's answer to
    # a zero-byte request), which any number of allocations hold at once, as
    # memres's workload reader counts them: kept out of `live`.
    empty = 0
    # The streams memres numbers: those of allocations and of frees of a
    # live block (a stray free's is none).
    numbered = set()
    with _open(path) as f:
        for n, line, problem in _lines(f):
            if problem:
                bad.append(problem)
                continue
            if _skipped(line):
                continue
            if _other_header(line):
                bad.append(f"line {n}: a header other than `{HEADER}`")
                continue
            try:
                action, ptr, size, stream = parse_record(line)
            except ValueError as e:
                bad.append(f"line {n}: {e}")
                continue
            empty_block = ptr == 0 and size == 0
            numbers = action == "allocate" or (action == "free" and (ptr in live or (empty_block and empty > 0)))
            past = _past_memres_limits(action, size, stream if numbers else None, now, allocs, numbered)
            if past:
                bad.append(f"line {n}: {past}")
                continue
            if numbers:
                numbered.add(stream)
            rows += 1
            streams.add(stream)
            if action == "allocate":
                allocs += 1
                if empty_block:
                    empty += 1
                else:
                    if ptr in live:
                        bad.append(f"line {n}: {ptr:#x} allocated while live")
                    live[ptr] = size
                    now += size
                peak = max(peak, now)
            elif action == "free":
                frees += 1
                if empty_block and empty > 0:
                    empty -= 1
                elif live.get(ptr) != size:
                    bad.append(f"line {n}: free of {ptr:#x} ({size} bytes) not matching a live allocation")
                else:
                    del live[ptr]
                    now -= size
            else:
                bad.append(f"line {n}: allocation failure of {size} bytes")
    return {
        "ok": not bad and allocs > 0,
        "rows": rows,
        "allocations": allocs,
        "frees": frees,
        "live_at_end": len(live) + empty,
        "peak_live_bytes": peak,
        "streams": len(streams),
        "problems": bad[:10],
    }
