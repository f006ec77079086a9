"""CuPy on memres against CuPy's default memory pool: the same workload, the
same results, bit for bit.

Driver (each worker in a process of its own):

    python3 cupy_check.py --so path/to/libmemres.so [--json out.json]

Worker (prints one line `RESULT {json}`):

    python3 cupy_check.py --worker native
    python3 cupy_check.py --worker memres --so path/to/libmemres.so [--stack 'stats(pool(cuda, per_stream=true, growth=32, granule=2MiB))']

The workload (fixed seed): matrix products, FFTs, reductions, a sort, a
cumulative sum, an elementwise chain, and many temporaries of assorted
sizes. Each result's bytes are hashed; the driver runs the native pool
twice (to see the workload is deterministic) and memres once, and compares.
"""

import argparse
import hashlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from workers import open_memres, run_worker, worker_or_driver  # noqa: E402

SCRIPT = os.path.abspath(__file__)
MEMRES_STACK = "stats(pool(cuda, per_stream=true, growth=32, granule=2MiB))"


def workload(cupy):
    rs = cupy.random.RandomState(42)
    out = {}
    a = rs.standard_normal((1536, 1536), dtype=cupy.float32)
    b = rs.standard_normal((1536, 1536), dtype=cupy.float32)
    out["matmul_f32"] = a @ b
    out["matmul_f64"] = a.astype(cupy.float64) @ b.astype(cupy.float64).T
    out["fft2"] = cupy.fft.fft2(a[:1024, :1024])
    out["rfft"] = cupy.fft.rfft(b, axis=0)
    out["sum_axis0"] = a.sum(axis=0)
    out["max_axis1"] = b.max(axis=1)
    out["norm"] = cupy.linalg.norm(a, axis=1)
    v = rs.standard_normal(1 << 22, dtype=cupy.float32)
    out["sort"] = cupy.sort(v)
    out["cumsum"] = cupy.cumsum(v[: 1 << 16].astype(cupy.float64))
    out["chain"] = cupy.tanh(v * 0.5 + 1.0) * cupy.exp(-(v ** 2))
    acc = cupy.zeros(4096, dtype=cupy.float64)
    sizes = rs.randint(1, 1 << 18, size=400).get()
    for i, n in enumerate(sizes):
        t = cupy.arange(int(n), dtype=cupy.float64) * (i + 1)
        acc[i % 4096] += float(t[-1])  # host round trip: temporaries come and go
    out["many_temporaries"] = acc
    return out


def digests(results):
    return {k: hashlib.sha256(v.get().tobytes()).hexdigest()[:16] for k, v in results.items()}


def worker(args):
    lib = open_memres(args, args.stack)
    import cupy

    if lib is not None:
        from cupy_memres import use_memres

        use_memres(lib)
    workload(cupy)  # warm up (plans, kernels)
    cupy.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    results = workload(cupy)
    cupy.cuda.runtime.deviceSynchronize()
    elapsed = time.perf_counter() - t0
    result = {"mode": args.worker, "cupy": cupy.__version__, "digests": digests(results), "seconds": elapsed}
    del results
    if lib is None:
        pool = cupy.get_default_memory_pool()
        result["pool_total_bytes"] = pool.total_bytes()
    else:
        dev = cupy.cuda.runtime.getDevice()
        result["stack"] = lib.stack(dev)
        result["memres"] = lib.stats(dev)
    print("RESULT " + json.dumps(result), flush=True)


def driver(args):
    native = run_worker(SCRIPT, "native", ["--worker", "native"])
    native2 = run_worker(SCRIPT, "native (again)", ["--worker", "native"])
    memres = run_worker(SCRIPT, "memres", ["--worker", "memres", "--so", args.so, "--stack", args.stack])
    deterministic = native["digests"] == native2["digests"]
    differ = sorted(k for k in native["digests"] if native["digests"][k] != memres["digests"].get(k))
    unstable = sorted(k for k in native["digests"] if native["digests"][k] != native2["digests"].get(k))
    # Results that the native pool reproduces must be reproduced by memres.
    must_match = [k for k in differ if k not in unstable]
    summary = {
        "cupy": native["cupy"],
        "results": len(native["digests"]),
        "identical": not differ,
        "differ": differ,
        "native_unstable": unstable,
        "ok": not must_match,
        "seconds_native": native["seconds"],
        "seconds_memres": memres["seconds"],
        "memres_stack": memres["stack"],
        "memres_stats": memres["memres"],
    }
    print("SUMMARY " + json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "runs": [native, native2, memres]}, f, indent=1)
    print(
        f"SUMMARY cupy_check: {summary['results']} results, "
        + ("all identical" if not differ else f"DIFFER: {', '.join(differ)}")
        + (f" (native itself unstable on {', '.join(unstable)})" if unstable else "")
        + f"; {memres['seconds'] * 1e3:.1f} ms memres vs {native['seconds'] * 1e3:.1f} ms native"
    )
    return 0 if summary["ok"] else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", choices=["native", "memres"])
    p.add_argument("--so", help="path of libmemres.so")
    p.add_argument("--stack", default=None, help=f"memres stack (default {MEMRES_STACK})")
    p.add_argument("--json", help="write the summary and every run here")
    args = p.parse_args()
    if worker_or_driver(p, args):
        return worker(args)
    args.stack = args.stack or MEMRES_STACK
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
