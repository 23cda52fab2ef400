"""The time model (muongrid/lab/timemodel.py) against its closed form, the cost model's bytes, and its two profiles.

Nothing here launches a process. The model against a real run's ledger (bytes sent and received per rank)
is in tests/test_distributed.py (test_time_model_prices_the_ledgers_busiest_rank), on a run it shares.
Tolerances: relative 1e-12, float rounding of a sum of a few terms; byte identities are exact.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from muongrid.lab import costmodel, timemodel
from muongrid.lab.synthetic import DEFAULT_SHAPES, DEFAULT_TP_DIMS, REPORT_SHAPES, REPORT_TP_DIMS, stack_shapes
from muongrid.newton_schulz import ns5_flops
from muongrid.plan import ParamSpec, build_plan

ROOT = Path(__file__).resolve().parents[1]
A, B, F = 1e-5, 1e9, 1e12  # alpha (s), beta (bytes/s), flops of the hand-made profile


def profile(**kw):
    hw = dict(flops=F, efficiency=1.0, ranks_per_node=None, intra=(A, B), inter=(A, B),
              reduce_scatter_as_all_reduce=False, shared_cores=False)
    return dict(hw, **kw)


def one(shape, split=-1):
    return [dict(shapes=[shape], tp_split_dims=[split], use_muon=True)]


def test_one_matrix_on_two_ranks_is_its_closed_form():
    """A 64 x 32 matrix on 2 DP ranks: one bucket, shards of s = 1024 elements."""
    s = 64 * 32 // 2
    ns = ns5_flops(64, 32) / F
    bucket = timemodel.step_seconds(one((64, 32)), 2, 1, None, "bucket", profile())
    assert bucket["grad_reduce_scatter"] == pytest.approx(A + 4 * s / B, rel=1e-12)
    assert bucket["ns_gather_dp"] == pytest.approx(A + 2 * s / B, rel=1e-12)
    assert bucket["param_all_gather"] == pytest.approx(A + 4 * s / B, rel=1e-12)
    assert bucket["newton_schulz"] == pytest.approx(ns, rel=1e-12)   # every rank runs it: the busiest too
    assert bucket["total"] == pytest.approx(3 * A + 10 * s / B + ns, rel=1e-12)
    owner = timemodel.step_seconds(one((64, 32)), 2, 1, None, "owner", profile())
    # the other rank sends its half (bf16) to the owner and gets it back: one peer, 2 s bytes each way
    assert owner["ns_to_owner"] == owner["ns_from_owner"] == pytest.approx(A + 2 * s / B, rel=1e-12)
    assert owner["ns_gather_dp"] == 0 and owner["newton_schulz"] == pytest.approx(ns, rel=1e-12)
    adamw = timemodel.step_seconds(one((64, 32)), 2, 1, None, "adamw", profile())
    assert adamw["total"] == pytest.approx(2 * A + 8 * s / B, rel=1e-12) and adamw["newton_schulz"] == 0


def test_tp_gathers_gloo_reduce_scatter_and_shared_cores():
    # TP only (1 x 2), matrix split on dim 0: the bucket layout gathers each TP shard (m = 32 x 32) over TP.
    t = timemodel.step_seconds(one((64, 32), 0), 1, 2, None, "bucket", profile())
    assert t["ns_gather_tp"] == pytest.approx(A + 2 * 32 * 32 / B, rel=1e-12)
    assert t["grad_reduce_scatter"] == t["ns_gather_dp"] == 0   # dp = 1: nothing over DP
    # gloo: a reduce-scatter runs as an all-reduce, 2 (n - 1) hops of the shard
    s = 64 * 32 // 4
    gloo = timemodel.step_seconds(one((64, 32)), 4, 1, None, "adamw", profile(reduce_scatter_as_all_reduce=True))
    assert gloo["grad_reduce_scatter"] == pytest.approx(6 * (A + 4 * s / B), rel=1e-12)
    # one machine's cores shared: Newton-Schulz ends when all ranks' FLOPs are done
    shared = timemodel.step_seconds(one((64, 32)), 4, 1, None, "bucket", profile(shared_cores=True))
    assert shared["newton_schulz"] == pytest.approx(4 * ns5_flops(64, 32) / F, rel=1e-12)
    owner = timemodel.step_seconds(one((64, 32)), 4, 1, None, "owner", profile(shared_cores=True))
    assert owner["newton_schulz"] == pytest.approx(ns5_flops(64, 32) / F, rel=1e-12)


def test_all_to_all_takes_the_busiest_rank_and_its_link_kinds():
    """Rank 0 receives 100 bytes from each of 3 peers; with 2 ranks per node one peer is on its node."""
    calls = [[[0, 0, 0, 0], [100, 0, 0, 0], [100, 0, 0, 0], [100, 0, 0, 0]]]
    assert timemodel.all_to_all_seconds(calls, profile()) == pytest.approx(3 * A + 300 / B, rel=1e-12)
    hw = profile(ranks_per_node=2, inter=(10 * A, B / 10))
    assert timemodel.all_to_all_seconds(calls, hw) == pytest.approx(2 * 10 * A + 200 / (B / 10), rel=1e-12)
    # two calls in a phase: alpha per peer per call, bytes summed over the phase
    assert timemodel.all_to_all_seconds(calls * 2, profile()) == pytest.approx(6 * A + 600 / B, rel=1e-12)
    assert timemodel.all_to_all_seconds([], profile()) == 0.0


SETS = {"poc": [dict(shapes=DEFAULT_SHAPES, tp_split_dims=DEFAULT_TP_DIMS, use_muon=True)],
        "report": [dict(shapes=REPORT_SHAPES, tp_split_dims=REPORT_TP_DIMS, use_muon=True)],
        "stack": [dict(shapes=stack_shapes(4)[0], tp_split_dims=stack_shapes(4)[1], use_muon=True)]}


@pytest.mark.parametrize("name", sorted(SETS))
@pytest.mark.parametrize("dp,tp", [(4, 1), (2, 2), (3, 1)])
def test_owner_traffic_is_the_cost_models_bytes_and_ring_time_is_the_bytes(name, dp, tp):
    """With no latency and one link of 1 byte/s, a ring phase's seconds are the bytes each rank sends
    (costmodel.step_bytes, which the ledger equals); the owner layouts' per-pair traffic sums, per rank,
    to step_bytes' ns_to_owner / ns_from_owner."""
    groups, bn = SETS[name], 200_000
    bw = profile(intra=(0.0, 1.0), inter=(0.0, 1.0))
    for layout in ("bucket", "adamw"):
        t = timemodel.step_seconds(groups, dp, tp, bn, layout, bw)
        want = costmodel.step_bytes(groups, dp, tp, bn, muon=layout != "adamw", rank=0)
        assert t["comm"] == want["total"]
        assert all(t[p] == want[p] for p in costmodel.PHASES)
    for layout in ("owner", "aligned"):
        plan = costmodel.plans_for(groups, dp, tp, bn, layout)[0]
        sent = [[0, 0] for _ in range(dp * tp)]
        for g, buckets in enumerate(plan.buckets):
            for bucket in buckets:
                for k, m in enumerate(timemodel.owner_traffic(plan, g, bucket)):
                    for r in range(dp * tp):
                        sent[r][k] += sum(m[r])
        for r in range(dp * tp):
            want = costmodel.step_bytes(groups, dp, tp, bn, layout=layout, rank=r)
            assert sent[r] == [want["ns_to_owner"], want["ns_from_owner"]], (layout, r)


def test_busiest_newton_schulz_is_the_plans_owner_load():
    groups = SETS["stack"]
    bucket = timemodel.step_seconds(groups, 4, 1, None, "bucket", profile())
    owner = timemodel.step_seconds(groups, 4, 1, None, "owner", profile())
    every = sum(ns5_flops(*s) for s in groups[0]["shapes"])
    assert bucket["busiest_ns_flops"] == every
    plan = costmodel.plans_for(groups, 4, 1, None, "owner")[0]
    load = timemodel.ns_flops_per_rank(plan, [True])
    assert sum(load) == every and owner["busiest_ns_flops"] == max(load) < every


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="layout must be one of"):
        timemodel.step_seconds(one((8, 8)), 2, 1, None, "zero3", profile())
    hw = profile()
    del hw["intra"]
    with pytest.raises(ValueError, match=r"lacks \['intra'\]"):
        timemodel.step_seconds(one((8, 8)), 2, 1, None, "bucket", hw)
    with pytest.raises(ValueError, match=r"efficiency must be in \(0, 1\]"):
        timemodel.step_seconds(one((8, 8)), 2, 1, None, "bucket", profile(efficiency=0))


def test_profiles_come_from_the_scale_model_and_the_recorded_calibration():
    from muongrid.lab import scale

    hw = timemodel.h100()
    timemodel.check_profile(hw)
    assert (hw["flops"], hw["efficiency"], hw["ranks_per_node"]) == (
        scale.H100["flops"], scale.H100["efficiency"], scale.H100["gpus_per_node"])
    assert hw["intra"] == scale.H100["nvlink"] and hw["inter"] == scale.H100["infiniband"]
    cpu = timemodel.this_machine(ROOT / timemodel.CPU_RECORD)
    timemodel.check_profile(cpu)
    record = json.loads((ROOT / timemodel.CPU_RECORD).read_text())
    assert record["command"].startswith("python scripts/calibrate_time_model.py")
    assert record["commit"] and record["cpu"] and record["torch"] and record["recorded_at"]
    links = record["measurements"]["links"]["result"]
    assert cpu["intra"] == (links["alpha_s"], links["beta_bytes_per_s"])
    assert cpu["flops"] == record["measurements"]["ns_speed"]["result"]["matmul_gflops"] * 1e9
    assert not cpu["reduce_scatter_as_all_reduce"] and cpu["shared_cores"]   # Comm's all-to-all on gloo


def test_fsdp2_extra_is_one_all_to_all_each_way_and_the_owners_newton_schulz():
    """A 3 x 4 matrix on 2 FSDP2 ranks: rows 0-1 on rank 0 (its owner, it holds most), row 2 on rank 1,
    which sends its 4 elements (bf16) to the owner and gets them back."""
    t = timemodel.fsdp2_extra_seconds([(3, 4)], 2, profile())
    assert t["ns_to_owner"] == t["ns_from_owner"] == pytest.approx(A + 8 / B, rel=1e-12)
    assert t["newton_schulz"] == pytest.approx(ns5_flops(3, 4) / F, rel=1e-12)
    assert t["total"] == pytest.approx(2 * (A + 8 / B) + ns5_flops(3, 4) / F, rel=1e-12)


def test_group_layout_is_priced_from_its_plan():
    """The group layout on the report's shapes (one 4096^2 matrix holds 99% of the FLOPs), 2 x 2: the members'
    all-to-all bytes are costmodel.step_bytes' (which the ledger equals); each member pays its NS share and
    layouts.group_seconds on the intra-node link (4 ranks on one node) or, on nodes of 2, the inter-node one;
    with no groups (the balanced stack) it is the owner layout exactly."""
    from muongrid.layouts import group_ns_flops, group_seconds
    groups = [dict(shapes=REPORT_SHAPES, tp_split_dims=REPORT_TP_DIMS, use_muon=True)]
    bw = profile(intra=(0.0, 1.0), inter=(0.0, 1.0))
    plan = costmodel.plans_for(groups, 2, 2, None, "group")[0]
    assert list(plan.groups.values()) == [(0, 1, 2, 3)]
    sent = [[0, 0] for _ in range(4)]
    for bucket in plan.buckets[0]:
        for k, m in enumerate(timemodel.owner_traffic(plan, 0, bucket)):
            for r in range(4):
                sent[r][k] += sum(m[r])
    for r in range(4):
        want = costmodel.step_bytes(groups, 2, 2, None, layout="group", rank=r)
        assert sent[r] == [want["ns_to_owner"], want["ns_from_owner"]], r
    for per_node, link in [(None, (A, B)), (2, (2 * A, B / 10))]:
        hw = profile(ranks_per_node=per_node, inter=(2 * A, B / 10))
        t = timemodel.step_seconds(groups, 2, 2, None, "group", hw)
        load = timemodel.ns_flops_per_rank(plan, [True])
        talk = group_seconds(4096, 4096, 4, 5, link)
        bound = max(range(4), key=lambda r: load[r])
        assert t["ns_group_gram"] == pytest.approx(talk, rel=1e-12)
        assert t["newton_schulz"] == pytest.approx(load[bound] / F, rel=1e-12)
        assert load[bound] >= group_ns_flops(4096, 4096, 4, split_b=True)
        assert t["total"] == pytest.approx(t["comm"] + t["newton_schulz"], rel=1e-12)
    stack = SETS["stack"]
    g, o = (timemodel.step_seconds(stack, 2, 2, None, x, profile()) for x in ("group", "owner"))
    assert g == o


def test_timed_groups_are_never_slower_in_the_model_than_flop_sized_ones():
    """``timed_groups=True`` prices build_plan(..., hw=profile): on the H100 profile and the report's shapes, on
    these grids, its NS + group-collective seconds are at most the FLOP-sized plan's (a greedy choice, so not
    a theorem: the sizes it tries include the FLOP rule's, judged by these same seconds)."""
    groups = [dict(shapes=REPORT_SHAPES, tp_split_dims=REPORT_TP_DIMS, use_muon=True)]
    hw = timemodel.h100()
    for dp, tp in [(2, 2), (4, 4), (16, 1)]:
        timed = timemodel.step_seconds(groups, dp, tp, None, "group", hw, timed_groups=True)
        flops = timemodel.step_seconds(groups, dp, tp, None, "group", hw)
        assert timed["newton_schulz"] + timed["ns_group_gram"] <= (flops["newton_schulz"] + flops["ns_group_gram"]) * (1 + 1e-9)


def test_the_cpu_profile_becomes_a_plan_profile_for_a_launch():
    """``plan_profile``: a launch of 4 ranks on 2 cores gives each rank 1 thread, so a rank computes at half
    the machine's rate and two compute at once; on 16 cores each of 4 ranks has 4 threads, all compute at
    once. On 2 cores the report's 4096 x 4096 matrix then goes to a group of two on 2 x 2, not four."""
    cpu = timemodel.this_machine(ROOT / timemodel.CPU_RECORD)
    two = timemodel.plan_profile(cpu, 4, cores=2)
    assert (two["flops"], two["parallel_ranks"]) == (cpu["flops"] / 2, 2)
    assert (two["intra"], two["ranks_per_node"]) == (tuple(cpu["intra"]), None)
    sixteen = timemodel.plan_profile(cpu, 4, cores=16)
    assert (sixteen["flops"], sixteen["parallel_ranks"]) == (cpu["flops"] / 4, 4)
    assert timemodel.plan_profile(cpu, 1, cores=2)["parallel_ranks"] == 1
    assert timemodel.plan_profile(cpu, 4, cores=2, threads=2)["parallel_ranks"] == 1   # train.py --threads 2
    for bad in (dict(ranks=0), dict(ranks=-2), dict(ranks=4, cores=0), dict(ranks=4, threads=0)):
        with pytest.raises(ValueError, match=">= 1"):
            timemodel.plan_profile(cpu, **bad)
    with pytest.raises(ValueError, match="whose cores the ranks share"):
        timemodel.plan_profile(timemodel.h100(), 4)        # a cluster's profile goes to the plan as it is
    specs = [[ParamSpec(f"w{i}", s, d) for i, (s, d) in enumerate(zip(REPORT_SHAPES, REPORT_TP_DIMS))]]
    assert build_plan(specs, 2, 0, 2, 2**20, "group", hw=two).groups == {(0, 0): (0, 1)}
