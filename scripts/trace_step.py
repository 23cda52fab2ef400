"""Follow one Distributed Muon step stage by stage on every rank: shapes, dtypes, norms, bytes.

    python scripts/trace_step.py --dp 2 --tp 2
    python scripts/trace_step.py --dp 2 --tp 2 --show w3
    python scripts/trace_step.py --dp 2 --tp 2 --layouts bucket,owner

Runs one step of the real optimizer with its trace hook on (``DistributedMuon.trace``), which
records every intermediate tensor of the flow: the averaged gradient shard, the momentum shard, the
DP-gathered bucket, each matrix before and after the TP gather, after Newton-Schulz, after the TP
shard and after the DP shard (the owner layout: what goes to the owners, what each owner
orthogonalises, what comes back). Rank 0 prints the stages of one matrix on every rank and ends with
one JSON line holding every rank's trace and the ledger of the step.

Besides the trace, each rank reports what the trace hook does not see: its TP-local gradients before
the step, its plan (the piece of each matrix in its DP shard: its ``slice`` of the flattened TP-local
matrix; the matrices it orthogonalises; each matrix's ``owner`` under an owner layout), the
dtypes of the optimizer state it keeps (the momentum and master shards), its parameters after the
step, and the ledger's record of every collective with the bytes it delivered to each other rank
(``Comm.peers``). ``--layouts`` runs the same step (same parameters, same gradients) once per layout,
in the same processes, each with a fresh ledger: the JSON line's ``runs`` holds one entry per layout
(``lab/step_explorer.py`` draws them); its top-level ``ranks`` and ``ledger`` are the first layout's.
"""
from __future__ import annotations

import argparse
import json
import sys

from muongrid.comm import PHASES, Ledger
from muongrid.distributed import DistributedMuon
from muongrid.launch import add_launch_args, check_launch_args, launch
from muongrid.lab.synthetic import add_problem_args, build_problem, check_problem_args, set_grads

LAYOUTS = ("bucket", "owner", "aligned")


def _dtype(t) -> str:
    return str(t.dtype).replace("torch.", "")


def one_step(grid, comm, args, layout: str) -> dict:
    """One traced step under ``layout`` on this rank: what the trace hook saw, and the rest (see above)."""
    comm.ledger = Ledger()   # this layout's step alone
    problem = build_problem("muon", args.shapes, args.tp_dims, 1, args.seed, grid.tp)
    opt = DistributedMuon(problem.param_groups(grid.tp, grid.tp_rank, grid.device), grid, comm=comm,
                          layout=layout, bucket_numel=args.bucket_numel)
    events = []
    opt.trace = lambda stage, name, t: events.append(
        dict(stage=stage, name=name, shape=list(t.shape), dtype=_dtype(t), numel=t.numel(),
             norm=float(t.float().norm())))
    set_grads(opt.param_groups, problem.grads(1, grid.dp_rank, grid.dp), grid)
    group = opt.param_groups[0]
    grads = [dict(shape=list(p.grad.shape), dtype=_dtype(p.grad)) for p in group["params"]]
    opt.step()
    ns = opt.plan.ns_keys(grid.rank, 0)
    owners = opt.plan.owners   # empty under "bucket"
    matrices = [dict(name=m.name, full_shape=list(m.full_shape), shape=list(m.shape), tp_split_dim=m.tp_split_dim,
                     bucket=m.bucket_idx, piece=m.local_numel, orthogonalises=(m.group_idx, m.param_idx) in ns,
                     slice=[m.param_slice.start, m.param_slice.stop], owner=owners.get((m.group_idx, m.param_idx)),
                     grad=grads[m.param_idx], param=dict(shape=list(p.shape), dtype=_dtype(p)))
                for m, p in zip(opt.plan.metas[0], group["params"])]
    state = {kind: dict(numel=sum(s[kind].numel() for s in opt.store.shards[0]), dtype=_dtype(opt.store.shards[0][0][kind]))
             for kind in ("momentum", "master")}
    summary = comm.ledger.summary()
    records = [dict(phase=r.phase, op=r.op, group=r.group, dtype=r.dtype, numel=r.numel, bytes_sent=r.bytes_sent,
                    peers={str(q): b for q, b in comm.peers(r).items()})
               for r in comm.ledger.records if r.phase in PHASES and r.step == summary["step"]]
    mine = dict(rank=grid.rank, dp_rank=grid.dp_rank, tp_rank=grid.tp_rank, events=events, matrices=matrices,
                state=state, records=records, ledger=summary)
    return dict(layout=layout, ranks=comm.gather_objects(mine, "report"), ledger=summary, table=comm.ledger.table())


def worker(grid, comm, args) -> int:
    runs = [one_step(grid, comm, args, layout) for layout in args.layouts]
    if grid.rank == 0:
        everyone = runs[0]["ranks"]
        print(f"stages of {args.show} (shape, dtype) on every rank, layout {runs[0]['layout']}:")
        for r in everyone:
            steps = [f"{e['stage']} {tuple(e['shape'])}" for e in r["events"] if e["name"] == args.show]
            print(f"  rank {r['rank']} (dp {r['dp_rank']}, tp {r['tp_rank']}): " + " -> ".join(steps))
        for run in runs:
            print(f"ledger of rank 0, layout {run['layout']}:\n{run.pop('table')}")
        print(json.dumps(dict(dp=grid.dp, tp=grid.tp, shapes=[list(s) for s in args.shapes], tp_dims=args.tp_dims,
                              bucket_numel=args.bucket_numel, layout=runs[0]["layout"], ranks=everyone,
                              ledger=runs[0]["ledger"], runs=runs)))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    add_problem_args(p)
    p.add_argument("--show", default="w3", help="the matrix whose stages are printed (default w3)")
    p.add_argument("--layouts", default="bucket",
                   help=f"comma-separated layouts to step in turn, of {', '.join(LAYOUTS)} (default bucket)")
    args = p.parse_args(argv)
    args.layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if not args.layouts or any(x not in LAYOUTS for x in args.layouts):
        p.error(f"--layouts takes some of {', '.join(LAYOUTS)}, got {','.join(args.layouts) or 'nothing'}")
    check_launch_args(p, args)
    check_problem_args(p, args)
    return launch(worker, args)


if __name__ == "__main__":
    sys.exit(main())
