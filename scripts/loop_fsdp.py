"""The training loop to copy (``loop_zero1_tp.py``) for a model under FSDP2 (``fully_shard``): FSDPMuon.

    python scripts/loop_fsdp.py --dp 2 --tp 2 --steps 20 --precision bf16 --accum 2 --save _build/loop_fsdp
    python scripts/loop_fsdp.py --dp 4 --tp 1 --steps 40 --resume _build/loop_fsdp/step20   # another grid
    torchrun --standalone --nproc-per-node 8 scripts/loop_fsdp.py --dp 8 --tp 1 --compile inductor

The same loop and flags as ``loop_zero1_tp.py`` (its helpers are imported from there); only what FSDP2 changes
is written here, each line marked ``# FSDP2``: the model is ``fully_shard``-ed over "dp" (after
``parallelize_module`` over "tp" when ``--tp`` > 1), so FSDP2 gathers the weights for forward and backward and
reduce-scatters the gradients itself; ``--precision bf16`` is FSDP2's ``MixedPrecisionPolicy`` (the sharded
weights stay fp32, FSDP2 gathers them in bf16 and reduces gradients in fp32); micro-batches before the last skip
the gradient reduce-scatter (``set_requires_gradient_sync``); ``FSDPMuon`` sends each matrix's row blocks to one
owner for Newton-Schulz and back.
"""
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import parallelize_module

from loop_zero1_tp import CONTEXT, evaluate, loss_on, parse
from muongrid import FSDPMuon, hybrid_param_groups
from muongrid.lab.charlm import batch, load_corpus
from muongrid.lab.tpgpt import head_major_gpt, tp_plan
from muongrid.launch import launch
from muongrid.resume import load_run, save_run


def worker(grid, comm, args):
    data = load_corpus()
    torch.manual_seed(0)
    model = head_major_gpt(data["vocab_size"], d=64, n_layer=2, n_head=4, context=CONTEXT).to(grid.device)
    if grid.tp > 1:
        model = parallelize_module(model, grid.mesh["tp"], tp_plan(2))
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)   # FSDP2
    fully_shard(model, mesh=grid.mesh["dp"], **({"mp_policy": bf16} if args.precision == "bf16" else {}))  # FSDP2
    groups = hybrid_param_groups(model, muon=dict(lr=args.lr), adamw=dict(lr=args.lr))
    opt = FSDPMuon(groups, grid)                                                           # FSDP2
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    forward = torch.compile(model, backend=args.compile) if args.compile else model
    gen = torch.Generator().manual_seed(0)
    run_args = dict(batch=args.batch, model="tiny-gpt-64x2", precision=args.precision)
    start = 1 + (load_run(args.resume, opt, sched, gen, run_args) if args.resume else 0)
    rows = slice(grid.dp_rank * args.batch // grid.dp, (grid.dp_rank + 1) * args.batch // grid.dp)
    losses, evals = [], []
    for step in range(start, args.steps + 1):
        x, y = batch(data["train"], args.batch, CONTEXT, gen)
        mean = torch.zeros((), device=grid.device)
        micro = list(zip(x[rows].chunk(args.accum), y[rows].chunk(args.accum)))
        for i, (xm, ym) in enumerate(micro):
            model.set_requires_gradient_sync(i == len(micro) - 1)   # FSDP2: reduce-scatter on the last only
            loss = loss_on(forward, xm.to(grid.device), ym.to(grid.device), args) / args.accum
            loss.backward()                                         # FSDP2 leaves .grad as the DP mean, in blocks
            mean += loss.detach()
        norm = opt.clip_grad_norm_(1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
        if args.eval_every and (step % args.eval_every == 0 or step == args.steps):
            evals.append([step, evaluate(forward, data, rows, grid, args)])
        if args.save and (step % args.every == 0 or step == args.steps):
            save_run(f"{args.save}/step{step}", step, opt, sched, gen, run_args)
        if grid.rank == 0 and step % 10 == 0:
            print(f"step {step}: loss {losses[-1]:.4f}, grad norm {norm.item():.3f}"
                  + (f", val {evals[-1][1]:.4f}" if evals and evals[-1][0] == step else ""), flush=True)
    if grid.rank == 0:
        print(json.dumps(dict(first_step=start, losses=losses, evals=evals)), flush=True)


if __name__ == "__main__":
    sys.exit(launch(worker, parse(__doc__)))
