"""Run by tests/test_grad_landing.py under the launcher: gradients made by a real backward land in the optimizer's
gradient buffers (``store.py``'s post-accumulate-grad hook), and the step is the same whatever the loop does.

On a DP x TP grid, for every layout, three copies of one problem (tests/conftest.py's odd shapes, TP-local, and a
vector in an AdamW group) step three times with two backwards per step (gradient accumulation):

* ``none``: the loop zeroes with ``zero_grad()`` (``set_to_none=True``, torch's default);
* ``zero``: the loop zeroes with ``zero_grad(set_to_none=False)``;
* ``hand``: no backward; ``p.grad`` is set to the sum of the two backwards' gradients, made apart.

They must give the same parameters, bit for bit, after every step. In step 2 the ``none`` run gives one matrix
no gradient anywhere (it stays None and is skipped, as the ``hand`` run's None) and another none on DP rank 0
only (zeros there). A loop that zeroes in place gives every parameter a gradient (zeros count, as in torch), so
the ``zero`` run skips nothing and has a ``hand`` twin of its own (``hand0``). After each backward, every
hooked gradient must be a view of the optimizer's gradient buffer. The same again with the matrices as DTensors
on the "tp" mesh (backward through ``to_local()``), packed and unpacked (the default) and bound to the buffers by
their local shards (``param_buffers="all"``), whose parameters must equal the plain tensors' bit for bit. And
an optimizer's hooks go with it (``hooks_removed``). Prints one JSON line (rank 0) with every rank's findings.

    python tests/grad_landing_run.py --dp 2 --tp 2 [--layouts bucket,owner,aligned,group]
"""
import argparse
import json
import sys

import torch

from muongrid import DistributedMuon
from muongrid.store import held
from muongrid.launch import add_launch_args, launch
from muongrid.sharding import tp_shard

SHAPES = [(36, 57), (45, 28), (33, 17), (20, 44), (8, 12)]   # tests/conftest.py's ODD_SHAPES and ODD_TP_DIMS
TP_DIMS = [0, 1, -1, 1, 0]
SKIP_EVERYWHERE, SKIP_ON_RANK0 = 1, 3   # in the "none" run's step 2


def make(grid, dtensor: bool):
    from torch.distributed.tensor import DTensor, Replicate, Shard

    gen = torch.Generator().manual_seed(0)
    mats = []
    for s, d in zip(SHAPES, TP_DIMS):
        mine = tp_shard(torch.randn(s, generator=gen) * 0.1, d, grid.tp, grid.tp_rank).clone()   # owns its storage
        if dtensor:
            mine = DTensor.from_local(mine, grid.mesh["tp"], [Replicate() if d == -1 else Shard(d)], shape=s,
                                      stride=(s[1], 1))
        mats.append(torch.nn.Parameter(mine))
    vec = torch.nn.Parameter(torch.randn(57, generator=gen))
    groups = [dict(params=mats, tp_split_dims=TP_DIMS, names=[f"w{i}" for i in range(len(mats))], lr=0.02,
                   weight_decay=0.1),
              dict(params=[vec], use_muon=False, tp_split_dims=[-1], names=["gain"], lr=1e-3, weight_decay=0.01)]
    return mats + [vec], groups


def loss_of(params, grid, step, micro, skip=()):
    """A loss whose gradient depends on the parameters, the rank, the step and the micro-batch."""
    gen = torch.Generator().manual_seed(1000 * step + 10 * micro + grid.rank)
    total = 0
    for k, p in enumerate(params):
        p = p.to_local() if hasattr(p, "to_local") else p   # a TP model's rank computes on its shard
        x = torch.randn(p.shape, generator=gen)
        if k not in skip:
            total = total + (p.square() * x).sum() + (p * x).sum()
    return total


def skips(run, grid, step):
    if run == "none" and step == 2:
        return {SKIP_EVERYWHERE} | ({SKIP_ON_RANK0} if grid.dp_rank == 0 else set())
    return set()


def landed(opt, params) -> bool:
    """Whether every hooked parameter's gradient is a view of its bucket's gradient buffer."""
    storages = {s.grads.untyped_storage()._cdata for row in opt.store.buffers for s in row if s.grads is not None}
    return all(held(p.grad).untyped_storage()._cdata in storages for p in params if p.grad is not None)


def case(grid, comm, layout, dtensor=False, bind=True) -> dict:
    runs = {}
    for run in ("none", "zero", "hand", "hand0"):
        params, groups = make(grid, dtensor)
        runs[run] = (params, DistributedMuon(groups, grid, comm=comm, layout=layout, param_buffers=bind))
    out = dict(equal_none=[], equal_zero=[], landed=True, skipped_none=True)
    for step in (1, 2, 3):
        for run, (params, opt) in runs.items():
            skip = skips("none" if run == "hand" else run, grid, step)
            if run.startswith("hand"):
                grads = []
                for micro in (0, 1):
                    loss = loss_of(params, grid, step, micro, skip)
                    wanted = [p for k, p in enumerate(params) if k not in skip]
                    made = dict(zip([id(p) for p in wanted], torch.autograd.grad(loss, wanted)))
                    grads.append([made.get(id(p)) for p in params])
                for p, a, b in zip(params, *grads):
                    p.grad = None if a is None else a + b
            else:
                opt.zero_grad(set_to_none=run == "none")
                for micro in (0, 1):
                    loss_of(params, grid, step, micro, skip).backward()
                    out["landed"] &= grid.dp == 1 or landed(opt, params)
                if run == "none":
                    out["skipped_none"] &= all(params[k].grad is None for k in skip)
            opt.step()
        out["equal_none"].append(all(torch.equal(a, b) for a, b in zip(runs["none"][0], runs["hand"][0])))
        out["equal_zero"].append(all(torch.equal(a, b) for a, b in zip(runs["zero"][0], runs["hand0"][0])))
    params, opt = runs["none"]
    buffers = {s.params.untyped_storage()._cdata for row in opt.store.buffers for s in row if s.params is not None}
    out["bound"] = [held(p).untyped_storage()._cdata in buffers for p in params]   # views of the buffers
    out["params"] = [held(p).clone() for p in params]
    return out


def hooks_go_with_the_optimizer(grid, comm) -> bool:
    """One hook per parameter while the optimizer lives, none once it is collected."""
    import gc

    p = torch.nn.Parameter(torch.randn(8, 12))
    opt = DistributedMuon([p], grid, comm=comm)
    had = len(p._post_accumulate_grad_hooks or {})
    del opt
    gc.collect()
    return had == (1 if grid.dp > 1 else 0) and not p._post_accumulate_grad_hooks


def worker(grid, comm, args):
    torch.set_num_threads(1)
    found = {"hooks_removed": hooks_go_with_the_optimizer(grid, comm)}
    for layout in args.layouts.split(","):
        found[layout] = case(grid, comm, layout)
        if grid.tp > 1:
            for bind, label in ((True, "dtensor"), ("all", "dtensor-bound")):
                found[f"{layout}-{label}"] = r = case(grid, comm, layout, dtensor=True, bind=bind)
                r["equal_plain"] = all(torch.equal(a, b) for a, b in zip(r["params"], found[layout]["params"]))
    for r in found.values():
        if isinstance(r, dict):
            del r["params"]
    everyone = comm.gather_objects(found, "report")
    if grid.rank == 0:
        print(json.dumps(dict(dp=grid.dp, tp=grid.tp, ranks=everyone)), flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_launch_args(p)
    p.add_argument("--layouts", default="bucket,owner,aligned,group")
    sys.exit(launch(worker, p.parse_args()))
