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
  result would. Every other matrix has one owner, as under "owner". Given a hardware profile
  (``hardware.py``; ``DistributedMuon(..., hw=)``, ``build_plan(..., hw=)``), ``assign_timed`` decides by
  time instead: owner or group, its size and its ranks, counting the group's collectives on the link it
  spans.

At scale (70,000 matrices, 1,024 ranks) the plan is built without any per-rank loop per matrix: even
cuts are computed when asked (``EvenCuts``), what each rank holds of a matrix is a few runs
(``HeldRuns``), and the least-loaded ranks are filed by load (``_Loads``), so an owner is chosen among them
only.

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

import bisect
import heapq
from collections.abc import Sequence
from typing import NamedTuple

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
    if numel == 0:
        return (0,) * (dp + 1)
    shard = -(-numel // dp)
    starts = tuple(range(0, numel, shard))   # min(r * shard, numel) for every r, in C: 1,024 ranks x 70,000 buckets
    return starts + (numel,) * (dp + 1 - len(starts))


class EvenCuts(Sequence):
    """``even_cuts(numel, dp)`` as a sequence that computes each offset when asked instead of storing
    ``dp + 1`` of them: a plan of 70,000 buckets on 1,024 DP ranks would otherwise hold 70 million.
    Equal to (and hashes as) the tuple.

        >>> EvenCuts(10, 3) == (0, 4, 8, 10)
        True
    """

    __slots__ = ("numel", "dp", "shard")

    def __init__(self, numel: int, dp: int):
        self.numel, self.dp, self.shard = numel, dp, -(-numel // dp)

    def __len__(self) -> int:
        return self.dp + 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self)[i]
        if i < 0:
            i += self.dp + 1
        if not 0 <= i <= self.dp:
            raise IndexError(f"cut {i} of {self.dp + 1}")
        return min(i * self.shard, self.numel)

    def __iter__(self):
        return iter(even_cuts(self.numel, self.dp))

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


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


class HeldRuns:
    """What each of ``world`` ranks holds of one matrix, as runs ``(first, end, elements)`` of equal non-zero
    counts, in order, over blocks of ``tp`` consecutive ranks (a DP rank's TP ranks, each holding what the DP
    rank holds; ``tp=1``: over ranks); every other rank holds nothing. At scale a matrix in a bucket of its own
    is spread over every DP rank in equal shards, one run, and one in a shared bucket over a few. Indexes like
    the full tuple (``held[r]``). The runs are kept as given (``plan.piece_runs`` makes them so), as a plan at
    scale makes 70,000 of these per assignment."""

    __slots__ = ("world", "runs", "tp", "_starts")

    def __init__(self, world: int, runs: list[tuple[int, int, int]], tp: int = 1):
        self.world, self.runs, self.tp = world, runs, tp
        self._starts = None   # made when first indexed: the owner rule reads only the runs

    @classmethod
    def of(cls, held) -> "HeldRuns":
        """From a full tuple of counts per rank (or another ``HeldRuns``)."""
        if isinstance(held, HeldRuns):
            return held
        runs = []
        for r, n in enumerate(held):
            if runs and runs[-1][1] == r and runs[-1][2] == n:
                runs[-1][1] += 1
            else:
                runs.append([r, r + 1, n])
        return cls(len(held), [tuple(x) for x in runs if x[2]])

    def __getitem__(self, rank: int) -> int:
        if self._starts is None:
            self._starts = [lo for lo, _, _ in self.runs]
        block = rank // self.tp
        i = bisect.bisect_right(self._starts, block) - 1
        return self.runs[i][2] if i >= 0 and block < self.runs[i][1] else 0

    def __len__(self) -> int:
        return self.world

    def __iter__(self):
        return (self[r] for r in range(self.world))

    def __eq__(self, other) -> bool:
        return tuple(self) == tuple(other)


class Matrix(NamedTuple):
    """One Muon matrix as owner assignment sees it (a named tuple: a plan at scale makes 70,000 of them per
    assignment, and a named tuple is made in under half the time of a frozen dataclass)."""

    key: tuple[int, int]          # (group_idx, param_idx)
    flops: int                    # Newton-Schulz FLOPs of the whole matrix
    held: tuple[int, ...]         # elements of it each world rank holds (a tuple, or ``HeldRuns``)
    candidates: tuple[int, ...]   # world ranks allowed to own it (all ``world`` of them: any rank)
    groupable: bool = True        # False for a 3-D bank of matrices (a MoE layer's experts): one owner always


class _Loads:
    """Work per rank, with the ranks filed by their load: ``least()`` gives the least load and, in order, every
    rank that has it. The owner rule only ever compares those ranks (``_pick_owner``), so a choice among 1,024
    ranks is a heap lookup and a bisection per run of held pieces, not a search. Loads only grow, and a model
    repeats a few FLOP counts many times (Kimi K2's 69,000 expert matrices share one), so ranks pile up on few
    loads. ``load`` is the plain list (read it, change it only through ``add``)."""

    def __init__(self, world: int):
        self.load = [0] * world
        self._ranks = {0: list(range(world))}   # load -> the ranks with exactly that load, ascending
        self._heap = [0]                         # the loads of ``_ranks``, and some no longer there (skipped)

    def add(self, rank: int, amount) -> None:
        old = self.load[rank]
        new = self.load[rank] = old + amount
        if new == old:
            return
        ranks = self._ranks[old]
        if len(ranks) == 1:
            del self._ranks[old]
        else:
            del ranks[bisect.bisect_left(ranks, rank)]
        ranks = self._ranks.get(new)
        if ranks is None:
            self._ranks[new] = [rank]
            heapq.heappush(self._heap, new)
        else:
            bisect.insort(ranks, rank)

    def least(self) -> tuple:
        """(the least load, the ranks that have it in ascending order: do not change the list)."""
        heap = self._heap
        while heap[0] not in self._ranks:   # a load every rank has left
            heapq.heappop(heap)
        return heap[0], self._ranks[heap[0]]


def _pick_owner(m: Matrix, world: int, loads: _Loads) -> int:
    """``min(m.candidates, key=(load, -held, rank))``, the owner rule. With every rank a candidate, the owner has
    the least load, so only ``loads.least()``'s ranks compete: per run of equal ``held`` (``HeldRuns``) its
    lowest-numbered such rank, else (holding nothing) the lowest-numbered of all."""
    if len(m.candidates) < world:
        load = loads.load
        return min(m.candidates, key=lambda r: (load[r], -m.held[r], r))
    _, ranks = loads.least()
    held = HeldRuns.of(m.held)
    owner, most = ranks[0], 0   # holding nothing; a run that holds some wins if one of its ranks is least loaded
    for lo, hi, n in held.runs:   # in order: on equal pieces the earlier run has the lower rank
        if n > most:
            i = bisect.bisect_left(ranks, lo * held.tp)
            if i < len(ranks) and ranks[i] < hi * held.tp:
                owner, most = ranks[i], n
    return owner


def assign_owners(matrices: list[Matrix], world: int) -> dict[tuple[int, int], int]:
    """One owner per matrix, balancing Newton-Schulz FLOPs over ``world`` ranks (deterministic)."""
    loads = _Loads(world)
    owners = {}
    for m in sorted(matrices, key=lambda m: -m.flops):  # stable: equal FLOPs keep plan order
        rank = _pick_owner(m, world, loads)
        owners[m.key] = rank
        loads.add(rank, m.flops)
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
                             split_b: bool = False, tp: int | None = None, hw: dict | None = None):
    """Owners as ``assign_owners``, except that a matrix whose Newton-Schulz FLOPs exceed the fair share
    (total / world) gets a *group* of ``ceil(flops / fair)`` ranks (at most ``world``, at most its long
    side), the smallest group that brings each member's share of the long side near the fair share;
    each member is charged ``group_ns_flops``. Deterministic, so the same on every rank. ``shapes[key]``
    is the matrix's (rows, cols). Returns (owners, groups, load): owners for the others, ``groups[key]``
    the sorted member ranks, ``load`` the FLOPs per rank.

    Which ranks: with ``tp`` given (the "group" layout, ``plan.build_plan``), ``group_window``'s contiguous,
    TP-local ranks; without it (``scripts/plan_at_scale.py``'s original rule) the least-loaded ranks at that
    point, wherever they are.

    With a hardware profile ``hw`` (``lab/timemodel``'s keys ``flops``, ``efficiency``, ``ranks_per_node``,
    ``intra``, ``inter``: fixed numbers, so every rank still builds the same plan) the choice counts time, not
    FLOPs: ``assign_timed``."""
    if hw is not None:
        return assign_timed(matrices, world, shapes, hw, steps, split_b)
    fair = sum(m.flops for m in matrices) / world
    loads = _Loads(world)
    load = loads.load
    owners, groups = {}, {}
    for m in sorted(matrices, key=lambda m: -m.flops):
        size = min(world, max(shapes[m.key]), -(-m.flops // max(1, int(fair))))
        if m.flops > fair and size > 1 and m.groupable:
            if tp is None:
                members = tuple(sorted(heapq.nsmallest(size, range(world), key=lambda r: (load[r], r))))
            else:
                members = group_window(load, size, tp)
            for r in members:
                loads.add(r, group_ns_flops(*shapes[m.key], size, steps, split_b))
            groups[m.key] = members
            continue
        rank = _pick_owner(m, world, loads)
        owners[m.key] = rank
        loads.add(rank, m.flops)
    return owners, groups, load


def group_seconds(rows: int, cols: int, size: int, steps: int, link: tuple[float, float]) -> float:
    """Alpha-beta seconds of one member's collectives to orthogonalise a ``rows x cols`` matrix in a group of
    ``size`` over ``link`` (alpha s per hop, beta bytes/s), in the sharing ``ns_group.group_form`` picks:
    Gram all-reduces (the norm and ``steps`` partial Grams, 2 (size - 1) hops each, and ``steps``
    all-gathers of B's rows, size - 1 hops) or the row form (``1 + 2 steps`` all-gathers); and the bytes a
    member sends, ``ns_group.group_ring_bytes`` (which ``costmodel.group_bytes`` prices too)."""
    from .ns_group import group_form, group_ring_bytes

    alpha, beta = link
    form = group_form(rows, cols, size, steps)
    hops = 1 + 2 * steps if form == "rows" else 2 * (1 + steps) + steps
    return (size - 1) * hops * alpha + group_ring_bytes(form, rows, cols, size, steps) / beta


def _group_sizes(most: int, node: int) -> list[int]:
    """Group sizes worth trying, up to ``most``: every size inside a node, then whole nodes, then ``most``."""
    sizes = set(range(2, min(most, node) + 1)) | set(range(2 * node, most + 1, node)) | {most}
    return sorted(k for k in sizes if k > 1)


def assign_timed(matrices: list[Matrix], world: int, shapes: dict, hw: dict, steps: int = 5, split_b: bool = True):
    """Owners and groups chosen by time on the profile ``hw``: the matrices in order of decreasing FLOPs; each
    goes where it *finishes* first (earliest-finish-time, the LPT rule in seconds). One owner (chosen as in
    ``assign_owners``, on seconds of work so far) finishes at its work so far + FLOPs / (flops x efficiency);
    a matrix above the fair share may instead get a group of ``k`` ranks (``_group_sizes`` up to
    ceil(FLOPs / fair)), which finishes at its busiest member's work so far + the member's FLOPs at that rate
    + ``group_seconds`` on the link the group spans: ``intra`` when every member is on one node of
    ``ranks_per_node`` consecutive ranks (TP-fastest: a TP group is a node), else ``inter``. So a group whose
    talk costs more than the Newton-Schulz it saves is not chosen, and a group that fits in a node takes
    that node's ``k`` least-busy ranks (not necessarily contiguous; the node whose k-th least busy rank is
    least busy, then least total, then the lowest), while a larger one takes the ``k`` least-busy ranks
    anywhere. Ties go to the smaller group. With ``parallel_ranks`` P (ranks sharing a node's cores), a group
    of k > P members computes in k / P turns, so it is no faster than P members. The shard's trip to the
    members and back is left out: it moves the same elements as the trip to one owner. Returns (owners,
    groups, FLOPs per rank)."""
    rate = hw["flops"] * hw["efficiency"]
    node = hw.get("ranks_per_node") or world
    turns = lambda k: max(1.0, k / (hw.get("parallel_ranks") or k))   # noqa: E731  (members taking turns)
    fair = sum(m.flops for m in matrices) / world
    busy = _Loads(world)
    flops = [0] * world
    owners, groups = {}, {}
    for m in sorted(matrices, key=lambda m: -m.flops):
        rows, cols = shapes[m.key][-2:]
        owner = _pick_owner(m, world, busy)
        best = (busy.load[owner] + m.flops / rate, (owner,), m.flops / rate)
        most = min(world, max(rows, cols), -(-m.flops // max(1, int(fair)))) if m.flops > fair and m.groupable else 1
        if most > 1:
            load = busy.load
            key = lambda r: (load[r], r)   # noqa: E731
            anywhere = sorted(range(world), key=key)
            nodes = [sorted(range(s, min(s + node, world)), key=key) for s in range(0, world, node)]
            for k in _group_sizes(most, node):
                if k <= node:
                    fits = [ranks for ranks in nodes if len(ranks) >= k]
                    if not fits:
                        continue
                    ranks = min(fits, key=lambda rs: (load[rs[k - 1]], sum(load[r] for r in rs[:k]), rs[0]))[:k]
                else:
                    ranks = anywhere[:k]
                members = tuple(sorted(ranks))
                link = hw["intra"] if members[0] // node == members[-1] // node else hw["inter"]
                cost = (group_ns_flops(rows, cols, k, steps, split_b) / rate * turns(k)
                        + group_seconds(rows, cols, k, steps, link))
                finish = max(load[r] for r in members) + cost
                if finish < best[0]:
                    best = (finish, members, cost)
        _, members, cost = best
        if len(members) == 1:
            owners[m.key] = members[0]
            flops[members[0]] += m.flops
        else:
            groups[m.key] = members
            for r in members:
                flops[r] += group_ns_flops(rows, cols, len(members), steps, split_b)
        for r in members:
            busy.add(r, cost)
    return owners, groups, flops
