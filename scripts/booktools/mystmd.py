"""MyST, as the chapters write it for the book, turned into Markdown that Jupyter and Colab render.

The chapters' Markdown (and the Markdown their ``say`` cells print) holds MyST roles (``{doc}``,
``{numref}``, ``{term}``, ``{cite:p}``, ``{cite:t}``, ``{ref}``), admonitions (```` ```{admonition} ````
and ``:::{admonition}`` fences; ``:class: dropdown`` folds one) and labels (``(name)=``). Jupyter and
Colab show all of it as raw text. ``Site`` reads the built pages (``objects.inv``, each page's element
ids, its figure numbers, the citations' author-year labels) and ``Site.markdown`` rewrites

- a role as a Markdown link into the published site, to a target it has checked exists in the build
  (a page, a figure's anchor with its number, a glossary entry, a reference);
- an admonition as a block quote under its title in bold, a dropdown as ``<details>`` (it stays folded);
- a label as an HTML anchor.

A role or directive it has no rule for raises, naming it, so nothing reaches a reader unconverted.
Code (fenced blocks, inline spans) is left as it is. ``myst_left`` counts what is left (the tests).

    site = Site(Path("_build/html"), "https://owner.github.io/repo/")
    site.markdown("{numref}`fig-ch1-spectrum` shows the skew.", page="notebooks/01_muon")
"""
from __future__ import annotations

import html
import posixpath
import re
from functools import cached_property
from pathlib import Path
from urllib.parse import urlsplit

# A role, or an inline code span (left as it is); whichever starts first wins.
ROLE_OR_CODE = re.compile(r"\{(?P<role>[a-z][\w:-]*)\}`(?P<content>[^`]+)`|(?P<ticks>`+).+?(?P=ticks)", re.S)
DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|:{3,})\{(?P<name>[\w-]+)\}[ \t]*(?P<arg>.*)$")
CODE_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?!.*`)")
OPTION = re.compile(r"^[ \t]*:(?P<key>[\w-]+):[ \t]*(?P<value>.*)$")
LABEL = re.compile(r"^\((?P<label>[\w.:-]+)\)=[ \t]*$", re.M)
PLACEHOLDER = re.compile(r"\{\{.*?\}\}")
ADMONITIONS = {"admonition", "note", "tip", "hint", "important", "seealso", "attention", "caution", "warning",
               "danger", "error"}
WARNINGS = {"attention", "caution", "warning", "danger", "error"}
TARGET = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.S)


class MystError(ValueError):
    """MyST that the edition has no rule for, or a reference whose target the built site lacks."""


def _text_of(fragment: str) -> str:
    """The text of an HTML fragment (tags dropped, entities decoded, spaces collapsed)."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


class Site:
    """The built book, as the edition's links need it: addresses, titles, figure numbers, citation labels."""

    def __init__(self, html_dir: Path, url: str):
        self.html = Path(html_dir)
        self.url = url.rstrip("/") + "/"
        self._pages: dict[str, str] = {}

    # -- what the build wrote ------------------------------------------------------------------
    @cached_property
    def inventory(self) -> dict:
        from sphinx.util.inventory import InventoryFile

        with (self.html / "objects.inv").open("rb") as f:
            return InventoryFile.load(f, "", posixpath.join)

    def _objects(self, kind: str) -> dict[str, tuple[str, str]]:
        """name -> (address relative to the site, display name) for one kind of ``objects.inv``."""
        return {name: (entry[2], entry[3]) for name, entry in self.inventory.get(kind, {}).items()}

    @cached_property
    def docs(self) -> dict[str, tuple[str, str]]:
        return {name: (uri, title) for name, (uri, title) in self._objects("std:doc").items()}

    @cached_property
    def labels(self) -> dict[str, tuple[str, str]]:
        return self._objects("std:label")

    @cached_property
    def terms(self) -> dict[str, str]:
        return {name.lower(): uri for name, (uri, _) in self._objects("std:term").items()}

    def page(self, path: str) -> str:
        """The HTML of a page of the site (``notebooks/01_muon.html``)."""
        if path not in self._pages:
            self._pages[path] = (self.html / path).read_text(encoding="utf-8")
        return self._pages[path]

    def ids(self, path: str) -> set[str]:
        return set(re.findall(r'\sid="([^"]+)"', self.page(path)))

    @cached_property
    def citations(self) -> dict[str, tuple[str, str]]:
        """Anchor id in the references page -> (its address, the author-year label the pages show), read from
        the citations the pages make (``bibtex_cite_id`` gives each entry an id made from its key)."""
        found = {}
        anchor = re.compile(r'<a class="reference internal" href="([^"#]*references\.html)#(cite-[^"]+)"[^>]*>(.*?)</a>',
                            re.S)
        for path in sorted(self.html.rglob("*.html")):
            rel = path.relative_to(self.html).as_posix()
            for span in re.finditer(r'<span class="bibtex-citation"[^>]*>(.*?)</span>', self.page(rel), re.S):
                for m in anchor.finditer(span.group(1)):
                    target = posixpath.normpath(posixpath.join(posixpath.dirname(rel), m.group(1)))
                    text = _text_of(m.group(3))
                    if not re.search(r", \d{4}[a-z]?$", text):  # the textual form: Author [<a>2025c</a>]
                        text = f"{_text_of(span.group(1)[:m.start()]).rstrip(' [(')}, {text}"
                    found.setdefault(m.group(2), (f"{target}#{m.group(2)}", text))
        return found

    # -- resolving a reference ------------------------------------------------------------------
    def address(self, relative: str) -> str:
        """The published address of ``relative`` (``page.html#id``), after checking the build has it."""
        path, _, anchor = relative.partition("#")
        if not (self.html / path).is_file():
            raise MystError(f"the built site has no page {path}")
        if anchor and anchor not in self.ids(path):
            raise MystError(f"the built page {path} has no element with id {anchor!r}")
        return self.url + relative

    def exists(self, url: str) -> bool:
        """Whether ``url``, an address inside the published site, names a page (and anchor) the build has."""
        if not url.startswith(self.url):
            return False
        try:
            self.address(url[len(self.url):])
        except MystError:
            return False
        return True

    def figure_number(self, label: str) -> str:
        """``Fig. 3``: the number the book gives the figure (or table) named ``label``."""
        uri = self.labels.get(label, (None,))[0]
        if uri is None:
            raise MystError(f"no figure or label {label!r} in the built site")
        path, _, anchor = uri.partition("#")
        page = self.page(path)
        start = page.find(f'id="{anchor}"')
        m = re.compile(r'<span class="caption-number">([^<]*)</span>').search(page, start)
        if start < 0 or m is None:
            raise MystError(f"{label!r} has no numbered caption in {path}")
        return m.group(1).strip()

    # -- the roles ------------------------------------------------------------------------------
    def role(self, name: str, content: str, page: str) -> str:
        m = TARGET.match(content)
        text, target = (m.group("text"), m.group("target")) if m else (None, content.strip())
        if name == "doc":
            doc = posixpath.normpath(target[1:] if target.startswith("/")  # (from the book's root)
                                     else posixpath.join(posixpath.dirname(page), target))
            if doc not in self.docs:
                raise MystError(f"{{doc}}`{content}`: the built site has no page {doc}")
            uri, title = self.docs[doc]
            return _link(text or title, self.address(uri))
        if name in ("numref", "ref"):
            if target not in self.labels:
                raise MystError(f"{{{name}}}`{content}`: the built site has no label {target!r}")
            uri, title = self.labels[target]
            if name == "numref":
                number = self.figure_number(target)
                title = (text or "").replace("%s", number.split()[-1]).replace("{number}", number.split()[-1]) or number
            return _link(text if name == "ref" and text else title, self.address(uri))
        if name == "term":
            uri = self.terms.get(target.lower())
            if uri is None:
                raise MystError(f"{{term}}`{content}`: the glossary has no term {target!r}")
            return _link(text or target, self.address(uri))
        if name in ("cite:p", "cite:t"):
            from docutils.nodes import make_id

            cited = []
            for key in (k.strip() for k in target.split(",")):
                anchor = make_id(f"cite-{key}")
                if anchor not in self.citations:
                    raise MystError(f"{{{name}}}`{content}`: no page of the built site cites {key!r}")
                uri, label = self.citations[anchor]
                who, _, year = label.rpartition(", ")
                cited.append(_link(label, self.address(uri)) if name == "cite:p"
                             else f"{_link(who, self.address(uri))} ({year})")
            return f"({'; '.join(cited)})" if name == "cite:p" else ", ".join(cited)
        raise MystError(f"no rule for the MyST role {{{name}}} (in {{{name}}}`{content}`)")

    def inline(self, text: str, page: str) -> str:
        """``text`` with every role outside inline code rewritten (``role``), labels made anchors."""
        if PLACEHOLDER.search(text):
            raise MystError(f"an unfilled placeholder {PLACEHOLDER.search(text).group(0)} in {page}")
        text = LABEL.sub(lambda m: f'<a id="{m.group("label")}"></a>', text)
        return ROLE_OR_CODE.sub(lambda m: self.role(m.group("role"), m.group("content"), page)
                                if m.group("role") else m.group(0), text)

    # -- the blocks -----------------------------------------------------------------------------
    def markdown(self, text: str, page: str) -> str:
        """``text`` (MyST Markdown of page ``page``, e.g. ``notebooks/01_muon``) as plain Markdown."""
        lines, out, run = text.split("\n"), [], []

        def flush():
            if run:
                out.append(self.inline("\n".join(run), page))
                run.clear()

        i = 0
        while i < len(lines):
            directive, code = DIRECTIVE.match(lines[i]), CODE_FENCE.match(lines[i])
            if not (directive or code):
                run.append(lines[i])
                i += 1
                continue
            m = directive or code
            fence = m.group("fence")
            close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
            end = next((j for j in range(i + 1, len(lines)) if close.match(lines[j])), len(lines))
            flush()
            if directive:
                body = lines[i + 1:end]
                options = {}
                while body and OPTION.match(body[0]):
                    options[OPTION.match(body[0]).group("key")] = OPTION.match(body[0]).group("value")
                    body = body[1:]
                out.append(self.directive(m.group("name"), m.group("arg"), options, "\n".join(body), page))
            else:
                out.append("\n".join(lines[i:end + 1]))  # code: as it is
            i = end + 1
        flush()
        return "\n".join(out)

    def directive(self, name: str, arg: str, options: dict, body: str, page: str) -> str:
        if name not in ADMONITIONS:
            raise MystError(f"no rule for the MyST directive {{{name}}} in {page}")
        title = self.inline(arg.strip(), page) or name.capitalize()
        body = self.markdown(body.strip("\n"), page)
        classes = set(options.get("class", "").split())
        if "dropdown" in classes:  # folded, as the book folds it, until the reader opens it
            return f"<details>\n<summary><strong>{title}</strong></summary>\n\n{body}\n\n</details>"
        mark = "\u26a0\ufe0f " if name in WARNINGS or classes & WARNINGS else ""
        return "\n".join("> " + line if line.strip() else ">" for line in [f"**{mark}{title}**", "", *body.split("\n")])


def _link(text: str, url: str) -> str:
    return f"[{text.replace('[', chr(92) + '[').replace(']', chr(92) + ']')}]({url})"


def myst_left(text: str) -> dict[str, int]:
    """MyST syntax in ``text`` outside code: roles, directives (backtick or colon fences), bare colon fences,
    directive options, labels and unfilled ``{{name}}`` placeholders, by kind."""
    counts = {"roles": 0, "directives": 0, "colon fences": 0, "options": 0, "labels": 0, "placeholders": 0}
    in_code = None
    for line in text.split("\n"):
        if in_code:
            if re.match(rf"^[ \t]*{re.escape(in_code[0])}{{{len(in_code)},}}[ \t]*$", line):
                in_code = None
            continue
        if DIRECTIVE.match(line):
            counts["directives"] += 1
            continue
        if (code := CODE_FENCE.match(line)) is not None:
            in_code = code.group("fence")
            continue
        counts["colon fences"] += bool(re.match(r"^[ \t>]*:::", line))
        counts["options"] += bool(re.match(r"^[ \t>]*:(class|name|open|label):", line))
        counts["labels"] += bool(LABEL.match(line))
        counts["placeholders"] += len(PLACEHOLDER.findall(line))
        counts["roles"] += sum(1 for m in ROLE_OR_CODE.finditer(line) if m.group("role"))
    return counts


def site_path(url: str, site_url: str) -> str | None:
    """The page (``notebooks/01_muon.html``) an address inside the site names, or None for one outside it."""
    if not url.startswith(site_url.rstrip("/") + "/"):
        return None
    return urlsplit(url).path[len(urlsplit(site_url.rstrip("/") + "/").path):]
