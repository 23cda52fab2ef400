"""MyST to plain Markdown (``booktools.mystmd``), on a small site written here: each rule, and the refusals.

The whole edition is checked against the real build in ``tests/test_edition.py``; this file pins each
rule on one line of input, so a failure there can be read here.
"""
from __future__ import annotations

import zlib

import pytest

from booktools.mystmd import MystError, Site, myst_left

URL = "https://example.github.io/book/"


@pytest.fixture
def site(tmp_path):
    """A built site in miniature: an objects.inv, a chapter page with a numbered figure, a glossary, the
    references page and a page that cites one of them (as sphinxcontrib-bibtex writes it)."""
    entries = ["notebooks/01_muon std:doc -1 notebooks/01_muon.html 1. Muon from first principles",
               "notebooks/05_step std:doc -1 notebooks/05_step.html 5. One step",
               "fig-ch1-spectrum std:label -1 notebooks/01_muon.html#$ Singular values",
               "owner layout std:term -1 book/glossary.html#term-owner-layout -",
               "DTensor std:term -1 book/glossary.html#term-DTensor -"]
    (tmp_path / "objects.inv").write_bytes(
        b"# Sphinx inventory version 2\n# Project: b\n# Version: \n"
        b"# The remainder of this file is compressed using zlib.\n" + zlib.compress("\n".join(entries).encode() + b"\n"))
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "book").mkdir()
    (tmp_path / "notebooks" / "01_muon.html").write_text(
        '<figure class="align-default" id="fig-ch1-spectrum"><img src="x.png"/><figcaption><p>'
        '<span class="caption-number">Fig. 3 </span><span class="caption-text">Singular values</span></p>'
        '</figcaption></figure><p>As <span class="bibtex-citation" id="id1">(<a class="reference internal" '
        'href="../book/references.html#cite-jordan2024muon" title="Keller Jordan">Jordan <em>et al.</em>, 2024</a>)'
        '</span> shows, and <span class="bibtex-citation" id="id2">PyTorch contributors [<a class="reference '
        'internal" href="../book/references.html#cite-pytorch2025dcp" title="DCP">2025c</a>]</span>.</p>')
    (tmp_path / "notebooks" / "05_step.html").write_text("<h1>5. One step</h1>")
    (tmp_path / "book" / "glossary.html").write_text('<dt id="term-owner-layout">owner layout</dt>'
                                                     '<dt id="term-DTensor">DTensor</dt>')
    (tmp_path / "book" / "references.html").write_text('<div class="citation" id="cite-jordan2024muon"></div>'
                                                       '<div class="citation" id="cite-pytorch2025dcp"></div>')
    return Site(tmp_path, URL)


def md(site, text):
    return site.markdown(text, "notebooks/01_muon")


def test_roles_become_links_whose_targets_exist(site):
    assert md(site, "{numref}`fig-ch1-spectrum` shows it.") == f"[Fig. 3]({URL}notebooks/01_muon.html#fig-ch1-spectrum) shows it."
    assert md(site, "{doc}`chapter 5 <05_step>`") == f"[chapter 5]({URL}notebooks/05_step.html)"
    assert md(site, "{doc}`05_step`") == f"[5. One step]({URL}notebooks/05_step.html)"
    assert md(site, "{doc}`/notebooks/05_step`") == f"[5. One step]({URL}notebooks/05_step.html)"  # from the root
    assert md(site, "{term}`owner layouts <owner layout>` and {term}`dtensor`") == (
        f"[owner layouts]({URL}book/glossary.html#term-owner-layout) and [dtensor]({URL}book/glossary.html#term-DTensor)")
    assert md(site, "Muon {cite:p}`jordan2024muon`.") == f"Muon ([Jordan et al., 2024]({URL}book/references.html#cite-jordan2024muon))."
    assert md(site, "{cite:t}`jordan2024muon` say") == f"[Jordan et al.]({URL}book/references.html#cite-jordan2024muon) (2024) say"
    # a reference the pages cite only in the textual form ("PyTorch contributors [2025c]") is found too
    assert md(site, "{cite:p}`jordan2024muon,pytorch2025dcp`") == (
        f"([Jordan et al., 2024]({URL}book/references.html#cite-jordan2024muon); "
        f"[PyTorch contributors, 2025c]({URL}book/references.html#cite-pytorch2025dcp))")
    assert myst_left(md(site, "{numref}`fig-ch1-spectrum` and {doc}`05_step`"))["roles"] == 0


def test_code_is_left_as_it_is(site):
    text = "Write `` {doc}`x` `` or:\n\n```markdown\n{doc}`05_step`\n:::{note}\n:::\n```\n"
    assert md(site, text) == text
    assert myst_left(text) == dict.fromkeys(myst_left(text), 0)


def test_admonitions_become_quotes_and_dropdowns_stay_folded(site):
    box = md(site, "```{admonition} What this chapter runs\nOne process, see {doc}`05_step`.\n```")
    assert box == f"> **What this chapter runs**\n>\n> One process, see [5. One step]({URL}notebooks/05_step.html)."
    warning = md(site, "```{admonition} Not public yet\n:class: warning\nRun it here.\n```")
    assert warning.startswith("> **\u26a0\ufe0f Not public yet**") and ":class:" not in warning
    solutions = md(site, ":::{admonition} Solutions\n:class: dropdown\n\n1. Run\n   ```python\n   x = 1\n   ```\n:::\nAfter.")
    assert solutions == ("<details>\n<summary><strong>Solutions</strong></summary>\n\n1. Run\n   ```python\n   x = 1\n"
                         "   ```\n\n</details>\nAfter.")
    for text in (box, warning, solutions):
        assert set(myst_left(text).values()) == {0}
    before = myst_left(":::{admonition} Solutions\n:class: dropdown\n{doc}`a` {term}`b`\n:::")
    assert before["directives"] == 1 and before["options"] == 1 and before["roles"] == 2 and before["colon fences"] == 1


def test_what_it_cannot_convert_it_refuses(site):
    with pytest.raises(MystError, match="has no label .fig-nowhere."):
        md(site, "{numref}`fig-nowhere`")
    with pytest.raises(MystError, match="no page notebooks/99_x"):
        md(site, "{doc}`99_x`")
    with pytest.raises(MystError, match="glossary has no term"):
        md(site, "{term}`bucket`")
    with pytest.raises(MystError, match="cites 'nobody2020'"):
        md(site, "{cite:p}`nobody2020`")
    with pytest.raises(MystError, match=r"role \{eq\}"):
        md(site, "{eq}`eq-1`")
    with pytest.raises(MystError, match=r"directive \{figure\}"):
        md(site, "```{figure} a.png\n```")
    with pytest.raises(MystError, match="unfilled placeholder"):
        md(site, "The ratio is {{ch1-ratio}}.")
    assert not site.exists(URL + "notebooks/01_muon.html#fig-gone") and site.exists(URL + "book/glossary.html")
