"""``capturable=True``: a step whose work a CUDA graph could record once and replay (opt-in; ``book/api.md``).

A graph replays its kernels with the arguments they had: a Python number baked into a kernel (``lr``,
``1 - lr*wd``, AdamW's step count) stays what it was at capture, nothing can be read back to the host, and a
buffer that moves leaves the graph pointing at freed memory. So, as torch's own capturable optimizers do:

* a group's ``lr``, ``weight_decay``, ``momentum`` and ``betas`` become float64 0-dim tensors on the grid's
  device (``pin_group``; float64 so the step rounds as the Python doubles do: the same bits on a CPU,
  ``tests/test_capturable.py``), written in place by schedulers and users alike (``pinned_write``, called by
  ``contract.LinkedGroup``); step counts live on the device (``DeviceStepCounts``), AdamW's bias corrections too;
* no host read, host-to-device copy or host collective inside ``step()``: ``check_finite="raise"`` and CUDA-event
  timing are refused (``refuse``), the default check is "defer", its vote held on the device and read only
  outside the step (``opt.check_finite_now()``: every step since the last read, replayed ones included,
  ``finite.Record``); every parameter needs a gradient at every step (``need_every_grad``).

Not yet captured on a GPU: the tests check on a CPU and on the meta device that two steps write the same
storages, dispatch the same scalars and read nothing back. AdamW groups run ``updates.adamw_tensor_step_``, not
the fused kernel (which takes betas as host numbers): about 1.5x the default step's bytes on Llama-3-8B's shapes.
"""
from __future__ import annotations

import torch

from .step import StepCounts

PINNED = ("lr", "weight_decay", "momentum", "betas")


class DeviceStepCounts(StepCounts):
    """Step counts on the device (where AdamW's bias corrections are computed): every parameter counts every
    step (each has a gradient: ``need_every_grad``), masked by the step's verdict, so nothing is taken back."""

    def __init__(self, counts: list[list[float]], device=None):
        self.groups = [torch.tensor(c, dtype=torch.float32).to(device) for c in counts]

    def count(self, step) -> None:
        for steps in self.groups:
            steps.add_(1 if step.keep is None else step.keep.to(steps.dtype))

    def uncount(self, step) -> None:
        """A skipped step counted nothing (``count`` is masked)."""

    def numbers(self, g: int) -> list:
        return list(self.groups[g])   # 0-dim device tensors


def pin_group(group: dict, device) -> None:
    """Turn a group's ``lr``, ``weight_decay``, ``momentum`` (Muon) and ``betas`` into float64 0-dim tensors on
    ``device``, in place; a Muon group's ``betas[0]`` is its ``momentum`` tensor. ``group`` is a
    ``contract.LinkedGroup``: from now on a write of these keys fills the tensors (``pinned_write``)."""
    def scalar(value) -> torch.Tensor:
        value = value.detach().reshape(()).item() if isinstance(value, torch.Tensor) else float(value)
        return torch.full((), value, dtype=torch.float64, device=device)

    values = {"lr": scalar(group["lr"]), "weight_decay": scalar(group["weight_decay"])}
    if group["use_muon"]:
        values["momentum"] = scalar(group["momentum"])
    if "betas" in group:
        betas = tuple(group["betas"])
        first = values["momentum"] if group["use_muon"] else scalar(betas[0])
        values["betas"] = (first, *(scalar(b) for b in betas[1:]))
    for key, value in values.items():
        dict.__setitem__(group, key, value)
    group.pinned = True


def pinned_write(group: dict, key: str, value) -> None:
    """Write ``value`` into a pinned group's tensor(s) for ``key`` in place (a scheduler's write, outside the
    step): a number fills, a tensor is copied, a tuple of betas element by element."""
    current = group[key]
    if key == "betas":
        for old, new in zip(current, tuple(value)):
            _fill(old, new)
        return
    _fill(current, value)


def _fill(tensor: torch.Tensor, value) -> None:
    if value is tensor:
        return
    if isinstance(value, torch.Tensor):
        tensor.copy_(value.detach().reshape(()))
    else:
        tensor.fill_(float(value))


def refuse(opt, qk_clip) -> None:
    """What ``capturable=True`` cannot do, refused when the optimizer is built, each with the way out."""
    if opt.check_finite == "raise":
        raise ValueError("capturable=True cannot use check_finite='raise' (or True): raising is a decision the host makes "
                         "after reading the gradients' verdict, and a captured step cannot read anything back. Use "
                         "check_finite='defer' (the verdict stays on the device; opt.check_finite_now() reads it "
                         "between steps) or False")
    if getattr(opt.comm, "time_device", False) and torch.device(opt.grid.device).type == "cuda":
        raise ValueError("capturable=True with a Comm that times every collective with CUDA events "
                         "(time_device=True): build the Comm without it")
    if qk_clip is not None:
        raise ValueError("capturable=True does not support qk_clip yet (MuonClip reads its logits' maxima on the host)")


def need_every_grad(name: str, where: str) -> ValueError:
    return ValueError(f"capturable=True updates every parameter at every step (a graph replays a fixed set of "
                      f"kernels), but {name!r} got no gradient on {where}. Zero the gradients with "
                      "zero_grad(set_to_none=False), or keep parameters that get no gradient out of the optimizer")
