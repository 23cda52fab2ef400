"""Hugging Face ``Trainer`` with ``DistributedMuon(grad_reduce="ddp")`` and ``muongrid.hf.ShardedCheckpoint``
(issue 50): one ``torchrun`` job of 2 gloo ranks (a straight run, a resume at step 2, and a save and resume
without the callback: ``tests/hf_trainer_run.py``), then one process resuming the 2-rank checkpoint through the
resharded copy. A tiny Llama from a config; gradient accumulation 2, bf16 autocast (and one fp16 run: Trainer's
GradScaler), Trainer's default gradient clipping and scheduler.

    python -m pytest -q tests/test_hf_trainer.py
"""
from __future__ import annotations

import functools
import sys

import pytest

from conftest import ROOT, last_json, run

pytest.importorskip("accelerate")


@functools.lru_cache(maxsize=None)
def job(folder: str) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "tests" / "hf_trainer_run.py"), "--out", folder]
    proc = run(cmd, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return last_json(proc.stdout)["ranks"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hf_trainer"))


def test_trainer_ranks_agree_and_a_resume_at_step_2_ends_bit_for_bit_where_the_straight_run_ends(folder):
    ranks = job(folder)
    assert len(ranks) == 2
    for rank, r in enumerate(ranks):
        assert r["world"] == 2 and r["equal_ranks"] and r["moved"], (rank, r)
        assert r["resumed_equal"], (rank, "the resumed run's parameters differ from the straight run's")
        assert r["resumed_losses"] == r["losses"] and len(r["losses"]) == 4, r
        # Trainer's own files, plus every rank's shard and the resharded copy; the limit kept only checkpoint-4
        assert {"optimizer.pt", "scheduler.pt", "rng_state_1.pth", "muongrid-shards", "muongrid-checkpoint"} \
            <= set(r["kept"]), r["kept"]
        assert r["shards"] == ["shard-rank0-of-2.pt", "shard-rank1-of-2.pt"] and r["last"] == ["checkpoint-4"]


def test_fp16_runs_with_trainers_grad_scaler_and_the_ranks_agree(folder):
    for rank, r in enumerate(job(folder)):
        assert r["fp16_equal_ranks"] and r["fp16_moved"] and len(r["fp16_losses"]) == 2, (rank, r)


def test_without_the_callback_the_resume_stops_on_every_rank_naming_it(folder):
    for rank, r in enumerate(job(folder)):
        assert r["bare"] and "ShardedCheckpoint" in r["bare"], (rank, r["bare"])
        assert "every rank stops here" in r["bare"] and "failed on rank 1" in r["bare"], r["bare"]


def test_one_process_continues_a_two_rank_checkpoint_through_the_resharded_copy(folder):
    """Another world size: the same global batch (4 rows per step on one rank), the optimizer state resharded.
    Step 3's loss is computed on the restored parameters (bit for bit); step 4's differs in the last digits
    (one process sums the batch's gradient in another order, and bf16 autocast rounds it otherwise), and the
    parameters stay within a quarter of how far the run moved them."""
    job(folder)
    proc = run([sys.executable, str(ROOT / "tests" / "hf_trainer_run.py"), "--out", folder, "--reshard-from", folder],
               timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    r = last_json(proc.stdout)
    assert r["losses"][:3] == r["straight_losses"][:3], r
    assert abs(r["losses"][3] - r["straight_losses"][3]) <= 1e-4 * abs(r["straight_losses"][3]), r
    assert r["max_abs_diff"] <= 0.25 * r["moved"], r
