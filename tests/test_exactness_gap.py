"""scripts/exactness_gap.py, which measures the README's "What bit for bit is against" paragraph.

On 2 DP ranks the optimizer's parameters must equal one process's bit for bit when that process is given
the gradients the ranks average ("rows": the comparison verify.py and every other test makes), for the
hybrid Muon and for AdamW alone. Against one process that takes one backward on the whole batch ("whole")
they differ: the script exists to measure by how much, so here it is only required to be measured (finite,
and not zero for Muon, whose bf16 Newton-Schulz carries the last-bit differences of another summation
order into every update). The book's GPT, so that the test needs no transformers.
"""
from __future__ import annotations

import math

from conftest import last_json, script


def test_bit_for_bit_given_the_ranks_gradients_and_measured_against_the_whole_batch():
    proc = script("exactness_gap.py", "--model", "gpt", "--steps", "3", "--width", "32", timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    gaps = last_json(proc.stdout)["gaps"]
    assert set(gaps) == {"hybrid", "adamw"}
    for kind in gaps:
        assert gaps[kind]["rows"] == dict(max_abs_diff=0.0, rel_to_movement=0.0)
        assert all(math.isfinite(v) for v in gaps[kind]["whole"].values())
    assert gaps["hybrid"]["whole"]["max_abs_diff"] > 0.0
    assert "against one process, the whole batch in one backward" in proc.stdout
