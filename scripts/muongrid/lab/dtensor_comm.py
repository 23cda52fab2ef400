"""Counting what DTensor moves implicitly: collectives and ring bytes of a region, like our ledger counts ours.

``torch.distributed.tensor.debug.CommDebugMode`` counts the collectives a DTensor program issues (how
many of each op). ``CountingCommMode`` is that mode, also recording each collective's input and group,
so the bytes can be put on the ledger's footing (``comm.ring_bytes``: what one rank sends as a ring
algorithm moves it):

* all-gather of an ``s``-element input over ``n`` ranks: ``(n-1)*s``;
* reduce-scatter of an ``f``-element input: ``(n-1)*f/n``; all-reduce of ``t`` elements: ``2*(n-1)*ceil(t/n)``;
* all-to-all: the input minus the part kept (``(n-1)/n`` of it, for equal splits); broadcast: the tensor.

    with CountingCommMode() as mode:
        torch_muon.step()
    mode.get_total_counts(), mode.bytes_sent(), mode.by_op()

Used by ``scripts/train.py --compare-torch-muon`` to count what ``torch.optim.Muon`` gathers inside
Newton-Schulz when its parameters are FSDP2 DTensors.
"""
from __future__ import annotations

import torch
from torch.distributed.tensor.debug import CommDebugMode

from ..comm import ring_bytes

_F = torch.ops._c10d_functional
# native functional collective -> (ledger op name, index of the group name in its arguments)
OPS = {_F.all_gather_into_tensor: ("all_gather", 2), _F.all_reduce: ("all_reduce", 2),
       _F.reduce_scatter_tensor: ("reduce_scatter", 3), _F.all_to_all_single: ("all_to_all", 3),
       _F.broadcast: ("broadcast", 2)}


def _group_size(name) -> int:
    from torch.distributed.distributed_c10d import _resolve_process_group
    return _resolve_process_group(name).size()


class CountingCommMode(CommDebugMode):
    """CommDebugMode that also keeps (op, group size, elements, dtype) of every functional collective."""

    def __init__(self):
        super().__init__()
        self.records: list[tuple[str, int, int, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is not NotImplemented and not isinstance(func, torch._ops.HigherOrderOperator):
            kind = OPS.get(func._overloadpacket)
            if kind is not None:
                op, where = kind
                t = args[0]
                self.records.append((op, _group_size(args[where]), t.numel(), t.dtype))
        return out

    def bytes_sent(self) -> int:
        """Bytes one rank sends in the recorded collectives, as a ring algorithm moves them."""
        total = 0
        for op, n, numel, dtype in self.records:
            if op == "reduce_scatter":
                numel = numel // n
            elif op == "all_reduce":
                numel = -(-numel // n)
            elif op == "all_to_all":
                numel = numel - numel // n
            total += ring_bytes(op, n, numel, dtype.itemsize)
        return total

    def by_op(self) -> dict:
        out: dict = {}
        for op, n, _, _ in self.records:
            out[op] = out.get(op, 0) + 1
        return out
