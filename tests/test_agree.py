"""Ranks that always agree (issue 40): a bad gradient, fp16 loss scaling, a caller's autocast or a DDP wrapper
never splits the job. Two launches on gloo (``tests/agree_run.py`` says what each case does): two ranks for
ZeRO-1 2x1, FSDPMuon 2x1, GradScaler, DDP and the plan check's traffic; four for ZeRO-1 2x2 (TP-split
matrices) and an expert grid (4x1, ep 2). One process for autocast.

    python -m pytest -q tests/test_agree.py
"""
from __future__ import annotations

import functools
import sys

import pytest
import torch

from conftest import ROOT, last_json, run

STEPS_BAD = 2   # agree_run.BAD


@functools.lru_cache(maxsize=None)
def launch(dp: int, tp: int, cases: str) -> list[dict]:
    cmd = [sys.executable, str(ROOT / "tests" / "agree_run.py"), "--dp", str(dp), "--tp", str(tp), "--cases", cases,
           "--timeout", "60"]
    proc = run(cmd, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["world"] == dp * tp and len(result["ranks"]) == dp * tp
    return result["ranks"]


def two() -> list[dict]:
    return launch(2, 1, "zero1,fsdp,scaler,ddp,setup")


def four() -> list[dict]:
    return launch(2, 2, "zero1,expert")


CASES = {"zero1 2x1": (two, "zero1"), "fsdp 2x1": (two, "fsdp"), "zero1 2x2": (four, "zero1"),
         "expert 4x1 ep2": (four, "expert")}


@pytest.mark.parametrize("case", list(CASES))
def test_a_nan_on_one_rank_makes_every_rank_raise_at_that_step_with_nothing_changed(case):
    ranks, key = CASES[case]
    results = [r[key]["raise"] for r in ranks()]
    last = len(results) - 1
    for rank, r in enumerate(results):
        assert [(step, unchanged) for step, _, unchanged in r["raised"]] == [(STEPS_BAD, True)], (rank, r["raised"])
        message = r["raised"][0][1]
        assert "NaN/Inf" in message and f"step {STEPS_BAD}" in message, message
        # the rank that found it counts the values; every other rank names that rank (job numbering)
        assert (f"on rank {last} (dp " in message) and ("1 NaN/Inf value(s)" in message) == (rank == last), message
        assert r["equal"] and r["moved"], (rank, "a loop that skipped the batch differs from a run without it")


@pytest.mark.parametrize("case", list(CASES))
def test_defer_skips_the_step_on_every_rank_and_says_so_at_the_next_read(case):
    ranks, key = CASES[case]
    for rank, r in enumerate(ranks()):
        r = r[key]["defer"]
        assert r["raised"] == [] and r["unchanged"] == [True], (rank, r)
        assert all(s == [STEPS_BAD] for s in r["skipped"]), (rank, r["skipped"])   # every optimizer of the model
        assert r["warned"] and all(step == STEPS_BAD + 1 and f"step {STEPS_BAD} was skipped on every rank" in m
                                   for step, m in r["warned"]), (rank, r["warned"])
        assert r["equal"] and r["moved"], (rank, "the skipped step left a trace")
        assert r["same_as_raise"], (rank, "a masked step differs from a plain one")


@pytest.mark.parametrize("case", ["zero1 2x1", "zero1 2x2"])
def test_capturable_skips_the_step_on_every_rank_and_takes_the_plain_steps_bit_for_bit(case):
    """``capturable=True`` (its check is "defer", its step counts masked on the device, its verdict read between
    steps by ``check_finite_now()``): the bad step changes nothing on any rank, is reported right after it, and
    the run ends where the plain "raise" run that never saw the batch ends, bit for bit."""
    ranks, key = CASES[case]
    for rank, r in enumerate(ranks()):
        r = r[key]["capturable"]
        assert r["raised"] == [] and r["unchanged"] == [True], (rank, r)
        assert r["skipped"] == [[STEPS_BAD]], (rank, r["skipped"])
        assert r["warned"] and all(step == STEPS_BAD and f"step {STEPS_BAD} was skipped on every rank" in m
                                   for step, m in r["warned"]), (rank, r["warned"])
        assert r["equal"] and r["moved"] and r["same_as_raise"], (rank, "capturable differs from the plain run")


def test_the_expert_grid_groups_carry_the_job_timeout():
    for r in four():
        assert r["expert"]["raise"]["timeouts"] == ["0:01:00"], r["expert"]["raise"]["timeouts"]


def test_grad_scaler_is_refused_on_every_rank_before_anything_changes():
    for r in two():
        refused = r["scaler"]["refused"]
        assert refused and "torch.amp.GradScaler" in refused and "bfloat16" in refused, refused
        assert r["scaler"]["unchanged"] and r["scaler"]["stepped"]


def test_a_ddp_wrapped_model_is_refused_with_the_fix():
    for r in two():
        refused = r["ddp"]["refused"]
        assert refused and "DistributedDataParallel" in refused and "unwrap the model" in refused, refused
        assert "grad_reduce='ddp'" in refused, refused   # the other fix: the DDP mode


def test_the_plan_check_sends_a_hash_not_the_plan():
    """300 parameters: the whole plan key pickles to kilobytes; the check sends a 64-character digest."""
    for r in two():
        assert r["setup"]["setup_bytes"] and max(r["setup"]["setup_bytes"]) < 100, r["setup"]


def test_a_step_under_a_callers_autocast_equals_the_plain_step_bit_for_bit():
    """The Gram form's fp32 products are what a CPU bf16 autocast would turn into bf16 (1.6e-4 apart, issue 40)."""
    from muongrid import DistributedMuon, Grid, MuonW

    def step(autocast: bool, cls):
        gen = torch.Generator().manual_seed(0)
        w = torch.nn.Parameter(torch.randn(24, 40, generator=gen))
        b = torch.nn.Parameter(torch.randn(40, generator=gen))
        groups = [dict(params=[w], ns_form="gram"), dict(params=[b], use_muon=False)]
        opt = cls(groups, Grid.single()) if cls is DistributedMuon else cls(groups)
        for k in range(2):
            w.grad, b.grad = torch.randn(w.shape, generator=gen), torch.randn(b.shape, generator=gen)
            if autocast:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    opt.step()
            else:
                opt.step()
        return w.detach().clone(), b.detach().clone()

    for cls in (DistributedMuon, MuonW):
        plain, under = step(False, cls), step(True, cls)
        assert all(torch.equal(a, b) for a, b in zip(plain, under)), cls.__name__
