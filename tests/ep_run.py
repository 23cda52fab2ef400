"""Run by tests/test_expert_parallel.py under the launcher: an expert-parallel MoE's optimizer against one process.

A small MoE's parameters: dense matrices and a bias (every rank holds them: ZeRO-1 over the job's DP), and two
expert banks of ``EXPERTS`` experts (experts x out x in), dealt over ``--ep`` expert-parallel ranks: DP rank d
holds expert slice ``d % ep``, ``EXPERTS / ep`` experts of each bank. Two DistributedMuon optimizers, as a
user builds them: the dense groups on the job's grid, the expert groups on ``grid.expert(ep)`` (each slice's
replicas average its gradients, shard its state and place its Newton-Schulz among themselves). Gradients are
integers (so every mean is exact), drawn per step and rank; ``--clip`` clips both optimizers together by the
model's global norm (``clipping.clip_together_``). The reference, in every rank's process: single-device
``MuonW`` on all parameters, each dense gradient the mean over every DP rank, each expert's the mean over the
ranks that hold it, clipped by ``clipping.clip_grad_norm_``. Dense parameters and this rank's experts must
equal it bit for bit. Prints one JSON line (rank 0).

    python tests/ep_run.py --dp 4 --tp 1 --configs 4x1:2:clip,4x1:4,2x2:2

``--configs`` runs several grids in one launch of ``dp * tp`` processes (each ``DPxTP:EP[:clip]`` of that world
size; a grid other than the launch's is built inside it), so the tests start their processes once.
"""
import argparse
import json
import sys

import torch

from muongrid import DistributedMuon, MuonW
from muongrid.clipping import clip_grad_norm_, clip_together_
from muongrid.launch import add_launch_args, launch

EXPERTS, STEPS = 4, 3
DENSE = {"attn.w": (24, 16), "shared.w": (16, 24), "norm.b": (16,)}
BANKS = {"experts.w1": (EXPERTS, 20, 16), "experts.w2": (EXPERTS, 16, 20)}


def full_params() -> dict:
    gen = torch.Generator().manual_seed(0)
    return {n: torch.randn(shape, generator=gen) * 0.1 for n, shape in {**DENSE, **BANKS}.items()}


def grads(step: int, dp_rank: int) -> dict:
    """DP rank ``dp_rank``'s gradients at ``step`` for every parameter (integers: exact sums and halvings)."""
    gen = torch.Generator().manual_seed(1000 * step + dp_rank)
    return {n: (torch.randn(shape, generator=gen) * 8).round() for n, shape in {**DENSE, **BANKS}.items()}


def experts_of(slice_: int, ep: int) -> slice:
    k = EXPERTS // ep
    return slice(slice_ * k, (slice_ + 1) * k)


def reference(dp: int, ep: int, clip: float | None) -> dict:
    ref = {n: torch.nn.Parameter(t) for n, t in full_params().items()}
    opt = MuonW([{"params": [ref[n] for n in DENSE if len(DENSE[n]) == 2] + [ref[n] for n in BANKS]},
                 {"params": [ref["norm.b"]], "use_muon": False}])
    for step in range(1, STEPS + 1):
        per_rank = [grads(step, d) for d in range(dp)]
        for n in DENSE:
            ref[n].grad = sum(g[n] for g in per_rank) / dp
        for n in BANKS:
            ref[n].grad = torch.cat([sum(per_rank[d][n][experts_of(e, ep)] for d in range(dp) if d % ep == e) / (dp // ep)
                                     for e in range(ep)])
        if clip is not None:
            clip_grad_norm_(list(ref.values()), clip)
        opt.step()
    return {n: p.detach() for n, p in ref.items()}


def run(grid, comm, layout: str, ep: int, clip: float | None) -> dict:
    start = full_params()
    mine = experts_of(grid.dp_rank % ep, ep)
    dense = {n: torch.nn.Parameter(start[n].clone()) for n in DENSE}
    banks = {n: torch.nn.Parameter(start[n][mine].clone()) for n in BANKS}
    dense_opt = DistributedMuon([{"params": [dense["attn.w"], dense["shared.w"]], "names": ["attn.w", "shared.w"]},
                                 {"params": [dense["norm.b"]], "names": ["norm.b"], "use_muon": False}],
                                grid, comm=comm, layout=layout)
    expert_opt = DistributedMuon([{"params": list(banks.values()), "names": list(banks)}], grid.expert(ep),
                                 layout=layout)
    for step in range(1, STEPS + 1):
        g = grads(step, grid.dp_rank)
        for n, p in dense.items():
            p.grad = g[n].clone()
        for n, p in banks.items():
            p.grad = g[n][mine].clone()
        if clip is not None:
            clip_together_([dense_opt, expert_opt], clip)
        dense_opt.step()
        expert_opt.step()
    want = reference(grid.dp, ep, clip)
    diff = {n: (p.detach() - want[n]).abs().max().item() for n, p in dense.items()}
    diff.update({n: (p.detach() - want[n][mine]).abs().max().item() for n, p in banks.items()})
    moved = min((want[n] - start[n]).abs().max().item() for n in want)
    ledger = expert_opt.comm.ledger.summary()
    return dict(diff=diff, moved=moved, expert_grid=dict(dp=expert_opt.grid.dp, rank=expert_opt.grid.rank),
                expert_phases=sorted(ledger["phases"]), ns_calls=ledger["ns_calls"])


def worker(grid, comm, args):
    from muongrid.comm import Comm
    from same_world import grid_of

    torch.set_num_threads(1)
    configs = args.configs.split(",") if args.configs else [f"{grid.dp}x{grid.tp}:{args.ep}" + (":clip" if args.clip else "")]
    out = {}
    for config in configs:
        shape, ep, *clip = config.split(":")
        dp, tp, here = grid_of(grid, shape, args.timeout)
        here_comm = comm if here is grid else Comm(here)
        cut = args.clip if args.clip is not None else (50.0 if clip else None)
        out[config] = dict(dp=dp, tp=tp, ep=int(ep), layouts={
            layout: run(here, here_comm, layout, int(ep), cut) for layout in args.layouts.split(",")})
    everyone = comm.gather_objects(out, "report")
    if grid.rank == 0:
        print(json.dumps(dict(world=grid.dp * grid.tp, ranks=everyone)), flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_launch_args(p)
    p.add_argument("--ep", type=int, default=2)
    p.add_argument("--clip", type=float, default=None, help="clip both optimizers together at this global norm")
    p.add_argument("--layouts", default="owner,aligned,bucket")
    p.add_argument("--configs", default="", help="several DPxTP:EP[:clip] grids of this world size, in one launch")
    sys.exit(launch(worker, p.parse_args()))
