"""Distributed Muon and Distributed AdamW: ``torch.optim.Optimizer``s with ZeRO-1 state, aware of TP.

Each rank holds its TP-local parameters and gradients and, thanks to ZeRO-1, optimizer state for only its DP
shard of every bucket (``plan.py``). One step, bucket by bucket:

  1. gradients    reduce-scatter over DP (fp32, sum / dp)                    -> my gradient shard
  2. Muon groups  momentum on my pieces (fp32) -> the layout's flow (``flows.py``, ``owner_flow.py``) turns
                  them into my pieces of the orthogonalised update -> decay and scaled lr into my master shard
     AdamW groups AdamW on my shard, elementwise, into my master shard
  3. parameters   all-gather the master shards over DP, into the parameters in place

The optimizer builds the plan, the store (``store.py``: every bucket's buffers and state) and the layout's
flow, and a step hands them data: ``self.store`` refreshes from the parameters, gives the flow momentum pieces,
``Applier`` writes the flow's results into the masters, and the store all-gathers them. Layouts ("owner", the
default; "bucket", the proof of concept's; "aligned"; "group") are in ``layouts.py``; ``overlap``, ``chunks``,
``ns_batch`` are the flow's options (``flows.FlowOptions``), ``hw`` sizes the group layout's groups by time.

    opt = DistributedMuon(hybrid_param_groups(model.named_parameters()), grid)   # layout="owner"
    loss.backward(); opt.step(); opt.zero_grad()

``capturable=True`` (opt-in; ``capture.py``) keeps lr, weight decay, momentum, betas and step counts in device
tensors and makes ``step()`` read nothing back and copy nothing from the host, so that a CUDA graph could capture
it; the step has not been captured on a GPU yet.

What it promises as a torch optimizer (hyperparameters in ``param_groups``, DTensor parameters, skipped
gradients, per-parameter state views, ``state_dict``) is ``contract.py`` and the book's ``book/api.md``;
chapter 5 walks one step. Run it: ``python scripts/verify.py --dp 2 --tp 2 --layout bucket,owner``.
"""
from __future__ import annotations

import dataclasses

import torch
from torch.profiler import record_function

from .capture import need_every_grad, pin_group
from .capture import refuse as refuse_capture
from .comm import Comm
from .contract import MomentumSync, job_place, lr_of, no_autocast, refuse_ddp, refuse_grad_scaler, vote, where_of
from .finite import Deferred, late_codes
from .flows import OVERLAP_MODES, BucketFlow, FlowOptions  # noqa: F401 (OVERLAP_MODES: bench, verify)
from .optim import DEFAULTS, call_closure, check_group, check_hyper, param_names, resolve_mode
from .owner_flow import OwnerFlow
from .placements import is_dtensor, local, resolve_tp_split_dims
from .plan import ParamSpec, build_plan, disagreement, plan_key
from .rank_state import RankState, deepcopy_sharing, refuse_pickle
from .sharding import local_shard
from .store import Store
from .updates import adamw_foreach_, adjust_lr, apply_update_foreach_, lr_key

FLOWS = {"bucket": BucketFlow, "owner": OwnerFlow, "aligned": OwnerFlow, "group": OwnerFlow}


def default_ns_batch(layout: str, device: torch.device) -> bool:
    """Batch Newton-Schulz by shape on a GPU, where one batched call replaces a launch per matrix (on one H100,
    GPT-2's step fell from 52.9 to 28.8 ms, chapter 14's record); not on a CPU, where a batch runs matrix by
    matrix inside the call and gains nothing, and not under the bucket layout, which cannot batch. Batched or
    not, the ranks compute alike; on a GPU a batched call may round differently from a loop of single ones, so
    a reference to compare with bit for bit must batch the same way (``verify.py --ns-batch``)."""
    return layout != "bucket" and device.type == "cuda"


def default_overlap(layout: str) -> str:
    """"none" for the bucket layout (kept exactly as the proof of concept ran it); "prefetch" for the
    owner layouts, which need it: without it every bucket's all-to-all waits for that bucket's busiest
    owner, so the ranks take turns at Newton-Schulz instead of working at once."""
    return "none" if layout == "bucket" else "prefetch"


class ZeroOneOptimizer(RankState, torch.optim.Optimizer):
    """The engine: ZeRO-1 sharded state, Muon or AdamW per group. Use the two classes below."""

    _step_supports_amp_scaling = True   # so torch.amp.GradScaler hands us its step, and we refuse it (contract.py)

    def __init__(self, params, grid, comm: Comm | None = None, layout: str = "owner",
                 bucket_numel: int | str | None = "auto", use_muon: bool = True,
                 check_finite: bool | str | None = None, overlap: str | None = None, ns_batch: bool | None = None,
                 hw: dict | None = None, param_buffers: bool | str = True, qk_clip=None, chunks: int | None = None,
                 capturable: bool = False, **hyper):
        hyper = check_hyper(hyper)
        overlap = overlap or default_overlap(layout)
        if layout == "group" and getattr(grid, "ep", 1) > 1:
            raise ValueError("layout='group' on an expert grid (grid.expert(ep)) is not supported: its Newton-Schulz "
                             "groups are made by every rank of the job; use 'owner' or 'aligned' for expert groups")
        if ns_batch is None:
            ns_batch = default_ns_batch(layout, torch.device(grid.device))
        if ns_batch and layout == "bucket":
            raise ValueError("ns_batch=True batches same-shape matrices on their owner: it needs layout='owner', "
                             "'aligned' or 'group' (the bucket layout orthogonalises every matrix on every rank)")
        self.grid = grid
        self.options = FlowOptions(overlap, chunks, bool(ns_batch))   # what the flow is told (flows.py)
        self.check_finite = resolve_mode(check_finite, torch.device(grid.device), bool(capturable))
        self._deferred = Deferred()
        self.comm = comm or Comm(grid)
        self.comm.naive_async = overlap == "naive"
        self._planned = False
        super().__init__(params, dict(DEFAULTS, use_muon=use_muon, **hyper))
        for g_idx, group in enumerate(self.param_groups):
            group["names"] = param_names(group, g_idx)
            group["tp_split_dims"] = resolve_tp_split_dims(group["names"], group["params"],
                                                           group.get("tp_split_dims"), grid)
            check_group(group, g_idx, banks=True)
            for name, p, dim in zip(group["names"], group["params"], group["tp_split_dims"]):
                if group["use_muon"] and p.ndim == 3 and dim != -1:
                    raise ValueError(f"parameter {name!r} is a bank of {p.shape[0]} matrices split over TP (dimension "
                                     f"{dim}); a bank must be whole on every TP rank (tp_split_dims -1): split its "
                                     "experts over ranks instead (expert parallelism, not yet here)")
        MomentumSync.of(self)
        self.capturable = bool(capturable)   # hyperparameters and step counts on the device (capture.py)
        if self.capturable:
            refuse_capture(self, qk_clip)
            for group in self.param_groups:
                pin_group(group, grid.device)
            MomentumSync.of(self).reset(self.param_groups)
        self.master_dtypes = [master_dtype(g, i) for i, g in enumerate(self.param_groups)]
        specs = [[ParamSpec(n, self._full_shape(p, d), d) for n, p, d in zip(g["names"], g["params"], g["tp_split_dims"])]
                 for g in self.param_groups]
        self.muon_groups = [bool(g["use_muon"]) for g in self.param_groups]
        dtypes = [[str(p.dtype).replace("torch.", "") for p in g["params"]] for g in self.param_groups]
        self._check_ranks_agree(plan_key(specs, dtypes, layout, bucket_numel, self.muon_groups, hw))
        self.plan = build_plan(specs, grid.dp, grid.dp_rank, grid.tp, bucket_numel, layout, self.muon_groups, hw)
        self.hw = hw   # the hardware profile the group layout's groups were sized on (None: by FLOPs)
        if self.plan.groups:  # collective: every rank has the same plan (checked above), so the same groups
            self.comm.add_subgroups(self.plan.groups.values())
        self.flow = self._make_flow(layout)
        self.store = Store(self.plan, [g["params"] for g in self.param_groups], self.master_dtypes, self.muon_groups,
                           grid, self.comm, bind=param_buffers)
        self.shards = self.store.shards
        self._bind_state()
        self.qk_clip = qk_clip   # MuonClip (qk_clip.py): query and key rows rescaled after each update
        if qk_clip is not None:
            qk_clip.bind_zero1(self)
        self.steps_taken = 0
        self._prepared = None  # this step's gradient decisions and shards, once clip_grad_norm_ or step made them
        self._planned = True

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

    def _make_flow(self, layout: str):
        return FLOWS[layout](self.plan, self.grid, self.comm, self.muon_groups)

    def _check_ranks_agree(self, key: dict) -> None:
        """One small all-gather when the optimizer is built: every rank must plan the same parameters
        (a rank with another model would hang or corrupt the first collective instead). What travels is a
        hash of the plan's key; the whole keys only when the hashes differ, to say where."""
        import hashlib
        digest = hashlib.sha256(repr(key).encode()).hexdigest()
        if len(set(self.comm.gather_objects(digest, "setup"))) == 1:
            return
        problem = disagreement(self.comm.gather_objects(key, "setup"))
        if problem and problem.startswith("the hardware profile"):
            raise ValueError(problem)
        if problem:
            raise ValueError(f"the ranks disagree about the parameters they optimize: {problem}. Every rank "
                             "must build the same model (TP-local shapes aside) and the same parameter groups")

    def add_param_group(self, param_group: dict) -> None:
        if self._planned:
            raise RuntimeError("the ZeRO-1 plan is fixed when the optimizer is built: give every parameter group "
                               "to the constructor")
        super().add_param_group(param_group)

    def _full_shape(self, p: torch.Tensor, tp_split_dim: int) -> tuple[int, ...]:
        if is_dtensor(p):  # a DTensor's shape is already the whole (global) one
            return tuple(p.shape)
        shape = list(p.shape)
        if tp_split_dim != -1:
            if not 0 <= tp_split_dim < len(shape):
                raise ValueError(f"tp_split_dim {tp_split_dim} is not a dimension of a {tuple(shape)} parameter")
            shape[tp_split_dim] *= self.grid.tp
        return tuple(shape)

    # ---- state: bucket shards for the collectives, per-parameter views for torch -------------------

    def _bind_state(self) -> None:
        """``self.state[p]`` holds views of this rank's part of every shard tensor, plus a step count (a view of
        one host tensor per group, so a step counts every parameter with one op). The same views, per bucket,
        are kept in ``self.views`` for the step's passes."""
        self.views: dict = {}
        self._steps = []
        for g, group in enumerate(self.param_groups):
            steps = torch.tensor([float(self.state[p].get("step", 0)) if p in self.state else 0.0
                                  for p in group["params"]], dtype=torch.float32)
            if self.capturable:   # counted on the device, where AdamW's bias corrections are computed
                steps = steps.to(self.grid.device)
            self._steps.append(steps)
            for i, (p, meta) in enumerate(zip(group["params"], self.plan.metas[g])):
                shard = self.shards[g][meta.bucket_idx]
                self.state[p] = {k: local_shard(t, self.plan, meta) for k, t in shard.items()}
                self.state[p]["step"] = steps[i]
            for bucket in self.plan.buckets[g]:
                self.views[(g, bucket.bucket_idx)] = {
                    k: [self.state[group["params"][i]][k] for i in bucket.param_indices]
                    for k in self.shards[g][bucket.bucket_idx]}
        self._masters = [[self.state[p]["master"] for p in group["params"]] for group in self.param_groups]

    def __getstate__(self):
        refuse_pickle(self)

    def __deepcopy__(self, memo):
        return deepcopy_sharing(self, memo, ("grid", "comm", "options"))

    # ---- the step ---------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = call_closure(closure)
        refuse_grad_scaler(self)
        try:
            # the contract's checks (_prepare) belong to the step; no caller's autocast
            with record_function("optimizer.step"), no_autocast(self.grid.device):
                self._prepare()
                self._count_steps()
                self.steps_taken += 1
                self.comm.ledger.begin_step(self.steps_taken)
                self.store.refresh()         # start from the parameters' current values
                self._update_master_shards()   # stages 1-7
                self._launch_deferred()        # "defer": the vote, to the host
                # MuonClip: this step's logits, on the updated masters
                if self.qk_clip is not None:
                    self.qk_clip.apply_zero1(self)
                self._gather_params()          # stage 8
        finally:
            self._prepared = None
        return loss

    def _count_steps(self) -> None:
        """Every parameter with a gradient somewhere counts a step (one op per group on the host). A step that
        "defer" may skip is reported at the next host read, where these counts are taken back (``finite.py``).
        Capturable: counted on the device, every parameter (each has its gradient), masked by the agreed verdict."""
        if self.capturable:
            keep = self._prepared["keep"]
            for steps in self._steps:
                steps.add_(1 if keep is None else keep.to(steps.dtype))
            return
        for steps, present in zip(self._steps, self._prepared["present"]):
            if all(present):
                steps.add_(1)
            elif any(present):
                steps.add_(torch.tensor(present, dtype=steps.dtype))

    def _launch_deferred(self) -> None:
        """Once the step has run: ``check_finite="defer"``'s vote, with the codes the step itself found (one rank:
        its Muon matrices', from their updates, ``Applier.flush``), on its way to the host (``finite.Deferred``)."""
        prepared = self._prepared
        agreed, late = prepared["agreed"], prepared.get("late")
        if agreed is None:
            return
        if late is not None:
            rank, world = job_place(self.grid)[:2]
            agreed = torch.maximum(agreed, late_codes(late, agreed.numel(), rank, world, agreed.device))
        self._deferred.launch(agreed, prepared["keep"], [n for g in self.param_groups for n in g["names"]],
                              self.steps_taken, self.grid.tp, job_place(self.grid)[1],
                              self._uncount_steps(prepared["present"], self.steps_taken), hold=self.capturable)

    def _checked_in_step(self) -> frozenset:
        """Places (in the order of all parameters) whose NaN/Inf check the step makes itself: in a job of one rank
        under "defer", where nothing is masked, every Muon matrix's, from its update (``finite.late_codes``)."""
        if self.check_finite != "defer" or job_place(self.grid)[1] != 1:
            return frozenset()
        places, i = set(), 0
        for g, group in enumerate(self.param_groups):
            if self.muon_groups[g]:
                places.update(range(i, i + len(group["params"])))
            i += len(group["params"])
        return frozenset(places)

    def _uncount_steps(self, present: list, steps_taken: int):
        """What ``_count_steps`` did for a step that turned out skipped ("defer": known at the next host read)."""
        def undo():
            for steps, flags in zip(self._steps, present if not self.capturable else ()):   # capturable: masked
                steps.sub_(torch.tensor(flags, dtype=steps.dtype))
            self.steps_taken = min(self.steps_taken, steps_taken - 1)
        return undo

    def _prepare(self) -> None:
        """Once per step, before anything changes: sync a scheduler's momentum, check the gradients and
        decide, the same on every rank, which parameters have a gradient somewhere (the others are skipped)."""
        if self._prepared is not None:
            return
        if not self.capturable:   # capturable: read between steps, by check_finite_now() (capture.py)
            self.check_finite_now()   # the last step's deferred NaN/Inf check (check_finite="defer")
        self.comm.ledger.begin_step(self.steps_taken + 1)  # clip_grad_norm_'s reduce-scatter belongs to this step
        MomentumSync.of(self)(self.param_groups)
        if self.steps_taken == 0 and not getattr(self, "_ddp_checked", False):
            refuse_ddp([p for g in self.param_groups for p in g["params"]])
            self._ddp_checked = True
        grads, index, where = self._check_grads()
        params = [p for g in self.param_groups for p in g["params"]]
        later = self._checked_in_step()
        flat, keep, agreed = vote(self, params, grads, index, where, later)
        present, i = [], 0
        for group in self.param_groups:
            present.append(flat[i: i + len(group["params"])])
            i += len(group["params"])
        self._prepared = dict(present=present, grads={}, keep=keep, agreed=agreed,
                              late=[] if later and agreed is not None else None)

    def check_finite_now(self) -> int | None:
        """With ``check_finite="defer"``: if the last step was skipped for a NaN/Inf gradient on some rank, say
        so now (a ``finite.SkippedStep`` warning), take back its step counts and return its number."""
        return self._deferred.check()

    @property
    def skipped_steps(self) -> list[int]:
        """The steps that ``check_finite="defer"`` skipped on every rank, as reported so far."""
        return self._deferred.skipped

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False):
        """Clip the DP-mean gradient by its global norm (every rank's shards, TP shards and replicated
        parameters counted once); returns the total norm, as ``torch.nn.utils.clip_grad_norm_``. Call it
        between ``backward()`` and ``step()``: it runs the step's gradient reduce-scatter early and the
        step uses the clipped shards; ``p.grad`` is left as it is (this rank's own gradient)."""
        from .clipping import clip_zero1_
        with no_autocast(self.grid.device):
            return clip_zero1_(self, max_norm, norm_type, error_if_nonfinite)

    def _grad_pieces(self, g: int, bucket) -> list:
        """This rank's DP-mean gradient of each parameter of the bucket, flat (None: skipped), made once per
        step (``Store.grad_pieces``: the reduce-scatter, or ``p.grad`` itself on one DP rank)."""
        self._prepare()
        return self.store.grad_pieces(g, bucket, self._prepared, self.trace)

    def _update_master_shards(self) -> None:
        """Reduce-scatter the gradients and update this rank's master shard of every bucket. A parameter
        with no gradient on any rank keeps its master and state (its Newton-Schulz input is zeros)."""
        for g, group in enumerate(self.param_groups):
            lr = group["lr"] if self.capturable else lr_of(group)   # capturable: a device scalar
            if group["use_muon"]:
                # BOOK-START muon-group (chapter 5 shows the lines up to BOOK-END)
                step, lazy = self._prepared, self.flow.lazy
                # stages 1-2 (reduce-scatter, momentum) per bucket, as the flow asks for them
                updates = self.store.momentum(g, group, step, lazy, self.trace)
                apply = Applier(self._masters[g], group, lr, step, self._place(group, 0), lazy)
                self.flow.done.clear()
                present = step["present"][g]
                # stages 3-6: the layout's flow
                for meta, piece in self.flow.run(group, updates, self.options):
                    if present[meta.param_idx]:
                        # stage 7, in passes of one matrix shape
                        apply.add(meta, piece)
                apply.flush()
                self._guard(g, apply.seen)
                # BOOK-END muon-group
                continue
            # AdamW, elementwise: one fused pass over every piece (capturable: the step counts stay on the device)
            steps, todo = list(self._steps[g]) if self.capturable else self._steps[g].tolist(), []
            for bucket in self.plan.buckets[g]:
                views, grads = self.views[(g, bucket.bucket_idx)], self._grad_pieces(g, bucket)
                todo += [(views, grads, k, i) for k, i in enumerate(bucket.param_indices)
                         if grads[k] is not None and grads[k].numel()]
            adamw_foreach_([v["master"][k] for v, _, k, _ in todo], [gr[k] for _, gr, k, _ in todo],
                           [v["exp_avg"][k] for v, _, k, _ in todo], [v["exp_avg_sq"][k] for v, _, k, _ in todo],
                           [steps[i] for _, _, _, i in todo], lr, group["betas"], group["eps"], group["weight_decay"],
                           keep=self._prepared["keep"])

    def _guard(self, g: int, updated: set) -> None:
        """After a Muon group's step: every matrix the plan gives this rank ran Newton-Schulz here, nothing else
        did, and every matrix this rank holds a piece of got its update (host sets, no device read). Silent
        routing (a planned matrix skipped, or updated without orthogonalisation) fails here, loudly."""
        metas, name = self.plan.metas[g], lambda key: metas[key[1]].name
        planned, ran = self.plan.ns_keys(self.grid.rank, g), self.flow.done
        held = {m.param_idx for m in metas if m.local_numel and self._prepared["present"][g][m.param_idx]}
        if planned != ran or not held <= updated:
            raise RuntimeError(
                f"group {g}, rank {self.grid.rank}: the step did not follow the plan (layout {self.layout!r}): "
                f"planned for Newton-Schulz here but not run {sorted(map(name, planned - ran))}, run but not "
                f"planned {sorted(map(name, ran - planned))}, held here but given no update "
                f"{sorted(metas[i].name for i in held - updated)}")

    def _place(self, group: dict, param_idx: int) -> int:
        """A parameter's place in the order of all parameters (the vote's)."""
        i = 0
        for gr in self.param_groups:
            if gr is group:
                return i + param_idx
            i += len(gr["params"])
        raise KeyError("not a parameter group of this optimizer")

    def _gather_params(self) -> None:
        """All-gather the master shards into every rank's parameters."""
        for g, group in enumerate(self.param_groups):
            params = group["params"]  # the proof of concept's second loop lacked this line (bug #1)
            for bucket in self.plan.buckets[g]:
                self._all_gather_params(params, bucket, self.shards[g][bucket.bucket_idx]["master"])

    def _all_gather_params(self, params, bucket, master: torch.Tensor) -> None:
        """Stage 8: every rank's master shard into every rank's parameters (in place where they are views of
        the bucket's buffer, ``store.py``)."""
        self.store.gather(bucket.buffer_idx, bucket, params)

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

    def state_bytes(self) -> dict:
        """Bytes of optimizer state on this rank, by kind. ``master`` counts only master shards kept apart
        from the parameters (bf16 parameters' fp32 masters, unbound buckets): an fp32 parameter bound to its
        bucket's buffer is its own master and costs nothing more (``store.py``)."""
        out: dict = {}
        for buckets in self.shards:
            for shard in buckets:
                for k, t in shard.items():
                    if k != "master":
                        out[k] = out.get(k, 0) + t.numel() * t.element_size()
        out["master"] = self.store.allocated_master_bytes()
        return out


class Applier:
    """Stage 7 of a Muon group: decoupled decay and the scaled update into the master pieces, one pass per
    scaled lr (one per matrix shape), over every piece the flow handed back (``per_bucket``: a bucket at a
    time, for a flow that makes its results as it goes, so they need not all be alive at once)."""

    def __init__(self, masters: list, group: dict, lr: float, step: dict, first: int, per_bucket: bool):
        """``masters``: the group's master views; ``step``: the step's ``keep`` and ``late`` (``finite.py``);
        ``first``: the group's first parameter's place among all parameters."""
        self.masters, self.group, self.lr, self.first, self.per_bucket = masters, group, lr, first, per_bucket
        self.keep, self.late = step["keep"], step.get("late")
        self.bucket, self.todo, self.seen = None, {}, set()

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
        """The shape's scaled lr: a number, or (capturable) one device scalar per distinct value, so the pieces of
        one shape still go in one pass (the dict of passes is keyed by it)."""
        mode = self.group["adjust_lr"]
        if not isinstance(self.lr, torch.Tensor):
            return adjust_lr(self.lr, shape, mode)
        made = self.__dict__.setdefault("_made", {})
        key = lr_key(shape, mode)
        if key not in made:
            made[key] = adjust_lr(self.lr, shape, mode)
        return made[key]

    def flush(self) -> None:
        for scaled, (masters, pieces, places) in self.todo.items():   # keep: a "defer" step that may be skipped
            if self.late is not None:   # one rank, "defer": the NaN/Inf check rides this pass, on the max-abs
                self.late += zip(places, torch._foreach_norm(pieces, float("inf")))   # norm of the bf16 update
            apply_update_foreach_(masters, pieces, self.lr, self.group["weight_decay"], scaled, self.keep)
        self.todo = {}


class DistributedMuon(ZeroOneOptimizer):
    """Muon under ZeRO-1 x TP; groups with ``use_muon=False`` run AdamW on the same plan (the hybrid).

    Keywords are ``torch.optim.Muon``'s (lr, weight_decay, momentum, nesterov, ns_coefficients, eps,
    ns_steps, adjust_lr_fn) with its meaning, and AdamW's (betas, eps) for AdamW groups, except one
    default: the lr adjustment is Moonshot's ``adjust_lr_fn="match_rms_adamw"`` (lr * 0.2 * sqrt(max(A, B)),
    so AdamW's lr and weight decay carry over), where torch's default (None) is ``"original"``
    (lr * sqrt(max(1, A/B))). Code ported from ``torch.optim.Muon`` passes ``adjust_lr_fn=None`` or
    ``"original"`` to take the same step. ``eps`` is Newton-Schulz's (1e-7) in a Muon group and AdamW's
    (1e-8) in an AdamW group. Gradients are averaged over DP inside ``step()``: clip with
    ``opt.clip_grad_norm_(max_norm)``, not ``torch.nn.utils.clip_grad_norm_``. ``state_dict()`` is this
    rank's shard: save it on every rank, or use ``muongrid.checkpoint`` (any grid, any layout).
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


def master_dtype(group: dict, g_idx: int) -> torch.dtype:
    """fp64 for a group of float64 parameters (kept float64, as torch keeps them), fp32 otherwise."""
    dtypes = {p.dtype for p in group["params"]}
    if torch.float64 in dtypes and len(dtypes) > 1:
        raise ValueError(f"group {g_idx} mixes float64 parameters with {sorted(str(d)[6:] for d in dtypes - {torch.float64})}; "
                         "ZeRO-1 keeps one master dtype per group: put the float64 parameters in a group of their own")
    return torch.float64 if dtypes == {torch.float64} else torch.float32
