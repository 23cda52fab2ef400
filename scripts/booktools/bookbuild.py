"""Build the book: execute each chapter once (guarded against stalls), then render with execution off.

``make book`` runs ``python scripts/build_book.py``; the test suite uses the same functions, so a
chapter executed by one is reused by the other when nothing it depends on has changed.

Why not let ``jupyter-book build`` execute the chapters itself: its executor (myst-nb through
nbclient) waits on ZeroMQ sockets in a way that can stall for a whole cell timeout
(``booktools.nbexec`` explains and works around it), and it cannot report time per chapter.

The flow:
1. ``executed(stem)``: run ``notebooks/<stem>.ipynb`` in ``notebooks/`` with ``nbexec`` and keep the
   result in ``_build/executed/<stem>.ipynb`` beside a fingerprint of its inputs (the chapter, every
   file under ``scripts/`` and ``book/data/``, ``requirements.txt``). A copy whose fingerprint matches
   is reused; any change re-executes.
2. ``stage(dest)``: a copy of ``book/``, the executed chapters as ``notebooks/*.ipynb`` and
   ``_config.yml`` with execution off.
3. ``render(dest)``: ``jupyter-book build`` with ``-W -n --keep-going``.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from muongrid.lab.notebook import ROOT
from muongrid.lab.roadmap import toc_chapters, toc_files  # noqa: F401  (the build's pages; read by tests too)

from .nbexec import Report, execute_chapter

BUILD = ROOT / "_build"
EXECUTED = BUILD / "executed"


def _digest(paths) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p.relative_to(ROOT)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


# What reads the executed chapters after they ran and never runs inside one: a change here writes the
# notebook edition again without executing a chapter again.
AFTER_THE_RUN = {"scripts/booktools/edition.py", "scripts/booktools/mystmd.py"}


def fingerprint(stem: str) -> str:
    """What a chapter's executed copy depends on: itself, the code it runs, the data it reads."""
    shared = [p for folder in ("scripts", "book/data") for p in (ROOT / folder).rglob("*")
              if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)
              and str(p.relative_to(ROOT)) not in AFTER_THE_RUN]
    return _digest([ROOT / "notebooks" / f"{stem}.ipynb", ROOT / "requirements.txt", *shared])


def is_fresh(stem: str) -> bool:
    """Whether chapter ``stem`` has an executed copy whose inputs are unchanged."""
    stamp = EXECUTED / f"{stem}.fingerprint"
    return (EXECUTED / f"{stem}.ipynb").exists() and stamp.exists() and stamp.read_text() == fingerprint(stem)


def executed(stem: str, force: bool = False) -> tuple[Path, Report | None]:
    """The executed copy of chapter ``stem``: reused if its inputs are unchanged, else executed now.
    Returns its path and the execution report (None when reused)."""
    import nbformat

    out, stamp = EXECUTED / f"{stem}.ipynb", EXECUTED / f"{stem}.fingerprint"
    if not force and is_fresh(stem):
        return out, None
    want = fingerprint(stem)
    run = run_record()  # before the run: what it ran is the checkout as it is now
    nb, report = execute_chapter(ROOT / "notebooks" / f"{stem}.ipynb", cwd=ROOT / "notebooks")
    nb.metadata.setdefault("muongrid", {})["run"] = dict(run, seconds=round(report.seconds, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    nbformat.write(nb, out)
    stamp.write_text(want)
    return out, report


def run_record() -> dict:
    """What made a chapter's outputs (kept in the executed copy, shown by the notebook edition): the commit,
    whether the inputs the fingerprint covers differed from it, the versions and the machine, the time."""
    import datetime
    import platform
    from importlib import metadata

    from muongrid.lab.provenance import cpu_model

    def git(*args):
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else None

    changed = git("status", "--porcelain", "--", "notebooks", "scripts", "book/data", "requirements.txt")
    return dict(commit=git("rev-parse", "HEAD"), uncommitted_changes=bool(changed) if changed is not None else None,
                torch=metadata.version("torch"), python=platform.python_version(), cpu=cpu_model(),
                cores=os.cpu_count(), platform=sys.platform,
                executed_at=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))


def stage(dest: Path, stems: list[str], toc: str | None = None) -> Path:
    """A source tree in ``dest`` whose chapters are the executed copies (execution off)."""
    shutil.copytree(ROOT / "book", dest / "book", ignore=shutil.ignore_patterns("__pycache__"))
    # The claims appendix's directive imports muongrid from here when it is not installed
    # (book/_ext/claims.py); _config.yml excludes scripts/ from the pages.
    shutil.copytree(ROOT / "scripts", dest / "scripts", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (dest / "notebooks").mkdir()
    for stem in stems:
        shutil.copy(EXECUTED / f"{stem}.ipynb", dest / "notebooks" / f"{stem}.ipynb")
    config = (ROOT / "_config.yml").read_text()
    config = config.replace("execute_notebooks: force", 'execute_notebooks: "off"')
    config = config.replace('"notebooks/*.ipynb"', '"notebooks/*.py"')
    (dest / "_config.yml").write_text(config)
    (dest / "_toc.yml").write_text(toc or (ROOT / "_toc.yml").read_text())
    return dest


def render(src: Path, timeout: float = 1200, offline: str | None = None) -> subprocess.CompletedProcess:
    """``jupyter-book build src`` with every warning an error; output in ``src/_build/html``."""
    env = dict(os.environ, **({"MUONGRID_OFFLINE": offline} if offline else {}))
    jb = Path(sys.executable).parent / "jupyter-book"
    return subprocess.run([str(jb), "build", str(src), "--warningiserror", "--nitpick", "--keep-going"],
                          cwd=src, env=env, capture_output=True, text=True, timeout=timeout)
