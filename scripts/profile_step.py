"""Profile whole training steps of a real small model, Distributed Muon vs Distributed AdamW, per rank.

    python scripts/profile_step.py --dp 2                  # Chrome traces in _build/traces/
    python scripts/profile_step.py --dp 2 --batch 128      # more tokens per step: the optimizer's share falls
    python scripts/profile_step.py --dp 2 --tp 2           # the tensor-parallel model on a 2 x 2 grid
    python scripts/profile_step.py --grids 4x1,1x4,2x2 --global-batch 64   # DP4 vs TP4 vs DP2xTP2, same tokens
    torchrun --standalone --nproc-per-node 4 scripts/profile_step.py --dp 2 --tp 2

Every rank trains two copies of chapter 1's tiny GPT, made tensor-parallel over the grid's "tp"
dimension by PyTorch's ``parallelize_module`` (``muongrid/lab/tpgpt.py``; on one TP rank it is
chapter 1's model), started from the same weights: one with Distributed Muon on the hybrid groups
(Muon for the hidden matrices, AdamW for the rest), one with Distributed AdamW on everything.
Their steps alternate. Each DP replica draws its own batches (the TP ranks of a replica share
them). Each step is forward, backward, then the ZeRO-1 optimizer (gradient reduce-scatter to
parameter all-gather), with a barrier in between so that time spent waiting for a slower rank's
backward pass is counted as waiting, not as communication. After a few warm-up steps
torch.profiler records every rank; each rank writes ``trace_rank<r>.json`` (open it at
https://ui.perfetto.dev) and splits its own trace into forward-backward, waiting,
communication, Newton-Schulz and the rest of the optimizer (``muongrid/lab/traces.py``). Rank 0
prints the medians per rank and one JSON line.

``--grids`` runs one such launch per grid, one after the other, each with ``--global-batch``
sequences per step shared by its DP replicas (so every grid trains on the same number of tokens),
and prints them side by side: each grid's slowest rank's step for Muon and for AdamW, their
ratio, and Muon's optimizer share; its JSON line holds every grid's.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from muongrid.lab.charlm import batch, load_corpus
from muongrid.distributed import DistributedAdamW, DistributedMuon
from muongrid.layouts import LAYOUTS
from muongrid.launch import add_launch_args, check_launch_args, launch, under_torchrun, without_torchrun
from muongrid.optim import hybrid_param_groups
from muongrid.lab.tpgpt import tp_gpt
from muongrid.lab.traces import breakdown, like_for_like_steps, load_events, median_breakdown
from muongrid.lab.verdicts import fastest, fastest_text

ROOT = Path(__file__).resolve().parents[1]


def worker(grid, comm, args) -> int:
    dev = grid.device
    data = load_corpus()
    models, opts = {}, {}
    for kind in ("muon", "adamw"):
        # the same initial weights on every rank and for both optimizers
        models[kind] = tp_gpt(data["vocab_size"], grid, d=args.width, n_layer=args.layers, n_head=args.heads,
                              seed=args.seed)
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
    steps = {kind: breakdown(events, f"train_step:{kind}") for kind in ("muon", "adamw")}
    mine = {kind: dict(median_breakdown(steps[kind]), step_all=[s["step"] for s in steps[kind]]) for kind in steps}
    mine["trace"], mine["trace_bytes"] = str(trace), trace.stat().st_size
    everyone = comm.gather_objects(mine, "report")
    if grid.rank == 0:
        n_params = sum(p.numel() for p in models["muon"].parameters())
        print(f"tiny GPT, {n_params:,} parameters, batch {args.batch} x {models['muon'].context} characters per DP "
              f"replica, dp={grid.dp} x tp={grid.tp}; medians of {args.steps} profiled steps (ms)"
              + ("; the parts are device time (CUDA kernels), the step wall time" if dev.type == "cuda" else ""))
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
                              width=args.width, layers=args.layers, heads=args.heads, n_params=n_params, steps=args.steps,
                              device=str(dev), ranks=everyone)))
    return 0


def parse_grids(text: str) -> list[tuple[int, int]]:
    """"4x1,1x4,2x2" -> [(4, 1), (1, 4), (2, 2)] (dp x tp)."""
    try:
        grids = [tuple(int(n) for n in g.split("x")) for g in text.split(",")]
    except ValueError:
        grids = []
    if not grids or any(len(g) != 2 or min(g) < 1 for g in grids):
        raise ValueError(f"--grids {text!r}: give DPxTP grids separated by commas, e.g. 4x1,1x4,2x2")
    return grids


def compare_grids(args, argv: list[str]) -> int:
    """One launch per grid (this script, ``--global-batch`` split over DP), then the grids side by side."""
    passed = []  # every option but the ones this function sets per grid
    skip = {"--grids": 1, "--dp": 1, "--tp": 1, "--batch": 1, "--global-batch": 1}
    it = iter(argv)
    for a in it:
        key = a.split("=")[0]
        if key in skip:
            if "=" not in a:
                next(it, None)
            continue
        passed.append(a)
    rows = []
    for dp, tp in parse_grids(args.grids):
        cmd = [sys.executable, __file__, "--dp", str(dp), "--tp", str(tp), "--batch", str(args.global_batch // dp),
               *passed, "--out", str(Path(args.out) / f"{dp}x{tp}")]
        print(f"== {dp}x{tp}: {' '.join(cmd[1:])}", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=without_torchrun())
        print(proc.stdout, end="", flush=True)
        if proc.returncode != 0:
            print(proc.stderr[-4000:], file=sys.stderr)
            print(f"profile_step.py: the {dp}x{tp} run failed (exit {proc.returncode})", file=sys.stderr)
            return 1
        r = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
        slowest = {k: max(rank[k]["step"] for rank in r["ranks"]) for k in ("muon", "adamw")}
        same_fb = like_for_like_steps(r["ranks"])
        per_step = {k: [max(steps) for steps in zip(*(rank[k]["step_all"] for rank in r["ranks"]))] for k in ("muon", "adamw")}
        share = sum(rank["muon"]["optimizer_share"] for rank in r["ranks"]) / len(r["ranks"])
        rows.append(dict(grid=f"{dp}x{tp}", dp=dp, tp=tp, batch_per_replica=args.global_batch // dp,
                         muon_step_ms=slowest["muon"], adamw_step_ms=slowest["adamw"],
                         muon_step_ms_all=per_step["muon"], adamw_step_ms_all=per_step["adamw"],
                         muon_over_adamw=same_fb["muon"] / same_fb["adamw"], muon_optimizer_share=share,
                         ranks=r["ranks"]))
    print(f"\nglobal batch {args.global_batch} sequences; slowest rank's median step (ms)")
    print(f"{'grid':<6}{'Muon':>9}{'AdamW':>9}{'Muon/AdamW*':>12}{'Muon opt. share':>17}")
    for row in rows:
        print(f"{row['grid']:<6}{row['muon_step_ms']:>9.1f}{row['adamw_step_ms']:>9.1f}{row['muon_over_adamw']:>12.2f}"
              f"{row['muon_optimizer_share']:>17.1%}")
    print("* over the same forward-backward (the mean of both model copies'): the copies' own differ by noise")
    muon_steps = {row["grid"]: row["muon_step_ms_all"] for row in rows}
    print(f"Muon: {fastest_text(muon_steps)} (each step's slowest rank; a winner only outside the noise)")
    print(json.dumps(dict(global_batch=args.global_batch, width=args.width, layers=args.layers, heads=args.heads,
                          steps=args.steps, layout=args.layout, fastest_for_muon=fastest(muon_steps), grids=rows)))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    p.add_argument("--steps", type=int, default=3, help="profiled steps per optimizer (default 3)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch", type=int, default=32, help="sequences per DP replica per step (default 32)")
    p.add_argument("--width", type=int, default=128, help="model width (default 128)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4, help="attention heads, split over TP (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout", choices=LAYOUTS, default="bucket", help="Distributed Muon's layout (default bucket)")
    p.add_argument("--out", default=str(ROOT / "_build" / "traces"), help="folder for the Chrome traces")
    p.add_argument("--grids", default=None, help="compare grids, e.g. 4x1,1x4,2x2 (one launch each)")
    p.add_argument("--global-batch", type=int, default=64, help="with --grids: sequences per step over all replicas")
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.global_batch < 1:
        p.error("--steps, --batch and --global-batch must be at least 1")
    if args.width % args.heads:
        p.error(f"--width {args.width} must divide by --heads {args.heads}")
    if args.grids:
        if under_torchrun() and int(os.environ["WORLD_SIZE"]) > 1:
            p.error("--grids launches one run per grid itself: start it once, with python (or torchrun "
                    "--nproc-per-node 1), not as one of several torchrun ranks")
        try:
            grids = parse_grids(args.grids)
        except ValueError as e:
            p.error(str(e))
        for dp, tp in grids:
            if args.global_batch % dp or args.heads % tp:
                p.error(f"grid {dp}x{tp}: --global-batch {args.global_batch} must divide by dp and --heads "
                        f"{args.heads} by tp")
        return compare_grids(args, sys.argv[1:] if argv is None else list(argv))
    check_launch_args(p, args)
    if args.heads % args.tp:
        p.error(f"--heads {args.heads} must divide by --tp {args.tp}: each TP rank computes whole heads")
    return launch(worker, args)


if __name__ == "__main__":
    sys.exit(main())
