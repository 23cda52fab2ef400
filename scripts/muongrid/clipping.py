"""Gradient clipping by global norm for ZeRO-1 and FSDP2: ``opt.clip_grad_norm_(max_norm, norm_type=2.0)``.

Why the optimizer does it. Under DDP a user clips after ``backward()``, when ``.grad`` already holds
the DP mean. Under ZeRO-1 (``DistributedMuon``, ``DistributedAdamW``) the mean is taken inside
``step()`` (a reduce-scatter), so ``torch.nn.utils.clip_grad_norm_`` between ``backward()`` and
``step()`` would see one rank's own gradient. ``opt.clip_grad_norm_`` therefore runs the step's
reduce-scatter early, computes the norm of the mean gradient over every rank's shards and scales the
shards that ``step()`` then uses (the convention of FSDP's ``clip_grad_norm_``). FSDP2 already leaves
``.grad`` as the mean, placed in blocks; ``FSDPMuon.clip_grad_norm_`` scales those blocks in place. The
optimizers' ``clip_grad_norm_`` methods call ``clip_zero1_`` and ``clip_fsdp_``; nothing here runs in ``step()``.

Counting each element once: DP shards are disjoint; a TP-split matrix's TP shards are disjoint; a
matrix replicated over TP is held by every TP rank, so only TP rank 0 counts it. The partial sums
(of ``|g|**p`` in float64, or the max for ``inf``) meet in one all-reduce over the world.

Numbers. The squares of fp32 values are exact in float64 and their sum is rounded at ~1e-16, far
below fp32's 6e-8, so the total norm rounded to fp32 does not depend on how the elements are split
over ranks: every grid gives the norm that ``total_norm`` gives on one device (``tests/test_contract.py``
asserts it bit for bit, and within 1e-6 of ``torch.nn.utils.get_total_norm``, whose per-tensor fp32
norms round differently). The scaling is torch's, op for op: ``coef = max_norm / (total + 1e-6)``,
clamped to 1, multiplied into the fp32 mean gradient; so given the same total norm the clipped
gradient equals ``torch.nn.utils.clip_grads_with_norm_``'s bit for bit.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .placements import local


def _partial(tensors: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    """This rank's part: sum of |x|**p (float64), or the max of |x| for p = inf."""
    if math.isinf(norm_type):
        return torch.stack([t.abs().max().to(torch.float64) for t in tensors if t.numel()] or
                           [torch.zeros((), dtype=torch.float64)]).max()
    total = torch.zeros((), dtype=torch.float64)
    for t in tensors:
        x = t.to(torch.float64).abs()
        total = total + (x.square().sum() if norm_type == 2.0 else x.pow(norm_type).sum())
    return total


def _finish(partial: torch.Tensor, norm_type: float, dtype: torch.dtype) -> torch.Tensor:
    if math.isinf(norm_type):
        return partial.to(dtype)
    return (partial.sqrt() if norm_type == 2.0 else partial.pow(1.0 / norm_type)).to(dtype)


def _check(max_norm, norm_type) -> float:
    norm_type = float(norm_type)
    if not (norm_type > 0 or math.isinf(norm_type)) or math.isnan(norm_type):
        raise ValueError(f"norm_type must be positive or inf, got {norm_type}")
    if not float(max_norm) >= 0:
        raise ValueError(f"max_norm must be >= 0, got {max_norm}")
    return norm_type


def _all_reduce(partial: torch.Tensor, comm, norm_type: float) -> torch.Tensor:
    """Through ``comm`` (timeout watchdog, clear errors), phase "grad_norm": not one of the step's phases,
    so the ledger's summaries (the algorithm's bytes) leave it out."""
    if comm.grid.dp * comm.grid.tp > 1:
        partial = comm.all_reduce(partial.to(comm.grid.device), "world", "grad_norm",
                                  op=dist.ReduceOp.MAX if math.isinf(norm_type) else dist.ReduceOp.SUM)
    return partial   # on the device, as torch's clip_grad_norm_ returns it: no host sync


def _scale(tensors: list[torch.Tensor], max_norm: float, total: torch.Tensor) -> None:
    """torch's clip_grads_with_norm_, op for op: grads *= min(max_norm / (total + 1e-6), 1)."""
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
    for t in tensors:
        t.mul_(coef.to(t.device))


def _nonfinite(total: torch.Tensor, norm_type: float, error_if_nonfinite: bool) -> None:
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(f"the total norm of order {norm_type} of the gradients is non-finite, so it cannot be "
                           "clipped; nothing was changed. Pass error_if_nonfinite=False to scale anyway")


def total_norm(tensors, norm_type: float = 2.0) -> torch.Tensor:
    """The global norm of ``tensors`` on one device, as the distributed optimizers compute it (the reference)."""
    tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    norm_type = _check(0.0, norm_type)
    return _finish(_partial(tensors, norm_type), norm_type, tensors[0].dtype if tensors else torch.float32)


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Single-device clipping with the distributed optimizers' norm (the reference they are tested against)."""
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    total = total_norm(grads, norm_type)
    _scale(grads, max_norm, total)
    return total


def clip_zero1_(opt, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False) -> torch.Tensor:
    """``DistributedMuon`` / ``DistributedAdamW``: reduce-scatter now (the step's own, cached), norm of the
    mean over every rank's pieces, scale the pieces ``step()`` will use. Where the step reduces, those are this
    rank's reduced shard, scaled in place; with one DP rank or ``grad_reduce="ddp"`` they are views of ``p.grad``,
    so they are replaced by scaled copies and ``p.grad`` is left as it is."""
    if getattr(opt.grid, "ep", 1) > 1:
        raise ValueError("this optimizer runs on an expert grid (grid.expert(ep)): its gradients are one expert "
                         "slice's, so their norm is not the model's; clip every optimizer of the model together "
                         "with muongrid.clipping.clip_together_([dense_opt, expert_opt], max_norm)")
    return clip_together_([opt], max_norm, norm_type, error_if_nonfinite)


def clip_together_(opts: list, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False):
    """One global-norm clip over the ZeRO-1 optimizers of one model: a dense one on the job's grid and expert
    ones on ``grid.expert(ep)``. Every rank holds its own shards of each, and every element is counted on
    exactly one rank (an expert slice's elements by the ranks of its grid), so one all-reduce of the summed
    partials over the job's grid (the first optimizer's, which must not be an expert grid) is the model's norm."""
    norm_type = _check(max_norm, norm_type)
    if getattr(opts[0].grid, "ep", 1) != 1:
        raise ValueError("clip_together_: the first optimizer must run on the job's grid (not grid.expert(ep))")
    from .contract import prepare_together
    steps = prepare_together(opts)   # every optimizer votes before anything changes; "defer": one verdict for all
    rows, counted = [], []
    for opt, step in zip(opts, steps):
        for g in range(len(opt.param_groups)):
            for bucket in opt.plan.buckets[g]:
                grads = opt.store.grad_pieces(g, bucket, step, opt.options.trace)
                rows.append((opt, step, (g, bucket.bucket_idx), grads))
                for grad, i in zip(grads, bucket.param_indices):
                    meta = opt.plan.metas[g][i]
                    if grad is not None and grad.numel() and (meta.tp_split_dim != -1 or opt.grid.tp_rank == 0):
                        counted.append(grad)
    dtypes = [d for opt in opts for d in opt.master_dtypes]
    dtype = torch.float64 if dtypes and all(d == torch.float64 for d in dtypes) else torch.float32
    total = _finish(_all_reduce(_partial(counted, norm_type), opts[0].comm, norm_type), norm_type, dtype)
    _nonfinite(total, norm_type, error_if_nonfinite)
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
    for opt, step, key, grads in rows:
        live = [g for g in grads if g is not None and g.numel()]
        if not live:
            continue
        if opt.store.reduces:   # this rank's reduced shard: the optimizer's own, scaled in place
            _scale(live, max_norm, total)
            continue
        scaled = iter(torch._foreach_mul(live, coef.to(opt.grid.device)))   # p.grad itself: scaled copies
        step.grads[key] = [next(scaled) if g is not None and g.numel() else g for g in grads]
    return total


def _tp_replicated(p) -> bool:
    names = tuple(p.device_mesh.mesh_dim_names or ())
    if "tp" not in names:
        return True  # an FSDP2 parameter on the "dp" mesh only: every TP rank holds its own copy
    from torch.distributed.tensor import Replicate
    return isinstance(p.placements[names.index("tp")], Replicate)


def clip_fsdp_(opt, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False) -> torch.Tensor:
    """``FSDPMuon``: FSDP2's gradients are already the DP mean, in blocks; scale them in place."""
    norm_type = _check(max_norm, norm_type)
    params = [p for group in opt.param_groups for p in group["params"] if p.grad is not None]
    blocks = [local(p.grad) for p in params]
    counted = [b for p, b in zip(params, blocks) if opt.grid.tp == 1 or not _tp_replicated(p) or opt.grid.tp_rank == 0]
    total = _finish(_all_reduce(_partial(counted, norm_type), opt.comm, norm_type),
                    norm_type, blocks[0].dtype if blocks else torch.float32)
    _nonfinite(total, norm_type, error_if_nonfinite)
    _scale(blocks, max_norm, total)
    return total
