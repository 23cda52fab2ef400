"""Shared helpers: where the repository is, and how to run its scripts the way a user would."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS))

# Small shapes that divide unevenly by every DP size tested (so buckets need padding and matrices
# straddle shard boundaries) while their TP split dims divide by 1, 2 and 4.
ODD_SHAPES = "36x57,45x28,33x17,20x44,8x12"
ODD_TP_DIMS = "0,1,none,1,0"


def run(cmd: list[str], timeout: float = 240, tag: str | None = None) -> subprocess.CompletedProcess:
    """Run a command from the repository root with a unique tag in its environment."""
    env = dict(os.environ, DMUON_TEST_TAG=tag or uuid.uuid4().hex, PYTHONUNBUFFERED="1")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def script(name: str, *args: str, **kw) -> subprocess.CompletedProcess:
    return run([sys.executable, str(SCRIPTS / name), *args], **kw)


def last_json(out: str) -> dict:
    """The last line of ``out`` that is a JSON object."""
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in output:\n{out[-3000:]}")


def processes_with_tag(tag: str) -> list[int]:
    """PIDs of live processes whose environment carries ``DMUON_TEST_TAG=tag``."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if f"DMUON_TEST_TAG={tag}".encode() in (d / "environ").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


@pytest.fixture
def tag():
    return uuid.uuid4().hex
