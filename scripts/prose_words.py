"""Count the prose a reader meets in the built book: article text outside code blocks, inline code and math.

    python scripts/prose_words.py _build/html          # after `make book`; one line per page, then the totals

Markdown a cell displays (``page.say``, tables ``notebook.table`` prints as Markdown, figure captions) counts;
code, printed output (stream and plain-text outputs) and interactive figures do not. Words are runs of letters
(``[A-Za-z][A-Za-z'-]*``), so numbers do not count. At 200 words a minute this gives the book's reading time.
(Issue 44: the book should read in well under three hours.)
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from bs4 import BeautifulSoup

from muongrid.lab.page import WORD   # the same word as the chapters' reading times count

DROP = ["pre", "code", ".math", "mjx-container", "script", "style", ".cell_input", ".output.stream",
        ".output.text_plain", ".output.text_html", ".headerlink", "svg", ".plotly-graph-div", ".caption-number"]
MATH = re.compile(r"\$\$.*?\$\$|\\\(.*?\\\)|\\\[.*?\\\]", re.S)


def page_words(html: str) -> int:
    """Words of prose in one built page's article."""
    soup = BeautifulSoup(html, "html.parser")
    article = soup.select_one("article") or soup.select_one("main") or soup
    for selector in DROP:
        for element in article.select(selector):
            element.decompose()
    return len(WORD.findall(MATH.sub(" ", article.get_text(" "))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("html", nargs="?", default="_build/html", help="the built book (default _build/html)")
    args = p.parse_args()
    root = Path(args.html)
    chapters = sorted(root.glob("notebooks/*.html"))
    if not chapters:
        p.error(f"no built chapters under {root}/notebooks: run `make book` first")
    counts = {page: page_words(page.read_text()) for page in chapters + sorted(root.glob("book/*.html"))}
    for page, n in counts.items():
        print(f"{n:7,d}  {page.relative_to(root)}")
    in_chapters = sum(counts[c] for c in chapters)
    print(f"chapters: {in_chapters:,} words, {in_chapters / 200 / 60:.1f} hours at 200 words a minute; "
          f"all pages: {sum(counts.values()):,}")


if __name__ == "__main__":
    main()
