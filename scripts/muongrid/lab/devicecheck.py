"""Run muongrid's code for every rank of a grid in one process, on the ``meta`` device, and record what a GPU would reject.

No GPU is needed. Every rank of a DP x TP grid is simulated in turn over torch's ``fake`` process group
(its collectives return at once without communicating, so one process can play rank after rank), with
the grid's device set to ``meta`` (tensors with shapes and dtypes but no data: nothing is computed). A
``TorchDispatchMode`` sees every aten and c10d operation and records

* ``off_device``: a collective handed a tensor that is not on the grid's device (NCCL raises on a CPU
  tensor; the fake group, like gloo, would not notice);
* ``mixed``: an operation that mixes tensors of two devices (a CPU scalar, a 0-d tensor, is allowed,
  as on CUDA);
* ``collectives``: every collective, per optimizer step, and whether it ran on host tensors (a gloo group
  beside NCCL would: the step makes none);
* ``syncs``: host syncs on a tensor of the grid's device (``.item()``, ``bool(t)``, ``.tolist()``,
  ``torch.equal``, a copy to the CPU), counted per step of a muongrid optimizer. On a GPU each one stalls
  the CPU until the device has caught up, so the engine allows at most one per step.

Reading a value off the meta device is impossible, so a host sync returns a stand-in (True, 1, zeros):
code that branches on values takes the "all is well" path. ``Comm.gather_objects`` (reports, the FSDP
owner table) does not communicate either: each rank gets its own object for everyone's, or, with
``passes=2``, the objects every rank contributed in a first pass. Three things torch needs for this are
lent for the run and given back: a ``torch.meta`` device module (CPU stand-ins), FSDP2's refusal to
train meta parameters switched off, and DTensor's sharding cache cleared between ranks (meshes of
different ranks compare equal, so a cached decision would carry the previous rank's coordinates).

    audit = simulate(worker, dp=2, tp=2, args=args)     # runs worker(grid, comm, args) for each rank
    assert audit.problems(sync_budget=1) == []

Used by tests/test_meta_device.py.
"""
from __future__ import annotations

import collections
import contextlib
import itertools
import sys
import weakref
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten
SYNC_OPS = {aten._local_scalar_dense.default, aten.equal.default, aten.nonzero.default, aten.is_nonzero.default}


def _where() -> str:
    """The innermost frame of muongrid or an entry point that led here (what a finding points at)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if "/scripts/" in path and "devicecheck.py" not in path:
            return f"{path.split('/scripts/')[-1]}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "?"


@dataclass
class Audit:
    """What the dispatch mode saw, over every simulated rank."""

    device: torch.device
    off_device: list = field(default_factory=list)   # (rank, op, devices, where)
    mixed: list = field(default_factory=list)        # (rank, op, devices, where)
    syncs: list = field(default_factory=list)        # (rank, step or None, op, where)
    collectives: list = field(default_factory=list)  # (rank, step or None, op, on the host: every tensor on the CPU)
    steps: int = 0                                   # optimizer steps seen (all ranks)
    rank: int = 0
    _step: object = None

    def syncs_per_step(self) -> dict:
        """(rank, step) -> host syncs inside that optimizer step."""
        return collections.Counter((r, s) for r, s, _, _ in self.syncs if s is not None)

    def collectives_per_step(self, on_host: bool) -> dict:
        """(rank, step) -> collectives inside that optimizer step, on host tensors (``on_host``) or on the device."""
        return collections.Counter((r, s) for r, s, _, h in self.collectives if s is not None and h == on_host)

    def problems(self, sync_budget: int = 1) -> list[str]:
        """Every finding, one line each; empty when the run is device-correct within the budget."""
        out = [f"rank {r}: collective {op} got a tensor on {d} (grid device {self.device}) at {w}"
               for r, op, d, w in self.off_device]
        out += [f"rank {r}: {op} mixes devices {d} at {w}" for r, op, d, w in self.mixed]
        over = {k: n for k, n in self.syncs_per_step().items() if n > sync_budget}
        for (r, s), n in sorted(over.items(), key=lambda kv: str(kv[0])):
            where = sorted({w for rr, ss, _, w in self.syncs if (rr, ss) == (r, s)})
            out.append(f"rank {r}: {n} host syncs in optimizer step {s} (budget {sync_budget}) at {where}")
        return out


class DeviceAudit(TorchDispatchMode):
    """Records off-device collectives, mixed-device ops and host syncs into ``audit`` (see the module docstring)."""

    def __init__(self, audit: Audit):
        super().__init__()
        self.audit = audit

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        a = self.audit
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        name = str(func)
        if name.startswith("c10d."):
            a.collectives.append((a.rank, a._step, name, bool(tensors) and all(t.device.type == "cpu" for t in tensors)))
            off = sorted({str(t.device) for t in tensors if t.device != a.device})
            if off:
                a.off_device.append((a.rank, name, off, _where()))
        elif func is not aten.copy_.default:   # a copy is the one op meant to span devices
            devices = {str(t.device) for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}
            if len(devices) > 1:
                a.mixed.append((a.rank, name, sorted(devices), _where()))
        on_device = [t for t in tensors if t.device.type != "cpu"]
        to_host = (func is aten._to_copy.default and bool(on_device) and kwargs.get("device") is not None
                   and torch.device(kwargs["device"]).type == "cpu")
        copy_to_host = (func is aten.copy_.default and args[0].device.type == "cpu" and args[1].device.type != "cpu"
                        and args[1].dim() > 0)
        if copy_to_host:   # non-blocking (pinned memory on a GPU) is no sync; meta has nothing to copy either way
            if not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False)):
                a.syncs.append((a.rank, a._step, name, _where()))
            if args[1].device.type == "meta":
                return args[0]
        if (func in SYNC_OPS and on_device) or to_host:
            a.syncs.append((a.rank, a._step, name, _where()))
            if any(t.device.type == "meta" for t in on_device):
                return self._stand_in(func, args, kwargs)
        if func is torch.ops.c10d.alltoall_base_.default and args[1].numel() == 0:
            # The fake group copies from the input to fill the output and refuses an empty input that a real
            # group accepts (a rank that sends nothing but receives): hand it one dummy element instead.
            args = list(args)
            args[1] = torch.empty(1, dtype=args[1].dtype, device=args[1].device)
            args[4] = [1] + [0] * (len(args[4]) - 1) if args[4] else []
        return func(*args, **kwargs)

    @staticmethod
    def _stand_in(func, args, kwargs):
        """A value for a read off the meta device: the 'all is well' answer."""
        if func is aten._to_copy.default:  # flags (bool/int: "present", "finite") read as 1, values as 0
            dtype = kwargs.get("dtype") or args[0].dtype
            fill = torch.ones if dtype == torch.bool or not (dtype.is_floating_point or dtype.is_complex) else torch.zeros
            return fill(args[0].shape, dtype=dtype)
        if func is aten._local_scalar_dense.default:
            return True if args[0].dtype == torch.bool else 1.0 if args[0].is_floating_point() else 1
        if func is aten.nonzero.default:
            return torch.zeros((0, args[0].dim()), dtype=torch.long, device=args[0].device)
        return True


class _MetaHandle:
    """What DTensor and FSDP2 ask of ``torch.<device type>`` (device count, current device, streams), for ``meta``:
    torch's CPU stand-ins (streams and events that do nothing), with device index 0."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def device_count() -> int:
        return 1


def _is_muongrid(opt) -> bool:
    return type(opt).__module__.startswith("muongrid")


@contextlib.contextmanager
def _meta_patches(device: str):
    """What running on ``meta`` needs from torch, lent for the run and given back after: a device module
    ``torch.meta`` (DTensor and FSDP2 look theirs up as ``torch.<type>``), and FSDP2's refusal to train
    parameters on meta switched off (they are never filled in; here that is the point)."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    if device != "meta":
        yield
        return
    had_handle, no_meta_check = hasattr(torch, "meta"), FSDPParamGroup._validate_no_meta_params
    if not had_handle:
        torch.meta = _MetaHandle()
    FSDPParamGroup._validate_no_meta_params = lambda self: None
    try:
        yield
    finally:
        FSDPParamGroup._validate_no_meta_params = no_meta_check
        if not had_handle:
            del torch.meta


def simulate(worker, dp: int, tp: int, args, device: str = "meta", passes: int = 1) -> Audit:
    """Run ``worker(grid, comm, args)`` for every rank of a ``dp`` x ``tp`` grid on ``device`` over the fake
    process group, under ``DeviceAudit``; return what it recorded in the last pass. With one pass,
    ``gather_objects`` gives every rank its own object for everyone's; ``passes=2`` first records what
    each rank contributes (FSDPMuon builds its owner table from them) and hands it out in the second."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from ..comm import Comm
    from ..grid import Grid

    world, gathered, original = dp * tp, {}, Comm.gather_objects
    for attempt in range(passes):
        last = attempt == passes - 1
        audit = Audit(torch.device(device))
        contributed: dict = collections.defaultdict(dict)

        # Each optimizer's own number, not id(opt): a short-lived optimizer (verify.py's state_dict twin)
        # may be freed and the next one built at the same address, which would merge their steps' syncs.
        numbers, fresh = weakref.WeakKeyDictionary(), itertools.count()

        def pre(opt, a, kw):
            if _is_muongrid(opt):
                if opt not in numbers:
                    numbers[opt] = (next(fresh), itertools.count())
                uid, steps = numbers[opt]
                audit._step = (uid, next(steps))
                audit.steps += 1

        def post(opt, a, kw):
            if _is_muongrid(opt):
                audit._step = None

        hooks = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
        try:
            with _meta_patches(device):
                for rank in range(world):
                    calls = itertools.count()

                    def gather_objects(self, obj, phase, _rank=rank, _calls=calls):
                        k = next(_calls)
                        contributed[k][_rank] = obj
                        return [gathered.get(k, {}).get(q, obj) for q in range(world)]

                    Comm.gather_objects = gather_objects
                    # DTensor caches sharding decisions by mesh, and meshes of different ranks compare equal: a
                    # cached decision would carry the previous rank's mesh (and its coordinates) into this one.
                    _clear_sharding_prop_cache()
                    audit.rank = rank
                    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
                    try:
                        grid = Grid.build(dp, tp, device)
                        comm = Comm(grid)
                        with DeviceAudit(audit):
                            worker(grid, comm, args)
                        comm.close()
                    except Exception:
                        if last:
                            raise
                    finally:
                        Comm.gather_objects = original
                        dist.destroy_process_group()
        finally:
            for h in hooks:
                h.remove()
        gathered = dict(contributed)
    return audit
