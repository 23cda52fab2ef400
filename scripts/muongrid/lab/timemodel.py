"""Seconds of one optimizer step on the slowest rank, for every layout: collectives plus Newton-Schulz.

``costmodel`` counts the bytes each rank sends (the ledger is tested against it); this module turns
a plan into time, per step, on a stated piece of hardware (a *profile*):

* every collective the engine runs, priced with ``costmodel.collective_seconds`` (ring all-gathers
  and reduce-scatters over DP per bucket, the bucket layout's DP and TP gathers for Newton-Schulz)
  or, for the owner layouts' all-to-alls (to the owners and back, one per chunk of a Muon group's buckets
  each way, as the flows issue them: ``owner_routes.exchange_chunks``), by
  ``all_to_all_seconds``: each rank pays one ``alpha`` per peer it exchanges with and the larger of
  what it sends and receives over ``beta``, links inside a node and between nodes working at once;
  a phase lasts as long as its busiest rank (an owner receives every piece of its matrices: the
  ledger's ``bytes_recv``, which ``owner_traffic`` matches rank by rank);
* Newton-Schulz: the FLOPs (``ns5_flops``) of the busiest rank at ``flops * efficiency``; on one
  machine whose cores every rank shares (``shared_cores``), the FLOPs of all ranks together, since
  the machine ends Newton-Schulz when it has done every rank's share;
* AdamW (``layout="adamw"``): the same plan's reduce-scatters and all-gathers, no Newton-Schulz;
* the group layout (``layout="group"``): as owner, the all-to-alls carrying each rank's piece to every
  member's block; each member's Newton-Schulz share (``layouts.group_ns_flops``, B's rows split) and its
  group's collectives (``layouts.group_seconds``: Gram all-reduces and B all-gathers, alpha-beta on the link
  the group spans: ``intra`` when all members share a node). The rank that bounds the step is the one with
  the most NS + group seconds; ``ns_group_gram`` and ``newton_schulz`` are that rank's. The plan is the
  optimizer's default (groups sized by FLOPs) or, with ``timed_groups=True``, sized by time on the same
  profile (``build_plan(..., hw=profile)``).

The step is priced serially (communication + Newton-Schulz, no overlap: an upper bound; overlap
can at best hide the smaller of the two). The optimizer's element-wise work (momentum, AdamW's
moments, the update) is left out on both sides.

A profile is a dict: the five keys a plan sizes groups with (``muongrid.hardware``: ``flops``, matmul FLOP/s
of one rank, and ``efficiency``, Newton-Schulz's share of it; ``ranks_per_node``, ranks on the fast link,
``None``: all on one machine; ``intra`` and ``inter``, (alpha s, beta bytes/s) per link), and
``reduce_scatter_as_all_reduce`` (a backend whose reduce-scatter is an all-reduce of the whole input: gloo's
own, which ``Comm`` no longer runs, so False in both profiles) and
``shared_cores`` (the ``flops`` is the whole machine's, shared by the ranks computing at once), and
optionally ``max_ranks`` (the largest grid the profile is meant for; callers skip larger ones).
Two are provided: ``h100()`` (``muongrid.hardware.H100``, from the book's one hardware table,
``hardware.H100_TABLE``: datasheet figures, the GPU record's measurements and stated assumptions, each with its
source) and ``this_machine()`` (measured here by ``scripts/calibrate_time_model.py``,
recorded with its provenance in ``book/data/time_model_cpu.json``).

``wholestep.py`` extends this model from the optimizer to the whole training step (forward + backward and the
element-wise passes) for real configurations.

    python -m muongrid.lab.timemodel       # the proof of concept's shapes on 4 x 1 and 2 x 2, both profiles
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .. import hardware
from ..group_routes import count_in_band, local_band, long_bounds
from ..layouts import group_ns_flops, group_seconds
from ..newton_schulz import NS_STEPS, ns5_flops
from ..owner_routes import PREFETCH_CHUNKS, exchange_chunks
from . import costmodel

# Chapter 13 compares the first four (``layout_seconds``' default, the layout explorer); "group" (chapter 15)
# is priced on request.
CLASSIC_LAYOUTS = ("adamw", "bucket", "owner", "aligned")
TIME_LAYOUTS = CLASSIC_LAYOUTS + ("group",)
PROFILE_KEYS = ("flops", "efficiency", "ranks_per_node", "intra", "inter", "reduce_scatter_as_all_reduce",
                "shared_cores")
CPU_RECORD = Path("book") / "data" / "time_model_cpu.json"
# The book launches at most 8 ranks on one machine; beyond that, one small CPU's measured link and
# matmul rates (shared by every rank) say nothing useful, so this profile is not applied there.
CPU_MAX_RANKS = 8


def _root() -> Path:
    from .notebook import ROOT  # the checkout the book runs from (a notebook runs in notebooks/)

    return ROOT


def h100() -> dict:
    """The H100 cluster profile: ``muongrid.hardware.h100()`` (NVLink inside a node of 8, InfiniBand between
    nodes; the figures and their sources are ``hardware.H100_TABLE``), with the time model's two further keys."""
    return dict(hardware.h100(), name="H100 cluster (assumed public figures)", reduce_scatter_as_all_reduce=False,
                shared_cores=False)


def this_machine(path: Path | None = None) -> dict:
    """The profile calibrated on this machine (``scripts/calibrate_time_model.py``), with its record."""
    record = json.loads(((path or _root() / CPU_RECORD)).read_text())
    profile = dict(record["profile"], intra=tuple(record["profile"]["intra"]), inter=tuple(record["profile"]["inter"]))
    return dict(profile, max_ranks=CPU_MAX_RANKS, provenance={k: record[k] for k in ("command", "commit", "torch", "cpu", "cores",
                                                              "recorded_at", "load_average_before")})


def plan_profile(cpu: dict, ranks: int, cores: int | None = None, threads: int | None = None) -> dict:
    """The hardware profile (``muongrid.hardware``) that sizes the group layout's groups for ``ranks`` ranks
    launched on the machine ``cpu`` describes (``this_machine()``: its ``flops`` is the whole machine's,
    ``shared_cores``). Each rank runs ``threads`` threads (default: what ``launch.py`` gives, ``cores //
    ranks``, at least one), so it computes at that share of the machine's rate and ``cores // threads``
    ranks compute at once (``parallel_ranks``); every rank is on the one node, over the measured link.
    ``cores`` defaults to this machine's. ``--hw this-machine`` (``hw_arg``) builds it for a launch.

        python -c "import json; from muongrid.lab.timemodel import this_machine, plan_profile; \
                   print(json.dumps(plan_profile(this_machine(), 4)))" > hw.json   # then --hw hw.json
    """
    if not cpu.get("shared_cores"):
        raise ValueError("plan_profile turns a profile of one machine whose cores the ranks share (shared_cores, "
                         "this_machine()) into a plan profile; give a cluster's profile to the plan as it is")
    cores = os.cpu_count() or 1 if cores is None else cores
    if ranks < 1 or cores < 1 or (threads is not None and threads < 1):
        raise ValueError(f"plan_profile needs ranks, cores and threads >= 1, got {ranks}, {cores}, {threads}")
    threads = min(cores, threads or max(1, cores // ranks))
    return hardware.profile(flops=cpu["flops"] * threads / cores, efficiency=cpu["efficiency"],
                            ranks_per_node=None, intra=cpu["intra"], inter=cpu["inter"],
                            parallel_ranks=max(1, cores // threads))


THIS_MACHINE = "this-machine"


def hw_arg(spec: str):
    """The type of a script's ``--hw``: ``hardware.load``'s profiles, or ``THIS_MACHINE`` (kept as a name until
    ``resolve_hw`` knows the launch's ranks)."""
    return THIS_MACHINE if spec.lower() == THIS_MACHINE else hardware.load(spec)


def resolve_hw(parser, args, threads: int | None = None) -> None:
    """``--hw this-machine`` (``args.hw_spec``) as the profile of this launch: the calibrated CPU profile of
    book/data (``this_machine``) for ``args.dp * args.tp`` ranks (``plan_profile``; under torchrun with the
    threads this process runs). Call it before each launch; a usage error if the calibration is missing."""
    if getattr(args, "hw_spec", None) != THIS_MACHINE:
        return
    from ..launch import under_torchrun

    if under_torchrun() and threads is None:
        import torch
        threads = torch.get_num_threads()
    try:
        args.hw = plan_profile(this_machine(), args.dp * args.tp, threads=threads)
    except FileNotFoundError as e:
        parser.error(f"--hw {THIS_MACHINE} reads this machine's calibration in a checkout ({e.filename}): run "
                     "from the repository (make record, or scripts/calibrate_time_model.py, writes it)")


def check_profile(hw: dict) -> None:
    """The plan's five keys checked by ``hardware.check_hw``, and the time model's two more present."""
    missing = [k for k in PROFILE_KEYS if k not in hw]
    if missing:
        raise ValueError(f"hardware profile lacks {missing}: give every one of {PROFILE_KEYS} (see timemodel's docstring)")
    hardware.check_hw({k: v for k, v in hw.items() if k != "shared_cores"})   # the values; shared is fine here


def ns_flops_per_rank(plan, use_muon: list[bool], steps: int = NS_STEPS) -> list[int]:
    """Newton-Schulz FLOPs of one step on every world rank: every matrix on every rank under the bucket
    layout, each matrix on its owner otherwise, and a grouped matrix's member share on each member."""
    load = [0] * plan.world
    for g, metas in enumerate(plan.metas):
        if not use_muon[g]:
            continue
        for meta in metas:
            flops = ns5_flops(*meta.full_shape)
            members = plan.group_of(meta)
            if plan.layout == "bucket":
                load = [x + flops for x in load]
            elif members is not None:
                for r in members:
                    load[r] += group_ns_flops(*meta.full_shape, len(members), steps, split_b=True)
            else:
                load[plan.owner_of(meta)] += flops
    return load


def group_seconds_per_rank(plan, hw: dict, steps: int = NS_STEPS) -> list[float]:
    """Seconds each rank spends in its groups' collectives per step (``layouts.group_seconds`` on the link
    each group spans: ``intra`` if every member is on one node of ``ranks_per_node``, else ``inter``)."""
    node = hw["ranks_per_node"] or plan.world
    out = [0.0] * plan.world
    for key, members in plan.groups.items():
        rows, cols = plan.metas[key[0]][key[1]].full_shape
        link = hw["intra"] if members[0] // node == members[-1] // node else hw["inter"]
        t = group_seconds(rows, cols, len(members), steps, link)
        for r in members:
            out[r] += t
    return out


def owner_traffic(plan, g: int, bucket) -> tuple[list[list[int]], list[list[int]]]:
    """Bytes ``[sender][receiver]`` of one Muon bucket's two all-to-alls under the owner layouts: to the
    owners (or members), and back, pair by pair (``piece_exchange``)."""
    world = plan.world
    there = [[0] * world for _ in range(world)]
    back = [[0] * world for _ in range(world)]
    for i in bucket.param_indices:
        meta = plan.metas[g][i]
        for q in plan.group_of(meta) or (plan.owner_of(meta),):
            for r in range(world):
                if r != q:
                    sent, returned = piece_exchange(plan, meta, r, q)
                    there[r][q] += sent
                    back[q][r] += returned
    return there, back


def piece_exchange(plan, meta, r: int, q: int) -> tuple[int, int]:
    """(bytes rank ``r`` sends to ``q``, bytes ``q`` sends back to ``r``) for one matrix, ``q`` its owner or
    one of its group's members. The rules of ``costmodel._rank_bytes``: a rank sends its piece to the owner
    (a TP-replicated matrix only from the owner's TP rank) and gets its piece back; under the group layout,
    the part of its piece in the member's block (``group_routes.count_in_band``), and back."""
    tp, members = plan.tp, plan.group_of(meta)
    if members is None:
        n = plan.piece_numel(meta, r // tp)
    else:
        dim, bounds = long_bounds(meta.full_shape, len(members))
        k, piece = members.index(q), plan.piece_slice(meta, r // tp)
        lo, hi = local_band(meta.full_shape, meta.shape, meta.tp_split_dim, r % tp, bounds[k], bounds[k + 1])
        n = count_in_band(piece.start, piece.stop, meta.shape, dim, lo, hi)
    sends = meta.tp_split_dim != -1 or r % tp == q % tp
    return (n if sends else 0) * costmodel.NS_BYTES, n * costmodel.NS_BYTES


def all_to_all_seconds(calls: list[list[list[int]]], hw: dict) -> float:
    """A phase of all-to-alls (one per chunk of buckets): ``calls[k][i][j]`` bytes from rank i to rank j in
    call k. Each rank pays ``alpha`` per peer it exchanges with in each call, and the larger of what it
    sends and what it receives in the whole phase over ``beta``, per link kind (inside a node, between
    nodes; the two kinds work at once). The buckets' all-to-alls follow each other on one
    communicator with nothing between them, so the phase ends when its busiest rank has moved its
    bytes (not when every call has waited for that call's own busiest rank: a bound no tighter)."""
    world = len(calls[0]) if calls else 0
    per_node = hw["ranks_per_node"] or world
    worst = 0.0
    for r in range(world):
        kinds = {}
        for traffic in calls:
            for q in range(world):
                if q == r or not (traffic[r][q] or traffic[q][r]):
                    continue
                k = kinds.setdefault(r // per_node == q // per_node, [0, 0, 0])
                k[0] += 1
                k[1] += traffic[r][q]
                k[2] += traffic[q][r]
        for same_node, (peers, sent, received) in kinds.items():
            alpha, beta = hw["intra"] if same_node else hw["inter"]
            worst = max(worst, peers * alpha + max(sent, received) / beta)
    return worst


def busiest_ns_flops(groups: list[dict], dp: int, tp: int, bucket_numel: int | None, layout: str) -> int:
    """Newton-Schulz FLOPs of the busiest rank per step under ``layout`` (0 for "adamw")."""
    if layout == "adamw":
        return 0
    plan = costmodel.plans_for(groups, dp, tp, bucket_numel, layout)[0]
    return max(ns_flops_per_rank(plan, [bool(g["use_muon"]) for g in groups]))


def _summed(matrices: list[list[list[int]]]) -> list[list[int]]:
    """Traffic matrices added up: the buckets of one chunk travel in one all-to-all."""
    return [[sum(m[i][j] for m in matrices) for j in range(len(matrices[0][i]))] for i in range(len(matrices[0]))]


def step_seconds(groups: list[dict], dp: int, tp: int, bucket_numel: int | None, layout: str, hw: dict,
                 timed_groups: bool = False, chunks: int = PREFETCH_CHUNKS) -> dict:
    """Modelled seconds of one optimizer step, by phase, on the slowest rank, for ``groups`` (``costmodel``
    form) on a ``dp x tp`` grid under ``layout`` (one of ``TIME_LAYOUTS``; "adamw": Distributed AdamW).
    The owner layouts' all-to-alls are priced as the flows issue them with "prefetch" (their default): a Muon
    group's buckets joined into ``chunks`` exchanges per direction (``owner_routes.exchange_chunks``).
    Also: the busiest rank's Newton-Schulz FLOPs, ``comm`` (all collectives) and ``total`` (comm + NS)."""
    if layout not in TIME_LAYOUTS:
        raise ValueError(f"layout must be one of {TIME_LAYOUTS}, got {layout!r}")
    check_profile(hw)
    muon = layout != "adamw"
    timed = hw if layout == "group" and timed_groups else None   # the plan's groups sized on this profile
    plan = costmodel.plans_for(groups, dp, tp, bucket_numel, "bucket" if layout == "adamw" else layout, muon,
                               timed)[0]
    use_muon = [bool(muon and gr["use_muon"]) for gr in groups]
    per_node = hw["ranks_per_node"] or dp * tp
    links = costmodel.links_for_grid(dp, tp, per_node, hw["intra"], hw["inter"])
    rs_op = "all_reduce" if hw["reduce_scatter_as_all_reduce"] else "reduce_scatter"
    out = dict.fromkeys(costmodel.PHASES, 0.0)
    to_owner, from_owner = [], []  # the owner layouts' all-to-alls, one per chunk of a Muon group's buckets
    for g, buckets in enumerate(plan.buckets):
        traffic = []
        for bucket in buckets:
            shard = bucket.shard_numel
            out["grad_reduce_scatter"] += costmodel.collective_seconds(rs_op, dp, shard * costmodel.GRAD_BYTES,
                                                                       *links["dp"])
            out["param_all_gather"] += costmodel.collective_seconds("all_gather", dp, shard * costmodel.PARAM_BYTES,
                                                                    *links["dp"])
            if not use_muon[g]:
                continue
            if layout == "bucket":
                out["ns_gather_dp"] += costmodel.collective_seconds("all_gather", dp, shard * costmodel.NS_BYTES,
                                                                    *links["dp"])
                for i in bucket.param_indices:
                    meta = plan.metas[g][i]
                    if meta.tp_split_dim != -1 and tp > 1:
                        out["ns_gather_tp"] += costmodel.collective_seconds(
                            "all_gather", tp, meta.numel * costmodel.NS_BYTES, *links["tp"])
            else:
                traffic.append(owner_traffic(plan, g, bucket))
        for chunk, _ in exchange_chunks([(t, ()) for t in traffic], "prefetch", chunks):   # what the flows issue
            to_owner.append(_summed([there for there, _ in chunk]))
            from_owner.append(_summed([back for _, back in chunk]))
    out["ns_to_owner"] = all_to_all_seconds(to_owner, hw)
    out["ns_from_owner"] = all_to_all_seconds(from_owner, hw)
    load = ns_flops_per_rank(plan, use_muon)
    rate = hw["flops"] * hw["efficiency"]
    gram = group_seconds_per_rank(plan, hw) if layout == "group" else [0.0] * plan.world
    if hw["shared_cores"]:   # one machine: NS ends when every rank's share is done; the busiest rank's talk
        out["newton_schulz"], out["ns_group_gram"] = sum(load) / rate, max(gram)
    else:                    # the rank with the most NS + group seconds bounds the step
        bound = max(range(plan.world), key=lambda r: (load[r] / rate + gram[r], -r))
        out["newton_schulz"], out["ns_group_gram"] = load[bound] / rate, gram[bound]
    out["comm"] = sum(out[p] for p in costmodel.PHASES)
    out["busiest_ns_flops"] = max(load)
    out["total"] = out["comm"] + out["newton_schulz"]
    return out


def fsdp2_extra_seconds(shapes: list[tuple[int, int]], dp: int, hw: dict) -> dict:
    """What ``FSDPMuon`` adds to a step on a DP-only FSDP2 grid, in seconds: its one all-to-all of every
    matrix's row blocks to the owners and one back (``fsdp_routes``, the routes it runs; bf16), and the
    busiest owner's Newton-Schulz. FSDP2's own gathers and reduce-scatters are not in it (``choice``)."""
    from ..fsdp_routes import routes
    from .choice import fsdp2_row_pieces

    check_profile(hw)
    by_rank = [fsdp2_row_pieces(s, dp) for s in shapes]
    r = routes(list(shapes), [[by_rank[m][d] for m in range(len(shapes))] for d in range(dp)], tp=1)
    off_diagonal = lambda counts, q: [0 if j == q else c * costmodel.NS_BYTES for j, c in enumerate(counts)]  # noqa: E731
    there = [off_diagonal(r.send_counts(q), q) for q in range(dp)]
    back = [off_diagonal(r.back_counts(q), q) for q in range(dp)]
    load = [sum(ns5_flops(*shapes[m]) for m in r.owned(q)) for q in range(dp)]
    out = dict(ns_to_owner=all_to_all_seconds([there], hw), ns_from_owner=all_to_all_seconds([back], hw),
               newton_schulz=(sum(load) if hw["shared_cores"] else max(load)) / (hw["flops"] * hw["efficiency"]))
    out["total"] = sum(out.values())
    return out


def layout_seconds(groups: list[dict], dp: int, tp: int, bucket_numel: int | None, hw: dict,
                   layouts: tuple[str, ...] = CLASSIC_LAYOUTS) -> dict:
    """``step_seconds`` for every layout of ``layouts`` (chapter 13's four unless asked), keyed by layout."""
    return {layout: step_seconds(groups, dp, tp, bucket_numel, layout, hw) for layout in layouts}


if __name__ == "__main__":
    from .synthetic import DEFAULT_SHAPES, DEFAULT_TP_DIMS

    groups = [dict(shapes=DEFAULT_SHAPES, tp_split_dims=DEFAULT_TP_DIMS, use_muon=True)]
    for hw in (this_machine(), h100()):
        for dp, tp in ((4, 1), (2, 2)):
            for layout, t in layout_seconds(groups, dp, tp, "auto", hw).items():
                print(f"{hw['name']:>40} {dp}x{tp} {layout:>8}: comm {t['comm'] * 1e3:9.3f} ms, "
                      f"NS {t['newton_schulz'] * 1e3:9.3f} ms, total {t['total'] * 1e3:9.3f} ms")
