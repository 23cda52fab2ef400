"""muongrid.lab.choice, the per-layout costs of chapter 13, against what they must be by construction.
Arithmetic only (no processes): well under a second.

    PYTHONPATH=scripts python -m pytest -q tests/test_choice.py
"""
from __future__ import annotations

from muongrid.lab.choice import STATE_BYTES, layout_costs
from muongrid.lab.synthetic import stack_shapes
from muongrid.newton_schulz import ns5_flops
from muongrid.plan import DEFAULT_BUCKET_NUMEL, ParamSpec, build_plan


def test_layout_costs_on_an_even_stack_and_an_uneven_grid():
    shapes, dims = stack_shapes(layers=4)
    groups = [dict(shapes=shapes, tp_split_dims=dims, use_muon=True)]
    total_ns = sum(ns5_flops(*s) for s in shapes)
    dp_only = {c["layout"]: c for c in layout_costs(groups, 4, 1, DEFAULT_BUCKET_NUMEL)}
    assert dp_only["bucket"]["vs_adamw"] == 1.25                    # (4 + 2 + 4) / (4 + 4), exactly
    assert dp_only["aligned"]["vs_adamw"] == 1.0                    # whole matrices per shard: no NS traffic
    assert dp_only["bucket"]["busiest_ns_flops"] == total_ns        # every rank orthogonalises everything
    assert [dp_only[k]["ns_runs_per_matrix"] for k in ("bucket", "owner", "aligned")] == [4, 1, 1]
    # 16 matrices of two sizes over 4 ranks: the owners split the work, none above half of it
    assert total_ns / 4 <= dp_only["owner"]["busiest_ns_flops"] <= total_ns / 2
    # state: fp32 master + momentum of this rank's (padded) shards
    plan = build_plan([[ParamSpec(f"p{i}", s, -1) for i, s in enumerate(shapes)]], 4, 0, 1, DEFAULT_BUCKET_NUMEL)
    assert dp_only["bucket"]["state_bytes_per_rank"] == plan.local_state_numel() * STATE_BYTES
    # a 3 x 2 grid whose shards do not divide the buffer evenly still prices every layout
    grid = {c["layout"]: c for c in layout_costs(groups, 3, 2, 100_000)}
    assert grid["owner"]["bytes_per_rank"] <= grid["bucket"]["bytes_per_rank"]
    assert grid["bucket"]["ns_runs_per_matrix"] == 6 and grid["owner"]["overlap"] == "prefetch"


def test_fsdp2_pieces_follow_torch_chunk_and_the_extra_is_the_owner_round_trip():
    import torch

    from muongrid.lab.choice import fsdp2_extra, fsdp2_row_pieces

    for rows, dp in [(10, 4), (3, 4), (8, 2), (7, 3)]:
        pieces = fsdp2_row_pieces((rows, 5), dp)
        chunks = [c.shape[0] for c in torch.empty(rows).chunk(dp)]
        assert [p.shape[0] for p in pieces] == chunks + [0] * (dp - len(chunks))
        assert sum(p.numel for p in pieces) == rows * 5
    # one 64 x 32 matrix on 4 ranks: its owner receives 3 blocks of 16 rows and sends them back
    extra = fsdp2_extra([(64, 32)], 4)
    assert extra["extra_bytes_per_rank"] == 2 * 3 * 16 * 32 * 2 / 4
