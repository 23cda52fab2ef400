"""How a Muon group's momentum pieces become this rank's pieces of the orthogonalised update: one flow per layout.

A flow is built from the plan, the grid, the ``Comm`` and the ``FlowOptions`` (never the optimizer); its ``run``
takes, bucket by bucket, this rank's momentum pieces (fp32, flat; None: skipped), the options and the step
(``step.Step``: each matrix orthogonalised here is noted in ``step.ran``), and yields this rank's piece of each
matrix's orthogonalised update. ``BucketFlow`` ("bucket", the proof of concept's) is here,
``OwnerFlow`` ("owner", "aligned", "group") in ``owner_flow.py``. Chapter 5 walks the bucket flow, chapter 8 the
others: ``python -m pytest -q tests/test_distributed.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch
from torch.profiler import record_function

from .comm import Pending, Phase
from .newton_schulz import NS_FORM, ns_flops, zeropower_ns5
from .owner_routes import PREFETCH_CHUNKS, exchanges  # noqa: F401 (PREFETCH_CHUNKS: chunks' default, named here)
from .plan import Bucket, DistMeta
from .sharding import bucket_matrix, copy_all, dp_shard_of, local_shard, tp_shard, tp_unshard

Updates = Iterable[tuple[Bucket, list]]           # (bucket, my momentum-updated piece of each of its matrices)
# (matrix, my piece of its orthogonalised update): flat, the TP-local matrix itself, or (owner flow, a transposed
# result) a list of (offset in the piece, 2-D view) rectangles (owner_flow._block_piece), which Applier.add unpacks
Pieces = Iterator[tuple[DistMeta, "torch.Tensor | list[tuple[int, torch.Tensor]]"]]


OVERLAP_MODES = ("none", "naive", "prefetch")


@dataclass(frozen=True)
class FlowOptions:
    """What a flow is told, per run. ``overlap``, how transfers meet Newton-Schulz (the same parameters bit for
    bit): "none" finishes each exchange in turn, "naive" waits at once on ``async_op=True`` collectives,
    "prefetch" starts every transfer before orthogonalising, in ``chunks`` exchanges per direction. ``ns_batch``:
    one batched Newton-Schulz per shape on its owner. ``trace``: None, or ``trace(stage, name, tensor)``."""

    overlap: str = "none"
    chunks: int | None = None
    ns_batch: bool = False
    trace: Callable | None = None

    def __post_init__(self):
        if self.overlap not in OVERLAP_MODES:
            raise ValueError(f"overlap must be one of {OVERLAP_MODES}, got {self.overlap!r}")
        if self.chunks is not None and (not isinstance(self.chunks, int) or isinstance(self.chunks, bool)
                                        or self.chunks < 1):
            raise ValueError(f"chunks must be a whole number >= 1 (exchanges per direction), got {self.chunks!r}")

    @property
    def exchanges(self) -> int:
        """K, the exchanges per direction of the owner layouts: 1 without prefetch."""
        return exchanges(self.overlap, self.chunks)


class Flow:
    """What every flow shares: Newton-Schulz with its bookkeeping, the trace, a bucket's flat bf16 shard."""

    lazy = True   # makes its results bucket by bucket as they are consumed (so it is fed that way too)

    def __init__(self, plan, grid, comm, muon: list[bool] | None = None, options: FlowOptions | None = None):
        self.plan, self.grid, self.comm = plan, grid, comm
        self.muon = [True] * len(plan.buckets) if muon is None else list(muon)   # which groups are Muon's
        self.options = options or FlowOptions()   # as built; each ``run`` is told its own (the trace may change)

    def newton_schulz(self, group: dict, matrix: torch.Tensor, metas, ran: set) -> torch.Tensor:
        """One Newton-Schulz call: a matrix, or a batch of same-shape matrices (counted as one call); ``metas``:
        the matrices it is, noted in ``ran`` (the step's: the optimizer's guard checks them against the plan)."""
        ran.update((m.group_idx, m.param_idx) for m in metas)
        form = group.get("ns_form", NS_FORM)
        with record_function("muon:newton_schulz"):  # it checks the shape first (the PoC's bug #2: a flat view)
            out = zeropower_ns5(matrix, group["ns_steps"], group["ns_coefficients"], group["eps"], form=form)
        self.comm.ledger.count_ns(ns_flops(*matrix.shape[-2:], group["ns_steps"], form) *
                                  (matrix.shape[0] if matrix.ndim == 3 else 1))
        return out

    def trace(self, stage: str, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if self.options.trace is not None:
            self.options.trace(stage, name, tensor)
        return tensor

    def flat_shard(self, bucket: Bucket, pieces: list, out: torch.Tensor) -> torch.Tensor:
        """The pieces laid out as this rank's flat shard of the bucket in ``out`` (kept between steps; zeros where
        a matrix is skipped and in the padding): one copy, the cast to ``out``'s dtype included."""
        metas, flat = self.plan.metas[bucket.group_idx], out.zero_()
        pairs = [(local_shard(flat, self.plan, metas[i]), piece) for i, piece in zip(bucket.param_indices, pieces)
                 if piece is not None and piece.numel()]
        copy_all([d for d, _ in pairs], [s for _, s in pairs])
        return self.trace("momentum_shard", f"bucket {bucket.group_idx}.{bucket.bucket_idx}", flat)


class BucketFlow(Flow):
    """Every rank gathers whole buckets over DP and every matrix over TP, and orthogonalises it.

    The gathers write into buffers made once from the plan, taken in turn: ``POOL`` bf16 slots of the biggest
    Muon bucket for the DP gather (in place: this rank's pieces go to its own shard of the slot) and as many of
    ``tp`` times that for the TP gathers. ``POOL`` gathered buckets can be in use at once: two with prefetch,
    plus the one before them whose results the optimizer may not have applied yet."""

    POOL = 3

    def __init__(self, plan, grid, comm, muon: list[bool] | None = None, options: FlowOptions | None = None):
        super().__init__(plan, grid, comm, muon, options)
        sizes = [b.padded_numel for g, buckets in enumerate(self.plan.buckets) if self.muon[g] for b in buckets]
        n, slots, device = max(sizes, default=0), min(self.POOL, len(sizes)), self.grid.device
        self.gathered = [torch.zeros(n, dtype=torch.bfloat16, device=device) for _ in range(slots)]
        tp_split = any(m.tp_split_dim != -1 for g, metas in enumerate(self.plan.metas) if self.muon[g]
                       for m in metas)
        self.tp_gathered = [torch.empty(self.grid.tp * n if self.grid.tp > 1 and tp_split else 0,
                                        dtype=torch.bfloat16, device=device) for _ in range(slots)]
        self._turn = 0

    def run(self, group: dict, updates: Updates, options: FlowOptions, step) -> Pieces:
        """With prefetch, the next bucket's DP gather travels while this one is
        orthogonalised: at most two gathered buckets are alive at once."""
        self.options = options
        prefetch = options.overlap == "prefetch"
        in_flight, n, r = [], None, self.grid.dp_rank
        for bucket, pieces in updates:
            # stage 3: DP gather (bf16, the whole bucket), in place, in the pool's next slot
            slot, n = self._turn % len(self.gathered), bucket.shard_numel
            self._turn += 1
            full = self.gathered[slot][:bucket.padded_numel]
            self.flat_shard(bucket, pieces, out=full[r * n: (r + 1) * n])
            gather = self.comm.all_gather_into_async(full, r, "dp", Phase.NS_GATHER_DP,
                                                     wait_now=not prefetch)
            in_flight.append((bucket, gather, self.tp_gathered[slot]))
            if len(in_flight) > (1 if prefetch else 0):
                yield from self._orthogonalise_bucket(group, step.ran, *in_flight.pop(0))
        for item in in_flight:
            yield from self._orthogonalise_bucket(group, step.ran, *item)

    def _orthogonalise_bucket(self, group: dict, ran: set, bucket: Bucket, gather: Pending,
                              tp_out: torch.Tensor) -> Pieces:
        """TP gather, Newton-Schulz, TP shard and DP shard for every matrix of a
        gathered bucket. Every TP gather is started first (into ``tp_out``, one
        region per matrix), so with prefetch later matrices travel while earlier
        ones are computed."""
        trace, tp = self.trace, self.grid.tp
        name = f"bucket {bucket.group_idx}.{bucket.bucket_idx}"
        bucket_update = trace("dp_gathered", name, gather.wait())
        metas = self.plan.metas[bucket.group_idx]
        matrices, at = [], 0
        for i in bucket.param_indices:
            meta = metas[i]
            matrix = self.unpack_ns_input(bucket_update, bucket, meta)
            matrix = trace("ns_input", meta.name, matrix)
            if meta.tp_split_dim != -1 and tp > 1:               # stage 4: TP gather
                out, at = tp_out[at: at + tp * matrix.numel()], at + tp * matrix.numel()
                matrix = self.comm.all_gather_async(
                    matrix, "tp", Phase.NS_GATHER_TP, out=out,
                    wait_now=self.options.overlap != "prefetch")
            matrices.append((meta, matrix))
        for meta, matrix in matrices:
            if isinstance(matrix, Pending):
                matrix = tp_unshard(matrix.wait(), meta, tp)
                matrix = trace("tp_gathered", meta.name, matrix)
            ortho = self.newton_schulz(group, matrix, [meta], ran)  # stage 5: Newton-Schulz
            ortho = trace("orthogonalised", meta.name, ortho)
            # stage 6: this TP rank's slice of the result, then this DP rank's part of it
            tp_part = trace("tp_shard", meta.name, self.my_tp_part(ortho, meta))
            yield meta, trace("dp_shard", meta.name, dp_shard_of(tp_part, meta))

    def my_tp_part(self, ortho: torch.Tensor, meta: DistMeta) -> torch.Tensor:
        """This TP rank's slice of an orthogonalised matrix (``tp_shard``, without its copy when unsplit)."""
        split = meta.tp_split_dim != -1 and self.grid.tp > 1
        return tp_shard(ortho, meta.tp_split_dim, self.grid.tp, self.grid.tp_rank, meta.name) if split else ortho

    def unpack_ns_input(self, bucket_update: torch.Tensor, bucket: Bucket, meta: DistMeta) -> torch.Tensor:
        """A matrix's TP-local block of the gathered bucket, as a matrix (the PoC's bug #2 was a flat view)."""
        return bucket_matrix(bucket_update, bucket, meta)


