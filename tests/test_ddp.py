"""The DDP mode (issue 50): ``DistributedMuon(groups, grid, grad_reduce="ddp")`` steps on the gradients
``DistributedDataParallel`` averaged, with ZeRO-1's sharded state and whole matrices on their owner.

Two launches on gloo (``tests/ddp_run.py`` says what each case does): 2 ranks for every case and the comparison
with DDP + ``ZeroRedundancyOptimizer(torch.optim.Muon)``, 3 ranks for the plain and accumulating runs. Every
distributed result is bit for bit against one process given the same gradients (tolerance zero: the same kernels
run on the same numbers). The checks made when an optimizer is built run here, in one process.

    python -m pytest -q tests/test_ddp.py
"""
from __future__ import annotations

import atexit
import functools
import shutil
import sys
import tempfile
import types

import pytest
import torch

from conftest import ROOT, last_json, run
from muongrid import DistributedMuon
from muongrid.grid import Grid


@functools.lru_cache(maxsize=None)
def launch(dp: int, cases: str) -> list[dict]:
    folder = tempfile.mkdtemp(prefix="muongrid-ddp-")   # unique: safe beside other test files
    atexit.register(shutil.rmtree, folder, True)
    cmd = [sys.executable, str(ROOT / "tests" / "ddp_run.py"), "--dp", str(dp), "--cases", cases, "--timeout", "120",
           "--folder", folder]
    proc = run(cmd, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["world"] == dp and len(result["ranks"]) == dp
    return result["ranks"]


def two() -> list[dict]:
    return launch(2, "plain,accumulate,clip,scaler,refused,shards,zero")


def three() -> list[dict]:
    return launch(3, "plain,accumulate")


def runs(ranks: list[dict], case: str) -> list[tuple[int, str, dict]]:
    out = []
    for rank, r in enumerate(ranks):
        value = r[case]
        for name, one in (value.items() if "equal" not in value else [("", value)]):
            if isinstance(one, dict) and "equal" in one:
                out.append((rank, name, one))
    return out


@pytest.mark.parametrize("world", [two, three], ids=["2x1", "3x1"])
@pytest.mark.parametrize("case", ["plain", "accumulate"])
def test_the_ddp_mode_equals_one_process_given_the_same_gradients(world, case):
    """Bit for bit after every step, gradient_as_bucket_view off and on, with a frozen matrix, under no_sync."""
    ranks = world()
    found = runs(ranks, case)
    assert len(found) == len(ranks) * (2 if case == "plain" else 1)
    for rank, name, r in found:
        assert r["equal"] == [True] * 3, (rank, name, r)
        assert r["frozen_kept"], (rank, name)
    prints = {r["fingerprint"] for _, _, r in found}
    assert len(prints) == 1, prints   # every rank ends with the same parameters, bucket views or not


def test_clipping_under_ddp_is_one_process_clipping():
    for rank, name, r in runs(two(), "clip"):
        assert r["equal"] == [True] * 3, (rank, name, r)
        if name == "ours":   # opt.clip_grad_norm_: the norm of the shards equals one process's, bit for bit
            assert r["norms_equal"] == [True] * 3, (rank, r)
    ranks = two()
    assert ranks[0]["clip"]["ours"]["fingerprint"] != ranks[0]["plain"]["bucket_view_off"]["fingerprint"]


def test_grad_scaler_drives_the_ddp_mode_and_skips_an_overflow_on_every_rank():
    for rank, r in enumerate(two()):
        scaler = r["scaler"]
        assert scaler["equal"] == [True] * 3 and scaler["skipped"] == [False] * 3, (rank, scaler)
        assert scaler["same_as_plain"], rank   # a power-of-two scale, unscaled: the plain run's numbers
        assert scaler["inf"]["skipped"] == [False, True, False] and scaler["inf"]["equal"] == [True] * 3, rank


def test_a_ddp_model_without_the_keyword_and_the_keyword_without_ddp_are_refused():
    for r in two():
        refused = r["refused"]
        assert refused["step_mode"] and "DistributedDataParallel" in refused["step_mode"], refused
        assert "grad_reduce='ddp'" in refused["step_mode"], refused["step_mode"]
        assert refused["no_ddp"] and "no DistributedDataParallel holds these parameters" in refused["no_ddp"]
        assert refused["no_ddp_unchanged"]


def test_dp2_moves_no_more_bytes_and_balances_newton_schulz_as_zero_redundancy_muon():
    """On 2 ranks, the same tiny Llama and batches: the most bytes any rank sends in a step (ours: the parameter
    all-gather, nothing else; ZeRO: its broadcasts) is no more than ZeRO's, the busiest rank's Newton-Schulz
    FLOPs no more than ZeRO's, and both optimizers follow the same losses (torch's Muon rounds its bf16
    Newton-Schulz in its own order: 1e-4)."""
    ranks = [r["zero"] for r in two()]
    assert all(r["phases"] == ["param_all_gather"] for r in ranks), [r["phases"] for r in ranks]
    assert max(r["ours_sent"] for r in ranks) <= max(r["zero_sent"] for r in ranks), ranks
    assert max(ranks[0]["ours_flops"]) <= max(ranks[0]["zero_flops"]), ranks[0]
    assert sum(ranks[0]["ours_flops"]) == sum(ranks[0]["zero_flops"])   # the same matrices, once each
    for rank, r in enumerate(ranks):
        assert r["ns_flops_ledger"] == r["ours_flops"][rank]   # what ran is what the plan says
        for a, b in zip(r["losses"]["ours"], r["losses"]["zero"]):
            assert abs(a - b) <= 1e-4 * abs(b), (rank, r["losses"])


def test_shard_files_resume_bit_for_bit_and_refuse_another_world_or_a_missing_file_on_every_rank():
    for rank, r in enumerate(two()):
        shards = r["shards"]
        assert shards["resumed_equal"] and shards["extra"] == {"step": 2}, (rank, shards)
        assert shards["files"] == ["shard-rank0-of-2.pt", "shard-rank1-of-2.pt"]
        assert "failed on ranks 0, 1" in shards["other_world"] and "a world of 4 ranks" in shards["other_world"]
        assert "muongrid.checkpoint" in shards["other_world"], shards["other_world"]
        assert "failed on rank 1 " in shards["missing"] and "shard-rank1-of-2.pt is missing" in shards["missing"]
        assert shards["refusals_changed_nothing"]
        assert shards["dcp_warnings"] == [], shards["dcp_warnings"]   # issue 50: DCP's ShardedTensor notice


# ---- checked when the optimizer is built --------------------------------------------------------------

def one_matrix():
    return [torch.nn.Parameter(torch.ones(4, 3))]


def test_grad_reduce_takes_step_or_ddp_by_name():
    for bad in ("DDP", "backward ", None, True):
        with pytest.raises(ValueError, match="grad_reduce must be one of"):
            DistributedMuon(one_matrix(), Grid.single(), grad_reduce=bad)


def test_ddp_mode_defaults_to_the_aligned_layout_and_refuses_another():
    assert DistributedMuon(one_matrix(), Grid.single(), grad_reduce="ddp").layout == "aligned"
    assert DistributedMuon(one_matrix(), Grid.single()).layout == "owner"
    with pytest.raises(ValueError, match="grad_reduce='ddp' takes layout='aligned'"):
        DistributedMuon(one_matrix(), Grid.single(), grad_reduce="ddp", layout="owner")


def test_ddp_mode_refuses_tensor_parallel_grids():
    from muongrid.options import check_grad_reduce
    with pytest.raises(ValueError, match="needs a data-parallel grid"):
        check_grad_reduce("ddp", "aligned", types.SimpleNamespace(dp=2, tp=2, ep=1))
    check_grad_reduce("ddp", "aligned", types.SimpleNamespace(dp=4, tp=1, ep=1))


def test_grad_scaler_is_refused_outside_the_ddp_mode_only():
    assert DistributedMuon(one_matrix(), Grid.single())._step_supports_amp_scaling
    assert not DistributedMuon(one_matrix(), Grid.single(), grad_reduce="ddp")._step_supports_amp_scaling
