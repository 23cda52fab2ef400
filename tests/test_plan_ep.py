"""A MoE's plan under expert parallelism, per rank, against pure ZeRO-1 x TP (no processes): ``ep_report`` of
muongrid/lab/scale.py, what scripts/plan_ep.py prints.

The expert plan runs on the expert grid (dp / ep x tp), so a rank's expert matrices, and its share of their
bytes and collectives, do not grow with the job's DP at a fixed ep: planning stays as fast at 1,024 ranks as
at 64 (held here by sizes, not by a wall-clock figure). Moonlight's shapes, three layers (two MoE).

    python -m pytest -q tests/test_plan_ep.py
"""
from __future__ import annotations

import pytest

from muongrid.lab.model_shapes import MODELS
from muongrid.lab.scale import ep_report, split_experts


def test_expert_parallel_sends_less_than_pure_zero1_and_keeps_experts_whole():
    r = ep_report("moonlight-16b-a3b", 64, 1, 8, layers=3)
    assert r["expert_matrices_per_rank"] == 2 * (64 // 8) * 3      # 2 MoE layers x 8 experts x 3 matrices
    assert r["bytes_per_rank_max"] < 0.6 * r["zero1_bytes_per_rank_max"]     # the dense part is the same
    # fewer collectives too (about a third as many with 2^20-element buckets; with "auto" buckets, which grow
    # with the 64 DP ranks of pure ZeRO-1, 136 against 186)
    assert r["collectives_per_rank_max"] < r["zero1_collectives_per_rank_max"]
    assert r["step_ms"] < r["zero1_step_ms"]


def test_a_rank_s_expert_share_does_not_grow_with_the_job():
    small, large = (ep_report("moonlight-16b-a3b", dp, 1, 8, layers=3) for dp in (16, 256))
    assert small["expert_matrices_per_rank"] == large["expert_matrices_per_rank"]
    dense, experts = split_experts(*MODELS["moonlight-16b-a3b"][0](3), 8)
    assert len(experts[0]) == small["expert_matrices_per_rank"] and not any(".expert." in s.name for s in dense[0])


def test_bad_expert_splits_are_refused():
    with pytest.raises(ValueError, match="ep=3 must divide dp=8"):
        ep_report("moonlight-16b-a3b", 8, 1, 3, layers=2)
    with pytest.raises(ValueError, match="64 experts per layer do not divide into ep=7"):
        split_experts(*MODELS["moonlight-16b-a3b"][0](2), 7)
