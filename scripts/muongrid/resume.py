"""Save and resume a training run (model, optimizer, scheduler, data position, RNG) on any grid and layout.

    from muongrid import resume
    resume.save_run(f"{folder}/step{step}", step, opt, sched, data_gen, run_args)
    step = resume.load_run(folder, opt, sched, data_gen, run_args)  # the newest step<N>

The model, the optimizer and the scheduler go through ``muongrid.checkpoint.save/load`` (which reshards:
``DistributedMuon`` / ``DistributedAdamW`` under ZeRO-1, whose masters are the parameters, and ``FSDPMuon``
alike). What the loop owns beside them is small and the same on every rank, so rank 0 writes it to
``<path>/train.json`` once the checkpoint is complete: the step, the data position (a
``muongrid.data.ResumableLoader``'s ``state_dict()``, or the state of a ``torch.Generator`` that draws the
batches, as ``train.py``'s does) and torch's global RNG state, and the arguments that define the run.
A resume refuses arguments that would make it another run (batch, model size, seed, optimizer, learning
rates...), naming them; the grid, the layout and ``--steps`` may change.

``scripts/train.py --save DIR --every N`` / ``--resume DIR`` use it.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

TRAIN_FILE = "train.json"


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


@contextlib.contextmanager
def _quiet():
    """DCP on ShardedTensors (muongrid.checkpoint's pieces) warns on every rank that DTensor is preferred."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*ShardedTensor.*")
        yield


def _is_generator(data) -> bool:
    return isinstance(data, torch.Generator)


def save_run(path, step: int, opt, sched, data_gen, run_args: dict, model=None,
             fsdp: bool | None = None) -> None:
    """Checkpoint after ``step`` (call on every rank, after ``opt.step()`` and ``sched.step()``).
    ``data_gen``: the data position, a ``torch.Generator`` or anything with ``state_dict()`` (a
    ``muongrid.data.ResumableLoader``). ``model`` and ``fsdp`` are no longer needed (the checkpoint reads the
    optimizer's kind); accepted for older callers."""
    from .checkpoint import save
    with _quiet():
        save(opt, path, step, scheduler=sched, extra=dict(run_args=run_args))
    if _rank() == 0:
        data = (dict(data_rng=_b64(data_gen.get_state())) if _is_generator(data_gen)
                else dict(data=data_gen.state_dict()))
        record = dict(step=step, **data, torch_rng=_b64(torch.get_rng_state()), run_args=run_args)
        tmp = Path(path) / f"{TRAIN_FILE}.tmp"
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, Path(path) / TRAIN_FILE)
    _barrier()


def latest(path) -> Path:
    """``path`` itself if it is a saved run, else its newest complete ``step<N>`` folder (train.py saves
    ``DIR/step<N>`` every N steps, so ``--resume DIR`` continues from the last one)."""
    path = Path(path)
    if (path / TRAIN_FILE).is_file() or not path.is_dir():
        return path
    steps = sorted((int(d.name[4:]), d) for d in path.glob("step*") if d.name[4:].isdigit() and (d / TRAIN_FILE).is_file())
    return steps[-1][1] if steps else path


def load_run(path, opt, sched, data_gen, run_args: dict, model=None, fsdp: bool | None = None) -> int:
    """Restore a ``save_run`` folder into this run (any grid, any layout); returns the step it was saved at.
    Everything that can be checked is checked before the model or optimizer change."""
    from .checkpoint import CheckpointError
    path = latest(path)
    file = Path(path) / TRAIN_FILE
    if not file.is_file():
        raise CheckpointError(f"{path} has no {TRAIN_FILE}: not a run saved by train.py --save (or the save did "
                              "not finish); resume from a complete one")
    record = json.loads(file.read_text())
    differ = {k: (record["run_args"].get(k), v) for k, v in run_args.items() if record["run_args"].get(k) != v}
    if differ:
        raise ValueError(f"{path} was saved by another run: " + ", ".join(f"{k} saved {a!r}, here {b!r}"
                                                                        for k, (a, b) in differ.items())
                         + ". Resume with the same settings (the grid, layout and --steps may change)")
    if _is_generator(data_gen) != ("data_rng" in record):
        raise ValueError(f"{file} holds its data position as {'a generator' if 'data_rng' in record else 'a loader'}"
                         f" state, and this run reads its data through {type(data_gen).__name__}")
    if not _is_generator(data_gen):
        data_gen.check_state(record["data"])   # before anything changes
    from .checkpoint import load
    with _quiet():
        step = load(opt, path, scheduler=sched)
    if step != record["step"]:
        raise CheckpointError(f"{file} is of step {record['step']} but the checkpoint of step {step}")
    if _is_generator(data_gen):
        data_gen.set_state(_unb64(record["data_rng"]))
    else:
        data_gen.load_state_dict(record["data"])
    torch.set_rng_state(_unb64(record["torch_rng"]))
    return step
