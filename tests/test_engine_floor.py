"""The engine stays a clean floor: it does not lean on the lab, its modules form no import cycle (deferred imports
included), and no file
reaches for ``sys.path`` (the package is installed, ``python scripts/x.py`` has ``scripts/`` on its path, and
pytest is given ``scripts/`` and ``tests/`` in ``pyproject.toml``).

``muongrid.lab`` holds what the book, benchmarks and tests use beside the engine; the engine must never need
it, so ``import muongrid`` loads none of it. The two checks the README advertises as ``python -m
muongrid.verify`` / ``muongrid.bench`` live in the package (an install must be able to run them) and use the
lab's synthetic problems and cost model: they are entry points, not engine, and are named here as such.

    python -m pytest -q tests/test_engine_floor.py
"""
from __future__ import annotations

import ast
import subprocess
import sys

from conftest import ROOT

PACKAGE = ROOT / "scripts" / "muongrid"
ENTRY_POINTS = {"verify", "bench"}   # muongrid.verify / muongrid.bench: the README's checks, runnable from an install


def module_name(path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path, top_level_only: bool) -> set[str]:
    """The muongrid modules ``path`` imports (relative imports resolved), at module level or anywhere."""
    tree = ast.parse(path.read_text())
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("muongrid"):
                out.add(target)
                out.update(f"{target}.{a.name}" for a in node.names)   # "from . import x" names a module
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("muongrid"))
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {m for m in out if m in modules}


def test_the_engine_imports_nothing_from_the_lab():
    offenders = []
    for path in sorted(PACKAGE.glob("*.py")):
        name = module_name(path)
        if name.split(".")[-1] in ENTRY_POINTS:
            continue
        lab = sorted(m for m in imports(path, top_level_only=False) if m.startswith("muongrid.lab"))
        if lab:
            offenders.append(f"{path.name}: {lab}")
    assert not offenders, offenders


def test_importing_muongrid_loads_no_lab_module():
    code = "import sys, muongrid; print(sorted(m for m in sys.modules if m.startswith('muongrid.lab')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def lab_modules_loaded_by(module: str) -> list[str]:
    """The lab modules that importing ``module`` loads: its module-level imports of the package, followed."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = PACKAGE.parent.joinpath(*name.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        todo += imports(path, top_level_only=True)
    return sorted(m.removeprefix("muongrid.lab.") for m in seen if m.startswith("muongrid.lab."))


def test_the_lab_map_says_what_the_package_checks_import_from_the_lab():
    import re

    import muongrid.lab

    said = dict(re.findall(r"^    muongrid\.(\w+) imports: (.+)$", muongrid.lab.__doc__, flags=re.M))
    assert sorted(said) == sorted(ENTRY_POINTS)
    for entry, names in said.items():
        assert names.split(", ") == lab_modules_loaded_by(f"muongrid.{entry}"), entry


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles in ``graph`` (module -> modules it imports), each as the modules around it."""
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if nxt == node or nxt.startswith(node + "."):
                continue   # a package importing its own submodules (muongrid/__init__.py)
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_no_import_cycles_at_module_level():
    graph = {module_name(p): imports(p, top_level_only=True) for p in PACKAGE.rglob("*.py")}
    assert find_cycles(graph) == []


def test_no_import_cycles_deferred_imports_included():
    """An import inside a function is a cycle waiting for the first call that makes it (checkpoint and fsdp
    imported each other so until issue 42): every import of the package counts, wherever it is written."""
    graph = {module_name(p): imports(p, top_level_only=False) for p in PACKAGE.rglob("*.py")}
    assert find_cycles(graph) == []


def test_the_cycle_check_sees_a_cycle():
    """The checker itself, on the pair the package had before (flows imported group_flow at its end)."""
    graph = {"muongrid.flows": {"muongrid.group_flow"}, "muongrid.group_flow": {"muongrid.flows"}}
    assert find_cycles(graph) == [["muongrid.flows", "muongrid.group_flow", "muongrid.flows"]]
    assert find_cycles({"muongrid": {"muongrid.flows"}, "muongrid.flows": {"muongrid.plan"}}) == []


def test_no_file_edits_sys_path():
    needles = ("sys.path.insert(", "sys.path.append(", "sys.path[:0]", "sys.path = ")
    offenders = []
    for folder in ("scripts", "tests", "notebooks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "test_engine_floor.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if any(needle in code for needle in needles):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, offenders
