"""The loop to copy (``loop_zero1_tp.py``) for a model under FSDP2: FSDPMuon.

    python scripts/loop_fsdp.py --dp 2 --tp 2 --lr 0.01 --precision bf16 \\
        --accum 2 --steps 40 --save _build/loop_fsdp --every 20
    python scripts/loop_fsdp.py --dp 4 --tp 1 --lr 0.01 --precision bf16 \\
        --accum 2 --steps 40 --resume _build/loop_fsdp/step20  # on another grid
    torchrun --standalone --nproc-per-node 8 scripts/loop_fsdp.py \\
        --dp 8 --tp 1 --lr 3e-4 --compile inductor

The same loop and flags as ``loop_zero1_tp.py``, whose helpers it imports (the
data loader keyed by the DP rank, the warm-up and cosine schedule); the
lines FSDP2 changes are marked ``# FSDP2``. The model is ``fully_shard``-ed over
"dp" (after ``parallelize_module`` over "tp" when ``--tp`` > 1), so FSDP2 gathers
the weights for forward and backward and reduce-scatters the gradients itself.
``--precision bf16`` is FSDP2's ``MixedPrecisionPolicy``: the sharded weights stay
fp32, FSDP2 gathers them in bf16 and reduces gradients in fp32. Micro-batches
before the last skip the reduce-scatter (``set_requires_gradient_sync``).
``FSDPMuon`` sends each matrix's row blocks to one owner for Newton-Schulz.
"""
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import parallelize_module

from loop_zero1_tp import evaluate, loss_on, parse, schedule, tiny_gpt, training_data
from muongrid import FSDPMuon, hybrid_param_groups
from muongrid.lab.charlm import load_corpus
from muongrid.lab.tpgpt import tp_plan
from muongrid.launch import launch
from muongrid.resume import load_run, save_run


def worker(grid, comm, args):
    data = load_corpus()
    model = tiny_gpt(data, grid.device)
    if grid.tp > 1:
        model = parallelize_module(model, grid.mesh["tp"], tp_plan(2))
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    policy = {"mp_policy": bf16} if args.precision == "bf16" else {}      # FSDP2
    fully_shard(model, mesh=grid.mesh["dp"], **policy)                    # FSDP2
    lr = dict(lr=args.lr)
    groups = hybrid_param_groups(model, muon=lr, adamw=lr)
    opt = FSDPMuon(groups, grid)                                          # FSDP2
    sched = schedule(opt, args)
    forward = torch.compile(model, backend=args.compile) if args.compile else model
    loader = training_data(data, grid, args)
    keep = dict(batch=args.batch, model="tiny-gpt-64x2", precision=args.precision,
                lr=args.lr, warmup=args.warmup, steps=args.steps)
    start = 1 + (load_run(args.resume, opt, sched, loader, keep) if args.resume else 0)
    losses, evals = [], []
    for step in range(start, args.steps + 1):
        x, y = next(loader)
        mean = torch.zeros((), device=grid.device)
        micro = list(zip(x.chunk(args.accum), y.chunk(args.accum)))
        for i, (xm, ym) in enumerate(micro):
            model.set_requires_gradient_sync(i == len(micro) - 1)         # FSDP2
            loss = loss_on(forward, xm.to(grid.device), ym.to(grid.device), args)
            (loss / args.accum).backward()          # .grad: the DP mean, in blocks
            mean += loss.detach() / args.accum
        norm = opt.clip_grad_norm_(1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
        if args.eval_every and (step % args.eval_every == 0 or step == args.steps):
            evals.append([step, evaluate(forward, data, grid, args)])
        if args.save and (step % args.every == 0 or step == args.steps):
            save_run(f"{args.save}/step{step}", step, opt, sched, loader, keep)
        if grid.rank == 0 and step % 10 == 0:
            val = "".join(f", val {v:.4f}" for s, v in evals if s == step)
            print(f"step {step}: loss {losses[-1]:.4f}, grad norm {norm:.3f}{val}",
                  flush=True)
    if grid.rank == 0:
        result = dict(first_step=start, losses=losses, evals=evals)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(launch(worker, parse(__doc__)))
