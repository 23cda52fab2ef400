"""The loops to copy (scripts/loop_zero1_tp.py and scripts/loop_fsdp.py, shown in chapter 12) resume exactly.

Each loop runs 5 steps on 2 x 1, saving after step 2 (``save_run``: model, optimizer, scheduler and data
position through ``muongrid.checkpoint``), then a second launch resumes from that folder on the same grid
to step 5. The same grid adds in the same order, so the resumed steps' losses must EQUAL the uninterrupted
run's. The loops warm the lr up over 5 steps (x 1/5, 2/5, ...): a resume that lost the scheduler would
take step 3 at 1/5 of the lr where 3/5 was due, and the losses of steps 4 and 5 would differ.
"""
from __future__ import annotations

import shutil

import pytest

from conftest import BUILD, last_json, script

DIR = BUILD / "test_loops"


@pytest.mark.parametrize("loop", ["loop_zero1_tp.py", "loop_fsdp.py"])
def test_a_loop_resumed_from_its_checkpoint_continues_bit_for_bit(loop):
    folder = DIR / loop.removesuffix(".py")
    shutil.rmtree(folder, ignore_errors=True)
    common = ["--dp", "2", "--tp", "1", "--steps", "5", "--batch", "8"]
    first = script(loop, *common, "--save", str(folder), "--every", "2", timeout=240)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    again = script(loop, *common, "--resume", str(folder / "step2"), timeout=240)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    uninterrupted, resumed = last_json(first.stdout), last_json(again.stdout)
    assert resumed["first_step"] == 3 and len(resumed["losses"]) == 3
    assert resumed["losses"] == uninterrupted["losses"][2:]
    assert (folder / "step2" / "muongrid.json").is_file() and (folder / "step2" / "train.json").is_file()
