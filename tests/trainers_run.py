"""Run by tests/test_trainers.py: the trainer recipes of ``scripts/`` exactly as they are, each trained three times
in one job (2 gloo ranks): straight for 4 steps, saving after step 2 with the trainer's own save; resumed from
that save to step 4 with the trainer's own load; and straight again with the recipe's optimizer replaced by the
package's single-device ``MuonW`` on every rank in place of its ``DistributedMuon`` (replicated: each rank steps
the same DDP-averaged gradients), under the same wrapper. Prints one JSON line (rank 0): per recipe, each run's losses and the largest parameter
differences (straight - resumed, straight - MuonW, rank 0 - every other rank).

    python tests/trainers_run.py DIR loop_accelerate [loop_fabric loop_lightning] --dp 2

Each recipe gets its flags from ``loop_zero1_tp.parse``: lr 0.01, 4 steps, 2 micro-batches of 2 rows per rank
a step, a save every 2 steps.
"""
import argparse
import functools
import importlib
import json
import os
import sys
import time
from pathlib import Path

# Lightning imports scipy, whose OpenBLAS starts a thread when loaded: the launcher then cannot fork the ranks from
# this process and starts a fork server, which imports Lightning a second time (half a minute on a loaded machine)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402

from muongrid import MuonW  # noqa: E402
from muongrid.lab.charlm import load_corpus  # noqa: E402
from muongrid.launch import add_launch_args, launch  # noqa: E402

FLAGS = ["--lr", "0.01", "--steps", "4", "--batch", "8", "--accum", "2", "--eval-every", "0", "--every", "2"]
RESUME_FROM = dict(loop_accelerate="step2", loop_fabric="step2.ckpt", loop_lightning="step=2.ckpt")


def replicated(groups, grid, **keywords):
    """In the recipe's ``DistributedMuon(groups, grid, grad_reduce="ddp")``: the package's single-device Muon +
    AdamW on the same groups, on every rank (what the recipe must equal)."""
    return MuonW(groups)


@functools.lru_cache(maxsize=None)
def corpus() -> dict:
    return load_corpus()


def params(model) -> dict:
    return {n: p.detach().float().cpu().clone() for n, p in model.named_parameters()}


def largest(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[n] - b[n]).abs().max().item() for n in a)


def worker(grid, comm, args):
    torch.set_num_threads(1)
    out = {}
    for name in args.recipes:
        recipe = importlib.import_module(name)
        recipe.load_corpus = corpus   # the same text each run: read once (half a second a read)
        folder = Path(args.dir) / name
        flags = [*FLAGS, "--dp", str(grid.dp)]
        started = time.perf_counter()
        straight, logged = recipe.train(grid, recipe.parse(recipe.__doc__, [*flags, "--save", str(folder)]))
        resumed, logged_resumed = recipe.train(
            grid, recipe.parse(recipe.__doc__, [*flags, "--resume", str(folder / RESUME_FROM[name])]))
        resumed_at = time.perf_counter()
        ours = recipe.DistributedMuon
        recipe.DistributedMuon = replicated
        try:
            reference, logged_reference = recipe.train(grid, recipe.parse(recipe.__doc__, flags))
        finally:
            recipe.DistributedMuon = ours
        seconds = [round(t, 1) for t in (resumed_at - started, time.perf_counter() - resumed_at)]
        runs = dict(straight=params(straight), resumed=params(resumed), reference=params(reference))
        everyone = comm.gather_objects(runs["straight"], "report")
        out[name] = dict(losses=logged["losses"], resumed_losses=logged_resumed["losses"],
                         first_step_resumed=logged_resumed["first_step"], reference_losses=logged_reference["losses"],
                         vs_resumed=largest(runs["straight"], runs["resumed"]),
                         vs_muonw=largest(runs["straight"], runs["reference"]),
                         moved=largest(runs["straight"], params(recipe.tiny_gpt(recipe.load_corpus(), "cpu"))),
                         across_ranks=max(largest(everyone[0], theirs) for theirs in everyone),
                         seconds=seconds,   # rank 0: straight and resumed; the MuonW run (for the record)
                         files=sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()))
    if grid.rank == 0:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_launch_args(p)
    p.add_argument("dir")
    p.add_argument("recipes", nargs="+")
    args = p.parse_args()
    for name in args.recipes:
        importlib.import_module(name)   # imported before the ranks fork: Lightning's import takes seconds
    sys.exit(launch(worker, args))
