"""No host collective in a steady-state step (issue 42): the step's one decision (which parameters have a
gradient somewhere, and the NaN/Inf verdict) rides a device all-reduce, and a rank that holds every gradient
reads nothing back.

Every rank of 2x1, 1x2 and 2x2 is simulated in this process on the ``meta`` device over torch's fake process
group (``muongrid/lab/devicecheck.py``): the audit sees every collective (and whether its tensors were on the
host) and every host sync, per optimizer step. The second step is the steady state (state made in the first).
That ranks still agree when one rank's gradient turns None is checked on real gloo ranks in
``tests/test_contract.py`` (finding 6) and ``tests/test_agree.py``.

    PYTHONPATH=scripts python -m pytest -q tests/test_step_vote.py
"""
from __future__ import annotations

import pytest
import torch

from muongrid.lab.devicecheck import simulate

SHAPES = [(12, 10), (7, 9), (10,)]   # two matrices (one split over TP by rows) and a gain vector
TP_DIMS = [0, 1, -1]


def audit_of(dp: int, tp: int, layout: str, check_finite, drop: bool = False):
    """Two steps of the hybrid on every rank; ``drop``: rank 0's first gradient is None in the second step."""
    from muongrid.distributed import DistributedMuon

    def worker(grid, comm, _):
        params = [torch.nn.Parameter(torch.zeros(*s, device=grid.device)) for s in SHAPES]
        local = [torch.nn.Parameter(torch.zeros(*_local(s, d, tp), device=grid.device))
                 for s, d in zip(SHAPES, TP_DIMS)]
        groups = [dict(params=local[:2], names=["a", "b"], tp_split_dims=TP_DIMS[:2]),
                  dict(params=local[2:], names=["g"], tp_split_dims=TP_DIMS[2:], use_muon=False)]
        opt = DistributedMuon(groups, grid, comm=comm, layout=layout, check_finite=check_finite)
        for step in range(2):
            for p in local:
                p.grad = torch.zeros_like(p)
            if drop and step == 1 and grid.rank == 0:
                local[0].grad = None
            opt.step()
        del params

    return simulate(worker, dp, tp, None)


def _local(shape, dim, tp):
    return tuple(n // tp if i == dim else n for i, n in enumerate(shape))


def steady(counter: dict) -> dict:
    """Counts of each rank's second step (steps are numbered (optimizer, n) per rank)."""
    return {r: n for (r, (_, k)), n in counter.items() if k == 1}


GRIDS = [(2, 1), (1, 2), (2, 2)]


@pytest.mark.parametrize("dp,tp", GRIDS, ids=lambda v: str(v))
@pytest.mark.parametrize("layout", ["bucket", "owner"])
def test_a_steady_state_step_makes_no_host_collective_and_no_host_sync(dp, tp, layout):
    for mode in (None, False):   # None: "defer" off a CPU (the GPU default); False: no check
        audit = simulate_ok(dp, tp, layout, mode)
        assert steady(audit.collectives_per_step(on_host=True)) == {}, mode
        assert steady(audit.syncs_per_step()) == {}, (mode, audit.syncs)
        # the vote still runs, on the device: one all-reduce per rank in the step at least
        device = steady(audit.collectives_per_step(on_host=False))
        assert sorted(device) == list(range(dp * tp)) and min(device.values()) >= 1


@pytest.mark.parametrize("dp,tp", GRIDS, ids=lambda v: str(v))
def test_raise_reads_the_ballot_once_after_the_collective_that_carries_it(dp, tp):
    audit = simulate_ok(dp, tp, "owner", "raise")
    assert steady(audit.collectives_per_step(on_host=True)) == {}
    assert steady(audit.syncs_per_step()) == {r: 1 for r in range(dp * tp)}


def test_a_rank_missing_a_gradient_reads_the_agreed_presence_and_only_it():
    audit = simulate_ok(2, 1, "owner", None, drop=True)
    assert steady(audit.collectives_per_step(on_host=True)) == {}
    assert steady(audit.syncs_per_step()) == {0: 1}   # rank 1 holds every gradient: it reads nothing


def simulate_ok(dp, tp, layout, mode, drop=False):
    audit = audit_of(dp, tp, layout, mode, drop)
    assert audit.off_device == [] and audit.mixed == []
    assert audit.steps == 2 * dp * tp
    return audit
