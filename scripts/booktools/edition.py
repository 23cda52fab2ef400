"""The notebook edition: each chapter as a reader opens it in Jupyter or Colab, written by ``make book``.

The repository's notebooks are the source: MyST for the book, no outputs. The edition is what the
pages' Colab buttons and ``.ipynb`` downloads give: ``_build/colab/notebooks/NN_name.ipynb`` (the
repository's paths; ``.github/workflows/book.yml`` pushes ``_build/colab`` to the branch that
``muongrid_edition_branch`` in ``_config.yml`` names), written from the executed chapter and the built
site:

- the outputs of the book's own run, and a note under the title naming the commit and the machine that
  made them, the licences and how to cite;
- Markdown with no MyST left (``booktools.mystmd``): references are links into the published site,
  checked against the build; admonitions are block quotes; folded solutions stay folded (``<details>``);
- each figure's caption (its ``mystnb`` metadata) in a Markdown cell under it, numbered as in the book;
- a Plotly figure's HTML loads plotly.js itself (Colab renders no Plotly JSON; JupyterLab and VS Code
  still get the JSON);
- the prose a ``say`` cell prints (and a listing or table cell that only displays) is a Markdown cell,
  there before anything runs; every other cell the book removes or folds is folded as Colab folds it
  (``cellView: form`` under a ``#@title``) and as JupyterLab does (``jupyter.source_hidden``), and the
  output of a cell the book removes is not kept;
- the set-up cell fetches the very commit that made the outputs.

    cd scripts && python -m booktools.edition     # _build/executed + _build/html -> _build/colab
"""
from __future__ import annotations

import ast
import re
import shutil
import sys
from pathlib import Path

import nbformat
import yaml

from muongrid.lab.notebook import ROOT, SETUP_PREFIX, repository_url, setup_cell

from .mystmd import MystError, Site, myst_left

BUILD = ROOT / "_build"
EDITION = BUILD / "colab"
DISPLAY_ONLY = {"say", "say_raw", "listing", "table"}   # muongrid.lab.page / notebook calls that only display
PLOTLY_JSON = "application/vnd.plotly.v1+json"
EDITION_MARKER = "# Set-up (written by `make book` for the notebook edition)."


def config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def branch() -> str:
    """The branch the publishing workflow pushes the edition to (and the Colab buttons open)."""
    return config()["sphinx"]["config"]["muongrid_edition_branch"]


def site_url() -> str:
    """Where the book is published: ``html.baseurl`` if ``_config.yml`` sets one, else the GitHub Pages
    address of ``repository.url`` (what ``.github/workflows/book.yml`` publishes to)."""
    base = (config().get("html") or {}).get("baseurl")
    if base:
        return base.rstrip("/") + "/"
    owner, name = repository_url().rstrip("/").split("/")[-2:]
    return f"https://{owner.lower()}.github.io/{name}/"


def plotly_loader() -> str:
    """The script tags with which Plotly's own HTML loads plotly.js from its CDN (version and integrity
    hash of the installed plotly's bundle), written once per figure: each output is its own frame in Colab."""
    import plotly.graph_objects as go

    page = go.Figure().to_html(full_html=False, include_plotlyjs="cdn")
    loader = "\n".join(re.findall(r"<script\b.*?</script>", page[:page.index('<div id="')], re.S))
    if "cdn.plot.ly" not in loader:
        raise RuntimeError(f"plotly's HTML no longer loads plotly.js from its CDN as expected: {page[:300]!r}")
    return loader


def _display_only(source: str) -> bool:
    """Whether a cell does nothing but display (``say(...)``, ``listing(...)``...): its output can stand for it."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    return bool(body) and all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
                              and getattr(s.value.func, "id", None) in DISPLAY_ONLY for s in body)


def _markdown_outputs(cell) -> list[str] | None:
    """The Markdown a cell displays, if that is all it outputs."""
    texts = []
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if out.get("output_type") != "display_data" or "text/markdown" not in data:
            return None
        texts.append(data["text/markdown"])
    return texts or None


def _fold(cell, title: str) -> None:
    """Fold a code cell as Colab does (a form: its title shown, the code behind "Show code") and as
    JupyterLab does. A cell magic must stay first, so such a cell gets no title line."""
    if not cell.source.startswith("%%"):
        cell.source = f"#@title {title}\n{cell.source}"
    cell.metadata["cellView"] = "form"
    cell.metadata.setdefault("jupyter", {})["source_hidden"] = True


class Edition:
    """Writes the edition of chapters executed by the build, against the site built from them."""

    def __init__(self, html: Path, url: str | None = None):
        self.url = url or site_url()
        self.site = Site(html, self.url)
        self.repo = repository_url().rstrip("/")
        self.loader = plotly_loader()
        self.title, self.author, self.year = (config().get(k) for k in ("title", "author", "copyright"))

    def chapter(self, nb, stem: str):
        """The edition of chapter ``stem``, made from its executed notebook ``nb`` (in place)."""
        run = nb.metadata.get("muongrid", {}).get("run")
        if not run or not run.get("commit"):
            raise ValueError(f"{stem}: the executed copy does not say which commit made it (executed before "
                             "booktools.bookbuild recorded it): run `make book` again")
        page = f"notebooks/{stem}"
        out, cells = nb, []
        for index, cell in enumerate(out.cells):
            cell.metadata.pop("execution", None)
            tags = set(cell.metadata.pop("tags", []))
            figure = cell.metadata.pop("mystnb", {}).get("figure")
            if cell.cell_type == "markdown":
                cell.source = self.site.markdown(cell.source, page)
                cells.append(cell)
                if index == 0:
                    cells.append(self._note(cell, stem, run))
                continue
            if cell.cell_type != "code":
                cells.append(cell)
                continue
            if "remove-cell" in tags:  # what the book never shows is not kept
                cell.outputs, cell.execution_count = [], None
            self._outputs(cell, page)
            if SETUP_PREFIX in cell.source:  # the same cell (and installs), fetching the commit that ran
                wanted = ast.literal_eval(re.search(r"^    wanted = (.*)$", cell.source, re.M).group(1))
                cell.source = setup_cell(ROOT / "notebooks" / f"{stem}.py", commit=run["commit"],
                                         marker=EDITION_MARKER, wanted=wanted).split("\n", 1)[1].rstrip("\n")
                _fold(cell, f"Set-up: in Colab, fetch the book's code at commit {run['commit'][:10]}")
            elif "remove-cell" in tags:
                _fold(cell, "For the book's build: values its text quotes, checks of its claims")
            elif "remove-input" in tags:
                shown = _markdown_outputs(cell)
                if shown is not None and _display_only(cell.source):
                    cell = nbformat.v4.new_markdown_cell("\n\n".join(shown), id=cell.id)
                else:
                    _fold(cell, "The code behind the output below")
            elif tags & {"hide-input", "hide-cell"}:
                _fold(cell, "The code behind the output below" if cell.outputs else "Code")
            cells.append(cell)
            if figure:
                cell.metadata["muongrid"] = {"figure": figure["name"]}
                cells.append(self._caption(figure, cell.id, page))
        out.cells = cells
        out.metadata.pop("jupytext", None)
        out.metadata["muongrid"] = {"edition": {
            "source": f"notebooks/{stem}.py", "site": self.site.address(f"{page}.html"), "run": run,
            "license": {"text and figures": "CC-BY-4.0", "code": "BSD-3-Clause"},
            "attribution": f"{self.title}, {self.author}, {self.year}"}}
        out.metadata["colab"] = {"provenance": [], "toc_visible": True}
        return out

    def _outputs(self, cell, page: str) -> None:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "text/markdown" in data:
                data["text/markdown"] = self.site.markdown(data["text/markdown"], page)
            if PLOTLY_JSON in data and "text/html" in data and "cdn.plot.ly" not in data["text/html"]:
                data["text/html"] = f"{self.loader}\n{data['text/html']}"

    def _caption(self, figure: dict, cell_id: str, page: str):
        name = figure["name"]
        number = self.site.figure_number(name)
        link = self.site.address(self.site.labels[name][0])
        caption = self.site.markdown(figure.get("caption", ""), page)
        return nbformat.v4.new_markdown_cell(f"**[{number}]({link}).** {caption}", id=f"{cell_id}-caption"[:64])

    def _note(self, title_cell, stem: str, run: dict):
        """The note under the title: what this notebook is, what made its outputs, the licences."""
        commit = run["commit"]
        at = f"{self.repo}/blob/{commit}"
        changed = (" (the checkout had uncommitted changes to the chapters or their code, so what ran may "
                   "differ from that commit)") if run.get("uncommitted_changes") else ""
        root = yaml.safe_load((ROOT / "_toc.yml").read_text())["root"]   # the book's front page (book/index)
        index = self.site.address(self.site.docs[root][0])
        text = (
            f"> **The notebook edition** of this chapter of [*{self.title}*]({index}), written by the book's build "
            f"from its own run. Every output below, and every number the text quotes, comes from that run: "
            f"commit [`{commit[:10]}`]({self.repo}/commit/{commit}){changed}, on {run['cpu']} "
            f"({run['cores']} cores), torch {run['torch']}, Python {run['python']}, {run['executed_at']}. "
            f"Running a cell replaces its output with your machine's. In Colab the first (folded) cell fetches "
            f"that commit's code; the chapter's source is [`notebooks/{stem}.py`]({at}/notebooks/{stem}.py), "
            f"and the [web page]({self.site.address(f'notebooks/{stem}.html')}) is the same chapter.\n>\n"
            f"> © {self.year} {self.author}. Text and figures: [CC BY 4.0]({at}/LICENSE-TEXT); code: "
            f"[BSD 3-Clause]({at}/LICENSE). To cite, see [`CITATION.cff`]({at}/CITATION.cff).")
        return nbformat.v4.new_markdown_cell(text, id=f"{title_cell.id}-edition"[:64])

    def write(self, stems: list[str], executed: Path, out: Path = EDITION) -> list[Path]:
        """Write every chapter's edition under ``out/notebooks/``, with the licences, the citation and a
        README beside them (what the edition branch holds). Returns the notebooks written."""
        shutil.rmtree(out, ignore_errors=True)
        (out / "notebooks").mkdir(parents=True)
        written = []
        for stem in stems:
            try:
                nb = self.chapter(nbformat.read(executed / f"{stem}.ipynb", as_version=4), stem)
            except MystError as e:
                raise MystError(f"chapter {stem}: {e}") from None
            nbformat.write(nb, out / "notebooks" / f"{stem}.ipynb")
            written.append(out / "notebooks" / f"{stem}.ipynb")
        for name in ("LICENSE", "LICENSE-TEXT", "CITATION.cff"):
            shutil.copy(ROOT / name, out / name)
        (out / "README.md").write_text(
            f"# {self.title}: the notebook edition\n\n"
            f"The chapters of [the book]({self.url}) as notebooks, with the outputs of the book's own run, "
            f"written by `make book` (`scripts/booktools/edition.py`) and published by "
            f"`.github/workflows/book.yml`. Each opens in Colab from its page's Colab button. The source is "
            f"the repository's default branch ({self.repo}); do not edit this branch, it is rewritten "
            f"on every publish.\n\nText and figures: CC BY 4.0 (LICENSE-TEXT); code: BSD 3-Clause (LICENSE).\n")
        return written


def install(html: Path, out: Path = EDITION) -> None:
    """Make each chapter page's ``.ipynb`` download the edition (the theme links ``_sources/``)."""
    for nb in sorted((out / "notebooks").glob("*.ipynb")):
        target = html / "_sources" / "notebooks" / nb.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(nb, target)


def markdown_of(nb) -> list[str]:
    """What a reader reads as Markdown in a notebook: its Markdown cells and the Markdown its cells display."""
    return [c.source for c in nb.cells if c.cell_type == "markdown"] + [
        o["data"]["text/markdown"] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        if "text/markdown" in o.get("data", {})]


def myst_counts(nb) -> dict[str, int]:
    """MyST syntax a Jupyter or Colab reader of ``nb`` would see raw (``mystmd.myst_left``), summed."""
    total: dict[str, int] = {}
    for text in markdown_of(nb):
        for kind, n in myst_left(text).items():
            total[kind] = total.get(kind, 0) + n
    return total


def main(argv=None) -> int:
    import argparse

    from .bookbuild import EXECUTED, toc_chapters

    p = argparse.ArgumentParser(description="Write the notebook edition from _build/executed and _build/html.")
    p.add_argument("--count", action="store_true", help="only count the MyST left in the executed chapters "
                   "and in the edition already written, per chapter")
    args = p.parse_args(argv)
    if args.count:
        rows = []
        for stem in toc_chapters():
            before = myst_counts(nbformat.read(EXECUTED / f"{stem}.ipynb", as_version=4))
            after = myst_counts(nbformat.read(EDITION / "notebooks" / f"{stem}.ipynb", as_version=4))
            rows.append((stem, before, after))
        kinds = list(rows[0][1])
        print(f"{'chapter':<26}" + "".join(f"{k:>22}" for k in kinds))
        for stem, before, after in rows:
            print(f"{stem:<26}" + "".join(f"{before[k]:>14} -> {after[k]:<5}" for k in kinds))
        print(f"{'all':<26}" + "".join(f"{sum(r[1][k] for r in rows):>14} -> {sum(r[2][k] for r in rows):<5}"
                                        for k in kinds))
        return 0
    html = BUILD / "html"
    written = Edition(html).write(toc_chapters(), EXECUTED)
    install(html)
    print(f"[edition] {len(written)} notebooks in {EDITION.relative_to(ROOT)}/notebooks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
