"""The ZeRO-1 plan of a MoE trained with expert parallelism, per rank, built without launching anything.

    python scripts/plan_ep.py --model kimi-k2 --grids 256x1 --ep 64        # Kimi K2 as trained: EP64 x DP4
    python scripts/plan_ep.py --model moonlight-16b-a3b --grids 64x1,128x8 --ep 8

Under pure ZeRO-1 x TP every rank holds every expert and all-gathers all of them each step (``plan_at_scale.py``
prices that). With expert parallelism (``Grid.expert(ep)``) the DP ranks are dealt into ``ep`` expert slices:
each rank holds ``experts / ep`` of each MoE layer's routed experts, whole, and those experts' gradients,
optimizer state and Newton-Schulz stay among the ``dp / ep`` ranks that hold the same slice. So each rank runs
two plans of ``muongrid.plan.build_plan`` (the optimizer's code): the dense one (attention, dense and shared MLPs,
embeddings, routers and norms) on the job's DP x TP grid, and its slice's expert plan on the expert grid
(``dp / ep`` x TP). Per rank this prints, for the owner layout, the sum of the two: bytes sent per step (the
closed form, ``plan_at_scale.bytes_per_rank``), collectives per step, Newton-Schulz load and the projected
serial step on H100s (``scale.H100``'s assumed figures), beside the same model under pure ZeRO-1 x TP, and
how long each plan took to build. What is not modelled: the token all-to-alls of the MoE layers (the model's
forward and backward, not the optimizer's), and where the expert grid's ranks sit (its DP link is priced as
``links_for_grid(dp / ep, tp)`` gives it, as if contiguous: on a real cluster the replicas of a slice may be
farther apart). The code is ``muongrid/lab/scale.py`` (``ep_report``).
"""
from __future__ import annotations

import argparse
import json
import sys

from muongrid.lab.model_shapes import MODELS
from muongrid.lab.scale import ep_report
from muongrid.plan import DEFAULT_BUCKET_NUMEL


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="kimi-k2", choices=[m for m in MODELS if "llama" not in m])
    p.add_argument("--grids", default="256x1", help="DPxTP,... (ep must divide each DP)")
    p.add_argument("--ep", type=int, default=64, help="expert-parallel slices (a divisor of DP)")
    p.add_argument("--layers", type=int, default=None, help="fewer layers than the model's (for a quick look)")
    p.add_argument("--bucket-numel", type=int, default=DEFAULT_BUCKET_NUMEL)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        grids = [tuple(int(v) for v in g.lower().split("x")) for g in args.grids.split(",")]
        assert all(len(g) == 2 and min(g) > 0 and g[0] % args.ep == 0 for g in grids) and args.ep > 0
    except (ValueError, AssertionError):
        p.error(f"--grids takes DPxTP,... with --ep ({args.ep}) dividing every DP; got {args.grids!r}")
    print(f"{args.model}: expert parallelism (ep={args.ep}) against pure ZeRO-1 x TP, per rank per step: GB sent, "
          "collectives, Newton-Schulz TFLOP and the projected serial optimizer step on H100s (busiest rank; "
          "plan_at_scale's assumed figures), and how long the plans took to build")
    print(f"{'grid':>8} {'ep':>4} | {'expert mats':>12} {'GB':>8} {'coll':>7} {'NS TF':>7} {'step ms':>9} "
          f"{'build s':>8} | {'GB':>9} {'coll':>8} {'NS TF':>7} {'step ms':>9} {'build s':>8}")
    print(f"{'':>15} | {'expert parallel':^57} | {'pure ZeRO-1 x TP':^46}")
    rows = []
    for dp, tp in grids:
        r = ep_report(args.model, dp, tp, args.ep, args.bucket_numel, args.layers)
        rows.append(r)
        print(f"{dp}x{tp:<4} {args.ep:>4} | {r['expert_matrices_per_rank']:>12} {r['bytes_per_rank_max'] / 1e9:>8.2f} "
              f"{r['collectives_per_rank_max']:>7} {r['ns_tflop_max']:>7.2f} {r['step_ms']:>9.1f} {r['build_s']:>8.2f} | "
              f"{r['zero1_bytes_per_rank_max'] / 1e9:>9.2f} {r['zero1_collectives_per_rank_max']:>8} "
              f"{r['zero1_ns_tflop_max']:>7.2f} {r['zero1_step_ms']:>9.1f} {r['zero1_build_s']:>8.2f}", flush=True)
    if args.json:
        print(json.dumps(dict(model=args.model, ep=args.ep, rows=rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
