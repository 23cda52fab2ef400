"""Optimizer-state metrics for Muon matrices, computed where Newton-Schulz runs, reported as scalars.

    metrics = NSMetrics(opt)        # hooks the optimizer's trace (DistributedMuon.trace)
    metrics.active = True           # for the steps you want measured (say every K steps)
    opt.step()
    rows = metrics.take()           # {matrix name: {...}} on the rank(s) that ran Newton-Schulz

Per Muon matrix (``ns_metrics``, pure):

* ``momentum_norm``: Frobenius norm of the matrix Newton-Schulz receives (Muon's momentum, blended
  with the gradient when Nesterov is on);
* ``update_rms``: RMS of the orthogonalised update times the per-matrix lr factor
  (``adjust_lr(lr, shape) / lr``), the update before the learning rate; with Moonshot's
  "match_rms_adamw" it sits near 0.2, AdamW's typical update RMS;
* ``in_*`` and ``out_*``: the spread of the singular values before and after Newton-Schulz:
  ``effective_rank`` (exp of the entropy of the normalised singular values, Roy and Vetterli
  2007: equal to the rank when all are equal, 1 when one dominates) and ``top_median`` (the
  largest over the median). Momentum is skewed (few large directions); NS5 flattens the
  spectrum into roughly [0.7, 1.2], so after it the effective rank is near min(A, B).

Where: under the "bucket" layout every rank orthogonalises every matrix, so rank 0 alone measures;
under "owner" and "aligned" each matrix's owner does. Only these scalars cross the network (the
caller gathers the dicts), so the metrics move no matrix. The singular values cost an SVD per matrix
per measured step: measure every K steps, not every step.

Under "group" a matrix orthogonalised by a group is seen by each member as one block of its long side.
The singular values of X = [X_1 ... X_k] are the square roots of the eigenvalues of the short side's
Gram matrix X X^T = sum_i X_i X_i^T, so each member reports its partial Gram matrices of the input and the
output (m x m, float64, m the short side) and ``merge`` sums them and finishes the row (``ns_metrics_gram``):
for such a matrix an m x m matrix per member crosses the network once per measured step, not the matrix.

    rows = merge(comm.gather_objects(metrics.take(), "metrics"))
"""
from __future__ import annotations

import math

import torch

from ..updates import adjust_lr


def spectrum_stats(s: torch.Tensor) -> dict:
    """Effective rank and largest/median of singular values ``s`` (non-negative, any order)."""
    s = s.double().clamp_min(0)
    total = s.sum()
    if total == 0:
        return dict(effective_rank=0.0, top_median=float("nan"))
    p = s / total
    entropy = -(p[p > 0] * p[p > 0].log()).sum()
    median = s.median()
    return dict(effective_rank=math.exp(entropy.item()),
                top_median=(s.max() / median).item() if median > 0 else float("inf"))


def ns_metrics(before: torch.Tensor, after: torch.Tensor, lr_factor: float) -> dict:
    """Scalars describing one Newton-Schulz call: ``before`` its input, ``after`` its output (same shape)."""
    if before.shape != after.shape or before.ndim != 2:
        raise ValueError(f"Newton-Schulz input {tuple(before.shape)} and output {tuple(after.shape)} must be the "
                         "same 2-D shape")
    b, a = before.float(), after.float()
    s_in, s_out = torch.linalg.svdvals(b), torch.linalg.svdvals(a)
    row = dict(momentum_norm=b.norm().item(), update_rms=(a.pow(2).mean().sqrt() * lr_factor).item())
    row.update({f"in_{k}": v for k, v in spectrum_stats(s_in).items()})
    row.update({f"out_{k}": v for k, v in spectrum_stats(s_out).items()})
    return row


def ns_metrics_gram(gram_in: torch.Tensor, gram_out: torch.Tensor, numel: int, lr_factor: float) -> dict:
    """``ns_metrics`` from the short side's Gram matrices of the input and the output (X X^T, m x m) and the
    matrix's element count: singular values are the square roots of the Gram's eigenvalues (clamped at 0)."""
    s_in, s_out = (torch.linalg.eigvalsh(g.double()).clamp_min(0).sqrt() for g in (gram_in, gram_out))
    row = dict(momentum_norm=float(gram_in.double().trace().clamp_min(0).sqrt()),
               update_rms=float((gram_out.double().trace().clamp_min(0) / numel).sqrt()) * lr_factor)
    row.update({f"in_{k}": v for k, v in spectrum_stats(s_in).items()})
    row.update({f"out_{k}": v for k, v in spectrum_stats(s_out).items()})
    return row


def short_gram(block: torch.Tensor, full_shape) -> torch.Tensor:
    """A block's share of the whole matrix's short-side Gram matrix (float64): X_i X_i^T for a block of
    columns of a wide matrix, X_i^T X_i for a block of rows of a tall one."""
    b = block.double()
    return b @ b.T if full_shape[0] <= full_shape[1] else b.T @ b


def merge(per_rank: list[dict]) -> dict:
    """Every rank's ``take()`` into one row per matrix: whole rows as they are, a grouped matrix's partial
    Gram matrices summed over its members and finished (``ns_metrics_gram``)."""
    rows, partial = {}, {}
    for rank_rows in per_rank:
        for name, row in rank_rows.items():
            if "gram_in" not in row:
                rows[name] = row
                continue
            seen = partial.setdefault(name, dict(row, gram_in=0, gram_out=0))
            seen["gram_in"] = seen["gram_in"] + row["gram_in"]
            seen["gram_out"] = seen["gram_out"] + row["gram_out"]
    for name, p in partial.items():
        rows[name] = ns_metrics_gram(p["gram_in"], p["gram_out"], p["numel"], p["lr_factor"])
    return rows


class NSMetrics:
    """Collects ``ns_metrics`` for every Muon matrix orthogonalised on this rank while ``active``.

    It uses the optimizer's trace hook: the last "ns_input" or "tp_gathered" tensor of a matrix is
    its whole Newton-Schulz input, "orthogonalised" its output (see ``flows.py``)."""

    def __init__(self, opt):
        self.active = False
        self._inputs: dict[str, torch.Tensor] = {}
        self._rows: dict[str, dict] = {}
        self._factor = {name: (group["adjust_lr"]) for group in opt.param_groups if group["use_muon"]
                        for name in group["names"]}
        self._measures = opt.layout != "bucket" or opt.grid.rank == 0
        self._shapes = {m.name: m.full_shape for buf in opt.plan.metas for m in buf}
        previous = opt.trace

        def hook(stage, name, tensor):
            if previous is not None:
                previous(stage, name, tensor)
            self._observe(stage, name, tensor)

        opt.trace = hook

    def _observe(self, stage: str, name: str, tensor: torch.Tensor) -> None:
        if not (self.active and self._measures and name in self._factor):
            return
        if stage in ("ns_input", "tp_gathered"):
            self._inputs[name] = tensor
        elif stage == "orthogonalised":
            before = self._inputs.pop(name)
            factor = adjust_lr(1.0, tuple(tensor.shape), self._factor[name])
            self._rows[name] = ns_metrics(before, tensor, factor)
        elif stage == "group_ns_input":
            self._inputs[name] = tensor
        elif stage == "group_orthogonalised":   # my block of a grouped matrix: partial Gram matrices (``merge``)
            shape = self._shapes[name]
            self._rows[name] = dict(gram_in=short_gram(self._inputs.pop(name), shape),
                                    gram_out=short_gram(tensor, shape), numel=shape[0] * shape[1],
                                    lr_factor=adjust_lr(1.0, tuple(shape), self._factor[name]))

    def take(self) -> dict:
        """The rows measured since the last call (and forget them); combine the ranks' with ``merge``."""
        rows, self._rows, self._inputs = self._rows, {}, {}
        return rows
