"""The NaN/Inf check of a step's gradients, decided by every rank together (``book/api.md``: ``check_finite``).

Each rank finds its own non-finite gradients with one ``torch._foreach_norm`` (max-abs: NaN or Inf exactly when
the gradient holds one, and it never overflows). What the ranks then do must be the same, or a rank that skips a
step leaves its peers waiting in a collective, so the verdict is voted: for every parameter a code (``world - job
rank`` where the gradient is not finite, else 0) goes into the step's ballot, and a MAX all-reduce gives every rank
which parameters were bad and the lowest rank that saw it (``contract.vote``). ``check_finite=`` (read when an
optimizer is built, ``optim.resolve_mode``) says what follows:

* ``"raise"`` (the default on a CPU): the host reads the ballot once; a bad gradient anywhere makes every rank
  raise the same ``FloatingPointError`` before the first collective that moves gradients, nothing changed.
* ``"defer"`` (the default on a GPU): no host read. The step runs masked by the verdict (``updates.py``'s
  ``keep=``: a no-op on every rank when a gradient was bad); the next ``step()``, ``state_dict()`` or
  ``opt.check_finite_now()`` reads it (``Deferred``), warns ``SkippedStep`` and takes back the step counts. A job
  of one rank takes its bad step and the next read raises; it checks a Muon matrix from the norm of its bf16
  update instead of its gradient (``late_codes``).
* ``False``: no check (as torch's optimizers): a NaN spreads through the reduce-scatter to every rank alike.

    check_finite([("w0", g0), ("w1", g1)], where="rank 0, step 3")   # FloatingPointError naming w0
"""
from __future__ import annotations

import warnings

import torch

class SkippedStep(RuntimeWarning):
    """A ``check_finite="defer"`` step found a NaN/Inf gradient on some rank and was skipped by every rank."""


def grad_norms(named: list[tuple[str, torch.Tensor]]) -> torch.Tensor | None:
    """Every tensor's max-abs norm, stacked on the device (None when there is none; 0 for an empty one). No sync."""
    if not named:
        return None
    full = [t for _, t in named if t.numel()]
    norms = iter(torch._foreach_norm(full, float("inf")) if full else [])
    zero = torch.zeros((), dtype=named[0][1].dtype, device=named[0][1].device)
    return torch.stack([next(norms) if t.numel() else zero for _, t in named]).float()


def nonfinite(named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, int]]:
    """(name, count of NaN/Inf values) of each tensor that has any; [] after a single host sync when none has."""
    if not named or bool(grad_norms(named).isfinite().all()):
        return []
    counts = [(name, int((~t.isfinite()).sum())) for name, t in named]
    return [(name, n) for name, n in counts if n]


def check_finite(named: list[tuple[str, torch.Tensor]], where: str, found_on: int | None = None) -> None:
    """Raise ``FloatingPointError`` naming the first gradient with NaN/Inf values (and listing the others).
    ``found_on``: the job rank the error names as where it was found (the launcher waits for its report)."""
    bad = nonfinite(named)
    if bad:
        (name, count), rest = bad[0], bad[1:]
        also = f"; also non-finite: {', '.join(f'{n!r} ({c})' for n, c in rest)}" if rest else ""
        error = FloatingPointError(f"gradient of parameter {name!r} has {count} NaN/Inf value(s) on {where}; "
                                   f"the step was not taken and nothing was changed{also}")
        error.found_on = found_on
        raise error


# ---- the vote ----------------------------------------------------------------------------------------------

def local_codes(norms: torch.Tensor, job_rank: int, job_world: int) -> torch.Tensor:
    """This rank's vote, on the device: ``job_world - job_rank`` where a norm is not finite, else 0."""
    return (~norms.isfinite()).to(torch.int32) * (job_world - job_rank)


def spread(codes: torch.Tensor | None, index: list[int], n: int, device) -> torch.Tensor:
    """The codes of the parameters that have a gradient here (``index``: their places) in a vector of all ``n``,
    on the device, with no host-to-device copy."""
    if not n:
        return torch.zeros(0, dtype=torch.int32, device=device)
    zero = torch.zeros((), dtype=torch.int32, device=device)
    at = dict(zip(index, range(len(index))))
    return torch.stack([codes[at[i]] if i in at else zero for i in range(n)])


def late_codes(norms: list[tuple[int, torch.Tensor]], n: int, job_rank: int, job_world: int,
               device) -> torch.Tensor:
    """A vote (as ``spread`` makes it) from the max-abs norms of the step's own results: (place, norm) pairs, a
    place's code non-zero when any of its norms is not finite; on the device, no host-to-device copy.

    A job of one rank under "defer" checks a Muon matrix here instead of reading its gradient: Newton-Schulz's
    output holds a NaN exactly when its input (made from the gradient and the momentum) held a NaN or an Inf, so
    the bf16 update's norm flags the gradient at the same step, reading half its bytes. It also flags a bad
    momentum, and a finite gradient within 0.4% of float32's largest value (Inf in bf16)."""
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
    name, first = _first_bad(bad)
    if first == job_rank:
        check_finite(named, where, found_on=job_rank)
    also = [n for n, _ in bad if n != name]
    error = FloatingPointError(
        f"gradient of parameter {name!r} has NaN/Inf values on rank {first} (dp {first // tp}, tp {first % tp}), "
        f"step {step}; every rank stops at this step: the step was not taken and nothing was changed"
        + (f"; also non-finite: {', '.join(map(repr, also))}" if also else ""))
    error.found_on = first
    raise error


def _first_bad(bad: list[tuple[str, int]]) -> tuple[str, int]:
    """(parameter, rank) of the lowest rank that voted a parameter bad, from (parameter, rank) pairs."""
    first = min(r for _, r in bad)
    return next(n for n, r in bad if r == first), first


class Deferred:
    """``check_finite="defer"``: one step's agreed vote and verdict on their way to the host (``launch``, no
    blocking), with an ``undo`` for what the host advanced (step counts); ``check`` reads them later."""

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
            name, first = _first_bad(bad)
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
