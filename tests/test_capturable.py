"""``capturable=True`` (issue 42, part 4): a step a CUDA graph could capture, checked without a GPU.

A CUDA graph records a step's kernels once and replays them. That works only if the step (1) reads nothing back
to the host, (2) copies nothing from the host (a value made from Python data inside ``step()`` would be frozen at
capture), (3) hands every kernel the same Python scalars at every step (a scheduler's new lr must arrive through a
tensor the kernel reads, not as a number baked into it) and (4) writes into the same storages at every step. No
GPU is lent here, so **the step has not been captured on a GPU yet**; what this file checks is those four
properties, by recording every aten op that ``step()`` dispatches (``StepAudit``, a ``TorchDispatchMode``):

* on one CPU process with real values, and on 2x1 and 2x2 grids simulated on the ``meta`` device over torch's
  fake process group (``devicecheck.simulate``), where a read of a device value or a copy from the host shows
  up as an op between devices (on one CPU process they are the same device, so the audit also counts every
  tensor made from Python data inside ``step()``, ``lift_fresh``, as a host-to-device copy);
* two steps after a warm-up, between which the lr (``LambdaLR`` on the CPU; a ``fill_`` on meta, where a
  scheduler cannot compute), the Muon momentum and AdamW's betas change (written as a momentum scheduler writes
  them: ``group["momentum"] = m``, ``group["betas"] = (b1, b2)``);
* the audit can fail: the same audit of the same loop with ``capturable=False`` finds the baked scalars, the host
  reads and the host copies (``test_the_audit_finds_what_the_default_step_does``).

And the capturable step is the default step, bit for bit, on one CPU process over a few steps under the same
schedules (float64 hyperparameter tensors round as the Python doubles did: ``capture.py``).

    python -m pytest -q tests/test_capturable.py
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from muongrid import DistributedAdamW, DistributedMuon, Grid
from muongrid.lab.devicecheck import simulate
from muongrid.lab.stepcost import _is_view
from muongrid.sharding import tp_shard

aten = torch.ops.aten
READS = {aten._local_scalar_dense.default, aten.equal.default, aten.nonzero.default, aten.is_nonzero.default}
SHAPES, TP_DIMS = [(12, 10), (7, 10), (10,)], [0, 1, -1]   # two matrices (one split by rows over TP), a gain


class StepAudit(TorchDispatchMode):
    """One step's dispatch: per op its name and Python scalar arguments; the storages written in place that
    existed before the step; reads of a device value back to the host; copies from the host."""

    def __init__(self):
        super().__init__()
        self.calls, self.written, self.made, self.reads, self.host_copies = [], set(), set(), [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        leaves = tree_leaves((args, kwargs))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        self.calls.append((name, tuple(x for x in leaves if isinstance(x, (bool, int, float)))))
        if func in READS or _to_host(func, args, kwargs):
            self.reads.append(name)
        if func in (aten.lift_fresh.default, aten.lift_fresh_copy.default) or _from_host(func, args, kwargs):
            self.host_copies.append(name)
        values = list(args) + [kwargs.get(a.name) for a in func._schema.arguments[len(args):]]
        for arg, value in zip(func._schema.arguments, values):
            if arg.alias_info is not None and arg.alias_info.is_write:
                self.written |= {t.untyped_storage()._cdata for t in tree_leaves(value) if isinstance(t, torch.Tensor)}
        out = func(*args, **kwargs)
        if not _is_view(func):
            known = {t.untyped_storage()._cdata for t in tensors}
            self.made |= {t.untyped_storage()._cdata for t in tree_leaves(out)
                          if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in known}
        return out

    def kept_written(self) -> set:
        """The storages written in place that the step did not make: what a captured graph writes through."""
        return self.written - self.made


def _to_host(func, args, kwargs) -> bool:
    if func is aten._to_copy.default and kwargs.get("device") is not None:
        return args[0].device.type != "cpu" and torch.device(kwargs["device"]).type == "cpu"
    return func is aten.copy_.default and args[0].device.type == "cpu" and args[1].device.type != "cpu"


def _from_host(func, args, kwargs) -> bool:
    if func is aten._to_copy.default and kwargs.get("device") is not None:
        return args[0].device.type == "cpu" and torch.device(kwargs["device"]).type != "cpu"
    return func is aten.copy_.default and args[0].device.type != "cpu" and args[1].device.type == "cpu"


def hybrid(params: list, names: list, tp_dims: list) -> list:
    return [dict(params=params[:2], names=names[:2], tp_split_dims=tp_dims[:2], lr=0.02, weight_decay=0.1),
            dict(params=params[2:], names=names[2:], tp_split_dims=tp_dims[2:], use_muon=False, lr=1e-3,
                 weight_decay=0.05)]


def reschedule(opt, k: int, scheduler=None) -> None:
    """Between steps: a new lr (the scheduler's, or written in place as a scheduler writes a tensor lr), and
    new Muon momentum and AdamW betas, assigned as torch's momentum schedulers assign them."""
    if scheduler is not None:
        scheduler.step()
    for group in opt.param_groups:
        if scheduler is None:
            lr = group["lr"]
            if isinstance(lr, torch.Tensor):
                lr.fill_(0.01 / (k + 2))
            else:
                group["lr"] = 0.01 / (k + 2)
        if group["use_muon"]:
            group["momentum"] = 0.95 - 0.02 * k
        else:
            group["betas"] = (0.9 - 0.01 * k, 0.999 - 0.001 * k)


def audited_steps(opt, params: list, gen, scheduler=None, steps: int = 3) -> list:
    """A warm-up step, then ``steps - 1`` audited steps, rescheduled before each; gradients refilled in place
    (``zero_grad(set_to_none=False)``'s loop: a captured backward keeps its gradients where they are)."""
    audits = []
    for k in range(steps):
        for p in params:
            if p.grad is None:
                p.grad = torch.empty_like(p)
            p.grad.copy_(torch.randn(p.shape, generator=gen) if gen is not None else p.grad)
        if k:
            reschedule(opt, k, scheduler)
            with StepAudit() as audit:
                opt.step()
            audits.append(audit)
        else:
            opt.step()
    return audits


def one_process(capturable: bool, layout: str = "owner"):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]
    opt = DistributedMuon(hybrid(params, ["a", "b", "g"], [-1, -1, -1]), Grid.single(), layout=layout,
                          capturable=capturable)   # check_finite: "raise" (CPU default), "defer" when capturable
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 / (1 + k))
    return opt, params, audited_steps(opt, params, gen, scheduler)


def on_grid(dp: int, tp: int, capturable: bool, layout: str = "owner") -> dict:
    """rank -> (its two audits, the storages of its parameters and optimizer state), on the meta device."""
    out = {}

    def worker(grid, comm, _):
        params = [torch.nn.Parameter(tp_shard(torch.empty(s, device=grid.device), d, grid.tp, grid.tp_rank).clone())
                  for s, d in zip(SHAPES, TP_DIMS)]
        opt = DistributedMuon(hybrid(params, ["a", "b", "g"], TP_DIMS), grid, comm=comm, layout=layout,
                              capturable=capturable)
        audits = audited_steps(opt, params, None)
        kept = {t.untyped_storage()._cdata for p in params for t in [p, *opt.state[p].values()]
                if isinstance(t, torch.Tensor)}
        out[grid.rank] = (audits, kept)

    simulate(worker, dp, tp, None)
    return out


def problems(first: StepAudit, second: StepAudit) -> list[str]:
    """What would keep the second step from replaying the first's graph (empty: nothing)."""
    found = []
    if first.calls != second.calls:
        diff = next(i for i, (a, b) in enumerate(zip(first.calls + [None], second.calls + [None])) if a != b)
        found.append(f"dispatch differs at op {diff}: {first.calls[diff:diff + 1]} then {second.calls[diff:diff + 1]}")
    if first.kept_written() != second.kept_written():
        found.append("the two steps write different storages")
    found += [f"host read: {r}" for r in first.reads + second.reads]
    found += [f"host copy: {c}" for c in first.host_copies + second.host_copies]
    return found


@pytest.mark.parametrize("layout", ["owner", "bucket"])
def test_one_process_step_replays_and_writes_in_place(layout):
    opt, params, (first, second) = one_process(True, layout)
    assert problems(first, second) == []
    kept = {t.untyped_storage()._cdata for p in params for t in [p, *opt.state[p].values()]}
    assert kept <= first.kept_written(), "the parameters and their state are written where they are"


@pytest.mark.parametrize("dp,tp", [(2, 1), (2, 2)], ids=str)
def test_grid_step_replays_and_writes_in_place(dp, tp):
    for rank, ((first, second), kept) in on_grid(dp, tp, True).items():
        assert problems(first, second) == [], rank
        assert kept <= first.kept_written(), (rank, "the parameters and their state are written where they are")


def test_the_audit_finds_what_the_default_step_does():
    """The control: the same loop without ``capturable`` bakes the new lr, momentum and betas into the dispatch
    as Python numbers, and on a grid (check_finite="defer" there, the default off a CPU) reads the last step's
    vote back at the start of the next and copies this one's to the host; the audit must say so, or it could not
    fail. (A ``.tolist()`` of a CPU tensor dispatches nothing: that is why the grids run on meta.)"""
    _, _, (first, second) = one_process(False)
    found = problems(first, second)
    assert any(f.startswith("dispatch differs") for f in found), found
    for rank, ((first, second), _) in on_grid(2, 1, False).items():
        found = problems(first, second)
        assert any(f.startswith("dispatch differs") for f in found), (rank, found)
        assert "host read: _local_scalar_dense" in found and "host read: copy_" in found, (rank, found)


@pytest.mark.parametrize("layout", ["owner", "bucket"])
def test_capturable_takes_the_default_step_bit_for_bit(layout):
    (a, pa, _), (b, pb, _) = one_process(False, layout), one_process(True, layout)
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))
    for x, y in zip(pa, pb):
        for k, t in a.state[x].items():
            assert torch.equal(t.float(), b.state[y][k].float()), k


def test_schedulers_write_into_the_tensors_and_muon_momentum_is_betas0():
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]
    opt = DistributedMuon(hybrid(params, ["a", "b", "g"], [-1, -1, -1]), Grid.single(), check_finite=False,
                          capturable=True)
    muon, adamw = opt.param_groups
    held = [muon["lr"], muon["momentum"], adamw["betas"][0], adamw["betas"][1], adamw["weight_decay"]]
    assert muon["betas"][0] is muon["momentum"] and all(t.dtype == torch.float64 and t.dim() == 0 for t in held)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[0.02, 1e-3], total_steps=10)   # writes betas[0]
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    sched.step()
    now = [muon["lr"], muon["momentum"], adamw["betas"][0], adamw["betas"][1], adamw["weight_decay"]]
    assert all(a is b for a, b in zip(held, now)), "the same tensors, written in place"
    assert muon["betas"][0] is muon["momentum"] and float(muon["momentum"]) == sched.optimizer.param_groups[0]["betas"][0]
    muon["momentum"] = 0.5
    assert float(muon["betas"][0]) == 0.5


def test_what_capturable_refuses():
    params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    with pytest.raises(ValueError, match="capturable=True cannot use check_finite='raise'"):
        DistributedMuon(hybrid(params, ["a", "b", "g"], [-1, -1, -1]), Grid.single(), capturable=True,
                        check_finite="raise")
    # the default check is the one a capturable step can make, on a CPU too
    assert DistributedMuon(hybrid(params, ["a", "b", "g"], [-1, -1, -1]), Grid.single(),
                           capturable=True).check_finite == "defer"
    opt = DistributedAdamW(hybrid(params, ["a", "b", "g"], [-1, -1, -1]), Grid.single(), check_finite=False,
                           capturable=True)
    for p in params[1:]:
        p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match=r"capturable=True updates every parameter at every step .*'a' got no gradient on rank 0"):
        opt.step()


def test_a_loaded_state_is_written_into_the_same_tensors():
    """``load_state_dict`` writes the saved hyperparameters into the tensors a graph would read, not new ones."""
    def build():
        params = [torch.nn.Parameter(torch.randn(s, generator=torch.Generator().manual_seed(0))) for s in SHAPES]
        return DistributedMuon(hybrid(params, ["a", "b", "g"], [-1, -1, -1]), Grid.single(), check_finite=False,
                               capturable=True), params
    opt, params = build()
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    opt.param_groups[0]["lr"].fill_(0.005)
    opt.param_groups[0]["momentum"] = 0.8
    opt.param_groups[1]["betas"] = (0.85, 0.98)
    saved = opt.state_dict()
    again, _ = build()
    held = [again.param_groups[0]["lr"], again.param_groups[0]["momentum"], *again.param_groups[1]["betas"]]
    again.load_state_dict(saved)
    now = [again.param_groups[0]["lr"], again.param_groups[0]["momentum"], *again.param_groups[1]["betas"]]
    assert all(a is b for a, b in zip(held, now))
    assert [float(t) for t in now] == [0.005, 0.8, 0.85, 0.98]
    assert again.param_groups[0]["betas"][0] is again.param_groups[0]["momentum"]
    assert float(again.state[again.param_groups[1]["params"][0]]["step"]) == 1
