"""The "group" layout's part of the owner flow: a large matrix orthogonalised by a group of ranks together.

A matrix in ``plan.groups`` (above the fair share of Newton-Schulz FLOPs) has ``k`` members; in the owner flow's
all-to-all (``owner_flow.py``) member i gets the elements of every rank's pieces in block i of the matrix's long
side (``group_routes.group_route``: counts and index tensors, made with the owner routes when the optimizer is
built). The members orthogonalise it together
over their subgroup (``group_newton_schulz``, phase "ns_group_gram", in the form ``ns_group.group_form`` picks
from the shape) and send every element back. It is never batched, and equals one device's result within the
tolerance ``tests/test_group_layout.py`` states (another order of fp32 additions; chapter 8).
"""
from __future__ import annotations

import functools

import torch

from .comm import Phase, subgroup_name
from .group_routes import GroupRoute
from .newton_schulz import NS_FORM
from .ns_gram_group import gram_sharded_flops, zeropower_gram_sharded
from .ns_group import group_form, row_flops, zeropower_rows, zeropower_sharded


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
