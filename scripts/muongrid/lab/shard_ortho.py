"""Orthogonalising each shard instead of the matrix: a shortcut some sharded Muon ports take, measured.

Under FSDP2 a rank holds a block of rows of each matrix (``Shard(0)``, cut as ``torch.chunk`` cuts); under
tensor parallelism a block of rows or of columns. Muon's update is Newton-Schulz on the *whole* momentum
matrix. Running Newton-Schulz on each rank's block as if it were the matrix needs no communication (no
gather to an owner, nothing back), but it is another optimizer: the blocks of an orthogonalised matrix are
not the orthogonalised blocks (each block's singular vectors are its own, not the matrix's). Chapter 11
measures how different the update is, and what it does to a short training of the tiny GPT.

    from muongrid.lab.shard_ortho import ShardMuonW, relative_difference
    relative_difference(momentum, shards=4, dim=0)     # |shard update - Muon's| / |Muon's|
    opt = ShardMuonW(hybrid_param_groups(model), shards=4, dim=0, lr=3e-3)   # train with the shortcut

Each block is treated as the optimizer treats a matrix: Newton-Schulz on the block, and the learning rate
adjusted for the block's shape (``updates.adjust_lr``), as an optimizer that is handed the local shard sees
it. With ``shards=1`` both are Muon, bit for bit (``tests/test_shard_ortho.py``).
"""
from __future__ import annotations

import torch

from ..newton_schulz import zeropower_ns5
from ..optim import MuonW
from ..updates import adjust_lr


def blocks(matrix: torch.Tensor, shards: int, dim: int) -> tuple[torch.Tensor, ...]:
    """``matrix`` cut into ``shards`` blocks along ``dim`` as FSDP2 and DTensor's ``Shard(dim)`` cut it
    (``torch.chunk``: equal blocks of ``ceil(size / shards)``, the last one shorter): views."""
    if dim not in (0, 1) or matrix.ndim != 2:
        raise ValueError(f"blocks of a 2-D matrix are cut along dim 0 (rows) or 1 (columns); got dim={dim} "
                         f"for a tensor of shape {tuple(matrix.shape)}")
    if not 1 <= shards <= matrix.shape[dim]:
        raise ValueError(f"cannot cut {matrix.shape[dim]} {('rows', 'columns')[dim]} into {shards} shards: "
                         f"give 1 to {matrix.shape[dim]}")
    return torch.chunk(matrix, shards, dim)


def muon_direction(update: torch.Tensor, adjust: str = "match_rms_adamw", **ns) -> torch.Tensor:
    """What one Muon step subtracts from a matrix per unit of learning rate: Newton-Schulz of ``update``
    (fp32), times the matrix's lr adjustment. ``ns``: ``zeropower_ns5``'s keywords."""
    return zeropower_ns5(update, **ns).float() * adjust_lr(1.0, tuple(update.shape), adjust)


def shard_direction(update: torch.Tensor, shards: int, dim: int = 0, adjust: str = "match_rms_adamw",
                    **ns) -> torch.Tensor:
    """The same with each of ``shards`` blocks (``blocks``) taken as the matrix, put back together."""
    return torch.cat([muon_direction(b, adjust, **ns) for b in blocks(update, shards, dim)], dim)


def relative_difference(update: torch.Tensor, shards: int, dim: int = 0, **kw) -> float:
    """``|shard_direction - muon_direction| / |muon_direction|`` (Frobenius norms): 0 for one shard."""
    whole = muon_direction(update, **kw)
    return float((shard_direction(update, shards, dim, **kw) - whole).norm() / whole.norm())


class ShardMuonW(MuonW):
    """``MuonW`` whose Muon step orthogonalises each of ``shards`` blocks of a matrix (cut along ``dim``) on its
    own, with the lr adjusted for the block: what each rank computes when it runs Muon on its shard alone.
    Momentum, weight decay and the AdamW groups are ``MuonW``'s; one process, no communication."""

    def __init__(self, params, shards: int, dim: int = 0, **hyper):
        super().__init__(params, **hyper)
        for group in self.param_groups:
            for p in group["params"] if group["use_muon"] else ():
                blocks(p.detach(), shards, dim)   # refuses a cut the matrix cannot take, before any step
        self.shards, self.dim = shards, dim

    def _orthogonalised_update(self, p: torch.Tensor, update: torch.Tensor, group: dict) -> None:
        for block, piece in zip(blocks(p, self.shards, self.dim), blocks(update, self.shards, self.dim)):
            super()._orthogonalised_update(block, piece, group)
