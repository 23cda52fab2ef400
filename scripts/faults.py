"""Inject one fault on one rank of a Distributed Muon run and show how the run fails.

    python scripts/faults.py --dp 2 --tp 2 --fault raise   --rank 3 --step 2   # an exception mid-step
    python scripts/faults.py --dp 2 --tp 1 --fault hang    --rank 1 --timeout 5 # a rank stops answering
    python scripts/faults.py --dp 2 --tp 2 --fault nan     --rank 2             # a NaN in one gradient
    python scripts/faults.py --dp 2 --tp 2 --fault watchdog --rank 1            # rank 1 ended by the watchdog
    python scripts/faults.py --dp 2 --tp 2 --fault kill    --rank 1             # rank 1 dies of SIGKILL (the OOM killer)
    python scripts/faults.py --dp 2 --tp 1 --fault shape-mismatch --rank 1      # rank 1 built another model
    python scripts/faults.py --dp 2 --tp 2 --fault wrong-dtype --rank 2         # a bf16 gradient on one rank
    python scripts/faults.py --dp 2 --tp 2 --fault corrupt-checkpoint --rank 1  # a checkpoint file truncated
    python scripts/faults.py --dp 2 --tp 2 --fault none                          # no fault: exits 0

Each fault must end the whole run with a non-zero exit code, the failing rank's traceback (or,
for a hang, an error naming the collective that timed out) and no process left behind. The tests
check exactly that; chapter 10 shows each fault's output as a reader sees it, and ``scripts/fault_bench.py`` repeats
every fault under CPU load to show that each one ends cleanly every time.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

from muongrid import checkpoint
from muongrid.comm import report_fatal
from muongrid.distributed import DistributedMuon
from muongrid.launch import add_launch_args, check_launch_args, launch
from muongrid.lab.synthetic import build_problem, set_grads

FAULTS = ("none", "raise", "hang", "nan", "watchdog", "kill", "shape-mismatch", "wrong-dtype",
          "corrupt-checkpoint")
SHAPES = [(36, 57), (45, 28), (33, 17)]
TP_DIMS = [0, 1, -1]


class InjectedFault(RuntimeError):
    pass


def say(line: str) -> None:
    """One write per line, so that lines from ranks sharing a terminal never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def worker(grid, comm, args) -> int:
    target = grid.rank == args.rank
    shapes = list(SHAPES)
    if target and args.fault == "shape-mismatch":  # this rank's model has one column more in one matrix
        shapes[2] = (shapes[2][0], shapes[2][1] + 1)
    problem = build_problem("muon", shapes, TP_DIMS, 1, 0, grid.tp)
    say(f"rank {grid.rank}: pid {os.getpid()}")  # to kill a rank from outside
    opt = DistributedMuon(problem.param_groups(grid.tp, grid.tp_rank, grid.device), grid, comm=comm, layout="bucket")
    for step in range(1, args.steps + 1):
        set_grads(opt.param_groups, problem.grads(step, grid.dp_rank, grid.dp), grid)
        if step == args.step:
            # A barrier first: every rank has finished the steps before, and rank 0 has said so. The
            # launcher stops all ranks once the target fails, which could otherwise cut off a rank 0 that
            # is still finishing step - 1 (seen once in CI on 2 cores: no "step 1 done").
            comm.gather_objects(None, "report")
            inject(args.fault, target, grid, opt, step)
        opt.step()
        if grid.rank == 0:
            say(f"step {step} done")
    return 0


def inject(fault: str, target: bool, grid, opt, step: int) -> None:
    """The fault, on the target rank at ``step`` (the others carry on as if nothing happened)."""
    first = opt.param_groups[0]["params"][0]
    if fault == "corrupt-checkpoint":  # every rank saves, one truncates a file, every rank loads
        mine = tempfile.mkdtemp(prefix="muongrid-fault-") if grid.rank == 0 else None
        folder = opt.comm.gather_objects(mine, "report")[0]  # rank 0's folder, on every rank
        checkpoint.save(opt, Path(folder) / "ckpt", step=step - 1)
        if target:
            data = sorted((Path(folder) / "ckpt").glob("*.distcp"))[0]
            data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
            say(f"rank {grid.rank}: truncated {data.name} to half its size")
        opt.comm.gather_objects(None, "report")  # a barrier: the file is cut before anyone reads
        try:
            checkpoint.load(opt, Path(folder) / "ckpt")
        finally:  # every rank has finished reading (DCP gathers the ranks' errors before raising)
            if grid.rank == 0:
                shutil.rmtree(folder, ignore_errors=True)
    if not target:
        if fault == "watchdog":
            time.sleep(3600)  # the others hang: only the launcher can end this run
        return
    if fault == "raise":
        raise InjectedFault(f"injected failure on rank {grid.rank} at step {step}")
    if fault == "hang":
        say(f"rank {grid.rank}: hanging at step {step} (not entering the collective)")
        time.sleep(3600)
    if fault == "watchdog":  # what comm.py's watchdog does to a rank stuck in a collective
        report_fatal(f"[muongrid watchdog] (injected) rank {grid.rank} ended at step {step}")
        os._exit(3)
    if fault == "kill":  # what the out-of-memory killer does: no exception, no traceback, no clean-up
        say(f"rank {grid.rank}: sending itself SIGKILL at step {step}")
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "nan":
        first.grad.view(-1)[0] = float("nan")
    if fault == "wrong-dtype":  # e.g. a mixed-precision hook on one rank; torch allows it through .data
        first.grad.data = first.grad.data.to(torch.bfloat16)


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
