"""MuonClip's QK-clip (``muongrid/qk_clip.py``): the per-head factors, the row scaling on flat shards, and the
optimizers on five grids against one process, bit for bit, with one collective per step.

tests/qkclip_run.py launches each grid: a head-major fused QKV matrix of 4 heads (split over TP by rows), a
matrix split by columns, a replicated one and a bias; per-head maxima drawn so that some heads are clipped;
DistributedMuon under the bucket, owner and aligned layouts (and FSDPMuon on 2x1) against MuonW on
the DP-mean gradients followed by the same clip on whole matrices. Multiplying rows by a factor is
elementwise, so the shards must give one process's parameters exactly (tolerance 0).

    python -m pytest -q tests/test_qk_clip.py
"""
from __future__ import annotations

import functools
import math
import sys

import pytest
import torch

from conftest import ROOT, last_json, run
from muongrid.lab.devicecheck import simulate
from muongrid.qk_clip import QKClip, QKLayer, _scale_flat_rows_, clip_rows_, factors


def test_factors_clip_only_heads_over_the_threshold():
    f = factors(torch.tensor([50.0, 100.0, 400.0, -3.0]), 100.0)
    assert f.tolist() == [1.0, 1.0, 0.5, 1.0]                 # sqrt(100 / 400) on q and on k: logits / 4
    assert factors(torch.tensor([-math.inf]), 100.0).tolist() == [1.0]


def test_flat_pieces_scale_the_rows_they_hold():
    """A shard's piece of a row-major matrix may start and end mid-row: each element gets its row's factor."""
    matrix, scale = torch.arange(1.0, 36.0).view(7, 5), torch.arange(1.0, 8.0)
    want = matrix * scale.unsqueeze(1)
    for a, b in [(0, 35), (3, 29), (7, 8), (10, 20), (0, 4), (31, 35)]:
        piece = matrix.reshape(-1)[a:b].clone()
        _scale_flat_rows_(piece, scale, a, 5)
        assert torch.equal(piece, want.reshape(-1)[a:b]), (a, b)


def test_the_reference_scales_query_and_key_rows_only():
    layer = QKLayer("qkv", "qkv", ((0, 2), (6, 8)), ((2, 4), (8, 10)))
    w = torch.ones(12, 3)
    for which in ("q", "k"):
        clip_rows_(w, layer, torch.tensor([0.5, 1.0]), which)
    assert w[:, 0].tolist() == [0.5, 0.5, 0.5, 0.5] + [1.0] * 8


def test_bad_clips_are_refused_naming_what_is_wrong():
    layer = QKLayer("w", "w", ((0, 2),), ((2, 4),))
    with pytest.raises(ValueError, match="positive finite"):
        QKClip(0.0, [layer])
    with pytest.raises(ValueError, match="at least one QKLayer"):
        QKClip(10.0, [])
    from muongrid import DistributedMuon, Grid
    p = torch.nn.Parameter(torch.ones(3, 4))
    with pytest.raises(ValueError, match="no parameter named 'w'"):
        DistributedMuon([{"params": [p], "names": ["x"]}], Grid.single(), qk_clip=QKClip(10.0, [layer]))
    with pytest.raises(ValueError, match=r"rows \[\(2, 4\)\] of 'w' fall outside its 3 rows"):
        DistributedMuon([{"params": [p], "names": ["w"]}], Grid.single(), qk_clip=QKClip(10.0, [layer]))


def test_no_host_sync_on_the_meta_device():
    """The clip's maxima, factors and scaling stay on the device: a step with it costs no host sync."""
    from muongrid import DistributedMuon
    layer = QKLayer("w", "w", ((0, 4), (8, 12)), ((4, 8), (12, 16)))

    def worker(grid, comm, args):
        p = torch.nn.Parameter(torch.ones(16 // grid.tp, 6, device=grid.device))
        clip = QKClip(10.0, [layer])
        opt = DistributedMuon([{"params": [p], "names": ["w"], "tp_split_dims": [0]}], grid, comm=comm,
                              layout="owner", qk_clip=clip)
        for _ in range(2):
            p.grad = torch.ones_like(p)
            clip.record(0, torch.ones(2 // grid.tp, device=grid.device), first_head=grid.tp_rank * (2 // grid.tp))
            opt.step()

    audit = simulate(worker, 2, 2, None)
    assert audit.steps == 8 and audit.problems(0) == []


LAUNCHES = {1: ["1x1"], 2: ["2x1", "1x2"], 4: ["2x2"], 6: ["3x2"]}   # the grids of each world size, one launch each


@functools.lru_cache(maxsize=None)
def launch(world: int) -> list:
    grids = LAUNCHES[world]
    dp, tp = grids[0].split("x")
    args = [sys.executable, str(ROOT / "tests" / "qkclip_run.py"), "--dp", dp, "--tp", tp, "--grids", ",".join(grids)]
    proc = run(args + (["--fsdp"] if world == 2 else []), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return last_json(proc.stdout)["ranks"]


@pytest.mark.parametrize("dp, tp, fsdp", [(1, 1, False), (2, 1, True), (1, 2, False), (2, 2, False), (3, 2, False)])
def test_qk_clip_on_shards_equals_one_process(dp, tp, fsdp):
    ranks = [everything[f"{dp}x{tp}"] for everything in launch(dp * tp)]
    assert len(ranks) == dp * tp
    for found in ranks:
        for layout in ("bucket", "owner", "aligned"):
            r = found[layout]
            assert r["max_diff"] == 0.0 and r["clipped"] >= 1, (layout, r)
            assert r["qk_clip_calls"] == 1          # one all-reduce of every head's maximum per step
        if fsdp:
            assert found["fsdp"]["max_diff"] == 0.0
