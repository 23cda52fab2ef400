"""What ``muongrid.checkpoint`` saves and loads for an ``FSDPMuon`` (FSDP2 ``fully_shard`` parameters).

``checkpoint.save(opt, path, step=...)`` and ``checkpoint.load(opt, path)`` call this module when ``opt`` is
an ``FSDPMuon``; the marker, the checks, the crash safety and the error messages are ``checkpoint.py``'s.

Under FSDP2 every parameter and every state tensor already is a DTensor placed in global coordinates
(``Shard(0)`` row blocks over "dp", and ``Shard(d)`` or ``Replicate()`` over "tp" underneath), so there is
nothing to cut by hand as ``checkpoint.py`` does for ZeRO-1's flat pieces: DCP writes each rank's block
and reads back whatever block a rank holds on another grid. The keys are the ZeRO-1 checkpoint's, by
parameter name: ``model.<name>`` (the parameter, in its own dtype: FSDP2 keeps no fp32 master),
``optim.state.<name>.momentum`` (FSDPMuon's ``momentum_buffer``) or ``.exp_avg`` / ``.exp_avg_sq``, and
``optim.state.<name>.step`` for AdamW. Saved in the parameter's own shape (a vector stays a vector),
so ``checkpoint.export`` gives whole tensors that ``checkpoint.load_single`` puts into ``MuonW``.
"""
from __future__ import annotations

import torch

CANONICAL = {"momentum_buffer": "momentum"}  # FSDPMuon's state name -> the checkpoint's kind


def _entries(opt):
    """(name, parameter, state, group) for every parameter, in the optimizer's order."""
    for group in opt.param_groups:
        for name, p in zip(group["names"], group["params"]):
            yield name, p, opt.state[p], group


def params(opt) -> dict:
    """The marker's ``params``: every parameter's global shape, its state kinds, and its optimizer."""
    return {name: dict(shape=list(p.shape), kinds=sorted(CANONICAL.get(k, k) for k in state if k != "step"),
                       use_muon=bool(group["use_muon"]))
            for name, p, state, group in _entries(opt)}


def saved_on(opt) -> dict:
    return dict(dp=opt.grid.dp, tp=opt.grid.tp)


def state_dict(opt) -> dict:
    """What DCP writes: the parameters and the state as the DTensors they are (``step`` a plain scalar,
    the same on every rank)."""
    sd = {}
    for name, p, state, _ in _entries(opt):
        sd[f"model.{name}"] = p.detach()
        for kind, t in state.items():
            sd[f"optim.state.{name}.{CANONICAL.get(kind, kind)}"] = t.detach() if kind == "step" else t
    return sd


def targets(opt) -> dict:
    """Fresh tensors placed like ``state_dict``'s, for DCP to read into: nothing of ``opt`` is touched
    until every byte has been read."""
    return {key: torch.zeros_like(t) for key, t in state_dict(opt).items()}


def apply(opt, got: dict) -> None:
    """Copy what was read into the parameters and the state (each rank its own blocks)."""
    for name, p, state, _ in _entries(opt):
        _local(p).copy_(_local(got[f"model.{name}"]))
        for kind, t in state.items():
            _local(t).copy_(_local(got[f"optim.state.{name}.{CANONICAL.get(kind, kind)}"]))


def _local(t: torch.Tensor) -> torch.Tensor:
    from .placements import local
    return local(t.detach())
