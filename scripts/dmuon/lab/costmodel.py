"""Closed-form communication of one optimizer step, per rank: bytes, and time under an alpha-beta model.

Ring collectives over ``n`` ranks move ``(n - 1) * shard`` elements per rank for an all-gather or
a reduce-scatter. For each bucket of ``P`` TP-local elements (``P`` padded up to a multiple of
``dp``; shard ``s = P / dp``):

    grad reduce-scatter (fp32)     (dp - 1) * s * 4          both optimizers
    param all-gather     (fp32)    (dp - 1) * s * 4          both optimizers
    NS gather over DP    (bf16)    (dp - 1) * s * 2          Muon buckets only
    NS gather over TP    (bf16)    (tp - 1) * m * 2          Muon, per matrix split over TP (m: its TP-local size)

So on a DP-only grid a Muon bucket costs (4 + 2 + 4) / (4 + 4) = 1.25 x an AdamW bucket, the
paper's upper bound, exactly, padding or not: the DP gather is whole-bucket here (the proof of
concept's layout). ``dp_gather_bytes`` prices two other layouts: gathering only the matrices that
straddle a shard boundary, and giving every matrix one owner (no DP gather: the ratio's lower
limit, 1). TP adds its gathers on top, which AdamW never needs (its update is elementwise).

Time: a ring collective over ``n`` ranks takes ``(n - 1) * (alpha + shard_bytes / beta)``
(``alpha`` the per-hop latency, ``beta`` the bandwidth); an all-reduce twice that. Gloo runs a
reduce-scatter as an all-reduce of the whole input, so ``gloo_reduce_scatter=True`` prices it so.

Nothing here reads the ledger: tests check that the ledger, counted at run time from the tensors
that really went through ``comm.Comm``, equals this.
"""
from __future__ import annotations

import math

from ..plan import split_into_buckets, tp_local_shape

GRAD_BYTES, NS_BYTES, PARAM_BYTES = 4, 2, 4
LAYOUTS = ("bucket", "straddlers", "owner")


def _buckets(group: dict, dp: int, tp: int, bucket_numel: int | None):
    """For each bucket of ``group``: (TP-local sizes of the group's matrices, the bucket's members, its shard)."""
    local = [math.prod(tp_local_shape("p", s, d, tp)) for s, d in zip(group["shapes"], group["tp_split_dims"])]
    for members in split_into_buckets(local, bucket_numel):
        yield local, members, -(-sum(local[i] for i in members) // dp)


def step_calls(groups: list[dict], dp: int, tp: int, bucket_numel: int | None, muon: bool = True):
    """Every collective of one step: (phase, op, group, ranks, shard elements, bytes per element).

    ``groups``: dicts with ``shapes`` (full), ``tp_split_dims`` and ``use_muon`` (as in
    ``synthetic.Problem.groups``). ``muon=False`` prices every group as AdamW (the baseline).
    """
    for g in groups:
        for local, members, shard in _buckets(g, dp, tp, bucket_numel):
            yield "grad_reduce_scatter", "reduce_scatter", "dp", dp, shard, GRAD_BYTES
            if muon and g["use_muon"]:
                yield "ns_gather_dp", "all_gather", "dp", dp, shard, NS_BYTES
                for i in members:
                    if g["tp_split_dims"][i] != -1 and tp > 1:
                        yield "ns_gather_tp", "all_gather", "tp", tp, local[i], NS_BYTES
            yield "param_all_gather", "all_gather", "dp", dp, shard, PARAM_BYTES


def step_bytes(groups: list[dict], dp: int, tp: int, bucket_numel: int | None, muon: bool = True) -> dict:
    """Bytes one rank sends per step, by phase, and their total."""
    out = dict(grad_reduce_scatter=0, ns_gather_dp=0, ns_gather_tp=0, param_all_gather=0)
    for phase, _, _, n, shard, size in step_calls(groups, dp, tp, bucket_numel, muon):
        out[phase] += (n - 1) * shard * size
    out["total"] = sum(out.values())
    return out


def bytes_ratio(groups: list[dict], dp: int, tp: int, bucket_numel: int | None) -> float | None:
    """Muon / AdamW bytes per step (None when AdamW moves nothing, e.g. dp = 1)."""
    adamw = step_bytes(groups, dp, tp, bucket_numel, muon=False)["total"]
    return step_bytes(groups, dp, tp, bucket_numel)["total"] / adamw if adamw else None


def dp_gather_bytes(groups: list[dict], dp: int, tp: int, bucket_numel: int | None, layout: str = "bucket") -> float:
    """Bytes per rank (averaged over the DP ranks) that Muon's DP gather needs under ``layout``.

    "bucket": every rank gathers every whole bucket (the proof of concept; what this code runs).
    "straddlers": only a matrix split between ``k > 1`` DP ranks is gathered, by those ``k`` ranks:
    together they receive ``(k - 1) * m`` elements. "owner": shard boundaries on matrix boundaries,
    so nothing is gathered (and Newton-Schulz runs once per matrix).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}")
    if layout == "owner" or dp == 1:
        return 0.0
    total = 0.0
    for g in (g for g in groups if g["use_muon"]):
        for local, members, shard in _buckets(g, dp, tp, bucket_numel):
            if layout == "bucket":
                total += (dp - 1) * shard * NS_BYTES
                continue
            start = 0
            for i in members:
                end = start + local[i]
                owners = sum(max(start, r * shard) < min(end, (r + 1) * shard) for r in range(dp))
                total += (owners - 1) * local[i] * NS_BYTES / dp
                start = end
    return total


def collective_seconds(op: str, n: int, shard_bytes: float, alpha: float, beta: float) -> float:
    """Ring time of one collective: (n - 1) hops of latency ``alpha`` (s) and ``shard_bytes / beta``."""
    if n == 1:
        return 0.0
    hops = 2 * (n - 1) if op == "all_reduce" else n - 1
    return hops * (alpha + shard_bytes / beta)


def step_seconds(groups: list[dict], dp: int, tp: int, bucket_numel: int | None, links: dict, muon: bool = True,
                 gloo_reduce_scatter: bool = False) -> dict:
    """Predicted communication seconds per step, by phase. ``links``: {"dp": (alpha, beta), "tp": (alpha, beta)}."""
    out = dict(grad_reduce_scatter=0.0, ns_gather_dp=0.0, ns_gather_tp=0.0, param_all_gather=0.0)
    for phase, op, group, n, shard, size in step_calls(groups, dp, tp, bucket_numel, muon):
        if op == "reduce_scatter" and gloo_reduce_scatter:
            op = "all_reduce"
        out[phase] += collective_seconds(op, n, shard * size, *links[group])
    out["total"] = sum(out.values())
    return out


def fit_alpha_beta(samples: list[tuple[int, float, float]]) -> tuple[float, float]:
    """Least-squares (alpha, beta) from all-gather timings: samples of (ranks, shard bytes, seconds).

    Both constants are kept physical (alpha >= 0, beta > 0). When the samples cannot resolve the
    bandwidth (too small, too noisy: the best slope is not positive), beta is ``inf`` and alpha
    alone fits them.
    """
    import torch

    X = torch.tensor([[n - 1, (n - 1) * b] for n, b, _ in samples], dtype=torch.float64)
    y = torch.tensor([t for _, _, t in samples], dtype=torch.float64)
    alpha, inv_beta = torch.linalg.lstsq(X, y.unsqueeze(1)).solution.squeeze(1).tolist()
    if inv_beta <= 0:  # latency only
        return max(float(X[:, 0] @ y / (X[:, 0] @ X[:, 0])), 0.0), float("inf")
    if alpha < 0:  # bandwidth only
        return 0.0, float(X[:, 1] @ X[:, 1] / (X[:, 1] @ y))
    return alpha, 1.0 / inv_beta


def links_for_grid(dp: int, tp: int, gpus_per_node: int, intra: tuple[float, float],
                   inter: tuple[float, float]) -> dict:
    """Which (alpha, beta) each group's ring runs on, for ranks laid out TP-fastest on nodes.

    A TP group is ``tp`` consecutive ranks: inside one node if ``tp <= gpus_per_node``. A DP group
    takes one rank from each replica: it crosses nodes as soon as ``dp * tp > gpus_per_node``, and a
    ring is as slow as its slowest link.
    """
    return {"tp": intra if tp <= gpus_per_node else inter, "dp": intra if dp * tp <= gpus_per_node else inter}
