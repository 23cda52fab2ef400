"""What a ZeRO-1 optimizer is built with: layout defaults and the checks made once, when it is built (not the step).

``ZeroOneOptimizer`` (``distributed.py``) calls these from its constructor; nothing here runs inside ``step()``.
Chapter 8 says what the layouts and the overlap modes are for.

    python -m pytest -q tests/test_optim_api.py tests/test_agree.py
"""
from __future__ import annotations

import hashlib

import torch

from .placements import is_dtensor
from .plan import ParamSpec, disagreement


def default_ns_batch(layout: str, device: torch.device) -> bool:
    """Batch Newton-Schulz by shape on a GPU (one call instead of a launch per matrix: GPT-2's step on one H100
    fell from 52.9 to 28.8 ms, chapter 14); not on a CPU, where it gains nothing, nor under "bucket", which cannot.
    A batched call may round differently from single ones: a bit-for-bit reference must batch alike."""
    return layout != "bucket" and device.type == "cuda"


def default_overlap(layout: str) -> str:
    """"none" for "bucket" (as the proof of concept ran); "prefetch" for the owner layouts, whose ranks would
    otherwise take turns at Newton-Schulz (each exchange waits for its busiest owner)."""
    return "none" if layout == "bucket" else "prefetch"


GRAD_REDUCE = ("step", "ddp", "backward")   # where the gradients are averaged over DP: inside step(), by DDP
# before it, or by this optimizer from backward's hooks (reducer.py)


def default_layout(grad_reduce: str) -> str:
    """"owner" when ``step()`` averages the gradients; "aligned" under DDP, whose averaged gradient is whole on
    every rank: a shard cut on matrix boundaries then holds whole matrices, and nothing travels for Newton-Schulz."""
    return "aligned" if grad_reduce == "ddp" else "owner"


def check_grad_reduce(grad_reduce, layout: str, grid) -> None:
    """``grad_reduce`` names where gradients are averaged; "ddp" needs the aligned layout and a DP-only grid."""
    if grad_reduce not in GRAD_REDUCE:
        raise ValueError(f"grad_reduce must be one of {GRAD_REDUCE} (where the gradients are averaged over the "
                         f"data-parallel ranks: inside step(), by DistributedDataParallel, or launched from "
                         f"backward as each bucket's gradients land), got {grad_reduce!r}")
    if grad_reduce != "ddp":
        return
    if layout != "aligned":
        raise ValueError(f"grad_reduce='ddp' takes layout='aligned' (its default: whole matrices on the rank that "
                         f"holds their averaged gradient, so nothing is exchanged), not layout={layout!r}")
    if grid.tp > 1 or getattr(grid, "ep", 1) > 1:
        raise ValueError(f"grad_reduce='ddp' needs a data-parallel grid (tp=1, no expert slices), got dp={grid.dp}, "
                         f"tp={grid.tp}: DistributedDataParallel averages every gradient over all the ranks it "
                         "spans and knows nothing of TP shards. For DP x TP, leave the model unwrapped and keep "
                         "grad_reduce='step' (the optimizer averages over the dp group inside step())")


def check_layout(layout: str, grid, ns_batch: bool) -> None:
    if layout == "group" and getattr(grid, "ep", 1) > 1:
        raise ValueError("layout='group' on an expert grid (grid.expert(ep)) is not supported: its Newton-Schulz "
                         "groups are made by every rank of the job; use 'owner' or 'aligned' for expert groups")
    if ns_batch and layout == "bucket":
        raise ValueError("ns_batch=True batches same-shape matrices on their owner: it needs layout='owner', "
                         "'aligned' or 'group' (the bucket layout orthogonalises every matrix on every rank)")


def check_banks(group: dict) -> None:
    """A bank (a 3-D Muon parameter) is whole on every TP rank."""
    for name, p, dim in zip(group["names"], group["params"], group["tp_split_dims"]):
        if group["use_muon"] and p.ndim == 3 and dim != -1:
            raise ValueError(f"parameter {name!r} is a bank of {p.shape[0]} matrices split over TP (dimension "
                             f"{dim}); a bank must be whole on every TP rank (tp_split_dims -1): split its "
                             "experts over ranks instead (expert parallelism, not yet here)")


def full_shape(p: torch.Tensor, tp_split_dim: int, tp: int) -> tuple[int, ...]:
    """The whole (global) shape of a TP-local parameter; a DTensor's shape is already the whole one."""
    if is_dtensor(p):
        return tuple(p.shape)
    shape = list(p.shape)
    if tp_split_dim != -1:
        if not 0 <= tp_split_dim < len(shape):
            raise ValueError(f"tp_split_dim {tp_split_dim} is not a dimension of a {tuple(shape)} parameter")
        shape[tp_split_dim] *= tp
    return tuple(shape)


def param_specs(group: dict, tp: int) -> list[ParamSpec]:
    """What the plan is built from: each parameter's name, whole shape and TP split."""
    return [ParamSpec(n, full_shape(p, d, tp), d) for n, p, d in zip(group["names"], group["params"],
                                                                      group["tp_split_dims"])]


def master_dtype(group: dict, g_idx: int) -> torch.dtype:
    """fp64 for a group of float64 parameters (kept float64, as torch keeps them), fp32 otherwise."""
    dtypes = {p.dtype for p in group["params"]}
    if torch.float64 in dtypes and len(dtypes) > 1:
        others = sorted(str(d)[6:] for d in dtypes - {torch.float64})
        raise ValueError(f"group {g_idx} mixes float64 parameters with {others}; "
                         "ZeRO-1 keeps one master dtype per group: put the float64 parameters in a group of their own")
    return torch.float64 if dtypes == {torch.float64} else torch.float32


def check_ranks_agree(comm, key: dict) -> None:
    """One small all-gather when the optimizer is built: every rank must plan the same parameters (a rank with
    another model would hang or corrupt the first collective instead). What travels is a hash of the plan's
    key; the whole keys only when the hashes differ, to say where."""
    digest = hashlib.sha256(repr(key).encode()).hexdigest()
    if len(set(comm.gather_objects(digest, "setup"))) == 1:
        return
    problem = disagreement(comm.gather_objects(key, "setup"))
    if problem and problem.startswith("the hardware profile"):
        raise ValueError(problem)
    if problem:
        raise ValueError(f"the ranks disagree about the parameters they optimize: {problem}. Every rank "
                         "must build the same model (TP-local shapes aside) and the same parameter groups")
