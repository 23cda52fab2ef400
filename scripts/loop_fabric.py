"""Muon under Lightning Fabric (chapter 12): DistributedMuon's DDP mode, your loop.

    torchrun --standalone --nproc-per-node 2 scripts/loop_fabric.py --dp 2 \\
        --lr 0.01 --steps 40 --save _build/loop_fabric --every 20
    torchrun --standalone --nproc-per-node 2 scripts/loop_fabric.py --dp 2 \\
        --lr 0.01 --steps 40 --resume _build/loop_fabric/step20.ckpt
    python scripts/loop_fabric.py --dp 2 --lr 0.01 --steps 4   # local gloo ranks

The lines Fabric needs are marked ``# Fabric``. ``setup`` wraps the model in
DistributedDataParallel, which averages the gradients in backward, so the optimizer
is built with ``grad_reduce="ddp"``. ``no_backward_sync`` skips DDP's all-reduce on
micro-batches before the last; ``clip_gradients`` clips the averaged gradient, the
same on every rank. The strategy, ``muongrid.lightning.FabricShardedDDPStrategy``,
is Fabric's DDP with one change: ``fabric.save`` also writes every rank's optimizer
shard beside the checkpoint and ``fabric.load`` reads each rank's own back, so a
resume on the same number of ranks ends where the run would have. The model, the
data and the schedule are ``loop_zero1_tp.py``'s.
"""
import itertools
import sys

import torch
from lightning.fabric import Fabric
from torch.utils.data import DataLoader

from loop_zero1_tp import CONTEXT, loss_on, parse, schedule, tiny_gpt
from muongrid import DistributedMuon, hybrid_param_groups
from muongrid.data import TokenWindows
from muongrid.lab.charlm import load_corpus
from muongrid.launch import PrintsLog, launch
from muongrid.lightning import FabricShardedDDPStrategy


def train(grid, args):
    """The loop; returns the trained model and what it logged."""
    fabric = Fabric(accelerator=grid.device.type, devices=grid.dp,   # Fabric
                    strategy=FabricShardedDDPStrategy())
    fabric.launch()                     # joins the ranks torchrun (or muongrid) started
    data = load_corpus()
    model = tiny_gpt(data, fabric.device)
    lr = dict(lr=args.lr)                           # one lr for both groups
    groups = hybrid_param_groups(model, muon=lr, adamw=lr)
    opt = DistributedMuon(groups, grid, grad_reduce="ddp")   # DDP averages
    model, opt = fabric.setup(model, opt)                          # Fabric
    sched = schedule(opt, args)
    rows = args.batch // (grid.dp * args.accum)     # a micro-batch of one rank
    loader = fabric.setup_dataloaders(                             # Fabric
        DataLoader(TokenWindows(data["train"], CONTEXT), batch_size=rows))
    state = dict(model=model, optimizer=opt, scheduler=sched, step=0)
    if args.resume:
        fabric.load(args.resume, state)                            # Fabric
    start = state["step"] + 1
    batches = itertools.islice(loader, (start - 1) * args.accum, None)
    losses = []
    for step in range(start, args.steps + 1):
        mean = torch.zeros((), device=fabric.device)
        for i in range(args.accum):
            x, y = next(batches)
            last = i == args.accum - 1
            with fabric.no_backward_sync(model, enabled=not last):  # Fabric
                loss = loss_on(model, x, y, args)
                fabric.backward(loss / args.accum)                 # Fabric
            mean += loss.detach() / args.accum
        fabric.clip_gradients(model, opt, max_norm=1.0)            # Fabric
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(fabric.all_reduce(mean, reduce_op="mean").item())
        state["step"] = step
        if args.save and (step % args.every == 0 or step == args.steps):
            fabric.save(f"{args.save}/step{step}.ckpt", state)     # Fabric
        if fabric.global_rank == 0 and step % 10 == 0:
            print(f"step {step}: loss {losses[-1]:.4f}", flush=True)
    return model.module, dict(first_step=start, losses=losses)


if __name__ == "__main__":
    sys.exit(launch(PrintsLog(train), parse(__doc__)))
