"""The README's training loop resumes a run (issue 50): its block, run as written on gloo with its first line
adapted as the README says, saved at step 3 on 2 x 2 (TP 2) and resumed on 4 x 1, reads the uninterrupted run's
batches: the step-4 loss of the global batch is the same to 5 digits (other grids add in another order; here it
was equal to every digit). One ``torchrun`` job of 4 gloo ranks (``tests/readme_loop_run.py``).

    python -m pytest -q tests/test_readme_loop.py
"""
from __future__ import annotations

import sys

from conftest import ROOT, last_json, run


def test_the_readme_loop_saved_on_2x2_resumes_on_4x1_with_the_next_batch(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
           str(ROOT / "tests" / "readme_loop_run.py"), "--out", str(tmp_path)]
    proc = run(cmd, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    r = last_json(proc.stdout)
    assert r["starts"] == [0, 3] and r["saved"] == ["step3"], r   # the second run found the save and resumed
    assert abs(r["resumed"] - r["straight"]) <= 1e-5 * abs(r["straight"]), r
