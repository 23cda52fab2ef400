"""The "group" layout's flow: a large matrix orthogonalised by a group of ranks, the others by one owner.

``GroupFlow`` is the owner flow with one more kind of destination, written apart from ``owner_flow.py``
(it moves each bucket's flat shard, not pieces: the group layout is not yet on the copy-free path). A matrix in ``plan.groups``
(above the fair share of Newton-Schulz FLOPs, ``layouts.assign_owners_and_groups``) has ``k`` members;
member i is sent, in the same one all-to-all as the owners' pieces, the elements of every rank's
pieces that fall in block i of the matrix's long side (``group_routes``), so it holds that block
whole. The members then orthogonalise it together over their process subgroup (``Comm.add_subgroups``,
phase "ns_group_gram") in the form ``ns_group.group_form`` picks by the fewer bytes per member: the Gram
form ``zeropower_sharded`` (the norm and each iteration's Gram matrix all-reduced in fp32, B's rows
split with ``split_b`` and all-gathered in bf16), or, for a near-square matrix, the row form
``zeropower_rows`` (the matrix and each iteration's rows of A and X all-gathered in bf16). They send
every element back to where it came from, in the same all-to-all as the owners' results::

    my pieces --bf16, one all-to-all--> owners (whole matrices) and members (long-side blocks)
    owners: Newton-Schulz once          members: zeropower_sharded over the group's subgroup
    --one all-to-all--> my pieces of every orthogonalised matrix

One all-to-all each way per chunk of buckets (``owner_flow.exchange_chunks``: one chunk without overlap, a
few with "prefetch"), whatever the number of buckets and matrices.

Owner matrices take exactly the owner layout's path (same assembly, same ``zeropower_ns5`` call), so
their results equal the owner layout's bit for bit. Grouped matrices in the Gram form cannot: one process
sums the Gram matrix X X^T over all n columns in one GEMM, the group sums each block's columns and then
the k partial sums, a different order of fp32 additions, which now and then moves a bf16 rounding of A
and is carried through the iterations. The row form sums nothing across ranks, and is bit-exact where
the GEMM's rows do not depend on the call's row count (``ns_group.py`` says where). The tolerance is
stated and tested in ``tests/test_group_layout.py``.

Options, as under "owner": the owner matrices honour every option the owner layout does, bit for bit
(``ns_form``, ``ns_coefficients``, ``ns_batch``, every ``overlap`` mode). A grouped matrix honours
``ns_coefficients``, ``ns_steps`` and ``ns_form`` (``"gram"``: R = X X^T all-reduced once and the m x m
iteration on every member, ``ns_gram_group.py``; within the same tolerance of one process's Gram form),
but it is never batched: each member holds one block of it, not a whole matrix (``ns_batch`` batches
the owner matrices only).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.profiler import record_function

from .comm import Pending, Phase, subgroup_name
from .flows import Flow, Pieces, Updates
from .owner_flow import exchange_chunks, name_of
from .group_routes import band_indices, block_positions, count_in_band, local_band, long_bounds
from .newton_schulz import NS_FORM
from .ns_gram_group import gram_sharded_flops, zeropower_gram_sharded
from .ns_group import group_form, row_flops, zeropower_rows, zeropower_sharded
from .plan import DistMeta
from .sharding import local_shard, tp_shard


@dataclass
class Route:
    """One grouped matrix's routing, the same arithmetic on every rank (index tensors only for this rank)."""

    members: tuple[int, ...]
    dim: int                        # the long side
    bounds: tuple[int, ...]         # block i is [bounds[i], bounds[i + 1]) of the long side
    counts: list[list[int]]         # counts[r][i]: elements of rank r's piece in block i
    src: list[torch.Tensor]         # src[i]: positions in my piece of my elements in block i
    pos: dict                       # if I am a member: rank r -> where r's elements sit in my flat block


@dataclass
class Chunk:
    """Consecutive buckets that travel in one all-to-all each way, with this rank's flat bf16 shard of each."""

    buckets: tuple
    flats: list

    def shard_of(self, plan, meta: DistMeta) -> torch.Tensor:
        """This rank's piece of ``meta`` (flat), in its bucket's shard."""
        at = next(i for i, b in enumerate(self.buckets) if b.bucket_idx == meta.bucket_idx)
        return local_shard(self.flats[at], plan, meta)

    def empty(self) -> torch.Tensor:
        return self.flats[0][:0]


class GroupFlow(Flow):
    """Owner matrices as ``OwnerFlow``; grouped matrices block by block to their members and back."""

    def __init__(self, opt):
        super().__init__(opt)
        self._routes: dict[tuple[int, int], Route] = {}

    def run(self, group: dict, updates: Updates) -> Pieces:
        """Each bucket's pieces as one flat bf16 shard, the buckets joined into chunks (one all-to-all each way per
        chunk: ``exchange_chunks``); then, by overlap mode: the one chunk in turn ("none", "naive"), every chunk's
        transfers first ("prefetch"), or one batched call per shape (``ns_batch``)."""
        flats = [(bucket, [self.flat_shard(bucket, pieces)]) for bucket, pieces in updates]
        chunks = [Chunk(*c) for c in exchange_chunks(flats, self.opt.overlap, getattr(self.opt, "chunks", None))]
        if getattr(self.opt, "ns_batch", False):
            yield from self._run_batched(group, chunks)
            return
        if self.opt.overlap != "prefetch":
            for chunk in chunks:
                to_owner = self.comm.all_to_all(*self._to_owners(chunk), "world", Phase.NS_TO_OWNER)
                yield from self._pieces_back(chunk, self._orthogonalise_owned(group, chunk, to_owner.wait()))
            return
        sent = [(chunk, self.comm.all_to_all(*self._to_owners(chunk), "world", Phase.NS_TO_OWNER, wait_now=False))
                for chunk in chunks]
        back = [(chunk, self._orthogonalise_owned(group, chunk, to_owner.wait(), wait_now=False))
                for chunk, to_owner in sent]
        for chunk, from_owner in back:
            yield from self._pieces_back(chunk, from_owner)

    def _metas(self, chunk: Chunk) -> list[DistMeta]:
        return [self.plan.metas[b.buffer_idx][i] for b in chunk.buckets for i in b.param_indices]

    def _sends(self, meta: DistMeta, rank: int) -> bool:
        """Whether world rank ``rank`` sends its pieces of an owner matrix (one TP rank, if replicated)."""
        return meta.tp_split_dim != -1 or rank % self.grid.tp == self.plan.owner_of(meta) % self.grid.tp

    def _piece_numel(self, meta: DistMeta, rank: int) -> int:
        return self.plan.piece_numel(meta, rank // self.grid.tp)

    # --- who sends what to whom --------------------------------------------------------------------

    def _route(self, meta: DistMeta) -> Route:
        key = (meta.buffer_idx, meta.param_idx)
        if key not in self._routes:
            members, tp, me = self.plan.group_of(meta), self.grid.tp, self.grid.rank
            dim, bounds = long_bounds(meta.full_shape, len(members))

            def band(r: int, i: int) -> tuple[int, int]:
                return local_band(meta.full_shape, meta.shape, meta.tp_split_dim, r % tp, bounds[i], bounds[i + 1])

            def piece(r: int) -> slice:
                return self.plan.piece_slice(meta, r // tp)

            counts = [[count_in_band(piece(r).start, piece(r).stop, meta.shape, dim, *band(r, i))
                       for i in range(len(members))] for r in range(self.plan.world)]
            src = [band_indices(piece(me).start, piece(me).stop, meta.shape, dim, *band(me, i))
                   for i in range(len(members))]
            pos = {}
            if me in members:
                i = members.index(me)
                pos = {r: block_positions(piece(r).start, piece(r).stop, meta.full_shape, meta.shape,
                                          meta.tp_split_dim, r % tp, bounds[i], bounds[i + 1])
                       for r in range(self.plan.world)}
            dev = self.grid.device   # the index tensors live where the pieces do (a GPU's, on CUDA)
            self._routes[key] = Route(members, dim, bounds, counts, [t.to(dev) for t in src],
                                      {r: t.to(dev) for r, t in pos.items()})
        return self._routes[key]

    def _sends_to(self, meta: DistMeta, r: int, q: int) -> bool:
        """Whether rank r sends its piece's part to member q (one TP rank, q's, if replicated)."""
        return meta.tp_split_dim != -1 or r % self.grid.tp == q % self.grid.tp

    def _there(self, meta: DistMeta, r: int, q: int) -> int:
        """Elements of ``meta`` that rank r sends rank q on the way to Newton-Schulz."""
        members = self.plan.group_of(meta)
        if members is None:
            return self._piece_numel(meta, r) if q == self.plan.owner_of(meta) and self._sends(meta, r) else 0
        if q not in members or not self._sends_to(meta, r, q):
            return 0
        return self._route(meta).counts[r][members.index(q)]

    def _back(self, meta: DistMeta, q: int, r: int) -> int:
        """Elements of ``meta`` that rank q sends back to rank r (every rank gets its whole piece back)."""
        members = self.plan.group_of(meta)
        if members is None:
            return self._piece_numel(meta, r) if q == self.plan.owner_of(meta) else 0
        return self._route(meta).counts[r][members.index(q)] if q in members else 0

    # --- there ---------------------------------------------------------------------------------------

    def _to_owners(self, chunk: Chunk) -> tuple[torch.Tensor, list[int], list[int]]:
        me, world = self.grid.rank, self.plan.world
        parts: list[list[torch.Tensor]] = [[] for _ in range(world)]
        for meta in self._metas(chunk):
            members = self.plan.group_of(meta)
            if members is None:
                if self._sends(meta, me):
                    parts[self.plan.owner_of(meta)].append(chunk.shard_of(self.plan, meta))
                continue
            piece, route = chunk.shard_of(self.plan, meta), self._route(meta)
            for i, q in enumerate(members):
                if self._sends_to(meta, me, q):
                    parts[q].append(piece[route.src[i]])
        send = torch.cat([p for ps in parts for p in ps] or [chunk.empty()]).to(torch.bfloat16)
        recv = [sum(self._there(m, r, me) for m in self._metas(chunk)) for r in range(world)]
        return self.trace("to_owner", name_of(chunk.buckets), send), \
            [sum(p.numel() for p in ps) for ps in parts], recv

    def _assemble(self, chunk: Chunk, received: torch.Tensor):
        """(owned whole matrices, my blocks of grouped matrices), each as (meta, tensor), in chunk order."""
        me, tp, world = self.grid.rank, self.grid.tp, self.plan.world
        metas = self._metas(chunk)
        chunks: dict[tuple[int, int], torch.Tensor] = {}
        offset = 0
        for r in range(world):    # rank by rank, each rank's parts in chunk order
            for meta in metas:
                members = self.plan.group_of(meta)
                mine = me in members if members is not None else self.plan.owner_of(meta) == me
                if not mine or not (self._sends(meta, r) if members is None else self._sends_to(meta, r, me)):
                    continue
                n = self._there(meta, r, me)
                chunks[(meta.param_idx, r)] = received[offset: offset + n]
                offset += n
        owned, blocks = [], []
        for meta in metas:
            members = self.plan.group_of(meta)
            if members is None and self.plan.owner_of(meta) == me:   # as OwnerFlow._assemble_owned
                tp_ranks = range(tp) if meta.tp_split_dim != -1 else [me % tp]
                parts = [torch.cat([chunks[(meta.param_idx, d * tp + t)] for d in range(self.grid.dp)]).view(meta.shape)
                         for t in tp_ranks]
                matrix = torch.cat(parts, dim=meta.tp_split_dim) if len(parts) > 1 else parts[0]
                owned.append((meta, self.trace("ns_input", meta.name, matrix)))
            elif members is not None and me in members:
                route, i = self._route(meta), members.index(me)
                width = route.bounds[i + 1] - route.bounds[i]
                shape = (width, meta.full_shape[1]) if route.dim == 0 else (meta.full_shape[0], width)
                block = torch.empty(shape[0] * shape[1], dtype=received.dtype, device=received.device)
                for r in range(world):
                    if (meta.param_idx, r) in chunks:
                        block[route.pos[r]] = chunks[(meta.param_idx, r)]
                blocks.append((meta, self.trace("group_ns_input", meta.name, block.view(shape))))
        return owned, blocks

    # --- Newton-Schulz --------------------------------------------------------------------------------

    def _orthogonalise_owned(self, group: dict, chunk: Chunk, received: torch.Tensor,
                             wait_now: bool = True) -> Pending:
        """My blocks of grouped matrices first (so no member waits at a Gram all-reduce while another
        orthogonalises its own matrices), then the matrices I own; then everything goes back."""
        owned, blocks = self._assemble(chunk, received)
        ortho = {meta.param_idx: self._group_ns(group, meta, block) for meta, block in blocks}
        for meta, matrix in owned:
            ortho[meta.param_idx] = self.trace("orthogonalised", meta.name, self.newton_schulz(group, matrix, [meta]))
        done = [(meta, ortho[meta.param_idx]) for meta in self._metas(chunk) if meta.param_idx in ortho]
        return self._send_back(chunk, done, wait_now, received[:0])

    def _run_batched(self, group: dict, chunks: list) -> Pieces:
        """``ns_batch``: as ``OwnerFlow._run_batched`` for the owner matrices (one batched call per distinct
        shape I own, over every bucket of the group); my blocks of grouped matrices first, one by one, in plan
        order (every member meets every Gram all-reduce in the same order), since a block cannot batch."""
        wait_now = self.opt.overlap != "prefetch"
        sent = [(chunk, self.comm.all_to_all(*self._to_owners(chunk), "world", Phase.NS_TO_OWNER, wait_now=wait_now))
                for chunk in chunks]
        received = [(chunk, to_owner.wait()) for chunk, to_owner in sent]
        assembled = [(chunk, *self._assemble(chunk, got), got[:0]) for chunk, got in received]
        ortho: dict[int, torch.Tensor] = {}
        for _, _, blocks, _ in assembled:
            for meta, block in blocks:
                ortho[meta.param_idx] = self._group_ns(group, meta, block)
        by_shape: dict[tuple[int, ...], list[tuple[DistMeta, torch.Tensor]]] = {}
        for _, owned, _, _ in assembled:
            for meta, matrix in owned:
                by_shape.setdefault(tuple(matrix.shape), []).append((meta, matrix))
        for same in by_shape.values():   # a bank (3-D) joins the batch matrix by matrix
            stacked = torch.stack([m for _, m in same])
            results = self.newton_schulz(group, stacked.flatten(0, -3), [m for m, _ in same]).unflatten(
                0, stacked.shape[:-2])
            for (meta, _), result in zip(same, results.unbind(0)):
                ortho[meta.param_idx] = self.trace("orthogonalised", meta.name, result)
        back = [(chunk, self._send_back(chunk, [(m, ortho[m.param_idx]) for m in self._metas(chunk)
                                                if m.param_idx in ortho], wait_now, empty))
                for chunk, _, _, empty in assembled]
        for chunk, from_owner in back:
            yield from self._pieces_back(chunk, from_owner)

    def _group_ns(self, group: dict, meta: DistMeta, block: torch.Tensor) -> torch.Tensor:
        """My block's part in a grouped matrix's Newton-Schulz, under the profiler range every Newton-Schulz
        call has (``lab/traces.py``); the group's Gram collectives run inside it, so there it includes them."""
        self.done.add((meta.buffer_idx, meta.param_idx))
        with record_function("muon:newton_schulz"):
            return self._group_newton_schulz(group, meta, block)

    def _group_newton_schulz(self, group: dict, meta: DistMeta, block: torch.Tensor) -> torch.Tensor:
        """My block of the grouped matrix. With ``ns_form="gram"`` the Gram iteration over the group
        (``_group_gram``); otherwise the sharing ``ns_group.group_form`` picks from the shape alone (the same
        on every member): Gram all-reduces or the row form. Either way the collectives are phase
        "ns_group_gram"."""
        if group.get("ns_form", NS_FORM) == "gram":
            return self._group_gram(group, meta, block)
        route = self._route(meta)
        size, i = len(route.members), route.members.index(self.grid.rank)
        name = subgroup_name(route.members)
        steps = group["ns_steps"]

        def gather(t: torch.Tensor) -> torch.Tensor:
            return self.comm.all_gather(t, name, Phase.NS_GROUP_GRAM)
        if group_form(*meta.full_shape, size, steps) == "rows":
            out = zeropower_rows(block, gather, route.dim, meta.full_shape[route.dim], (i, size), steps,
                                 group["ns_coefficients"], group["eps"])
            self.comm.ledger.count_ns(row_flops(*meta.full_shape, (i, size), steps))
        else:
            out = zeropower_sharded(block, lambda t: self.comm.all_reduce(t, name, Phase.NS_GROUP_GRAM), route.dim,
                                    steps, group["ns_coefficients"], group["eps"], split_b=(i, size), all_gather=gather)
            m = min(meta.full_shape)
            b_rows = len(torch.tensor_split(torch.arange(m), size)[i])
            self.comm.ledger.count_ns(steps * (4 * m * m * block.shape[route.dim] + 2 * m * m * b_rows))
        return self.trace("group_orthogonalised", meta.name, out)

    def _group_gram(self, group: dict, meta: DistMeta, block: torch.Tensor) -> torch.Tensor:
        """``ns_form="gram"``: the norm and R = X X^T all-reduced once, the m x m iteration on every member
        (``ns_gram_group.py``)."""
        route = self._route(meta)
        name = subgroup_name(route.members)
        out = zeropower_gram_sharded(block, lambda t: self.comm.all_reduce(t, name, Phase.NS_GROUP_GRAM), route.dim,
                                     group["ns_steps"], group["ns_coefficients"], group["eps"])
        self.comm.ledger.count_ns(gram_sharded_flops(*meta.full_shape, block.shape[route.dim], group["ns_steps"]))
        return self.trace("group_orthogonalised", meta.name, out)

    # --- back ----------------------------------------------------------------------------------------

    def _send_back(self, chunk: Chunk, orthos: list[tuple[DistMeta, torch.Tensor]], wait_now: bool,
                   empty: torch.Tensor) -> Pending:
        me, tp, world = self.grid.rank, self.grid.tp, self.plan.world
        back: list[list[torch.Tensor]] = [[] for _ in range(world)]
        for meta, ortho in orthos:
            if self.plan.group_of(meta) is not None:
                flat, route = ortho.reshape(-1), self._route(meta)
                for r in range(world):
                    back[r].append(flat[route.pos[r]])
                continue
            tp_parts = [tp_shard(ortho, meta.tp_split_dim, tp, t, meta.name).reshape(-1) for t in range(tp)] \
                if meta.tp_split_dim != -1 else [ortho.reshape(-1)] * tp
            for r in range(world):
                back[r].append(tp_parts[r % tp][self.plan.piece_slice(meta, r // tp)])
        send = torch.cat([p for ps in back for p in ps] or [empty])
        recv = [sum(self._back(m, q, me) for m in self._metas(chunk)) for q in range(world)]
        return self.comm.all_to_all(send, [sum(p.numel() for p in ps) for ps in back], recv, "world",
                                    Phase.NS_FROM_OWNER, wait_now=wait_now)

    def _pieces_back(self, chunk: Chunk, from_owner: Pending) -> Pieces:
        received = from_owner.wait()
        me, metas = self.grid.rank, self._metas(chunk)
        by_meta: dict[int, torch.Tensor] = {}
        offset = 0
        for q in range(self.plan.world):
            for meta in metas:
                n = self._back(meta, q, me)
                members = self.plan.group_of(meta)
                if members is None:
                    if q == self.plan.owner_of(meta):
                        by_meta[meta.param_idx] = received[offset: offset + n]
                elif q in members:
                    piece = by_meta.setdefault(meta.param_idx, received.new_empty(self._piece_numel(meta, me)))
                    piece[self._route(meta).src[members.index(q)]] = received[offset: offset + n]
                offset += n
        for meta in metas:
            yield meta, self.trace("from_owner", meta.name, by_meta[meta.param_idx])
