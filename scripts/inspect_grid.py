"""Report what every rank of a DP x TP grid holds: its process groups, its ZeRO-1 plan and its state.

    python scripts/inspect_grid.py --dp 2 --tp 4
    python scripts/inspect_grid.py --dp 3 --tp 2 --shapes 100x100,124x324 --tp-dims 0,1 --bucket-numel 20000

Each rank builds the real ``DistributedMuon`` for the given shapes (the proof of concept's by
default) and reports the ranks of its DP and TP groups as the process groups themselves list them,
every parameter's ``dist_meta``, its buckets and the bytes of optimizer state it keeps, and the state
it keeps for the same parameters held in bf16 (``state_bytes_bf16``: their fp32 masters are kept apart;
an fp32 parameter is its own master). Rank 0 prints a summary and one JSON line with everything, which
chapters 3 and 4 draw.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

from muongrid.distributed import DistributedMuon
from muongrid.launch import add_launch_args, check_launch_args, launch
from muongrid.lab.synthetic import add_problem_args, build_problem, check_problem_args


def worker(grid, comm, args) -> int:
    problem = build_problem("muon", args.shapes, args.tp_dims, 1, args.seed, grid.tp)
    opt, opt_bf16 = (DistributedMuon([dict(g, params=[torch.nn.Parameter(p.detach().to(dtype)) for p in g["params"]])
                                      for g in problem.param_groups(grid.tp, grid.tp_rank)],
                                     grid, comm=comm, layout="bucket", bucket_numel=args.bucket_numel)
                     for dtype in (torch.float32, torch.bfloat16))
    mine = dict(grid.describe(),
                params=[dict(dataclasses.asdict(m), held_shape=list(p.shape)) for m, p in
                        zip(opt.plan.metas[0], opt.param_groups[0]["params"])],
                buckets=[dict(dataclasses.asdict(b), cuts=list(b.cuts)) for b in opt.plan.buckets[0]],
                global_buffer_size=opt.plan.global_buffer_size[0], state_bytes=opt.state_bytes(),
                state_bytes_bf16=opt_bf16.state_bytes())
    everyone = comm.gather_objects(mine, "report")
    if grid.rank == 0:
        print(f"{'rank':>4} {'dp':>3} {'tp':>3}  {'DP group':<14}{'TP group':<16}{'owned elements':>15}{'state bytes':>13}")
        for r in everyone:
            owned = sum(p["local_range"][1] - p["local_range"][0] for p in r["params"])
            print(f"{r['rank']:>4} {r['dp_rank']:>3} {r['tp_rank']:>3}  {str(r['dp_group']):<14}{str(r['tp_group']):<16}"
                  f"{owned:>15}{sum(r['state_bytes'].values()):>13}")
        print(json.dumps(dict(dp=grid.dp, tp=grid.tp, shapes=[list(s) for s in args.shapes], tp_dims=args.tp_dims,
                              bucket_numel=args.bucket_numel, ranks=everyone)))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    add_problem_args(p)
    args = p.parse_args(argv)
    check_launch_args(p, args)
    check_problem_args(p, args)
    return launch(worker, args)


if __name__ == "__main__":
    sys.exit(main())
