"""Distributed Muon and Distributed AdamW: ``torch.optim.Optimizer``s with ZeRO-1 state, aware of TP.

Each rank holds its TP-local parameters and gradients and the optimizer state of only its DP shard of every
bucket (``plan.py``). The optimizer builds the plan, the store (``store.py``: every bucket's buffers and state)
and the layout's flow (``flows.py``, ``owner_flow.py``); a step hands them data, bucket by bucket:

  1     gradients   reduce-scatter over DP (fp32, sum / dp)                     -> my gradient shard
  2     momentum    Muon's momentum on my pieces of every matrix (fp32; the store's pass)
  3-6   the flow    my pieces -> whole matrices -> Newton-Schulz -> my pieces of the orthogonalised update
                    (bucket: DP then TP gathers, every rank; owner layouts: to each matrix's owner and back)
  7     update      decay and scaled lr into my master shard (``Applier``); AdamW groups: AdamW on my shard
  8     parameters  all-gather the master shards over DP, into the parameters in place

    opt = DistributedMuon(hybrid_param_groups(model.named_parameters()), grid)   # layout="owner"
    loss.backward(); opt.step(); opt.zero_grad()

Options and build-time checks: ``options.py``; state views, ``state_dict``, ``state_bytes``: ``rank_state.py``;
the torch-optimizer contract: ``contract.py``, ``book/api.md``; ``capturable=True``: ``capture.py``. Chapter 5
walks one step, chapter 8 the layouts: ``python scripts/verify.py --dp 2 --tp 2 --layout bucket,owner``.
"""
from __future__ import annotations

import dataclasses

import torch
from torch.profiler import record_function

from . import rank_state
from .capture import DeviceStepCounts, need_every_grad, pin_group
from .capture import refuse as refuse_capture
from .clipping import clip_zero1_
from .comm import Comm
from .contract import MomentumSync, check_ddp, job_place, lr_of, no_autocast, refuse_grad_scaler, vote, where_of
from .finite import Deferred, late_codes, max_abs
from .flows import OVERLAP_MODES, BucketFlow, FlowOptions  # noqa: F401 (OVERLAP_MODES: bench, verify)
from .optim import DEFAULTS, call_closure, check_group, check_hyper, param_names, resolve_mode
from .options import (check_banks, check_grad_reduce, check_layout, check_ranks_agree, default_layout,
                      default_ns_batch, default_overlap, master_dtype, param_specs)   # default_*: bench, the lab, tests
from .owner_flow import OwnerFlow
from .placements import is_dtensor, local, resolve_tp_split_dims
from .plan import build_plan, plan_key
from .step import Step, StepCounts
from .store import Store
from .updates import adamw_foreach_, adjust_lr, apply_update_foreach_, lr_key

FLOWS = {"bucket": BucketFlow, "owner": OwnerFlow, "aligned": OwnerFlow, "group": OwnerFlow}


class ZeroOneOptimizer(torch.optim.Optimizer):
    """The engine: ZeRO-1 sharded state, Muon or AdamW per group. Use the two classes below.

    Its state is the store's (``store.py``): ``opt.state[p]`` holds this rank's views of every state kind of
    ``p`` (the store's ``views``, the same objects) and its step count (``counts``, ``step.py``). What does not run
    in a step has functions elsewhere, one concern each: saving and loading (``rank_state.py``), the build-time
    checks (``options.py``), clipping's arithmetic (``clipping.py``)."""

    _step_supports_amp_scaling = True   # so torch.amp.GradScaler hands us its step, and we refuse it (contract.py)

    def __init__(self, params, grid, comm: Comm | None = None, layout: str | None = None,
                 bucket_numel: int | str | None = "auto", use_muon: bool = True,
                 check_finite: bool | str | None = None, overlap: str | None = None, ns_batch: bool | None = None,
                 hw: dict | None = None, param_buffers: bool | str = True, qk_clip=None, chunks: int | None = None,
                 capturable: bool = False, grad_reduce: str = "step", **hyper):
        hyper = check_hyper(hyper)
        if not isinstance(capturable, bool):
            raise TypeError(f"capturable must be True or False, got {capturable!r}")
        layout = default_layout(grad_reduce) if layout is None else layout
        check_grad_reduce(grad_reduce, layout, grid)
        self.grad_reduce = grad_reduce   # "ddp": DDP averaged the gradients before step() (contract.check_ddp)
        if grad_reduce == "backward" and capturable:
            raise ValueError("grad_reduce='backward' launches the gradient reduce-scatters from backward's hooks, "
                             "outside the step a graph captures; capturable=True needs grad_reduce='step'")
        if grad_reduce == "ddp":   # GradScaler unscales and checks the averaged gradients itself: the same everywhere
            self._step_supports_amp_scaling = False
        overlap = default_overlap(layout) if overlap is None else overlap
        ns_batch = default_ns_batch(layout, torch.device(grid.device)) if ns_batch is None else ns_batch
        check_layout(layout, grid, ns_batch)
        self.grid = grid
        self.options = FlowOptions(overlap, chunks, bool(ns_batch))   # what the flow is told (flows.py)
        self.check_finite = resolve_mode(check_finite, torch.device(grid.device), capturable)
        self._deferred = Deferred(hold=capturable)   # capturable: the vote is held on the device (finite.py)
        self.comm = comm or Comm(grid)
        self.comm.naive_async = overlap == "naive"
        self._planned = False
        super().__init__(params, dict(DEFAULTS, use_muon=use_muon, **hyper))
        for g, group in enumerate(self.param_groups):
            group["names"] = param_names(group, g)
            group["tp_split_dims"] = resolve_tp_split_dims(group["names"], group["params"],
                                                           group.get("tp_split_dims"), grid)
            check_group(group, g, banks=True)
            check_banks(group)
        MomentumSync.of(self)
        self.capturable = capturable   # hyperparameters and step counts on the device (capture.py)
        if self.capturable:
            refuse_capture(self, qk_clip)
            for group in self.param_groups:
                pin_group(group, grid.device)
            MomentumSync.of(self).reset(self.param_groups)
        self.master_dtypes = [master_dtype(group, g) for g, group in enumerate(self.param_groups)]
        specs = [param_specs(group, grid.tp) for group in self.param_groups]
        self.muon_groups = [bool(group["use_muon"]) for group in self.param_groups]
        dtypes = [[str(p.dtype).replace("torch.", "") for p in group["params"]] for group in self.param_groups]
        check_ranks_agree(self.comm, plan_key(specs, dtypes, layout, bucket_numel, self.muon_groups, hw))
        self.plan = build_plan(specs, grid.dp, grid.dp_rank, grid.tp, bucket_numel, layout, self.muon_groups, hw)
        self.hw = hw   # the hardware profile the group layout's groups were sized on (None: by FLOPs)
        if self.plan.groups:  # collective: every rank has the same plan (checked above), so the same groups
            self.comm.add_subgroups(self.plan.groups.values())
        self.flow = FLOWS[layout](self.plan, self.grid, self.comm, self.muon_groups, self.options)
        self.store = Store(self.plan, [group["params"] for group in self.param_groups], self.master_dtypes,
                           self.muon_groups, grid, self.comm, bind=param_buffers,
                           reduce=grad_reduce != "ddp" and grad_reduce, step_number=lambda: self.steps_taken + 1)
        saved = [[float(self.state[p].get("step", 0)) if p in self.state else 0.0 for p in group["params"]]
                 for group in self.param_groups]
        self.counts = (DeviceStepCounts if capturable else StepCounts)(saved, grid.device)
        rank_state.bind_state(self)
        # places (in the order of all parameters) whose NaN/Inf check the step makes itself: in a job of one rank
        # under "defer", where nothing is masked, every Muon matrix's, from its update (finite.late_codes)
        alone = self.check_finite == "defer" and job_place(grid)[1] == 1
        muon = [m for m, group in zip(self.muon_groups, self.param_groups) for _ in group["params"]]
        self._checked_in_step = frozenset(i for i, m in enumerate(muon) if m and alone)
        self.qk_clip = qk_clip   # MuonClip (qk_clip.py): query and key rows rescaled after each update
        if qk_clip is not None:
            qk_clip.bind_zero1(self)
        self.steps_taken = 0
        self._step: Step | None = None   # the step under way (step.py), from its first gradient to its last gather
        self.last_step: Step | None = None   # the last finished one, for inspection (its gradient pieces let go)
        self._planned = True

    # ---- the step ---------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = call_closure(closure)
        refuse_grad_scaler(self)
        try:
            # the contract's checks (decided_step) belong to the step; no caller's autocast
            with record_function("optimizer.step"), no_autocast(self.grid.device):
                step = self.decided_step()
                self.counts.count(step)
                self.steps_taken += 1
                self.store.refresh()        # start from the parameters' current values
                self._update_master_shards(step)    # stages 1-7
                self._launch_deferred(step)  # "defer": the vote, to the host
                # MuonClip: this step's logits, on the updated masters
                if self.qk_clip is not None:
                    self.qk_clip.apply_zero1(self, step)
                self._gather_params()       # stage 8
        finally:
            self._end_step()
        return loss

    def no_sync(self):
        """A context for every backward but a step's last (gradient accumulation) under ``grad_reduce="backward"``:
        the gradients are summed in the buffers and nothing is launched (``reducer.py``). Elsewhere it does nothing."""
        import contextlib
        return self.store.reducer.no_sync() if self.store.reducer is not None else contextlib.nullcontext()

    def pending_step(self) -> Step:
        """The step under way, begun now if none is (the last one's deferred NaN/Inf check read first, so its
        number is right): ``clip_grad_norm_`` and ``step()`` ask for it."""
        if self._step is None:
            self._deferred.check_between_steps()   # "defer": the last step's verdict (not under capturable)
            self._step = Step(self.steps_taken + 1)
            self.comm.ledger.begin_step(self._step.number)   # clip_grad_norm_'s reduce-scatter belongs to it
        return self._step

    def decided_step(self) -> Step:
        """The step under way, decided: once per step, before anything changes, sync a scheduler's momentum,
        check the gradients and decide, the same on every rank, which parameters have a gradient somewhere
        (the others are skipped) and whether the step is kept (``contract.vote``)."""
        step = self.pending_step()
        if step.decided:
            return step
        MomentumSync.of(self)(self.param_groups)
        if self.steps_taken == 0 and not getattr(self, "_ddp_checked", False):
            check_ddp([p for group in self.param_groups for p in group["params"]], self.grad_reduce, self.grid.dp)
            self._ddp_checked = True
        grads, index, where = self._check_grads()
        if self.store.reducer is not None:   # grad_reduce="backward": every rank's reduce-scatters before its ballot
            self.store.reducer.launch_rest()
        params = [p for group in self.param_groups for p in group["params"]]
        flat, keep, agreed = vote(self, params, grads, index, where, self._checked_in_step)
        flat = iter(flat)
        step.decide([[next(flat) for _ in group["params"]] for group in self.param_groups], keep, agreed,
                    bool(self._checked_in_step))
        return step

    def _end_step(self) -> None:
        if self.store.reducer is not None:
            self.store.reducer.end_step()   # grad_reduce="backward": nothing left in flight (reducer.py)
        step, self._step = self._step, None
        if step is not None:
            step.grads.clear()
            self.last_step = step

    def _launch_deferred(self, step: Step) -> None:
        """Once the step has run: ``check_finite="defer"``'s vote, with the codes the step itself found (one rank:
        its Muon matrices', from their updates, ``Applier.flush``), on its way to the host (``finite.Deferred``)."""
        agreed = step.agreed
        if agreed is None:
            return
        rank, world = job_place(self.grid)[:2]
        if step.late is not None:
            agreed = torch.maximum(agreed, late_codes(step.late, agreed.numel(), rank, world, agreed.device))
        self._deferred.launch(agreed, step.keep, [n for group in self.param_groups for n in group["names"]],
                              step.number, self.grid.tp, world, self._uncount(step))

    def _uncount(self, step: Step):
        """What ``step()`` counted for a step that turned out skipped ("defer": known at a later host read):
        ``undo(k)``, ``k`` the steps skipped (several, read late, under ``capturable``)."""
        def undo(skipped: int = 1):
            self.counts.uncount(step)
            self.steps_taken -= skipped
        return undo

    def check_finite_now(self) -> int | None:
        """With ``check_finite="defer"``: if the last step (under ``capturable``, any since the last read) was
        skipped for a NaN/Inf gradient on some rank, say so now (a ``finite.SkippedStep`` warning), take back its
        step counts and return its number."""
        return self._deferred.check()

    @property
    def skipped_steps(self) -> list[int]:
        """The steps that ``check_finite="defer"`` skipped on every rank, as reported so far."""
        return self._deferred.skipped

    def _update_master_shards(self, step: Step) -> None:
        """Reduce-scatter the gradients and update this rank's master shard of every bucket. A parameter
        with no gradient on any rank keeps its master and state (its Newton-Schulz input is zeros)."""
        trace, views = self.options.trace, self.store.views
        for g, group in enumerate(self.param_groups):
            lr = lr_of(group)   # capturable: the group's device scalar
            if not group["use_muon"]:
                self._adamw(g, group, lr, step)
                continue
            # BOOK-START muon-group (chapter 5 shows the lines up to BOOK-END)
            # stages 1-2 (reduce-scatter, momentum) per bucket, as the flow asks for them
            updates = self.store.momentum(g, group, step, self.flow.lazy, trace)
            first = sum(len(gr["params"]) for gr in self.param_groups[:g])   # the vote's place
            apply = Applier([v["master"] for v in views[g]], group, lr, step, first, self.flow.lazy)
            present = step.present[g]
            # stages 3-6: the layout's flow
            for meta, piece in self.flow.run(group, updates, self.options, step):
                if present[meta.param_idx]:
                    # stage 7, in passes of one matrix shape
                    apply.add(meta, piece)
            apply.flush()
            self._guard(g, step, apply.seen)
            # BOOK-END muon-group

    def _adamw(self, g: int, group: dict, lr, step: Step) -> None:
        """AdamW, elementwise: one fused pass over every piece of the group (capturable: counts on the device)."""
        views, counts, todo = self.store.views[g], self.counts.numbers(g), []
        for bucket in self.plan.buckets[g]:
            grads = self.store.grad_pieces(g, bucket, step, self.options.trace)
            todo += [(views[i], grad, counts[i]) for i, grad in zip(bucket.param_indices, grads)
                     if grad is not None and grad.numel()]
        adamw_foreach_([v["master"] for v, _, _ in todo], [grad for _, grad, _ in todo],
                       [v["exp_avg"] for v, _, _ in todo], [v["exp_avg_sq"] for v, _, _ in todo],
                       [n for _, _, n in todo], lr, group["betas"], group["eps"], group["weight_decay"],
                       keep=step.keep)

    def _guard(self, g: int, step: Step, updated: set) -> None:
        """After a Muon group's step: exactly the matrices the plan gives this rank ran Newton-Schulz here, and
        every matrix it holds a piece of got its update (host sets, no device read); else fail, naming them."""
        metas, name = self.plan.metas[g], lambda key: metas[key[1]].name
        planned, ran = self.plan.ns_keys(self.grid.rank, g), {key for key in step.ran if key[0] == g}
        held = {m.param_idx for m in metas if m.local_numel and step.present[g][m.param_idx]}
        if planned != ran or not held <= updated:
            raise RuntimeError(
                f"group {g}, rank {self.grid.rank}: the step did not follow the plan (layout {self.layout!r}): "
                f"planned for Newton-Schulz here but not run {sorted(map(name, planned - ran))}, run but not "
                f"planned {sorted(map(name, ran - planned))}, held here but given no update "
                f"{sorted(metas[i].name for i in held - updated)}")

    def _gather_params(self) -> None:
        """All-gather the master shards into every rank's parameters."""
        for g, group in enumerate(self.param_groups):
            params = group["params"]  # the proof of concept's second loop lacked this line (bug #1)
            for bucket in self.plan.buckets[g]:
                self.store.gather(g, bucket, params)   # stage 8, in place where parameters are buffer views

    def _check_grads(self):
        """Fail on this rank, before any collective, with a message naming the parameter. Returns the
        local gradients, their places among all parameters and where we are, for the NaN/Inf vote (``finite.py``)."""
        where = where_of(self.grid, self.steps_taken + 1)
        grads, index, i = [], [], -1
        for g, group in enumerate(self.param_groups):
            if bool(group["use_muon"]) != self.muon_groups[g]:
                raise ValueError(f"group {g}: use_muon changed after the optimizer was built; its state is "
                                 f"{'Muon' if self.muon_groups[g] else 'AdamW'}'s")
            for name, p in zip(group["names"], group["params"]):
                i += 1
                if p.grad is None:  # skipped if no rank has one, zeros here if another rank has one
                    if self.capturable:
                        raise need_every_grad(name, where)
                    continue
                if p.grad.shape != p.shape:
                    raise ValueError(f"parameter {name!r}: gradient shape {tuple(p.grad.shape)} differs from "
                                     f"parameter shape {tuple(p.shape)} on {where}")
                if p.grad.dtype != p.dtype:
                    raise TypeError(f"parameter {name!r}: gradient dtype {str(p.grad.dtype)[6:]} differs from "
                                    f"parameter dtype {str(p.dtype)[6:]} on {where}; the reduce-scatter would mix "
                                    "precisions across ranks. Cast the gradient (or the model) back")
                if is_dtensor(p) and (not is_dtensor(p.grad) or p.grad.placements != p.placements):
                    raise ValueError(f"parameter {name!r} is a DTensor placed {p.placements} but its gradient is "
                                     f"{getattr(p.grad, 'placements', 'a plain tensor')} on {where}; the optimizer "
                                     "reduces gradients over DP only, so a gradient must be placed as its parameter")
                grads.append((name, local(p.grad)))
                index.append(i)
        return grads, index, where

    # ---- outside the step: options, clipping, state ------------------------------------------------

    @property
    def layout(self) -> str:
        return self.plan.layout

    @property
    def overlap(self) -> str:
        return self.options.overlap

    @property
    def ns_batch(self) -> bool:
        return self.options.ns_batch

    @property
    def chunks(self) -> int | None:
        return self.options.chunks

    @property
    def trace(self):
        """None, or a callable(stage, name, tensor) called at each stage of a step (``scripts/trace_step.py``)."""
        return self.options.trace

    @trace.setter
    def trace(self, fn) -> None:
        self.options = dataclasses.replace(self.options, trace=fn)

    def add_param_group(self, param_group: dict) -> None:
        if self._planned:
            raise RuntimeError("the ZeRO-1 plan is fixed when the optimizer is built: give every parameter group "
                               "to the constructor")
        super().add_param_group(param_group)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False):
        """Clip the DP-mean gradient by its global norm (every rank's shards, TP shards and replicated
        parameters counted once); returns the total norm, as ``torch.nn.utils.clip_grad_norm_``. Call it
        between ``backward()`` and ``step()``: it runs the step's gradient reduce-scatter early and the
        step uses the clipped shards; ``p.grad`` is left as it is (this rank's own gradient). ``clipping.py``."""
        with no_autocast(self.grid.device):
            return clip_zero1_(self, max_norm, norm_type, error_if_nonfinite)

    def state_bytes(self) -> dict:
        """Bytes of optimizer state on this rank, by kind (``rank_state.state_bytes``)."""
        return rank_state.state_bytes(self.store)

    def state_dict(self) -> dict:
        """This rank's shard, as ``torch.optim.Optimizer.state_dict`` makes it, with what it depends on."""
        self.check_finite_now()   # never hand out a state the deferred NaN/Inf check has not cleared
        return dict(super().state_dict(), muongrid=rank_state.signature(self))

    def check_state_dict(self, state_dict: dict) -> None:
        """Raise, naming the problem, unless ``load_state_dict(state_dict)`` would fit; changes nothing."""
        rank_state.check_state_dict(self, state_dict)

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state saved by the same optimizer on the same grid, layout and rank (``rank_state.load``)."""
        rank_state.load(self, state_dict)
        self._step = None

    def __getstate__(self):   # pickling one rank's optimizer is refused, saying what to do (rank_state.py)
        rank_state.refuse_pickle(self)

    def __deepcopy__(self, memo):   # a copy shares the grid, the collectives and the options
        return rank_state.deepcopy_sharing(self, memo, ("grid", "comm", "options"))


class Applier:
    """Stage 7 of a Muon group: decoupled decay and the scaled update into the master pieces, one pass per scaled
    lr (per matrix shape); ``per_bucket``: a bucket at a time, for a flow that makes its results as it goes."""

    def __init__(self, masters: list, group: dict, lr: float, step: Step, first: int, per_bucket: bool):
        """``masters``: the group's master views; ``step``: its ``keep`` masks the update, its ``note_late`` takes
        the updates' norms (``finite.py``); ``first``: the group's first parameter's place among all parameters."""
        self.masters, self.group, self.lr, self.step, self.first = masters, group, lr, step, first
        self.per_bucket, self.bucket, self.todo, self.seen, self.made = per_bucket, None, {}, set(), {}

    def add(self, meta, piece: torch.Tensor) -> None:
        self.seen.add(meta.param_idx)
        if self.per_bucket and meta.bucket_idx != self.bucket:
            self.flush()
            self.bucket = meta.bucket_idx
        whole = self.masters[meta.param_idx]
        scaled = self._scaled(meta.full_shape[-2:])   # a bank: per matrix
        masters, pieces, places = self.todo.setdefault(scaled, ([], [], []))
        # the piece is flat, or the whole TP-local matrix or bank (maybe a transposed view), or a list of
        # (offset, rows) rectangles of a transposed result (owner_flow._block_piece): the master shaped alike
        for offset, part in (piece if isinstance(piece, list) else [(0, piece)]):
            if part.numel():
                masters.append(whole[offset: offset + part.numel()].view(part.shape))
                pieces.append(part)
                places.append(self.first + meta.param_idx)

    def _scaled(self, shape) -> float | torch.Tensor:
        """The shape's scaled lr, made once per distinct value (capturable: a device scalar), so the pieces of
        one shape go in one pass (the dict of passes is keyed by it)."""
        key = lr_key(shape, self.group["adjust_lr"])
        if key not in self.made:
            self.made[key] = adjust_lr(self.lr, shape, self.group["adjust_lr"])
        return self.made[key]

    def flush(self) -> None:
        step = self.step
        for scaled, (masters, pieces, places) in self.todo.items():   # keep: a "defer" step that may be skipped
            if step.late is not None:   # one rank, "defer": the NaN/Inf check rides this pass, on the max-abs
                step.note_late(places, max_abs(pieces))   # norm of the bf16 update
            apply_update_foreach_(masters, pieces, self.lr, self.group["weight_decay"], scaled, step.keep)
        self.todo = {}


class DistributedMuon(ZeroOneOptimizer):
    """Muon under ZeRO-1 x TP; groups with ``use_muon=False`` run AdamW on the same plan (the hybrid).

    Keywords are ``torch.optim.Muon``'s, and AdamW's (betas, eps) for AdamW groups, except one default: the lr
    adjustment is Moonshot's ``adjust_lr_fn="match_rms_adamw"`` (lr * 0.2 * sqrt(max(A, B)), so AdamW's lr and
    weight decay carry over), where torch's is ``"original"`` (lr * sqrt(max(1, A/B))): code ported from
    ``torch.optim.Muon`` passes ``adjust_lr_fn=None`` or ``"original"``. ``eps`` is Newton-Schulz's (1e-7) in a
    Muon group, AdamW's (1e-8) in an AdamW group. Clip with ``opt.clip_grad_norm_(max_norm)`` (the DP mean is
    taken in ``step()``). ``state_dict()`` is this rank's shard: save it on every rank, or use
    ``muongrid.checkpoint`` (any grid, any layout).
    """

    def __init__(self, params, grid, **kwargs):
        super().__init__(params, grid, use_muon=kwargs.pop("use_muon", True), **kwargs)


class DistributedAdamW(ZeroOneOptimizer):
    """AdamW under ZeRO-1: the baseline, with the same plan, buckets and ledger as Distributed Muon.

    Every group runs AdamW, whatever its ``use_muon`` says, so the same parameter groups can be
    given to both optimizers for a like-for-like comparison. A layout changes nothing here.
    """

    def __init__(self, params, grid, **kwargs):
        if isinstance(params, torch.Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            f"but got {torch.typename(params)}: pass [tensor] (torch's own wording and rule)")
        groups = list(params)
        if groups and isinstance(groups[0], dict):
            groups = [dict(g, use_muon=False) for g in groups]
        super().__init__(groups, grid, use_muon=False, **kwargs)
