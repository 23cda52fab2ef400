"""Hugging Face ``Trainer`` with a ZeRO-1 optimizer: every rank's shard saved and resumed by Trainer's checkpoints.

Trainer wraps the model in ``DistributedDataParallel`` under ``torchrun`` (so build the optimizer with
``grad_reduce="ddp"``), writes ``optimizer.state_dict()`` from rank 0 only, and on resume loads that one file into
every rank's optimizer. ``ShardedCheckpoint(opt)``, a ``TrainerCallback``, keeps every rank's shard instead:

    args = TrainingArguments(output_dir, ddp_backend="gloo", save_steps=100, ...)   # "nccl" on GPUs
    grid = Grid.build(dp=args.world_size, tp=1)       # after args has set up the process group (args.device)
    opt = DistributedMuon(hybrid_param_groups(model), grid, grad_reduce="ddp")
    trainer = Trainer(model, args, train_dataset=data, optimizers=(opt, None),
                      callbacks=[muongrid.hf.ShardedCheckpoint(opt)])
    trainer.train(resume_from_checkpoint=True)        # torchrun --nproc-per-node N train.py

At each of Trainer's saves (``on_save``, on every rank) each rank writes its shard into the checkpoint's folder
(``checkpoint-N/muongrid-shards``, ``muongrid.shard_files``) and, with ``reshard=True`` (the default), a
``muongrid.checkpoint`` copy in global coordinates (``checkpoint-N/muongrid-checkpoint``); rank 0 then replaces
``optimizer.pt`` (its own shard) with a small record pointing there. On resume Trainer loads ``optimizer.pt`` into
every rank's optimizer, as always: the callback's ``load_state_dict`` pre-hook reads the record and loads each rank's
own shard (the same world size: bit for bit) or the resharded copy (another world size). Trainer itself restores
the model, its scheduler (it loads ``scheduler.pt`` only when ``optimizer.pt`` exists, which it still does), the
data position and every rank's RNG. ``save_total_limit`` removes the folders with the rest of the checkpoint.

Without the callback a resume stops on every rank at Trainer's ``load_state_dict`` with a message naming it
(``rank_state.load_state_dict`` agrees across ranks before anything changes). This module imports transformers only
when ``ShardedCheckpoint`` is first used. ``tests/test_hf_trainer.py`` runs it under torchrun.
"""
from __future__ import annotations

from pathlib import Path

import torch

POINTER = "muongrid.hf.ShardedCheckpoint"   # the key of the record rank 0 writes into optimizer.pt
SHARDS, RESHARD = "muongrid-shards", "muongrid-checkpoint"


class _Sharded:
    """What ``ShardedCheckpoint`` does; a ``transformers.TrainerCallback`` is mixed in when the class is made."""

    def __init__(self, opt, reshard: bool = True):
        from .distributed import ZeroOneOptimizer
        inner = getattr(opt, "optimizer", opt)   # an accelerate AcceleratedOptimizer holds ours
        if not isinstance(inner, ZeroOneOptimizer):
            raise TypeError(f"ShardedCheckpoint(opt) takes a DistributedMuon or DistributedAdamW, not a "
                            f"{type(inner).__name__}: a torch optimizer's state is whole on every rank, and Trainer "
                            "saves and resumes it without help")
        self.opt, self.reshard = inner, bool(reshard)
        inner.register_load_state_dict_pre_hook(self._load)

    def on_save(self, args, state, control, **kwargs):
        """After Trainer wrote ``checkpoint-N`` (every rank): every rank's shard, then rank 0's pointer record."""
        import torch.distributed as dist

        from . import checkpoint, shard_files
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        shard_files.save(self.opt, folder / SHARDS, extra=dict(step=state.global_step))
        if self.reshard:
            checkpoint.save(self.opt, folder / RESHARD, state.global_step)
        world = dist.get_world_size() if dist.is_initialized() else 1
        if not dist.is_initialized() or dist.get_rank() == 0:
            record = {POINTER: dict(checkpoint=str(folder.resolve()), shards=SHARDS, world=world,
                                    step=state.global_step, reshard=RESHARD if self.reshard else "")}
            tmp = folder / "optimizer.pt.tmp"
            torch.save(record, tmp)
            tmp.replace(folder / "optimizer.pt")
        return control

    def _load(self, opt, state_dict):
        """``load_state_dict``'s pre-hook: a pointer record becomes this rank's own shard (or, from another world
        size, the resharded copy is loaded and the optimizer's state handed back as it now is)."""
        record = state_dict.get(POINTER) if isinstance(state_dict, dict) else None
        if record is None:
            return None   # an ordinary state_dict: load_state_dict checks it (and names this callback if wrong)
        from . import checkpoint, shard_files
        folder = _checkpoint_read() or Path(record["checkpoint"])
        if not (folder / record["shards"]).is_dir():
            raise checkpoint.CheckpointError(
                f"{folder} has no {record['shards']}: ShardedCheckpoint keeps every rank's optimizer shard beside "
                "Trainer's files in each checkpoint-N folder; resume from a whole checkpoint folder")
        if record["world"] in shard_files.saved_worlds(folder / record["shards"]) and \
                record["world"] == _world():
            return shard_files.read(opt, folder / record["shards"])["optimizer"]
        if not record["reshard"]:
            raise checkpoint.CheckpointError(
                f"{folder} was saved by {record['world']} ranks and this run has {_world()}: its optimizer shards "
                "load only on that world size. Resume on it, or save with ShardedCheckpoint(opt, reshard=True) "
                "(the default), which keeps a copy that loads on any world size")
        checkpoint.load(opt, folder / record["reshard"])
        return opt.state_dict()


def _checkpoint_read() -> Path | None:
    """The checkpoint folder Trainer is loading ``optimizer.pt`` from: its ``_load_optimizer_and_scheduler``'s
    argument, found up the call stack (the record also names the folder it was written in, used when this is not
    found: a checkpoint moved elsewhere is found only this way)."""
    import sys
    frame = sys._getframe(1)
    while frame is not None:
        folder = frame.f_locals.get("checkpoint") if frame.f_code.co_name == "_load_optimizer_and_scheduler" else None
        if isinstance(folder, str):
            return Path(folder)
        frame = frame.f_back
    return None


def _world() -> int:
    import torch.distributed as dist
    return dist.get_world_size() if dist.is_initialized() else 1


_CLASS = None


def __getattr__(name: str):
    """``ShardedCheckpoint`` is made on first use, so that importing this module needs no transformers."""
    global _CLASS
    if name != "ShardedCheckpoint":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _CLASS is None:
        from transformers import TrainerCallback
        _CLASS = type("ShardedCheckpoint", (_Sharded, TrainerCallback), dict(
            __doc__="Trainer's checkpoints keep every rank's ZeRO-1 optimizer shard (see ``muongrid.hf``).",
            __module__=__name__))
    return _CLASS
