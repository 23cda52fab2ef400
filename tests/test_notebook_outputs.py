"""A chapter shows what it computes where it computes it, as a notebook as well as on the page.

Jupyter, JupyterLab, VS Code and Colab render a notebook's Markdown cells and its cells' outputs, and
nothing of the book build's machinery: not MyST-NB's glue records (``application/papermill.record/*``
outputs), not ``{glue}`` roles or ``{literalinclude}`` directives in Markdown (shown as raw text). So the
chapters the build executed (``_build/executed/``, the notebooks a reader's "Run all" reproduces) are
checked for what a notebook reader would see:

- every figure and explorer is the single display output of the cell that makes it (an image or a
  Plotly figure), and that cell carries the ``mystnb`` caption and name the book numbers it by;
- every number the prose quotes is in a displayed paragraph (``say``), filled in, with no placeholder left;
- no Markdown cell holds ``{glue``, ``{literalinclude}`` or ``{eval}``;
- the build's bookkeeping (``keep``, glue records for the claims appendix, verdict helpers, the
  assertions that guard a claim) sits in cells the book removes and Jupyter and Colab fold.

And on the built page, each chapter shows exactly the figures its notebook makes.
"""
from __future__ import annotations

import re

import nbformat
import pytest

from muongrid.lab import verdicts
from muongrid.lab.notebook import chapters
from conftest import executed_notebook

CHAPTERS = [p.stem for p in chapters()]
RAW_IN_JUPYTER = ("{glue", "{literalinclude}", "{eval}")
FIGURE_TYPES = ("image/png", "image/svg+xml", "application/vnd.plotly.v1+json")
# The helpers that decide a timing verdict for the prose (bookkeeping); spread_text and ratio_text only
# format the spread a reader is shown, and stay in view.
VERDICT_HELPERS = ["beats", "fastest", "fastest_text", "versus_claim"]
assert all(callable(getattr(verdicts, n)) for n in VERDICT_HELPERS)
BOOKKEEPING_CALL = re.compile(r"\b(glue|keep|glue_checks|record|" + "|".join(VERDICT_HELPERS) + r")\(")


def folded(cell) -> bool:
    """Whether a notebook reader sees the cell's source only on asking (Jupyter's and Colab's fold)."""
    return bool(cell.metadata.get("jupyter", {}).get("source_hidden"))


def removed_from_page(cell) -> bool:
    tags = cell.metadata.get("tags", [])
    return "remove-cell" in tags or "remove-input" in tags


def hidden_on_page(cell) -> bool:
    """The book removes the cell's source, or folds it behind a toggle."""
    tags = cell.metadata.get("tags", [])
    return removed_from_page(cell) or "hide-input" in tags or "hide-cell" in tags


def displays(cell) -> list:
    return [o for o in cell.get("outputs", []) if o.get("output_type") in ("display_data", "execute_result")]


def figure_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and c.metadata.get("mystnb", {}).get("figure")]


@pytest.mark.parametrize("name", CHAPTERS)
def test_a_chapter_shows_what_it_computes(name):
    nb = nbformat.read(executed_notebook(name), as_version=4)
    problems = []
    for i, cell in enumerate(nb.cells):
        where = f"{name} cell {i}"
        if cell.cell_type == "markdown":
            problems += [f"{where}: Markdown holds {raw}" for raw in RAW_IN_JUPYTER if raw in cell.source]
            continue
        if cell.cell_type != "code":
            continue
        hidden = folded(cell) and hidden_on_page(cell)
        if hidden_on_page(cell) and not folded(cell):
            problems.append(f"{where}: the book hides its source but Jupyter and Colab would show it")
        if not hidden:
            calls = BOOKKEEPING_CALL.findall(cell.source)
            if calls:
                problems.append(f"{where}: a visible cell does the build's bookkeeping: {sorted(set(calls))}")
            if re.search(r"^\s*assert\b", cell.source, re.M):
                problems.append(f"{where}: a visible cell asserts (guards belong in a folded cell)")
        records = [o for o in cell.get("outputs", [])
                   if any(k.startswith("application/papermill.record/") for k in o.get("data", {}))]
        if records and not (hidden and "remove-cell" in cell.metadata.get("tags", [])):
            problems.append(f"{where}: a glue record outside a folded, removed cell")
        if cell.source.lstrip().startswith("say("):
            shown = displays(cell)
            if len(shown) != 1 or "text/markdown" not in shown[0]["data"]:
                problems.append(f"{where}: a say() cell shows no Markdown paragraph")
            elif "{{" in shown[0]["data"]["text/markdown"]:
                problems.append(f"{where}: a paragraph shows an unfilled placeholder")
        figure = cell.metadata.get("mystnb", {}).get("figure")
        if figure:
            if not figure.get("name") or not figure.get("caption"):
                problems.append(f"{where}: a figure cell without a name and a caption: {figure}")
            shown = displays(cell)
            if len(shown) != 1:
                problems.append(f"{where}: figure {figure.get('name')} has {len(shown)} display outputs, "
                                "not 1 (the book would wrap each in the figure)")
            elif not any(t in shown[0]["data"] for t in FIGURE_TYPES):
                problems.append(f"{where}: figure {figure.get('name')} shows {sorted(shown[0]['data'])}, "
                                f"no image or Plotly figure")
    assert not problems, "\n".join(problems)


def test_the_book_has_figures_and_prose_cells():
    """The checks above are not vacuous: the chapters do make figures and quote numbers through cells."""
    nbs = {n: nbformat.read(executed_notebook(n), as_version=4) for n in ("01_muon", "04_zero1_buffer")}
    assert len(figure_cells(nbs["01_muon"])) >= 3
    assert any(c.source.startswith("say(") for c in nbs["01_muon"].cells if c.cell_type == "code")
    assert any(c.source.startswith("listing(") for c in nbs["04_zero1_buffer"].cells if c.cell_type == "code")


def test_each_page_shows_the_figures_its_notebook_makes(built_book):
    """On the built page, a chapter's numbered figures are exactly its notebook's figure cells, each an
    image or a Plotly figure inside its ``<figure>`` (none lost to a caption without content)."""
    problems = []
    for name in CHAPTERS:
        nb = nbformat.read(executed_notebook(name), as_version=4)
        names = sorted(c.metadata["mystnb"]["figure"]["name"] for c in figure_cells(nb))
        html = (built_book / "notebooks" / f"{name}.html").read_text()
        figures = re.findall(r'<figure[^>]*\bid="([^"]+)"[^>]*>(.*?)</figure>', html, re.S)
        on_page = sorted(fid for fid, _ in figures)
        if on_page != names:
            problems.append(f"{name}: page figures {on_page}, notebook figures {names}")
        for fid, body in figures:
            if "<img" not in body and "plotly-graph-div" not in body:
                problems.append(f"{name}: figure {fid} has no image or Plotly figure on the page")
    assert not problems, "\n".join(problems)


def test_every_page_says_when_the_colab_button_cannot_work(built_book):
    """While ``repository.url`` is the placeholder, every page says, above its Colab button, that the
    repository is not public (book/_ext/offline_assets.py); once it is published, no page says so."""
    from muongrid.lab.notebook import repository_is_public

    for page in ("book/index.html", "notebooks/01_muon.html"):
        html = (built_book / page).read_text()
        assert ("repository is not public yet" in html) == (not repository_is_public()), page


def test_a_downloaded_chapter_stops_in_its_first_cell_and_says_what_to_do(tmp_path):
    """A chapter's .ipynb opened outside a checkout (downloaded from the page) stops in its set-up cell
    with what to do, before any cell that would fail obscurely."""
    import shutil

    from nbclient.exceptions import CellExecutionError

    from conftest import ROOT
    from booktools.nbexec import GuardedClient

    nb = nbformat.read(ROOT / "notebooks" / "01_muon.ipynb", as_version=4)
    nb.cells = nb.cells[:2] + [nbformat.v4.new_code_cell('print("the chapter went on")')]
    shutil.copy(ROOT / "notebooks" / "01_muon.ipynb", tmp_path)

    with pytest.raises(CellExecutionError, match="make lab"):
        GuardedClient(nb, label="downloaded chapter", timeout=120,
                      resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert nb.cells[1].outputs and not nb.cells[2].get("outputs")
