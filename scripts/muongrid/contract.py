"""The ``torch.optim`` contract, shared by MuonW, DistributedMuon, DistributedAdamW and FSDPMuon.

What a user's training loop expects of any torch optimizer, in one place so the three distributed
classes keep it the same way (``tests/test_contract.py`` checks each point against ``torch.optim.Muon``
and ``torch.optim.AdamW``):

* keywords: ``torch.optim.Muon``'s are accepted with its meaning (``adjust_lr_fn``: None is torch's
  "original"; ``eps`` in a Muon group is Newton-Schulz's, in an AdamW group AdamW's); our default lr
  adjustment stays Moonshot's ``"match_rms_adamw"`` (``normalize_hyper``);
* invalid hyperparameters and parameters (negative lr, momentum, weight decay or eps, betas outside
  [0, 1), a tensor lr of more than one element, complex or integer parameters) are refused when the
  optimizer is built, as torch refuses them (``check_group_contract``);
* a momentum scheduler (``OneCycleLR``, ``CyclicLR``) writes ``betas[0]`` of every group when the
  optimizer's defaults hold ``betas``; a Muon group keeps ``momentum`` and ``betas[0]`` as one value,
  whichever was written last (``MomentumSync``);
* a gradient that is None on every rank skips its parameter (no decay, no state change, no step
  count), as torch skips it; None on some ranks only counts as zeros there. One small all-reduce of host
  values per step decides it on every rank alike (``grads_present``), so no rank waits for a gradient that
  never comes, and no GPU waits for the host;
* pickling an optimizer that holds process groups is refused with the fix (``refuse_pickle``).
"""
from __future__ import annotations

import torch

from .newton_schulz import NS_EPS

ADAMW_EPS = 1e-8
# torch.optim.Muon's adjust_lr_fn=None means "original"; ours (no keyword) means Moonshot's.
TORCH_NONE_ADJUSTMENT = "original"


def normalize_hyper(hyper: dict) -> dict:
    """Map ``torch.optim.Muon``'s keywords onto ours: ``adjust_lr_fn`` -> ``adjust_lr``."""
    hyper = dict(hyper)
    if "adjust_lr_fn" in hyper:
        if "adjust_lr" in hyper:
            raise TypeError("give adjust_lr_fn (torch.optim.Muon's name) or adjust_lr, not both")
        fn = hyper.pop("adjust_lr_fn")
        hyper["adjust_lr"] = TORCH_NONE_ADJUSTMENT if fn is None else fn
    if "ns_eps" in hyper:
        raise TypeError("ns_eps is now eps (torch.optim.Muon's name): in a Muon group eps is Newton-Schulz's "
                        "epsilon, in an AdamW group AdamW's")
    return hyper


def fill_group(group: dict) -> None:
    """Per-kind defaults that one ``defaults`` dict cannot hold: eps (1e-7 for Muon as torch.optim.Muon,
    1e-8 for AdamW as torch.optim.AdamW) and a Muon group's ``betas[0]``, which is its momentum."""
    if "adjust_lr_fn" in group:  # a group dict written for torch.optim.Muon
        fn = group.pop("adjust_lr_fn")
        group["adjust_lr"] = TORCH_NONE_ADJUSTMENT if fn is None else fn
    if group.get("eps") is None:
        group["eps"] = NS_EPS if group["use_muon"] else ADAMW_EPS
    if group["use_muon"] and "betas" in group:
        group["betas"] = (group["momentum"], *tuple(group["betas"])[1:])


def _number(name: str, value, g_idx: int) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"group {g_idx}: Tensor {name} must be 1-element, got shape {tuple(value.shape)}")
        value = value.item()
    return float(value)


def check_group_contract(group: dict, g_idx: int) -> None:
    """Refuse, as torch does when an optimizer is built, what no step could use."""
    lr = _number("lr", group["lr"], g_idx)
    checks = [("lr", lr), ("weight_decay", _number("weight_decay", group["weight_decay"], g_idx)),
              ("eps", _number("eps", group["eps"], g_idx))]
    if group["use_muon"]:
        checks.append(("momentum", _number("momentum", group["momentum"], g_idx)))
    for name, value in checks:
        if not value >= 0.0:  # also refuses NaN
            raise ValueError(f"group {g_idx}: {name} should be >= 0 but is {value}")
    if not group["use_muon"]:
        for i, beta in enumerate(group["betas"]):
            if not 0.0 <= float(beta) < 1.0:
                raise ValueError(f"group {g_idx}: betas[{i}] should be in [0, 1) but is {beta}")
    if int(group["ns_steps"]) < 0:
        raise ValueError(f"group {g_idx}: ns_steps should be >= 0 but is {group['ns_steps']}")
    for name, p in zip(group.get("names") or [None] * len(group["params"]), group["params"]):
        if p.is_complex() or not p.is_floating_point():
            label = repr(name) if name else "a parameter"
            raise ValueError(f"group {g_idx}: {label} has dtype {str(p.dtype)[6:]}; these optimizers update real "
                             "floating-point parameters only (as torch.optim.Muon): keep it out of the optimizer, "
                             "or view a complex parameter as real (torch.view_as_real) in the model")


def lr_of(group: dict) -> float:
    """The group's lr as a Python number (a one-element tensor lr is accepted, as torch accepts it)."""
    lr = group["lr"]
    return float(lr.item()) if isinstance(lr, torch.Tensor) else float(lr)


class LinkedGroup(dict):
    """A parameter group in which a Muon group's ``momentum`` and ``betas[0]`` are one value the moment either
    is written: a scheduler that writes ``betas[0]`` (``OneCycleLR``, ``CyclicLR``) is seen in ``momentum`` at
    once, as ``torch.optim.Muon``'s own ``momentum`` would show it (not only at the next step)."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if not self.get("use_muon"):
            return
        if key == "betas" and "momentum" in self and tuple(value)[0] != self["momentum"]:
            super().__setitem__("momentum", tuple(value)[0])
        elif key == "momentum" and "betas" in self and tuple(self["betas"])[0] != value:
            super().__setitem__("betas", (value, *tuple(self["betas"])[1:]))


class MomentumSync:
    """Keep a Muon group's ``momentum`` and ``betas[0]`` one value: whichever changed since the last step wins.

    torch's momentum schedulers write ``betas[0]`` into every group when ``optimizer.defaults`` holds
    ``betas`` (ours do, for the AdamW groups of a hybrid), else ``momentum``. Muon reads ``momentum``.
    """

    def __init__(self, param_groups: list[dict]):
        self.reset(param_groups)

    @classmethod
    def of(cls, opt) -> "MomentumSync":
        """The optimizer's sync, made on first use (an unpickled optimizer has none yet)."""
        sync = opt.__dict__.get("_momentum_sync")
        if sync is None:
            sync = opt.__dict__["_momentum_sync"] = cls(opt.param_groups)
        return sync

    def after_load(self, param_groups: list[dict]) -> None:
        """A loaded Muon group's ``momentum`` is the truth (a state saved before betas[0] followed it may
        carry AdamW's betas)."""
        for group in param_groups:
            if "ns_eps" in group:  # saved before eps meant Newton-Schulz's in a Muon group
                ns_eps = group.pop("ns_eps")
                if group.get("use_muon"):
                    group["eps"] = ns_eps
            if group.get("use_muon") and "betas" in group:
                group["betas"] = (group["momentum"], *tuple(group["betas"])[1:])
        self.reset(param_groups)

    def reset(self, param_groups: list[dict]) -> None:
        for i, group in enumerate(param_groups):   # in place: the optimizer's own list
            if not isinstance(group, LinkedGroup):
                param_groups[i] = LinkedGroup(group)
        self.seen = [(g.get("momentum"), tuple(g["betas"])[0] if "betas" in g else None) for g in param_groups]

    def __call__(self, param_groups: list[dict]) -> None:
        for g_idx, (group, (m_seen, b_seen)) in enumerate(zip(param_groups, self.seen)):
            if group["use_muon"] and "betas" in group:
                m, b = group["momentum"], tuple(group["betas"])[0]
                if m != m_seen and b != b_seen and m != b:
                    raise ValueError(f"group {g_idx}: momentum ({m}) and betas[0] ({b}) were both changed since the "
                                     "last step; in a Muon group they are one value: set one of them")
                if b != b_seen:
                    group["momentum"] = b
                elif m != m_seen:
                    group["betas"] = (m, *tuple(group["betas"])[1:])
        self.reset(param_groups)


def grads_present(params: list[torch.Tensor], comm, finite: torch.Tensor | None = None):
    """For each parameter: whether any rank has a gradient for it. The host knows its own (``p.grad is not
    None``); with several ranks one all-reduce (MAX) of one int per parameter over ``comm.host_group`` (gloo
    beside NCCL) makes every rank take the same decision, with no device read and no GPU sync. Through
    ``comm`` (its timeout watchdog names a peer that never comes), under the phase "contract", which the
    ledger's summaries leave out: their bytes are the algorithm's.

    ``finite`` (this rank's on-device "all gradients finite" flag, ``finite.finite_flag``), when given, is
    read here: the step's one host sync (``check_finite="raise"``). Returns (present, finite as a bool or None)."""
    mine = [p.grad is not None for p in params]
    if comm.grid.dp * comm.grid.tp > 1 and params:
        import torch.distributed as dist
        flags = comm.all_reduce_host(torch.tensor(mine, dtype=torch.int32), "contract", op=dist.ReduceOp.MAX)
        mine = [bool(x) for x in flags.tolist()]
    return mine, (None if finite is None else bool(finite))


def refuse_pickle(opt) -> None:
    raise TypeError(f"{type(opt).__name__} holds process groups, which cannot be pickled: save "
                    "opt.state_dict() (this rank's shard, with torch.save on every rank) or use muongrid.checkpoint "
                    "(one folder, any grid); copy.deepcopy(opt) works and shares the grid")


def deepcopy_sharing(opt, memo: dict, shared: tuple[str, ...]):
    """``copy.deepcopy`` of an optimizer that shares ``shared`` attributes (the grid, the Comm and its process
    groups cannot be copied) and copies everything else, state views kept as views (torch copies storages once)."""
    import copy

    for name in shared:
        value = getattr(opt, name, None)
        if value is not None:
            memo[id(value)] = value
    new = type(opt).__new__(type(opt))
    memo[id(opt)] = new
    new.__dict__.update(copy.deepcopy(opt.__dict__, memo))
    return new
