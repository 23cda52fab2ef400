"""Run four collectives for real on gloo (ZeRO-1's three and broadcast), print what every rank had and got.

    python scripts/collectives.py --dp 4            # 4 ranks
    python scripts/collectives.py --dp 3 --numel 6  # each rank's full tensor has 6 elements

Every rank starts with a small tensor whose values say who owns them (rank r holds
``100*r + i``). The script runs an all-gather of one shard, a reduce-scatter and an all-reduce of the
full tensor, a broadcast of rank 0's full tensor, checks that the all-reduce equals a reduce-scatter followed by an all-gather, and
prints each rank's input and output plus the bytes the ledger counted. The last line is JSON.
"""
from __future__ import annotations

import argparse
import json
import sys


import torch

from muongrid.launch import add_launch_args, check_launch_args, launch


def worker(grid, comm, args) -> int:
    world = grid.dp * grid.tp
    full = torch.arange(args.numel, dtype=torch.float32, device=grid.device) + 100 * grid.rank
    shard = full.view(world, -1)[grid.rank].clone()
    # BOOK-START collectives (chapter 2 shows the lines up to BOOK-END)
    # comm.<op>(tensor, group, phase): "world" is every rank; the phase labels the ledger
    results = {
        "input (full)": full,
        "all_gather(my shard)": comm.all_gather(shard, "world", "demo_all_gather"),
        "reduce_scatter(full)": comm.reduce_scatter_sum(full, "world", "demo_rs"),
        "all_reduce(full)": comm.all_reduce(full.clone(), "world", "demo_all_reduce"),
        "broadcast(from rank 0)": comm.broadcast(full.clone(), "world", "demo_bc", src=0),
    }
    rs = results["reduce_scatter(full)"]
    rs_then_ag = comm.all_gather(rs, "world", "demo_check")
    same = torch.equal(rs_then_ag, results["all_reduce(full)"])
    # BOOK-END collectives
    # Bring every rank's results to rank 0 (through the same wrapper) to print one table.
    table = {k: comm.all_gather(v, "world", "demo_report").view(world, -1).tolist() for k, v in results.items()}
    if grid.rank == 0:
        for name, rows in table.items():
            print(f"{name}:")
            for r, row in enumerate(rows):
                print(f"  rank {r}: {' '.join(str(int(v)) for v in row)}")
        print(f"all_reduce == all_gather(reduce_scatter): {same}")
        per_op = {}
        for rec in comm.ledger.records:
            if rec.phase.startswith("demo_") and rec.phase not in ("demo_check", "demo_report"):
                per_op[rec.op] = dict(elements_in_shard=rec.numel, bytes_sent=rec.bytes_sent)
        print(json.dumps(dict(world=world, numel=args.numel, results=table, allreduce_is_rs_plus_ag=same,
                              ledger=per_op)))
    return 0 if same else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    p.add_argument("--numel", type=int, default=8, help="elements in each rank's full tensor")
    args = p.parse_args(argv)
    check_launch_args(p, args)
    if args.numel % (args.dp * args.tp):
        p.error(f"--numel {args.numel} must divide by the world size {args.dp * args.tp}")
    return launch(worker, args)


if __name__ == "__main__":
    sys.exit(main())
