"""Sharded checkpoints that reshard: save on one grid and layout, load on any other, or in one process.

    from muongrid import checkpoint
    checkpoint.save(opt, "ckpt/step100", step=100, scheduler=sched)   # every rank, after opt.step()
    step = checkpoint.load(opt, "ckpt/step100", scheduler=sched)      # any grid, any layout
    checkpoint.export("ckpt/step100", "step100.pt")    # one plain file, for people without DCP
    checkpoint.load_single(MuonW(...), torch.load("step100.pt", weights_only=True))

``opt`` is a ``DistributedMuon`` / ``DistributedAdamW`` (ZeRO-1, below) or an ``FSDPMuon``
(``checkpoint_fsdp.py``: FSDP2's DTensors are already in global coordinates); the marker, the checks,
the crash safety and the errors are this module's for both. A checkpoint loads into the kind of
optimizer that saved it, on any grid. ``scheduler`` (any ``torch.optim.lr_scheduler``) is saved in the
marker and restored by ``load``, so a resumed run's learning rate continues where it was.

**The form.** A rank's optimizer state is its pieces of every parameter (``plan.py``): a flat range
of its TP shard, cut wherever ZeRO-1 cut the bucket. Saved as such, it could only be read back on
the same grid and layout. So each state tensor is saved in *global coordinates*: as the whole
parameter's shape, of which each rank writes the rectangles its piece covers (a flat range of a
row-major matrix is at most three rectangles: a partial row, whole rows, a partial row). That is
exactly what ``torch.distributed.checkpoint`` (DCP) stores for a sharded tensor, and DCP reads any
rectangles back from any others: a loader on another grid asks for its own pieces' rectangles and
DCP finds the bytes. Keys are parameter *names* (``optim.state.<name>.<kind>``), never positions,
so a model whose parameters are ordered differently still loads, and one whose names or shapes
differ is refused by name. This is DCP's own convention: ``get_state_dict``/``set_state_dict``
likewise key optimizer state by fully qualified parameter names and store DTensor shards in global
coordinates; our pieces are not DTensor placements (a ZeRO-1 cut runs through rows), so this module
builds the sharded tensors itself.

**Expert slices.** An optimizer on ``grid.expert(ep)`` holds slice ``s`` of every expert bank (experts x out x
in): experts ``s*k .. (s+1)*k``, as ``Grid.expert`` deals them. Saved, a slice's bank is its rows of the whole
bank, written by the slice's ranks; so the checkpoint holds each bank whole, and loads on another ``ep`` (or
into one process's whole bank) as a checkpoint of a dense matrix loads on another grid.

What is saved, per parameter: ``master`` (the fp32 weights the optimizer owns), ``momentum`` (Muon)
or ``exp_avg`` and ``exp_avg_sq`` (AdamW), and ``step``; the model's own weights under
``model.<name>``; and, in ``muongrid.json``, the format, the step, the optimizer and the grid and layout
it came from, every parameter's shape and kind, the hyperparameters and the scheduler's state. What
the optimizer does not hold is not saved: a model's persistent buffers (batch-norm statistics; the
book's GPT and transformers' Llama and GPT-2 have none) and parameters left out of every group.

**Crash safety.** Every rank writes into ``<path>.partial``; only when all have finished does rank 0
write ``muongrid.json`` there and move the folder to ``<path>`` (the previous checkpoint at ``<path>``
is moved aside first and removed last). A save that dies half-way leaves the previous checkpoint
in place, and a folder without ``muongrid.json`` is never taken for a checkpoint. ``load`` checks
everything it can (marker, optimizer, names, shapes, kinds, groups, scheduler) before reading a byte,
and reads into fresh tensors before copying anything into the optimizer, so a failed load changes
nothing. What DCP itself refuses (a stored tensor of another shape, a key it lacks: a marker that does
not tell the truth) comes back as a ``CheckpointError`` naming the parameter, raised before anything changed.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from .placements import local
from .rank_state import CheckpointError, after_load  # noqa: F401 (CheckpointError: re-exported here)

FORMAT = "muongrid-checkpoint/1"
MARKER = "muongrid.json"
SINGLE_KEYS = {"momentum": "momentum_buffer"}  # canonical name -> single-device MuonW's state name


# ---- geometry: a rank's piece as rectangles of the whole parameter -------------------------------

def matrix_view(shape: tuple[int, ...]) -> tuple[int, int]:
    """The 2-D shape a parameter is stored as: (rows, everything else); a vector is one row."""
    if len(shape) == 1:
        return 1, shape[0]
    return shape[0], int(torch.Size(shape[1:]).numel())


def rectangles(local_shape, tp_split_dim: int, tp_rank: int, piece: slice) -> list[tuple[tuple, tuple, int, int]]:
    """The rectangles of the whole parameter that elements ``piece`` of this TP rank's flattened shard
    cover: (offsets, sizes, start, stop in the piece), in the piece's order."""
    rows, cols = matrix_view(tuple(local_shape))
    if len(local_shape) == 1 and tp_split_dim == 0:
        row_off, col_off = 0, tp_rank * cols      # a vector split over TP: along its only dimension
    else:
        row_off = tp_rank * rows if tp_split_dim == 0 else 0
        col_off = tp_rank * cols if tp_split_dim == 1 else 0
    a, b = piece.start, piece.stop
    out, pos = [], a
    while pos < b:
        i, j = divmod(pos, cols)
        if j or b - pos < cols:                   # a partial row
            n = min(cols - j, b - pos)
            out.append(((row_off + i, col_off + j), (1, n), pos - a, pos - a + n))
        else:                                     # as many whole rows as fit
            n = (b - pos) // cols * cols
            out.append(((row_off + i, col_off), (n // cols, cols), pos - a, pos - a + n))
        pos += n
    return out


def placement(rank: int, device: torch.device) -> str:
    """A shard's placement, ``rank:N/cuda:I``: ShardedTensor compares its device with the local shard's tensor,
    and ``cuda`` is not ``cuda:1``. Other ranks' shards name only the type: their index is theirs to know."""
    return f"rank:{rank}/{device}"


def _sharded(opt, global_shape, writers, mine, dtype):
    """A ShardedTensor of ``global_shape``: ``writers`` are (rank, offsets, sizes) of every rank's
    rectangles, ``mine`` this rank's (offsets, sizes, tensor). In one process (no process group), the
    whole tensor: ``mine`` then covers all of it."""
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardMetadata
    from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties

    if _job_world(opt.grid) == 1:
        whole = torch.zeros(global_shape, dtype=dtype, device=opt.grid.device)
        for off, size, t in mine:
            whole[off[0]:off[0] + size[0], off[1]:off[1] + size[1]] = t
        return whole
    me, device = _job_rank(opt.grid, opt.grid.rank), opt.grid.device
    metas = [ShardMetadata(list(off), list(size), placement(r, device if r == me else torch.device(device.type)))
             for r, off, size in writers]
    local = [Shard(t, ShardMetadata(list(off), list(size), placement(me, device))) for off, size, t in mine]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ShardedTensor's deprecation notice: DCP still reads and writes it
        return ShardedTensor._init_from_local_shards_and_global_metadata(
            local, ShardedTensorMetadata(metas, torch.Size(global_shape), TensorProperties(dtype=dtype)))


def _writers(opt, meta, model: bool = False):
    """Who writes which rectangles of ``meta``: every rank its pieces (``model``: DP rank 0 the whole
    parameter); a parameter replicated over TP is written (and read) by TP rank 0 only, and broadcast over
    TP after a load. On an expert grid, every slice's ranks their rows of the whole bank."""
    grid, out = opt.grid, []
    for s in range(grid.ep):
        job_ranks = _slice_ranks(grid, s)
        for r in range(grid.tp if model else grid.dp * grid.tp):
            d, t = divmod(r, grid.tp)
            if meta.tp_split_dim == -1 and t != 0:
                continue
            piece = slice(0, meta.numel) if model else opt.plan.piece_slice(meta, d)
            for off, size, _, _ in rectangles(meta.shape, meta.tp_split_dim, t, piece):
                out.append((job_ranks[r], _in_bank(meta, s, off), size))
    return out


def _global_shape(opt, meta) -> tuple[int, int]:
    rows, cols = matrix_view(tuple(meta.full_shape))
    return rows * opt.grid.ep, cols


def _state_sharded(opt, meta, tensor_piece):
    """``tensor_piece`` (this rank's flat piece of one state tensor) as a ShardedTensor in global coordinates."""
    writes = meta.tp_split_dim != -1 or opt.grid.tp_rank == 0
    mine = [] if not writes else [
        (_in_bank(meta, _slice_of(opt.grid), off), size, tensor_piece[a:b].view(size))
        for off, size, a, b in rectangles(meta.shape, meta.tp_split_dim, opt.grid.tp_rank, meta_piece(opt, meta))]
    return _sharded(opt, _global_shape(opt, meta), _writers(opt, meta), mine, tensor_piece.dtype)


# ---- expert slices: an optimizer on grid.expert(ep) holds slice s of every bank, rows s*k..(s+1)*k ----

def _job_world(grid) -> int:
    return grid.dp * grid.tp * grid.ep


def _job_rank(grid, r: int) -> int:
    """The job's rank of grid rank ``r`` (an expert grid numbers its ranks from 0)."""
    return grid.global_ranks[r] if grid.global_ranks else r


def _slice_of(grid) -> int:
    return (_job_rank(grid, 0) // grid.tp) % grid.ep   # as Grid.expert deals DP ranks: d holds slice d % ep


def _slice_ranks(grid, s: int) -> list[int]:
    """The job's ranks of expert slice ``s``, in its grid's rank order (``Grid.expert``'s)."""
    if grid.ep == 1:
        return [_job_rank(grid, r) for r in range(grid.dp * grid.tp)]
    return [d * grid.tp + t for d in range(grid.dp * grid.ep) if d % grid.ep == s for t in range(grid.tp)]


def _in_bank(meta, s: int, off: tuple[int, int]) -> tuple[int, int]:
    """Offsets in slice ``s``'s bank as offsets in the whole bank (its experts are rows of the matrix view)."""
    return off[0] + s * matrix_view(tuple(meta.full_shape))[0], off[1]


def _check_expert_grid(opt) -> None:
    if getattr(getattr(opt, "grid", None), "ep", 1) == 1:   # (not an optimizer of ours: _engine says so)
        return
    if _is_fsdp(opt):
        raise CheckpointError("an FSDPMuon on an expert grid is not checkpointed: build the expert groups' "
                              "optimizer as a DistributedMuon on grid.expert(ep); nothing was changed")
    for name, meta, *_ in _entries(opt):
        if len(meta.full_shape) != 3:
            raise CheckpointError(
                f"parameter {name!r} has shape {tuple(meta.full_shape)} on an expert grid (grid.expert("
                f"{opt.grid.ep})); a checkpoint stores each slice as its rows of the whole bank, so every parameter "
                "there must be a bank of experts (experts x out x in), slice s holding experts s*k..(s+1)*k as "
                "grid.expert deals them; nothing was changed")


def meta_piece(opt, meta) -> slice:
    return opt.plan.piece_slice(meta, opt.grid.dp_rank)


# ---- which optimizer: ZeRO-1 (this module) or FSDPMuon (checkpoint_fsdp.py) ----------------------------

def _is_fsdp(opt) -> bool:
    """An FSDPMuon says so itself (``FSDPMuon.checkpoint_engine``), so this module need not import ``fsdp``,
    which imports it (no import cycle, ``tests/test_package.py``)."""
    return getattr(type(opt), "checkpoint_engine", None) == "fsdp"


def _engine(opt) -> str:
    """``"fsdp"`` for an FSDPMuon, ``"zero1"`` for a DistributedMuon / DistributedAdamW; anything else is refused."""
    if _is_fsdp(opt):
        return "fsdp"
    if hasattr(opt, "plan") and hasattr(opt, "grid"):
        return "zero1"
    raise TypeError(f"muongrid.checkpoint saves and loads a DistributedMuon, DistributedAdamW or FSDPMuon, not a "
                    f"{type(opt).__name__}: for a single-device optimizer use torch.save(opt.state_dict(), ...), and "
                    "checkpoint.load_single to load an exported muongrid checkpoint into one")


# ---- what is saved -------------------------------------------------------------------------------

def _entries(opt):
    """(name, meta, param, state) for every parameter, with its group."""
    for g, group in enumerate(opt.param_groups):
        for name, p, meta in zip(group["names"], group["params"], opt.plan.metas[g]):
            yield name, meta, p, opt.state[p], group


def describe(opt, step: int) -> dict:
    """The marker: what a loader checks before reading anything."""
    engine = _engine(opt)
    if engine == "fsdp":
        from . import checkpoint_fsdp
        params, saved_on = checkpoint_fsdp.params(opt), checkpoint_fsdp.saved_on(opt)
    else:
        ep = opt.grid.ep   # an expert grid's bank is stored whole: its slices' experts, one after another
        params = {name: dict(shape=[meta.full_shape[0] * ep, *meta.full_shape[1:]],
                             kinds=sorted(k for k in state if k != "step"), use_muon=bool(group["use_muon"]))
                  for name, meta, _, state, group in _entries(opt)}
        saved_on = dict(dp=opt.grid.dp, tp=opt.grid.tp, layout=opt.layout, **({"ep": ep} if ep > 1 else {}))
    hyper = [{k: v for k, v in g.items() if k not in ("params",)} for g in opt.param_groups]
    return dict(format=FORMAT, step=step, engine=engine, optimizer=type(opt).__name__,
                steps_taken=int(opt.steps_taken), params=params, param_groups=hyper, saved_on=saved_on)


def _state_dict(opt) -> dict:
    if _is_fsdp(opt):
        from . import checkpoint_fsdp
        return checkpoint_fsdp.state_dict(opt)
    sd = {}
    for name, meta, p, state, _ in _entries(opt):
        for kind, t in state.items():
            if kind != "step":
                sd[f"optim.state.{name}.{kind}"] = _state_sharded(opt, meta, t)
        sd[f"optim.state.{name}.step"] = state["step"].detach().clone()
        whole = slice(0, meta.numel) if opt.grid.dp_rank == 0 else slice(0, 0)  # DP rank 0 writes the model
        writes = opt.grid.dp_rank == 0 and (meta.tp_split_dim != -1 or opt.grid.tp_rank == 0)
        flat = local(p.detach()).reshape(-1)  # a DTensor parameter: the TP shard this rank holds
        mine = [(_in_bank(meta, _slice_of(opt.grid), off), size, flat[a:b].view(size)) for off, size, a, b in
                rectangles(meta.shape, meta.tp_split_dim, opt.grid.tp_rank, whole)] if writes else []
        sd[f"model.{name}"] = _sharded(opt, _global_shape(opt, meta), _writers(opt, meta, model=True), mine, p.dtype)
    return sd


def _scheduler_record(scheduler) -> dict | None:
    """The scheduler's class and ``state_dict()``, for the marker (JSON: readable, and loaded without pickle)."""
    if scheduler is None:
        return None
    record = dict(type=type(scheduler).__name__, state=scheduler.state_dict())
    try:
        json.dumps(record)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"the {record['type']}'s state_dict() cannot be written as JSON ({e}); nothing was "
                              "saved. Save that scheduler yourself (torch.save) and leave scheduler= out") from None
    return record


def save(opt, path, step: int, scheduler=None, extra: dict | None = None) -> None:
    """Write ``opt``'s state (and its parameters) to the folder ``path``; call it on every rank.
    ``scheduler``: its state is kept (pass the same to ``load``). ``extra`` (JSON) is kept in the marker,
    for the caller's own checks on resume. Everything that can fail before writing is checked first."""
    _check_expert_grid(opt)
    import torch.distributed.checkpoint as dcp

    if hasattr(opt, "check_finite_now"):   # a skipped "defer" step's step counts are taken back first
        opt.check_finite_now()
    marker = dict(describe(opt, step), scheduler=_scheduler_record(scheduler), extra=extra or {})
    try:
        text = json.dumps(marker, indent=1)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"the checkpoint's marker cannot be written as JSON ({e}: a tensor-valued "
                              "hyperparameter, or a non-JSON extra?); nothing was saved") from None
    path = Path(path)
    partial, old = Path(f"{path}.partial"), Path(f"{path}.old")
    world, first = _job_world(opt.grid), _job_rank(opt.grid, opt.grid.rank) == 0
    if first:
        shutil.rmtree(partial, ignore_errors=True)  # what a save that died left behind
    _barrier(world)
    with _quiet(world):
        dcp.save(_state_dict(opt), checkpoint_id=str(partial), no_dist=world == 1)
    if os.environ.get("MUONGRID_DIE_WHILE_SAVING") == str(opt.grid.rank):  # the crash test: die before it completes
        os._exit(9)
    _barrier(world)
    if first:
        (partial / MARKER).write_text(text)
        if path.exists():
            os.replace(path, old)
        os.replace(partial, path)
        shutil.rmtree(old, ignore_errors=True)
    _barrier(world)


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


@contextlib.contextmanager
def _quiet(world: int):
    """DCP warns that it runs in a single process when there is no process group: that is intended. It also
    warns, on every rank, that ShardedTensor (what this module's pieces are, ``_sharded``) is deprecated for
    DTensor: a ZeRO-1 cut is not a DTensor placement, and DCP still reads and writes ShardedTensor."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*ShardedTensor.*")
        if world == 1:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


# ---- loading ---------------------------------------------------------------------------------------

def read_marker(path) -> tuple[Path, dict]:
    """The checkpoint folder to read and its marker; a clear error when there is none."""
    path = Path(path)
    if not (path / MARKER).is_file() and (Path(f"{path}.old") / MARKER).is_file():
        path = Path(f"{path}.old")  # a save died between moving the old checkpoint aside and the new in
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint at {path}")
    if not (path / MARKER).is_file():
        raise CheckpointError(f"{path} has no {MARKER}: it is not a muongrid checkpoint, or its save did not finish")
    marker = json.loads((path / MARKER).read_text())
    if marker.get("format") != FORMAT:
        raise CheckpointError(f"{path} is in format {marker.get('format')!r}; this code reads {FORMAT!r}")
    return path, marker


def check_fits(marker: dict, expected: dict) -> None:
    """Raise, naming every difference, unless the saved parameters are this optimizer's (names, shapes, kinds)."""
    saved, ours = marker["params"], expected
    problems = [f"missing from the checkpoint: {n}" for n in ours if n not in saved]
    problems += [f"not in this optimizer: {n}" for n in saved if n not in ours]
    for n in set(saved) & set(ours):
        for key in ("shape", "kinds"):
            if saved[n][key] != ours[n][key]:
                problems.append(f"{n}: {key} {saved[n][key]} in the checkpoint, {ours[n][key]} here")
    if problems:
        raise CheckpointError("the checkpoint does not fit this optimizer:\n  " + "\n  ".join(sorted(problems)))


def check_optimizer(path, marker: dict, opt) -> None:
    """The checkpoint's kind of optimizer (ZeRO-1 or FSDP2) must be this one's."""
    saved, ours = marker.get("engine", "zero1"), _engine(opt)   # markers before FSDPMuon's were all ZeRO-1
    if saved != ours:
        what = dict(zero1="ZeRO-1 shards with fp32 masters", fsdp="FSDP2 DTensor blocks")
        raise CheckpointError(f"{path} was saved by {marker.get('optimizer', 'DistributedMuon')} ({what[saved]}); "
                              f"{type(opt).__name__} keeps {what[ours]} and loads only its own kind of checkpoint "
                              "(on any grid). Load it into the optimizer that saved it, or export() it to one file")


def check_groups(path, marker: dict, opt) -> None:
    """The same parameters in each group (in any order): the saved hyperparameters go to their group."""
    theirs = marker["param_groups"]
    if len(theirs) != len(opt.param_groups) or any(
            set(t.get("names", [])) != set(g["names"]) for t, g in zip(theirs, opt.param_groups)):
        raise CheckpointError(f"{path} groups its parameters otherwise: "
                              f"{[len(t.get('names', [])) for t in theirs]} parameters per group there, "
                              f"{[len(g['names']) for g in opt.param_groups]} here (or other names in a group); "
                              "build the parameter groups as the run that saved it did")


def check_scheduler(path, marker: dict, scheduler) -> None:
    """A scheduler given to ``load`` must be the kind that was saved; one saved and not given is warned about."""
    saved = marker.get("scheduler")
    if scheduler is None:
        if saved is not None:
            warnings.warn(f"{path} holds a {saved['type']}'s state but load() was given no scheduler: pass "
                          "scheduler= to continue its learning rate where it was", stacklevel=3)
        return
    if saved is None:
        raise CheckpointError(f"{path} was saved without a scheduler (save(..., scheduler=sched) keeps one), so "
                              f"there is nothing to restore into the {type(scheduler).__name__}; nothing was changed")
    if saved["type"] != type(scheduler).__name__:
        raise CheckpointError(f"{path} holds a {saved['type']}'s state, not a {type(scheduler).__name__}'s; "
                              "nothing was changed")


_SIZE = re.compile(r"Size mismatch between saved (torch\.Size\(\[[^]]*\]\)) and current: "
                   r"(torch\.Size\(\[[^]]*\]\)) for (\S+)")
_MISSING = re.compile(r"Missing key in checkpoint state_dict: (\S+?)\.?$", re.MULTILINE)


def _what(key: str) -> str:
    """A DCP key named as the user knows it: ``optim.state.w.momentum`` is parameter 'w' (its momentum)."""
    if key.startswith("optim.state."):
        name, _, kind = key[len("optim.state."):].rpartition(".")
        return f"parameter {name!r} (its {kind})"
    if key.startswith("model."):
        return f"parameter {key[len('model.'):]!r} (its weights)"
    return repr(key)


def _messages(e: BaseException) -> list[str]:
    """The messages inside DCP's ``CheckpointException`` (one failure per rank), or ``e``'s own."""
    failures = getattr(e, "failures", None)
    if not failures:
        return [str(e)]
    out = []
    for _, failure in sorted(failures.items()):
        out.append(str(failure[0] if isinstance(failure, tuple) else failure))
    return out


def translate(e: BaseException, path) -> CheckpointError:
    """DCP's error while reading ``path`` as ours, naming the parameter and the problem."""
    for msg in _messages(e):
        if m := _SIZE.search(msg):
            return CheckpointError(f"{path} does not fit this optimizer: {_what(m[3])} is stored as {m[1]} there, "
                                   f"{m[2]} here; nothing was changed")
        if m := _MISSING.search(msg):
            return CheckpointError(f"{path} does not fit this optimizer: {_what(m[1])} is not in it; "
                                   "nothing was changed")
    last = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    return CheckpointError(f"reading {path} failed (a file truncated or corrupted?); nothing was changed: {last}")


def _targets(opt) -> dict:
    """Fresh tensors, placed as ``_state_dict``'s, for DCP to read into."""
    if _is_fsdp(opt):
        from . import checkpoint_fsdp
        return checkpoint_fsdp.targets(opt)
    targets = {}
    for name, meta, p, state, _ in _entries(opt):
        for kind, t in state.items():
            targets[f"optim.state.{name}.{kind}"] = torch.zeros_like(t) if kind == "step" else \
                _state_sharded(opt, meta, torch.zeros_like(t))
    return targets


def _apply_zero1(opt, targets: dict) -> None:
    """Copy what was read into this rank's pieces of the state (the masters among them)."""
    world = _job_world(opt.grid)
    for name, meta, p, state, _ in _entries(opt):
        for kind, t in state.items():
            got = targets[f"optim.state.{name}.{kind}"]
            if kind == "step":
                t.copy_(got)
                continue
            if world == 1:  # one process: the whole parameter
                t.copy_(got.reshape(-1))
            elif meta.tp_split_dim != -1 or opt.grid.tp_rank == 0:
                for shard, (_, _, a, b) in zip(got.local_shards(), rectangles(
                        meta.shape, meta.tp_split_dim, opt.grid.tp_rank, meta_piece(opt, meta))):
                    t[a:b].copy_(shard.tensor.reshape(-1))
            if meta.tp_split_dim == -1 and opt.grid.tp > 1:  # TP rank 0 read it for its TP peers
                opt.comm.broadcast(t, "tp", "checkpoint", src=_job_rank(opt.grid, opt.grid.rank - opt.grid.tp_rank))


def load(opt, path, scheduler=None) -> int:
    """Load a checkpoint saved on any grid and layout into the distributed ``opt`` (the kind of optimizer
    that saved it) and, given one, its ``scheduler``; returns its step. Call on every rank. Nothing
    changes unless everything was checked and read."""
    _check_expert_grid(opt)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    path, marker = read_marker(path)
    check_optimizer(path, marker, opt)
    check_fits(marker, describe(opt, 0)["params"])
    check_groups(path, marker, opt)
    check_scheduler(path, marker, scheduler)
    targets = _targets(opt)
    world = _job_world(opt.grid)
    try:
        with _quiet(world):
            dcp.load(targets, checkpoint_id=str(path), no_dist=world == 1)
    except (Exception, CheckpointException) as e:  # DCP's own exception is a BaseException
        raise translate(e, path) from e
    with torch.no_grad():
        if _is_fsdp(opt):
            from . import checkpoint_fsdp
            checkpoint_fsdp.apply(opt, targets)
        else:
            _apply_zero1(opt, targets)
        for ours, theirs in zip(opt.param_groups, marker["param_groups"]):
            ours.update({k: tuple(v) if isinstance(ours.get(k), tuple) else v
                         for k, v in theirs.items() if k not in ("names", "tp_split_dims", "use_muon")})
        after_load(opt)  # a Muon group's betas[0] follows its momentum
        opt.steps_taken = marker.get("steps_taken", marker["step"])
        if not _is_fsdp(opt):
            opt._gather_params()  # the parameters are the masters, all-gathered (as after every step)
    if scheduler is not None:
        scheduler.load_state_dict(marker["scheduler"]["state"])
    return marker["step"]


def export(path, out_file) -> None:
    """One plain ``torch.save`` file of the whole checkpoint (full tensors), readable with
    ``torch.load(out_file, weights_only=True)`` and ``load_single``; its marker travels inside."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path, marker = read_marker(path)
    dcp_to_torch_save(path, out_file)
    sd = torch.load(out_file, weights_only=True)
    sd["muongrid"] = json.dumps(marker)
    torch.save(sd, out_file)


def load_single(opt, state: dict) -> int:
    """Load an exported checkpoint (``export``) into a single-device ``Muon``/``MuonW``/``AdamW``, or into
    ``torch.optim.Muon`` (whose ``momentum_buffer`` is the same EMA momentum: give its param groups
    ``names``). A group without ``use_muon`` is a Muon group unless ``opt`` is an AdamW."""
    marker = json.loads(state["muongrid"])
    default_muon = not isinstance(opt, torch.optim.AdamW) and "AdamW" not in type(opt).__name__
    named = {n: (p, g) for g in opt.param_groups for n, p in zip(g.get("names") or [], g["params"])}
    if not named:
        raise CheckpointError("the optimizer's param groups have no 'names': give each group the parameter names "
                              "(as model.named_parameters() gives them) so the checkpoint's tensors can find them")
    muon = {n: bool(g.get("use_muon", default_muon)) for n, (p, g) in named.items()}
    expected = {n: dict(shape=list(p.shape), kinds=["momentum"] if muon[n] else ["exp_avg", "exp_avg_sq"])
                for n, (p, g) in named.items()}
    for info in marker["params"].values():
        info["kinds"] = [k for k in info["kinds"] if k != "master"]
    check_fits(marker, expected)
    with torch.no_grad():
        for name, (p, g) in named.items():
            master = f"optim.state.{name}.master"  # ZeRO-1's fp32 weights; FSDPMuon keeps none: the parameter
            p.copy_((state[master] if master in state else state[f"model.{name}"]).view(p.shape))
            st = opt.state[p]
            for kind in expected[name]["kinds"]:
                st[SINGLE_KEYS.get(kind, kind)] = state[f"optim.state.{name}.{kind}"].view(p.shape).clone()
            if not muon[name]:
                st["step"] = int(state[f"optim.state.{name}.step"])
    return marker["step"]
