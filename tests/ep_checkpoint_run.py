"""Run by tests/test_expert_parallel.py under the launcher: an expert grid's checkpoint holds each bank whole
and loads on another number of expert slices.

On 4 ranks (DP 4): the expert banks of tests/ep_run.py trained 2 steps on ``grid.expert(2)`` (slices of 2
experts, each on 2 replicas) and saved. Then, per ``--load-ep`` (4: every rank its own slice of one expert;
1: every rank the whole bank, ZeRO-1 over 4), fresh parameters on that grid load it and save it again. Rank 0
exports every checkpoint to one file (``checkpoint.export``: full tensors) and compares them, tensor by tensor,
bit for bit; every rank also compares the banks it holds with its rows of the exported first save (so the
rows are where the experts are, not only where the last save put them). Last, an expert optimizer of 2-D
matrices tries to save (refused: not a bank). Prints one JSON line (rank 0).

    python tests/ep_checkpoint_run.py --dp 4 --tp 1 --out DIR
"""
import argparse
import json
import sys
from pathlib import Path

import torch

from ep_run import BANKS, experts_of, full_params, grads
from muongrid import DistributedMuon, checkpoint
from muongrid.launch import add_launch_args, launch

SAVE_EP, STEPS = 2, 2


def expert_optimizer(grid, ep: int, start: dict):
    here = grid.expert(ep) if ep > 1 else grid
    mine = experts_of(grid.dp_rank % ep, ep)
    banks = {n: torch.nn.Parameter(start[n][mine].clone()) for n in BANKS}
    return DistributedMuon([{"params": list(banks.values()), "names": list(banks)}], here), banks, mine


def worker(grid, comm, args):
    torch.set_num_threads(1)
    out = Path(args.out)
    opt, banks, mine = expert_optimizer(grid, SAVE_EP, full_params())
    for step in range(1, STEPS + 1):
        g = grads(step, grid.dp_rank)
        for n, p in banks.items():
            p.grad = g[n][mine].clone()
        opt.step()
    checkpoint.save(opt, out / "saved", step=STEPS)
    held = {("saved", n): (p.detach().clone(), mine) for n, p in banks.items()}
    for ep in args.load_ep:
        zeros = {n: torch.zeros_like(t) for n, t in full_params().items()}
        loaded, banks, mine = expert_optimizer(grid, ep, zeros)
        step = checkpoint.load(loaded, out / "saved")
        held.update({(f"ep{ep}", n): (p.detach().clone(), mine) for n, p in banks.items()})
        checkpoint.save(loaded, out / f"again_ep{ep}", step=step)
    report = {}
    if grid.rank == 0:
        checkpoint.export(out / "saved", out / "saved.pt")
    torch.distributed.barrier()  # the export is written before anyone reads it
    whole = torch.load(out / "saved.pt", weights_only=True)
    bank = {n: whole[f"model.{n}"].view(shape) for n, shape in BANKS.items()}   # stored as (experts, out * in)
    report["rows_match"] = {f"{where}.{n}": torch.equal(p, bank[n][rows])
                            for (where, n), (p, rows) in held.items()}
    if grid.rank == 0:
        report["exports"] = {}
        for ep in args.load_ep:
            checkpoint.export(out / f"again_ep{ep}", out / f"again_ep{ep}.pt")
            again = torch.load(out / f"again_ep{ep}.pt", weights_only=True)
            tensors = sorted(k for k, v in whole.items() if isinstance(v, torch.Tensor))
            report["exports"][f"ep{ep}"] = dict(
                keys_equal=tensors == sorted(k for k, v in again.items() if isinstance(v, torch.Tensor)),
                unequal=[k for k in tensors if k in again and not torch.equal(whole[k], again[k])],
                shapes={k: list(whole[k].shape) for k in tensors if k.startswith("model.")},
                marker_ep=json.loads(whole["muongrid"])["saved_on"].get("ep"))
        report["moved"] = min((bank[n] - full_params()[n]).abs().max().item() for n in BANKS)
    matrix = DistributedMuon([{"params": [torch.nn.Parameter(torch.zeros(8, 8))], "names": ["expert.w"]}],
                             grid.expert(SAVE_EP))
    try:
        checkpoint.save(matrix, out / "matrix", step=1)
    except checkpoint.CheckpointError as e:
        report["refused"] = str(e)
    everyone = comm.gather_objects(report, "report")
    if grid.rank == 0:
        print(json.dumps(dict(ranks=everyone)), flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_launch_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--load-ep", type=lambda s: [int(x) for x in s.split(",")], default=[4, 1])
    sys.exit(launch(worker, p.parse_args()))
