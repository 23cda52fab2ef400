"""One colour scheme per quantity: the book's figures take their colours from ``muongrid.lab.palette``.

The plotting code (every chapter's code cells, ``muongrid/lab/explorers.py``, ``diagrams.py`` and
``step_explorer.py``) may not write a colour of its own: no hex literal, no matplotlib cycle colour
(``"C0"``, ``f"C{i}"``), no ``tab:`` colour and no colormap (``plt.cm.``). Named neutrals (black,
white, grey) are fine.
And so that the check cannot pass by a figure simply using matplotlib's defaults, every figure that
shows one of the palette's quantities must take them from it: the cell that draws it (the one whose
``mystnb`` figure name is ``fig-<key>``) names ``palette``, or it is drawn by one of those modules,
which do. Nothing is executed (a second).

    PYTHONPATH=scripts python -m pytest -q tests/test_palette.py
"""
from __future__ import annotations

import re

import jupytext
import pytest

from conftest import ROOT

COLOUR = re.compile(r"""["']#[0-9a-fA-F]{3}(?:[0-9a-fA-F]{3})?["']"""  # "#4c72b0"
                    r"""|["']C\d["']|f["']C\{"""                     # "C0", f"C{i}"
                    r"""|["']tab:\w+["']|\bplt\.cm\.\w+|\bcm\.\w+\(""")  # "tab:blue", plt.cm.tab10
LAB = ROOT / "scripts" / "muongrid" / "lab"

# Figures that show a quantity of the palette, by key (figure fig-<key>): the cell that draws them must use it.
USES_PALETTE = ["ch1-training", "ch2-memory", "ch3-grid", "ch4-plan", "ch5-stages", "ch6-layouts",
                "ch6-projection", "ch7-breakdown", "ch7-trace", "ch8-bytes", "ch8-times", "ch9-tp-plan",
                "ch9-spectra", "ch9-study", "ch9-profile", "ch10-state", "ch11-shard-ortho", "ch15-group-steps",
                "ch15-projection"]
# Figures drawn by a module that takes its colours from the palette.
BY_MODULE = {"explorers": ["ch1-nsmap", "ch1-coefficients", "ch2-explorer", "ch2-grid", "ch4-explorer",
                           "ch4-buckets", "ch6-explorer", "ch6-latency"],
             "diagrams": ["ch2-collectives", "ch5-flow", "ch8-layouts", "ch11-holders"],
             "step_explorer": ["ch5-explorer"]}
# Cells left alone on purpose, with the reason.
EXEMPT: dict[str, str] = {}


def colour_problems(source: str) -> list[str]:
    """Every hard-coded colour in ``source``, with its line."""
    return [f"line {i}: {m.group(0)}" for i, line in enumerate(source.splitlines(), 1)
            for m in COLOUR.finditer(line) if not line.lstrip().startswith("#")]


def code_cells() -> dict[str, list]:
    return {py.name: [c for c in jupytext.read(py).cells if c.cell_type == "code"]
            for py in sorted((ROOT / "notebooks").glob("*.py"))}


def gluing(cells: dict[str, list], key: str) -> str:
    """The source of the code cell that draws figure ``fig-<key>`` (its ``mystnb`` figure name)."""
    found = [c.source for cs in cells.values() for c in cs
             if c.metadata.get("mystnb", {}).get("figure", {}).get("name") == f"fig-{key}"]
    assert len(found) == 1, f"{len(found)} cells draw figure fig-{key}"
    return found[0]


def test_no_plotting_code_writes_its_own_colour():
    cells = code_cells()
    exempt = [gluing(cells, key) for key in EXEMPT]
    bad = {f"{name} cell {i}": p for name, cs in cells.items() for i, c in enumerate(cs)
           if c.source not in exempt and (p := colour_problems(c.source))}
    for module in ("explorers", "diagrams", "step_explorer"):
        if p := colour_problems((LAB / f"{module}.py").read_text()):
            bad[f"muongrid/lab/{module}.py"] = p
    assert not bad, f"colours written in place of muongrid.lab.palette: {bad}"


def test_the_figures_of_the_palettes_quantities_take_it():
    cells = code_cells()
    for key in USES_PALETTE:
        assert "palette" in gluing(cells, key), f"{key} does not take its colours from muongrid.lab.palette"
    for module, keys in BY_MODULE.items():
        assert "from . import palette" in (LAB / f"{module}.py").read_text()
        for key in keys:
            assert re.search(rf"\b(?:{module}|Figure|\w+_(?:explorer|diagram))\b", gluing(cells, key)), key


def test_the_palette_names_every_quantity_once():
    from muongrid.lab import palette

    assert set(palette.OPTIMIZER) == {"muon", "adamw"}
    assert len(set(palette.OPTIMIZER.values())) == 2
    for family in (palette.STEP, palette.PHASE, palette.MEMORY):
        assert len(set(family.values())) == len(family), family  # no two parts alike in one figure
    assert {"bucket", "owner", "aligned"} <= set(palette.LAYOUT)
    from muongrid.lab.costmodel import PHASES

    assert set(PHASES) == set(palette.PHASE)


def test_the_colour_check_catches_what_it_is_for():
    """It can fail: each kind of hard-coded colour is found; the palette's names and neutrals pass."""
    for bad in ('ax.plot(x, color="#4c72b0")', "ax.bar(x, y, color='#fff')", 'color="C1"',
                'color=f"C{i}"', 'COLOURS = ["tab:blue"]', "colors = plt.cm.tab10.colors",
                "fc=plt.cm.Pastel1(r)", 'marker=dict(color="#d62728")'):
        assert colour_problems(bad), bad
    for fine in ('ax.plot(x, color=palette.OPTIMIZER["muon"])', 'ax.axvline(8, color="black")',
                 'ec="grey"', "# a comment naming #4c72b0 is not code", 'label="C0 and C1"'):
        assert not colour_problems(fine), fine
    import nbformat

    other = nbformat.v4.new_code_cell("show(fig)", metadata={"mystnb": {"figure": {"name": "fig-other"}}})
    with pytest.raises(AssertionError, match="0 cells draw figure fig-missing"):
        gluing({"x.py": [other]}, "missing")
    assert gluing({"x.py": [other]}, "other") == "show(fig)"
