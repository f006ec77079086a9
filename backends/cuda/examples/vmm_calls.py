"""What the driver's virtual memory calls cost, the calls `vmm` makes for
each physical handle it maps and unmaps: `cuMemCreate`, `cuMemMap`,
`cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease` (and `cuMemGetInfo`, which
`vmm` asks before it maps), through ctypes, on device 0; no memres needed.

    python3 vmm_calls.py [REPEATS]

Prints the median microseconds per call, in two tables:

- handles of one 2 MiB granule, k side by side: one `cuMemSetAccess` and
  one `cuMemUnmap` over all k, against k creates, maps and releases;
- one handle of k granules: each call once.

Then the median milliseconds to map 2 GiB in handles of one granule
(create, map and set access for each) and to unmap and release them, the
handles split among 1, 2, 4 and 8 threads: does the driver serve
threads side by side?
"""
import ctypes
import statistics
import sys
import threading
import time

GRANULE = 2 << 20
cu = ctypes.CDLL("libcuda.so.1")


def check(rc, what):
    if rc != 0:
        raise SystemExit(f"{what}: CUresult {rc}")


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int), ("location", Location),
                ("win32", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]


class Access(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


PINNED, DEVICE, READ_WRITE = 1, 1, 3
PROP = Prop(PINNED, 0, Location(DEVICE, 0), None)
ACCESS = Access(Location(DEVICE, 0), READ_WRITE)
cu.cuMemCreate.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.POINTER(Prop), ctypes.c_uint64]
cu.cuMemMap.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint64]
cu.cuMemSetAccess.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.POINTER(Access), ctypes.c_size_t]
cu.cuMemUnmap.argtypes = [ctypes.c_uint64, ctypes.c_size_t]
cu.cuMemRelease.argtypes = [ctypes.c_uint64]
cu.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
cu.cuMemAddressReserve.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_size_t,
                                   ctypes.c_uint64, ctypes.c_uint64]
cu.cuMemAddressFree.argtypes = [ctypes.c_uint64, ctypes.c_size_t]


def timed(f):
    t = time.perf_counter_ns()
    f()
    return (time.perf_counter_ns() - t) / 1000


def create(size):
    h = ctypes.c_uint64()
    check(cu.cuMemCreate(ctypes.byref(h), size, ctypes.byref(PROP), 0), "cuMemCreate")
    return h.value


def main():
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    check(cu.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ks = [1, 4, 16, 64]
    va = ctypes.c_uint64()
    check(cu.cuMemAddressReserve(ctypes.byref(va), max(ks) * GRANULE, GRANULE, 0, 0), "cuMemAddressReserve")
    base = va.value
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    info = [timed(lambda: check(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo"))
            for _ in range(100)]
    print(f"cuMemGetInfo: {statistics.median(info):.1f} us")

    print("k handles of one granule: create+map per handle, then one call for all k (us)")
    for k in ks:
        t = {"create+map per handle": [], "set_access (k handles)": [], "unmap (k handles)": [],
             "release per handle": []}
        for _ in range(repeats):
            hs = []
            start = time.perf_counter_ns()
            for i in range(k):
                hs.append(create(GRANULE))
                check(cu.cuMemMap(base + i * GRANULE, GRANULE, 0, hs[-1], 0), "cuMemMap")
            t["create+map per handle"].append((time.perf_counter_ns() - start) / 1000 / k)
            t["set_access (k handles)"].append(
                timed(lambda: check(cu.cuMemSetAccess(base, k * GRANULE, ctypes.byref(ACCESS), 1), "cuMemSetAccess")))
            check(cu.cuMemsetD8_v2(base, 1, k * GRANULE), "cuMemsetD8")
            check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
            t["unmap (k handles)"].append(timed(lambda: check(cu.cuMemUnmap(base, k * GRANULE), "cuMemUnmap")))
            start = time.perf_counter_ns()
            for h in hs:
                check(cu.cuMemRelease(h), "cuMemRelease")
            t["release per handle"].append((time.perf_counter_ns() - start) / 1000 / k)
        print(f"  k={k:2d}  " + "  ".join(f"{n} {statistics.median(v):7.1f}" for n, v in t.items()))

    print("one handle of k granules, each call once (us)")
    for k in ks:
        t = {"create": [], "map": [], "set_access": [], "unmap": [], "release": []}
        for _ in range(repeats):
            h = [0]
            t["create"].append(timed(lambda: h.__setitem__(0, create(k * GRANULE))))
            t["map"].append(timed(lambda: check(cu.cuMemMap(base, k * GRANULE, 0, h[0], 0), "cuMemMap")))
            t["set_access"].append(
                timed(lambda: check(cu.cuMemSetAccess(base, k * GRANULE, ctypes.byref(ACCESS), 1), "cuMemSetAccess")))
            check(cu.cuMemsetD8_v2(base, 1, k * GRANULE), "cuMemsetD8")
            check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
            t["unmap"].append(timed(lambda: check(cu.cuMemUnmap(base, k * GRANULE), "cuMemUnmap")))
            t["release"].append(timed(lambda: check(cu.cuMemRelease(h[0]), "cuMemRelease")))
        print(f"  k={k:2d}  " + "  ".join(f"{n} {statistics.median(v):7.1f}" for n, v in t.items()))
    check(cu.cuMemAddressFree(base, max(ks) * GRANULE), "cuMemAddressFree")
    threads_table(ctx, repeats)


def threads_table(ctx, repeats, n=1024):
    va = ctypes.c_uint64()
    check(cu.cuMemAddressReserve(ctypes.byref(va), n * GRANULE, GRANULE, 0, 0), "cuMemAddressReserve")
    base, handles = va.value, [0] * n

    def in_threads(count, work):
        def run(t):
            check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            for i in range(t, n, count):  # ctypes lets the GIL go during each call
                work(i)
        threads = [threading.Thread(target=run, args=(t,)) for t in range(count)]
        start = time.perf_counter_ns()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return (time.perf_counter_ns() - start) / 1e6

    def map_one(i):
        handles[i] = create(GRANULE)
        check(cu.cuMemMap(base + i * GRANULE, GRANULE, 0, handles[i], 0), "cuMemMap")
        check(cu.cuMemSetAccess(base + i * GRANULE, GRANULE, ctypes.byref(ACCESS), 1), "cuMemSetAccess")

    def unmap_one(i):
        check(cu.cuMemUnmap(base + i * GRANULE, GRANULE), "cuMemUnmap")
        check(cu.cuMemRelease(handles[i]), "cuMemRelease")

    print(f"{n} handles of one granule from T threads (ms)")
    for count in [1, 2, 4, 8]:
        t = {"create+map+set_access": [], "unmap+release": []}
        for _ in range(repeats):
            t["create+map+set_access"].append(in_threads(count, map_one))
            check(cu.cuMemsetD8_v2(base, 1, n * GRANULE), "cuMemsetD8")
            check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
            t["unmap+release"].append(in_threads(count, unmap_one))
        print(f"  T={count}  " + "  ".join(f"{k} {statistics.median(v):7.1f}" for k, v in t.items()))
    check(cu.cuMemAddressFree(base, n * GRANULE), "cuMemAddressFree")


if __name__ == "__main__":
    main()
