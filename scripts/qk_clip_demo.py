"""MuonClip's QK-clip on the book's GPT: the largest attention logit per step, with and without the clip.

    python scripts/qk_clip_demo.py --dp 2 --steps 120 --threshold 8

Trains ``lab/charlm.TinyGPT`` (on Python's own docs, each DP rank its own batches) twice with the same seed
under ``DistributedMuon`` (owner layout, hybrid groups): once only watching the logits (``QKClip(None)``),
once clipping at ``--threshold`` (``muongrid/qk_clip.py``). Each step the model reports every head's largest
causal pre-softmax logit (``charlm.record_max_logits``), the optimizer all-reduces them once (MAX over the
grid) and, when clipping, rescales the query and key rows of every head above the threshold after its
update. Ends with one JSON line: per run, the step-by-step largest logit over every head (read on rank 0
after each step, for the report) and the final training loss.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from muongrid import DistributedMuon, hybrid_param_groups
from muongrid.launch import add_launch_args, check_launch_args, launch
from muongrid.lab import charlm
from muongrid.qk_clip import QKClip


def train(grid, comm, args, threshold, data) -> dict:
    torch.manual_seed(args.seed)
    model = charlm.TinyGPT(data["vocab_size"], d=args.width, n_layer=args.layers, n_head=args.heads,
                           context=args.context).to(grid.device)
    clip = QKClip(threshold, charlm.qk_layers(model))
    charlm.record_max_logits(model, clip)
    opt = DistributedMuon(hybrid_param_groups(model, muon={"lr": args.lr}, adamw={"lr": args.adamw_lr}), grid,
                          comm=comm, layout="owner", qk_clip=clip)
    gen = torch.Generator().manual_seed(args.seed + 1000 * grid.dp_rank)
    peaks, losses = [], []
    for _ in range(args.steps):
        x, y = charlm.batch(data["train"], args.batch, args.context, gen)
        x, y = x.to(grid.device), y.to(grid.device)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        peaks.append(float(clip.last.max()))
        losses.append(float(loss.detach()))
    return dict(threshold=threshold, max_logit=peaks, loss=losses)


def worker(grid, comm, args) -> int:
    data = charlm.load_corpus()
    runs = {"watch only": train(grid, comm, args, None, data),
            f"clip at {args.threshold:g}": train(grid, comm, args, args.threshold, data)}
    if grid.rank == 0:
        for name, r in runs.items():
            print(f"{name:<16} largest logit: first {r['max_logit'][0]:.1f}, last {r['max_logit'][-1]:.1f}, "
                  f"highest {max(r['max_logit']):.1f}; last loss on rank 0's batch {r['loss'][-1]:.3f}")
        print(json.dumps(dict(dp=grid.dp, tp=grid.tp, steps=args.steps, threshold=args.threshold, runs=runs)))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--threshold", type=float, default=8.0, help="QK-clip's threshold on the largest logit")
    p.add_argument("--lr", type=float, default=0.04, help="Muon's lr (a high one makes the logits grow)")
    p.add_argument("--adamw-lr", type=float, default=3e-3)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    check_launch_args(p, args)
    if args.steps < 1 or not args.threshold > 0:
        p.error("--steps must be >= 1 and --threshold > 0")
    if args.tp != 1:
        p.error("--tp must be 1 here (the book's GPT is not tensor-parallel in this demo)")
    return launch(worker, args)


if __name__ == "__main__":
    sys.exit(main())
