"""The book's prose points at real files: every ``scripts/...``, ``muongrid/...`` and ``tests/...`` path it
mentions exists, a path written alone in a code span is a link to that file on the repository, and
every ``{literalinclude}`` (the code excerpts of chapters 4 and 5) names a file, a ``:pyobject:`` and
markers that exist. Nothing is executed: the Jupytext sources and book/*.md are parsed (about a second).

    PYTHONPATH=scripts python -m pytest -q tests/test_book_links.py
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import jupytext
import pytest

from muongrid.lab.notebook import repository_url
from muongrid.lab.page import listings_of, shown_markdown
from conftest import ROOT

# A path in prose: not part of a longer path or URL (``../scripts/x``, ``.../blob/main/scripts/x``).
PATH = re.compile(r"(?<![\w/.-])((?:scripts|muongrid|tests)/[\w./-]*)")
# A code span holding nothing but such a path, and whether a Markdown link wraps it.
SPAN = re.compile(r"(\[)?`((?:scripts|muongrid|tests)/[\w./-]*)`(\]\(([^)\s]+)\))?")
FENCE = re.compile(r"^(```+|:::+)(.*)$")
INCLUDE = re.compile(r"^```\{literalinclude\}\s+(\S+)\s*\n((?::[\w-]+:.*\n)*)", re.M)


def repo_path(mention: str) -> Path:
    """Where a mention lives in the checkout: ``muongrid/x`` is ``scripts/muongrid/x``."""
    mention = mention.rstrip(".,;:")
    return ROOT / ("scripts/" + mention if mention.startswith("muongrid/") else mention)


def prose(markdown: str) -> str:
    """The text outside plain code fences (directive fences such as ```{admonition} are prose)."""
    out, fence = [], None
    for line in markdown.splitlines():
        m = FENCE.match(line.strip())
        if fence is None and m and m.group(1).startswith("```") and not m.group(2).startswith("{"):
            fence = m.group(1)
            continue
        if fence is not None:
            if line.strip() == fence:
                fence = None
            continue
        out.append(line)
    return "\n".join(out)


def problems(markdown: str, url: str) -> list[str]:
    """What is wrong with the paths in one page's (or cell's) Markdown."""
    found, text = [], prose(markdown)
    for m in PATH.finditer(text):
        if not repo_path(m.group(1)).exists():
            found.append(f"{m.group(1)!r} does not exist")
    for m in SPAN.finditer(text):
        bracket, path, _, href = m.groups()
        where = repo_path(path)
        kind = "tree" if where.is_dir() else "blob"
        want = f"{url}/{kind}/main/{where.relative_to(ROOT).as_posix()}".rstrip("/")
        if not (bracket and href):
            found.append(f"`{path}` is not a link (want [`{path}`]({want}))")
        elif href.rstrip("/") != want:
            found.append(f"`{path}` links to {href}, want {want}")
    for href in re.findall(re.escape(url) + r"/(?:blob|tree)/main/([^)\s#]+)", text):
        if not (ROOT / href).exists():
            found.append(f"a link to {href}, which does not exist")
    return found


def include_problems(markdown: str, folder: Path) -> list[str]:
    """A literalinclude whose file, pyobject or markers are missing (paths resolve from ``folder``,
    as Sphinx resolves them from the page's own folder)."""
    found = []
    for m in INCLUDE.finditer(markdown):
        target = (folder / m.group(1)).resolve()
        if not target.is_file():
            found.append(f"literalinclude {m.group(1)}: no such file from {folder.name}/")
            continue
        source = target.read_text()
        options = dict(re.findall(r"^:([\w-]+):\s*(.*)$", m.group(2), re.M))
        if "pyobject" in options and options["pyobject"] not in python_objects(source):
            found.append(f"literalinclude {m.group(1)}: no {options['pyobject']}")
        for key in ("start-after", "end-before"):
            if key in options and options[key].strip() not in source:
                found.append(f"literalinclude {m.group(1)}: no {key} marker {options[key]!r}")
    return found


def python_objects(source: str) -> set[str]:
    """``f``, ``C`` and ``C.m`` for every top-level function, class and method."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{n.name}" for n in node.body if isinstance(n, ast.FunctionDef)}
    return names


def pages() -> list[tuple[Path, str]]:
    """Every page's Markdown: what each chapter's .py source shows as prose (its markdown cells and the
    paragraphs its ``say`` cells display), and book/*.md."""
    out = []
    for py in sorted((ROOT / "notebooks").glob("*.py")):
        out.append((py, shown_markdown(jupytext.read(py).cells)))
    out += [(md, md.read_text()) for md in sorted((ROOT / "book").glob("*.md"))]
    return out


@pytest.mark.parametrize("page", pages(), ids=lambda p: p[0].name)
def test_paths_in_prose_exist_and_link_to_the_repository(page):
    path, markdown = page
    assert not problems(markdown, repository_url()), path.name


@pytest.mark.parametrize("page", pages(), ids=lambda p: p[0].name)
def test_code_excerpts_resolve(page):
    path, markdown = page
    assert not include_problems(markdown, path.parent), path.name


def test_the_chapters_with_the_step_show_its_code():
    """Chapters 4 and 5 show the engine's own code with ``listing(...)``, read when the chapter runs (so
    a Jupyter reader sees it too); each names a function, class or marker that exists (``listings_of``
    raises for one that does not)."""
    shown = {name: listings_of(jupytext.read(ROOT / "notebooks" / name).cells)
             for name in ("04_zero1_buffer.py", "05_distributed_step.py")}
    for name, found in shown.items():
        assert found, f"{name} shows no code of the package"
    assert any(args.get("pyobject") == "BucketFlow._orthogonalise_bucket" for args, _ in shown["05_distributed_step.py"])
    every = [a for py in sorted((ROOT / "notebooks").glob("*.py")) for a in listings_of(jupytext.read(py).cells)]
    assert len(every) >= 12 and all(code.strip() for _, code in every)


def test_the_checks_catch_what_they_are_for():
    """The checks above can fail: a missing path, a bare path, a wrong link, a missing excerpt."""
    url = "https://github.com/o/r"
    assert problems("see `muongrid/nothing_here.py`", url)
    assert problems("see `scripts/verify.py`", url)
    assert problems(f"see [`scripts/verify.py`]({url}/blob/main/scripts/other.py)", url)
    assert not problems(f"see [`scripts/verify.py`]({url}/blob/main/scripts/verify.py)", url)
    assert not problems(f"run `python scripts/verify.py --dp 2` or\n```bash\nls scripts/nowhere\n```", url)
    assert problems("run `python scripts/nowhere.py`", url)
    folder = ROOT / "notebooks"
    assert include_problems("```{literalinclude} ../scripts/muongrid/flows.py\n:pyobject: NoSuch.thing\n```", folder)
    assert include_problems("```{literalinclude} ../scripts/missing.py\n```", folder)
    assert include_problems("```{literalinclude} ../scripts/muongrid/plan.py\n:start-after: NO MARKER\n```", folder)
    assert not include_problems("```{literalinclude} ../scripts/muongrid/flows.py\n:pyobject: BucketFlow.run\n```",
                                folder)


# ---- the front door: the road map comes from _toc.yml, the first page says how to start --------------

def test_the_road_map_lists_every_page_of_the_toc():
    from booktools.bookbuild import toc_files
    from muongrid.lab.roadmap import rows, table_markdown

    listed = toc_files()[1:]
    assert [r[0] for r in rows()] == listed
    table = table_markdown()
    assert all(f"</{p}>`" in table for p in listed)
    assert "12. Use it in your training" in table   # titles come from each page's first heading
    source = (ROOT / "notebooks" / "00_start_here.py").read_text()
    assert "table_markdown()" in source and "| 12." not in source   # generated, not typed


def test_the_index_routes_every_chapter_by_goal_and_does_not_repeat_the_road_map():
    """The first page says which chapters to read for each goal; chapter 0 holds the one table of pages."""
    from booktools.bookbuild import toc_files

    index = (ROOT / "book" / "index.md").read_text()
    assert "{chapter-table}" not in index and "| Page |" not in index
    for goal in ("To understand", "To use it", "To decide", "To reproduce the paper"):
        assert f"**{goal}" in index, goal
    linked = set(re.findall(r"\{doc\}`[^`<]*<\.\./(notebooks/[^>]+)>`", index))
    chapters = {p for p in toc_files() if p.startswith("notebooks/")}
    assert chapters - linked == set(), f"chapters no goal of the index names: {sorted(chapters - linked)}"


def test_a_chapter_without_a_road_map_question_is_an_error():
    from muongrid.lab.roadmap import rows

    toc = ("format: jb-book\nroot: book/index\nchapters:\n"
           "  - file: notebooks/00_start_here\n  - file: notebooks/99_new\n")
    with pytest.raises(KeyError, match="99_new"):
        rows(toc)


def test_chapter_0_starts_with_the_real_repository_and_make_setup():
    source = (ROOT / "notebooks" / "00_start_here.py").read_text()
    assert "<this repository>" not in source
    assert "repository_url()" in source and "make setup" in source
    markdown = "\n\n".join(c.source for c in jupytext.read(ROOT / "notebooks" / "00_start_here.py").cells
                           if c.cell_type == "markdown")
    first = next(p for p in markdown.split("\n\n") if "proof of concept" in " ".join(p.split()))
    assert "{cite:p}`moonshot2025moonlight`" in first, "the proof of concept is not cited where it is introduced"
    assert "moonshot2025moonlight" in (ROOT / "book" / "references.bib").read_text()


# ---- reading aids: chapters 6-13 link the chapters they mention and their terms to the glossary --------

def test_chapters_6_to_13_link_the_chapters_they_mention_and_their_terms():
    glossary = (ROOT / "book" / "glossary.md").read_text()
    defined = {t.strip().lower() for t in re.findall(r"^(\S[^\n]*)\n  \S", glossary, re.M)}
    for path, markdown in pages():
        if not (path.suffix == ".py" and 6 <= int(path.name[:2]) <= 13):
            continue
        lines = [line for line in prose(markdown).splitlines()
                 if not line.startswith(("#", ":", "```"))]
        text = re.sub(r"\{doc\}`[^`]*`|`[^`]*`", "", "\n".join(lines))
        plain = re.findall(r"\b[Cc]hapter \d+\b", text)
        assert not plain, f"{path.name}: {plain} are not links ({{doc}}`chapter N <NN_name>`)"
        terms = [t.split("<")[-1].rstrip(">").strip().lower() for t in re.findall(r"\{term\}`([^`]*)`", markdown)]
        assert all(t in defined for t in terms), f"{path.name}: {set(terms) - defined} not in the glossary"
        if int(path.name[:2]) <= 11:
            assert terms, f"{path.name} links none of its terms to the glossary"


# ---- furniture: every chapter reads the same way ----------------------------------------------------------

# A chapter that leaves out a piece says why here (none does today); the test then checks the rest.
FURNITURE_EXEMPT: dict[str, dict[str, str]] = {}
FURNITURE = {  # piece -> the Markdown line that opens it
    "what it runs": re.compile(r"^```\{admonition\} What this chapter runs\s*$", re.M),
    "summary": re.compile(r"^## Summary\s*$", re.M),
    "exercises": re.compile(r"^## Exercises\s*$", re.M),
    "solutions": re.compile(r"^:::\{admonition\} Solutions\s*\n:class: dropdown\s*$", re.M),
}


def furniture_problems(markdown: str, exempt: dict[str, str] | None = None) -> list[str]:
    """What a chapter's Markdown lacks or repeats of its furniture: exactly one "What this chapter
    runs" admonition, one Summary, one Exercises section and one (folded) Solutions admonition after
    it. ``exempt`` maps a piece to the reason the chapter leaves it out."""
    exempt = exempt or {}
    found, at = [], {}
    for piece, pattern in FURNITURE.items():
        hits = [m.start() for m in pattern.finditer(markdown)]
        if piece in exempt:
            if hits:
                found.append(f"{piece} is exempt ({exempt[piece]}) but present")
            continue
        if len(hits) != 1:
            found.append(f"{len(hits)} x {piece}, want 1")
        elif hits:
            at[piece] = hits[0]
    if "exercises" in at and "solutions" in at and at["solutions"] < at["exercises"]:
        found.append("the solutions come before the exercises")
    if "what it runs" in at and "summary" in at and at["summary"] < at["what it runs"]:
        found.append("the summary comes before the 'What this chapter runs' box")
    return found


@pytest.mark.parametrize("page", [p for p in pages() if p[0].suffix == ".py"], ids=lambda p: p[0].name)
def test_every_chapter_has_the_same_furniture(page):
    path, markdown = page
    problems_found = furniture_problems(markdown, FURNITURE_EXEMPT.get(path.stem))
    assert not problems_found, f"{path.name}: {problems_found}"


def test_the_furniture_check_catches_what_it_is_for():
    """The check can fail: a missing Summary, a second box, solutions before exercises, and a
    piece that is exempt but present; a complete chapter passes."""
    good = ("# 1. T\n\n```{admonition} What this chapter runs\nx\n```\n\n## Summary\n\n- a\n\n"
            "## Exercises\n\n1. q\n\n:::{admonition} Solutions\n:class: dropdown\n\n1. a\n:::\n")
    assert not furniture_problems(good)
    assert furniture_problems(good.replace("## Summary", "## Recap")) == ["0 x summary, want 1"]
    twice = good.replace("## Summary", "```{admonition} What this chapter runs\ny\n```\n\n## Summary")
    assert furniture_problems(twice) == ["2 x what it runs, want 1"]
    flipped = good.replace("## Exercises\n\n1. q\n\n", "") + "\n## Exercises\n\n1. q\n"
    assert furniture_problems(flipped) == ["the solutions come before the exercises"]
    unfolded = good.replace(":class: dropdown\n", "")
    assert furniture_problems(unfolded) == ["0 x solutions, want 1"]
    assert furniture_problems(good, {"summary": "a reference page"}) == [
        "summary is exempt (a reference page) but present"]
    no_summary = good.replace("## Summary\n\n- a\n\n", "")
    assert not furniture_problems(no_summary, {"summary": "a reference page"})


# The index's twenty-minute path: per stop, the chapter and its stretches (from one heading to the next one
# named), in the order the index lists them; the index's own figure opens the second stop.
TWENTY_MINUTES = [("01_muon", [("Orthogonalisation", "Explore the coefficients")]),
                  ("05_distributed_step", [("The flow", "The step from scratch"),
                                           ("Step through it", "Is it right?")]),
                  ("08_beyond_poc", [("The (1, 1.25] bound", "With tensor parallelism")]),
                  ("13_what_to_pick", [("The decision", "What each layout costs")])]


def stretch(cells, start: str, end: str) -> list:
    """The cells of a chapter from the heading that starts with ``start`` to the next one that starts with
    ``end`` (any level), Markdown cells cut at those lines."""
    import copy

    out, on = [], False
    for cell in cells:
        if cell.cell_type != "markdown":
            out += [cell] if on else []
            continue
        kept = []
        for line in cell.source.splitlines():
            heading = re.match(r"#{2,4} (.*)", line)
            if heading and on and heading.group(1).startswith(end):
                on = None
                break
            on = on or bool(heading and heading.group(1).startswith(start))
            kept += [line] if on else []
        if kept:
            out.append(copy.copy(cell))
            out[-1].source = "\n".join(kept)
        if on is None:
            return out
    raise AssertionError(f"no heading {start!r} followed by {end!r}: the index's twenty-minute path names them")


def test_the_twenty_minute_path_fits_twenty_minutes():
    """The index's twenty-minute path names sections that exist, says each stop's minutes as the chapters'
    reading times count them (``page.reading_minutes``: 200 words, 8 lines of code or one figure a minute,
    to the nearest minute), and adds up to at most 20 (issue 51: its stops reach chapter 5's explorer and
    chapter 8's 1.25x section)."""
    from muongrid.lab.page import reading_minutes

    index = (ROOT / "book" / "index.md").read_text()
    path = index[index.index("## In twenty minutes"):index.index("## Which chapters to read")]
    said = [int(m) for m in re.findall(r"\(about (\d+) minutes?\)", path)]
    assert len(said) == len(TWENTY_MINUTES), said
    minutes = []
    for i, (chapter, stretches) in enumerate(TWENTY_MINUTES):
        cells = jupytext.read(ROOT / "notebooks" / f"{chapter}.py").cells
        for start, _ in stretches:
            assert f'"{start}' in " ".join(path.split()), f"the index's stop {i + 1} does not name {start!r}"
        minutes.append(sum(reading_minutes(stretch(cells, *s)) for s in stretches) + (i == 1))  # + its figure
    counted = [max(1, round(m)) for m in minutes]
    assert said == counted, f"the index says {said} minutes for its stops; they read in {minutes}"
    assert sum(minutes) <= 20, f"the twenty-minute path reads in {sum(minutes):.1f} minutes: {minutes}"


def test_each_chapter_title_carries_its_file_number():
    """The title's number is the file's (``14_on_a_gpu.py`` is "# 14. ..."): after chapters are renumbered
    the sidebar and the titles must agree, and a title is easy to forget (issue 44)."""
    wrong = []
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        title = next(line for line in path.read_text().splitlines() if line.startswith("# # "))
        if not title.startswith(f"# # {int(path.name[:2])}. "):
            wrong.append(f"{path.name}: {title}")
    assert not wrong, wrong
