"""A ``capturable=True`` step replayed as a CUDA graph replays it, simulated on the CPU (issue 53).

A CUDA graph records a step's kernels once and replays them: no Python runs at a replay, so nothing the optimizer
keeps on the host (the deferred NaN/Inf check's bookkeeping, ``steps_taken``) advances. No GPU is lent here, so
``Replay`` does the same on the CPU: a ``TorchDispatchMode`` records every aten op one ``step()`` dispatches
(function, arguments, results), and ``replay()`` runs exactly those ops again, each argument that an earlier op
made replaced by what that op makes now, every other tensor (parameters, gradients, state, the device
hyperparameters) the same object, as a graph's fixed addresses are. No optimizer code runs at a replay.

* The replays are the steps: replayed with new gradients written in place, the parameters equal those of an
  optimizer stepped eagerly on the same gradients, bit for bit (so the record holds the whole step).
* The deferred check sees the replays (the bug issue 53 found by reading: after the first ``check_finite_now()``
  the host's pending record stayed empty, so a NaN in a later replay was never reported): one process takes a
  bad step and the next read raises; with a verdict (several ranks) the skipped replays are counted and named.

    python -m pytest -q tests/test_replay.py
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from muongrid import DistributedMuon, Grid
from muongrid.finite import Deferred, SkippedStep

SHAPES = [(12, 10), (7, 10), (10,)]


class Replay(TorchDispatchMode):
    """Record the aten ops of a block; ``replay()`` runs them again on the same tensors (see the docstring)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace != "profiler":   # record_function's ranges: not kernels
            self.ops.append((func, args, kwargs, out))   # the results kept alive: their ids stay theirs
        return out

    def replay(self) -> None:
        made: dict[int, torch.Tensor] = {}

        def now(x):
            return made.get(id(x), x) if isinstance(x, torch.Tensor) else x

        with torch.no_grad():
            for func, args, kwargs, out in self.ops:
                new = func(*tree_map(now, args), **tree_map(now, kwargs))
                for old, fresh in zip(tree_leaves(out), tree_leaves(new)):
                    if isinstance(old, torch.Tensor):
                        made[id(old)] = fresh


def build():
    params = [torch.nn.Parameter(torch.randn(s, generator=torch.Generator().manual_seed(0))) for s in SHAPES]
    groups = [dict(params=params[:2], names=["a", "b"], lr=0.02, weight_decay=0.1),
              dict(params=params[2:], names=["g"], use_muon=False, lr=1e-3, weight_decay=0.05)]
    return DistributedMuon(groups, Grid.single(), capturable=True), params   # check_finite: "defer"


def gradients(k: int, nan_in: str | None = None) -> list[torch.Tensor]:
    grads = [torch.randn(s, generator=torch.Generator().manual_seed(100 + k)) for s in SHAPES]
    if nan_in is not None:
        grads["abg".index(nan_in)].view(-1)[3] = float("nan")
    return grads


def fill(params: list, grads: list) -> None:
    for p, g in zip(params, grads):
        if p.grad is None:
            p.grad = torch.empty_like(p)
        p.grad.copy_(g)   # in place: where a captured backward leaves them


def test_replayed_steps_are_the_steps_and_a_nan_in_a_replay_is_reported():
    opt, params = build()
    fill(params, gradients(1))
    opt.step()   # warm-up (as before a capture): the deferred record is made here
    fill(params, gradients(2))
    with Replay() as graph:   # "capture" step 2
        opt.step()
    assert opt.check_finite_now() is None
    for k in (3, 4):
        fill(params, gradients(k))
        graph.replay()
    reference, ref_params = build()
    for k in (1, 2, 3, 4):
        fill(ref_params, gradients(k))
        reference.step()
    for name, p, q in zip("abg", params, ref_params):
        assert torch.equal(p, q), name
    for k, bad in ((5, "g"), (6, "a"), (7, None)):   # AdamW's gradient checked, then a Muon matrix's update
        fill(params, gradients(k, bad))
        graph.replay()
    # step 5: g's gradient; 6: a's; 7: a's momentum still holds the NaN (its update is what one process checks)
    with pytest.raises(FloatingPointError, match=r"parameter 'a' had NaN/Inf values on rank 0, 3 steps, 5 to 7,"):
        opt.check_finite_now()
    assert opt.check_finite_now() is None   # read once, then cleared


def test_skipped_replays_are_counted_and_named():
    """A job of several ranks masks a bad step (``keep``) and reports it at the next read: the record keeps
    counting through replays. Driven directly, with the vote and verdict as a step hands them over."""
    deferred, undone = Deferred(hold=True), []
    agreed, keep = torch.zeros(3, dtype=torch.int32), torch.ones((), dtype=torch.bool)
    launch = dict(names=["a", "b", "c"], tp=1, job_world=2, undo=undone.append)
    deferred.launch(agreed, keep, step=1, **launch)   # the first step makes the record
    with Replay() as graph:
        deferred.launch(agreed, keep, step=2, **launch)
    assert deferred.check() is None
    for codes, kept in (([0, 0, 0], True), ([0, 1, 0], False), ([0, 0, 1], False), ([0, 0, 0], True)):
        agreed.copy_(torch.tensor(codes, dtype=torch.int32))   # rank 1 (code 2 - 1) voted b, then c
        keep.fill_(kept)
        graph.replay()
    with pytest.warns(SkippedStep, match=r"2 steps, 4 to 5, were skipped on every rank: gradient of parameter 'b' "
                                         r"had NaN/Inf values on rank 1"):
        assert deferred.check() == 5
    assert undone == [2] and deferred.skipped == [5] and deferred.check() is None
