"""Chapter 1's tiny GPT made tensor-parallel with PyTorch's own layers (``parallelize_module``).

    model = tp_gpt(vocab_size, grid, d=128, n_layer=2, n_head=4, seed=0)   # on every rank of the grid
    opt = DistributedMuon(hybrid_param_groups(model.named_parameters()), grid, layout="owner")

The TP plan, per transformer block, on the grid's "tp" mesh dimension (Megatron-LM's split, one
all-reduce per sub-layer in the forward pass and one in the backward)::

    qkv   ColwiseParallel   weight (3d, d)  -> Shard(0): this rank's heads' q, k and v rows
    attention on the local heads only (n_head / tp of them; no communication)
    proj  RowwiseParallel   weight (d, d)   -> Shard(1): its input columns; output all-reduced
    fc    ColwiseParallel   weight (4d, d)  -> Shard(0)
    out   RowwiseParallel   weight (d, 4d)  -> Shard(1); output all-reduced

Embeddings, the norms and the head stay plain tensors, replicated: every TP rank holds them whole
and computes them redundantly. At this size (a ~100-character vocabulary) they are a few
percent of the FLOPs, and keeping them whole keeps the loss a plain ``cross_entropy`` on local
logits (a vocab-parallel head would need ``loss_parallel``). Their gradients are the same on
every TP rank: ``ColwiseParallel`` all-reduces the gradient of its replicated input in the
backward pass, so whatever feeds a block sees the whole gradient.

**The qkv rows.** ``charlm.Block`` stores its fused qkv weight as [all q rows; all k rows; all v
rows]. ``ColwiseParallel`` cuts the rows into ``tp`` contiguous chunks, which would hand rank 0
the q rows of every head and rank 1 a mix of k and v. So the weight is stored head-major here,
[head 0: q, k, v; head 1: q, k, v; ...] (Megatron's layout), and a contiguous chunk is whole
heads, for any ``tp`` that divides ``n_head``. The permutation is applied once to the model that
``charlm.TinyGPT`` builds from the seed, so a 1 x 1 grid computes exactly charlm's function, and
Newton-Schulz, which commutes with permuting a matrix's rows, orthogonalises the same matrix up
to that permutation.

The optimizer reads the placements (``muongrid/placements.py``): the four block matrices arrive as
DTensors with ``tp_split_dim`` 0 or 1, everything else as plain tensors with -1.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .charlm import Block, TinyGPT

TP_PLAN_NOTE = "qkv, fc: ColwiseParallel (Shard(0)); proj, out: RowwiseParallel (Shard(1)); the rest replicated"


def head_major_rows(n_head: int, d: int) -> torch.Tensor:
    """Row order that turns a [q; k; v] qkv weight (3d rows) into [head 0: q k v; head 1: q k v; ...]."""
    hd = d // n_head
    return torch.arange(3 * d).view(3, n_head, hd).transpose(0, 1).reshape(-1)


class HeadMajorBlock(Block):
    """``charlm.Block`` with its qkv rows head-major, so that any contiguous chunk of rows is whole heads.

    The forward pass takes the head count from what the qkv layer returns (n_head / tp heads on a
    TP rank), so the same code runs whole or tensor-parallel."""

    def forward(self, x):
        B, T, D = x.shape
        hd = D // self.n_head
        qkv = self.qkv(self.norm1(x))                                  # (B, T, 3 * local heads * hd)
        q, k, v = qkv.view(B, T, -1, 3, hd).permute(3, 0, 2, 1, 4)     # each (B, local heads, T, hd)
        if self.logit_hook is not None:
            self.logit_hook(q, k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.norm2(x))))


def head_major_gpt(vocab_size: int, d: int = 128, n_layer: int = 2, n_head: int = 4, context: int = 64) -> TinyGPT:
    """``charlm.TinyGPT`` (initialised from the current RNG state) with head-major blocks: the same function."""
    model = TinyGPT(vocab_size, d=d, n_layer=n_layer, n_head=n_head, context=context)
    rows = head_major_rows(n_head, d)
    for i, old in enumerate(model.blocks):
        new = HeadMajorBlock(d, n_head)
        state = old.state_dict()
        state["qkv.weight"] = state["qkv.weight"][rows].clone()
        new.load_state_dict(state)
        model.blocks[i] = new
    return model


def tp_plan(n_layer: int) -> dict:
    """``parallelize_module``'s plan for the blocks (module path -> ParallelStyle)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {}
    for i in range(n_layer):
        plan.update({f"blocks.{i}.qkv": ColwiseParallel(), f"blocks.{i}.proj": RowwiseParallel(),
                     f"blocks.{i}.fc": ColwiseParallel(), f"blocks.{i}.out": RowwiseParallel()})
    return plan


def tp_gpt(vocab_size: int, grid, d: int = 128, n_layer: int = 2, n_head: int = 4, context: int = 64,
           seed: int = 0) -> TinyGPT:
    """The tiny GPT, seeded the same on every rank, tensor-parallel over ``grid.mesh["tp"]``."""
    from torch.distributed.tensor.parallel import parallelize_module

    if n_head % grid.tp or d % n_head:
        raise ValueError(f"n_head={n_head} must divide by tp={grid.tp}, and d={d} by n_head "
                         "(each TP rank runs whole attention heads)")
    torch.manual_seed(seed)
    model = head_major_gpt(vocab_size, d=d, n_layer=n_layer, n_head=n_head, context=context).to(grid.device)
    if grid.mesh is None:  # Grid.single(): one process, nothing to split
        return model
    return parallelize_module(model, grid.mesh["tp"], tp_plan(n_layer))
