"""One matrix orthogonalised by a group of ranks: the Gram form (Gram matrix all-reduced) or the row form.

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

The row form (``zeropower_rows``) is the other way to share one matrix, cheaper in bytes when the matrix
is near square (the Gram form's m x m all-reduce is then as large as the matrix, every iteration). The
members all-gather their long-side blocks (in ``dtype``) into the whole X and normalise it as one process
does; then member i owns block i of the *short* side's rows, X_i (m_i x n), and per iteration::

    A_i = X_i X^T                          my rows of the Gram matrix; all-gather A (m x m, in dtype)
    B_i = b A_i + c A_i A                  my rows of B
    X_i <- a X_i + B_i X                   my rows of the new X; all-gather X (m x n, in dtype)

and at the end keeps block i of the long side, so the routing in and out is the Gram form's. No sum
crosses ranks: every element is computed by the same GEMM as in one process, only over fewer rows, so it
equals ``zeropower_ns5`` bit for bit wherever a GEMM's output row does not depend on how many rows the
call has. Measured on the AVX2 machine this was built on (MKL fp32 sgemm, bf16 emulated): true for
every row block of at least 4 rows with one MKL thread, and of 4, 8 or at least 12 rows with two (MKL
runs 1-3 rows on another path, and with two threads splits 5-7 and 9-11 rows another way); a Python
thread other than the main one runs MKL with its default thread count. Nothing guarantees it elsewhere:
a GEMM that picks its kernel or splits its inner sum by shape (oneDNN's bf16 kernels on AVX-512,
cuBLAS split-K on a GPU) reorders fp32 sums as the Gram form does, so the Gram form's tolerance is the
one that holds on any machine (``tests/test_ns_group.py``).
Per rank and run ``1 + 2 steps`` all-gathers, ``(k - 1) * e * (ceil(n/k) m + steps (ceil(m/k) m + ceil(m/k) n))``
ring bytes (``e`` the element size), against the Gram form's ``~(k - 1)/k * steps * 10 m^2``: so, for
5 steps, the row form wins for n below about 3.3 m (``group_form`` decides by the exact ring bytes). It
holds the whole X on every member (m n elements), the Gram form only its block.

``zeropower_sharded`` is pure given its ``all_reduce`` callable: over a process group pass
``lambda t: comm.all_reduce(t, "tp", phase)``; in one process ``simulate`` runs k shards in k threads
with an all-reduce that sums in rank order (``tests/test_ns_group.py``); ``zeropower_rows`` likewise
with its ``all_gather`` (``simulate(..., rows=True)``).
"""
from __future__ import annotations

import threading
from typing import Callable

import torch

from .newton_schulz import NS_COEFFICIENTS, NS_EPS, NS_STEPS, rounder
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
    r = rounder(dtype, shard.device)   # bf16 emulated as in newton_schulz.zeropower_ns5
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


def _gather_rows(all_gather: AllGather, mine: torch.Tensor, counts: list[int], dtype: torch.dtype) -> torch.Tensor:
    """Every member's rows end to end (member j holds ``counts[j]`` rows): one all-gather of blocks padded to
    ``max(counts)`` rows, sent in ``dtype``."""
    padded = torch.zeros(max(counts), mine.size(1), dtype=dtype, device=mine.device)
    padded[:mine.size(0)] = mine
    got = all_gather(padded.reshape(-1)).view(len(counts), max(counts), mine.size(1))
    return torch.cat([got[j, :n] for j, n in enumerate(counts)])


def _split_counts(n: int, size: int) -> list[int]:
    """Block sizes of ``torch.tensor_split`` of n items into ``size`` parts (the first n % size one larger)."""
    return [n // size + (1 if j < n % size else 0) for j in range(size)]


def zeropower_rows(block: torch.Tensor, all_gather: AllGather, long_dim: int, long_size: int, member: tuple[int, int],
                   steps: int = NS_STEPS, coefficients=NS_COEFFICIENTS, eps: float = NS_EPS,
                   dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The row form: this member's block of ``zeropower_ns5(whole matrix)``. ``block`` is block
    ``member[0]`` (of ``member[1]``, ``torch.tensor_split``'s sizes) of the matrix's long side
    (``long_dim``: 0 for a tall matrix's rows, 1 for a wide one's columns), whose full length is
    ``long_size``. Every member calls it together with the same options; ``all_gather`` takes equal flat
    tensors from every member and returns them end to end in member order. Returns ``block``'s shape in ``dtype``.
    """
    if block.ndim != 2 or long_dim not in (0, 1):
        raise ValueError(f"zeropower_rows takes a 2-D block and long_dim 0 or 1, got shape {tuple(block.shape)} "
                         f"and long_dim {long_dim!r}")
    if not (len(member) == 2 and 0 <= member[0] < member[1]):
        raise ValueError(f"member is (index, group size) with 0 <= index < size, got {member!r}")
    i, size = member
    long_counts = _split_counts(long_size, size)
    if block.size(long_dim) != long_counts[i]:
        raise ValueError(f"member {i} of {size} holds {long_counts[i]} of the {long_size} along dim {long_dim} "
                         f"(torch.tensor_split's blocks), got a block of shape {tuple(block.shape)}: pass the "
                         "matrix's full long side as long_size and this member's block of it")
    if block.size(1 - long_dim) > long_size:
        raise ValueError(f"long_dim {long_dim} must be the long side: the block has {block.size(1 - long_dim)} "
                         f"along the other dim, more than long_size {long_size}")
    schedule = ns_schedule(coefficients, steps)
    r = rounder(dtype, block.device)   # bf16 emulated as in newton_schulz.zeropower_ns5
    # the whole matrix, in its own orientation and contiguous, as the owner layout hands zeropower_ns5
    mine = block.to(dtype)
    whole = _gather_rows(all_gather, mine if long_dim == 0 else mine.T, long_counts, dtype)
    G = whole if long_dim == 0 else whole.T.contiguous()
    X = r(G)                                     # from here on zeropower_ns5's steps, on my rows only
    tall = G.size(0) > G.size(1)
    if tall:
        X = X.mT
    X = r(X / r(X.norm()).clamp(min=eps))
    counts = _split_counts(X.size(0), size)
    lo, hi = sum(counts[:i]), sum(counts[:i + 1])
    for a, b, c in schedule:
        A = _gather_rows(all_gather, r(X[lo:hi] @ X.mT), counts, dtype).to(X.dtype)   # my rows of X X^T
        B = r(torch.addmm(A[lo:hi], A[lo:hi], A, beta=b, alpha=c))                     # my rows of bA + cA^2
        X = _gather_rows(all_gather, r(torch.addmm(X[lo:hi], B, X, beta=a)), counts, dtype).to(X.dtype)
    X = X.to(dtype)
    out = X.mT if tall else X
    start = sum(long_counts[:i])
    return out.narrow(long_dim, start, long_counts[i]).contiguous()


def row_collectives(rows: int, cols: int, size: int, steps: int = NS_STEPS, element_size: int = 2) -> tuple[int, int]:
    """(collectives, input bytes) that one member of a group of ``size`` issues for one matrix in the row form:
    ``1 + 2 steps`` all-gathers (the matrix's long-side blocks once; A's and X's short-side row blocks per
    step), each block padded to the largest. A ring all-gather moves ``size - 1`` times its input per rank."""
    m, n = min(rows, cols), max(rows, cols)
    pm, pn = -(-m // size), -(-n // size)
    return 1 + 2 * steps, element_size * (pn * m + steps * (pm * m + pm * n))


def group_ring_bytes(form: str, rows: int, cols: int, size: int, steps: int = NS_STEPS) -> int:
    """Ring bytes one member sends to orthogonalise one matrix in ``form`` ("gram": fp32 Gram all-reduces
    and bf16 B all-gathers, as the group layout runs ``zeropower_sharded``; "rows": bf16 all-gathers)."""
    if form == "gram":
        m = min(rows, cols)
        reduced = [1] + [m * m] * steps                  # the norm and the partial Grams, fp32, all-reduced
        return sum(2 * (size - 1) * -(-e // size) * 4 for e in reduced) + steps * (size - 1) * 2 * -(-m // size) * m
    if form == "rows":
        return (size - 1) * row_collectives(rows, cols, size, steps)[1]
    raise ValueError(f"unknown group form {form!r}: use one of {GROUP_FORMS}")


GROUP_FORMS = ("gram", "rows")


def group_form(rows: int, cols: int, size: int, steps: int = NS_STEPS) -> str:
    """The form a group of ``size`` runs one rows x cols matrix in: the one whose member sends fewer ring bytes
    (the Gram form on a tie). Pure and deterministic, so every rank picks the same with no communication."""
    for name, v in (("rows", rows), ("cols", cols), ("size", size)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"group_form needs a positive int {name}, got {v!r}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"group_form needs a non-negative int steps, got {steps!r}")
    gram, row = (group_ring_bytes(f, rows, cols, size, steps) for f in GROUP_FORMS)
    return "rows" if row < gram else "gram"


def row_flops(rows: int, cols: int, member: tuple[int, int], steps: int = NS_STEPS) -> int:
    """Newton-Schulz FLOPs of one member in the row form: its ``m_i`` short-side rows of X X^T, B and B X."""
    m, n = min(rows, cols), max(rows, cols)
    m_i = _split_counts(m, member[1])[member[0]]
    return steps * (4 * m_i * m * n + 2 * m_i * m * m)


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
             rows: bool = False, **options) -> list[torch.Tensor]:
    """Run ``zeropower_sharded`` on k shards in one process: one thread per "rank", and an all-reduce that
    waits for all k inputs and gives each the sum in rank order (fp32 additions, 0 + 1 + ... + k-1);
    ``gather_b`` also passes an all-gather (the k inputs end to end), so B's row blocks are gathered.
    ``rows`` runs the row form (``zeropower_rows``) instead, with that all-gather. Each "rank" runs with
    the caller's intra-op thread count, as a rank process that sets it would (a new Python thread would
    otherwise run MKL with its default count, which can change a GEMM's bits)."""
    k = len(shards)
    barrier = threading.Barrier(k)
    slots: list = [None] * k
    out: list = [None] * k
    errors: list = []

    threads_per_rank = torch.get_num_threads()

    def rank(i: int) -> None:
        torch.set_num_threads(threads_per_rank)

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
            if rows:
                out[i] = zeropower_rows(shards[i], all_gather, long_dim, sum(s.size(long_dim) for s in shards), (i, k),
                                        **options)
            else:
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
