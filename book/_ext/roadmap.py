"""The ``{chapter-table}`` directive: the book's road map, generated from ``_toc.yml``.

Every page of the table of contents, its title (the page's first heading) and the question it
answers, as ``muongrid.lab.roadmap.table_markdown`` writes it; chapter 0 shows the same table from a
cell. Used on the index page:

    ```{chapter-table}
    ```
"""
from __future__ import annotations

import sys
from pathlib import Path

from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective


class ChapterTable(SphinxDirective):
    has_content = False

    def run(self):
        try:
            from muongrid.lab.roadmap import table_markdown
        except ImportError:  # muongrid not installed: the staged copy of scripts/ beside the sources
            sys.path.insert(0, str(Path(self.env.srcdir) / "scripts"))
            from muongrid.lab.roadmap import table_markdown
        toc = Path(self.env.srcdir) / "_toc.yml"
        self.env.note_dependency(str(toc))
        from docutils import nodes
        holder = nodes.container(classes=["chapter-table"])
        lines = table_markdown(toc.read_text()).splitlines()
        self.state.nested_parse(StringList(lines, source=str(toc)), self.content_offset, holder)
        return [holder]


def setup(app):
    app.add_directive("chapter-table", ChapterTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
