"""``scripts/iteration_bench.py`` counts what each data-parallel option moves and runs, and the counts are the closed
forms': one short launch (3 gloo ranks, a one-layer Llama, one timed iteration), whose
checks the script makes itself (bytes per rank equal to ``costmodel``'s, every gradient reduced once, ZeRO's owners,
each matrix orthogonalised once, the first losses within 1e-4 of ZeRO's) and whose counts are read here. Times are
printed by the script and never asserted. Chapter 13 runs the same checks on a Llama and a GPT-2 with tied
embeddings, two layers each (its build fails if one fails).

    python -m pytest -q tests/test_iteration_bench.py
"""
from __future__ import annotations

import pytest

from conftest import last_json, refused, script
from muongrid.lab.iteration import OURS
from muongrid.newton_schulz import ns5_flops

DP = 3   # uneven: buckets pad, ZeRO's greedy owners and ours differ


@pytest.fixture(scope="module")
def record():
    proc = script("iteration_bench.py", "--dp", str(DP), "--models", "llama:32x1", "--runs", "1",
                  "--iters", "1", "--probes", "1", "--batch", "6", "--seq", "16", "--scale", "8", timeout=600)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return last_json(proc.stdout)


def test_every_count_check_passes(record):
    assert record["ok"] and not record["failed"]
    checks = [c for r in record["results"] for c in r["checks"]]
    assert len(checks) >= 8 * 4, checks   # eight options, at least four checks each
    assert [r["model"]["kind"] for r in record["results"]] == ["llama"]


def test_who_moves_what_where(record):
    for result in record["results"]:
        options = result["options"]
        torch_, zero = options["torch"], options["zero"]
        # DDP reduces under backward, torch's Muon moves nothing in step(); ZeRO adds one broadcast per parameter
        assert torch_["by_stage"]["backward"]["calls"] == len(torch_["buckets"]) >= 1
        assert "step" not in torch_["by_stage"]
        assert zero["by_stage"]["step"]["calls"] > 0 and zero["buckets"] == torch_["buckets"]
        assert zero["by_stage"]["step"]["bytes"] == zero["bytes_per_rank"][0] - torch_["bytes_per_rank"][0]
        for name in OURS:
            if name != "backward":
                assert set(options[name]["by_stage"]) == {"step"}
        # grad_reduce="backward": the owner layout's collectives, its gradient reduce-scatters moved into backward
        owner, backward = options["owner"], options["backward"]
        assert backward["bytes_per_rank"] == owner["bytes_per_rank"]
        assert backward["by_stage"]["backward"]["calls"] + backward["by_stage"]["step"]["calls"] == \
            owner["by_stage"]["step"]["calls"]
        # the gate of issue 54: ours moves fewer bytes per rank than DDP + ZeRO, under every layout here
        for name in ("owner", "aligned", "group"):
            assert max(options[name]["bytes_per_rank"]) < min(zero["bytes_per_rank"])
        # the ballot is ours alone (the DDP mode decides without one), timed as its own part
        for name, row in options.items():
            assert (row["parts"]["ballot"] > 0) == (name in OURS), (name, row["parts"])


def test_newton_schulz_work_per_rank(record):
    for result in record["results"]:
        options = result["options"]
        every = options["torch"]["ns_flops_per_rank"]
        assert len(set(every)) == 1   # DDP + torch.optim.Muon: every rank orthogonalises every matrix
        total = every[0]
        assert total == sum(ns5_flops(*s) for g in result["groups"] if g["use_muon"] for s in g["shapes"])
        assert options["bucket"]["ns_flops_per_rank"] == every
        for name in ("zero", "owner", "aligned"):   # each matrix once, on its owner
            per_rank = options[name]["ns_flops_per_rank"]
            assert sum(per_rank) == total and max(per_rank) < total
        # ours owns by Newton-Schulz FLOPs, ZeRO by elements: ours is never less balanced here
        assert max(options["owner"]["ns_flops_per_rank"]) <= max(options["zero"]["ns_flops_per_rank"])


def test_bad_arguments_are_refused_before_anything_starts():
    from iteration_bench import main
    assert "--warmup >= 2" in refused(main, "--warmup", "1")
    assert "unknown" in refused(main, "--variants", "torch,adam")
    assert "KIND:HIDDENxLAYERS" in refused(main, "--models", "llama-256")


def test_the_ballot_is_its_own_part_not_update():
    """Our step's first collective, the ballot (phase "contract"), waits there for the slowest rank's backward: its
    seconds are the part "ballot", taken out of "update" with the ledger's phases (here a stub optimizer records
    them, so the arithmetic is checked exactly, with no launch and no clock asserted)."""
    import torch
    from muongrid.comm import Ledger, Record
    from muongrid.lab.iteration import Clock, Variant, iterate

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2))

        def forward(self, input_ids, labels, use_cache):
            return type("Out", (), dict(loss=(self.w * input_ids).sum()))

    class Ours(torch.optim.SGD):
        grad_reduce = "step"

        def __init__(self, params):
            super().__init__(params, lr=0.1)
            self.comm = type("Comm", (), dict(ledger=Ledger()))()

        def step(self):
            ledger = self.comm.ledger
            ledger.begin_step(ledger.step + 1)
            for phase, seconds in (("contract", 0.25), ("grad_reduce_scatter", 0.125), ("ns_to_owner", 0.0625),
                                   ("param_all_gather", 0.03125)):
                ledger.records.append(Record(ledger.step, phase, "all_reduce", "world", 2, "int32", 1, 8, 8, seconds))

    model = Model()
    ours = Ours(model.parameters())
    v = Variant("owner", model, model, [ours], Clock(torch.device("cpu")), ours=ours)
    out = iterate(v, torch.ones(2))
    assert out["ballot"] == 0.25 and out["reduction"] == 0.125 and out["exchange"] == 0.0625
    assert out["update"] == pytest.approx(out["step"] - 0.25 - 0.125 - 0.0625 - 0.03125, abs=1e-12)
