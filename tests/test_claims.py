"""The claims list (``muongrid/lab/claims.py``): one wording per claim, tables in one order, links that resolve.

Runs in well under a second; executes no chapter (chapters 7, 9 and 13 render these tables when built).
"""
from pathlib import Path

import pytest

from muongrid.lab import claims

ROOT = Path(__file__).resolve().parents[1]


def test_table_keeps_the_list_order_and_each_claims_source_figure():
    rows = {"fastest_grid": ("2x2 fastest", "`cmd`", "Agrees."), "comm_bound": ("1.250", "`cmd`", "Agrees.")}
    lines = claims.table(rows).splitlines()
    assert lines[0].startswith("| claim | their figure |") and len(lines) == 4
    # comm_bound comes before fastest_grid in CLAIMS, whatever order the chapter wrote them in
    assert "(1, 1.25]" in lines[2] and "DP2 x TP2" in lines[3]
    assert "| 1.25 upper bound | 1.250 (`cmd`) | Agrees. |" in lines[2]


def test_an_unknown_claim_is_refused_by_name():
    with pytest.raises(KeyError, match="no such claim \\['fastest'\\]"):
        claims.table({"fastest": ("x", "y", "z")})


def test_the_index_names_every_claim_and_links_chapters_and_sources_that_exist():
    index = claims.index_table()
    assert len(index.splitlines()) == 2 + len(claims.CLAIMS)
    bib = (ROOT / "book" / "references.bib").read_text()
    for c in claims.CLAIMS.values():
        assert c.text in index and f"@misc{{{claims.CITES[c.source]}," in bib
        assert list(c.checked_in) == sorted(c.checked_in), f"{c.text}: chapters in book order"
        for doc in c.checked_in:
            assert (ROOT / "notebooks" / f"{doc}.py").exists(), doc
            assert f"<{doc}>`" in index
