"""Training loops: varying batch shapes, gradient checkpointing, and fp16
mixed precision with a gradient scaler."""

import torch
import torch.nn.functional as F

from .models import BertLike, MiniGPT, resnet


def bert_varbatch(ctx):
    """Masked-LM steps on length buckets, the batch sized to the bucket and
    jittered, as a token-budget sampler makes them."""
    vocab = 30522
    model = BertLike(ctx, layers=ctx.size(6, 1), d=ctx.size(768, 64), heads=ctx.size(12, 4), lm_head=True)
    model.to(ctx.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    buckets = [64, 128, 256, 512] if not ctx.dry else [16, 32]
    for _ in range(ctx.steps(30)):
        length = ctx.choice(buckets)
        batch = max(4, min(64, ctx.randint(8192, 16384) // length)) if not ctx.dry else 2
        ids = torch.randint(0, vocab, (batch, length), device=ctx.device)
        mask = torch.ones_like(ids)
        labels = torch.where(torch.rand(batch, length, device=ctx.device) < 0.15, ids, -100)
        with ctx.autocast():
            loss = model(ids, mask, labels=labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ctx.info["last_loss"] = loss.item()


def gpt_checkpoint(ctx):
    """A decoder LM whose blocks recompute their activations in backward."""
    vocab, length = 32000, ctx.size(1024, 32)
    model = MiniGPT(vocab, ctx.size(1024, 64), ctx.size(12, 2), heads=ctx.size(16, 4), max_len=length)
    model.to(ctx.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(ctx.steps(18)):
        batch = ctx.randint(4, 12) if not ctx.dry else 2
        ids = torch.randint(0, vocab, (batch, length + 1), device=ctx.device)
        with ctx.autocast():
            logits = model(ids[:, :-1], checkpointed=True)
        loss = F.cross_entropy(logits.float().view(-1, vocab), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ctx.info["last_loss"] = loss.item()


def resnet_amp(ctx):
    """ResNet-18, fp16 autocast, loss scaling, SGD with momentum; image size
    and batch change with the step (progressive resizing, ragged last batches)."""
    model = resnet(ctx, "resnet18").to(ctx.device, memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-5)
    scaler = torch.amp.GradScaler(ctx.device, enabled=ctx.cuda)
    sides = [128, 160, 192, 224, 256] if not ctx.dry else [64]
    for _ in range(ctx.steps(40)):
        side, batch = ctx.choice(sides), ctx.choice([16, 32, 64, 96, 128]) if not ctx.dry else 2
        x = torch.randn(batch, 3, side, side, device=ctx.device).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device=ctx.device)
        with ctx.autocast(torch.float16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        ctx.info["last_loss"] = loss.item()
