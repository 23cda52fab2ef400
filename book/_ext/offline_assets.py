"""Serve MathJax, require.js and the Jupyter widget manager from the book itself, so pages render offline.

By default the pages load these from CDNs: with no network, math shows as raw LaTeX and widget
areas stay empty. At build time this Sphinx extension fetches pinned packages from the npm
registry (``npm pack``, never a CDN), unpacks the files the pages need into
``book/_offline/offline/`` (git-ignored, reused by later builds), has Sphinx copy that folder to
``_build/html/offline/``, and points ``mathjax_path`` and myst-nb's ``nb_ipywidgets_js`` at it.
The folder is outside ``_static/`` on purpose: Jupyter Book adds every .js under ``_static/`` to
every page.

Without npm (or the registry) the build falls back to the CDNs with a warning; with
``MUONGRID_OFFLINE=require`` that is an error instead (the browser test sets it).

The chapters' explorers are Plotly figures (``muongrid.lab.explorers``). Their HTML carries no
plotly.js; this extension copies ``plotly.min.js`` out of the installed ``plotly`` wheel (no
download) to ``offline/plotly/`` and adds it, first in ``<head>``, to the pages that hold a Plotly
figure. It must load before require.js, or it registers itself as an AMD module instead of
defining ``window.Plotly``.

Chapters read from Jupytext ``.py`` sources also offer their paired ``.ipynb`` for download.

It also adds the book's stylesheet (``book/_static/book.css``: outputs wrap instead of scrolling
sideways), and prints a loud notice while ``repository.url`` is still the placeholder (a notice on
stderr, not a Sphinx warning: the build runs with ``-W``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
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
    ("@jupyter-widgets/html-manager", "dist", "html-manager"),  # + its fonts (Font Awesome), found via WIDGETS_PATHS
]
# embed-amd.js finds its fonts next to the AMD modules it defines, whose addresses require.js derives
# from their names: without this map, `notebooks/@jupyter-widgets/...` (missing files, console errors).
WIDGET_MODULES = ["html-manager/dist", "html-manager", "base", "base7", "controls", "controls7"]
STAMP = "versions.txt"


def _wanted() -> str:
    files = "\n".join(dst for _, _, dst in FILES)  # a new file to unpack also triggers a fetch
    return "\n".join(f"{name}@{version}" for name, version in PACKAGES.items()) + "\n" + files + "\n"


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
            if source.is_dir():  # (dist/: only the font files, the scripts are the one above)
                shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.js", "*.map", "*.txt"))
            else:
                shutil.copyfile(source, target)
        (staging / STAMP).write_text(_wanted())
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)


PLACEHOLDER_URL = "https://github.com/muongrid-book/distributed-muon"


def copy_plotly(root: Path) -> bool:
    """Copy plotly.min.js from the installed plotly package to ``root/offline/plotly/``."""
    try:
        import plotly
    except ImportError:
        return False
    source = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    target = root / "offline" / "plotly" / "plotly.min.js"
    if not (target.exists() and target.stat().st_size == source.stat().st_size):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return True


def warn_placeholder(config) -> None:
    url = (getattr(config, "html_theme_options", None) or {}).get("repository_url", "")
    if url.rstrip("/") == PLACEHOLDER_URL:
        bar = "!" * 100
        print(f"\n{bar}\n!! repository.url in _config.yml is still the placeholder {PLACEHOLDER_URL}.\n"
              "!! The Colab, repository and issue buttons and every chapter's set-up cell (git clone) point at it.\n"
              "!! Set repository.url to the real repository, then run `python -m muongrid.lab.notebook sync`\n"
              f"!! (CONTRIBUTING.md, 'Publish the book').\n{bar}\n", file=sys.stderr, flush=True)


# Shown on every page, above the launch buttons, while the repository is the placeholder.
NOT_PUBLIC = ("This book's repository is not public yet, so the Colab button cannot fetch its code "
              "(the first cell stops and says so). Run the chapters on your machine: chapter 0 says how.")


def configure(app, config) -> None:
    warn_placeholder(config)
    options = getattr(config, "html_theme_options", None)
    if (options is not None and options.get("repository_url", "").rstrip("/") == PLACEHOLDER_URL
            and not options.get("announcement")):  # (jupyter-book sets it to "" when _config.yml has none)
        options["announcement"] = NOT_PUBLIC
    # An explicit colour mode: without one the theme logs "Got invalid theme mode" as a console error.
    config.html_context = dict(config.html_context or {}, default_mode="light")
    root = Path(app.srcdir) / "book" / "_offline"
    config.html_static_path = list(config.html_static_path) + [str(Path(app.srcdir) / "book" / "_static")]
    assets = root / "offline"
    stamp = assets / STAMP
    fetched = True
    if not (stamp.exists() and stamp.read_text() == _wanted()):
        try:
            LOG.info("offline_assets: fetching %s from the npm registry", ", ".join(PACKAGES))
            fetch(assets)
        except (OSError, subprocess.SubprocessError, StopIteration) as e:
            message = f"offline_assets: could not fetch local MathJax/widget assets ({e}); pages will use CDNs"
            if os.environ.get("MUONGRID_OFFLINE") == "require":
                raise RuntimeError(message) from e
            LOG.warning(message)
            fetched = False
    if copy_plotly(root) or fetched:  # after fetch(), which replaces the folder
        config.html_extra_path = list(config.html_extra_path) + [str(root)]
    if not fetched:
        return
    # Both paths are resolved relative to _static/ by Sphinx, hence the "../".
    config.mathjax_path = "../offline/mathjax/tex-chtml.js"
    # "<prefix>/dist/libembed-amd" -> offline/html-manager/libembed-amd; "base" -> offline/html-manager/base
    paths = ", ".join(f'"@jupyter-widgets/{m}": root + "offline/html-manager{"" if m.endswith("/dist") else "/" + m}"'
                      for m in WIDGET_MODULES)
    (assets / "widget-paths.js").write_text(
        "// Written by book/_ext/offline_assets.py: where the widget manager's AMD modules (and so its fonts) live.\n"
        "(function () {\n  const root = document.documentElement.dataset.content_root || './';\n"
        f"  require.config({{paths: {{{paths}}}}});\n}})();\n"
        "// The widgets typeset their labels with MathJax 2's MathJax.Hub.Queue; the book loads MathJax 3.\n"
        "document.addEventListener('DOMContentLoaded', function () {\n"
        "  if (window.MathJax && !window.MathJax.Hub) {\n"
        "    window.MathJax.Hub = {Queue: function (command) {\n"
        "      if (window.MathJax.typesetPromise) window.MathJax.typesetPromise([command[2]]).catch(function () {});\n"
        "    }};\n  }\n});\n")
    config.nb_ipywidgets_js = {
        "../offline/require.js": {},
        "../offline/widget-paths.js": {},
        # No crossorigin attribute: it makes browsers refuse the script when the page is opened from
        # file://, which is how an offline reader opens a local build.
        "../offline/html-manager/embed-amd.js": {"data-jupyter-widgets-cdn": "https://cdn.jsdelivr.net/npm/"},
    }


def add_page_assets(app, pagename, templatename, context, doctree) -> None:
    """plotly.min.js on the pages that show a Plotly figure, before any other script; and each
    script once (sphinx-thebe registers its inline `const THEBE_JS_URL = ...` twice under Jupyter
    Book, a console error on every page)."""
    if "plotly-graph-div" in context.get("body", ""):
        app.add_js_file("../offline/plotly/plotly.min.js", priority=10)
    scripts, seen = context.get("script_files"), set()
    if scripts is not None:
        unique = []
        for js in scripts:
            key = (str(getattr(js, "filename", js) or ""), repr(sorted(getattr(js, "attributes", {}).items())))
            if key not in seen:
                seen.add(key)
                unique.append(js)
        scripts[:] = unique


def offer_ipynb(app, pagename, templatename, context, doctree) -> None:
    """A chapter read from its Jupytext ``.py`` also offers its paired ``.ipynb`` (what Colab and
    Jupyter open) in the download menu; ``copy_ipynb`` puts it beside the page's source."""
    paired = Path(app.srcdir, pagename + ".ipynb")
    if doctree is not None and paired.exists() and not context.get("page_source_suffix", "").endswith(".ipynb"):
        context["ipynb_source"] = pagename + ".ipynb"
        app.env.muongrid_ipynb = getattr(app.env, "muongrid_ipynb", set()) | {pagename}


def copy_ipynb(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        for pagename in sorted(getattr(app.env, "muongrid_ipynb", ())):
            target = Path(app.outdir, "_sources", pagename + ".ipynb")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(app.srcdir, pagename + ".ipynb"), target)


def setup(app):
    app.connect("html-page-context", offer_ipynb, priority=400)  # before the theme builds its buttons (501)
    app.connect("build-finished", copy_ipynb)
    app.connect("config-inited", configure, priority=900)
    app.connect("html-page-context", add_page_assets)
    app.add_css_file("book.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
