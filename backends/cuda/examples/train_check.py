"""PyTorch training on memres against PyTorch's own allocator.

Driver (runs each worker in a process of its own and compares):

    python3 train_check.py --so path/to/libmemres.so [--stack STACK]... [--log /tmp/torch.csv] [--json out.json]

It trains one of three models (`--model`: a small transformer,
TransformerEncoder; the same with batch and sequence length drawn per step;
a VGG-style CNN), bf16 autocast, for 50 steps on random data with a fixed
seed, on PyTorch's native caching
allocator and on memres per stack to test, in `--rounds` interleaved rounds
(default 3; native at least twice, to see that the run is deterministic at
all). Step times are medians over steps 6 to 50, then over rounds; the
time ratio is given as the ratio of those medians, as the median
of the rounds' own ratios (each memres run over the native run of its
round, which a slow spell of the machine affects alike), and step by step
("same steps": each step over native's step of the same index in the
round, which has the same shapes; the median per round, then over
rounds). Each
step begins with `memres_step`, so that a stack with `planned(...)` lays
each step out from the one before it: at the top of the loop's body, or
with `--step-at optimizer` after `opt.step()`, where the host has queued
the step's work and the device still runs it (`--step-at top,optimizer`
runs each stack both ways, side by side). Each run also gives the
host's time per phase of a step (the call, the inputs, forward, backward,
the optimizer) and its wait for the device after them, beside native's:
a device that waits for the host waits in one of those. After each step,
outside its time, a control launches 200 in-place kernels that allocate
nothing: its time is the host's pace in that process, and the ratio
"pace taken out" compares the stacks at the same pace (a fit of
log(step) on log(control), with two standard errors about it). The
stacks come from `--stack` (repeatable), else from $MEMRES_TRAIN_STACKS
(separated by `;`), else `stats(pool(cuda, per_stream=true, growth=32, granule=2MiB))`. With --log it runs once
more on memres with MEMRES_STACK='log(STACK, file=PATH)'
(the first stack) so the run is recorded as an RMM-format trace, which it
then checks (every free matches a live allocation of the same size). It
prints per-step losses, the median step time and the peak memory held from
the device of each run, and compares, per stack: losses identical, step
time ratio, peak ratio (memres's bytes held from the device at peak, the
larger of the stack's upstream peak and its driver pools' reserved peak /
torch.cuda.max_memory_reserved()), and what the timed steps took from
the device (memory given back and taken again costs driver calls in such
steps). One line `SUMMARY train_check [STACK]:
...` per stack. Exit status 0 when every check passes.

Each step's input is pinned before the step begins, as a
`DataLoader(pin_memory=True)` does, and copied without blocking
(`--pageable`: copied from pageable memory, as before): a pageable copy's
time varies between processes by up to 2x whatever the allocator, the
largest spread in the CNN's step time. `--profile-steps K` runs K more
steps under PyTorch's profiler and compares the device's busy time per
step and each kernel's time with native's (a slower step whose device
time did not grow waited for the host), and the host's calls into CUDA
per step.

`--also native-async` and `--also shim-async --shim async_shim.so` add two
baselines to the rounds: PyTorch on the driver's stream-ordered pool as its
own backend, and the same pool through the pluggable allocator that memres
is plugged in by (`async_shim.c`); the second over the first is what that
path costs whatever allocator is behind it. `--also native-expandable`:
PyTorch's allocator with expandable segments, its own placement in
virtual memory. `--cpus 2-5` runs every worker
on the same cores.

Worker (one run, prints one line `RESULT {json}`):

    python3 train_check.py --worker native
    python3 train_check.py --worker memres --so path/to/libmemres.so [--stack 'stats(pool(cuda, per_stream=true, growth=32, granule=2MiB))']
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

# Before torch loads cuBLAS: a deterministic workspace configuration.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from rmm_log import check_trace  # noqa: E402
from workers import NATIVE_ASYNC_ENV, open_memres, plug_shim, run_worker, worker_or_driver  # noqa: E402

SCRIPT = os.path.abspath(__file__)

SEED = 1234
# Launches in the control after each step: about 2 ms of the host's time.
CONTROL_LAUNCHES = 200
MEMRES_STACK = "stats(pool(cuda, per_stream=true, growth=32, granule=2MiB))"
STACKS_VAR = "MEMRES_TRAIN_STACKS"


# The models, each a function of (torch, F, args) returning the module, a
# generator of `steps` (input, target) pairs and the loss. Parameters and
# data come from CPU generators seeded alike: the same in every run.
VOCAB = 1024


def transformer(torch, F, args, dynamic=False):
    d_model = args.d_model
    layer = torch.nn.TransformerEncoderLayer(
        d_model, 8, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True, norm_first=True
    )

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
            self.head = torch.nn.Linear(d_model, VOCAB)

        def forward(self, x):
            return self.head(self.encoder(x))

    model = Model()

    def batches(steps):
        gen = torch.Generator().manual_seed(SEED)
        for _ in range(steps):
            batch, seq = args.batch, args.seq
            if dynamic:
                # Batch and sequence length change every step, as requests do.
                batch = int(torch.randint(args.batch // 4, args.batch + 1, (1,), generator=gen))
                seq = 16 * int(torch.randint(args.seq // 64, args.seq // 16 + 1, (1,), generator=gen))
            yield (torch.randn(batch, seq, d_model, generator=gen),
                   torch.randint(0, VOCAB, (batch, seq), generator=gen))

    def loss_of(logits, y):
        return F.cross_entropy(logits.float().view(-1, VOCAB), y.view(-1))

    return model, batches, loss_of


def conv(torch, F, args):
    """A VGG-style convolutional network (batch norm, max pooling) on 64x64
    images."""
    nn = torch.nn
    layers, cin = [], 3
    for width in (64, 64, "pool", 128, 128, "pool", 256, 256, "pool", 512, 512):
        if width == "pool":
            layers.append(nn.MaxPool2d(2))
            continue
        layers += [nn.Conv2d(cin, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
        cin = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 100)]
    model = nn.Sequential(*layers)

    def batches(steps):
        gen = torch.Generator().manual_seed(SEED)
        for _ in range(steps):
            yield (torch.randn(args.batch * 4, 3, 64, 64, generator=gen),
                   torch.randint(0, 100, (args.batch * 4,), generator=gen))

    def loss_of(logits, y):
        return F.cross_entropy(logits.float(), y)

    return model, batches, loss_of


def profile_steps(torch, train_step, inputs, args):
    """The device's side of `--profile-steps` more steps, under PyTorch's
    profiler: per step, the time the device was busy (kernels, copies and
    sets, overlaps counted once) and each kernel's time. Where memres's
    step is slower than native's, busy time that grew says the device ran
    slower on memres's memory; busy time that did not says the device
    waited for the host. Also the host's calls into CUDA per step, by name
    (the runtime's and the driver's, `cu*`): a stack that called the
    driver within steady steps would show there."""
    from torch.profiler import ProfilerActivity, profile

    k = args.profile_steps
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for x, y in inputs(k):
            train_step(x, y)
        torch.cuda.synchronize()
    spans, kernels, calls = [], {}, {}
    for e in prof.profiler.kineto_results.events():
        if e.device_type() != torch.autograd.DeviceType.CUDA:
            if e.name().startswith("cu"):
                calls[e.name()] = calls.get(e.name(), 0) + 1
            continue
        start, length = e.start_ns(), e.duration_ns()
        spans.append((start, start + length))
        kernels[e.name()] = kernels.get(e.name(), 0) + length
    busy, end = 0, None
    for lo, hi in sorted(spans):
        if end is None or lo > end:
            busy, end = busy + hi - lo, hi
        elif hi > end:
            busy, end = busy + hi - end, hi
    return {
        "steps": k,
        "busy_ms_per_step": busy / k / 1e6,
        "kernel_ms_per_step": {name: ns / k / 1e6 for name, ns in kernels.items()},
        "cuda_calls_per_step": {name: n / k for name, n in calls.items()},
    }


MODELS = {
    "transformer": transformer,
    "conv": conv,
    "dynamic": lambda torch, F, args: transformer(torch, F, args, dynamic=True),
}


def cpu_list(text):
    """The CPUs of a list as taskset takes it: `2-5,8`."""
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def worker(args):
    if args.cpus:
        # Before torch starts its threads, which inherit it.
        os.sched_setaffinity(0, cpu_list(args.cpus))
    lib = open_memres(args, args.stack[-1] if args.stack else None)
    import torch
    import torch.nn.functional as F

    if lib is not None:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(lib.path, "memres_alloc", "memres_free")
        torch.cuda.memory.change_current_allocator(allocator)
    elif args.worker == "shim":
        plug_shim(torch, args.shim)

    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        attention = lambda: sdpa_kernel(SDPBackend.MATH)  # noqa: E731 (deterministic backward)
    except ImportError:
        import contextlib

        attention = contextlib.nullcontext

    device = torch.device("cuda")
    model, batches, loss_of = MODELS[args.model](torch, F, args)
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

    # The loop's stream, the same every step.
    on = (torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream)

    # Where each step of the stack's `planned` layers begins (none: nothing
    # to do): at the top of the loop's body, or after the optimizer's step,
    # as `memres.allocators.torch.step_after(opt)` does. There the host has
    # queued the step's work and the device is still running it.
    step_calls = []

    def memres_step(*_):
        t = time.perf_counter()
        lib.step(*on)
        step_calls.append(time.perf_counter() - t)

    if lib is not None and args.step_at == "optimizer":
        opt.register_step_post_hook(memres_step)

    # Per step, the host's time at the end of each phase: where a device
    # that waits for the host waits.
    PHASES = ("memres_step", "inputs", "forward", "backward", "optimizer")
    marks = []

    def train_step(x, y):
        """One step; returns its loss."""
        at = [time.perf_counter()]
        if lib is not None and args.step_at == "top":
            memres_step()
        at.append(time.perf_counter())
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        at.append(time.perf_counter())
        with torch.autocast("cuda", dtype=torch.bfloat16), attention():
            out = model(x)
        loss = loss_of(out, y)
        at.append(time.perf_counter())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        at.append(time.perf_counter())
        opt.step()
        at.append(time.perf_counter())
        marks.append(at)
        return loss

    def pinned(pairs):
        """The input pairs in pinned host memory, pinned before the step
        as a `DataLoader(pin_memory=True)` does in its own thread (unless
        `--pageable`): a pageable copy's time varies between processes by
        up to 2x, whatever the allocator."""
        for x, y in pairs:
            yield (x, y) if args.pageable else (x.pin_memory(), y.pin_memory())

    # The host's pace, apart from the allocator: after each step, outside
    # its time, CONTROL_LAUNCHES in-place kernels on one tensor allocated
    # before the loop. They go through the same dispatcher and driver as a
    # step's launches and allocate nothing.
    probe = torch.zeros(256, device=device)

    def control():
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(CONTROL_LAUNCHES):
            probe.add_(1.0)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    # Bytes the stack has taken from the device so far, after each step
    # (outside its time): a step that took any grew the peak, or took
    # again memory given back (in `vmm`, driver calls and a wait for the
    # stream).
    def taken():
        return lib.stats(torch.cuda.current_device())["upstream_total"] if lib is not None else 0

    losses, times, controls, upstream = [], [], [], []
    for x, y in pinned(batches(args.steps)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = train_step(x, y)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        controls.append(control())
        upstream.append(taken())
    profile = profile_steps(torch, train_step, lambda k: pinned(batches(k)), args) if args.profile_steps else None

    result = {
        "mode": args.worker,
        "model": args.model,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "losses": losses,
        "step_ms_median": statistics.median(times[5:] or times) * 1e3,
        "step_ms": [t * 1e3 for t in times],
        # The seconds each `memres_step` call took (none on native).
        "step_call_ms_median": statistics.median(step_calls[5:args.steps] or step_calls or [0.0]) * 1e3,
        "step_at": args.step_at,
        # Medians over the timed steps of the host's time in each phase of
        # a step (the step's `memres_step` call at the top, the inputs'
        # copies, the forward pass and loss, the backward pass, the
        # optimizer's step), and of the wait for the device after it.
        "host_ms_phases": {
            name: statistics.median(m[i + 1] - m[i] for m in marks[5:args.steps]) * 1e3
            for i, name in enumerate(PHASES)
        },
        # The control's time (ms), the host's pace in this process.
        "control_ms_median": statistics.median(controls[5:]) * 1e3,
        "wait_ms_median": statistics.median(t - (m[-1] - m[0]) for t, m in zip(times[5:], marks[5:args.steps])) * 1e3,
        # Bytes taken from the device after each step (0 on native).
        "upstream_total_steps": upstream,
    }
    if profile is not None:
        result["profile"] = profile
    if args.worker == "shim":
        # The driver's pool keeps no count that PyTorch can read.
        result["peak_reserved"] = None
    elif lib is None:
        result["peak_reserved"] = torch.cuda.max_memory_reserved()
        result["peak_allocated"] = torch.cuda.max_memory_allocated()
    else:
        dev = torch.cuda.current_device()
        stats = lib.stats(dev)
        lib.flush()
        result["stack"] = lib.stack(dev)
        # Bytes held from the device at peak: what the stack took from its
        # leaves, or, through an `async` leaf, what the driver's pool had
        # reserved, when more: the driver maps its pool in large units and
        # keeps chunks the stack gave back.
        result["peak_reserved"] = max(stats["upstream_peak"], stats["reserved_peak"])
        result["memres"] = stats
        # Whether the loop was laid out: steps that followed a plan.
        result["planned"], result["planned_layers"] = lib.steps(dev)
    print("RESULT " + json.dumps(result), flush=True)




# Baselines that `--also` adds beside the stacks: PyTorch with the driver's
# stream-ordered pool as its own backend, and the same pool through the
# pluggable allocator (`async_shim.c`). Their difference is what the
# pluggable path costs by itself, whatever allocator is behind it. And
# PyTorch's own allocator with expandable segments (one segment per stream
# that grows by mapping pages): the same allocator placing tensors in
# virtual memory, as memres's `vmm` does.
BASELINES = {
    "native-async": (["--worker", "native"], NATIVE_ASYNC_ENV),
    "native-expandable": (["--worker", "native"], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    "shim-async": (["--worker", "shim"], {}),
}


def compare_profiles(rounds, natives):
    """The `--profile-steps` figures of a configuration's rounds beside
    native's: the device's busy time per step (median of the rounds' ratios,
    each over the native run of its round) and the kernels whose time grew
    most (medians over rounds, in ms per step). Empty without profiles."""
    pairs = [(m["profile"], n["profile"]) for m, n in zip(rounds, natives) if "profile" in m and "profile" in n]
    if not pairs:
        return {}

    def per_step(profiles, figure, name):
        """The median over `profiles` of `figure`'s entry for `name` per step."""
        return statistics.median(p[figure].get(name, 0.0) for p in profiles)

    def kernel_ms(profiles, name):
        return per_step(profiles, "kernel_ms_per_step", name)

    def calls(profiles, name):
        return per_step(profiles, "cuda_calls_per_step", name)

    mine, theirs = [m for m, _ in pairs], [n for _, n in pairs]
    names = set().union(*(p["kernel_ms_per_step"] for p in mine + theirs))
    grown = sorted(((kernel_ms(mine, k) - kernel_ms(theirs, k), k) for k in names), reverse=True)
    call_names = sorted(set().union(*(p["cuda_calls_per_step"] for p in mine + theirs)))
    # Per name: (name, mine, native).
    call_counts = [(n, calls(mine, n), calls(theirs, n)) for n in call_names]
    return {
        "cuda_calls_per_step": sum(m for _, m, _ in call_counts),
        "cuda_calls_per_step_native": sum(t for _, _, t in call_counts),
        # The calls whose count per step differs from native's.
        "cuda_calls_differing": [[n, m, t] for n, m, t in call_counts if m != t],
        "busy_ms_per_step": statistics.median(p["busy_ms_per_step"] for p in mine),
        "busy_ms_per_step_native": statistics.median(p["busy_ms_per_step"] for p in theirs),
        "busy_ratio_paired": statistics.median(m["busy_ms_per_step"] / n["busy_ms_per_step"] for m, n in pairs),
        "kernels_grown_ms": [[name[:120], round(d, 4), round(kernel_ms(theirs, name), 4)] for d, name in grown[:8]],
    }


def labelled(stack, place):
    """A configuration's name: its stack, and where its step is called
    unless at the top."""
    return stack if place == "top" else f"{stack} @{place}"


def phases_of(runs):
    """The medians over `runs` of each host phase and of the wait (ms)."""
    return {
        **{k: statistics.median(r["host_ms_phases"][k] for r in runs) for k in runs[0]["host_ms_phases"]},
        "wait": statistics.median(r["wait_ms_median"] for r in runs),
    }


def same_steps(run, native):
    """The median over the timed steps (6 on) of `run`'s step over
    `native`'s step of the same index."""
    return statistics.median(a / b for a, b in zip(run["step_ms"][5:], native["step_ms"][5:]))


def taken_in_timed_steps(run):
    """What `run`'s stack took from the device in the timed steps (6 on):
    MiB per step, and how many of those steps took any. A stack that
    gives memory back and takes it again pays driver calls (and in `vmm` a
    wait for the stream) in such steps."""
    total = run["upstream_total_steps"]
    taken = [b - a for a, b in zip(total[4:], total[5:])]
    return (sum(taken) / len(taken) / 2**20, sum(t > 0 for t in taken)) if taken else (0.0, 0)


def adjusted(runs, natives):
    """The step time of `runs` over `natives`' with each process's pace
    taken out, and the range of two standard errors about it.

    The host's pace differs by process, and a host-bound step follows it
    in part. A least-squares fit of log(step) on log(control) with a slope
    shared by both sets (an analysis of covariance) gives the sets'
    difference at the same control time. Fewer than two runs in a set, or
    controls that do not vary: None."""
    xs = [[math.log(r["control_ms_median"]) for r in rs] for rs in (runs, natives)]
    ys = [[math.log(r["step_ms_median"]) for r in rs] for rs in (runs, natives)]
    n = [len(x) for x in xs]
    if min(n) < 2 or sum(n) < 4:
        return None, None
    mx, my = [statistics.fmean(x) for x in xs], [statistics.fmean(y) for y in ys]
    sxx = sum((a - mx[i]) ** 2 for i in (0, 1) for a in xs[i])
    if sxx == 0:
        return None, None
    slope = sum((a - mx[i]) * (b - my[i]) for i in (0, 1) for a, b in zip(xs[i], ys[i])) / sxx
    effect = (my[0] - my[1]) - slope * (mx[0] - mx[1])
    residual = sum((b - my[i] - slope * (a - mx[i])) ** 2 for i in (0, 1) for a, b in zip(xs[i], ys[i]))
    se = math.sqrt(residual / (sum(n) - 3) * (1 / n[0] + 1 / n[1] + (mx[0] - mx[1]) ** 2 / sxx))
    return math.exp(effect), (math.exp(effect - 2 * se), math.exp(effect + 2 * se))


def driver(args):
    common = ["--model", args.model, "--steps", str(args.steps), "--layers", str(args.layers), "--d-model", str(args.d_model),
              "--batch", str(args.batch), "--seq", str(args.seq)]
    if args.cpus:
        common += ["--cpus", args.cpus]
    if args.profile_steps:
        common += ["--profile-steps", str(args.profile_steps)]
    if args.pageable:
        common += ["--pageable"]
    # The configurations beside native: (name, worker argv, environment).
    places = args.step_at.split(",")
    configs = [
        (labelled(stack, place),
         ["--worker", "memres", "--so", args.so, "--stack", stack, "--step-at", place], None)
        for stack in args.stack for place in places
    ]
    for name in args.also:
        argv, env = BASELINES[name]
        if name == "shim-async":
            argv = argv + ["--shim", args.shim]
        configs.append((name, argv, dict(os.environ, **env)))
    # Rounds interleave the configurations (native, each stack, native, ...)
    # so that a slow spell of the machine hits all of them alike; a
    # configuration's step time is the median over its rounds.
    natives, per_stack_runs, runs = [], [[] for _ in configs], {}
    rounds = max(args.rounds, 1)
    # Native runs at least twice: the second tells whether the run is
    # deterministic at all.
    for r in range(max(rounds, 2)):
        n = run_worker(SCRIPT, f"native, round {r}", ["--worker", "native"] + common)
        natives.append(n)
        runs[f"native_r{r}"] = n
        if r >= rounds:
            continue
        for i, (name, argv, env) in enumerate(configs):
            m = run_worker(SCRIPT, f"{name}, round {r}", argv + common, env=env)
            m["stack"] = labelled(m.get("stack", name), m.get("step_at", "top"))
            per_stack_runs[i].append(m)
            runs[f"memres{i}_r{r}"] = m
        if args.json:
            # The runs so far, in case the driver is stopped before the end.
            with open(args.json, "w") as f:
                json.dump({"summary": None, "runs": runs}, f, indent=1)
    native = natives[0]
    logged = trace = None
    if args.log:
        env = dict(os.environ, MEMRES_STACK=f"log({args.stack[0]}, file={args.log})")
        logged = run_worker(SCRIPT, "memres, logged", ["--worker", "memres", "--so", args.so] + common, env=env)
        runs["memres_logged"] = logged
        trace = check_trace(args.log)

    for name, r in runs.items():
        print(f"{name:14s} losses: " + " ".join(f"{x:.6f}" for x in r["losses"]))

    def max_diff(a, b):
        return max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))

    deterministic = all(n["losses"] == native["losses"] for n in natives)
    step_native = statistics.median(n["step_ms_median"] for n in natives)
    peak_native = max(n["peak_reserved"] for n in natives)
    per_stack = []
    for rounds in per_stack_runs:
        memres = rounds[0]
        step = statistics.median(m["step_ms_median"] for m in rounds)
        # None where the configuration cannot tell (the shim).
        peak = None if memres["peak_reserved"] is None else max(m["peak_reserved"] for m in rounds)
        counts = memres.get("memres")
        per_stack.append({
            "memres_stack": memres["stack"],
            "losses_identical": all(m["losses"] == native["losses"] for m in rounds),
            "max_loss_diff": max(max_diff(m, native) for m in rounds),
            "rounds": len(rounds),
            "step_ms_memres": step,
            "step_ms_memres_rounds": [m["step_ms_median"] for m in rounds],
            "step_time_ratio": step / step_native,
            # Each round's memres run over the native run just before it:
            # a slow spell of the machine cancels out of these.
            "step_time_ratio_rounds": [m["step_ms_median"] / n["step_ms_median"] for m, n in zip(rounds, natives)],
            "step_time_ratio_paired": statistics.median(
                m["step_ms_median"] / n["step_ms_median"] for m, n in zip(rounds, natives)
            ),
            # Each timed step over native's same step of the round (the
            # same shapes: the data are seeded alike), the median per round:
            # with shapes that change per step, a median over steps of
            # unlike sizes moves with the few that change rank.
            "step_time_ratio_same_steps_rounds": [same_steps(m, n) for m, n in zip(rounds, natives)],
            "step_time_ratio_same_steps": statistics.median(same_steps(m, n) for m, n in zip(rounds, natives)),
            # The ratio with the host's pace of each process taken out, and
            # the range of two standard errors about it (see `adjusted`).
            **dict(zip(("step_time_ratio_adjusted", "step_time_ratio_adjusted_range"), adjusted(rounds, natives))),
            "control_ms_rounds": [m["control_ms_median"] for m in rounds],
            # Per round: MiB taken from the device per timed step, and the
            # timed steps that took any.
            "taken_in_timed_steps_rounds": [taken_in_timed_steps(m) for m in rounds],
            "peak_memres_held": peak,
            "peak_memres_upstream": counts and max(m["memres"]["upstream_peak"] for m in rounds),
            "peak_memres_driver_reserved": counts and counts["reserved_peak"],
            "peak_memres_live": counts["bytes_peak"] if counts and counts["has_stats"] else None,
            "peak_ratio": None if peak is None else peak / peak_native,
            "step_call_ms": statistics.median(m["step_call_ms_median"] for m in rounds),
            # The host's time per phase of a step and the wait for the
            # device after it, medians over rounds, beside native's.
            "host_ms_phases": phases_of(rounds),
            "host_ms_phases_native": phases_of(natives),
            # Per round, steps that followed a plan of the `planned` layers
            # and steps in all (None without such layers).
            "planned_followed": [(m["planned"]["followed"], m["planned"]["steps"]) if m.get("planned_layers") else None
                                 for m in rounds],
            **compare_profiles(rounds, natives),
        })
    summary = {
        "gpu": native["gpu"],
        "torch": native["torch"],
        "model": args.model,
        "steps": args.steps,
        "native_deterministic": deterministic,
        "native_repeat_max_loss_diff": max(max_diff(n, native) for n in natives),
        "step_ms_native": step_native,
        "step_ms_native_rounds": [n["step_ms_median"] for n in natives],
        "control_ms_native_rounds": [n["control_ms_median"] for n in natives],
        "peak_native_reserved": peak_native,
        "peak_native_allocated": native["peak_allocated"],
        "stacks": per_stack,
        # The first stack's figures at the top level, as before.
        **per_stack[0],
    }
    if logged is not None:
        summary["logged_losses_identical"] = logged["losses"] == native["losses"]
        summary["logged_stack"] = logged["stack"]
        summary["step_ms_memres_logged"] = logged["step_ms_median"]
        summary["trace"] = trace
    ok = (all(p["losses_identical"] for p in per_stack) or not deterministic) and (trace is None or trace["ok"])
    if logged is not None and deterministic:
        ok = ok and summary["logged_losses_identical"]
    summary["ok"] = ok
    print("SUMMARY " + json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "runs": runs}, f, indent=1)
    mib = 1 << 20
    for i, p in enumerate(per_stack):
        print(
            f"SUMMARY train_check {args.model} [{p['memres_stack']}]: losses {'identical' if p['losses_identical'] else 'DIFFER'} "
            f"(native repeat {'identical' if deterministic else 'differs: not deterministic'}); "
            f"step {p['step_ms_memres']:.2f} ms vs {summary['step_ms_native']:.2f} ms native "
            f"(x{p['step_time_ratio']:.3f}, per round x{p['step_time_ratio_paired']:.3f}, "
            f"same steps x{p['step_time_ratio_same_steps']:.4f}"
            + (f", pace taken out x{p['step_time_ratio_adjusted']:.3f}, {p['step_time_ratio_adjusted_range'][0]:.3f}-"
               f"{p['step_time_ratio_adjusted_range'][1]:.3f}); " if p["step_time_ratio_adjusted"] else "); ")
            + ("peak held unknown" if p["peak_ratio"] is None else
               f"peak held {p['peak_memres_held'] / mib:.0f} MiB vs "
               f"{summary['peak_native_reserved'] / mib:.0f} MiB native reserved (x{p['peak_ratio']:.3f})")
            + (f"; steps laid out {p['planned_followed'][0][0]} of {p['planned_followed'][0][1]} (first round)"
               if p["planned_followed"][0] else "")
            + "; taken from the device per timed step, MiB (steps that took any): "
            + ", ".join(f"{mib_:.1f} ({k})" for mib_, k in p["taken_in_timed_steps_rounds"])
            + (f"; device busy {p['busy_ms_per_step']:.2f} ms vs {p['busy_ms_per_step_native']:.2f} ms per step "
               f"(per round x{p['busy_ratio_paired']:.3f}); CUDA calls {p['cuda_calls_per_step']:.1f} vs "
               f"{p['cuda_calls_per_step_native']:.1f} per step" if "busy_ratio_paired" in p else "")
            + (f"; trace {trace['rows']} rows, {'ok' if trace['ok'] else 'BAD'}" if trace and i == 0 else "")
        )
        mine, theirs = p["host_ms_phases"], p["host_ms_phases_native"]
        print("  host ms per step, memres / native: "
              + ", ".join(f"{k} {mine[k]:.4f} / {theirs[k]:.4f}" for k in mine))
        for name, grew, was in p.get("kernels_grown_ms", []):
            print(f"  kernel {grew:+.4f} ms per step (native {was:.4f}): {name}")
        for name, mine, native in p.get("cuda_calls_differing", []):
            print(f"  CUDA call {name}: {mine:.1f} per step (native {native:.1f})")
    if not deterministic:
        print("SUMMARY train_check: the native run is not deterministic; loss equality is not checked")
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", choices=["native", "memres", "shim"], help="run one configuration and print RESULT")
    p.add_argument("--so", help="path of libmemres.so")
    p.add_argument("--stack", action="append", default=None,
                   help=f"memres stack to test, repeatable (driver default: ${STACKS_VAR} split at `;`, "
                        f"else {MEMRES_STACK}); a worker runs the last")
    p.add_argument("--log", help="also run with MEMRES_STACK='log(STACK, file=LOG)' and check the trace")
    p.add_argument("--json", help="write the summary and every run here (the runs so far after each round)")
    p.add_argument("--also", action="append", default=[], choices=sorted(BASELINES),
                   help="a baseline beside the stacks, repeatable: native-async (PyTorch's own cudaMallocAsync "
                        "backend), native-expandable (PyTorch's allocator with expandable segments) or "
                        "shim-async (the driver's pool through the pluggable allocator, --shim)")
    p.add_argument("--shim", help="async_shim.so, built from async_shim.c (for --also shim-async)")
    p.add_argument("--cpus", help="CPUs every worker runs on, as taskset takes them (2-5,8): the same cores "
                                  "for every process, so that where the system puts one does not time it")
    p.add_argument("--rounds", type=int, default=3,
                   help="runs of each configuration, interleaved; step times are medians over rounds (native runs at least twice)")
    p.add_argument("--model", choices=sorted(MODELS), default="transformer",
                   help="transformer (fixed shapes), dynamic (the transformer with batch and "
                        "sequence length drawn per step) or conv (a VGG-style CNN)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--pageable", action="store_true",
                   help="copy each step's input from pageable host memory (default: pinned before the step)")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="after the timed steps, this many more under PyTorch's profiler: the device's busy time per "
                        "step and the kernels that differ most from native's")
    p.add_argument("--step-at", default="top",
                   help="where each step's memres_step is called: top (of the loop's body), optimizer (after "
                        "opt.step(), as memres.allocators.torch.step_after does), or a comma-separated list, "
                        "each run per stack side by side (a worker takes one)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    args = p.parse_args()
    if "shim-async" in args.also and not args.shim or args.worker == "shim" and not args.shim:
        p.error("shim-async needs --shim")
    if any(place not in ("top", "optimizer") for place in args.step_at.split(",")):
        p.error("--step-at takes top or optimizer, or both separated by a comma")
    if worker_or_driver(p, args):
        return worker(args)
    if not args.stack:
        from_env = [x.strip() for x in os.environ.get(STACKS_VAR, "").split(";") if x.strip()]
        args.stack = from_env or [MEMRES_STACK]
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
