"""A tensor-parallel step's host work is linear in the number of parameters (issue 42): a bucket of DTensor
parameters is packed and unpacked from its own parameters only (by default), or bound to its buffer by their
local shards (``param_buffers="all"``), never packed from every parameter of its group each step.

Counted, not timed: the Python calls into torch's DTensor package (``torch/distributed/tensor/``) during one
``step()`` on the meta device over the fake process group (``devicecheck.simulate``), with P = 16, 32 and 64
DTensor matrices split over TP = 2, one bucket each (before: 2P^2 + P ``to_local()`` calls, 15.7x from 16 to
64 matrices; now a few calls per parameter, bound or not).

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


def dtensor_calls(count: int, dp: int, layout: str, bind) -> dict:
    """rank -> (Python calls into DTensor's package in the second step, whether every bucket is bound)."""
    from torch.distributed.tensor import DTensor

    found = {}

    def worker(grid, comm, _):
        params = tp_params(grid, count)
        opt = DistributedMuon([dict(params=params, lr=0.02)], grid, comm=comm, layout=layout, bucket_numel=1000,
                              param_buffers=bind)

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
        storages = {s.params.untyped_storage()._cdata for row in opt.store.buffers for s in row
                    if s.params is not None}
        bound = all(p.to_local().untyped_storage()._cdata in storages for p in params)
        found[grid.rank] = (calls[0], bound, len(opt.plan.buckets[0]))

    simulate(worker, dp, 2, None)
    return found


@pytest.mark.parametrize("dp, layout, bind", [(1, "bucket", True), (1, "bucket", "all"), (2, "owner", True),
                                              (2, "owner", "all")])
def test_dtensor_calls_per_step_grow_linearly(dp, layout, bind):
    counts = {}
    for count in (16, 32, 64):
        found = dtensor_calls(count, dp, layout, bind)
        assert len(found) == dp * 2
        for rank, (calls, bound, buckets) in found.items():
            assert bound == (bind == "all"), (count, rank)   # local shards are views of the buffers, if asked
            assert buckets >= count, (count, buckets)    # one bucket per matrix: the case that was quadratic
        counts[count] = max(calls for calls, _, _ in found.values())
    assert counts[64] / counts[16] <= 4.5, counts
    # per parameter, a few calls bound (4 measured) or a few dozen packed (20): before, 240 at P = 16 and 944 at 64
    assert counts[16] <= (8 if bind == "all" else 32) * 16, counts
