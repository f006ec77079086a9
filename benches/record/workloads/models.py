"""Models with random weights, nothing downloaded: built from transformers'
and torchvision's configurations where those are installed (unless
`ctx.plain`), else from plain PyTorch modules defined here, of the same
shapes."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def _optional(ctx, module):
    """The module, or None when missing or when ctx.plain asks for plain PyTorch."""
    if ctx.plain:
        return None
    try:
        return __import__(module)
    except ImportError:
        return None


# ---------------------------------------------------------------- decoder LM


class KVCache:
    """One layer's keys and values, grown by concatenation every step (as
    naive Hugging Face code does)."""

    def __init__(self):
        self.k = self.v = None

    def append(self, k, v):
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v

    def reorder(self, index):
        """Beam search: keep the rows of the beams that survived."""
        self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class DecoderBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, cache=None):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            k, v = cache.append(k, v)
        # Prefill and training are causal; one new token sees the whole cache.
        a = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class MiniGPT(nn.Module):
    """A GPT-style decoder with learned positions and an explicit KV cache."""

    def __init__(self, vocab, d, layers, heads, max_len):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(DecoderBlock(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def new_cache(self):
        return [KVCache() for _ in self.blocks]

    def forward(self, ids, caches=None, start=0, checkpointed=False):
        pos = torch.arange(start, start + ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(pos)
        for i, block in enumerate(self.blocks):
            if checkpointed:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x, caches[i] if caches is not None else None)
        return self.head(self.ln(x))


# ---------------------------------------------------------------- encoders


class PlainEncoder(nn.Module):
    """BERT-like: embeddings, a pre-norm TransformerEncoder, a padding mask."""

    def __init__(self, vocab, d, layers, heads, max_len):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, ids, mask):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return self.encoder(x, src_key_padding_mask=mask == 0)


class BertLike(nn.Module):
    """One interface over transformers' BERT and the plain encoder: hidden
    states from (ids, mask), and, with labels, a masked-LM loss."""

    def __init__(self, ctx, layers, d=768, heads=12, vocab=30522, max_len=512, lm_head=False):
        super().__init__()
        transformers = _optional(ctx, "transformers")
        self.hf = transformers is not None
        if self.hf:
            config = transformers.BertConfig(
                vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=4 * d, max_position_embeddings=max_len,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            )
            self.model = (transformers.BertForMaskedLM if lm_head else transformers.BertModel)(config)
        else:
            self.model = PlainEncoder(vocab, d, layers, heads, max_len)
            self.head = nn.Linear(d, vocab) if lm_head else None
        ctx.info["encoder"] = "transformers.Bert" if self.hf else "plain"

    def forward(self, ids, mask, labels=None):
        if self.hf:
            out = self.model(input_ids=ids, attention_mask=mask, labels=labels)
            return out.loss if labels is not None else out.last_hidden_state
        h = self.model(ids, mask)
        if labels is None:
            return h
        logits = self.head(h)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)


def gpt2_or_plain(ctx, layers=12, d=768, heads=12, vocab=50257, max_len=1024):
    """GPT-2-small from its configuration, or MiniGPT of its shape; called
    as model(ids, mask) -> logits."""
    transformers = _optional(ctx, "transformers")
    if transformers is not None:
        config = transformers.GPT2Config(
            vocab_size=vocab, n_positions=max_len, n_embd=d, n_layer=layers, n_head=heads,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )
        model = transformers.GPT2LMHeadModel(config)
        ctx.info["decoder"] = "transformers.GPT2"
        return lambda ids, mask: model(input_ids=ids, attention_mask=mask, use_cache=False).logits, model
    model = MiniGPT(vocab, d, layers, heads, max_len)
    ctx.info["decoder"] = "plain"
    return lambda ids, mask: model(ids), model


# ---------------------------------------------------------------- convnets


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.down is None else self.down(x)))


class PlainResNet(nn.Module):
    """ResNet with basic blocks (depths (2, 2, 2, 2) is ResNet-18)."""

    def __init__(self, depths, classes=1000, width=64):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        layers, cin = [], width
        for i, n in enumerate(depths):
            cout = width << i
            for j in range(n):
                layers.append(BasicBlock(cin, cout, 2 if j == 0 and i > 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


def resnet(ctx, name):
    """torchvision's resnet18/resnet50 with random weights, or a plain
    ResNet (basic blocks; for resnet50, ResNet-34's depths)."""
    tv = _optional(ctx, "torchvision")
    if tv is not None:
        ctx.info["convnet"] = f"torchvision.{name}"
        return getattr(tv.models, name)(weights=None)
    ctx.info["convnet"] = "plain"
    return PlainResNet((2, 2, 2, 2) if name == "resnet18" else (3, 4, 6, 3))
