"""Memory freed on one CUDA stream and allocated on another, checked on the GPU.

Driver (runs each allocator in a process of its own and compares):

    python3 two_stream_check.py --so path/to/libmemres.so [--rounds 4] [--ordered STACK]... [--json out.json]

Each round, for each size: on stream A a tensor `t` is allocated, a long
kernel (`torch.cuda._sleep`) then `t.fill_(1)` are queued on A, and `t` is
freed while they are pending (legal: the free is ordered on A, its
allocation stream). A allocates again at once (memory freed on A may be
reused on A at once). Then on stream B a tensor `u` of the same size is
allocated and filled with 2; after the device is synchronized `u` must
hold only 2s. A stream-agnostic pool hands `u` the address of `t` while A's
fill is still to run, and A's 1s land in `u`: a corrupted round. Sizes grow
from round to round, so that B's own pool is too small now and then and a
stream-ordered pool must move A's chunk to B (after a wait on A) or give it
back upstream.

It runs PyTorch's own allocator, memres with STACK_AGNOSTIC (the former
default, whose pool ignores streams: the check must catch its race, or it
proves nothing) and memres with its default stack (no --stack: the
library's own default), and each stack given with `--ordered STACK`
(repeatable: other stacks said to be stream-ordered). Exit status 0 when
PyTorch's allocator, the default and every `--ordered` stack never
corrupt a round and the stream-agnostic stack does. One line
`SUMMARY two_stream_check [NAME]: ...` per run.

Worker (one run, prints one line `RESULT {json}`):

    python3 two_stream_check.py --worker native
    python3 two_stream_check.py --worker memres --so path/to/libmemres.so [--stack STACK]

Under compute-sanitizer (one worker, few rounds; memcheck tracks the
driver's stream-ordered allocations, so a chunk given back upstream before
the work on it is done shows as a use after free):

    compute-sanitizer --tool memcheck --track-stream-ordered-races all \\
        python3 two_stream_check.py --worker memres --so libmemres.so --rounds 1 --sleep-ms 2
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from workers import open_memres, run_worker, worker_or_driver  # noqa: E402

SCRIPT = os.path.abspath(__file__)

STACK_AGNOSTIC = "stats(pool(async))"
MIB = 1 << 20
# Bytes per round: the same size twice (the address of `t` comes back), then
# larger ones (B's pool must get more memory).
SIZES = [8 * MIB, 8 * MIB, 40 * MIB, 24 * MIB, 72 * MIB, 136 * MIB, 8 * MIB]


def worker(args):
    lib = open_memres(args, args.stack)
    import torch

    if lib is not None:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(lib.path, "memres_alloc", "memres_free")
        torch.cuda.memory.change_current_allocator(allocator)

    # Clock cycles of the sleep kernel: the SM clock, measured once.
    torch.cuda.init()
    cycles_per_ms = measure_cycles_per_ms(torch)
    sleep = int(args.sleep_ms * cycles_per_ms)
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    rounds = []
    for r in range(args.rounds):
        for size in SIZES:
            n = size // 4
            with torch.cuda.stream(a):
                t = torch.empty(n, dtype=torch.float32, device="cuda")
                addr_t = t.data_ptr()
                torch.cuda._sleep(sleep)
                t.fill_(1.0)
                del t  # freed on A while the sleep and the fill are pending
                # Reused on A at once: A's work is ordered.
                t2 = torch.empty(n, dtype=torch.float32, device="cuda")
                same_stream_reuse = t2.data_ptr() == addr_t
                t2.fill_(3.0)
                del t2
            with torch.cuda.stream(b):
                u = torch.empty(n, dtype=torch.float32, device="cuda")
                addr_u = u.data_ptr()
                u.fill_(2.0)
            torch.cuda.synchronize()
            wrong = int((u != 2.0).sum().item())
            rounds.append({
                "round": r,
                "bytes": size,
                "wrong_elements": wrong,
                "cross_stream_reuse": addr_u == addr_t,
                "same_stream_reuse": same_stream_reuse,
            })
            del u
    torch.cuda.synchronize()
    result = {
        "mode": args.worker,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "sleep_cycles": sleep,
        "rounds": rounds,
        "corrupted": sum(1 for x in rounds if x["wrong_elements"]),
        "cross_stream_reuses": sum(1 for x in rounds if x["cross_stream_reuse"]),
        "same_stream_reuses": sum(1 for x in rounds if x["same_stream_reuse"]),
    }
    if lib is not None:
        dev = torch.cuda.current_device()
        result["stack"] = lib.stack(dev)
        result["memres"] = lib.stats(dev)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def measure_cycles_per_ms(torch):
    """SM clock cycles per millisecond, from a timed sleep kernel."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    torch.cuda._sleep(cycles)  # warm up
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / max(start.elapsed_time(end), 1e-3)


def driver(args):
    common = ["--rounds", str(args.rounds), "--sleep-ms", str(args.sleep_ms)]
    runs = {
        "native": run_worker(SCRIPT, "native", ["--worker", "native"] + common),
        "agnostic": run_worker(SCRIPT, 
            f"memres {STACK_AGNOSTIC}", ["--worker", "memres", "--so", args.so, "--stack", STACK_AGNOSTIC] + common
        ),
        "default": run_worker(SCRIPT, "memres default", ["--worker", "memres", "--so", args.so] + common),
    }
    for i, stack in enumerate(args.ordered or []):
        runs[f"ordered {i + 1}"] = run_worker(
            SCRIPT, f"memres {stack}", ["--worker", "memres", "--so", args.so, "--stack", stack] + common
        )
    for name, r in runs.items():
        what = r.get("stack", "PyTorch's allocator")
        print(
            f"SUMMARY two_stream_check [{name}: {what}]: {r['corrupted']} of {len(r['rounds'])} rounds corrupted; "
            f"B got the address A freed in {r['cross_stream_reuses']}, "
            f"A reused it at once in {r['same_stream_reuses']}"
        )
    ok = all(r["corrupted"] == 0 for name, r in runs.items() if name != "agnostic")
    caught = runs["agnostic"]["corrupted"] > 0
    if not caught:
        print("SUMMARY two_stream_check: the stream-agnostic pool corrupted nothing: the check proves nothing "
              "(a longer --sleep-ms?)")
    summary = {"ok": ok and caught, "race_caught": caught, **{k: {
        key: v.get(key) for key in ("stack", "corrupted", "cross_stream_reuses", "same_stream_reuses")
    } for k, v in runs.items()}}
    print("SUMMARY " + json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "runs": runs}, f, indent=1)
    return 0 if summary["ok"] else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", choices=["native", "memres"], help="run one allocator and print RESULT")
    p.add_argument("--so", help="path of libmemres.so")
    p.add_argument("--stack", help="a worker's memres stack (default: the library's default)")
    p.add_argument("--ordered", action="append", metavar="STACK",
                   help="another stream-ordered stack, which must corrupt no round either (repeatable)")
    p.add_argument("--rounds", type=int, default=4, help="passes over the sizes")
    p.add_argument("--sleep-ms", type=float, default=20.0, help="the sleep kernel queued before A's fill")
    p.add_argument("--json", help="write the summary and every run here")
    args = p.parse_args()
    if worker_or_driver(p, args):
        return worker(args)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
