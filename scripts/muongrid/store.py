"""The store: the tensors a ZeRO-1 step works on, bucket by bucket, built once from the plan and kept.

For every bucket (its ``BucketBuffers``): the parameters' flat buffer, the gradient buffer backward lands in, this rank's
master shard and its optimizer state (``shards``). It is built from data (the plan, each group's parameters,
master dtypes, the grid and the ``Comm``), never the optimizer. A *buffer* here is such a flat tensor made once
and kept (the glossary's "store"), as in Megatron-LM's parameter-and-gradient buffers. Chapters 4 and 5.

* **Parameters.** A *bound* bucket's parameters (plain tensors owning their storage, one dtype and device) are
  views of one flat tensor laid out as the collectives move it, so the all-gather writes into them in place and
  an fp32 (or fp64) parameter is its own master; a bf16/fp16 one keeps an fp32 master, refreshed where the
  parameter no longer equals it rounded. Other buckets are packed and unpacked (``sharding.py``).
  ``param_buffers="all"`` binds DTensors' local shards too (not by default: torch 2.13's ``torch.compile``
  cannot trace one inside a bigger storage); ``False`` binds nothing. ``p.data = new`` is taken up at the step.
* **Gradients.** One DP rank, or a rank whose ``p.grad`` DDP averaged (``grad_reduce="ddp"``), reads its piece
  of ``p.grad`` where autograd left it. Otherwise, with several DP ranks, a post-accumulate-grad hook
  copies each gradient of the master's dtype into its place in the gradient buffer once and points ``p.grad``
  there, so the next backward accumulates in place: at most one pass over the gradients whatever ``zero_grad``
  the loop uses. Any other gradient is copied in at the step. With ``grad_reduce="backward"`` the hook also copies
  (cast) a gradient of another dtype, and tells the ``reducer.Reducer``, which launches each bucket's
  reduce-scatter from backward when its last gradient lands (the rules that keep every rank's order: its docstring).

    python -m pytest -q tests/test_grad_landing.py tests/test_store_buffers.py
"""
from __future__ import annotations

import collections
import weakref
from dataclasses import dataclass, field

import torch

from .comm import Phase
from .placements import is_dtensor, local
from .sharding import copy_all, local_shard, pack_bucket, unpack_bucket
from .updates import muon_momentum_foreach_

MUON_STATE, ADAMW_STATE = ("master", "momentum"), ("master", "exp_avg", "exp_avg_sq")


@dataclass
class BucketBuffers:
    """One bucket's tensors on this rank."""

    master: torch.Tensor                      # this rank's master shard (flat, shard_numel elements)
    params: torch.Tensor | None = None        # the bound parameters' flat buffer (padded_numel), or None
    ptrs: list = field(default_factory=list)  # each bound parameter's data_ptr, to notice p.data = new
    grads: torch.Tensor | None = None         # the flat gradient buffer (several DP ranks), made with the rest
    grad_shard: torch.Tensor | None = None    # this rank's reduce-scattered gradient shard (several DP ranks)

    @property
    def master_is_param(self) -> bool:
        return self.params is not None and self.params.dtype == self.master.dtype


def held(p: torch.Tensor) -> torch.Tensor:
    """The tensor that holds ``p``'s values on this rank: a DTensor's local shard (the object itself, not the
    fresh view ``to_local()`` makes: an attribute read, no call into DTensor), else ``p``."""
    return p._local_tensor if is_dtensor(p) else p


def bindable(params: list[torch.Tensor], dtensors: bool = False) -> bool:
    """Whether these parameters can become views of one buffer (see the module docstring); DTensor
    parameters only with ``dtensors``."""
    if not dtensors and any(is_dtensor(p) for p in params):
        return False
    tensors = [held(p) for p in params]
    if not tensors or len({(t.dtype, t.device) for t in tensors}) != 1 or not all(t.is_contiguous() for t in tensors):
        return False
    return all(t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()
               for t in tensors)


def _place(p: torch.Tensor, flat: torch.Tensor, at: int) -> torch.Tensor:
    """Copy ``p``'s values to ``flat[at:]`` and make that view where ``p`` holds them; returns the view."""
    t = held(p)
    view = flat[at: at + t.numel()].view(t.shape)
    view.copy_(t.detach())
    if is_dtensor(p):
        p._local_tensor = view
    else:
        p.data = view
    return view


def _run(bucket, meta) -> int:
    """Where ``meta``'s elements start in the bucket's flat collective layout (always one run here)."""
    lo = meta.global_range[0] - bucket.start
    runs = bucket.segments(lo, lo + meta.numel)
    if len(runs) != 1:
        raise AssertionError(f"parameter {meta.name!r} is cut into {len(runs)} runs by the bucket's shards")
    return runs[0][2]


class Store:
    """Every bucket's ``BucketBuffers`` and state, and what a step asks of them (see the module docstring). ``params``: each
    group's parameter list (the optimizer's own lists); ``muon``: whether each group is Muon's."""

    def __init__(self, plan, params: list[list], master_dtypes: list, muon: list[bool], grid, comm,
                 bind: bool | str = True, reduce: bool | str = True, step_number=None):
        if bind not in (True, False, "all"):
            raise ValueError(f"param_buffers must be True, False or 'all' (DTensor parameters too), got {bind!r}")
        self.plan, self.params, self.master_dtypes, self.muon = plan, params, master_dtypes, muon
        self.grid, self.comm = grid, comm
        self.reduces = bool(reduce) and grid.dp > 1   # False: one DP rank, or DDP averaged p.grad (grad_reduce="ddp")
        self.reducer = None   # reduce="backward": the launches from backward (reducer.py)
        shared = _shared_storages([p for group in params for p in group])
        self.buffers = []   # per group, per bucket: its BucketBuffers
        for g, group in enumerate(params):
            row = []
            for bucket in self.plan.buckets[g]:
                mine = [group[i] for i in bucket.param_indices]
                ok = (bool(bind) and bindable(mine, dtensors=bind == "all")
                      and not any(_storage(held(p)) in shared for p in mine))
                row.append(self._bind(g, bucket) if ok else BucketBuffers(self._packed_shard(g, bucket).clone()))
            self.buffers.append(row)
        # this rank's state per bucket: the master shard (the parameters themselves where they can be) and
        # Muon's or AdamW's state laid out alike
        self.shards = [[{k: buffers.master if k == "master" else torch.zeros_like(buffers.master)
                         for k in (MUON_STATE if muon[g] else ADAMW_STATE)} for buffers in row]
                       for g, row in enumerate(self.buffers)]
        # per group and parameter, this rank's piece of every state kind (a view of its bucket's shard): the dict
        # the optimizer's state[p] is
        self.views = [[{} for _ in metas] for metas in plan.metas]
        for g, buckets in enumerate(plan.buckets):
            for b in buckets:
                for i in b.param_indices:
                    self.views[g][i] = {k: local_shard(t, plan, plan.metas[g][i])
                                        for k, t in self.shards[g][b.bucket_idx].items()}
        self.hooks = []   # the gradient hooks' handles, removed when these buffers go
        if self.reduces:
            self._land_gradients(backward=reduce == "backward", step_number=step_number)
            weakref.finalize(self, _remove, self.hooks)

    # ---- building --------------------------------------------------------------------------------

    def _bind(self, g: int, bucket) -> BucketBuffers:
        params, metas = self.params[g], self.plan.metas[g]
        first = held(params[bucket.param_indices[0]])
        flat = torch.zeros(bucket.padded_numel, dtype=first.dtype, device=first.device)
        for i in bucket.param_indices:
            _place(params[i], flat, _run(bucket, metas[i]))
        own = flat[self.grid.dp_rank * bucket.shard_numel: (self.grid.dp_rank + 1) * bucket.shard_numel]
        return BucketBuffers(own.to(self.master_dtypes[g]), flat,
                             [held(params[i]).data_ptr() for i in bucket.param_indices])

    def _packed_shard(self, g: int, bucket) -> torch.Tensor:
        """This rank's shard of the bucket's current parameter values, packed (unbound buckets)."""
        params = self.params[g]
        flat = pack_bucket(_only(params, bucket, lambda p: local(p.detach())), bucket, self.master_dtypes[g])
        lo = bucket.shard_numel * self.grid.dp_rank
        return flat[lo: lo + bucket.shard_numel]

    # ---- before the step: start from the parameters' current values ----------------------------------

    def refresh(self) -> None:
        """Take up whatever was written to the parameters since the last step (see the module docstring)."""
        for g, group in enumerate(self.params):
            for bucket in self.plan.buckets[g]:
                buffers = self.buffers[g][bucket.bucket_idx]
                if buffers.params is None:
                    current = self._packed_shard(g, bucket)
                elif self._rebind_moved(g, bucket, buffers) or not buffers.master_is_param:
                    current = self._own(bucket, buffers)
                else:
                    continue   # the master is the parameter: nothing to take up
                master, dtype = buffers.master, group[bucket.param_indices[0]].dtype
                if dtype == master.dtype:
                    if current.data_ptr() != master.data_ptr():
                        master.copy_(current)
                    continue
                rounded = master.to(dtype)
                master.copy_(torch.where(current != rounded, current.to(master.dtype), master))

    def _own(self, bucket, buffers: BucketBuffers) -> torch.Tensor:
        n = bucket.shard_numel
        return buffers.params[self.grid.dp_rank * n: (self.grid.dp_rank + 1) * n]

    def _rebind_moved(self, g: int, bucket, buffers: BucketBuffers) -> bool:
        """A parameter given new storage (``p.data = new``): copy its values in, make it a view again."""
        params, metas, moved = self.params[g], self.plan.metas[g], False
        for k, i in enumerate(bucket.param_indices):
            p = held(params[i])
            if p.data_ptr() == buffers.ptrs[k]:
                continue
            if p.dtype != buffers.params.dtype or p.device != buffers.params.device or p.shape != torch.Size(metas[i].shape):
                raise ValueError(f"parameter {metas[i].name!r} became {str(p.dtype)[6:]} {tuple(p.shape)} on {p.device} "
                                 f"after the optimizer was built (it was {str(buffers.params.dtype)[6:]} "
                                 f"{tuple(metas[i].shape)} on {buffers.params.device}); build the optimizer after "
                                 "moving or casting the model")
            buffers.ptrs[k] = _place(params[i], buffers.params, _run(bucket, metas[i])).data_ptr()
            moved = True
        return moved

    # ---- gradients --------------------------------------------------------------------------------

    def _land_gradients(self, backward: bool = False, step_number=None) -> None:
        """Every bucket's flat gradient buffer, and a hook on each parameter that lands its gradient there
        (``backward``: every parameter that can get a gradient, cast where its dtype differs, and the reducer)."""
        from .reducer import Reducer

        hooked, landings = {}, []
        for g, params in enumerate(self.params):
            metas, dtype = self.plan.metas[g], self.master_dtypes[g]
            for bucket in self.plan.buckets[g]:
                buffers = self.buffers[g][bucket.bucket_idx]
                buffers.grads = torch.zeros(bucket.padded_numel, dtype=dtype, device=self.grid.device)
                buffers.grad_shard = torch.zeros(bucket.shard_numel, dtype=dtype, device=self.grid.device)
                hooked[(g, bucket.bucket_idx)] = mine = []
                for i in bucket.param_indices:
                    p = params[i]
                    if not p.requires_grad or (p.dtype != dtype and not backward):
                        continue   # copied in at the step (reduce_scatter)
                    at, shape = _run(bucket, metas[i]), held(p).shape
                    view = buffers.grads[at: at + metas[i].numel].view(shape)
                    landings.append(_Landing(view, (g, bucket.bucket_idx, i) if backward else None))
                    self.hooks.append(p.register_post_accumulate_grad_hook(landings[-1]))
                    mine.append(i)
        if backward:
            self.reducer = Reducer(self, hooked, step_number)
            for landing in landings:
                landing.reducer = weakref.ref(self.reducer)   # weak: the hooks must not keep the store alive

    def grad_pieces(self, g: int, bucket, step, trace=None) -> list:
        """This rank's DP-mean gradient of each parameter of the bucket, flat, in master dtype (None: no rank has
        one), made once per step and kept in ``step.grads`` (``step``: a decided ``step.Step``). Where the step
        reduces, a Muon group's shard is its momentum where ``step.keep`` (a "defer" verdict) is False; otherwise
        ``p.grad`` is the mean already (one rank, or DDP's) and a piece is a view of it."""
        key, present = (g, bucket.bucket_idx), step.present[g]
        if key in step.grads:
            return step.grads[key]
        params, metas, dtype = self.params[g], self.plan.metas[g], self.master_dtypes[g]
        if not self.reduces:
            pieces = [None if not present[i] else torch.zeros(metas[i].local_numel, dtype=dtype, device=self.grid.device)
                      if params[i].grad is None else local(params[i].grad).reshape(-1)[metas[i].param_slice].to(dtype)
                      for i in bucket.param_indices]
        else:
            shard = self.reduce_scatter(g, bucket)
            if self.muon[g] and step.keep is not None:
                torch.where(step.keep, shard, self.shards[g][bucket.bucket_idx]["momentum"], out=shard)
            pieces = [local_shard(shard, self.plan, metas[i]) if present[i] else None for i in bucket.param_indices]
            if trace is not None:
                trace("grad_shard", f"bucket {bucket.group_idx}.{bucket.bucket_idx}",
                      torch.cat([x for x in pieces if x is not None] or [torch.zeros(0)]))
        step.grads[key] = pieces
        return pieces

    def momentum(self, g: int, group: dict, step, lazy: bool, trace=None):
        """(bucket, this rank's gradient pieces through Muon's momentum) per bucket of Muon group ``g`` (None: a
        skipped parameter, its momentum left as it is): one pass over the group, or for a ``lazy`` flow (the
        bucket layout's) one bucket at a time, as it asks."""
        def momentum(buckets):
            rows = [list(self.grad_pieces(g, b, step, trace)) for b in buckets]   # new lists: the cache keeps the gradients
            todo = [(n, k) for n, row in enumerate(rows) for k, grad in enumerate(row)
                    if grad is not None and grad.numel()]
            views = self.views[g]
            out = muon_momentum_foreach_([views[buckets[n].param_indices[k]]["momentum"] for n, k in todo],
                                         [rows[n][k] for n, k in todo], group["momentum"], group["nesterov"],
                                         None if self.reduces else step.keep)
            for (n, k), piece in zip(todo, out):
                rows[n][k] = piece
            return list(zip(buckets, rows))
        # a generator either way, run by the flow as it iterates: the pieces go from here to the flow directly
        passes = [[b] for b in self.plan.buckets[g]] if lazy else [self.plan.buckets[g]]
        return (pair for buckets in passes for pair in momentum(buckets))

    def reduce_scatter(self, g: int, bucket) -> torch.Tensor:
        """Copy the bucket's gradients into its flat buffer (those not already there),
        reduce-scatter over DP, divide by dp: this rank's DP-mean gradient shard
        (``grad_reduce="backward"``: the reduce-scatter launched from backward,
        waited for)."""
        if self.reducer is not None:
            return self.reducer.take(g, bucket)
        self.fill(g, bucket)
        buffers = self.buffers[g][bucket.bucket_idx]
        shard = self.comm.reduce_scatter_into(buffers.grad_shard, buffers.grads, "dp",
                                              Phase.GRAD_REDUCE_SCATTER)
        return shard.div_(self.grid.dp)

    def fill(self, g: int, bucket) -> None:
        """Copy the bucket's gradients into its flat buffer where backward did not put them; zeros for a parameter
        with no gradient here."""
        buffers = self.buffers[g][bucket.bucket_idx]
        params, metas, dtype = self.params[g], self.plan.metas[g], self.master_dtypes[g]
        flat, dsts, srcs, zeros = buffers.grads, [], [], []
        for i in bucket.param_indices:
            p, at = params[i], _run(bucket, metas[i])
            view = flat[at: at + metas[i].numel]
            if p.grad is None:
                zeros.append(view)
                continue
            grad = local(p.grad)
            in_place = _storage(grad) == _storage(flat) and grad.storage_offset() == at
            if in_place and grad.dtype == dtype:
                continue   # backward wrote into the buffer (zeroed in place)
            dsts.append(view)
            srcs.append(grad.reshape(-1))
            if grad.dtype == dtype and grad.is_contiguous():
                # the same values; the next backward accumulates into the buffer
                _point_grad(p, view.view(grad.shape))
        copy_all(dsts, srcs, zeros)

    # ---- after the step: the parameters all-gathered --------------------------------------------------

    def gather(self, g: int, bucket, params=None) -> None:
        """Every rank's master shard into every rank's parameters. ``params`` (the
        group's, by default) is where an unbound bucket unpacks to."""
        buffers, comm = self.buffers[g][bucket.bucket_idx], self.comm
        params = self.params[g] if params is None else params
        if buffers.params is None:
            dtype = params[bucket.param_indices[0]].dtype
            full = comm.all_gather(buffers.master.to(dtype), "dp", Phase.PARAM_ALL_GATHER)
            targets = _only(params, bucket, lambda p: local(p.data))
            unpack_bucket(full, bucket, self.plan.metas[g], targets)
            return
        if not buffers.master_is_param:
            self._own(bucket, buffers).copy_(buffers.master)
        comm.all_gather_into(buffers.params, self.grid.dp_rank, "dp",
                             Phase.PARAM_ALL_GATHER)


class _Landing:
    """One parameter's post-accumulate-grad hook: autograd's gradient into its place ``view`` in the gradient
    buffer, once, and ``p.grad`` pointed there; when ``p.grad`` is that place, backward added into it already.
    ``key`` (``grad_reduce="backward"``: group, bucket, parameter) is told to the reducer once the gradient is in
    place; there a gradient of another dtype is copied in cast, every time (``p.grad`` keeps its own sum)."""

    __slots__ = ("view", "key", "reducer")

    def __init__(self, view: torch.Tensor, key: tuple | None = None):
        self.view, self.key, self.reducer = view, key, None

    def __call__(self, p: torch.Tensor) -> None:
        mine = None if p.grad is None else held(p.grad)
        if mine is None:
            return
        if not _is_place(mine, self.view):
            if mine.shape != self.view.shape or mine.layout != torch.strided or (
                    mine.dtype != self.view.dtype and self.key is None):
                return   # the step's checks name the problem (distributed._check_grads)
            with torch.no_grad():
                self.view.copy_(mine)
            if mine.dtype == self.view.dtype:
                _point_grad(p, self.view)
        reducer = self.reducer and self.reducer()
        if reducer is not None:
            reducer.landed_in(self.key[:2], self.key[2])


def _point_grad(p: torch.Tensor, view: torch.Tensor) -> None:
    """``p.grad`` becomes ``view`` (its values already there); a DTensor gradient placed as its parameter keeps
    its object and takes ``view`` as local shard, one placed otherwise is left for the step to refuse."""
    if not is_dtensor(p.grad):
        p.grad = view
    elif is_dtensor(p) and p.grad._spec.placements == p._spec.placements:
        p.grad._local_tensor = view


def _only(params: list, bucket, make) -> list:
    """``make(p)`` for the bucket's parameters, None for the others (indexed like ``params``)."""
    mine = set(bucket.param_indices)
    return [make(p) if i in mine else None for i, p in enumerate(params)]


def _is_place(grad: torch.Tensor, view: torch.Tensor) -> bool:
    return (_storage(grad) == _storage(view) and grad.storage_offset() == view.storage_offset()
            and grad.stride() == view.stride())


def _remove(handles: list) -> None:
    for handle in handles:
        handle.remove()


def _storage(p: torch.Tensor) -> int:
    """An id of ``p``'s storage (not its data pointer: every tensor on ``meta`` has pointer 0)."""
    return p.untyped_storage()._cdata


def _shared_storages(params: list[torch.Tensor]) -> set[int]:
    """Storages that more than one of ``params`` lives in (binding would untie them)."""
    counts = collections.Counter(_storage(held(p)) for p in params)
    return {key for key, n in counts.items() if n > 1}
