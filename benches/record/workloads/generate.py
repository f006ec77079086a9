"""Autoregressive generation with a KV cache that grows every token, as
naive Hugging Face-style loops do: the cache, the ids and the attention mask
are each replaced by a one-token-longer copy (torch.cat) every step."""

import torch

from .models import MiniGPT

VOCAB = 32000


def _model(ctx):
    d, layers = ctx.size(2048, 128), ctx.size(4, 2)
    return MiniGPT(VOCAB, d, layers, heads=16 if not ctx.dry else 4, max_len=2048).to(ctx.device, ctx.dtype).eval()


def _requests(ctx, max_batch, max_prompt, max_new):
    """The requests of a run: (batch, prompt length, new tokens), the new
    tokens 3 on a dry run."""
    for _ in range(ctx.steps(10)):
        batch, prompt, new = ctx.logint(1, max_batch), ctx.logint(32, max_prompt), ctx.randint(16, max_new)
        yield batch, prompt, 3 if ctx.dry else new


def kv_greedy(ctx):
    model = _model(ctx)
    with torch.inference_mode():
        for batch, prompt, new in _requests(ctx, ctx.size(8, 2), ctx.size(1024, 24), 48):
            ids = torch.randint(0, VOCAB, (batch, prompt), device=ctx.device)
            mask = torch.ones(batch, prompt, dtype=torch.long, device=ctx.device)
            caches = model.new_cache()
            logits = model(ids, caches)
            for step in range(new):
                token = logits[:, -1].argmax(dim=-1, keepdim=True)
                # The ids and the attention mask grow too, as in Hugging Face's
                # loop (this causal model needs no mask; the copies are the point).
                ids = torch.cat([ids, token], dim=1)
                mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
                logits = model(token, caches, start=prompt + step)
            ids.cpu()
            del caches, logits


def kv_beam(ctx):
    model = _model(ctx)
    beams = 4
    with torch.inference_mode():
        for batch, prompt, new in _requests(ctx, ctx.size(4, 2), ctx.size(512, 24), 32):
            rows = batch * beams
            # Every beam starts from the prompt; only the first has score 0.
            ids = torch.randint(0, VOCAB, (batch, prompt), device=ctx.device).repeat_interleave(beams, dim=0)
            scores = torch.full((batch, beams), -1e9, device=ctx.device)
            scores[:, 0] = 0
            caches = model.new_cache()
            logits = model(ids, caches)
            for step in range(new):
                logp = torch.log_softmax(logits[:, -1].float(), dim=-1)
                total = (scores.view(rows, 1) + logp).view(batch, beams * VOCAB)
                scores, flat = total.topk(beams, dim=1)
                origin = flat // VOCAB + torch.arange(batch, device=ctx.device).unsqueeze(1) * beams
                token = (flat % VOCAB).view(rows, 1)
                origin = origin.view(rows)
                for cache in caches:
                    cache.reorder(origin)
                ids = torch.cat([ids.index_select(0, origin), token], dim=1)
                logits = model(token, caches, start=prompt + step)
            ids.view(batch, beams, -1)[:, 0].cpu()
            del caches, logits


def seq2seq_greedy(ctx):
    """An encoder-decoder (torch.nn.Transformer) as a translation service
    runs it: each request's source encoded once, then the target decoded
    greedily with no cache, the whole prefix through the decoder every
    token."""
    d = ctx.size(1024, 64)
    heads, layers = (16, 6) if not ctx.dry else (4, 1)
    model = torch.nn.Transformer(d_model=d, nhead=heads, num_encoder_layers=layers, num_decoder_layers=layers,
                                 dim_feedforward=4 * d, batch_first=True)
    embed, head = torch.nn.Embedding(VOCAB, d), torch.nn.Linear(d, VOCAB)
    for module in (model, embed, head):
        module.to(ctx.device, ctx.dtype).eval()
    with torch.inference_mode():
        for batch, source, new in _requests(ctx, ctx.size(16, 2), ctx.size(256, 24), 64):
            src = torch.randint(0, VOCAB, (batch, source), device=ctx.device)
            memory = model.encoder(embed(src))
            out = torch.zeros(batch, 1, dtype=torch.long, device=ctx.device)
            for _ in range(new):
                mask = torch.nn.Transformer.generate_square_subsequent_mask(out.size(1), device=ctx.device,
                                                                            dtype=ctx.dtype)
                hidden = model.decoder(embed(out), memory, tgt_mask=mask)
                out = torch.cat([out, head(hidden[:, -1]).argmax(dim=-1, keepdim=True)], dim=1)
            out.cpu()
            del memory
