"""PyTorch on memres: switch PyTorch's CUDA allocator to libmemres.so, train a
small network for a few steps, and print what memres held.

    python3 pytorch_memres.py path/to/libmemres.so [--stack 'stats(pool(cuda, per_stream=true, growth=32, granule=2MiB))']

The stack is --stack, else the environment variable MEMRES_STACK, else
memres's default, stats(pool(cuda, per_stream=true, growth=32, granule=2MiB)). The allocator must be switched before
PyTorch allocates anything on the GPU.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memres_ctypes import Memres, print_stats  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("so", help="path of libmemres.so")
    p.add_argument("--stack", help="memres stack description (default: MEMRES_STACK or the library's default, stats(pool(cuda, per_stream=true, growth=32, granule=2MiB)))")
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()

    lib = Memres(args.so)
    if args.stack:
        lib.configure(args.stack)

    import torch

    allocator = torch.cuda.memory.CUDAPluggableAllocator(lib.path, "memres_alloc", "memres_free")
    torch.cuda.memory.change_current_allocator(allocator)

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096),
        torch.nn.GELU(),
        torch.nn.Linear(4096, 1024),
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        x = torch.randn(256, 1024, device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = (model(x).float() - x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {loss.item():.6f}")
    # Tensors of many sizes, freed at once: the pool reuses and coalesces.
    scratch = [torch.empty(1 + 997 * i, dtype=torch.uint8, device=device) for i in range(500)]
    del scratch
    torch.cuda.synchronize()

    print_stats(lib, torch.cuda.current_device(), reserved=True)


if __name__ == "__main__":
    main()
