"""Newton-Schulz variants: per-iteration coefficient schedules and the Gram form. Pure functions.

``newton_schulz.zeropower_ns5`` runs any of them; this file says what they are, checks the options
a user gives, and counts their work.

**Coefficient schedules** (``ns_coefficients``). Each step maps a singular value ``s`` to
``a*s + b*s**3 + c*s**5``; a schedule gives one ``(a, b, c)`` per step:

* ``"muon"`` (the default, the paper's): Keller Jordan's ``(3.4445, -4.7750, 2.0315)`` every step.
  A steep slope at 0 lifts tiny singular values fast; the price is that the result lands in
  roughly [0.7, 1.2] rather than at 1.
* ``"polar_express"``: the five per-step triples of "The Polar Express: Optimal Matrix Sign Methods
  and Their Application to the Muon Algorithm" (N. Amsel, D. Persson, C. Musco, R. M. Gower, 2025,
  arXiv:2505.16932), computed there for 5 iterations, lower bound l = 1e-3, safety factor 2e-2 and
  cushion 2 (the values are those published for that setting and used by modded-nanogpt and nanochat;
  we did not re-derive them, we check what they do). Each step is the minimax odd
  quintic on the interval the previous step left, so the error after every step equioscillates about 1:
  on [1e-3, 1] the five steps give [0.0082, 1.9917], [0.033, 1.966], [0.128, 1.869], [0.416, 1.576],
  [0.859, 1.141] (float64; ``tests/test_ns_variants.py`` checks this), against Muon's [0.47, 1.20].
* ``"cubic"``: the classical Newton-Schulz iteration ``(1.5, -0.5, 0)``, which converges to exactly 1
  but slowly from small singular values (on [1e-2, 1], five steps leave the smallest at 0.076).
* any triple ``(a, b, c)`` (repeated every step) or a list of ``ns_steps`` triples.

**Forms** (``ns_form``):

* ``"standard"``: ``A = X X^T; B = bA + cA^2; X <- aX + BX`` (3 matmuls a step, two of them m x m x n).
* ``"gram"``: iterate on the small m x m Gram matrix ``R = X X^T`` of the short side. Every step is a
  polynomial in R, so ``X_k = Q_k X_0`` with ``Q_k`` m x m, and ``R_{k+1} = P_k R_k P_k`` with
  ``P_k = aI + bR_k + cR_k^2`` (``P_k`` commutes with ``R_k``). Only the first Gram and the final
  ``Q X_0`` touch the long side: ``4 m^2 n + (8 s - 6) m^3`` FLOPs for s >= 2 steps, against
  ``s (4 m^2 n + 2 m^3)``, so it pays when n is well above m (about 1.8x fewer FLOPs at n = 4m) and
  costs more on square matrices. Same result up to rounding (exactly equal in exact arithmetic). Its
  m x m iteration runs in fp32 even for bf16 input: rounded to bf16, R loses its small eigenvalues and
  the iteration can diverge (``newton_schulz._gram_iterations`` says how).
"""
from __future__ import annotations

import math

MUON_QUINTIC = (3.4445, -4.7750, 2.0315)
CUBIC = (1.5, -0.5, 0.0)
# Polar Express (Amsel et al. 2025, arXiv:2505.16932): num_iters=5, l=1e-3, safety factor 2e-2, cushion 2.
POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
NAMED_SCHEDULES = {"muon": MUON_QUINTIC, "polar_express": POLAR_EXPRESS, "cubic": CUBIC}
NS_FORMS = ("standard", "gram")

Triple = tuple[float, float, float]


def _triple(value, where: str) -> Triple | None:
    """``value`` as a triple of finite floats, or None if it is not three numbers."""
    try:
        items = list(value)
    except TypeError:
        return None
    if len(items) != 3 or any(isinstance(x, (str, bytes)) for x in items):
        return None
    try:
        out = tuple(float(x) for x in items)
    except (TypeError, ValueError):
        return None
    if not all(math.isfinite(x) for x in out):
        raise ValueError(f"{where}: Newton-Schulz coefficients must be finite, got {tuple(items)}")
    return out


def ns_schedule(coefficients, steps: int) -> tuple[Triple, ...]:
    """The ``(a, b, c)`` of each of the ``steps`` iterations, from a name, one triple or a schedule.

    Raises ValueError, naming the fix, for anything else (before any work is done).
    """
    where = "ns_coefficients"
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"ns_steps must be an integer >= 0, got {steps!r}")
    if isinstance(coefficients, str):
        if coefficients not in NAMED_SCHEDULES:
            raise ValueError(f"unknown {where} {coefficients!r}; name one of {sorted(NAMED_SCHEDULES)}, or give "
                             "one (a, b, c) triple or a list of ns_steps triples")
        coefficients = NAMED_SCHEDULES[coefficients]
    one = _triple(coefficients, where)
    if one is not None:
        return (one,) * steps
    try:
        schedule = [_triple(t, f"{where}[{i}]") for i, t in enumerate(coefficients)]
    except TypeError:
        schedule = [None]
    if not schedule or any(t is None for t in schedule):
        raise ValueError(f"{where} must be a name ({', '.join(sorted(NAMED_SCHEDULES))}), one (a, b, c) triple, or "
                         f"a list of ns_steps (a, b, c) triples; got {coefficients!r}")
    if len(schedule) != steps:
        raise ValueError(f"{where} is a schedule of {len(schedule)} per-iteration triples but ns_steps is {steps}: "
                         f"pass ns_steps={len(schedule)} (or a schedule of {steps} triples)")
    return tuple(schedule)


def check_ns_form(form: str) -> str:
    if form not in NS_FORMS:
        raise ValueError(f"ns_form must be one of {NS_FORMS}, got {form!r} ('gram' iterates on the m x m Gram "
                         "matrix of the short side)")
    return form


def check_ns_options(coefficients, steps, form: str = "standard") -> None:
    """Refuse, before anything changes, Newton-Schulz options that no step could run."""
    check_ns_form(form)
    ns_schedule(coefficients, int(steps) if isinstance(steps, float) and steps.is_integer() else steps)


def ns_matmuls(steps: int, form: str = "standard") -> int:
    """Matrix products one Newton-Schulz run makes (the norm and additions aside)."""
    check_ns_form(form)
    if form == "standard" or steps == 0:
        return 3 * steps
    # first Gram, final Q X; per step R^2, Q <- P Q (not the first), R <- P R P (not the last: 2)
    return 2 + sum(1 + (k > 0) + 2 * (k < steps - 1) for k in range(steps))


def ns_flops(rows: int, cols: int, steps: int, form: str = "standard") -> int:
    """FLOPs of one Newton-Schulz run on a rows x cols matrix (multiply-adds count 2); m <= n."""
    check_ns_form(form)
    m, n = min(rows, cols), max(rows, cols)
    if form == "standard":
        return steps * (4 * m * m * n + 2 * m**3)
    if steps == 0:
        return 0
    square = sum(1 + (k > 0) + 2 * (k < steps - 1) for k in range(steps))
    return 4 * m * m * n + square * 2 * m**3


def composed_map(s, schedule):
    """Apply a schedule's polynomials to numbers (floats or a float64 tensor): what NS does to each
    normalised singular value, step by step (returns the list after each step)."""
    out, x = [], s
    for a, b, c in schedule:
        x = a * x + b * x**3 + c * x**5
        out.append(x)
    return out
