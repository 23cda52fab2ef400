"""Hardware profiles: the few fixed numbers that size the group layout's groups by time. Pure, no tensors.

Under ``layout="group"`` a matrix above its fair share of Newton-Schulz work may be orthogonalised by a
group of ranks instead of one owner (``group_flow.py``). Whether a group pays depends on the machine: it
divides the FLOPs, but adds collectives on the link its members share. Without a profile the plan sizes
groups by FLOPs alone (``layouts.assign_owners_and_groups``: contiguous, TP-local windows); with one it
sends each matrix wherever it *finishes* first, an owner or a group of any size, counting the group's
collectives on its link (``layouts.assign_timed``). A profile is a dict of plain numbers:

* ``flops``: matmul FLOP/s of one rank; ``efficiency``: the share of it Newton-Schulz reaches, in (0, 1];
* ``ranks_per_node``: how many consecutive ranks share the fast link (the grid lays ranks out TP-fastest,
  ``grid.py``, so a TP group sits on one node when ``tp <= ranks_per_node``); ``None``: all on one node;
* ``intra`` and ``inter``: (alpha, beta) inside a node and between nodes: seconds per ring hop, bytes/s;
* optionally ``parallel_ranks``: how many ranks of a node compute at ``flops`` at the same time, where
  ranks share a node's cores (CPU ranks: cores // threads per rank); a group with more members than that
  finishes no sooner, it only talks more. ``None`` (the default): every rank has its own device.

Every rank must give the same profile (the optimizer checks it with the rest of the plan), so no rank
measures its own. ``h100()`` is the profile of the public H100 figures below; ``profile(...)`` any other.

    from dmuon import DistributedMuon, hardware
    opt = DistributedMuon(groups, grid, layout="group", hw=hardware.h100())
    opt = DistributedMuon(groups, grid, layout="group", hw=hardware.profile(   # your cluster's figures
        flops=..., efficiency=0.5, ranks_per_node=8, intra=(alpha, beta), inter=(alpha, beta)))
"""
from __future__ import annotations

import json
import math
from pathlib import Path

# An H100 cluster, as ASSUMPTIONS taken from public figures, not measured here (``scripts/plan_at_scale.py``
# and chapter 14 project with them):
# - bf16 dense matmul: 989 TFLOP/s peak (NVIDIA H100 SXM datasheet, nvidia.com/en-us/data-center/h100: 1,979 "with
#   sparsity", half that dense); Newton-Schulz is charged at ``efficiency`` of it (assumed 50%: large GEMMs reach
#   more, the small m x m iterations and the expert matrices less).
# - NVLink 4 inside a node of 8: 900 GB/s per GPU both ways together (same datasheet), so 450 GB/s one way;
#   latency per ring hop assumed 3 us.
# - InfiniBand between nodes: one 400 Gb/s NDR ConnectX-7 per GPU (DGX H100 user guide), 50 GB/s one way;
#   latency per ring hop assumed 5 us.
H100 = dict(flops=989e12, efficiency=0.5, gpus_per_node=8, nvlink=(3e-6, 450e9), infiniband=(5e-6, 50e9))

HW_KEYS = ("flops", "efficiency", "ranks_per_node", "intra", "inter")


def profile(flops: float, efficiency: float, ranks_per_node: int | None, intra: tuple[float, float],
            inter: tuple[float, float], parallel_ranks: int | None = None) -> dict:
    """A checked profile from its numbers (see the module docstring)."""
    return check_hw(dict(flops=flops, efficiency=efficiency, ranks_per_node=ranks_per_node, intra=intra,
                         inter=inter, parallel_ranks=parallel_ranks))


def node_profile(figures: dict) -> dict:
    """The profile of a cluster given as ``H100`` is (``gpus_per_node``, ``nvlink``, ``infiniband``)."""
    return profile(figures["flops"], figures["efficiency"], figures["gpus_per_node"], figures["nvlink"],
                   figures["infiniband"])


def h100() -> dict:
    """The profile of ``H100``: NVLink inside a node of 8, InfiniBand between nodes."""
    return node_profile(H100)


def load(spec: str) -> dict:
    """A profile named on a command line (``train.py --hw``): ``"h100"``, or a JSON file holding the five
    keys (``{"flops": 4e14, "efficiency": 0.5, "ranks_per_node": 8, "intra": [3e-6, 2e11], ...}``)."""
    if spec.lower() == "h100":
        return h100()
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--hw takes 'h100' or a JSON file with {HW_KEYS}; {spec!r} is neither")
    try:
        hw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{spec}: not JSON ({e})") from None
    return check_hw(hw)


def check_hw(hw: dict) -> dict:
    """``hw``'s five keys and ``parallel_ranks`` (None if absent), checked, with its links as tuples (other
    keys, such as the time model's names, are left out: they do not change the plan). Raises ValueError
    naming the key that is missing or wrong."""
    if not isinstance(hw, dict):
        raise ValueError(f"hw must be a dict with {HW_KEYS} (dmuon.hardware.profile(...) or .h100()), "
                         f"got {type(hw).__name__}")
    missing = [k for k in HW_KEYS if k not in hw]
    if missing:
        raise ValueError(f"hardware profile lacks {missing}: give every one of {HW_KEYS} (dmuon.hardware)")
    out = {k: hw[k] for k in HW_KEYS}
    out["parallel_ranks"] = hw.get("parallel_ranks")
    if not _positive(out["flops"]):
        raise ValueError(f"hardware profile: flops must be a positive number of FLOP/s, got {out['flops']!r}")
    if not (_positive(out["efficiency"]) and out["efficiency"] <= 1):
        raise ValueError(f"hardware profile: efficiency must be in (0, 1], got {out['efficiency']!r}")
    for key in ("ranks_per_node", "parallel_ranks"):
        n = out[key]
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"hardware profile: {key} must be a positive int or None, got {n!r}")
    for link in ("intra", "inter"):
        value = out[link]
        if (not isinstance(value, (tuple, list)) or len(value) != 2 or not _number(value[0]) or value[0] < 0
                or not _positive(value[1])):
            raise ValueError(f"hardware profile: {link} must be (alpha seconds >= 0, beta bytes/s > 0), "
                             f"got {value!r}")
        out[link] = (float(value[0]), float(value[1]))
    return out


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _positive(x) -> bool:
    return _number(x) and x > 0
