"""The real ZeRO-1 plan of real models on up to 1,024 ranks and more, priced without launching anything.

What ``scripts/plan_at_scale.py`` (``grid_report``) and ``scripts/plan_ep.py`` (``ep_report``) print, and what the
time model (``timemodel``, ``wholestep``) and chapters 15 and 16 read. The models are ``model_shapes.MODELS``:
Llama-3-70B, Llama-3-8B, Llama-3.2-1B, and two MoEs with one matrix per expert, Moonlight-16B-A3B and Kimi K2.

For each DP x TP grid, two plans of ``muongrid.plan.build_plan`` (the code the optimizer runs), each built and
timed: the "owner" layout (one owner per matrix) and the "group" layout with the hardware profile
(``build_plan(..., layout="group", hw=profile(H100))``: a matrix goes to one owner or to a group of ranks,
whichever finishes it first counting the group's collectives, ``layouts.assign_timed``). Per plan, per rank:

* Newton-Schulz FLOPs, as max / mean over ranks (1.0 = perfectly balanced; the step waits for the max);
* bytes sent per step, from the closed form (``lab/costmodel``'s rules, summed for every rank in one pass,
  ``bytes_per_rank``; ``tests/test_plan_at_scale.py`` checks the two agree, groups included), and AdamW's;
* bytes sent per step to another node (``cross_node_bytes_per_rank``: the all-to-alls point to point, the
  rings to the next rank in the ring), as the busiest rank's;
* collectives per step: reduce-scatter + all-gather per bucket, K all-to-alls each way per Muon group (to
  the owners or members and back: its buckets joined into K = min(``PREFETCH_CHUNKS``, buckets) exchanges,
  as the flows issue them with "prefetch", ``owner_routes.exchange_chunks``), and per group membership
  1 + ns_steps all-reduces and ns_steps all-gathers;
* projected milliseconds on the busiest rank (``ns_seconds_per_rank``: NS FLOPs at a stated throughput plus
  each group's collectives by alpha-beta on the link it spans; ``step_seconds_per_rank``: the whole step,
  serial), with the constants of ``H100``: public H100 figures taken as assumptions, cited there;
* same-shape batching (``ns_batch=True``): matrices owned and Newton-Schulz calls (distinct shapes owned) on
  the rank that owns the most.

For comparison, the NS time of two older group rules on the same matrices (``group_assignment``): "scattered"
(groups of ceil(FLOPs / fair) on the least-loaded ranks anywhere, the first rule here) and "flops" (the
optimizer's group layout without a profile: the same sizes, contiguous TP-local windows).

With expert parallelism (``ep_report``; ``Grid.expert(ep)``) the DP ranks are dealt into ``ep`` expert slices: each
rank holds ``experts / ep`` of each MoE layer's routed experts, whole, and runs two plans, the dense one on the
job's DP x TP grid and its slice's expert plan on the expert grid (``dp / ep`` x TP); ``scripts/plan_ep.py``'s
docstring says what is and is not modelled.

    from muongrid.lab.scale import grid_report
    row = grid_report(8, 8, layers=2, model="llama3-8b")   # owner and group plans, per rank, as one dict
"""
from __future__ import annotations

import contextlib
import gc
import re
import time

from muongrid import hardware
from muongrid.group_routes import count_in_band, local_band, long_bounds
from .costmodel import collective_seconds, group_bytes, links_for_grid
from .timemodel import piece_exchange
from muongrid.layouts import assign_owners_and_groups, group_ns_flops, group_seconds
from muongrid.newton_schulz import NS_STEPS, ns5_flops
from muongrid.owner_routes import PREFETCH_CHUNKS
from muongrid.plan import build_plan, ns_flops, owner_candidates, piece_runs

from .model_shapes import MODELS

GRAD_BYTES, NS_BYTES, PARAM_BYTES = 4, 2, 4


# The projection's constants: public H100 figures taken as ASSUMPTIONS, not measured here (``muongrid.hardware.H100``,
# each cited there), and the profile the optimizer's group plan is sized with (``build_plan(..., hw=)``).
H100 = hardware.H100


def profile(hw: dict = H100) -> dict:
    """``hw`` (figures as ``H100`` gives them) as a hardware profile: ``hardware.node_profile``."""
    return hardware.node_profile(hw)


def span_link(members, prof: dict) -> tuple[float, float]:
    """The link a group's rings run on: ``intra`` if every member is on one node (``ranks_per_node``
    consecutive ranks), else ``inter`` (a ring is as slow as its slowest hop)."""
    node = prof["ranks_per_node"]
    return prof["intra"] if members[0] // node == members[-1] // node else prof["inter"]


def ns_seconds_per_rank(owners: dict, groups: dict, shapes: dict, world: int, prof: dict,
                        steps: int = NS_STEPS) -> tuple[list[int], list[float]]:
    """(Newton-Schulz FLOPs, seconds) of one step on every rank: its owned matrices' FLOPs
    (``ns5_flops``) and, per group it belongs to, a member's FLOPs (``group_ns_flops``, B's rows split as
    the optimizer runs it), all at ``flops * efficiency``, plus ``layouts.group_seconds`` (its Gram
    all-reduces and B all-gathers, alpha-beta) on the link the group spans (``span_link``)."""
    rate = prof["flops"] * prof["efficiency"]
    flops = [0] * world
    extra = [0.0] * world
    of_shape = {}   # a model repeats a few shapes many times (Kimi K2: 69,000 matrices, 3 shapes of one cost)
    for key, rank in owners.items():
        shape = shapes[key]
        if shape not in of_shape:
            of_shape[shape] = ns5_flops(*shape)
        flops[rank] += of_shape[shape]
    for key, members in groups.items():
        rows, cols = shapes[key]
        t = group_seconds(rows, cols, len(members), steps, span_link(members, prof))
        for r in members:
            flops[r] += group_ns_flops(rows, cols, len(members), steps, split_b=True)
            extra[r] += t
    return flops, [f / rate + x for f, x in zip(flops, extra)]


def muon_matrices(plan, muon: list[bool]):
    """Every Muon matrix of ``plan`` (an "owner" or "group" plan) as (meta, owner, members, runs): its owner and
    ``piece_runs`` (what each DP rank holds, as runs), or the ``members`` of its group (owner and runs None).
    One pass with the plan's lookups made once per parameter group: the per-rank prices below walk Kimi K2's
    70,000 matrices this way, several times per grid."""
    even, owners, groups = plan.layout != "aligned", plan.owners, plan.groups
    for g, metas in enumerate(plan.metas):
        if not muon[g]:
            continue
        buckets = plan.buckets[g]
        for meta in metas:
            key = (g, meta.param_idx)
            members = groups.get(key)
            if members is None:
                yield meta, owners[key], None, piece_runs(buckets[meta.bucket_idx], meta, even)
            else:
                yield meta, None, members, None


def bytes_per_rank(plan, muon: list[bool], steps: int = NS_STEPS, placed: list | None = None) -> list[dict]:
    """Bytes each world rank sends per step, by phase, under ``plan``'s layout ("owner" or "group"): the closed
    form of ``lab/costmodel._rank_bytes``, for every rank in one pass. An owned matrix's DP pieces come as
    runs (``plan.piece_runs``), added to the ranks of a run at once (difference arrays), so Kimi K2's
    70,000 matrices on 1,024 ranks cost 70,000 steps, not 70 million; a grouped one likewise, per member
    (``_group_bytes_into``). ``tests/test_plan_at_scale.py`` checks it equals
    ``costmodel.step_bytes(..., rank=r)`` on every rank of small models. ``placed``: ``list(muon_matrices(plan,
    muon))`` if already made."""
    dp, tp, world = plan.dp, plan.tp, plan.world
    out = [dict(grad_reduce_scatter=0, ns_to_owner=0, ns_group_gram=0, ns_from_owner=0, param_all_gather=0)
           for _ in range(world)]
    per_bucket = sum((dp - 1) * b.shard_numel for buf in plan.buckets for b in buf)
    every_tp = [0] * (dp + 1)                       # difference arrays over DP ranks: pieces sent by all TP ranks
    one_tp = [[0] * (dp + 1) for _ in range(tp)]    # ... by TP rank t only (a TP-replicated matrix)
    kept, returned = [0] * world, [0] * world      # elements an owner keeps (its own piece) and sends back
    for meta, owner, members, runs in muon_matrices(plan, muon) if placed is None else placed:
        if members is not None:
            _group_bytes_into(plan, meta, members, steps, out, every_tp)
            continue
        diff = every_tp if meta.tp_split_dim != -1 else one_tp[owner % tp]
        mine, d = 0, owner // tp
        for lo, hi, n in runs:
            diff[lo] += n
            diff[hi] -= n
            if lo <= d < hi:
                mine = n
        kept[owner] += mine
        returned[owner] += tp * meta.numel - mine
    for o, k, r in zip(out, kept, returned):
        o["ns_to_owner"] -= k * NS_BYTES          # the owner's own piece stays
        o["ns_from_owner"] += r * NS_BYTES
    run_all, run_one = 0, [0] * tp
    for d in range(dp):
        run_all += every_tp[d]
        for t in range(tp):
            run_one[t] += one_tp[t][d]
            o = out[d * tp + t]
            o["ns_to_owner"] += (run_all + run_one[t]) * NS_BYTES
            o["grad_reduce_scatter"] = per_bucket * GRAD_BYTES
            o["param_all_gather"] = per_bucket * PARAM_BYTES
    for o in out:
        o["total"] = sum(o.values())
    return out


def _group_bytes_into(plan, meta, members: tuple[int, ...], steps: int, out: list[dict], every_tp: list[int]) -> None:
    """``costmodel._group_bytes`` for every rank at once. A rank sends each member the part of its piece in that
    member's block (``group_routes.count_in_band``) and gets it back. The blocks cover the matrix, so when every
    rank sends to every member (the matrix is split over TP, or tp = 1) a rank sends its whole piece (added by
    DP runs into ``every_tp``) but what it keeps as a member; a member gets back every rank's part of its block
    (the block's elements on every TP rank) but its own. A TP-replicated matrix is sent only by the member's TP
    rank: those ranks are counted one by one."""
    dp, tp, size = plan.dp, plan.tp, len(members)
    dim, bounds = long_bounds(meta.full_shape, size)
    other = meta.shape[1 - dim]
    gram = group_bytes(*meta.full_shape, size, steps)
    everyone = meta.tp_split_dim != -1 or tp == 1

    def count(r: int, band: tuple[int, int]) -> int:
        piece = plan.piece_slice(meta, r // tp)
        return count_in_band(piece.start, piece.stop, meta.shape, dim, *band)

    if everyone:
        for lo, hi, n in piece_runs(plan.bucket_of(meta), meta, even=True):
            every_tp[lo] += n
            every_tp[hi] -= n
    for i, q in enumerate(members):
        bands = [local_band(meta.full_shape, meta.shape, meta.tp_split_dim, t, bounds[i], bounds[i + 1])
                 for t in range(tp)]
        own = count(q, bands[q % tp])
        out[q]["ns_from_owner"] += (sum((hi - lo) * other for lo, hi in bands) - own) * NS_BYTES
        out[q]["ns_group_gram"] += gram
        if everyone:
            out[q]["ns_to_owner"] -= own * NS_BYTES
            continue
        for d in range(dp):
            r = d * tp + q % tp
            if r != q:
                out[r]["ns_to_owner"] += count(r, bands[q % tp]) * NS_BYTES


def owner_bytes_per_rank(plan, muon: list[bool]) -> list[dict]:
    """``bytes_per_rank`` of an owner plan (the phases the owner layout has)."""
    return [{k: v for k, v in o.items() if k != "ns_group_gram"} for o in bytes_per_rank(plan, muon)]


def cross_node_bytes_per_rank(plan, muon: list[bool], bytes_: list[dict], ranks_per_node: int,
                              steps: int = NS_STEPS, placed: list | None = None) -> list[int]:
    """Bytes each rank sends per step to a rank on another node (``ranks_per_node`` consecutive ranks per
    node), from ``bytes_`` (``bytes_per_rank`` of the same plan) under this model of the collectives:

    * the all-to-alls (to the owners or members, and back) go point to point: a piece crosses when its
      sender and receiver sit on different nodes (``lab/timemodel.piece_exchange``, pair by pair);
    * the rings (the DP reduce-scatter and all-gather, a group's Gram all-reduces and B all-gathers) send
      each rank's bytes to its successor in the ring (DP index + 1, or the next member): all of them cross
      when that successor is on another node, none otherwise.

    So a rank's all-to-all bytes minus those to its own node: only the ranks of an owner's or member's node
    are visited per matrix (O(ranks_per_node), not O(world)). ``tests/test_plan_at_scale.py`` checks it
    against the pairs counted one by one. ``placed``: as ``bytes_per_rank`` takes it."""
    dp, tp, world, node = plan.dp, plan.tp, plan.world, ranks_per_node
    near = [0] * world   # all-to-all bytes a rank sends to its own node
    near_runs = [0] * (world + 1)   # ... added to runs of ranks at once (a difference array)
    neighbours = lambda r: range(r - r % node, min(world, r - r % node + node))  # noqa: E731
    for meta, owner, members, runs in muon_matrices(plan, muon) if placed is None else placed:
        if members is None:   # one owner: its node's ranks that hold a piece, from the piece's runs
            _owner_near(runs, meta.tp_split_dim != -1, owner, tp, node, world, near, near_runs)
            continue
        for q in members:
            for r in neighbours(q):
                if r != q:
                    sent, returned = piece_exchange(plan, meta, r, q)
                    near[r] += sent
                    near[q] += returned
    run = 0
    for r in range(world):
        run += near_runs[r]
        near[r] += run
    out = [b["ns_to_owner"] + b["ns_from_owner"] - n for b, n in zip(bytes_, near)]
    for r in range(world):
        successor = ((r // tp + 1) % dp) * tp + r % tp
        if successor // node != r // node:
            out[r] += bytes_[r]["grad_reduce_scatter"] + bytes_[r]["param_all_gather"]
    for meta_key, members in plan.groups.items():
        rows, cols = plan.metas[meta_key[0]][meta_key[1]].full_shape
        for i, q in enumerate(members):
            if members[(i + 1) % len(members)] // node != q // node:
                out[q] += group_bytes(rows, cols, len(members), steps)
    return out


def _owner_near(runs, split: bool, q: int, tp: int, node: int, world: int, near: list[int],
                near_runs: list[int]) -> None:
    """``piece_exchange(plan, meta, r, q)`` added for every rank ``r`` on owner ``q``'s node, each DP rank's piece
    read from the matrix's ``runs`` (``plan.piece_runs``, a few per matrix) instead of asked rank by rank. A
    matrix ``split`` over TP is sent by every rank of a run, so the run is added at once into ``near_runs`` (a
    difference array over ranks, summed by the caller); a TP-replicated one only by the owner's TP rank,
    counted one by one."""
    first = q - q % node
    last = min(world, first + node)
    for lo, hi, n in runs:
        if hi * tp <= first or lo * tp >= last:   # off q's node, as most runs are
            continue
        a, b = max(first, lo * tp), min(last, hi * tp)
        others = b - a - (a <= q < b)   # the ranks r != q of [a, b): each sends n and gets n back from q
        near[q] += others * n * NS_BYTES
        if split:
            near_runs[a] += n * NS_BYTES
            near_runs[b] -= n * NS_BYTES
            if a <= q < b:
                near[q] -= n * NS_BYTES
        else:
            for r in range(a + (q - a) % tp, b, tp):   # the ranks of [a, b) on q's TP rank
                if r != q:
                    near[r] += n * NS_BYTES


def exchanges_per_direction(plan, muon: list[bool], chunks: int = PREFETCH_CHUNKS) -> int:
    """All-to-alls per step and direction: one per chunk of each Muon group's buckets (``exchange_chunks``)."""
    if plan.world == 1:
        return 0
    return sum(min(chunks, len(buckets)) for g, buckets in enumerate(plan.buckets) if muon[g])


def collectives_per_rank(plan, muon: list[bool], steps: int = NS_STEPS) -> list[int]:
    """Collectives each rank joins per step: per bucket a reduce-scatter and an all-gather over DP, per Muon
    group K all-to-alls each way (``exchanges_per_direction``), and per group membership 1 + steps
    all-reduces (norm, Grams) and steps all-gathers (B's rows)."""
    n = 2 * exchanges_per_direction(plan, muon)
    for buckets in plan.buckets:
        n += len(buckets) * (2 if plan.dp > 1 else 0)
    out = [n] * plan.world
    for members in plan.groups.values():
        for r in members:
            out[r] += 1 + 2 * steps
    return out


def zero1_seconds(plan, prof: dict) -> float:
    """Seconds of one step's ZeRO-1 collectives, the same for every rank and for AdamW on the same plan: per
    bucket a ring reduce-scatter (fp32 gradients) and all-gather (fp32 parameters) over DP
    (``costmodel.collective_seconds`` on ``links_for_grid``'s DP link)."""
    links = links_for_grid(plan.dp, plan.tp, prof["ranks_per_node"], prof["intra"], prof["inter"])
    return sum(collective_seconds("reduce_scatter", plan.dp, b.shard_numel * GRAD_BYTES, *links["dp"])
               + collective_seconds("all_gather", plan.dp, b.shard_numel * PARAM_BYTES, *links["dp"])
               for buf in plan.buckets for b in buf)


def step_seconds_per_rank(plan, bytes_: list[dict], ns_s: list[float], prof: dict, muon: list[bool]) -> list[float]:
    """Projected seconds of one optimizer step on every rank, serial (no overlap, an upper bound): per bucket a
    ring reduce-scatter and all-gather over DP (``costmodel.collective_seconds`` on ``links_for_grid``'s DP
    link), the all-to-alls' bytes (sent + received: an owner's receipts are what it sends back) at the DP
    link's bandwidth plus one latency per exchange issued (``exchanges_per_direction``, each way), and
    ``ns_seconds_per_rank`` (Newton-Schulz
    with the group collectives). Cruder than ``lab/timemodel.step_seconds`` (which prices each all-to-all
    peer by peer, O(world^2) per bucket: too slow at 1,024 ranks), and stated so."""
    links = links_for_grid(plan.dp, plan.tp, prof["ranks_per_node"], prof["intra"], prof["inter"])
    alpha, beta = links["dp"]
    comm = zero1_seconds(plan, prof)
    calls = exchanges_per_direction(plan, muon)
    return [comm + 2 * calls * alpha + (o["ns_to_owner"] + o["ns_from_owner"]) / beta + t
            for o, t in zip(bytes_, ns_s)]


GROUP_RULES = ("scattered", "flops", "timed")


def group_assignment(plan, muon: list[bool], rule: str, prof: dict, matrices: list | None = None):
    """(owners, groups) of a group mode for ``plan``'s matrices under one rule: "timed", the optimizer's group
    layout with the profile (``build_plan(layout="group", hw=prof)``, ``layouts.assign_timed``); "flops", the
    optimizer's group layout without one (groups of ceil(FLOPs / fair), contiguous TP-local windows);
    "scattered", this script's first rule (the same sizes, the least-loaded ranks anywhere). ``matrices``:
    ``plan.owner_candidates(plan, muon)`` if already made (the assignment does not change them).

    Given an owner plan with no matrix above the fair share (``fair_share_exceeded``), "flops" and "scattered"
    form no group, and the rest of their rule is ``assign_owners``': the plan's own owners, returned as they are
    (Kimi K2 on 1,024 ranks: 70,000 matrices, none above it, not assigned twice more)."""
    shapes = {(g, meta.param_idx): meta.full_shape for g, metas in enumerate(plan.metas) if muon[g] for meta in metas}
    if rule != "timed" and plan.layout == "owner" and not fair_share_exceeded(plan, muon):
        return dict(plan.owners), {}, shapes
    matrices = owner_candidates(plan, muon) if matrices is None else matrices
    tp = {"scattered": None, "flops": plan.tp, "timed": plan.tp}[rule]
    hw = prof if rule == "timed" else None
    owners, groups, _ = assign_owners_and_groups(matrices, plan.world, shapes, split_b=True, tp=tp, hw=hw)
    return owners, groups, shapes


def fair_share_exceeded(plan, muon: list[bool]) -> bool:
    """Whether a Muon matrix of ``plan`` has more Newton-Schulz FLOPs than the fair share (all of them / world,
    as ``layouts.assign_owners_and_groups`` reckons it): only such a matrix can get a group by FLOPs."""
    flops, of_shape = [], {}   # per full shape: a model repeats a few shapes many times
    for g, metas in enumerate(plan.metas):
        for meta in metas if muon[g] else ():
            if meta.full_shape not in of_shape:
                of_shape[meta.full_shape] = ns_flops(meta.full_shape)
            flops.append(of_shape[meta.full_shape])
    return bool(flops) and max(flops) > sum(flops) / plan.world


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off inside, as it was after. A plan at scale is a million small objects
    that hold no reference cycles, so a collection frees nothing, but its full passes rescan every live object
    as the plans grow: pricing Kimi K2 on 128x8 and 1024x1, 19 full passes cost 2.7 s of 13.7 (CPU, shared
    machine)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@collector_paused()
def grid_report(dp: int, tp: int, layers: int | None = None, model: str = "llama3-70b", hw: dict = H100,
                bucket_numel: int | str = "auto", rules: tuple[str, ...] = ("scattered", "flops")) -> dict:
    """One model on one grid: the owner plan and the optimizer's group plan (``build_plan(layout="group",
    hw=profile(hw))``), built and timed, each with its NS load, bytes, collectives and projected times
    per rank; and, for comparison, the NS time of the other group ``rules`` (``group_assignment``)."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: pick one of {', '.join(MODELS)}")
    build, default_layers = MODELS[model]
    specs, muon = build(default_layers if layers is None else layers)
    prof = profile(hw)
    world, rate = dp * tp, prof["flops"] * prof["efficiency"]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    out = dict(model=model, dp=dp, tp=tp, world=world)
    for layout in ("owner", "group"):
        t0 = time.perf_counter()
        plan = build_plan(specs, dp, 0, tp, bucket_numel=bucket_numel, layout=layout, muon=muon,
                          hw=prof if layout == "group" else None)
        out[f"{layout}_build_s"] = time.perf_counter() - t0
        shapes = {(m.group_idx, m.param_idx): m.full_shape for m in plan.metas[0]}
        flops, ns_s = ns_seconds_per_rank(plan.owners, plan.groups, shapes, world, prof)
        placed = list(muon_matrices(plan, muon))   # walked once for bytes and cross-node bytes
        bytes_ = bytes_per_rank(plan, muon, placed=placed)
        totals = [b["total"] for b in bytes_]
        cross = cross_node_bytes_per_rank(plan, muon, bytes_, prof["ranks_per_node"], placed=placed)
        step_s = step_seconds_per_rank(plan, bytes_, ns_s, prof, muon)
        owned, owned_shapes = [0] * world, [set() for _ in range(world)]
        for key, rank in plan.owners.items():
            owned[rank] += 1
            owned_shapes[rank].add(shapes[key])
        out.update({f"{layout}_ns_max_over_mean": max(flops) / mean(flops), f"{layout}_ranks_idle": flops.count(0),
                    f"{layout}_ns_max_tflop": max(flops) / 1e12, f"{layout}_ns_ms": max(ns_s) * 1e3,
                    f"{layout}_bytes_per_rank_max": max(totals), f"{layout}_bytes_per_rank_mean": mean(totals),
                    f"{layout}_cross_node_bytes_max": max(cross),
                    f"{layout}_collectives_per_rank_max": max(collectives_per_rank(plan, muon)),
                    f"{layout}_step_ms": max(step_s) * 1e3, f"{layout}_owned_max": max(owned),
                    f"{layout}_ns_calls_batched_max": max(len(x) for x in owned_shapes)})
        if layout == "owner":
            out.update(muon_matrices=len(plan.metas[0]), buckets=sum(len(b) for b in plan.buckets),
                       adamw_step_ms=zero1_seconds(plan, prof) * 1e3,
                       distinct_shapes=len(set(shapes.values())), ideal_ns_ms=sum(flops) / world / rate * 1e3,
                       adamw_bytes_per_rank=sum((dp - 1) * b.shard_numel for buf in plan.buckets for b in buf)
                       * (GRAD_BYTES + PARAM_BYTES), owner_plan=plan)
        else:
            sizes = [len(m) for m in plan.groups.values()]
            out.update(grouped_matrices=len(sizes), group_size_max=max(sizes, default=0),
                       groups_across_nodes=sum(span_link(m, prof) != prof["intra"] for m in plan.groups.values()),
                       group_bytes_gram_max=max(b["ns_group_gram"] for b in bytes_))
    owner_plan = out.pop("owner_plan")
    # made once for every rule, and only if a rule can form a group (else group_assignment needs none)
    matrices = owner_candidates(owner_plan, muon) if rules and fair_share_exceeded(owner_plan, muon) else None
    for rule in rules:
        owners, groups, shapes = group_assignment(owner_plan, muon, rule, prof, matrices)
        flops, ns_s = ns_seconds_per_rank(owners, groups, shapes, world, prof)
        out[f"{rule}_ns_ms"] = max(ns_s) * 1e3
        out[f"{rule}_ns_max_over_mean"] = max(flops) / mean(flops)
        out[f"{rule}_group_size_max"] = max(map(len, groups.values()), default=0)
    return out


# ---- expert parallelism: a MoE's routed experts dealt into ep slices (scripts/plan_ep.py) ----
EXPERT = re.compile(r"\.expert\.(\d+)\.")


def split_experts(specs: list, muon: list[bool], ep: int) -> tuple[list, list]:
    """(dense groups, expert groups of slice 0): every routed expert's matrices taken out of the Muon group;
    slice 0 keeps experts 0 .. experts/ep - 1 of every layer (every slice has the same shapes)."""
    experts = max((int(m.group(1)) for s in specs[0] if (m := EXPERT.search(s.name))), default=-1) + 1
    if experts == 0:
        raise ValueError("this model has no routed experts (no '.expert.N.' in its matrix names)")
    if experts % ep:
        raise ValueError(f"{experts} experts per layer do not divide into ep={ep} slices")
    per = experts // ep
    dense = [[s for s in specs[0] if not EXPERT.search(s.name)]] + specs[1:]
    mine = [[s for s in specs[0] if (m := EXPERT.search(s.name)) and int(m.group(1)) < per]]
    return dense, mine


def priced(plan, muon: list[bool], prof: dict) -> dict:
    """Per rank of ``plan``: bytes, collectives, NS seconds and the serial step seconds (owner layout)."""
    shapes = {(m.group_idx, m.param_idx): m.full_shape for m in plan.metas[0]}
    flops, ns_s = ns_seconds_per_rank(plan.owners, plan.groups, shapes, plan.world, prof)
    bytes_ = owner_bytes_per_rank(plan, muon)
    return dict(bytes=[b["total"] for b in bytes_], collectives=collectives_per_rank(plan, muon), flops=flops,
                step_s=step_seconds_per_rank(plan, bytes_, ns_s, prof, muon))


@collector_paused()
def ep_report(model: str, dp: int, tp: int, ep: int, bucket_numel: int | str = "auto",
              layers: int | None = None) -> dict:
    """One MoE on one grid with ``ep`` expert slices, against pure ZeRO-1 x TP (see the module docstring)."""
    if dp % ep:
        raise ValueError(f"ep={ep} must divide dp={dp}")
    build, default_layers = MODELS[model]
    specs, muon = build(default_layers if layers is None else layers)
    prof = profile(H100)
    dense_specs, expert_specs = split_experts(specs, muon, ep)
    t0 = time.perf_counter()
    dense = build_plan(dense_specs, dp, 0, tp, bucket_numel, "owner", muon)
    experts = build_plan(expert_specs, dp // ep, 0, tp, bucket_numel, "owner", [True])
    build_s = time.perf_counter() - t0
    d, x = priced(dense, muon, prof), priced(experts, [True], prof)
    world = dp * tp

    def per_rank(key):   # world rank r = dp_rank * tp + tp_rank holds slice dp_rank % ep, expert-grid rank ...
        return [d[key][r] + x[key][(r // tp // ep) * tp + r % tp] for r in range(world)]

    out = dict(model=model, dp=dp, tp=tp, ep=ep, world=world, build_s=build_s,
               expert_matrices_per_rank=len(expert_specs[0]), dense_matrices=len(dense_specs[0]),
               bytes_per_rank_max=max(per_rank("bytes")), collectives_per_rank_max=max(per_rank("collectives")),
               ns_tflop_max=max(per_rank("flops")) / 1e12, step_ms=max(per_rank("step_s")) * 1e3)
    t0 = time.perf_counter()
    whole = build_plan(specs, dp, 0, tp, bucket_numel, "owner", muon)
    out["zero1_build_s"] = time.perf_counter() - t0
    z = priced(whole, muon, prof)
    out.update(zero1_bytes_per_rank_max=max(z["bytes"]), zero1_collectives_per_rank_max=max(z["collectives"]),
               zero1_ns_tflop_max=max(z["flops"]) / 1e12, zero1_step_ms=max(z["step_s"]) * 1e3)
    return out
