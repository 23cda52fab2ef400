"""Layout checks for a built page in a browser: what a reader sees cut off, broken or dead.

``tests/test_browser.py`` runs these on every page of the built book; they also run on any other
build (a partial book rendered from a subset toc, say), from the command line:

    python -m booktools.pagecheck path/to/_build/html [page.html ...]

Each ``*_problems`` function takes a selenium driver with the page loaded and returns a list of
readable problems (empty when the page is fine):

- ``code_problems``: a code listing whose lines scroll sideways: a code cell, an excerpt of
  ``scripts/`` included with ``{literalinclude}`` (chapters 4 and 5) or a command in the prose.
  Each holds lines of at most 88 characters (``tests/test_readability.py``), in one type size.
  Also any highlighted code, in a cell or in an output (a listing ``page.listing`` displays), that
  wraps a line: a statement broken in the middle reads as two. (Printed text, a stream output, wraps
  by design: ``book/_static/book.css``.)
- ``table_problems``: a table that scrolls sideways, or a table cell that breaks inside a word or
  a number (a word whose letters land on two lines).
- ``widget_problems``: an ipywidgets control in the static page (without a kernel it moves and
  changes nothing; the book's explorers are Plotly figures whose every position is precomputed).
- ``output_problems``: an element of a notebook output that scrolls sideways.
- ``math_problems``: a displayed equation (MathJax's ``mjx-container[display="true"]``) wider than
  its column: the theme lets it scroll, so the end of a long line (a coefficient, a definition) is
  cut off on screen. Long equations are broken into aligned lines instead.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

SCROLLS = """
const scrolls = e => e.scrollWidth > e.clientWidth + 1
  && !['visible', 'hidden', 'clip'].includes(getComputedStyle(e).overflowX);
"""
CODE_CELLS = SCROLLS + """
return [...document.querySelectorAll('article div.highlight, article div.highlight pre')]
  .filter(e => !e.closest('div.cell_output'))   // outputs: output_problems
  .filter(scrolls)
  .map(e => (e.closest('div.cell_input') ? 'code cell ' : 'listing ') + e.scrollWidth + '>'
       + e.clientWidth + ' px: '
       + e.textContent.split('\\n').reduce((a, b) => b.length > a.length ? b : a, '').slice(0, 100));
"""
# Highlighted code that wraps: laid out again with white-space: pre (a copy beside it), it would be shorter.
WRAPS = """
return [...document.querySelectorAll('article div.highlight pre')].filter(pre => {
  if (pre.closest('.output.stream, .output.text_plain')) return false;   // printed text wraps by design
  if (getComputedStyle(pre).whiteSpace === 'pre') return false;   // never wraps (it may scroll: CODE_CELLS)
  const probe = pre.cloneNode(true);
  Object.assign(probe.style, {whiteSpace: 'pre', position: 'absolute', visibility: 'hidden'});
  pre.parentElement.appendChild(probe);
  const wraps = pre.getBoundingClientRect().height > probe.getBoundingClientRect().height + 1;
  probe.remove();
  return wraps;
}).map(pre => (pre.closest('div.cell_input') ? 'code cell' : pre.closest('div.cell_output') ? 'listing in an output'
               : 'listing') + ' wraps a line: '
       + pre.textContent.split('\\n').reduce((a, b) => b.length > a.length ? b : a, '').slice(0, 100));
"""
OUTPUTS = SCROLLS + """
return [...document.querySelectorAll('div.cell_output, div.cell_output *')]
  .filter(scrolls)
  .filter(e => !e.closest('.widget-subarea, .jupyter-widgets, .js-plotly-plot'))
  .filter(e => !e.querySelector('table'))  // a table's own box: table_problems judges it
  .map(e => 'output ' + e.tagName.toLowerCase() + '.' + e.className + ' ' + e.scrollWidth + '>'
       + e.clientWidth + ': ' + e.textContent.slice(0, 80));
"""
# A word (a run of non-space characters; a hyphen ends one, since a line may break after it) of a
# table cell whose client rectangles sit on more than one line was broken inside it. Tables that scroll: their container is wider inside than out.
TABLES = SCROLLS + """
const problems = [];
for (const t of document.querySelectorAll('article table')) {
  const box = t.closest('.pst-scrollable-table-container, .output') || t.parentElement;
  if (scrolls(box) || t.getBoundingClientRect().right > box.getBoundingClientRect().right + 1)
    problems.push('table scrolls ' + box.scrollWidth + '>' + box.clientWidth + ' px: '
                  + t.textContent.trim().replace(/\\s+/g, ' ').slice(0, 80));
  for (const cell of t.querySelectorAll('td, th')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.data.matchAll(/[^\\s-]+-?/g)) {
        const r = document.createRange();
        r.setStart(node, m.index);
        r.setEnd(node, m.index + m[0].length);
        const tops = new Set([...r.getClientRects()].filter(q => q.width > 0).map(q => Math.round(q.top)));
        if (tops.size > 1) problems.push('table cell breaks inside "' + m[0] + '"');
      }
    }
  }
}
return problems;
"""
# A displayed equation whose typeset width (mjx-math) passes its container's right edge, or whose
# container scrolls: the reader sees it cut off.
MATH = SCROLLS + """
return [...document.querySelectorAll('mjx-container[display="true"]')]
  .filter(c => { const m = c.querySelector('mjx-math');
                 return scrolls(c) || (m && m.getBoundingClientRect().right
                                       > c.getBoundingClientRect().right + 1); })
  .map(c => 'equation ' + Math.round((c.querySelector('mjx-math') || c).getBoundingClientRect().width)
       + '>' + c.clientWidth + ' px: ' + c.textContent.slice(0, 60));
"""
WIDGETS = """
return [...document.querySelectorAll('.widget-subarea, .jupyter-widgets, '
  + 'script[type="application/vnd.jupyter.widget-view+json"], '
  + 'script[type="application/vnd.jupyter.widget-state+json"]')].length;
"""


def code_problems(driver) -> list[str]:
    return driver.execute_script(CODE_CELLS) + driver.execute_script(WRAPS)


def output_problems(driver) -> list[str]:
    return driver.execute_script(OUTPUTS)


def table_problems(driver) -> list[str]:
    return driver.execute_script(TABLES)


def math_problems(driver) -> list[str]:
    return driver.execute_script(MATH)


def widget_problems(driver) -> list[str]:
    n = driver.execute_script(WIDGETS)
    return [f"{n} ipywidgets elements: a control that moves without a kernel and changes nothing"] if n else []


def layout_problems(driver) -> list[str]:
    """Everything above, for the page the driver has loaded. (Chromium lays out what a closed ``<details>``
    folds, a hidden cell's code or an output behind "show", so the checks see it folded too.)"""
    return (code_problems(driver) + output_problems(driver) + table_problems(driver)
            + math_problems(driver) + widget_problems(driver))


def chromium(width: int = 1280):
    """A headless Chromium with the network cut off (DNS disabled), or an error naming what is missing."""
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        raise RuntimeError("pagecheck needs Chromium and chromedriver (apt-get install chromium chromium-driver)")
    options = Options()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--host-resolver-rules=MAP * ~NOTFOUND", f"--window-size={width},1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console errors readable
    return webdriver.Chrome(service=Service(driver_path), options=options)


def open_page(driver, page: Path, width: int = 1280) -> None:
    """Load ``page`` at ``width`` px and give MathJax and Plotly time to lay it out."""
    driver.set_window_size(width, 1000)
    driver.get(page.resolve().as_uri())
    driver.set_script_timeout(60)
    driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const wait = () => (window.MathJax && MathJax.startup && MathJax.startup.promise)
            ? MathJax.startup.promise.then(() => done(true), () => done(false)) : done(false);
        if (document.readyState === 'complete') setTimeout(wait, 300);
        else window.addEventListener('load', () => setTimeout(wait, 300));
    """)
    time.sleep(0.7)


def narrow(driver, width: int = 400) -> None:
    """The open page at ``width`` px without loading it again: the browser lays it out anew (the theme's
    media queries, tables, wrapped lines), and MathJax's output, typeset once, is what a reload would give
    (MathJax 3 breaks no lines by width). A reload would wait for the page and MathJax a second time."""
    driver.set_window_size(width, 1000)
    driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        requestAnimationFrame(() => requestAnimationFrame(() => done(true)));
    """)
    time.sleep(0.2)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    root = Path(argv[0])
    pages = [root / p for p in argv[1:]] or [*sorted(root.glob("notebooks/*.html")), *sorted(root.glob("book/*.html")),
                                             *sorted(root.glob("*.html"))]
    driver = chromium()
    bad = 0
    try:
        for page in pages:
            open_page(driver, page)
            problems = layout_problems(driver)
            narrow(driver, 400)  # narrow: tables may scroll, never break a word
            problems += [f"at 400 px: {p}" for p in table_problems(driver) if "breaks inside" in p]
            problems += [f"at 400 px: {p}" for p in math_problems(driver)]  # equations always fit
            bad += bool(problems)
            print(f"{page.relative_to(root)}: {'ok' if not problems else len(problems)}")
            for p in problems:
                print("   ", p)
    finally:
        driver.quit()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
