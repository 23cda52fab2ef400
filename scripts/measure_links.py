"""Measure this machine's collective latency and bandwidth and fit the alpha-beta model to them.

    python scripts/measure_links.py --dp 4
    torchrun --standalone --nproc-per-node 8 scripts/measure_links.py --dp 8   # on a GPU node

Times an all-gather and a reduce-scatter over the DP group (``Comm``'s, as the optimizers run them)
for shards from 256 bytes to 4 MiB (median of several repetitions, slowest rank), fits
``t = (n-1) * (alpha + shard_bytes / beta)`` to the all-gathers (``muongrid/costmodel.fit_alpha_beta``),
and reports how long a reduce-scatter takes relative to an all-gather that moves the same bytes under
the ring algorithm. With NCCL the two should be close. Gloo has no reduce-scatter of its own: it runs
one as an all-reduce (twice the ring's bytes), so on gloo ``Comm`` runs an all-to-all and adds the
rows itself (``comm.py``), and this script also times gloo's own (``dist.reduce_scatter_tensor``,
column "gloo's own") beside it. The last line is JSON.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys


import torch
import torch.distributed as dist

from muongrid.comm import is_gloo, reduce_scatter_flat
from muongrid.lab.costmodel import collective_seconds, fit_alpha_beta
from muongrid.launch import add_launch_args, check_launch_args, launch
from muongrid.lab.profiling import slowest_rank_seconds


def worker(grid, comm, args) -> int:
    n, dev = grid.dp, grid.device
    gloo = dev.type == "cpu" and is_gloo(grid.dp_group)
    rows = []
    for shard_bytes in [256 * 4**k for k in range(args.points)]:
        shard = torch.ones(shard_bytes // 4, device=dev)
        full = torch.ones(n * shard.numel(), device=dev)
        ops = {"all_gather": lambda s=shard: comm.all_gather(s, "dp", "measure"),
               "reduce_scatter": lambda f=full: comm.reduce_scatter_sum(f, "dp", "measure")}
        if gloo:
            out = torch.empty_like(shard)
            ops["gloo_reduce_scatter"] = lambda f=full, o=out: reduce_scatter_flat(o, f, group=grid.dp_group)
        times = {op: [] for op in ops}
        for rep in range(args.reps + 1):
            for op, fn in ops.items():
                t = slowest_rank_seconds(comm, fn, "dp")
                if rep:  # the first repetition warms up buffers and connections
                    times[op].append(t)
        rows.append(dict(shard_bytes=shard_bytes, **{f"{op}_s": statistics.median(t) for op, t in times.items()}))
    alpha, beta = fit_alpha_beta([(n, r["shard_bytes"], r["all_gather_s"]) for r in rows])
    if grid.rank == 0:
        print(f"{n} ranks over {dist.get_backend()}; medians of {args.reps} repetitions, slowest rank")
        print(f"{'shard bytes':>12}{'all-gather ms':>15}{'model ms':>10}{'reduce-scatter ms':>19}{'RS / AG':>9}"
              + (f"{'gloo' + chr(39) + 's own ms':>16}{'/ AG':>7}" if gloo else ""))
        for r in rows:
            model = collective_seconds("all_gather", n, r["shard_bytes"], alpha, beta)
            print(f"{r['shard_bytes']:>12,}{r['all_gather_s'] * 1e3:>15.3f}{model * 1e3:>10.3f}"
                  f"{r['reduce_scatter_s'] * 1e3:>19.3f}{r['reduce_scatter_s'] / r['all_gather_s']:>9.2f}"
                  + (f"{r['gloo_reduce_scatter_s'] * 1e3:>16.3f}{r['gloo_reduce_scatter_s'] / r['all_gather_s']:>7.2f}"
                     if gloo else ""))
        big = rows[-1]
        resolved = beta != float("inf")
        print(f"fit: alpha = {alpha * 1e6:.1f} us per hop, " + (f"beta = {beta / 1e9:.3f} GB/s per link" if resolved else
              "bandwidth not resolved by these sizes (use more --points)"))
        print(json.dumps(dict(ranks=n, backend=dist.get_backend(), device=str(dev), alpha_s=alpha,
                              beta_bytes_per_s=beta if resolved else None,
                              rs_over_ag_largest=big["reduce_scatter_s"] / big["all_gather_s"],
                              gloo_rs_over_ag_largest=big["gloo_reduce_scatter_s"] / big["all_gather_s"] if gloo
                              else None, samples=rows)))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    p.add_argument("--points", type=int, default=8, help="shard sizes 256 B * 4^k, k < points (default 8: up to 4 MiB)")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    check_launch_args(p, args)
    if args.dp < 2:
        p.error("--dp must be at least 2: a collective over one rank moves nothing")
    return launch(worker, args)


if __name__ == "__main__":
    sys.exit(main())
