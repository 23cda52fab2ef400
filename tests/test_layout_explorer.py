"""Chapter 13's kernel-free explorer (muongrid/lab/layout_explorer.py): what it draws is the models' numbers,
and its controls switch between precomputed frames (tests/test_browser.py moves it in a real page)."""
from __future__ import annotations

import pytest

from muongrid.lab import costmodel, timemodel
from muongrid.lab.layout_explorer import explorer_rows, layout_explorer, shape_sets

HW = dict(name="test", flops=1e12, efficiency=1.0, ranks_per_node=None, intra=(1e-5, 1e9), inter=(1e-5, 1e9),
          reduce_scatter_as_all_reduce=False, shared_cores=False, max_ranks=2)
SETS = {"a": [dict(shapes=[(64, 32), (48, 48)], tp_split_dims=[0, 1], use_muon=True)],
        "b": [dict(shapes=[(96, 32)], tp_split_dims=[0], use_muon=True)]}
GRIDS = ((2, 1), (2, 2))


def test_rows_are_the_cost_and_time_models():
    rows = explorer_rows(SETS, GRIDS, 1000, [HW])
    assert len(rows) == len(SETS) * len(GRIDS) * len(timemodel.CLASSIC_LAYOUTS)
    for r in rows:
        groups, grid = SETS[r["shapes"]], (r["dp"], r["tp"])
        muon = r["layout"] != "adamw"
        sent = costmodel.step_bytes(groups, *grid, 1000, muon=muon, layout=r["layout"] if muon else "bucket")
        assert r["bytes_per_rank"] == sent["total"]
        assert r["busiest_ns_flops"] == timemodel.busiest_ns_flops(groups, *grid, 1000, r["layout"])
        if grid == (2, 1):  # within the profile's max_ranks
            assert r["seconds"]["test"] == timemodel.step_seconds(groups, *grid, 1000, r["layout"], HW)
        else:
            assert r["seconds"] == {}
    assert {r["ns_runs_per_matrix"] for r in rows if r["layout"] == "bucket" and r["dp"] * r["tp"] == 4} == {4}


def test_controls_switch_precomputed_frames_without_rescaling():
    fig = layout_explorer(explorer_rows(SETS, GRIDS, 1000, [HW]))
    per_frame = 4  # bytes, NS, state, one profile's time
    assert len(fig.data) == len(SETS) * len(GRIDS) * per_frame
    (menu,), (slider,) = fig.layout.updatemenus, fig.layout.sliders
    assert [b.label for b in menu.buttons] == list(SETS)
    assert [s.label for s in slider.steps] == ["2x1", "2x2"]
    shown = [i for i, t in enumerate(fig.data) if t.visible]
    assert len(shown) == per_frame and shown == [i for i, v in enumerate(slider.steps[slider.active].args[0]["visible"]) if v]
    for step in slider.steps:  # a slider step changes visibility and title, never an axis range
        assert sum(step.args[0]["visible"]) == per_frame and set(step.args[1]) == {"title.text"}
    for button in menu.buttons:  # the menu swaps the slider (its own frames) and the axis ranges
        assert {"sliders", "yaxis.range", "yaxis4.range"} <= set(button.args[1])
    # the bytes drawn for set "a" on 2 x 1 are the rows' bytes, in MB
    rows = [r for r in explorer_rows(SETS, GRIDS, 1000, [HW]) if (r["shapes"], r["dp"], r["tp"]) == ("a", 2, 1)]
    assert list(fig.data[0].y) == pytest.approx([r["bytes_per_rank"] / 1e6 for r in rows])


def test_the_three_sets_of_shapes():
    sets = shape_sets()
    assert list(sets) == ["balanced stack", "report shapes", "Llama-3-8B layer"]
    llama = sets["Llama-3-8B layer"][0]
    assert llama["shapes"] == [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096), (14336, 4096),
                               (14336, 4096), (4096, 14336)]
    assert llama["tp_split_dims"] == [0, 0, 0, 1, 0, 0, 1]
    assert sets["report shapes"][0]["shapes"][0] == (4096, 4096)
