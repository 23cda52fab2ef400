"""Run by tests/test_backward_reduce.py under the launcher: ``grad_reduce="backward"`` (``reducer.py``) gives the
parameters ``grad_reduce="step"`` gives, bit for bit, and launches the gradient reduce-scatters from backward.

On a DP x TP grid, for each layout asked for, two optimizers step copies of one problem (grad_landing_run.py's odd
TP-local matrices and a vector, and a bf16 vector whose gradient is copied into the fp32 buffer cast), one with
each ``grad_reduce``, both with ``check_finite="raise"`` and small buckets (several per group):

1. one backward: the bytes launched from the landing hook before ``backward()`` returned, of all the step's;
2. two backwards, the first under ``opt.no_sync()``, a matrix with no gradient anywhere and one with none on DP
   rank 0 (zeros there);
3. two backwards without ``no_sync()`` (two rounds launched, the last one used);
4. a NaN in one matrix's gradient on the last DP rank: both optimizers raise ``FloatingPointError`` on every rank,
   and no parameter changes;
5. one backward again (the round after a raise starts fresh), clipped by ``opt.clip_grad_norm_`` before the step.

After each step the two copies must be equal bit for bit. Each rank also reports its ledger's collectives under
"backward" (step, op, phase, elements), which every rank of a DP group must have issued in the same order. Prints
one JSON line (rank 0) with every rank's findings.

    python tests/backward_reduce_run.py --dp 2 --tp 2 [--layouts owner,bucket]
"""
import argparse
import json
import sys

import torch

from grad_landing_run import loss_of, make
from muongrid import DistributedMuon
from muongrid.comm import Comm
from muongrid.launch import add_launch_args, launch

SKIP_EVERYWHERE, SKIP_ON_RANK0, NAN_AT = 1, 3, 2
STEPS = ("one", "no_sync", "two_rounds", "nan", "after")


def problem(grid):
    params, groups = make(grid, dtensor=False)
    gen = torch.Generator().manual_seed(7)
    half = torch.nn.Parameter(torch.randn(40, generator=gen).to(torch.bfloat16))
    groups.append(dict(params=[half], use_muon=False, tp_split_dims=[-1], names=["half"], lr=1e-3))
    return params + [half], groups


def losses(params, grid, step, micro, skip=(), nan=False):
    loss = loss_of(params[:-1], grid, step, micro, skip) + (params[-1].float() * (grid.rank + 1)).square().sum()
    if nan:
        loss = loss + params[NAN_AT].sum() * float("nan")
    return loss


def run_step(opt, params, grid, step: int, name: str, found: dict) -> None:
    skip = {SKIP_EVERYWHERE} | ({SKIP_ON_RANK0} if grid.dp_rank == 0 else set()) if name == "no_sync" else set()
    nan = name == "nan" and grid.dp_rank == grid.dp - 1
    opt.zero_grad()
    micros = 2 if name in ("no_sync", "two_rounds") else 1
    for micro in range(micros):
        quiet = name == "no_sync" and micro < micros - 1
        with opt.no_sync() if quiet else torch.enable_grad():
            losses(params, grid, step, micro, skip, nan).backward()
    reducer = opt.store.reducer
    if reducer is not None:   # what backward launched before it returned, of all the step reduces
        found.setdefault("issued", {})[name] = dict(reducer.issued, total=sum(reducer.nbytes.values()),
                                                    rounds=reducer.rounds)
    before = [p.detach().clone() for p in params]
    try:
        if name == "after":   # clip_grad_norm_ takes the reduced shards first; step() then finds them taken
            opt.clip_grad_norm_(0.5)
        opt.step()
    except FloatingPointError as e:
        found.setdefault("raised", {})[name] = dict(kind=type(e).__name__,
                                                    unchanged=all(torch.equal(a, p) for a, p in zip(before, params)))


def case(grid, layout: str) -> dict:
    runs = {}
    for mode in ("step", "backward"):
        params, groups = problem(grid)
        comm = Comm(grid)
        opt = DistributedMuon(groups, grid, comm=comm, layout=layout, grad_reduce=mode, check_finite="raise",
                              bucket_numel=1024)
        runs[mode] = (params, opt, {})
    out = dict(equal=[])
    for step, name in enumerate(STEPS, start=1):
        for mode, (params, opt, found) in runs.items():
            run_step(opt, params, grid, step, name, found)
        out["equal"].append(all(torch.equal(a, b) for a, b in zip(runs["step"][0], runs["backward"][0])))
    for mode, (params, opt, found) in runs.items():
        out[mode] = found
        out[mode]["ledger"] = [(r.step, r.op, r.phase, r.numel) for r in opt.comm.ledger.records]
    out["buckets"] = len(runs["backward"][1].store.reducer.order) if runs["backward"][1].store.reducer else 0
    return out


def refusals(grid) -> dict:
    """Where "backward" cannot apply, the optimizer says so when it is built (or, a DDP model, at the first step)."""
    from torch.nn.parallel import DistributedDataParallel

    from muongrid import FSDPMuon

    said = {}
    params, groups = problem(grid)
    for label, kwargs in (("capturable", dict(capturable=True, check_finite="defer")),
                          ("unknown", dict(grad_reduce="later"))):
        try:
            DistributedMuon(groups, grid, **{"grad_reduce": "backward", **kwargs})
            said[label] = None
        except (ValueError, TypeError) as e:
            said[label] = str(e)
    try:
        FSDPMuon(params[:1], grid, grad_reduce="backward")
        said["fsdp"] = None
    except TypeError as e:
        said["fsdp"] = str(e)
    if grid.tp == 1:   # a DDP model (DP only): refused at the first step, as under "step"
        model = DistributedDataParallel(torch.nn.Linear(4, 3, bias=False))
        opt = DistributedMuon(model.parameters(), grid, grad_reduce="backward")
        model(torch.ones(2, 4)).sum().backward()
        try:
            opt.step()
            said["ddp"] = None
        except RuntimeError as e:
            said["ddp"] = str(e)
    return said


def worker(grid, comm, args):
    torch.set_num_threads(1)
    found = {layout: case(grid, layout) for layout in args.layouts.split(",")}
    found["refused"] = refusals(grid)
    found["tp_rank"] = grid.tp_rank
    everyone = comm.gather_objects(found, "report")
    if grid.rank == 0:
        print(json.dumps(dict(dp=grid.dp, tp=grid.tp, ranks=everyone)), flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_launch_args(p)
    p.add_argument("--layouts", default="owner,bucket")
    sys.exit(launch(worker, p.parse_args()))
