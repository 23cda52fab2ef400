"""The owner layouts' flow ("owner", "aligned", "group"): each matrix goes, in pieces, to its one owner (under
"group", a large one block by block to its group's members: ``group_flow.py``), is orthogonalised there once, and
comes back in pieces. Who sends what to whom is arithmetic on the plan, done once per chunk of buckets and kept
(``OwnerRoute``); a step only moves data, with one copy each way::

    my pieces --bf16, one copy into the send buffer--> all-to-all --> owners (and members)   "to owner"
    owner: its matrices' pieces --one copy--> a bank per shape, Newton-Schulz on the bank (``ns_batch``) or on
           each matrix of it; member: its block, with the other members
    the results --one copy into the send buffer--> all-to-all --> back                       "from owner"

A rank's own pieces of a matrix it owns never enter a collective; a matrix replicated over TP is sent by one TP
rank, the owner's. Under "aligned" on a DP-only grid every matrix is whole on its owner: nothing is exchanged. Per matrix the arithmetic is the single-device one, bit for bit (chapter 8). The send and
receive buffers, banks and blocks are made on the first step and kept (``lab/stepcost.persistent_bytes``).

    python -m pytest -q tests/test_routes.py tests/test_exchanges.py tests/test_store_buffers.py
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.profiler import record_function

from .comm import Pending, Phase
from .flows import PREFETCH_CHUNKS, Flow, FlowOptions, Pieces  # noqa: F401 (PREFETCH_CHUNKS: the lab, tests)
from .group_flow import GroupRoute, group_newton_schulz, group_route, sends
from .sharding import copy_all

BF16 = torch.bfloat16


@dataclass
class Owned:
    """A matrix this rank owns: where each rank's piece sits in its bank row, and where the updates go."""

    k: int                                            # its index among the chunk's matrices
    meta: object
    blocks: int                                       # T: TP blocks in the bank row (1 unless split over TP)
    key: tuple                                        # (T, block rows, block cols, split dim): its TP blocks
    parts: list = field(default_factory=list)         # (block, a, b, recv offset or None for my own piece)
    back: list = field(default_factory=list)          # (rank, block, a, b, send-back offset), other ranks
    mine: tuple | None = None                         # (block, a, b) of my own piece, if I hold one


@dataclass
class Member:
    """A grouped matrix ("group" layout) this rank holds a block of: whose elements land where in the block."""

    k: int
    meta: object
    route: GroupRoute
    block: torch.Tensor                               # my block of its long side, kept between steps
    parts: list = field(default_factory=list)         # (recv offset or None for my own elements, n, positions)
    back: list = field(default_factory=list)          # (send-back offset, n, positions), other ranks
    mine: tuple | None = None                         # (positions in my block, positions in my piece)


@dataclass
class OwnerRoute:
    """One chunk's traffic on this rank, and the buffers it moves through (kept between steps); ``k`` numbers
    the chunk's matrices, bucket after bucket."""

    metas: list          # the chunk's matrices, bucket after bucket
    sends: list          # (k, send offset): my pieces of owner matrices others own, by owner then chunk order
    send_counts: list
    recv_counts: list
    owned: list          # Owned, in chunk order
    back_counts: list
    back_recv: dict      # k -> (offset, numel): my pieces of matrices others own, in what comes back
    back_recv_counts: list
    members: list = field(default_factory=list)       # Member, in chunk order ("group")
    group_sends: list = field(default_factory=list)   # (k, send offset, n, positions in my piece) ("group")
    group_back: dict = field(default_factory=dict)    # k -> [(offset, n, positions in my piece)] ("group")
    buffers: dict = field(default_factory=dict)       # "send", "recv", "back", "back_recv"; k -> a grouped piece


class OwnerFlow(Flow):
    """One owner per matrix, or one group (see the module docstring)."""

    lazy = False   # every bucket's pieces travel before any comes back

    def __init__(self, plan, grid, comm, muon: list[bool] | None = None):
        super().__init__(plan, grid, comm, muon)
        self._routes: dict[tuple, OwnerRoute] = {}
        self._banks: dict[tuple, dict] = {}   # per set of chunks orthogonalised together: shape -> bank, staging
        self.silent = plan.layout == "aligned" and grid.tp == 1   # whole matrices on their owner: no exchange

    # ---- the arithmetic, once per chunk ----------------------------------------------------------

    def _piece(self, meta, rank: int) -> tuple[int, int, int]:
        """(TP block, start, end) of world rank ``rank``'s piece of ``meta`` in the block's flat elements."""
        tp = self.grid.tp
        block = rank % tp if meta.tp_split_dim != -1 and tp > 1 else 0
        piece = self.plan.piece_slice(meta, rank // tp)
        return block, piece.start, piece.stop

    def route(self, chunk) -> OwnerRoute:
        """The route of a chunk (a tuple of consecutive buckets of one group), or of one bucket alone."""
        chunk = chunk if isinstance(chunk, tuple) else (chunk,)
        key = tuple((bucket.buffer_idx, bucket.bucket_idx) for bucket in chunk)
        if key not in self._routes:
            self._routes[key] = self._build_route(chunk)
        return self._routes[key]

    def _build_route(self, chunk: tuple) -> OwnerRoute:
        me, world, tp, plan = self.grid.rank, self.plan.world, self.grid.tp, self.plan
        metas = [plan.metas[bucket.buffer_idx][i] for bucket in chunk for i in bucket.param_indices]
        grouped = {k: group_route(plan, self.grid, m) for k, m in enumerate(metas) if plan.group_of(m) is not None}
        owner = [None if k in grouped else plan.owner_of(m) for k, m in enumerate(metas)]
        send_counts, recv_counts, back_counts, back_recv_counts = ([0] * world for _ in range(4))
        route = OwnerRoute(metas, [], send_counts, recv_counts, [], back_counts, {}, back_recv_counts)
        for q in range(world):   # what I send, by owner (or member) then chunk order, and what comes back
            for k, meta in enumerate(metas):
                g = grouped.get(k)
                if q == me or (q not in g.members if g else owner[k] != q):
                    continue
                i = g.members.index(q) if g else None
                n = g.counts[me][i] if g else meta.local_numel
                if n and sends(meta, me, q, tp):
                    if g:
                        route.group_sends.append((k, sum(send_counts), n, g.src[i]))
                    else:
                        route.sends.append((k, sum(send_counts)))
                    send_counts[q] += n
                if n and g:
                    route.group_back.setdefault(k, []).append((sum(back_recv_counts), n, g.src[i]))
                elif n:
                    route.back_recv[k] = (sum(back_recv_counts), n)
                back_recv_counts[q] += n
        items = []
        for k, meta in enumerate(metas):
            if k in grouped and me in grouped[k].members:
                g = grouped[k]
                block = torch.empty(g.block_shape(meta, g.members.index(me)), dtype=BF16, device=self.grid.device)
                items.append(Member(k, meta, g, block))
            elif owner[k] == me:
                split = meta.tp_split_dim != -1 and tp > 1
                rows, cols = (meta.shape if split else meta.full_shape)[-2:]   # a bank (3-D) is never split
                items.append(Owned(k, meta, tp if split else 1,
                                   (tp if split else 1, rows, cols, meta.tp_split_dim if split else -1)))
        route.owned = [item for item in items if isinstance(item, Owned)]
        route.members = [item for item in items if isinstance(item, Member)]
        offset = back_offset = 0
        for r in range(world):   # what I receive and what I send back, by rank then chunk order
            for item in items:
                at = None if r == me else offset
                if isinstance(item, Member):
                    i = item.route.members.index(me)
                    n, where = item.route.counts[r][i], item.route.pos[r]
                    part, back, mine = (at, n, where), (back_offset, n, where), (where, item.route.src[i])
                else:
                    block, a, b = self._piece(item.meta, r)
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
        dev = self.grid.device
        for name, counts in (("send", send_counts), ("recv", recv_counts), ("back", back_counts),
                             ("back_recv", back_recv_counts)):
            route.buffers[name] = torch.empty(sum(counts), dtype=BF16, device=dev)
        for k in grouped:
            if metas[k].local_numel:
                route.buffers[k] = torch.empty(metas[k].local_numel, dtype=BF16, device=dev)
        return route

    # ---- the step ------------------------------------------------------------------------------

    def run(self, group: dict, updates, options: FlowOptions) -> Pieces:
        """``updates``: (bucket, pieces) per bucket (flat pieces aligned with ``bucket.param_indices``, None: skipped).
        Yields (meta, my piece of its orthogonalised update). The buckets travel in ``exchange_chunks`` chunks, one
        all-to-all each way per chunk; with "prefetch" every chunk is sent before any is orthogonalised, and each
        chunk's results go back while the next one is orthogonalised."""
        self.options = options
        chunks = exchange_chunks(list(updates), options.overlap, options.chunks)
        if not options.ns_batch and options.overlap != "prefetch":   # "none", "naive": one chunk
            for chunk, pieces in chunks:
                sent = [(chunk, pieces, self._send(chunk, pieces, True))]
                yield from self._pieces_back(self._send_back(sent, self._orthogonalise(group, sent), True))
            return
        wait_now = options.overlap != "prefetch"
        sent = [(chunk, pieces, self._send(chunk, pieces, wait_now)) for chunk, pieces in chunks]
        if options.ns_batch:   # every chunk's matrices in one bank per shape
            yield from self._pieces_back(self._send_back(sent, self._orthogonalise(group, sent), wait_now))
            return
        backs = [self._send_back([s], self._orthogonalise(group, [s]), False) for s in sent]
        for back in backs:
            yield from self._pieces_back(back)

    def _send(self, chunk: tuple, pieces: list, wait_now: bool):
        """Start sending my pieces of other ranks' matrices to their owners (bf16, one copy)."""
        route = self.route(chunk)
        send = route.buffers["send"]
        dsts, srcs, zeros = [], [], []
        parts = [(k, at, route.metas[k].local_numel, None) for k, at in route.sends] + route.group_sends
        for k, at, n, where in parts:
            piece = pieces[k]
            (zeros if piece is None else dsts).append(send[at: at + n])
            if piece is not None:
                srcs.append(piece if where is None else piece[where])
        copy_all(dsts, srcs, zeros)
        self.trace("to_owner", name_of(chunk), send)
        if self.silent:
            return Pending(route.buffers["recv"])
        return self.comm.all_to_all(send, route.send_counts, route.recv_counts, "world", Phase.NS_TO_OWNER,
                                    wait_now=wait_now, out=route.buffers["recv"])

    def _orthogonalise(self, group: dict, sent: list) -> list:
        """My blocks of grouped matrices first, in chunk order on every member (so no member waits at a collective
        while another orthogonalises its own); then every matrix I own: its pieces into the bank of its shape (a
        TP split by columns gathered block by block, then joined), Newton-Schulz, the results kept."""
        done = []
        for chunk, pieces, pending in sent:
            for item in self.route(chunk).members:
                done.append((chunk, item, self._group_ns(group, item, pieces[item.k], pending.wait())))
        banks: dict[tuple, list] = {}   # shape -> (chunk, pieces, pending, Owned) of each matrix I own
        for chunk, pieces, pending in sent:
            for item in self.route(chunk).owned:
                banks.setdefault(tuple(item.meta.full_shape), []).append((chunk, pieces, pending, item))
        kept = self._banks.setdefault(tuple(id(self.route(chunk)) for chunk, _, _ in sent), {})
        dsts, srcs, zeros, joins = [], [], [], []
        for shape, rows in banks.items():
            bank = _kept(kept, shape, (len(rows), *shape), self.grid.device)
            for row, (_, pieces, pending, item) in enumerate(rows):
                blocks, n_rows, cols, split = item.key
                if split == 1:   # blocks of columns: gathered apart, joined below
                    staging = _kept(kept, (shape, row), (blocks, n_rows, cols), self.grid.device)
                    joins.append((bank[row], staging))
                    flat = staging.view(blocks, -1)
                else:            # blocks of rows, or one block: each block is a run of the matrix
                    flat = bank[row].view(blocks, -1)
                received = pending.wait()
                for block, a, b, at in item.parts:
                    dst = flat[block, a:b]
                    if at is None and pieces[item.k] is None:
                        zeros.append(dst)
                    else:
                        dsts.append(dst)
                        srcs.append(pieces[item.k] if at is None else received[at: at + b - a])
        copy_all(dsts, srcs, zeros)
        for whole, staging in joins:
            whole.view(whole.shape[0], staging.shape[0], -1).copy_(staging.permute(1, 0, 2))
        for shape, rows in banks.items():
            matrices = kept[shape]
            if self.options.ns_batch:   # banks of matrices (3-D parameters) join the batch matrix by matrix
                outs = self.newton_schulz(group, matrices.flatten(0, -3), [m[3].meta for m in rows]).unflatten(
                    0, matrices.shape[:-2]).unbind(0)
            else:
                outs = [self.newton_schulz(group, m, [member[3].meta]) for m, member in zip(matrices.unbind(0), rows)]
            for (chunk, _, _, item), matrix, out in zip(rows, matrices.unbind(0), outs):
                self.trace("ns_input", item.meta.name, matrix)
                done.append((chunk, item, self.trace("orthogonalised", item.meta.name, out)))
        return done

    def _group_ns(self, group: dict, item: Member, piece, received: torch.Tensor) -> torch.Tensor:
        """Every rank's elements of a grouped matrix into my block (one copy), and my part of its Newton-Schulz,
        under the profiler range every Newton-Schulz call has (the group's collectives run inside it)."""
        flat, meta = item.block.view(-1), item.meta
        for at, n, where in item.parts:
            if at is not None:
                flat.index_copy_(0, where, received[at: at + n])
            elif piece is None:
                flat.index_fill_(0, where, 0)
            else:
                flat.index_copy_(0, where, piece[item.route.src[item.route.members.index(self.grid.rank)]].to(BF16))
        self.trace("group_ns_input", meta.name, item.block)
        self.done.add((meta.buffer_idx, meta.param_idx))
        with record_function("muon:newton_schulz"):
            out = group_newton_schulz(self.comm, group, meta, item.block, item.route, self.grid.rank)
        return self.trace("group_orthogonalised", meta.name, out)

    def _send_back(self, sent: list, done: list, wait_now: bool) -> list:
        """Cut every result into the pieces each rank keeps (one copy) and start sending them back: one
        all-to-all per chunk of ``sent``, on every rank, whether or not it owns a matrix there."""
        by_chunk: dict = {id(chunk): [] for chunk, _, _ in sent}
        for chunk, item, out in done:
            by_chunk[id(chunk)].append((item, out))
        backs = []
        for chunk, _, _ in sent:
            route = self.route(chunk)
            send = route.buffers["back"]
            dsts, srcs, mine = [], [], {}
            for item, out in by_chunk[id(chunk)]:
                if isinstance(item, Member):
                    flat = out.reshape(-1)
                    for at, n, where in item.back:
                        torch.index_select(flat, 0, where, out=send[at: at + n])
                    if item.mine is not None:
                        mine[item.k] = (flat, *item.mine)
                    continue
                for _, block, a, b, at in item.back:
                    for offset, src in _parts(_block_piece(out, item, block, a, b)):
                        dsts.append(send[at + offset: at + offset + src.numel()].view(src.shape))
                        srcs.append(src)
                if item.mine is not None:
                    mine[item.k] = _block_piece(out, item, *item.mine)
            copy_all(dsts, srcs)
            pending = Pending(route.buffers["back_recv"]) if self.silent else self.comm.all_to_all(
                send, route.back_counts, route.back_recv_counts, "world", Phase.NS_FROM_OWNER, wait_now=wait_now,
                out=route.buffers["back_recv"])
            backs.append((chunk, pending, mine))
        return backs

    def _pieces_back(self, backs: list) -> Pieces:
        for chunk, pending, mine in backs:
            route, received = self.route(chunk), pending.wait()
            for k, meta in enumerate(route.metas):
                if k in route.buffers:   # a grouped matrix: my piece, from every member's block
                    piece = route.buffers[k]
                    for at, n, where in route.group_back.get(k, []):
                        piece.index_copy_(0, where, received[at: at + n])
                    if k in mine:
                        flat, at_block, at_piece = mine[k]
                        piece.index_copy_(0, at_piece, flat[at_block])
                    yield meta, self.trace("from_owner", meta.name, piece)
                elif k in mine:   # maybe rows of a transposed result (see _block_piece): traced whole, if at all
                    piece = mine[k]
                    if self.options.trace is not None:
                        whole = torch.cat([r.reshape(-1) for _, r in piece]) if isinstance(piece, list) else piece
                        self.trace("from_owner", meta.name, whole)
                    yield meta, piece
                elif k in route.back_recv:
                    at, n = route.back_recv[k]
                    yield meta, self.trace("from_owner", meta.name, received[at: at + n])


def exchange_chunks(updates: list, overlap: str, chunks: int | None = None) -> list[tuple[tuple, list]]:
    """(bucket, pieces) pairs joined into at most K chunks of consecutive buckets, each one exchange per
    direction: K = 1 without overlap ("none", "naive"), ``chunks`` (default ``PREFETCH_CHUNKS``) with "prefetch".
    Returns (buckets, their pieces one after another) per chunk; the buckets are split as evenly as their count
    allows (``torch.tensor_split``'s sizes)."""
    k = min(FlowOptions(overlap, chunks).exchanges, len(updates))   # no buckets: no exchange
    base, extra = divmod(len(updates), max(k, 1))
    cuts = [i * base + min(i, extra) for i in range(k + 1)]
    parts = [updates[lo: hi] for lo, hi in zip(cuts, cuts[1:])]
    return [(tuple(b for b, _ in part), [p for _, ps in part for p in ps]) for part in parts]


def name_of(chunk: tuple) -> str:
    """A chunk's name in traces: "bucket 0.3" or "buckets 0.0-0.2"."""
    first, last = (f"{b.buffer_idx}.{b.bucket_idx}" for b in (chunk[0], chunk[-1]))
    return f"bucket {first}" if len(chunk) == 1 else f"buckets {first}-{last}"


def _kept(kept: dict, key, shape: tuple, device) -> torch.Tensor:
    """The bf16 tensor ``kept[key]`` of ``shape``, made the first time it is asked for."""
    if key not in kept or kept[key].shape != torch.Size(shape):
        kept[key] = torch.empty(shape, dtype=BF16, device=device)
    return kept[key]


def _block_piece(out: torch.Tensor, item: Owned, block: int, a: int, b: int):
    """Elements [a, b) (row-major) of TP block ``block`` of the orthogonalised matrix ``out``, as a view: the
    block, its flat elements, or, where the result is a transposed view (a tall matrix) or a block of columns,
    rectangles of rows ``[(offset in the piece, 2-D view)]``, so nothing is copied to cut it (a 3-D bank: flat)."""
    blocks, rows, cols, split = item.key
    if blocks > 1:
        out = out[block * rows: (block + 1) * rows] if split == 0 else out[:, block * cols: (block + 1) * cols]
    if a == 0 and b == out.numel():
        return out
    if out.is_contiguous() or out.dim() != 2:
        return out.reshape(-1)[a:b]
    return _rectangles(out, a, b)


def _rectangles(matrix: torch.Tensor, a: int, b: int) -> list:
    """Row-major elements [a, b) of a 2-D ``matrix`` as (offset, view) rectangles: a partial first row, the
    whole rows, a partial last row."""
    width, out, pos = matrix.shape[1], [], a
    while pos < b:
        row, col = divmod(pos, width)
        if col or b - pos < width:
            k = min(width - col, b - pos)
            out.append((pos - a, matrix[row: row + 1, col: col + k]))
            pos += k
        else:
            n = (b - pos) // width
            out.append((pos - a, matrix[row: row + n]))
            pos += n * width
    return out


def _parts(piece) -> list:
    """A piece as (offset, tensor) parts: itself, or its rectangles."""
    return piece if isinstance(piece, list) else [(0, piece)]
