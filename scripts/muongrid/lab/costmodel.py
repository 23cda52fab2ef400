"""Closed-form communication of one optimizer step, per rank: bytes for every layout, and time under an alpha-beta model.

The geometry (buckets, shard cuts, padding, pieces, owners) is read from the plan
(``muongrid.plan.build_plan``), the same one the engine uses; the byte formulas below are written
here, from the algorithm's definition, and never from what the engine sent, so that "the ledger
equals the closed form" (a test on every grid and layout) checks the engine's traffic.

Ring collectives over ``n`` ranks move ``(n - 1) * shard`` elements per rank for an all-gather or
a reduce-scatter. For each bucket with shards of ``s`` elements (the largest shard; shorter ones
travel padded):

    grad reduce-scatter (fp32)     (dp - 1) * s * 4          both optimizers, every layout
    param all-gather     (fp32)    (dp - 1) * s * 4          both optimizers, every layout
                         (bf16)    (dp - 1) * s * 2          the same, parameters held in bf16 (``param_bytes=2``)

and, for Muon's Newton-Schulz, by layout:

    bucket   NS gather over DP (bf16)   (dp - 1) * s * 2         every Muon bucket
             NS gather over TP (bf16)   (tp - 1) * m * 2         every matrix split over TP (m: TP-local size)
    owner,   to owner (bf16)            my piece of each matrix owned by another rank, if I send it
    aligned  from owner (bf16)          for each matrix I own, every other rank's piece of it

    group    to the group, from the group   as owner, per member: my piece's elements in member i's
             (bf16)                      block of the long side (``group_routes.count_in_band``)
             the group's own collectives, per member and run, in the form with fewer bytes
             (``ns_group.group_form``), phase ns_group_gram:
             Gram form: all-reduces (fp32)   2 (k - 1) * 4 * (1 + steps * ceil(m^2 / k))
                        B all-gathers (bf16) steps * (k - 1) * 2 * ceil(m / k) * m
             row form:  all-gathers (bf16)   (k - 1) * 2 * (ceil(n / k) * m + steps * ceil(m / k) * (m + n))

(a matrix replicated over TP is sent to its owner, or member, by the TP rank of the receiver only,
and comes back to every rank; k is the group's size, m the matrix's short side, n its long side). So on a DP-only grid a Muon bucket costs (4 + 2 + 4) / (4 + 4) = 1.25 x an AdamW
bucket under the bucket layout, the paper's upper bound, exactly, padding or not (with bf16 parameters,
whose fp32 masters stay home, (4 + 2 + 2) / (4 + 2) = 1.33); the owner layout
moves only the pieces that are not already on a matrix's owner, twice (there and back); the
aligned layout moves nothing over DP, but its uneven shards pad the reduce-scatter and all-gather.

``dp_gather_bytes`` prices the DP gather alone under three idealised variants, for the book's
argument about the bound: the whole bucket (what the bucket layout does), only the matrices that
straddle a shard boundary, or none.

torch's own data-parallel paths, priced with the same ring convention (``comm.ring_bytes``), so a DDP user's
options sit beside ours (``scripts/iteration_bench.py`` counts them; chapter 13 compares them):

    DDP all-reduce (fp32)       2 (dp - 1) ceil(b / dp) * 4 per gradient bucket of b elements, under backward
    ZeRO broadcast (fp32)       every parameter from its owner, its whole size on every rank (the ledger charges a
                                broadcast in full to each rank of the ring); owners chosen "sorted-greedy"
                                (``zero_partition``), by elements, not by Newton-Schulz FLOPs; DDP also
                                broadcasts the module's buffers from rank 0 at every forward (``broadcast_bytes``)
    our step's ballot (int32)   one MAX all-reduce of one int per parameter, two with a NaN/Inf check (phase
                                "contract", which ``step_bytes`` leaves out)

Time: a ring collective over ``n`` ranks takes ``(n - 1) * (alpha + shard_bytes / beta)``
(``alpha`` the per-hop latency, ``beta`` the bandwidth); an all-reduce twice that. Gloo runs a
reduce-scatter as an all-reduce of the whole input; ``Comm`` runs an all-to-all there instead (the ring's
bytes, (n - 1) messages of a shard), which the ring form prices. ``gloo_reduce_scatter=True`` prices gloo's own.
"""
from __future__ import annotations

from ..group_routes import count_in_band, local_band, long_bounds
from ..newton_schulz import NS_FORM, NS_STEPS
from ..ns_gram_group import gram_sharded_bytes
from ..ns_group import group_form
from ..plan import ParamSpec, build_plan

GRAD_BYTES, NS_BYTES, PARAM_BYTES = 4, 2, 4
PHASES = ("grad_reduce_scatter", "ns_gather_dp", "ns_gather_tp", "ns_to_owner", "ns_group_gram", "ns_from_owner",
          "param_all_gather")
GRAM_BYTES, B_BYTES = 4, 2   # the group's partial Grams (and norm) travel in fp32, B's rows in bf16
ROW_BYTES = 2                # the row form's all-gathers (matrix, rows of A and of X) travel in bf16
DP_GATHER_VARIANTS = ("bucket", "straddlers", "none")


def plans_for(groups: list[dict], dp: int, tp: int, bucket_numel: int | None, layout: str = "bucket",
              muon: bool = True, hw: dict | None = None, first_only: bool = False) -> list:
    """The plan of every DP rank for ``groups`` (dicts with ``shapes`` (full), ``tp_split_dims`` and
    ``use_muon``, as ``synthetic.Problem.groups``); ``muon=False`` plans every group as AdamW; ``hw``
    sizes the group layout's groups by time (``hardware.py``), as the optimizer's ``hw=`` does. ``first_only``:
    DP rank 0's plan alone (its geometry, cuts and owners are every rank's), in a list: at 1,024 ranks, the others
    cost seconds for nothing."""
    specs = [[ParamSpec(f"g{g}.p{i}", tuple(s), d) for i, (s, d) in enumerate(zip(gr["shapes"], gr["tp_split_dims"]))]
             for g, gr in enumerate(groups)]
    flags = [bool(muon and g["use_muon"]) for g in groups]
    return [build_plan(specs, dp, d, tp, bucket_numel, layout, flags, hw) for d in ([0] if first_only else range(dp))]


def step_calls(groups: list[dict], dp: int, tp: int, bucket_numel: int | None, muon: bool = True,
               param_bytes: int = PARAM_BYTES):
    """Every ring collective of one step under the bucket layout: (phase, op, group, ranks, shard elements,
    bytes per element). ``muon=False`` prices every group as AdamW (the baseline); ``param_bytes=2``
    parameters held in bf16 (``step_bytes``)."""
    plan = plans_for(groups, dp, tp, bucket_numel, "bucket", muon, first_only=True)[0]
    for g, buckets in enumerate(plan.buckets):
        use_muon = muon and groups[g]["use_muon"]
        for bucket in buckets:
            yield "grad_reduce_scatter", "reduce_scatter", "dp", dp, bucket.shard_numel, GRAD_BYTES
            if use_muon:
                yield "ns_gather_dp", "all_gather", "dp", dp, bucket.shard_numel, NS_BYTES
                for i in bucket.param_indices:
                    meta = plan.metas[g][i]
                    if meta.tp_split_dim != -1 and tp > 1:
                        yield "ns_gather_tp", "all_gather", "tp", tp, meta.numel, NS_BYTES
            yield "param_all_gather", "all_gather", "dp", dp, bucket.shard_numel, param_bytes


def step_bytes(groups: list[dict], dp: int, tp: int, bucket_numel: int | None, muon: bool = True,
               layout: str = "bucket", rank: int | None = None, hw: dict | None = None,
               param_bytes: int = PARAM_BYTES) -> dict:
    """Bytes world rank ``rank`` sends per step, by phase, and their total. With ``rank=None``, the mean
    over all ranks (every rank sends the same under the bucket layout; the owner layouts differ by rank).
    ``hw``: the group layout's plan sized by time on that profile (``plans_for``). ``param_bytes``: bytes of
    a parameter element in the all-gather, 4 for fp32 parameters, 2 for bf16 ones (their fp32 master stays
    on its rank, and the gradient buffer, in the master's dtype, is reduce-scattered in fp32 either way)."""
    plan = plans_for(groups, dp, tp, bucket_numel, layout, muon, hw, first_only=True)[0]
    use_muon = [bool(muon and g["use_muon"]) for g in groups]
    steps = [g.get("ns_steps", NS_STEPS) for g in groups]
    forms = [g.get("ns_form", NS_FORM) for g in groups]
    if rank is not None:
        return _rank_bytes(plan, use_muon, rank, steps, forms, param_bytes=param_bytes)
    apart = layout == "group" and tp == 1   # grouped matrices summed over ranks at once: O(members), not O(dp^2)
    every = [_rank_bytes(plan, use_muon, r, steps, forms, apart, param_bytes) for r in (range(dp * tp) if layout != "bucket" else [0])]
    if apart:
        every.append(_group_totals(plan, use_muon, steps, forms))
    mean = {k: sum(e[k] for e in every) / (dp * tp if layout != "bucket" else 1) for k in every[0]}
    return {k: int(v) if v == int(v) else v for k, v in mean.items()}


def _group_totals(plan, use_muon: list[bool], steps: list[int], forms: list[str]) -> dict:
    """What every rank together sends for the grouped matrices on a DP-only grid: each matrix's pieces partition it,
    so what travels to (and back from) its members is all of it but what each member holds of its own block."""
    out = dict.fromkeys(PHASES, 0)
    for g, metas in enumerate(plan.metas):
        for meta in metas if use_muon[g] else ():
            members = plan.group_of(meta)
            if members is None:
                continue
            dim, bounds = long_bounds(meta.full_shape, len(members))
            held = 0
            for i, q in enumerate(members):
                piece = plan.piece_slice(meta, q)
                lo, hi = local_band(meta.full_shape, meta.shape, meta.tp_split_dim, 0, bounds[i], bounds[i + 1])
                held += count_in_band(piece.start, piece.stop, meta.shape, dim, lo, hi)
            moved = (meta.numel - held) * NS_BYTES
            out["ns_to_owner"] += moved
            out["ns_from_owner"] += moved
            out["ns_group_gram"] += len(members) * group_bytes(*meta.full_shape, len(members), steps[g], forms[g])
    out["total"] = sum(out.values())
    return out


def group_gram_bytes(rows: int, cols: int, size: int, steps: int = NS_STEPS) -> int:
    """Bytes one member of a group of ``size`` sends (ring) to orthogonalise one matrix: all-reduces of the
    norm (one fp32 scalar) and ``steps`` fp32 partial Grams (m x m), and ``steps`` all-gathers of its
    bf16 block of B's rows (``ceil(m / size)`` rows of m)."""
    m = min(rows, cols)
    gram = 2 * (size - 1) * GRAM_BYTES * (1 + steps * -(-m * m // size))
    return gram + steps * (size - 1) * B_BYTES * -(-m // size) * m


def group_row_bytes(rows: int, cols: int, size: int, steps: int = NS_STEPS) -> int:
    """Bytes one member of a group of ``size`` sends (ring) to orthogonalise one matrix in the row form: an
    all-gather of the members' long-side blocks (``ceil(n / size)`` of n, each m long), then per step an
    all-gather of its rows of A (``ceil(m / size)`` rows of m) and of X (``ceil(m / size)`` rows of n), bf16."""
    m, n = min(rows, cols), max(rows, cols)
    rows_per = -(-m // size)
    return (size - 1) * ROW_BYTES * (-(-n // size) * m + steps * rows_per * (m + n))


def group_bytes(rows: int, cols: int, size: int, steps: int = NS_STEPS, ns_form: str = NS_FORM) -> int:
    """Bytes one member sends for one grouped matrix: with the standard iteration, in the sharing
    ``ns_group.group_form`` picks (Gram all-reduces or the row form); with ``ns_form="gram"``, the Gram
    iteration's two all-reduces (``ns_gram_group.gram_sharded_bytes``)."""
    if ns_form == "gram":
        return gram_sharded_bytes(rows, cols, size)
    form = group_form(rows, cols, size, steps)
    return (group_row_bytes if form == "rows" else group_gram_bytes)(rows, cols, size, steps)


def _group_bytes(plan, meta, members: tuple[int, ...], rank: int, steps: int, out: dict,
                 ns_form: str = NS_FORM) -> None:
    """The group layout's traffic for one matrix, for world rank ``rank`` (added into ``out``)."""
    tp, size = plan.tp, len(members)
    dim, bounds = long_bounds(meta.full_shape, size)

    def count(r: int, i: int) -> int:     # elements of rank r's piece in member i's block
        piece = plan.piece_slice(meta, r // tp)
        lo, hi = local_band(meta.full_shape, meta.shape, meta.tp_split_dim, r % tp, bounds[i], bounds[i + 1])
        return count_in_band(piece.start, piece.stop, meta.shape, dim, lo, hi)

    for i, q in enumerate(members):
        if rank != q and (meta.tp_split_dim != -1 or rank % tp == q % tp):
            out["ns_to_owner"] += count(rank, i) * NS_BYTES
        if rank == q:
            out["ns_from_owner"] += sum(count(r, i) for r in range(plan.world) if r != q) * NS_BYTES
            out["ns_group_gram"] += group_bytes(*meta.full_shape, size, steps, ns_form)


def _rank_bytes(plan, use_muon: list[bool], rank: int, steps: list[int] | None = None,
                forms: list[str] | None = None, groups_apart: bool = False, param_bytes: int = PARAM_BYTES) -> dict:
    dp, tp, layout = plan.dp, plan.tp, plan.layout
    out = dict.fromkeys(PHASES, 0)
    for g, buckets in enumerate(plan.buckets):
        for bucket in buckets:
            out["grad_reduce_scatter"] += (dp - 1) * bucket.shard_numel * GRAD_BYTES
            out["param_all_gather"] += (dp - 1) * bucket.shard_numel * param_bytes
            if not use_muon[g]:
                continue
            if layout == "bucket":
                out["ns_gather_dp"] += (dp - 1) * bucket.shard_numel * NS_BYTES
            for i in bucket.param_indices:
                meta = plan.metas[g][i]
                if layout == "bucket":
                    if meta.tp_split_dim != -1 and tp > 1:
                        out["ns_gather_tp"] += (tp - 1) * meta.numel * NS_BYTES
                    continue
                members = plan.group_of(meta)
                if members is not None and groups_apart:   # _group_totals counts them
                    continue
                if members is not None:
                    _group_bytes(plan, meta, members, rank, (steps or [NS_STEPS] * len(use_muon))[g], out,
                                 (forms or [NS_FORM] * len(use_muon))[g])
                    continue
                owner = plan.owner_of(meta)
                sends = meta.tp_split_dim != -1 or rank % tp == owner % tp
                if rank != owner and sends:
                    out["ns_to_owner"] += plan.piece_numel(meta, rank // tp) * NS_BYTES
                if rank == owner:
                    out["ns_from_owner"] += sum(plan.piece_numel(meta, r // tp) for r in range(dp * tp)
                                                if r != owner) * NS_BYTES
    out["total"] = sum(out.values())
    return out


def bytes_ratio(groups: list[dict], dp: int, tp: int, bucket_numel: int | None, layout: str = "bucket",
                param_bytes: int = PARAM_BYTES) -> float | None:
    """Muon (under ``layout``) / AdamW bytes per step, mean over ranks (None when AdamW moves nothing, e.g. dp = 1);
    ``param_bytes=2``: both with bf16 parameters."""
    adamw = step_bytes(groups, dp, tp, bucket_numel, muon=False, param_bytes=param_bytes)["total"]
    muon = step_bytes(groups, dp, tp, bucket_numel, layout=layout, param_bytes=param_bytes)["total"]
    return muon / adamw if adamw else None


def dp_gather_bytes(groups: list[dict], dp: int, tp: int, bucket_numel: int | None, variant: str = "bucket") -> float:
    """Bytes per rank (averaged over the DP ranks) that a DP gather for Newton-Schulz needs, on equal shards.

    "bucket": every rank gathers every whole bucket (the bucket layout). "straddlers": only a matrix
    split between ``k > 1`` DP ranks is gathered, by those ``k`` ranks: together they receive
    ``(k - 1) * m`` elements. "none": no DP gather (shards cut on matrix boundaries, as the aligned
    layout does, at the price of uneven shards).
    """
    if variant not in DP_GATHER_VARIANTS:
        raise ValueError(f"variant must be one of {DP_GATHER_VARIANTS}")
    if variant == "none" or dp == 1:
        return 0.0
    plan = plans_for(groups, dp, tp, bucket_numel, first_only=True)[0]
    total = 0.0
    for g, buckets in enumerate(plan.buckets):
        if not groups[g]["use_muon"]:
            continue
        for bucket in buckets:
            if variant == "bucket":
                total += (dp - 1) * bucket.shard_numel * NS_BYTES
                continue
            for i in bucket.param_indices:
                meta = plan.metas[g][i]
                holders = sum(plan.piece_numel(meta, r) > 0 for r in range(dp))
                total += (holders - 1) * meta.numel * NS_BYTES / dp
    return total


def collective_seconds(op: str, n: int, shard_bytes: float, alpha: float, beta: float) -> float:
    """Ring time of one collective: (n - 1) hops of latency ``alpha`` (s) and ``shard_bytes / beta``."""
    if n == 1:
        return 0.0
    hops = 2 * (n - 1) if op == "all_reduce" else n - 1
    return hops * (alpha + shard_bytes / beta)


def step_seconds(groups: list[dict], dp: int, tp: int, bucket_numel: int | None, links: dict, muon: bool = True,
                 gloo_reduce_scatter: bool = False) -> dict:
    """Predicted communication seconds per step, by phase. ``links``: {"dp": (alpha, beta), "tp": (alpha, beta)}."""
    out = dict(grad_reduce_scatter=0.0, ns_gather_dp=0.0, ns_gather_tp=0.0, param_all_gather=0.0)
    for phase, op, group, n, shard, size in step_calls(groups, dp, tp, bucket_numel, muon):
        if op == "reduce_scatter" and gloo_reduce_scatter:
            op = "all_reduce"
        out[phase] += collective_seconds(op, n, shard * size, *links[group])
    out["total"] = sum(out.values())
    return out


def fit_alpha_beta(samples: list[tuple[int, float, float]]) -> tuple[float, float]:
    """Least-squares (alpha, beta) from all-gather timings: samples of (ranks, shard bytes, seconds).

    Both constants are kept physical (alpha >= 0, beta > 0). When the samples cannot resolve the
    bandwidth (too small, too noisy: the best slope is not positive), beta is ``inf`` and alpha
    alone fits them.
    """
    import torch

    X = torch.tensor([[n - 1, (n - 1) * b] for n, b, _ in samples], dtype=torch.float64)
    y = torch.tensor([t for _, _, t in samples], dtype=torch.float64)
    alpha, inv_beta = torch.linalg.lstsq(X, y.unsqueeze(1)).solution.squeeze(1).tolist()
    if inv_beta <= 0:  # latency only
        return max(float(X[:, 0] @ y / (X[:, 0] @ X[:, 0])), 0.0), float("inf")
    if alpha < 0:  # bandwidth only
        return 0.0, float(X[:, 1] @ X[:, 1] / (X[:, 1] @ y))
    return alpha, 1.0 / inv_beta


def links_for_grid(dp: int, tp: int, gpus_per_node: int, intra: tuple[float, float],
                   inter: tuple[float, float]) -> dict:
    """Which (alpha, beta) each group's ring runs on, for ranks laid out TP-fastest on nodes.

    A TP group is ``tp`` consecutive ranks: inside one node if ``tp <= gpus_per_node``. A DP group
    takes one rank from each replica: it crosses nodes as soon as ``dp * tp > gpus_per_node``, and a
    ring is as slow as its slowest link.
    """
    return {"tp": intra if tp <= gpus_per_node else inter, "dp": intra if dp * tp <= gpus_per_node else inter}


def ddp_all_reduce_bytes(bucket_numels: list[int], dp: int, element_size: int = GRAD_BYTES) -> int:
    """Bytes one rank sends when DDP all-reduces gradient buckets of ``bucket_numels`` elements over ``dp`` ranks."""
    return sum(2 * (dp - 1) * -(-b // dp) * element_size for b in bucket_numels)


def zero_partition(numels: list[int], dp: int) -> list[int]:
    """The rank ``ZeroRedundancyOptimizer`` gives each parameter of one group (``numels``, in the group's order): the
    largest first (a stable sort), each to the rank holding the fewest elements so far (the first such rank)."""
    owners, held = [0] * len(numels), [0] * dp
    for i in sorted(range(len(numels)), key=lambda i: -numels[i]):
        owners[i] = held.index(min(held))
        held[owners[i]] += numels[i]
    return owners


def broadcast_bytes(numels: list[int], dp: int, element_size: int = PARAM_BYTES) -> int:
    """Bytes one rank sends when tensors of ``numels`` elements are each broadcast over ``dp`` ranks: every parameter
    from its owner under ``ZeroRedundancyOptimizer``; DDP's module buffers from rank 0 at each forward."""
    return sum(numels) * element_size if dp > 1 else 0


def ballot_bytes(n_params: int, world: int, checked: bool = True) -> int:
    """Bytes one rank sends in our step's one ballot (``contract.vote``): int32 per parameter, twice with a check."""
    return 2 * (world - 1) * -(-(n_params * (2 if checked else 1)) // world) * 4 if world > 1 else 0
