"""Gradients made by backward land in the optimizer's gradient buffers, and the step does not depend on how the
loop zeroes them (issue 42): ``tests/grad_landing_run.py`` on grids that do not divide the shapes evenly, with
plain TP-local tensors and (TP > 1) DTensor parameters, packed (the default) or bound to the buffers by their
local shards (``param_buffers="all"``).

    python -m pytest -q tests/test_grad_landing.py
"""
from __future__ import annotations

import sys

import pytest

from conftest import ROOT, last_json, run


@pytest.mark.parametrize("dp, tp", [(2, 1), (2, 2)])
def test_both_zero_grad_modes_and_accumulation_give_the_hand_given_step(dp, tp):
    proc = run([sys.executable, str(ROOT / "tests" / "grad_landing_run.py"), "--dp", str(dp), "--tp", str(tp)],
               timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    ranks = last_json(proc.stdout)["ranks"]
    assert len(ranks) == dp * tp
    for rank, found in enumerate(ranks):
        assert found.pop("hooks_removed"), rank   # a collected optimizer leaves no hook on the parameters
        layouts = {"bucket", "owner", "aligned", "group"}
        dtensor = {f"{x}-dtensor{b}" for x in layouts for b in ("", "-bound")} if tp > 1 else set()
        assert set(found) == layouts | dtensor
        for layout, r in found.items():
            # zero_grad() and zero_grad(set_to_none=False), two backwards a step, equal to the summed gradients
            # given by hand, bit for bit, on every step; a gradient that never came stays None
            assert r["equal_none"] == [True] * 3 and r["equal_zero"] == [True] * 3, (rank, layout, r)
            assert r["landed"] and r["skipped_none"], (rank, layout, r)
            # plain parameters and, with param_buffers="all", DTensors' local shards are views of the buffers;
            # by default a DTensor bucket is packed and unpacked (the vector's bucket stays bound)
            assert r["bound"] == [not layout.endswith("-dtensor")] * 5 + [True], (rank, layout, r["bound"])
            if "-dtensor" in layout:   # DTensor parameters, bound or not: the plain tensors' step, bit for bit
                assert r["equal_plain"], (rank, layout, r)
