"""No buffer of the store is allocated again in a steady-state step (issue 42), counted on the meta device.

The gradient buffers, this rank's reduce-scattered gradient shards and the bucket flow's gather buffers (the DP
gather in place in a pool of bf16 slots, the TP gathers into slots beside them) are made once, from the plan, when
the optimizer is built (``store.py``, ``flows.BucketFlow``). A ``TorchDispatchMode`` records every tensor an
op returns in new storage during ``step()``, outside Newton-Schulz (whose temporaries are its own), on 2x1 and
2x2 grids over the fake process group (``devicecheck.simulate``): none may have a store buffer's size (a bucket's
shard or padded size) in the first step or the second, nothing may be allocated by the collectives' wrappers
(``comm.py``), and two steps must gather into the same storages. Before, each step allocated five store-sized
tensors per rank here (the reduce-scatter shard and its NaN-step select, the bf16 send shard, the gathered
bucket, the AdamW bucket's shard). What remains per step is per matrix: the TP gather's join and slice
(``sharding.tp_unshard``/``tp_shard``) and the momentum's Nesterov look-ahead.

The owner, aligned and group layouts (``owner_flow.py``) make their routes (``owner_routes.py``), all-to-all send
and receive buffers, Newton-Schulz banks and, under "group", each member's block and its pieces of grouped
matrices when the optimizer is built (issue 53; before, at the first step): the same counts on 2x1 and 2x2 (a
matrix above the fair share, so the group layout makes a group), with buckets small enough to travel in several
chunks, must find after either step the storages there were before the first, and no store-sized or ``comm.py``
allocation in either step.

    python -m pytest -q tests/test_store_buffers.py
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from muongrid import DistributedMuon
from muongrid.lab.devicecheck import simulate
from muongrid.lab.stepcost import _caller, _is_view
from muongrid.sharding import tp_shard

SHAPES, TP_DIMS = [(36, 57), (45, 28), (33, 17), (20, 44), (8, 12)], [0, 1, -1, 1, 0]   # conftest's odd shapes


class NewStorage(TorchDispatchMode):
    """Every tensor an op returns in a storage none of its arguments had: (op, numel, where, in Newton-Schulz)."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not _is_view(func):
            known = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            where, in_ns = _caller()
            self.made += [(func.overloadpacket.__name__, t.numel(), where, in_ns) for t in tree_leaves(out)
                          if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in known]
        return out


GROUPED = [0]   # matrices the last plan gave a group


def kept(flow) -> list:
    """The storages a flow keeps between steps: the bucket flow's gather slots, or the owner flow's route buffers,
    banks and members' blocks (``kept_tensors``)."""
    tensors = flow.gathered + flow.tp_gathered if hasattr(flow, "gathered") else flow.kept_tensors()
    return sorted(t.untyped_storage()._cdata for t in tensors)


def two_steps(dp: int, tp: int, layout: str = "bucket", **options) -> dict:
    """rank -> (per step: the store-sized and the comm.py allocations, the kept storages), and the kept storages
    as the optimizer was built (under the key (rank, "built"))."""
    found = {}
    shapes, dims = (SHAPES, TP_DIMS) if layout == "bucket" else (SHAPES + [(96, 230)], TP_DIMS + [0])

    def worker(grid, comm, _):
        mats = [torch.nn.Parameter(tp_shard(torch.empty(s, device=grid.device), d, grid.tp, grid.tp_rank).clone())
                for s, d in zip(shapes, dims)]
        gains = [torch.nn.Parameter(torch.empty(n, device=grid.device)) for n in (57, 31)]
        opt = DistributedMuon([dict(params=mats, tp_split_dims=dims, lr=0.02),
                               dict(params=gains, use_muon=False, tp_split_dims=[-1, -1], lr=1e-3)],
                              grid, comm=comm, layout=layout, **options)
        GROUPED[0] = len(opt.plan.groups)
        sizes = {n for buckets in opt.plan.buckets for b in buckets for n in (b.shard_numel, b.padded_numel)}
        found[(grid.rank, "built")] = kept(opt.flow)
        steps = []
        for _ in range(2):
            for p in mats + gains:
                p.grad = torch.empty_like(p)
            with NewStorage() as mode:
                opt.step()
            made = [m for m in mode.made if not m[3]]
            slots = kept(opt.flow)
            steps.append(([m for m in made if m[1] in sizes], [m for m in made if m[2].startswith("muongrid/comm.py")],
                          slots))
        found[grid.rank] = steps

    simulate(worker, dp, tp, None)
    return found


@pytest.mark.parametrize("dp, tp", [(2, 1), (2, 2)])
def test_a_steady_state_step_allocates_no_store_buffer(dp, tp):
    found = two_steps(dp, tp)
    assert len(found) == 2 * dp * tp
    for rank, steps in ((r, s) for r, s in found.items() if isinstance(r, int)):
        for n, (store_sized, by_comm, _) in enumerate(steps, 1):
            assert store_sized == [], (rank, n, store_sized)
            assert by_comm == [], (rank, n, by_comm)
        assert steps[0][2] == steps[1][2] and len(steps[0][2]) >= 2, (rank, steps[0][2], steps[1][2])


@pytest.mark.parametrize("layout", ["owner", "aligned", "group"])
@pytest.mark.parametrize("dp, tp", [(2, 1), (2, 2)])
@pytest.mark.parametrize("ns_batch", [False, True])
def test_the_owner_layouts_keep_their_banks_and_exchange_buffers(layout, dp, tp, ns_batch):
    """The routes' buffers and the banks are made when the optimizer is built; neither step allocates anything
    store-sized but the momentum's Nesterov look-ahead (``updates.py``, per matrix as in torch.optim.Muon: with one
    matrix per bucket it has the shard's size) nor anything in ``comm.py``, and both move data through the
    storages made when it was built."""
    found = two_steps(dp, tp, layout, bucket_numel=4000, ns_batch=ns_batch)
    assert len(found) == 2 * dp * tp
    for rank, steps in ((r, s) for r, s in found.items() if isinstance(r, int)):
        for n, (store_sized, by_comm, slots) in enumerate(steps, 1):
            assert [m for m in store_sized if not m[2].startswith("muongrid/updates.py")] == [], (rank, n, store_sized)
            assert by_comm == [], (rank, n, by_comm)
            assert slots == found[(rank, "built")] and len(slots) >= 4, (rank, n, slots, found[(rank, "built")])
    assert (layout == "group") == (GROUPED[0] > 0)   # the group layout did make a group


def test_gloo_reduce_scatter_sums_in_rank_order_into_a_kept_receive_buffer():
    """On gloo ``Comm`` runs a reduce-scatter as an all-to-all and adds the arrived rows itself (``comm.py``): in
    rank order, as a one-process sum of the ranks' gradients adds them (three fp32 rows whose sum depends on the
    order), into a receive buffer kept per gradient buffer, so a steady-state step allocates none; any other
    caller's buffer is its own."""
    from muongrid.comm import Comm, Phase, _sum_arrived
    from muongrid.grid import Grid

    gen = torch.Generator().manual_seed(0)
    big, small = torch.randn(1000, generator=gen) * 1e7, torch.randn(1000, generator=gen)
    rows = [big, -big, small]   # in rank order the bigs cancel exactly; the other way round they round small away
    shard = torch.empty(1000)
    _sum_arrived(torch.cat(rows), shard, 3)
    assert torch.equal(shard, rows[0] + rows[1] + rows[2])
    assert not torch.equal(shard, rows[2] + rows[1] + rows[0])   # the order matters for these values: it is pinned
    comm = Comm(Grid.single())
    grads, other = torch.zeros(12), torch.zeros(12)
    first = comm._arrival(grads, Phase.GRAD_REDUCE_SCATTER)
    assert comm._arrival(grads, Phase.GRAD_REDUCE_SCATTER) is first
    assert comm._arrival(other, Phase.GRAD_REDUCE_SCATTER) is not first
    assert comm._arrival(grads, "measure") is not first
    comm.close()
