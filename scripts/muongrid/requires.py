"""Which torch muongrid needs, checked the moment ``import muongrid`` runs, before anything else is imported.

    python -c "import muongrid"    # on too old a torch: one ImportError naming the version and the missing APIs

The minimum is the lowest torch this project has run its distributed tests on, not the lowest that
happens to import: the engine uses the public ``torch.distributed.tensor`` (DTensor, for TP models),
FSDP2's public ``torch.distributed.fsdp.fully_shard`` (``FSDPMuon``, train.py --fsdp) and the tests
and the book compare against ``torch.optim.Muon``, which arrived last, in 2.9. How the tested
versions were checked is in CHANGELOG.md (0.3.0). Without this check an older torch would fail deep
inside an import with a message about some private module.
"""
from __future__ import annotations

import importlib
import re

MIN_TORCH = (2, 9)
TESTED_TORCH = ("2.9.0", "2.13.0")  # the releases the distributed tests ran on (CHANGELOG.md, 0.3.0)

# (module, attribute, the torch release that made it public): what muongrid and its checks rely on.
APIS = (
    ("torch.distributed", "init_process_group", "(any release built with distributed support)"),
    ("torch.distributed.tensor", "DTensor", "2.5"),
    ("torch.distributed.fsdp", "fully_shard", "2.6"),
    ("torch.optim", "Muon", "2.9"),
)


def torch_release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string ("2.13.0+cpu", "2.10.0a0+git1234", "2.9.0.dev20250801"),
    or None when it does not start with two numbers."""
    found = re.match(r"\s*(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def missing_apis(import_missing: bool = True) -> list[str]:
    """The APIs of ``APIS`` this torch lacks, each with the release that introduced it. A module not yet
    imported is imported to look only with ``import_missing``: on a release new enough to have them all,
    importing DTensor and FSDP here would cost every process about a second of CPU for nothing."""
    import sys

    missing = []
    for module, name, since in APIS:
        if module not in sys.modules and not import_missing:
            continue
        try:
            present = hasattr(importlib.import_module(module), name)
        except ImportError:
            present = False
        if not present:
            missing.append(f"{module}.{name} (torch {since})" if since[0].isdigit() else f"{module} {since}")
    return missing


def check_torch() -> None:
    """Raise ImportError, naming the torch needed and what is missing, unless this torch is new enough."""
    import torch

    version = str(torch.__version__)
    release = torch_release(version)
    missing = missing_apis(import_missing=release is None or release < MIN_TORCH)
    too_old = release is not None and release < MIN_TORCH
    if not too_old and not missing:
        return
    need = ".".join(map(str, MIN_TORCH))
    lines = [f"muongrid needs torch >= {need} (its distributed tests ran on torch {', '.join(TESTED_TORCH)}); "
             f"this is torch {version}, imported from {getattr(torch, '__file__', '?')}."]
    if missing:
        lines.append("This torch lacks: " + "; ".join(missing) + ".")
    lines.append(f"Install a newer one, e.g. pip install 'torch>={need}' (on a GPU cluster, the build that matches "
                 "its CUDA), in the environment that runs muongrid.")
    raise ImportError(" ".join(lines))
