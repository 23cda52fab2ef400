"""The real ZeRO-1 plan for real model shapes on up to 1,024 ranks and more, built without launching anything.

Models (``--model``): Llama-3-70B, Llama-3-8B, Llama-3.2-1B, and two MoEs with one matrix per expert:
Moonlight-16B-A3B and Kimi K2, a 1T-class model (their shapes and sources in the builders below).

For each DP x TP grid, two plans of ``muongrid.plan.build_plan`` (the code the optimizer runs), each built and
timed: the "owner" layout (one owner per matrix) and the "group" layout with this script's hardware profile
(``build_plan(..., layout="group", hw=profile(H100))``: a matrix goes to one owner or to a group of ranks,
whichever finishes it first counting the group's collectives, ``layouts.assign_timed``). Per plan, per rank:

* Newton-Schulz FLOPs, as max / mean over ranks (1.0 = perfectly balanced; the step waits for the max);
* bytes sent per step, from the closed form (``lab/costmodel``'s rules, summed for every rank in one pass,
  ``bytes_per_rank``; ``tests/test_plan_at_scale.py`` checks the two agree, groups included), and AdamW's;
* bytes sent per step to another node (``cross_node_bytes_per_rank``: the all-to-alls point to point, the
  rings to the next rank in the ring), as the busiest rank's;
* collectives per step: reduce-scatter + all-gather per bucket, K all-to-alls each way per Muon group (to
  the owners or members and back: its buckets joined into K = min(``PREFETCH_CHUNKS``, buckets) exchanges,
  as the flows issue them with "prefetch", ``owner_flow.exchange_chunks``), and per group membership
  1 + ns_steps all-reduces and ns_steps all-gathers;
* projected milliseconds on the busiest rank (``ns_seconds_per_rank``: NS FLOPs at a stated throughput plus
  each group's collectives by alpha-beta on the link it spans; ``step_seconds_per_rank``: the whole step,
  serial), with the constants of ``H100``: public H100 figures taken as assumptions, cited there;
* same-shape batching (``ns_batch=True``): matrices owned and Newton-Schulz calls (distinct shapes owned) on
  the rank that owns the most.

For comparison, the NS time of two older group rules on the same matrices (``group_assignment``): "scattered"
(groups of ceil(FLOPs / fair) on the least-loaded ranks anywhere, this script's first rule) and "flops" (the
optimizer's group layout without a profile: the same sizes, contiguous TP-local windows).

    python scripts/plan_at_scale.py [--model llama3-70b] [--grids 8x8,32x8,128x8,64x16,1024x1] [--json]
    python scripts/plan_at_scale.py --model kimi-k2 --grids 128x8 --bucket-numel 268435456   # fewer, larger buckets
"""
from __future__ import annotations

import argparse
import json
import sys
import time


from muongrid import hardware
from muongrid.group_routes import count_in_band, local_band, long_bounds
from muongrid.lab.costmodel import collective_seconds, group_bytes, links_for_grid
from muongrid.lab.timemodel import piece_exchange
from muongrid.layouts import assign_owners_and_groups, group_ns_flops, group_seconds
from muongrid.newton_schulz import NS_STEPS, ns5_flops
from muongrid.owner_flow import PREFETCH_CHUNKS
from muongrid.plan import DEFAULT_BUCKET_NUMEL, ParamSpec, _owner_candidates, _piece_runs, build_plan

GRAD_BYTES, NS_BYTES, PARAM_BYTES = 4, 2, 4


def llama3(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, head_dim: int = 128,
           vocab: int = 128256, tied: bool = False) -> tuple[list[list[ParamSpec]], list[bool]]:
    """(groups, muon flags) of a dense Llama-3: one Muon group with every layer's 7 matrices (q, k, v, gate,
    up colwise: TP split dim 0; o, down rowwise: 1), one AdamW group (embedding, head unless ``tied`` to the
    embedding, norms)."""
    q, kv = heads * head_dim, kv_heads * head_dim
    muon = []
    for i in range(layers):
        muon += [ParamSpec(f"layers.{i}.q", (q, hidden), 0), ParamSpec(f"layers.{i}.k", (kv, hidden), 0),
                 ParamSpec(f"layers.{i}.v", (kv, hidden), 0), ParamSpec(f"layers.{i}.o", (hidden, q), 1),
                 ParamSpec(f"layers.{i}.gate", (intermediate, hidden), 0),
                 ParamSpec(f"layers.{i}.up", (intermediate, hidden), 0),
                 ParamSpec(f"layers.{i}.down", (hidden, intermediate), 1)]
    adamw = [ParamSpec("embed", (vocab, hidden), 0)] + ([] if tied else [ParamSpec("head", (vocab, hidden), 0)])
    adamw += [ParamSpec(f"norm.{i}", (hidden,), -1) for i in range(2 * layers + 1)]
    return [muon, adamw], [True, False]


def llama3_70b(layers: int = 80):
    """Llama-3-70B: hidden 8192, intermediate 28672, 80 layers, 64 query / 8 KV heads of 128, vocab 128256."""
    return llama3(8192, 28672, layers, 64, 8)


def llama3_8b(layers: int = 32):
    """Llama-3-8B: hidden 4096, intermediate 14336, 32 layers, 32 query / 8 KV heads of 128, vocab 128256."""
    return llama3(4096, 14336, layers, 32, 8)


def llama3_2_1b(layers: int = 16):
    """Llama-3.2-1B: hidden 2048, intermediate 8192, 16 layers, 32 query / 8 KV heads of 64, vocab 128256, the
    head tied to the embedding (1,235,814,400 parameters: the model of the GPU record's forward + backward)."""
    return llama3(2048, 8192, layers, 32, 8, head_dim=64, tied=True)


def mlp(prefix: str, inter: int, hidden: int) -> list[ParamSpec]:
    """A SwiGLU MLP's three matrices (gate and up colwise: TP split dim 0; down rowwise: 1), for the MoE builders'
    dense layers, shared experts and routed experts."""
    return [ParamSpec(f"{prefix}.gate", (inter, hidden), 0), ParamSpec(f"{prefix}.up", (inter, hidden), 0),
            ParamSpec(f"{prefix}.down", (hidden, inter), 1)]


def moonlight_16b_a3b(layers: int = 27, experts: int = 64):
    """Moonlight-16B-A3B (DeepSeek-V3 architecture), per-expert matrices.

    Config of huggingface.co/moonshotai/Moonlight-16B-A3B (config.json), as restated by the Megatron
    arguments in slime's scripts/models/moonlight.sh: hidden 2048, 27 layers of which the first is dense
    (intermediate 11264) and the other 26 MoE with 64 routed experts (intermediate 1408 each) and 2 shared
    experts (modelled as one MLP of 2 x 1408), 16 heads, vocab 163840. (Some NVIDIA pages say "8 shared
    experts, intermediate 10944": that is not this config.) Attention is MLA without a query LoRA
    (q_lora_rank null): q (16 x (128 + 64), 2048), kv_a (512 + 64, 2048), kv_b (16 x (128 + 128), 512),
    o (2048, 16 x 128).

    Simplified: every 2-D weight of attention and MLPs goes to Muon (the router (64 x 2048), norms, the
    embedding and head to AdamW); each expert's gate/up/down is its own matrix, TP-split like a dense MLP
    (expert tensor parallelism); expert parallelism is not modelled; kv_a is replicated over TP.
    """
    hidden, heads = 2048, 16
    muon, adamw = [], [ParamSpec("embed", (163840, hidden), 0), ParamSpec("head", (163840, hidden), 0)]

    for i in range(layers):
        muon += [ParamSpec(f"layers.{i}.q", (heads * 192, hidden), 0), ParamSpec(f"layers.{i}.kv_a", (576, hidden), -1),
                 ParamSpec(f"layers.{i}.kv_b", (heads * 256, 512), 0), ParamSpec(f"layers.{i}.o", (hidden, heads * 128), 1)]
        if i == 0:
            muon += mlp(f"layers.{i}.mlp", 11264, hidden)
        else:
            muon += mlp(f"layers.{i}.shared", 2 * 1408, hidden)
            for e in range(experts):
                muon += mlp(f"layers.{i}.expert.{e}", 1408, hidden)
            adamw.append(ParamSpec(f"layers.{i}.router", (experts, hidden), -1))
        adamw += [ParamSpec(f"layers.{i}.norm.{j}", (n,), -1) for j, n in enumerate((hidden, hidden, 512))]
    return [muon, adamw], [True, False]


def kimi_k2(layers: int = 61, experts: int = 384):
    """Kimi K2, the 1T-class MoE (about 1.03 x 10^12 parameters here), per-expert matrices.

    Config of huggingface.co/moonshotai/Kimi-K2-Instruct (config.json) and the Kimi K2 technical report
    (arXiv:2507.20534, its architecture table): DeepSeek-V3's architecture with hidden 7168, 61 layers of which
    the first is dense (intermediate 18432) and the other 60 MoE with 384 routed experts (intermediate 2048
    each) and 1 shared expert (2048), 64 heads, vocab 163840. Attention is MLA with a query LoRA of rank 1536:
    q_a (1536, 7168), q_b (64 x (128 + 64), 1536), kv_a (512 + 64, 7168), kv_b (64 x (128 + 128), 512),
    o (7168, 64 x 128). The same simplifications as ``moonlight_16b_a3b``; q_a and kv_a are replicated over TP.
    """
    hidden, heads = 7168, 64
    muon, adamw = [], [ParamSpec("embed", (163840, hidden), 0), ParamSpec("head", (163840, hidden), 0)]

    for i in range(layers):
        muon += [ParamSpec(f"layers.{i}.q_a", (1536, hidden), -1), ParamSpec(f"layers.{i}.q_b", (heads * 192, 1536), 0),
                 ParamSpec(f"layers.{i}.kv_a", (576, hidden), -1), ParamSpec(f"layers.{i}.kv_b", (heads * 256, 512), 0),
                 ParamSpec(f"layers.{i}.o", (hidden, heads * 128), 1)]
        if i == 0:
            muon += mlp(f"layers.{i}.mlp", 18432, hidden)
        else:
            muon += mlp(f"layers.{i}.shared", 2048, hidden)
            for e in range(experts):
                muon += mlp(f"layers.{i}.expert.{e}", 2048, hidden)
            adamw.append(ParamSpec(f"layers.{i}.router", (experts, hidden), -1))
        adamw += [ParamSpec(f"layers.{i}.norm.{j}", (n,), -1) for j, n in enumerate((hidden, hidden, 1536, 512))]
    return [muon, adamw], [True, False]


MODELS = {"llama3-70b": (llama3_70b, 80), "llama3-8b": (llama3_8b, 32), "llama3.2-1b": (llama3_2_1b, 16),
          "moonlight-16b-a3b": (moonlight_16b_a3b, 27), "kimi-k2": (kimi_k2, 61)}

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
    for key, rank in owners.items():
        flops[rank] += ns5_flops(*shapes[key])
    for key, members in groups.items():
        rows, cols = shapes[key]
        t = group_seconds(rows, cols, len(members), steps, span_link(members, prof))
        for r in members:
            flops[r] += group_ns_flops(rows, cols, len(members), steps, split_b=True)
            extra[r] += t
    return flops, [f / rate + x for f, x in zip(flops, extra)]


def bytes_per_rank(plan, muon: list[bool], steps: int = NS_STEPS) -> list[dict]:
    """Bytes each world rank sends per step, by phase, under ``plan``'s layout ("owner" or "group"): the closed
    form of ``lab/costmodel._rank_bytes``, for every rank in one pass. An owned matrix's DP pieces come as
    runs (``plan._piece_runs``), added to the ranks of a run at once (difference arrays), so Kimi K2's
    70,000 matrices on 1,024 ranks cost 70,000 steps, not 70 million; a grouped one likewise, per member
    (``_group_bytes_into``). ``tests/test_plan_at_scale.py`` checks it equals
    ``costmodel.step_bytes(..., rank=r)`` on every rank of small models."""
    dp, tp, world = plan.dp, plan.tp, plan.world
    out = [dict(grad_reduce_scatter=0, ns_to_owner=0, ns_group_gram=0, ns_from_owner=0, param_all_gather=0)
           for _ in range(world)]
    per_bucket = sum((dp - 1) * b.shard_numel for buf in plan.buckets for b in buf)
    every_tp = [0] * (dp + 1)                       # difference arrays over DP ranks: pieces sent by all TP ranks
    one_tp = [[0] * (dp + 1) for _ in range(tp)]    # ... by TP rank t only (a TP-replicated matrix)
    for g, metas in enumerate(plan.metas):
        if not muon[g]:
            continue
        for meta in metas:
            members = plan.group_of(meta)
            if members is not None:
                _group_bytes_into(plan, meta, members, steps, out, every_tp)
                continue
            owner = plan.owner_of(meta)
            runs = _piece_runs(plan.bucket_of(meta), meta, even=plan.layout != "aligned")
            diff = every_tp if meta.tp_split_dim != -1 else one_tp[owner % tp]
            mine = 0
            for lo, hi, n in runs:
                diff[lo] += n
                diff[hi] -= n
                if lo <= owner // tp < hi:
                    mine = n
            out[owner]["ns_to_owner"] -= mine * NS_BYTES          # the owner's own piece stays
            out[owner]["ns_from_owner"] += (tp * meta.numel - mine) * NS_BYTES
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
        for lo, hi, n in _piece_runs(plan.bucket_of(meta), meta, even=True):
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
                              steps: int = NS_STEPS) -> list[int]:
    """Bytes each rank sends per step to a rank on another node (``ranks_per_node`` consecutive ranks per
    node), from ``bytes_`` (``bytes_per_rank`` of the same plan) under this model of the collectives:

    * the all-to-alls (to the owners or members, and back) go point to point: a piece crosses when its
      sender and receiver sit on different nodes (``lab/timemodel.piece_exchange``, pair by pair);
    * the rings (the DP reduce-scatter and all-gather, a group's Gram all-reduces and B all-gathers) send
      each rank's bytes to its successor in the ring (DP index + 1, or the next member): all of them cross
      when that successor is on another node, none otherwise.

    So a rank's all-to-all bytes minus those to its own node: only the ranks of an owner's or member's node
    are visited per matrix (O(ranks_per_node), not O(world)). ``tests/test_plan_at_scale.py`` checks it
    against the pairs counted one by one."""
    dp, tp, world, node = plan.dp, plan.tp, plan.world, ranks_per_node
    near = [0] * world   # all-to-all bytes a rank sends to its own node
    neighbours = lambda r: range(r - r % node, min(world, r - r % node + node))  # noqa: E731
    for g, metas in enumerate(plan.metas):
        for meta in metas if muon[g] else ():
            for q in plan.group_of(meta) or (plan.owner_of(meta),):
                for r in neighbours(q):
                    if r != q:
                        sent, returned = piece_exchange(plan, meta, r, q)
                        near[r] += sent
                        near[q] += returned
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


def group_assignment(plan, muon: list[bool], rule: str, prof: dict):
    """(owners, groups) of a group mode for ``plan``'s matrices under one rule: "timed", the optimizer's group
    layout with the profile (``build_plan(layout="group", hw=prof)``, ``layouts.assign_timed``); "flops", the
    optimizer's group layout without one (groups of ceil(FLOPs / fair), contiguous TP-local windows);
    "scattered", this script's first rule (the same sizes, the least-loaded ranks anywhere)."""
    matrices = _owner_candidates(plan, muon)
    shapes = {m.key: plan.metas[m.key[0]][m.key[1]].full_shape for m in matrices}
    tp = {"scattered": None, "flops": plan.tp, "timed": plan.tp}[rule]
    hw = prof if rule == "timed" else None
    owners, groups, _ = assign_owners_and_groups(matrices, plan.world, shapes, split_b=True, tp=tp, hw=hw)
    return owners, groups, shapes


def grid_report(dp: int, tp: int, layers: int | None = None, model: str = "llama3-70b", hw: dict = H100,
                bucket_numel: int = DEFAULT_BUCKET_NUMEL, rules: tuple[str, ...] = ("scattered", "flops")) -> dict:
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
        shapes = {(m.buffer_idx, m.param_idx): m.full_shape for m in plan.metas[0]}
        flops, ns_s = ns_seconds_per_rank(plan.owners, plan.groups, shapes, world, prof)
        bytes_ = bytes_per_rank(plan, muon)
        totals = [b["total"] for b in bytes_]
        cross = cross_node_bytes_per_rank(plan, muon, bytes_, prof["ranks_per_node"])
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
    for rule in rules:
        owners, groups, shapes = group_assignment(owner_plan, muon, rule, prof)
        flops, ns_s = ns_seconds_per_rank(owners, groups, shapes, world, prof)
        out[f"{rule}_ns_ms"] = max(ns_s) * 1e3
        out[f"{rule}_ns_max_over_mean"] = max(flops) / mean(flops)
        out[f"{rule}_group_size_max"] = max(map(len, groups.values()), default=0)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grids", default="8x8,32x8,128x8,64x16,1024x1")
    p.add_argument("--model", default="llama3-70b", choices=sorted(MODELS))
    p.add_argument("--layers", type=int, default=None, help="fewer layers than the model's (for a quick look)")
    p.add_argument("--bucket-numel", type=int, default=DEFAULT_BUCKET_NUMEL,
                   help="elements per ZeRO-1 bucket (default 2**20); a matrix larger than a bucket gets its own, so on "
                        "a model of many large matrices this sets the collectives per step")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        grids = [tuple(int(x) for x in g.lower().split("x")) for g in args.grids.split(",")]
        assert all(len(g) == 2 and min(g) > 0 for g in grids)
    except (ValueError, AssertionError):
        p.error(f"--grids takes DPxTP,... e.g. 128x8; got {args.grids!r}")
    if args.bucket_numel < 1:
        p.error(f"--bucket-numel must be at least 1, got {args.bucket_numel}")
    rows = []
    print(f"{args.model}: owner plan vs the optimizer's group plan (build_plan(layout='group', hw=profile(H100))); NS "
          "FLOPs per rank max/mean (1.0 = balanced); GB sent per rank per step (closed form), and GB of them sent to "
          f"another node (x-node: nodes of {profile()['ranks_per_node']} ranks, cross_node_bytes_per_rank); "
          "collectives per rank per step; ms per step on the busiest rank projected to H100s (assumed figures, see "
          "H100): NS with the "
          "group collectives, and the whole step (serial); the NS ms of the older group rules for comparison")
    print(f"{'grid':>8} {'ranks':>5} | {'build s':>7} {'max/mean':>8} {'GB max':>7} {'x-node':>7} {'coll':>6} "
          f"{'NS ms':>7} {'step ms':>8} | {'build s':>7} {'max/mean':>8} {'grouped':>7} {'k max':>5} {'GB max':>7} "
          f"{'x-node':>7} {'coll':>6} {'NS ms':>7} {'step ms':>8} | {'scattered':>9} {'flops':>7} {'ideal':>7}")
    print(f"{'':>14} | {'owner':^57} | {'group (optimizer, timed)':^75} | {'NS ms of other rules':^25}")
    for dp, tp in grids:
        r = grid_report(dp, tp, args.layers, args.model, bucket_numel=args.bucket_numel)
        rows.append(r)
        print(f"{dp}x{tp:<4} {r['world']:>5} | {r['owner_build_s']:>7.2f} {r['owner_ns_max_over_mean']:>8.2f} "
              f"{r['owner_bytes_per_rank_max'] / 1e9:>7.2f} {r['owner_cross_node_bytes_max'] / 1e9:>7.2f} "
              f"{r['owner_collectives_per_rank_max']:>6} "
              f"{r['owner_ns_ms']:>7.2f} {r['owner_step_ms']:>8.2f} | {r['group_build_s']:>7.2f} "
              f"{r['group_ns_max_over_mean']:>8.2f} {r['grouped_matrices']:>7} {r['group_size_max']:>5} "
              f"{r['group_bytes_per_rank_max'] / 1e9:>7.2f} {r['group_cross_node_bytes_max'] / 1e9:>7.2f} "
              f"{r['group_collectives_per_rank_max']:>6} "
              f"{r['group_ns_ms']:>7.2f} {r['group_step_ms']:>8.2f} | {r['scattered_ns_ms']:>9.2f} "
              f"{r['flops_ns_ms']:>7.2f} {r['ideal_ns_ms']:>7.2f}", flush=True)
    if args.json:
        print(json.dumps({"model": args.model, "hw": H100, "rows": rows}))   # one JSON object (lab.notebook.last_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
