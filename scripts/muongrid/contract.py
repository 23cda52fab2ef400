"""The ``torch.optim`` contract in ``step()``, shared by MuonW, DistributedMuon, DistributedAdamW and FSDPMuon.

What a training loop expects of any torch optimizer, kept the same way by every class (``tests/test_contract.py``
checks each point against ``torch.optim.Muon`` and ``torch.optim.AdamW``; chapter 12 tells the rest):

* a momentum scheduler that writes ``betas[0]`` is seen in a Muon group's ``momentum`` (``LinkedGroup``,
  ``MomentumSync``);
* a gradient that is None on every rank skips its parameter, as torch skips it; None on some ranks only counts as
  zeros there. That, and the NaN/Inf verdict (``finite.py``), is decided in one small device all-reduce on every
  rank alike, before the first collective that moves gradients (``vote``; ``prepare_together`` decides a model's
  optimizers as one), so a loop that skips a bad batch keeps every rank in step;
* ``torch.amp.GradScaler`` (``refuse_grad_scaler``; allowed with ``grad_reduce="ddp"``) and a
  ``DistributedDataParallel`` model without ``grad_reduce="ddp"`` (``check_ddp``) are refused at the first step,
  and a caller's ``torch.autocast`` does not reach inside it (``no_autocast``).

What is checked when an optimizer is built (torch's keywords and refusals) is ``optim.py``'s ``check_group``;
pickling and deep copies are ``rank_state.py``'s.
"""
from __future__ import annotations

import weakref

import torch

from .capture import PINNED, pinned_write
from .finite import grad_norms, local_codes, raise_agreed, spread


def lr_of(group: dict) -> float | torch.Tensor:
    """The group's lr as a step applies it: a Python number (a one-element tensor lr is accepted, as torch accepts
    it), or under ``capturable=True`` the group's device scalar itself (``capture.pin_group``)."""
    lr = group["lr"]
    if getattr(group, "pinned", False):
        return lr
    return float(lr.item()) if isinstance(lr, torch.Tensor) else float(lr)


class LinkedGroup(dict):
    """A parameter group in which a Muon group's ``momentum`` and ``betas[0]`` are one value the moment either
    is written (a scheduler that writes ``betas[0]``, ``OneCycleLR``, is seen in ``momentum`` at once)."""

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
    """Keep a Muon group's ``momentum`` and ``betas[0]`` one value: whichever changed since the last step wins
    (torch's momentum schedulers write ``betas[0]`` when ``optimizer.defaults`` holds ``betas``, as ours do)."""

    def __init__(self, param_groups: list[dict]):
        self.reset(param_groups)

    @classmethod
    def of(cls, opt) -> "MomentumSync":
        """The optimizer's sync, made on first use (an unpickled optimizer has none yet)."""
        sync = getattr(opt, "momentum_sync", None)
        if sync is None:
            sync = opt.momentum_sync = cls(opt.param_groups)
        return sync

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

    The ballot is one MAX all-reduce on the device, phase "contract", over the whole job: an int32 per parameter
    and expert slice for "I have a gradient", then with a check one ``1 + finite.local_codes`` per parameter. The
    host reads it only where it must: a rank missing a gradient (presence), and "raise" (its one host sync).
    ``later``: places whose NaN/Inf check the step makes itself (one rank under "defer": ``_vote_alone``)."""
    job_rank, job_world, expert_slice, ep = job_place(opt.grid)
    names, n, mode = [name for g in opt.param_groups for name in g["names"]], len(params), opt.check_finite
    mine = [p.grad is not None for p in params]
    if job_world == 1 or not params or getattr(opt, "grad_reduce", "step") == "ddp":
        # "ddp": every rank holds the same averaged gradients, so each decides alone and all decide alike
        return _vote_alone(opt, mine, named, index, where, names, job_rank, job_world, later)
    import torch.distributed as dist
    device, here = opt.grid.device, all(mine)
    ballot = torch.zeros(ep * n + (n if mode else 0), dtype=torch.int32, device=device)
    own = ballot[expert_slice * n: (expert_slice + 1) * n]
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
    present = mine if here else [bool(x) for x in read[expert_slice * n: (expert_slice + 1) * n]]
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
    once; "defer" keeps its vote and does not mask the step (the next read raises), leaving out the places
    ``later``, whose codes the step adds itself (``finite.late_codes``)."""
    n, mode, same = len(mine), opt.check_finite, job_world > 1   # same: "ddp", every rank alike (``vote``)
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
    agreed = spread(None if norms is None else local_codes(norms, job_rank, job_world), index, n, opt.grid.device)
    return mine, (agreed == 0).all() if same else None, agreed


def prepare_together(opts: list) -> list:
    """Decide one step for the optimizers of one model (a dense one and expert ones on ``grid.expert(ep)``)
    before any changes anything: under "raise" a NaN anywhere raises on every rank here; under "defer" the step
    is kept only if every optimizer's gradients were finite. Call it after ``backward()``, before the steps.
    Returns each optimizer's decided step (``step.Step``)."""
    steps = [opt.decided_step() for opt in opts]
    keeps = [step.keep for step in steps]
    if any(k is None for k in keeps) or len(keeps) < 2:
        return steps
    keep = torch.stack(keeps).all()
    for step in steps:
        step.keep = keep
    return steps


def no_autocast(device: torch.device):
    """A context in which a caller's ``torch.autocast`` does not reach: the step runs in the dtypes it chose."""
    import contextlib
    stack = contextlib.ExitStack()
    for kind in dict.fromkeys(("cpu", torch.device(device).type)):
        if torch.amp.is_autocast_available(kind):
            stack.enter_context(torch.autocast(kind, enabled=False))
    return stack


def refuse_grad_scaler(opt) -> None:
    """Refuse ``torch.amp.GradScaler`` at the first ``scaler.step(opt)`` (it hands an optimizer that sets
    ``_step_supports_amp_scaling`` a found-inf flag from this rank's own gradients: the message says why)."""
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
    """A global module-registration hook: DDP's ``__init__`` registers the model it wraps as its ``module``;
    remember the wrapper (weakly)."""
    if name == "module" and isinstance(module, torch.nn.parallel.DistributedDataParallel):
        _DDP_MODULES.add(module)


torch.nn.modules.module.register_module_module_registration_hook(_note_ddp)


def ddp_wrapper(params: list[torch.Tensor], scan: bool = False):
    """The ``DistributedDataParallel`` module that holds any of ``params``, or None: among those built since
    muongrid was imported (``_note_ddp``), and with ``scan`` among all live objects (one built before)."""
    import gc
    ours = {id(p) for p in params}

    def find(scan_all: bool):
        every = (o for o in gc.get_objects() if isinstance(o, torch.nn.parallel.DistributedDataParallel))
        return next((d for d in (every if scan_all else list(_DDP_MODULES))
                     if any(id(p) in ours for p in d.module.parameters())), None)
    for scan_all in (False, True) if scan else (False,):
        if find(scan_all) is not None:
            gc.collect()   # a wrapper the caller dropped may wait in a reference cycle: it does not count
            return find(scan_all)
    return None


def check_ddp(params: list[torch.Tensor], grad_reduce: str = "step", dp: int = 2) -> None:
    """At the first step: ``grad_reduce="step"`` refuses parameters a ``DistributedDataParallel`` holds (twice
    the gradient traffic, silently); ``"ddp"`` on several DP ranks needs one (else each rank would step on its own
    gradient and the replicas would drift apart)."""
    ddp = ddp_wrapper(params, scan=grad_reduce == "ddp") if grad_reduce != "ddp" or dp > 1 else None
    if grad_reduce != "ddp" and ddp is not None:
        raise RuntimeError(
            f"these parameters belong to a model wrapped in {type(ddp).__name__}: DDP all-reduces every gradient "
            "and then this optimizer reduce-scatters it again (twice the gradient traffic). Build the optimizer "
            "with grad_reduce='ddp' (DDP averages, step() reduces nothing: what HF Trainer, Accelerate and "
            "Lightning need), or unwrap the model (use ddp.module, or do not wrap it): the optimizer then averages "
            "the gradients over the data-parallel ranks itself, inside step()")
    if grad_reduce == "ddp" and dp > 1 and ddp is None:
        raise RuntimeError(
            "grad_reduce='ddp' says DistributedDataParallel averages the gradients before step(), but no "
            "DistributedDataParallel holds these parameters: each rank would step on its own gradient. Wrap the "
            "model in DDP (HF Trainer, Accelerate and Lightning do under torchrun), or build the optimizer with "
            "grad_reduce='step' (the default: step() averages them)")


def refuse_ddp(params: list[torch.Tensor]) -> None:
    """``FSDPMuon``: parameters a ``DistributedDataParallel`` module holds are refused."""
    ddp = ddp_wrapper(params)
    if ddp is not None:
        raise RuntimeError(
            f"these parameters belong to a model wrapped in {type(ddp).__name__}: DDP all-reduces every "
            "gradient that FSDP2 already reduce-scatters. Unwrap the model (use ddp.module, or do not wrap it)")
