"""The NaN/Inf check of a step's gradients with one host sync, however many parameters there are.

Reading ``bool(torch.isfinite(g).all())`` per parameter stalls the CPU on a GPU once per parameter
(21 times a step for the tiny GPT). Here every parameter's flag is computed on the device, stacked and
read once; only when that one read says something is wrong are the parameters looked at one by one
(the failure path may be slow: the step is abandoned anyway), so the error still names them.

    check_finite([("w0", g0), ("w1", g1)], where="rank 0, step 3")   # raises FloatingPointError naming w0
"""
from __future__ import annotations

import torch


def finite_flag(named: list[tuple[str, torch.Tensor]]) -> torch.Tensor | None:
    """One on-device bool: every tensor in ``named`` is finite (None when there is none). No host sync:
    the caller reads it together with whatever else the step reads (``contract.grads_present``)."""
    if not named:
        return None
    return torch.stack([t.isfinite().all() for _, t in named]).all()


def nonfinite(named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, int]]:
    """(name, count of NaN/Inf values) of each tensor that has any; [] after a single host sync when none has."""
    if not named:
        return []
    if bool(torch.stack([t.isfinite().all() for _, t in named]).all()):
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
