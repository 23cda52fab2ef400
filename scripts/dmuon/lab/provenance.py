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

ROOT = Path(__file__).resolve().parents[3]


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
    """The command (relative to the checkout), commit (and whether the tree had changes), versions, machine, time."""
    import torch

    script = Path(argv[0]).resolve()
    shown = str(script.relative_to(ROOT)) if script.is_relative_to(ROOT) else argv[0]
    return dict(command=" ".join(["python", shown, *argv[1:]]), commit=_git("rev-parse", "HEAD"),
                uncommitted_changes=bool(_git("status", "--porcelain", "--untracked-files=no")),
                torch=torch.__version__, python=platform.python_version(), cpu=cpu_model(),
                cores=os.cpu_count(), platform=sys.platform,
                recorded_at=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
