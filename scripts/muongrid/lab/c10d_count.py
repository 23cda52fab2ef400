"""Every collective a process runs, counted where torch dispatches it: ours, DDP's and ZeroRedundancyOptimizer's alike.

Our optimizers write each collective into their ledger (``comm.py``); torch's paths do not: DDP's reducer all-reduces
its gradient buckets from C++ during backward, and ``ZeroRedundancyOptimizer`` broadcasts each parameter from its
owner. All of them reach the dispatcher as ``c10d`` ops (``c10d.allreduce_``, ``c10d.broadcast_``,
``c10d._reduce_scatter_base_``, ``c10d._allgather_base_``, ``c10d.alltoall_base_``, ...), and a
``TorchDispatchMode`` sees each one with its tensors and process group (measured on torch 2.13, gloo: DDP's bucket
all-reduce is seen from backward). ``C10dCounter`` records them and prices each as the ledger does
(``comm.ring_bytes``: the bytes one rank sends in a ring algorithm; a broadcast charges every rank its tensor), so a
count of our optimizer equals its ledger plus the step's one ballot all-reduce (phase "contract").

    with C10dCounter() as seen:
        seen.stage = "backward"; loss.backward()
        seen.stage = "step"; opt.step()
    seen.summary()    # {"calls": 3, "bytes": ..., "by_stage": {...}, "by_op": {...}}

The mode sends every op of the process through Python, which is slow: count on an iteration set apart, never a
timed one. Nothing here is imported by the engine.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ..comm import ring_bytes

# c10d op -> (the ring op it is priced as, the argument whose elements are this rank's shard)
OPS = {
    "allreduce_": ("all_reduce", "tensors"),
    "allreduce_coalesced_": ("all_reduce", "tensors"),
    "broadcast_": ("broadcast", "tensors"),
    "_reduce_scatter_base_": ("reduce_scatter", "output_tensor"),
    "reduce_scatter_": ("reduce_scatter", "output_tensors"),
    "_allgather_base_": ("all_gather", "input_tensor"),
    "allgather_": ("all_gather", "input_tensors"),
    "allgather_into_tensor_coalesced_": ("all_gather", "inputs"),
    "alltoall_base_": ("all_to_all", "input"),
    "barrier": ("barrier", None),
}


@dataclass
class Call:
    stage: str
    op: str           # the ring op: all_reduce, broadcast, reduce_scatter, all_gather, all_to_all, barrier
    c10d: str         # the dispatcher's name
    dtype: str
    numel: int        # this rank's elements as the ledger counts them (an all-reduce: the whole tensor)
    group_size: int
    bytes_sent: int


def _numel(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    return sum(_numel(v) for v in value) if isinstance(value, (list, tuple)) else 0


def _dtype(value) -> str:
    if isinstance(value, torch.Tensor):
        return str(value.dtype).replace("torch.", "")
    return next((_dtype(v) for v in value if _dtype(v)), "") if isinstance(value, (list, tuple)) else ""


def price(c10d: str, named: dict) -> Call:
    """One dispatched collective as a ``Call`` (stage left empty). ``named``: its arguments by schema name."""
    ring, shard_arg = OPS[c10d]
    pg = dist.ProcessGroup.unbox(named["process_group"]) if "process_group" in named else None
    size = pg.size() if pg is not None else dist.get_world_size()
    if ring == "barrier":
        return Call("", ring, c10d, "", 0, size, 0)
    shard = named[shard_arg]
    dtype, numel = _dtype(shard), _numel(shard)
    itemsize = getattr(torch, dtype).itemsize
    if ring == "all_to_all":
        splits = list(named.get("input_split_sizes") or [])
        me = pg.rank()
        sent = sum(splits) - splits[me] if splits else numel - numel // size
        return Call("", ring, c10d, dtype, sent, size, sent * itemsize)
    if ring == "all_reduce":   # the ledger's all-reduce shard: ceil(elements / ranks)
        return Call("", ring, c10d, dtype, numel, size, ring_bytes(ring, size, -(-numel // size), itemsize))
    return Call("", ring, c10d, dtype, numel, size, ring_bytes(ring, size, numel, itemsize))


class C10dCounter(TorchDispatchMode):
    """Records every ``c10d`` op dispatched while it is active, under the caller's current ``stage``."""

    def __init__(self):
        super().__init__()
        self.calls: list[Call] = []
        self.stage = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        namespace, _, rest = str(func).partition(".")
        if namespace == "c10d":
            name = rest.split(".")[0]
            if name not in OPS:
                raise NotImplementedError(f"c10d op {func} is not priced in lab/c10d_count.py: add it to OPS")
            schema = [a.name for a in func._schema.arguments]
            named = dict(zip(schema, args))
            named.update(kwargs)
            call = price(name, named)
            call.stage = self.stage
            self.calls.append(call)
        return func(*args, **kwargs)

    def summary(self) -> dict:
        """Calls and bytes sent, in total, by stage and by op (with the elements, for all-reduces the buckets)."""
        out = dict(calls=len(self.calls), bytes=sum(c.bytes_sent for c in self.calls), by_stage={}, by_op={})
        for c in self.calls:
            for key, table in ((c.stage, out["by_stage"]), (c.op, out["by_op"])):
                row = table.setdefault(key, dict(calls=0, bytes=0))
                row["calls"] += 1
                row["bytes"] += c.bytes_sent
        return out

    def numels(self, op: str, stage: str | None = None) -> list[int]:
        """The elements of each ``op`` call (of ``stage``), in the order they ran: e.g. DDP's bucket sizes."""
        return [c.numel for c in self.calls if c.op == op and (stage is None or c.stage == stage)]
