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
measures its own. ``h100()`` is the profile of ``H100_TABLE`` below (the book's one hardware table: public
H100 figures and the project's one-GPU record, each with its source); ``profile(...)`` any other.

    from muongrid import DistributedMuon, hardware
    opt = DistributedMuon(groups, grid, layout="group", hw=hardware.h100())
    opt = DistributedMuon(groups, grid, layout="group", hw=hardware.profile(   # your cluster's figures
        flops=..., efficiency=0.5, ranks_per_node=8, intra=(alpha, beta), inter=(alpha, beta)))
"""
from __future__ import annotations

import json
import math
import numbers
from pathlib import Path

# THE hardware table: one H100 cluster, every figure with its kind and source. Every page that prices time reads
# it (the plans' group sizing, the optimizer time model, the whole training step, chapters 6, 13, 15 and the GPU
# page), so no chapter types a link speed or a FLOP rate of its own. Three kinds of figure:
# - "datasheet": NVIDIA's published figures (H100 SXM datasheet, nvidia.com/en-us/data-center/h100; DGX H100 user
#   guide for the network);
# - "measured": the project's one-GPU record (one H100 80GB HBM3, torch 2.11.0+cu130, 2026-11-26, commit 7b306af,
#   ``book/data/gpu_h100_2026-11-26.json`` with its commands; ``tests/test_hardware_table.py`` holds these
#   figures to that file);
# - "assumed": what nothing here measured (a multi-GPU link's latency, and Newton-Schulz's share of the peak,
#   kept below every rate the record measured, so that a modelled Muon step errs long).
H100_TABLE = {
    "peak_bf16": (989e12, "FLOP/s", "datasheet", "dense bf16 peak (1,979 'with sparsity', half that dense)"),
    "matmul_bf16": (774.87e12, "FLOP/s", "measured", "bf16 matmul 8192 x 8192 x 8192, fastest of 5"),
    "ns5_4096": (670.65e12, "FLOP/s", "measured", "NS5 on one 4096 x 4096 matrix (scripts/ns_speed.py), fastest of 7"),
    "ns_in_step": (573.7e12, "FLOP/s", "measured",
                   "Newton-Schulz inside the optimizer step on Llama-3.2-1B shapes (torch profiler, 2 steps)"),
    "ns_efficiency": (0.5, "of peak", "assumed",
                      "Newton-Schulz charged at half the datasheet peak: below all three rates above"),
    "model_flops": (363.65e12, "FLOP/s", "measured", "forward + backward of a 1.2B Llama, 16,384 tokens, "
                    "bf16 autocast: (6 N T + attention FLOPs) / time, 47% of the measured matmul rate"),
    "hbm": (3.35e12, "bytes/s", "datasheet", "HBM3 bandwidth"),
    "elementwise": (2.556e12, "bytes/s", "measured", "fused AdamW over 1,235,779,584 fp32 parameters (28 bytes "
                    "each) in 13.54 ms"),
    "nvlink": ((3e-6, 450e9), "(s, bytes/s)", "datasheet, latency assumed",
               "NVLink 4 inside a node: 900 GB/s per GPU both ways together, 450 one way; 3 us a ring hop"),
    "infiniband": ((5e-6, 50e9), "(s, bytes/s)", "datasheet, latency assumed",
                   "one 400 Gb/s NDR ConnectX-7 per GPU between nodes, 50 GB/s one way; 5 us a ring hop"),
    "gpus_per_node": (8, "GPUs", "datasheet", "a DGX H100 node"),
}


def figure(key: str):
    """The value of one row of ``H100_TABLE``."""
    return H100_TABLE[key][0]


# The plans' and the optimizer time model's cluster, from the table above (``plan_at_scale.py`` and chapters 13
# and 14 project with it; ``h100()`` is its profile).
H100 = dict(flops=figure("peak_bf16"), efficiency=figure("ns_efficiency"), gpus_per_node=figure("gpus_per_node"),
            nvlink=figure("nvlink"), infiniband=figure("infiniband"))

HW_KEYS = ("flops", "efficiency", "ranks_per_node", "intra", "inter")
OPTIONAL_KEYS = ("parallel_ranks", "name")


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
    """A profile named on a command line (``--hw``): ``"h100"``, or a JSON file holding the five keys and
    optionally ``parallel_ranks`` (``{"flops": 4e14, "efficiency": 0.5, "ranks_per_node": 8, "intra": [3e-6,
    2e11], ...}``; a key it does not know is refused, so that a misspelt one cannot pass unseen)."""
    if spec.lower() == "h100":
        return h100()
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--hw takes 'h100' or a JSON file with {HW_KEYS} (and optionally parallel_ranks); "
                         f"{spec!r} is neither")
    try:
        hw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{spec}: not a JSON hardware profile ({e})") from None
    unknown = sorted(set(hw) - set(HW_KEYS) - set(OPTIONAL_KEYS)) if isinstance(hw, dict) else []
    if unknown:
        raise ValueError(f"{spec}: unknown keys {unknown}; a profile has {HW_KEYS} and optionally {OPTIONAL_KEYS}")
    return check_hw(hw)


def check_hw(hw: dict) -> dict:
    """``hw``'s five keys and ``parallel_ranks`` (None if absent), checked, as plain floats and ints with its
    links as tuples (other keys, such as the time model's names, are left out: they do not change the plan).
    Raises ValueError naming the key that is missing or wrong."""
    if not isinstance(hw, dict):
        raise ValueError(f"hw must be a dict with {HW_KEYS} (muongrid.hardware.profile(...) or .h100()), "
                         f"got {type(hw).__name__}")
    if hw.get("shared_cores"):
        raise ValueError("this profile's flops is a whole machine's, shared by its ranks (shared_cores: the time "
                         "model's CPU profile); to size groups give one rank's rate and parallel_ranks "
                         "(muongrid.hardware.profile, or lab.timemodel.plan_profile)")
    missing = [k for k in HW_KEYS if k not in hw]
    if missing:
        raise ValueError(f"hardware profile lacks {missing}: give every one of {HW_KEYS} (muongrid.hardware)")
    out = dict(flops=_real(hw, "flops", "a positive number of FLOP/s", lambda x: x > 0),
               efficiency=_real(hw, "efficiency", "in (0, 1]", lambda x: 0 < x <= 1))
    for key in ("ranks_per_node", "parallel_ranks"):
        n = hw.get(key)
        if n is not None and (isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1):
            raise ValueError(f"hardware profile: {key} must be a positive int or None, got {n!r}")
        out[key] = None if n is None else int(n)
    if out["ranks_per_node"] and out["parallel_ranks"] and out["parallel_ranks"] > out["ranks_per_node"]:
        raise ValueError(f"hardware profile: parallel_ranks ({out['parallel_ranks']}) counts ranks of one node, so it "
                         f"cannot exceed ranks_per_node ({out['ranks_per_node']})")
    for link in ("intra", "inter"):
        value = hw[link]
        pair = tuple(_as_float(x) for x in value) if isinstance(value, (tuple, list)) else ()
        if len(pair) != 2 or None in pair or pair[0] < 0 or not pair[1] > 0:
            raise ValueError(f"hardware profile: {link} must be (alpha seconds >= 0, beta bytes/s > 0), "
                             f"got {value!r}")
        out[link] = pair
    return {k: out[k] for k in (*HW_KEYS, "parallel_ranks")}


def _as_float(x) -> float | None:
    """``x`` as a finite float, or None (bools, strings, NaN, infinities and overflowing integers)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return None
    try:
        value = float(x)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _real(hw: dict, key: str, what: str, ok) -> float:
    value = _as_float(hw[key])
    if value is None or not ok(value):
        raise ValueError(f"hardware profile: {key} must be {what}, got {hw[key]!r}")
    return value
