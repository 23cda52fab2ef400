"""Profile whole training steps of a real small model, Distributed Muon vs Distributed AdamW, per rank.

    python scripts/profile_step.py --dp 2                  # Chrome traces in _build/traces/
    python scripts/profile_step.py --dp 2 --batch 128      # more tokens per step: the optimizer's share falls
    torchrun --standalone --nproc-per-node 2 scripts/profile_step.py --dp 2

Every data-parallel rank trains two copies of chapter 1's tiny GPT (``dmuon/lab/charlm.py``), started
from the same weights, on its own batches: one with Distributed Muon on the hybrid groups (Muon
for the hidden matrices, AdamW for the rest), one with Distributed AdamW on everything. Their
steps alternate. Each step is forward, backward, then the ZeRO-1 optimizer (gradient
reduce-scatter to parameter all-gather), with a barrier in between so that time spent waiting
for a slower rank's backward pass is counted as waiting, not as communication. After a few
warm-up steps torch.profiler records every rank; each rank writes ``trace_rank<r>.json`` (open it
at https://ui.perfetto.dev) and splits its own trace into forward-backward, waiting,
communication, Newton-Schulz and the rest of the optimizer (``dmuon/lab/traces.py``). Rank 0 prints the medians per rank and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from dmuon.lab.charlm import TinyGPT, batch, load_corpus
from dmuon.distributed import DistributedAdamW, DistributedMuon
from dmuon.layouts import LAYOUTS
from dmuon.launch import add_launch_args, check_launch_args, launch
from dmuon.optim import hybrid_param_groups
from dmuon.lab.traces import breakdown, load_events, median_breakdown

ROOT = Path(__file__).resolve().parents[1]


def worker(grid, comm, args) -> int:
    dev = grid.device
    data = load_corpus()
    models, opts = {}, {}
    for kind in ("muon", "adamw"):
        torch.manual_seed(args.seed)  # the same initial weights on every rank and for both optimizers
        models[kind] = TinyGPT(data["vocab_size"], d=args.width, n_layer=args.layers).to(dev)
        groups = hybrid_param_groups(models[kind].named_parameters(), muon=dict(lr=3e-3), adamw=dict(lr=3e-3))
        cls = DistributedMuon if kind == "muon" else DistributedAdamW
        opts[kind] = cls(groups, grid, comm=comm, layout=args.layout if kind == "muon" else "bucket")
    gen = torch.Generator().manual_seed(args.seed * 7919 + grid.dp_rank)  # each DP rank its own batches

    def train_step(kind):
        x, y = batch(data["train"], args.batch, models[kind].context, gen)
        with record_function(f"train_step:{kind}"):
            with record_function("forward_backward"):
                loss = F.cross_entropy(models[kind](x.to(dev)).flatten(0, 1), y.to(dev).flatten())
                opts[kind].zero_grad()
                loss.backward()
            with record_function("wait_for_peers"):  # so that the optimizer's collectives do not include it
                comm.all_reduce(torch.zeros(1, device=dev), "world", "sync")
            opts[kind].step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

    for i in range(args.warmup):
        for kind in ("muon", "adamw") if i % 2 else ("adamw", "muon"):
            train_step(kind)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for i in range(args.steps):
            for kind in ("muon", "adamw") if i % 2 else ("adamw", "muon"):
                train_step(kind)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trace = out / f"trace_rank{grid.rank}.json"
    prof.export_chrome_trace(str(trace))
    events = load_events(trace)
    mine = {kind: median_breakdown(breakdown(events, f"train_step:{kind}")) for kind in ("muon", "adamw")}
    mine["trace"], mine["trace_bytes"] = str(trace), trace.stat().st_size
    everyone = comm.gather_objects(mine, "report")
    if grid.rank == 0:
        n_params = sum(p.numel() for p in models["muon"].parameters())
        print(f"tiny GPT, {n_params:,} parameters, batch {args.batch} x {models['muon'].context} characters per rank, "
              f"dp={grid.dp}; medians of {args.steps} profiled steps (ms)")
        print(f"{'rank':>4} {'optimizer':<7}{'step':>9}{'fwd+bwd':>9}{'wait':>7}{'comm':>8}{'NS':>8}{'opt. compute':>14}"
              f"{'opt. share':>12}")
        for r, rank in enumerate(everyone):
            for kind in ("muon", "adamw"):
                b = rank[kind]
                print(f"{r:>4} {kind:<7}{b['step']:>9.1f}{b['forward_backward']:>9.1f}{b['waiting']:>7.1f}"
                      f"{b['communication']:>8.1f}{b['newton_schulz']:>8.1f}{b['optimizer_compute']:>14.1f}"
                      f"{b['optimizer_share']:>12.1%}")
        print(f"traces: {', '.join(r['trace'] for r in everyone)}")
        print(json.dumps(dict(dp=grid.dp, tp=grid.tp, layout=args.layout, batch=args.batch, context=models["muon"].context,
                              width=args.width, layers=args.layers, n_params=n_params, steps=args.steps,
                              device=str(dev), ranks=everyone)))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    p.add_argument("--steps", type=int, default=3, help="profiled steps per optimizer (default 3)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch", type=int, default=32, help="sequences per rank per step (default 32)")
    p.add_argument("--width", type=int, default=128, help="model width (default 128)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout", choices=LAYOUTS, default="bucket", help="Distributed Muon's layout (default bucket)")
    p.add_argument("--out", default=str(ROOT / "_build" / "traces"), help="folder for the Chrome traces")
    args = p.parse_args(argv)
    check_launch_args(p, args)
    if args.tp != 1:
        p.error("the profiled model is data-parallel only: use --tp 1 (verify.py and bench.py cover TP)")
    if args.steps < 1 or args.batch < 1:
        p.error("--steps and --batch must be at least 1")
    return launch(worker, args)


if __name__ == "__main__":
    sys.exit(main())
