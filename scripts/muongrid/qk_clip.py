"""MuonClip's QK-clip on ZeRO-1 and FSDP2 shards: keep every attention head's largest logit under a threshold.

Kimi K2 (Moonshot AI, arXiv 2507.20534, section 2.1) trained with Muon and found attention logits growing
without bound in some heads; its fix, QK-clip, runs after each optimizer step. For every head h whose largest
pre-softmax logit of the step, ``S_h = max_(batch, i, j) q_i . k_j / sqrt(d_head)``, exceeds the threshold
``tau``, it rescales that head's query and key projections: ``gamma_h = tau / S_h``, and both the query rows and
the key rows of head h are multiplied by ``sqrt(gamma_h)`` (the report splits the factor evenly between them for
the head-specific parts; its shared rotary key part, which plain multi-head attention does not have, is left
alone). The head's next logits are then about ``tau``. Heads at or under ``tau`` get a factor of exactly 1.

On shards, with no host sync:

* the model reports each attention layer's per-head maxima as it runs (``clip.record(layer, maxima)``: a
  device tensor over the heads this rank computes; a running max over micro-batches);
* the optimizer packs every layer's maxima into one tensor over the whole model's heads (-inf where this rank
  has none: other TP ranks' heads), all-reduces it once with MAX over the world (DP ranks saw other rows, TP
  ranks other heads), and turns it into factors on the device;
* each rank multiplies the rows it keeps: its ZeRO-1 master pieces (a flat range of a matrix is at most a
  partial row, whole rows and a partial row: three multiplies), or its FSDP2 row blocks, or its TP rows; the
  parameter all-gather then spreads the result as after any step.

Where each head's rows sit is the model's to say (``QKLayer``: the parameter and, per head, its query rows and
its key rows, in the whole matrix's coordinates), so fused QKV, separate projections and TP's head-major rows
are all described the same way. ``lab/charlm.qk_layers`` does it for the book's GPT. ``QKClip(None, layers)``
only watches: the step's maxima are gathered into ``clip.last`` (on the device) and nothing is scaled.

    clip = QKClip(threshold=100.0, layers=charlm.qk_layers(model))
    opt = DistributedMuon(groups, grid, qk_clip=clip)      # the model calls clip.record in its attention
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .comm import Phase
from .placements import local

Rows = tuple[int, int]   # [start, end) rows of the whole matrix


@dataclass(frozen=True)
class QKLayer:
    """One attention layer: the parameter(s) holding its query and key projections, and each head's rows.

    ``q_param``/``k_param``: names (the optimizer's group ``names``; the same name for a fused QKV weight).
    ``q_rows[h]``/``k_rows[h]``: head h's rows in that parameter, in whole-matrix (un-TP-split) coordinates."""

    q_param: str
    k_param: str
    q_rows: tuple[Rows, ...]
    k_rows: tuple[Rows, ...]

    @property
    def heads(self) -> int:
        return len(self.q_rows)


def factors(maxima: torch.Tensor, threshold: float) -> torch.Tensor:
    """Each head's multiplier for its query and key rows: sqrt(tau / S) where S > tau, else exactly 1."""
    gamma = torch.where(maxima > threshold, threshold / maxima, torch.ones_like(maxima))
    return gamma.sqrt()


def kept(step, factor: torch.Tensor) -> torch.Tensor:
    """The factors, or 1 for a step (``step.Step``) that ``check_finite="defer"`` skips (``finite.py``: no host
    read)."""
    return factor if step.keep is None else torch.where(step.keep, factor, 1.0)


def clip_rows_(weight: torch.Tensor, layer: QKLayer, factor: torch.Tensor, which: str) -> None:
    """The single-process reference: multiply ``which`` ("q" or "k") rows of every head of the whole ``weight``."""
    for h, (a, b) in enumerate(layer.q_rows if which == "q" else layer.k_rows):
        weight[a:b].mul_(factor[h])


class QKClip:
    """QK-clip at ``threshold`` over ``layers`` (see the module docstring). The model calls ``record``; the
    optimizer calls ``apply_*`` after its update and before its parameters are gathered."""

    def __init__(self, threshold: float | None, layers: list[QKLayer]):
        if threshold is not None and (not threshold > 0 or math.isinf(threshold)):
            raise ValueError(f"qk_clip threshold must be a positive finite number (or None: watch, never clip), "
                             f"got {threshold}")
        if not layers:
            raise ValueError("QKClip needs at least one QKLayer (which rows are each head's query and key)")
        self.threshold, self.layers = None if threshold is None else float(threshold), list(layers)
        self.offsets = [sum(l.heads for l in self.layers[:i]) for i in range(len(self.layers))]
        self.total = sum(l.heads for l in self.layers)
        self.seen: dict[int, tuple[torch.Tensor, int]] = {}   # layer -> (running max of its local heads, first head)
        self.last: torch.Tensor | None = None                  # the last step's all-reduced maxima (device)

    def record(self, layer: int, maxima: torch.Tensor, first_head: int = 0) -> None:
        """Layer ``layer``'s largest logit per head this forward (heads ``first_head`` on: under TP a rank runs
        a slice of the heads). A running max until the optimizer's step uses and clears it."""
        maxima = maxima.detach().float()
        if layer in self.seen:
            maxima = torch.maximum(self.seen[layer][0], maxima)
        self.seen[layer] = (maxima, first_head)

    def packed(self, device) -> torch.Tensor:
        """This rank's maxima over the whole model's heads, -inf where it saw none."""
        out = torch.full((self.total,), -math.inf, device=device)
        for layer, (maxima, first) in self.seen.items():
            at = self.offsets[layer] + first
            out[at: at + maxima.numel()] = maxima
        return out

    def reduce(self, comm) -> torch.Tensor:
        """The step's maxima, MAX over the world: one all-reduce for the whole model (phase "qk_clip")."""
        maxima = self.packed(comm.grid.device)
        if comm.grid.dp * comm.grid.tp > 1:
            comm.all_reduce(maxima, "world", Phase.QK_CLIP, op=dist.ReduceOp.MAX)
        self.seen, self.last = {}, maxima
        return maxima

    def _row_index(self, name: str, rows: int, first_row: int, device) -> torch.Tensor:
        """Per row of rows ``first_row``..+``rows`` of parameter ``name``: the index of its head's factor in the
        packed maxima, or ``total`` (a constant 1). Made once, when the optimizer binds the clip."""
        index = torch.full((rows,), self.total, dtype=torch.long)
        for i, layer in enumerate(self.layers):
            for param, spans in ((layer.q_param, layer.q_rows), (layer.k_param, layer.k_rows)):
                if param != name:
                    continue
                for h, (a, b) in enumerate(spans):
                    lo, hi = max(a, first_row), min(b, first_row + rows)
                    if lo < hi:
                        index[lo - first_row: hi - first_row] = self.offsets[i] + h
        return index.to(device)

    def _check_names(self, named: dict) -> None:
        for name in sorted(self.names()):
            if name not in named:
                raise ValueError(f"QK-clip: no parameter named {name!r} in the optimizer (its groups' names: "
                                 f"{sorted(named)[:6]}...); give the QKLayer the names the groups use")
        for layer in self.layers:
            for name, spans in ((layer.q_param, layer.q_rows), (layer.k_param, layer.k_rows)):
                full = named[name]
                if any(not 0 <= a < b <= full for a, b in spans):
                    raise ValueError(f"QK-clip: rows {list(spans)} of {name!r} fall outside its {full} rows")

    def names(self) -> set[str]:
        return {n for layer in self.layers for n in (layer.q_param, layer.k_param)}

    # ---- the optimizers --------------------------------------------------------------------------------

    def bind_zero1(self, opt) -> None:
        """``DistributedMuon`` / ``DistributedAdamW``, when built: where each of this rank's master pieces of the
        query and key parameters starts, and its rows' factor indices (on the device, made now: no copy in a step)."""
        named = {n: meta.full_shape[0] for g, group in enumerate(opt.param_groups)
                 for n, meta in zip(group["names"], opt.plan.metas[g])}
        self._check_names(named)
        self.pieces = []
        for g, group in enumerate(opt.param_groups):
            for name, p, meta in zip(group["names"], group["params"], opt.plan.metas[g]):
                if name not in self.names() or not meta.local_numel:
                    continue
                if meta.tp_split_dim == 1:
                    raise ValueError(f"QK-clip: parameter {name!r} is split over TP by columns; query and key "
                                     "projections split by rows (ColwiseParallel) or replicated are supported")
                rows, cols = meta.shape[0], math.prod(meta.shape[1:])
                first = opt.grid.tp_rank * rows if meta.tp_split_dim == 0 else 0
                index = self._row_index(name, rows, first, opt.grid.device)
                self.pieces.append((p, index, meta.local_range[0] - meta.global_range[0], cols))

    def apply_zero1(self, opt, step) -> None:
        """After the update, before the all-gather: scale the master pieces of the query and key rows."""
        maxima = self.reduce(opt.comm)
        if self.threshold is None:
            return
        factor = kept(step, torch.cat([factors(maxima, self.threshold), torch.ones(1, device=opt.grid.device)]))
        for p, index, start, cols in self.pieces:
            _scale_flat_rows_(opt.state[p]["master"], factor[index], start, cols)

    def bind_fsdp(self, opt) -> None:
        """``FSDPMuon``, when built: each query and key parameter's row block on this rank and its rows' factor
        indices."""
        named = {n: p.shape[0] for group in opt.param_groups for n, p in zip(group["names"], group["params"])}
        self._check_names(named)
        self.blocks = []
        for group in opt.param_groups:
            for name, p in zip(group["names"], group["params"]):
                if name in self.names():
                    rows = local(p.data).shape[0]
                    self.blocks.append((p, self._row_index(name, rows, _fsdp_first_row(p), opt.grid.device)))

    def apply_fsdp(self, opt, step) -> None:
        """After the update: scale this rank's row block of each query and key parameter (FSDP2's Shard(0))."""
        maxima = self.reduce(opt.comm)
        if self.threshold is None:
            return
        factor = kept(step, torch.cat([factors(maxima, self.threshold), torch.ones(1, device=opt.grid.device)]))
        for p, index in self.blocks:
            block = local(p.data)
            block.mul_(factor[index].view(-1, *[1] * (block.dim() - 1)))


def _scale_flat_rows_(piece: torch.Tensor, scale: torch.Tensor, start: int, cols: int) -> None:
    """Multiply the flat ``piece`` (elements ``start``.. of a row-major matrix with ``cols`` columns) by its rows'
    ``scale``: a partial first row, whole rows, a partial last row (at most three multiplies)."""
    n, done = piece.numel(), 0
    while done < n:
        row, col = divmod(start + done, cols)
        if col or n - done < cols:                       # part of one row
            k = min(cols - col, n - done)
            piece[done: done + k].mul_(scale[row])
            done += k
        else:                                            # as many whole rows as there are
            rows = (n - done) // cols
            piece[done: done + rows * cols].view(rows, cols).mul_(scale[row: row + rows].unsqueeze(1))
            done += rows * cols


def _fsdp_first_row(p) -> int:
    """The first row of the whole matrix in this rank's FSDP2 block (Shard(0), torch's uneven chunks)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    _, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return offset[0]
