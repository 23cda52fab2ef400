"""The convergence study (scripts/convergence_study.py) and the profiled step on DP x TP (scripts/profile_step.py).

* The study's arithmetic (best lr, mean and spread over seeds, tokens to target) on made-up runs
  whose answers are known.
* The study itself at ``--tiny`` size, the same script chapter 9's recorded study ran: every run
  present, the best lr the lowest final loss, the summary the one its runs give.
* The recorded study in ``book/data``: complete, with its command and commit, and its summary
  recomputed from its own runs (so no figure the chapter cites can drift from the data).
* ``profile_step.py --grids`` on a DP grid and a TP grid of a tiny model: both launch, every rank's
  trace is split, and Newton-Schulz shows up for Muon only.
"""
from __future__ import annotations

import json
import math

import pytest

from conftest import ROOT, last_json, refused, script
from muongrid.lab.traces import like_for_like_steps

import convergence_study as study  # the entry point (scripts/ is on pytest's path: pyproject.toml)

RECORDED = ROOT / "book" / "data" / "convergence_study.json"


def fake_run(opt, lr, seed, curve):
    return dict(optimizer=opt, lr=lr, seed=seed, tokens=[0, 100, 200, 300], val_loss=curve, final_val_loss=curve[-1])


def test_tokens_to_reach_interpolates_between_evaluations():
    tokens, curve = [0, 100, 200], [4.0, 3.0, 2.0]
    assert study.tokens_to_reach(tokens, curve, 3.0) == 100
    assert study.tokens_to_reach(tokens, curve, 2.5) == pytest.approx(150)
    assert study.tokens_to_reach(tokens, curve, 4.5) == 0
    assert study.tokens_to_reach(tokens, curve, 1.9) is None


def test_summary_picks_the_best_lr_and_averages_its_seeds():
    runs = [fake_run("adamw", 0.01, 0, [4, 3, 2.5, 2.0]), fake_run("adamw", 0.03, 0, [4, 3.2, 2.8, 2.6]),
            fake_run("adamw", 0.001, 0, [4, 3.5, 3.1, float("nan")]),  # a diverged run is never the best
            fake_run("adamw", 0.01, 1, [4, 3, 2.5, 2.2]),
            fake_run("hybrid", 0.01, 0, [4, 2.5, 2.0, 1.5]), fake_run("hybrid", 0.02, 0, [4, 2.6, 2.1, 1.6]),
            fake_run("hybrid", 0.01, 1, [4, 2.5, 2.0, 1.7])]
    s = study.summarise(runs, None)
    assert s["best_lr"] == {"adamw": 0.01, "hybrid": 0.01}
    assert s["best_at_edge"] == {"adamw": False, "hybrid": True}
    a, h = s["curves"]["adamw"], s["curves"]["hybrid"]
    assert a["seeds"] == [0, 1] and a["mean"][-1] == pytest.approx(2.1) and a["std"][-1] == pytest.approx(math.sqrt(0.02))
    assert s["final_gap"] == pytest.approx(2.1 - 1.6)
    # the hybrid's mean (4, 2.5, 2.0, 1.6) reaches AdamW's final 2.1 between 100 and 200 tokens: at 180
    assert s["hybrid_tokens_to_adamw_final"] == pytest.approx(180)
    assert s["hybrid_fraction_of_adamw_tokens"] == pytest.approx(0.6)
    assert s["adamw_tokens_to_hybrid_final"] is None


def test_tiny_study_runs_every_setting_and_summarises_them(tmp_path):
    out = tmp_path / "study.json"
    proc = script("convergence_study.py", "--tiny", "--lrs-adamw", "0.01,0.03", "--lrs-hybrid", "0.01,0.03",
                  "--seeds", "2", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    printed, written = last_json(proc.stdout), json.loads(out.read_text())
    assert printed == written and written["complete"]
    assert written["command"].startswith("python scripts/convergence_study.py --tiny") and written["commit"]
    runs = written["runs"]
    assert len(runs) == 2 + 2 + 2
    s = written["summary"]
    for opt in ("adamw", "hybrid"):
        sweep = [r for r in runs if r["optimizer"] == opt and r["seed"] == 0]
        assert s["best_lr"][opt] == min(sweep, key=lambda r: r["final_val_loss"])["lr"]
        assert s["curves"][opt]["seeds"] == [0, 1]
        assert all(r["val_loss"][-1] < r["val_loss"][0] for r in runs if r["optimizer"] == opt)
    assert json.loads(json.dumps(study.summarise(runs, None))) == s
    assert "gap at" in proc.stdout


def test_recorded_study_is_complete_and_its_summary_follows_from_its_runs():
    r = json.loads(RECORDED.read_text())
    assert r["complete"] and r["commit"] and r["command"].startswith("python scripts/convergence_study.py")
    assert len(r["lrs"]["adamw"]) >= 3 and len(r["lrs"]["hybrid"]) >= 3 and r["settings"]["seeds"] >= 3
    assert json.loads(json.dumps(study.summarise(r["runs"], None))) == r["summary"]
    for opt in ("adamw", "hybrid"):
        assert len(r["summary"]["curves"][opt]["seeds"]) == r["settings"]["seeds"]


def test_profile_step_compares_a_dp_and_a_tp_grid(tmp_path):
    proc = script("profile_step.py", "--grids", "2x1,1x2", "--global-batch", "4", "--steps", "1", "--warmup", "1",
                  "--width", "32", "--layers", "1", "--heads", "2", "--out", str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    r = last_json(proc.stdout)
    assert [(g["dp"], g["tp"], g["batch_per_replica"]) for g in r["grids"]] == [(2, 1, 2), (1, 2, 4)]
    for g in r["grids"]:
        assert len(g["ranks"]) == 2
        for rank in g["ranks"]:
            assert rank["muon"]["newton_schulz"] > 0 and rank["adamw"]["newton_schulz"] == 0
        same_fb = like_for_like_steps(g["ranks"])
        # the ratio is the like-for-like one; no timing order is asserted: on this tiny model one measured
        # step of AdamW can take longer than Muon's on a busy machine (seen once: 0.64)
        assert g["muon_over_adamw"] == pytest.approx(same_fb["muon"] / same_fb["adamw"])
    assert (tmp_path / "1x2" / "trace_rank1.json").exists()
    assert r["fastest_for_muon"] and set(r["fastest_for_muon"]) <= {"2x1", "1x2"}  # one, or a tie within the noise
    for g in r["grids"]:  # the verdict reads each step's slowest rank
        assert len(g["muon_step_ms_all"]) == 1 and g["muon_step_ms_all"][0] == max(x["muon"]["step_all"][0] for x in g["ranks"])


def test_profile_step_refuses_a_grid_it_cannot_split():
    import profile_step

    assert "--global-batch 4 must divide by dp" in refused(profile_step.main, "--grids", "3x1", "--global-batch", "4")
    assert "give DPxTP grids" in refused(profile_step.main, "--grids", "4y1")
