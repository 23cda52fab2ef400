"""Distributed runs on real gloo process groups, checked against the single-device reference.

Every run checks all three layouts (bucket, owner, aligned) side by side in one launch: each gets its
own optimizer, and each must match the reference. Tolerance: zero. Each rank runs the same kernels on the same numbers as the reference (the
gradients are dyadic, so the DP sum is exact in any order; see muongrid/lab/synthetic.py), so any
difference at all is a bug. Shapes divide unevenly by every DP size (padding, straddling
matrices), buckets are small so there are several, and there are several parameter groups.
"""
from __future__ import annotations

import functools
import sys

import pytest

from conftest import ODD_SHAPES, ODD_TP_DIMS, last_json, refused, run, script
from muongrid.lab.costmodel import PHASES, step_bytes
from muongrid.lab.synthetic import build_problem, parse_shapes, parse_tp_dims
from muongrid.verify import main as verify_main

GRIDS = [(1, 1), (2, 1), (2, 2), (3, 1), (1, 4), (2, 4), (3, 2)]
# Muon on grids that cover one process, DP only (even and uneven), TP only, and both (with more DP
# or more TP ranks); the hybrid and AdamW (the same plan and collectives, other update math) on
# grids that cover DP only, TP only (1x2), both, and four DP ranks (4x1); each overlap mode on a
# grid with both. (Muon on 1x2 and 4x1 was dropped to save launches: 1x4 and 3x1 take the same
# code paths, and the hybrid and AdamW runs keep those two grids' plans covered.)
CASES = ([("muon", dp, tp, "none") for dp, tp in GRIDS]
         + [("hybrid", dp, tp, "none") for dp, tp in [(2, 1), (1, 2), (3, 2)]]
         + [("adamw", dp, tp, "none") for dp, tp in [(2, 2), (4, 1)]]
         + [("muon", 2, 2, "prefetch"), ("hybrid", 3, 2, "naive")])
LAYOUTS = "bucket,owner,aligned"
BUCKET = "1500"
N_MATRICES = len(ODD_SHAPES.split(","))


def verify_args(optimizer, dp, tp, *extra, overlap="none", layouts="bucket"):
    return ["--dp", str(dp), "--tp", str(tp), "--optimizer", optimizer, "--overlap", overlap, "--shapes", ODD_SHAPES,
            "--tp-dims", ODD_TP_DIMS, "--bucket-numel", BUCKET, "--steps", "3", "--layout", layouts, *extra]


@functools.lru_cache(maxsize=None)
def verify_run(optimizer, dp, tp, overlap="none", layouts=LAYOUTS):
    """One verify.py run per case (every layout side by side), shared by the tests that read it."""
    return script("verify.py", *verify_args(optimizer, dp, tp, overlap=overlap, layouts=layouts))


def assert_ledger_is_closed_form(result, optimizer, dp, tp):
    """Every rank's ledger, under every layout, equals the closed form for that rank, phase by phase."""
    problem = build_problem(optimizer, parse_shapes(ODD_SHAPES), parse_tp_dims(ODD_TP_DIMS), 2, 0, tp)
    for layout, res in result["layouts"].items():
        assert len(res["ledger_per_rank"]) == dp * tp
        for rank, ledger in enumerate(res["ledger_per_rank"]):
            expected = step_bytes(problem.groups, dp, tp, int(BUCKET), layout=layout, rank=rank)
            for phase in PHASES:
                assert ledger["phases"].get(phase, {}).get("bytes_sent", 0) == expected[phase], (layout, rank, phase)
            assert ledger["bytes_sent"] == expected["total"], (layout, rank)


@pytest.mark.parametrize("optimizer,dp,tp,overlap", CASES,
                         ids=[f"{o}-{d}x{t}" + ("" if v == "none" else f"-{v}") for o, d, t, v in CASES])
def test_every_layout_matches_reference_bit_for_bit(optimizer, dp, tp, overlap):
    proc = verify_run(optimizer, dp, tp, overlap)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = last_json(proc.stdout)
    assert result["ok"] is True and result["max_abs_diff"] == 0.0
    assert (result["dp"], result["tp"], result["optimizer"]) == (dp, tp, optimizer)
    assert sorted(result["layouts"]) == sorted(LAYOUTS.split(","))
    for layout, res in result["layouts"].items():
        assert res["ok"] and res["max_abs_diff"] == 0.0 and len(res["per_step_max_abs_diff"]) == 3, layout
    assert_ledger_is_closed_form(result, optimizer, dp, tp)


@pytest.mark.parametrize("optimizer,dp,tp", [("muon", dp, tp) for dp, tp in GRIDS] + [("hybrid", 3, 2)])
def test_owner_layouts_orthogonalise_each_matrix_once_and_every_rank_agrees_who(optimizer, dp, tp):
    result = last_json(verify_run(optimizer, dp, tp, "none").stdout)  # the same cached run as above
    muon_matrices = N_MATRICES  # the hybrid routes the same matrices to Muon (biases, embedding: AdamW)
    layouts = result["layouts"]
    assert layouts["bucket"]["ns_calls"] == muon_matrices * dp * tp   # every rank, every matrix
    for layout in ("owner", "aligned"):
        assert layouts[layout]["ns_calls"] == muon_matrices, layout
        assert layouts[layout]["owners_agree"] is True
        assert len(layouts[layout]["owners"]) == muon_matrices
        assert set(layouts[layout]["owners"].values()) <= set(range(dp * tp))


def test_verify_under_torchrun_on_2x2():
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                "scripts/verify.py", *verify_args("hybrid", 2, 2, layouts=LAYOUTS)])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = last_json(proc.stdout)
    assert result["ok"] and result["world_size"] == 4 and result["backend"] == "gloo"
    assert_ledger_is_closed_form(result, "hybrid", 2, 2)


def test_dp_only_byte_ratio_is_exactly_the_papers_bound():
    muon = last_json(verify_run("muon", 4, 1, "none").stdout)["layouts"]
    adamw = last_json(verify_run("adamw", 4, 1, "none").stdout)["layouts"]["bucket"]
    assert muon["bucket"]["ledger"]["bytes_sent"] / adamw["ledger"]["bytes_sent"] == 1.25
    # The owner layout moves less than the bucket layout, summed over ranks (it is uneven per rank).
    total = lambda res: sum(r["bytes_sent"] for r in res["ledger_per_rank"])  # noqa: E731
    assert total(adamw) < total(muon["owner"]) < 1.25 * total(adamw)


# ---- the proof of concept's two bugs: the check must catch each one ----------------------------

def test_bug1_stale_params_is_caught_silently_wrong_case():
    """Equal shapes in two groups: the bug corrupts parameters without crashing. verify must say so."""
    proc = script("verify.py", "--dp", "2", "--shapes", "24x24,24x24", "--tp-dims", "none,none", "--groups", "2",
                  "--poc-bug", "stale-params")
    result = last_json(proc.stdout)
    assert proc.returncode == 1 and result["ok"] is False and result["max_abs_diff"] > 1e-3
    fixed = script("verify.py", "--dp", "2", "--shapes", "24x24,24x24", "--tp-dims", "none,none", "--groups", "2")
    assert fixed.returncode == 0 and last_json(fixed.stdout)["max_abs_diff"] == 0.0


def test_bug1_stale_params_crashes_when_shapes_differ():
    proc = script("verify.py", *verify_args("muon", 2, 1, "--poc-bug", "stale-params"))
    assert proc.returncode == 1 and "failed first" in proc.stderr


def test_bug2_flat_view_reaches_newton_schulz():
    proc = script("verify.py", *verify_args("muon", 2, 1, "--poc-bug", "flat-view"))
    assert proc.returncode == 1
    assert "Newton-Schulz needs a 2-D matrix (or a 3-D batch of them), got a tensor of shape (2052,)" in proc.stderr


def test_bug2_is_hidden_when_every_matrix_is_split_over_tp():
    """The TP gather rebuilds the shape, which is why the bug showed only on some grids."""
    proc = script("verify.py", "--tp", "2", "--shapes", "24x24,24x24", "--tp-dims", "0,1", "--poc-bug", "flat-view")
    assert proc.returncode == 0 and last_json(proc.stdout)["ok"] is True


def test_verify_runs_newton_schulz_options_on_a_grid_bit_for_bit():
    """verify.py --ns-batch --ns-form gram --ns-coefficients polar_express on 3x2: the owner and aligned layouts
    run the options on whole matrices, the reference runs them too, so the match is still exact; each owner
    makes one Newton-Schulz call per distinct shape it owns: 9 matrices of one shape (split over TP by rows,
    by columns or not at all) and a tenth on 6 ranks, so some owner must batch."""
    shapes = ",".join(["36x56"] * 9 + ["20x44"])
    proc = script("verify.py", "--dp", "3", "--tp", "2", "--layout", "owner,aligned", "--shapes", shapes,
                  "--tp-dims", ",".join(["0", "1", "none"] * 3 + ["1"]), "--groups", "1", "--steps", "2", "--ns-batch", "--ns-form", "gram",
                  "--ns-coefficients", "polar_express")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = last_json(proc.stdout)
    assert (result["ns_batch"], result["ns_form"], result["ns_coefficients"]) == (True, "gram", "polar_express")
    sizes = {f"0.{i}": s for i, s in enumerate(shapes.split(","))}
    for layout, res in result["layouts"].items():
        assert res["ok"] and res["max_abs_diff"] == 0.0 and res["state_dict_roundtrip"], layout
        owned = {}
        for matrix, rank in res["owners"].items():
            owned.setdefault(rank, set()).add(sizes[matrix])
        assert res["ns_calls"] == sum(len(s) for s in owned.values()) < len(sizes), (layout, res["owners"])


def test_verify_refuses_newton_schulz_options_it_cannot_run():
    for extra, message in ((["--layout", "bucket", "--ns-batch"], "the bucket layout has no owner"),
                           (["--ns-coefficients", "quartic"], "unknown ns_coefficients 'quartic'"),
                           (["--optimizer", "adamw", "--ns-form", "gram"], "give a Muon optimizer")):
        err = refused(verify_main, "--dp", "2", *extra)
        assert message in err, (extra, err[-500:])


def test_time_model_prices_the_ledgers_busiest_rank():
    """muongrid.lab.timemodel against the engine's ledger (the cached 2x2 run: several buckets, TP-split and
    replicated matrices): the owner layouts' per-pair traffic is what each rank sent and received, and with
    no latency and 1 byte/s each phase lasts the busiest rank's max(sent, received) bytes, exactly, so the
    model orders the layouts as the ledger does."""
    from muongrid.lab import costmodel, timemodel

    dp, tp = 2, 2
    layouts = last_json(verify_run("muon", dp, tp, "none").stdout)["layouts"]
    problem = build_problem("muon", parse_shapes(ODD_SHAPES), parse_tp_dims(ODD_TP_DIMS), 2, 0, tp)
    hw = dict(flops=1.0, efficiency=1.0, ranks_per_node=None, intra=(0.0, 1.0), inter=(0.0, 1.0),
              reduce_scatter_as_all_reduce=False, shared_cores=False)
    modelled, ledgered = {}, {}
    for layout, res in layouts.items():
        ledgers = [r["phases"] for r in res["ledger_per_rank"]]
        if layout != "bucket":
            plan = costmodel.plans_for(problem.groups, dp, tp, int(BUCKET), layout)[0]
            for k, phase in enumerate(("ns_to_owner", "ns_from_owner")):
                calls = [timemodel.owner_traffic(plan, g, b)[k] for g, bs in enumerate(plan.buckets) for b in bs]
                for r, ledger in enumerate(ledgers):
                    got = ledger.get(phase, {})
                    assert sum(sum(c[r]) for c in calls) == got.get("bytes_sent", 0), (layout, phase, r)
                    assert sum(c[q][r] for c in calls for q in range(dp * tp)) == got.get("bytes_recv", 0)
        t = timemodel.step_seconds(problem.groups, dp, tp, int(BUCKET), layout, hw)
        busiest = {p: max(max(lg.get(p, {}).get("bytes_sent", 0), lg.get(p, {}).get("bytes_recv", 0))
                          for lg in ledgers) for p in PHASES}
        assert {p: t[p] for p in PHASES} == busiest, layout
        modelled[layout], ledgered[layout] = t["comm"], sum(busiest.values())
    assert sorted(modelled, key=modelled.get) == sorted(ledgered, key=ledgered.get)
