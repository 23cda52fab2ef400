"""The book reads well on the page, and what it quotes is true (a few seconds, nothing executed).

- No code cell spreads a call or a list over more than 8 lines that each hold one argument (a command
  one flag per line is read down a page instead of across a line: ``run("train.py --dp 2 --tp 2")``).
- Every listing fits the column: each line of code a page shows from ``scripts/`` (``{literalinclude}``,
  read as Sphinx reads it) and of a fenced block in the prose has at most 88 characters, as code cells do
  (``tests/test_notebooks.py``); the browser test checks the built pages the same way.
- Every message the book quotes in its prose (the troubleshooting table, a chapter, the README) is one the
  code can print (``tests/quoted.py`` says how a quote is matched), or one of torch's, listed below.
- ``run()`` takes a command as one would type it.

    PYTHONPATH=scripts python -m pytest -q tests/test_readability.py
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import jupytext
import pytest

import quoted
from conftest import ROOT
from muongrid.lab.notebook import chapters, command_line
from muongrid.lab.page import listings_of, shown_markdown

COLUMNS = 88
MAX_ONE_ARGUMENT_LINES = 8
BOOK_PAGES = sorted((ROOT / "book").glob("*.md"))
PAGES = [ROOT / "README.md", *BOOK_PAGES]   # the README is quoted from too, but GitHub shows it, not the book

# Messages of torch, NCCL and CUDA that the troubleshooting page quotes: not ours to check by grep.
EXTERNAL = {
    "[Rank R] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=…, OpType=ALLGATHER, …) ran "
    "for N milliseconds before timing out": "torch's ProcessGroupNCCL watchdog",
    "Some NCCL operations have failed or timed out": "torch's ProcessGroupNCCL",
    "NCCL error in: …ProcessGroupNCCL.cpp:…, remote process exited or there was a network error": "NCCL",
    "CUDA error: out of memory": "the CUDA runtime",
}


# Pages another branch is still rewriting, by stem, with the reason; strict: once such a page passes, its
# mark must go.
ELSEWHERE: dict[str, str] = {}


def per_page(paths) -> list:
    """``paths`` as test parameters named by page, those of ``ELSEWHERE`` expected to fail."""
    return [pytest.param(p, id=p.stem, marks=[pytest.mark.xfail(strict=True, reason=ELSEWHERE[p.stem])]
                         if p.stem in ELSEWHERE else []) for p in paths]


def markdown_of(path: Path) -> str:
    if path.suffix == ".md":
        return path.read_text()
    return shown_markdown(jupytext.read(path).cells)


def code_cells(path: Path) -> list[str]:
    return [c.source for c in jupytext.read(path).cells if c.cell_type == "code"]


# ---- one argument per line ---------------------------------------------------------------------

def one_argument_lines(source: str) -> set[int]:
    """Lines that hold exactly one argument of a call (or one element of a list, tuple or set) and
    nothing else but a comma and a comment."""
    source = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    tree, lines = ast.parse(source), source.splitlines()
    starts: dict[int, list] = {}
    for node in ast.walk(tree):
        items = ([*node.args, *node.keywords] if isinstance(node, ast.Call)
                 else node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else [])
        for item in items:
            starts.setdefault(item.lineno, []).append(item)
    found = set()
    for n, items in starts.items():
        item = items[0]
        if len(items) != 1 or item.end_lineno != n:
            continue
        text = lines[n - 1]
        before, after = text[:item.col_offset].strip(), text[item.end_col_offset:].strip()
        if before == "" and re.fullmatch(r",?\s*(#.*)?", after):
            found.add(n)
    return found


def longest_run(numbers: set[int]) -> int:
    best = run = 0
    for n in sorted(numbers):
        run = run + 1 if n - 1 in numbers else 1
        best = max(best, run)
    return best


def test_the_one_argument_check_sees_a_spread_call():
    spread = "run(\n    'train.py',\n" + "".join(f"    '--flag{i}',\n    {i},\n" for i in range(5)) + ")\n"
    assert longest_run(one_argument_lines(spread)) == 11
    assert longest_run(one_argument_lines("run('train.py --dp 2 --tp 2', log='collapsed')\n")) == 0
    # a table's rows, one per line, are not single arguments (each holds several values)
    table = "rows = [\n    [1, 2],\n    [3, 4],\n]\nx = f(\n    a,\n    b=2,  # why\n)\n"
    assert one_argument_lines(table) == {6, 7}


@pytest.mark.parametrize("path", per_page(chapters()))
def test_no_code_cell_reads_one_argument_per_line(path):
    worst = [(longest_run(one_argument_lines(src)), src.splitlines()[0][:60]) for src in code_cells(path)]
    too_long = [w for w in worst if w[0] > MAX_ONE_ARGUMENT_LINES]
    assert not too_long, (f"cells with more than {MAX_ONE_ARGUMENT_LINES} consecutive one-argument lines "
                          f"(write the command as one string, run(\"script.py --flag value\")): {too_long}")


# ---- listings fit the column -------------------------------------------------------------------

INCLUDE = re.compile(r"```\{literalinclude\}\s+(\S+)\n((?::[\w-]+:.*\n)*)")


def included_lines(target: str, options_text: str) -> list[str]:
    """The lines a ``{literalinclude}`` of a chapter shows, read by Sphinx's own reader."""
    from sphinx.directives.code import LiteralIncludeReader

    options = {}
    for m in re.finditer(r":([\w-]+):[ \t]*(.*)", options_text):
        key, value = m.group(1), m.group(2).strip()
        options[key] = (int(value) if value else None) if key == "dedent" else value
    options.pop("caption", None)

    class Config:
        source_encoding = "utf-8"

    lines, _ = LiteralIncludeReader(str((ROOT / "notebooks" / target).resolve()), options, Config()).read()
    return lines.splitlines()


def listings(path: Path) -> list[tuple[str, list[str]]]:
    """(what, lines) of every literalinclude and fenced code block of a page of the book."""
    from markdown_it import MarkdownIt

    text, out = markdown_of(path), []
    for m in INCLUDE.finditer(text):
        out.append((m.group(1) + " " + m.group(2).split("\n")[0], included_lines(*m.groups())))
    if path.suffix == ".py":  # a chapter shows the package's code with listing(...), read as it runs
        for args, code in listings_of(jupytext.read(path).cells):
            key = next((k for k in ("pyobject", "start_after") if k in args), None)
            where = f" :{key.replace('_', '-')}: {args[key]}" if key else ""
            out.append((f"../scripts/muongrid/{args['path']}{where}", code.splitlines()))
    for tok in MarkdownIt("commonmark").parse(text):
        if tok.type == "fence" and not tok.info.startswith("{"):   # a directive is not a listing
            out.append((f"```{tok.info} block", tok.content.splitlines()))
    return out


def test_the_engine_listings_are_read_as_sphinx_reads_them():
    shown = [what for path in chapters() for what, _ in listings(path) if what.startswith("../scripts/")]
    assert len(shown) >= 12   # chapters 4 and 5 show the engine's own code
    step = dict(listings(ROOT / "notebooks" / "05_distributed_step.py"))
    lines = step["../scripts/muongrid/distributed.py :pyobject: ZeroOneOptimizer.step"]
    assert lines[1].startswith("def step(self") and not lines[1].startswith(" ")   # dedented


@pytest.mark.parametrize("path", per_page([*chapters(), *BOOK_PAGES]))
def test_listings_fit_the_column(path):
    wide = [f"{what}: {len(line)} columns: {line.strip()[:50]}"
            for what, lines in listings(path) for line in lines if len(line) > COLUMNS]
    assert not wide, f"lines over {COLUMNS} columns scroll sideways at 1280 px: " + "\n".join(wide)


# ---- quoted messages ---------------------------------------------------------------------------

def sources() -> tuple[Path, ...]:
    return tuple(sorted((ROOT / "scripts").rglob("*.py"))) + tuple(chapters())


def test_the_quote_check_tells_a_message_from_a_stale_one():
    files = sources()
    assert quoted.source_of("gradient of parameter 'p' has k NaN/Inf value(s) on rank R", files)
    assert quoted.source_of("world size N does not equal dp*tp", files)
    # two of the code's messages, one completing the other ("{how}, with no Python traceback")
    assert quoted.source_of("was killed by signal SIGKILL, with no Python traceback", files)
    # what the troubleshooting page quoted after the code had stopped raising it, and near misses
    for stale in ("parameter 'p' has no gradient on rank R ... all ranks must have one",
                  "parameter 'p' has no gradient on rank R", "world size N does not equal dp+tp",
                  "gradient of parameter 'p' has k NaN values on rank R"):
        assert quoted.source_of(stale, files) is None, stale


def test_every_quoted_message_is_one_the_code_prints():
    files, missing, seen = sources(), [], set()
    for path in [*chapters(), *PAGES]:
        for q in quoted.quotes(markdown_of(path)):
            seen.add(q)
            if q not in EXTERNAL and quoted.source_of(q, files) is None:
                missing.append(f"{path.name}: `{q}`")
    assert len(seen) >= 15   # the troubleshooting table alone quotes more
    assert not missing, "quoted, but no code prints it (reword it as the code does): " + "; ".join(missing)
    assert set(EXTERNAL) <= seen, f"no longer quoted, drop them from EXTERNAL: {set(EXTERNAL) - seen}"


# ---- run() takes a command string --------------------------------------------------------------

def test_run_takes_the_command_as_typed():
    assert command_line("verify.py --dp 2 --tp 2") == ("verify.py", ["--dp", "2", "--tp", "2"])
    assert command_line("train.py --label 'a b'", "--steps", 3) == ("train.py", ["--label", "a b", "--steps", "3"])
    assert command_line("verify.py", "--dp", 2) == ("verify.py", ["--dp", "2"])
    with pytest.raises(ValueError, match="needs a script"):
        command_line("  ")


def test_prose_words_counts_prose_not_code_math_or_printed_output():
    """scripts/prose_words.py, the book's reading-time count (issue 44): a page's prose counts, a code block, inline
    code, math and a cell's printed output do not."""
    from prose_words import page_words

    html = ("<article><p>Muon keeps one moment <code>momentum_buffer</code> and \\(x^2\\) math.</p>"
            "<div class='cell_input'><pre>print('not prose')</pre></div>"
            "<div class='output stream'><pre>printed words here</pre></div>"
            "<figure><figcaption><span class='caption-number'>Fig. 3 </span>A caption counts.</figcaption></figure>"
            "</article><nav>sidebar words</nav>")
    assert page_words(html) == len("Muon keeps one moment and math".split()) + len("A caption counts".split())


def test_reading_time_counts_prose_code_and_figures():
    """Each chapter's reading time (its box's last line, written by ``python -m muongrid.lab.notebook sync``)
    counts prose at 200 words, the code a reader sees at 8 lines and each figure at one minute (issue 51): an
    admonition's words count, a code block in the prose counts as code, folded or removed code does not, and a
    cell numbered as a figure counts once."""
    from muongrid.lab.notebook import _percent_cells
    from muongrid.lab.page import READ_PER_MINUTE, code_lines, figure_count, prose_words, reading_minutes

    chapter = ('# %% [markdown]\n# # 1. Title\n#\n# ```{admonition} Note\n# four words of prose\n# ```\n#\n'
               '# ```bash\n# make book\n# make test\n# ```\n\n'
               '# %%\nx = 1\n\ny = 2\n\n'
               '# %% tags=["remove-input"] jupyter={"source_hidden": true}\nhidden = 1\n\n'
               '# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-x", "caption": "a=b tags=[1]"}}\n'
               'show(fig)\n')
    cells = _percent_cells(chapter)
    assert READ_PER_MINUTE == {"words": 200, "code lines": 8, "figures": 1}
    assert (prose_words(cells), code_lines(cells), figure_count(cells)) == (5, 4, 1)
    assert reading_minutes(cells) == 5 / 200 + 4 / 8 + 1
