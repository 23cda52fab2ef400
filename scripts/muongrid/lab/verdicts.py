"""Timing verdicts that a busy machine cannot turn around: a winner only outside the noise, "tie" otherwise.

Two runs of one benchmark on a shared 2-core machine can differ by 10-20% (another process takes a
core for a moment), so "A is faster than B" from one median each can flip between two builds of the
book. Here a verdict needs repeated measurements of both, and A wins only if its median is below B's
by more than ``NOISE_BAND`` *and* A's slowest repeat beats B's fastest; otherwise the two tie. The
book prints the spread (min / median / max) beside every such verdict.

    from muongrid.lab.verdicts import fastest, spread_text
    winners = fastest({"4x1": [0.31, 0.30, 0.33], "2x2": [0.29, 0.35, 0.30]})   # ['2x2', '4x1']: a tie
"""
from __future__ import annotations

import statistics

NOISE_BAND = 0.10  # relative: medians closer than this never decide (run-to-run spread measured here)


def spread(samples: list[float]) -> tuple[float, float, float]:
    """(min, median, max) of repeated measurements."""
    if not samples:
        raise ValueError("a verdict needs at least one measurement of each contender")
    return min(samples), statistics.median(samples), max(samples)


def beats(a: list[float], b: list[float], band: float = NOISE_BAND) -> bool:
    """Whether times ``a`` are clearly below times ``b``: median below by more than ``band`` and no overlap."""
    a_min, a_med, a_max = spread(a)
    b_min, b_med, b_max = spread(b)
    return a_med * (1 + band) < b_med and a_max < b_min


def fastest(named: dict[str, list[float]], band: float = NOISE_BAND) -> list[str]:
    """The contenders tied for fastest: the one with the lowest median, and every one it does not beat
    (a single name means a clear winner), in order of median."""
    order = sorted(named, key=lambda k: spread(named[k])[1])
    best = order[0]
    return [best] + [k for k in order[1:] if not beats(named[best], named[k], band)]


def spread_text(samples: list[float], scale: float = 1e3, unit: str = "ms") -> str:
    """``"312 ms (305-330)"``: median, then min-max, of ``samples`` times ``scale``."""
    lo, med, hi = (x * scale for x in spread(samples))
    return f"{med:.0f} {unit} ({lo:.0f}-{hi:.0f})"


def ratio_text(samples: list[float]) -> str:
    """``"1.17 (0.97-1.18)"``: median, then min-max, of repeated ratios (no unit)."""
    lo, med, hi = spread(samples)
    return f"{med:.2f} ({lo:.2f}-{hi:.2f})"


def fastest_text(named: dict[str, list[float]], band: float = NOISE_BAND) -> str:
    """``"2x2 fastest"`` or ``"tie between 2x2 and 4x1 (within the noise)"``."""
    winners = fastest(named, band)
    if len(winners) == 1:
        return f"{winners[0]} fastest"
    return f"tie between {', '.join(winners[:-1])} and {winners[-1]} (within the noise)"


def versus_claim(named: dict[str, list[float]], claimed: str, band: float = NOISE_BAND) -> str:
    """What repeated timings say of a claim that ``claimed`` is the fastest, in words they support: a tie
    is not agreement (two medians 77 and 91 ms whose repeats overlap settle nothing)."""
    winners = fastest(named, band)
    if winners == [claimed]:
        return f"Agrees: {claimed} is fastest, outside the noise."
    if claimed not in winners:
        return f"Differs here: {winners[0]} beats {claimed} outside the noise."
    others = " and ".join(k for k in winners if k != claimed)
    if winners[0] == claimed:
        return (f"Not settled: {claimed} has the lowest median, but its repeats overlap those of "
                f"{others}, so these runs do not tell them apart.")
    return (f"Not settled: {winners[0]} has the lowest median and {claimed} is within the noise of "
            "it, so these runs do not tell them apart.")


def ratio_range(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """A ratio of two repeated timings as (lowest, of medians, highest): min(a)/max(b), median(a)/median(b),
    max(a)/min(b). Two runs of one benchmark can give ratios anywhere in such a range."""
    a_min, a_med, a_max = spread(a)
    b_min, b_med, b_max = spread(b)
    return a_min / b_max, a_med / b_med, a_max / b_min

