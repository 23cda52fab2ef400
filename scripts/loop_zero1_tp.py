"""The training loop to copy (chapter 12): DistributedMuon, ZeRO-1 x tensor parallel.

    python scripts/loop_zero1_tp.py --dp 2 --tp 2 --precision bf16 --accum 2 \\
        --steps 20 --save _build/loop --every 10
    python scripts/loop_zero1_tp.py --dp 4 --tp 1 --precision bf16 --accum 2 \\
        --steps 40 --resume _build/loop/step20              # on another grid
    torchrun --standalone --nproc-per-node 8 scripts/loop_zero1_tp.py \\
        --dp 2 --tp 4 --compile inductor                     # one node of 8 GPUs
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29500 scripts/loop_zero1_tp.py \\
        --dp 4 --tp 4 --steps 1000                          # on each of two nodes

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
* ``--lr``: ONE lr for both groups. Start from AdamW's tuned lr: the default
  ``adjust_lr_fn="match_rms_adamw"`` scales each Muon matrix's step to AdamW's
  update size. Then sweep it upwards (chapter 9's best was 3x AdamW's). Weight
  decay is the optimizer's default, 0.1 on every group, norms and biases too.

``save_run`` / ``load_run`` (``muongrid.resume``) carry the model, the optimizer
and the scheduler through ``muongrid.checkpoint``, and the data position beside
them: a run resumes on any grid. ``loop_fsdp.py`` is this loop for a model under
FSDP2; ``train.py`` is the book's measuring harness, not a template.
"""
import argparse
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


def evaluate(model, data, rows, grid, args) -> float:
    """The mean loss on fixed held-out windows: each DP rank on its rows of each."""
    gen = torch.Generator().manual_seed(1234)       # the same windows every time
    windows = [batch(data["val"], args.batch, CONTEXT, gen)
               for _ in range(EVAL_BATCHES)]
    model.eval()
    with torch.no_grad():
        total = sum(loss_on(model, x[rows].to(grid.device), y[rows].to(grid.device),
                            args) for x, y in windows)
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
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    forward = torch.compile(model, backend=args.compile) if args.compile else model
    gen = torch.Generator().manual_seed(0)          # the data order, on every rank
    keep = dict(batch=args.batch, model="tiny-gpt-64x2", precision=args.precision)
    start = 1 + (load_run(args.resume, opt, warmup, gen, keep) if args.resume else 0)
    n = args.batch // grid.dp                       # this DP rank's rows of a batch
    rows = slice(grid.dp_rank * n, (grid.dp_rank + 1) * n)
    losses, evals = [], []
    for step in range(start, args.steps + 1):
        x, y = batch(data["train"], args.batch, CONTEXT, gen)   # the global batch
        mean = torch.zeros((), device=grid.device)
        for xm, ym in zip(x[rows].chunk(args.accum), y[rows].chunk(args.accum)):
            loss = loss_on(forward, xm.to(grid.device), ym.to(grid.device), args)
            (loss / args.accum).backward()          # gradients add up in .grad
            mean += loss.detach() / args.accum
        norm = opt.clip_grad_norm_(1.0)             # the DP mean's norm, TP once
        opt.step()
        warmup.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(mean)                       # for the log: the global mean
        losses.append(mean.item() / dist.get_world_size())
        if args.eval_every and (step % args.eval_every == 0 or step == args.steps):
            evals.append([step, evaluate(forward, data, rows, grid, args)])
        if args.save and (step % args.every == 0 or step == args.steps):
            # every rank saves its shard; any grid can load it
            save_run(f"{args.save}/step{step}", step, opt, warmup, gen, keep)
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
    p.add_argument("--lr", type=float, default=0.01, help="both groups (AdamW's lr)")
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
