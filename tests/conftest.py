"""Shared helpers: where the repository is, and how to run its scripts the way a user would."""
from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

# Before anything imports torch (OpenMP reads it when it loads): this process and every one the tests
# start. booktools.nbexec.quiet_openmp says why; importing it here would import torch first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Inductor (tests/test_loops.py's compile) builds its kernels in one process, not in a pool of one per core that
# each import torch: two cores are already busy with the other worker and the chapters, and the pool cost CPU
# (that test with a cold cache, one run each on a shared machine: 59.6 s of CPU with the pool, 52.5 without).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

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
    import fcntl

    _wait_for_chapter(name)
    if bookbuild.is_fresh(name):
        return bookbuild.executed(name)[0]
    # A chapter the background run failed on runs here, and fails here; one worker at a time executes it.
    bookbuild.EXECUTED.mkdir(parents=True, exist_ok=True)
    with open(bookbuild.EXECUTED / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return bookbuild.executed(name)[0]


# ---- the chapters execute in the background while the other tests run ----------------------------
# Executing the chapters is half the suite's time, and a chapter leaves a core idle much of it (its
# kernel waits for the scripts it launches, which wait for their ranks' collectives). So the session
# starts `scripts/build_book.py --only <chapters>` at once, in its own process group, and runs the
# tests that read executed chapters (`_reads_chapters`) last: first those that read single chapters,
# each waiting only until its chapter is executed and fingerprinted (`executed_notebook` then reuses
# it), then those that read the whole book. The chapters are every stale one if a selected test uses
# `built_book`, else those named in the selected tests' ids. MUONGRID_TEST_CHAPTERS=inline executes them
# in the test process instead, when the first test needs one (the old order).
#
# Under pytest-xdist (`make test`: two workers) the run is the controller's, started once for the session:
# each worker collects and orders the same tests and writes the chapters it wants into the session's folder
# (`_session_folder`, handed to the workers in `workerinput`); the controller starts the run when the first
# worker has collected, before any test runs, notes its end in that folder (`_Background`), and stops it if
# the session ends early. A worker's test waits until its chapter is fresh or that end is noted.

_background: dict = {}
_XDIST_KEY = "muongrid_chapters"


def _reads_chapters(item) -> bool:
    """Whether a test reads executed chapters: it uses `built_book` or calls `executed_notebook`."""
    if "built_book" in getattr(item, "fixturenames", ()):
        return True
    function = getattr(item, "function", None)
    return function is not None and "executed_notebook" in _names(function.__code__)


@functools.lru_cache(maxsize=None)
def _names(code) -> frozenset[str]:
    """The global names a function's code (its nested functions' included) refers to: what it may call. Read
    from the code object, not its source (``inspect.getsource`` per test was a third of collecting the suite)."""
    return frozenset(code.co_names).union(*(_names(c) for c in code.co_consts if hasattr(c, "co_names")))


# ``python scripts/build_book.py`` that dies with the process that started it, however that ends (a crash, a
# KeyboardInterrupt in an xdist worker's collection): its kernels then stop themselves (ipykernel watches its
# parent) and its warm-start server dies with it.
_BUILD_BOOK = ("import runpy, sys; sys.path[0] = sys.argv[1]; from booktools.warmstart import _die_with_parent; "
               "_die_with_parent(); sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')")


# Two runs share the chapters (``build_book.py --claims``): a chapter's kernel waits much of its time for the
# ranks it launched, so while one chapter waits the other runs, and the chapters end sooner for the tests that
# read the whole book (they wait for the last). MUONGRID_CHAPTER_RUNS=1 executes them in one run.
_RUNS = int(os.environ.get("MUONGRID_CHAPTER_RUNS", "2"))


class _Background:
    """The background chapter run: ``_RUNS`` processes of ``build_book.py --only <stems> --claims <folder>``,
    each in a process group of its own, their output in ``_build/test-chapters.log`` (-2.log, ...); ``ended``
    (a file) is written with the largest exit status when every one has ended."""

    def __init__(self, stems: list[str], ended: Path | None = None):
        import tempfile
        import threading

        BUILD.mkdir(parents=True, exist_ok=True)
        self.claims = Path(tempfile.mkdtemp(prefix="muongrid-claims-"))
        self.logs = [BUILD / f"test-chapters{'' if n == 0 else f'-{n + 1}'}.log" for n in range(max(1, _RUNS))]
        self.procs = [subprocess.Popen(
            [sys.executable, "-c", _BUILD_BOOK, str(SCRIPTS), str(SCRIPTS / "build_book.py"), "--only",
             ",".join(stems), "--claims", str(self.claims)],
            cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True) for log in self.logs]
        self.log = self.logs[0]

        def note_end():
            code = max(proc.wait() for proc in self.procs)
            self.code = code
            import shutil

            shutil.rmtree(self.claims, ignore_errors=True)
            if ended is not None:
                with contextlib.suppress(OSError):  # the session's folder is gone (the session has ended)
                    ended.write_text(str(code))
        self.code = None
        threading.Thread(target=note_end, daemon=True).start()

    def poll(self) -> int | None:
        """None while a run goes on, else the largest exit status."""
        if any(proc.poll() is None for proc in self.procs):
            return None
        return max(proc.returncode for proc in self.procs)

    def stop(self) -> None:
        """End the runs and their kernels and scripts if they still run (the session ended early: -x, ^C)."""
        import signal

        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def _session_folder(config) -> Path | None:
    """The folder this session's processes share about the background run, when pytest-xdist runs it."""
    if hasattr(config, "workerinput"):
        return Path(config.workerinput[_XDIST_KEY]) if _XDIST_KEY in config.workerinput else None
    return _background.get("folder")


def pytest_configure(config):
    if getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput"):
        import tempfile

        _background["folder"] = Path(tempfile.mkdtemp(prefix="muongrid-chapters-"))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(xdist controller) Each worker learns where the session's background run is noted."""
    node.workerinput[_XDIST_KEY] = str(_background["folder"])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """(xdist controller) The first worker to have collected says which chapters to run: start them now."""
    folder = _background.get("folder")
    wanted = folder / f"wanted-{node.gateway.id}.json" if folder else None
    if "run" in _background or wanted is None or not wanted.exists():
        return
    import json

    stems = json.loads(wanted.read_text())
    if stems:
        _background["run"] = _Background(stems, ended=folder / "ended")
        (folder / "started").write_text(" ".join(stems))


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected what will not run
def pytest_collection_modifyitems(session, config, items):
    readers = [i for i in items if _reads_chapters(i)]
    whole = [i for i in readers if "built_book" in getattr(i, "fixturenames", ())]
    chapters = bookbuild.toc_chapters()

    last = {i.path for i in whole}   # the files that read the built book
    reading = {i.path for i in readers}

    def order(item) -> tuple:
        """Under ``make test``'s ``--dist loadfile`` a file's tests run on one worker, in one process (so its
        module fixtures and cached launches are made once, and its fixed paths under _build/ have one writer),
        and the files are handed out in the order of their first test: the files that read no chapter first,
        then those that read single chapters, then those that read the built book (made once for the session,
        ``built_book``: they run on both workers). In a file, the tests that read chapters come last, in the
        order the chapters execute (each waits only for its own)."""
        in_file = (1, min((n for n, s in enumerate(chapters) if s in item.nodeid), default=len(chapters))) \
            if _reads_chapters(item) else (0,)
        return (2 if item.path in last else 1 if item.path in reading else 0, in_file)

    items.sort(key=order)
    everything = bool(whole)
    wanted = [s for s in chapters if everything or any(s in i.nodeid for i in readers)]
    background = os.environ.get("MUONGRID_TEST_CHAPTERS", "background") == "background"
    stale = [s for s in wanted if not bookbuild.is_fresh(s)] if background else []
    if config.option.collectonly:
        return
    folder = _session_folder(config)
    if hasattr(config, "workerinput"):  # the controller starts the run (pytest_xdist_node_collection_finished)
        if folder is not None:
            import json

            (folder / f"wanted-{config.workerinput['workerid']}.json").write_text(json.dumps(stale))
    elif stale:
        _background["run"] = _Background(stale)


def _background_running(config) -> bool:
    """Whether this session's background chapter run has been started and has not ended."""
    run = _background.get("run")
    if run is not None:
        return run.poll() is None
    folder = _session_folder(config)
    return folder is not None and (folder / "started").exists() and not (folder / "ended").exists()


def _wait_for_chapter(name: str) -> None:
    """Until chapter ``name`` is executed and fingerprinted (``bookbuild`` writes the fingerprint after the
    notebook), or the background run has ended: a test that reads an early chapter need not wait for the
    last one. A run that failed is reported once; its failing chapter then executes in the test's process."""
    import time

    config = _background["config"]
    while _background_running(config) and not bookbuild.is_fresh(name):
        time.sleep(1.0)
    if not bookbuild.is_fresh(name) and not _background.get("reported"):
        run, folder = _background.get("run"), _session_folder(config)
        code = run.poll() if run is not None else None
        if code is None and folder is not None and (folder / "ended").exists():
            code = int((folder / "ended").read_text())
        if code:
            _background["reported"] = True
            print(f"[conftest] the background chapter run failed; its logs: {BUILD}/test-chapters*.log",
                  file=sys.stderr)


def pytest_sessionstart(session):
    _background["config"] = session.config


def pytest_sessionfinish(session, exitstatus):
    if _WARM is not None:
        _WARM.close()
    run = _background.pop("run", None)
    if run is not None:  # still running only if the session ended early (-x, ^C): stop it and its kernels
        run.stop()


def pytest_unconfigure(config):
    folder = _background.pop("folder", None)
    if folder is not None:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def stage_book(dest: Path, toc: str | None = None) -> Path:
    """A source tree in ``dest`` with every chapter of ``toc`` executed (execution off)."""
    stems = bookbuild.toc_chapters(toc)
    for stem in stems:
        executed_notebook(stem)
    return bookbuild.stage(dest, stems, toc=toc)


def _made_once(request, name: str, make) -> Path:
    """``make(folder)`` run once for the session: under xdist by the first worker to ask, in the session's
    folder, while any other worker that asks waits for it (a lock) and then reads what it made; ``make``'s
    failure is each asker's. Without xdist, in the session's temporary folder."""
    import fcntl

    shared = _session_folder(request.config)
    if shared is None:
        folder = request.getfixturevalue("tmp_path_factory").mktemp(name)
        make(folder)
        return folder
    folder = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / f"{name}.made").exists():
            import shutil

            shutil.rmtree(folder, ignore_errors=True)   # a worker's earlier try that failed
            folder.mkdir()
            make(folder)
            (shared / f"{name}.made").write_text("")
    return folder


@pytest.fixture(scope="session")
def built_book(request) -> Path:
    """The whole book, built from the executed chapters, once for the session; returns its html folder."""
    def make(folder: Path) -> None:
        import shutil

        src = stage_book(folder)
        proc = bookbuild.render(src, offline="require")
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        shutil.rmtree(BUILD / "html-tested", ignore_errors=True)
        shutil.copytree(src / "_build" / "html", BUILD / "html-tested")  # an artifact beside the screenshots

    return _made_once(request, "book", make) / "_build" / "html"


@pytest.fixture(scope="session")
def book_edition(built_book, request) -> Path:
    """The notebook edition, written as ``make book`` writes it: from the executed chapters, its links checked
    against the built book, its notebooks made the pages' downloads. Returns its folder (``notebooks/`` inside)."""
    from booktools import edition

    def make(out: Path) -> None:
        edition.Edition(built_book).write(bookbuild.toc_chapters(), bookbuild.EXECUTED, out)
        edition.install(built_book, out)

    return _made_once(request, "colab", make)
