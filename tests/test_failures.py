"""Bad input and failing ranks: a clear error, a non-zero exit, the root cause's traceback, no orphans.

Every fault of ``scripts/faults.py`` runs on a 2 x 2 grid, on the last rank (so the culprit is never
rank 0 by luck), and a hang also on 2 x 1, where the waiting rank must name the collective it waited in.
Chapter 10 runs five of the faults (raise, kill, hang, shape-mismatch, corrupt-checkpoint) on 2 x 1 and
holds each to the same ``judge``, so the suite (which executes every chapter) sees those on both grids.
Each must end the whole run with exit code 1, the message a user needs, the failing rank named first
where one rank is at fault (``muongrid/lab/faultcheck.py`` says what each fault must show), and no
process left behind. The subprocess timeout is the backstop for "never ends"; how long each fault
takes to end under load is measured by ``scripts/fault_bench.py``, not asserted here.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, SCRIPTS, processes_with_tag, refused, run, script
from muongrid.lab.faultcheck import EXPECTED, judge
from muongrid.verify import main as verify_main


def assert_no_orphans(tag):
    deadline = time.monotonic() + 5
    while processes_with_tag(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with_tag(tag) == []


@pytest.mark.parametrize("fault,dp,tp", [(f, 2, 2) for f in EXPECTED] + [("hang", 2, 1)],
                         ids=[f"{f}-2x2" for f in EXPECTED] + ["hang-2x1"])
def test_every_fault_ends_the_run_with_a_clear_message_and_no_orphans(fault, dp, tp, tag):
    rank = dp * tp - 1
    proc = script("faults.py", "--dp", str(dp), "--tp", str(tp), "--fault", fault, "--rank", str(rank), "--step", "2",
                  "--timeout", "5", tag=tag, timeout=120)
    assert judge(fault, dp, tp, rank, proc.returncode, proc.stdout, proc.stderr) == [], proc.stderr[-3000:]
    if fault == "hang" and tp == 1:  # the waiting rank names the collective it waited in: the step's first,
        # where every rank says which parameters have a gradient (muongrid/contract.py)
        assert "all_reduce over the world group" in proc.stderr and "phase contract, step 2" in proc.stderr
    assert_no_orphans(tag)


def test_wrong_world_size_under_torchrun(tag):
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                "scripts/verify.py", "--dp", "2", "--tp", "2", "--shapes", "8x8"], tag=tag)
    assert proc.returncode != 0
    assert "world size 1 does not equal dp*tp = 2*2 = 4" in proc.stderr
    assert_no_orphans(tag)


def test_tp_dim_that_does_not_divide_fails_before_launching():
    err = refused(verify_main, "--tp", "3", "--shapes", "100x100", "--tp-dims", "0")
    assert "dimension 0 has size 100, which does not divide by tp=3" in err
    assert "Traceback" not in err


def test_bad_shapes_and_grid_arguments_are_clear_errors():
    assert "cannot read shapes '100xabc'" in refused(verify_main, "--shapes", "100xabc")
    assert "2 shapes but 1 TP split dims" in refused(verify_main, "--shapes", "10x10,12x12", "--tp-dims", "0")
    assert "--dp and --tp must be at least 1" in refused(verify_main, "--dp", "0")


def test_killing_the_launcher_leaves_no_rank_behind(tag):
    env = dict(os.environ, MUONGRID_TEST_TAG=tag, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "faults.py"), "--dp", "2", "--fault", "hang", "--rank", "1",
                             "--timeout", "300"], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        if "hanging" in line or time.monotonic() > deadline:
            break
    assert len(processes_with_tag(tag)) >= 3  # the launcher and its two ranks
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert_no_orphans(tag)


def test_watchdog_ends_a_rank_whose_collective_never_returns():
    """The backstop for backends that hang without raising (a stuck NCCL kernel): after the timeout
    plus a grace period the watchdog names the collective and ends the process with code 3."""
    code = (
        "import time\n"
        "from muongrid.comm import Comm\n"
        "from muongrid.grid import Grid\n"
        "grid = Grid(2, 1, 0, 0, 0, None, None, 'cpu')\n"
        "comm = Comm(grid, timeout_s=0.5)\n"
        "comm._inflight = (time.monotonic() - 60, 'all_gather over the dp group (test)')\n"
        "time.sleep(30)\n"
    )
    proc = run([sys.executable, "-c", code], timeout=240)
    assert proc.returncode == 3
    assert "[muongrid watchdog] all_gather over the dp group (test) has not finished" in proc.stderr


def test_a_rank_killed_from_outside_is_the_root_cause_not_the_ranks_the_launcher_stopped(tag):
    """kill -9 of rank 1 while rank 0 hangs: the report blames rank 1, never a rank the launcher ended."""
    env = dict(os.environ, MUONGRID_TEST_TAG=tag, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "faults.py"), "--dp", "2", "--tp", "2", "--fault", "hang",
                             "--rank", "0", "--timeout", "120"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    pids, hanging = {}, False
    deadline = time.monotonic() + 240   # generous: two test workers and the chapters share the cores
    while time.monotonic() < deadline and not (hanging and 1 in pids):
        line = proc.stdout.readline()
        if line.startswith("rank ") and ": pid " in line:
            pids[int(line.split()[1].rstrip(":"))] = int(line.split()[-1])
        hanging = hanging or "hanging" in line
    assert hanging and 1 in pids, "the ranks did not start"
    os.kill(pids[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 1
    assert "rank 1 (dp 0, tp 1) failed first" in err and "killed by signal SIGKILL" in err, err[-2000:]
    assert_no_orphans(tag)


LAUNCH_AFTER = """
import sys
import torch
{before}
from muongrid import launch
from muongrid.verify import main
context = launch._context
def traced():  # the method the launch really uses, after verify's own checks built the problem
    ctx = context()
    print("start method:", ctx.get_start_method(), flush=True)
    return ctx
launch._context = traced
# 512 x 512: large enough that building it with two threads would start torch's OpenMP pool
sys.exit(main(["--dp", "1", "--tp", "1", "--shapes", "512x512,16x16", "--tp-dims", "none,none", "--steps", "1"]))
"""


@pytest.mark.parametrize("before,method", [("", "fork"), ("torch.set_num_threads(2); (torch.randn(600, 600) @ torch.randn(600, 600)).sum()", "forkserver")],
                         ids=["fresh", "after-tensor-work"])
def test_ranks_are_forked_only_from_a_process_without_threads(before, method):
    """A launcher that has not computed forks its ranks (no second import of torch), even after the script
    built its problem to check the input (``launch.forkable``); one whose tensor work left an OpenMP pool
    must not (a forked rank would hang in its first parallel region): it falls back to a fork server and
    the run still ends, exact. One rank, so it runs on every core, in parallel regions:
    forked after tensor work, it hangs (the subprocess timeout catches that; checked by hand)."""
    code = LAUNCH_AFTER.format(before=before)
    env = {k: v for k, v in os.environ.items() if k != "MUONGRID_START_METHOD"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"start method: {method}\n" in proc.stdout and "OK: largest difference 0.000e+00" in proc.stdout


def test_a_rank_killed_by_a_signal_is_blamed_before_the_peers_that_lost_it(tmp_path, capsys):
    """The race the kill fault hit once on 2 x 2: rank 3 is killed, rank 2 fails at once on the closed
    connection and both are found ended in one wake-up; the report must still name rank 3 first, whichever
    of them the launcher took for the culprit."""
    from types import SimpleNamespace

    from muongrid import launch

    procs = [SimpleNamespace(exitcode=None), SimpleNamespace(exitcode=None), SimpleNamespace(exitcode=1),
             SimpleNamespace(exitcode=-signal.SIGKILL)]
    (tmp_path / "rank2.txt").write_text(f"{time.time()}\nCollectiveError: Connection closed by peer\n")
    launch._report(procs, tmp_path, SimpleNamespace(tp=2), 2, stopped={0, 1})
    err = capsys.readouterr().err
    assert "rank 3 (dp 1, tp 1) failed first" in err and "killed by signal SIGKILL" in err, err
    assert "Connection closed by peer" in err.split("failed first", 1)[1]   # rank 2's line follows
