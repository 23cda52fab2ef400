"""The guard against silent routing: after every Muon group's step the optimizer checks, on the host, that
the matrices that ran Newton-Schulz on this rank are exactly the plan's, and that every matrix it holds a
piece of got an update (``ZeroOneOptimizer._guard``). Other projects shipped the mirror bugs: matrices
planned for Muon that silently fell back to another update. Here each way of going wrong is put in on purpose
and must fail the step, naming the matrix; the untouched step passes on every layout.

    python -m pytest -q tests/test_guard.py
"""
from __future__ import annotations

import pytest
import torch

from muongrid import DistributedMuon, Grid


def build(layout: str, ns_batch: bool = False):
    gen = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(*s, generator=gen)) for s in [(12, 8), (3, 8, 6), (12, 8), (6, 10)]]
    opt = DistributedMuon([{"params": ps, "names": ["a", "bank", "b", "c"]}], Grid.single(), layout=layout,
                          ns_batch=ns_batch)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen)
    return opt


@pytest.mark.parametrize("layout, ns_batch", [("bucket", False), ("owner", False), ("owner", True),
                                              ("aligned", True), ("group", False)])
def test_a_step_that_follows_the_plan_passes(layout, ns_batch):
    opt = build(layout, ns_batch)
    opt.step()
    assert opt.last_step.ran == {(0, i) for i in range(4)}


@pytest.mark.parametrize("layout", ["bucket", "owner", "group"])
def test_a_matrix_updated_without_newton_schulz_fails_the_step(layout):
    opt = build(layout)
    real = opt.flow.newton_schulz

    def forgets_c(group, matrix, metas, ran):   # "c" is orthogonalised but not as itself: a silent fallback
        return real(group, matrix, [m for m in metas if m.name != "c"], ran)

    opt.flow.newton_schulz = forgets_c
    with pytest.raises(RuntimeError, match=r"planned for Newton-Schulz here but not run \['c'\]"):
        opt.step()


@pytest.mark.parametrize("layout", ["owner", "aligned"])
def test_a_matrix_that_gets_no_update_fails_the_step(layout):
    opt = build(layout, ns_batch=True)
    real = opt.flow.run

    def drops_bank(group, updates, options, step):
        return ((meta, piece) for meta, piece in real(group, updates, options, step) if meta.name != "bank")

    opt.flow.run = drops_bank
    with pytest.raises(RuntimeError, match=r"held here but given no update \['bank'\]"):
        opt.step()
