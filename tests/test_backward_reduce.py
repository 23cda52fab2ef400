"""``grad_reduce="backward"`` (issue 54 part 2, ``muongrid/reducer.py``): the gradient reduce-scatters launched from
backward give the parameters ``grad_reduce="step"`` gives, bit for bit, on 2x1 and 2x2 (odd shapes), with gradient
accumulation (under ``no_sync()`` and without), a matrix with no gradient anywhere and one with none on one rank, a
bf16 parameter, ``clip_grad_norm_`` before a step, and a NaN on one rank under ``check_finite="raise"`` (every rank
raises, nothing changes). One launch per grid (``tests/backward_reduce_run.py``) checks all of it.

    python -m pytest -q tests/test_backward_reduce.py
"""
from __future__ import annotations

import sys

import pytest

from conftest import ROOT, last_json, run

STEPS = ("one", "no_sync", "two_rounds", "nan", "after")


@pytest.mark.parametrize("dp, tp", [(2, 1), (2, 2)])
def test_backward_reduce_equals_step_reduce(dp, tp):
    proc = run([sys.executable, str(ROOT / "tests" / "backward_reduce_run.py"), "--dp", str(dp), "--tp", str(tp),
                "--layouts", "owner,bucket"], timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    ranks = last_json(proc.stdout)["ranks"]
    assert len(ranks) == dp * tp
    for layout in ("owner", "bucket"):
        by_tp = {}
        for rank, found in enumerate(ranks):
            r = found[layout]
            # the same parameters as grad_reduce="step" after every step, bit for bit (fp32 sums in the same
            # buffers and the same reduce-scatter, so nothing may differ)
            assert r["equal"] == [True] * len(STEPS), (rank, layout, r["equal"])
            assert r["buckets"] >= 4, r["buckets"]   # small buckets: a launch order to keep, not one bucket
            issued = r["backward"]["issued"]
            for name in ("one", "after"):   # one backward: at least 90% of the bytes launched under it
                i = issued[name]
                assert i["landing"] >= 0.9 * i["total"] and i["step"] == 0, (rank, name, i)
            # a gradient missing here or anywhere: the rest launched when backward ended, none left for step()
            assert issued["no_sync"]["rounds"] == 1 and issued["no_sync"]["step"] == 0, issued["no_sync"]
            assert sum(issued["no_sync"][k] for k in ("landing", "backward_end")) == issued["no_sync"]["total"]
            assert issued["two_rounds"]["rounds"] == 2   # without no_sync() each backward launches a round
            # check_finite="raise": the same error on every rank in both modes, and no parameter changed
            for mode in ("step", "backward"):
                assert r[mode]["raised"] == {"nan": dict(kind="FloatingPointError", unchanged=True)}, (rank, mode)
            # (an all-to-all's elements are what this rank sends: they differ by rank; the rest are equal shards)
            by_tp.setdefault(found["tp_rank"], []).append([(s, op, phase, n if op != "all_to_all" else None)
                                                           for s, op, phase, n in r["backward"]["ledger"]])
        # every rank of a DP group issued the same collectives in the same order
        for tp_rank, ledgers in by_tp.items():
            assert all(led == ledgers[0] for led in ledgers), (layout, tp_rank)
    refused = ranks[0]["refused"]
    assert "capturable=True needs grad_reduce='step'" in refused["capturable"]
    assert "'backward'" in refused["unknown"]
    assert "FSDPMuon takes no grad_reduce" in refused["fsdp"]
    if tp == 1:
        assert "wrapped in DistributedDataParallel" in refused["ddp"], refused["ddp"]
