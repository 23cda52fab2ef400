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
  count), as torch skips it; None on some ranks only counts as zeros there. A few int32s per parameter in the
  step's one small device all-reduce decide it on every rank alike (``vote``), so no rank waits for a gradient
  that never comes; no host collective runs, and a rank that holds every gradient reads nothing back;
* pickling an optimizer that holds process groups is refused with the fix (``refuse_pickle``).

Ranks decide together (issue 40): whether a step is taken, skipped or refused is the same on every rank, decided
before the first collective that moves gradients, so a loop that skips a bad batch keeps every rank in step:

* the NaN/Inf verdict rides the same ballot as presence (``vote``; ``finite.py`` says what "raise" and "defer" do
  with it);
  on an expert grid the vote spans the job, and ``prepare_together`` decides a model's optimizers as one;
* ``torch.amp.GradScaler`` is refused at its first ``scaler.step(opt)`` (``refuse_grad_scaler`` says why: its
  overflow flag is each rank's own); bf16 autocast needs no scaler;
* a caller's ``torch.autocast`` does not reach inside ``step()`` (``no_autocast``);
* parameters of a ``DistributedDataParallel`` model are refused at the first step (``refuse_ddp``; a global
  module-registration hook notes every DDP wrapper built after muongrid is imported).
"""
from __future__ import annotations

import weakref

import torch

from .capture import PINNED, pinned_write
from .finite import grad_norms, local_codes, raise_agreed, spread
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

    pinned = False   # capturable=True: lr, weight decay, momentum and betas are device tensors (capture.py)

    def __setitem__(self, key, value):
        if self.pinned and key in PINNED and key in self:
            pinned_write(self, key, value)   # in place: a captured step reads these tensors where they are
            return
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
        if any(g.pinned for g in param_groups):
            self.seen = [(None, None)] * len(param_groups)   # never compared: nothing read from the tensors
            return
        self.seen = [(g.get("momentum"), tuple(g["betas"])[0] if "betas" in g else None) for g in param_groups]

    def __call__(self, param_groups: list[dict]) -> None:
        for g_idx, (group, (m_seen, b_seen)) in enumerate(zip(param_groups, self.seen)):
            if getattr(group, "pinned", False):
                continue   # capturable: momentum and betas[0] are one tensor, written in place (capture.py)
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


def job_place(grid) -> tuple[int, int, int, int]:
    """(job rank, job world, expert slice, ep) of this rank: an expert grid (``grid.expert(ep)``) is one slice
    of the job; any other grid is the whole job."""
    ep, ranks = getattr(grid, "ep", 1), getattr(grid, "global_ranks", ()) or ()
    if ep == 1 or not ranks:
        return grid.rank, grid.dp * grid.tp, 0, 1
    return ranks[grid.rank], grid.dp * grid.tp * ep, ranks[0] // grid.tp, ep


def where_of(grid, step: int) -> str:
    """"rank R (dp D, tp T), step S" in the job's numbering (an expert grid's slice numbers its ranks anew)."""
    rank, tp = job_place(grid)[0], grid.tp
    return f"rank {rank} (dp {rank // tp}, tp {rank % tp}), step {step}"


def vote(opt, params: list, named: list, index: list[int], where: str, later: frozenset = frozenset()):
    """The step's one decision, the same on every rank (``finite.py``): which parameters have a gradient
    somewhere, and whether the step goes on. ``named``: this rank's (name, local gradient) pairs, at places
    ``index`` of ``params``. Returns (present, keep, agreed): ``keep`` and ``agreed`` are the device verdict and
    vote of ``check_finite="defer"`` (None otherwise; a one-rank job gets its vote and no ``keep``); with "raise"
    a bad gradient anywhere raises here, on every rank, before any collective that moves gradients.

    With several ranks the decision is one small all-reduce (MAX) of a ballot on the grid's device, phase
    "contract", over the whole job (an expert grid's slices together): one int32 per parameter and expert
    slice for "I have a gradient" (each slice in its own part), then, with a check, one NaN/Inf code per
    parameter (``finite.local_codes``, plus one). Under "defer" that is the collective the check already issued; no host
    collective runs in any mode. The host reads the ballot only where it needs a value:

    * a rank that holds every gradient knows each is present somewhere and reads nothing (the steady state: no
      host sync); a rank missing one reads the agreed presence (one sync, in the step that lost a gradient);
    * ``check_finite="raise"`` reads it once, after that all-reduce (the step's one host sync), since raising
      is a decision the host makes;
    * ``"defer"`` keeps the verdict on the device (``keep``) and reads it at the next host read.

    ``later``: places in ``params`` whose NaN/Inf check the step makes itself, in a pass it makes anyway, so the
    vote leaves them out (used only in a job of one rank under "defer", where nothing is masked and the verdict is
    read after the step: ``_vote_alone``)."""
    job_rank, job_world, slot, ep = job_place(opt.grid)
    names, n, mode = [name for g in opt.param_groups for name in g["names"]], len(params), opt.check_finite
    mine = [p.grad is not None for p in params]
    if job_world == 1 or not params:
        return _vote_alone(opt, mine, named, index, where, names, job_rank, job_world, later)
    import torch.distributed as dist
    device, here = opt.grid.device, all(mine)
    ballot = torch.zeros(ep * n + (n if mode else 0), dtype=torch.int32, device=device)
    own = ballot[slot * n: (slot + 1) * n]
    if here:
        own.fill_(1)   # no copy from the host: every gradient is here
    else:
        own.copy_(torch.tensor(mine, dtype=torch.int32))
    norms = grad_norms(named) if mode else None
    if mode:   # a code travels as 1 + code, so that a ballot of ones reads "every gradient here, all finite"
        codes = None if norms is None else local_codes(norms, job_rank, job_world)
        if codes is not None and len(index) == n:
            torch.add(codes, 1, out=ballot[ep * n:])
        else:
            ballot[ep * n:].copy_(spread(codes, index, n, device)).add_(1)
    opt.comm.all_reduce(ballot, "job" if ep > 1 else "world", "contract", op=dist.ReduceOp.MAX)
    read = ballot.tolist() if mode == "raise" or not here else None   # the one host read, where one is needed
    present = mine if here else [bool(x) for x in read[slot * n: (slot + 1) * n]]
    if mode == "raise":
        raise_agreed([c - 1 for c in read[ep * n:]], names, named, where, job_rank, job_world, opt.grid.tp,
                     opt.steps_taken + 1)
    if mode != "defer":
        return present, None, None
    agreed = ballot[ep * n:] - 1
    return present, (agreed == 0).all(), agreed


def _vote_alone(opt, mine: list, named: list, index: list[int], where: str, names: list, job_rank: int,
                job_world: int, later: frozenset = frozenset()):
    """``vote`` in a job of one rank: presence is this rank's, and no one can disagree. "raise" reads the flags
    once; "defer" keeps its vote and does not mask the step (the next read raises). Under "defer" the gradients
    at places ``later`` are not read here: the step adds their codes to the returned vote itself (a Muon
    matrix's from the norm of its orthogonalised update, ``finite.late_codes``), before the vote is read."""
    n, mode = len(mine), opt.check_finite
    if mode == "raise":
        norms = grad_norms(named)
        finite = [] if norms is None else norms.isfinite().tolist()   # the step's one host read
        codes = [0] * n
        for i, ok in zip(index, finite):
            codes[i] = 0 if ok else job_world - job_rank
        raise_agreed(codes, names, named, where, job_rank, job_world, opt.grid.tp, opt.steps_taken + 1)
        return mine, None, None
    if mode != "defer":
        return mine, None, None
    if later:
        kept = [k for k, i in enumerate(index) if i not in later]
        named, index = [named[k] for k in kept], [index[k] for k in kept]
    norms = grad_norms(named)
    return mine, None, spread(None if norms is None else local_codes(norms, job_rank, job_world), index, n,
                              opt.grid.device)


def prepare_together(opts: list) -> None:
    """Decide one step for the optimizers of one model (a dense one on the job's grid and expert ones on
    ``grid.expert(ep)``) before any of them changes anything: each votes on its gradients, so with
    ``check_finite="raise"`` a NaN anywhere raises on every rank here; with ``"defer"`` the step is kept only
    if every optimizer's gradients were finite, and skipped by all of them otherwise. Call it after
    ``backward()`` and before the ``step()`` calls (``clipping.clip_together_`` calls it)."""
    for opt in opts:
        opt._prepare()
    keeps = [opt._prepared.get("keep") for opt in opts]
    if any(k is None for k in keeps) or len(keeps) < 2:
        return
    keep = torch.stack(keeps).all()
    for opt in opts:
        opt._prepared["keep"] = keep


def no_autocast(device: torch.device):
    """A context in which a caller's ``torch.autocast`` does not reach: the step runs in the dtypes it chose
    (under an enclosing CPU bf16 autocast, the Gram form's fp32 products would otherwise run in bf16)."""
    import contextlib
    stack = contextlib.ExitStack()
    for kind in dict.fromkeys(("cpu", torch.device(device).type)):
        if torch.amp.is_autocast_available(kind):
            stack.enter_context(torch.autocast(kind, enabled=False))
    return stack


def refuse_grad_scaler(opt) -> None:
    """``torch.amp.GradScaler.step`` hands an optimizer that sets ``_step_supports_amp_scaling`` its scale and
    a found-inf flag computed from this rank's own, unreduced gradients; its ``update()`` then moves each
    rank's scale by that rank's flag alone. One rank's overflow would skip the step there only and split the
    scales. Refused at the first ``scaler.step(opt)``, on every rank alike, before anything changes."""
    if hasattr(opt, "found_inf") or hasattr(opt, "grad_scale"):
        for name in ("found_inf", "grad_scale"):   # the scaler deletes them after a step that returns; this one raises
            opt.__dict__.pop(name, None)
        raise RuntimeError(
            f"torch.amp.GradScaler cannot drive {type(opt).__name__}: its inf/NaN check reads each rank's own "
            "gradient before the optimizer averages them, so one rank's overflow would skip the step on that rank "
            "only and the ranks' loss scales would drift apart. Train in bfloat16 instead (torch.autocast(device, "
            "dtype=torch.bfloat16): fp32's exponent range, no loss scaling needed) and call opt.step() directly; "
            "check_finite='raise' or 'defer' skips a step with NaN/Inf gradients on every rank together")


_DDP_MODULES: "weakref.WeakSet" = weakref.WeakSet()   # every DistributedDataParallel built since import


def _note_ddp(module, name: str, submodule):
    """A global module-registration hook (``torch.nn.modules.module``): DDP's ``__init__`` registers the model it
    wraps as its ``module``; remember the wrapper (weakly). One isinstance check per submodule registration."""
    if name == "module" and isinstance(module, torch.nn.parallel.DistributedDataParallel):
        _DDP_MODULES.add(module)


torch.nn.modules.module.register_module_module_registration_hook(_note_ddp)


def refuse_ddp(params: list[torch.Tensor]) -> None:
    """Refuse parameters that a ``DistributedDataParallel`` module holds: DDP all-reduces their gradients and
    then the optimizer reduce-scatters them again (twice the traffic, silently). Checked at the first step
    against every DDP wrapper built since muongrid was imported (``_note_ddp``), with no scan of the heap."""
    ours = {id(p) for p in params}

    def wrapper():
        return next((d for d in list(_DDP_MODULES) if any(id(p) in ours for p in d.module.parameters())), None)
    if wrapper() is not None:
        import gc
        gc.collect()   # a wrapper the caller dropped may wait in a reference cycle: it does not count
        ddp = wrapper()
        if ddp is not None:
            raise RuntimeError(
                f"these parameters belong to a model wrapped in {type(ddp).__name__}: DDP all-reduces every "
                "gradient and then this optimizer reduce-scatters it again (twice the gradient traffic). Unwrap "
                "the model (use ddp.module, or do not wrap it): the optimizer averages the gradients over the "
                "data-parallel ranks itself, inside step()")


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
