"""Run by tests/test_checkpoint.py under the launcher: a tensor-parallel (DTensor) model is saved on one layout
and loaded into a fresh model and optimizer on another; every parameter must come back equal."""
import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from muongrid import DistributedMuon, checkpoint, hybrid_param_groups
from muongrid.launch import add_launch_args, launch
from muongrid.lab.tpgpt import tp_gpt

def worker(grid, comm, args):
    model = tp_gpt(40, grid, d=32, n_layer=1, n_head=2, context=8)
    opt = DistributedMuon(hybrid_param_groups(model.named_parameters()), grid, comm=comm, layout="owner")
    x = torch.randint(0, 40, (2, 8))
    for _ in range(2):
        model(x).float().pow(2).mean().backward()
        opt.step(); opt.zero_grad()
    folder = comm.gather_objects(tempfile.mkdtemp() if grid.rank == 0 else None, "report")[0]
    checkpoint.save(opt, Path(folder) / "ck", step=2)
    model2 = tp_gpt(40, grid, d=32, n_layer=1, n_head=2, context=8, seed=5)
    opt2 = DistributedMuon(hybrid_param_groups(model2.named_parameters()), grid, comm=comm, layout="bucket")
    assert checkpoint.load(opt2, Path(folder) / "ck") == 2
    for (n, p), (_, q) in zip(model.named_parameters(), model2.named_parameters()):
        a = p.to_local() if hasattr(p, "to_local") else p
        b = q.to_local() if hasattr(q, "to_local") else q
        assert torch.equal(a, b), n
    comm.gather_objects(None, "report")  # every rank has read before rank 0 removes the folder
    if grid.rank == 0:
        shutil.rmtree(folder)
        print("DTensor checkpoint round trip ok", flush=True)
    return 0

if __name__ == "__main__":
    p = argparse.ArgumentParser(); add_launch_args(p); sys.exit(launch(worker, p.parse_args()))
