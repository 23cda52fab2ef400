"""DistributedMuon / DistributedAdamW as torch.optim.Optimizers, in one process (a 1 x 1 grid, no process group).

The distributed behaviour of the same API (every layout on real gloo grids, and the state_dict round
trip on each) is in test_distributed.py; here: param_groups, lr schedulers, closures, zero_grad,
state_dict / load_state_dict and their errors. Tolerance zero throughout: a 1 x 1 grid runs the
same kernels on the same numbers as the single-device optimizer.
"""
from __future__ import annotations

import copy

import pytest
import torch

from muongrid import DistributedAdamW, DistributedMuon, Grid, MuonW
from muongrid.layouts import LAYOUTS
from muongrid.lab.synthetic import build_problem

GRID = Grid.single()
SHAPES = [(12, 20), (16, 8), (9, 9)]


def make(optimizer="hybrid", layout="owner", cls=DistributedMuon, **kw):
    problem = build_problem(optimizer, SHAPES, [-1, -1, -1], 2, seed=3)
    return problem, cls(problem.param_groups(), GRID, layout=layout, bucket_numel=300, **kw)


def set_grads(opt, problem, step):
    grads = problem.grads(step, 0)
    for g in opt.param_groups:
        for n, p in zip(g["names"], g["params"]):
            p.grad = grads[n].clone()


def params_of(opt):
    return [p.detach().clone() for g in opt.param_groups for p in g["params"]]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_is_an_optimizer_and_equals_single_device_muonw(layout):
    problem, opt = make(layout=layout)
    assert isinstance(opt, torch.optim.Optimizer)
    ref = MuonW(problem.param_groups())
    for step in range(1, 4):
        set_grads(opt, problem, step)
        set_grads(ref, problem, step)
        opt.step()
        ref.step()
    assert all(torch.equal(a, b) for a, b in zip(params_of(opt), params_of(ref)))


def test_an_lr_scheduler_changes_the_step_as_a_hand_set_lr_does():
    problem, scheduled = make()
    _, by_hand = make()
    _, constant = make()
    sched = torch.optim.lr_scheduler.LambdaLR(scheduled, lambda epoch: 0.5 ** epoch)
    base = [g["lr"] for g in by_hand.param_groups]
    for step in range(1, 4):
        for g, lr in zip(by_hand.param_groups, base):
            g["lr"] = lr * 0.5 ** (step - 1)
        for opt in (scheduled, by_hand, constant):
            set_grads(opt, problem, step)
            opt.step()
        sched.step()
    assert all(torch.equal(a, b) for a, b in zip(params_of(scheduled), params_of(by_hand)))
    assert not all(torch.equal(a, b) for a, b in zip(params_of(scheduled), params_of(constant)))


def test_step_calls_the_closure_and_returns_its_loss():
    problem, opt = make()
    calls = []

    def closure():
        calls.append(1)
        set_grads(opt, problem, 1)
        return torch.tensor(2.5)

    assert opt.step(closure).item() == 2.5 and calls == [1]


def test_zero_grad_clears_gradients_and_a_step_without_gradients_changes_nothing():
    problem, opt = make()
    set_grads(opt, problem, 1)
    opt.zero_grad()
    assert all(p.grad is None for g in opt.param_groups for p in g["params"])
    before = params_of(opt)
    opt.step()  # as torch: parameters without a gradient are skipped (tests/test_contract.py has the rest)
    assert all(torch.equal(a, b) for a, b in zip(before, params_of(opt)))
    assert all(int(opt.state[p]["step"]) == 0 for g in opt.param_groups for p in g["params"])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cls", [DistributedMuon, DistributedAdamW])
def test_state_dict_round_trip_continues_bit_for_bit(layout, cls):
    problem, opt = make(layout=layout, cls=cls)
    for step in (1, 2):
        set_grads(opt, problem, step)
        opt.step()
    saved = copy.deepcopy(opt.state_dict())
    kinds = {k for st in saved["state"].values() for k in st}
    assert {"master", "step"} <= kinds and ({"momentum"} <= kinds) == (cls is DistributedMuon)
    copies = [dict(g, params=[torch.nn.Parameter(p.detach().clone()) for p in g["params"]]) for g in opt.param_groups]
    twin = cls(copies, GRID, layout=layout, bucket_numel=300)
    twin.load_state_dict(saved)
    assert twin.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    for o in (opt, twin):
        set_grads(o, problem, 3)
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(params_of(opt), params_of(twin)))


def test_loading_a_state_from_another_layout_or_shape_fails_before_changing_anything():
    problem, opt = make(layout="owner")
    set_grads(opt, problem, 1)
    opt.step()
    _, other = make(layout="bucket")
    before = {k: v.clone() for k, v in other.state[other.param_groups[0]["params"][0]].items()}
    with pytest.raises(ValueError, match="another grid or layout .layout: saved owner, here bucket.*muongrid.checkpoint"):
        other.load_state_dict(opt.state_dict())
    after = other.state[other.param_groups[0]["params"][0]]
    assert all(torch.equal(before[k], after[k]) for k in before)
    saved = opt.state_dict()
    first = next(iter(saved["state"].values()))
    first["master"] = first["master"][:1]
    with pytest.raises(ValueError, match="other shapes"):
        make(layout="owner")[1].load_state_dict(saved)


def test_param_groups_are_fixed_once_the_plan_is_built():
    _, opt = make()
    with pytest.raises(RuntimeError, match="plan is fixed"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, 3))]})


def test_a_non_matrix_in_a_muon_group_is_a_clear_error():
    with pytest.raises(ValueError, match="'bias' has shape \\(4,\\) but Muon orthogonalises 2-D matrices and 3-D banks"):
        DistributedMuon([{"params": [torch.nn.Parameter(torch.zeros(4))], "names": ["bias"]}], GRID)


def test_the_default_is_the_owner_layout_and_state_saved_under_the_old_default_says_how_to_load_it():
    """Issue 43: no layout argument runs the layout the book recommends ("owner"), with batched Newton-Schulz only
    on a GPU; a state_dict saved under the old default ("bucket") is refused with the way out in the message."""
    from muongrid.distributed import default_ns_batch

    problem = build_problem("muon", n_groups=2)
    opt = DistributedMuon(problem.param_groups(), GRID)
    assert (opt.layout, opt.ns_batch, opt.overlap) == ("owner", False, "prefetch")
    assert default_ns_batch("owner", torch.device("cuda")) and not default_ns_batch("bucket", torch.device("cuda"))
    assert not default_ns_batch("owner", torch.device("cpu"))
    old = DistributedMuon(problem.param_groups(), GRID, layout="bucket")
    with pytest.raises(ValueError, match="pass layout='bucket' to load this state as it was saved"):
        opt.load_state_dict(old.state_dict())
    DistributedMuon(problem.param_groups(), GRID, layout="bucket").load_state_dict(old.state_dict())
