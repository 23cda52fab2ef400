"""Serve MathJax, require.js and the Jupyter widget manager from the book itself, so pages render offline.

By default the pages load these from CDNs: with no network, math shows as raw LaTeX and widget
areas stay empty. At build time this Sphinx extension fetches pinned packages from the npm
registry (``npm pack``, never a CDN), unpacks the files the pages need into
``book/_offline/offline/`` (git-ignored, reused by later builds), has Sphinx copy that folder to
``_build/html/offline/``, and points ``mathjax_path`` and myst-nb's ``nb_ipywidgets_js`` at it.
The folder is outside ``_static/`` on purpose: Jupyter Book adds every .js under ``_static/`` to
every page.

Without npm (or the registry) the build falls back to the CDNs with a warning; with
``DMUON_OFFLINE=require`` that is an error instead (the browser test sets it).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from sphinx.util import logging

LOG = logging.getLogger(__name__)
PACKAGES = {"mathjax": "3.2.2", "requirejs": "2.3.8", "@jupyter-widgets/html-manager": "1.0.15"}
# What the pages load, from each unpacked package: (package, path inside it, path under offline/).
FILES = [
    ("mathjax", "es5/tex-chtml.js", "mathjax/tex-chtml.js"),
    ("mathjax", "es5/output/chtml/fonts/woff-v2", "mathjax/output/chtml/fonts/woff-v2"),
    ("mathjax", "es5/input/tex/extensions", "mathjax/input/tex/extensions"),
    ("mathjax", "es5/ui", "mathjax/ui"),
    ("mathjax", "es5/a11y", "mathjax/a11y"),
    ("requirejs", "require.js", "require.js"),
    ("@jupyter-widgets/html-manager", "dist/embed-amd.js", "html-manager/embed-amd.js"),  # self-contained
]
STAMP = "versions.txt"


def _wanted() -> str:
    return "\n".join(f"{name}@{version}" for name, version in PACKAGES.items()) + "\n"


def fetch(dest: Path) -> None:
    """Download the pinned packages with ``npm pack`` and copy the needed files into ``dest``."""
    with tempfile.TemporaryDirectory() as tmp:
        specs = [f"{n}@{v}" for n, v in PACKAGES.items()]
        subprocess.run(["npm", "pack", "--silent", "--pack-destination", tmp, *specs], check=True,
                       capture_output=True, timeout=300)
        unpacked = {}
        for name in PACKAGES:
            tgz = next(Path(tmp).glob(name.replace("@", "").replace("/", "-") + "-*.tgz"))
            out = Path(tmp, "x", name.replace("/", "_"))
            with tarfile.open(tgz) as tar:
                tar.extractall(out, filter="data")
            unpacked[name] = out / "package"
        staging = dest.with_name(dest.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        for name, src, dst in FILES:
            source, target = unpacked[name] / src, staging / dst
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if source.is_dir() else shutil.copyfile)(source, target)
        (staging / STAMP).write_text(_wanted())
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)


def configure(app, config) -> None:
    root = Path(app.srcdir) / "book" / "_offline"
    assets = root / "offline"
    stamp = assets / STAMP
    if not (stamp.exists() and stamp.read_text() == _wanted()):
        try:
            LOG.info("offline_assets: fetching %s from the npm registry", ", ".join(PACKAGES))
            fetch(assets)
        except (OSError, subprocess.SubprocessError, StopIteration) as e:
            message = f"offline_assets: could not fetch local MathJax/widget assets ({e}); pages will use CDNs"
            if os.environ.get("DMUON_OFFLINE") == "require":
                raise RuntimeError(message) from e
            LOG.warning(message)
            return
    config.html_extra_path = list(config.html_extra_path) + [str(root)]
    # Both paths are resolved relative to _static/ by Sphinx, hence the "../".
    config.mathjax_path = "../offline/mathjax/tex-chtml.js"
    config.nb_ipywidgets_js = {
        "../offline/require.js": {},
        # No crossorigin attribute: it makes browsers refuse the script when the page is opened from
        # file://, which is how an offline reader opens a local build.
        "../offline/html-manager/embed-amd.js": {"data-jupyter-widgets-cdn": "https://cdn.jsdelivr.net/npm/"},
    }


def setup(app):
    app.connect("config-inited", configure, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
