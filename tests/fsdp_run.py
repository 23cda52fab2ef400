"""Run by tests/test_fsdp.py under the launcher: FSDPMuon on a fully_shard model (TP underneath when tp > 1)
against single-device muongrid.MuonW and against torch.optim.Muon on the same FSDP2 model, and a DCP
checkpoint (with the scheduler's state) saved on one grid and loaded on another through
``muongrid.checkpoint``. Prints one JSON line (rank 0) with what it measured.

Every step's gradients are drawn from a generator seeded by (step, parameter index), whole, on every
rank; each rank gives FSDPMuon its block (placed as FSDP2 places gradients) and the reference the whole
tensor, so the optimizers see the same numbers and the comparison is of the optimizers alone. Every
optimizer runs under the same warm-up scheduler (lr x 0.25, 0.5, 0.75, 1 over steps 1-4): a resumed run
that lost the scheduler's state would take step 3 at 0.25 where 0.75 was due, and differ.

    python tests/fsdp_run.py --dp 3 --tp 1 --steps 3 [--save DIR] [--load DIR --resume-at 2]
"""
import argparse
import json
import sys

import torch

from muongrid import MuonW, checkpoint
from torch.distributed.tensor import DTensor

from muongrid.fsdp import FSDPMuon, fsdp_piece
from muongrid.launch import add_launch_args, launch
from muongrid.lab.tpgpt import head_major_gpt, tp_gpt

VOCAB, D, HEADS, LAYERS, CONTEXT = 41, 40, 2, 1, 8   # 41 rows and 40*k rows split unevenly over 3 (and 41 over 2, 4)
HYPER = dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True)


def groups(model):
    """Every matrix to Muon (embeddings and head too: they are replicated over TP), vectors to AdamW."""
    named = list(model.named_parameters())
    return [dict(params=[p for _, p in named if p.ndim == 2], names=[n for n, p in named if p.ndim == 2], use_muon=True),
            dict(params=[p for _, p in named if p.ndim != 2], names=[n for n, p in named if p.ndim != 2],
                 use_muon=False, lr=0.01)]


def warmup(opt):
    """The scheduler every optimizer runs under: a different lr at each of the first four steps."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))


def fsdp_model(grid):
    from torch.distributed.fsdp import fully_shard
    model = tp_gpt(VOCAB, grid, d=D, n_layer=LAYERS, n_head=HEADS, context=CONTEXT, seed=0)
    fully_shard(model, mesh=grid.mesh["dp"])
    return model


def grads(step, named):
    return {n: torch.randn(p.shape, generator=torch.Generator().manual_seed(1000 * step + i))
            for i, (n, p) in enumerate(named)}


def reference_step(step, named, opt, sched) -> dict:
    """Step ``step``'s seeded whole gradients given to the single-device reference, which steps; returns them."""
    whole = grads(step, named)
    for n, p in named:
        p.grad = whole[n]
    opt.step()
    sched.step()
    return whole


def give(model, grid, whole):
    """Each parameter's gradient as FSDP2 leaves it: this rank's block of the whole, placed like the parameter."""
    for n, p in model.named_parameters():
        block = whole[n][fsdp_piece(n, p, grid).slices()].contiguous()
        p.grad = DTensor.from_local(block, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())


def worker(grid, comm, args):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ref = head_major_gpt(VOCAB, d=D, n_layer=LAYERS, n_head=HEADS, context=CONTEXT)
    ref_opt = MuonW(groups(ref), **HYPER)
    model = fsdp_model(grid)
    opt = FSDPMuon(groups(model), grid, comm=comm, **HYPER)
    ref_sched, sched = warmup(ref_opt), warmup(opt)
    first = 1
    if args.load:
        first = checkpoint.load(opt, args.load, scheduler=sched) + 1
    out = dict(dp=grid.dp, tp=grid.tp, first_step=first)
    named = list(ref.named_parameters())
    torch_model = None
    if args.torch and not args.load:
        torch_model = fsdp_model(grid)
        g = groups(torch_model)
        torch_opts = [torch.optim.Muon(g[0]["params"], adjust_lr_fn="match_rms_adamw", **HYPER),
                      torch.optim.AdamW(g[1]["params"], lr=0.01, weight_decay=0.1)]
        torch_scheds = [warmup(o) for o in torch_opts]
    for step in range(1, args.steps + 1):
        whole = reference_step(step, named, ref_opt, ref_sched)
        if step < first:
            continue
        give(model, grid, whole)
        opt.step()
        sched.step()
        if step == args.save_at and args.save:
            checkpoint.save(opt, args.save, step=step, scheduler=sched)
        if torch_model is not None:
            give(torch_model, grid, whole)
            for o, s in zip(torch_opts, torch_scheds):
                o.step()
                s.step()
    ref_params = dict(named)
    diff, diff_torch = {}, {}
    for n, p in model.named_parameters():
        want = ref_params[n].detach()[fsdp_piece(n, p, grid).slices()]
        diff[n] = (p.to_local() - want).abs().max().item() if want.numel() else 0.0
    if torch_model is not None:  # relative to how far the parameter moved: ||ours - torch|| / ||ours - initial||
        torch.manual_seed(0)
        init = dict(head_major_gpt(VOCAB, d=D, n_layer=LAYERS, n_head=HEADS, context=CONTEXT).named_parameters())
        for (n, p), (_, q) in zip(model.named_parameters(), torch_model.named_parameters()):
            ours, theirs = p.full_tensor(), q.full_tensor()   # collectives, in the same order on every rank
            diff_torch[n] = ((ours - theirs).norm() / (ours - init[n].detach()).norm()).item()
    everyone = comm.gather_objects(dict(diff=diff, diff_torch=diff_torch,
                                        owned=opt.routes.owned(grid.rank),
                                        ns_calls=opt.comm.ledger.summary()["ns_calls"],
                                        ledger=opt.comm.ledger.summary()), "report")
    if grid.rank == 0:
        out.update(max_diff={n: max(e["diff"][n] for e in everyone) for n in diff},
                   lrs=[g["lr"] for g in opt.param_groups], ref_lrs=[g["lr"] for g in ref_opt.param_groups],
                   rel_diff_torch=diff_torch,
                   owners=opt.routes.owners, n_matrices=len(opt.routes.owners),
                   ns_calls=[e["ns_calls"] for e in everyone], ledger=[e["ledger"] for e in everyone],
                   pieces=[[list(p.shape) for p in row] for row in opt.routes.pieces],
                   names=[n for g in opt.param_groups if g["use_muon"] for n in g["names"]])
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_launch_args(p)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--torch", action="store_true", help="also step torch.optim.Muon on the same FSDP2 model")
    p.add_argument("--save", default=None)
    p.add_argument("--save-at", type=int, default=2)
    p.add_argument("--load", default=None)
    sys.exit(launch(worker, p.parse_args()))
