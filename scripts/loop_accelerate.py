"""Muon under Hugging Face Accelerate (chapter 12): DistributedMuon's DDP mode.

    torchrun --standalone --nproc-per-node 2 scripts/loop_accelerate.py --dp 2 \\
        --lr 0.01 --steps 40 --save _build/loop_accelerate --every 20
    torchrun --standalone --nproc-per-node 2 scripts/loop_accelerate.py --dp 2 \\
        --lr 0.01 --steps 40 --resume _build/loop_accelerate/step20
    python scripts/loop_accelerate.py --dp 2 --lr 0.01 --steps 4   # local gloo ranks

(``accelerate launch`` starts it as torchrun does.) The lines Accelerate needs are
marked ``# Accelerate``. ``prepare`` wraps the model in DistributedDataParallel,
which averages the gradients in backward, so the optimizer is built with
``grad_reduce="ddp"``: ZeRO-1's sharded state, each matrix orthogonalised once on
the rank whose shard holds it, no second reduction. ``accumulate`` skips DDP's
all-reduce and the step on micro-batches before the last, ``backward`` divides the
loss by their number, and ``clip_grad_norm_`` clips the averaged gradient, the same
on every rank. ``save_state`` writes the model, the schedule (registered: stepped
once per optimizer step, as a prepared one is not), the RNG and, through
``muongrid.accelerate.ShardedState``, every rank's optimizer shard; ``load_state``
reads them back and ``skip_first_batches`` continues the data, so a resume on the
same number of ranks ends where the run would have. The model, the data and the
schedule are ``loop_zero1_tp.py``'s.
"""
import sys

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from loop_zero1_tp import CONTEXT, loss_on, parse, schedule, tiny_gpt
from muongrid import DistributedMuon, hybrid_param_groups
from muongrid.accelerate import ShardedState
from muongrid.data import TokenWindows
from muongrid.lab.charlm import load_corpus
from muongrid.launch import PrintsLog, launch


def train(grid, args):
    """The loop; returns the trained model and what it logged."""
    accelerator = Accelerator(gradient_accumulation_steps=args.accum,  # Accelerate
                              cpu=grid.device.type == "cpu")
    data = load_corpus()
    model = tiny_gpt(data, accelerator.device)
    lr = dict(lr=args.lr)                           # one lr for both groups
    groups = hybrid_param_groups(model, muon=lr, adamw=lr)
    opt = DistributedMuon(groups, grid, grad_reduce="ddp")   # DDP averages
    sched = schedule(opt, args)
    rows = args.batch // (grid.dp * args.accum)     # a micro-batch of one rank
    loader = DataLoader(TokenWindows(data["train"], CONTEXT), batch_size=rows)
    model, opt, loader = accelerator.prepare(model, opt, loader)   # Accelerate
    accelerator.register_for_checkpointing(sched)                  # Accelerate
    ShardedState(accelerator, opt)      # save_state/load_state: every rank's shard
    start = 1
    if args.resume:
        accelerator.load_state(args.resume)                        # Accelerate
        start = sched.last_epoch + 1                # optimizer steps taken + 1
        loader = accelerator.skip_first_batches(loader, (start - 1) * args.accum)
    batches, losses = iter(loader), []
    for step in range(start, args.steps + 1):
        mean = torch.zeros((), device=accelerator.device)
        for _ in range(args.accum):
            x, y = next(batches)
            with accelerator.accumulate(model):                    # Accelerate
                loss = loss_on(model, x, y, args)
                accelerator.backward(loss)                         # Accelerate
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()                          # on the last micro-batch
                opt.zero_grad(set_to_none=True)
            mean += loss.detach() / args.accum
        sched.step()
        losses.append(accelerator.reduce(mean, "mean").item())    # Accelerate
        if args.save and (step % args.every == 0 or step == args.steps):
            accelerator.save_state(f"{args.save}/step{step}")      # Accelerate
        if accelerator.is_main_process and step % 10 == 0:
            print(f"step {step}: loss {losses[-1]:.4f}", flush=True)
    return accelerator.unwrap_model(model), dict(first_step=start, losses=losses)


if __name__ == "__main__":
    sys.exit(launch(PrintsLog(train), parse(__doc__)))
