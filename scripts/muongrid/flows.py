"""How a Muon group's momentum shards become orthogonalised updates: one flow per layout.

The optimizer (``distributed.py``) hands a flow, bucket by bucket, this rank's momentum-updated
shard (fp32, its DP part of the bucket, on its TP rank). The flow must hand back, for every matrix
of the bucket, this rank's piece of the orthogonalised update: the same elements, in the same
order, as ``dp_shard_of(tp_shard(NS(whole matrix)))``. How the whole matrix is assembled, and
where Newton-Schulz runs, is the layout:

``BucketFlow`` (layout "bucket", the proof of concept's)::

    my shard --bf16--> all-gather over DP (whole bucket)   "DP gather"
             --------> per matrix, all-gather over TP       "TP gather"
             --------> Newton-Schulz, on every rank
             --------> keep my TP slice, then my DP part    "TP shard", "DP shard"

``OwnerFlow`` (layouts "owner" and "aligned")::

    my pieces of every matrix --bf16, one all-to-all--> each matrix's owner   "to owner"
    the owner joins DP pieces, then TP shards, runs Newton-Schulz once,
    and cuts the result into the same pieces --one all-to-all--> back       "from owner"

A matrix replicated over TP (``tp_split_dim == -1``) is sent to its owner by one TP rank only
(the owner's); every TP rank gets its piece back, since each keeps state for its replica.

``GroupFlow`` (layout "group", ``group_flow.py``) is ``OwnerFlow`` where a matrix above the fair
share of Newton-Schulz work goes, block by block of its long side, to a group of ranks that
orthogonalise it together.

Overlap (``opt.overlap``): "none" finishes each bucket in turn; "naive" issues every collective
with ``async_op=True`` and waits at once (the community report's experiment); "prefetch" starts
every bucket's transfers before orthogonalising any, so later transfers travel while
Newton-Schulz runs. All give the same parameters, bit for bit.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch
from torch.profiler import record_function

from .comm import Pending, Phase
from .newton_schulz import NS_FORM, ns_flops, zeropower_ns5
from .plan import Bucket, DistMeta
from .sharding import bucket_matrix, dp_shard_of, local_shard, tp_shard, tp_unshard

Updates = Iterable[tuple[Bucket, torch.Tensor]]   # (bucket, my momentum-updated shard of it)
Pieces = Iterator[tuple[DistMeta, torch.Tensor]]  # (matrix, my piece of its orthogonalised update)


class Flow:
    def __init__(self, opt):
        self.opt, self.plan, self.comm, self.grid = opt, opt.plan, opt.comm, opt.grid

    def newton_schulz(self, group: dict, matrix: torch.Tensor) -> torch.Tensor:
        """One Newton-Schulz call: a matrix, or a batch of same-shape matrices (counted as one call)."""
        form = group.get("ns_form", NS_FORM)
        with record_function("muon:newton_schulz"):  # it checks the shape first (the PoC's bug #2: a flat view)
            out = zeropower_ns5(matrix, group["ns_steps"], group["ns_coefficients"], group["eps"], form=form)
        self.comm.ledger.count_ns(ns_flops(*matrix.shape[-2:], group["ns_steps"], form) *
                                  (matrix.shape[0] if matrix.ndim == 3 else 1))
        return out

    def trace(self, stage: str, name: str, tensor: torch.Tensor) -> torch.Tensor:
        return self.opt._trace(stage, name, tensor)


class BucketFlow(Flow):
    """Every rank gathers whole buckets over DP and every matrix over TP, and orthogonalises it."""

    def run(self, group: dict, updates: Updates) -> Pieces:
        """With prefetch, the next bucket's DP gather travels while this one is orthogonalised: one bucket
        ahead, so at most two gathered buckets are alive at once (not the whole TP-local model)."""
        prefetch = self.opt.overlap == "prefetch"
        in_flight = []
        for bucket, update in updates:
            # stage 3: DP gather (bf16, the whole bucket)
            gather = self.comm.all_gather_async(update.to(torch.bfloat16), "dp", Phase.NS_GATHER_DP,
                                                wait_now=not prefetch)
            in_flight.append((bucket, gather))
            if len(in_flight) > (1 if prefetch else 0):
                yield from self._orthogonalise_bucket(group, *in_flight.pop(0))
        for item in in_flight:
            yield from self._orthogonalise_bucket(group, *item)

    def _orthogonalise_bucket(self, group: dict, bucket: Bucket, gather: Pending) -> Pieces:
        """TP gather, Newton-Schulz, TP shard and DP shard for every matrix of a gathered bucket. Every
        TP gather is started first, so with prefetch later matrices travel while earlier ones are computed."""
        bucket_update = self.trace("dp_gathered", f"bucket {bucket.buffer_idx}.{bucket.bucket_idx}", gather.wait())
        metas = self.plan.metas[bucket.buffer_idx]
        matrices = []
        for i in bucket.param_indices:
            meta = metas[i]
            matrix = self.trace("ns_input", meta.name, self.unpack_ns_input(bucket_update, bucket, meta))
            if meta.tp_split_dim != -1 and self.grid.tp > 1:                            # stage 4: TP gather
                matrix = self.comm.all_gather_async(matrix, "tp", Phase.NS_GATHER_TP,
                                                    wait_now=self.opt.overlap != "prefetch")
            matrices.append((meta, matrix))
        for meta, matrix in matrices:
            if isinstance(matrix, Pending):
                matrix = self.trace("tp_gathered", meta.name, tp_unshard(matrix.wait(), meta, self.grid.tp))
            ortho = self.trace("orthogonalised", meta.name, self.newton_schulz(group, matrix))  # stage 5
            tp_part = self.trace("tp_shard", meta.name,                                 # stage 6: TP shard
                                 tp_shard(ortho, meta.tp_split_dim, self.grid.tp, self.grid.tp_rank, meta.name))
            yield meta, self.trace("dp_shard", meta.name, dp_shard_of(tp_part, meta))   # stage 6: DP shard

    def unpack_ns_input(self, bucket_update: torch.Tensor, bucket: Bucket, meta: DistMeta) -> torch.Tensor:
        """A matrix's TP-local block of the gathered bucket, as a matrix (the PoC's bug #2 was a flat view)."""
        return bucket_matrix(bucket_update, bucket, meta)


class OwnerFlow(Flow):
    """Each matrix travels, in pieces, to its one owner, is orthogonalised there once, and comes back."""

    def run(self, group: dict, updates: Updates) -> Pieces:
        if getattr(self.opt, "ns_batch", False):
            yield from self._run_batched(group, updates)
            return
        naive_or_none = self.opt.overlap != "prefetch"
        if naive_or_none:
            for bucket, update in updates:
                to_owner = self.comm.all_to_all(*self._to_owners(bucket, update), "world", Phase.NS_TO_OWNER)
                yield from self._pieces_back(bucket, self._orthogonalise_owned(group, bucket, to_owner.wait()))
            return
        sent = [(bucket, self.comm.all_to_all(*self._to_owners(bucket, update), "world", Phase.NS_TO_OWNER,
                                              wait_now=False)) for bucket, update in updates]
        back = [(bucket, self._orthogonalise_owned(group, bucket, to_owner.wait(), wait_now=False))
                for bucket, to_owner in sent]
        for bucket, from_owner in back:
            yield from self._pieces_back(bucket, from_owner)

    # --- who sends what to whom: the same arithmetic on every rank ------------------------------

    def _metas(self, bucket: Bucket) -> list[DistMeta]:
        return [self.plan.metas[bucket.buffer_idx][i] for i in bucket.param_indices]

    def _sends(self, meta: DistMeta, rank: int) -> bool:
        """Whether world rank ``rank`` sends its pieces of ``meta`` to the owner (one TP rank, if replicated)."""
        return meta.tp_split_dim != -1 or rank % self.grid.tp == self.plan.owner_of(meta) % self.grid.tp

    def _piece_numel(self, meta: DistMeta, rank: int) -> int:
        return self.plan.piece_numel(meta, rank // self.grid.tp)

    def _to_owners(self, bucket: Bucket, update: torch.Tensor) -> tuple[torch.Tensor, list[int], list[int]]:
        """My bf16 pieces ordered by owner rank, and the element counts to send and to receive."""
        me, world = self.grid.rank, self.plan.world
        parts: list[list[torch.Tensor]] = [[] for _ in range(world)]
        recv = [0] * world
        for meta in self._metas(bucket):
            owner = self.plan.owner_of(meta)
            if self._sends(meta, me):
                parts[owner].append(local_shard(update, self.plan, meta))
            if owner == me:
                for r in range(world):
                    recv[r] += self._piece_numel(meta, r) if self._sends(meta, r) else 0
        send = torch.cat([p for ps in parts for p in ps] or [update[:0]]).to(torch.bfloat16)
        return self.trace("to_owner", f"bucket {bucket.buffer_idx}.{bucket.bucket_idx}", send), \
            [sum(p.numel() for p in ps) for ps in parts], recv

    def _run_batched(self, group: dict, updates: Updates) -> Pieces:
        """Same-shape batching: every bucket's pieces travel to their owners first, then each owner runs
        one batched Newton-Schulz per distinct matrix shape it owns (over all buckets of the group),
        then the pieces go back. Per matrix the same arithmetic as unbatched (bit-exact where the CPU's
        batched GEMM equals its plain one, which ``tests/test_ns_variants.py`` checks)."""
        wait_now = self.opt.overlap != "prefetch"
        sent = [(bucket, self.comm.all_to_all(*self._to_owners(bucket, update), "world", Phase.NS_TO_OWNER,
                                              wait_now=wait_now)) for bucket, update in updates]
        received = [(bucket, to_owner.wait()) for bucket, to_owner in sent]
        owned = [(bucket, self._assemble_owned(bucket, got), got[:0]) for bucket, got in received]
        by_shape: dict[tuple[int, ...], list[tuple[DistMeta, torch.Tensor]]] = {}
        for _, matrices, _ in owned:
            for meta, matrix in matrices:
                by_shape.setdefault(tuple(matrix.shape), []).append((meta, matrix))
        ortho = {}
        for same in by_shape.values():
            batch = self.newton_schulz(group, torch.stack([m for _, m in same]))
            for (meta, _), result in zip(same, batch):
                ortho[meta.param_idx] = self.trace("orthogonalised", meta.name, result)
        back = [(bucket, self._send_back(bucket, [(meta, ortho[meta.param_idx]) for meta, _ in matrices], wait_now,
                                         empty)) for bucket, matrices, empty in owned]
        for bucket, from_owner in back:
            yield from self._pieces_back(bucket, from_owner)

    def _orthogonalise_owned(self, group: dict, bucket: Bucket, received: torch.Tensor,
                             wait_now: bool = True) -> Pending:
        """Assemble, orthogonalise and cut up every matrix of the bucket that this rank owns; start
        sending the pieces back."""
        ortho = [(meta, self.trace("orthogonalised", meta.name, self.newton_schulz(group, matrix)))
                 for meta, matrix in self._assemble_owned(bucket, received)]
        return self._send_back(bucket, ortho, wait_now, received[:0])

    def _assemble_owned(self, bucket: Bucket, received: torch.Tensor) -> list[tuple[DistMeta, torch.Tensor]]:
        """Every matrix of the bucket that this rank owns, whole, from the pieces received."""
        me, tp, world = self.grid.rank, self.grid.tp, self.plan.world
        owned = [m for m in self._metas(bucket) if self.plan.owner_of(m) == me]
        # ``received`` holds, rank by rank, that rank's pieces of my matrices in bucket order.
        pieces: dict[tuple[int, int], torch.Tensor] = {}
        offset = 0
        for r in range(world):
            for meta in owned:
                if self._sends(meta, r):
                    n = self._piece_numel(meta, r)
                    pieces[(meta.param_idx, r)] = received[offset: offset + n]
                    offset += n
        matrices = []
        for meta in owned:
            tp_ranks = range(tp) if meta.tp_split_dim != -1 else [me % tp]
            blocks = [torch.cat([pieces[(meta.param_idx, d * tp + t)] for d in range(self.grid.dp)]).view(meta.shape)
                      for t in tp_ranks]
            matrix = torch.cat(blocks, dim=meta.tp_split_dim) if len(blocks) > 1 else blocks[0]
            matrices.append((meta, self.trace("ns_input", meta.name, matrix)))
        return matrices

    def _send_back(self, bucket: Bucket, orthos: list[tuple[DistMeta, torch.Tensor]], wait_now: bool,
                   empty: torch.Tensor) -> Pending:
        """Cut every orthogonalised matrix I own in this bucket (in bucket order) into the pieces each rank
        keeps, and start sending them back with one all-to-all."""
        me, tp, world = self.grid.rank, self.grid.tp, self.plan.world
        back: list[list[torch.Tensor]] = [[] for _ in range(world)]
        for meta, ortho in orthos:
            tp_parts = [tp_shard(ortho, meta.tp_split_dim, tp, t, meta.name).reshape(-1) for t in range(tp)] \
                if meta.tp_split_dim != -1 else [ortho.reshape(-1)] * tp
            for r in range(world):
                back[r].append(tp_parts[r % tp][self.plan.piece_slice(meta, r // tp)])
        send = torch.cat([p for ps in back for p in ps] or [empty])
        recv = [sum(self._piece_numel(m, me) for m in self._metas(bucket) if self.plan.owner_of(m) == r)
                for r in range(world)]
        return self.comm.all_to_all(send, [sum(p.numel() for p in ps) for ps in back], recv, "world",
                                    Phase.NS_FROM_OWNER, wait_now=wait_now)

    def _pieces_back(self, bucket: Bucket, from_owner: Pending) -> Pieces:
        """Split what came back from the owners into my piece of every matrix of the bucket."""
        received = from_owner.wait()
        metas, world = self._metas(bucket), self.plan.world
        offset = 0
        by_meta = {}
        for r in range(world):
            for meta in metas:
                if self.plan.owner_of(meta) == r:
                    n = self._piece_numel(meta, self.grid.rank)
                    by_meta[meta.param_idx] = received[offset: offset + n]
                    offset += n
        for meta in metas:
            yield meta, self.trace("from_owner", meta.name, by_meta[meta.param_idx])


from .group_flow import GroupFlow  # noqa: E402 (it builds on OwnerFlow, above)

FLOWS = {"bucket": BucketFlow, "owner": OwnerFlow, "aligned": OwnerFlow, "group": GroupFlow}
