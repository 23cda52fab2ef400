"""The NaN/Inf check of a step's gradients, decided by every rank together.

Each rank finds its own non-finite gradients with one ``torch._foreach_norm`` (the max-abs norm: it reads each
gradient once, is NaN or Inf exactly when the gradient holds a NaN or an Inf, and never overflows). What every
rank then does must be the same, or a rank that skips a step leaves its peers waiting in a collective (on gloo
the next mismatched collective aborts; NCCL hangs until its timeout). So the verdict is voted: each rank puts,
for every parameter, a code into a vector (``world - job rank`` where its gradient is not finite, 0 where it is)
and a MAX all-reduce gives every rank the same vector: which parameters were bad, and the lowest rank that saw it.
``check_finite=`` says where that vote travels and what follows:

* ``"raise"`` (the default on a CPU, where reading a value costs nothing): the codes ride the step's ballot, one
  small device all-reduce with the presence flags (``contract.vote``), and are read on the host once, after it
  (the step's one host sync: raising is a host decision). A bad gradient anywhere makes every rank raise the
  same ``FloatingPointError`` at the same step, before the first collective that moves gradients, with nothing
  changed: a loop may catch it, zero the gradients and go on.
* ``"defer"`` (the default on a GPU): no host read. The codes are all-reduced on the device (the same ballot as
  presence), and the step runs
  masked by the result: a step with a bad gradient anywhere is a no-op on every rank (parameters, optimizer
  state and step counts as they were; ``updates.py``'s ``keep=``). The vector travels to the host without
  blocking; the next ``step()``, ``state_dict()`` or ``opt.check_finite_now()`` reads it and reports the skipped
  step (a ``SkippedStep`` warning naming the parameter, the rank and the step; ``opt.skipped_steps`` lists them)
  and takes back the step counts the host had already advanced. The mask costs one select over each bucket's
  gradient shard (a job of one rank, with no one to disagree with, skips it: its bad step is taken and the next
  read raises ``FloatingPointError``, as before; it also reads no Muon gradient for the check, but the norm of
  each Muon matrix's bf16 update, in the step, half the bytes: ``late_codes``).
* ``False``: no check (as torch's optimizers): a NaN spreads through the reduce-scatter to every rank alike.

    named = [("w0", g0), ("w1", g1)]
    check_finite(named, where="rank 0, step 3")   # one rank's own check: FloatingPointError naming w0
"""
from __future__ import annotations

import warnings

import torch

MODES = ("raise", "defer")


class SkippedStep(RuntimeWarning):
    """A ``check_finite="defer"`` step found a NaN/Inf gradient on some rank and was skipped by every rank."""


def resolve_mode(check, device: torch.device, capturable: bool = False):
    """``check_finite`` as given (True, False, "raise", "defer" or None) -> "raise", "defer" or None (off).
    None means the device's default: "raise" on a CPU, "defer" elsewhere, and "defer" everywhere for a
    ``capturable=True`` optimizer (which cannot read the verdict inside ``step()``: ``capture.py``)."""
    if check is None:
        return "raise" if device.type == "cpu" and not capturable else "defer"
    if check is True:
        return "raise"
    if check is False:
        return None
    if check not in MODES:
        raise ValueError(f"check_finite must be True, False, 'raise' or 'defer', got {check!r}")
    return check


def grad_norms(named: list[tuple[str, torch.Tensor]]) -> torch.Tensor | None:
    """Every tensor's max-abs norm, stacked on the device (None when there is none; 0 for an empty one). No sync."""
    if not named:
        return None
    full = [t for _, t in named if t.numel()]
    norms = iter(torch._foreach_norm(full, float("inf")) if full else [])
    zero = torch.zeros((), dtype=named[0][1].dtype, device=named[0][1].device)
    return torch.stack([next(norms) if t.numel() else zero for _, t in named]).float()


def finite_flag(named: list[tuple[str, torch.Tensor]]) -> torch.Tensor | None:
    """One on-device bool: every tensor in ``named`` is finite (None when there is none). No host sync."""
    norms = grad_norms(named)
    return None if norms is None else norms.isfinite().all()


def nonfinite(named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, int]]:
    """(name, count of NaN/Inf values) of each tensor that has any; [] after a single host sync when none has."""
    if not named:
        return []
    if bool(finite_flag(named)):
        return []
    counts = [(name, int((~t.isfinite()).sum())) for name, t in named]
    return [(name, n) for name, n in counts if n]


def check_finite(named: list[tuple[str, torch.Tensor]], where: str,
                 note: str = "the step was not taken and nothing was changed", known_finite: bool | None = None,
                 found_on: int | None = None) -> None:
    """Raise ``FloatingPointError`` naming the first gradient with NaN/Inf values (and listing the others).
    ``known_finite``: the flag already read; True skips the check. ``found_on``: the job rank the error
    names as where it was found (the launcher waits for that rank's report: ``launch.py``)."""
    if known_finite:
        return
    bad = nonfinite(named)
    if bad:
        (name, count), rest = bad[0], bad[1:]
        also = f"; also non-finite: {', '.join(f'{n!r} ({c})' for n, c in rest)}" if rest else ""
        error = FloatingPointError(f"gradient of parameter {name!r} has {count} NaN/Inf value(s) on {where}; {note}{also}")
        error.found_on = found_on
        raise error


# ---- the vote ----------------------------------------------------------------------------------------------

def local_codes(norms: torch.Tensor, job_rank: int, job_world: int) -> torch.Tensor:
    """This rank's vote, on the device: ``job_world - job_rank`` where a norm is not finite, else 0."""
    return (~norms.isfinite()).to(torch.int32) * (job_world - job_rank)


def spread(codes: torch.Tensor | None, index: list[int], n: int, device) -> torch.Tensor:
    """The codes of the parameters that have a gradient here (``index``: their places) in a vector of all ``n``,
    on the device, made with no host-to-device copy."""
    if not n:
        return torch.zeros(0, dtype=torch.int32, device=device)
    zero = torch.zeros((), dtype=torch.int32, device=device)
    at = dict(zip(index, range(len(index))))
    return torch.stack([codes[at[i]] if i in at else zero for i in range(n)])


def late_codes(norms: list[tuple[int, torch.Tensor]], n: int, job_rank: int, job_world: int,
               device) -> torch.Tensor:
    """A vote (as ``spread`` makes it) from the max-abs norms of the step's own results: (place, norm) pairs, a
    place's code non-zero when any of its norms is not finite. Made on the device with no host-to-device copy.

    A job of one rank under "defer" checks a Muon matrix here instead of reading its gradient before the step:
    Newton-Schulz's output holds a NaN exactly when its input held a NaN or an Inf (an Inf becomes NaN in
    Nesterov's lerp, or in the division by the norm, and a matmul spreads a NaN), and that input is made from the
    gradient and the momentum, so the norm of the bf16 update reads half the gradient's bytes in a pass that
    was not otherwise made, and flags the gradient's NaN/Inf at the same step. It flags an Inf or NaN already in
    the momentum as well (which only a step taken with a bad gradient leaves there), and a finite gradient
    within 0.4% of float32's largest value, which rounds to Inf in bf16."""
    by: dict = {}
    for i, norm in norms:
        by.setdefault(i, []).append(norm)
    if not by:
        return torch.zeros(n, dtype=torch.int32, device=device)
    flat = [x for i in by for x in by[i]]
    codes = local_codes(torch.stack(flat).float(), job_rank, job_world)
    at, k = {}, 0
    for i in by:
        at[i] = codes[k] if len(by[i]) == 1 else codes[k: k + len(by[i])].amax()
        k += len(by[i])
    zero = torch.zeros((), dtype=torch.int32, device=device)
    return torch.stack([at.get(i, zero) for i in range(n)])


def raise_agreed(agreed: list[int], names: list[str], named: list[tuple[str, torch.Tensor]], where: str,
                 job_rank: int, job_world: int, tp: int, step: int) -> None:
    """Every rank, after the vote: raise the same ``FloatingPointError`` if any rank voted a parameter bad. The
    rank that found it names the values (its own check); the others name that rank and parameter."""
    bad = [(n, job_world - c) for n, c in zip(names, agreed) if c]
    if not bad:
        return
    first = min(r for _, r in bad)
    if first == job_rank:
        check_finite(named, where, found_on=job_rank)
    name = next(n for n, r in bad if r == first)
    also = [n for n, _ in bad if n != name]
    error = FloatingPointError(
        f"gradient of parameter {name!r} has NaN/Inf values on rank {first} (dp {first // tp}, tp {first % tp}), "
        f"step {step}; every rank stops at this step: the step was not taken and nothing was changed"
        + (f"; also non-finite: {', '.join(map(repr, also))}" if also else ""))
    error.found_on = first
    raise error


class Deferred:
    """``check_finite="defer"``: one step's agreed vote on its way to the host, read later.

    ``launch`` keeps the voted vector and whether the step was kept (device tensors, copied without blocking) and
    an ``undo`` for what the host advanced (step counts); ``check`` reads them when the next host read comes."""

    def __init__(self):
        self.pending = None
        self.skipped: list[int] = []   # the steps skipped so far (their numbers as they were reported)

    def launch(self, agreed: torch.Tensor, keep: torch.Tensor, names: list[str], step: int, tp: int, job_world: int,
               undo, hold: bool = False) -> None:
        """``hold`` (``capturable=True``): copy the vote into device buffers made at the first launch and kept
        (no host allocation, copy or event in the step); ``check`` reads them, outside the step."""
        if hold:
            self.held = held = self.__dict__.get("held") or {}
            for key, t in (("agreed", agreed), ("keep", keep)):
                if t is not None:
                    if key not in held or held[key].shape != t.shape:
                        held[key] = torch.empty_like(t)
                    held[key].copy_(t)
            agreed, keep = (held["agreed"], None), None if keep is None else (held["keep"], None)
        else:
            agreed, keep = _to_host(agreed), None if keep is None else _to_host(keep)
        self.pending = dict(agreed=agreed, keep=keep, names=names, step=step, tp=tp, world=job_world, undo=undo)

    def check(self) -> int | None:
        """If the launched step was skipped: take back what the host advanced, warn on every rank alike, and
        return its step number (None if it was kept or nothing was pending)."""
        if self.pending is None:
            return None
        p, self.pending = self.pending, None
        agreed = _read(p["agreed"])
        bad = [(n, p["world"] - int(c)) for n, c in zip(p["names"], agreed.tolist()) if c]
        if p["keep"] is None:   # one rank: the step was taken, not masked
            if bad:
                raise FloatingPointError(
                    f"gradient of parameter {bad[0][0]!r} had NaN/Inf values on rank 0, step {p['step']}; with "
                    "check_finite='defer' on one process that step was taken (a job of several ranks skips it on "
                    "every rank), so parameters and optimizer state may now hold NaN/Inf: reload the last "
                    "checkpoint, or use check_finite='raise' (one host read per step)")
            return None
        if bool(_read(p["keep"]).all()):
            return None
        p["undo"]()
        if bad:
            first = min(r for _, r in bad)
            name = next(n for n, r in bad if r == first)
            what = (f"gradient of parameter {name!r} had NaN/Inf values on rank {first} (dp {first // p['tp']}, "
                    f"tp {first % p['tp']})")
        else:
            what = "another optimizer of this model had a NaN/Inf gradient (the optimizers decided together)"
        self.skipped.append(p["step"])
        warnings.warn(f"step {p['step']} was skipped on every rank: {what}; parameters, optimizer state and step "
                      "counts are as they were before it (check_finite='defer')", SkippedStep, stacklevel=3)
        return p["step"]


def _to_host(t: torch.Tensor):
    """A non-blocking copy to the host (into pinned memory, with an event, from a GPU), read by ``_read``. The
    host side starts as "all is well" (True, or 0), which is what a tensor on ``meta`` leaves it as."""
    pinned, t = t.device.type == "cuda", t.reshape(-1)
    host = (torch.ones if t.dtype == torch.bool else torch.zeros)(t.shape, dtype=t.dtype, pin_memory=pinned)
    host.copy_(t, non_blocking=True)
    event = None
    if pinned:
        event = torch.cuda.Event()
        event.record()
    return host, event


def _read(pair) -> torch.Tensor:
    host, event = pair
    if event is not None and not event.query():
        event.synchronize()
    return host if host.device.type == "cpu" else host.cpu()   # a held device buffer (capturable), read now
