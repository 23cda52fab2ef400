"""Single-device Muon, AdamW and the hybrid MuonW: the references every distributed run is checked against.

One optimizer class, ``MuonW``, runs each parameter group with Muon (``use_muon=True``) or
AdamW (``use_muon=False``); ``Muon`` and ``AdamW`` are the same class with every group of one
kind. The math lives in ``updates.py`` and ``newton_schulz.py``; this file only loops over groups.

The hybrid routing rule (which parameter gets Muon, and why) is ``routing.py``'s, and nowhere else;
``hybrid_param_groups`` below turns its table into a Muon group and an AdamW group.

    >>> groups = hybrid_param_groups(model, muon={"lr": 0.02}, adamw={"lr": 3e-3})
    >>> opt = MuonW(groups)
"""
from __future__ import annotations

import torch

from .contract import MomentumSync, lr_of, no_autocast
from .newton_schulz import NS_COEFFICIENTS, NS_EPS, NS_FORM, NS_STEPS, zeropower_ns5
from .ns_variants import check_ns_options
from .rank_state import after_load
from .routing import RoutingRow, RoutingTable, routes_to_muon, routing_table  # noqa: F401 (re-exported)
from .updates import LR_ADJUSTMENTS, adamw_step_, adjust_lr, apply_update_, muon_momentum_

# Hyperparameters of both kinds of group. Muon's defaults are torch.optim.Muon's except the lr
# adjustment, which is Moonshot's ("match_rms_adamw"; pass adjust_lr_fn="original" or None for
# torch's); AdamW's are torch.optim.AdamW's except weight decay, which is shared with Muon (0.1, as
# in Moonshot's recipe). ``eps`` is per kind, as in torch: Newton-Schulz's 1e-7 in a Muon group,
# AdamW's 1e-8 in an AdamW group (None here: filled in per group by ``fill_group``).
# ``adjust_lr_fn`` (torch.optim.Muon's keyword) is accepted and stored as ``adjust_lr``.
DEFAULTS = dict(
    lr=1e-3, weight_decay=0.1, eps=None,
    momentum=0.95, nesterov=True, ns_steps=NS_STEPS, ns_coefficients=NS_COEFFICIENTS, ns_form=NS_FORM,
    adjust_lr="match_rms_adamw",                          # Muon groups
    betas=(0.9, 0.999),                                   # AdamW groups (a Muon group's betas[0] is its momentum)
)


# torch.optim.Muon's keywords, per-kind defaults and torch's refusals, as a group is built (``contract.py``).
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
    """``value`` as a float: a real number or a one-element tensor; anything else (a string, None) is refused by
    name, as ``torch.optim.Muon`` refuses it when built (rather than kept until a step or a scheduler fails)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"group {g_idx}: Tensor {name} must be 1-element, got shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"group {g_idx}: {name} must be a number (a float, or a one-element tensor), got {value!r} "
                        f"({type(value).__name__}); e.g. {name}=3e-4, not {name}='3e-4'")
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


def resolve_mode(check, device: torch.device, capturable: bool = False):
    """``check_finite`` as given (True, False, "raise", "defer" or None) -> "raise", "defer" or None (off).
    None: "raise" on a CPU, "defer" elsewhere and for ``capturable=True`` (no host read in ``step()``)."""
    if check is None:
        return "raise" if device.type == "cpu" and not capturable else "defer"
    if check is True:
        return "raise"
    if check is False:
        return None
    if check not in ("raise", "defer"):   # finite.py says what each does
        raise ValueError(f"check_finite must be True, False, 'raise' or 'defer', got {check!r}")
    return check


def check_hyper(hyper: dict) -> dict:
    """Refuse unknown keywords; map torch.optim.Muon's names onto ours."""
    hyper = normalize_hyper(hyper)
    unknown = set(hyper) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown hyperparameters {sorted(unknown)}; known: {sorted(DEFAULTS)} "
                        "(and adjust_lr_fn, torch.optim.Muon's name for adjust_lr)")
    return hyper


def check_muon_shape(name: str, shape: tuple[int, ...], banks: bool = False) -> None:
    """Raise a clear error when a parameter Muon cannot take is put in a Muon group: anything but a 2-D
    matrix, or with ``banks`` (``MuonW``, ``DistributedMuon``) also a 3-D bank of matrices (experts x out x in)."""
    if len(shape) == 2 or (banks and len(shape) == 3):
        return
    if banks:
        raise ValueError(f"parameter {name!r} has shape {tuple(shape)} but Muon orthogonalises 2-D matrices and "
                         "3-D banks of them (experts x out x in) only; put it in a group with use_muon=False "
                         "(AdamW), or build groups with hybrid_param_groups(model)")
    bank = (" (a 3-D expert bank runs on muongrid.MuonW and DistributedMuon; FSDPMuon does not take banks yet)"
            if len(shape) == 3 else "")
    raise ValueError(f"parameter {name!r} has shape {tuple(shape)} but Muon orthogonalises 2-D matrices only{bank}; "
                     "put it in a group with use_muon=False (AdamW), or build groups with hybrid_param_groups()")


def hybrid_param_groups(model_or_named, muon: dict | None = None, adamw: dict | None = None, head=None,
                        return_table: bool = False):
    """A Muon group and an AdamW group, routed by ``routing.routing_table`` (embeddings, the output head,
    routers and vectors to AdamW; hidden matrices and expert banks to Muon; the reasons in the table).

    ``model_or_named`` is the model (preferred: its modules say what each parameter is) or
    ``model.named_parameters()`` (names stand in). ``head``: the output head where the model does not say it.
    Each group carries ``names`` so errors and reports can name parameters; a tied tensor appears once. With
    ``return_table=True`` returns ``(groups, table)``; ``print(table)`` shows every tensor's route and why.
    """
    table = routing_table(model_or_named, head=head, _stacklevel=3)   # warnings point at the caller
    groups = {True: dict(muon or {}, use_muon=True, params=[], names=[]),
              False: dict(adamw or {}, use_muon=False, params=[], names=[])}
    for route in table:
        g = groups[route.use_muon]
        g["params"].append(route.param)
        g["names"].append(route.name)
    groups = [g for g in groups.values() if g["params"]]
    return (groups, table) if return_table else groups


def param_names(group: dict, group_idx: int) -> list[str]:
    """The group's parameter names, or ``group{g}.param{i}`` where none were given."""
    names = group.get("names") or [f"group{group_idx}.param{i}" for i in range(len(group["params"]))]
    if len(names) != len(group["params"]):
        raise ValueError(f"group {group_idx}: {len(names)} names for {len(group['params'])} parameters")
    return list(names)


def check_group(group: dict, group_idx: int, banks: bool = False) -> None:
    """Fill in per-kind defaults and validate one parameter group (shared by every optimizer class).
    ``banks``: the optimizer takes 3-D banks of matrices (experts x out x in) in Muon groups."""
    fill_group(group)
    check_group_contract(group, group_idx)
    if group["adjust_lr"] not in LR_ADJUSTMENTS:
        raise ValueError(f"group {group_idx}: adjust_lr must be one of {LR_ADJUSTMENTS}, got {group['adjust_lr']!r}")
    if group["use_muon"]:
        try:
            check_ns_options(group["ns_coefficients"], group["ns_steps"], group.get("ns_form", NS_FORM))
        except ValueError as e:
            raise ValueError(f"group {group_idx}: {e}") from None
        for name, p in zip(param_names(group, group_idx), group["params"]):
            check_muon_shape(name, tuple(p.shape), banks)


def call_closure(closure):
    """``torch.optim``'s contract: re-evaluate the model with gradients on, return the loss (or None)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class MuonW(torch.optim.Optimizer):
    """Muon on groups with ``use_muon=True``, AdamW on the others; one process, no communication.

    A Muon group may hold 3-D banks of matrices (a MoE layer's experts, experts x out x in): each expert's
    matrix is orthogonalised on its own (one Newton-Schulz batch) and its lr adjusted for out x in."""

    def __init__(self, params, use_muon: bool = True, **hyper):
        super().__init__(params, dict(DEFAULTS, use_muon=use_muon, **check_hyper(hyper)))
        for g_idx, group in enumerate(self.param_groups):
            check_group(group, g_idx, banks=True)
        MomentumSync.of(self)

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        after_load(self)

    @torch.no_grad()
    def step(self, closure=None):
        loss = call_closure(closure)
        MomentumSync.of(self)(self.param_groups)
        devices = {p.device.type for group in self.param_groups for p in group["params"]}
        with no_autocast(next(iter(devices), "cpu")):   # a caller's autocast does not reach the update
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if group["use_muon"]:
                        self._muon(p, group)
                    else:
                        self._adamw(p, group)
        return loss

    def _muon(self, p: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p.grad)
        self._orthogonalised_update(p, muon_momentum_(state["momentum_buffer"], p.grad, group["momentum"],
                                                      group["nesterov"]), group)

    def _orthogonalised_update(self, p: torch.Tensor, update: torch.Tensor, group: dict) -> None:
        """Newton-Schulz on ``update`` and the step on ``p`` (``lab/shard_ortho.py`` runs it block by block)."""
        ortho = zeropower_ns5(update, group["ns_steps"], group["ns_coefficients"], group["eps"],
                              form=group.get("ns_form", NS_FORM))
        lr = lr_of(group)
        # A 3-D bank's matrices are its last two dimensions: each expert's lr is scaled for its own shape.
        apply_update_(p, ortho, lr, group["weight_decay"], adjust_lr(lr, tuple(p.shape[-2:]), group["adjust_lr"]))

    def _adamw(self, p: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        if "step" not in state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        state["step"] += 1
        adamw_step_(p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"], lr_of(group),
                    group["betas"], group["eps"], group["weight_decay"])


class Muon(MuonW):
    """Single-device Muon: every group uses Muon unless it says ``use_muon=False``."""

    def __init__(self, params, **hyper):
        super().__init__(params, use_muon=True, **hyper)


class AdamW(MuonW):
    """Single-device AdamW with the same math the ZeRO-1 AdamW runs on shards."""

    def __init__(self, params, **hyper):
        super().__init__(params, use_muon=False, **hyper)
