"""The NaN/Inf check of a step's gradients: one device reduction, read when it costs the GPU nothing.

Every gradient's norm comes from one ``torch._foreach_norm`` (it reads each gradient once); a NaN or Inf
anywhere makes its norm non-finite. What happens next is ``check_finite=``:

* ``"raise"`` (the default on a CPU, where reading a value costs nothing): the flag is read at once, with
  the step's other host read, and a non-finite gradient stops the step before anything changes, with an
  error naming the parameter (``FloatingPointError``). On a GPU that read is one host sync per step.
* ``"defer"`` (the default on a GPU): the norms travel to the host without blocking (a non-blocking copy into
  pinned memory, and a CUDA event); the step goes on. The next ``step()`` (or ``state_dict()``, or
  ``opt.check_finite_now()``) reads them, by then long arrived, and raises the same error naming the
  parameter and the step it came from. That step was taken: its parameters and optimizer state may hold
  NaN/Inf, so reload a checkpoint (or use ``"raise"`` where a bad batch must not touch the state). No host sync.
* ``False``: no check (as torch's optimizers).

A finite gradient whose squares overflow fp32 (values above ~1e19) also has an infinite norm; ``"raise"``
then counts the NaN/Inf values one by one and goes on if there are none, ``"defer"`` says so in its error.

    check_finite([("w0", g0), ("w1", g1)], where="rank 0, step 3")   # raises FloatingPointError naming w0
"""
from __future__ import annotations

import torch

MODES = ("raise", "defer")


def resolve_mode(check, device: torch.device):
    """``check_finite`` as given (True, False, "raise", "defer" or None) -> "raise", "defer" or None (off).
    None means the device's default: "raise" on a CPU, "defer" elsewhere."""
    if check is None:
        return "raise" if device.type == "cpu" else "defer"
    if check is True:
        return "raise"
    if check is False:
        return None
    if check not in MODES:
        raise ValueError(f"check_finite must be True, False, 'raise' or 'defer', got {check!r}")
    return check


def grad_norms(named: list[tuple[str, torch.Tensor]]) -> torch.Tensor | None:
    """Every gradient's norm, stacked into one tensor on the device (None when there is none). No host sync."""
    if not named:
        return None
    return torch.stack(torch._foreach_norm([t for _, t in named]))


def finite_flag(named: list[tuple[str, torch.Tensor]]) -> torch.Tensor | None:
    """One on-device bool: every tensor in ``named`` is finite (None when there is none). No host sync:
    the caller reads it together with whatever else the step reads."""
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
                 note: str = "the step was not taken and nothing was changed", known_finite: bool | None = None) -> None:
    """Raise ``FloatingPointError`` naming the first gradient with NaN/Inf values (and listing the others).
    ``known_finite``: the flag already read (``finite_flag``); True skips the check, False names the culprits."""
    if known_finite:
        return
    bad = nonfinite(named) if known_finite is None else [(n, c) for n, c in
                                                        ((n, int((~t.isfinite()).sum())) for n, t in named) if c]
    if bad:
        (name, count), rest = bad[0], bad[1:]
        also = f"; also non-finite: {', '.join(f'{n!r} ({c})' for n, c in rest)}" if rest else ""
        raise FloatingPointError(f"gradient of parameter {name!r} has {count} NaN/Inf value(s) on {where}; {note}{also}")


class Deferred:
    """``check_finite="defer"``: one step's gradient norms on their way to the host, read later."""

    def __init__(self):
        self.pending = None   # (names, where, host norms, event or None)

    def launch(self, named: list[tuple[str, torch.Tensor]], where: str) -> None:
        """Start the norms' copy to the host (non-blocking; nothing waits for it here)."""
        norms = grad_norms(named)
        if norms is None:
            return
        pinned = norms.device.type == "cuda"
        host = torch.zeros(norms.shape, dtype=norms.dtype, pin_memory=pinned)
        host.copy_(norms, non_blocking=True)
        event = None
        if pinned:
            event = torch.cuda.Event()
            event.record()
        self.pending = ([n for n, _ in named], where, host, event)

    def check(self) -> None:
        """Raise for the launched step if one of its gradients was not finite (waits for the copy, which has
        long finished by the time the next step or a checkpoint asks)."""
        if self.pending is None:
            return
        names, where, host, event = self.pending
        self.pending = None
        if event is not None and not event.query():
            event.synchronize()
        bad = [n for n, ok in zip(names, host.isfinite().tolist()) if not ok]
        if bad:
            also = f"; also: {', '.join(repr(n) for n in bad[1:])}" if bad[1:] else ""
            raise FloatingPointError(
                f"gradient of parameter {bad[0]!r} had NaN/Inf values (or values whose squares overflow) on {where}; "
                "with check_finite='defer' (the default on a GPU) that step was taken, so parameters and optimizer "
                "state may now hold NaN/Inf: reload the last checkpoint. check_finite='raise' stops before such a "
                f"step at one host sync per step{also}")
