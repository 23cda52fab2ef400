"""The real ZeRO-1 plan for real model shapes on up to 1,024 ranks and more, built without launching anything.

Models (``--model``): Llama-3-70B, Llama-3-8B, and two MoEs with one matrix per expert: Moonlight-16B-A3B and
Kimi K2, a 1T-class model (their shapes and sources in the builders below).

For each DP x TP grid: ``dmuon.plan.build_plan`` (buckets, cuts, owners; the same code the optimizer
runs) and its build time, then per rank:

* Newton-Schulz FLOPs under owner-per-matrix (the "owner" layout) and with the group mode
  (``layouts.assign_owners_and_groups``: a matrix above the fair share is orthogonalised by a group of
  ranks, ``ns_group.py``), as max / mean over ranks (1.0 = perfectly balanced; the step waits for the max),
  the group mode with every rank computing all of ``B = bA + cA^2`` and with B's rows split (``split_b``);
* bytes sent per step by the owner layout, from the closed form (``lab/costmodel.py``'s rules, summed
  per rank in one pass; ``tests/test_plan_at_scale.py`` checks the two agree on a small model), and AdamW's;
* same-shape batching (``ns_batch=True``): matrices owned and Newton-Schulz calls (distinct shapes
  owned) on the rank that owns the most, under the owner layout;
* collectives per step per rank: reduce-scatter + all-gather per bucket, two all-to-alls per Muon
  bucket (to the owners and back), and with the group mode 1 + ns_steps all-reduces per grouped matrix
  on each of its members.

The group mode is planned here only: the optimizer does not yet route a matrix to a group, so its
bytes are an estimate (members receive their long-side shard of the matrix and send it back, bf16, plus
the ring all-reduces of the m x m Gram in fp32), marked as such.

Time model (``ns_seconds_per_rank``), per rank per step: Newton-Schulz FLOPs at a stated throughput plus
the alpha-beta time of the group mode's all-reduces and shard trips; the step waits for the busiest rank.
The constants (``H100``) are public H100 figures taken as assumptions, cited there, not measured here.

    python scripts/plan_at_scale.py [--model llama3-70b] [--grids 8x8,32x8,128x8,64x16,1024x1] [--json]
    python scripts/plan_at_scale.py --model kimi-k2 --grids 128x8 --bucket-numel 268435456   # fewer, larger buckets
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dmuon.lab.costmodel import collective_seconds  # noqa: E402
from dmuon.layouts import assign_owners_and_groups  # noqa: E402
from dmuon.newton_schulz import NS_STEPS, ns5_flops  # noqa: E402
from dmuon.plan import DEFAULT_BUCKET_NUMEL, ParamSpec, _owner_candidates, build_plan  # noqa: E402

GRAD_BYTES, NS_BYTES, PARAM_BYTES = 4, 2, 4


def llama3(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, head_dim: int = 128,
           vocab: int = 128256) -> tuple[list[list[ParamSpec]], list[bool]]:
    """(groups, muon flags) of a dense Llama-3: one Muon group with every layer's 7 matrices (q, k, v, gate,
    up colwise: TP split dim 0; o, down rowwise: 1), one AdamW group (embedding, head, norms)."""
    q, kv = heads * head_dim, kv_heads * head_dim
    muon = []
    for i in range(layers):
        muon += [ParamSpec(f"layers.{i}.q", (q, hidden), 0), ParamSpec(f"layers.{i}.k", (kv, hidden), 0),
                 ParamSpec(f"layers.{i}.v", (kv, hidden), 0), ParamSpec(f"layers.{i}.o", (hidden, q), 1),
                 ParamSpec(f"layers.{i}.gate", (intermediate, hidden), 0),
                 ParamSpec(f"layers.{i}.up", (intermediate, hidden), 0),
                 ParamSpec(f"layers.{i}.down", (hidden, intermediate), 1)]
    adamw = [ParamSpec("embed", (vocab, hidden), 0), ParamSpec("head", (vocab, hidden), 0)]
    adamw += [ParamSpec(f"norm.{i}", (hidden,), -1) for i in range(2 * layers + 1)]
    return [muon, adamw], [True, False]


def llama3_70b(layers: int = 80):
    """Llama-3-70B: hidden 8192, intermediate 28672, 80 layers, 64 query / 8 KV heads of 128, vocab 128256."""
    return llama3(8192, 28672, layers, 64, 8)


def llama3_8b(layers: int = 32):
    """Llama-3-8B: hidden 4096, intermediate 14336, 32 layers, 32 query / 8 KV heads of 128, vocab 128256."""
    return llama3(4096, 14336, layers, 32, 8)


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


MODELS = {"llama3-70b": (llama3_70b, 80), "llama3-8b": (llama3_8b, 32), "moonlight-16b-a3b": (moonlight_16b_a3b, 27),
          "kimi-k2": (kimi_k2, 61)}

# The time model's constants for a projection to H100s: ASSUMPTIONS taken from public figures, not measured here.
# - bf16 dense matmul: 989 TFLOP/s peak (NVIDIA H100 SXM datasheet, nvidia.com/en-us/data-center/h100: 1,979 "with
#   sparsity", half that dense); Newton-Schulz is charged at NS_EFFICIENCY of it (assumed 50%: large GEMMs reach more,
#   the small m x m iterations and the expert matrices less).
# - NVLink 4 inside a node of 8: 900 GB/s per GPU both ways together (same datasheet), so 450 GB/s one way;
#   latency per ring hop assumed 3 us.
# - InfiniBand between nodes: one 400 Gb/s NDR ConnectX-7 per GPU (DGX H100 user guide), 50 GB/s one way;
#   latency per ring hop assumed 5 us.
H100 = dict(flops=989e12, efficiency=0.5, gpus_per_node=8, nvlink=(3e-6, 450e9), infiniband=(5e-6, 50e9))


def ns_seconds_per_rank(load: list[int], groups: dict, shapes: dict, hw: dict = H100, steps: int = NS_STEPS,
                        split_b: bool = False) -> list[float]:
    """Newton-Schulz seconds of one step on every rank: its FLOPs at ``hw['flops'] * hw['efficiency']``, plus,
    for each group it belongs to, the alpha-beta time (``costmodel.collective_seconds``) of the group's ring
    all-reduces (1 + steps, fp32 m x m Grams; with ``split_b`` also steps bf16 B's) and of its long-side shard's
    trip there and back (bf16, at the link's bandwidth). A group of at most ``gpus_per_node`` is priced on
    NVLink (as if placed on one node: the assignment does not place it so yet, so this is optimistic), a
    larger one on InfiniBand."""
    rate = hw["flops"] * hw["efficiency"]
    out = [x / rate for x in load]
    for key, members in groups.items():
        rows, cols = shapes[key]
        m, n, size = min(rows, cols), max(rows, cols), len(members)
        alpha, beta = hw["nvlink"] if size <= hw["gpus_per_node"] else hw["infiniband"]
        t = collective_seconds("all_reduce", size, 4 / size, alpha, beta)
        t += steps * collective_seconds("all_reduce", size, 4 * m * m / size, alpha, beta)
        if split_b:
            t += steps * collective_seconds("all_reduce", size, 2 * m * m / size, alpha, beta)
        t += 2 * (alpha + m * -(-n // size) * NS_BYTES / beta)
        for r in members:
            out[r] += t
    return out


def owner_bytes_per_rank(plan, muon: list[bool]) -> list[dict]:
    """Bytes each world rank sends per step under the owner layout, by phase: the closed form of
    ``lab/costmodel._rank_bytes``, summed for every rank in one pass over the matrices."""
    dp, tp, world = plan.dp, plan.tp, plan.world
    out = [dict(grad_reduce_scatter=0, ns_to_owner=0, ns_from_owner=0, param_all_gather=0) for _ in range(world)]
    per_bucket = sum((dp - 1) * b.shard_numel for buf in plan.buckets for b in buf)
    for r in range(world):
        out[r]["grad_reduce_scatter"] = per_bucket * GRAD_BYTES
        out[r]["param_all_gather"] = per_bucket * PARAM_BYTES
    for g, metas in enumerate(plan.metas):
        if not muon[g]:
            continue
        for meta in metas:
            owner = plan.owner_of(meta)
            pieces = [plan.piece_numel(meta, d) for d in range(dp)]
            split = meta.tp_split_dim != -1
            back = 0
            for r in range(world):
                if r == owner:
                    continue
                back += pieces[r // tp]
                if split or r % tp == owner % tp:
                    out[r]["ns_to_owner"] += pieces[r // tp] * NS_BYTES
            out[owner]["ns_from_owner"] += back * NS_BYTES
    for o in out:
        o["total"] = sum(o.values())
    return out


def collectives_per_rank(plan, muon: list[bool], groups: dict | None = None, steps: int = NS_STEPS) -> list[int]:
    world = plan.world
    n = 0
    for g, buckets in enumerate(plan.buckets):
        n += len(buckets) * ((2 if plan.dp > 1 else 0) + (2 if muon[g] and world > 1 else 0))
    out = [n] * world
    for members in (groups or {}).values():
        for r in members:
            out[r] += 1 + steps
    return out


def grid_report(dp: int, tp: int, layers: int | None = None, model: str = "llama3-70b", hw: dict = H100,
                bucket_numel: int = DEFAULT_BUCKET_NUMEL) -> dict:
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: pick one of {', '.join(MODELS)}")
    build, default_layers = MODELS[model]
    specs, muon = build(default_layers if layers is None else layers)
    t0 = time.perf_counter()
    plan = build_plan(specs, dp, 0, tp, bucket_numel=bucket_numel, layout="owner", muon=muon)
    build_s = time.perf_counter() - t0
    world = dp * tp
    shapes = {(m.buffer_idx, m.param_idx): m.full_shape for m in plan.metas[0]}
    load = [0] * world
    owned, owned_shapes = [0] * world, [set() for _ in range(world)]
    for key, rank in plan.owners.items():
        load[rank] += ns5_flops(*shapes[key])
        owned[rank] += 1
        owned_shapes[rank].add(shapes[key])
    t0 = time.perf_counter()
    candidates = _owner_candidates(plan, muon)
    _, groups, group_load = assign_owners_and_groups(candidates, world, shapes)
    group_s = time.perf_counter() - t0
    _, groups_b, group_load_b = assign_owners_and_groups(candidates, world, shapes, split_b=True)
    owner_s = ns_seconds_per_rank(load, {}, shapes, hw)
    group_s_ = ns_seconds_per_rank(group_load, groups, shapes, hw)
    group_b_s = ns_seconds_per_rank(group_load_b, groups_b, shapes, hw, split_b=True)
    t0 = time.perf_counter()
    bytes_ = owner_bytes_per_rank(plan, muon)
    bytes_s = time.perf_counter() - t0
    adamw = sum((dp - 1) * b.shard_numel for buf in plan.buckets for b in buf) * (GRAD_BYTES + PARAM_BYTES)
    gram_bytes = [0] * world   # group mode, estimate: Gram all-reduces (ring: 2 (g-1)/g x input) + shard there and back
    for key, members in groups.items():
        rows, cols = shapes[key]
        m, n, size = min(rows, cols), max(rows, cols), len(members)
        for r in members:
            gram_bytes[r] += int(2 * (size - 1) / size * 4 * (1 + NS_STEPS * m * m)) + 2 * m * -(-n // size) * NS_BYTES
    coll = collectives_per_rank(plan, muon)
    coll_group = collectives_per_rank(plan, muon, groups)
    totals = [b["total"] for b in bytes_]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return dict(model=model, dp=dp, tp=tp, world=world, muon_matrices=len(plan.metas[0]), buckets=sum(len(b) for b in plan.buckets),
                plan_build_s=build_s, group_assign_s=group_s, bytes_closed_form_s=bytes_s,
                owner_ns_max_over_mean=max(load) / mean(load), owner_ranks_idle=sum(1 for x in load if x == 0),
                owner_ns_max_tflop=max(load) / 1e12,
                group_ns_max_over_mean=max(group_load) / mean(group_load), grouped_matrices=len(groups),
                group_size_max=max(map(len, groups.values()), default=0),
                group_ns_max_tflop=max(group_load) / 1e12,
                group_split_b_ns_max_over_mean=max(group_load_b) / mean(group_load_b),
                group_split_b_ns_max_tflop=max(group_load_b) / 1e12,
                owner_bytes_per_rank_max=max(totals), owner_bytes_per_rank_mean=mean(totals), adamw_bytes_per_rank=adamw,
                group_extra_bytes_per_rank_max_estimate=max(gram_bytes),
                collectives_per_rank_owner=max(coll), collectives_per_rank_group_max=max(coll_group),
                owner_ns_ms=max(owner_s) * 1e3, group_ns_ms=max(group_s_) * 1e3, group_split_b_ns_ms=max(group_b_s) * 1e3,
                owned_max=max(owned), ns_calls_batched_max=max(len(x) for x in owned_shapes),
                distinct_shapes=len(set(shapes.values())),
                ideal_ns_ms=sum(load) / world / (hw["flops"] * hw["efficiency"]) * 1e3)


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
    print(f"{args.model} shapes; NS FLOPs per rank as max/mean (1.0 = balanced); bytes per rank per step (owner "
          "layout, closed form) in GB; NS ms per step on the busiest rank, projected to H100s (assumed figures, "
          "see H100)")
    print(f"{'grid':>8} {'ranks':>5} {'build s':>7} {'owner max/mean':>14} {'idle':>5} {'max TFLOP':>9} "
          f"{'group max/mean':>14} {'grouped':>7} {'max TFLOP':>9} {'split-B max/mean':>16} {'GB owner max':>12} {'GB AdamW':>8} "
          f"{'+GB group est':>13} {'coll owner':>10} {'coll group':>10} {'NS ms owner':>11} {'group':>7} {'split-B':>7} "
          f"{'ideal':>7}")
    for dp, tp in grids:
        r = grid_report(dp, tp, args.layers, args.model, bucket_numel=args.bucket_numel)
        rows.append(r)
        print(f"{dp}x{tp:<4} {r['world']:>5} {r['plan_build_s']:>7.2f} {r['owner_ns_max_over_mean']:>14.2f} "
              f"{r['owner_ranks_idle']:>5} {r['owner_ns_max_tflop']:>9.2f} {r['group_ns_max_over_mean']:>14.2f} "
              f"{r['grouped_matrices']:>7} {r['group_ns_max_tflop']:>9.2f} {r['group_split_b_ns_max_over_mean']:>16.2f} "
              f"{r['owner_bytes_per_rank_max'] / 1e9:>12.2f} "
              f"{r['adamw_bytes_per_rank'] / 1e9:>8.2f} {r['group_extra_bytes_per_rank_max_estimate'] / 1e9:>13.2f} "
              f"{r['collectives_per_rank_owner']:>10} {r['collectives_per_rank_group_max']:>10} "
              f"{r['owner_ns_ms']:>11.2f} {r['group_ns_ms']:>7.2f} {r['group_split_b_ns_ms']:>7.2f} {r['ideal_ns_ms']:>7.2f}")
    if args.json:
        print(json.dumps({"model": args.model, "hw": H100, "rows": rows}))   # one JSON object (lab.notebook.last_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
