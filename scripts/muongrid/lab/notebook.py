"""What the chapters share: launching scripts from a cell, reading their results, and the set-up cell.

In a notebook (``muongrid`` is installed: ``make setup`` does ``pip install -e .``; in Colab the set-up cell does it):

    from muongrid.lab.notebook import run, last_json
    out = run("verify.py --dp 2 --tp 2")   # streams into the cell; raises if the script fails
    result = last_json(out)                 # the script's final JSON line, as a dict

The command reads as it would in a shell (split with ``shlex``); arguments may also come one by one
after it, for values a cell computes: ``run("verify.py --dp 2", "--shapes", shapes)``.

Why a subprocess: ``torch.multiprocessing`` spawns ranks by importing the function they run, and
a function defined in a notebook cell cannot be imported; and ``!python ...`` never raises on a
non-zero exit, so a broken script would leave a green notebook. ``run`` does both jobs properly.

From a shell:

    python -m muongrid.lab.notebook sync     # rewrite every chapter's set-up cell (after its title) from SETUP_CELL
    python -m muongrid.lab.notebook check    # exit 1 if any chapter's set-up cell is out of date or misplaced

The repository URL is written once, in ``_config.yml`` (``repository.url``); the set-up cell of every
chapter is generated from it, and a test checks that it is.
"""
from __future__ import annotations

import atexit
import functools
import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from .provenance import repository_root

ROOT = repository_root()
SCRIPTS = ROOT / "scripts"
NOTEBOOKS = ROOT / "notebooks"


class ScriptFailed(RuntimeError):
    """A launched script exited with a non-zero code (or succeeded where it was expected to fail)."""


def _relative(line: str) -> str:
    """A line of script output with the checkout's absolute path removed (tracebacks, trace files)."""
    return line.replace(str(ROOT) + os.sep, "")


def command_line(command: str, *args) -> tuple[str, list[str]]:
    """(script, arguments) of ``run``'s command: the string split as a shell would, then ``args``.

    >>> command_line("verify.py --dp 2 --tp 2", "--shapes", "8x8")
    ('verify.py', ['--dp', '2', '--tp', '2', '--shapes', '8x8'])
    """
    words = shlex.split(command)
    if not words:
        raise ValueError("run() needs a script to run, e.g. run(\"verify.py --dp 2 --tp 2\")")
    return words[0], [*words[1:], *map(str, args)]


def run(command: str, *args, expect_failure: bool = False, timeout: float = 900, echo_json: bool = False,
        log: str = "stream", env: dict | None = None) -> str:
    """Run ``python scripts/<script> <arguments>``, show its output, and return it.

    ``command`` is the script and its arguments as one would type them in a shell
    (``"train.py --dp 2 --tp 2"``); ``args`` are appended to it (any values, made strings).
    Raises ``ScriptFailed`` if the script exits non-zero, or, with ``expect_failure=True``, if it
    exits zero. Lines that are JSON objects (machine-readable results) are not shown unless
    ``echo_json``; they are still in the returned text. Paths inside the checkout are shown relative
    to it. ``log="stream"`` prints lines as they come; ``log="collapsed"`` shows the whole output
    afterwards in a collapsed block (``<details>``), for long logs that the chapter summarises
    itself; an unexpected failure is always shown in full. ``env`` adds environment variables (shown
    in front of the command, as a shell would take them).

    Inside a book build (``make book``), the script's process is forked from a Python that has already
    imported torch: the build's warm-start server (``scripts/booktools/warmstart.py``, named by
    ``MUONGRID_WARM_SOCKET``; seconds saved per call). Anywhere else, and with ``MUONGRID_WARM_START=0``,
    it is a new interpreter.
    """
    if log not in ("stream", "collapsed"):
        raise ValueError("log must be 'stream' or 'collapsed'")
    script, args = command_line(command, *args)
    cmd = [sys.executable, str(SCRIPTS / script), *args]
    shown = " ".join([*(f"{k}={shlex.quote(str(v))}" for k, v in (env or {}).items()), "python",
                      f"scripts/{script}", *map(shlex.quote, args)])
    if log == "stream":
        print(f"$ {shown}", flush=True)
    proc = _start(cmd, dict(os.environ, PYTHONUNBUFFERED="1", **{k: str(v) for k, v in (env or {}).items()}))
    lines, visible = [], []
    try:
        for line in proc.stdout:
            lines.append(line)
            # torch 2.13's profiler (kineto) prints "USDT: ... profiler_start/stop" on every use, unconditionally
            if (echo_json or not line.startswith("{")) and not line.startswith("USDT:"):
                visible.append(_relative(line))
                if log == "stream":
                    print(visible[-1], end="", flush=True)
        code = proc.wait(timeout=timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    failed = (code != 0) != expect_failure
    if log == "collapsed":
        if failed:
            print(f"$ {shown}\n" + "".join(visible), flush=True)
        else:
            show_log(f"$ {shown}", "".join(visible), f"exit code {code}")
    if code != 0 and not expect_failure:
        raise ScriptFailed(f"`{shown}` exited with code {code}; its output is above")
    if code == 0 and expect_failure:
        raise ScriptFailed(f"`{shown}` was expected to fail but exited with code 0")
    return "".join(lines)


_warm = None


def _start(cmd: list[str], env: dict):
    """The script's process: forked by the book build's warm-start server if this kernel runs inside one,
    else a new interpreter."""
    global _warm
    if _warm is None and os.environ.get("MUONGRID_WARM_SOCKET"):
        try:   # the book's tooling: beside the package in a checkout (scripts/booktools), never in the wheel
            from booktools import warmstart
        except ImportError:
            warmstart = None
        if warmstart is not None and warmstart.enabled():
            _warm = warmstart.WarmStarter(cmd[0], str(SCRIPTS), os.environ["MUONGRID_WARM_SOCKET"])
            atexit.register(_warm.close)
    if _warm is not None:
        proc = _warm.start(cmd[1:], str(ROOT), env)
        if proc is not None:
            return proc
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)


def show_log(title: str, text: str, note: str = "") -> None:
    """Display ``text`` in a collapsed block titled ``title`` (plain text where HTML is not shown)."""
    import html

    from IPython.display import display

    lines = text.count("\n")
    summary = f"{html.escape(title)} <small>({lines} lines{', ' + html.escape(note) if note else ''}; click to show)</small>"
    display({"text/html": f'<details class="muongrid-log"><summary><code>{summary}</code></summary>'
                          f"<pre>{html.escape(text)}</pre></details>",
             "text/plain": f"{title}\n{text}"}, raw=True)


def table(headers: list[str], rows: list[list], align: str | None = None) -> None:
    """Display a Markdown table (the book renders it as an HTML table that fits the column).
    ``align``: one character per column, ``l`` or ``r`` (default: numbers right, text left)."""
    from IPython.display import Markdown, display

    def cell(v):  # a "|" would end the cell and a newline the row: escape the one, fold the other
        text = f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)
        return text.replace("|", "\\|").replace("\n", " ")

    align = align or "".join("r" if rows and isinstance(rows[0][i], (int, float)) else "l" for i in range(len(headers)))
    rule = ["---:" if a == "r" else ":---" for a in align]
    text = "\n".join("| " + " | ".join(r) + " |"
                     for r in [[cell(h) for h in headers], rule, *[[cell(v) for v in row] for row in rows]])
    display(Markdown(text))


def last_json(output: str) -> dict:
    """The last line of a script's output that is a JSON object."""
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("the script printed no JSON result line")


# ---- the set-up cell ------------------------------------------------------------------------

SETUP_MARKER = "# Set-up (written by `python -m muongrid.lab.notebook sync`)."
SETUP_PREFIX = "# Set-up"  # also finds cells an older marker made
# What a Colab CPU runtime has before a chapter's set-up cell runs (its image), by import name.
COLAB_IMAGE = {"torch", "numpy", "matplotlib", "plotly", "ipywidgets", "sklearn", "pandas", "IPython",
               "ipykernel", "traitlets", "google"}
PIP_NAMES = {"sklearn": "scikit-learn", "yaml": "PyYAML"}
# Lines of at most 88 characters, like every code cell of the book (tests/test_notebooks.py).
SETUP_CELL = """\
# %% tags=["hide-cell"] jupyter={{"source_hidden": true}}
{marker}
# In Colab: fetch the book's code and install what this chapter needs beyond Colab's
# image (never torch). Elsewhere nothing is installed here: `make setup` does it.
import importlib.util, os, subprocess, sys  # noqa: E401
REPOSITORY = "{url}"{commit}
HOME = "/content/{name}"  # where Colab keeps the clone
if "google.colab" in sys.modules:
    if {fetch}:
        raise RuntimeError(
            f"could not clone {{REPOSITORY}}: this book's repository is not public "
            "yet (or this runtime cannot reach it). Run the book on your machine: "
            "in a copy of the repository, `make lab` sets up Python and opens the "
            "chapters in JupyterLab (`make book` builds all of them).")
    os.chdir(os.path.join(HOME, "notebooks"))
    install = [sys.executable, "-m", "pip", "install", "-q"]
    if importlib.util.find_spec("muongrid") is None:  # the book's package, not its deps
        subprocess.run([*install, "--no-deps", ".."], check=True)
    wanted = {wanted}
    missing = [pip for module, pip in wanted
               if importlib.util.find_spec(module) is None]
    if missing:
        subprocess.run([*install, *missing], check=True)
    importlib.invalidate_caches()
elif (importlib.util.find_spec("muongrid") is None
      or not os.path.isfile(os.path.join("..", "scripts", "verify.py"))):
    raise RuntimeError(
        "this chapter runs inside the book's repository, with its package installed: "
        "in a copy of the repository, `make lab` sets it up and opens JupyterLab on "
        "its notebooks/ folder; open the chapter there. In Colab, open it with the "
        "book's Colab button.")
"""


def _imports(path: Path) -> set[str]:
    return _imports_of(path.resolve(), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _imports_of(path: Path, mtime_ns: int) -> frozenset[str]:
    """Module names ``path`` imports anywhere (a chapter's py:percent source or a module), relative
    imports of the package made absolute (``from .costmodel import x`` -> ``muongrid.lab.costmodel``,
    ``from . import y`` -> ``muongrid.lab.y``)."""
    import ast

    here = path.resolve().relative_to(SCRIPTS.resolve()).with_suffix("").parts if path.resolve().is_relative_to(
        SCRIPTS.resolve()) else ()
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = here[:len(here) - node.level]  # a module's package is its folder
                base = ".".join([*package, *([node.module] if node.module else [])])
                names |= {base} if node.module else {f"{base}.{a.name}" for a in node.names}
            elif node.module:
                names.add(node.module)
    return frozenset(names)


def _module_file(name: str) -> Path | None:
    """The source of ``muongrid.x.y`` in this checkout (a module or a package's __init__)."""
    base = SCRIPTS.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def needed_modules(chapter: Path) -> set[str]:
    """Third-party top-level modules a chapter needs: what its cells import, what the scripts it runs
    import, and what the muongrid modules either of those import, followed to the end."""
    text = chapter.read_text()
    todo = [chapter] + [SCRIPTS / s for s in sorted(set(re.findall(r"""run\(\s*f?["']([\w.]+\.py)""", text)))]
    seen, third_party = set(), set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for name in _imports(path):
            top = name.split(".")[0]
            if top == "muongrid":
                parts = name.split(".")
                for i in range(1, len(parts) + 1):  # the package, its subpackages and the module
                    found = _module_file(".".join(parts[:i]))
                    if found:
                        todo.append(found)
            elif (SCRIPTS / f"{top}.py").is_file():  # an entry point beside the package (scripts/)
                todo.append(SCRIPTS / f"{top}.py")
            elif (SCRIPTS / top / "__init__.py").is_file():  # the book's tooling (booktools): a build's, not Colab's
                continue
            elif top not in sys.stdlib_module_names and top != "__future__":
                third_party.add(top)
    # ``from muongrid.lab import explorers``: a module named as an imported attribute
    for path in list(seen):
        for m in re.finditer(r"from (muongrid(?:\.\w+)*) import ([\w, ()\n]+)", path.read_text()):
            for attr in re.findall(r"\w+", m.group(2)):
                found = _module_file(f"{m.group(1)}.{attr}")
                if found and found not in seen:
                    seen.add(found)
                    third_party |= {n.split(".")[0] for n in _imports(found)
                                    if n.split(".")[0] not in sys.stdlib_module_names | {"muongrid", "__future__"}}
    return third_party


def pinned(pip_name: str) -> str:
    """``pip_name`` with the version requirements.txt pins, if it pins one."""
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        spec = line.split("#")[0].strip()
        if re.match(rf"{re.escape(pip_name)}\s*([=<>!~]|$)", spec, re.I):
            return spec
    return pip_name


def colab_installs(chapter: Path) -> list[tuple[str, str]]:
    """(import name, pip requirement) for what ``chapter`` needs beyond Colab's image, sorted."""
    return sorted((m, pinned(PIP_NAMES.get(m, m))) for m in needed_modules(chapter) - COLAB_IMAGE)


def repository_url() -> str:
    """``repository.url`` from ``_config.yml``: the one place the URL is written."""
    match = re.search(r"^repository:\s*\n(?:\s+.*\n)*?\s+url:\s*(\S+)", (ROOT / "_config.yml").read_text(), re.M)
    if not match:
        raise ValueError("_config.yml has no repository.url")
    return match.group(1).strip("\"'")


# The address the repository was shipped with, before it was published (book/_ext/offline_assets.py
# prints a notice while _config.yml still names it).
PLACEHOLDER_URL = "https://github.com/muongrid-book/distributed-muon"


def repository_is_public() -> bool:
    """Whether ``repository.url`` names a published repository (not the placeholder it shipped with)."""
    return repository_url().rstrip("/") != PLACEHOLDER_URL


# How the set-up cell fetches the code: the branch's newest commit (a chapter of the repository), or
# the one commit whose run made the stored outputs (the notebook edition, booktools.edition).
CLONE = """not os.path.isdir(HOME) and subprocess.run(
            ["git", "clone", "--quiet", "--depth", "1", REPOSITORY, HOME]).returncode"""
FETCH_COMMIT = """not os.path.isdir(os.path.join(HOME, "scripts")) and any(
            subprocess.run(git).returncode for git in (
                ["git", "init", "--quiet", HOME],
                ["git", "-C", HOME, "fetch", "--quiet", "--depth", "1", REPOSITORY, COMMIT],
                ["git", "-C", HOME, "checkout", "--quiet", "FETCH_HEAD"]))"""


def setup_cell(chapter: Path, commit: str | None = None, marker: str = SETUP_MARKER,
               wanted: list | None = None) -> str:
    """The set-up cell of ``chapter``: the repository from ``_config.yml``, the installs it needs (``wanted``,
    if already known: ``colab_installs``). With ``commit``, the cell fetches that commit instead of cloning
    the branch (the notebook edition)."""
    url = repository_url()
    pinned = f'\nCOMMIT = "{commit}"  # the commit whose run made the outputs stored below' if commit else ""
    return SETUP_CELL.format(marker=marker, url=url, name=url.rstrip("/").split("/")[-1],
                             wanted=repr(colab_installs(chapter) if wanted is None else wanted), commit=pinned,
                             fetch=FETCH_COMMIT if commit else CLONE)


def chapters() -> list[Path]:
    return sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.py"))


def _cells(text: str) -> tuple[str, list[str]]:
    """(header, cells) of a py:percent chapter; each cell starts with ``# %%``."""
    start = text.index("# %%")
    return text[:start], [c for c in re.split(r"(?m)^(?=# %%)", text[start:]) if c]


def _with_setup(text: str, chapter: Path) -> str:
    """The chapter with its set-up cell (re)generated and placed right after the title cell (the
    first cell, a Markdown cell holding the ``# N. Title`` heading), so the page starts with its title."""
    header, cells = _cells(text)
    cells = [c for c in cells if SETUP_PREFIX not in c and c.strip() != "# %%"]  # (and no empty cells)
    title = next(i for i, c in enumerate(cells) if c.startswith("# %% [markdown]"))
    cells.insert(title + 1, setup_cell(chapter) + "\n")
    cells = [c if c.endswith("\n\n") or i == len(cells) - 1 else c.rstrip("\n") + "\n\n" for i, c in enumerate(cells)]
    return header + "".join(cells)


# ---- the reading line of each chapter's "What this chapter runs" box --------------------------------

# The chapters to read first, by number: the learner's road (the index routes readers by goal).
READ_FIRST = {0: (), 1: (), 2: (), 3: (2,), 4: (2, 3), 5: (1, 4), 6: (5,), 7: (6,), 8: (5, 6), 9: (1, 8),
              10: (5,), 11: (2, 8), 12: (1, 8), 13: (8,), 14: (13,), 15: (8, 13), 16: (8,)}
READING_PREFIX = "# Reading: about "


def reading_line(text: str, chapter: Path) -> str:
    """The box's last line for chapter ``chapter`` whose py:percent source is ``text``: minutes of reading
    (``page.reading_minutes``: its prose, the code it shows and its figures, at ``page.READ_PER_MINUTE``),
    rounded up to 5 (so a small edit rarely changes it; the set-up test says when ``sync`` must rewrite
    it), what that counts, and the chapters to read first."""
    from .page import READ_PER_MINUTE, reading_minutes

    minutes = 5 * math.ceil(reading_minutes(_percent_cells(_without_reading(text))) / 5)
    rate = READ_PER_MINUTE
    stems = {int(p.name[:2]): p.stem for p in chapters()}
    first = [f"{{doc}}`chapter {n} <{stems[n]}>`" for n in READ_FIRST[int(chapter.name[:2])]]
    figures = "one figure" if rate["figures"] == 1 else f"{rate['figures']} figures"
    return (f"{READING_PREFIX}{minutes} minutes at {rate['words']} words, {rate['code lines']} lines of code "
            f"or {figures} a minute, plus running it. "
            f"Read first: {' and '.join(first) if first else 'nothing but PyTorch'}.")


def _cell_metadata(head: str) -> dict:
    """The metadata a py:percent cell's ``# %%`` line carries (``tags=[...] mystnb={...}``: JSON values, read
    one after the other, so an ``=`` inside a value, a caption's, is never taken for a key)."""
    metadata, decoder, key = {}, json.JSONDecoder(), re.compile(r"\s+(\w+)=")
    m = key.search(head)
    while m:
        metadata[m.group(1)], end = decoder.raw_decode(head, m.end())
        m = key.match(head, end)
    return metadata


def _percent_cells(text: str) -> list:
    """A py:percent chapter's cells as (cell_type, source, metadata) objects, read without jupytext (which
    Colab lacks): a Markdown cell's lines lose their ``# ``, a code cell's stay as they are."""
    from types import SimpleNamespace

    out = []
    for cell in _cells(text)[1]:
        head, _, body = cell.partition("\n")
        if "[markdown]" in head:
            body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#")
                              for line in body.rstrip("\n").splitlines())
            out.append(SimpleNamespace(cell_type="markdown", source=body, metadata=_cell_metadata(head)))
        else:
            out.append(SimpleNamespace(cell_type="code", source=body.rstrip("\n"), metadata=_cell_metadata(head)))
    return out


def _without_reading(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(READING_PREFIX))


def _with_reading(text: str, chapter: Path) -> str:
    """The chapter with its box's reading line (re)written, as the box's last line."""
    text = _without_reading(text)
    box = text.index("# ```{admonition} What this chapter runs")
    end = text.index("# ```\n", box + 1)
    return text[:end] + reading_line(text, chapter) + "\n" + text[end:]


def sync(check_only: bool = False) -> list[Path]:
    """Make every chapter's set-up cell the generated one, right after its title, and its box's reading
    line current; re-pair the .ipynb. Returns the files that were (or, with ``check_only``, would be)
    changed."""
    stale = []
    for path in chapters():
        text = path.read_text()
        new = _with_reading(_with_setup(text, path), path)
        if new == text:
            continue
        stale.append(path)
        if not check_only:
            path.write_text(new)
            subprocess.run([sys.executable, "-m", "jupytext", "--sync", "--quiet", str(path)], check=True)
    return stale


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "check"
    if command not in ("sync", "check"):
        sys.exit("usage: python -m muongrid.lab.notebook sync|check")
    changed = sync(check_only=command == "check")
    for p in changed:
        print(f"{'out of date' if command == 'check' else 'updated'}: {p.relative_to(ROOT)}")
    sys.exit(1 if changed and command == "check" else 0)
