"""Run by tests/test_ns_group.py under the launcher: Newton-Schulz at scale on a real DP x TP grid.

* ``batched``: DistributedMuon, layout "owner", ``ns_batch=True``, on shapes with repeats (several
  matrices of one shape, spread over buckets), 3 steps against single-device ``muongrid.Muon`` on the
  DP-mean gradients: parameters equal bit for bit, and each rank's Newton-Schulz calls per step equal the
  number of distinct shapes it owns (from the plan). Also with Polar Express coefficients and the Gram
  form, against the single-device optimizer with the same options.
* ``group``: ``muongrid.ns_group.zeropower_sharded`` on every rank of the "world" group and of the "tp"
  group, each rank holding a near-equal block of a matrix's long side, against ``zeropower_ns5`` of the
  whole matrix in this process (tolerance in tests/test_ns_group.py), and its all-reduces counted.

Prints one JSON line (rank 0) with every rank's findings.

    python tests/ns_run.py --dp 2 --tp 1
"""
import argparse
import json
import sys

import torch

from muongrid import DistributedMuon, Muon
from muongrid.comm import Ledger
from muongrid.launch import add_launch_args, launch
from muongrid.lab.synthetic import build_problem
from muongrid.newton_schulz import zeropower_ns5
from muongrid.ns_group import split_long_side, zeropower_sharded
from muongrid.sharding import tp_shard

# Repeated shapes (eight 16x24, four 24x16, two 20x20) and two of their own, so that on 4 ranks every owner
# holds several matrices of one shape; TP split dims divide by 2.
SHAPES = [(16, 24), (24, 16), (16, 24), (20, 20), (16, 24), (24, 16), (16, 24), (10, 6)] * 2
SHAPES[-1] = (6, 14)
TP_DIMS = [0, 1, -1, 0, 1, 0, -1, 1] * 2
OPTIONS = {"default": {}, "polar_gram": dict(ns_coefficients="polar_express", ns_form="gram")}


def batched(grid, comm, options: dict) -> dict:
    comm.ledger = Ledger()   # each run's own count of Newton-Schulz calls
    problem = build_problem("muon", SHAPES, TP_DIMS, n_groups=2, seed=3, tp=grid.tp)
    groups = [dict(g, **options) for g in problem.param_groups(grid.tp, grid.tp_rank)]
    opt = DistributedMuon(groups, grid, comm=comm, layout="owner", bucket_numel=900, ns_batch=True)
    ref_groups = [dict(g, **options) for g in problem.param_groups()]
    ref = Muon(ref_groups)
    ref_params = {n: p for g in ref_groups for n, p in zip(g["names"], g["params"])}
    equal = True
    for step in range(1, 4):
        grads = problem.grads(step, grid.dp_rank, grid.dp)
        for g in opt.param_groups:
            for n, d, p in zip(g["names"], g["tp_split_dims"], g["params"]):
                p.grad = tp_shard(grads[n], d, grid.tp, grid.tp_rank, n)
        for n, g in problem.mean_grads(step, grid.dp).items():
            ref_params[n].grad = g
        opt.step()
        ref.step()
        equal &= all(torch.equal(p.detach(), tp_shard(ref_params[n].detach(), d, grid.tp, grid.tp_rank, n))
                     for g in opt.param_groups for n, d, p in zip(g["names"], g["tp_split_dims"], g["params"]))
    plan = opt.plan
    shapes_owned = {(m.group_idx, m.full_shape) for buf in plan.metas for m in buf
                    if plan.owners[(m.group_idx, m.param_idx)] == grid.rank}
    return dict(equal=bool(equal), ns_calls=comm.ledger.summary()["ns_calls"], distinct_shapes_owned=len(shapes_owned),
                matrices_owned=sum(1 for buf in plan.metas for m in buf
                                   if plan.owners[(m.group_idx, m.param_idx)] == grid.rank))


def group(grid, comm) -> dict:
    out = {}
    gen = torch.Generator().manual_seed(7)
    matrices = {"wide": torch.randn(24, 70, generator=gen), "tall": torch.randn(61, 20, generator=gen)}
    for name, size, rank in (("world", grid.dp * grid.tp, grid.rank), ("tp", grid.tp, grid.tp_rank)):
        if size == 1 or (name == "tp" and grid.dp == 1):
            continue
        for kind, G in matrices.items():
            for dtype, split_b in ((torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)):
                before = len(comm.ledger.records)
                long_dim, blocks = split_long_side(G, size)
                mine = zeropower_sharded(blocks[rank], lambda t: comm.all_reduce(t, name, "ns_gram_all_reduce"),
                                         long_dim, dtype=dtype, split_b=(rank, size) if split_b else None)
                ref = torch.tensor_split(zeropower_ns5(G, dtype=dtype), size, dim=long_dim)[rank]
                calls = comm.ledger.records[before:]
                out[f"{name}-{kind}-{str(dtype)[6:]}" + ("-splitb" if split_b else "")] = dict(
                    max_abs=float((mine.double() - ref.double()).abs().max()),
                    sq_diff=float((mine.double() - ref.double()).pow(2).sum()), sq_ref=float(ref.double().pow(2).sum()),
                    all_reduces=len(calls), elements=sum(r.numel for r in calls), shape=list(mine.shape))
    return out


def worker(grid, comm, args):
    torch.set_num_threads(1)
    found = {f"batched-{k}": batched(grid, comm, v) for k, v in OPTIONS.items()}
    found["group"] = group(grid, comm)
    everyone = comm.gather_objects(found, "report")
    if grid.rank == 0:
        print(json.dumps(dict(dp=grid.dp, tp=grid.tp, ranks=everyone)), flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_launch_args(p)
    sys.exit(launch(worker, p.parse_args()))
