"""Open every page of the built book in headless Chromium (selenium + chromedriver) with the network cut off.

A page fails if it does not load, if a notebook output is an error, if a figure is missing or has
no caption, if any math is left as raw LaTeX (MathJax must have typeset every math element), if
the browser logs an error (a failed script, a missing font file, a CDN it could not reach), or on
the layout checks of ``booktools.pagecheck`` (they also run on a partial build:
``python -m booktools.pagecheck DIR``): at 1280 px a code cell, a table or an output that scrolls
sideways, a table cell that breaks inside a word or a number (also at 400 px, where a table may
scroll as a whole), a displayed equation wider than its column (at 1280 and 400 px: long ones are
broken into aligned lines), or an ipywidgets control (without a kernel it moves and changes nothing).
"A code cell" there is every listing of a page: code cells, the excerpts of ``scripts/`` that
chapters 4 and 5 include with ``{literalinclude}``, and commands in the prose. On pages with a
Plotly explorer, the test moves a slider and checks that the figure changes, with no kernel.
DNS is disabled (``--host-resolver-rules``), so a page that needs a CDN fails here. Screenshots at
1280 px and 400 px go to ``_build/screenshots/`` as build artifacts.

Without Chromium, chromedriver or selenium the test is skipped locally and fails in CI (``CI``
set): `.ci/run` installs them (Debian's ``chromium`` and ``chromium-driver``; selenium is pinned in
requirements.txt).
"""
from __future__ import annotations

import os
import shutil
import time

import nbformat
import pytest

from conftest import BUILD, executed_notebook
from test_book import toc_files

from booktools.pagecheck import layout_problems, math_problems, narrow, open_page, table_problems

FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--host-resolver-rules=MAP * ~NOTFOUND", "--window-size=1280,1000"]
SHOTS = BUILD / "screenshots"

# Figures (saved images and Plotly explorers) that are not inside a <figure> with a caption.
UNCAPTIONED = """
const shown = [...document.querySelectorAll('article img[src*="_images/"], article .js-plotly-plot')];
return shown.filter(e => !e.closest('.widget-subarea, .jupyter-widgets'))
  .filter(e => { const f = e.closest('figure'); return !(f && f.querySelector('figcaption .caption-number')); })
  .map(e => e.tagName + ' ' + (e.getAttribute('src') || e.id));
"""

SEARCH_BOXES = """
return [...document.querySelectorAll('.search-button-field, .search-button, form.bd-search')]
  .filter(e => e.offsetParent !== null && e.getBoundingClientRect().width > 0 && !e.closest('dialog')).length;
"""


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        webdriver = None
    if chromium is None or driver_path is None or webdriver is None:
        missing = "Chromium" if chromium is None else "chromedriver" if driver_path is None else "selenium"
        if os.environ.get("CI"):
            pytest.fail(f"{missing} is required in CI (.ci/run installs chromium, chromium-driver and requirements.txt)")
        pytest.skip(f"{missing} is not installed (apt-get install chromium chromium-driver; pip install selenium)")
    options = Options()
    options.binary_location = chromium
    for flag in FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # Service(path) with an explicit driver: selenium must never try to download one.
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


def load(driver, page, width=1280):
    """Open ``page`` at ``width`` px and wait until MathJax has typeset it and Plotly has rendered."""
    open_page(driver, page, width)


def console_errors(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def move_a_slider(driver) -> tuple[str, str]:
    """Click near the left end of the first Plotly slider; return the plot's SVG before and after."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    plot = driver.find_element(By.CSS_SELECTOR, ".js-plotly-plot")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", plot)
    svg = "return arguments[0].querySelector('.main-svg').outerHTML + arguments[0].layout.title.text"
    before = driver.execute_script(svg, plot)
    rail = plot.find_element(By.CSS_SELECTOR, ".slider-rail-touch-rect")
    ActionChains(driver).move_to_element_with_offset(rail, -rail.size["width"] // 2 + 4, 0).click().perform()
    time.sleep(0.5)
    return before, driver.execute_script(svg, plot)


@pytest.mark.parametrize("name", toc_files())
def test_page_reads_well_offline(built_book, browser, name):
    page = built_book / f"{name}.html"
    static = page.read_text()
    load(browser, page)
    dom = browser.page_source
    assert "<article" in dom and len(dom) > 10_000, "the page did not load"

    errors = console_errors(browser)
    assert not errors, f"console errors: {errors}"

    # One search box in sight.
    searches = browser.execute_script(SEARCH_BOXES)
    assert searches == 1, f"{searches} search boxes visible at 1280 px"

    # Notebook outputs that are errors (myst-nb marks them "output traceback" / "output error").
    assert not browser.execute_script("return document.querySelectorAll('.output.traceback, .output.error').length")

    # Math: Sphinx wraps every formula in a "math" element; MathJax must have typeset each one.
    n_math = static.count('class="math notranslate nohighlight"')
    typeset = browser.execute_script("return document.querySelectorAll('mjx-container').length")
    assert typeset >= n_math, f"{n_math} formulas, {typeset} typeset"

    # Layout at 1280 px: no code cell, table or output scrolls sideways, no table breaks a word,
    # no ipywidgets control (booktools.pagecheck says what each check selects and exempts).
    problems = layout_problems(browser)
    assert not problems, f"at 1280 px: {problems}"

    # Figures: every image exists and is real; each figure has a numbered caption.
    images = browser.execute_script(
        "return [...document.querySelectorAll('article img')].map(i => [i.getAttribute('src'), i.naturalWidth])")
    for src, width in images:
        if src.startswith("data:"):  # a figure embedded in saved widget output
            assert src.startswith("data:image/") and len(src) > 1000, f"empty embedded image {src[:60]}"
        else:
            target = (page.parent / src.split("?")[0]).resolve()
            assert target.exists() and target.stat().st_size > 100, f"missing image {src}"
        assert width > 0, f"image {src[:60]} did not load"
    uncaptioned = browser.execute_script(UNCAPTIONED)
    assert not uncaptioned, f"figures without a numbered caption: {uncaptioned}"
    if name.startswith("notebooks/"):
        nb = nbformat.read(executed_notebook(name.split("/")[1]), as_version=4)
        plots = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
        shown = sum("_images/" in src for src, _ in images)
        assert shown >= plots, f"{plots} figures in the notebook, {shown} on the page"

    # Explorers move with no kernel: a slider click changes the figure and its title.
    if browser.execute_script("return document.querySelectorAll('.js-plotly-plot').length"):
        before, after = move_a_slider(browser)
        assert before != after, "moving the explorer's slider did not change the figure"
        assert not console_errors(browser)
        SHOTS.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(SHOTS / f"{name.replace('/', '__')}-explorer.png"))

    SHOTS.mkdir(parents=True, exist_ok=True)
    stem = name.replace("/", "__")
    browser.execute_script("window.scrollTo(0, 0)")
    assert browser.save_screenshot(str(SHOTS / f"{stem}.png"))
    narrow(browser, 400)
    assert browser.save_screenshot(str(SHOTS / f"{stem}@400px.png"))
    broken = [p for p in table_problems(browser) if "breaks inside" in p]  # scrolling is fine here
    assert not broken, f"at 400 px: {broken}"
    assert not math_problems(browser), f"at 400 px: {math_problems(browser)}"


# Chapter 5's step explorer (muongrid/lab/step_explorer.py): the text its SVG shows, and its slider and buttons.
STEP_PLOT = "return document.querySelector('#fig-ch5-explorer .js-plotly-plot')"
SHOWN_TEXT = "return [...arguments[0].querySelectorAll('.main-svg text')].map(t => t.textContent).join('\\n')"


def shown_stage(driver, plot) -> str:
    """The stage line the figure displays ("Stage 3 of 8: Gather for Newton-Schulz ...")."""
    text = driver.execute_script(SHOWN_TEXT, plot)
    return next(line for line in text.split("\n") if line.startswith("Stage "))


def test_the_step_explorer_steps_in_the_built_page(built_book, browser):
    """Chapter 5's explorer moves with no kernel: a click on the slider shows another stage (its title, and
    the ranks' text), a grid button another grid (a 4 x 1 grid's rank 3 is DP rank 3)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    load(browser, built_book / "notebooks" / "05_distributed_step.html")
    plot = browser.execute_script(STEP_PLOT)
    assert plot is not None, "no Plotly figure inside fig-ch5-explorer"
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", plot)
    assert shown_stage(browser, plot).startswith("Stage 3 of 8")
    rail = plot.find_element(By.CSS_SELECTOR, ".slider-rail-touch-rect")
    seen = []
    for fraction in (0.0, 1.0):   # the rail's two ends: stage 0, then stage 8
        offset = round((fraction - 0.5) * (rail.size["width"] - 8))
        ActionChains(browser).move_to_element_with_offset(rail, offset, 0).click().perform()
        time.sleep(0.5)
        seen.append(shown_stage(browser, plot))
    assert seen[0].startswith("Stage 0 of 8: Before the step"), seen
    assert seen[1].startswith("Stage 8 of 8: All-gather the parameters"), seen
    assert "(dp 3, tp 0)" not in browser.execute_script(SHOWN_TEXT, plot)
    button = next(b for b in plot.find_elements(By.CSS_SELECTOR, ".updatemenu-button") if b.text.strip() == "4 x 1")
    ActionChains(browser).move_to_element(button).click().perform()
    time.sleep(0.5)
    assert "(dp 3, tp 0)" in browser.execute_script(SHOWN_TEXT, plot)
    assert shown_stage(browser, plot).startswith("Stage 3 of 8")   # a grid button starts at stage 3 again
    assert not console_errors(browser)


def test_at_least_one_explorer_in_the_book(built_book):
    pages = [f for f in toc_files() if "plotly-graph-div" in (built_book / f"{f}.html").read_text()]
    assert len(pages) >= 4, f"Plotly explorers on {pages}"
    assert (built_book / "offline" / "plotly" / "plotly.min.js").stat().st_size > 1_000_000


BAD_PAGE = """<!doctype html><html><body><article>
<div class="cell_input"><div class="highlight"><pre style="overflow-x: auto">{long_line}</pre></div></div>
<div class="pst-scrollable-table-container" style="width: 300px; overflow-x: auto">
  <table><tr><td>{wide_row}</td></tr></table></div>
<table style="width: 60px"><tr><td style="overflow-wrap: anywhere">abcdefghijklmnopqrstuvwxyz</td></tr></table>
<table style="width: 60px"><tr><td>reduce-scatter all-gather</td></tr></table>
<div class="cell_output"><script type="application/vnd.jupyter.widget-view+json">{{}}</script></div>
<div style="width: 300px">
  <mjx-container display="true" style="display: block; overflow-x: auto"><mjx-math
    style="display: inline-block; white-space: nowrap">{wide_math}</mjx-math></mjx-container>
  <mjx-container display="true" style="display: block; overflow-x: auto"><mjx-math
    style="display: inline-block; white-space: nowrap">M = 0.95 M + G</mjx-math></mjx-container>
</div>
</article></body></html>"""


def test_layout_checks_catch_what_they_should(browser, tmp_path):
    """The checks fail where they should (a page with one of each defect) and accept a break after
    a hyphen; they run on any built page, not only on the whole book."""
    from booktools.pagecheck import code_problems, math_problems, widget_problems

    page = tmp_path / "bad.html"
    page.write_text(BAD_PAGE.format(long_line="x = 1  # " + "y" * 400, wide_row="wide&nbsp;" * 80,
                                    wide_math="W = (1 - eta lambda) W - eta 0.2 sqrt(max(A, B)) O " * 4))
    load(browser, page)
    assert any("code cell" in p for p in code_problems(browser))
    tables = table_problems(browser)
    assert any("table scrolls" in p for p in tables), tables
    assert any('breaks inside "abcdefghijklmnopqrstuvwxyz"' in p for p in tables), tables
    assert not any("reduce-" in p or "scatter" in p for p in tables), tables  # after a hyphen: fine
    assert widget_problems(browser)
    # The same markup MathJax 3 writes for a displayed equation: the wide one is flagged, the
    # short one beside it in the same 300 px column is not.
    equations = math_problems(browser)
    assert len(equations) == 1 and "W = (1 - eta lambda)" in equations[0], equations
