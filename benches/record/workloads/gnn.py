"""Graph neural network training on graphs of varying size (mini-batches of
sampled subgraphs): per layer a gather of node features along the edges and
a scatter-add back to the nodes, with degree normalisation."""

import torch
import torch.nn.functional as F
from torch import nn


class GCNLayer(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.lin = nn.Linear(cin, cout)

    def forward(self, x, src, dst, norm):
        messages = self.lin(x).index_select(0, src) * norm[:, None]
        return torch.zeros(x.shape[0], messages.shape[1], device=x.device, dtype=messages.dtype).index_add_(
            0, dst, messages)


def gcn_varsize(ctx):
    features, hidden, classes = 128, 256, 40
    layers = nn.ModuleList([GCNLayer(features, hidden), GCNLayer(hidden, hidden), GCNLayer(hidden, classes)])
    layers.to(ctx.device).train()
    opt = torch.optim.Adam(layers.parameters(), lr=1e-3)
    for _ in range(ctx.steps(40)):
        nodes = ctx.logint(10_000, 200_000) if not ctx.dry else 500
        edges = nodes * ctx.randint(5, 20)
        x = torch.randn(nodes, features, device=ctx.device)
        y = torch.randint(0, classes, (nodes,), device=ctx.device)
        src = torch.randint(0, nodes, (edges,), device=ctx.device)
        dst = torch.randint(0, nodes, (edges,), device=ctx.device)
        # Symmetric normalisation 1/sqrt(deg(src) deg(dst)), self-loops counted.
        deg = torch.bincount(dst, minlength=nodes).float() + 1
        norm = deg.rsqrt()[src] * deg.rsqrt()[dst]
        h = x
        for i, layer in enumerate(layers):
            h = layer(h, src, dst, norm)
            if i + 1 < len(layers):
                h = F.dropout(F.relu(h), 0.5)
        train = torch.rand(nodes, device=ctx.device) < 0.3
        loss = F.cross_entropy(h[train], y[train])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ctx.info["last_loss"] = loss.item()
