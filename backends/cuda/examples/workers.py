"""The checks' drivers run each configuration in a process of its own (an
allocator is chosen once per process): `run_worker` runs one and reads the
`RESULT {json}` line it prints."""

import json
import subprocess
import sys

# The environment of PyTorch on the driver's stream-ordered pool as its own
# backend: a baseline beside memres with no memres in it.
NATIVE_ASYNC_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}


def plug_shim(torch, path):
    """Makes the driver's pool, through `async_shim.so` at `path`, PyTorch's
    allocator: the same way in as memres's, before any CUDA tensor."""
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "shim_alloc", "shim_free")
    torch.cuda.memory.change_current_allocator(allocator)


def run_worker(script, name, argv, env=None):
    """Runs `python3 script argv...`; returns the JSON of its last RESULT
    line, or exits with its output when it failed or printed none."""
    cmd = [sys.executable, script] + argv
    print(f"-- {name}: {' '.join(cmd)}", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        sys.stdout.write(p.stdout[-4000:])
        sys.stdout.write(p.stderr[-4000:])
        raise SystemExit(f"{name}: worker failed (exit {p.returncode})")
    return json.loads(lines[-1][len("RESULT "):])


def worker_or_driver(parser, args):
    """Refuses a memres worker or a driver without --so; says whether
    `args` ask for a worker."""
    if args.worker == "memres" and not args.so:
        parser.error("--worker memres needs --so")
    if not args.worker and not args.so:
        parser.error("--so is needed")
    return bool(args.worker)


def open_memres(args, stack):
    """For `--worker memres`, the bindings of libmemres.so (--so) with
    `stack` configured, if given, before anything is allocated; None for
    `--worker native`."""
    if args.worker != "memres":
        return None
    from memres_ctypes import Memres

    lib = Memres(args.so)
    if stack:
        lib.configure(stack)
    return lib
