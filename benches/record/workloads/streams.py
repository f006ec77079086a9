"""Two streams: a side stream copies pinned host batches to the device ahead
of the compute on the default stream (the prefetching a DataLoader with
pin_memory and a CUDA prefetcher does). Batches are allocated, and so freed,
on the copy stream; activations and gradients on the default stream."""

import collections
import contextlib

import torch
import torch.nn.functional as F
from torch import nn

DEPTH = 2  # batches in flight ahead of the compute


def _convnet(classes=100):
    def stage(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.MaxPool2d(2))

    return nn.Sequential(stage(3, 64), stage(64, 128), stage(128, 256), stage(256, 512),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))


def two_streams(ctx):
    model = _convnet().to(ctx.device, memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    copy = torch.cuda.Stream() if ctx.cuda else None
    side = ctx.size(128, 32)
    gen = torch.Generator().manual_seed(ctx.seed)

    def host_batch():
        batch = ctx.choice([32, 48, 64, 96, 128]) if not ctx.dry else 2
        x = torch.randint(0, 256, (batch, 3, side, side), dtype=torch.uint8, generator=gen)
        y = torch.randint(0, 100, (batch,), generator=gen)
        return (x.pin_memory(), y.pin_memory()) if ctx.cuda else (x, y)

    def on_copy_stream():
        return torch.cuda.stream(copy) if ctx.cuda else contextlib.nullcontext()

    def prefetch():
        x, y = host_batch()
        with on_copy_stream():
            x = x.to(ctx.device, non_blocking=True)
            y = y.to(ctx.device, non_blocking=True)
            # Normalised on the copy stream: its temporaries come and go there too.
            x = ((x.float() / 255 - 0.45) / 0.225).contiguous(memory_format=torch.channels_last)
            ready = torch.cuda.Event() if ctx.cuda else None
            if ready is not None:
                ready.record()
        return x, y, ready

    steps = ctx.steps(100)
    queue = collections.deque(prefetch() for _ in range(min(DEPTH, steps)))
    for step in range(steps):
        x, y, ready = queue.popleft()
        if step + DEPTH < steps:
            queue.append(prefetch())
        if ready is not None:
            torch.cuda.current_stream().wait_event(ready)
        with ctx.autocast():
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if ctx.cuda:
            # The batch is freed on the copy stream, where it was allocated:
            # that stream must first wait for the compute that reads it
            # (what record_stream does for PyTorch's own allocator).
            done = torch.cuda.Event()
            done.record()
            copy.wait_event(done)
        del x, y
        if step % 10 == 0:
            ctx.info["last_loss"] = loss.item()
