"""Records a family of real allocation traces: each workload of
workloads/__init__.py runs in a process of its own with PyTorch or CuPy
allocating through libmemres.so, whose `log` adaptor writes every
allocation and free in RMM's log format.

    python3 benches/record/record.py --so path/to/libmemres.so --out DIR [--only NAME,...]
    python3 benches/record/record.py --list
    python3 benches/record/record.py --device cpu --dry-run      # no GPU, no library

For each workload NAME the driver runs the worker with
MEMRES_STACK='log(async, file=DIR/NAME.csv)' under a timeout, checks the
trace (every free matches a live allocation of its size, whatever the
stream; no failed allocation), gzips it to DIR/NAME.csv.gz if it passed
(one that failed stays DIR/NAME.csv), and prints one line: name, rows,
peak live bytes, seconds, OK or FAIL. DIR/NAME.log holds the worker's
output, DIR/summary.json every figure. Exit status 0 when every workload
passed; a failing one does not stop the others.

A dry run (--dry-run) runs each workload for a few small steps without
the library and records nothing: on the CPU (--device cpu) it checks that
the code runs where there is no GPU, CuPy workloads running on NumPy.

Worker (one workload in this process; prints `RESULT {json}`):

    python3 benches/record/record.py --worker NAME [--so SO] [--device cuda|cpu] [--dry-run]
"""

import argparse
import gc
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "backends", "cuda", "examples")
sys.path.insert(0, HERE)
sys.path.insert(0, EXAMPLES)
from rmm_log import WHITE_SPACE, check_trace  # noqa: E402
from workloads import BY_NAME, WORKLOADS  # noqa: E402
from workloads.context import Context  # noqa: E402

# The stack of every recording: the trace is what the framework asked for,
# whatever serves it; the driver's pool is the plainest server.
STACK = "log(async, file={file})"
DEFAULT_TIMEOUT = 120


# ------------------------------------------------------------------ worker


def worker(args):
    w = BY_NAME[args.worker]
    lib = None
    if not args.dry_run:
        from memres_ctypes import Memres

        lib = Memres(args.so)
    ctx = Context(args.device, dry=args.dry_run, plain=args.plain)
    versions = {}
    if w.framework == "torch":
        import torch

        if lib is not None:
            # Before the first CUDA tensor: every allocation goes to memres.
            allocator = torch.cuda.memory.CUDAPluggableAllocator(lib.path, "memres_alloc", "memres_free")
            torch.cuda.memory.change_current_allocator(allocator)
        torch.manual_seed(ctx.seed)
        versions["torch"] = torch.__version__
        if ctx.cuda:
            versions["gpu"] = torch.cuda.get_device_name()
    elif ctx.cuda:
        import cupy

        if lib is not None:
            from cupy_memres import use_memres

            use_memres(lib)
        ctx.xp = cupy
        versions["cupy"] = cupy.__version__
        versions["gpu"] = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())["name"].decode()
    else:
        import numpy

        ctx.xp = numpy
        versions["numpy"] = numpy.__version__

    t0 = time.perf_counter()
    w.function()(ctx)
    gc.collect()
    ctx.sync()
    seconds = time.perf_counter() - t0
    if lib is not None:
        lib.flush()
    print("RESULT " + json.dumps({"name": w.name, "seconds": seconds, **versions, **ctx.info}), flush=True)
    sys.stderr.flush()
    # No interpreter teardown: frees made after the flush would be lost from
    # the trace in an order that varies from run to run; what is live now
    # stays live in the trace (a replay frees it at the end).
    os._exit(0)


# ------------------------------------------------------------------ driver


def run_one(w, args):
    """Runs one workload's worker; returns its summary record."""
    log_path = os.path.join(args.out, f"{w.name}.log")
    csv = os.path.join(args.out, f"{w.name}.csv")
    for stale in (csv, csv + ".gz"):
        if os.path.exists(stale):
            os.remove(stale)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", w.name, "--device", args.device]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if args.dry_run:
        cmd.append("--dry-run")
    else:
        cmd += ["--so", args.so]
        env["MEMRES_STACK"] = STACK.format(file=csv)
    if args.plain:
        cmd.append("--plain")
    record = {"name": w.name, "framework": w.framework, "kind": w.kind, "held_out": w.held_out, "about": w.about}
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        # A session of its own: a timeout kills the worker and its children.
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            p.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            record["why"] = f"timed out after {args.timeout} s"
    record["seconds"] = round(time.perf_counter() - t0, 2)
    record["exit"] = p.returncode
    # UTF-8 whatever the locale, as the worker (Python, PyTorch, CUDA) writes
    # it; a byte that is not UTF-8 is replaced, not an error.
    with open(log_path, encoding="utf-8", errors="replace") as f:
        output = f.read()
    results = [line for line in output.splitlines() if line.startswith("RESULT ")]
    if p.returncode != 0 or not results:
        record.setdefault("why", f"worker exit status {p.returncode}" + ("" if results else ", no RESULT line"))
        record["ok"] = False
        record["log_tail"] = output[-3000:]
        return record
    record["result"] = json.loads(results[-1][len("RESULT "):])
    if args.dry_run:
        record["ok"] = True
        return record
    if not os.path.exists(csv):
        record.update(ok=False, why=f"no trace written at {csv}")
        return record
    trace = check_trace(csv)
    record["trace"] = trace
    record["ok"] = trace["ok"]
    if not trace["ok"]:
        # Left plain, so that OUT/*.csv.gz are the traces that passed.
        record["why"] = "; ".join(trace["problems"][:3]) or "no allocation"
        return record
    with open(csv, "rb") as src, gzip.GzipFile(csv + ".gz", "wb", compresslevel=9, mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(csv)
    record["gz_bytes"] = os.path.getsize(csv + ".gz")
    return record


def line(r):
    mib = 1 << 20
    status = "OK" if r["ok"] else f"FAIL ({r.get('why', '?')})"
    t = r.get("trace")
    gz = f"{r['gz_bytes'] / 1024:6.0f} KiB gz" if "gz_bytes" in r else f"{'-':>6s} KiB gz"
    figures = (f"{t['rows']:8d} ops  peak live {t['peak_live_bytes'] / mib:9.1f} MiB  {gz}"
               if t else f"{'-':>8s} ops  {'':29s}")
    held = " held-out" if r["held_out"] else ""
    return f"{r['name']:22s} {figures}  {r['seconds']:6.1f} s  {status}{held}"


# What ends a word of a stack string (memres_core::stack::parse: white space
# is Rust's `char::is_whitespace`, Unicode's, a no-break space included): the
# file of `log(async, file=OUT/NAME.csv)` may hold none of it.
NOT_IN_A_WORD = ",()=" + WHITE_SPACE


def printable(text):
    """`text` as standard output can print it: a character its encoding
    lacks (a worker's UTF-8 under LC_ALL=C) as an escape, not an error."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    return text.encode(encoding, "backslashreplace").decode(encoding)


def driver(args):
    args.out = os.path.abspath(args.out)
    bad = sorted({c for c in args.out if c in NOT_IN_A_WORD})
    if bad:
        raise SystemExit(f"--out {args.out!r}: a path with {' or '.join(map(repr, bad))} cannot be named "
                         "in a memres stack (',', '(', ')', '=' and white space end its words)")
    os.makedirs(args.out, exist_ok=True)
    chosen = WORKLOADS
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            raise SystemExit(f"unknown workload(s): {', '.join(unknown)} (see --list)")
        chosen = [BY_NAME[n] for n in names]
    records, t0 = [], time.perf_counter()
    for w in chosen:
        r = run_one(w, args)
        records.append(r)
        print(printable(line(r)), flush=True)
        if not r["ok"] and r.get("log_tail", "").strip():
            print(printable("    " + "\n    ".join(r["log_tail"].splitlines()[-15:])), flush=True)
    failed = [r["name"] for r in records if not r["ok"]]
    total = time.perf_counter() - t0
    summary = {"mode": "dry-run" if args.dry_run else "record", "device": args.device,
               "stack": None if args.dry_run else STACK, "seconds": round(total, 1), "failed": failed,
               "workloads": records}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"{len(records) - len(failed)}/{len(records)} OK in {total:.0f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else "") + f"; summary in {args.out}/summary.json")
    return 1 if failed else 0


def list_workloads():
    for w in WORKLOADS:
        held = "held-out" if w.held_out else "        "
        print(f"{w.name:22s} {w.framework:5s} {w.kind:10s} {held}  {w.about}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--so", help="path of libmemres.so (not needed for --dry-run)")
    p.add_argument("--out", default="traces", help="folder of the traces, logs and summary.json (default ./traces)")
    p.add_argument("--only", help="comma-separated workload names (default: all)")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--dry-run", action="store_true", help="a few small steps, without the library, no trace")
    p.add_argument("--plain", action="store_true", help="plain PyTorch models even where transformers/torchvision are installed")
    p.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT, help=f"seconds per workload (default {DEFAULT_TIMEOUT})")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.list:
        list_workloads()
        return 0
    if not args.dry_run:
        if args.device != "cuda":
            p.error("recording needs --device cuda (use --dry-run on the CPU)")
        if not args.so or not os.path.isfile(args.so):
            p.error("--so must name libmemres.so (or pass --dry-run)")
        args.so = os.path.abspath(args.so)
    if args.worker:
        if args.worker not in BY_NAME:
            p.error(f"unknown workload {args.worker}")
        return worker(args)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
