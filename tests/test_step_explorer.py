"""Chapter 5's step explorer (muongrid/lab/step_explorer.py): the bytes it shows are the ledger's, and the closed
form's; what it shows each rank holding is what the trace saw; its controls switch precomputed frames.

One real traced step (``scripts/trace_step.py``, 2 x 2, bucket and owner, shapes that divide by nothing and
buckets small enough to need padding), and a 2 x 1 one for the grid buttons; a ring of four ranks is a report
written here. tests/test_browser.py moves the figure in the built chapter.

    PYTHONPATH=scripts python -m pytest -q tests/test_step_explorer.py
"""
from __future__ import annotations

import copy

import plotly.graph_objects as go
import pytest

from conftest import ODD_SHAPES, ODD_TP_DIMS, last_json, script

from muongrid.lab import costmodel, explorers
from muongrid.lab.step_explorer import MIN_WIDTH, OFFSET, STAGES, runs_of, stage_rows, step_explorer
from muongrid.lab.step_transfers import describe, transfers

BUCKET = 700   # elements: the five matrices (TP-local) fill three buckets, padded


def trace(dp: int, tp: int) -> dict:
    proc = script("trace_step.py", "--dp", str(dp), "--tp", str(tp), "--shapes", ODD_SHAPES, "--tp-dims", ODD_TP_DIMS,
                  "--bucket-numel", str(BUCKET), "--layouts", "bucket,owner", "--show", "w1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_json(proc.stdout)


@pytest.fixture(scope="module")
def traced() -> dict:
    return trace(2, 2)


@pytest.fixture(scope="module")
def figure(traced) -> go.Figure:
    return step_explorer([traced], active_grid=(2, 2), active_stage=3)


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
    """``Comm.peers`` (the ledger's view; the explorer draws rings as rings): a ring collective's bytes spread
    over the other members of its group (a DP group: the ranks with this TP rank); an all-to-all's, to the ranks
    it sent to."""
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


def test_the_figure_draws_those_bytes(traced, figure):
    """Each frame's send matrix (rows: from, columns: to) holds the rows' bytes, and each row of it sums to
    what the ledger says that rank sent in that stage."""
    rows = stage_rows([traced])
    maps = [t for t in figure.data if isinstance(t, go.Heatmap)]
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


def test_controls_switch_precomputed_frames_and_a_grid_keeps_the_stage(traced):
    """The slider shows one stage's traces (of every grid) and sets each grid's title; a grid button only moves
    the axes' window to its grid's drawing (a relayout): it never touches what the slider chose."""
    other = trace(2, 1)   # a second grid, drawn OFFSET further along the same axes
    fig = step_explorer([traced, other], active_grid=(2, 2), active_stage=3)
    (slider,), (menu,) = fig.layout.sliders, fig.layout.updatemenus
    assert [s.label for s in slider.steps] == [s[0] for s in STAGES]
    assert [b.label for b in menu.buttons] == ["2 x 2", "2 x 1"]
    shown = [i for i, t in enumerate(fig.data) if t.visible]
    assert shown == [i for i, v in enumerate(slider.steps[3].args[0]["visible"]) if v]
    seen = set()
    for k, step in enumerate(slider.steps):   # one stage's traces, and one title per grid; never an axis
        frame = {i for i, v in enumerate(step.args[0]["visible"]) if v}
        assert frame and not frame & seen
        seen |= frame
        keys = list(step.args[1])
        assert len(keys) == 2 and all(key.startswith("annotations[") and key.endswith("].text") for key in keys)
        assert all(f"Stage {k} of 8" in title for title in step.args[1].values())
    assert seen == set(range(len(fig.data)))   # every trace drawn belongs to one stage
    titles = [fig.layout.annotations[int(key[12:-6])] for key in slider.steps[3].args[1]]
    assert [a.text for a in titles] == list(slider.steps[3].args[1].values())
    for k, button in enumerate(menu.buttons):
        assert button.method == "relayout"
        (window,) = button.args
        assert all(key.split(".")[1] in ("range", "tickvals", "ticktext") for key in window)
        # the grid's own title is in its window, the other grid's is not: Plotly draws only the one in range
        lo, hi = window["xaxis.range"]
        assert [lo <= a.x <= hi for a in titles] == [j == k for j in range(2)], (k, lo, hi)
        assert lo == OFFSET * k and all(titles[j].xref == "x" for j in range(2))
    # the figure opens on the active grid's window
    assert list(fig.layout.xaxis.range) == menu.buttons[0].args[0]["xaxis.range"]


def test_what_travels_is_named_and_adds_up(traced):
    """Each transfer's hover names its pieces; an all-to-all's pieces are its bytes exactly, a ring's its bytes
    less the shards' padding (``step_transfers`` raises otherwise, so building the rows checks every one)."""
    rows = stage_rows([traced])
    at = {(r["layout"], r["stage"], r["rank"]): r for r in rows}
    for r in range(4):
        ring = at["bucket", 3, r]["transfers"]
        assert list(ring) == [r ^ 2] and ring[r ^ 2]["kind"] == "ring all-gather over DP"
        assert {p["kept_by"] for p in ring[r ^ 2]["pieces"]} == {r}   # a ring of two passes its own shard
        for q, t in at["owner", 3, r]["transfers"].items():
            assert t["kind"] == "all-to-all" and t["padding"] == 0 and t["pieces"]
            assert {p["owner"] for p in t["pieces"]} == {q}   # each piece goes to its matrix's owner
            assert sum(p["numel"] for p in t["pieces"]) * 2 == t["bytes"]
        for q, t in at["owner", 6, r]["transfers"].items():   # and comes back to the rank that keeps it
            assert {(p["owner"], p["kept_by"]) for p in t["pieces"]} == {(r, q)}
    line = describe(at["owner", 3, 0]["transfers"][next(iter(at["owner", 3, 0]["transfers"]))]["pieces"][0], True)
    assert "kept by rank 0" in line and "its owner: rank" in line


def test_a_ring_goes_to_the_next_rank_and_passes_on_the_rest():
    """Four DP ranks: an all-gather passes every shard but the next rank's to the next rank; a reduce-scatter,
    partial sums of every shard but its own (so the bytes are the ledger's: three shards each)."""
    shard = 5

    def report(rank, op, phase):
        matrix = dict(name="w0", shape=[4, 5], full_shape=[4, 5], tp_split_dim=-1, owner=None,
                      slice=[rank * shard, (rank + 1) * shard])
        rec = dict(phase=phase, op=op, group="dp", dtype="float32", numel=shard, bytes_sent=3 * shard * 4,
                   peers={str(q): shard * 4 for q in range(4) if q != rank})
        return dict(rank=rank, dp_rank=rank, tp_rank=0, matrices=[matrix], records=[rec])

    for op, phase, skip in (("all_gather", "param_all_gather", 1), ("reduce_scatter", "grad_reduce_scatter", 0)):
        ranks = [report(r, op, phase) for r in range(4)]
        for r in range(4):
            (to, t), = transfers(ranks, r, (phase,), 4, 1).items()
            assert to == (r + 1) % 4 and t["bytes"] == 3 * shard * 4 and t["padding"] == 0
            assert sorted(p["kept_by"] for p in t["pieces"]) == sorted(set(range(4)) - {(r + skip) % 4})


def test_a_narrow_screen_scrolls_the_figure_instead_of_squeezing_it(figure):
    html = explorers._html(figure, include_plotlyjs=False)
    assert html.startswith(f'<div style="overflow-x: auto"><div style="min-width: {MIN_WIDTH}px">')
    assert not explorers._html(go.Figure(), include_plotlyjs=False).startswith("<div style=\"overflow")


def test_a_phase_it_does_not_know_fails(traced):
    other = copy.deepcopy(traced)
    other["runs"][0]["ranks"][0]["records"][0]["phase"] = "ns_group_gram"
    with pytest.raises(ValueError, match="ns_group_gram"):
        stage_rows([other])
