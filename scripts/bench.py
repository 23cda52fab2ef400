"""Distributed Muon vs Distributed AdamW, measured side by side in one run: bytes, time, state, memory.

    python scripts/bench.py --dp 2 --tp 2                      # one grid
    python scripts/bench.py --sweep                            # DP4, TP4 and DP2xTP2, one after another
    torchrun --standalone --nproc-per-node 4 scripts/bench.py --dp 2 --tp 2

A thin wrapper: the benchmark lives in the package (``scripts/muongrid/bench.py``, every flag and the
JSON line described there), so an install runs the same thing as ``python -m muongrid.bench`` or
``muongrid-bench``. This file keeps the book's commands working from a checkout.
"""
import sys

from muongrid.bench import main

if __name__ == "__main__":
    sys.exit(main())
