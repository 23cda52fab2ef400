"""The Gram form of Newton-Schulz (``ns_form="gram"``) for one matrix held by a group of ranks. Pure.

The group layout (``group_flow.py``) gives each of k members a block ``X_i`` of a matrix's long side
(wide orientation: X = [X_1 ... X_k], m x n_i each, m the short side). The Gram form needs the long side
only twice, for the first Gram matrix and for the final product, so over a group it is::

    ||X||_F^2 = sum_i ||X_i||_F^2          one scalar all-reduce
    R = X X^T = sum_i X_i X_i^T            one m x m all-reduce (fp32 partial sums), once
    Q = gram_polynomial(R, schedule)        m x m, on every member (the same R, so the same Q)
    X_i <- Q X_i                            local

Two all-reduces per matrix and step, against ``1 + steps`` (plus B's gathers) for the standard form
(``ns_group.zeropower_sharded``). Every member repeats the m x m iteration, ``(8 s - 6) m^3`` FLOPs for
s >= 2 steps (``ns_variants.ns_flops``); only the ``4 m^2 n`` long-side part divides by k.

Against one process (``newton_schulz.zeropower_ns5(..., form="gram")``) only the order of R's fp32
additions differs (each member sums its n_i columns, the all-reduce adds the k partial sums; the norm is
a sum of squares, as in ``ns_group``), so the result is the same up to an occasional bf16 rounding of
the final product: the group layout's stated tolerance (``tests/test_group_layout.py``).

    out = zeropower_gram_sharded(block, lambda t: comm.all_reduce(t, name, phase), long_dim, 5, "muon", 1e-7)
"""
from __future__ import annotations

import torch

from .newton_schulz import NS_COEFFICIENTS, NS_EPS, NS_STEPS, gram_polynomial, rounder
from .ns_group import AllReduce
from .ns_variants import ns_flops, ns_schedule


def zeropower_gram_sharded(shard: torch.Tensor, all_reduce: AllReduce, long_dim: int, steps: int = NS_STEPS,
                           coefficients=NS_COEFFICIENTS, eps: float = NS_EPS,
                           dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """This member's block of ``zeropower_ns5(whole matrix, form="gram")``; the matrix is split along
    ``long_dim`` (0: rows of a tall matrix, 1: columns of a wide one). Every member calls it together with
    the same options. Returns the block's shape, in ``dtype``."""
    if shard.ndim != 2 or long_dim not in (0, 1):
        raise ValueError(f"zeropower_gram_sharded takes a 2-D shard and long_dim 0 or 1, got shape "
                         f"{tuple(shard.shape)} and long_dim {long_dim!r}")
    schedule = ns_schedule(coefficients, steps)
    r = rounder(dtype, shard.device)   # bf16 emulated as in newton_schulz.zeropower_ns5
    inner = torch.float64 if dtype == torch.float64 else torch.float32   # R's partial sums travel in this
    X = r(shard.to(dtype))
    if long_dim == 0:
        X = X.T
    norm = all_reduce(X.to(inner).pow(2).sum().reshape(1)).sqrt()[0]
    X = r(X / r(norm.to(X.dtype)).clamp(min=eps))
    if schedule:
        X32 = X.to(inner)
        Q = gram_polynomial(all_reduce(X32 @ X32.T), schedule)
        X = r(r(Q.to(X.dtype)) @ X)
    X = X.to(dtype)
    return X.T if long_dim == 0 else X


def gram_sharded_bytes(rows: int, cols: int, size: int) -> int:
    """Bytes one member of a group of ``size`` sends (ring all-reduce: ``2 (size - 1)`` chunks of
    ``ceil(numel / size)``) for one matrix: the norm (one scalar) and R (m x m), both fp32. The standard
    form's are ``lab/costmodel.group_gram_bytes``; the ledger's phase "ns_group_gram" holds either."""
    m = min(rows, cols)
    return 2 * (size - 1) * 4 * (1 + -(-m * m // size))


def gram_sharded_flops(rows: int, cols: int, block: int, steps: int = NS_STEPS) -> int:
    """FLOPs of one member holding ``block`` of the long side: the whole matrix's Gram-form count
    (``ns_variants.ns_flops``) with only this member's share of the first Gram and of Q X (``4 m^2 block``);
    the m x m iteration is every member's."""
    m, n = min(rows, cols), max(rows, cols)
    return ns_flops(rows, cols, steps, "gram") - (4 * m * m * (n - block) if steps else 0)
