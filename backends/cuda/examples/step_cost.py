"""The cost of `memres_step` alone: a loop of 300 steps, each a
`memres_step` and two `torch.empty` (16 MiB and 4 MiB, freed in the step)
through libmemres.so on STACK, beside a ctypes call that does nothing
(`memres_last_error(NULL, 0)`); medians of steps 51-300, first without
then with a `torch.cuda.synchronize()` before each step, as
`train_check.py` does. With a `planned(...)` stack every step after the
third follows the plan: the figure is that of a steady step.

    python3 step_cost.py path/to/libmemres.so STACK
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from memres_ctypes import Memres  # noqa: E402


def main():
    so, stack = sys.argv[1], sys.argv[2]
    lib = Memres(so)
    lib.configure(stack)
    torch.cuda.memory.change_current_allocator(
        torch.cuda.memory.CUDAPluggableAllocator(lib.path, "memres_alloc", "memres_free"))
    keep = torch.empty(1 << 20, device="cuda")  # noqa: F841 (a block that outlives the steps)

    def body():
        a = torch.empty(1 << 22, device="cuda")
        b = torch.empty(1 << 20, device="cuda")
        del a, b

    for sync in (False, True):
        steps, calls = [], []
        for _ in range(300):
            if sync:
                torch.cuda.synchronize()
            t = time.perf_counter()
            lib.step(0, 0)
            steps.append(time.perf_counter() - t)
            body()
            t = time.perf_counter()
            lib.lib.memres_last_error(None, 0)
            calls.append(time.perf_counter() - t)
        counts, _ = lib.steps(0)
        print(f"{'synchronized' if sync else 'unsynchronized'}: memres_step "
              f"{statistics.median(steps[50:]) * 1e6:.2f} us, a call that does nothing "
              f"{statistics.median(calls[50:]) * 1e6:.2f} us; steps followed {counts['followed']} of {counts['steps']}")


if __name__ == "__main__":
    main()
