"""One matrix orthogonalised by a group of ranks: Newton-Schulz with the Gram matrix all-reduced.

When one matrix holds most of the Newton-Schulz work, its one owner bounds the step. Here the matrix
stays sharded along its *long* side over k ranks (rank i holds ``X_i``, m x n_i in the wide
orientation, m the short side) and every iteration needs only the small m x m Gram matrix, which is a
sum over the shards::

    ||X||_F^2 = sum_i ||X_i||_F^2          one scalar all-reduce, once
    A = X X^T = sum_i X_i X_i^T            one m x m all-reduce per iteration
    B = b A + c A^2                        on every rank (the same A, so the same B)
    X_i <- a X_i + B X_i                   local: rank i's columns of a X + B X

(NVIDIA's Emerging-Optimizers ``tp_mode="distributed"`` does this over a TP group.) Per rank and run:
``1 + steps`` all-reduces of ``4 + steps * m^2 * 4`` bytes (fp32 partial Grams), and
``steps * (4 m^2 n_i + 2 m^3)`` FLOPs: the m x n work divides by k, the m^3 part does not.

It cannot be bit-exact against one process: there ``X X^T`` is one GEMM whose fp32 sums run over all n
columns in the kernel's order; here each rank sums its n_i columns and the all-reduce adds the k
partial sums, a different order of fp32 additions. The Gram matrix then differs in its last fp32 bits,
which flips an occasional bf16 rounding of A, and five iterations carry that forward. The partial Grams
travel in fp32 (not bf16) so that only the order of additions differs, never an extra rounding.

``zeropower_sharded`` is pure given its ``all_reduce`` callable: over a process group pass
``lambda t: comm.all_reduce(t, "tp", phase)``; in one process ``simulate`` runs k shards in k threads
with an all-reduce that sums in rank order (``tests/test_ns_group.py``).
"""
from __future__ import annotations

import threading
from typing import Callable

import torch

from .newton_schulz import NS_COEFFICIENTS, NS_EPS, NS_STEPS, native_bf16_matmul
from .ns_variants import ns_schedule

AllReduce = Callable[[torch.Tensor], torch.Tensor]   # sums a tensor over the group, returns the sum
AllGather = Callable[[torch.Tensor], torch.Tensor]   # equal flat tensors from every rank, in rank order


def zeropower_sharded(shard: torch.Tensor, all_reduce: AllReduce, long_dim: int, steps: int = NS_STEPS,
                      coefficients=NS_COEFFICIENTS, eps: float = NS_EPS,
                      dtype: torch.dtype = torch.bfloat16, split_b: tuple[int, int] | None = None,
                      all_gather: AllGather | None = None) -> torch.Tensor:
    """This rank's shard of ``zeropower_ns5(whole matrix)``; the matrix is split along ``long_dim``
    (0: rows of a tall matrix, 1: columns of a wide one), its long side. Every rank of the group must
    call it together, with the same options. Returns the shard's shape, in ``dtype``.

    ``split_b=(rank, size)`` also divides the m^3 work of ``B = bA + cA^2``: rank i computes B's i-th
    block of rows and one more all-reduce per step (of B with the other rows zero, exact) assembles B
    everywhere. Per rank ``steps * (4 m^2 n_i + 2 m^3 / size)`` FLOPs and ``1 + 2 steps`` all-reduces.
    Without it every rank computes the whole B, so as the group grows its work per rank tends to
    ``2 m^3`` per step, a third of a square matrix's.

    ``all_gather`` (with ``split_b``): assemble B from the ranks' row blocks with one all-gather (each
    block padded to ``ceil(m / size)`` rows) instead of the all-reduce of B with zeros elsewhere: the same
    B, bit for bit, for half the ring bytes and no additions (``tests/test_group_layout.py`` checks it).
    """
    if shard.ndim != 2 or long_dim not in (0, 1):
        raise ValueError(f"zeropower_sharded takes a 2-D shard and long_dim 0 or 1, got shape {tuple(shard.shape)} "
                         f"and long_dim {long_dim!r}")
    if split_b is not None and not (len(split_b) == 2 and 0 <= split_b[0] < split_b[1]):
        raise ValueError(f"split_b is (rank, group size) with 0 <= rank < size, got {split_b!r}")
    if all_gather is not None and split_b is None:
        raise ValueError("all_gather assembles B's row blocks: it needs split_b=(rank, size)")
    schedule = ns_schedule(coefficients, steps)
    if dtype == torch.bfloat16 and not native_bf16_matmul(shard.device):
        def r(t):  # bf16 emulated as in newton_schulz.zeropower_ns5
            return t.to(dtype).to(torch.float32)
    else:
        def r(t):
            return t
    acc = torch.float64 if dtype == torch.float64 else torch.float32   # partial sums travel in this
    X = r(shard.to(dtype))
    if long_dim == 0:
        X = X.T
    norm = all_reduce(X.to(acc).pow(2).sum().reshape(1)).sqrt()[0]
    X = r(X / r(norm.to(X.dtype)).clamp(min=eps))
    for a, b, c in schedule:
        partial = X.to(acc) @ X.to(acc).T                # my columns' share of X X^T, not rounded
        A = r(all_reduce(partial).to(X.dtype))
        if split_b is None:
            B = r(torch.addmm(A, A, A, beta=b, alpha=c))
        else:
            counts = [len(t) for t in torch.tensor_split(torch.arange(A.size(0)), split_b[1])]
            lo = sum(counts[:split_b[0]])
            hi = lo + counts[split_b[0]]
            rows = r(torch.addmm(A[lo:hi], A[lo:hi], A, beta=b, alpha=c))   # my rows of B
            if all_gather is None:                       # zeros elsewhere add exactly
                mine = torch.zeros_like(A)
                mine[lo:hi] = rows
                B = all_reduce(mine.to(dtype)).to(X.dtype)  # in the iteration's dtype (bf16: half the bytes)
            else:
                per = max(counts)
                padded = torch.zeros(per, A.size(1), dtype=dtype, device=A.device)
                padded[:hi - lo] = rows.to(dtype)
                got = all_gather(padded.reshape(-1)).view(len(counts), per, A.size(1))
                B = torch.cat([got[j, :n] for j, n in enumerate(counts)]).to(X.dtype)
        X = r(torch.addmm(X, B, X, beta=a))
    X = X.to(dtype)
    return X.T if long_dim == 0 else X


def sharded_collectives(rows: int, cols: int, steps: int = NS_STEPS, element_size: int = 4,
                        split_b: bool = False, b_element_size: int = 2, size: int | None = None) -> tuple[int, int]:
    """(collectives, input bytes) that one rank of the group issues for one matrix: ``1 + steps`` all-reduces
    of ``element_size * (1 + steps * m^2)`` bytes in all, plus with ``split_b`` one of B per step (m^2 in the
    iteration's dtype), or, given the group's ``size`` (the ``all_gather`` option), one all-gather per step
    of a ``ceil(m / size) x m`` block. A ring all-reduce moves about twice its input per rank."""
    m = min(rows, cols)
    calls, nbytes = 1 + steps, element_size * (1 + steps * m * m)
    if split_b:
        block = m * m if size is None else -(-m // size) * m
        calls, nbytes = calls + steps, nbytes + steps * block * b_element_size
    return calls, nbytes


def sharded_flops(rows: int, cols: int, size: int, steps: int = NS_STEPS, split_b: bool = False) -> int:
    """Newton-Schulz FLOPs on the busiest rank of a group of ``size`` (its long-side block is the ceiling)."""
    m, n = min(rows, cols), max(rows, cols)
    b_rows = -(-m // size) if split_b else m
    return steps * (4 * m * m * -(-n // size) + 2 * m * m * b_rows)


def split_long_side(matrix: torch.Tensor, k: int) -> tuple[int, list[torch.Tensor]]:
    """(long_dim, k blocks along it): ``torch.tensor_split``'s near-equal blocks, so sizes need not divide."""
    long_dim = 0 if matrix.size(0) > matrix.size(1) else 1
    return long_dim, list(torch.tensor_split(matrix, k, dim=long_dim))


def simulate(shards: list[torch.Tensor], long_dim: int, split_b: bool = False, gather_b: bool = False,
             **options) -> list[torch.Tensor]:
    """Run ``zeropower_sharded`` on k shards in one process: one thread per "rank", and an all-reduce that
    waits for all k inputs and gives each the sum in rank order (fp32 additions, 0 + 1 + ... + k-1);
    ``gather_b`` also passes an all-gather (the k inputs end to end), so B's row blocks are gathered."""
    k = len(shards)
    barrier = threading.Barrier(k)
    slots: list = [None] * k
    out: list = [None] * k
    errors: list = []

    def rank(i: int) -> None:
        def exchange(t: torch.Tensor, combine) -> torch.Tensor:
            slots[i] = t
            barrier.wait()
            result = combine(slots)
            barrier.wait()            # everyone has read the slots before they are reused
            return result

        def all_reduce(t: torch.Tensor) -> torch.Tensor:
            def total(ts):
                acc = ts[0].clone()
                for j in range(1, k):
                    acc += ts[j]
                return acc
            return exchange(t, total)

        def all_gather(t: torch.Tensor) -> torch.Tensor:
            return exchange(t, torch.cat)
        try:
            out[i] = zeropower_sharded(shards[i], all_reduce, long_dim, split_b=(i, k) if split_b else None,
                                       all_gather=all_gather if gather_b else None, **options)
        except BaseException as e:   # noqa: BLE001 (re-raised below, in the caller's thread)
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out
