"""Expert parallelism: a MoE's dense groups on the job's grid and its expert banks on ``grid.expert(ep)``, against
one process, bit for bit (tests/ep_run.py says how the reference is built).

On EP 2 x DP 2 (4 ranks: each expert slice on two replicas, which average its gradients, shard its state and
place its Newton-Schulz) with the model's gradients clipped together by the global norm, on EP 4 (every rank
its own slice: no DP for the experts), and on EP 2 x TP 2; each under the owner, aligned and bucket layouts.
Gradients are integers, so every mean is exact and the only question is whether the right numbers meet.

    python -m pytest -q tests/test_expert_parallel.py
"""
from __future__ import annotations

import functools
import sys

import pytest
import torch

from conftest import ROOT, last_json, run
from muongrid import Grid


CONFIGS = {"4x1:2:clip": (4, 1, 2), "4x1:4": (4, 1, 4), "2x2:2": (2, 2, 2)}   # all on 4 ranks: one launch


@functools.lru_cache(maxsize=None)
def launch() -> dict:
    cmd = [sys.executable, str(ROOT / "tests" / "ep_run.py"), "--dp", "4", "--tp", "1", "--configs", ",".join(CONFIGS)]
    proc = run(cmd, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return last_json(proc.stdout)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_expert_parallel_moe_equals_one_process(config):
    dp, tp, ep = CONFIGS[config]
    result = launch()
    assert len(result["ranks"]) == dp * tp
    for rank, everything in enumerate(result["ranks"]):
        found = everything[config]["layouts"]
        assert (everything[config]["dp"], everything[config]["tp"]) == (dp, tp)
        for layout in ("owner", "aligned", "bucket"):
            r = found[layout]
            assert max(r["diff"].values()) == 0.0, (rank, layout, r["diff"])
            assert r["moved"] > 1e-4
            assert r["expert_grid"]["dp"] == dp // ep          # the slice's replicas form the expert grid's DP
            assert ("grad_reduce_scatter" in r["expert_phases"]) == (dp // ep > 1)


def test_an_expert_checkpoint_holds_each_bank_whole_and_loads_on_another_ep(tmp_path):
    """Saved on EP 2 (tests/ep_checkpoint_run.py), loaded on EP 4 and on EP 1 (every rank the whole bank) and
    saved again: every tensor of the checkpoints equal bit for bit, each bank stored whole (4 experts), and
    every rank's experts equal to their rows of the first save, before and after the loads; and an expert
    optimizer of 2-D matrices refused."""
    cmd = [sys.executable, str(ROOT / "tests" / "ep_checkpoint_run.py"), "--dp", "4", "--tp", "1", "--out", str(tmp_path)]
    proc = run(cmd, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    ranks = last_json(proc.stdout)["ranks"]
    assert len(ranks) == 4
    for rank, report in enumerate(ranks):
        assert len(report["rows_match"]) == 6 and all(report["rows_match"].values()), (rank, report["rows_match"])
    exports = ranks[0]["exports"]
    assert set(exports) == {"ep4", "ep1"}
    for ep, found in exports.items():
        assert found["keys_equal"] and found["unequal"] == [], (ep, found)
        assert found["marker_ep"] == 2
        assert all(shape[0] == 4 for shape in found["shapes"].values()), found["shapes"]
    assert ranks[0]["moved"] > 1e-4   # the saved experts had trained: a load of zeros would show
    for report in ranks:   # one expert per 2-D matrix is not a bank: refused by name, nothing written
        assert "parameter 'expert.w' has shape (8, 8) on an expert grid" in report["refused"]
    assert not (tmp_path / "matrix").exists() and not (tmp_path / "matrix.partial").exists()


def test_expert_grids_refuse_what_they_cannot_do_yet():
    grid = Grid.single()
    with pytest.raises(ValueError, match="ep=3 must divide dp=1"):
        grid.expert(3)
    expert = grid.expert(1)
    assert (expert.dp, expert.ep) == (1, 1)
    with pytest.raises(ValueError, match="already an expert grid"):
        Grid(2, 1, 0, 0, 0, None, None, torch.device("cpu"), ep=2).expert(2)


def test_an_expert_grid_on_the_meta_device_stays_on_the_device_with_no_sync():
    """A dense and an expert optimizer on 4 x 2 (ep 2), every rank simulated on meta (NCCL's view)."""
    from muongrid import DistributedMuon
    from muongrid.lab.devicecheck import simulate

    def worker(grid, comm, args):
        experts = grid.expert(2)
        bank = torch.nn.Parameter(torch.ones(3, 8, 6, device=grid.device))
        dense = torch.nn.Parameter(torch.ones(8, 6, device=grid.device))
        opts = [DistributedMuon([dense], grid, comm=comm, layout="owner"),
                DistributedMuon([bank], experts, layout="owner")]
        for _ in range(2):
            for p in (bank, dense):
                p.grad = torch.ones_like(p)
            for opt in opts:
                opt.step()

    audit = simulate(worker, 4, 2, None)
    assert audit.steps == 32 and audit.problems(0) == []
