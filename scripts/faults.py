"""Inject one fault on one rank of a Distributed Muon run and show how the run fails.

    python scripts/faults.py --dp 2 --tp 2 --fault raise   --rank 3 --step 2   # an exception mid-step
    python scripts/faults.py --dp 2 --tp 1 --fault hang    --rank 1 --timeout 5 # a rank stops answering
    python scripts/faults.py --dp 2 --tp 2 --fault nan     --rank 2             # a NaN in one gradient
    python scripts/faults.py --dp 2 --tp 1 --fault missing-grad --rank 0        # p.grad is None on one rank
    python scripts/faults.py --dp 2 --tp 2 --fault watchdog --rank 1            # rank 1 ended by the watchdog
    python scripts/faults.py --dp 2 --tp 2 --fault none                          # no fault: exits 0

Each fault must end the whole run with a non-zero exit code, the failing rank's traceback (or,
for a hang, an error naming the collective that timed out) and no process left behind. The tests
check exactly that; the book's troubleshooting appendix shows the output.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


from dmuon.comm import report_fatal
from dmuon.distributed import DistributedMuon
from dmuon.launch import add_launch_args, check_launch_args, launch
from dmuon.lab.synthetic import build_problem, set_grads

FAULTS = ("none", "raise", "hang", "nan", "missing-grad", "watchdog")
SHAPES = [(36, 57), (45, 28), (33, 17)]
TP_DIMS = [0, 1, -1]


class InjectedFault(RuntimeError):
    pass


def worker(grid, comm, args) -> int:
    problem = build_problem("muon", SHAPES, TP_DIMS, 1, 0, grid.tp)
    opt = DistributedMuon(problem.param_groups(grid.tp, grid.tp_rank), grid, comm=comm)
    target = grid.rank == args.rank
    print(f"rank {grid.rank}: pid {os.getpid()}", flush=True)  # to kill a rank from outside
    for step in range(1, args.steps + 1):
        set_grads(opt.param_groups, problem.grads(step, grid.dp_rank, grid.dp), grid)
        if target and step == args.step:
            first = opt.param_groups[0]["params"][0]
            if args.fault == "raise":
                raise InjectedFault(f"injected failure on rank {grid.rank} at step {step}")
            if args.fault == "hang":
                print(f"rank {grid.rank}: hanging at step {step} (not entering the collective)", flush=True)
                time.sleep(3600)
            if args.fault == "watchdog":  # what comm.py's watchdog does to a rank stuck in a collective
                report_fatal(f"[dmuon watchdog] (injected) rank {grid.rank} ended at step {step}")
                os._exit(3)
            if args.fault == "nan":
                first.grad.view(-1)[0] = float("nan")
            if args.fault == "missing-grad":
                first.grad = None
        if args.fault == "watchdog" and not target and step == args.step:
            time.sleep(3600)  # the others hang: only the launcher can end this run
        opt.step()
        if grid.rank == 0:
            print(f"step {step} done", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    p.add_argument("--fault", choices=FAULTS, default="raise")
    p.add_argument("--rank", type=int, default=0, help="the rank that misbehaves")
    p.add_argument("--step", type=int, default=2, help="the step at which it misbehaves")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args(argv)
    check_launch_args(p, args)
    if not 0 <= args.rank < args.dp * args.tp:
        p.error(f"--rank {args.rank} is not a rank of a {args.dp} x {args.tp} grid")
    return launch(worker, args)


if __name__ == "__main__":
    sys.exit(main())
