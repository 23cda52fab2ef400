"""An oracle for the optimizers' math that shares no code with the engine (issue 41).

Everything here is written from the papers' and torch's documented formulas, in float64, and imports
nothing from muongrid: a bug in ``muongrid.updates`` or ``muongrid.newton_schulz`` cannot hide here by being
shared with the reference (verify.py's ``MuonW`` calls the same functions as the engine, so comparing the two
is blind to them).

* Muon momentum in the EMA form the engine documents (``updates.py``, as torch.optim.Muon):
  ``buf = mu*buf + (1-mu)*g``, Nesterov ``u = (1-mu)*g + mu*buf``, else ``u = buf``. (Moonshot's sum form,
  ``buf = mu*buf + g``, is ``1/(1-mu)`` times this; with Newton-Schulz replaced by the identity the two differ
  by that factor, so the oracle tells them apart.)
* Decoupled weight decay with the unadjusted lr, then the update with the adjusted lr:
  ``p = p*(1 - lr*wd) - adjusted(lr) * NS(u)``; adjusted: "match_rms_adamw" ``0.2*sqrt(max(A, B))*lr``,
  "original" ``sqrt(max(1, A/B))*lr``, "none" ``lr``.
* AdamW (Loshchilov & Hutter, torch.optim.AdamW): ``m = b1*m + (1-b1)*g``, ``v = b2*v + (1-b2)*g^2``,
  ``p = p*(1 - lr*wd) - lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)``.
* Newton-Schulz: ``ns5`` below, the quintic iteration on the Frobenius-normalised matrix (wide orientation,
  norm clamped below by eps), in float64.
* CyclicLR's "triangular" policy, by its formula: ``cyclic(t, base, top, size)``.
"""
from __future__ import annotations

import math

import torch

MUON_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def ns5(G: torch.Tensor, steps: int = 5, coefficients=MUON_COEFFICIENTS, eps: float = 1e-7) -> torch.Tensor:
    """Newton-Schulz in float64: X <- a X + (b A + c A^2) X with A = X X^T, on the wide orientation."""
    X = G.to(torch.float64)
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    X = X / max(float(torch.sqrt((X * X).sum())), eps)
    a, b, c = coefficients
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * (A @ A)) @ X
    return X.T if tall else X


def adjusted(lr: float, shape, mode: str) -> float:
    rows, cols = shape[-2], shape[-1]
    if mode == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols)) * lr
    if mode == "original":
        return math.sqrt(max(1.0, rows / cols)) * lr
    assert mode == "none", mode
    return lr


def cyclic(t: int, base: float, top: float, size: int) -> float:
    """CyclicLR "triangular" after ``t`` scheduler steps: base -> top over ``size`` steps and back."""
    cycle = math.floor(1 + t / (2 * size))
    x = abs(t / size - 2 * cycle + 1)
    return base + (top - base) * max(0.0, 1 - x)


class Oracle:
    """Float64 Muon or AdamW on whole tensors. ``ns``: the Newton-Schulz to use (``ns5`` by default, or
    ``identity`` to compare with an engine whose Newton-Schulz was replaced by the identity).
    ``step`` returns the parameter's new value and a bound on how far a correct engine, computing in fp32
    (bf16 at Newton-Schulz's input), may be from it after this step (see ``Oracle.step``)."""

    def __init__(self, p: torch.Tensor, muon: bool, ns=None, momentum_form: str = "ema"):
        self.p = p.detach().to(torch.float64).clone()
        self.muon, self.ns, self.form = muon, ns or ns5, momentum_form
        self.buf = torch.zeros_like(self.p)
        self.m, self.v, self.t = torch.zeros_like(self.p), torch.zeros_like(self.p), 0
        self.bound = torch.zeros_like(self.p)

    def step(self, g: torch.Tensor, h: dict) -> torch.Tensor:
        """One step with gradient ``g`` and hyperparameters ``h`` (lr, weight_decay, and momentum, nesterov,
        ns_steps, eps, adjust_lr for Muon or betas, eps for AdamW).

        The bound grows by, per element: for Muon ``2**-7 * s*|u|`` (Newton-Schulz's input is rounded to bf16,
        8 significant bits, so at most 2**-8 relative; doubled; with the identity in place of Newton-Schulz that rounding reaches the
        parameter as it is); for AdamW ``2**-16 * lr * |update|`` (fp32 rounding of m, v, the square root and
        the division, a few ulps of 2**-24 each, with a wide margin); for both ``2**-21 * |p|`` (the fp32 decay
        and add, 2 roundings of 2**-24, margin 4)."""
        g = g.to(torch.float64)
        lr, wd = float(h["lr"]), float(h["weight_decay"])
        decayed = self.p * (1 - lr * wd)
        if self.muon:
            mu = float(h["momentum"])
            if self.form == "ema":
                self.buf = mu * self.buf + (1 - mu) * g
                u = (1 - mu) * g + mu * self.buf if h["nesterov"] else self.buf
            else:   # Moonshot's sum form, to show the oracle tells the two apart
                self.buf = mu * self.buf + g
                u = g + mu * self.buf if h["nesterov"] else self.buf
            s = adjusted(lr, self.p.shape, h["adjust_lr"])
            step = s * self.ns(u, int(h["ns_steps"]), eps=float(h["eps"]))
            self.bound += 2**-7 * s * u.abs()   # meant for ns=identity; with ns5 see tests/test_oracle.py
        else:
            b1, b2 = (float(b) for b in h["betas"])
            self.t += 1
            self.m = b1 * self.m + (1 - b1) * g
            self.v = b2 * self.v + (1 - b2) * g * g
            step = lr * (self.m / (1 - b1**self.t)) / ((self.v / (1 - b2**self.t)).sqrt() + float(h["eps"]))
            self.bound += 2**-16 * step.abs()
        self.p = decayed - step
        self.bound += 2**-21 * self.p.abs()
        return self.p


def identity(G: torch.Tensor, steps: int = 5, coefficients=None, eps: float = 1e-7) -> torch.Tensor:
    """Newton-Schulz replaced by the identity (the oracle's side of ``identity_hook``)."""
    return G.to(torch.float64)


class NSHook:
    """Stands in for the engine's ``zeropower_ns5``: returns its input as it is (a bf16 matrix stays bf16, as
    the real function returns its ``dtype``) and records what each call was asked for, so a test can check that
    every matrix got its own group's ns_steps, coefficients and eps."""

    def __init__(self):
        self.calls = []

    def __call__(self, G, steps=5, coefficients=MUON_COEFFICIENTS, eps=1e-7, dtype=torch.bfloat16, form="standard"):
        self.calls.append(dict(shape=tuple(G.shape[-2:]), steps=steps, coefficients=coefficients, eps=eps, form=form))
        return G.to(dtype)
