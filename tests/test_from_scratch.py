"""scripts/from_scratch.py: distributed Muon in plain torch.distributed equals muongrid's, bit for bit.

One launch per grid (2x1 and 2x2, chapter 5's), each with planted bugs stepped beside the real thing,
so the same launch shows that the comparison can fail. The shapes are the script's defaults: every
group's TP-local buffer divides unevenly by dp on some grid (padding) and matrices straddle DP shards.
"""
from __future__ import annotations

import functools
import math

import pytest

import from_scratch
from conftest import last_json, refused, script
from muongrid.lab.synthetic import build_problem

PLANTS = {(2, 1): ["no-mean", "lost-momentum"], (2, 2): ["no-mean", "tp-lr", "tp-slice"]}


@functools.lru_cache(maxsize=None)
def launched(dp: int, tp: int):
    proc = script("from_scratch.py", "--dp", str(dp), "--tp", str(tp), "--steps", "3",
                  "--plant", ",".join(PLANTS[(dp, tp)]))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return last_json(proc.stdout)


@pytest.mark.parametrize("dp,tp", list(PLANTS), ids=[f"{d}x{t}" for d, t in PLANTS])
def test_from_scratch_equals_muongrid_bit_for_bit(dp, tp):
    result = launched(dp, tp)
    assert (result["dp"], result["tp"], result["layout"], result["steps"]) == (dp, tp, "bucket", 3)
    assert result["equal"] is True   # int32 patterns of every parameter, rank and step
    assert result["max_abs_diff"] == 0.0 and result["per_step_max_abs_diff"] == [0.0] * 3
    # the problem is the hard case: buffers that need padding, matrices cut by a DP shard boundary
    problem = build_problem("muon", [tuple(s) for s in result["shapes"]], result["tp_dims"], 2, 0, tp)
    padded = straddling = 0
    for g in problem.groups:
        sizes = [math.prod(s) // (tp if d != -1 else 1) for s, d in zip(g["shapes"], g["tp_split_dims"])]
        shard = -(-sum(sizes) // dp)
        padded += sum(sizes) % dp != 0
        ends = [sum(sizes[:i + 1]) for i in range(len(sizes))]
        straddling += sum(1 for lo, hi in zip([0] + ends, ends) if lo // shard != (hi - 1) // shard)
    assert padded and straddling, (padded, straddling)
    assert any(d != -1 for d in result["tp_dims"]) and -1 in result["tp_dims"]


def test_planted_bugs_are_caught():
    """The comparison can fail: a one-line change to the class the book shows makes it differ."""
    two_by_one, two_by_two = launched(2, 1)["planted"], launched(2, 2)["planted"]
    assert two_by_one["lost-momentum"]["equal"] is False
    assert two_by_two["tp-lr"]["equal"] is False and two_by_two["tp-slice"]["equal"] is False
    for caught in (two_by_one["lost-momentum"], two_by_two["tp-lr"], two_by_two["tp-slice"]):
        assert caught["max_abs_diff"] > 1e-4
    # Summing the DP gradients instead of averaging them is invisible with dp = 2, as chapter 5 says:
    # doubling is exact in floating point and Newton-Schulz divides by the norm.
    assert two_by_one["no-mean"]["equal"] is True and two_by_two["no-mean"]["equal"] is True


def test_every_planted_bug_is_one_line_of_the_class():
    for name in from_scratch.PLANTED:
        assert from_scratch.planted(name).__name__ == "FromScratchMuon"


def test_unknown_planted_bug_is_refused():
    assert "unknown" in refused(from_scratch.main, "--dp", 2, "--plant", "nope")


def test_help_gives_the_defaults_it_runs_with(capsys):
    """``--help`` names the shapes the script steps when none are given (it said the proof of concept's)."""
    with pytest.raises(SystemExit):
        from_scratch.main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    args = from_scratch.parse_args(["--dp", "2"])
    assert "x".join(map(str, args.shapes[0])) == "36x57"
    assert f"(default: {','.join('x'.join(map(str, s)) for s in args.shapes)})" in shown
    assert "(default: 0,1,none,1,0)" in shown and args.tp_dims == [0, 1, -1, 1, 0]


def test_your_code_is_checked_before_anything_launches(tmp_path):
    """``--code`` runs a reader's version of the listing; what cannot run is refused by name first."""
    owner = str(from_scratch.__file__).replace("from_scratch.py", "from_scratch_owner.py")
    assert "no such class" in refused(from_scratch.main, "--dp", 2, "--class", "Nope")
    assert "leave out --code" in refused(from_scratch.main, "--dp", 2, "--plant", "tp-lr", "--code", owner)
    assert "No such file" in refused(from_scratch.main, "--dp", 2, "--code", tmp_path / "missing.py")
    broken = tmp_path / "broken.py"
    broken.write_text("class FromScratchMuon(:\n")
    assert "--code" in refused(from_scratch.main, "--dp", 2, "--code", broken)
    scope, defined = from_scratch.load_code(owner)   # the exercise's solution: one class on top of the listing
    assert defined == ["OwnerMuon"] and issubclass(scope["OwnerMuon"], scope["FromScratchMuon"])
