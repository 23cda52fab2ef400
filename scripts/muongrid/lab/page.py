"""What a chapter shows as it runs, the same in Jupyter, JupyterLab, VS Code, Colab and the built book.

A chapter is a notebook first: every figure, explorer, listing and number appears as the output of the
cell that makes it, so a reader who opens the ``.ipynb`` sees what a reader of the website sees. The
book only adds captions, numbers and cross-references on top (MyST-NB reads a cell's
``mystnb: figure: {name, caption}`` metadata and numbers its output as a figure).

    from muongrid.lab.page import keep, say, show, listing

    show(fig)                          # a matplotlib or Plotly figure as this cell's output
    keep("ch1-band-lo", f"{lo:.3f}")   # a value the prose quotes (in a folded cell)
    say("Five steps land in [{{ch1-band-lo}}, 1].")   # Markdown with kept values filled in
    listing("plan.py", pyobject="split_into_buckets")  # a function of the package, shown as code

``say`` is how prose quotes a computed number: it is a code cell whose input the book removes and
Jupyter and Colab fold (``jupyter.source_hidden``), and whose output is the paragraph, rendered as
Markdown everywhere (MyST-NB renders it as MyST, so roles and math work in the book). ``{{name}}``
is the kept value as text; ``{{name:.2f}}`` formats it (a number kept as text is read back as one).
An unknown name raises, so a chapter never shows a hole where a number belongs.

Nothing here needs MyST-NB, so a chapter runs in a bare Colab runtime.
"""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

KEPT: dict[str, object] = {}
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_.-]+)\s*(?::([^}]*))?\}\}")
PACKAGE = Path(__file__).resolve().parents[1]  # scripts/muongrid


def keep(name: str, value) -> None:
    """Keep ``value`` under ``name`` for the prose of this chapter (``say``'s ``{{name}}``)."""
    KEPT[name] = value


def kept(name: str, spec: str = ""):
    """The kept value ``name`` as text, formatted with ``spec`` (``".2f"``, ``","``) when one is given."""
    if name not in KEPT:
        raise KeyError(f"no value kept under {name!r}: keep({name!r}, ...) must run before the prose "
                       f"that quotes it (kept so far: {sorted(KEPT)})")
    value = KEPT[name]
    value = getattr(value, "data", value)  # IPython's Markdown and HTML objects keep their text in .data
    if not spec:
        return str(value)
    if isinstance(value, str):
        value = float(value.replace(",", ""))
    return format(value, spec)


def fill(text: str) -> str:
    """``text`` with every ``{{name}}`` / ``{{name:spec}}`` replaced by the kept value."""
    return PLACEHOLDER.sub(lambda m: kept(m.group(1), m.group(2) or ""), text)


def say(text: str) -> None:
    """Display ``text`` (Markdown) with the kept values filled in, as this cell's output."""
    say_raw(fill(textwrap.dedent(text).strip("\n")))


def show(obj) -> None:
    """Display a figure as this cell's output: a matplotlib figure as an image (then closed, so it is not
    drawn twice), a Plotly figure or explorer with the renderer the front end has (``explorers.show``),
    anything else as IPython would."""
    from IPython.display import display

    from . import explorers

    if isinstance(obj, explorers.Figure):
        obj = obj.fig
    try:
        import plotly.graph_objects as go
    except ImportError:  # pragma: no cover - plotly is in the book's requirements and Colab's image
        go = None
    if go is not None and isinstance(obj, go.Figure):
        explorers.show(obj)
        return
    try:
        from matplotlib.figure import Figure as MplFigure
    except ImportError:  # pragma: no cover
        MplFigure = ()
    display(obj)
    if isinstance(obj, MplFigure):
        import matplotlib.pyplot as plt

        plt.close(obj)


def source_of(path: str, pyobject: str | None = None, start_after: str | None = None,
              end_before: str | None = None) -> str:
    """Lines of ``scripts/muongrid/<path>`` (or of ``scripts/<name>.py``, given as that path from the
    repository root): one top-level function or class (``pyobject``, ``Class.method`` too), or the lines
    between two marker comments, dedented."""
    if path.startswith("scripts/"):   # a script of the checkout (in Colab the package is a copy)
        from .provenance import repository_root
        file = repository_root() / path
    else:
        file = PACKAGE / path
    text = file.read_text()
    lines = text.splitlines()
    if pyobject:
        body = ast.parse(text).body
        node = None
        for part in pyobject.split("."):
            node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                           ast.ClassDef)) and n.name == part), None)
            if node is None:
                raise LookupError(f"{path} has no {pyobject}")
            body = node.body
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        lines = lines[start - 1:node.end_lineno]
    if start_after:
        hits = [i for i, line in enumerate(lines) if start_after in line]
        if not hits:
            raise LookupError(f"{path} has no line with {start_after!r}")
        lines = lines[hits[0] + 1:]
    if end_before:
        hits = [i for i, line in enumerate(lines) if end_before in line]
        if not hits:
            raise LookupError(f"{path} has no line with {end_before!r}")
        lines = lines[:hits[0]]
    return textwrap.dedent("\n".join(lines)).strip("\n")


def listing(path: str, caption: str | None = None, **where) -> None:
    """Show code of the package or of a script (``source_of``'s arguments) as a highlighted Python block,
    under a caption naming its file: the code that runs, read when the chapter runs."""
    code = source_of(path, **where)
    title = caption or (path if path.startswith("scripts/") else f"muongrid/{path}")
    fence = "````" if "```" in code else "```"
    say_raw(f"**{title}**\n\n{fence}python\n{code}\n{fence}")


def say_raw(text: str) -> None:
    """Display Markdown as it is (no placeholders filled)."""
    from IPython.display import Markdown, display

    display(Markdown(text))


# ---- what a chapter shows, read from its source without running it (for the tests) ----------------

SAY_CALL = re.compile(r'^say\(r?f?"""\n?(.*?)"""\)\s*$', re.S)


def shown_markdown(cells) -> str:
    """A chapter's prose as a reader sees it: its Markdown cells and the paragraphs its ``say`` cells
    display (placeholders unfilled), in order. ``cells``: a notebook's cells (jupytext or nbformat)."""
    parts = []
    for cell in cells:
        if cell.cell_type == "markdown":
            parts.append(cell.source)
        elif cell.cell_type == "code" and (m := SAY_CALL.match(cell.source.strip())):
            parts.append(textwrap.dedent(m.group(1)).strip("\n"))
    return "\n\n".join(parts)


def listings_of(cells) -> list[tuple[dict, str]]:
    """Every ``listing(...)`` a chapter's code cells call: (its arguments, the code it shows). Raises
    ``LookupError`` for one that names no function, class or marker of the package."""
    found = []
    for cell in cells:
        if cell.cell_type != "code" or "listing(" not in cell.source:
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "listing":
                args = dict(path=ast.literal_eval(node.args[0]),
                            **{k.arg: ast.literal_eval(k.value) for k in node.keywords})
                where = {k: v for k, v in args.items() if k != "caption"}
                found.append((args, source_of(**where)))
    return found


WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")   # a word of prose: letters, so numbers do not count
FENCE = re.compile(r"^\s*(`{3,}|:{3,})\s*(\S*)")
# What a reader gets through in a minute: the reading time counts code and figures, not prose alone
READ_PER_MINUTE = {"words": 200, "code lines": 8, "figures": 1}
HIDES_CODE = {"remove-input", "remove-cell", "hide-input", "hide-cell"}   # folded code is not read


def _split_fences(markdown: str) -> tuple[str, list[str]]:
    """(the prose, the lines of its code blocks) of Markdown: a fence whose info is a directive
    (```` ```{admonition} ````, ``:::{admonition}``) holds prose; any other fence holds code."""
    prose, code, stack = [], [], []   # stack: (fence characters, is code) of the open fences
    for line in markdown.splitlines():
        m = FENCE.match(line)
        if m and stack and m.group(1) == stack[-1][0] and not m.group(2):   # closes the innermost
            stack.pop()
            continue
        if m and not (stack and stack[-1][1]):   # opens a block (nothing opens inside code)
            stack.append((m.group(1), not m.group(2).startswith("{")))
            continue
        (code if stack and stack[-1][1] else prose).append(line)
    return "\n".join(prose), code


def prose_words(cells) -> int:
    """Words of prose a reader reads in a chapter (``shown_markdown`` without code blocks, inline code and
    math; admonitions count, they are prose)."""
    text = _split_fences(shown_markdown(cells))[0]
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]*\$|`[^`]*`", " ", text, flags=re.S)
    return len(WORD.findall(text))


def _tags(cell) -> set[str]:
    return set(getattr(cell, "metadata", {}).get("tags", []))


def code_lines(cells) -> int:
    """Non-blank lines of code a reader reads in a chapter: code cells whose input the page shows (not
    folded or removed), code blocks in its prose, and the package code its ``listing`` calls show."""
    shown = [c.source for c in cells if c.cell_type == "code" and not _tags(c) & HIDES_CODE]
    blocks = _split_fences(shown_markdown(cells))[1]
    listed = [code for _, code in listings_of(cells)]
    return sum(1 for line in "\n".join([*shown, *blocks, *listed]).splitlines() if line.strip())


def figure_count(cells) -> int:
    """Figures in a chapter: cells the book numbers as figures (``mystnb`` figure metadata) and figures
    its Markdown places (```` ```{figure} ````, ``![..](..)``)."""
    numbered = sum(1 for c in cells if "figure" in (getattr(c, "metadata", {}).get("mystnb") or {}))
    placed = len(re.findall(r"^\s*`{3,}\{figure\}|!\[[^\]]*\]\(", shown_markdown(cells), re.M))
    return numbered + placed


def reading_minutes(cells) -> float:
    """Minutes to read a chapter at ``READ_PER_MINUTE``: its prose, the code it shows and its figures."""
    counts = {"words": prose_words(cells), "code lines": code_lines(cells), "figures": figure_count(cells)}
    return sum(n / READ_PER_MINUTE[k] for k, n in counts.items())
