"""The loops chapter 12 shows and runs (scripts/loop_zero1_tp.py, the template to copy, and scripts/loop_fsdp.py,
its FSDP2 variant) resume exactly, with everything a cluster run uses switched on.

Each loop runs 5 steps on 2 x 1, saving after step 2 (``save_run``: model, optimizer, scheduler and data
position through ``muongrid.checkpoint``), then a second launch resumes from that folder on the same grid
to step 5. The same grid adds in the same order, so the resumed steps' losses and evaluations must EQUAL the
uninterrupted run's. The loops warm the lr up over 5 steps (x 1/5, 2/5, ...): a resume that lost the
scheduler would take step 3 at 1/5 of the lr where 3/5 was due, and the losses of steps 4 and 5 would differ.
Both run two micro-batches a step and evaluate every 2 steps; the template with bf16 weights (fp32 masters in
the optimizer), the FSDP2 variant under bf16 autocast. ``--compile`` is not switched on here: compiling costs
about 9 s of CPU per launch even with ``aot_eager`` (inductor's C++ compile takes a minute), and
``tests/test_hf_models.py`` trains a compiled model under the optimizer bit for bit. A flag the loops refuse
is refused before any process starts.
"""
from __future__ import annotations

import shutil

import pytest

from conftest import BUILD, last_json, refused, script

DIR = BUILD / "test_loops"
CASES = {"loop_zero1_tp.py": ["--precision", "bf16"],
         "loop_fsdp.py": ["--precision", "autocast"]}


@pytest.mark.parametrize("loop", list(CASES))
def test_a_loop_resumed_from_its_checkpoint_continues_bit_for_bit(loop):
    folder = DIR / loop.removesuffix(".py")
    shutil.rmtree(folder, ignore_errors=True)
    common = ["--dp", "2", "--tp", "1", "--steps", "5", "--batch", "8", "--accum", "2", "--eval-every", "2",
              *CASES[loop]]
    first = script(loop, *common, "--save", str(folder), "--every", "2", timeout=240)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    again = script(loop, *common, "--resume", str(folder / "step2"), timeout=240)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    uninterrupted, resumed = last_json(first.stdout), last_json(again.stdout)
    assert resumed["first_step"] == 3 and len(resumed["losses"]) == 3
    assert resumed["losses"] == uninterrupted["losses"][2:]
    assert [e[0] for e in uninterrupted["evals"]] == [2, 4, 5] and resumed["evals"] == uninterrupted["evals"][1:]
    assert uninterrupted["evals"][-1][1] < uninterrupted["evals"][0][1]   # it learns
    assert (folder / "step2" / "muongrid.json").is_file() and (folder / "step2" / "train.json").is_file()


def test_micro_batches_must_split_each_ranks_rows():
    import loop_zero1_tp

    def parse(argv):
        return loop_zero1_tp.parse(loop_zero1_tp.__doc__, argv)

    assert "--accum 3" in refused(parse, "--dp", "2", "--tp", "1", "--batch", "8", "--accum", "3")
