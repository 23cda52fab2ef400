"""Layouts: where ZeRO-1 cuts a bucket, and which rank orthogonalises each matrix. Pure, no tensors.

A layout is a choice of the plan (``plan.build_plan(..., layout=...)``); the optimizer, the math
and the collectives are the same for all three:

* ``"bucket"``: the paper's and the proof of concept's. Buckets are cut into ``dp`` equal shards,
  anywhere, even through a matrix. Every rank gathers whole buckets over DP (bf16) and every
  matrix over TP, and orthogonalises every matrix: ``dp * tp`` Newton-Schulz runs per matrix.
* ``"owner"``: the same equal shards (so the gradient reduce-scatter and the parameter
  all-gather are exactly AdamW's), but every matrix has one *owner* among all ``dp * tp`` ranks.
  Only the matrix's pieces travel, to the owner and back; Newton-Schulz runs once.
* ``"aligned"``: shards cut on matrix boundaries (Megatron's layer-wise idea), so no matrix is
  split over DP: its owner is one of the TP ranks of the DP rank that holds it, and nothing
  travels over DP for Newton-Schulz. The price: shards of unequal size, padded to the largest,
  which the reduce-scatter and all-gather then move. Its buckets may hold ``dp`` times as many
  elements as the others, so that every shard gets several matrices to balance.
* ``"group"``: the owner layout, except that a matrix whose Newton-Schulz FLOPs exceed its fair
  share (all Muon FLOPs / world) gets a *group* of ranks instead of one owner. Member i receives
  block i of the matrix's long side and the group runs ``ns_group.zeropower_sharded`` together
  (the Gram matrix all-reduced each iteration, ``split_b`` on); each block comes back as an owner's
  result would. Every other matrix has one owner, as under "owner".

Owners are chosen the same way on every rank (nothing random, nothing measured): the matrices
in order of decreasing Newton-Schulz FLOPs, each to the candidate rank with the least work so far
(the "longest processing time first" rule), ties going to the rank that already holds most of
the matrix, then to the lowest rank.

    >>> even_cuts(10, 3)
    (0, 4, 8, 10)
    >>> aligned_cuts([6, 2, 2, 6], 2)
    (0, 8, 16)
"""
from __future__ import annotations

from dataclasses import dataclass

LAYOUTS = ("bucket", "owner", "aligned", "group")


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")


def parse_layouts(text: str) -> list[str]:
    """'bucket,owner' -> ["bucket", "owner"]: distinct known layouts, for command lines."""
    layouts = [x.strip() for x in text.split(",") if x.strip()]
    if not layouts or any(x not in LAYOUTS for x in layouts) or len(set(layouts)) < len(layouts):
        raise ValueError(f"--layout takes distinct layouts from {','.join(LAYOUTS)}, e.g. --layout bucket,owner; "
                         f"got {text!r}")
    return layouts


def even_cuts(numel: int, dp: int) -> tuple[int, ...]:
    """``dp + 1`` offsets cutting ``numel`` elements into ``dp`` shards of ``ceil(numel / dp)``
    (the last ones shorter, or empty: the collectives pad them)."""
    shard = -(-numel // dp)
    return tuple(min(r * shard, numel) for r in range(dp + 1))


def aligned_cuts(sizes: list[int], dp: int) -> tuple[int, ...]:
    """``dp + 1`` offsets that cut only between the parameters of ``sizes`` (laid end to end),
    each as close as possible to an equal share. A parameter larger than a share makes the
    shards uneven, and some may be empty: that is the price of never splitting a matrix."""
    bounds = [0]
    for n in sizes:
        bounds.append(bounds[-1] + n)
    total, cuts = bounds[-1], [0]
    for r in range(1, dp):
        target = total * r / dp
        best = min((b for b in bounds if b >= cuts[-1]), key=lambda b: (abs(b - target), b))
        cuts.append(best)
    cuts.append(total)
    return tuple(cuts)


@dataclass(frozen=True)
class Matrix:
    """One Muon matrix as owner assignment sees it."""

    key: tuple[int, int]          # (buffer_idx, param_idx)
    flops: int                    # Newton-Schulz FLOPs of the whole matrix
    held: tuple[int, ...]         # elements of it each world rank holds
    candidates: tuple[int, ...]   # world ranks allowed to own it


def assign_owners(matrices: list[Matrix], world: int) -> dict[tuple[int, int], int]:
    """One owner per matrix, balancing Newton-Schulz FLOPs over ``world`` ranks (deterministic)."""
    load = [0] * world
    owners = {}
    for m in sorted(matrices, key=lambda m: -m.flops):  # stable: equal FLOPs keep plan order
        rank = min(m.candidates, key=lambda r: (load[r], -m.held[r], r))
        owners[m.key] = rank
        load[rank] += m.flops
    return owners


def group_ns_flops(rows: int, cols: int, size: int, steps: int = 5, split_b: bool = False) -> int:
    """Newton-Schulz FLOPs on the busiest of ``size`` ranks that orthogonalise one matrix together
    (``ns_group.sharded_flops``): the long side divides (ceil); the m^3 of ``B = bA + cA^2`` only with
    ``split_b``."""
    m, n = min(rows, cols), max(rows, cols)
    return steps * (4 * m * m * -(-n // size) + 2 * m * m * (-(-m // size) if split_b else m))


def group_window(load: list[int], size: int, tp: int) -> tuple[int, ...]:
    """``size`` contiguous ranks for a group: inside one TP group when ``size <= tp``, else starting on a
    TP-group boundary; of those windows the one whose busiest rank has the least load (then the least
    total load, then the lowest start). Why contiguous and TP-local: ranks are laid out TP-fastest
    (``grid.py``), so a TP group is one model replica's node on a cluster, with its fast links; the
    group's Gram all-reduces (``steps`` of m x m fp32 per run) are then on NVLink, not across nodes.

        >>> group_window([5, 0, 0, 0, 9, 9, 9, 9], 2, 4)
        (1, 2)
    """
    world = len(load)
    starts = [s for s in range(world - size + 1)
              if (s // tp == (s + size - 1) // tp if size <= tp else s % tp == 0)] or [0]
    best = min(starts, key=lambda s: (max(load[s:s + size]), sum(load[s:s + size]), s))
    return tuple(range(best, best + size))


def assign_owners_and_groups(matrices: list[Matrix], world: int, shapes: dict, steps: int = 5,
                             split_b: bool = False, tp: int | None = None):
    """Owners as ``assign_owners``, except that a matrix whose Newton-Schulz FLOPs exceed the fair share
    (total / world) gets a *group* of ``ceil(flops / fair)`` ranks (at most ``world``, at most its long
    side), the smallest group that brings each member's share of the long side near the fair share;
    each member is charged ``group_ns_flops``. Deterministic, so the same on every rank. ``shapes[key]``
    is the matrix's (rows, cols). Returns (owners, groups, load): owners for the others, ``groups[key]``
    the sorted member ranks, ``load`` the FLOPs per rank.

    Which ranks: with ``tp`` given (the "group" layout, ``plan.build_plan``), ``group_window``'s contiguous,
    TP-local ranks; without it (``scripts/plan_at_scale.py``'s original rule) the least-loaded ranks at that
    point, wherever they are."""
    fair = sum(m.flops for m in matrices) / world
    load = [0] * world
    owners, groups = {}, {}
    for m in sorted(matrices, key=lambda m: -m.flops):
        size = min(world, max(shapes[m.key]), -(-m.flops // max(1, int(fair))))
        if m.flops > fair and size > 1:
            if tp is None:
                members = tuple(sorted(sorted(range(world), key=lambda r: (load[r], r))[:size]))
            else:
                members = group_window(load, size, tp)
            for r in members:
                load[r] += group_ns_flops(*shapes[m.key], size, steps, split_b)
            groups[m.key] = members
            continue
        rank = min(m.candidates, key=lambda r: (load[r], -m.held[r], r))
        owners[m.key] = rank
        load[rank] += m.flops
    return owners, groups, load
