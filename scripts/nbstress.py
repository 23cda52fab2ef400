"""Execute chapters over and over in one process, as a book build does, and count stalls.

This is both the reproduction of issue 16's stall and its stress check:

    python scripts/nbstress.py --client stock --timeout 20 --rounds 20 --synthetic
        # plain nbclient: a stall shows as a cell whose reply reached the client about
        # --timeout seconds after the kernel sent it
    python scripts/nbstress.py --client guarded --rounds 20                # every chapter, 20 rounds
    python scripts/nbstress.py --client guarded --rounds 3 --chapters 02_distributed_map,04_zero1_buffer

A *stall* is a cell for which the client received the kernel's reply more than ``--stall-after``
seconds (default 5) after the kernel stamped it; every cell's reply normally arrives within
milliseconds. A chapter whose cell fails counts under *errors* (its last lines are printed) and the
rounds go on; the exit code is 1 when any run stalled or failed. With ``--client guarded``
(``booktools.nbexec``, what the build and tests use) the table also counts *late wake-ups*: polls
that found a reply only when their 0.5 s slice ran out, i.e. the lost wake-ups that stall plain
nbclient, each absorbed in under a second.

``--synthetic`` runs a small notebook (cells that stream a subprocess's output and draw a figure)
instead of the chapters: the same traffic pattern, a few seconds a round. The last line is JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from booktools import nbexec
from muongrid.lab.notebook import chapters

ROOT = Path(__file__).resolve().parents[1]

STREAM_CELL = '''import subprocess, sys
p = subprocess.Popen([sys.executable, "-u", "-c",
                      "import time\\nfor i in range(40):\\n    print('line', i, flush=True); time.sleep(0.01)"],
                     stdout=subprocess.PIPE, text=True)
for line in p.stdout:
    print(line, end="", flush=True)
p.wait()'''
FIGURE_CELL = '''import matplotlib
matplotlib.use("agg")
import matplotlib.pyplot as plt
plt.plot([1, 3, 2]); plt.show()'''


def synthetic(path: Path) -> Path:
    cells = [nbformat.v4.new_code_cell(STREAM_CELL) for _ in range(20)] + [nbformat.v4.new_code_cell(FIGURE_CELL)]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


class TimedStock(NotebookClient):
    """Plain nbclient, recording when each reply reached the client (the kernel stamps when it sent it)."""

    def __init__(self, nb, **kw):
        super().__init__(nb, **kw)
        self.received: dict[int, datetime] = {}

    async def async_execute_cell(self, cell, cell_index, *a, **kw):
        out = await super().async_execute_cell(cell, cell_index, *a, **kw)
        self.received[cell_index] = datetime.now().astimezone()
        return out


def reply_delays(nb, received: dict[int, datetime]) -> list[tuple[int, float]]:
    """(cell, seconds from the kernel's reply stamp to the client's receipt) for every code cell."""
    out = []
    for i, when in received.items():
        stamp = nb.cells[i].metadata.get("execution", {}).get("shell.execute_reply")
        if stamp:
            out.append((i, (when - datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds()))
    return out


def run_once(path: Path, client: str, timeout: float) -> tuple[float, list[tuple[int, float]], int, int]:
    """Execute ``path`` once: (seconds, reply delays, late wake-ups, retries)."""
    cwd = str(ROOT / "notebooks")
    started = time.monotonic()
    if client == "stock":
        nb = nbformat.read(path, as_version=4)
        c = TimedStock(nb, timeout=timeout, kernel_name="python3", record_timing=True,
                       resources={"metadata": {"path": cwd}})
        c.execute()
        return time.monotonic() - started, reply_delays(nb, c.received), 0, 0
    before = nbexec.SlicedChannel.late_wakeups
    received: dict[int, datetime] = {}
    nb, report = nbexec.execute_chapter(path, cwd=cwd, timeout=timeout,
                                        on_cell_done=lambda i: received.__setitem__(i, datetime.now().astimezone()))
    return (time.monotonic() - started, reply_delays(nb, received),
            nbexec.SlicedChannel.late_wakeups - before, report.retries)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--client", choices=["stock", "guarded"], default="guarded")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--chapters", default="all", help="comma-separated stems, or 'all'")
    p.add_argument("--synthetic", action="store_true", help="a small streaming notebook instead of the chapters")
    p.add_argument("--timeout", type=float, default=nbexec.CELL_TIMEOUT_S, help="per-cell timeout, seconds")
    p.add_argument("--stall-after", type=float, default=5.0)
    args = p.parse_args(argv)

    if args.synthetic:
        paths = [synthetic(Path("/tmp") / "muongrid_nbstress_synthetic.ipynb")]
    else:
        wanted = None if args.chapters == "all" else set(args.chapters.split(","))
        paths = [ROOT / "notebooks" / f"{c.stem}.ipynb" for c in chapters() if wanted is None or c.stem in wanted]
        if wanted and len(paths) != len(wanted):
            p.error(f"unknown chapters: {sorted(wanted - {q.stem for q in paths})}")
    stats = {q.stem: {"runs": 0, "stalls": 0, "errors": 0, "late_wakeups": 0, "retries": 0, "slowest_s": 0.0,
                      "worst_delay_s": 0.0} for q in paths}
    for r in range(args.rounds):
        for path in paths:
            s = stats[path.stem]
            try:
                seconds, delays, late, retries = run_once(path, args.client, args.timeout)
            except Exception as e:  # a cell that failed: count it, say which, and go on with the rounds
                s["runs"] += 1
                s["errors"] += 1
                print(f"round {r + 1:2d} {path.stem:<26} ERROR {type(e).__name__}: "
                      + " | ".join(str(e).strip().splitlines()[-3:]), flush=True)
                continue
            stalled = [(i, round(d, 1)) for i, d in delays if d > args.stall_after]
            s["runs"] += 1
            s["stalls"] += len(stalled)
            s["late_wakeups"] += late
            s["retries"] += retries
            s["slowest_s"] = round(max(s["slowest_s"], seconds), 1)
            s["worst_delay_s"] = round(max([s["worst_delay_s"], *(d for _, d in delays)]), 3)
            print(f"round {r + 1:2d} {path.stem:<26} {seconds:6.1f} s  late wake-ups {late}"
                  + (f"  STALLED cells {stalled}" if stalled else ""), flush=True)
    print(f"\n{'chapter':<26} {'runs':>5} {'stalls':>6} {'errors':>6} {'retries':>7} {'late wake-ups':>13} "
          f"{'slowest s':>9} {'worst reply delay s':>19}")
    for name, s in stats.items():
        print(f"{name:<26} {s['runs']:5d} {s['stalls']:6d} {s['errors']:6d} {s['retries']:7d} "
              f"{s['late_wakeups']:13d} {s['slowest_s']:9.1f} {s['worst_delay_s']:19.3f}")
    total = {k: sum(s[k] for s in stats.values()) for k in ("runs", "stalls", "errors", "late_wakeups", "retries")}
    if nbexec.SlicedChannel.late_log:
        print("late wake-ups (channel, message, seconds it had waited in the socket):",
              [(c, m, round(a, 3)) for c, m, a in nbexec.SlicedChannel.late_log])
    print(json.dumps({"client": args.client, "rounds": args.rounds, **total, "chapters": stats}))
    return 1 if total["stalls"] or total["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
