"""The owner layouts' flow ("owner", "aligned", "group"): each matrix goes, in pieces, to its one owner (under
"group", a large one block by block to its group's members: ``group_flow.py``), is orthogonalised there once, and
comes back in pieces. Who sends what to whom is arithmetic on the plan (``owner_routes.py``), done for every
chunk of buckets when the optimizer is built; a step only moves data, with one copy each way::

    my pieces --bf16, one copy into the send buffer--> all-to-all --> owners (and members)   "to owner"
    owner: its matrices' pieces --one copy--> a bank per shape, Newton-Schulz on the bank (``ns_batch``) or on
           each matrix of it; member: its block, with the other members
    the results --one copy into the send buffer--> all-to-all --> back                       "from owner"

A rank's own pieces of a matrix it owns never enter a collective; a matrix replicated over TP is sent by one TP
rank, the owner's. Under "aligned" on a DP-only grid every matrix is whole on its owner: nothing is exchanged.
Per matrix the arithmetic is the single-device one, bit for bit (chapter 8). The send and receive buffers, banks
and blocks are made with the routes, when the optimizer is built, and kept (``kept_tensors``;
``lab/stepcost.persistent_bytes``).

    python -m pytest -q tests/test_routes.py tests/test_exchanges.py tests/test_store_buffers.py
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.profiler import record_function

from . import owner_routes
from .comm import Pending, Phase
from .flows import Flow, FlowOptions, Pieces
from .group_flow import group_newton_schulz
from .owner_routes import Member, Owned, OwnerRoute
from .sharding import copy_all

BF16 = torch.bfloat16


@dataclass
class Exchange:
    """One chunk of a Muon group's buckets as a step moves it, one all-to-all each way: its route, the buffers it
    moves through, the banks of the chunks orthogonalised with it, and its name in traces. Made when built."""

    route: OwnerRoute
    buffers: dict     # "send", "recv", "back", "back_recv"; j -> my piece of a grouped matrix; ("block", j) -> my block
    banks: dict       # shape -> bank (one bf16 row per matrix I own); (shape, row) -> staging of a row split by columns
    name: str


class OwnerFlow(Flow):
    """One owner per matrix, or one group (see the module docstring)."""

    lazy = False   # every bucket's pieces travel before any comes back

    def __init__(self, plan, grid, comm, muon: list[bool] | None = None, options: FlowOptions | None = None):
        super().__init__(plan, grid, comm, muon, options)
        self.silent = plan.layout == "aligned" and grid.tp == 1   # whole matrices on their owner: no exchange
        self.exchanges: dict[int, list[Exchange]] = {}   # per Muon group, its chunks in order
        for g, pairs in owner_routes.routes(plan, grid.rank, self.options, self.muon).items():
            routes = [owner_routes.on_device(r, grid.device) for _, r in pairs]
            together = [routes] if self.options.ns_batch else [[r] for r in routes]   # one set of banks each
            banks = {id(r): bank for rs in together for bank in [self._banks(rs)] for r in rs}
            self.exchanges[g] = [Exchange(r, self._buffers(r), banks[id(r)], name_of(c))
                                 for (c, _), r in zip(pairs, routes)]

    # ---- made when built, kept: the routes' buffers and the banks ----------------------------------

    def _buffers(self, route: OwnerRoute) -> dict:
        """A route's buffers: the all-to-alls' four, a grouped matrix's piece and my block of it."""
        dev = self.grid.device
        counts = dict(send=route.send_counts, recv=route.recv_counts, back=route.back_counts,
                      back_recv=route.back_recv_counts)
        buffers = {name: torch.empty(sum(c), dtype=BF16, device=dev) for name, c in counts.items()}
        for j in route.grouped:
            if route.metas[j].local_numel:
                buffers[j] = torch.empty(route.metas[j].local_numel, dtype=BF16, device=dev)
        for item in route.members:
            buffers[("block", item.j)] = torch.empty(item.route.block_shape(item.meta, item.route.members.index(
                self.grid.rank)), dtype=BF16, device=dev)
        return buffers

    def _banks(self, routes: list) -> dict:
        """The banks of chunks orthogonalised together: per shape, one bf16 row per matrix this rank owns there,
        and a staging tensor per row whose TP blocks are columns (gathered apart, then joined)."""
        rows: dict[tuple, list] = {}
        for route in routes:
            for item in route.owned:
                rows.setdefault(tuple(item.meta.full_shape), []).append(item)
        banks = {}
        for shape, items in rows.items():
            banks[shape] = torch.empty((len(items), *shape), dtype=BF16, device=self.grid.device)
            for row, item in enumerate(items):
                blocks, n_rows, cols, split = item.key
                if split == 1:
                    banks[(shape, row)] = torch.empty((blocks, n_rows, cols), dtype=BF16, device=self.grid.device)
        return banks

    def kept_tensors(self) -> list[torch.Tensor]:
        """Every tensor this flow keeps between steps: the routes' buffers and blocks, and the banks."""
        exchanges = [ex for exs in self.exchanges.values() for ex in exs]
        banks = {id(ex.banks): ex.banks for ex in exchanges}.values()   # chunks orthogonalised together share one
        return [t for ex in exchanges for t in ex.buffers.values()] + [t for b in banks for t in b.values()]

    # ---- the step ------------------------------------------------------------------------------

    def run(self, group: dict, updates, options: FlowOptions, step) -> Pieces:
        """``updates``: (bucket, pieces) per bucket (flat pieces aligned with ``bucket.param_indices``, None: skipped).
        Yields (meta, my piece of its orthogonalised update). The buckets travel in the chunks made when the flow
        was built (``owner_routes.exchange_chunks``; ``overlap``, ``chunks`` and ``ns_batch`` are the flow's
        own, as built: ``options`` brings the trace), one all-to-all each way per chunk; with "prefetch" every
        chunk is sent before any is orthogonalised, and each chunk's results go back while the next one is
        orthogonalised."""
        self.options, updates = options, list(updates)
        pieces, at, sent = [p for _, ps in updates for p in ps], 0, []
        wait_now = self.options.overlap != "prefetch"
        for ex in self.exchanges[updates[0][0].group_idx] if updates else ():
            mine, at = pieces[at: at + len(ex.route.metas)], at + len(ex.route.metas)
            sent.append((ex, mine, self._send(ex, mine, wait_now)))
        if self.options.ns_batch:   # every chunk's matrices in one bank per shape
            yield from self._pieces_back(self._send_back(sent, self._orthogonalise(group, sent, step.ran), wait_now))
            return
        backs = [self._send_back([s], self._orthogonalise(group, [s], step.ran), wait_now) for s in sent]
        for back in backs:
            yield from self._pieces_back(back)

    def _send(self, ex: Exchange, pieces: list, wait_now: bool):
        """Start sending my pieces of other ranks' matrices to their owners (bf16, one copy)."""
        route, buffers = ex.route, ex.buffers
        send = buffers["send"]
        dsts, srcs, zeros = [], [], []
        for j, at, n, where, _ in route.sends + route.group_sends:
            piece = pieces[j]
            (zeros if piece is None else dsts).append(send[at: at + n])
            if piece is not None:
                srcs.append(piece if where is None else piece[where])
        copy_all(dsts, srcs, zeros)
        self.trace("to_owner", ex.name, send)
        if self.silent:
            return Pending(buffers["recv"])
        return self.comm.all_to_all(send, route.send_counts, route.recv_counts, "world", Phase.NS_TO_OWNER,
                                    wait_now=wait_now, out=buffers["recv"])

    def _orthogonalise(self, group: dict, sent: list, ran: set) -> list:
        """My blocks of grouped matrices first, in chunk order on every member (so no member waits at a collective
        while another orthogonalises its own); then every matrix I own: its pieces into the bank of its shape (a
        TP split by columns gathered block by block, then joined), Newton-Schulz, the results kept."""
        done = []
        for ex, pieces, pending in sent:
            for item in ex.route.members:
                done.append((ex, item, self._group_ns(group, item, pieces[item.j], pending.wait(), ran,
                                                      ex.buffers[("block", item.j)])))
        banks: dict[tuple, list] = {}   # shape -> (exchange, pieces, pending, Owned) of each matrix I own
        for ex, pieces, pending in sent:
            for item in ex.route.owned:
                banks.setdefault(tuple(item.meta.full_shape), []).append((ex, pieces, pending, item))
        kept = sent[0][0].banks if sent else {}   # the banks of these chunks, made when the flow was built
        dsts, srcs, zeros, joins = [], [], [], []
        for shape, rows in banks.items():
            bank = kept[shape]
            for row, (_, pieces, pending, item) in enumerate(rows):
                blocks, n_rows, cols, split = item.key
                if split == 1:   # blocks of columns: gathered apart, joined below
                    staging = kept[(shape, row)]
                    joins.append((bank[row], staging))
                    flat = staging.view(blocks, -1)
                else:            # blocks of rows, or one block: each block is a run of the matrix
                    flat = bank[row].view(blocks, -1)
                received = pending.wait()
                for block, a, b, at in item.parts:
                    dst = flat[block, a:b]
                    if at is None and pieces[item.j] is None:
                        zeros.append(dst)
                    else:
                        dsts.append(dst)
                        srcs.append(pieces[item.j] if at is None else received[at: at + b - a])
        copy_all(dsts, srcs, zeros)
        for whole, staging in joins:
            whole.view(whole.shape[0], staging.shape[0], -1).copy_(staging.permute(1, 0, 2))
        for shape, rows in banks.items():
            matrices = kept[shape]
            if self.options.ns_batch:   # banks of matrices (3-D parameters) join the batch matrix by matrix
                outs = self.newton_schulz(group, matrices.flatten(0, -3), [m[3].meta for m in rows], ran).unflatten(
                    0, matrices.shape[:-2]).unbind(0)
            else:
                outs = [self.newton_schulz(group, m, [member[3].meta], ran)
                        for m, member in zip(matrices.unbind(0), rows)]
            for (ex, _, _, item), matrix, out in zip(rows, matrices.unbind(0), outs):
                self.trace("ns_input", item.meta.name, matrix)
                done.append((ex, item, self.trace("orthogonalised", item.meta.name, out)))
        return done

    def _group_ns(self, group: dict, item: Member, piece, received: torch.Tensor, ran: set,
                  block: torch.Tensor) -> torch.Tensor:
        """Every rank's elements of a grouped matrix into my ``block`` (one copy), and my part of its Newton-Schulz,
        under the profiler range every Newton-Schulz call has (the group's collectives run inside it)."""
        flat, meta = block.view(-1), item.meta
        for at, n, where in item.parts:
            if at is not None:
                flat.index_copy_(0, where, received[at: at + n])
            elif piece is None:
                flat.index_fill_(0, where, 0)
            else:
                flat.index_copy_(0, where, piece[item.route.src[item.route.members.index(self.grid.rank)]].to(BF16))
        self.trace("group_ns_input", meta.name, block)
        ran.add((meta.group_idx, meta.param_idx))
        with record_function("muon:newton_schulz"):
            out = group_newton_schulz(self.comm, group, meta, block, item.route, self.grid.rank)
        return self.trace("group_orthogonalised", meta.name, out)

    def _send_back(self, sent: list, done: list, wait_now: bool) -> list:
        """Cut every result into the pieces each rank keeps (one copy) and start sending them back: one
        all-to-all per chunk of ``sent``, on every rank, whether or not it owns a matrix there."""
        by_chunk: dict = {id(ex): [] for ex, _, _ in sent}
        for ex, item, out in done:
            by_chunk[id(ex)].append((item, out))
        backs = []
        for ex, _, _ in sent:
            route, buffers = ex.route, ex.buffers
            send = buffers["back"]
            dsts, srcs, mine = [], [], {}
            for item, out in by_chunk[id(ex)]:
                if isinstance(item, Member):
                    flat = out.reshape(-1)
                    for _, at, n, where in item.back:
                        torch.index_select(flat, 0, where, out=send[at: at + n])
                    if item.mine is not None:
                        mine[item.j] = (flat, *item.mine)
                    continue
                for _, block, a, b, at in item.back:
                    for offset, src in _parts(_block_piece(out, item, block, a, b)):
                        dsts.append(send[at + offset: at + offset + src.numel()].view(src.shape))
                        srcs.append(src)
                if item.mine is not None:
                    mine[item.j] = _block_piece(out, item, *item.mine)
            copy_all(dsts, srcs)
            pending = Pending(buffers["back_recv"]) if self.silent else self.comm.all_to_all(
                send, route.back_counts, route.back_recv_counts, "world", Phase.NS_FROM_OWNER, wait_now=wait_now,
                out=buffers["back_recv"])
            backs.append((ex, pending, mine))
        return backs

    def _pieces_back(self, backs: list) -> Pieces:
        for ex, pending, mine in backs:
            route, buffers, received = ex.route, ex.buffers, pending.wait()
            for j, meta in enumerate(route.metas):
                if j in buffers:   # a grouped matrix: my piece, from every member's block
                    piece = buffers[j]
                    for at, n, where in route.group_back.get(j, []):
                        piece.index_copy_(0, where, received[at: at + n])
                    if j in mine:
                        flat, at_block, at_piece = mine[j]
                        piece.index_copy_(0, at_piece, flat[at_block])
                    yield meta, self.trace("from_owner", meta.name, piece)
                elif j in mine:   # maybe rows of a transposed result (see _block_piece): traced whole, if at all
                    piece = mine[j]
                    if self.options.trace is not None:
                        whole = torch.cat([r.reshape(-1) for _, r in piece]) if isinstance(piece, list) else piece
                        self.trace("from_owner", meta.name, whole)
                    yield meta, piece
                elif j in route.back_recv:
                    at, n = route.back_recv[j]
                    yield meta, self.trace("from_owner", meta.name, received[at: at + n])


def name_of(chunk: tuple) -> str:
    """A chunk's name in traces: "bucket 0.3" or "buckets 0.0-0.2"."""
    first, last = (f"{b.group_idx}.{b.bucket_idx}" for b in (chunk[0], chunk[-1]))
    return f"bucket {first}" if len(chunk) == 1 else f"buckets {first}-{last}"


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
