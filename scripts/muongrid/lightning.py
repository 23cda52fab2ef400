"""Lightning's checkpoints with every rank's shard of a ZeRO-1 optimizer: two DDP strategies.

    trainer = L.Trainer(strategy=ShardedDDPStrategy(), accumulate_grad_batches=2, gradient_clip_val=1.0, ...)
    trainer.fit(module, loader, ckpt_path=...)     # configure_optimizers: DistributedMuon(..., grad_reduce="ddp")

    fabric = L.Fabric(strategy=FabricShardedDDPStrategy(), ...)
    model, opt = fabric.setup(model, DistributedMuon(groups, grid, grad_reduce="ddp"))
    fabric.save(path, {"model": model, "optimizer": opt, "step": step})   # + every rank's shard beside it
    fabric.load(path, state)                                            # each rank its own (the same world)

**Why a strategy.** Lightning takes ``optimizer.state_dict()`` on every rank and writes rank 0's checkpoint
alone, then loads that file into every rank: for ZeRO-1 that is rank 0's shard, which every other rank refuses.
A ``CheckpointIO`` plugin is called on rank 0 only and a callback is not given the checkpoint's path; the
strategy's ``save_checkpoint`` / ``load_checkpoint`` run on every rank with the path. These two are Lightning's
``DDPStrategy`` (Trainer: ``lightning.pytorch``; Fabric: ``lightning.fabric``) with one change each: a ZeRO-1
optimizer (``DistributedMuon`` / ``DistributedAdamW``) is written by every rank beside the checkpoint
(``<path>.muongrid/<name>/``, through ``shard_files``: all ranks or none, refused by name on another world
size) and read back from there; the checkpoint itself holds a marker in its place. Any other optimizer, and
everything else, is saved and loaded as Lightning does.

Lightning is imported when one of the two classes is first used, never on ``import muongrid.lightning``.
"""
from __future__ import annotations

import os
import shutil

from . import shard_files

MARKER = "muongrid.lightning"   # the key of what a checkpoint holds in a ZeRO-1 optimizer's place (rank_state)


def shard_folder(path, name) -> str:
    """Where the optimizer saved under ``name`` keeps its shards, beside the checkpoint ``path``."""
    return os.path.join(f"{path}.muongrid", str(name))


def sharded(opt) -> bool:
    """A ZeRO-1 optimizer (one shard per rank), looked for through Lightning's wrapper."""
    return hasattr(getattr(opt, "_optimizer", opt), "check_state_dict")


def _trainer_strategy():
    from lightning.fabric.utilities.optimizer import _optimizer_to_device
    from lightning.pytorch.strategies import DDPStrategy

    class ShardedDDPStrategy(DDPStrategy):
        """The Lightning Trainer's ``DDPStrategy``, saving and loading every rank's ZeRO-1 optimizer shard."""

        def optimizer_state(self, optimizer):
            if sharded(optimizer):
                return {MARKER: "every rank's shard is in the checkpoint's .muongrid folder"}
            return super().optimizer_state(optimizer)

        def save_checkpoint(self, checkpoint, filepath, storage_options=None) -> None:
            for i, opt in enumerate(self.optimizers):
                if sharded(opt):
                    shard_files.save(getattr(opt, "_optimizer", opt), shard_folder(filepath, f"optimizer_{i}"))
            super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

        def load_checkpoint(self, checkpoint_path, weights_only=None):
            self._loading = checkpoint_path   # load_optimizer_state_dict is not given it
            return super().load_checkpoint(checkpoint_path, weights_only=weights_only)

        def load_optimizer_state_dict(self, checkpoint) -> None:
            for i, (opt, state) in enumerate(zip(self.optimizers, checkpoint["optimizer_states"])):
                if sharded(opt):
                    shard_files.load(getattr(opt, "_optimizer", opt), shard_folder(self._loading, f"optimizer_{i}"))
                else:
                    opt.load_state_dict(state)
                    _optimizer_to_device(opt, self.root_device)

        def remove_checkpoint(self, filepath) -> None:
            super().remove_checkpoint(filepath)
            if self.is_global_zero:
                shutil.rmtree(f"{filepath}.muongrid", ignore_errors=True)

    return ShardedDDPStrategy


def _fabric_strategy():
    from lightning.fabric.strategies import DDPStrategy

    class FabricShardedDDPStrategy(DDPStrategy):
        """Fabric's ``DDPStrategy``, saving and loading every rank's ZeRO-1 optimizer shard."""

        def save_checkpoint(self, path, state, storage_options=None, filter=None) -> None:
            state = dict(state)
            for name, obj in state.items():
                if sharded(obj):
                    shard_files.save(obj, shard_folder(path, name))
                    state[name] = {MARKER: f"every rank's shard is in {shard_folder(os.path.basename(path), name)}"}
            super().save_checkpoint(path, state, storage_options=storage_options, filter=filter)

        def load_checkpoint(self, path, state=None, strict=True, weights_only=None):
            if not isinstance(state, dict) or not any(sharded(obj) for obj in state.values()):
                return super().load_checkpoint(path, state, strict=strict, weights_only=weights_only)
            ours = {name: obj for name, obj in state.items() if sharded(obj)}
            for name, opt in ours.items():
                shard_files.load(opt, shard_folder(path, name))
            rest = {name: obj for name, obj in state.items() if name not in ours}
            if rest:
                remainder = super().load_checkpoint(path, rest, strict=strict, weights_only=weights_only)
                state.update(rest)   # the plain values Lightning read into it (a step counter...)
            else:
                remainder = super().load_checkpoint(path, None, weights_only=weights_only)
            return {name: value for name, value in remainder.items() if name not in ours}

    return FabricShardedDDPStrategy


_MADE = {"ShardedDDPStrategy": _trainer_strategy, "FabricShardedDDPStrategy": _fabric_strategy}


def __getattr__(name: str):
    """``ShardedDDPStrategy`` and ``FabricShardedDDPStrategy``, made (and Lightning imported) on first use."""
    if name not in _MADE:
        raise AttributeError(f"module 'muongrid.lightning' has no attribute {name!r}")
    cls = globals()[name] = _MADE[name]()
    cls.__module__ = __name__
    return cls
