"""Recurrent training: an LSTM language model over batches whose sequence
length changes every step, as bucketed text batches come. cuDNN takes a
workspace and a reserve for every shape, beside the activations."""

import torch
import torch.nn.functional as F
from torch import nn


class LSTMLM(nn.Module):
    def __init__(self, vocab, d, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, d, num_layers=layers, batch_first=True, dropout=0.1)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


def lstm_varlen(ctx):
    """Steps of length 32-512 (log-uniform), the batch from a token budget,
    Adam with gradient clipping, in fp32."""
    vocab = ctx.size(16000, 500)
    model = LSTMLM(vocab, ctx.size(1024, 32), ctx.size(3, 2)).to(ctx.device).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(ctx.steps(40)):
        length = ctx.logint(32, ctx.size(512, 24))
        batch = max(4, min(128, ctx.randint(8192, 16384) // length)) if not ctx.dry else 2
        ids = torch.randint(0, vocab, (batch, length + 1), device=ctx.device)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ctx.info["last_loss"] = loss.item()
