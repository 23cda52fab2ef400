"""Repeat every fault of ``faults.py`` many times while other processes load the CPU, and count the clean endings.

A failure path that works once on an idle machine can still hang or leave processes behind when
the machine is busy (a rank is slow to start, a report is read while it is being written). This
runs each fault ``--repeats`` times on one grid, with one busy process per core competing for the
CPU, and prints per fault: runs, clean failures (``muongrid/lab/faultcheck.py`` says what clean
means: exit code 1, the right message, the right rank named first), the slowest time from launch
to exit, the slowest time from the fault to the exit (for a hang, bounded by ``--timeout`` + 15 s)
and the processes left behind. The target is every run clean and nothing left behind.

    python scripts/fault_bench.py                       # every fault, 20 times, 2 x 2, two busy processes
    python scripts/fault_bench.py --faults hang,kill --repeats 5 --dp 2 --tp 1 --load 0
    python scripts/fault_bench.py --dp 2 --tp 1 --out book/data/fault_bench_2x1.json   # what chapter 10 shows

The last line is JSON (``per_fault``, ``all_clean``, ``leftovers``, ``complete``); ``--out`` also
writes it, after every fault, with the command, commit and machine. Each fault's row records the
machine's 1-minute load average when it finished: on a shared machine other jobs load it too.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from muongrid.lab.faultcheck import EXPECTED, first_failure, judge, processes_with_tag
from muongrid.lab.provenance import provenance

FAULTS_PY = Path(__file__).resolve().parent / "faults.py"
FAULT_STEP = 2


def busy_processes(n: int) -> list[subprocess.Popen]:
    """``n`` processes that spin on the CPU until stopped (the load other jobs put on a shared machine)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def one_run(fault: str, dp: int, tp: int, timeout: float, limit: float) -> dict:
    """Run one fault on the last rank; time it; judge it; look for leftovers."""
    rank, tag = dp * tp - 1, uuid.uuid4().hex
    env = dict(os.environ, MUONGRID_TEST_TAG=tag, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(FAULTS_PY), "--dp", str(dp), "--tp", str(tp), "--fault", fault, "--rank", str(rank),
           "--step", str(FAULT_STEP), "--timeout", str(timeout)]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err, fault_at = [], [], [None]

    def read_stdout():
        for line in proc.stdout:
            out.append(line)
            if fault_at[0] is None and line.startswith(f"step {FAULT_STEP - 1} done"):
                fault_at[0] = time.monotonic()  # the faulty step begins now

    readers = [threading.Thread(target=read_stdout), threading.Thread(target=lambda: err.extend(proc.stderr))]
    for t in readers:
        t.start()
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    end = time.monotonic()
    for t in readers:
        t.join()
    deadline = time.monotonic() + 5  # ranks get a moment to be reaped after the launcher exits
    while processes_with_tag(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_with_tag(tag)
    for pid in left:  # leave the machine as we found it, but count them
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    problems = judge(fault, dp, tp, rank, code, "".join(out), "".join(err))
    if problems:  # say what happened instead: the launcher's verdict and that rank's last words
        verdict, last_words = first_failure("".join(err))
        problems.append(f"the run said: {verdict or 'no verdict'}: {last_words[:300] or 'nothing'}")
    if end - start >= limit:
        problems.append(f"did not end within {limit:.0f} s; killed")
    return dict(seconds=end - start, after_fault=None if fault_at[0] is None else end - fault_at[0],
                problems=problems, leftovers=len(left))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--faults", default=",".join(EXPECTED), help="comma-separated faults (default: all)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--timeout", type=float, default=5.0, help="the runs' collective timeout, seconds")
    p.add_argument("--load", type=int, default=os.cpu_count() or 1, help="busy processes (default: one per core)")
    p.add_argument("--limit", type=float, default=180.0, help="seconds before a run counts as never ending")
    p.add_argument("--out", type=Path, help="also write the result, with its command, commit and machine, here (JSON)")
    args = p.parse_args(argv)
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = sorted(set(faults) - set(EXPECTED))
    if unknown:
        p.error(f"unknown faults {unknown}; known: {', '.join(EXPECTED)}")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    print(f"{args.repeats} runs of each fault on a {args.dp} x {args.tp} grid, --timeout {args.timeout:g}, "
          f"{args.load} busy process(es) on {os.cpu_count()} cores", flush=True)
    origin = provenance(sys.argv)  # the code as it was when the bench began (it may change during a long run)
    load = busy_processes(args.load)
    per_fault = {}

    def record(done: bool) -> dict:
        """The result so far; with ``--out`` it is rewritten after every fault, so a bench cut short
        still leaves what it measured (``complete`` says whether every fault ran)."""
        result = dict(grid=dict(dp=args.dp, tp=args.tp), repeats=args.repeats, timeout=args.timeout, load=args.load,
                      cores=os.cpu_count(), per_fault=per_fault, complete=done and len(per_fault) == len(faults),
                      all_clean=all(r["clean"] == r["runs"] for r in per_fault.values()),
                      leftovers=sum(r["leftovers"] for r in per_fault.values()))
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(dict(origin, **result), indent=1) + "\n")
        return result

    try:
        print(f"{'fault':<20}{'runs':>5}{'clean':>7}{'slowest exit':>14}{'after fault':>13}{'left behind':>13}", flush=True)
        for fault in faults:
            runs = [one_run(fault, args.dp, args.tp, args.timeout, args.limit) for _ in range(args.repeats)]
            after = [r["after_fault"] for r in runs if r["after_fault"] is not None]
            row = dict(runs=len(runs), clean=sum(not r["problems"] for r in runs),
                       slowest_exit_s=round(max(r["seconds"] for r in runs), 1),
                       slowest_after_fault_s=round(max(after), 1) if after else None,
                       leftovers=sum(r["leftovers"] for r in runs),
                       problems=sorted({q for r in runs for q in r["problems"]}),
                       load_average_1min=round(os.getloadavg()[0], 1))  # everything else running, too
            per_fault[fault] = row
            after_text = "-" if row["slowest_after_fault_s"] is None else f"{row['slowest_after_fault_s']:.1f} s"
            print(f"{fault:<20}{row['runs']:>5}{row['clean']:>7}{row['slowest_exit_s']:>12.1f} s{after_text:>13}"
                  f"{row['leftovers']:>13}", flush=True)
            for problem in row["problems"]:
                print(f"    {problem}", flush=True)
            record(done=False)
    finally:
        for proc in load:
            proc.kill()
            proc.wait()
    result = record(done=True)
    print(json.dumps(result))
    return 0 if result["all_clean"] and result["leftovers"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
