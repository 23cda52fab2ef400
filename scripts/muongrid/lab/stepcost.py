"""What one optimizer step costs a GPU, counted on the ``meta`` device: bytes moved, aten ops, copies, host syncs.

A GPU step of an optimizer is memory traffic and kernel launches more than FLOPs: on Llama-1B shapes torch's
Muon and ours spend the same ~80 ms in Newton-Schulz matmuls on an H100, and the rest of the step is
elementwise passes, copies and host syncs (``../shared/gpu/h100-2026-11-26``). Those can be counted without a
GPU. ``StepCost`` is a ``TorchDispatchMode``: it sees every aten op one ``step()`` dispatches on tensors of the
``meta`` device (shapes and dtypes, no data, nothing computed, so real model shapes count in seconds) and
records, per op:

* **bytes**: each tensor argument the op's schema marks as written counts as written, every other tensor
  argument as read; an in-place op reads what it writes too, except the write-only ones (``copy_``, ``fill_``,
  ``zero_``); an op that writes no argument writes its outputs. Views (ops that return an alias and write
  nothing) move no bytes and are counted apart, ``detach`` among them;
* **copies**: ops that only move or cast data (``copy_``, ``clone``, ``cat``, ``stack``, ``_to_copy``, fills,
  ``where``, ...): their written bytes are the step's copy traffic;
* **host syncs**: reading a value back (``.item()``, ``bool(t)``, ``.tolist()``, ``torch.equal``), a copy from
  the device to the host that is not ``non_blocking``, and a blocking copy from the host to the device (on CUDA
  ``copy_kernel_cuda`` then synchronises the stream). Each stalls the host until the GPU catches up. On
  ``meta`` a read returns a stand-in (``devicecheck``'s "all is well" values);
* **where**: ops inside Newton-Schulz (a ``zeropower`` function on the call stack: ours, or torch.optim.Muon's
  ``_zeropower_via_newtonschulz``) are counted apart, so the traffic around Newton-Schulz can be compared;
* **host scalars**: ops on 0-d CPU tensors (step counters) run on the host, not the GPU: counted apart.

Foreach ops count as one op (a GPU launches one kernel per chunk of tensors); the schema of ``_fused_adamw_``
marks its gradients as written (a few percent too many bytes on torch's side: conservative for a comparison).
What this cannot see: kernel fusion inside one op, caching-allocator behaviour, real timings. The H100 record
found this count predicts the measured gap in step time within 5%.

    cost = measure(lambda: opt.step())          # one step, after a warm-up call
    print(cost.summary())

Used by ``scripts/step_bench.py`` and ``tests/test_step_cost.py``.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten
GiB = 2**30

COPY_OPS = {"copy_", "clone", "cat", "stack", "_to_copy", "fill_", "zero_", "zeros", "zeros_like", "full",
            "full_like", "new_zeros", "where", "_foreach_copy_", "_foreach_zero_", "index_put_", "index",
            "constant_pad_nd", "contiguous", "masked_fill_", "masked_fill", "index_select", "split_with_sizes_copy"}
ALLOCS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}   # allocate, move nothing
WRITE_ONLY = {"copy_", "fill_", "zero_", "_foreach_copy_", "_foreach_zero_", "masked_fill_"}
READS = {aten._local_scalar_dense.default, aten.equal.default, aten.nonzero.default, aten.is_nonzero.default}
NS_FUNCTIONS = ("zeropower", "_zeropower_via_newtonschulz", "_gram_iterations", "_standard_iterations")


@dataclass
class Op:
    name: str
    written: int
    read: int
    copy: bool
    in_ns: bool
    host: bool
    where: str
    watched: int = 0   # bytes written into the watched storages (``StepCost(watch=...)``)


@dataclass
class Cost:
    """The ops of one counted region, with their sums (``summary``)."""

    ops: list = field(default_factory=list)     # non-view ops (Op)
    views: int = 0
    detach: int = 0
    syncs: list = field(default_factory=list)   # (op, where)

    def device_ops(self) -> list:
        return [o for o in self.ops if not o.host]

    def summary(self) -> dict:
        ops = self.device_ops()
        out_ns = [o for o in ops if not o.in_ns]
        return dict(
            ops=len(ops), ns_ops=sum(o.in_ns for o in ops), host_scalar_ops=len(self.ops) - len(ops),
            written_gib=sum(o.written for o in ops) / GiB, read_gib=sum(o.read for o in ops) / GiB,
            bytes_gib=sum(o.written + o.read for o in ops) / GiB,
            outside_ns_gib=sum(o.written + o.read for o in out_ns) / GiB,
            copy_ops=sum(o.copy for o in ops), copy_written_gib=sum(o.written for o in ops if o.copy) / GiB,
            views=self.views, detach=self.detach, syncs=len(self.syncs))

    def by_place(self, top: int = 12) -> list[tuple[str, int, float]]:
        """(where, ops, GiB written + read) of the places outside Newton-Schulz that move the most bytes."""
        places: dict[str, list] = {}
        for o in self.device_ops():
            if not o.in_ns:
                p = places.setdefault(o.where, [0, 0])
                p[0] += 1
                p[1] += o.written + o.read
        return sorted(((w, n, b / GiB) for w, (n, b) in places.items()), key=lambda x: -x[2])[:top]


def _bytes(value) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(value) if isinstance(t, torch.Tensor))


def _caller() -> tuple[str, bool]:
    """The innermost frame of muongrid, an entry point or torch.optim that led here, and whether a
    Newton-Schulz function is on the stack."""
    frame, where, in_ns = sys._getframe(1), None, False
    while frame is not None:
        code = frame.f_code
        if code.co_name.startswith(NS_FUNCTIONS) or code.co_name in NS_FUNCTIONS:
            in_ns = True
        path = code.co_filename.replace("\\", "/")
        if where is None and ("/scripts/" in path or "/torch/optim/" in path) and "stepcost.py" not in path:
            short = path.split("/scripts/")[-1] if "/scripts/" in path else "torch/optim/" + path.split("/torch/optim/")[-1]
            where = f"{short}:{frame.f_lineno} ({code.co_name})"
        frame = frame.f_back
    return where or "?", in_ns


VIEWS = {aten._unsafe_view.default, aten.alias.default}   # views whose schema does not say so


def _is_view(func) -> bool:
    if func in VIEWS:
        return True
    schema = func._schema
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    return not writes and any(r.alias_info is not None for r in schema.returns)


def _sync(func, args, kwargs) -> bool:
    """Whether this op makes the host wait for the device (see the module docstring)."""
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    on_device = [t for t in tensors if t.device.type != "cpu"]
    if func in READS:
        return bool(on_device)
    if func is aten._to_copy.default and kwargs.get("device") is not None:
        to, src = torch.device(kwargs["device"]), args[0].device
        if to.type != src.type and not kwargs.get("non_blocking", False):
            return (src.type != "cpu") or args[0].dim() > 0   # to the host, or a blocking copy of a host tensor
    if func is aten.copy_.default:
        dst, src = args[0], args[1]
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        if dst.device.type != src.device.type and not non_blocking:
            return src.device.type != "cpu" or src.dim() > 0
    return False


class StepCost(TorchDispatchMode):
    """Counts every op dispatched under it into ``self.cost`` (see the module docstring)."""

    def __init__(self, watch: set | None = None):
        super().__init__()
        self.cost, self.watch = Cost(), watch or set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if _sync(func, args, kwargs):
            self.cost.syncs.append((name, _caller()[0]))
            if any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in tree_leaves((args, kwargs))):
                return _stand_in(func, args, kwargs)
        if _off_meta(func, args, kwargs):   # a non-blocking copy to the host: no sync, but nothing to copy
            return _stand_in(func, args, kwargs)
        out = func(*args, **kwargs)
        if _is_view(func):
            self.cost.views += 1
            self.cost.detach += func is aten.detach.default
            return out
        schema, written, read, watched = func._schema, 0, 0, 0
        values = list(args) + [kwargs.get(a.name) for a in schema.arguments[len(args):]]
        for arg, value in zip(schema.arguments, values):
            n = _bytes(value)
            if arg.alias_info is not None and arg.alias_info.is_write:
                written += n
                watched += _bytes([t for t in tree_leaves(value) if isinstance(t, torch.Tensor)
                                   and t.untyped_storage()._cdata in self.watch])
                read += 0 if name in WRITE_ONLY or arg.name.startswith("out") else n
            else:
                read += n
        if name in ALLOCS:
            written = read = 0
        elif not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            written += _bytes(out)
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        host = bool(tensors) and all(t.device.type == "cpu" and t.dim() == 0 for t in tensors)
        where, in_ns = _caller()
        self.cost.ops.append(Op(name, written, read, name in COPY_OPS, in_ns, host, where, watched))
        return out


def _off_meta(func, args, kwargs) -> bool:
    """A copy from the meta device to the host (which meta cannot do)."""
    if func is aten.copy_.default:
        return args[1].device.type == "meta" and args[0].device.type == "cpu"
    if func is aten._to_copy.default and kwargs.get("device") is not None:
        return args[0].device.type == "meta" and torch.device(kwargs["device"]).type == "cpu"
    return False


def _stand_in(func, args, kwargs):
    """A value for a read off the meta device ("all is well": flags true, values zero)."""
    if func is aten.copy_.default:
        return args[0]
    from .devicecheck import DeviceAudit
    return DeviceAudit._stand_in(func, args, kwargs)


def measure(step, warmup: int = 1) -> Cost:
    """Call ``step()`` ``warmup`` times (lazy state is made then), then once under ``StepCost``."""
    for _ in range(warmup):
        with StepCost():   # the stand-ins for reads are needed in the warm-up too
            step()
    with StepCost() as mode:
        step()
    return mode.cost


def measure_grid(model: str, dp: int, layout: str = "owner", ns_batch: bool = True, fresh_grads: bool = True,
                 layers: int | None = None) -> dict:
    """Each rank's second step of ``DistributedMuon`` on a ``dp`` x 1 grid, on ``meta``, over the fake process
    group (``devicecheck.simulate``): rank -> ``Cost``. ``fresh_grads``: every step's gradients are new tensors
    (a loop that zeroes with ``set_to_none=True``, torch's default); else they are zeroed in place, so backward
    writes into the optimizer's gradient buffers (``store.py``)."""
    from ..distributed import DistributedMuon
    from .devicecheck import simulate
    from .stepmodels import hybrid_tp_groups, named_params

    costs = {}

    def worker(grid, comm, _):
        named = named_params(model, grid.device, layers)
        opt = DistributedMuon(hybrid_tp_groups(model, named), grid, comm=comm, layout=layout, ns_batch=ns_batch)
        opt.step()
        if fresh_grads:
            for _, p in named:
                p.grad = torch.empty_like(p)
        else:
            opt.zero_grad(set_to_none=False)
        with StepCost() as mode:
            opt.step()
        costs[grid.rank] = mode.cost

    simulate(worker, dp, 1, None)
    return costs


def measure_landing(model: str, dp: int, tp: int = 1, set_to_none: bool = True, layers: int | None = None,
                    layout: str = "owner", ns_batch: bool = True) -> dict:
    """Each rank's second step of ``DistributedMuon`` on a ``dp`` x ``tp`` grid on ``meta`` (the fake process group
    when more than one rank), with a real backward before it, so the gradient hooks run (``store.py``); the
    loop zeroes with ``zero_grad(set_to_none=...)`` (not counted: torch's loop does the same). Returns rank ->
    dict(step=Cost of ``step()``, hook=Cost of the optimizer's own ops during backward, grad_copied=bytes copied
    into the optimizer's gradient buffers by both, hook_copied=those the hooks copied, grad_bytes=this rank's
    gradient bytes)."""
    from ..distributed import DistributedMuon
    from ..grid import Grid
    from .devicecheck import simulate
    from .stepmodels import hybrid_tp_groups, named_params

    out = {}

    def worker(grid, comm, _):
        named = named_params(model, grid.device, layers, tp=grid.tp)
        opt = DistributedMuon(hybrid_tp_groups(model, named, grid.tp), grid, comm=comm, layout=layout, ns_batch=ns_batch)
        weights = {n: torch.empty_like(p) for n, p in named}

        def loss():   # a gradient of its own for every parameter, made by autograd
            return sum((p * weights[n]).sum() for n, p in named)

        for step in (1, 2):
            opt.zero_grad(set_to_none=set_to_none)
            total = loss()
            watch = {s.grads.untyped_storage()._cdata for row in opt.store.buffers for s in row
                     if s.grads is not None}
            with StepCost(watch) as backward:
                total.backward()
            with StepCost(watch) as step_cost:
                opt.step()
        hook = Cost(ops=[o for o in backward.cost.ops if o.where.startswith("muongrid/") and "/lab/" not in o.where])
        by_hook, by_step = (sum(o.watched for o in ops if o.copy) for ops in (hook.ops, step_cost.cost.ops))
        out[grid.rank] = dict(step=step_cost.cost, hook=hook, grad_copied=by_hook + by_step, hook_copied=by_hook,
                              grad_bytes=sum(p.numel() * p.element_size() for _, p in named))

    if dp * tp == 1:
        worker(Grid.single("meta"), None, None)
    else:
        simulate(worker, dp, tp, None)
    return out


def persistent_bytes(model: str, dp: int, tp: int = 1, layout: str = "bucket", layers: int | None = None) -> dict:
    """What rank 0 keeps between steps beside its parameters, in bytes per byte of its (TP-local, fp32)
    parameters, by kind: the gradient buffers, the reduce-scattered gradient shards, the bucket flow's gather
    slots (``flows.BucketFlow``), the owner flows' exchange buffers (both all-to-alls' send and receive buffers,
    grouped matrices' blocks and pieces, and the bf16 banks of every matrix rank 0 owns, made when it is built:
    ``owner_flow.py``) and the optimizer state (momentum; AdamW's moments). Counted on ``meta``."""
    from ..distributed import DistributedMuon
    from .devicecheck import simulate
    from .stepmodels import hybrid_tp_groups, named_params

    out = {}

    def nbytes(tensors) -> int:
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def worker(grid, comm, _):
        if grid.rank:
            return
        named = named_params(model, grid.device, layers, tp=grid.tp)
        opt = DistributedMuon(hybrid_tp_groups(model, named, grid.tp), grid, comm=comm, layout=layout,
                              ns_batch=layout != "bucket")
        buffers = [b for row in opt.store.buffers for b in row]
        state = [t for row in opt.store.shards for shard in row for k, t in shard.items() if k != "master"]
        flow = opt.flow   # the owner layouts' routes' buffers and banks: every owned matrix whole, in bf16
        exchange = nbytes(flow.kept_tensors()) if hasattr(flow, "kept_tensors") else 0
        kinds = dict(gradient_buffers=nbytes(b.grads for b in buffers),
                     gradient_shards=nbytes(b.grad_shard for b in buffers),
                     gather_slots=nbytes(getattr(flow, "gathered", []) + getattr(flow, "tp_gathered", [])),
                     exchange_buffers=exchange,
                     optimizer_state=nbytes(state), separate_masters=opt.state_bytes()["master"])
        params = sum(p.numel() * 4 for _, p in named)
        out.update({k: v / params for k, v in kinds.items()})

    simulate(worker, dp, tp, None)
    return out


def param_bytes(model: str, layers: int | None = None) -> int:
    """Bytes of the model's parameters in fp32 (what one rank holds under ZeRO-1)."""
    from .stepmodels import named_params
    return sum(p.numel() * 4 for _, p in named_params(model, "meta", layers))
