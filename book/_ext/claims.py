"""The ``{claims-appendix}`` directive: every claim of the paper, the report and the tutorial, once.

Each claim's words, source and figure come from ``muongrid.lab.claims.CLAIMS``; each chapter's finding is
pasted from the chapter's executed page (it glues them with ``claims.glue_checks``), so the appendix shows
what the chapters computed when the book was built. Used by ``book/claims.md``:

    ```{claims-appendix}
    ```
"""
from __future__ import annotations

import sys
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective


class ClaimsAppendix(SphinxDirective):
    has_content = False

    def run(self):
        try:
            from muongrid.lab.claims import appendix_markdown
        except ImportError:  # muongrid not installed: the staged copy of scripts/ beside the sources
            sys.path.insert(0, str(Path(self.env.srcdir) / "scripts"))
            from muongrid.lab.claims import appendix_markdown
        holder = nodes.container(classes=["claims-appendix"])
        lines = appendix_markdown().splitlines()
        self.state.nested_parse(StringList(lines, source=self.env.docname), self.content_offset, holder)
        return [holder]


def setup(app):
    app.add_directive("claims-appendix", ClaimsAppendix)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
