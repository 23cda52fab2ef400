"""``check_finite``'s three modes, on a CPU with real values (``muongrid/finite.py``).

"raise" (the CPU default) stops a step with a NaN/Inf gradient before anything changes; "defer" (the GPU
default, where reading the flag at once would cost a host sync) lets that step run and raises at the next
``step()``, naming the parameter and the step it came from; False checks nothing. Each is held here for
DistributedMuon and FSDPMuon's shared helper, one process (the same code runs on every rank).

    python -m pytest -q tests/test_finite_modes.py
"""
from __future__ import annotations

import pytest
import torch

from muongrid import DistributedAdamW, DistributedMuon, Grid
from muongrid.finite import resolve_mode


def params():
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(12, 8, generator=gen)), torch.nn.Parameter(torch.randn(8, generator=gen))]


def groups(ps):
    return [{"params": [ps[0]], "names": ["w"]}, {"params": [ps[1]], "names": ["b"], "use_muon": False}]


def nan_grads(ps):
    ps[0].grad = torch.full_like(ps[0], float("nan"))
    ps[1].grad = torch.ones_like(ps[1])


def test_the_defaults_follow_the_device():
    assert resolve_mode(None, torch.device("cpu")) == "raise"
    assert resolve_mode(None, torch.device("cuda", 0)) == "defer" and resolve_mode(None, torch.device("meta")) == "defer"
    assert resolve_mode(True, torch.device("meta")) == "raise" and resolve_mode(False, torch.device("cpu")) is None
    with pytest.raises(ValueError, match="check_finite must be True, False, 'raise' or 'defer'"):
        resolve_mode("later", torch.device("cpu"))


def test_raise_stops_the_step_before_anything_changes():
    ps = params()
    opt = DistributedMuon(groups(ps), Grid.single())
    before = [p.detach().clone() for p in ps]
    nan_grads(ps)
    with pytest.raises(FloatingPointError, match=r"gradient of parameter 'w' has 96 NaN/Inf value\(s\) on rank 0"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, ps))


def test_defer_raises_at_the_next_step_naming_the_parameter_and_the_step():
    ps = params()
    opt = DistributedMuon(groups(ps), Grid.single(), check_finite="defer")
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.step()                                   # step 1: finite
    nan_grads(ps)
    opt.step()                                   # step 2: taken (no host read), the check travels
    assert torch.isnan(ps[0]).all()              # what "defer" trades for no sync: the bad step was applied
    for p in ps:
        p.grad = torch.ones_like(p)
    with pytest.raises(FloatingPointError, match=r"parameter 'w' had NaN/Inf values .* step 2; .*reload"):
        opt.step()
    opt.step()                                   # reported once; the next step goes on


def test_defer_is_read_by_check_finite_now_and_off_means_off():
    ps = params()
    opt = DistributedAdamW(groups(ps), Grid.single(), check_finite="defer")
    ps[1].grad = torch.full_like(ps[1], float("inf"))
    ps[0].grad = torch.ones_like(ps[0])
    opt.step()
    with pytest.raises(FloatingPointError, match="parameter 'b'"):
        opt.check_finite_now()
    ps = params()
    opt = DistributedMuon(groups(ps), Grid.single(), check_finite=False)
    nan_grads(ps)
    opt.step()
    opt.step()   # nothing checks
