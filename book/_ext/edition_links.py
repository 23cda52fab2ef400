"""A chapter's Colab button opens its notebook edition, not its source notebook.

sphinx-book-theme builds the button from ``repository.url`` and ``repository.branch``
(``.../github/<owner>/<repo>/blob/main/notebooks/01_muon.ipynb``): the source notebook, MyST in its
Markdown and no outputs. The edition (``scripts/booktools/edition.py``) has the same paths on the branch
``muongrid_edition_branch`` (``_config.yml``), which ``.github/workflows/book.yml`` pushes after each
build; this extension points the button there. The page's ``.ipynb`` download is the edition too:
``make book`` copies it over the page's ``_sources/`` copy once the edition is written.
"""
from __future__ import annotations


def point_colab_at_edition(app, pagename, templatename, context, doctree) -> None:
    source = f"/blob/{app.config.html_theme_options.get('repository_branch') or 'main'}/"
    edition = f"/blob/{app.config.muongrid_edition_branch}/"
    for group in context.get("header_buttons", []):
        if group.get("label") != "launch-buttons":
            continue
        for button in group.get("buttons", []):
            if button.get("text") == "Colab" and source in button.get("url", ""):
                button["url"] = button["url"].replace(source, edition, 1)


def setup(app):
    app.add_config_value("muongrid_edition_branch", "edition", "html")
    app.connect("html-page-context", point_colab_at_edition, priority=502)  # after the theme's (501)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
