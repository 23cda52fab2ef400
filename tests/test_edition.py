"""The notebook edition (``booktools.edition``) reads in Jupyter and Colab as the book reads on the web.

Against the executed chapters and the book built from them (the session's ``built_book``), each
chapter's edition must have: no MyST left in what a reader reads as Markdown (roles, directives,
colon fences, options, labels, ``{{name}}``), every reference a link whose target the built site has,
every figure's caption beside it and every figure stored in a form Jupyter and Colab render without
the book, every cell the book removes or folds folded or turned into the prose it prints, a set-up
cell that fetches the commit that ran, the licences; and the pages' Colab buttons and downloads give
it. Chapter 1 of the edition is also run as Colab runs it (``tests/test_colab.py``).
"""
from __future__ import annotations

import re
import subprocess

import nbformat
import pytest
import yaml

from booktools import bookbuild, edition
from booktools.mystmd import Site
from conftest import ROOT

LINK = re.compile(r"\]\((?P<url>[^)\s]+)\)|href=\"(?P<href>[^\"]+)\"")


@pytest.fixture(scope="module")
def chapters(book_edition):
    """(stem, executed notebook, its edition) for every chapter of the book, read once."""
    return [(stem, nbformat.read(bookbuild.EXECUTED / f"{stem}.ipynb", as_version=4),
             nbformat.read(book_edition / "notebooks" / f"{stem}.ipynb", as_version=4))
            for stem in bookbuild.toc_chapters()]


def test_no_myst_is_left_and_every_role_became_a_link(chapters, built_book):
    site = Site(built_book, edition.site_url())
    before, after, roles, links = {}, {}, 0, 0
    for stem, executed, ed in chapters:
        for totals, nb in ((before, executed), (after, ed)):
            for kind, n in edition.myst_counts(nb).items():
                totals[kind] = totals.get(kind, 0) + n
        roles += edition.myst_counts(executed)["roles"]
        links += sum(1 for text in edition.markdown_of(ed) for m in LINK.finditer(text)
                     if (m.group("url") or m.group("href")).startswith(site.url))
    print(f"\nMyST a Jupyter reader would see raw, executed chapters -> edition: "
          + ", ".join(f"{k} {before[k]} -> {after[k]}" for k in before))
    assert before["roles"] > 100 and before["directives"] > 30, before  # (what the counter finds in the source)
    assert all(n == 0 for n in after.values()), after
    assert links >= roles, f"{roles} roles in the chapters, {links} links into the site in the edition"


def test_every_link_target_exists(chapters, built_book):
    """A link into the site names a page and an element id the build has; one into the repository names a
    file of the commit that made the outputs (or, for the book's own ``blob/main`` links, of this checkout)."""
    site, repo = Site(built_book, edition.site_url()), edition.repository_url().rstrip("/")
    missing, checked = [], 0
    for stem, _, ed in chapters:
        commit = ed.metadata["muongrid"]["edition"]["run"]["commit"]
        texts = edition.markdown_of(ed) + [o["data"]["text/html"] for c in ed.cells if c.cell_type == "code"
                                           for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
        for text in texts:
            for m in LINK.finditer(text):
                url = m.group("url") or m.group("href")
                if url.startswith(site.url):
                    ok = site.exists(url)
                elif url.startswith(f"{repo}/blob/"):
                    ref, _, path = url[len(f"{repo}/blob/"):].partition("/")
                    path = path.split("#")[0]
                    ok = (ROOT / path).exists() if ref == "main" else subprocess.run(
                        ["git", "cat-file", "-e", f"{ref}:{path}"], cwd=ROOT).returncode == 0
                elif url.startswith(f"{repo}/commit/"):
                    ok = subprocess.run(["git", "cat-file", "-e", f"{url.rsplit('/', 1)[1]}^{{commit}}"],
                                        cwd=ROOT).returncode == 0
                else:
                    continue
                checked += 1
                if not ok:
                    missing.append((stem, url))
    assert checked > 200 and not missing, missing[:20]


def test_every_figure_has_its_caption_and_renders_without_the_book(chapters):
    figures = captions = 0
    for stem, executed, ed in chapters:
        figures += sum(1 for c in executed.cells if c.metadata.get("mystnb", {}).get("figure"))
        for i, cell in enumerate(ed.cells):
            name = cell.metadata.get("muongrid", {}).get("figure")
            if not name:
                continue
            caption = ed.cells[i + 1]
            assert caption.cell_type == "markdown" and f"#{name})" in caption.source, (stem, name)
            assert re.match(r"\*\*\[(Fig\.|Table) \d+\]\(", caption.source) and len(caption.source) > 60, caption.source
            captions += 1
            shown = [o["data"] for o in cell.outputs if o.get("output_type") in ("display_data", "execute_result")]
            images = [d for d in shown if "image/png" in d or "image/svg+xml" in d]
            plots = [d for d in shown if edition.PLOTLY_JSON in d]
            assert images or plots, (stem, name, [sorted(d) for d in shown])
            for data in plots:  # Colab renders no Plotly JSON: the HTML must load plotly.js itself
                html = data.get("text/html", "")
                assert re.search(r'<script[^>]+src="https://cdn\.plot\.ly/plotly-[\d.]+\.min\.js"', html), (stem, name)
                assert "Plotly.newPlot" in html, (stem, name)
    print(f"\n{captions} of {figures} figures have their caption beside them")
    assert captions == figures > 30


def test_what_the_book_removes_or_folds_is_folded_or_printed(chapters):
    for stem, executed, ed in chapters:
        by_id = {c.id: c for c in ed.cells}
        run = ed.metadata["muongrid"]["edition"]["run"]
        assert "jupytext" not in ed.metadata and ed.metadata["muongrid"]["edition"]["license"]
        note = ed.cells[1].source
        assert "CC BY 4.0" in note and "BSD 3-Clause" in note and run["commit"][:10] in note, note
        assert run["cpu"] in note
        for cell in executed.cells:
            tags = set(cell.metadata.get("tags", []))
            mine = by_id[cell.id]
            if cell.cell_type != "code" or not tags & {"remove-cell", "remove-input", "hide-input", "hide-cell"}:
                continue
            if mine.cell_type == "markdown":  # a say/listing/table cell: its printed Markdown, stored
                assert "remove-input" in tags and mine.source.strip(), (stem, cell.id)
                continue
            assert mine.metadata.get("cellView") == "form" and mine.metadata["jupyter"]["source_hidden"], (stem, cell.id)
            assert mine.source.startswith("#@title ") or mine.source.startswith("%%"), (stem, cell.id)
            if "remove-cell" in tags:
                assert not mine.outputs, (stem, cell.id)
        setup = [c for c in ed.cells if c.cell_type == "code" and edition.EDITION_MARKER in c.source]
        assert len(setup) == 1 and f'COMMIT = "{run["commit"]}"' in setup[0].source, stem
        nbformat.validate(ed)


def test_colab_buttons_and_downloads_give_the_edition(book_edition, built_book):
    """While repository.url is the placeholder nothing can be opened in Colab: check the links and files."""
    branch = edition.branch()
    owner, repo = edition.repository_url().rstrip("/").split("/")[-2:]
    for stem in bookbuild.toc_chapters():
        page = (built_book / "notebooks" / f"{stem}.html").read_text()
        colab = re.findall(r'href="(https://colab\.research\.google\.com/[^"]+)"', page)
        assert colab == [f"https://colab.research.google.com/github/{owner}/{repo}/blob/{branch}/notebooks/{stem}.ipynb"], colab
        assert (book_edition / "notebooks" / f"{stem}.ipynb").is_file()
        assert re.search(rf'href="\.\./_sources/notebooks/{stem}\.ipynb"', page), stem
        download = built_book / "_sources" / "notebooks" / f"{stem}.ipynb"
        assert download.read_bytes() == (book_edition / "notebooks" / f"{stem}.ipynb").read_bytes(), stem
    for name in ("LICENSE", "LICENSE-TEXT", "README.md"):
        assert (book_edition / name).is_file()
    # the publishing workflow pushes the edition to that branch, with the permission to push
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    build = workflow["jobs"]["build"]
    assert build["permissions"]["contents"] == "write"
    push = next(s["run"] for s in build["steps"] if "refs/heads/" in s.get("run", ""))
    assert "--work-tree=_build/colab" in push and f"refs/heads/{branch}" in push
    assert [s.get("run") for s in build["steps"]].index("make book") < [s.get("run") for s in build["steps"]].index(push)


def test_the_prose_a_cell_prints_is_stored_as_markdown(chapters):
    """The paragraph a say() cell printed is a Markdown cell, with the run's numbers in it, before anything runs."""
    said = stored = 0
    for stem, executed, ed in chapters:
        by_id = {c.id: c for c in ed.cells}
        for cell in executed.cells:
            if cell.cell_type == "code" and re.match(r"say\(r?f?\"\"\"", cell.source.strip()):
                said += 1
                mine = by_id[cell.id]
                stored += mine.cell_type == "markdown" and mine.source.strip() != ""
    print(f"\n{stored} of {said} say() cells are stored as Markdown")
    assert said > 50 and stored == said
