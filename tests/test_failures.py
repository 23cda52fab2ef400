"""Bad input and failing ranks: a clear error, a non-zero exit, the root cause's traceback, no orphans."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from conftest import ROOT, SCRIPTS, processes_with_tag, run, script


def assert_no_orphans(tag):
    deadline = time.monotonic() + 5
    while processes_with_tag(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with_tag(tag) == []


def test_rank_that_raises_mid_step_ends_the_run_with_its_traceback(tag):
    proc = script("faults.py", "--dp", "2", "--tp", "2", "--fault", "raise", "--rank", "3", "--step", "2", tag=tag)
    assert proc.returncode == 1
    assert "step 1 done" in proc.stdout and "step 2 done" not in proc.stdout
    assert "rank 3 (dp 1, tp 1) failed first; its traceback:" in proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr
    assert "InjectedFault: injected failure on rank 3 at step 2" in proc.stderr
    assert_no_orphans(tag)


def test_hung_collective_times_out_naming_the_collective(tag):
    start = time.monotonic()
    proc = script("faults.py", "--dp", "2", "--fault", "hang", "--rank", "1", "--timeout", "4", tag=tag)
    assert proc.returncode == 1
    assert "reduce_scatter over the dp group" in proc.stderr and "timed out" in proc.stderr
    assert "phase grad_reduce_scatter, step 2" in proc.stderr
    assert time.monotonic() - start < 90
    assert_no_orphans(tag)


def test_nan_gradient_is_a_clear_error(tag):
    proc = script("faults.py", "--dp", "2", "--tp", "2", "--fault", "nan", "--rank", "2", tag=tag)
    assert proc.returncode == 1
    assert "gradient of parameter 'w0' has 1 NaN/Inf value(s) on rank 2 (dp 1, tp 0), step 2" in proc.stderr
    assert_no_orphans(tag)


def test_missing_gradient_on_one_rank_is_a_clear_error(tag):
    proc = script("faults.py", "--dp", "2", "--fault", "missing-grad", "--rank", "1", tag=tag)
    assert proc.returncode == 1
    assert "parameter 'w0' has no gradient on rank 1 (dp 1, tp 0), step 2" in proc.stderr
    assert_no_orphans(tag)


def test_wrong_world_size_under_torchrun(tag):
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                "scripts/verify.py", "--dp", "2", "--tp", "2", "--shapes", "8x8"], tag=tag)
    assert proc.returncode != 0
    assert "world size 3 does not equal dp*tp = 2*2 = 4" in proc.stderr
    assert_no_orphans(tag)


def test_tp_dim_that_does_not_divide_fails_before_launching():
    proc = script("verify.py", "--tp", "3", "--shapes", "100x100", "--tp-dims", "0")
    assert proc.returncode != 0
    assert "dimension 0 has size 100, which does not divide by tp=3" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_shapes_and_grid_arguments_are_clear_errors():
    proc = script("verify.py", "--shapes", "100xabc")
    assert proc.returncode != 0 and "cannot read shapes '100xabc'" in proc.stderr
    proc = script("verify.py", "--shapes", "10x10,12x12", "--tp-dims", "0")
    assert proc.returncode != 0 and "2 shapes but 1 TP split dims" in proc.stderr
    proc = script("verify.py", "--dp", "0")
    assert proc.returncode != 0 and "--dp and --tp must be at least 1" in proc.stderr


def test_killing_the_launcher_leaves_no_rank_behind(tag):
    env = dict(os.environ, DMUON_TEST_TAG=tag, PYTHONUNBUFFERED="1")
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
        "from dmuon.comm import Comm\n"
        "from dmuon.grid import Grid\n"
        "grid = Grid(2, 1, 0, 0, 0, None, None, 'cpu')\n"
        "comm = Comm(grid, timeout_s=0.5)\n"
        "comm._inflight = (time.monotonic() - 60, 'all_gather over the dp group (test)')\n"
        "time.sleep(30)\n"
    )
    proc = run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == 3
    assert "[dmuon watchdog] all_gather over the dp group (test) has not finished" in proc.stderr


def test_a_rank_killed_from_outside_is_the_root_cause_not_the_ranks_the_launcher_stopped(tag):
    """kill -9 of rank 1 while rank 0 hangs: the report blames rank 1, never a rank the launcher ended."""
    env = dict(os.environ, DMUON_TEST_TAG=tag, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "faults.py"), "--dp", "2", "--tp", "2", "--fault", "hang",
                             "--rank", "0", "--timeout", "120"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    pids, hanging = {}, False
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (hanging and 1 in pids):
        line = proc.stdout.readline()
        if line.startswith("rank ") and ": pid " in line:
            pids[int(line.split()[1].rstrip(":"))] = int(line.split()[-1])
        hanging = hanging or "hanging" in line
    assert hanging and 1 in pids, "the ranks did not start"
    os.kill(pids[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "rank 1 (dp 0, tp 1) failed first" in err and "killed by signal SIGKILL" in err, err[-2000:]
    assert_no_orphans(tag)


def test_a_rank_ended_by_the_watchdog_ends_the_run_while_the_others_hang(tag):
    """Exit code 3 from the watchdog is a failure, not a worker's return code: the launcher must not wait
    for the ranks that hang (they would sleep for an hour)."""
    start = time.monotonic()
    proc = script("faults.py", "--dp", "2", "--tp", "2", "--fault", "watchdog", "--rank", "1", tag=tag, timeout=120)
    assert proc.returncode == 1
    assert "rank 1 (dp 0, tp 1) failed first" in proc.stderr and "[dmuon watchdog] (injected)" in proc.stderr
    assert time.monotonic() - start < 100
    assert_no_orphans(tag)


def test_a_hang_on_a_2x2_grid_ends_the_run(tag):
    """The watchdog ends the waiting ranks; the launcher must take that as a failure, not wait for the hung rank."""
    start = time.monotonic()
    proc = script("faults.py", "--dp", "2", "--tp", "2", "--fault", "hang", "--rank", "1", "--timeout", "5",
                  tag=tag, timeout=120)
    assert proc.returncode == 1
    assert "timed out" in proc.stderr or "has not finished" in proc.stderr, proc.stderr[-2000:]
    assert time.monotonic() - start < 100
    assert_no_orphans(tag)
