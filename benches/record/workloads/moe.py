"""Mixture of experts: a router sends every token to its top-2 experts, each
expert runs on the tokens it got (a batch whose size the routing decides),
and the outputs are scattered back, weighted."""

import torch
import torch.nn.functional as F
from torch import nn


class MoE(nn.Module):
    def __init__(self, d, hidden, experts, top):
        super().__init__()
        self.top = top
        self.norm = nn.LayerNorm(d)
        self.router = nn.Linear(d, experts, bias=False)
        self.w1 = nn.ModuleList(nn.Linear(d, hidden, bias=False) for _ in range(experts))
        self.w2 = nn.ModuleList(nn.Linear(hidden, d, bias=False) for _ in range(experts))

    def forward(self, x):
        shape = x.shape
        x = self.norm(x).view(-1, shape[-1])
        weights, chosen = torch.softmax(self.router(x).float(), dim=-1).topk(self.top, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e, (w1, w2) in enumerate(zip(self.w1, self.w2)):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if token.numel() == 0:
                continue
            y = w2(F.silu(w1(x.index_select(0, token)))) * weights[token, slot, None]
            out = out.index_add(0, token, y)
        return out.view(shape)


class Model(nn.Module):
    def __init__(self, vocab, d, layers, experts, top=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.attn = nn.ModuleList(nn.MultiheadAttention(d, 8, batch_first=True) for _ in range(layers))
        self.ln = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.moe = nn.ModuleList(MoE(d, 2 * d, experts, top) for _ in range(layers))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for attn, ln, moe in zip(self.attn, self.ln, self.moe):
            y = ln(x)
            x = x + attn(y, y, y, need_weights=False)[0]
            x = x + moe(x)
        return self.head(x)


def moe_routing(ctx):
    vocab = 16000
    d, layers = ctx.size(1024, 64), ctx.size(4, 1)
    model = Model(vocab, d, layers, experts=8).to(ctx.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(ctx.steps(20)):
        batch, length = (ctx.logint(2, 16), ctx.choice([128, 256, 512])) if not ctx.dry else (2, 16)
        ids = torch.randint(0, vocab, (batch, length + 1), device=ctx.device)
        with ctx.autocast():
            logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, vocab), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ctx.info["last_loss"] = loss.item()
