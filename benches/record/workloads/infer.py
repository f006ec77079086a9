"""Inference serving with dynamic shapes: every request brings its own batch
size and sequence length (or image size), and its answer goes back to the
host, as a server does."""

import torch

from .models import BertLike, gpt2_or_plain, resnet


def _padding_mask(ctx, batch, length):
    """A mask of ones then zeros: each sequence of the batch has its own length."""
    lengths = [ctx.randint(max(1, length // 4), length) for _ in range(batch)]
    lengths[0] = length
    mask = torch.zeros(batch, length, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return mask.to(ctx.device)


def bert_dynamic(ctx):
    max_batch, max_len = ctx.size(64, 4), ctx.size(512, 48)
    model = BertLike(ctx, layers=ctx.size(12, 2)).to(ctx.device, ctx.dtype).eval()
    with torch.inference_mode():
        for _ in range(ctx.steps(100)):
            batch, length = ctx.logint(1, max_batch), ctx.logint(16, max_len)
            ids = torch.randint(0, 30522, (batch, length), device=ctx.device)
            hidden = model(ids, _padding_mask(ctx, batch, length))
            # The [CLS] embeddings, normalised, back to the host.
            torch.nn.functional.normalize(hidden[:, 0].float(), dim=-1).cpu()


def gpt_dynamic(ctx):
    max_batch, max_len = ctx.size(32, 3), ctx.size(1024, 48)
    forward, model = gpt2_or_plain(ctx, layers=ctx.size(12, 2))
    model.to(ctx.device, ctx.dtype).eval()
    with torch.inference_mode():
        for _ in range(ctx.steps(90)):
            batch, length = ctx.logint(1, max_batch), ctx.logint(8, max_len)
            ids = torch.randint(0, 50257, (batch, length), device=ctx.device)
            logits = forward(ids, _padding_mask(ctx, batch, length))
            # Scoring: log-probabilities of the next token, top candidates to the host.
            torch.log_softmax(logits[:, -1].float(), dim=-1).topk(5).indices.cpu()


def resnet_dynamic(ctx):
    max_batch = ctx.size(64, 3)
    sides = [128, 160, 192, 224, 256, 288, 320, 384] if not ctx.dry else [64, 96]
    model = resnet(ctx, "resnet50").to(ctx.device, ctx.dtype, memory_format=torch.channels_last).eval()
    with torch.inference_mode():
        for _ in range(ctx.steps(110)):
            batch, side = ctx.logint(1, max_batch), ctx.choice(sides)
            # Images arrive as uint8 and are normalised on the device.
            raw = torch.randint(0, 256, (batch, 3, side, side), dtype=torch.uint8, device=ctx.device)
            x = ((raw.to(ctx.dtype) / 255 - 0.45) / 0.225).contiguous(memory_format=torch.channels_last)
            torch.softmax(model(x).float(), dim=-1).topk(5).indices.cpu()
