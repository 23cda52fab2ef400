"""Open every page of the built book in headless Chromium with the network cut off.

A page fails if it does not load, if a notebook output is an error, if a figure is missing, if
any math is left as raw LaTeX (MathJax must have typeset every math element), or if a widget's
saved state did not render. DNS is disabled (``--host-resolver-rules``), so a page that needs a
CDN fails here. Screenshots go to ``_build/screenshots/`` as build artifacts.

Without Chromium the test is skipped locally and fails in CI (``CI`` set): `.ci/run` installs it.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

import nbformat
import pytest

from conftest import BUILD, executed_notebook
from test_book import toc_files

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=20000"]


@pytest.fixture(scope="module")
def chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is required in CI (.ci/run installs it with apt-get)")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    return exe


def browse(chromium, page, *args) -> str:
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
                              capture_output=True, text=True, timeout=120)
    return proc.stdout


@pytest.mark.parametrize("name", toc_files())
def test_page_renders_offline(built_book, chromium, name):
    page = built_book / f"{name}.html"
    static = page.read_text()
    dom = browse(chromium, page, "--dump-dom")
    assert "<article" in dom and len(dom) > 10_000, "the page did not load"

    # Notebook outputs that are errors (myst-nb marks them "output traceback" / "output error").
    assert not re.search(r'class="output (traceback|error)', dom)

    # Math: Sphinx wraps every formula in a "math" element; MathJax must have typeset each one.
    n_math = len(re.findall(r'class="math notranslate nohighlight"', static))
    assert dom.count("<mjx-container") >= n_math, f"{n_math} formulas, {dom.count('<mjx-container')} typeset"

    # Widgets: every saved widget view must have been rendered by the widget manager.
    n_views = static.count("application/vnd.jupyter.widget-view+json")
    if n_views:
        assert dom.count('class="widget-subarea"') >= n_views and "jupyter-widgets" in dom, "widgets did not render"

    # Figures: every image the page shows exists and is a real image; chapters show all their plots.
    images = re.findall(r'<img[^>]+src="([^"]+)"', dom)
    for src in images:
        if src.startswith("data:"):  # a figure embedded in saved widget output
            assert src.startswith("data:image/") and len(src) > 1000, f"empty embedded image {src[:60]}"
            continue
        target = (page.parent / src.split("?")[0]).resolve()
        assert target.exists() and target.stat().st_size > 100, f"missing image {src}"
        assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" or target.suffix in (".svg", ".gif", ".jpg")
    if name.startswith("notebooks/"):
        nb = nbformat.read(executed_notebook(name.split("/")[1]), as_version=4)
        plots = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
        shown = sum("_images/" in src for src in images)
        assert shown >= plots, f"{plots} figures in the notebook, {shown} on the page"

    shots = BUILD / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / f"{name.replace('/', '__')}.png"
    browse(chromium, page, "--window-size=1200,3000", f"--screenshot={shot}")
    assert shot.exists() and shot.stat().st_size > 10_000
