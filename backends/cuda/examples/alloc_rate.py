"""The cost of an allocation as PyTorch pays it: time per `torch.empty` (and
the free of the tensor made 64 allocations before it, sizes of 512 B to
4 MiB) through PyTorch's own allocator and through libmemres.so on each
stack, one process per (allocator, stack) and round, rounds interleaved;
the best of three timed loops of 50,000 per process, the median over
rounds printed. Python's own cost of `torch.empty` is in every figure.

    python3 alloc_rate.py path/to/libmemres.so ROUNDS STACK...

A STACK of `native-async` is PyTorch on the driver's stream-ordered pool as
its own backend (`PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync`), and
`shim:PATH` the same pool plugged in as memres is, from `async_shim.so`
built at PATH (see `async_shim.c`): the two ways into PyTorch side by side.
"""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from workers import NATIVE_ASYNC_ENV, plug_shim  # noqa: E402


def worker(mode, so, stack):
    import torch
    if mode == "shim":
        plug_shim(torch, stack)
    elif mode == "memres":
        from memres_ctypes import Memres
        lib = Memres(so)
        lib.configure(stack)
        torch.cuda.memory.change_current_allocator(
            torch.cuda.memory.CUDAPluggableAllocator(lib.path, "memres_alloc", "memres_free"))
    torch.zeros(1, device="cuda")
    sizes = [512 * (1 + (i * 2654435761) % 8192) for i in range(997)]

    def run(n):
        keep = []
        t = time.perf_counter()
        for i in range(n):
            keep.append(torch.empty(sizes[i % 997], dtype=torch.uint8, device="cuda"))
            if len(keep) > 64:
                keep.pop(0)
        keep.clear()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / n

    run(20000)
    r = [run(50000) for _ in range(3)]
    print("RESULT " + json.dumps({"mode": mode, "stack": stack, "us": min(r) * 1e6}))


def config(stack):
    """(worker mode, stack or shim path) of a STACK argument."""
    if stack == "native-async":
        return ("native-async", "-")
    if stack.startswith("shim:"):
        return ("shim", stack[len("shim:"):])
    return ("memres", stack)


def main():
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    so, rounds, stacks = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    res = {}
    for _ in range(rounds):
        for mode, stack in [("native", "-")] + [config(s) for s in stacks]:
            env = dict(os.environ, **(NATIVE_ASYNC_ENV if mode == "native-async" else {}))
            out = subprocess.run([sys.executable, __file__, "--worker", mode, so, stack],
                                 capture_output=True, text=True, timeout=120, env=env)
            line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
            if not line:
                print(mode, stack, "FAILED", out.stderr[-2000:])
                continue
            d = json.loads(line[0][7:])
            res.setdefault((mode, stack), []).append(d["us"])
    for (mode, stack), v in res.items():
        v.sort()
        print(f"{mode:12s} {stack:50s} us/alloc+free: {' '.join('%.2f' % x for x in v)} median {v[len(v)//2]:.2f}")


main()
