"""Accelerate's ``save_state`` / ``load_state`` with every rank's shard of a ZeRO-1 optimizer.

    accelerator = Accelerator(gradient_accumulation_steps=2)
    grid = Grid.build(accelerator.num_processes, 1)
    opt = DistributedMuon(hybrid_param_groups(model), grid, grad_reduce="ddp")   # DDP averages the gradients
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    ShardedState(accelerator, opt)          # muongrid.accelerate: before the first save_state / load_state
    accelerator.save_state(folder)          # + every rank's shard in folder/muongrid_optimizer_0/
    accelerator.load_state(folder)          # each rank its own shard (the same number of ranks)

**Why.** ``save_state`` calls ``optimizer.state_dict()`` on every rank but writes the main process's alone, and
``load_state`` loads that file into every rank's optimizer: for ZeRO-1 that is rank 0's shard, which every
other rank refuses. Accelerate documents two hooks that run on every rank and are given the folder,
``register_save_state_pre_hook`` and ``register_load_state_pre_hook``: there every rank writes and reads its
own shard (``shard_files``: all ranks or none, refused by name on another world size). Accelerate then still
writes rank 0's state as its ``optimizer.bin`` and, right after the load hook, loads it into every optimizer;
a ``load_state_dict`` pre-hook (torch's, on the optimizer) takes that one load, coming before any step and
holding a shard of the same plan, as the state the hook has just loaded. Accelerate itself is never imported
here: the accelerator is handed in.
"""
from __future__ import annotations

import os

import torch

from . import shard_files

PLAN_KEYS = ("dp", "tp", "layout", "global_buffer_size")   # a shard of the same plan, from any rank


def shard_folder(folder, index: int) -> str:
    """Where optimizer ``index``'s shards go inside an Accelerate checkpoint folder."""
    return os.path.join(folder, f"muongrid_optimizer_{index}")


class ShardedState:
    """Register on ``accelerator`` (its ``save_state`` / ``load_state``) the save and load of every rank's shard of
    each ZeRO-1 optimizer given (``DistributedMuon`` / ``DistributedAdamW``, or what ``prepare`` returned for them);
    an optimizer whose whole state is on every rank is left to Accelerate. ``remove()`` takes the hooks off."""

    def __init__(self, accelerator, *optimizers):
        unwrapped = [getattr(o, "optimizer", o) for o in optimizers]   # AcceleratedOptimizer wraps ours
        self.optimizers = [o for o in unwrapped if hasattr(o, "check_state_dict")]   # the others: Accelerate's
        self._loaded: dict[int, int] = {}   # id(opt) -> steps_taken when the load hook filled it
        self.handles = [accelerator.register_save_state_pre_hook(self._save),
                        accelerator.register_load_state_pre_hook(self._load)]
        self.handles += [opt.register_load_state_dict_pre_hook(self._after_own_shard) for opt in self.optimizers]

    def _save(self, models, weights, output_dir) -> None:
        for state in weights:   # the model state dicts Accelerate is about to write
            for name, t in state.items():
                if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > t.numel() * t.element_size():
                    state[name] = t.clone()   # a view of ZeRO-1's flat buffer: safetensors would drop it as tied
        for i, opt in enumerate(self.optimizers):
            shard_files.save(opt, shard_folder(output_dir, i))

    def _load(self, models, input_dir) -> None:
        for i, opt in enumerate(self.optimizers):
            shard_files.load(opt, shard_folder(input_dir, i))
            self._loaded[id(opt)] = opt.steps_taken

    def _after_own_shard(self, opt, state_dict):
        """Accelerate's own load of rank 0's ``optimizer.bin``, just after ours: keep the shard ours loaded."""
        if self._loaded.pop(id(opt), None) != opt.steps_taken:
            return None   # not that load: torch's own checks run
        saved, ours = (state_dict.get("muongrid") if isinstance(state_dict, dict) else None), opt.state_dict()
        return ours if saved and all(saved.get(k) == ours["muongrid"][k] for k in PLAN_KEYS) else None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
