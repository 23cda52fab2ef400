"""A small real task for a CPU: a tiny GPT learning next-character prediction on Python's own docs.

The corpus is ``pydoc_data.topics``, the help texts that ship inside every Python installation
(about 465k characters of English), so nothing is downloaded. The model's module names follow
the hybrid routing rule (``optim.routes_to_muon``): ``embed.*`` and ``head`` go to AdamW with the
norms and biases; the attention and MLP matrices go to Muon.

    data = load_corpus()
    model = TinyGPT(data["vocab_size"])
    history = train(model, MuonW(hybrid_param_groups(model.named_parameters())), data, steps=200)
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import nn


def load_corpus(val_fraction: float = 0.1) -> dict:
    """Python's help topics as one text, encoded per character; the last 10% is held out."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(len(ids) * (1 - val_fraction))
    return dict(train=ids[:split], val=ids[split:], vocab_size=len(chars), chars=chars, n_chars=len(text))


def batch(ids: torch.Tensor, batch_size: int, context: int, gen: torch.Generator):
    """Random windows of ``context`` characters and the same windows shifted by one."""
    start = torch.randint(0, len(ids) - context - 1, (batch_size,), generator=gen)
    window = torch.stack([ids[s: s + context + 1] for s in start.tolist()])
    return window[:, :-1], window[:, 1:]


class Block(nn.Module):
    logit_hook = None   # optional callable(q, k): sees each forward's queries and keys (QK-clip's maxima)

    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.fc, self.out = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.n_head, D // self.n_head).permute(2, 0, 3, 1, 4)
        if self.logit_hook is not None:
            self.logit_hook(q, k)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D))
        return x + self.out(F.gelu(self.fc(self.norm2(x))))


class TinyGPT(nn.Module):
    """Token and position embeddings, ``n_layer`` pre-norm transformer blocks, a final norm and a head."""

    def __init__(self, vocab_size: int, d: int = 128, n_layer: int = 2, n_head: int = 4, context: int = 64):
        super().__init__()
        self.context = context
        self.embed = nn.ModuleDict(dict(tok=nn.Embedding(vocab_size, d), pos=nn.Embedding(context, d)))
        self.blocks = nn.ModuleList(Block(d, n_head) for _ in range(n_layer))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab_size, bias=False)

    def forward(self, idx):
        x = self.embed["tok"](idx) + self.embed["pos"](torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


@torch.no_grad()
def evaluate(model, ids: torch.Tensor, batches: int = 8, batch_size: int = 64, seed: int = 1234) -> float:
    """Mean cross-entropy (nats per character) on fixed random windows of ``ids``."""
    gen = torch.Generator().manual_seed(seed)
    dev = next(model.parameters()).device  # windows are drawn on the CPU (one generator everywhere), used there
    total = sum(F.cross_entropy(model(x.to(dev)).flatten(0, 1), y.to(dev).flatten()).double()
                for x, y in (batch(ids, batch_size, model.context, gen) for _ in range(batches)))
    return total.item() / batches  # one host sync for the whole evaluation


def train(model, optimizer, data: dict, steps: int = 200, batch_size: int = 32, seed: int = 0,
          eval_every: int = 50) -> dict:
    """Train on random windows; returns per-step train loss, periodic validation loss and seconds."""
    gen = torch.Generator().manual_seed(seed)
    history = dict(step_loss=[], val_steps=[], val_loss=[], seconds=0.0)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        x, y = batch(data["train"], batch_size, model.context, gen)
        dev = next(model.parameters()).device
        loss = F.cross_entropy(model(x.to(dev)).flatten(0, 1), y.to(dev).flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        history["step_loss"].append(loss.item())
        if step % eval_every == 0 or step == steps:
            history["val_steps"].append(step)
            history["val_loss"].append(evaluate(model, data["val"]))
    history["seconds"] = time.perf_counter() - start
    return history


def max_logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Each head's largest causal pre-softmax logit, q_i . k_j / sqrt(d_head) for j <= i, over the batch: what
    QK-clip keeps under its threshold (``muongrid/qk_clip.py``). q, k: (batch, heads, tokens, d_head)."""
    T = q.shape[-2]
    logits = (q @ k.mT) / math.sqrt(q.shape[-1])
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return logits.masked_fill(~causal, -math.inf).amax(dim=(0, 2, 3))


def qk_layers(model, head_major: bool = False) -> list:
    """The book's GPT's ``QKLayer``s: its fused ``blocks.i.qkv.weight`` holds all query rows, then all key rows,
    then all value rows; ``head_major`` (``tpgpt``, the TP model): each head's query, key and value rows in turn."""
    from ..qk_clip import QKLayer

    out = []
    for i, block in enumerate(model.blocks):
        d, heads = block.qkv.weight.shape[1], block.n_head
        hd = d // heads
        if head_major:
            q = tuple((h * 3 * hd, h * 3 * hd + hd) for h in range(heads))
            k = tuple((h * 3 * hd + hd, h * 3 * hd + 2 * hd) for h in range(heads))
        else:
            q = tuple((h * hd, (h + 1) * hd) for h in range(heads))
            k = tuple((d + h * hd, d + (h + 1) * hd) for h in range(heads))
        out.append(QKLayer(f"blocks.{i}.qkv.weight", f"blocks.{i}.qkv.weight", q, k))
    return out


def record_max_logits(model, clip, tp_rank: int = 0) -> None:
    """Have every block of ``model`` report its heads' largest logits to ``clip`` on each forward (under TP a
    rank's block runs heads ``tp_rank * local`` onwards)."""
    for i, block in enumerate(model.blocks):
        block.logit_hook = (lambda q, k, i=i: clip.record(i, max_logits(q, k), first_head=tp_rank * q.shape[1]))
