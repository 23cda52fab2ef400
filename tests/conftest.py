"""Shared helpers: where the repository is, and how to run its scripts the way a user would."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


from dmuon.lab.faultcheck import processes_with_tag  # noqa: F401  (a run's leftover processes)
from dmuon.lab.notebook import last_json  # noqa: F401  (the tests read scripts' JSON lines as the book does)

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


@pytest.fixture
def tag():
    return uuid.uuid4().hex


# ---- the built book, shared by the book and browser tests ---------------------------------------

BUILD = ROOT / "_build"


_EXECUTED: dict[str, Path] = {}


def execute_notebook(nb, timeout: float = 900):
    """Run ``nb`` with nbclient in notebooks/ (inside the checkout whose scripts the chapters launch), in place."""
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    return nb


def executed_notebook(name: str) -> Path:
    """Execute chapter ``name`` with nbclient (in notebooks/), once per test session, and return the
    executed copy in ``_build/executed/``. Copies from earlier sessions are never reused: they may
    predate a change in scripts/."""
    import nbformat

    if name not in _EXECUTED:
        nb = execute_notebook(nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4))
        out = BUILD / "executed" / f"{name}.ipynb"
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out)
        _EXECUTED[name] = out
    return _EXECUTED[name]


def stage_book(dest: Path, toc: str | None = None, executed: bool = True) -> Path:
    """Copy what the book needs into ``dest``; with ``executed``, the chapters are the executed .ipynb
    and execution is off, so the build only renders (the chapters already ran in test_notebooks)."""
    import shutil

    from dmuon.lab.notebook import chapters

    shutil.copytree(ROOT / "book", dest / "book", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "notebooks").mkdir()
    config = (ROOT / "_config.yml").read_text()
    if executed:
        for path in chapters():
            shutil.copy(executed_notebook(path.stem), dest / "notebooks" / f"{path.stem}.ipynb")
        config = config.replace("execute_notebooks: force", 'execute_notebooks: "off"')
        config = config.replace('"notebooks/*.ipynb"', '"notebooks/*.py"')
    else:
        shutil.copytree(ROOT / "scripts", dest / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
        for path in chapters():
            shutil.copy(path, dest / "notebooks")
    (dest / "_config.yml").write_text(config)
    (dest / "_toc.yml").write_text(toc or (ROOT / "_toc.yml").read_text())
    return dest


def build_book(src: Path, timeout: float = 1200) -> subprocess.CompletedProcess:
    env = dict(os.environ, DMUON_OFFLINE="require")
    return subprocess.run([str(Path(sys.executable).parent / "jupyter-book"), "build", str(src), "--warningiserror", "--nitpick",
                           "--keep-going"], cwd=src, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> Path:
    """The whole book, built from the executed chapters; returns its html folder."""
    src = stage_book(tmp_path_factory.mktemp("book"))
    proc = build_book(src)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    html = src / "_build" / "html"
    import shutil
    shutil.rmtree(BUILD / "html-tested", ignore_errors=True)
    shutil.copytree(html, BUILD / "html-tested")  # kept as an artifact beside the screenshots
    return html
