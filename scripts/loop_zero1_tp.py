"""The training loop to copy (chapter 12): DistributedMuon, ZeRO-1 x tensor parallel.

    python scripts/loop_zero1_tp.py --dp 2 --tp 2 --lr 0.01 --precision bf16 \\
        --accum 2 --steps 40 --save _build/loop --every 20
    python scripts/loop_zero1_tp.py --dp 4 --tp 1 --lr 0.01 --precision bf16 \\
        --accum 2 --steps 40 --resume _build/loop/step20     # on another grid
    torchrun --standalone --nproc-per-node 8 scripts/loop_zero1_tp.py \\
        --dp 2 --tp 4 --lr 3e-4 --compile inductor           # one node of 8 GPUs
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29500 scripts/loop_zero1_tp.py \\
        --dp 4 --tp 4 --lr 3e-4 --steps 1000                # on each of two nodes

``worker`` is the loop; ``muongrid.launch`` runs it on dp*tp local gloo processes,
or as one rank under torchrun (NCCL on GPUs). The model is the book's tiny GPT,
which returns logits; put yours in its place (a Hugging Face model returns
``.loss``: the comment in ``loss_on`` says how). Each flag switches one thing:

* ``--precision``: ``autocast`` (fp32 weights, bf16 matmuls under
  ``torch.autocast``), ``bf16`` (the weights in bf16; the optimizer keeps an fp32
  master of its shard) or ``fp32``;
* ``--accum K``: K micro-batches a step; backward adds up their gradients (each
  loss divided by K) and ``step()`` averages over DP, so nothing else changes;
* ``--compile BACKEND``: ``torch.compile`` the model: ``inductor`` on GPUs;
  ``aot_eager`` on a small CPU, where inductor's C++ build takes a minute;
* ``--eval-every N``: the mean loss on fixed held-out windows every N steps;
* ``--lr`` (required): ONE peak lr for both groups, your AdamW recipe's: the
  default ``adjust_lr_fn="match_rms_adamw"`` scales each Muon matrix's step to
  AdamW's update size (Moonshot, arXiv 2502.16982, section 2.2), so AdamW's lr
  and weight decay carry over. Then sweep it upwards (chapter 9's best was 3x
  AdamW's). Weight decay is the optimizer's default, 0.1 on every group;
* ``--warmup N``: a linear warm-up over N steps, then a cosine decay to 10% of
  the lr at ``--steps`` (the schedule is part of the run: a resume keeps it).

The data: ``muongrid.data.ResumableLoader``, a ``DataLoader`` whose sampler is
keyed by the DP rank (the TP ranks of a replica read the same rows; the replicas
read disjoint slices of one global batch); put your ``Dataset`` in place of
``TokenWindows``. ``save_run`` / ``load_run`` (``muongrid.resume``) carry the
model, the optimizer and the scheduler through ``muongrid.checkpoint``, and the
loader's position beside them: a run resumes on any grid, reading on where it
stopped. ``loop_fsdp.py`` is this loop for a model under
FSDP2; ``train.py`` is the book's measuring harness, not a template.
"""
import argparse
import json
import math
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor.parallel import parallelize_module

from muongrid import DistributedMuon, hybrid_param_groups
from muongrid.data import ResumableLoader, TokenWindows
from muongrid.lab.charlm import load_corpus
from muongrid.lab.tpgpt import head_major_gpt, tp_plan
from muongrid.launch import add_launch_args, check_launch_args, launch
from muongrid.resume import load_run, save_run

CONTEXT, EVAL_BATCHES = 32, 4


def tiny_gpt(data, device):
    """The book's GPT, the same initial weights on every rank."""
    torch.manual_seed(0)
    return head_major_gpt(data["vocab_size"], d=64, n_layer=2, n_head=4,
                          context=CONTEXT).to(device)


def loss_on(model, x, y, args):
    """The mean cross-entropy on (x, y); bf16 matmuls under --precision autocast."""
    amp = args.precision == "autocast"
    with torch.autocast(x.device.type, torch.bfloat16, enabled=amp):
        logits = model(x)
    # a Hugging Face model computes its own: loss = model(input_ids=x, labels=x).loss
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def training_data(data, grid, args) -> ResumableLoader:
    """This DP rank's rows of each step's global batch (the TP ranks of a replica
    read the same ones), as a DataLoader whose position the checkpoint keeps."""
    return ResumableLoader(TokenWindows(data["train"], CONTEXT), args.batch,
                           dp=grid.dp, dp_rank=grid.dp_rank, seed=0)


def schedule(opt, args):
    """Linear warm-up over --warmup steps, then cosine decay to 10% at --steps."""
    def factor(s):                                  # s: steps taken so far
        if s < args.warmup:
            return (s + 1) / args.warmup
        t = min(1.0, (s - args.warmup) / max(1, args.steps - args.warmup))
        return 0.1 + 0.45 * (1 + math.cos(math.pi * t))
    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def evaluate(model, data, grid, args) -> float:
    """The mean loss on the first held-out windows: each DP rank on its rows."""
    val, n = TokenWindows(data["val"], CONTEXT), args.batch // grid.dp
    model.eval()
    total = torch.zeros((), device=grid.device)
    with torch.no_grad():
        for k in range(EVAL_BATCHES):
            first = k * args.batch + grid.dp_rank * n
            windows = [val.window(i) for i in range(first, first + n)]
            x, y = map(torch.stack, zip(*windows))
            total += loss_on(model, x.to(grid.device), y.to(grid.device), args)
    model.train()
    dist.all_reduce(total)                          # the mean over every rank
    return total.item() / (dist.get_world_size() * EVAL_BATCHES)


def worker(grid, comm, args):
    data = load_corpus()
    model = tiny_gpt(data, grid.device)
    if args.precision == "bf16":
        model = model.to(torch.bfloat16)            # the optimizer keeps fp32 masters
    # TP: qkv and fc split by rows (colwise), proj and out by columns (rowwise)
    model = parallelize_module(model, grid.mesh["tp"], tp_plan(2))
    lr = dict(lr=args.lr)                           # one lr for both groups
    groups = hybrid_param_groups(model, muon=lr, adamw=lr)
    opt = DistributedMuon(groups, grid, layout="owner")   # reads TP from DTensors
    sched = schedule(opt, args)
    forward = torch.compile(model, backend=args.compile) if args.compile else model
    loader = training_data(data, grid, args)
    keep = dict(batch=args.batch, model="tiny-gpt-64x2", precision=args.precision,
                lr=args.lr, warmup=args.warmup, steps=args.steps)   # the schedule too
    start = 1 + (load_run(args.resume, opt, sched, loader, keep) if args.resume else 0)
    losses, evals = [], []
    for step in range(start, args.steps + 1):
        x, y = next(loader)                         # this DP rank's rows
        mean = torch.zeros((), device=grid.device)
        for xm, ym in zip(x.chunk(args.accum), y.chunk(args.accum)):
            loss = loss_on(forward, xm.to(grid.device), ym.to(grid.device), args)
            (loss / args.accum).backward()          # gradients add up in .grad
            mean += loss.detach() / args.accum
        norm = opt.clip_grad_norm_(1.0)             # the DP mean's norm, TP once
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(mean)                       # for the log: the global mean
        losses.append(mean.item() / dist.get_world_size())
        if args.eval_every and (step % args.eval_every == 0 or step == args.steps):
            evals.append([step, evaluate(forward, data, grid, args)])
        if args.save and (step % args.every == 0 or step == args.steps):
            # every rank saves its shard and the data position; any grid loads it
            save_run(f"{args.save}/step{step}", step, opt, sched, loader, keep)
        if grid.rank == 0 and step % 10 == 0:
            val = "".join(f", val {v:.4f}" for s, v in evals if s == step)
            print(f"step {step}: loss {losses[-1]:.4f}, grad norm {norm:.3f}{val}",
                  flush=True)
    if grid.rank == 0:
        result = dict(first_step=start, losses=losses, evals=evals)
        print(json.dumps(result), flush=True)


def parse(doc: str, argv=None):
    """The loops' flags (``loop_fsdp.py`` takes the same), checked."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    add_launch_args(p)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16, help="sequences a step, all ranks")
    p.add_argument("--accum", type=int, default=1, help="micro-batches a step")
    p.add_argument("--precision", default="autocast",
                   choices=("autocast", "bf16", "fp32"))
    p.add_argument("--compile", metavar="BACKEND", help="inductor, aot_eager, ...")
    p.add_argument("--lr", type=float, required=True,
                   help="peak lr of both groups: your AdamW recipe's (Moonshot's "
                        "matched update RMS, arXiv 2502.16982 sec. 2.2, lets AdamW's "
                        "lr carry over); 0.01 suits the book's tiny GPT (chapter 9)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up steps, then cosine")
    p.add_argument("--eval-every", type=int, default=10, help="0: no evaluation")
    p.add_argument("--save", default=None)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--resume", default=None)
    args = p.parse_args(argv)
    check_launch_args(p, args)
    rows = args.batch // args.dp
    if args.batch % args.dp or args.accum < 1 or rows % args.accum:
        p.error(f"--batch {args.batch} must split into --dp {args.dp} equal parts and "
                f"each of those into --accum {args.accum} micro-batches")
    return args


if __name__ == "__main__":
    sys.exit(launch(worker, parse(__doc__)))
