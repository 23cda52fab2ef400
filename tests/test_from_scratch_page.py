"""Chapter 5's from-scratch listing runs as the built page shows it, and equals the engine bit for bit.

The code is read from the built page (``built_book``: the HTML a reader sees, Pygments' spans and
entities undone), not from ``scripts/from_scratch.py``: what a reader copies is what runs. It must be a
program's whole parts (its imports, the groups, the class, the launch: ``mp.start_processes`` with
``init_process_group``), use no name that it neither defines nor imports (no alias kept outside the
lines shown), and fit 88 columns. Then ``from_scratch.py --code <the page's code> --launch listing``
starts 2 x 2 ranks with the page's own ``launch`` and steps the page's ``FromScratchMuon`` beside
muongrid's ``DistributedMuon`` on the same gradients, comparing every parameter's bits after each step.

    PYTHONPATH=scripts python -m pytest -q tests/test_from_scratch_page.py
"""
from __future__ import annotations

import ast
import builtins
from html.parser import HTMLParser

from conftest import last_json, script

PAGE = "notebooks/05_distributed_step.html"
CAPTION = "scripts/from_scratch.py"


class Listings(HTMLParser):
    """The text of every ``<pre>`` that follows a ``<strong>`` reading ``caption`` (``page.listing``'s title)."""

    def __init__(self, caption: str):
        super().__init__(convert_charrefs=True)
        self.caption, self.found = caption, []
        self._strong: list[str] | None = None
        self._armed = False
        self._pre: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "strong":
            self._strong = []
        elif tag == "pre" and self._armed:
            self._pre, self._armed = [], False

    def handle_endtag(self, tag):
        if tag == "strong" and self._strong is not None:
            self._armed = "".join(self._strong).strip() == self.caption
            self._strong = None
        elif tag == "pre" and self._pre is not None:
            self.found.append("".join(self._pre))
            self._pre = None

    def handle_data(self, data):
        if self._strong is not None:
            self._strong.append(data)
        elif self._pre is not None:
            self._pre.append(data)


def shown_code(html: str, caption: str = CAPTION) -> list[str]:
    parser = Listings(caption)
    parser.feed(html)
    return parser.found


def free_names(code: str) -> set[str]:
    """Names the code reads that nothing in it binds (assignment, argument, import, def, loop or comprehension
    target) and that are not builtins: what it would need from outside the lines shown."""
    tree = ast.parse(code)
    read, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return read - bound - set(dir(builtins))


def test_the_listing_parser_reads_what_a_page_shows():
    html = ('<p><strong>scripts/from_scratch.py</strong></p><div class="highlight"><pre><span></span>'
            '<span class="k">if</span> <span class="n">a</span> <span class="o">&lt;</span> b:\n'
            '    <span class="k">yield</span> i\n</pre></div><p><strong>other.py</strong></p><pre>x = 1</pre>')
    assert shown_code(html) == ["if a < b:\n    yield i\n"]
    assert free_names("import math\ndef f(x):\n    return math.sqrt(x) + g(x)") == {"g"}


def test_the_page_code_runs_as_shown_on_2x2_and_equals_the_engine(built_book, tmp_path):
    listings = shown_code((built_book / PAGE).read_text())
    assert len(listings) == 1, f"{len(listings)} listings titled {CAPTION} on the page"
    code = listings[0]
    for part in ("import torch.distributed as dist", "def make_groups(", "class FromScratchMuon",
                 "def orthogonalise(", "def launch(", "dist.init_process_group(", "mp.start_processes("):
        assert part in code, part
    assert max(map(len, code.splitlines())) <= 88
    assert free_names(code) == set()   # torch.distributed's own names, nothing defined off the page
    path = tmp_path / "shown.py"
    path.write_text(code)
    proc = script("from_scratch.py", "--dp", "2", "--tp", "2", "--steps", "2", "--code", str(path),
                  "--launch", "listing")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert (result["dp"], result["tp"], result["launch"], result["layout"]) == (2, 2, "listing", "bucket")
    # the page's names ran, not the script's own: the class, the groups and the launch that started the ranks
    assert {"make_groups", "FromScratchMuon", "launch", "run_rank"} <= set(result["defined"])
    assert result["equal"] is True and result["per_step_max_abs_diff"] == [0.0, 0.0]
    assert "FutureWarning" not in proc.stderr   # no renamed collective (torch 2.13) on the page
