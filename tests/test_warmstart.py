"""The warm start server (booktools.warmstart): a script forked from it behaves as the same script
started as ``python script.py`` would, and the server never serves stale source or a stale environment."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import ROOT, SCRIPTS
from booktools import warmstart

pytestmark = pytest.mark.skipif(not warmstart.enabled(), reason="the warm start server forks: Linux only")

PROBE = """\
import json, os, random, sys, threading, time
import numpy
print(json.dumps(dict(argv=sys.argv, path0=sys.path[0], cwd=os.getcwd(), name=__name__, file=__file__,
                      probe=os.environ.get("MUONGRID_PROBE"), draw=random.random(),
                      np_draw=numpy.random.random())))
sys.stdout.flush()
print("to stderr", file=sys.stderr)
how = sys.argv[1]
if how == "thread":
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread done", file=sys.stderr))).start()
if how == "interrupt":
    raise KeyboardInterrupt
if how == "exit3":
    sys.exit(3)
if how == "raise":
    raise ValueError("raised in the script")
if how == "message":
    sys.exit("a message instead of a code")
if how == "kill":
    os.kill(os.getpid(), 9)
if how == "sleep":
    import time
    time.sleep(60)
"""


@pytest.fixture(scope="module")
def warm():
    starter = warmstart.WarmStarter(sys.executable, str(SCRIPTS))
    yield starter
    starter.close()


def both(warm, tmp_path, how, env=None):
    """(forked, fresh) CompletedProcess of the probe script run with argument ``how``."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = warm.start([str(probe), how], str(ROOT), env, stderr_apart=True)
    assert proc is not None
    out, err = proc.communicate(180)   # generous: the suite runs on two workers beside the chapters
    fresh = subprocess.run([sys.executable, str(probe), how], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=180)
    return subprocess.CompletedProcess(how, proc.returncode, out, err), fresh


def fields(out: str) -> dict:
    return json.loads(out.splitlines()[0])


@pytest.mark.parametrize("how, code", [("ok", 0), ("exit3", 3), ("raise", 1), ("message", 1), ("kill", -9),
                                       ("interrupt", -signal.SIGINT), ("thread", 0)])
def test_a_forked_script_exits_and_prints_as_a_fresh_one(warm, tmp_path, how, code):
    forked, fresh = both(warm, tmp_path, how)
    assert forked.returncode == fresh.returncode == code
    seen, expected = fields(forked.stdout), fields(fresh.stdout)
    for draw in ("draw", "np_draw"):
        seen.pop(draw), expected.pop(draw)
    assert seen == expected
    assert forked.stderr.splitlines()[0] == "to stderr"
    # the same traceback, line for line (from the script's frame), the same message, the thread joined
    assert forked.stderr == fresh.stderr
    if how == "raise":
        assert "Traceback (most recent call last)" in forked.stderr
        assert forked.stderr.strip().endswith("ValueError: raised in the script")
    if how == "thread":
        assert forked.stderr.splitlines()[-1] == "thread done"


def test_each_forked_script_draws_its_own_random_numbers(warm, tmp_path):
    first, second = (fields(both(warm, tmp_path, "ok")[0].stdout) for _ in range(2))
    assert first["draw"] != second["draw"] and first["np_draw"] != second["np_draw"]


def test_two_replies_that_wait_together_are_read_as_two():
    """A script that ends at once leaves its pid and its exit code waiting on the socket together."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        warmstart._send(theirs, {"pid": 7})
        warmstart._send(theirs, {"code": 3})
        assert warmstart._receive(ours)[0] == {"pid": 7}
        assert warmstart._receive(ours)[0] == {"code": 3}


def test_an_edited_module_starts_a_new_server(warm, tmp_path):
    both(warm, tmp_path, "ok")
    server = warm.proc.pid
    module = SCRIPTS / "muongrid" / "grid.py"
    stat = module.stat()
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    try:
        forked, _ = both(warm, tmp_path, "exit3")
    finally:
        os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert forked.returncode == 3 and warm.proc.pid != server


def test_muongrid_variables_reach_the_script_and_others_start_a_new_server(warm, tmp_path):
    forked, _ = both(warm, tmp_path, "ok", env={"MUONGRID_PROBE": "one"})
    server = warm.proc.pid
    assert fields(forked.stdout)["probe"] == "one"
    forked, _ = both(warm, tmp_path, "ok", env={"MUONGRID_PROBE": "two"})
    assert fields(forked.stdout)["probe"] == "two" and warm.proc.pid == server
    both(warm, tmp_path, "ok", env={"OMP_NUM_THREADS": "1"})  # read when torch loads: the server's is stale
    assert warm.proc.pid != server


def test_a_timeout_kills_the_script_and_the_server_goes_with_its_client(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    starter = warmstart.WarmStarter(sys.executable, str(SCRIPTS))
    proc = starter.start([str(probe), "sleep"], str(ROOT), dict(os.environ), stderr_apart=True)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.communicate(timeout=1)
    assert proc.returncode == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)
    server = starter.proc
    starter.sock.close()  # the client goes (as a kernel that ends): the server sees the socket close
    starter.sock = None
    assert server.wait(timeout=30) == 0  # it exited by itself, cleanly


def test_kernels_of_one_build_share_one_server_each_in_a_session_of_its_own(tmp_path):
    """``shared``: clients that serve the same environment join it (no server of their own), each in its own
    session (one client's long script does not hold up another's); a client whose environment differs in a
    variable read at import gets a server of its own; a client that goes kills the script it left running."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with warmstart.shared(sys.executable, str(SCRIPTS)) as path:
        assert os.environ["MUONGRID_WARM_SOCKET"] == path
        one, two, other = (warmstart.WarmStarter(sys.executable, str(SCRIPTS), path) for _ in range(3))
        sleeping = one.start([str(probe), "sleep"], str(ROOT), env, stderr_apart=True)
        proc = two.start([str(probe), "exit3"], str(ROOT), dict(env, JPY_PARENT_PID="1", MUONGRID_PROBE="x"),
                         stderr_apart=True)
        out, _ = proc.communicate(30)
        assert proc.returncode == 3 and fields(out)["probe"] == "x"
        assert one.proc is None and two.proc is None  # both joined the shared server
        proc = other.start([str(probe), "ok"], str(ROOT), dict(env, OMP_NUM_THREADS="1"), stderr_apart=True)
        assert proc.communicate(60)[0] and other.proc is not None and other.shared is None
        other.close()
        one.close()  # its session sees the client go and kills the script
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(sleeping.pid):
            time.sleep(0.1)
        assert not _alive(sleeping.pid)
        two.close()
    assert "MUONGRID_WARM_SOCKET" not in os.environ


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, not yet reaped by its session, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_server_that_runs_another_thread_refuses_to_fork_and_the_client_starts_interpreters(monkeypatch, tmp_path):
    """``fork_hazard``: a thread besides the two of a fresh ``import torch`` (here one the server starts before
    it serves, as tensor work would start an OpenMP pool) makes a fork unsafe; the server says so instead of
    forking, and the client gives up on warm starts (``run`` then starts a new interpreter)."""

    def with_a_thread(python, path0, entry, sock, env):
        code = (f"import sys, threading, time; sys.path[0] = {path0!r}; "
                "threading.Thread(target=time.sleep, args=(600,), daemon=True).start(); "
                f"from booktools.warmstart import {entry}; {entry}({sock.fileno()})")
        return subprocess.Popen([python, "-c", code], stdin=subprocess.DEVNULL, pass_fds=[sock.fileno()], env=env)

    monkeypatch.setattr(warmstart, "_start_python", with_a_thread)
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    starter = warmstart.WarmStarter(sys.executable, str(SCRIPTS))
    try:
        assert starter.start([str(probe), "ok"], str(ROOT), dict(os.environ)) is None
        assert starter.failed and "3 threads run in it" in starter.refusal
    finally:
        starter.close()


def test_the_fork_check_sees_a_thread_started_after_the_imports():
    code = ("import threading, time; from booktools import warmstart as w; _, base = w._preload(); "
            "print(w.fork_hazard(base)); threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); "
            "print(w.fork_hazard(base))")
    out = subprocess.run([sys.executable, "-c", code], cwd=SCRIPTS, capture_output=True, text=True, timeout=240)
    first, second = out.stdout.splitlines()
    assert first == "None" and second.startswith(f"{int(second.split()[0])} threads run in it (")
    assert int(second.split()[0]) == int(second.split("(")[1].split()[0]) + 1
