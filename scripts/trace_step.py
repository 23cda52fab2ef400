"""Follow one Distributed Muon step stage by stage on every rank: shapes, dtypes, norms, bytes.

    python scripts/trace_step.py --dp 2 --tp 2
    python scripts/trace_step.py --dp 2 --tp 2 --show w3

Runs one step of the real optimizer with its trace hook on (``DistributedMuon.trace``), which
records every intermediate tensor of the flow: the averaged gradient shard, the momentum shard, the
DP-gathered bucket, each matrix before and after the TP gather, after Newton-Schulz, after the TP
shard and after the DP shard. Rank 0 prints the stages of one matrix on every rank and ends with
one JSON line holding every rank's trace and the ledger of the step.
"""
from __future__ import annotations

import argparse
import json
import sys


from muongrid.distributed import DistributedMuon
from muongrid.launch import add_launch_args, check_launch_args, launch
from muongrid.lab.synthetic import add_problem_args, build_problem, check_problem_args, set_grads


def worker(grid, comm, args) -> int:
    problem = build_problem("muon", args.shapes, args.tp_dims, 1, args.seed, grid.tp)
    opt = DistributedMuon(problem.param_groups(grid.tp, grid.tp_rank, grid.device), grid, comm=comm, bucket_numel=args.bucket_numel)
    events = []
    opt.trace = lambda stage, name, t: events.append(
        dict(stage=stage, name=name, shape=list(t.shape), dtype=str(t.dtype).replace("torch.", ""),
             numel=t.numel(), norm=float(t.float().norm())))
    set_grads(opt.param_groups, problem.grads(1, grid.dp_rank, grid.dp), grid)
    opt.step()
    mine = dict(rank=grid.rank, dp_rank=grid.dp_rank, tp_rank=grid.tp_rank, events=events)
    everyone = comm.gather_objects(mine, "report")
    if grid.rank == 0:
        print(f"stages of {args.show} (shape, dtype) on every rank:")
        for r in everyone:
            steps = [f"{e['stage']} {tuple(e['shape'])}" for e in r["events"] if e["name"] == args.show]
            print(f"  rank {r['rank']} (dp {r['dp_rank']}, tp {r['tp_rank']}): " + " -> ".join(steps))
        print(comm.ledger.table())
        print(json.dumps(dict(dp=grid.dp, tp=grid.tp, shapes=[list(s) for s in args.shapes], tp_dims=args.tp_dims,
                              ranks=everyone, ledger=comm.ledger.summary())))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    add_problem_args(p)
    p.add_argument("--show", default="w3", help="the matrix whose stages are printed (default w3)")
    args = p.parse_args(argv)
    check_launch_args(p, args)
    check_problem_args(p, args)
    return launch(worker, args)


if __name__ == "__main__":
    sys.exit(main())
