"""Every rank's own optimizer shard, saved to one folder and loaded back as it was, bit for bit, on the same world.

A ZeRO-1 ``state_dict()`` is one rank's shard, and a trainer that saves the optimizer from rank 0 only (HF Trainer,
Accelerate, Lightning) keeps one shard of several. Their integrations (``muongrid.hf`` and the others) call
these two functions from the hook each trainer offers, on every rank:

    from muongrid import shard_files
    shard_files.save(opt, f"{ckpt}/muongrid", extra={"step": step})   # <folder>/shard-rank<R>-of-<W>.pt
    extra = shard_files.load(opt, f"{ckpt}/muongrid")                 # each rank its own file, the same world

A save or a load that fails on one rank fails on every rank, with each rank's problem in the message (``agree``),
so no rank walks on into a collective its peers never join (``rank_state.agree``); a load changes nothing unless
every rank could load.
A folder written by another world size is refused by name: these files are shards of one plan. Moving a run to
another world size goes through ``muongrid.checkpoint`` (global coordinates, resharded on load).

    python -m pytest -q tests/test_ddp.py -k shard_files
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch
import torch.distributed as dist

from .rank_state import agree

FORMAT = "muongrid-shard/1"
NAME = re.compile(r"shard-rank(\d+)-of-(\d+)\.pt$")


def file_name(rank: int, world: int) -> str:
    return f"shard-rank{rank}-of-{world}.pt"


def _place() -> tuple[int, int]:
    """(rank, world) of this process in the job (0, 1 without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def saved_worlds(folder) -> set[int]:
    """The world sizes whose shard files ``folder`` holds."""
    folder = Path(folder)
    return {int(m[2]) for f in (folder.iterdir() if folder.is_dir() else []) if (m := NAME.match(f.name))}


def _owned(value):
    """``value`` with every tensor a compact copy (a state view would save the whole buffer it lives in)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _owned(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_owned(v) for v in value)
    return value


def save(opt, folder, extra: dict | None = None) -> Path:
    """Write this rank's ``opt.state_dict()`` (and ``extra``) to ``folder``; call on every rank. Shards of
    another world size left in ``folder`` are removed. Returns this rank's file."""
    rank, world = _place()
    folder = Path(folder)
    path, problem = folder / file_name(rank, world), None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            for f in folder.iterdir():
                if (m := NAME.match(f.name)) and int(m[2]) != world:
                    f.unlink(missing_ok=True)
        record = dict(format=FORMAT, rank=rank, world=world, optimizer=_owned(opt.state_dict()), extra=extra or {})
        tmp = folder / f"{path.name}.{os.getpid()}.tmp"
        torch.save(record, tmp)
        os.replace(tmp, path)   # whole or not at all
    except Exception as e:   # noqa: BLE001 (every rank must hear of it: agree)
        problem = f"{type(e).__name__}: {e}"
    agree(problem, f"saving the optimizer shards to {folder}")
    return path


def load(opt, folder) -> dict:
    """Load this rank's file of ``folder`` into ``opt`` (call on every rank of the world that saved it); returns
    the ``extra`` it was saved with. Nothing changes on any rank unless every rank's file fits its optimizer."""
    record = read(opt, folder)
    opt.load_state_dict(record["optimizer"])
    return record["extra"]


def read(opt, folder) -> dict:
    """This rank's record in ``folder`` (``optimizer``: its state_dict, ``extra``), checked on every rank to fit
    ``opt`` (``agree``) but not loaded: for a hook that hands it to ``opt.load_state_dict`` itself."""
    rank, world = _place()
    folder = Path(folder)
    path, problem, record = folder / file_name(rank, world), None, None
    try:
        worlds = saved_worlds(folder)
        if not folder.is_dir():
            problem = f"no folder {folder}"
        elif worlds and world not in worlds:
            problem = (f"{folder} holds the shards of a world of {' or '.join(map(str, sorted(worlds)))} ranks and "
                       f"this job has {world}: each file is one rank's shard of that world's plan. Resume on "
                       f"{min(worlds)} ranks, or move the run to {world} through muongrid.checkpoint (it reshards)")
        elif not path.is_file():
            problem = f"{path.name} is missing from {folder} (its save did not finish, or the file was moved)"
        else:
            record = torch.load(path, weights_only=True)
            if record.get("format") != FORMAT or (record.get("rank"), record.get("world")) != (rank, world):
                problem = (f"{path.name} holds rank {record.get('rank')} of {record.get('world')}'s shard "
                           f"(format {record.get('format')!r}), not rank {rank} of {world}'s")
            else:
                opt.check_state_dict(record["optimizer"])
    except Exception as e:   # noqa: BLE001 (every rank must hear of it: agree)
        problem = f"{type(e).__name__}: {e}"
    agree(problem, f"loading the optimizer shards from {folder}")
    return record
