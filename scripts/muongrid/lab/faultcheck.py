"""What a clean failure looks like, for each fault that ``scripts/faults.py`` injects.

One place says, per fault, which messages the user must see and whether the rank that misbehaved
must be the one the launcher names first. ``tests/test_failures.py`` checks one run of each fault
on two grids; ``scripts/fault_bench.py`` repeats each many times under load and counts the runs
that end cleanly.

    problems = judge("nan", dp=2, tp=2, rank=3, returncode=1, stdout=out, stderr=err)   # [] when clean
"""
from __future__ import annotations

import re

FIRST = r"rank {rank} \(dp {dp}, tp {tp}\) failed first"
STOPPED = r"=== the run was stopped: all \d+ ranks ended, exit code 1 ==="

# fault -> (regexes stderr must match, whether the misbehaving rank must be named first). Where every
# rank detects the problem (another model, a corrupt file) or the culprit is silent (a hang: a waiting
# peer times out first), any rank may be named first.
EXPECTED = {
    "raise": ([r"Traceback \(most recent call last\)", r"InjectedFault: injected failure on rank {rank} at step 2"],
              True),
    # gloo raises "timed out"; muongrid's watchdog says "has not finished"; NCCL's watchdog "Watchdog caught collective
    # operation timeout: WorkNCCL(...) ran for N milliseconds before timing out" (ProcessGroupNCCL.cpp)
    "hang": ([r"timed out|has not finished|Watchdog caught collective operation timeout|NCCL timeout"], False),
    "nan": ([r"gradient of parameter 'w0' has 1 NaN/Inf value\(s\) on rank {rank} \(dp {dp}, tp {tp}\), step 2"], True),
    "watchdog": ([r"\[muongrid watchdog\] \(injected\) rank {rank} ended at step 2"], True),
    "kill": ([r"killed by signal SIGKILL"], True),
    "shape-mismatch": ([r"the ranks disagree about the parameters they optimize: parameter 'w2': full shape "
                        r"\[33, 18\] on rank {rank}, \[33, 17\] on rank 0"], False),
    "wrong-dtype": ([r"parameter 'w0': gradient dtype bfloat16 differs from parameter dtype float32 on rank {rank}"],
                    True),
    "corrupt-checkpoint": ([r"reading \S+ failed \(a file truncated or corrupted\?\); nothing was changed"], False),
}


def judge(fault: str, dp: int, tp: int, rank: int, returncode: int, stdout: str, stderr: str) -> list[str]:
    """Why this run of ``faults.py --fault fault --rank rank --step 2`` was not a clean failure ([] if it was)."""
    where = dict(rank=rank, dp=rank // tp, tp=rank % tp)
    problems = []
    if returncode != 1:
        problems.append(f"exit code {returncode}, expected 1")
    if ("step 1 done" in stdout) != (fault != "shape-mismatch"):  # that one fails while the optimizer is built
        problems.append("step 1 did not run as expected")
    if "step 2 done" in stdout:
        problems.append("step 2 finished despite the fault")
    patterns, target_first = EXPECTED[fault]
    problems += [f"no match for {p!r}" for p in patterns if not re.search(p.format(**where), stderr)]
    if target_first and not re.search(FIRST.format(**where), stderr):
        problems.append(f"rank {rank} is not named first")
    if not re.search(STOPPED, stderr):
        problems.append("no closing line from the launcher")
    return problems


def processes_with_tag(tag: str) -> list[int]:
    """PIDs of live processes whose environment carries ``MUONGRID_TEST_TAG=tag`` (a run's leftovers)."""
    from pathlib import Path

    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if f"MUONGRID_TEST_TAG={tag}".encode() in (d / "environ").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def first_failure(output: str) -> tuple[str, str]:
    """From a failed run's output: the launcher's verdict (who failed first) and that rank's last
    words (the exception line, or what the launcher knows of a rank that died without one)."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if "failed first" in line), None)
    if start is None:
        return "", ""
    verdict = lines[start].strip("= ").split(";")[0]
    body = []
    for line in lines[start + 1:]:
        if line.startswith("--- then") or line.startswith("=== the run was stopped"):
            break
        if line.strip():
            body.append(line.strip())
    return verdict, body[-1] if body else ""
