"""Moving tensors according to a plan: TP shard/unshard, packing buckets, and taking a rank's DP shard.

    tp_shard      <->  tp_unshard        (a matrix <-> this TP rank's slice along tp_split_dim)
    pack_bucket   <->  unpack_bucket     (the bucket's parameters <-> dp padded shards laid end to end)
    bucket_matrix, dp_shard_of           (one parameter of a gathered bucket as a matrix; my flat part of it)

A flat bucket is what the DP collectives move: shard ``r`` at offset ``r * shard_numel``, zero-padded
(``Bucket.segments`` does the arithmetic; chapter 4). Shapes are restored with ``.view(meta.shape)``: the
proof of concept's second bug was a flat ``.view(-1)`` reaching Newton-Schulz. ``pytest tests/test_plan.py``.
"""
from __future__ import annotations

import torch

from .plan import Bucket, DistMeta, Plan, tp_local_shape


def tp_shard(full: torch.Tensor, tp_split_dim: int, tp: int, tp_rank: int, name: str = "tensor") -> torch.Tensor:
    """This TP rank's contiguous slice of ``full`` along ``tp_split_dim`` (-1: the whole tensor)."""
    tp_local_shape(name, tuple(full.shape), tp_split_dim, tp)  # validates divisibility
    if tp_split_dim == -1 or tp == 1:
        return full.clone()
    return full.chunk(tp, dim=tp_split_dim)[tp_rank].contiguous()


def tp_unshard(gathered: torch.Tensor, meta: DistMeta, tp: int) -> torch.Tensor:
    """Rebuild the full matrix from a TP all-gather: ``tp`` flat shards of
    ``meta.shape``, joined on the split dim."""
    return torch.cat(gathered.view(tp, *meta.shape).unbind(0), dim=meta.tp_split_dim)


def pack_bucket(tensors: list[torch.Tensor], bucket: Bucket, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The bucket's tensors as one zero-padded flat tensor of ``bucket.padded_numel`` (see above)."""
    first = tensors[bucket.param_indices[0]]
    flat = torch.zeros(bucket.padded_numel, dtype=dtype or first.dtype, device=first.device)
    offset = 0
    for i in bucket.param_indices:
        t = tensors[i].reshape(-1)
        for src, n, dst in bucket.segments(offset, offset + t.numel()):
            flat[dst: dst + n] = t[src: src + n]
        offset += t.numel()
    return flat


def unpack_bucket(flat: torch.Tensor, bucket: Bucket, metas: list[DistMeta], tensors: list[torch.Tensor]) -> None:
    """Copy a full flat bucket back into the tensors it holds (casting to each tensor's dtype)."""
    for i in bucket.param_indices:
        tensors[i].copy_(bucket_matrix(flat, bucket, metas[i]))


def bucket_matrix(flat: torch.Tensor, bucket: Bucket, meta: DistMeta) -> torch.Tensor:
    """One parameter's elements of a full flat bucket, as its TP-local matrix (a
    view with equal shards)."""
    lo = meta.global_range[0] - bucket.start
    parts = [flat[dst: dst + n] for _, n, dst in bucket.segments(lo, lo + meta.numel)]
    return (parts[0] if len(parts) == 1 else torch.cat(parts)).view(meta.shape)


def dp_shard_of(matrix: torch.Tensor, meta: DistMeta) -> torch.Tensor:
    """The flat part of a TP-local matrix that this DP rank owns
    (``meta.local_range``)."""
    return matrix.reshape(-1)[meta.param_slice]


def copy_all(dsts: list, srcs: list, zeros: list = ()) -> None:
    """``srcs`` into ``dsts`` and zeros into ``zeros``, one foreach call each (the cast included)."""
    if dsts:
        torch._foreach_copy_(dsts, srcs)
    if zeros:
        torch._foreach_zero_(zeros)


def local_shard(flat_shard: torch.Tensor, plan: Plan, meta: DistMeta) -> torch.Tensor:
    """The view of a rank's bucket shard that holds ``meta``'s owned elements."""
    return flat_shard[plan.shard_slice(meta)]
