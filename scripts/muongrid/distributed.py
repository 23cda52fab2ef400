"""Distributed Muon and Distributed AdamW: ``torch.optim.Optimizer``s with ZeRO-1 state, aware of TP.

Each rank holds its TP-local parameters and their gradients (a TP-parallel model's own shards)
and, thanks to ZeRO-1, optimizer state for only its DP shard of every bucket (``plan.py``). One
step, bucket by bucket:

  1. gradients    pack -> reduce-scatter over DP (fp32, sum / dp)            -> my gradient shard
  2. Muon groups  momentum on my shard (fp32) -> the layout's flow (``flows.py``) turns it into my
                  shard of the orthogonalised update -> decay and scaled lr into my fp32 master shard
     AdamW groups AdamW on my shard, elementwise, into my master shard
  3. parameters   all-gather the master shards over DP -> unpack into the parameters

The layout (``layouts.py``) is a choice of the plan: "bucket" (the paper's and the proof of
concept's: every rank orthogonalises every matrix), "owner" (one owner per matrix, Newton-Schulz
once), "aligned" (shards cut on matrix boundaries) or "group" (owner, but a matrix above the fair
share of Newton-Schulz work is orthogonalised by a group of ranks together: ``group_flow.py``). Steps 1 and 3 are AdamW's and the same for
every layout but "aligned", whose uneven shards travel padded.

    opt = DistributedMuon(hybrid_param_groups(model.named_parameters()), grid, layout="owner")
    loss.backward(); opt.step(); opt.zero_grad()

``hw=`` (a hardware profile, ``hardware.py``; the group layout only) sizes the groups by time instead of by
FLOPs: each matrix goes to one owner or to a group of any size, whichever finishes it first counting the
group's collectives on the link its members share (``layouts.assign_timed``); every rank must give the same.
``ns_batch=True`` (owner, aligned and group layouts) has each owner run one batched Newton-Schulz per
distinct matrix shape it owns, instead of one call per matrix (same parameters, bit for bit, on the CPUs
we checked); under "group" a matrix orthogonalised by a group is never batched (each member holds a block
of it: ``group_flow.py``).
``overlap`` picks how transfers meet Newton-Schulz (``flows.py``); by default the bucket layout runs
as the proof of concept did and the owner layouts prefetch (``default_overlap``).

Hyperparameters live in ``param_groups`` (an lr scheduler works); a group may also give
``names`` (for errors) and ``tp_split_dims`` (per parameter: 0 or 1 if the model splits it over
TP, -1 if replicated). Parameters may be DTensors on the grid's "tp" mesh dimension (a model made
tensor-parallel with ``parallelize_module``): their split dim is read from the placement
(``Shard(0)`` -> 0, ``Shard(1)`` -> 1, ``Replicate()`` -> -1) and the optimizer works on their
local shards (``placements.py``). State is per parameter, as torch keeps it: ``master`` (the copy of
the elements this rank owns, fp32, or fp64 for a float64 group), ``momentum`` or ``exp_avg``/``exp_avg_sq``
and ``step``; each is a view into the bucket shard the collectives use. ``state_dict()`` /
``load_state_dict()`` round-trip on the same grid, layout and rank (each rank saves and loads its own).

**As a torch optimizer** (``contract.py``, ``tests/test_contract.py``): a step starts from the parameters'
current values. The master is refreshed from the parameter at the start of every step wherever the
parameter no longer equals the master rounded to the parameter's dtype: for fp32 and fp64 parameters
that is every changed element (the master is then the parameter), for bf16/fp16 parameters the fp32
master keeps its extra bits until someone writes the parameter (loading weights, clamping, EMA swaps).
A gradient that is None on every rank skips its parameter as torch does; None on some ranks counts as
zeros there (one small all-reduce per step decides, the same on every rank). Gradients are averaged
over DP inside the step, so clipping the mean gradient is ``opt.clip_grad_norm_`` (``clipping.py``).

Run it: ``python scripts/verify.py --dp 2 --tp 2 --layout bucket,owner`` (or under ``torchrun``).
"""
from __future__ import annotations

import torch
from torch.profiler import record_function

from .finite import check_finite, finite_flag
from .comm import Comm, Phase
from .contract import MomentumSync, deepcopy_sharing, grads_present, lr_of, refuse_pickle
from .flows import FLOWS
from .optim import DEFAULTS, call_closure, check_group, check_hyper, param_names
from .placements import is_dtensor, local, resolve_tp_split_dims
from .plan import DEFAULT_BUCKET_NUMEL, ParamSpec, build_plan, disagreement, plan_key
from .sharding import local_shard, pack_bucket, unpack_bucket
from .updates import adamw_step_, adjust_lr, apply_update_, muon_momentum_

OVERLAP_MODES = ("none", "naive", "prefetch")


def default_overlap(layout: str) -> str:
    """"none" for the bucket layout (kept exactly as the proof of concept ran it); "prefetch" for the
    owner layouts, which need it: without it every bucket's all-to-all waits for that bucket's busiest
    owner, so the ranks take turns at Newton-Schulz instead of working at once."""
    return "none" if layout == "bucket" else "prefetch"

MUON_STATE, ADAMW_STATE = ("master", "momentum"), ("master", "exp_avg", "exp_avg_sq")


class ZeroOneOptimizer(torch.optim.Optimizer):
    """The engine: ZeRO-1 sharded state, Muon or AdamW per group. Use the two classes below."""

    def __init__(self, params, grid, comm: Comm | None = None, layout: str = "bucket",
                 bucket_numel: int | None = DEFAULT_BUCKET_NUMEL, use_muon: bool = True,
                 check_finite: bool = True, overlap: str | None = None, ns_batch: bool = False,
                 hw: dict | None = None, **hyper):
        hyper = check_hyper(hyper)
        overlap = overlap or default_overlap(layout)
        if overlap not in OVERLAP_MODES:
            raise ValueError(f"overlap must be one of {OVERLAP_MODES}, got {overlap!r}")
        if ns_batch and layout == "bucket":
            raise ValueError("ns_batch=True batches same-shape matrices on their owner: it needs layout='owner', "
                             "'aligned' or 'group' (the bucket layout orthogonalises every matrix on every rank)")
        self.grid, self.overlap, self.check_finite, self.ns_batch = grid, overlap, check_finite, bool(ns_batch)
        self.comm = comm or Comm(grid)
        self.comm.naive_async = overlap == "naive"
        self._planned = False
        super().__init__(params, dict(DEFAULTS, use_muon=use_muon, **hyper))
        for g_idx, group in enumerate(self.param_groups):
            group["names"] = param_names(group, g_idx)
            group["tp_split_dims"] = resolve_tp_split_dims(group["names"], group["params"],
                                                           group.get("tp_split_dims"), grid)
            check_group(group, g_idx)
        MomentumSync.of(self)
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
        self.shards = [[self._init_shard(g, b) for b in buckets] for g, buckets in enumerate(self.plan.buckets)]
        self._bind_state()
        self.steps_taken = 0
        self._prepared = None  # this step's gradient decisions and shards, once clip_grad_norm_ or step made them
        self._planned = True
        self.trace = None  # optional callable(stage, name, tensor), called at each stage (see trace_step.py)

    @property
    def layout(self) -> str:
        return self.plan.layout

    def _make_flow(self, layout: str):
        return FLOWS[layout](self)

    def _check_ranks_agree(self, key: dict) -> None:
        """One small all-gather when the optimizer is built: every rank must plan the same parameters
        (a rank with another model would hang or corrupt the first collective instead)."""
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

    def _init_shard(self, g: int, bucket) -> dict:
        """The fp32 master shard of the bucket's parameters, and Muon's or AdamW's state for it."""
        master = self._param_shard(g, bucket)
        kinds = MUON_STATE if self.muon_groups[g] else ADAMW_STATE
        return {k: master if k == "master" else torch.zeros_like(master) for k in kinds}

    def _param_shard(self, g: int, bucket) -> torch.Tensor:
        """This rank's shard of the bucket's current parameter values, in the group's master dtype."""
        flat = pack_bucket([local(p.detach()) for p in self.param_groups[g]["params"]], bucket, self.master_dtypes[g])
        lo = bucket.shard_numel * self.grid.dp_rank
        return flat[lo: lo + bucket.shard_numel].clone()

    def _refresh_masters(self) -> None:
        """Start the step from the parameters' current values: take the parameter wherever it no longer
        equals the master rounded to its dtype (all of an fp32 parameter that changed; a bf16 parameter's
        fp32 master keeps its extra bits until the parameter is written)."""
        for g, group in enumerate(self.param_groups):
            for bucket in self.plan.buckets[g]:
                master = self.shards[g][bucket.bucket_idx]["master"]
                current = self._param_shard(g, bucket)
                dtype = group["params"][bucket.param_indices[0]].dtype
                rounded = master if dtype == master.dtype else master.to(dtype).to(master.dtype)
                master.copy_(torch.where(current != rounded, current, master))

    def _bind_state(self) -> None:
        """``self.state[p]`` holds views of this rank's part of every shard tensor, plus a step count."""
        for g, group in enumerate(self.param_groups):
            for p, meta in zip(group["params"], self.plan.metas[g]):
                shard = self.shards[g][meta.bucket_idx]
                step = self.state[p].get("step", torch.zeros((), dtype=torch.float32))
                self.state[p] = {k: local_shard(t, self.plan, meta) for k, t in shard.items()}
                self.state[p]["step"] = step

    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd["muongrid"] = self._signature()
        return sd

    def _signature(self) -> dict:
        """What a saved state depends on: resharding to another grid or layout is not done here."""
        return dict(dp=self.grid.dp, tp=self.grid.tp, dp_rank=self.grid.dp_rank, tp_rank=self.grid.tp_rank,
                    layout=self.layout, global_buffer_size=list(self.plan.global_buffer_size))

    def __getstate__(self):
        refuse_pickle(self)

    def __deepcopy__(self, memo):
        return deepcopy_sharing(self, memo, ("grid", "comm", "trace"))

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state saved by the same optimizer on the same grid, layout and rank. Everything is
        checked before anything changes; a mismatch is an error naming it. ``register_load_state_dict_pre_hook``
        and ``_post_hook`` hooks run as in torch."""
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        check_signature(state_dict.get("muongrid"), self._signature())
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("the saved parameter groups differ from this optimizer's in number or size")
        ids = [i for g in groups for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(ids, params):
            theirs, ours = state_dict["state"].get(i, {}), self.state[p]
            if set(theirs) != set(ours) or any(torch.as_tensor(theirs[k]).shape != ours[k].shape for k in ours):
                raise ValueError(f"saved state of parameter {i} has {sorted(theirs)} with other shapes than "
                                 f"this optimizer's {sorted(ours)}")
        for i, p in zip(ids, params):
            for k, t in self.state[p].items():
                t.copy_(torch.as_tensor(state_dict["state"][i][k]))  # a Python-number step too
        for ours, theirs in zip(self.param_groups, groups):
            ours.update({k: v for k, v in theirs.items() if k != "params"})
        MomentumSync.of(self).after_load(self.param_groups)
        self._prepared = None
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    # ---- the step ---------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = call_closure(closure)
        try:
            with record_function("optimizer.step"):  # the contract's checks (_prepare) belong to the step
                self._prepare()
                for group, present in zip(self.param_groups, self._prepared["present"]):
                    for p, here in zip(group["params"], present):
                        if here:
                            self.state[p]["step"] += 1
                self.steps_taken += 1
                self.comm.ledger.begin_step(self.steps_taken)
                self._refresh_masters()
                self._update_master_shards()   # stages 1-7
                self._gather_params()          # stage 8
        finally:
            self._prepared = None
        return loss

    def _prepare(self) -> None:
        """Once per step, before anything changes: sync a scheduler's momentum, check the gradients and
        decide, the same on every rank, which parameters have a gradient somewhere (the others are skipped)."""
        if self._prepared is not None:
            return
        self.comm.ledger.begin_step(self.steps_taken + 1)  # clip_grad_norm_'s reduce-scatter belongs to this step
        MomentumSync.of(self)(self.param_groups)
        grads, where = self._check_grads()
        flag = finite_flag(grads) if self.check_finite else None
        flat, finite = grads_present([p for g in self.param_groups for p in g["params"]], self.comm, flag)
        if flag is not None:
            check_finite(grads, where, known_finite=finite)
        present, i = [], 0
        for group in self.param_groups:
            present.append(flat[i: i + len(group["params"])])
            i += len(group["params"])
        self._prepared = dict(present=present, grad_shards={})

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False):
        """Clip the DP-mean gradient by its global norm (every rank's shards, TP shards and replicated
        parameters counted once); returns the total norm, as ``torch.nn.utils.clip_grad_norm_``. Call it
        between ``backward()`` and ``step()``: it runs the step's gradient reduce-scatter early and the
        step uses the clipped shards; ``p.grad`` is left as it is (this rank's own gradient)."""
        from .clipping import clip_zero1_
        return clip_zero1_(self, max_norm, norm_type, error_if_nonfinite)

    def _grad_shard(self, g: int, bucket) -> torch.Tensor:
        """This rank's DP-mean gradient shard of the bucket (reduced once per step, cached)."""
        self._prepare()
        cache = self._prepared["grad_shards"]
        key = (g, bucket.bucket_idx)
        if key not in cache:
            cache[key] = self._reduce_scatter_grads(self.param_groups[g]["params"], bucket)
        return cache[key]

    def _skipped(self, g: int, bucket) -> list[int]:
        present = self._prepared["present"][g]
        return [i for i in bucket.param_indices if not present[i]]

    def _update_master_shards(self) -> None:
        """Reduce-scatter the gradients and update this rank's master shard of every bucket. A parameter
        with no gradient on any rank keeps its master and state (its Newton-Schulz input is zeros)."""
        for g, group in enumerate(self.param_groups):
            params, lr = group["params"], lr_of(group)
            if group["use_muon"]:
                # BOOK-START muon-group (chapter 5 shows the lines up to BOOK-END)
                present = self._prepared["present"][g]
                # stages 1-2 (reduce-scatter, momentum), per bucket, as the flow asks for them
                updates = ((bucket, self._momentum(g, group, bucket)) for bucket in self.plan.buckets[g])
                for meta, piece in self.flow.run(group, updates):  # stages 3-6: the layout's flow
                    if not present[meta.param_idx]:
                        continue
                    master = local_shard(self.shards[g][meta.bucket_idx]["master"], self.plan, meta)
                    apply_update_(master, piece, lr, group["weight_decay"],              # stage 7
                                  adjust_lr(lr, meta.full_shape, group["adjust_lr"]))
                # BOOK-END muon-group
                continue
            for bucket in self.plan.buckets[g]:
                shard, grad = self.shards[g][bucket.bucket_idx], self._grad_shard(g, bucket)
                steps = [int(self.state[params[i]]["step"]) for i in bucket.param_indices]
                if not self._skipped(g, bucket) and len(set(steps)) == 1:   # the whole bucket at once
                    adamw_step_(shard["master"], grad, shard["exp_avg"], shard["exp_avg_sq"], steps[0], lr,
                                group["betas"], group["eps"], group["weight_decay"])
                    continue
                skipped = self._skipped(g, bucket)
                for i, step in zip(bucket.param_indices, steps):   # elementwise: the same numbers per element
                    if i not in skipped:
                        where = self.plan.shard_slice(self.plan.metas[g][i])
                        adamw_step_(shard["master"][where], grad[where], shard["exp_avg"][where],
                                    shard["exp_avg_sq"][where], step, lr, group["betas"], group["eps"],
                                    group["weight_decay"])

    def _momentum(self, g: int, group: dict, bucket) -> torch.Tensor:
        """This rank's gradient shard of the bucket through Muon's momentum: the shard to orthogonalise.
        A skipped parameter's momentum is left as it is and its part of the result is zeros."""
        buf, grad = self.shards[g][bucket.bucket_idx]["momentum"], self._grad_shard(g, bucket)
        skipped = self._skipped(g, bucket)
        if not skipped:
            update = muon_momentum_(buf, grad, group["momentum"], group["nesterov"])
        else:
            update = torch.zeros_like(buf)
            for i in bucket.param_indices:
                if i not in skipped:
                    where = self.plan.shard_slice(self.plan.metas[g][i])
                    update[where] = muon_momentum_(buf[where], grad[where], group["momentum"], group["nesterov"])
        return self._trace("momentum_shard", f"bucket {bucket.buffer_idx}.{bucket.bucket_idx}", update)

    def _gather_params(self) -> None:
        """All-gather the master shards into every rank's parameters."""
        for g, group in enumerate(self.param_groups):
            params = group["params"]  # the proof of concept's second loop lacked this line (bug #1)
            for bucket in self.plan.buckets[g]:
                self._all_gather_params(params, bucket, self.shards[g][bucket.bucket_idx]["master"])

    def _trace(self, stage: str, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if self.trace is not None:
            self.trace(stage, name, tensor)
        return tensor

    def _reduce_scatter_grads(self, params, bucket) -> torch.Tensor:
        flat = pack_bucket([local(p.grad) if p.grad is not None else torch.zeros_like(local(p.detach()))
                            for p in params], bucket, self.master_dtypes[bucket.buffer_idx])
        shard = self.comm.reduce_scatter_sum(flat, "dp", Phase.GRAD_REDUCE_SCATTER).div_(self.grid.dp)
        return self._trace("grad_shard", f"bucket {bucket.buffer_idx}.{bucket.bucket_idx}", shard)

    def _all_gather_params(self, params, bucket, master: torch.Tensor) -> None:
        dtype = params[bucket.param_indices[0]].dtype
        full = self.comm.all_gather(master.to(dtype), "dp", Phase.PARAM_ALL_GATHER)
        unpack_bucket(full, bucket, self.plan.metas[bucket.buffer_idx], [local(p.data) for p in params])

    def _check_grads(self):
        """Fail on this rank, before any collective, with a message naming the parameter. Returns the
        local gradients and where we are, for the NaN/Inf check read with the step's one host sync."""
        where = f"rank {self.grid.rank} (dp {self.grid.dp_rank}, tp {self.grid.tp_rank}), step {self.steps_taken + 1}"
        grads = []  # checked for NaN/Inf together after the loop: one host sync (finite.py)
        for g, group in enumerate(self.param_groups):
            if bool(group["use_muon"]) != self.muon_groups[g]:
                raise ValueError(f"group {g}: use_muon changed after the optimizer was built; its state is "
                                 f"{'Muon' if self.muon_groups[g] else 'AdamW'}'s")
            for name, p in zip(group["names"], group["params"]):
                if p.grad is None:  # skipped if no rank has one, zeros here if another rank has one
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
        return grads, where

    def state_bytes(self) -> dict:
        """Bytes of optimizer state on this rank, by kind (the master shard is listed apart)."""
        out: dict = {}
        for buckets in self.shards:
            for shard in buckets:
                for k, t in shard.items():
                    out[k] = out.get(k, 0) + t.numel() * t.element_size()
        return out


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
            raise TypeError("params should be an iterable of Tensors or dicts, but got a single "
                            f"{type(params).__name__}: pass [tensor] (as for any torch optimizer)")
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


def check_signature(saved: dict | None, ours: dict) -> None:
    """Refuse a state_dict from another rank, grid or layout, saying which and what to do."""
    if saved == ours:
        return
    if saved is None:
        raise ValueError("this state_dict has no 'muongrid' entry: it was not saved by DistributedMuon/DistributedAdamW "
                         "(a single-device optimizer's state cannot be loaded into ZeRO-1 shards; use muongrid.checkpoint)")
    grid_keys = ("dp", "tp", "layout", "global_buffer_size")
    if all(saved.get(k) == ours[k] for k in grid_keys):
        raise ValueError(f"this state_dict is the shard of rank dp {saved.get('dp_rank')}, tp {saved.get('tp_rank')}; "
                         f"this is rank dp {ours['dp_rank']}, tp {ours['tp_rank']} of the same grid and layout. ZeRO-1 "
                         "keeps each rank's own shard of the optimizer state, so 'save on rank 0, load everywhere' "
                         "cannot work: save opt.state_dict() on every rank (e.g. torch.save(opt.state_dict(), "
                         "f'opt.{rank}.pt')) and load each rank's own file, or use muongrid.checkpoint.save/load "
                         "(one folder, loadable on any grid and layout)")
    differ = {k: (saved.get(k), ours[k]) for k in grid_keys if saved.get(k) != ours[k]}
    raise ValueError(f"this state_dict was saved on another grid or layout ({', '.join(f'{k}: saved {a}, here {b}' for k, (a, b) in differ.items())}); "
                     "a state_dict is one rank's shard of one plan: resharding goes through muongrid.checkpoint.save/load")
