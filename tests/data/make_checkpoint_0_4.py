"""Make ``tests/data/checkpoint_0_4/``: a checkpoint saved by muongrid 0.4 (commit f5d494a), kept so later
versions prove they still load it (``tests/test_old_checkpoint.py``; issue 53).

One process (``Grid.single()``), ``DistributedMuon`` with its default layout ("owner") on a Muon group of two
matrices and an AdamW group of a gain, two steps with seeded gradients, then saved both ways a user saves it:

* ``dcp/``: ``muongrid.checkpoint.save`` (DCP, global coordinates; loads on any grid and layout);
* ``rank0.pt``: ``torch.save(opt.state_dict())``, the one rank's shard;
* ``next.pt``: the parameters as saved, the gradients of step 3 and the parameters after step 3 (what a
  resumed optimizer must reproduce bit for bit).

    PYTHONPATH=scripts python tests/data/make_checkpoint_0_4.py   # rewrites the folder: only at a 0.4 commit
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from muongrid import DistributedMuon, Grid, checkpoint

OUT = Path(__file__).resolve().parent / "checkpoint_0_4"
SHAPES = [(9, 12), (12, 7), (10,)]


def groups(params: list) -> list[dict]:
    return [dict(params=params[:2], names=["w1", "w2"], lr=0.02, weight_decay=0.1),
            dict(params=params[2:], names=["gain"], use_muon=False, lr=1e-3, weight_decay=0.05)]


def grads(step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=gen) for s in SHAPES]


def params() -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]


def main() -> None:
    ps = params()
    opt = DistributedMuon(groups(ps), Grid.single(), check_finite="raise")
    for step in (1, 2):
        for p, g in zip(ps, grads(step)):
            p.grad = g
        opt.step()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()
    checkpoint.save(opt, OUT / "dcp", step=2)
    torch.save(opt.state_dict(), OUT / "rank0.pt")
    saved = [p.detach().clone() for p in ps]
    for p, g in zip(ps, grads(3)):
        p.grad = g
    opt.step()
    torch.save(dict(params=saved, grads=grads(3), after=[p.detach().clone() for p in ps]), OUT / "next.pt")


if __name__ == "__main__":
    main()
