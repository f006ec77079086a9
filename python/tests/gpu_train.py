"""Trains a small network on the GPU with PyTorch's allocator or memres's,
printing the losses, the mean step time and the peak device memory as one
JSON line. Used by test_gpu.py (losses must match) and by the lead's
comparison (python/gpu/run.sh prints both side by side)."""

import argparse
import json
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

p = argparse.ArgumentParser()
p.add_argument("--allocator", choices=["native", "memres"], required=True)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--stack", help="memres stack (default: what use() gives, the default stack)")
p.add_argument("--width", type=int, default=2048)
p.add_argument("--step-after-optimizer", action="store_true",
               help="steps marked by memres.allocators.torch.step_after(opt), not by step() in the loop")
args = p.parse_args()

import torch  # noqa: E402

if args.allocator == "memres":
    import memres.allocators.torch as mt
    mt.use(stack=args.stack)  # None: use() alone

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
dev = torch.device("cuda")
w = args.width
model = torch.nn.Sequential(
    torch.nn.Linear(1024, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
    torch.nn.Linear(w, 10)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
if args.allocator == "memres" and args.step_after_optimizer:
    mt.step_after(opt)
gen = torch.Generator(device="cpu").manual_seed(1)
data = [(torch.randn(256, 1024, generator=gen), torch.randint(0, 10, (256,), generator=gen))
        for _ in range(8)]

losses, times, planned_layers = [], [], 0
for step in range(args.steps):
    x, y = data[step % len(data)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if args.allocator == "memres" and not args.step_after_optimizer:
        # A step of the stack's `planned` layers (none: nothing to do).
        planned_layers = mt.step()
    x, y = x.to(dev), y.to(dev)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(loss.item())
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)

result = {"allocator": args.allocator, "losses": losses,
          "step_ms": 1000 * sorted(times[5:])[len(times[5:]) // 2]}
if args.allocator == "memres":
    import memres
    # Bytes held from the device at peak: memres's leaves', or what the
    # driver's pools under `async` leaves reserved, where more.
    st = memres.statistics.get_device_statistics(backend="cuda")
    result["peak_held_bytes"] = st.peak_bytes
    result["peak_reserved_bytes"] = st.peak_reserved_bytes
    result["peak_device_bytes"] = max(st.peak_bytes, st.peak_reserved_bytes)
    result["stack"] = memres.mr.get_current_device_resource().stack
    result["planned_layers"] = planned_layers
    # What the planned layers did: steps, those that followed a plan, ...
    result["steps"] = mt.steps()
    result["memres_live_blocks"] = memres._native.cuda().c_live_count(torch.cuda.current_device())
    # The most bytes live at once: what no allocator can hold less than.
    counts = memres.statistics.get_statistics()
    result["peak_live_bytes"] = counts.peak_bytes if counts is not None else None
else:
    result["peak_device_bytes"] = torch.cuda.max_memory_reserved()
    result["peak_live_bytes"] = torch.cuda.max_memory_allocated()
print(json.dumps(result))
