"""A chapter of the notebook edition runs as Colab runs it: a bare runtime, the set-up cell fetching
the commit that made the edition's outputs and installing what the chapter needs.

The pages' Colab buttons open the notebook edition (``booktools.edition``, written by ``make book``
from the executed chapters), so that is what runs here. Colab opens it in a runtime that has torch,
numpy, matplotlib, plotly, ipywidgets, scikit-learn, pandas and ipykernel, imports ``google.colab`` at
start, and has neither MyST-NB nor the book's package. The chapter's set-up cell must fetch the
repository at the commit that made its outputs, install what the chapter needs beyond that image
(never torch) and go on. Here that runtime is a virtual environment whose site-packages hold only
those distributions and what they require (links into this checkout's .venv, so nothing is
downloaded but what the set-up cell itself installs), with a ``google.colab`` module imported at
start-up. The set-up cell runs as written, except that it fetches from this checkout instead of the
public URL, into a folder the test picks instead of ``/content``.

Chapter 1 runs in every ``make test``; others on request: ``make colab CHAPTERS=04_zero1_buffer,05_distributed_step``
(or ``MUONGRID_COLAB_CHAPTERS=...``).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from packaging.requirements import Requirement

from booktools.edition import EDITION_MARKER
from muongrid.lab.notebook import repository_url
from conftest import ROOT

COLAB_IMAGE = ["torch", "numpy", "matplotlib", "plotly", "ipywidgets", "scikit-learn", "pandas", "ipykernel",
               "pip"]
NOT_IN_COLAB = ["myst_nb", "jupyter_book", "sphinx", "jupytext", "muongrid"]


def closure(names: list[str]) -> list[metadata.Distribution]:
    """The installed distributions ``names`` and everything they require (extras left out)."""
    seen, todo = {}, list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # (pandas is in Colab's image but not in the book's requirements: nothing to link)
        seen[key] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def colab_runtime(where: Path) -> Path:
    """A Python that sees only Colab's packages (linked from this environment) and imports google.colab
    at start; returns its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where / "venv")], check=True)
    python = where / "venv" / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    image = where / "image"
    image.mkdir()
    for dist in closure(COLAB_IMAGE):
        base = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if not (image / top).exists() and (base / top).exists() and top != "__pycache__":
                (image / top).symlink_to(base / top)
    fake = where / "google-colab" / "google" / "colab"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('"""Stands in for Colab\'s module: its presence is how a chapter knows."""\n')
    (site / "colab_image.pth").write_text(f"{image}\n{where / 'google-colab'}\nimport google.colab\n")
    return python


# Chapter 1 in every run; others on request (e.g. MUONGRID_COLAB_CHAPTERS=00_start_here,04_zero1_buffer).
CHAPTERS = os.environ.get("MUONGRID_COLAB_CHAPTERS", "01_muon").split(",")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_chapter_runs_as_in_colab(tmp_path, monkeypatch, chapter, book_edition):
    python = colab_runtime(tmp_path)
    probe = subprocess.run([str(python), "-c", "import importlib.util, json, sys; print(json.dumps("
                            "{m: importlib.util.find_spec(m) is not None for m in sys.argv[1:]}))",
                            "torch", "plotly", "google.colab", *NOT_IN_COLAB],
                           capture_output=True, text=True, check=True)
    found = json.loads(probe.stdout)
    assert found["torch"] and found["plotly"] and found["google.colab"], found
    assert not any(found[m] for m in NOT_IN_COLAB), f"the runtime is not bare: {found}"

    kernels = tmp_path / "jupyter" / "kernels" / "colab"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab-like", "language": "python"}))

    nb = nbformat.read(book_edition / "notebooks" / f"{chapter}.ipynb", as_version=4)
    setup = next(c for c in nb.cells if c.cell_type == "code" and EDITION_MARKER in c.source)
    commit = nb.metadata["muongrid"]["edition"]["run"]["commit"]
    assert f'COMMIT = "{commit}"' in setup.source, "the set-up cell does not fetch the commit that ran"
    content = tmp_path / "content"
    content.mkdir()
    source = re.sub(r'^REPOSITORY = ".*"$', f'REPOSITORY = "file://{ROOT}"', setup.source, count=1, flags=re.M)
    source = re.sub(r'^HOME = "/content/', f'HOME = "{content}/', source, count=1, flags=re.M)
    assert source.count(str(ROOT)) == 1 and source.count(str(content)) == 1, "the set-up cell changed shape"
    setup.source = source
    # the kernel inherits this process's environment: Colab's has no PYTHONPATH and no virtualenv
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    NotebookClient(nb, kernel_name="colab", timeout=600,
                   resources={"metadata": {"path": str(content)}}).execute()

    clone = content / repository_url().rstrip("/").split("/")[-1]  # the folder the set-up cell names
    assert (clone / "notebooks" / f"{chapter}.ipynb").is_file(), "the set-up cell did not fetch the repository"
    fetched = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert fetched.stdout.strip() == commit, "the set-up cell fetched another commit than the one that ran"
    installed = subprocess.run([str(python), "-c", "import muongrid; print(muongrid.__file__)"],
                               capture_output=True, text=True, check=True).stdout
    assert str(tmp_path / "venv") in installed, f"muongrid was not installed into the runtime: {installed}"
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    figures = [c for c in nb.cells if c.cell_type == "code" and c.metadata.get("muongrid", {}).get("figure")]
    assert chapter != "01_muon" or len(figures) >= 3  # (chapter 1 draws a spectrum and two explorers)
    for cell in figures:
        shown = [o for o in cell.outputs if o.get("output_type") in ("display_data", "execute_result")]
        kinds = {k for o in shown for k in o["data"]}
        html = " ".join(str(o["data"].get("text/html", "")) for o in shown)
        assert "image/png" in kinds or "plotly" in html.lower(), (cell.metadata["muongrid"], kinds)
