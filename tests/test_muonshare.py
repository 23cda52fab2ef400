"""muongrid.lab.muonshare, chapter 13's Muon share against the tokens of a step: the curve is what its pieces
say, ``tokens_for`` inverts it, and DMuon's measured row is read from the cited record (about 3 s, no process).

    PYTHONPATH=scripts python -m pytest -q tests/test_muonshare.py
"""
from __future__ import annotations

import pytest

from muongrid.lab import muonshare, timemodel, wholestep


def test_the_curve_is_a_fixed_extra_over_a_step_that_grows_with_the_tokens():
    row = muonshare.ROWS[0]
    c = muonshare.curve(row, tokens=(2**18, 2**20))
    opt = wholestep.optimizer_seconds(wholestep.Config("x", row.model, row.dp, row.tp, 1))
    assert c["optimizer"] == dict(adamw=opt["adamw"]["total"], muon=opt["owner"]["total"])
    for t, extra in c["extra"].items():
        fb = wholestep.forward_backward_seconds(row.model, row.dp * row.tp, t)
        assert extra == pytest.approx((opt["owner"]["total"] - opt["adamw"]["total"]) / (fb + opt["adamw"]["total"]))
    assert c["extra"][2**18] > c["extra"][2**20] > 0
    assert muonshare.curve(row, tokens=(muonshare.tokens_for(row, 0.02),))["extra"].popitem()[1] == pytest.approx(0.02)


def test_the_fsdp2_row_charges_fsdpmuons_trips_and_newton_schulz_and_the_elementwise_passes():
    row = muonshare.Row("t", "llama3.2-1b", 8, sharding="fsdp2")
    groups, muon_elems, adamw_elems = wholestep.cost_groups(row.model)
    shapes = [s for g in groups if g["use_muon"] for s in g["shapes"]]
    extra = timemodel.fsdp2_extra_seconds(shapes, 8, timemodel.h100())["total"]
    opt = muonshare.optimizer_seconds(row)
    diff = (wholestep.elementwise_seconds(muon_elems, adamw_elems, 8, "muon")
            - wholestep.elementwise_seconds(muon_elems, adamw_elems, 8, "adamw"))
    assert opt["muon"] - opt["adamw"] == pytest.approx(extra + diff) and extra > 0
    with pytest.raises(ValueError, match="FSDP2 over DP alone"):
        muonshare.optimizer_seconds(muonshare.Row("t", "llama3.2-1b", 4, tp=2, sharding="fsdp2"))


def test_dmuons_row_comes_from_the_cited_record():
    gap = muonshare.dmuon_gap()
    assert (gap["their_adamw_ms"], gap["their_muon_ms"]) == (1271, 1372) and gap["their_extra_ms"] == 101
    assert gap["their_extra"] == pytest.approx(0.0795, abs=1e-4)          # the README's +8.0%
    assert gap["ours_over_their_step"] == pytest.approx(gap["our_extra_ms"] / 1271)
    assert muonshare.fmt_tokens(2**17) == "128 Ki" and muonshare.fmt_tokens(2**22) == "4 Mi"
