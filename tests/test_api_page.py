"""book/api.md, the API reference, says what the code accepts: each table lists exactly the keywords the
callable takes, with the defaults it has (a second of CPU, nothing launched).

A keyword list is read from ``inspect.signature``: for a class, of its ``__init__`` and of the ``__init__``
its ``**kwargs`` reach (``DistributedMuon`` hands them to ``ZeroOneOptimizer``); a ``**hyper`` that ends
the chain stands for the hyperparameters, ``muongrid.optim.DEFAULTS`` (and ``adjust_lr_fn``, torch's name
for ``adjust_lr``), which the page lists once, in its own table. Someone who adds, removes or changes the
default of a keyword gets a failure here naming it and the page's section.

    PYTHONPATH=scripts python -m pytest -q tests/test_api_page.py
"""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from conftest import ROOT

PAGE = ROOT / "book" / "api.md"
HYPER = "Hyperparameters (every optimizer, per parameter group)"


def sections() -> dict[str, dict[str, str]]:
    """Each ``## `name``` (or ``## title``) section's table: keyword -> its default cell."""
    out, name = {}, None
    for line in PAGE.read_text().splitlines():
        if line.startswith("## "):
            name = line[3:].strip().strip("`")
            continue
        m = re.match(r"^\| `(\w+)` \|[^|]*\| ([^|]*) \|", line)
        if m and name is not None:
            out.setdefault(name, {})[m.group(1)] = m.group(2).strip()
    return out


def chain(name: str) -> list:
    """The functions whose parameters ``name`` accepts, in the order keywords travel."""
    import muongrid
    from muongrid import accelerate, checkpoint, data, hf, resume, shard_files, tp_plans
    from muongrid.distributed import ZeroOneOptimizer

    return {"DistributedMuon": [muongrid.DistributedMuon.__init__, ZeroOneOptimizer.__init__],
            "FSDPMuon": [muongrid.FSDPMuon.__init__],
            "Muon": [muongrid.Muon.__init__],
            "Grid.build": [muongrid.Grid.build], "Grid.single": [muongrid.Grid.single],
            "Grid.from_mesh": [muongrid.Grid.from_mesh],
            "Grid.expert": [muongrid.Grid.expert],
            "hybrid_param_groups": [muongrid.hybrid_param_groups],
            "checkpoint.save": [checkpoint.save], "checkpoint.load": [checkpoint.load],
            "checkpoint.export": [checkpoint.export],
            "resume.save_run": [resume.save_run],
            "ShardedCheckpoint": [hf._Sharded.__init__], "shard_files.save": [shard_files.save],
            "ShardedState": [accelerate.ShardedState.__init__],
            "ResumableLoader": [data.ResumableLoader.__init__],
            "parallelize_llama": [tp_plans.parallelize_llama]}[name]


def accepted(functions) -> tuple[dict, bool]:
    """(keyword -> default or inspect.Parameter.empty, whether a ``**hyper`` ends the chain)."""
    out, hyper = {}, False
    for i, f in enumerate(functions):
        params = list(inspect.signature(f).parameters.values())
        for p in params:
            if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            out.setdefault(p.name, p.default)
        var = [p for p in params if p.kind == p.VAR_KEYWORD]
        if not var:
            return out, False
        hyper = i == len(functions) - 1 and var[0].name == "hyper"
    return out, hyper


def same_default(cell: str, default) -> bool:
    if default is inspect.Parameter.empty:
        return cell == "required"
    m = re.fullmatch(r"`([^`]*)`", cell)
    if not m:
        return False
    try:
        return ast.literal_eval(m.group(1)) == default
    except ValueError:
        return False


def test_the_hyperparameter_table_is_the_optimizers_defaults():
    from muongrid.optim import DEFAULTS

    table = sections()[HYPER]
    assert set(table) == set(DEFAULTS) | {"adjust_lr_fn"}, sorted(set(table) ^ (set(DEFAULTS) | {"adjust_lr_fn"}))
    wrong = [k for k in DEFAULTS if not same_default(table[k], DEFAULTS[k])]
    assert not wrong, {k: (table[k], DEFAULTS[k]) for k in wrong}
    assert same_default(table["adjust_lr_fn"], DEFAULTS["adjust_lr"])


@pytest.mark.parametrize("name", ["DistributedMuon", "FSDPMuon", "Muon", "Grid.build", "Grid.single", "Grid.expert",
                                  "Grid.from_mesh",
                                  "hybrid_param_groups", "checkpoint.save", "checkpoint.load", "checkpoint.export",
                                  "resume.save_run", "ShardedCheckpoint", "shard_files.save", "ShardedState",
                                  "ResumableLoader",
                                  "parallelize_llama"])
def test_each_table_lists_every_keyword_with_its_default(name):
    from muongrid.optim import DEFAULTS

    page = sections()
    assert name in page, f"book/api.md has no section '## `{name}`'"
    keywords, hyper = accepted(chain(name))
    table = page[name]
    if hyper:   # the hyperparameters are in their own table; a section may not list them again
        assert not set(table) & set(DEFAULTS), f"{name}: {sorted(set(table) & set(DEFAULTS))} belong to '{HYPER}'"
    assert set(table) == set(keywords), (f"book/api.md, {name}: missing {sorted(set(keywords) - set(table))}, "
                                         f"not in the code {sorted(set(table) - set(keywords))}")
    wrong = {k: (table[k], keywords[k]) for k in keywords if not same_default(table[k], keywords[k])}
    assert not wrong, f"book/api.md, {name}: the page's default against the code's: {wrong}"


def test_the_lightning_strategies_add_no_keyword_to_lightnings_and_have_their_section():
    """``muongrid.lightning``'s two strategies take Lightning's ``DDPStrategy`` keywords unchanged (no ``__init__``
    of their own; read from the source, since importing Lightning takes seconds), and the page names both."""
    from muongrid import lightning
    tree = ast.parse(Path(lightning.__file__).read_text())
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    assert set(classes) == set(lightning._MADE)
    assert not [c for c, node in classes.items() for f in node.body if getattr(f, "name", "") == "__init__"]
    page = PAGE.read_text()
    assert "## `ShardedDDPStrategy`" in page and "`FabricShardedDDPStrategy(**keywords)`" in page


def test_the_check_sees_a_missing_keyword_and_a_stale_default():
    def f(a, b: int = 3, *, c="x", **hyper):
        pass

    keywords, hyper = accepted([f])
    assert keywords == {"a": inspect.Parameter.empty, "b": 3, "c": "x"} and hyper
    assert same_default("required", keywords["a"]) and same_default("`3`", 3) and same_default('`"x"`', "x")
    assert not same_default("`4`", 3) and not same_default("3", 3) and not same_default("`x`", "x")


def test_the_page_is_in_the_table_of_contents_under_reference():
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    reference = next(p for p in toc["parts"] if p["caption"] == "Reference")
    assert "book/api" in [c["file"] for c in reference["chapters"]]


def test_the_readme_is_short_keeps_the_two_commands_and_links_the_reference():
    """The README is the front door (issue 43): under 200 lines, the two commands as they have always read,
    what has run where, the link to this page, and a tensor-parallel grid only on a model made tensor-parallel
    (a ``Grid.build(..., tp=N)`` with N > 1 in a block that never calls a TP plan would repeat the work N times)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    assert "make book   # sets up .venv, executes every chapter and builds the book into _build/html" in readme
    assert "make test   # sets up .venv and runs the whole test suite" in readme
    assert "**What has run where**" in readme and "pipeline parallelism | not supported" in readme
    assert "](book/api.md)" in readme and "](CONTRIBUTING.md)" in readme
    for block in re.findall(r"```python\n(.*?)```", readme, re.S):
        tp = re.search(r"Grid\.build\([^)]*tp=(\d+)", block)
        if tp and int(tp.group(1)) > 1:
            assert re.search(r"parallelize_(module|llama)\(", block), block[:300]
