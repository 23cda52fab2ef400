"""The loops chapter 12 shows and runs (scripts/loop_zero1_tp.py, the template to copy, and scripts/loop_fsdp.py,
its FSDP2 variant): the rows each rank reads, a resume that continues the data and the curve exactly, and
``--compile inductor``.

**Rows and resume.** Each loop runs 4 steps straight, saving after step 2 (``save_run``: model, optimizer,
scheduler and the data loader's position through ``muongrid.checkpoint``), then a second launch resumes from
that folder on the same grid to step 4. Every rank records the training rows it read
(``tests/loop_rows_run.py`` wraps the dataset's ``__getitem__``; the loop is run as it is). The template runs
on 2 x 2, so: the two TP ranks of each replica read the same rows (a sampler keyed by the global rank would
give them different ones and still run), the two replicas read disjoint rows, and the resumed ranks read
exactly the rows the straight run read in steps 3 and 4. The same grid adds in the same order, so the
resumed steps' losses and evaluations must EQUAL the straight run's. The loops warm the lr up over 5 steps
and decay it by a cosine after: a resume that lost the scheduler would take step 3 at 1/5 of the lr where
3/5 was due, and the losses of step 4 would differ. Both run two micro-batches a step and evaluate every
2 steps; the template with bf16 weights (fp32 masters in the optimizer), the FSDP2 variant (2 x 1) under
bf16 autocast.

**Compile.** ``--compile inductor`` on one rank, fp32, 2 steps of the template's tiny GPT, against the same
launch uncompiled: inductor generates and builds C++ kernels (measured here: 49 s for this test with a cold
inductor cache on a loaded 2-core machine, 18-27 s once its cache in /tmp holds them) whose sums run in
another order than eager's, so the losses agree within 1e-4 (measured here: 5e-7 after 2 steps), not bit for bit.
It is skipped, saying so, only where this machine has no C++ compiler for inductor to call.

The sampler's arithmetic (the same global batch on every grid, across an epoch boundary; a position that
refuses other data) is checked in this process, without launching.
"""
from __future__ import annotations

import json
import shutil
import sys

import pytest

from conftest import BUILD, ROOT, last_json, refused, run, script

DIR = BUILD / "test_loops"
CASES = {"loop_zero1_tp": ["--dp", "2", "--tp", "2", "--precision", "bf16"],
         "loop_fsdp": ["--dp", "2", "--tp", "1", "--precision", "autocast"]}
COMMON = ["--lr", "0.01", "--steps", "4", "--batch", "8", "--accum", "2", "--eval-every", "2"]


def recorded(loop: str, folder, *args: str):
    """Launch ``loop`` recording each rank's rows into ``folder``; its JSON and {rank: record}."""
    shutil.rmtree(folder, ignore_errors=True)
    proc = run([sys.executable, str(ROOT / "tests" / "loop_rows_run.py"), loop, str(folder), *args], timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = {int(p.stem.removeprefix("rows_rank")): json.loads(p.read_text()) for p in folder.glob("rows_rank*.json")}
    return last_json(proc.stdout), rows


@pytest.mark.parametrize("loop", list(CASES))
def test_a_loop_reads_its_rows_by_dp_rank_and_a_resume_continues_data_and_curve_bit_for_bit(loop):
    ckpt = DIR / loop / "ckpt"
    shutil.rmtree(ckpt, ignore_errors=True)
    args = [*COMMON, *CASES[loop]]
    first, rows = recorded(loop, DIR / loop / "straight", *args, "--save", str(ckpt), "--every", "2")
    again, rows_again = recorded(loop, DIR / loop / "resumed", *args, "--resume", str(ckpt / "step2"))
    dp, tp = int(args[args.index("--dp") + 1]), int(args[args.index("--tp") + 1])
    n = 8 // dp                                          # rows a rank reads a step
    assert sorted(rows) == sorted(rows_again) == list(range(dp * tp))
    for r, rec in rows.items():
        assert len(rec["rows"]) == 4 * n and rec["dp_rank"] == r // tp
        same_replica = [rows[q]["rows"] for q in rows if rows[q]["dp_rank"] == rec["dp_rank"]]
        assert all(other == rec["rows"] for other in same_replica)     # the TP ranks of a replica
        assert rows_again[r]["rows"] == rec["rows"][2 * n:]            # the resume reads on where it stopped
    replicas = [rows[d * tp]["rows"] for d in range(dp)]
    every = [i for rep in replicas for i in rep]
    assert len(set(every)) == len(every) == 4 * 8                      # disjoint, and no row twice in an epoch
    assert again["first_step"] == 3 and len(again["losses"]) == 2
    assert again["losses"] == first["losses"][2:]
    assert [e[0] for e in first["evals"]] == [2, 4] and again["evals"] == first["evals"][1:]
    assert (ckpt / "step2" / "muongrid.json").is_file() and (ckpt / "step2" / "train.json").is_file()
    assert json.loads((ckpt / "step2" / "train.json").read_text())["data"]["batches"] == 2


def test_the_template_compiles_with_inductor_on_one_rank_and_agrees_with_eager():
    from torch._inductor import cpp_builder

    try:
        compiler = cpp_builder.get_cpp_compiler()
    except Exception as e:   # inductor names the compiler it looked for
        pytest.skip(f"inductor finds no C++ compiler on this machine ({e}); the CPU cannot build its kernels")
    one = ["--dp", "1", "--tp", "1", "--lr", "0.01", "--steps", "2", "--batch", "4", "--eval-every", "0",
           "--precision", "fp32"]
    compiled = script("loop_zero1_tp.py", *one, "--compile", "inductor", timeout=400)
    assert compiled.returncode == 0, f"inductor ({compiler})\n" + compiled.stdout[-2000:] + compiled.stderr[-4000:]
    eager = script("loop_zero1_tp.py", *one, timeout=240)
    assert eager.returncode == 0, eager.stdout[-2000:] + eager.stderr[-3000:]
    ours, theirs = last_json(compiled.stdout)["losses"], last_json(eager.stdout)["losses"]
    assert len(ours) == len(theirs) == 2
    assert ours == pytest.approx(theirs, abs=1e-4)


def test_the_sampler_gives_every_grid_the_same_global_batches_and_refuses_other_data():
    import torch

    from muongrid.data import DPBatchSampler, ResumableLoader, TokenWindows

    def global_batches(dp: int, steps: int, start: int = 0) -> list[list[int]]:
        its = [iter(DPBatchSampler(30, 6, dp, r, seed=3, start=start)) for r in range(dp)]
        return [sorted(i for it in its for i in next(it)) for _ in range(steps)]

    one = global_batches(1, 12)                  # 5 batches an epoch: steps 6-10 are epoch 1's permutation
    assert global_batches(2, 12) == global_batches(3, 12) == global_batches(6, 12) == one
    assert one[:5] != one[5:10] and all(len(set(b)) == 6 for b in one)
    assert len({i for b in one[:5] for i in b}) == 30                   # an epoch reads each row once
    assert global_batches(2, 5, start=7) == one[7:12]

    data = TokenWindows(torch.arange(200), context=4)
    loader = ResumableLoader(data, 8, dp=2, dp_rank=1, seed=0)
    taken = [next(loader) for _ in range(3)]
    assert taken[0][0].shape == (4, 4) and torch.equal(taken[0][1], taken[0][0] + 1)
    state = loader.state_dict()
    later = ResumableLoader(data, 8, dp=2, dp_rank=1, seed=0)
    later.load_state_dict(state)
    assert torch.equal(next(later)[0], next(loader)[0])
    with pytest.raises(ValueError, match="global_batch saved 8, here 4"):
        ResumableLoader(data, 4, dp=2, dp_rank=1, seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="dp_rank=2 is not a rank of dp=2"):
        DPBatchSampler(30, 6, 2, 2)


def test_micro_batches_must_split_each_ranks_rows_and_the_lr_is_required():
    import loop_zero1_tp

    def parse(argv):
        return loop_zero1_tp.parse(loop_zero1_tp.__doc__, argv)

    assert "--accum 3" in refused(parse, "--lr", "0.01", "--dp", "2", "--tp", "1", "--batch", "8", "--accum", "3")
    assert "--lr" in refused(parse, "--dp", "2", "--tp", "1")
