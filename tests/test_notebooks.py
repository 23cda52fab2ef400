"""The chapters: paired sources in sync, set-up cells current, every chapter executes with nbclient,
and a chapter whose launched script fails, fails.

Each chapter is executed once per test session (``conftest.executed_notebook``); the book and
browser tests render those executed copies.
"""
from __future__ import annotations

import json

import jupytext
import nbformat
import pytest
from nbclient.exceptions import CellExecutionError

from muongrid.lab.notebook import SETUP_MARKER, chapters, colab_installs, repository_url, sync
from conftest import ROOT, execute_notebook, executed_notebook

NOTEBOOKS = ROOT / "notebooks"
CHAPTERS = [p.stem for p in chapters()]


def test_there_are_chapters_0_to_7():
    assert [c[:2] for c in CHAPTERS][:8] == ["00", "01", "02", "03", "04", "05", "06", "07"]


@pytest.mark.parametrize("name", CHAPTERS)
def test_pair_is_in_sync_and_ipynb_has_no_outputs(name):
    py = jupytext.read(NOTEBOOKS / f"{name}.py")
    ipynb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    assert [(c.cell_type, c.source) for c in py.cells] == [(c.cell_type, c.source) for c in ipynb.cells], \
        f"{name}.py and {name}.ipynb differ: run `jupytext --sync notebooks/{name}.py`"
    # The metadata that decides what a reader sees: the book's tags, MyST-NB's figure captions and names,
    # and the folds Jupyter and Colab apply (jupytext keeps exactly these: cell_metadata_filter).
    kept = ("tags", "mystnb", "jupyter")
    assert [{k: c.metadata.get(k) for k in kept} for c in py.cells] == \
        [{k: c.metadata.get(k) for k in kept} for c in ipynb.cells], \
        f"{name}.py and {name}.ipynb differ in cell metadata: run `jupytext --sync notebooks/{name}.py`"
    assert py.metadata["jupytext"]["cell_metadata_filter"] == "tags,mystnb,jupyter,-all"
    assert all(not c.get("outputs") and not c.get("execution_count") for c in ipynb.cells if c.cell_type == "code")
    assert ipynb.metadata.get("kernelspec", {}).get("name") == "python3"


def test_setup_cells_are_generated_from_the_one_repository_url():
    assert sync(check_only=True) == [], "run `python -m muongrid.lab.notebook sync`"
    url = repository_url()
    assert url.startswith("https://github.com/")
    for name in CHAPTERS:
        cells = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4).cells
        # The page opens with its title; the (folded) set-up cell comes right below it.
        assert cells[0].cell_type == "markdown" and cells[0].source.startswith("# "), name
        assert SETUP_MARKER in cells[1].source, name
        first = next(c for c in cells if c.cell_type == "code")
        assert SETUP_MARKER in first.source and f'REPOSITORY = "{url}"' in first.source
        assert "hide-cell" in first.metadata.get("tags", [])
        wanted = first.source.split("wanted = ")[1].split("\n")[0]
        assert wanted == repr(colab_installs(NOTEBOOKS / f"{name}.py")) and "torch" not in wanted  # never torch


CODE_COLUMNS = 88


def test_code_cells_fit_the_page():
    """Every line of a code cell the book shows (the set-up cell included) has at most 88 characters: at
    1280 px a code cell of the book shows that many without scrolling (tests/test_browser.py checks pages).
    Cells whose input the book removes (``remove-input``, ``remove-cell``: prose a cell displays, listings,
    bookkeeping) never show their source on a page."""
    long_lines = []
    for path in chapters():
        code = False
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith("# %%"):
                code = "[markdown]" not in line and "remove-input" not in line and "remove-cell" not in line
            elif code and len(line) > CODE_COLUMNS:
                long_lines.append(f"{path.name}:{n}: {len(line)} columns")
    assert not long_lines, f"code lines over {CODE_COLUMNS} columns: {long_lines}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_executes(name):
    nb = nbformat.read(executed_notebook(name), as_version=4)  # raises CellExecutionError on any failure
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "some cells did not run"
    assert not [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]


def test_a_failing_script_fails_the_notebook(tmp_path):
    """`!python script.py` would not raise; muongrid.lab.notebook.run must, so a broken script breaks the build."""
    setup = next(c for c in nbformat.read(NOTEBOOKS / f"{CHAPTERS[0]}.ipynb", as_version=4).cells if c.cell_type == "code")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(setup.source),
        nbformat.v4.new_code_cell('from muongrid.lab.notebook import run\nrun("verify.py --dp 0")'),
        nbformat.v4.new_code_cell('print("this cell must never run")'),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    with pytest.raises(CellExecutionError, match="exited with code 2"):
        execute_notebook(nb, timeout=120)
    assert not nb.cells[2].get("outputs")


def test_expected_failure_that_succeeds_also_fails(tmp_path):
    from muongrid.lab import notebook

    with pytest.raises(notebook.ScriptFailed, match="expected to fail"):
        notebook.run("verify.py", "--shapes", "8x8", "--steps", "1", expect_failure=True)
    # the command as one string, as the chapters write it, runs the same script with the same arguments
    assert json.loads(notebook.run("verify.py --shapes 8x8 --steps 1").strip().splitlines()[-1])["ok"]
