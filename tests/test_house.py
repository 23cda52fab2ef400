"""The house a newcomer walks (issue 42): the module maps name the modules that exist, and the test suite is
split by what each test needs.

* ``scripts/muongrid/__init__.py``'s map names every module of the engine, and only those, and so do the maps of
  ``muongrid/lab/__init__.py`` and ``booktools/__init__.py``; the layout block
  of ``CONTRIBUTING.md`` (the README's map until issue 43) names only files that exist (a selection, but every
  engine module).
* No module of the package executes a file by path (``spec_from_file_location``, ``runpy.run_path``): the
  library parts of the entry points live in the package (``lab/scale.py``, ``lab/model_shapes.py``), and the
  scripts are thin over them; chapters *launch* scripts as processes (``lab/notebook.run``), which is not loading.
* The step path a newcomer reads to follow one ``step()`` (``STEP_PATH``) is what a step runs, measured by a line
  tracer (``lab/steppath.py``), and the distinct lines a steady-state step executes fit their budget; a step runs
  no other module of the package but the shared math and plan (``STEP_ALSO_RUNS``), so code cannot leave the
  step path by moving into a new module.
* Every test carries exactly one suite mark (``unit``, ``distributed``, ``book``, ``browser``; registered in
  ``pyproject.toml``, given by file in ``conftest.SUITE_OF``): ``python -m pytest -m unit`` runs the
  one-process tests in a few minutes, ``make test`` all of them.

    PYTHONPATH=scripts python -m pytest -q tests/test_house.py
"""
from __future__ import annotations

import re
import tomllib

import muongrid
from conftest import ROOT, SUITE_OF, SUITES

PACKAGE = ROOT / "scripts" / "muongrid"


def init_map() -> list[str]:
    """The module names at the start of the map's lines in the package docstring (``verify, bench`` is two)."""
    doc = muongrid.__doc__
    block = doc[doc.index("The engine, in the order"):doc.index("``muongrid.lab``")]
    names = []
    for line in block.splitlines()[1:]:
        m = re.match(r"^    ([a-z_0-9]+(?:, [a-z_0-9]+)*)\s{2,}", line)
        if m:
            names += m.group(1).split(", ")
    return names


def test_the_package_map_names_every_engine_module_and_only_those():
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    names = init_map()
    assert len(names) == len(set(names)), "a module is named twice"
    assert sorted(names) == modules


def docstring_map(doc: str) -> list[str]:
    """The module names at the start of a package docstring's map lines (four spaces, a name, two spaces)."""
    return [m.group(1) for m in re.finditer(r"^    ([a-z_0-9]+)\s{2,}\S", doc, flags=re.M)]


def test_the_lab_and_booktools_maps_name_every_module_and_only_those():
    import booktools
    import muongrid.lab

    for package, folder in ((muongrid.lab, PACKAGE / "lab"), (booktools, ROOT / "scripts" / "booktools")):
        names = docstring_map(package.__doc__)
        assert len(names) == len(set(names)), f"{folder.name}: a module is named twice"
        assert sorted(names) == sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__"), folder.name


def test_the_layout_map_names_only_files_that_exist():
    text = (ROOT / "CONTRIBUTING.md").read_text()   # the README's map moved there (issue 43)
    block = text[text.index("## Layout"):]
    block = block[block.index("```") + 3:]
    block = block[:block.index("```")]
    folder, missing, seen, engine = None, [], 0, set()
    for line in block.splitlines():
        if not line.startswith(" "):
            head = line.split()[0] if line else ""
            folder = {"scripts/muongrid/": PACKAGE, "scripts/muongrid/lab/": PACKAGE / "lab",
                      "scripts/booktools/": ROOT / "scripts" / "booktools"}.get(head)
        if folder is not None and line.startswith("  "):
            for name in re.findall(r"\b([a-z_0-9]+)\.py\b", line):
                seen += 1
                engine |= {name} if folder == PACKAGE else set()
                if not (folder / f"{name}.py").exists():
                    missing.append(f"{folder.name}/{name}.py")
    entries = block[block.index("scripts/*.py"):block.index("notebooks/")]
    scripts = re.findall(r"\b([a-z_0-9]+)(?=,|\n)", entries.split(":", 1)[1])
    missing += [f"scripts/{n}.py" for n in scripts if not (ROOT / "scripts" / f"{n}.py").exists()]
    assert seen > 20 and len(scripts) > 5, "the layout block was not found where it was"
    assert missing == []
    # the engine's part is whole (issue 53: it had left out 8 of 40 modules, fsdp.py among them)
    assert sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__" and p.stem not in engine) == []


def test_the_suite_marks_are_registered():
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert sorted(m.split(":")[0] for m in ini["markers"]) == sorted(SUITES)


def test_every_test_file_is_in_one_suite():
    files = sorted(p.stem for p in (ROOT / "tests").glob("test_*.py"))
    assert sorted(SUITE_OF) == files
    assert set(SUITE_OF.values()) <= set(SUITES)


def test_every_collected_test_has_exactly_one_suite_mark(request):
    items = request.session.items
    assert request.node in items
    wrong = [(i.nodeid, [m for m in SUITES if i.get_closest_marker(m)]) for i in items
             if sum(1 for m in SUITES if i.get_closest_marker(m)) != 1]
    assert wrong == []


def test_no_package_module_executes_a_file_by_path():
    needles = ("spec_from_file_location", "run_path(", "SourceFileLoader", "exec(open(")
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        code = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())
        if any(n in code for n in needles):
            found.add(path.relative_to(PACKAGE).as_posix())
    assert found == set(), found


# The files a newcomer reads to follow one step. Issue 42 held them to 2,525 lines; issue 53 budgets what a step
# runs instead: the distinct lines a steady-state step executes (``lab/steppath.py``: every layout, capturable or
# not, the DDP mode; 1x1, 2x1, 2x2), so a method moved into another file counts as much as before. Measured at
# f5d494a (issue 53's base): 851. Lower the budget as the path shrinks; a new feature raises it in the commit that
# adds it, saying so, never silently. 856 (issue 54): grad_reduce="backward" asks of a "step" step whether a
# reducer is there (before the ballot, at the end) and the reduce-scatter is Comm's started form, waited at once.
# 849 (issue 53): the step a typed value (step.py), counted in one object; one class, no mixins. 850: chapter 5
# quotes Store.reduce_scatter, whose reduce-scatter call now wraps at 88 columns (test_readability). 853:
# finite.max_abs, the NaN/Inf check's max-abs norms by aminmax on the CPU (torch's inf-norm was 6x slower there).
# 854 (issue 54): Comm's reduce-scatter asks whether it runs on gloo, where it is an all-to-all and a local sum.
STEP_PATH = ("distributed.py", "step.py", "flows.py", "owner_flow.py", "group_flow.py", "store.py", "comm.py",
             "updates.py", "sharding.py", "finite.py", "contract.py", "capture.py")
STEP_LINES_BUDGET = 854
# What else a step runs: the math (Newton-Schulz, alone or shared by a group), the plan it follows, and the
# checks of the optimizer contract it shares with the one-process optimizers.
STEP_ALSO_RUNS = {"newton_schulz.py", "ns_variants.py", "ns_group.py", "ns_gram_group.py", "plan.py", "layouts.py",
                  "placements.py", "optim.py"}


def test_the_step_path_is_what_a_step_runs_and_fits_its_budget():
    from muongrid.lab import steppath

    lines = steppath.step_lines()
    ran = {module for module, _ in lines}
    assert set(STEP_PATH) <= ran, sorted(set(STEP_PATH) - ran)
    assert ran - set(STEP_PATH) <= STEP_ALSO_RUNS, sorted(ran - set(STEP_PATH) - STEP_ALSO_RUNS)
    assert len(lines) <= STEP_LINES_BUDGET, steppath.report(lines)


# ---- issue 53: the step's data is typed, and a step-path module keeps to its own and torch's -------------------

STEP_DICT_NAMES = {"step", "prepared", "_prepared", "_step"}   # what a step's state was called while it was a dict
TORCH_PRIVATE = {"_local_tensor", "_spec", "_cdata"}   # DTensor's local shard and spec, a storage's id: torch's types
OUTSIDE = {"torch", "os"}   # private functions of torch (``torch._foreach_*``) and the standard library's


def step_path_trees():
    import ast

    for name in sorted(set(STEP_PATH) | STEP_ALSO_RUNS):
        yield name, ast.parse((PACKAGE / name).read_text())


def test_no_step_path_module_indexes_a_step_dict_by_string():
    """The step is a ``step.Step`` with named fields: ``step["grads"]`` or ``opt._prepared["keep"]`` anywhere on the
    step path fails here."""
    import ast

    found = []
    for name, tree in step_path_trees():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                    and isinstance(node.slice.value, str)):
                continue
            value = node.value
            named = value.id if isinstance(value, ast.Name) else value.attr if isinstance(value, ast.Attribute) else ""
            if named in STEP_DICT_NAMES:
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_no_step_path_module_reads_another_objects_private_attribute():
    """``x._name`` on the step path only for ``self`` (or an object of the class whose body it is in, which
    defines ``_name``), torch's own private names (``TORCH_PRIVATE``, ``torch._foreach_*``) and the standard
    library's; ``getattr(x, "_name")`` likewise. So the flows never reach into the optimizer, nor the lab's
    fixtures into the plan."""
    import ast

    def own_names(cls: ast.ClassDef) -> set:
        names = {f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
        return names

    def private(attr: str) -> bool:
        return attr.startswith("_") and not attr.startswith("__")

    def root(node) -> str:
        while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
            node = node.func if isinstance(node, ast.Call) else node.value
        return node.id if isinstance(node, ast.Name) else ""

    found = []
    for name, tree in step_path_trees():
        allowed_at: dict[int, set] = {}
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            own = own_names(cls)
            for node in ast.walk(cls):
                allowed_at[id(node)] = own
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                obj, attr = node.value, node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                  and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                obj, attr = node.args[0], node.args[1].value
            else:
                continue
            if not private(attr) or attr in TORCH_PRIVATE or root(obj) in OUTSIDE:
                continue
            if isinstance(obj, ast.Name) and obj.id in ("self", "cls"):
                continue
            if attr in allowed_at.get(id(node), set()):
                continue
            found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert found == []
