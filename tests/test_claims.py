"""The claims list (``muongrid/lab/claims.py``): one wording per claim, tables in one order, links that resolve.

Runs in well under a second; executes no chapter (chapters 7 and 9 hand their findings to the claims
appendix, ``book/claims.md``, when built; chapter 13 prints the index).
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


def test_the_appendix_pastes_every_finding_of_the_measuring_chapters_once():
    text = claims.appendix_markdown()
    for key, c in claims.CLAIMS.items():
        assert text.count(c.text[1:]) == 1, c.text   # every claim once (its first letter capitalised)
        for doc in c.checked_in:
            ref = f"../notebooks/{doc}.ipynb::{claims.glue_key(key)}"
            assert (ref in text) == (doc in claims.MEASURED_IN), ref
            assert f"<../notebooks/{doc}>`" in text
    assert (ROOT / "book" / "claims.md").read_text().count("```{claims-appendix}") == 1


def test_a_chapter_must_hand_over_exactly_the_claims_it_checks():
    rows = {k: ("1.0x", "cmd", "Agrees.") for k in claims.measured_by("09_training")}
    claims.glue_checks("09_training", rows)   # all of them: fine
    with pytest.raises(KeyError, match="missing \\['loss_gap'\\]"):
        claims.glue_checks("09_training", {k: v for k, v in rows.items() if k != "loss_gap"})
    with pytest.raises(KeyError, match="unknown \\['comm_time'\\]"):
        claims.glue_checks("09_training", dict(rows, comm_time=("x", "y", "z")))
    with pytest.raises(ValueError, match="not among the chapters"):
        claims.glue_checks("08_beyond_poc", {})
    assert claims.finding_html("a < b", "run.py --x", "Agrees.") == "a &lt; b (<code>run.py --x</code>). Agrees."
