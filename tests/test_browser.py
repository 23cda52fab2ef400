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
# The text a reader sees: drawn inside the figure (another grid's drawing lies far outside it, on the same axes).
SHOWN_TEXT = """
const plot = arguments[0], outer = plot.getBoundingClientRect();
return [...plot.querySelectorAll('.main-svg text')].filter(t => !t.closest('.hoverlayer')).filter(t => {
  const r = t.getBoundingClientRect();
  return r.width > 0 && r.right > outer.left && r.left < outer.right && r.bottom > outer.top && r.top < outer.bottom;
}).map(t => t.textContent).join('\\n');
"""
# What would read badly: text that runs off the figure, text that starts in a rank box and runs out of it,
# and text over other text. The boxes' outlines are the figure's only lines: one path per layout and stage,
# a closed run ("M...L...") per box, read here in page pixels.
FIGURE_PROBLEMS = """
const plot = arguments[0], outer = plot.getBoundingClientRect();
const inside = (r, b) => r.left >= b.left - 1 && r.right <= b.right + 1 && r.top >= b.top - 1 && r.bottom <= b.bottom + 1;
const meets = (r, b) => r.right > b.left && r.left < b.right && r.bottom > b.top && r.top < b.bottom;
const boxes = [];
for (const path of plot.querySelectorAll('.main-svg g.trace.scatter path.js-line')) {
  const m = path.getScreenCTM();
  for (const run of (path.getAttribute('d') || '').split('M').slice(1)) {
    const xy = run.replace(/Z/g, '').split('L').map(p => p.split(',').map(Number));
    const a = new DOMPoint(Math.min(...xy.map(p => p[0])), Math.min(...xy.map(p => p[1]))).matrixTransform(m);
    const b = new DOMPoint(Math.max(...xy.map(p => p[0])), Math.max(...xy.map(p => p[1]))).matrixTransform(m);
    const box = {left: a.x, top: a.y, right: b.x, bottom: b.y};
    if (meets(box, outer)) boxes.push(box);
  }
}
const problems = [], shown = [];
for (const t of plot.querySelectorAll('.main-svg text')) {
  if (t.closest('.hoverlayer')) continue;
  const r = t.getBoundingClientRect();
  if (r.width === 0 || !meets(r, outer)) continue;
  if (!inside(r, outer)) { problems.push('runs off the figure: ' + t.textContent); continue; }
  const y = (r.top + r.bottom) / 2;
  const box = boxes.find(b => r.left + 1 >= b.left && r.left + 1 <= b.right && y >= b.top && y <= b.bottom);
  if (box && !inside(r, box)) problems.push('runs out of its rank box: ' + t.textContent);
  for (const [q, u] of shown)
    if (Math.min(r.right, q.right) - Math.max(r.left, q.left) > 1
        && Math.min(r.bottom, q.bottom) - Math.max(r.top, q.top) > 1)
      problems.push('"' + t.textContent + '" over "' + u + '"');
  shown.push([r, t.textContent]);
}
return problems;
"""
# Stages on every grid, set as the slider's steps and the buttons set them (Plotly.update, relayout); then back.
# Stages 2 (a rank's header says what it will send) and 5 (its Newton-Schulz count) hold text that stages 3 and 6,
# which the test clicks to, do not; a redraw takes seconds on a busy 2-core machine, so not all nine.
SOME_STATES = """
const [plot, check, stages, done] = [arguments[0], new Function(arguments[1]), arguments[2],
                                     arguments[arguments.length - 1]];
(async () => {
  const found = [], steps = plot.layout.sliders[0].steps, buttons = plot.layout.updatemenus[0].buttons;
  const start = plot.layout.sliders[0].active;
  for (const s of stages) {
    await Plotly.update(plot, steps[s].args[0], steps[s].args[1]);
    for (const b of buttons) {
      await Plotly.relayout(plot, b.args[0]);
      for (const p of check.call(null, plot)) found.push(b.label + ', ' + steps[s].label + ': ' + p);
    }
  }
  await Plotly.relayout(plot, buttons[plot.layout.updatemenus[0].active].args[0]);
  await Plotly.update(plot, steps[start].args[0], steps[start].args[1]);
  done(found);
})();
"""
# The centre of send-matrix cell (from, to) of a layout (its axes: xaxis3 bucket, xaxis4 owner), in page pixels.
CELL = """
const [plot, axis, from, to] = [...arguments];
const xa = plot._fullLayout['x' + axis], ya = plot._fullLayout['y' + axis], box = plot.getBoundingClientRect();
return [box.left + xa._offset + xa.l2p(xa.range[0] + 0.5 + to), box.top + ya._offset + ya.l2p(from)];
"""


def shown_stage(driver, plot) -> str:
    """The stage line the figure displays ("Stage 3 of 8: Gather the Nesterov update ...")."""
    text = driver.execute_script(SHOWN_TEXT, plot)
    stages = [line for line in text.split("\n") if line.startswith("Stage ")]
    assert len(stages) == 1, stages   # one grid's title in sight
    return stages[0]


def click_stage(driver, plot, stage: int, stages: int = 8) -> None:
    """Click the slider's rail where ``stage`` of 0..``stages`` is."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    rail = plot.find_element(By.CSS_SELECTOR, ".slider-rail-touch-rect")
    offset = round((stage / stages - 0.5) * (rail.size["width"] - 8))
    ActionChains(driver).move_to_element_with_offset(rail, offset, 0).click().perform()
    time.sleep(0.5)


def click_grid(driver, plot, label: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    button = next(b for b in plot.find_elements(By.CSS_SELECTOR, ".updatemenu-button") if b.text.strip() == label)
    ActionChains(driver).move_to_element(button).click().perform()
    time.sleep(0.5)


def hover_cell(driver, plot, axis: str, sender: int, receiver: int) -> str:
    """Hover send-matrix cell (sender, receiver) of the layout drawn on ``axis``; the hover's text."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    driver.execute_script("arguments[0].scrollIntoView({block: 'end'})", plot)   # the send matrices in view
    x, y = driver.execute_script(CELL, plot, axis, sender, receiver)
    for where in ((2, 2), (round(x), round(y))):   # away first, so the hover is this cell's
        actions = ActionBuilder(driver)
        actions.pointer_action.move_to_location(*where)
        actions.perform()
    time.sleep(0.4)
    return driver.execute_script(
        "const h = arguments[0].querySelector('.hoverlayer'); return h ? h.textContent : ''", plot)


def test_the_step_explorer_in_the_built_page(built_book, browser):
    """Chapter 5's explorer in the page a reader opens: its controls and rank boxes fit one 1280 x 800 view;
    a click on the slider shows another stage, and a grid button another grid at the same stage; no text of
    the figure runs off it, out of its rank box or over other text (at 1280 px: stages 2 and 5 on every grid,
    3 and 6 where the clicks take it; at 400 px, where the figure keeps its width and scrolls); hovering a
    send-matrix cell names the matrix pieces that travelled, who keeps them and, for the owner layout,
    their owner."""
    from muongrid.lab.step_explorer import MIN_WIDTH

    load(browser, built_book / "notebooks" / "05_distributed_step.html")
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            dict(width=1280, height=800, deviceScaleFactor=1, mobile=False))
    try:
        time.sleep(0.5)
        plot = browser.execute_script(STEP_PLOT)
        assert plot is not None, "no Plotly figure inside fig-ch5-explorer"
        # One view: the figure's top just under the page's header bar, its controls and rank boxes above the
        # bottom edge (the send matrices may go below it).
        browser.execute_script("""
            const plot = arguments[0], bar = document.querySelector('.bd-header-article');
            const below = bar ? bar.getBoundingClientRect().bottom : 0;
            window.scrollBy(0, plot.getBoundingClientRect().top - below);""", plot)
        time.sleep(0.3)
        view = browser.execute_script("""
            const plot = arguments[0], outer = plot.getBoundingClientRect();
            const bar = document.querySelector('.bd-header-article');
            const parts = [...plot.querySelectorAll('.slider-container, .updatemenu-container')]
              .concat([...plot.querySelectorAll('.main-svg g.trace.scatter path.js-line')]
                      .filter(p => { const r = p.getBoundingClientRect();
                                     return r.width > 0 && r.left < outer.right && r.right > outer.left; }));
            return {top: bar ? bar.getBoundingClientRect().bottom : 0, height: window.innerHeight,
                    parts: parts.length, highest: Math.min(...parts.map(p => p.getBoundingClientRect().top)),
                    lowest: Math.max(...parts.map(p => p.getBoundingClientRect().bottom))};""", plot)
        assert view["height"] == 800 and view["parts"] >= 2 + 8   # slider, buttons, 2 x 4 rank boxes
        assert view["highest"] >= view["top"] - 1 and view["lowest"] <= view["height"], view

        assert shown_stage(browser, plot).startswith("Stage 3 of 8")
        assert not browser.execute_script(FIGURE_PROBLEMS, plot)
        browser.set_script_timeout(600)
        problems = browser.execute_async_script(SOME_STATES, plot, FIGURE_PROBLEMS, [2, 5])
        assert not problems, f"at 1280 px: {problems}"

        click_stage(browser, plot, 6)
        assert shown_stage(browser, plot).startswith("Stage 6 of 8: Keep my slice")
        for label in ("4 x 1", "2 x 1", "2 x 2"):   # a grid keeps the stage
            click_grid(browser, plot, label)
            assert shown_stage(browser, plot).startswith("Stage 6 of 8"), label
            assert ("(dp 3, tp 0)" in browser.execute_script(SHOWN_TEXT, plot)) == (label == "4 x 1")
            assert not browser.execute_script(FIGURE_PROBLEMS, plot), label
        click_stage(browser, plot, 3)
        assert shown_stage(browser, plot).startswith("Stage 3 of 8")
        ring, to_owner = hover_cell(browser, plot, "axis3", 0, 2), None
        assert "ring all-gather over DP" in ring and "kept by rank 0" in ring, ring
        for sender in range(4):   # an owner layout's all-to-all cell with something in it
            for receiver in range(4):
                text = hover_cell(browser, plot, "axis4", sender, receiver) if sender != receiver else ""
                if "all-to-all" in text:
                    to_owner = text
                    break
            if to_owner:
                break
        assert to_owner and f"its owner: rank {receiver}" in to_owner, to_owner
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

    narrow(browser, 400)
    time.sleep(0.5)
    plot = browser.execute_script(STEP_PLOT)
    width, page_scrolls = browser.execute_script("""
        const s = document.scrollingElement;
        return [arguments[0].getBoundingClientRect().width, s.scrollWidth > s.clientWidth + 1];""", plot)
    assert width >= MIN_WIDTH and not page_scrolls, (width, page_scrolls)   # the figure's box scrolls, not the page
    assert not browser.execute_script(FIGURE_PROBLEMS, plot), "at 400 px"
    assert not console_errors(browser)


def test_at_least_one_explorer_in_the_book(built_book):
    pages = [f for f in toc_files() if "plotly-graph-div" in (built_book / f"{f}.html").read_text()]
    assert len(pages) >= 4, f"Plotly explorers on {pages}"
    assert (built_book / "offline" / "plotly" / "plotly.min.js").stat().st_size > 1_000_000


BAD_PAGE = """<!doctype html><html><body><article>
<div class="cell_input"><div class="highlight"><pre style="overflow-x: auto">{long_line}</pre></div></div>
<div class="pst-scrollable-table-container" style="width: 300px; overflow-x: auto">
  <table><tr><td>{wide_row}</td></tr></table></div>
<details><summary>Show code cell source</summary><div class="cell_output" style="width: 300px">
  <div class="highlight"><pre style="white-space: pre-wrap">folded = ({wrapped})</pre></div></div></details>
<table style="width: 60px"><tr><td style="overflow-wrap: anywhere">abcdefghijklmnopqrstuvwxyz</td></tr></table>
<table style="width: 60px"><tr><td>reduce-scatter all-gather</td></tr></table>
<div class="cell_output"><script type="application/vnd.jupyter.widget-view+json">{{}}</script></div>
<div class="cell_output" style="width: 300px"><div class="highlight"><pre style="white-space: pre-wrap">{wrapped}
short = 1</pre></div><div class="highlight"><pre style="white-space: pre-wrap">fits = 1
also = 2</pre></div></div>
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
                                    wrapped="grads = reduce_scatter(" + "bucket_shard, " * 12 + ")",
                                    wide_math="W = (1 - eta lambda) W - eta 0.2 sqrt(max(A, B)) O " * 4))
    load(browser, page)
    code = code_problems(browser)
    assert any("code cell" in p for p in code)
    # highlighted code that wraps (here a listing in an output, 300 px wide) is named; two short lines are not
    # (also behind a closed fold, which Chromium lays out)
    wrapping = sorted(p for p in code if "wraps" in p)
    assert len(wrapping) == 2, wrapping
    assert wrapping[0].startswith("listing in an output wraps a line: folded = (grads = "), wrapping
    assert wrapping[1].startswith("listing in an output wraps a line: grads = "), wrapping
    tables = table_problems(browser)
    assert any("table scrolls" in p for p in tables), tables
    assert any('breaks inside "abcdefghijklmnopqrstuvwxyz"' in p for p in tables), tables
    assert not any("reduce-" in p or "scatter" in p for p in tables), tables  # after a hyphen: fine
    assert widget_problems(browser)
    # The same markup MathJax 3 writes for a displayed equation: the wide one is flagged, the
    # short one beside it in the same 300 px column is not.
    equations = math_problems(browser)
    assert len(equations) == 1 and "W = (1 - eta lambda)" in equations[0], equations
