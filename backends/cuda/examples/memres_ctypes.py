"""ctypes bindings of libmemres.so (the C functions of include/memres.h).

Used by the examples beside this file:

    from memres_ctypes import Memres
    lib = Memres("path/to/libmemres.so")
    lib.configure("stats(pool(async, initial=1GiB))")   # before the first allocation
    ...
    print(lib.stats(0))

PyTorch's CUDAPluggableAllocator opens the library with dlopen; ctypes opens
the same file, and the dynamic loader hands both the same copy, so the
figures read here are those of the allocator PyTorch uses.
"""

import ctypes
import json
import os

STATS_FIELDS = (
    "bytes_current",
    "bytes_peak",
    "bytes_total",
    "count_current",
    "count_peak",
    "count_total",
    "upstream_current",
    "upstream_peak",
    "upstream_total",
    "reserved_current",
    "reserved_peak",
    "live_blocks",
    "has_stats",
)


class Stats(ctypes.Structure):
    """memres_stats_t."""

    _fields_ = [(name, ctypes.c_int64) for name in STATS_FIELDS]

    def as_dict(self):
        return {name: getattr(self, name) for name in STATS_FIELDS}


STEPS_FIELDS = ("steps", "followed", "plans", "planned_allocations", "region", "carry_region")


class Steps(ctypes.Structure):
    """memres_steps_t."""

    _fields_ = [(name, ctypes.c_int64) for name in STEPS_FIELDS]

    def as_dict(self):
        return {name: getattr(self, name) for name in STEPS_FIELDS}


class MemresError(RuntimeError):
    pass


class Memres:
    """The C functions of libmemres.so, with errors raised as MemresError."""

    def __init__(self, path):
        self.path = os.path.abspath(path)
        lib = ctypes.CDLL(self.path)
        lib.memres_alloc.restype = ctypes.c_void_p
        lib.memres_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        lib.memres_free.restype = None
        lib.memres_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        lib.memres_configure.restype = ctypes.c_int
        lib.memres_configure.argtypes = [ctypes.c_char_p]
        lib.memres_stats.restype = ctypes.c_int
        lib.memres_stats.argtypes = [ctypes.c_int, ctypes.POINTER(Stats)]
        lib.memres_last_error.restype = ctypes.c_size_t
        lib.memres_last_error.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.memres_stack.restype = ctypes.c_size_t
        lib.memres_stack.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        lib.memres_flush.restype = ctypes.c_int
        lib.memres_flush.argtypes = []
        lib.memres_steps.restype = ctypes.c_int
        lib.memres_steps.argtypes = [ctypes.c_int, ctypes.POINTER(Steps)]
        lib.memres_step.restype = ctypes.c_int
        lib.memres_step.argtypes = [ctypes.c_int, ctypes.c_void_p]
        self.lib = lib

    def last_error(self):
        n = self.lib.memres_last_error(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        self.lib.memres_last_error(buf, n + 1)
        return buf.value.decode(errors="replace")

    def configure(self, stack):
        if self.lib.memres_configure(stack.encode()) != 0:
            raise MemresError(self.last_error())

    def stack(self, device=0):
        n = self.lib.memres_stack(device, None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        self.lib.memres_stack(device, buf, n + 1)
        return buf.value.decode()

    def stats(self, device=0):
        s = Stats()
        if self.lib.memres_stats(device, ctypes.byref(s)) != 0:
            raise MemresError(self.last_error())
        return s.as_dict()

    def steps(self, device=0):
        """What the stack's planned layers have done (memres_steps_t as a
        dict) and how many there are."""
        s = Steps()
        n = self.lib.memres_steps(device, ctypes.byref(s))
        if n < 0:
            raise MemresError(self.last_error())
        return s.as_dict(), n

    def flush(self):
        if self.lib.memres_flush() != 0:
            raise MemresError(self.last_error())

    def step(self, device=0, stream=0):
        """Marks the start of a step for the stack's planned layers; returns how many there are."""
        n = self.lib.memres_step(device, stream or None)
        if n < 0:
            raise MemresError(self.last_error())
        return n

    def alloc(self, size, device=0, stream=0):
        """The address as an int; 0 for size 0; MemresError when out of memory."""
        p = self.lib.memres_alloc(size, device, stream or None)
        if not p:
            if size == 0:
                return 0
            raise MemresError(self.last_error())
        return p

    def free(self, ptr, size, device=0, stream=0):
        self.lib.memres_free(ptr or None, size, device, stream or None)


def fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


def print_stats(lib, device, reserved=False):
    """Prints the stack of `device`, its figures, and a `STATS` line of JSON
    for scripts to read; `reserved`: the driver pools' peak too."""
    stats = lib.stats(device)
    print(f"memres stack: {lib.stack(device)}")
    if stats["has_stats"]:
        print(
            f"  live now {fmt_bytes(stats['bytes_current'])} in {stats['count_current']} blocks; "
            f"peak live {fmt_bytes(stats['bytes_peak'])}; {stats['count_total']} allocations in all"
        )
    held = f"  held from the device: now {fmt_bytes(stats['upstream_current'])}, peak {fmt_bytes(stats['upstream_peak'])}"
    if reserved:
        held += f"; driver pools reserved at peak {fmt_bytes(stats['reserved_peak'])}"
    print(held)
    print("STATS " + json.dumps(stats))
