"""A training loop with FSDPMuon on an FSDP2 (``fully_shard``) model, to copy into your project (chapter 12).

    python scripts/loop_fsdp.py --dp 2 --tp 1 --steps 20 --save _build/loop_fsdp --every 10
    python scripts/loop_fsdp.py --dp 1 --tp 2 --steps 40 --resume _build/loop_fsdp/step20   # another grid
    torchrun --standalone --nproc-per-node 4 scripts/loop_fsdp.py --dp 4 --tp 1 --steps 20

With ``--tp 2`` the model is tensor-parallel on "tp" first, then ``fully_shard`` on "dp" (FSDP2 x TP).
FSDP2 gathers the weights for forward and backward and reduce-scatters the gradients itself;
FSDPMuon sends each matrix's row blocks to one owner for Newton-Schulz and back.
"""
import argparse
import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import parallelize_module

from muongrid import FSDPMuon, hybrid_param_groups
from muongrid.lab.charlm import batch, load_corpus
from muongrid.lab.tpgpt import head_major_gpt, tp_plan
from muongrid.launch import add_launch_args, launch
from muongrid.resume import load_run, save_run


def worker(grid, comm, args):
    data = load_corpus()
    torch.manual_seed(0)
    model = head_major_gpt(data["vocab_size"], d=64, n_layer=2, n_head=4, context=32).to(grid.device)
    if grid.tp > 1:
        model = parallelize_module(model, grid.mesh["tp"], tp_plan(2))
    fully_shard(model, mesh=grid.mesh["dp"])                # parameters become Shard(0) DTensors over "dp"
    groups = hybrid_param_groups(model.named_parameters(), muon=dict(lr=0.02), adamw=dict(lr=3e-3))
    opt = FSDPMuon(groups, grid)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    gen = torch.Generator().manual_seed(0)
    run_args = dict(batch=args.batch, model="tiny-gpt-64x2")
    start = 1 + (load_run(args.resume, opt, sched, gen, run_args) if args.resume else 0)   # scheduler too
    rows = slice(grid.dp_rank * args.batch // grid.dp, (grid.dp_rank + 1) * args.batch // grid.dp)
    losses = []
    for step in range(start, args.steps + 1):
        x, y = batch(data["train"], args.batch, 32, gen)
        inputs, targets = x[rows].to(grid.device), y[rows].to(grid.device)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())   # a model that returns logits;
        # a Hugging Face model computes its loss: loss = model(input_ids=inputs, labels=inputs).loss
        loss.backward()                                     # FSDP2 leaves .grad as the DP mean, in blocks
        norm = opt.clip_grad_norm_(1.0)
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
