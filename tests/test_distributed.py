"""Distributed runs on real gloo process groups, checked against the single-device reference.

Tolerance: zero. Each rank runs the same kernels on the same numbers as the reference (the
gradients are dyadic, so the DP sum is exact in any order; see dmuon/lab/synthetic.py), so any
difference at all is a bug. Shapes divide unevenly by every DP size (padding, straddling
matrices), buckets are small so there are several, and there are several parameter groups.
"""
from __future__ import annotations

import functools
import sys

import pytest

from conftest import ODD_SHAPES, ODD_TP_DIMS, last_json, run, script
from dmuon.lab.costmodel import step_bytes
from dmuon.lab.synthetic import build_problem, parse_shapes, parse_tp_dims

GRIDS = [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4), (3, 1), (2, 4)]
CASES = ([("muon", dp, tp, "none") for dp, tp in GRIDS]
         + [("hybrid", dp, tp, "none") for dp, tp in [(2, 1), (2, 2), (3, 1), (1, 4), (2, 4)]]
         + [("adamw", dp, tp, "none") for dp, tp in [(2, 2), (4, 1), (3, 1)]]
         + [("muon", 2, 2, "prefetch"), ("hybrid", 3, 1, "naive")])  # overlap must not change a bit
BUCKET = "1500"


def verify_args(optimizer, dp, tp, *extra, overlap="none"):
    return ["--dp", str(dp), "--tp", str(tp), "--optimizer", optimizer, "--overlap", overlap, "--shapes", ODD_SHAPES,
            "--tp-dims", ODD_TP_DIMS, "--bucket-numel", BUCKET, "--steps", "3", *extra]


@functools.lru_cache(maxsize=None)
def verify_run(optimizer, dp, tp, overlap="none"):
    """One verify.py run per case, shared by the tests that read it."""
    return script("verify.py", *verify_args(optimizer, dp, tp, overlap=overlap))


def assert_ledger_is_closed_form(result, optimizer, dp, tp):
    problem = build_problem(optimizer, parse_shapes(ODD_SHAPES), parse_tp_dims(ODD_TP_DIMS), 2, 0, tp)
    expected = step_bytes(problem.groups, dp, tp, int(BUCKET))
    phases = result["ledger"]["phases"]
    for phase in ("grad_reduce_scatter", "ns_gather_dp", "ns_gather_tp", "param_all_gather"):
        assert phases.get(phase, {}).get("bytes_sent", 0) == expected[phase], phase
    assert result["ledger"]["bytes_sent"] == expected["total"]


@pytest.mark.parametrize("optimizer,dp,tp,overlap", CASES,
                         ids=[f"{o}-{d}x{t}" + ("" if v == "none" else f"-{v}") for o, d, t, v in CASES])
def test_verify_matches_reference_bit_for_bit(optimizer, dp, tp, overlap):
    proc = verify_run(optimizer, dp, tp, overlap)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = last_json(proc.stdout)
    assert result["ok"] is True and result["max_abs_diff"] == 0.0
    assert (result["dp"], result["tp"], result["optimizer"]) == (dp, tp, optimizer)
    assert len(result["per_step_max_abs_diff"]) == 3
    assert_ledger_is_closed_form(result, optimizer, dp, tp)


def test_verify_under_torchrun_on_2x2():
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                "scripts/verify.py", *verify_args("hybrid", 2, 2)])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = last_json(proc.stdout)
    assert result["ok"] and result["world_size"] == 4 and result["backend"] == "gloo"
    assert_ledger_is_closed_form(result, "hybrid", 2, 2)


def test_dp_only_byte_ratio_is_exactly_the_papers_bound():
    muon = last_json(verify_run("muon", 4, 1).stdout)
    adamw = last_json(verify_run("adamw", 4, 1).stdout)
    assert muon["ledger"]["bytes_sent"] / adamw["ledger"]["bytes_sent"] == 1.25


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
    assert "Newton-Schulz needs a 2-D matrix, got a tensor of shape (2052,)" in proc.stderr


def test_bug2_is_hidden_when_every_matrix_is_split_over_tp():
    """The TP gather rebuilds the shape, which is why the bug showed only on some grids."""
    proc = script("verify.py", "--tp", "2", "--shapes", "24x24,24x24", "--tp-dims", "0,1", "--poc-bug", "flat-view")
    assert proc.returncode == 0 and last_json(proc.stdout)["ok"] is True
