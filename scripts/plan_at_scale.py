"""The real ZeRO-1 plan for real model shapes on up to 1,024 ranks and more, built without launching anything.

For each DP x TP grid, the owner plan and the optimizer's group plan (``build_plan(layout="group",
hw=profile(H100))``), each built and timed, per rank: Newton-Schulz load (max / mean), bytes sent per step
(and to another node), collectives, and milliseconds projected to H100s (public figures taken as
assumptions); beside the NS time of two older group rules. The code is ``muongrid/lab/scale.py`` (its
docstring says what each column counts) over the shapes of ``muongrid/lab/model_shapes.py``.

    python scripts/plan_at_scale.py [--model llama3-70b] [--grids 8x8,32x8,128x8,64x16,1024x1] [--json]
    python scripts/plan_at_scale.py --model kimi-k2 --grids 128x8 --bucket-numel 268435456   # fewer, larger buckets
"""
from __future__ import annotations

import argparse
import json
import sys

from muongrid.lab.model_shapes import MODELS
from muongrid.lab.scale import H100, grid_report, profile
from muongrid.plan import bucket_limit


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grids", default="8x8,32x8,128x8,64x16,1024x1")
    p.add_argument("--model", default="llama3-70b", choices=sorted(MODELS))
    p.add_argument("--layers", type=int, default=None, help="fewer layers than the model's (for a quick look)")
    p.add_argument("--bucket-numel", type=lambda x: x if x == "auto" else int(x), default="auto",
                   help="elements per ZeRO-1 bucket (default 'auto': 2**20, grown with DP so each rank's shard keeps "
                        "2**18, plan.bucket_limit); a matrix larger than a bucket gets its own, so on a model of many "
                        "large matrices this sets the collectives per step")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        grids = [tuple(int(x) for x in g.lower().split("x")) for g in args.grids.split(",")]
        assert all(len(g) == 2 and min(g) > 0 for g in grids)
    except (ValueError, AssertionError):
        p.error(f"--grids takes DPxTP,... e.g. 128x8; got {args.grids!r}")
    try:
        bucket_limit(args.bucket_numel, 1)
    except ValueError as e:
        p.error(f"--bucket-numel: {e}")
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
