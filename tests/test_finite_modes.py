"""``check_finite``'s three modes, on a CPU with real values (``muongrid/finite.py``).

"raise" (the CPU default) stops a step with a NaN/Inf gradient before anything changes; "defer" (the GPU
default, where reading the flag at once would cost a host sync) makes that step a no-op, masked on the device,
and the next ``step()`` (or ``check_finite_now()``) warns, naming the parameter and the step; False checks
nothing. One process here; ``tests/test_agree.py`` holds the same on grids, where every rank must agree.

    python -m pytest -q tests/test_finite_modes.py
"""
from __future__ import annotations

import pytest
import torch

from muongrid import DistributedAdamW, DistributedMuon, Grid
from muongrid.finite import SkippedStep, resolve_mode


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


def test_defer_skips_the_step_and_says_so_at_the_next_step():
    """The bad step is a no-op (no host read: masked on the device); the next step warns, naming the parameter
    and the step, takes back the step counts, and goes on: the end equals a run that never saw that batch."""
    def run(bad: bool):
        ps = params()
        opt = DistributedMuon(groups(ps), Grid.single(), check_finite="defer")
        for step in (1, 2, 3, 4):
            if step == 2 and not bad:
                continue
            if step == 2:
                nan_grads(ps)
                before = [p.detach().clone() for p in ps] + [t.clone() for p in ps for t in opt.state[p].values()]
                opt.step()   # skipped, with nothing read back
                after = [p.detach().clone() for p in ps] + [t.clone() for p in ps for t in opt.state[p].values()]
                assert all(torch.equal(a, b) for a, b in zip(before[:2], after[:2]))   # parameters as they were
                assert all(torch.equal(a, b) for a, b in zip(before, after) if a.dim())   # state too
                assert all(not torch.isnan(t).any() for t in after)
                continue
            for i, p in enumerate(ps):
                p.grad = torch.full_like(p, 0.5 * step + i)
            if step == 3 and bad:
                with pytest.warns(SkippedStep, match=r"step 2 was skipped on every rank: gradient of parameter 'w' "
                                                     r"had NaN/Inf values on rank 0 \(dp 0, tp 0\)"):
                    opt.step()
            else:
                opt.step()
        return ps, opt
    bad, opt = run(True)
    clean, clean_opt = run(False)
    assert opt.skipped_steps == [2] and clean_opt.skipped_steps == []
    assert all(torch.equal(a, b) for a, b in zip(bad, clean))
    assert all(torch.equal(opt.state[a][k], clean_opt.state[b][k]) for a, b in zip(bad, clean) for k in opt.state[a])
    assert opt.steps_taken == clean_opt.steps_taken == 3


def test_defer_is_read_by_check_finite_now_and_off_means_off():
    ps = params()
    opt = DistributedAdamW(groups(ps), Grid.single(), check_finite="defer")
    before = [p.detach().clone() for p in ps]
    ps[1].grad = torch.full_like(ps[1], float("inf"))
    ps[0].grad = torch.ones_like(ps[0])
    opt.step()
    with pytest.warns(SkippedStep, match="parameter 'b'"):
        assert opt.check_finite_now() == 1
    assert opt.check_finite_now() is None   # reported once
    assert all(torch.equal(a, b) for a, b in zip(before, ps)) and float(opt.state[ps[0]]["step"]) == 0
    ps = params()
    opt = DistributedMuon(groups(ps), Grid.single(), check_finite=False)
    nan_grads(ps)
    opt.step()   # nothing checks: the NaN reaches the parameters, as with torch's optimizers
    assert torch.isnan(ps[0]).all() and opt.skipped_steps == []


def test_defer_steps_equal_raise_steps_bit_for_bit_when_every_gradient_is_finite():
    """The masked step ("defer") takes the same numbers as the plain one when nothing is skipped: Muon with and
    without Nesterov, weight decay, AdamW, a bf16 parameter with its fp32 master."""
    def run(mode):
        gen = torch.Generator().manual_seed(3)
        w = torch.nn.Parameter(torch.randn(12, 8, generator=gen))
        v = torch.nn.Parameter(torch.randn(8, 6, generator=gen).bfloat16())
        b = torch.nn.Parameter(torch.randn(8, generator=gen))
        opt = DistributedMuon([dict(params=[w], weight_decay=0.1), dict(params=[v], nesterov=False, weight_decay=0.05),
                               dict(params=[b], use_muon=False, weight_decay=0.1)], Grid.single(), check_finite=mode)
        for _ in range(3):
            for p in (w, v, b):
                p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
            opt.step()
        return [w, v, b] + [t for p in (w, v, b) for t in opt.state[p].values()]
    assert all(torch.equal(a, b) for a, b in zip(run("raise"), run("defer")))


@pytest.mark.parametrize("fused", [False, True])
def test_adamw_keep_leaves_everything_or_changes_nothing(fused):
    """``keep`` in AdamW's two paths: the loop (where-restored) and torch's fused kernel (its found_inf), reached
    on the CPU: kept, the same bits as without ``keep``; not kept (a NaN gradient), everything as it was."""
    from muongrid.updates import adamw_foreach_

    def start():
        gen = torch.Generator().manual_seed(5)
        return [torch.randn(7, generator=gen), torch.randn(7, generator=gen), torch.randn(7, generator=gen).abs()]

    def run(keep, grad):
        p, m, v = start()
        adamw_foreach_([p], [grad], [m], [v], [4], 0.01, (0.9, 0.95), 1e-8, 0.1, fused=fused, keep=keep)
        return p, m, v
    grad = torch.linspace(-1, 1, 7)
    plain, kept = run(None, grad), run(torch.tensor(True), grad)
    assert all(torch.equal(a, b) for a, b in zip(plain, kept))
    assert not torch.equal(plain[0], start()[0])
    skipped = run(torch.tensor(False), torch.full((7,), float("nan")))
    assert all(torch.equal(a, b) for a, b in zip(skipped, start()))
