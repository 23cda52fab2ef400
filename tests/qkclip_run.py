"""Run by tests/test_qk_clip.py under the launcher: MuonClip's QK-clip on a DP x TP grid against one process.

A head-major fused QKV matrix of 4 heads (72 x 24: each head's query, key and value rows in turn, split over TP
by rows, so a TP rank holds whole heads), a matrix split by columns, one replicated and a bias, as
``synthetic.build_problem("hybrid")`` makes them (integer-valued gradients, so every grid's DP mean is exact).
Every step each rank reports per-head maxima for its own rows and heads (drawn from a seed: half above the
threshold), the optimizer clips after its update, and the parameters must equal single-device ``MuonW`` on
the DP-mean gradients followed by ``qk_clip.clip_rows_`` with the maxima's max over DP, bit for bit. With
``--fsdp`` the same on FSDP2 (``fully_shard``, DP only) with ``FSDPMuon``. Prints one JSON line (rank 0).

    python tests/qkclip_run.py --dp 2 --tp 2
    python tests/qkclip_run.py --dp 2 --tp 1 --grids 2x1,1x2 --fsdp   # several grids of one world size, one launch
"""
import argparse
import json
import sys

import torch

from muongrid import DistributedMuon, MuonW
from muongrid.comm import Comm
from muongrid.launch import add_launch_args, launch
from muongrid.lab.synthetic import build_problem
from muongrid.qk_clip import QKClip, QKLayer, clip_rows_, factors
from muongrid.sharding import tp_shard

HEADS, HD, THRESHOLD, STEPS = 4, 6, 50.0, 3
SHAPES, TP_DIMS = [(3 * HEADS * HD, HEADS * HD), (24, 20), (14, 24)], [0, 1, -1]
QKV = "layers.0.weight"
LAYER = QKLayer(QKV, QKV, tuple((h * 3 * HD, h * 3 * HD + HD) for h in range(HEADS)),
                tuple((h * 3 * HD + HD, h * 3 * HD + 2 * HD) for h in range(HEADS)))


def maxima(step: int, dp_rank: int) -> torch.Tensor:
    """DP rank ``dp_rank``'s per-head largest logits at ``step`` (every head; a TP rank reports its own)."""
    return torch.rand(HEADS, generator=torch.Generator().manual_seed(100 * step + dp_rank)) * 2 * THRESHOLD


def mean_grads(problem, step: int, dp: int) -> dict:
    total = None
    for r in range(dp):
        g = problem.grads(step, r, dp)
        total = g if total is None else {n: total[n] + g[n] for n in g}
    return {n: t / dp for n, t in total.items()}


def reference(problem, dp: int) -> dict:
    ref = {n: torch.nn.Parameter(t.clone()) for n, t in problem.full.items()}
    groups = problem.param_groups()
    for g in groups:
        g["params"] = [ref[n] for n in g["names"]]
    opt = MuonW(groups)
    for step in range(1, STEPS + 1):
        for n, g in mean_grads(problem, step, dp).items():
            ref[n].grad = g
        opt.step()
        factor = factors(torch.stack([maxima(step, r) for r in range(dp)]).amax(0), THRESHOLD)
        with torch.no_grad():
            for which in ("q", "k"):
                clip_rows_(ref[QKV], LAYER, factor, which)
    return {n: p.detach() for n, p in ref.items()}


def zero1(layout: str, grid, comm, want: dict) -> dict:
    problem = build_problem("hybrid", SHAPES, TP_DIMS, seed=3, tp=grid.tp)
    clip = QKClip(THRESHOLD, [LAYER])
    opt = DistributedMuon(problem.param_groups(grid.tp, grid.tp_rank), grid, comm=Comm(grid), layout=layout,
                          bucket_numel=500, qk_clip=clip)
    local = HEADS // grid.tp
    for step in range(1, STEPS + 1):
        grads = problem.grads(step, grid.dp_rank, grid.dp)
        for g in opt.param_groups:
            for n, d, p in zip(g["names"], g["tp_split_dims"], g["params"]):
                p.grad = tp_shard(grads[n], d, grid.tp, grid.tp_rank, n)
        clip.record(0, maxima(step, grid.dp_rank)[grid.tp_rank * local:(grid.tp_rank + 1) * local],
                    first_head=grid.tp_rank * local)
        opt.step()
    diff = max((p.detach() - tp_shard(want[n], d, grid.tp, grid.tp_rank, n)).abs().max().item()
               for g in opt.param_groups for n, d, p in zip(g["names"], g["tp_split_dims"], g["params"]))
    clipped = int((clip.last > THRESHOLD).sum())   # heads the last step clipped (device tensor read for the report)
    calls = opt.comm.ledger.summary()["phases"]["qk_clip"]["calls"] if grid.dp * grid.tp > 1 else 1
    return dict(max_diff=diff, clipped=clipped, qk_clip_calls=calls)


def fsdp(grid, comm, want: dict) -> dict:
    """FSDPMuon on the same problem, DP only: each parameter a module's weight, fully_shard over "dp"."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor

    from muongrid import FSDPMuon
    problem = build_problem("hybrid", SHAPES, [-1, -1, -1], seed=3, tp=1)
    module = torch.nn.ParameterDict({n.replace(".", "_"): torch.nn.Parameter(t.clone())
                                     for n, t in problem.full.items()})
    fully_shard(module, mesh=grid.mesh["dp"])
    groups = problem.param_groups()
    for g in groups:
        g["params"] = [module[n.replace(".", "_")] for n in g["names"]]
    clip = QKClip(THRESHOLD, [LAYER])
    opt = FSDPMuon(groups, grid, comm=Comm(grid), qk_clip=clip)
    for step in range(1, STEPS + 1):
        mean = mean_grads(problem, step, grid.dp)   # FSDP2's reduce-scatter leaves the DP mean in .grad
        for g in groups:
            for n, p in zip(g["names"], g["params"]):
                p.grad = distribute_tensor(mean[n], p.device_mesh, p.placements)
        clip.record(0, maxima(step, grid.dp_rank))
        opt.step()
    diff = max((p.full_tensor().detach() - want[n]).abs().max().item()
               for g in groups for n, p in zip(g["names"], g["params"]))
    return dict(max_diff=diff)


def worker(grid, comm, args):
    from same_world import grid_of

    torch.set_num_threads(1)
    out = {}
    for shape in (args.grids.split(",") if args.grids else [f"{grid.dp}x{grid.tp}"]):
        dp, tp, here = grid_of(grid, shape, args.timeout)
        problem = build_problem("hybrid", SHAPES, TP_DIMS, seed=3, tp=tp)
        want = reference(problem, dp)
        found = {layout: zero1(layout, here, comm, want) for layout in args.layouts.split(",")}
        if args.fsdp and tp == 1:
            found["fsdp"] = fsdp(here, comm, want)
        out[shape] = found
    everyone = comm.gather_objects(out, "report")
    if grid.rank == 0:
        print(json.dumps(dict(world=grid.dp * grid.tp, ranks=everyone)), flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_launch_args(p)
    p.add_argument("--layouts", default="bucket,owner,aligned")
    p.add_argument("--fsdp", action="store_true", help="also FSDPMuon, on the grids without TP")
    p.add_argument("--grids", default="", help="several DPxTP grids of this world size, in one launch")
    sys.exit(launch(worker, p.parse_args()))
