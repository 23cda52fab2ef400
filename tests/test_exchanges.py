"""Collectives sized for a cluster (issue 42): the owner, aligned, group and FSDP flows exchange a step's pieces
in at most K all-to-alls per direction, whatever the number of buckets and matrices (K = 1 without overlap,
``chunks`` with "prefetch": ``owner_routes.exchange_chunks``, itself tested in ``tests/test_routes.py``).

Every rank of the grid is simulated in this process on the ``meta`` device over torch's fake process group
(``muongrid/lab/devicecheck.py``) and the ledger's records of one step are counted by phase. That the chunked
exchanges give the same parameters as one process, bit for bit, is asserted where it always was
(``tests/test_distributed.py``, ``tests/test_group_layout.py``).

    PYTHONPATH=scripts python -m pytest -q tests/test_exchanges.py
"""
from __future__ import annotations

import collections

import pytest
import torch

from muongrid.comm import Phase
from muongrid.lab.devicecheck import simulate
from muongrid.owner_routes import PREFETCH_CHUNKS
from muongrid.plan import ParamSpec, build_plan

SHAPES = [(12, 10), (7, 9), (10, 12), (9, 7), (6, 6), (12, 10), (8, 5), (5, 8), (11, 4), (4, 11)]
BUCKET_NUMEL = {1: None, 3: 300, 10: 1}   # buckets -> bucket_numel that makes that many (checked below)
EXCHANGES = (Phase.NS_TO_OWNER, Phase.NS_FROM_OWNER)


def buckets_of(bucket_numel) -> int:
    specs = [[ParamSpec(f"w{i}", s, -1) for i, s in enumerate(SHAPES)]]
    return len(build_plan(specs, 2, 0, 1, bucket_numel, "owner", [True]).buckets[0])


def second_step_exchanges(opt, params, comm) -> collections.Counter:
    """Two steps on zero gradients; the owner exchanges the second (steady-state) one issued, by phase."""
    for _ in range(2):
        for p in params:
            p.grad = torch.zeros_like(p)
        opt.step()
    step = comm.ledger.step
    return collections.Counter(r.phase for r in comm.ledger.records if r.step == step and r.phase in EXCHANGES)


def exchanges(dp: int, tp: int, layout: str, bucket_numel, overlap: str, ns_batch: bool, chunks=None) -> dict:
    """Per rank, the all-to-alls of its second step, by phase."""
    from muongrid.distributed import DistributedMuon
    counts: dict = {}

    def worker(grid, comm, _):
        params = [torch.nn.Parameter(torch.zeros(*s, device=grid.device)) for s in SHAPES]
        opt = DistributedMuon([dict(params=params, tp_split_dims=[-1] * len(SHAPES))], grid, comm=comm,
                              layout=layout, bucket_numel=bucket_numel, overlap=overlap, ns_batch=ns_batch,
                              chunks=chunks)
        counts[grid.rank] = second_step_exchanges(opt, params, comm)

    audit = simulate(worker, dp, tp, None)
    assert audit.steps == 2 * dp * tp
    return counts


def test_the_bucket_counts_are_what_the_cases_say():
    assert {n: buckets_of(b) for n, b in BUCKET_NUMEL.items()} == {1: 1, 3: 3, 10: 10}


@pytest.mark.parametrize("buckets", sorted(BUCKET_NUMEL))
@pytest.mark.parametrize("layout", ["owner", "aligned", "group"])
@pytest.mark.parametrize("overlap,ns_batch", [("none", False), ("prefetch", False),
                                              ("prefetch", True), ("none", True)])
def test_exchanges_per_step_and_direction_are_at_most_k(buckets, layout, overlap, ns_batch):
    k = 1 if overlap != "prefetch" else PREFETCH_CHUNKS
    for dp, tp in ((2, 1), (2, 2)):
        counts = exchanges(dp, tp, layout, BUCKET_NUMEL[buckets], overlap, ns_batch)
        for rank, by_phase in counts.items():
            for phase in EXCHANGES:
                if layout == "aligned" and tp == 1:   # every matrix whole on its owner: nothing to exchange
                    assert by_phase[phase] == 0, (dp, tp, rank, phase, by_phase)
                    continue
                # every rank joins every exchange (an all-to-all is collective), and no more than K of them
                assert 1 <= by_phase[phase] <= min(k, buckets), (dp, tp, rank, phase, by_phase)


def test_chunks_sets_k_with_prefetch():
    counts = exchanges(2, 1, "owner", BUCKET_NUMEL[10], "prefetch", False, chunks=2)
    assert {rank: dict(c) for rank, c in counts.items()} == {r: {p: 2 for p in EXCHANGES} for r in range(2)}
    with pytest.raises(ValueError, match="chunks"):
        exchanges(1, 1, "owner", None, "prefetch", False, chunks=0)


def test_fsdp_exchanges_once_per_direction():
    """FSDPMuon sends every matrix's blocks in one all-to-all and takes the results back in one."""
    from torch.distributed.fsdp import fully_shard

    from muongrid.fsdp import FSDPMuon
    counts: dict = {}

    def worker(grid, comm, _):
        model = torch.nn.Sequential(*[torch.nn.Linear(s[1], s[0], bias=False) for s in SHAPES[:4]]).to(grid.device)
        fully_shard(model, mesh=grid.mesh["dp"])
        params = list(model.parameters())
        opt = FSDPMuon(params, grid, comm=comm)
        counts[grid.rank] = second_step_exchanges(opt, params, comm)

    simulate(worker, 2, 1, None, passes=2)
    assert {rank: dict(c) for rank, c in counts.items()} == {r: {p: 1 for p in EXCHANGES} for r in range(2)}
