"""The owner layouts' routes as plan data: who sends which piece of which matrix to whom, per chunk of buckets.

Pure arithmetic on the plan (no process group, no device), beside ``group_routes.py`` and ``fsdp_routes.py``.
``routes(plan, rank, options, muon)`` gives a rank every route its steps will use, built when the optimizer is
built: a Muon group's buckets go in ``exchange_chunks`` chunks (one all-to-all each way per chunk, K of them with
"prefetch"), and a chunk's ``OwnerRoute`` lists, in the order the flow lays them out in its buffers:

* what this rank sends: its piece of each matrix another rank owns (``sends``), or its elements of each block of a
  grouped matrix (``group_sends``), by destination then chunk order, and the counts per rank each way;
* what it owns (``Owned``: where every rank's piece lands in the matrix's bank row, and where each rank's part of
  the result goes back) and, under "group", the blocks it holds (``Member``);
* what comes back to it (``back_recv``, ``group_back``).

``messages(route, rank)`` says the same per matrix: (phase, sender, receiver, matrix, elements), what the
all-to-alls carry. ``OwnerFlow`` (``owner_flow.py``) makes its buffers from the routes and moves bytes; the lab
prices the same exchanges from ``exchange_chunks`` and the plan (``lab/timemodel.py``, ``lab/scale.py``).

    python -m pytest -q tests/test_routes.py tests/test_exchanges.py
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .group_routes import GroupRoute, group_route, sends

PREFETCH_CHUNKS = 4   # exchanges per direction with "prefetch": enough for Newton-Schulz to hide transfers


@dataclass
class Owned:
    """A matrix this rank owns: where each rank's piece sits in its bank row, and where the updates go."""

    j: int                                            # its place among the chunk's matrices
    meta: object
    blocks: int                                       # T: TP blocks in the bank row (1 unless split over TP)
    key: tuple                                        # (T, block rows, block cols, split dim): its TP blocks
    parts: list = field(default_factory=list)         # (block, a, b, recv offset or None for my own piece)
    back: list = field(default_factory=list)          # (rank, block, a, b, send-back offset), other ranks
    mine: tuple | None = None                         # (block, a, b) of my own piece, if I hold one


@dataclass
class Member:
    """A grouped matrix ("group" layout) this rank holds a block of: whose elements land where in the block."""

    j: int
    meta: object
    route: GroupRoute
    parts: list = field(default_factory=list)         # (recv offset or None for my own elements, n, positions)
    back: list = field(default_factory=list)          # (rank, send-back offset, n, positions), other ranks
    mine: tuple | None = None                         # (positions in my block, positions in my piece)


@dataclass
class OwnerRoute:
    """One chunk's traffic on one rank; ``j`` numbers the chunk's matrices, bucket after bucket."""

    metas: list          # the chunk's matrices, bucket after bucket
    sends: list          # (j, send offset, n, None, owner): my pieces of matrices others own, by owner, chunk order
    send_counts: list
    recv_counts: list
    owned: list          # Owned, in chunk order
    back_counts: list
    back_recv: dict      # j -> (offset, numel): my pieces of matrices others own, in what comes back
    back_recv_counts: list
    members: list = field(default_factory=list)       # Member, in chunk order ("group")
    group_sends: list = field(default_factory=list)   # (j, send offset, n, positions in my piece, member) ("group")
    group_back: dict = field(default_factory=dict)    # j -> [(offset, n, positions in my piece)] ("group")
    grouped: dict = field(default_factory=dict)       # j -> GroupRoute of each grouped matrix of the chunk


def exchange_chunks(updates: list, overlap: str, chunks: int | None = None) -> list[tuple[tuple, list]]:
    """(bucket, pieces) pairs joined into at most K chunks of consecutive buckets, each one exchange per
    direction: K = 1 without overlap ("none", "naive"), ``chunks`` (default ``PREFETCH_CHUNKS``) with "prefetch".
    Returns (buckets, their pieces one after another) per chunk; the buckets are split as evenly as their count
    allows (``torch.tensor_split``'s sizes)."""
    k = min(exchanges(overlap, chunks), len(updates))   # no buckets: no exchange
    base, extra = divmod(len(updates), max(k, 1))
    cuts = [i * base + min(i, extra) for i in range(k + 1)]
    parts = [updates[lo: hi] for lo, hi in zip(cuts, cuts[1:])]
    return [(tuple(b for b, _ in part), [p for _, ps in part for p in ps]) for part in parts]


def exchanges(overlap: str, chunks: int | None = None) -> int:
    """K, the exchanges per direction: 1 without "prefetch", else ``chunks`` (default ``PREFETCH_CHUNKS``)."""
    return 1 if overlap != "prefetch" else PREFETCH_CHUNKS if chunks is None else int(chunks)


def group_chunks(plan, g: int, overlap: str, chunks: int | None = None) -> list[tuple]:
    """The chunks (tuples of buckets) group ``g``'s buckets travel in."""
    return [chunk for chunk, _ in exchange_chunks([(b, ()) for b in plan.buckets[g]], overlap, chunks)]


def routes(plan, rank: int, options, muon: list[bool]) -> dict[int, list[tuple[tuple, OwnerRoute]]]:
    """Every route world rank ``rank``'s steps use under ``options`` (``flows.FlowOptions``): per Muon group, its
    chunks in order, each with its route."""
    return {g: [(chunk, route(plan, rank, chunk)) for chunk in group_chunks(plan, g, options.overlap, options.chunks)]
            for g, is_muon in enumerate(muon) if is_muon}


def piece_of(plan, meta, rank: int) -> tuple[int, int, int]:
    """(TP block, start, end) of world rank ``rank``'s piece of ``meta`` in the block's flat elements."""
    tp = plan.tp
    block = rank % tp if meta.tp_split_dim != -1 and tp > 1 else 0
    piece = plan.piece_slice(meta, rank // tp)
    return block, piece.start, piece.stop


def route(plan, me: int, chunk) -> OwnerRoute:
    """World rank ``me``'s route of a chunk (a tuple of consecutive buckets of one group, or one bucket)."""
    chunk = chunk if isinstance(chunk, tuple) else (chunk,)
    world, tp = plan.world, plan.tp
    metas = [plan.metas[bucket.group_idx][i] for bucket in chunk for i in bucket.param_indices]
    grouped = {j: group_route(plan, me, m) for j, m in enumerate(metas) if plan.group_of(m) is not None}
    owner = [None if j in grouped else plan.owner_of(m) for j, m in enumerate(metas)]
    send_counts, recv_counts, back_counts, back_recv_counts = ([0] * world for _ in range(4))
    out = OwnerRoute(metas, [], send_counts, recv_counts, [], back_counts, {}, back_recv_counts, grouped=grouped)
    for q in range(world):   # what I send, by owner (or member) then chunk order, and what comes back
        for j, meta in enumerate(metas):
            g = grouped.get(j)
            if q == me or (q not in g.members if g else owner[j] != q):
                continue
            i = g.members.index(q) if g else None
            n = g.counts[me][i] if g else meta.local_numel
            if n and sends(meta, me, q, tp):
                if g:
                    out.group_sends.append((j, sum(send_counts), n, g.src[i], q))
                else:
                    out.sends.append((j, sum(send_counts), n, None, q))
                send_counts[q] += n
            if n and g:
                out.group_back.setdefault(j, []).append((sum(back_recv_counts), n, g.src[i]))
            elif n:
                out.back_recv[j] = (sum(back_recv_counts), n)
            back_recv_counts[q] += n
    items = []
    for j, meta in enumerate(metas):
        if j in grouped and me in grouped[j].members:
            items.append(Member(j, meta, grouped[j]))
        elif owner[j] == me:
            split = meta.tp_split_dim != -1 and tp > 1
            rows, cols = (meta.shape if split else meta.full_shape)[-2:]   # a bank (3-D) is never split
            items.append(Owned(j, meta, tp if split else 1,
                               (tp if split else 1, rows, cols, meta.tp_split_dim if split else -1)))
    out.owned = [item for item in items if isinstance(item, Owned)]
    out.members = [item for item in items if isinstance(item, Member)]
    offset = back_offset = 0
    for r in range(world):   # what I receive and what I send back, by rank then chunk order
        for item in items:
            at = None if r == me else offset
            if isinstance(item, Member):
                i = item.route.members.index(me)
                n, where = item.route.counts[r][i], item.route.pos[r]
                part, back, mine = (at, n, where), (r, back_offset, n, where), (where, item.route.src[i])
            else:
                block, a, b = piece_of(plan, item.meta, r)
                n, part, back, mine = b - a, (block, a, b, at), (r, block, a, b, back_offset), (block, a, b)
            if n <= 0:
                continue
            if sends(item.meta, r, me, tp):   # r sends me its elements (I am the owner, or a member)
                item.parts.append(part)
                offset += 0 if r == me else n
                recv_counts[r] += 0 if r == me else n
            if r == me:
                item.mine = mine
            else:
                item.back.append(back)
                back_offset += n
                back_counts[r] += n
    return out


def messages(route: OwnerRoute, me: int) -> list[tuple[str, int, int, str, int]]:
    """(phase, sender, receiver, matrix name, elements) of every piece world rank ``me`` sends on ``route``: to
    owners and members ("ns_to_owner"), and back from what it owns or holds a block of ("ns_from_owner")."""
    out = [("ns_to_owner", me, q, route.metas[j].name, n) for j, _, n, _, q in route.sends + route.group_sends]
    for item in route.owned:
        out += [("ns_from_owner", me, r, item.meta.name, b - a) for r, _, a, b, _ in item.back]
    for item in route.members:
        out += [("ns_from_owner", me, r, item.meta.name, n) for r, _, n, _ in item.back]
    return out


def on_device(route: OwnerRoute, device) -> OwnerRoute:
    """``route`` with its index tensors (the grouped matrices' positions) on ``device``, each moved once."""
    import dataclasses

    import torch

    if torch.device(device).type == "cpu":
        return route
    moved: dict = {}

    def to(x):
        if isinstance(x, torch.Tensor):
            if id(x) not in moved:
                moved[id(x)] = x.to(device)
            return moved[id(x)]
        if isinstance(x, (list, tuple)):
            return type(x)(to(v) for v in x)
        if isinstance(x, dict):
            return {k: to(v) for k, v in x.items()}
        if isinstance(x, (OwnerRoute, Owned, Member, GroupRoute)):
            return dataclasses.replace(x, **{f.name: to(getattr(x, f.name)) for f in dataclasses.fields(x)
                                             if f.name not in ("meta", "metas")})
        return x
    return to(route)
