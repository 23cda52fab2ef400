"""Run by tests/test_fsdp.py under the launcher: FSDPMuon on FSDP2 models that someone else sharded, each against
single-device ``muongrid.MuonW``: fsdp_run.py's tiny GPT (its matrices in Muon, vectors in AdamW), 3 steps with
its seeded whole gradients (each rank given its block, placed as FSDP2 places gradients) under its warm-up
scheduler. Prints one JSON line (rank 0).

* ``unnamed``: ``fully_shard(model)`` with no mesh, so on torch's default one (1-D, every rank, no dimension
  names: what Accelerate and HF Trainer shard on), then ``FSDPMuon(groups, Grid.from_mesh(mesh))``.
* ``accelerate``: Accelerate's documented order. ``FSDPMuon`` is built on the plain model (with the launcher's
  ``Grid.build(dp, 1)`` grid), then ``accelerator.prepare(model, opt)`` shards the model with FSDP2 (on the same
  default mesh) and swaps the optimizer's parameters for the sharded ones; FSDPMuon plans at its first step.
  On a CPU accelerate takes its DDP path whatever its FSDP2 plugin says (facts.md): that is tried first, and
  FSDPMuon's refusal at its first step recorded; then the state accelerate made is set to FSDP2 by hand
  before ``prepare``: what runs is accelerate's own ``_prepare_fsdp2``, on gloo.

    python tests/fsdp_mesh_run.py --dp 3 --steps 3
"""
import argparse
import json
import sys

import torch
from accelerate import Accelerator   # imported once, before the launcher forks the ranks
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from fsdp_run import CONTEXT, D, HEADS, HYPER, LAYERS, VOCAB, give, groups, reference_step, warmup
from muongrid import Grid, MuonW
from muongrid.fsdp import FSDPMuon
from muongrid.lab.tpgpt import head_major_gpt
from muongrid.launch import add_launch_args, launch


def gpt():
    torch.manual_seed(0)
    return head_major_gpt(VOCAB, d=D, n_layer=LAYERS, n_head=HEADS, context=CONTEXT)


def sharded_first():
    """fully_shard on torch's default mesh, then the optimizer on the grid of that mesh."""
    from torch.distributed.fsdp import fully_shard
    model = fully_shard(gpt())
    mesh = next(model.parameters()).device_mesh
    opt = FSDPMuon(groups(model), Grid.from_mesh(mesh), **HYPER)
    return model, opt, opt, dict(mesh_names=mesh.mesh_dim_names, mesh_ranks=mesh.mesh.tolist())


def accelerate_order(grid):
    """The optimizer first, on plain parameters; then accelerate's FSDP2 prepare shards and swaps them."""
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    seen = dict(accelerate_type_on_cpu=str(accelerator.distributed_type))   # it joins the launcher's group
    model = gpt()
    model, opt = accelerator.prepare(model, FSDPMuon(groups(model), grid, **HYPER))
    seen["cpu_wraps_in"] = type(model).__name__
    try:
        opt.step()   # refused before any collective, on every rank alike
    except RuntimeError as e:
        seen["cpu_refusal"] = str(e)
    accelerator.state.distributed_type = DistributedType.FSDP   # what it picks on GPUs
    accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    model = gpt()
    opt = FSDPMuon(groups(model), grid, **HYPER)
    planned_at_build = opt.routes is not None
    model, wrapped = accelerator.prepare(model, opt)
    mesh = next(model.parameters()).device_mesh
    return model, wrapped, opt, dict(seen, planned_at_build=planned_at_build, planned_before_step=opt.routes is not None,
                                     wrapper=type(wrapped).__name__, mesh_names=mesh.mesh_dim_names,
                                     mesh_ranks=mesh.mesh.tolist())


def worker(grid, comm, args):
    torch.set_num_threads(1)
    ref = gpt()
    ref_opt = MuonW(groups(ref), **HYPER)
    ref_sched = warmup(ref_opt)
    cases = dict(unnamed=sharded_first(), accelerate=accelerate_order(grid))
    scheds = {name: warmup(case[2]) for name, case in cases.items()}
    named = list(ref.named_parameters())
    for step in range(1, args.steps + 1):
        whole = reference_step(step, named, ref_opt, ref_sched)
        for name, (model, stepper, opt, _) in cases.items():
            give(model, opt.grid, whole)
            stepper.step()
            scheds[name].step()
    ref_params, out = dict(named), dict(dp=grid.dp)
    for name, (model, _, opt, seen) in cases.items():
        diff = max((p.full_tensor() - ref_params[n].detach()).abs().max().item()   # the same order on every rank
                   for n, p in model.named_parameters())
        state = opt.state_dict()["state"]
        out[name] = dict(seen, max_diff=diff, lrs=[g["lr"] for g in opt.param_groups],
                         owners=opt.routes.owners, ns_calls=opt.comm.ledger.summary()["ns_calls"],
                         state_entries=len(state), params=len(opt._all_params()))
    out["ref_lrs"] = [g["lr"] for g in ref_opt.param_groups]
    everyone = comm.gather_objects(out, "report")
    if grid.rank == 0:
        print(json.dumps(dict(out, ns_calls={name: [e[name]["ns_calls"] for e in everyone] for name in cases},
                              max_diff={name: max(e[name]["max_diff"] for e in everyone) for name in cases})),
              flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_launch_args(p)
    p.add_argument("--steps", type=int, default=3)
    sys.exit(launch(worker, p.parse_args()))
