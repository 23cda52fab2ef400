"""The built book: every page there, Colab links of the right form, local assets, and the real build
path failing when a script that a chapter launches is broken."""
from __future__ import annotations

import re

import pytest
import yaml

from booktools.bookbuild import toc_files  # noqa: F401  (test_browser imports it from here)
from muongrid.lab.notebook import chapters, repository_url
from conftest import ROOT


def test_every_page_of_the_toc_is_built(built_book):
    for f in toc_files():
        page = built_book / f"{f}.html"
        assert page.exists() and page.stat().st_size > 5000, f
    assert "Distributed Muon" in (built_book / "index.html").read_text() or (built_book / "book/index.html").exists()


@pytest.mark.parametrize("name", [p.stem for p in chapters()])
def test_chapter_page_has_outputs_and_a_colab_link(built_book, name):
    html = (built_book / "notebooks" / f"{name}.html").read_text()
    org_repo = repository_url().split("github.com/")[1]
    # the button opens the chapter's notebook edition, on the branch the publishing workflow pushes
    # (tests/test_edition.py checks the file behind it, the workflow and the download)
    branch = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]["muongrid_edition_branch"]
    link = f"https://colab.research.google.com/github/{org_repo}/blob/{branch}/notebooks/{name}.ipynb"
    assert link in html, f"no Colab link {link}"
    assert "cell_output" in html
    assert "output traceback" not in html and "output error" not in html
    # The download menu offers the notebook itself, and the file is there.
    ipynb = re.search(r'href="([^"]+\.ipynb)"[^>]*\n?[^>]*download-notebook-button|'
                      r'download-notebook-button[^>]*href="([^"]+\.ipynb)"|href="([^"]+_sources/[^"]+\.ipynb)"', html)
    assert ipynb, "no .ipynb in the download menu"
    href = next(g for g in ipynb.groups() if g)
    assert (built_book / "notebooks" / href).resolve().exists(), href


@pytest.mark.parametrize("name", [p.stem for p in chapters()])
def test_markdown_tables_in_outputs_render_as_tables(built_book, name):
    """A table that a cell displays as Markdown must reach the page as an HTML table, not as pipes."""
    import nbformat

    from conftest import executed_notebook

    nb = nbformat.read(executed_notebook(name), as_version=4)
    tables = sum(bool(re.search(r"^\|.*\|\s*\n\|[-| :]+\|", o["data"]["text/markdown"], re.M))
                 for c in nb.cells for o in c.get("outputs", []) if "text/markdown" in o.get("data", {}))
    html = (built_book / "notebooks" / f"{name}.html").read_text()
    outputs = html.split('class="cell_output')[1:]
    assert sum(o.count("<table") for o in outputs) >= tables


def test_pages_load_math_and_widgets_from_the_book_itself(built_book):
    assert (built_book / "offline" / "mathjax" / "tex-chtml.js").exists()
    assert (built_book / "offline" / "html-manager" / "embed-amd.js").exists()
    for page in built_book.rglob("*.html"):
        scripts = re.findall(r'<script[^>]+src="([^"]+)"', page.read_text())
        remote = [s for s in scripts if s.startswith(("http:", "https:", "//"))]
        assert not remote, f"{page.relative_to(built_book)} loads {remote}"
    muon = (built_book / "notebooks" / "01_muon.html").read_text()
    assert "offline/mathjax/tex-chtml.js" in muon
    # No ipywidgets in the static pages (they would move and change nothing without a kernel; the
    # explorers are Plotly figures instead), so no page needs the widget manager.
    with_widgets = [str(p.relative_to(built_book)) for p in built_book.rglob("*.html")
                    if "application/vnd.jupyter.widget-state+json" in p.read_text()]
    assert not with_widgets, f"pages with ipywidgets: {with_widgets}"


MINI_TOC = """format: jb-book
root: notebooks/00_start_here
chapters:
  - file: book/troubleshooting
  - file: book/references
"""


def _copy_of_the_checkout(dest):
    import shutil

    for folder in ("scripts", "notebooks", "book"):
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("_config.yml", "requirements.txt"):
        shutil.copy(ROOT / name, dest / name)
    (dest / "_toc.yml").write_text(MINI_TOC)
    # Chapter 0's road map and glossary links name pages this one-chapter book leaves out. Their
    # "unknown document" warnings are the partial toc's, not the build path's this test is about;
    # test_every_page_of_the_toc_is_built holds the whole book to -W -n, every link included.
    config = (dest / "_config.yml").read_text()
    marker = 'suppress_warnings: ["mystnb.unknown_mime_type"'
    assert marker in config
    (dest / "_config.yml").write_text(config.replace(marker, marker + ', "ref.doc"'))
    return dest


def _make_book(checkout):
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(checkout / "scripts"), MUONGRID_OFFLINE="require")
    # --no-edition: this one-chapter book's pages link to chapters it leaves out, which the notebook edition
    # refuses (each of its links must reach a built page); tests/test_edition.py holds the whole book's edition.
    return subprocess.run([sys.executable, str(checkout / "scripts" / "build_book.py"), "--no-edition"],
                          cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=900)


def test_make_book_executes_chapters_and_fails_when_a_script_breaks(tmp_path):
    """What `make book` runs (scripts/build_book.py), on chapter 0 in a copy of the checkout: it
    reuses an executed chapter whose inputs are unchanged, renders it and prints the time per chapter;
    once the script the chapter launches is broken (an input changed), it executes the chapter again,
    and the build fails and shows why."""
    good = _copy_of_the_checkout(tmp_path / "good")
    # The copy's inputs are byte for byte the checkout's, so the chapter this session executed is
    # reused (its fingerprint matches): the good build only renders, the broken one must execute.
    from conftest import executed_notebook
    import shutil
    (good / "_build" / "executed").mkdir(parents=True)
    for suffix in (".ipynb", ".fingerprint"):
        shutil.copy(executed_notebook("00_start_here").with_suffix(suffix), good / "_build" / "executed")
    proc = _make_book(good)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    page = (good / "_build/html/notebooks/00_start_here.html").read_text()
    assert "largest |distributed - single process|" in page
    assert "cell_output" in page and "output traceback" not in page
    assert "00_start_here: reused" in proc.stdout and "whole build" in proc.stdout  # the timing table
    # While repository.url is the placeholder, the build says so loudly (on stderr; -W forbids warnings).
    if repository_url() == "https://github.com/muongrid-book/distributed-muon":  # offline_assets.PLACEHOLDER_URL
        assert "is still the placeholder" in proc.stderr

    broken = _copy_of_the_checkout(tmp_path / "broken")
    verify = broken / "scripts" / "muongrid" / "verify.py"  # scripts/verify.py is a wrapper around it
    source = verify.read_text()
    assert "def worker(grid, comm, args) -> int:\n" in source
    verify.write_text(source.replace("def worker(grid, comm, args) -> int:\n",
                                     "def worker(grid, comm, args) -> int:\n    raise RuntimeError('broken on purpose')\n"))
    proc = _make_book(broken)
    assert proc.returncode != 0
    assert "broken on purpose" in proc.stdout + proc.stderr
