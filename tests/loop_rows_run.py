"""Run by tests/test_loops.py: one of the loops in ``scripts/`` exactly as it is, each rank recording which
training rows it read, to ``DIR/rows_rank<r>.json`` (its dp and tp rank, and the rows in the order read).

The recording wraps ``muongrid.data.TokenWindows.__getitem__``, which only the training ``DataLoader`` calls
(the evaluation reads ``window()``), in each rank's own process; nothing in the loop is changed or told.

    python tests/loop_rows_run.py loop_zero1_tp DIR --dp 2 --tp 2 --lr 0.01 --steps 4
"""
import importlib
import json
import sys
from pathlib import Path

from muongrid.data import TokenWindows
from muongrid.launch import launch



def load(name: str):
    """A loop of ``scripts/`` by its module name: ``scripts/`` is on every path of the checkout's environment
    (``make setup``'s editable install puts it there, as ``PYTHONPATH=scripts`` does)."""
    return importlib.import_module(name)


def worker(grid, comm, args):
    read, get = [], TokenWindows.__getitem__

    def recording(self, i):
        read.append(int(i))
        return get(self, i)

    TokenWindows.__getitem__ = recording
    try:
        return load(args.loop).worker(grid, comm, args)
    finally:
        TokenWindows.__getitem__ = get
        record = dict(dp_rank=grid.dp_rank, tp_rank=grid.tp_rank, rows=read)
        Path(args.rows_dir, f"rows_rank{grid.rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    name, out = sys.argv[1], sys.argv[2]
    loop = load(name)
    args = loop.parse(loop.__doc__, sys.argv[3:])
    args.loop, args.rows_dir = name, out
    Path(out).mkdir(parents=True, exist_ok=True)
    sys.exit(launch(worker, args))
