"""Check Distributed Muon / AdamW / the hybrid against the single-device reference, step by step.

    python scripts/verify.py --dp 2 --tp 2                          # spawns 4 local gloo ranks
    torchrun --standalone --nproc-per-node 4 scripts/verify.py --dp 2 --tp 2   # NCCL when CUDA is there

A thin wrapper: the check lives in the package (``scripts/muongrid/verify.py``, every flag and the JSON
line described there), so an install runs the same thing as ``python -m muongrid.verify`` or
``muongrid-verify``. This file keeps the book's commands working from a checkout.
"""
import sys

from muongrid.verify import main

if __name__ == "__main__":
    sys.exit(main())
