"""``check_finite``'s three modes, on a CPU with real values (``muongrid/finite.py``).

"raise" (the CPU default) stops a step with a NaN/Inf gradient before anything changes; "defer" (the GPU
default, where reading the flag at once would cost a host sync) skips that step on every rank of a job, masked on
the device, and warns at the next read (``tests/test_agree.py``, on grids); on one process the step is taken and
the next ``step()`` (or ``check_finite_now()``) raises, naming the parameter and the step; False checks nothing.

    python -m pytest -q tests/test_finite_modes.py
"""
from __future__ import annotations

import pytest
import torch

from muongrid import DistributedAdamW, DistributedMuon, Grid
from muongrid.optim import resolve_mode


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


def test_defer_on_one_process_takes_the_step_and_raises_at_the_next():
    """One process has no one to disagree with: its bad step runs unmasked (no extra pass over the gradients)
    and the next step raises, naming the parameter and the step, before it changes anything; reported once.
    Several ranks skip the step together instead (tests/test_agree.py)."""
    ps = params()
    opt = DistributedMuon(groups(ps), Grid.single(), check_finite="defer")
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.step()                                   # step 1: finite
    nan_grads(ps)
    opt.step()                                   # step 2: taken (no host read)
    assert torch.isnan(ps[0]).all()
    for p in ps:
        p.grad = torch.ones_like(p)
    held = [p.detach().clone() for p in ps]
    with pytest.raises(FloatingPointError, match=r"parameter 'w' had NaN/Inf values on rank 0, step 2; .*reload"):
        opt.step()
    assert torch.equal(held[1], ps[1]) and opt.steps_taken == 2   # the raising step changed nothing
    assert opt.check_finite_now() is None        # reported once
    opt.step()
    assert opt.steps_taken == 3


def test_defer_is_read_by_check_finite_now_and_off_means_off():
    ps = params()
    opt = DistributedAdamW(groups(ps), Grid.single(), check_finite="defer")
    ps[1].grad = torch.full_like(ps[1], float("inf"))
    ps[0].grad = torch.ones_like(ps[0])
    opt.step()
    with pytest.raises(FloatingPointError, match="parameter 'b'"):
        opt.check_finite_now()
    assert opt.check_finite_now() is None
    ps = params()
    opt = DistributedMuon(groups(ps), Grid.single(), check_finite=False)
    nan_grads(ps)
    opt.step()   # nothing checks: the NaN reaches the parameters, as with torch's optimizers
    assert torch.isnan(ps[0]).all() and opt.check_finite_now() is None


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_defer_on_one_process_finds_a_muon_matrix_by_its_update(bad, nesterov):
    """One process under "defer" reads no Muon gradient for the check: the norm of each matrix's update (made in
    the step) is not finite exactly when its gradient held a NaN or an Inf (``finite.late_codes``). One bad
    element of one matrix, of each kind, with and without Nesterov, is found and named at the next read, and a
    finite step beside it is not."""
    gen = torch.Generator().manual_seed(1)
    ps = [torch.nn.Parameter(torch.randn(12, 8, generator=gen)), torch.nn.Parameter(torch.randn(6, 8, generator=gen)),
          torch.nn.Parameter(torch.randn(8, generator=gen))]
    opt = DistributedMuon([{"params": ps[:2], "names": ["w", "v"], "nesterov": nesterov},
                           {"params": ps[2:], "names": ["b"], "use_muon": False}], Grid.single(), check_finite="defer")
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()
    assert opt.check_finite_now() is None
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen)
    ps[1].grad[3, 5] = bad
    opt.step()
    with pytest.raises(FloatingPointError, match=r"parameter 'v' had NaN/Inf values on rank 0, step 2"):
        opt.check_finite_now()


def test_muon_keep_changes_nothing_when_false_and_nothing_else_when_true():
    """The masked Muon pieces (``updates.py``'s ``keep``): kept, the same bits as the plain functions; not kept
    (a NaN gradient), the momentum and the master as they were. Grids run them in tests/test_agree.py."""
    from muongrid.updates import apply_update_foreach_, muon_momentum_foreach_

    def run(keep, grad, nesterov):
        gen = torch.Generator().manual_seed(7)
        buf, master = torch.randn(5, 4, generator=gen), torch.randn(5, 4, generator=gen)
        out = muon_momentum_foreach_([buf], [grad], 0.9, nesterov, keep)
        apply_update_foreach_([master], [o.clone() for o in out], 0.02, 0.1, 0.05, keep)
        return buf, master
    grad = torch.linspace(-2, 2, 20).view(5, 4)
    for nesterov in (True, False):
        plain, kept = run(None, grad, nesterov), run(torch.tensor(True), grad, nesterov)
        assert all(torch.equal(a, b) for a, b in zip(plain, kept))
        before = run(torch.tensor(False), torch.zeros(5, 4), nesterov)   # momentum toward itself: nothing moves
        skipped = run(torch.tensor(False), torch.full((5, 4), float("nan")), nesterov)
        gen = torch.Generator().manual_seed(7)
        start = (torch.randn(5, 4, generator=gen), torch.randn(5, 4, generator=gen))
        assert all(torch.equal(a, b) for a, b in zip(skipped, start)) and all(torch.equal(a, b) for a, b in zip(before, start))


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
