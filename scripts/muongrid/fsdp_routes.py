"""Where each piece of an FSDP2 matrix goes for Newton-Schulz, and back: pure geometry, no tensors.

FSDP2 (``fully_shard``) gives every rank one rectangle of every parameter: a block of rows over "dp"
(uneven: the last ranks hold fewer rows, maybe none), and with tensor parallelism underneath a block
of that TP shard's rows or columns. DTensor says where the rectangle sits
(``compute_local_shape_and_global_offset``); ``Piece`` is that, for one rank. A parameter replicated
over TP (an embedding, a norm) has the same rectangle on every TP rank of a DP rank.

``routes`` takes every rank's pieces of every Muon matrix and decides, the same way on every rank:

* the **owner** of each matrix, balancing Newton-Schulz FLOPs over all ranks with the engine's rule
  (``layouts.assign_owners``: largest matrices first, each to the least-loaded rank, ties to the rank
  holding most of it);
* the **sender** of each distinct rectangle: one rank per rectangle, so a TP-replicated piece travels
  once (from the TP rank in the owner's TP column when it holds one, else the lowest);
* every rank gets its own rectangle back, whoever sent it.

Message order, which both ends compute alike: a rank's message to rank ``q`` holds its pieces of the
matrices ``q`` owns, in matrix order; the owner's message back to ``q`` holds ``q``'s rectangles of the
owner's matrices, in matrix order.

    >>> p = [[Piece((0, 0), (2, 4))], [Piece((2, 0), (1, 4))]]      # a 3 x 4 matrix on 2 ranks
    >>> r = routes([(3, 4)], p, tp=1)
    >>> r.owners, r.send_counts(0), r.recv_counts(0)
    ([0], [8, 0], [8, 4])
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .layouts import Matrix, assign_owners
from .newton_schulz import ns5_flops


@dataclass(frozen=True)
class Piece:
    """One rank's rectangle of a parameter: global offsets and local shape (row-major, contiguous)."""

    offset: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def slices(self) -> tuple[slice, ...]:
        return tuple(slice(o, o + s) for o, s in zip(self.offset, self.shape))


@dataclass(frozen=True)
class Routes:
    """For matrices ``0..M-1`` and ranks ``0..W-1``: pieces[r][m], owners[m], senders[m] (ranks)."""

    shapes: list[tuple[int, int]]
    pieces: list[list[Piece]]
    owners: list[int]
    senders: list[frozenset[int]]

    @property
    def world(self) -> int:
        return len(self.pieces)

    def outgoing(self, rank: int) -> list[list[int]]:
        """Per destination rank, the matrices whose piece ``rank`` sends there (in matrix order)."""
        out = [[] for _ in range(self.world)]
        for m, owner in enumerate(self.owners):
            if rank in self.senders[m] and self.pieces[rank][m].numel:
                out[owner].append(m)
        return out

    def incoming(self, owner: int) -> list[list[int]]:
        """Per source rank, the matrices of ``owner`` whose piece that rank sends (in matrix order)."""
        return [self.outgoing(r)[owner] for r in range(self.world)]

    def owned(self, rank: int) -> list[int]:
        return [m for m, o in enumerate(self.owners) if o == rank]

    def send_counts(self, rank: int) -> list[int]:
        return [sum(self.pieces[rank][m].numel for m in ms) for ms in self.outgoing(rank)]

    def recv_counts(self, rank: int) -> list[int]:
        return [sum(self.pieces[r][m].numel for m in ms) for r, ms in enumerate(self.incoming(rank))]

    def back_counts(self, owner: int) -> list[int]:
        """What ``owner`` sends back to each rank: that rank's rectangles of the owner's matrices."""
        return [sum(self.pieces[q][m].numel for m in self.owned(owner)) for q in range(self.world)]

    def back_recv_counts(self, rank: int) -> list[int]:
        return [sum(self.pieces[rank][m].numel for m in self.owned(o)) for o in range(self.world)]


def routes(shapes: list[tuple[int, int]], pieces: list[list[Piece]], tp: int, ns_steps: int = 5) -> Routes:
    """Owners and senders for matrices of full ``shapes``; ``pieces[r][m]`` is rank ``r``'s rectangle of
    matrix ``m`` (world ranks, TP fastest: rank = dp_rank * tp + tp_rank)."""
    world = len(pieces)
    mats = [Matrix((0, m), ns5_flops(*shape, ns_steps), tuple(pieces[r][m].numel for r in range(world)),
                   tuple(range(world))) for m, shape in enumerate(shapes)]
    owner_of = assign_owners(mats, world)
    owners = [owner_of[(0, m)] for m in range(len(shapes))]
    senders = []
    for m, owner in enumerate(owners):
        chosen: dict[Piece, int] = {}
        for r in sorted(range(world), key=lambda r: (r % tp != owner % tp, r)):
            piece = pieces[r][m]
            if piece.numel and piece not in chosen:
                chosen[piece] = r
        covered = sum(p.numel for p in chosen)
        if covered != math.prod(shapes[m]):
            raise ValueError(f"matrix {m} of shape {shapes[m]}: the ranks' pieces cover {covered} elements, not "
                             f"{math.prod(shapes[m])} (they overlap or leave a gap; is every rank on the same mesh?)")
        senders.append(frozenset(chosen.values()))
    return Routes(list(shapes), pieces, owners, senders)
