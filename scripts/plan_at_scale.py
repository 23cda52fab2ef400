"""The real ZeRO-1 plan for Llama-3-70B shapes on up to 1,024 ranks, built without launching anything.

For each DP x TP grid: ``dmuon.plan.build_plan`` (buckets, cuts, owners; the same code the optimizer
runs) and its build time, then per rank:

* Newton-Schulz FLOPs under owner-per-matrix (the "owner" layout) and with the group mode
  (``layouts.assign_owners_and_groups``: a matrix above the fair share is orthogonalised by a group of
  ranks, ``ns_group.py``), as max / mean over ranks (1.0 = perfectly balanced; the step waits for the max),
  the group mode with every rank computing all of ``B = bA + cA^2`` and with B's rows split (``split_b``);
* bytes sent per step by the owner layout, from the closed form (``lab/costmodel.py``'s rules, summed
  per rank in one pass; ``tests/test_plan_at_scale.py`` checks the two agree on a small model), and AdamW's;
* collectives per step per rank: reduce-scatter + all-gather per bucket, two all-to-alls per Muon
  bucket (to the owners and back), and with the group mode 1 + ns_steps all-reduces per grouped matrix
  on each of its members.

The group mode is planned here only: the optimizer does not yet route a matrix to a group, so its
bytes are an estimate (members receive their long-side shard of the matrix and send it back, bf16, plus
the ring all-reduces of the m x m Gram in fp32), marked as such.

Llama-3-70B: hidden 8192, intermediate 28672, 80 layers, 64 query heads and 8 KV heads of 128, vocab
128256; Muon for the 7 matrices of each layer (q, k, v, gate, up colwise: TP split dim 0; o, down
rowwise: 1), AdamW for the embedding, the head and the norms.

    python scripts/plan_at_scale.py [--grids 8x8,32x8,128x8,64x16,1024x1] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dmuon.layouts import assign_owners_and_groups  # noqa: E402
from dmuon.newton_schulz import NS_STEPS, ns5_flops  # noqa: E402
from dmuon.plan import ParamSpec, _owner_candidates, build_plan  # noqa: E402

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 8192, 28672, 80, 64, 8, 128, 128256
GRAD_BYTES, NS_BYTES, PARAM_BYTES = 4, 2, 4


def llama3_70b(layers: int = LAYERS) -> tuple[list[list[ParamSpec]], list[bool]]:
    """(groups, muon flags): one Muon group with every layer's 7 matrices, one AdamW group."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    muon = []
    for i in range(layers):
        muon += [ParamSpec(f"layers.{i}.q", (q, HIDDEN), 0), ParamSpec(f"layers.{i}.k", (kv, HIDDEN), 0),
                 ParamSpec(f"layers.{i}.v", (kv, HIDDEN), 0), ParamSpec(f"layers.{i}.o", (HIDDEN, q), 1),
                 ParamSpec(f"layers.{i}.gate", (INTERMEDIATE, HIDDEN), 0),
                 ParamSpec(f"layers.{i}.up", (INTERMEDIATE, HIDDEN), 0),
                 ParamSpec(f"layers.{i}.down", (HIDDEN, INTERMEDIATE), 1)]
    adamw = [ParamSpec("embed", (VOCAB, HIDDEN), 0), ParamSpec("head", (VOCAB, HIDDEN), 0)]
    adamw += [ParamSpec(f"norm.{i}", (HIDDEN,), -1) for i in range(2 * layers + 1)]
    return [muon, adamw], [True, False]


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


def grid_report(dp: int, tp: int, layers: int = LAYERS) -> dict:
    specs, muon = llama3_70b(layers)
    t0 = time.perf_counter()
    plan = build_plan(specs, dp, 0, tp, layout="owner", muon=muon)
    build_s = time.perf_counter() - t0
    world = dp * tp
    shapes = {(m.buffer_idx, m.param_idx): m.full_shape for m in plan.metas[0]}
    load = [0] * world
    for key, rank in plan.owners.items():
        load[rank] += ns5_flops(*shapes[key])
    t0 = time.perf_counter()
    candidates = _owner_candidates(plan, muon)
    _, groups, group_load = assign_owners_and_groups(candidates, world, shapes)
    group_s = time.perf_counter() - t0
    _, _, group_load_b = assign_owners_and_groups(candidates, world, shapes, split_b=True)
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
    return dict(dp=dp, tp=tp, world=world, muon_matrices=len(plan.metas[0]), buckets=sum(len(b) for b in plan.buckets),
                plan_build_s=build_s, group_assign_s=group_s, bytes_closed_form_s=bytes_s,
                owner_ns_max_over_mean=max(load) / mean(load), owner_ranks_idle=sum(1 for x in load if x == 0),
                owner_ns_max_tflop=max(load) / 1e12,
                group_ns_max_over_mean=max(group_load) / mean(group_load), grouped_matrices=len(groups),
                group_ns_max_tflop=max(group_load) / 1e12,
                group_split_b_ns_max_over_mean=max(group_load_b) / mean(group_load_b),
                group_split_b_ns_max_tflop=max(group_load_b) / 1e12,
                owner_bytes_per_rank_max=max(totals), owner_bytes_per_rank_mean=mean(totals), adamw_bytes_per_rank=adamw,
                group_extra_bytes_per_rank_max_estimate=max(gram_bytes),
                collectives_per_rank_owner=max(coll), collectives_per_rank_group_max=max(coll_group))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grids", default="8x8,32x8,128x8,64x16,1024x1")
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        grids = [tuple(int(x) for x in g.lower().split("x")) for g in args.grids.split(",")]
        assert all(len(g) == 2 and min(g) > 0 for g in grids)
    except (ValueError, AssertionError):
        p.error(f"--grids takes DPxTP,... e.g. 128x8; got {args.grids!r}")
    rows = []
    print(f"Llama-3-70B shapes, {args.layers} layers, {7 * args.layers} Muon matrices; NS FLOPs per rank as max/mean "
          "(1.0 = balanced); bytes per rank per step (owner layout, closed form) in GB")
    print(f"{'grid':>8} {'ranks':>5} {'build s':>7} {'owner max/mean':>14} {'idle':>5} {'max TFLOP':>9} "
          f"{'group max/mean':>14} {'grouped':>7} {'max TFLOP':>9} {'split-B max/mean':>16} {'GB owner max':>12} {'GB AdamW':>8} "
          f"{'+GB group est':>13} {'coll owner':>10} {'coll group':>10}")
    for dp, tp in grids:
        r = grid_report(dp, tp, args.layers)
        rows.append(r)
        print(f"{dp}x{tp:<4} {r['world']:>5} {r['plan_build_s']:>7.2f} {r['owner_ns_max_over_mean']:>14.2f} "
              f"{r['owner_ranks_idle']:>5} {r['owner_ns_max_tflop']:>9.2f} {r['group_ns_max_over_mean']:>14.2f} "
              f"{r['grouped_matrices']:>7} {r['group_ns_max_tflop']:>9.2f} {r['group_split_b_ns_max_over_mean']:>16.2f} "
              f"{r['owner_bytes_per_rank_max'] / 1e9:>12.2f} "
              f"{r['adamw_bytes_per_rank'] / 1e9:>8.2f} {r['group_extra_bytes_per_rank_max_estimate'] / 1e9:>13.2f} "
              f"{r['collectives_per_rank_owner']:>10} {r['collectives_per_rank_group_max']:>10}")
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
