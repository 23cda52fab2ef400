"""Chapter 5's step explorer (muongrid/lab/step_explorer.py): the bytes it shows are the ledger's, and the closed
form's; what it shows each rank holding is what the trace saw; its controls switch precomputed frames.

One real traced step (``scripts/trace_step.py``, 2 x 2, bucket and owner, shapes that divide by nothing and
buckets small enough to need padding); tests/test_browser.py moves the figure in the built chapter.

    PYTHONPATH=scripts python -m pytest -q tests/test_step_explorer.py
"""
from __future__ import annotations

import copy

import plotly.graph_objects as go
import pytest

from conftest import ODD_SHAPES, ODD_TP_DIMS, last_json, script

from muongrid.lab import costmodel
from muongrid.lab.step_explorer import STAGES, runs_of, stage_rows, step_explorer

BUCKET = 700   # elements: the five matrices (TP-local) fill three buckets, padded


@pytest.fixture(scope="module")
def traced() -> dict:
    proc = script("trace_step.py", "--dp", "2", "--tp", "2", "--shapes", ODD_SHAPES, "--tp-dims", ODD_TP_DIMS,
                  "--bucket-numel", str(BUCKET), "--layouts", "bucket,owner", "--show", "w1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_json(proc.stdout)


def test_the_run_is_what_the_test_means(traced):
    """Both layouts ran, on four ranks, over several padded buckets (else the checks below prove less)."""
    assert [r["layout"] for r in runs_of(traced)] == ["bucket", "owner"]
    for run in runs_of(traced):
        assert [r["rank"] for r in run["ranks"]] == [0, 1, 2, 3]
        assert len({m["bucket"] for m in run["ranks"][0]["matrices"]}) > 1
        # momentum and master stay fp32; what the gathers move is bf16
        assert all(r["state"]["momentum"]["dtype"] == r["state"]["master"]["dtype"] == "float32" for r in run["ranks"])
        moved = {rec["dtype"] for r in run["ranks"] for rec in r["records"] if rec["phase"].startswith("ns_")}
        assert moved == {"bfloat16"}


def test_each_records_peers_add_up_to_its_bytes(traced):
    """``Comm.peers``: a ring collective's bytes spread over the other members of its group (a DP group: the
    ranks with this TP rank); an all-to-all's, to the ranks it sent to."""
    tp = traced["tp"]
    for run in runs_of(traced):
        for rank in run["ranks"]:
            for rec in rank["records"]:
                peers = {int(q): b for q, b in rec["peers"].items()}
                assert sum(peers.values()) == rec["bytes_sent"], rec
                assert rank["rank"] not in peers
                if rec["group"] == "dp":
                    assert all(q % tp == rank["tp_rank"] for q in peers)
                if rec["group"] == "tp":
                    assert all(q // tp == rank["dp_rank"] for q in peers)


def test_the_bytes_shown_are_the_ledgers_and_the_closed_forms(traced):
    rows = stage_rows([traced])
    groups = [dict(shapes=traced["shapes"], tp_split_dims=traced["tp_dims"], use_muon=True)]
    dp, tp = traced["dp"], traced["tp"]
    for run in runs_of(traced):
        closed = {r: costmodel.step_bytes(groups, dp, tp, BUCKET, layout=run["layout"], rank=r) for r in range(dp * tp)}
        for rank in run["ranks"]:
            mine = [row for row in rows if (row["layout"], row["rank"]) == (run["layout"], rank["rank"])]
            assert [row["stage"] for row in mine] == list(range(len(STAGES)))
            ledger = rank["ledger"]["phases"]
            for row in mine:
                phases = STAGES[row["stage"]][2]
                assert row["bytes_sent"] == sum(ledger[p]["bytes_sent"] for p in phases if p in ledger)
                assert row["bytes_sent"] == sum(closed[rank["rank"]][p] for p in phases)
            assert sum(row["bytes_sent"] for row in mine) == rank["ledger"]["bytes_sent"] > 0
    # the layouts differ where they should: the owner layout sends less in all, and no TP gather
    total = {layout: sum(r["bytes_sent"] for r in rows if r["layout"] == layout) for layout in ("bucket", "owner")}
    assert total["owner"] < total["bucket"]
    assert not any(r["bytes_sent"] for r in rows if r["layout"] == "owner" and r["stage"] == 4)


def test_the_figure_draws_those_bytes(traced):
    """Each frame's send matrix (rows: from, columns: to) holds the rows' bytes, and each row of it sums to
    what the ledger says that rank sent in that stage."""
    rows = stage_rows([traced])
    fig = step_explorer([traced], active_grid=(2, 2), active_stage=3)
    maps = [t for t in fig.data if isinstance(t, go.Heatmap)]
    assert len(maps) == len(STAGES) * 2   # one per stage and layout
    for k, heat in enumerate(maps):
        stage, layout = k // 2, ("bucket", "owner")[k % 2]
        for row in (r for r in rows if (r["stage"], r["layout"]) == (stage, layout)):
            drawn = list(heat.z[row["rank"]])
            assert sum(drawn) == row["bytes_sent"]
            assert {q: b for q, b in enumerate(drawn) if b} == row["sends"]


def test_what_each_rank_holds_is_what_the_trace_saw(traced):
    rows = stage_rows([traced])
    names = [m["name"] for m in runs_of(traced)[0]["ranks"][0]["matrices"]]

    def held(layout, stage, rank):
        return next(r for r in rows if (r["layout"], r["stage"], r["rank"]) == (layout, stage, rank))["holds"]

    for r in range(4):
        # the bucket layout: every rank has every matrix's TP slice after the DP gather, whole after the TP one
        assert [h["name"] for h in held("bucket", 3, r)] == names
        assert all(h["numel"] == h["whole"] for h in held("bucket", 5, r))
        assert all("fp32" in h["label"] for s in (0, 1, 2, 7, 8) for h in held("bucket", s, r))
        assert all("bf16" in h["label"] for s in (3, 4, 5, 6) for h in held("bucket", s, r))
    # the owner layout: each matrix orthogonalised on one rank only, whole
    owners = [h["name"] for r in range(4) for h in held("owner", 5, r)]
    assert sorted(owners) == sorted(names)
    # after the step each DP pair holds its TP slice of every matrix between them, once
    for layout in ("bucket", "owner"):
        for t in range(2):
            for name in names:
                kept = sum(h["numel"] for r in (t, 2 + t) for h in held(layout, 6, r) if h["name"] == name)
                assert kept == sum(h["numel"] for h in held(layout, 0, t) if h["name"] == name)


def test_controls_switch_precomputed_frames(traced):
    fig = step_explorer([traced], active_grid=(2, 2), active_stage=3)
    (slider,), (menu,) = fig.layout.sliders, fig.layout.updatemenus
    assert [s.label for s in slider.steps] == [s[0] for s in STAGES]
    assert [b.label for b in menu.buttons] == ["2 x 2"]
    shown = [i for i, t in enumerate(fig.data) if t.visible]
    assert shown == [i for i, v in enumerate(slider.steps[3].args[0]["visible"]) if v]
    titles, seen = [], set()
    for step in slider.steps:   # one frame's traces and its title; never an axis
        (key, title), = step.args[1].items()
        frame = {i for i, v in enumerate(step.args[0]["visible"]) if v}
        assert key.startswith("annotations[") and frame and not frame & seen
        seen |= frame
        titles.append(title)
    assert seen == set(range(len(fig.data)))   # every trace drawn belongs to one stage
    assert all(f"Stage {k} of 8" in t for k, t in enumerate(titles))
    assert fig.layout.annotations[int(key[12:-6])].text == titles[3]


def test_a_phase_it_does_not_know_fails(traced):
    other = copy.deepcopy(traced)
    other["runs"][0]["ranks"][0]["records"][0]["phase"] = "ns_group_gram"
    with pytest.raises(ValueError, match="ns_group_gram"):
        stage_rows([other])
