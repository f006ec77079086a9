"""What a workload function is given: the device, the random shapes, the
step counts, and in a dry run smaller ones."""

import contextlib
import math
import random

SEED = 20


class Context:
    """One run of one workload.

    `device` is "cuda" or "cpu" (a dry run). `xp` is CuPy on the GPU and
    NumPy on the CPU, for array workloads. Shapes are drawn from `rng`, a
    Python generator seeded alike in every run, so that a trace's sizes do
    not depend on the device's random numbers. A dry run takes few steps and
    small shapes: it checks that the code runs, not what it allocates.
    `plain` asks for the plain-PyTorch models even where transformers or
    torchvision are installed. `info` goes into the worker's RESULT line.
    """

    def __init__(self, device, dry=False, plain=False, seed=SEED):
        self.device = device
        self.cuda = device == "cuda"
        self.dry = dry
        self.plain = plain
        self.seed = seed
        self.rng = random.Random(seed)
        self.xp = None
        self.info = {}

    def steps(self, n):
        """`n` steps, two in a dry run."""
        return min(n, 2) if self.dry else n

    def size(self, full, dry):
        """A dimension: `full`, or `dry` in a dry run."""
        return dry if self.dry else full

    def randint(self, lo, hi):
        """An integer in lo..=hi, uniform."""
        return self.rng.randint(lo, hi)

    def logint(self, lo, hi):
        """An integer in lo..=hi, log-uniform (small ones as often as large
        ones, as request sizes come)."""
        return min(hi, max(lo, round(math.exp(self.rng.uniform(math.log(lo), math.log(hi))))))

    def choice(self, items):
        return self.rng.choice(items)

    # PyTorch helpers (the module is imported only by torch workloads).

    @property
    def dtype(self):
        """The working precision: bfloat16 on the GPU, float32 on the CPU."""
        import torch

        return torch.bfloat16 if self.cuda else torch.float32

    def autocast(self, dtype=None):
        """Mixed precision on the GPU; nothing on the CPU."""
        import torch

        if not self.cuda:
            return contextlib.nullcontext()
        return torch.autocast("cuda", dtype=dtype or torch.bfloat16)

    def sync(self):
        if self.cuda and self.xp is None:
            import torch

            torch.cuda.synchronize()
        elif self.cuda:
            self.xp.cuda.runtime.deviceSynchronize()
