"""Run by tests/test_group_layout.py under the launcher (or in-process for 1 x 1): the "group" layout.

Four seeded problems, each with large matrices (far above their fair share of Newton-Schulz FLOPs, so the
plan gives them groups on any grid of 2 ranks or more) among five small ones, none of whose sides divide
evenly by every group size: one large matrix, wide with TP splitting its short side, tall with TP splitting
its long side, or replicated over TP; or two, with groups sized by time on ``TIMED_HW`` (``hw=``), which on
2 x 2 gives groups no FLOP window would: ranks 0, 1, 2 and ranks 0, 3 (not contiguous, rank 0 in both).
For each, DistributedMuon with layout "owner" and with layout "group" run 3 steps beside single-device
``muongrid.Muon`` on the DP-mean gradients, and every rank reports:

* for every parameter, its max abs difference from the reference (owner layout and group layout) and,
  for the grouped ones, the squared Frobenius distance to the reference and the squared size of the
  reference's update (parameters after - before), on this rank's TP shard;
* whether the owner matrices of the group layout equal the owner layout's bit for bit;
* the plan's groups, its last step's ledger (bytes per phase) and Newton-Schulz calls;
* under "options", the group layout with each of ``OPTIONS`` (``ns_batch``, ``ns_form="gram"``, Polar
  Express, each overlap mode) against single-device Muon with the same options, on a problem with
  repeated shapes: differences per parameter, Newton-Schulz calls and the distinct shapes this rank owns.

Prints one JSON line (rank 0) with every rank's findings.

    python tests/group_run.py --dp 2 --tp 2
"""
import argparse
import json
import sys

import torch

from muongrid import DistributedMuon, Muon, hardware
from muongrid.launch import add_launch_args, launch
from muongrid.lab.synthetic import build_problem, set_grads
from muongrid.comm import Comm, Ledger
from muongrid.ns_gram_group import gram_sharded_bytes
from muongrid.sharding import tp_shard

SMALL = [((20, 36), 1), ((36, 20), 0), ((24, 24), -1), ((12, 8), 0), ((8, 28), 1)]
LARGE = {"wide-tp-short": [((96, 230), 0)], "tall-tp-long": [((228, 64), 0)], "replicated": [((80, 170), -1)],
         "timed": [((116, 218), 0), ((120, 142), 0)]}
# A slow rank (1 GFLOP/s) in nodes of 4 with a fast link inside and a slow one between: groups pay, inside a node.
TIMED_HW = hardware.profile(flops=1e9, efficiency=1.0, ranks_per_node=4, intra=(1e-6, 1e9), inter=(1e-4, 1e8))
HW = {"timed": TIMED_HW}   # the problems whose group plan is sized by time (the others: by FLOPs)
BUCKET_NUMEL = 4000   # several buckets; the large matrix's DP pieces straddle shard boundaries
STEPS = 3


def problem_for(name: str, tp: int):
    items = SMALL[:2] + LARGE[name] + SMALL[2:]
    return build_problem("muon", [s for s, _ in items], [d for _, d in items], n_groups=1, seed=11, tp=tp)


def check(grid, name: str) -> dict:
    problem = problem_for(name, grid.tp)
    opts, ledgers = {}, {}
    for layout in ("owner", "group"):
        ledgers[layout] = Ledger()
        comm = Comm(grid, ledger=ledgers[layout])
        timed = dict(hw=HW[name]) if layout == "group" and name in HW else {}
        opts[layout] = DistributedMuon(problem.param_groups(grid.tp, grid.tp_rank), grid, comm=comm, layout=layout,
                                       bucket_numel=BUCKET_NUMEL, **timed)
    ref_groups = problem.param_groups()
    ref = Muon(ref_groups)
    ref_params = {n: p for g in ref_groups for n, p in zip(g["names"], g["params"])}
    first = {n: p.detach().clone() for n, p in ref_params.items()}
    for step in range(1, STEPS + 1):
        grads = problem.grads(step, grid.dp_rank, grid.dp)
        for opt in opts.values():
            set_grads(opt.param_groups, grads, grid)
            opt.step()
        for n, g in problem.mean_grads(step, grid.dp).items():
            ref_params[n].grad = g
        ref.step()
    plan = opts["group"].plan
    grouped = {plan.metas[b][i].name for (b, i) in plan.groups}
    params = {}
    owner_equal = True
    for layout, opt in opts.items():
        for g in opt.param_groups:
            for n, d, p in zip(g["names"], g["tp_split_dims"], g["params"]):
                want = tp_shard(ref_params[n].detach(), d, grid.tp, grid.tp_rank, n)
                diff = (p.detach().double() - want.double())
                row = params.setdefault(n, dict(grouped=n in grouped))
                row[f"{layout}_max_abs"] = float(diff.abs().max())
                if layout == "group" and n in grouped:
                    update = want.double() - tp_shard(first[n], d, grid.tp, grid.tp_rank, n).double()
                    row.update(sq_diff=float(diff.pow(2).sum()), sq_update=float(update.pow(2).sum()))
    for go, oo in zip(opts["group"].param_groups, opts["owner"].param_groups):
        for n, pg, po in zip(go["names"], go["params"], oo["params"]):
            if n not in grouped:
                owner_equal &= torch.equal(pg.detach(), po.detach())
    summary = ledgers["group"].summary()
    return dict(params=params, owner_matrices_equal_owner_layout=bool(owner_equal),
                groups=sorted([list(k), list(v)] for k, v in plan.groups.items()),
                owners=sorted([list(k), v] for k, v in plan.owners.items()),
                bytes_per_phase={ph: p["bytes_sent"] for ph, p in summary["phases"].items()},
                calls_per_phase={ph: p["calls"] for ph, p in summary["phases"].items()},
                ns_calls=summary["ns_calls"], owner_ns_calls=ledgers["owner"].summary()["ns_calls"])


# The options a user of the owner layout has, under "group", on one problem with repeated shapes (so that
# batching batches): (Newton-Schulz options of the group, optimizer keywords). Between them they cover
# every overlap mode, same-shape batching, the Gram form and another coefficient schedule.
OPTIONS = {"batch-none": ({}, dict(ns_batch=True, overlap="none")),
           "gram-polar-naive": (dict(ns_form="gram", ns_coefficients="polar_express"), dict(overlap="naive")),
           "batch-gram-prefetch": (dict(ns_form="gram"), dict(ns_batch=True, overlap="prefetch"))}


def options_problem(tp: int):
    items = SMALL[:2] + LARGE["wide-tp-short"] + SMALL[2:] + [((12, 8), 0)] * 10   # > 8 ranks: one owns two
    return build_problem("muon", [s for s, _ in items], [d for _, d in items], n_groups=1, seed=12, tp=tp)


def check_options(grid, label: str) -> dict:
    """The group layout with ``OPTIONS[label]`` beside single-device Muon with the same Newton-Schulz options:
    per parameter its max abs difference (and for grouped ones the squared distance and update), the
    Newton-Schulz calls of the last step and the distinct shapes this rank owns."""
    ns_options, keywords = OPTIONS[label]
    problem = options_problem(grid.tp)
    ledger = Ledger()
    opt = DistributedMuon([dict(g, **ns_options) for g in problem.param_groups(grid.tp, grid.tp_rank)], grid,
                          comm=Comm(grid, ledger=ledger), layout="group", bucket_numel=BUCKET_NUMEL, **keywords)
    ref_groups = [dict(g, **ns_options) for g in problem.param_groups()]
    ref = Muon(ref_groups)
    ref_params = {n: p for g in ref_groups for n, p in zip(g["names"], g["params"])}
    first = {n: p.detach().clone() for n, p in ref_params.items()}
    for step in range(1, STEPS + 1):
        set_grads(opt.param_groups, problem.grads(step, grid.dp_rank, grid.dp), grid)
        opt.step()
        for n, g in problem.mean_grads(step, grid.dp).items():
            ref_params[n].grad = g
        ref.step()
    plan = opt.plan
    grouped = {plan.metas[b][i].name for (b, i) in plan.groups}
    params = {}
    for g in opt.param_groups:
        for n, d, p in zip(g["names"], g["tp_split_dims"], g["params"]):
            want = tp_shard(ref_params[n].detach(), d, grid.tp, grid.tp_rank, n)
            diff = p.detach().double() - want.double()
            update = want.double() - tp_shard(first[n], d, grid.tp, grid.tp_rank, n).double()
            params[n] = dict(grouped=n in grouped, max_abs=float(diff.abs().max()), sq_diff=float(diff.pow(2).sum()),
                             sq_update=float(update.pow(2).sum()))
    mine = [m for buf in plan.metas for m in buf if plan.owners.get((m.group_idx, m.param_idx)) == grid.rank]
    summary = ledger.summary()
    return dict(params=params, ns_calls=summary["ns_calls"], distinct_shapes_owned=len({m.full_shape for m in mine}),
                matrices_owned=len(mine),
                memberships=sum(grid.rank in members for members in plan.groups.values()),
                groups=sorted([list(k), list(v)] for k, v in plan.groups.items()),
                overlap=opt.overlap, ns_batch=opt.ns_batch,
                calls_per_phase={ph: p["calls"] for ph, p in summary["phases"].items()},
                bytes_per_phase={ph: p["bytes_sent"] for ph, p in summary["phases"].items()},
                gram_form_bytes=sum(gram_sharded_bytes(*plan.metas[b][i].full_shape, len(members))
                                    for (b, i), members in plan.groups.items() if grid.rank in members))


def worker(grid, comm, args):
    torch.set_num_threads(1)
    found = {name: check(grid, name) for name in LARGE}
    found["options"] = {label: check_options(grid, label) for label in OPTIONS}
    everyone = comm.gather_objects(found, "report")
    if grid.rank == 0:
        print(json.dumps(dict(dp=grid.dp, tp=grid.tp, ranks=everyone)), flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_launch_args(p)
    sys.exit(launch(worker, p.parse_args()))
