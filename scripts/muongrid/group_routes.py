"""Which of a matrix's ZeRO-1 x TP pieces go to which member of its Newton-Schulz group. Pure arithmetic.

Under the "group" layout (``layouts.py``) a matrix is orthogonalised by ``k`` ranks together
(``ns_group.zeropower_sharded``): member i needs block i of the matrix's *long* side (rows of a tall
matrix, columns otherwise, as ``zeropower_ns5`` orients it), with ``torch.tensor_split``'s near-equal
sizes. What each rank holds is a flat piece ``[a, b)`` (its DP part) of its TP-local matrix. So for a
sender and a member the question is: which elements of the piece fall in the member's block, in which
order, and where do they sit in the block?

* Rows (long side 0): block i is a band of rows, contiguous in every row-major piece.
* Columns (long side 1): block i is a band of columns; inside a piece that is one run per row.

Either way the elements travel in the piece's own (row-major) order, and the same indices bring the
orthogonalised block back, so every rank gets exactly its piece again. ``count_in_band`` is the closed
form (used for the all-to-all sizes and by ``lab/costmodel.py``); ``band_indices`` and ``block_positions``
build the index tensors the flow uses (``group_route``, this rank's ``GroupRoute``), and a test checks they agree.

    >>> long_bounds((10, 7), 3)
    (0, (0, 4, 7, 10))
    >>> count_in_band(5, 17, (4, 7), 1, 3, 5)    # elements 5..16 of a 4x7 matrix in columns 3..4
    2
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def long_dim_of(shape: tuple[int, int]) -> int:
    """0 for a tall matrix (rows > cols), else 1: the side ``zeropower_ns5`` sums its Gram matrix over."""
    return 0 if shape[0] > shape[1] else 1


def long_bounds(full_shape: tuple[int, int], size: int) -> tuple[int, tuple[int, ...]]:
    """(long_dim, size + 1 offsets) of ``torch.tensor_split``'s blocks of the long side."""
    dim = long_dim_of(full_shape)
    n = full_shape[dim]
    base, extra = divmod(n, size)
    bounds = [0]
    for i in range(size):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return dim, tuple(bounds)


def local_band(full_shape: tuple[int, int], local_shape: tuple[int, int], tp_split_dim: int, tp_rank: int,
               lo: int, hi: int) -> tuple[int, int]:
    """The long-side range [lo, hi) of the whole matrix in TP rank ``tp_rank``'s local coordinates
    (empty, (0, 0), when its TP shard holds none of it)."""
    dim = long_dim_of(full_shape)
    if tp_split_dim != dim:          # the TP split (if any) cuts the other side: the band is unchanged
        return lo, hi
    start = tp_rank * local_shape[dim]
    a, b = max(lo, start), min(hi, start + local_shape[dim])
    return (a - start, b - start) if a < b else (0, 0)


def count_in_band(a: int, b: int, local_shape: tuple[int, int], dim: int, lo: int, hi: int) -> int:
    """How many of the flat (row-major) elements [a, b) of a ``local_shape`` matrix have their ``dim``
    coordinate in [lo, hi)."""
    if a >= b or lo >= hi:
        return 0
    cols = local_shape[1]
    if dim == 0:
        return max(0, min(b, hi * cols) - max(a, lo * cols))
    width = hi - lo

    def upto(x: int) -> int:      # elements before flat index x whose column is in [lo, hi)
        return (x // cols) * width + min(max(x % cols - lo, 0), width)
    return upto(b) - upto(a)


def band_indices(a: int, b: int, local_shape: tuple[int, int], dim: int, lo: int, hi: int) -> torch.Tensor:
    """Positions in the piece [a, b) (0 = element a) of its elements inside the band, in order."""
    k = torch.arange(a, b)
    coord = k // local_shape[1] if dim == 0 else k % local_shape[1]
    return torch.nonzero((coord >= lo) & (coord < hi)).view(-1)


def block_positions(a: int, b: int, full_shape: tuple[int, int], local_shape: tuple[int, int],
                    tp_split_dim: int, tp_rank: int, lo: int, hi: int) -> torch.Tensor:
    """Where the piece's elements inside the block [lo, hi) (whole-matrix long-side coordinates) sit in
    the block, flat and row-major, in the order of ``band_indices``."""
    dim = long_dim_of(full_shape)
    k = torch.arange(a, b)
    row, col = k // local_shape[1], k % local_shape[1]
    if tp_split_dim == 0:
        row = row + tp_rank * local_shape[0]
    elif tp_split_dim == 1:
        col = col + tp_rank * local_shape[1]
    coord = row if dim == 0 else col
    keep = (coord >= lo) & (coord < hi)
    row, col = row[keep], col[keep]
    if dim == 0:
        return (row - lo) * full_shape[1] + col
    return row * (hi - lo) + (col - lo)


@dataclass
class GroupRoute:
    """One grouped matrix's routing, the same arithmetic on every rank (index tensors only for this rank)."""

    members: tuple[int, ...]
    dim: int                        # the long side
    bounds: tuple[int, ...]         # block i is [bounds[i], bounds[i + 1]) of the long side
    counts: list[list[int]]         # counts[r][i]: elements of rank r's piece in block i
    src: list[torch.Tensor]         # src[i]: positions in my piece of my elements in block i
    pos: dict                       # if I am a member: rank r -> where r's elements sit in my flat block

    def block_shape(self, meta, i: int) -> tuple[int, int]:
        width = self.bounds[i + 1] - self.bounds[i]
        return (width, meta.full_shape[1]) if self.dim == 0 else (meta.full_shape[0], width)


def sends(meta, r: int, q: int, tp: int) -> bool:
    """Whether rank ``r`` sends its piece of ``meta`` to rank ``q``, its owner or a member of its group: a matrix
    replicated over TP is sent by one TP rank only, ``q``'s."""
    return meta.tp_split_dim != -1 or r % tp == q % tp


def group_route(plan, rank: int, meta) -> GroupRoute:
    """``meta``'s route on world rank ``rank``, its index tensors on the CPU (the flow moves them to its device)."""
    members, tp, me = plan.group_of(meta), plan.tp, rank
    dim, bounds = long_bounds(meta.full_shape, len(members))

    def band(r: int, i: int) -> tuple[int, int]:
        return local_band(meta.full_shape, meta.shape, meta.tp_split_dim, r % tp, bounds[i], bounds[i + 1])

    pieces = [plan.piece_slice(meta, r // tp) for r in range(plan.world)]
    counts = [[count_in_band(pieces[r].start, pieces[r].stop, meta.shape, dim, *band(r, i))
               for i in range(len(members))] for r in range(plan.world)]
    src = [band_indices(pieces[me].start, pieces[me].stop, meta.shape, dim, *band(me, i))
           for i in range(len(members))]
    pos = {}
    if me in members:
        i = members.index(me)
        pos = {r: block_positions(pieces[r].start, pieces[r].stop, meta.full_shape, meta.shape, meta.tp_split_dim,
                                  r % tp, bounds[i], bounds[i + 1]) for r in range(plan.world)}
    return GroupRoute(members, dim, bounds, counts, src, pos)
