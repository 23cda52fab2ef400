"""Checkpoints saved by muongrid 0.4 still load (issue 53): the ones in ``tests/data/checkpoint_0_4/``, made at
commit f5d494a by ``tests/data/make_checkpoint_0_4.py`` (its docstring says what they hold).

Both forms a user keeps are loaded into a freshly built optimizer of the same model, which then takes the step
the 0.4 optimizer took after saving: its parameters must equal 0.4's bit for bit (the same kernels on the same
numbers, one process; a state loaded wrong, or a step that changed its arithmetic, would differ).

    PYTHONPATH=scripts python -m pytest -q tests/test_old_checkpoint.py
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from muongrid import DistributedMuon, Grid, checkpoint

DATA = Path(__file__).resolve().parent / "data"
SAVED = DATA / "checkpoint_0_4"


def _maker():
    spec = importlib.util.spec_from_file_location("make_checkpoint_0_4", DATA / "make_checkpoint_0_4.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("form", ["state_dict", "dcp"])
def test_a_0_4_checkpoint_resumes_bit_for_bit(form):
    make, expected = _maker(), torch.load(SAVED / "next.pt", weights_only=True)
    params = make.params()   # values overwritten below: the saved ones
    with torch.no_grad():
        for p, saved in zip(params, expected["params"]):
            p.copy_(saved)
    opt = DistributedMuon(make.groups(params), Grid.single(), check_finite="raise")
    if form == "state_dict":
        opt.load_state_dict(torch.load(SAVED / "rank0.pt", weights_only=True))
    else:
        assert checkpoint.load(opt, SAVED / "dcp") == 2
        assert all(torch.equal(p, s) for p, s in zip(params, expected["params"]))   # the model's weights too
    assert [int(opt.state[p]["step"]) for p in params] == [2, 2, 2]
    for p, g in zip(params, expected["grads"]):
        p.grad = g.clone()
    opt.step()
    for name, p, after in zip("w1 w2 gain".split(), params, expected["after"]):
        assert torch.equal(p.detach(), after), name
