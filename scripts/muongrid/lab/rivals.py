"""Other distributed Muon implementations' traffic per optimizer step, as closed forms (pure Python).

Chapter 16 sets these beside ``costmodel`` (the closed form the ledger is tested against) for the same
matrices and the same ranks. Every function returns a dict: phase -> elements one rank sends per step,
averaged over all ranks, and ``"total"``. Elements, not bytes: each implementation picks its own dtypes,
and the chapter states them where it turns elements into bytes.

Conventions, the same as the ledger's where both count the same thing:

* a ring all-gather or reduce-scatter of a tensor of ``P`` elements over ``n`` ranks: each rank sends
  ``(n - 1) / n * P``;
* a pipelined broadcast or reduce of ``P`` elements over ``n`` ranks: every rank but one forwards the
  tensor once, ``(n - 1) * P`` in all, so ``(n - 1) / n * P`` per rank on average (the convention of
  DMuon's own cost page);
* an all-to-all: what leaves a rank (its block for itself stays).

Sources, each read at one commit; the formulas below are written from the algorithms as their code and
documents describe them, not copied:

* X-Square-Robot/dmuon 0.2.0 (commit f002f24): ``docs/reference/communication-cost.md`` states the DDP,
  DMuon-Z2, DMuon-Z3 and naive FSDP2 + Muon volumes and an HSDP table (``dmuon`` and ``naive_fsdp2_muon``
  with ``as_documented=True`` reproduce them); ``docs/design/architecture.md`` and
  ``dmuon/_backends/fsdp2/group.py`` describe who sends what (reduce to the owner, broadcast from it,
  HSDP's second stage only in the owner's shard column), from which ``dmuon`` derives the mean over all
  ranks; ``docs/guides/tp-support.md`` describes the TP path (``dmuon_tp``, derived).
* microsoft/dion (commit 0a059a4), ``dion/megabatch_base.py``: every parameter of one shape in one batch,
  padded with zero matrices to a multiple of the world size and each shard's rows to ``ceil(rows / n)``,
  one all-to-all there and one back (``dion_megabatch``, derived).
* pytorch/torchtitan (commit b5bcd76), ``torchtitan/distributed/flex_shard/``: ``Owned`` moves each
  matrix's storage shards to one rank and back with packed all-to-alls (``row_shard_owner_all_to_all``,
  derived; FSDPMuon's pieces are the same).
* NVIDIA/Megatron-LM (commit d98e8a6) ``megatron/core/optimizer/layer_wise_optimizer.py`` with
  NVIDIA-NeMo/Emerging-Optimizers (commit fd77292) ``orthogonalized_optimizers/muon_utils.py``
  (``newton_schulz_tp``): whole matrices per DP rank, and under TP either an all-gather of the matrix
  ("duplicated") or one Gram all-reduce per Newton-Schulz step ("distributed") (``megatron_tp``, derived).

    >>> dmuon(1000, 4, "z3")["total"], dmuon(1000, 4, "ddp")["total"]
    (2250.0, 1500.0)
"""
from __future__ import annotations

from collections import Counter

DMUON_MODES = ("ddp", "z2", "z3")
MEGATRON_TP_MODES = ("duplicated", "distributed")


def _share(n: int) -> float:
    """(n - 1) / n: what one rank sends, on average, of a tensor a ring or pipeline moves over n ranks."""
    if n < 1:
        raise ValueError(f"a group has at least one rank, got {n}")
    return (n - 1) / n


def _with_total(phases: dict) -> dict:
    return dict(phases, total=sum(phases.values()))


def dmuon(p: int, n: int, mode: str = "z3", replicate: int = 1, as_documented: bool = False) -> dict:
    """X-Square's DMuon: elements per rank per step for ``p`` Muon elements on a shard group of ``n``
    ranks (and, with ``replicate`` = R > 1, HSDP's R replicas of it: n x R ranks).

    ``mode``: "ddp" (its DDP backend: reduce the gradient to the owner, broadcast the new parameter
    from it), "z2" (FSDP2 beside it, ``reshard_after_forward=False``: forward broadcast, backward
    reduce), "z3" (the default: also a second broadcast in backward, since the parameter was freed
    after forward). Each is ``(n - 1) / n * p`` per transfer.

    HSDP adds a reduce and a broadcast over the replicate group, run only in the owner's shard column
    (one rank in n per replica row takes part for a given matrix): averaged over all n x R ranks,
    ``(R - 1) / (n R) * p`` each. DMuon's page writes ``(R - 1) / R * p`` each (``as_documented=True``),
    the traffic of a rank that took part for every matrix."""
    if mode not in DMUON_MODES:
        raise ValueError(f"mode must be one of {DMUON_MODES}, got {mode!r}")
    if mode == "ddp" and replicate > 1:
        raise ValueError("DMuon's HSDP path is its FSDP2 backend: use mode 'z2' or 'z3' with replicate > 1")
    share = _share(n) * p
    phases = {"ddp": dict(reduce_to_owner=share, broadcast_from_owner=share),
              "z2": dict(forward_broadcast=share, backward_reduce=share),
              "z3": dict(forward_broadcast=share, backward_rebroadcast=share, backward_reduce=share)}[mode]
    if replicate > 1:
        column = _share(replicate) * p * (1 if as_documented else 1 / n)
        phases.update(replicate_reduce=column, replicate_broadcast=column)
    return _with_total(phases)


def naive_fsdp2_muon(p: int, n: int, reshard: bool = True) -> dict:
    """FSDP2 plus a Muon that gathers every matrix on every rank for Newton-Schulz, as DMuon's page counts
    it: FSDP2's forward all-gather, its backward all-gather when it reshards after forward, its gradient
    reduce-scatter, and one more all-gather in the optimizer; ``(n - 1) / n * p`` each."""
    return _with_total(dict(fsdp2(p, n, reshard), optimizer_all_gather=_share(n) * p))


def fsdp2(p: int, n: int, reshard: bool = True) -> dict:
    """FSDP2's own collectives on ``p`` elements over ``n`` ranks, by its definition: the forward
    all-gather, the backward all-gather (only when it reshards after forward), the gradient
    reduce-scatter. Padding of uneven shards is left out."""
    share = _share(n) * p
    phases = dict(forward_all_gather=share)
    if reshard:
        phases["backward_all_gather"] = share
    phases["backward_reduce_scatter"] = share
    return phases


def _numel(shape: tuple[int, int]) -> int:
    return shape[0] * shape[1]


def row_shard_owner_all_to_all(shapes: list[tuple[int, int]], n: int) -> dict:
    """Each matrix held as FSDP2 row blocks over ``n`` ranks is sent to one owner and comes back: the
    owner keeps its own block, every other rank sends its block there and gets it back. With rows that
    divide by ``n`` every block is ``numel / n`` whoever owns it, so per rank on average
    ``(n - 1) / n^2 * numel`` each way (torchtitan's ``Owned`` and muongrid's ``FSDPMuon`` alike).
    Uneven rows make it depend on the owner: refused here (``choice.fsdp2_extra`` prices our owners)."""
    uneven = [s for s in shapes if s[0] % n]
    if uneven:
        raise ValueError(f"rows of {uneven[:3]} do not divide by {n}: the bytes then depend on who owns what")
    each_way = sum(_share(n) * _numel(s) / n for s in shapes)
    return _with_total(dict(to_owner=each_way, from_owner=each_way))


def chunk_rows(rows: int, n: int) -> list[int]:
    """Rows of each of ``n`` ranks under FSDP2's ``Shard(0)`` (``torch.chunk``): ``ceil(rows / n)`` each,
    the last ranks fewer, maybe none."""
    size = -(-rows // n)
    return [max(0, min(rows, (r + 1) * size) - r * size) for r in range(n)]


def dion_megabatch(shapes: list[tuple[int, int]], n: int) -> dict:
    """microsoft/dion's Muon on FSDP2 row shards: per distinct shape, one all-to-all there and one back.

    The ``c`` matrices of a shape are padded with zero matrices to ``k * n`` (``k = ceil(c / n)``), and
    every rank's block to ``ceil(rows / n)`` rows, so each rank sends each other rank ``k`` blocks of
    the same size; matrix ``i`` of the padded list goes to rank ``i // k``. The zeros travel too:
    ``padding`` is the part of ``total`` that is zero matrices or zero rows."""
    if n < 1:
        raise ValueError(f"a group has at least one rank, got {n}")
    each_way = zeros = 0
    for (rows, cols), count in Counter(map(tuple, shapes)).items():
        k = -(-count // n)
        block = -(-rows // n) * cols
        held = chunk_rows(rows, n)
        sent = (n - 1) * k * block * n                       # every rank, to the n - 1 others
        real = sum(held[s] * cols for i in range(count) for s in range(n) if s != i // k)
        each_way += sent / n
        zeros += (sent - real) / n
    return dict(to_owner=each_way, from_owner=each_way, total=2 * each_way, padding=2 * zeros)


def dmuon_tp(p: int, n: int, t: int, mode: str = "z2") -> dict:
    """DMuon with tensor parallelism (``docs/guides/tp-support.md``), for ``p`` Muon elements (full
    matrices, every one split over TP) on ``n`` DP x ``t`` TP ranks. Each TP rank's shard of a matrix is
    dedicated over DP as without TP (``dmuon(p / t, n, mode)``); at the step, the DP owners of a
    matrix's ``t`` shards gather them to one TP owner (``dist.gather``), which runs Newton-Schulz on the
    whole matrix and scatters the update back (``dist.scatter``): ``(t - 1) / t`` of the matrix each
    way, by t of the n x t ranks, so ``(t - 1) / (n t^2) * p`` per rank on average, each way."""
    phases = {k: v for k, v in dmuon(p / t, n, mode).items() if k != "total"}
    tp_each = (t - 1) / (n * t * t) * p
    return _with_total(dict(phases, tp_gather=tp_each, tp_scatter=tp_each))


def megatron_tp(shapes: list[tuple[int, int]], n: int, t: int, split_dims: list[int], tp_mode: str = "duplicated",
                steps: int = 5) -> dict:
    """Megatron-LM's layer-wise optimizer with Emerging-Optimizers' ``TensorParallelMuon`` on ``n`` DP x
    ``t`` TP ranks, for full matrices ``shapes`` split over TP along ``split_dims`` (0 or 1 each).

    Over DP (layer-wise): gradients reduce-scattered and parameters all-gathered in buckets whose shards
    hold whole matrices, ``(n - 1) / n`` of each TP rank's ``p / t`` each way (shard padding left out).
    Over TP, only the TP group of the matrix's DP owner works on it (t of the n x t ranks):
    "duplicated" all-gathers the matrix (each of the t sends ``(t - 1) / t`` of it), every one of them
    runs Newton-Schulz on it whole; "distributed" keeps the shards and all-reduces, per Newton-Schulz
    step, the Gram matrix of the dimension that is not split (``d x d``: ``2 (t - 1) / t * d^2`` per
    member), and once the squared norm (one element)."""
    if tp_mode not in MEGATRON_TP_MODES:
        raise ValueError(f"tp_mode must be one of {MEGATRON_TP_MODES}, got {tp_mode!r}")
    if len(split_dims) != len(shapes) or any(d not in (0, 1) for d in split_dims):
        raise ValueError("give one TP split dim, 0 or 1, per matrix")
    p = sum(map(_numel, shapes))
    dp = _share(n) * p / t
    if tp_mode == "duplicated":
        tp_part = sum(t * _share(t) * _numel(s) for s in shapes) / (n * t)
        name = "tp_all_gather"
    else:
        tp_part = sum(t * 2 * _share(t) * (steps * s[1 - d] ** 2 + 1) for s, d in zip(shapes, split_dims)) / (n * t)
        name = "tp_gram_all_reduce"
    return _with_total({"grad_reduce_scatter": dp, "param_all_gather": dp, name: tp_part})
