"""The package as someone who adopts it meets it: licences, citation, versions, the torch it needs,
and the wheel installed into a fresh environment (torch, numpy, nothing of this repository) running
``python -m muongrid.verify`` there, and importing every module it ships there (the one import rule:
plotly, matplotlib, yaml and the like are imported where used, never at a shipped module's top).

    PYTHONPATH=scripts python -m pytest -q tests/test_package.py

The wheel tests share one build and one virtual environment (``installed``, about 10 s); one 2-rank verify
run and one interpreter importing every shipped module run there; nothing is downloaded (pip runs with
--no-index).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from datetime import date
from importlib import metadata
from pathlib import Path

import pytest
import yaml

import muongrid
from muongrid import requires

ROOT = Path(__file__).resolve().parents[1]


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def repository_url() -> str:
    return yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]


# ---- licences, citation, one version ------------------------------------------------------------

def test_licences_are_in_the_repository_the_metadata_and_the_footer():
    code, text = (ROOT / "LICENSE").read_text(), (ROOT / "LICENSE-TEXT").read_text()
    assert code.startswith("BSD 3-Clause License") and "The Distributed Muon book contributors" in code
    assert "Neither the name of the copyright holder" in code  # clause 3: the BSD-3 text, not BSD-2
    assert "Creative Commons Attribution 4.0 International Public License" in text
    assert all(f"Section {i} --" in text for i in range(1, 9)), "the full CC BY 4.0 legal code has sections 1-8"
    project = pyproject()["project"]
    assert project["license"] == "BSD-3-Clause AND CC-BY-4.0"
    assert project["license-files"] == ["LICENSE", "LICENSE-TEXT"]
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]  # PEP 639: the expression instead
    footer = yaml.safe_load((ROOT / "_config.yml").read_text())["html"]["extra_footer"]
    assert "CC BY 4.0" in footer and "BSD 3-Clause" in footer


CFF_KEYS = {"abstract", "authors", "cff-version", "commit", "contact", "date-released", "doi", "identifiers",
            "keywords", "license", "license-url", "message", "preferred-citation", "references", "repository",
            "repository-artifact", "repository-code", "title", "type", "url", "version"}  # CFF 1.2.0's top level


def test_citation_cff_is_valid_cff_1_2_0_and_matches_the_package():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert set(cff) <= CFF_KEYS, f"keys CFF 1.2.0 does not define: {set(cff) - CFF_KEYS}"
    assert cff["cff-version"] == "1.2.0"
    for key in ("message", "title", "authors"):  # the required ones
        assert cff.get(key), key
    assert isinstance(cff["message"], str) and isinstance(cff["title"], str)
    assert cff.get("type", "software") in ("software", "dataset")
    for person in cff["authors"]:  # a person needs family-names (or a name as an entity)
        assert isinstance(person, dict) and (person.get("family-names") or person.get("name")), person
    assert isinstance(cff["version"], str) and cff["version"] == muongrid.__version__  # quoted: a YAML number is no version
    date.fromisoformat(str(cff["date-released"]))
    assert cff["license"] == pyproject()["project"]["license"].split(" AND ")
    assert cff["repository-code"] == repository_url()
    assert all(isinstance(k, str) for k in cff.get("keywords", []))


def test_the_book_says_how_to_cite_it_with_the_same_version_and_address():
    index = (ROOT / "book" / "index.md").read_text()
    assert "## Cite this book" in index
    bibtex = index.split("```bibtex", 1)[1].split("```", 1)[0]
    assert re.search(r"version\s*=\s*\{(.*?)\}", bibtex).group(1) == muongrid.__version__
    assert re.search(r"url\s*=\s*\{(.*?)\}", bibtex).group(1) == repository_url()


def test_one_version_everywhere():
    project = pyproject()
    assert "version" in project["project"]["dynamic"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "muongrid.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", muongrid.__version__)
    assert f"## {muongrid.__version__} " in (ROOT / "CHANGELOG.md").read_text()
    low = re.fullmatch(r"torch>=(\d+)\.(\d+)", project["project"]["dependencies"][0])
    assert (int(low.group(1)), int(low.group(2))) == requires.MIN_TORCH  # the metadata says what the import checks
    assert any(v.startswith(".".join(map(str, requires.MIN_TORCH)) + ".") for v in requires.TESTED_TORCH)


# ---- the torch it needs --------------------------------------------------------------------------

def test_torch_release_reads_every_kind_of_version_string():
    assert requires.torch_release("2.13.0+cpu") == (2, 13)
    assert requires.torch_release("2.10.0a0+git1234abc") == (2, 10)
    assert requires.torch_release("2.9.0.dev20250801+cu128") == (2, 9)
    assert requires.torch_release("unknown") is None
    assert requires.torch_release("2.10.0") > requires.MIN_TORCH > requires.torch_release("2.4.1")  # not string order


# Each case runs in one child process that imports torch once: it patches torch, forgets muongrid, imports
# it again, then undoes the patch. "as is" is the control: the same code path must then import cleanly.
OLD_TORCH = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed.fsdp, torch.distributed.tensor, torch.optim

    def attempt(patch, undo):
        for name in [m for m in sys.modules if m == "muongrid" or m.startswith("muongrid.")]:
            del sys.modules[name]
        patch()
        try:
            import muongrid
            return None
        except ImportError as e:
            return str(e)
        finally:
            undo()

    real = torch.__version__
    def set_version(v): torch.__version__ = v
    def hide(module, name):
        value = getattr(module, name)
        return (lambda: delattr(module, name)), (lambda: setattr(module, name, value))
    def block(module):
        saved = sys.modules[module]
        return (lambda: sys.modules.__setitem__(module, None)), (lambda: sys.modules.__setitem__(module, saved))

    out = {
        "as is": attempt(lambda: None, lambda: None),
        "2.4.1": attempt(lambda: set_version("2.4.1"), lambda: set_version(real)),
        "2.10.0": attempt(lambda: set_version("2.10.0"), lambda: set_version(real)),
        "no Muon": attempt(*hide(torch.optim, "Muon")),
        "no fully_shard": attempt(*hide(torch.distributed.fsdp, "fully_shard")),
        "no DTensor module": attempt(*block("torch.distributed.tensor")),
    }
    print(json.dumps(out))
""")


def test_import_on_too_old_a_torch_fails_at_once_naming_the_version_and_the_missing_api():
    proc = subprocess.run([sys.executable, "-c", OLD_TORCH], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    need = "torch >= " + ".".join(map(str, requires.MIN_TORCH))
    assert errors["as is"] is None and errors["2.10.0"] is None  # 2.10 is newer than 2.9, though "2.10" < "2.9"
    assert need in errors["2.4.1"] and "this is torch 2.4.1" in errors["2.4.1"] and "pip install" in errors["2.4.1"]
    assert need in errors["no Muon"] and "torch.optim.Muon (torch 2.9)" in errors["no Muon"]
    assert "torch.distributed.fsdp.fully_shard (torch 2.6)" in errors["no fully_shard"]
    assert "torch.distributed.tensor.DTensor (torch 2.5)" in errors["no DTensor module"]
    assert "fully_shard" not in errors["no Muon"]  # names what is missing, not every API it checks


# ---- the wheel in a fresh environment ------------------------------------------------------------

def requirements_folder(dest: Path, names: list[str]) -> Path:
    """A folder holding links to the installed packages ``names`` and what they require (transitively) and
    nothing else, so a virtual environment can see this machine's torch without seeing muongrid or anything
    else installed here."""
    from packaging.requirements import Requirement

    dest.mkdir()
    todo, seen = list(names), set()
    while todo:
        name = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional requirement this machine does not have
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
        site = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")} - {"__pycache__"}:
            if (site / top).exists() and not (dest / top).exists():
                (dest / top).symlink_to(site / top)
    assert "torch" in seen and not (dest / "muongrid").exists()
    return dest


class Installed:
    """The wheel built from this checkout, installed with ``--no-deps`` into a fresh virtual environment that sees
    torch and numpy (and what they require) from this machine and nothing else: no muongrid, no plotly."""

    def __init__(self, tmp_path: Path):
        import shutil
        import zipfile

        self.tmp_path = tmp_path
        # Build from a copy of what the wheel is made of, so nothing (build/, egg-info) is written into the checkout.
        src = tmp_path / "src"
        # All of scripts/: the entry points and the book's tooling (booktools) lie beside the package, as in a checkout.
        shutil.copytree(ROOT / "scripts", src / "scripts", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        for name in ("pyproject.toml", "README.md", "LICENSE", "LICENSE-TEXT"):
            shutil.copy(ROOT / name, src / name)
        self.clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
        self.check([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", str(src), "-w",
                    str(tmp_path / "dist")])
        self.wheel = tmp_path / "dist" / f"muongrid-{muongrid.__version__}-py3-none-any.whl"
        assert self.wheel.exists(), list((tmp_path / "dist").iterdir())
        self.names = zipfile.ZipFile(self.wheel).namelist()
        self.info = f"muongrid-{muongrid.__version__}.dist-info"
        self.meta = zipfile.ZipFile(self.wheel).read(f"{self.info}/METADATA").decode()
        self.declared = re.findall(r"^Requires-Dist: (.+)$", self.meta, flags=re.M)

        # A fresh environment from the interpreter this one was made from: no pip, no site-packages of ours.
        self.env_dir = tmp_path / "venv"
        self.check([sys._base_executable, "-m", "venv", "--without-pip", str(self.env_dir)])
        self.python = self.env_dir / "bin" / "python"
        self.site = Path(self.check([str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
                                    ).stdout.strip())
        # What pip would bring for the wheel: torch and numpy, with their requirements (from this machine, offline).
        visible = requirements_folder(tmp_path / "requirements",
                                      [re.match(r"[\w.-]+", r).group() for r in self.declared])
        (self.site / "requirements.pth").write_text(f"{visible}\n")
        self.work = tmp_path / "elsewhere"  # outside the repository: nothing there to import from
        self.work.mkdir()
        probe = subprocess.run([str(self.python), "-c", "import muongrid"], capture_output=True, text=True,
                               cwd=self.work, env=self.clean)
        assert probe.returncode != 0 and "No module named 'muongrid'" in probe.stderr  # nothing leaks in before
        self.check([*pip, "--python", str(self.python), "install", "--no-index", "--no-deps", "--no-cache-dir",
                    str(self.wheel)])
        assert (self.site / "muongrid" / "verify.py").exists()  # the imports can only find this copy (the probe)

    def check(self, cmd, **kw) -> subprocess.CompletedProcess:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=self.clean, **kw)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    """One wheel and one fresh environment for the tests of this file (a build and a venv: seconds each)."""
    return Installed(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_holds_the_package_alone_and_declares_torch_and_numpy(installed):
    names, info = installed.names, installed.info
    for must in ("muongrid/verify.py", "muongrid/bench.py", "muongrid/requires.py", "muongrid/lab/synthetic.py",
                 f"{info}/licenses/LICENSE", f"{info}/licenses/LICENSE-TEXT", f"{info}/entry_points.txt"):
        assert must in names, must
    # The package alone: none of the book's tooling (the notebook executor, the build, the warm-start server, the
    # page checker), no entry point of scripts/.
    tooling = {p.stem for p in (ROOT / "scripts" / "booktools").glob("*.py")} - {"__init__"}
    assert len(tooling) >= 4 and not [n for n in names if Path(n).stem in tooling or n.startswith("booktools/")]
    assert [n for n in names if not n.startswith(("muongrid/", f"{info}/"))] == []
    assert "License-Expression: BSD-3-Clause AND CC-BY-4.0" in installed.meta
    # numpy: torch's all_gather_object needs it, undeclared
    assert installed.declared == ["torch>=2.9", "numpy"], installed.declared


def test_the_wheel_installs_into_a_fresh_environment_and_verifies_a_grid_there(installed):
    run = installed.check([str(installed.python), "-m", "muongrid.verify", "--dp", "2", "--tp", "1"],
                          cwd=installed.work)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["max_abs_diff"] == 0.0 and (result["dp"], result["tp"]) == (2, 1), result
    assert "OK: largest difference" in run.stdout  # the same output as scripts/verify.py
    for script, module in (("muongrid-verify", "muongrid.verify"), ("muongrid-bench", "muongrid.bench")):
        assert f"from {module} import main" in (installed.env_dir / "bin" / script).read_text()
    usage = installed.check([str(installed.env_dir / "bin" / "muongrid-bench"), "--help"], cwd=installed.work).stdout
    assert "--sweep" in usage and "--layout" in usage  # bench imports there too


# Imports every module it is given, in one interpreter, and prints {module: the error} for those that fail.
IMPORT_EACH = textwrap.dedent("""
    import importlib, json, sys
    failed = {}
    for name in sys.argv[1:]:
        try:
            importlib.import_module(name)
        except BaseException as e:  # SystemExit too: a module must not exit when imported
            failed[name] = f"{type(e).__name__}: {e}"
    print(json.dumps(failed))
""")


def test_every_module_the_wheel_ships_imports_with_torch_and_numpy_alone(installed):
    """The one import rule (CONTRIBUTING.md): what the package declares is all a shipped module may import at its
    top; plotly, matplotlib, yaml, IPython, transformers and the like are imported inside the functions that use
    them. The modules are read from the wheel itself, so a new one is held to the rule the day it ships."""
    modules = sorted(n.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                     for n in installed.names if n.endswith(".py"))
    assert {"muongrid", "muongrid.lab", "muongrid.verify", "muongrid.lab.explorers", "muongrid.lab.diagrams",
            "muongrid.lab.roadmap"} <= set(modules) and len(modules) > 60, modules
    # The environment has none of the book's other packages: the rule is tested, not assumed.
    absent = installed.check([str(installed.python), "-c", IMPORT_EACH, "plotly", "matplotlib", "yaml", "IPython"],
                             cwd=installed.work)
    assert sorted(json.loads(absent.stdout.strip().splitlines()[-1])) == ["IPython", "matplotlib", "plotly", "yaml"]
    proc = installed.check([str(installed.python), "-c", IMPORT_EACH, *modules], cwd=installed.work)
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert failed == {}, "shipped modules that need more than torch and numpy to import (import those where used):\n" \
        + "\n".join(f"  {m}: {e}" for m, e in failed.items())
