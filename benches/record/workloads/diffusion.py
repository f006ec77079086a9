"""Diffusion sampling: a latent UNet (residual convolution blocks, self- and
cross-attention at the lower resolutions, a timestep embedding) run for a
denoising loop with classifier-free guidance (the batch doubled: with and
without the prompt)."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class ResBlock(nn.Module):
    def __init__(self, cin, cout, temb):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(temb, cout)
        self.n2, self.c2 = nn.GroupNorm(32, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, t):
        h = self.c1(F.silu(self.n1(x))) + self.t(t)[:, :, None, None]
        return self.skip(x) + self.c2(F.silu(self.n2(h)))


class Attention(nn.Module):
    """Self-attention over the pixels, then cross-attention to the context."""

    def __init__(self, c, ctx_dim, heads=8):
        super().__init__()
        self.heads = heads
        self.norm = nn.GroupNorm(32, c)
        self.qkv, self.out = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.q2, self.kv2, self.out2 = nn.Linear(c, c), nn.Linear(ctx_dim, 2 * c), nn.Linear(c, c)

    def split(self, x):
        b, n, c = x.shape
        return x.view(b, n, self.heads, c // self.heads).transpose(1, 2)

    def forward(self, x, context):
        b, c, h, w = x.shape
        y = self.norm(x).flatten(2).transpose(1, 2)
        q, k, v = (self.split(t) for t in self.qkv(y).chunk(3, dim=-1))
        y = y + self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, h * w, c))
        k, v = (self.split(t) for t in self.kv2(context).chunk(2, dim=-1))
        a = F.scaled_dot_product_attention(self.split(self.q2(y)), k, v)
        y = y + self.out2(a.transpose(1, 2).reshape(b, h * w, c))
        return x + y.transpose(1, 2).reshape(b, c, h, w)


class UNet(nn.Module):
    def __init__(self, channels=(128, 256, 384), attention=(False, True, True), ctx_dim=768, latent=4):
        super().__init__()
        self.base = channels[0]
        temb = 4 * self.base
        self.temb = nn.Sequential(nn.Linear(self.base, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.inp = nn.Conv2d(latent, channels[0], 3, padding=1)
        self.down, self.up = nn.ModuleList(), nn.ModuleList()
        cin, skips = channels[0], [channels[0]]
        for i, (c, attn) in enumerate(zip(channels, attention)):
            self.down.append(nn.ModuleList([ResBlock(cin, c, temb), Attention(c, ctx_dim) if attn else None,
                                            nn.Conv2d(c, c, 3, 2, 1) if i + 1 < len(channels) else None]))
            cin = c
            skips.append(c)
        self.mid = nn.ModuleList([ResBlock(cin, cin, temb), Attention(cin, ctx_dim), ResBlock(cin, cin, temb)])
        for i, (c, attn) in reversed(list(enumerate(zip(channels, attention)))):
            self.up.append(nn.ModuleList([ResBlock(cin + skips.pop(), c, temb), Attention(c, ctx_dim) if attn else None,
                                          nn.Conv2d(c, c, 3, padding=1) if i > 0 else None]))
            cin = c
        self.outp = nn.Sequential(nn.GroupNorm(32, cin), nn.SiLU(), nn.Conv2d(cin, latent, 3, padding=1))

    def embed(self, t, dtype):
        half = self.base // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / half)
        args = t.float()[:, None] * freqs[None]
        return self.temb(torch.cat([args.cos(), args.sin()], dim=-1).to(dtype))

    def forward(self, x, t, context):
        emb = self.embed(t, x.dtype)
        h = self.inp(x)
        skips = [h]
        for res, attn, down in self.down:
            h = res(h, emb)
            if attn is not None:
                h = attn(h, context)
            skips.append(h)
            if down is not None:
                h = down(h)
        h = self.mid[2](self.mid[1](self.mid[0](h, emb), context), emb)
        for res, attn, up in self.up:
            h = res(torch.cat([h, skips.pop()], dim=1), emb)
            if attn is not None:
                h = attn(h, context)
            if up is not None:
                h = up(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.outp(h)


def unet_denoise(ctx):
    channels = (128, 256, 384) if not ctx.dry else (32, 64)
    model = UNet(channels, attention=(False, True, True)[: len(channels)]).to(ctx.device, ctx.dtype).eval()
    sizes = [32, 40, 48, 56, 64] if not ctx.dry else [8]
    steps, guidance = ctx.steps(15), 7.5
    with torch.inference_mode():
        for _ in range(ctx.steps(5)):
            batch, side = ctx.randint(1, 4) if not ctx.dry else 1, ctx.choice(sizes)
            prompt = torch.randn(batch, 77, 768, device=ctx.device, dtype=ctx.dtype)
            context = torch.cat([torch.zeros_like(prompt), prompt])
            x = torch.randn(batch, 4, side, side, device=ctx.device, dtype=ctx.dtype)
            # A DDIM-like schedule: x <- a x + b eps.
            for i in range(steps):
                t = torch.full((2 * batch,), 999 - i * (1000 // steps), device=ctx.device)
                eps_uncond, eps_cond = model(torch.cat([x, x]), t, context).chunk(2)
                eps = eps_uncond + guidance * (eps_cond - eps_uncond)
                a = 1 - (i + 1) / (steps + 1)
                x = math.sqrt(a) * x + math.sqrt(1 - a) * eps
            x.float().cpu()
