"""A training loop with DistributedMuon on a DP x TP grid, to copy into your project (chapter 12).

    python scripts/loop_zero1_tp.py --dp 2 --tp 2 --steps 20 --save _build/loop --every 10
    python scripts/loop_zero1_tp.py --dp 4 --tp 1 --steps 40 --resume _build/loop/step20   # another grid
    torchrun --standalone --nproc-per-node 4 scripts/loop_zero1_tp.py --dp 2 --tp 2 --steps 20
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
        scripts/loop_zero1_tp.py --dp 4 --tp 4 --steps 1000            # on each of two nodes

``worker`` is the loop; ``muongrid.launch`` runs it on dp*tp local gloo processes, or as one rank under
torchrun (NCCL on GPUs). The model is the book's tiny GPT, which returns logits; put yours in its place
(a Hugging Face model returns an object whose ``.loss`` is the loss: the comment at the loss says how).
``save_run`` / ``load_run`` (``muongrid.resume``) carry the model, the optimizer and the scheduler through
``muongrid.checkpoint`` and the data position beside them; ``checkpoint.save(opt, path, step=step,
scheduler=sched)`` alone is the same checkpoint without the data position.
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
from muongrid.launch import add_launch_args, launch
from muongrid.resume import load_run, save_run


def worker(grid, comm, args):
    data = load_corpus()
    torch.manual_seed(0)                                    # the same initial weights on every rank
    model = head_major_gpt(data["vocab_size"], d=64, n_layer=2, n_head=4, context=32).to(grid.device)
    model = parallelize_module(model, grid.mesh["tp"], tp_plan(2))   # TP: colwise qkv/fc, rowwise proj/out
    groups = hybrid_param_groups(model.named_parameters(), muon=dict(lr=0.02), adamw=dict(lr=3e-3))
    opt = DistributedMuon(groups, grid, layout="owner")     # ZeRO-1 over "dp", TP read from the DTensors
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))   # warm-up
    gen = torch.Generator().manual_seed(0)                  # the data order: the same on every rank
    run_args = dict(batch=args.batch, model="tiny-gpt-64x2")  # what a resume must not change
    start = 1 + (load_run(args.resume, opt, sched, gen, run_args) if args.resume else 0)   # scheduler too
    rows = slice(grid.dp_rank * args.batch // grid.dp, (grid.dp_rank + 1) * args.batch // grid.dp)
    losses = []
    for step in range(start, args.steps + 1):
        x, y = batch(data["train"], args.batch, 32, gen)    # the global batch; this DP rank takes its rows
        inputs, targets = x[rows].to(grid.device), y[rows].to(grid.device)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())   # a model that returns logits;
        # a Hugging Face model computes its loss: loss = model(input_ids=inputs, labels=inputs).loss
        loss.backward()
        norm = opt.clip_grad_norm_(1.0)                     # the DP-mean gradient's norm, TP counted once
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        mean = loss.detach().clone()                        # for the log: the global mean loss
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
        if args.save and (step % args.every == 0 or step == args.steps):
            save_run(f"{args.save}/step{step}", step, opt, sched, gen, run_args)   # every rank; any grid
        if grid.rank == 0 and step % 10 == 0:
            print(f"step {step}: loss {losses[-1]:.4f}, grad norm {norm.item():.3f}", flush=True)
    if grid.rank == 0:
        print(json.dumps(dict(first_step=start, losses=losses)), flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--save", default=None)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--resume", default=None)
    sys.exit(launch(worker, p.parse_args()))
