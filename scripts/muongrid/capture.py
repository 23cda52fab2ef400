"""``capturable=True``: a step whose work a CUDA graph could record once and replay (opt-in).

A CUDA graph replays the kernels it recorded with the arguments they had: a Python number baked into a kernel
(``lr``, ``1 - lr*wd``, AdamW's step count) stays what it was at capture, a value read back to the host
(``.item()``, ``.tolist()``, ``bool(t)``) cannot be read at all, and a buffer that moves leaves the graph
pointing at freed memory. With ``capturable=True`` the distributed optimizers keep what changes between steps
on the device, as torch's own capturable optimizers do:

* a group's ``lr``, ``weight_decay``, ``momentum`` and ``betas`` become float64 0-dim tensors on the grid's
  device (float64 so that ``1 - lr*wd``, the scaled lr and AdamW's bias corrections round as the Python doubles
  of the default path did: the two paths take the same step bit for bit on a CPU, ``tests/test_capturable.py``).
  ``torch.optim.lr_scheduler`` writes a tensor lr with ``fill_``; any other write of these keys (a momentum
  scheduler's ``group["betas"] = (m, b2)``, a user's ``group["momentum"] = 0.9``) is turned into a fill of the
  same tensor (``pinned_write``, called by ``contract.LinkedGroup``), so the tensors keep their addresses; in a
  Muon group ``momentum`` and ``betas[0]`` are one tensor. ``eps``, ``nesterov`` and ``ns_steps`` stay numbers:
  fixed for the life of a graph;
* step counts live on the device, counted by a device add (masked by the agreed NaN/Inf verdict under
  ``check_finite="defer"``), and AdamW's bias corrections are computed there;
* no host read, no host-to-device copy and no host collective inside ``step()``: ``check_finite="raise"`` (a host
  decision) is refused, and the default check becomes ``"defer"`` on every device (on a CPU it is "raise"
  otherwise); under ``"defer"`` the step keeps its vote in buffers made once, and the host reads them
  only when asked (``opt.check_finite_now()``, ``state_dict()``), never inside ``step()``: call it between
  replays to learn of a skipped step; timing the collectives with CUDA events (``Comm(time_device=True)``) is
  refused;
* every gradient must be there at every step: a gradient that is None raises ``ValueError`` naming the
  parameter, on the rank that lacks it (a graph replays a fixed set of kernels; deciding on the host which
  parameters to skip is what capturable removes). Zero with ``zero_grad(set_to_none=False)``, which a captured
  backward needs anyway. On several ranks the other ranks then wait in the step's first collective, as for a
  rank that failed.

The step has not been captured on a GPU yet: what is checked (on a CPU and on the meta device) is that two steps
write the same storages, dispatch the same scalar arguments, read nothing back and copy nothing from the host
(``tests/test_capturable.py``). Python-side counters (``steps_taken``, the ledger) do not advance under replay.
AdamW groups run the tensor-valued update (``updates.adamw_tensor_step_``), not torch's fused kernel, which takes
betas and weight decay as host numbers. That costs bytes: counted on the meta device, one rank's step on
Llama-3-8B's shapes (4 layers, where AdamW's two vocabulary matrices hold most of the elements) moves about 1.5x
what the default step moves (207 GiB against 141 GiB on 2026-11-28: ``lab.stepcost.measure`` of both). A fused
kernel that reads its betas from the device would take that back.
"""
from __future__ import annotations

import torch

PINNED = ("lr", "weight_decay", "momentum", "betas")


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
        raise ValueError("capturable=True cannot use check_finite='raise': raising is a decision the host makes "
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
