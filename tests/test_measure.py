"""The measurement tools: closed-form model, alpha-beta fit, trace parser, peak memory; and the
benchmark scripts' results, checked against the closed form."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import ROOT, last_json, script
from muongrid.lab import timemodel
from muongrid.lab.costmodel import (DP_GATHER_VARIANTS, collective_seconds, dp_gather_bytes, fit_alpha_beta, step_bytes, step_calls,
                             step_seconds)
from muongrid.lab.profiling import step_peak_bytes
from muongrid.lab.synthetic import build_problem
from muongrid.lab.traces import breakdown, load_events, median_breakdown
from muongrid.plan import ParamSpec, build_plan


@pytest.mark.parametrize("dp,tp", [(2, 1), (3, 1), (4, 2), (2, 4)])
def test_dp_gather_layouts_are_ordered_and_bucket_is_what_the_engine_moves(dp, tp):
    groups = build_problem("muon", tp=tp).groups
    by_layout = {lay: dp_gather_bytes(groups, dp, tp, 2**18, lay) for lay in DP_GATHER_VARIANTS}
    assert by_layout["bucket"] == step_bytes(groups, dp, tp, 2**18)["ns_gather_dp"]
    assert by_layout["none"] == 0 <= by_layout["straddlers"] <= by_layout["bucket"]


def test_many_equal_layers_straddle_little():
    """When matrices are small against a shard, few straddle: the gather shrinks towards the lower bound."""
    groups = [dict(shapes=[(256, 256)] * 48, tp_split_dims=[-1] * 48, use_muon=True)]
    assert dp_gather_bytes(groups, 4, 1, None, "straddlers") < 0.1 * dp_gather_bytes(groups, 4, 1, None, "bucket")


def test_time_model_follows_the_calls():
    groups = build_problem("muon").groups
    links = {"dp": (1e-3, 1e9), "tp": (1e-5, 1e11)}
    t = step_seconds(groups, 4, 1, None, links)
    calls = list(step_calls(groups, 4, 1, None))
    assert t["total"] == pytest.approx(sum(3 * (1e-3 + s * b / 1e9) for *_, s, b in calls))
    gloo = step_seconds(groups, 4, 1, None, links, gloo_reduce_scatter=True)
    assert gloo["grad_reduce_scatter"] == pytest.approx(2 * t["grad_reduce_scatter"])
    assert collective_seconds("all_gather", 1, 1e6, 1, 1) == 0.0


def test_alpha_beta_fit_recovers_known_constants():
    alpha, beta = 2e-5, 5e9
    samples = [(n, b, collective_seconds("all_gather", n, b, alpha, beta)) for n in (2, 4, 8) for b in (1e3, 1e5, 1e7)]
    fa, fb = fit_alpha_beta(samples)
    assert fa == pytest.approx(alpha, rel=1e-6) and fb == pytest.approx(beta, rel=1e-6)


def test_alpha_beta_fit_stays_physical_on_noise():
    """Small messages whose times fall with size (noise) must not give a negative bandwidth."""
    fa, fb = fit_alpha_beta([(2, 256, 3e-3), (2, 1024, 2e-3), (2, 4096, 1.5e-3)])
    assert fb == float("inf") and fa == pytest.approx((3e-3 + 2e-3 + 1.5e-3) / 3)
    fa, fb = fit_alpha_beta([(2, 1e6, 1e-3), (2, 2e6, 2.5e-3)])  # a negative intercept
    assert fa == 0.0 and fb > 0


def _trace(tmp_path, events):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [dict(ph="X", cat="user_annotation", pid=1, tid=1, **e) for e in events]
                                + [dict(ph="i", name="marker", ts=0)]}))
    return path


def test_trace_breakdown_on_a_known_trace(tmp_path):
    # step 1: 100 us; fwd-bwd 60; optimizer 35 containing two collectives (10 + 5) and NS 8
    events = [dict(name="train_step:muon", ts=1000, dur=100), dict(name="forward_backward", ts=1000, dur=60),
              dict(name="optimizer.step", ts=1062, dur=35), dict(name="comm:grad_reduce_scatter", ts=1063, dur=10),
              dict(name="muon:newton_schulz", ts=1075, dur=8), dict(name="comm_wait:param_all_gather", ts=1090, dur=5),
              dict(name="train_step:muon", ts=2000, dur=200), dict(name="forward_backward", ts=2000, dur=140),
              dict(name="wait_for_peers", ts=2141, dur=8), dict(name="comm:sync", ts=2142, dur=6),
              dict(name="optimizer.step", ts=2150, dur=50), dict(name="comm:grad_reduce_scatter", ts=2151, dur=20)]
    steps = breakdown(load_events(_trace(tmp_path, events)), "train_step:muon")
    assert steps[0] == dict(step=0.1, forward_backward=0.06, waiting=0.0, optimizer=0.035, communication=0.015,
                            newton_schulz=0.008, optimizer_compute=pytest.approx(0.02))
    assert steps[1]["waiting"] == 0.008 and steps[1]["communication"] == 0.02  # the barrier is waiting, not comm
    med = median_breakdown(steps)
    assert med["step"] == pytest.approx(0.15) and med["optimizer_share"] == pytest.approx(0.0425 / 0.15)
    with pytest.raises(ValueError, match="no training steps"):
        median_breakdown(breakdown(load_events(_trace(tmp_path, events)), "train_step:adamw"))


def test_like_for_like_steps_share_one_forward_backward():
    from muongrid.lab.traces import like_for_like_steps

    ranks = [dict(muon=dict(forward_backward=50.0, optimizer=30.0), adamw=dict(forward_backward=70.0, optimizer=10.0)),
             dict(muon=dict(forward_backward=52.0, optimizer=32.0), adamw=dict(forward_backward=68.0, optimizer=12.0))]
    steps = like_for_like_steps(ranks)  # whole steps would say 82 vs 80: noise in AdamW's copy hides Muon's cost
    assert steps == dict(muon=pytest.approx(60.0 + 32.0), adamw=pytest.approx(60.0 + 12.0))


def test_trace_breakdown_reads_device_time_on_a_cuda_trace(tmp_path):
    """On CUDA the CPU ranges time launches (an NCCL call returns once queued); the parts come from the
    gpu_user_annotation ranges (one per stream, overlaps counted once), the step from the CPU range."""
    cpu = [dict(name="train_step:muon", ts=1000, dur=1000), dict(name="forward_backward", ts=1000, dur=50),
           dict(name="optimizer.step", ts=1060, dur=40), dict(name="comm:grad_reduce_scatter", ts=1061, dur=2),
           dict(name="muon:newton_schulz", ts=1065, dur=3)]
    gpu = [dict(name="forward_backward", ts=1010, dur=400, tid=7),
           dict(name="optimizer.step", ts=1420, dur=500, tid=7),             # compute stream
           dict(name="optimizer.step", ts=1430, dur=300, tid=9),             # NCCL stream, inside the other
           dict(name="comm:grad_reduce_scatter", ts=1430, dur=300, tid=9),
           dict(name="muon:newton_schulz", ts=1750, dur=150, tid=7)]        # overlaps the collective
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [dict(ph="X", cat="user_annotation", pid=1, tid=1, **e) for e in cpu]
                                + [dict(ph="X", cat="gpu_user_annotation", pid=0, **e) for e in gpu]}))
    (step,) = breakdown(load_events(path), "train_step:muon")
    assert step == dict(step=1.0, forward_backward=0.4, waiting=0.0, optimizer=0.5, communication=0.3,
                        newton_schulz=0.15, optimizer_compute=pytest.approx(0.2))


def test_a_timing_verdict_needs_a_gap_outside_the_noise():
    from muongrid.lab.verdicts import beats, fastest, fastest_text, spread_text

    clear, slow = [0.100, 0.102, 0.105], [0.130, 0.128, 0.135]
    assert beats(clear, slow) and not beats(slow, clear)
    assert not beats([0.100, 0.101, 0.131], slow)          # medians far apart, but the ranges overlap
    assert not beats([0.100, 0.100], [0.105, 0.106])       # no overlap, but within the 10% band
    assert fastest({"4x1": slow, "2x2": clear}) == ["2x2"] and fastest_text({"4x1": slow, "2x2": clear}) == "2x2 fastest"
    tied = {"1x4": [0.5, 0.52], "4x1": [0.365, 0.36, 0.37], "2x2": [0.370, 0.368, 0.375]}  # 365 vs 370 ms
    assert fastest(tied) == ["4x1", "2x2"]
    assert fastest_text(tied) == "tie between 4x1 and 2x2 (within the noise)"
    assert spread_text([0.3, 0.312, 0.33]) == "312 ms (300-330)"
    from muongrid.lab.verdicts import ratio_range, versus_claim
    # a claim that 2x2 is fastest: agreement needs a clear win; a tie says nothing either way
    assert versus_claim({"4x1": slow, "2x2": clear}, "2x2").startswith("Agrees")
    assert versus_claim({"4x1": clear, "2x2": slow}, "2x2").startswith("Differs here: 4x1 beats 2x2")
    overlapping = {"2x2": [0.076, 0.077, 0.079], "4x1": [0.078, 0.091, 0.091]}   # 77 ms vs 91 ms
    assert versus_claim(overlapping, "2x2").startswith("Not settled: 2x2 has the lowest median")
    assert versus_claim(tied, "2x2").startswith("Not settled: 4x1 has the lowest median")
    assert ratio_range([2.0, 3.0, 4.0], [1.0, 1.5, 2.0]) == (1.0, 2.0, 4.0)
    with pytest.raises(ValueError, match="at least one measurement"):
        fastest({"2x2": []})


def test_ledger_keeps_a_bounded_window_of_steps():
    from muongrid.comm import Comm
    from muongrid.distributed import DistributedMuon
    from muongrid.grid import Grid

    p = torch.nn.Parameter(torch.randn(8, 8))
    opt = DistributedMuon([p], Grid.single(), comm=Comm(Grid.single()))
    for _ in range(40):
        p.grad = torch.randn(8, 8)
        opt.step()
    steps = {r.step for r in opt.comm.ledger.records if r.step}
    # The last keep_steps (16) steps are always there; older ones are dropped once every 16 steps (looking
    # over the records every step was host work on every step), so at most 32 are ever kept.
    assert set(range(25, 41)) <= steps <= set(range(9, 41)) and opt.comm.ledger.summary()["step"] == 40
    assert min(steps) == 32 - 16 + 1   # the last pruning was at step 32: steps 17-40 are kept
    # What was recorded while the optimizer was built (step 0: the ranks' plan check) is kept, once.
    assert [r.phase for r in opt.comm.ledger.records if not r.step] == ["setup"]


def test_peak_bytes_of_known_allocations():
    def fn():
        a = torch.empty(1000, 1000)          # 4 MB
        b = torch.empty(2000, 1000)          # 8 MB, while a is alive: the peak
        del a
        c = torch.empty(500, 1000)           # 2 MB
        return b, c
    assert step_peak_bytes(fn, torch.device("cpu")) == 12_000_000


# ---- the benchmark scripts, end to end ------------------------------------------------------------

SMALL = ["--shapes", "36x57,45x28,33x17,20x44,8x12", "--tp-dims", "0,1,none,1,0", "--bucket-numel", "1500",
         "--steps", "2", "--warmup", "1"]


def test_bench_on_2x2_reports_ratios_that_match_the_closed_form():
    proc = script("bench.py", "--dp", "2", "--tp", "2", *SMALL, "--overlap", "none,naive,prefetch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = last_json(proc.stdout)
    assert set(r["variants"]) == {"muon", "muon-naive", "muon-prefetch", "adamw", "adamw-naive"}
    groups = build_problem("muon", [(36, 57), (45, 28), (33, 17), (20, 44), (8, 12)], [0, 1, -1, 1, 0], tp=2).groups
    assert r["closed_form"]["matches_ledger"]
    assert r["bytes_ratio"] == step_bytes(groups, 2, 2, 1500)["total"] / step_bytes(groups, 2, 2, 1500, muon=False)["total"]
    for name, v in r["variants"].items():  # async variants move exactly the same bytes
        assert v["bytes"] == r["variants"][name.split("-")[0]]["bytes"]
        assert len(v["peak_bytes_per_rank"]) == 4 and min(v["peak_bytes_per_rank"]) > 0
        assert v["bytes_per_phase_per_rank"] == [v["bytes_per_phase"]] * 4  # a ring moves the same on every rank
        assert v["step_seconds"] > 0 and v["comm_seconds"] > 0
    assert r["state_bytes_ratio"] == pytest.approx(0.5, abs=1e-12)
    assert r["time_ratio"] > 0 and r["comm_time_ratio"] > 0


def test_bench_sweep_dp_only_gives_exactly_the_papers_bound():
    proc = script("bench.py", "--sweep", "--grids", "2x1,3x1", *SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = last_json(proc.stdout)["sweep"]
    assert [(r["dp"], r["tp"]) for r in runs] == [(2, 1), (3, 1)]
    assert all(r["bytes_ratio"] == 1.25 and r["closed_form"]["bytes_ratio"] == 1.25 for r in runs)
    assert last_json(proc.stdout)["fastest_muon_grids"] and set(last_json(proc.stdout)["fastest_muon_grids"]) <= {"2x1", "3x1"}


def test_bench_sizes_groups_on_this_machines_profile_for_each_grid_it_launches():
    """``--hw this-machine``: the calibrated CPU profile made into a plan profile for each grid's ranks
    (``timemodel.plan_profile``: 2 ranks get twice the threads of 4), the groups the plan gives with it, and
    bytes equal to the closed form priced on that plan. The 1024 x 1536 matrix gets a group on both grids
    on the recorded calibration (on a machine that computes several times faster than 340 GFLOP/s it
    would not pay: re-pick the shape if the record changes)."""
    proc = script("bench.py", "--sweep", "--grids", "2x1,2x2", "--layout", "group", "--hw", "this-machine",
                  "--shapes", "36x57,1024x1536,33x17", "--tp-dims", "0,1,none", "--bucket-numel", "1500",
                  "--steps", "1", "--warmup", "0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    cpu = timemodel.this_machine(ROOT / timemodel.CPU_RECORD)
    for r in last_json(proc.stdout)["sweep"]:
        hw = timemodel.plan_profile(cpu, r["dp"] * r["tp"])
        assert r["hw"] == json.loads(json.dumps(hw)) and r["closed_form"]["matches_ledger"]
        specs = [[ParamSpec(f"p{i}", shape, d)
                  for i, (shape, d) in enumerate(zip(((36, 57), (1024, 1536), (33, 17)), (0, 1, -1)))]]
        plan = build_plan(specs, r["dp"], 0, r["tp"], 1500, "group", hw=hw)
        assert r["layouts"]["group"]["groups"] == {f"{b}.{i}": list(m) for (b, i), m in plan.groups.items()}
        assert r["layouts"]["group"]["groups"]["0.1"]   # a group (on 2 cores, of ranks 0 and 1: two compute at once)


def test_profile_step_traces_and_splits_a_real_training_step(tmp_path):
    proc = script("profile_step.py", "--dp", "2", "--steps", "2", "--warmup", "1", "--batch", "8", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = last_json(proc.stdout)
    for rank in r["ranks"]:
        assert (tmp_path / f"trace_rank{r['ranks'].index(rank)}.json").exists()
        for kind in ("muon", "adamw"):
            b = rank[kind]
            assert 0 < b["forward_backward"] < b["step"] and 0 < b["communication"] <= b["optimizer"] < b["step"]
            assert 0 < b["optimizer_share"] < 1
        assert rank["muon"]["newton_schulz"] > 0 and rank["adamw"]["newton_schulz"] == 0


def test_measure_links_fits_the_model():
    proc = script("measure_links.py", "--dp", "2", "--points", "4", "--reps", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = last_json(proc.stdout)
    assert r["alpha_s"] >= 0 and (r["beta_bytes_per_s"] is None or r["beta_bytes_per_s"] > 0)
    assert len(r["samples"]) == 4 and all(s["all_gather_s"] > 0 and s["reduce_scatter_s"] > 0 for s in r["samples"])
    # gloo: its own reduce-scatter (an all-reduce inside) timed beside Comm's all-to-all one
    assert r["backend"] == "gloo" and all(s["gloo_reduce_scatter_s"] > 0 for s in r["samples"])
    assert r["gloo_rs_over_ag_largest"] > 0
