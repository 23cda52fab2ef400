"""The NaN/Inf check of a step's gradients, decided by every rank together (``book/api.md``: ``check_finite``).

Each rank finds its own non-finite gradients with their max-abs norms (``max_abs``: NaN or Inf exactly when
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


def max_abs(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each (non-empty) tensor's largest |value|, NaN or Inf exactly when the tensor has one. No sync.
    One fused ``_foreach_norm`` on an accelerator; on the CPU each tensor's ``aminmax`` instead: there torch's
    inf-norm is several times slower (39 Llama-sized gradients, 3.1M values, one thread: 14.6 ms against 2.5 ms,
    torch 2.13), and it ran inside every step."""
    if tensors and tensors[0].device.type == "cpu":
        return [torch.maximum(hi, -lo) for lo, hi in map(torch.aminmax, tensors)]
    return list(torch._foreach_norm(tensors, float("inf")))


def grad_norms(named: list[tuple[str, torch.Tensor]]) -> torch.Tensor | None:
    """Every tensor's max-abs norm, stacked on the device (None when there is none; 0 for an empty one). No sync."""
    if not named:
        return None
    full = [t for _, t in named if t.numel()]
    norms = iter(max_abs(full) if full else [])
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
    """``check_finite="defer"``: each step's agreed vote and verdict on their way to the host (``launch``, no
    blocking), with an ``undo`` for what the host advanced (step counts); ``check`` reads them later.

    ``hold`` (``capturable=True``): the vote stays on the device, in a ``Record`` made at the first launch and kept.
    A step adds to it with device ops only, so a CUDA graph that replays the step (where no Python runs, and so no
    ``launch`` bookkeeping) still adds every replay's verdict; ``check`` reads it, outside the step, and clears it."""

    def __init__(self, hold: bool = False):
        self.hold, self.pending, self.record = hold, None, None
        self.skipped: list[int] = []   # the steps skipped so far (their numbers as they were reported)

    def check_between_steps(self) -> int | None:
        """``check``, where the optimizer may read the host at the start of a step (not under ``hold``)."""
        return None if self.hold else self.check()

    def launch(self, agreed: torch.Tensor, keep: torch.Tensor | None, names: list[str], step: int, tp: int,
               job_world: int, undo) -> None:
        self.pending = dict(names=names, step=step, tp=tp, world=job_world, undo=undo)   # what the words need
        if self.hold:   # the values are the record's
            self.record = self.record or Record(agreed, step, alone=keep is None)
            self.record.add(agreed, keep)
        else:
            self.pending.update(agreed=_to_host(agreed), keep=None if keep is None else _to_host(keep))

    def check(self) -> int | None:
        """If a launched step was skipped: take back what the host advanced, warn on every rank alike, and
        return its step number (None if it was kept or nothing was pending)."""
        if self.hold:
            return self._check_record()
        if self.pending is None:
            return None
        p, self.pending = self.pending, None
        agreed = _read(p["agreed"])
        bad = [(n, p["world"] - int(c)) for n, c in zip(p["names"], agreed.tolist()) if c]
        if p["keep"] is None:   # one rank: the step was taken, not masked
            _taken(bad, f"step {p['step']}")
            return None
        if bool(_read(p["keep"]).all()):
            return None
        return self._skipped(p, bad, f"step {p['step']} was", p["step"], 1)

    def _check_record(self) -> int | None:
        if self.record is None or self.pending is None:
            return None
        p, (agreed, count, first, last) = self.pending, self.record.read()
        bad = [(n, p["world"] - int(c)) for n, c in zip(p["names"], agreed.tolist()) if c]
        if not count:
            return None
        which = f"step {last}" if count == 1 else f"{count} steps, {first} to {last},"
        if self.record.alone:   # one rank: the steps were taken, not masked
            _taken(bad, which)
            return None
        return self._skipped(p, bad, which + " was" if count == 1 else which + " were", last, count)

    def _skipped(self, p: dict, bad: list, which: str, step: int, count: int) -> int:
        p["undo"](count)
        if bad:
            name, first = _first_bad(bad)
            what = (f"gradient of parameter {name!r} had NaN/Inf values on rank {first} (dp {first // p['tp']}, "
                    f"tp {first % p['tp']})")
        else:
            what = "another optimizer of this model had a NaN/Inf gradient (the optimizers decided together)"
        self.skipped.append(step)
        warnings.warn(f"{which} skipped on every rank: {what}; parameters, optimizer state and step "
                      "counts are as they were before it (check_finite='defer')", SkippedStep, stacklevel=4)
        return step


def _taken(bad: list, which: str) -> None:
    if bad:
        raise FloatingPointError(
            f"gradient of parameter {bad[0][0]!r} had NaN/Inf values on rank 0, {which}; with "
            "check_finite='defer' on one process that step was taken (a job of several ranks skips it on "
            "every rank), so parameters and optimizer state may now hold NaN/Inf: reload the last "
            "checkpoint, or use check_finite='raise' (one host read per step)")


class Record:
    """``Deferred(hold=True)``'s device tensors, made once: the largest code each parameter was voted since the
    last read (``agreed``), how many steps were skipped (``skipped``; one rank: steps with a bad vote, which it
    takes), the step counter and the numbers of the first and last such step. ``add`` is device ops only (no
    host copy, no read), so it runs in a replayed graph too; ``read`` is the host read, then clears it."""

    def __init__(self, agreed: torch.Tensor, step: int, alone: bool):
        device = agreed.device
        self.agreed = torch.zeros_like(agreed)
        self.skipped, self.first, self.last = (torch.zeros((), dtype=torch.int64, device=device) for _ in range(3))
        self.counter = torch.full((), step - 1, dtype=torch.int64, device=device)
        self.alone = alone   # the job decides alone (no keep: one rank takes its steps)

    def add(self, agreed: torch.Tensor, keep: torch.Tensor | None) -> None:
        bad = (agreed != 0).any() if keep is None else ~keep
        self.counter.add_(1)
        torch.maximum(self.agreed, agreed, out=self.agreed)
        torch.where(bad & (self.skipped == 0), self.counter, self.first, out=self.first)
        torch.where(bad, self.counter, self.last, out=self.last)
        self.skipped.add_(bad)

    def read(self) -> tuple[torch.Tensor, int, int, int]:
        agreed, skipped = self.agreed.to("cpu", copy=True), int(self.skipped)
        first, last = int(self.first), int(self.last)
        self.agreed.zero_()
        self.skipped.zero_()
        return agreed, skipped, first, last


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
