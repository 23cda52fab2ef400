"""Closed-form communication of one optimizer step, per rank, as functions of shapes, DP, TP and dtypes.

Ring collectives over ``n`` ranks move ``(n - 1) * shard`` elements per rank for an all-gather or
a reduce-scatter. For each bucket of ``P`` TP-local elements (``P`` padded up to a multiple of
``dp``; shard ``s = P / dp``):

    grad reduce-scatter (fp32)     (dp - 1) * s * 4          both optimizers
    param all-gather     (fp32)    (dp - 1) * s * 4          both optimizers
    NS gather over DP    (bf16)    (dp - 1) * s * 2          Muon buckets only
    NS gather over TP    (bf16)    (tp - 1) * m * 2          Muon, per matrix split over TP (m: its TP-local size)

So on a DP-only grid a Muon bucket costs (4 + 2 + 4) / (4 + 4) = 1.25 x an AdamW bucket, the
paper's upper bound, exactly, padding or not: the DP gather is whole-bucket here (the proof of
concept's layout). TP adds its gathers on top, which AdamW never needs (its update is
elementwise on each shard).

Nothing here reads the ledger: tests check that the ledger, counted at run time from the tensors
that really went through ``comm.Comm``, equals this.
"""
from __future__ import annotations

from .plan import split_into_buckets, tp_local_shape

GRAD_BYTES, NS_BYTES, PARAM_BYTES = 4, 2, 4


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def step_bytes(groups: list[dict], dp: int, tp: int, bucket_numel: int | None, muon: bool = True) -> dict:
    """Bytes one rank sends per step, by phase.

    ``groups``: dicts with ``shapes`` (full), ``tp_split_dims`` and ``use_muon`` (as in
    ``synthetic.Problem.groups``). ``muon=False`` prices every group as AdamW (the baseline).
    """
    out = dict(grad_reduce_scatter=0, ns_gather_dp=0, ns_gather_tp=0, param_all_gather=0)
    for g in groups:
        local = [_numel(tp_local_shape("p", s, d, tp)) for s, d in zip(g["shapes"], g["tp_split_dims"])]
        for members in split_into_buckets(local, bucket_numel):
            shard = -(-sum(local[i] for i in members) // dp)
            out["grad_reduce_scatter"] += (dp - 1) * shard * GRAD_BYTES
            out["param_all_gather"] += (dp - 1) * shard * PARAM_BYTES
            if muon and g["use_muon"]:
                out["ns_gather_dp"] += (dp - 1) * shard * NS_BYTES
                out["ns_gather_tp"] += sum((tp - 1) * local[i] * NS_BYTES
                                           for i in members if g["tp_split_dims"][i] != -1 and tp > 1)
    out["total"] = sum(out.values())
    return out


def bytes_ratio(groups: list[dict], dp: int, tp: int, bucket_numel: int | None) -> float | None:
    """Muon / AdamW bytes per step (None when AdamW moves nothing, e.g. dp = 1)."""
    adamw = step_bytes(groups, dp, tp, bucket_numel, muon=False)["total"]
    return step_bytes(groups, dp, tp, bucket_numel)["total"] / adamw if adamw else None
