"""Where a recorded result came from: the command, the code's commit, the versions and the machine.

Results that the book cites but does not recompute on every build (a 20-repeat benchmark, a
convergence study) are saved as data files with this record, so a reader can see what produced
each number and run it again.

    record = dict(provenance(sys.argv), results=...)
"""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path



def repository_root() -> Path:
    """The checkout the book runs from: the nearest folder at or above the working directory that has
    ``scripts/verify.py`` (a chapter runs in ``notebooks/``, a script in the root), else the one this
    file sits in (an editable install). Colab installs the package from its clone as a copy, so only
    the working directory leads back to the clone there."""
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / "scripts" / "verify.py").is_file():
            return folder
    return Path(__file__).resolve().parents[3]


ROOT = repository_root()


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(argv: list[str]) -> dict:
    """The command (relative to the checkout), commit (and whether ``scripts/``, the code that runs, had
    uncommitted changes: edits to chapters or to other data files do not count), versions, machine, time."""
    import torch

    script = Path(argv[0]).resolve()
    shown = str(script.relative_to(ROOT)) if script.is_relative_to(ROOT) else argv[0]
    return dict(command=" ".join(["python", shown, *argv[1:]]), commit=_git("rev-parse", "HEAD"),
                uncommitted_changes=bool(_git("status", "--porcelain", "--untracked-files=no", "--", "scripts")),
                torch=torch.__version__, python=platform.python_version(), cpu=cpu_model(),
                cores=os.cpu_count(), platform=sys.platform,
                recorded_at=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))


def _driver_version(index: int) -> str | None:
    """The NVIDIA driver's version, as ``nvidia-smi`` reports it (torch does not expose it); None without it."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i",
                              str(index)], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def device_provenance(device) -> dict:
    """What a result timed on ``device`` needs beside ``provenance``: the GPU's model and memory, the driver,
    CUDA and NCCL versions. Off a GPU each is None and ``absent`` says why, so a CPU record says it is one."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return dict(gpu=None, gpu_memory_gib=None, gpu_count=0, driver=None, cuda=None, nccl=None,
                    absent=f"no GPU: timed on {device} ({cpu_model()})")
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    nccl = None
    if torch.distributed.is_nccl_available():
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return dict(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                gpu_count=torch.cuda.device_count(), driver=_driver_version(index), cuda=torch.version.cuda,
                nccl=nccl, absent=None)


def provenance_text(record: dict) -> str:
    """Two lines a chapter prints under a recorded result: when, by which command, on what code and machine."""
    load = record.get("load_average_1min")
    if isinstance(load, list):  # before the run, and at its end (its own processes included)
        load = f", load average {load[0]} before the run and {load[1]} at its end"
    else:
        load = "" if load is None else f", load average {load}"
    return (f"recorded {record['recorded_at']} by\n  {record['command']}\n"
            f"at commit {(record['commit'] or 'unknown')[:10]} on {record['cpu']} ({record['cores']} cores{load}), "
            f"torch {record['torch']}" + (f", at priority nice {record['nice']}" if record.get("nice") else "")
            + (" (scripts/ had uncommitted changes)" if record["uncommitted_changes"] else ""))


def load_recorded(name: str) -> dict:
    """A recorded result from ``book/data/`` by file name, with a clear error naming the command that makes it."""
    import json

    path = ROOT / "book" / "data" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: it is a recorded run; 'make record' makes the "
                                "benchmark runs (the Makefile lists their commands)")
    return json.loads(path.read_text())
