"""What each ZeRO-1 layout costs, per rank and per step, from the plan and the closed forms alone.

Chapter 13 ("What to pick and what it costs") shows these tables; nothing here runs a collective or
a kernel. For a set of Muon matrices on a ``dp x tp`` grid, each layout's row gives:

- bytes each rank sends per step (mean over the ranks), and that over AdamW's on the same plan
  (``costmodel.step_bytes`` / ``bytes_ratio``: the formulas the ledger is tested against);
- how many ranks run Newton-Schulz on each matrix (bucket: every rank; owner, aligned: one);
- the Newton-Schulz FLOPs of the busiest rank (``ns5_flops`` of the matrices it orthogonalises);
- optimizer state per rank (fp32 master and momentum for the largest shard, padding included);
- the overlap mode the optimizer picks by default (``distributed.default_overlap``).

``fsdp2_extra`` prices what Muon adds under FSDP2 on a DP-only grid (``FSDPMuon``: each matrix's row
blocks to one owner and back, ``fsdp_routes``), beside what the owner layout adds under ZeRO-1; FSDP2's
own gathers and reduce-scatters depend on how it is configured and are left out of both.

    python -m muongrid.lab.choice      # the tables for the proof of concept's shapes and a small stack
"""
from __future__ import annotations

from ..distributed import default_overlap
from ..fsdp_routes import Piece, routes
from ..newton_schulz import ns5_flops
from ..ns_group import sharded_flops
from . import costmodel

STATE_BYTES = 4 + 4  # fp32 master + fp32 momentum per element of a Muon shard


CHAPTER_LAYOUTS = ("bucket", "owner", "aligned")   # chapter 13's table; "group" on request


def layout_costs(groups: list[dict], dp: int, tp: int, bucket_numel: int | None,
                 layouts: tuple[str, ...] = CHAPTER_LAYOUTS) -> list[dict]:
    """One dict per layout of ``layouts`` for Muon groups ``groups`` (``costmodel`` form). Under "group" a
    grouped matrix still runs once (sharded): each member is charged ``ns_group.sharded_flops``."""
    rows = []
    for layout in layouts:
        plans = costmodel.plans_for(groups, dp, tp, bucket_numel, layout)
        sent = costmodel.step_bytes(groups, dp, tp, bucket_numel, layout=layout)
        rows.append(dict(layout=layout, bytes_per_rank=sent["total"],
                         vs_adamw=costmodel.bytes_ratio(groups, dp, tp, bucket_numel, layout),
                         ns_runs_per_matrix=dp * tp if layout == "bucket" else 1,
                         busiest_ns_flops=max(ns_flops_per_rank(plans[0], groups)),
                         state_bytes_per_rank=max(p.local_state_numel() for p in plans) * STATE_BYTES,
                         overlap=default_overlap(layout)))
    return rows


def ns_flops_per_rank(plan, groups: list[dict]) -> list[int]:
    """Each rank's Newton-Schulz FLOPs under ``plan`` (any DP rank's: they share the owners): every matrix on every
    rank under "bucket"; under the owner layouts each owner's matrices, a grouped one shared by its members."""
    metas = [m for g, metas_g in enumerate(plan.metas) if groups[g]["use_muon"] for m in metas_g]
    if plan.layout == "bucket":
        return [sum(ns5_flops(*m.full_shape) for m in metas)] * (plan.dp * plan.tp)
    load = [0] * (plan.dp * plan.tp)
    for m in metas:
        members = plan.group_of(m)
        for r in members or [plan.owner_of(m)]:
            load[r] += sharded_flops(*m.full_shape, len(members), split_b=True) if members else ns5_flops(*m.full_shape)
    return load


def fsdp2_row_pieces(shape: tuple[int, int], dp: int) -> list[Piece]:
    """Each DP rank's block of rows of a ``shape`` matrix under FSDP2's ``Shard(0)``: ``torch.chunk``'s
    split, ``ceil(rows / dp)`` rows per rank, the last ranks fewer (maybe none)."""
    rows, cols = shape
    chunk = -(-rows // dp)
    out = []
    for d in range(dp):
        start = min(rows, d * chunk)
        out.append(Piece((start, 0), (min(rows, start + chunk) - start, cols)))
    return out


def fsdp2_extra(shapes: list[tuple[int, int]], dp: int) -> dict:
    """What Muon adds per step on a DP-only FSDP2 grid: bf16 bytes each rank sends to and from the owners
    (mean over ranks), and the Newton-Schulz FLOPs of the busiest owner."""
    by_rank = [fsdp2_row_pieces(s, dp) for s in shapes]
    r = routes(list(shapes), [[by_rank[m][d] for m in range(len(shapes))] for d in range(dp)], tp=1)
    sent = [sum(r.send_counts(q)) - r.send_counts(q)[q] + sum(r.back_counts(q)) - r.back_counts(q)[q]
            for q in range(dp)]
    load = [sum(ns5_flops(*shapes[m]) for m in r.owned(q)) for q in range(dp)]
    return dict(extra_bytes_per_rank=sum(sent) * costmodel.NS_BYTES / dp, busiest_ns_flops=max(load))


def zero1_owner_extra(groups: list[dict], dp: int, bucket_numel: int | None) -> float:
    """What Muon adds per step under ZeRO-1 with the owner layout on a DP-only grid (mean bytes per rank)."""
    b = costmodel.step_bytes(groups, dp, 1, bucket_numel, layout="owner")
    return b["ns_to_owner"] + b["ns_from_owner"]


if __name__ == "__main__":
    from .synthetic import DEFAULT_SHAPES, DEFAULT_TP_DIMS

    groups = [dict(shapes=DEFAULT_SHAPES, tp_split_dims=DEFAULT_TP_DIMS, use_muon=True)]
    for dp, tp in ((4, 1), (2, 2)):
        for row in layout_costs(groups, dp, tp, "auto"):
            print(dp, tp, row)
