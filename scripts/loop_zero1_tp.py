"""The training loop to copy (chapter 12): DistributedMuon, ZeRO-1 over "dp" x tensor parallel over "tp".

    python scripts/loop_zero1_tp.py --dp 2 --tp 2 --steps 20 --precision bf16 --accum 2 --save _build/loop
    python scripts/loop_zero1_tp.py --dp 4 --tp 1 --steps 40 --resume _build/loop/step20   # another grid
    python scripts/loop_zero1_tp.py --dp 2 --tp 1 --compile aot_eager                     # a compiled model
    torchrun --standalone --nproc-per-node 8 scripts/loop_zero1_tp.py --dp 2 --tp 4 --compile inductor
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        scripts/loop_zero1_tp.py --dp 4 --tp 4 --steps 1000            # on each of two nodes

``worker`` is the loop; ``muongrid.launch`` runs it on dp*tp local gloo processes, or as one rank under
torchrun (NCCL on GPUs). The model is the book's tiny GPT, which returns logits; put yours in its place (a
Hugging Face model returns ``.loss``: the comment at the loss says how). What it does, each a flag:

* ``--precision``: ``autocast`` (fp32 weights, matmuls in bf16 under ``torch.autocast``), ``bf16`` (the
  weights themselves in bf16; the optimizer keeps an fp32 master of each shard) or ``fp32``;
* ``--accum K``: K micro-batches per step, their gradients summed by backward (each loss divided by K);
  ZeRO-1 averages over DP inside ``step()``, so nothing else changes;
* ``--compile BACKEND``: ``torch.compile`` the model (``inductor`` on GPUs; on a small CPU ``aot_eager``, since
  inductor's C++ compile takes about a minute per process there);
* ``--eval-every N``: the mean loss on fixed held-out windows, each DP rank on its rows, every N steps;
* one lr for both groups (``--lr``): start from AdamW's tuned lr; ``adjust_lr_fn="match_rms_adamw"`` (the
  default) scales each Muon matrix to AdamW's update size, then sweep the lr upwards (chapter 9's best hybrid
  lr was 3x AdamW's). Weight decay 0.1 on every group (the optimizer's default), norms and biases included.

``save_run`` / ``load_run`` (``muongrid.resume``) carry the model, the optimizer and the scheduler through
``muongrid.checkpoint``, and the data position beside them: a run resumes on any grid.
"""
import argparse
import contextlib
import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor.parallel import parallelize_module

from muongrid import DistributedMuon, hybrid_param_groups
from muongrid.lab.charlm import batch, load_corpus
from muongrid.lab.tpgpt import head_major_gpt, tp_plan
from muongrid.launch import add_launch_args, check_launch_args, launch
from muongrid.resume import load_run, save_run

CONTEXT, EVAL_BATCHES = 32, 4


def loss_on(model, x, y, args):
    """The mean cross-entropy of ``model`` on (x, y), its matmuls in bf16 under ``--precision autocast``."""
    amp = torch.autocast(x.device.type, torch.bfloat16) if args.precision == "autocast" else contextlib.nullcontext()
    with amp:
        logits = model(x)
    # a Hugging Face model computes its own: loss = model(input_ids=x, labels=x).loss
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def evaluate(model, data, rows, grid, args) -> float:
    """The global mean loss on fixed held-out windows: each DP rank takes its rows, the ranks average."""
    gen = torch.Generator().manual_seed(1234)                 # the same windows at every evaluation
    model.eval()
    with torch.no_grad():
        total = sum(loss_on(model, x[rows].to(grid.device), y[rows].to(grid.device), args)
                    for x, y in (batch(data["val"], args.batch, CONTEXT, gen) for _ in range(EVAL_BATCHES)))
    model.train()
    dist.all_reduce(total)                                    # every rank: mean over ranks and windows
    return total.item() / (dist.get_world_size() * EVAL_BATCHES)


def worker(grid, comm, args):
    data = load_corpus()
    torch.manual_seed(0)                                      # the same initial weights on every rank
    model = head_major_gpt(data["vocab_size"], d=64, n_layer=2, n_head=4, context=CONTEXT).to(grid.device)
    if args.precision == "bf16":
        model = model.to(torch.bfloat16)                      # the optimizer keeps fp32 master shards
    model = parallelize_module(model, grid.mesh["tp"], tp_plan(2))   # TP: colwise qkv/fc, rowwise proj/out
    groups = hybrid_param_groups(model, muon=dict(lr=args.lr), adamw=dict(lr=args.lr))   # one lr, module docs
    opt = DistributedMuon(groups, grid, layout="owner")       # ZeRO-1 over "dp", TP read from the DTensors
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))   # warm-up
    forward = torch.compile(model, backend=args.compile) if args.compile else model
    gen = torch.Generator().manual_seed(0)                    # the data order: the same on every rank
    run_args = dict(batch=args.batch, model="tiny-gpt-64x2", precision=args.precision)   # a resume keeps these
    start = 1 + (load_run(args.resume, opt, sched, gen, run_args) if args.resume else 0)   # scheduler too
    rows = slice(grid.dp_rank * args.batch // grid.dp, (grid.dp_rank + 1) * args.batch // grid.dp)
    losses, evals = [], []
    for step in range(start, args.steps + 1):
        x, y = batch(data["train"], args.batch, CONTEXT, gen)  # the global batch; this DP rank takes its rows
        mean = torch.zeros((), device=grid.device)
        for xm, ym in zip(x[rows].chunk(args.accum), y[rows].chunk(args.accum)):   # micro-batches
            loss = loss_on(forward, xm.to(grid.device), ym.to(grid.device), args) / args.accum
            loss.backward()                                   # gradients add up in .grad
            mean += loss.detach()
        norm = opt.clip_grad_norm_(1.0)                       # the DP-mean gradient's norm, TP counted once
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(mean)                                 # for the log: the global mean loss
        losses.append(mean.item() / dist.get_world_size())
        if args.eval_every and (step % args.eval_every == 0 or step == args.steps):
            evals.append([step, evaluate(forward, data, rows, grid, args)])
        if args.save and (step % args.every == 0 or step == args.steps):
            save_run(f"{args.save}/step{step}", step, opt, sched, gen, run_args)   # every rank; any grid
        if grid.rank == 0 and step % 10 == 0:
            print(f"step {step}: loss {losses[-1]:.4f}, grad norm {norm.item():.3f}"
                  + (f", val {evals[-1][1]:.4f}" if evals and evals[-1][0] == step else ""), flush=True)
    if grid.rank == 0:
        print(json.dumps(dict(first_step=start, losses=losses, evals=evals)), flush=True)


def arguments(doc: str) -> argparse.ArgumentParser:
    """The loops' flags (``loop_fsdp.py`` takes the same)."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    add_launch_args(p)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16, help="sequences a step, all DP ranks together")
    p.add_argument("--accum", type=int, default=1, help="micro-batches a step (each rank's rows split)")
    p.add_argument("--precision", choices=("autocast", "bf16", "fp32"), default="autocast")
    p.add_argument("--compile", default=None, metavar="BACKEND", help="torch.compile the model (inductor, aot_eager)")
    p.add_argument("--lr", type=float, default=0.01, help="both groups' lr (start from AdamW's tuned lr)")
    p.add_argument("--eval-every", type=int, default=10, help="0: no evaluation")
    p.add_argument("--save", default=None)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--resume", default=None)
    return p


def parse(doc: str, argv=None):
    """The flags, checked: the grid, and micro-batches that split each DP rank's rows evenly."""
    p = arguments(doc)
    args = p.parse_args(argv)
    check_launch_args(p, args)
    if args.batch % args.dp or args.accum < 1 or (args.batch // args.dp) % args.accum:
        p.error(f"--batch {args.batch} must split into --dp {args.dp} equal parts, and each into --accum "
                f"{args.accum} micro-batches")
    return args


if __name__ == "__main__":
    sys.exit(launch(worker, parse(__doc__)))
