"""Shared helpers: where the repository is, and how to run its scripts the way a user would."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

# Before anything imports torch (OpenMP reads it when it loads): this process and every one the tests
# start. booktools.nbexec.quiet_openmp says why; importing it here would import torch first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


from muongrid.lab.faultcheck import processes_with_tag  # noqa: F401  (a run's leftover processes)
from booktools import warmstart  # noqa: E402
from muongrid.lab.notebook import last_json  # noqa: F401  (the tests read scripts' JSON lines as the book does)

# Small shapes that divide unevenly by every DP size tested (so buckets need padding and matrices
# straddle shard boundaries) while their TP split dims divide by 1, 2 and 4.
ODD_SHAPES = "36x57,45x28,33x17,20x44,8x12"
ODD_TP_DIMS = "0,1,none,1,0"


# A script run here is forked from a Python that has imported torch already, as the chapters' are
# (booktools.warmstart: seconds of the suite's CPU per run, on two cores shared with the chapters).
_WARM = warmstart.WarmStarter(sys.executable, str(SCRIPTS)) if warmstart.enabled() else None


def run(cmd: list[str], timeout: float = 240, tag: str | None = None) -> subprocess.CompletedProcess:
    """Run a command from the repository root with a unique tag in its environment. A Python script
    without a ``tag`` asked for is forked by the warm start server; a tagged run gets an interpreter of
    its own, since ``processes_with_tag`` finds a run's processes by the environment they were
    exec'd with, which a forked process does not have."""
    env = dict(os.environ, MUONGRID_TEST_TAG=tag or uuid.uuid4().hex, PYTHONUNBUFFERED="1")
    if _WARM and tag is None and len(cmd) > 1 and cmd[0] == sys.executable and cmd[1].endswith(".py"):
        proc = _WARM.start(cmd[1:], str(ROOT), env, stderr_apart=True)
        if proc is not None:
            out, err = proc.communicate(timeout)
            return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def script(name: str, *args: str, **kw) -> subprocess.CompletedProcess:
    return run([sys.executable, str(SCRIPTS / name), *args], **kw)


def refused(main, *argv) -> str:
    """What a script's ``main(argv)`` prints as it refuses its arguments (argparse's exit code 2), run in this
    process: a check that fails before anything launches is the same code without an interpreter of its own
    (starting one and importing torch costs seconds of the suite's time per call)."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main([str(a) for a in argv])
    assert exit_.value.code == 2, (exit_.value.code, err.getvalue()[-2000:])
    return err.getvalue()


@pytest.fixture
def tag():
    return uuid.uuid4().hex


# ---- the suites: every test file in exactly one, by what its tests need (tests/test_house.py checks it) ----

SUITES = ("unit", "distributed", "book", "browser")
_BY_SUITE = {
    # one process, nothing launched, no chapter executed (the meta device and fake process groups included)
    "unit": "choice engine_floor exchanges fast_plan group_rows guard hardware_table house layout_explorer math "
            "meta_device ns_variants optim_api oracle plan plan_at_scale plan_ep precision record_gpu rivals routes "
            "routing step_cost step_vote timemodel wholestep muonshare tp_host_work "
            "store_buffers capturable old_checkpoint zero_cost mystmd shard_ortho replay",
    # launches processes: gloo ranks, the entry points, a wheel in a fresh environment, the warm-start server
    "distributed": "agree checkpoint contract ddp distributed exactness_gap expert_parallel failures finite_modes "
                   "hf_trainer from_scratch fsdp group_layout hf_models loops measure ns_group package qk_clip "
                   "readme_loop resume study train warmstart grad_landing step_explorer trainers "
                   "iteration_bench backward_reduce",
    # the book: its chapters executed or read, its prose, its build
    "book": "api_page book book_links claims colab edition from_scratch_page nbexec notebook_outputs notebooks palette "
            "readability",
    # a headless browser on the built pages
    "browser": "browser",
}
SUITE_OF = {f"test_{name}": suite for suite, names in _BY_SUITE.items() for name in names.split()}


def pytest_itemcollected(item):
    """Mark each test with its file's suite (``-m unit``, ``-m "not book and not browser"``)."""
    suite = SUITE_OF.get(Path(str(item.fspath)).stem)
    if suite is not None:
        item.add_marker(suite)


# ---- the built book, shared by the book and browser tests ---------------------------------------

from booktools import bookbuild  # noqa: E402

BUILD = bookbuild.BUILD


def execute_notebook(nb, timeout: float = 300):
    """Run ``nb`` in notebooks/ with the guarded client the book build uses, in place."""
    from booktools.nbexec import GuardedClient

    GuardedClient(nb, label="test notebook", timeout=timeout,
                  resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    return nb


def executed_notebook(name: str) -> Path:
    """Chapter ``name`` executed as ``make book`` executes it, at most once per test session. A copy
    that ``make book`` (or an earlier session) left in ``_build/executed/`` is reused only if its
    inputs (the chapter, scripts/, book/data/, requirements.txt) are byte for byte unchanged."""
    _wait_for_chapter(name)
    return bookbuild.executed(name)[0]  # a chapter the background run failed on runs here, and fails here


# ---- the chapters execute in the background while the other tests run ----------------------------
# Executing the chapters is half the suite's time, and a chapter leaves a core idle much of it (its
# kernel waits for the scripts it launches, which wait for their ranks' collectives). So the session
# starts `scripts/build_book.py --only <chapters>` at once, in its own process group, and runs the
# tests that read executed chapters (`_reads_chapters`) last: first those that read single chapters,
# each waiting only until its chapter is executed and fingerprinted (`executed_notebook` then reuses
# it), then those that read the whole book. The chapters are every stale one if a selected test uses
# `built_book`, else those named in the selected tests' ids. MUONGRID_TEST_CHAPTERS=inline executes them
# in the test process instead, when the first test needs one (the old order).

_background: dict = {}


def _reads_chapters(item) -> bool:
    """Whether a test reads executed chapters: it uses `built_book` or calls `executed_notebook`."""
    import inspect

    if "built_book" in getattr(item, "fixturenames", ()):
        return True
    function = getattr(item, "function", None)
    return function is not None and "executed_notebook(" in inspect.getsource(function)


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected what will not run
def pytest_collection_modifyitems(session, config, items):
    readers = [i for i in items if _reads_chapters(i)]
    whole = [i for i in readers if "built_book" in getattr(i, "fixturenames", ())]
    # Those that read single chapters first: each waits only for its own, while later ones execute.
    items[:] = [i for i in items if not _reads_chapters(i)] + [i for i in readers if i not in whole] + whole
    everything = bool(whole)
    wanted = [s for s in bookbuild.toc_chapters() if everything or any(s in i.nodeid for i in readers)]
    stale = [s for s in wanted if not bookbuild.is_fresh(s)]
    if stale and not config.option.collectonly and os.environ.get("MUONGRID_TEST_CHAPTERS", "background") == "background":
        log = BUILD / "test-chapters.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        _background["log"] = log
        _background["proc"] = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "build_book.py"), "--only", ",".join(stale)], cwd=ROOT,
            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_chapter(name: str) -> None:
    """Until chapter ``name`` is executed and fingerprinted (``bookbuild`` writes the fingerprint after the
    notebook), or the background run has ended: a test that reads an early chapter need not wait for the
    last one."""
    import time

    proc = _background.get("proc")
    while proc is not None and proc.poll() is None and not bookbuild.is_fresh(name):
        time.sleep(1.0)
    if proc is not None and proc.poll() is not None:
        _wait_for_background_chapters()


def _wait_for_background_chapters() -> None:
    proc = _background.pop("proc", None)
    if proc is not None and proc.wait() != 0:  # the failing chapter executes again in this process
        print(f"[conftest] the background chapter run failed; its log: {_background['log']}", file=sys.stderr)


def pytest_sessionfinish(session, exitstatus):
    if _WARM is not None:
        _WARM.close()
    proc = _background.pop("proc", None)
    if proc is not None and proc.poll() is None:  # the session ended early (-x, ^C): stop it and its kernels
        import signal
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def stage_book(dest: Path, toc: str | None = None) -> Path:
    """A source tree in ``dest`` with every chapter of ``toc`` executed (execution off)."""
    stems = bookbuild.toc_chapters(toc)
    for stem in stems:
        executed_notebook(stem)
    return bookbuild.stage(dest, stems, toc=toc)


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> Path:
    """The whole book, built from the executed chapters; returns its html folder."""
    import shutil

    src = stage_book(tmp_path_factory.mktemp("book"))
    proc = bookbuild.render(src, offline="require")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    html = src / "_build" / "html"
    shutil.rmtree(BUILD / "html-tested", ignore_errors=True)
    shutil.copytree(html, BUILD / "html-tested")  # kept as an artifact beside the screenshots
    return html


@pytest.fixture(scope="session")
def book_edition(built_book, tmp_path_factory) -> Path:
    """The notebook edition, written as ``make book`` writes it: from the executed chapters, its links checked
    against the built book, its notebooks made the pages' downloads. Returns its folder (``notebooks/`` inside)."""
    from booktools import edition

    out = tmp_path_factory.mktemp("colab")
    edition.Edition(built_book).write(bookbuild.toc_chapters(), bookbuild.EXECUTED, out)
    edition.install(built_book, out)
    return out
