"""Check Distributed Muon / AdamW / the hybrid against the single-device reference, step by step.

    python scripts/verify.py --dp 2 --tp 2                          # spawns 4 local gloo ranks
    python scripts/verify.py --dp 3 --tp 1 --optimizer hybrid --steps 5
    python scripts/verify.py --dp 2 --tp 4 --shapes 100x100,124x324 --tp-dims 0,1
    torchrun --standalone --nproc-per-node 4 scripts/verify.py --dp 2 --tp 2   # NCCL when CUDA is there

Every rank builds the same seeded problem, takes its TP shard of each parameter, and runs the
distributed optimizer on gradients that differ per DP rank. Beside it, rank 0 runs the
single-device reference on the whole parameters with the DP-averaged gradients and broadcasts
the result; after each step every rank compares its own parameters with its TP shard of it. The largest difference
over all ranks is printed per step, then the communication ledger, then one JSON line:
``{"ok": ..., "max_abs_diff": ..., "dp": ..., "tp": ..., "ledger": {...}, ...}``. Exit code 0 iff ok.

``--atol`` defaults to 0: on one machine the distributed run executes the same kernels on the
same numbers as the reference, so it must match bit for bit (see the synthetic module for why
reduction order cannot matter).
"""
from __future__ import annotations

import argparse
import json
import sys


import torch
import torch.distributed as dist

from dmuon.distributed import OVERLAP_MODES, DistributedMuon
from dmuon.launch import add_launch_args, check_launch_args, launch
from dmuon.optim import MuonW
from dmuon.lab.poc_bugs import POC_BUGS
from dmuon.sharding import tp_shard
from dmuon.lab.synthetic import OPTIMIZERS, add_problem_args, build_problem, check_problem_args, set_grads


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    add_problem_args(p)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="muon")
    p.add_argument("--groups", type=int, default=2, help="parameter groups for muon/adamw (default 2)")
    p.add_argument("--atol", type=float, default=0.0, help="largest allowed |param - reference| (default 0)")
    p.add_argument("--overlap", choices=OVERLAP_MODES, default="none",
                   help="how collectives overlap compute (see dmuon/distributed.py)")
    p.add_argument("--poc-bug", choices=sorted(POC_BUGS), default=None,
                   help="put one of the proof of concept's bugs back, to see this check catch it")
    args = p.parse_args(argv)
    check_launch_args(p, args)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    check_problem_args(p, args, args.optimizer, args.groups)
    return args


def reference_optimizer(problem, params: dict) -> MuonW:
    """The single-device optimizer over whole parameters; ``params`` (name -> tensor) become Parameters."""
    for n in params:
        params[n] = torch.nn.Parameter(params[n])
    return MuonW([dict(g["hyper"], params=[params[n] for n in g["names"]], names=g["names"], use_muon=g["use_muon"])
                  for g in problem.groups])


def worker(grid, comm, args) -> int:
    problem = build_problem(args.optimizer, args.shapes, args.tp_dims, args.groups, args.seed, grid.tp)
    dev = grid.device
    local = problem.param_groups(grid.tp, grid.tp_rank, dev)
    optimizer_class = POC_BUGS[args.poc_bug] if args.poc_bug else DistributedMuon
    opt = optimizer_class(local, grid, comm=comm, bucket_numel=args.bucket_numel, overlap=args.overlap)
    # The reference runs once, on rank 0, and is broadcast: every rank then checks its own shard.
    ref_params = {n: t.to(dev).clone() for n, t in problem.full.items()}
    ref = reference_optimizer(problem, ref_params) if grid.rank == 0 else None

    diffs = []
    for step in range(1, args.steps + 1):
        set_grads(opt.param_groups, problem.grads(step, grid.dp_rank), grid)
        opt.step()
        if ref is not None:
            for n, g in problem.mean_grads(step, grid.dp).items():
                ref_params[n].grad = g.to(dev)
            ref.step()
        diff = torch.zeros((), dtype=torch.float64, device=dev)
        for g in opt.param_groups:
            for n, d, p in zip(g["names"], g["tp_split_dims"], g["params"]):
                expect = tp_shard(comm.broadcast(ref_params[n].data, "world", "verify"), d, grid.tp, grid.tp_rank, n)
                diff = torch.maximum(diff, (p.detach().double() - expect.double()).abs().max())
        comm.all_reduce(diff, "world", "verify", op=dist.ReduceOp.MAX)
        diffs.append(diff.item())
        if grid.rank == 0:
            print(f"step {step}: max |param - reference| over all ranks = {diffs[-1]:.3e}", flush=True)

    ok = max(diffs) <= args.atol
    if grid.rank == 0:
        print(f"\ncommunication per rank in step {args.steps} ({args.optimizer}, dp={grid.dp}, tp={grid.tp}):")
        print(comm.ledger.table())
        print(f"\n{'OK' if ok else 'MISMATCH'}: largest difference {max(diffs):.3e} (allowed {args.atol:g})")
        print(json.dumps(dict(
            ok=ok, max_abs_diff=max(diffs), per_step_max_abs_diff=diffs, dp=grid.dp, tp=grid.tp,
            world_size=grid.dp * grid.tp, optimizer=args.optimizer, steps=args.steps, seed=args.seed,
            shapes=[list(s) for s in args.shapes], tp_dims=args.tp_dims, bucket_numel=args.bucket_numel,
            atol=args.atol, poc_bug=args.poc_bug, overlap=args.overlap, backend=dist.get_backend(), device=str(dev),
            state_bytes=opt.state_bytes(), ledger=comm.ledger.summary())), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(launch(worker, parse_args()))
