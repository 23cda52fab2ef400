"""A tensor-parallel step's host work is linear in the number of parameters (issue 42): DTensor parameters are
bound to their bucket's buffer (their local shards become views of it), so nothing packs or unpacks a bucket
from every parameter of its group each step.

Counted, not timed: the Python calls into torch's DTensor package (``torch/distributed/tensor/``) during one
``step()`` on the meta device over the fake process group (``devicecheck.simulate``), with P = 16, 32 and 64
DTensor matrices split over TP = 2, one bucket each (before: 2P^2 + P ``to_local()`` calls, 15.7x from 16 to
64 matrices; now a few calls per parameter).

    python -m pytest -q tests/test_tp_host_work.py
"""
from __future__ import annotations

import sys

import pytest
import torch

from muongrid import DistributedMuon
from muongrid.lab.devicecheck import simulate

DTENSOR_CODE = "/torch/distributed/tensor/"


def tp_params(grid, count: int) -> list:
    """``count`` DTensor matrices on the grid's "tp" mesh, split by rows or by columns in turn."""
    from torch.distributed.tensor import DTensor, Shard

    out = []
    for k in range(count):
        full, dim = (64 + 2 * (k % 3), 48), k % 2
        shape = tuple(n // grid.tp if d == dim else n for d, n in enumerate(full))
        local = torch.empty(shape, device=grid.device)
        out.append(torch.nn.Parameter(DTensor.from_local(local, grid.mesh["tp"], [Shard(dim)], shape=full,
                                                         stride=(full[1], 1))))
    return out


def dtensor_calls(count: int, dp: int, layout: str) -> dict:
    """rank -> (Python calls into DTensor's package in the second step, whether every bucket is bound)."""
    from torch.distributed.tensor import DTensor

    found = {}

    def worker(grid, comm, _):
        params = tp_params(grid, count)
        opt = DistributedMuon([dict(params=params, lr=0.02)], grid, comm=comm, layout=layout, bucket_numel=1000)

        def give():
            for p in params:
                p.grad = DTensor.from_local(torch.empty_like(p.to_local()), p.device_mesh, p.placements,
                                            shape=p.shape, stride=p.stride())
        give()
        opt.step()
        give()
        calls = [0]

        def profile(frame, event, arg):
            if event == "call" and DTENSOR_CODE in frame.f_code.co_filename.replace("\\", "/"):
                calls[0] += 1
        sys.setprofile(profile)
        try:
            opt.step()
        finally:
            sys.setprofile(None)
        storages = {s.params.untyped_storage()._cdata for row in opt.buffers.slots for s in row
                    if s.params is not None}
        bound = all(p.to_local().untyped_storage()._cdata in storages for p in params)
        found[grid.rank] = (calls[0], bound, len(opt.plan.buckets[0]))

    simulate(worker, dp, 2, None)
    return found


@pytest.mark.parametrize("dp, layout", [(1, "bucket"), (2, "owner")])
def test_dtensor_calls_per_step_grow_linearly(dp, layout):
    counts = {}
    for count in (16, 32, 64):
        found = dtensor_calls(count, dp, layout)
        assert len(found) == dp * 2
        for rank, (calls, bound, buckets) in found.items():
            assert bound, (count, rank)                  # every local shard is a view of its bucket's buffer
            assert buckets >= count, (count, buckets)    # one bucket per matrix: the case that was quadratic
        counts[count] = max(calls for calls, _, _ in found.values())
    assert counts[64] / counts[16] <= 4.5, counts
    assert counts[16] <= 8 * 16, counts                  # a few calls per parameter, not per pair of them
