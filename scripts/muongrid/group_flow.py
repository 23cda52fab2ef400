"""The "group" layout's part of the owner flow: a large matrix orthogonalised by a group of ranks together.

A matrix in ``plan.groups`` (above the fair share of Newton-Schulz FLOPs) has ``k`` members; in the owner flow's
all-to-all (``owner_flow.py``) member i gets the elements of every rank's pieces in block i of the matrix's long
side (``group_route``: counts and index tensors, from ``group_routes.py``). The members orthogonalise it together
over their subgroup (``group_newton_schulz``, phase "ns_group_gram", in the form ``ns_group.group_form`` picks
from the shape) and send every element back. It is never batched, and equals one device's result within the
tolerance ``tests/test_group_layout.py`` states (another order of fp32 additions; chapter 8).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .comm import Phase, subgroup_name
from .group_routes import band_indices, block_positions, count_in_band, local_band, long_bounds
from .newton_schulz import NS_FORM
from .ns_gram_group import gram_sharded_flops, zeropower_gram_sharded
from .ns_group import group_form, row_flops, zeropower_rows, zeropower_sharded


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


def group_route(plan, grid, meta) -> GroupRoute:
    """``meta``'s route on this rank (``grid.rank``), its index tensors on the grid's device."""
    members, tp, me = plan.group_of(meta), grid.tp, grid.rank
    dim, bounds = long_bounds(meta.full_shape, len(members))

    def band(r: int, i: int) -> tuple[int, int]:
        return local_band(meta.full_shape, meta.shape, meta.tp_split_dim, r % tp, bounds[i], bounds[i + 1])

    pieces = [plan.piece_slice(meta, r // tp) for r in range(plan.world)]
    counts = [[count_in_band(pieces[r].start, pieces[r].stop, meta.shape, dim, *band(r, i))
               for i in range(len(members))] for r in range(plan.world)]
    src = [band_indices(pieces[me].start, pieces[me].stop, meta.shape, dim, *band(me, i)).to(grid.device)
           for i in range(len(members))]
    pos = {}
    if me in members:
        i = members.index(me)
        pos = {r: block_positions(pieces[r].start, pieces[r].stop, meta.full_shape, meta.shape, meta.tp_split_dim,
                                  r % tp, bounds[i], bounds[i + 1]).to(grid.device) for r in range(plan.world)}
    return GroupRoute(members, dim, bounds, counts, src, pos)


def group_newton_schulz(comm, group: dict, meta, block: torch.Tensor, route: GroupRoute, rank: int) -> torch.Tensor:
    """My block of the grouped matrix, orthogonalised with the other members (their collectives are phase
    "ns_group_gram"); the Newton-Schulz work is counted in ``comm.ledger``."""
    size, i, name, steps = len(route.members), route.members.index(rank), subgroup_name(route.members), group["ns_steps"]
    all_reduce = functools.partial(comm.all_reduce, group=name, phase=Phase.NS_GROUP_GRAM)
    gather = functools.partial(comm.all_gather, group=name, phase=Phase.NS_GROUP_GRAM)
    if group.get("ns_form", NS_FORM) == "gram":   # R = X X^T all-reduced once, the m x m iteration on every member
        out = zeropower_gram_sharded(block, all_reduce, route.dim, steps, group["ns_coefficients"], group["eps"])
        comm.ledger.count_ns(gram_sharded_flops(*meta.full_shape, block.shape[route.dim], steps))
    elif group_form(*meta.full_shape, size, steps) == "rows":
        out = zeropower_rows(block, gather, route.dim, meta.full_shape[route.dim], (i, size), steps,
                             group["ns_coefficients"], group["eps"])
        comm.ledger.count_ns(row_flops(*meta.full_shape, (i, size), steps))
    else:
        out = zeropower_sharded(block, all_reduce, route.dim, steps, group["ns_coefficients"], group["eps"],
                                split_b=(i, size), all_gather=gather)
        m = min(meta.full_shape)
        b_rows = len(torch.tensor_split(torch.arange(m), size)[i])
        comm.ledger.count_ns(steps * (4 * m * m * block.shape[route.dim] + 2 * m * m * b_rows))
    return out
