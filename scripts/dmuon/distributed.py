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
once) or "aligned" (shards cut on matrix boundaries). Steps 1 and 3 are AdamW's and the same for
every layout but "aligned", whose uneven shards travel padded.

    opt = DistributedMuon(hybrid_param_groups(model.named_parameters()), grid, layout="owner")
    loss.backward(); opt.step(); opt.zero_grad()

``overlap`` picks how transfers meet Newton-Schulz (``flows.py``); by default the bucket layout runs
as the proof of concept did and the owner layouts prefetch (``default_overlap``).

Hyperparameters live in ``param_groups`` (an lr scheduler works); a group may also give
``names`` (for errors) and ``tp_split_dims`` (per parameter: 0 or 1 if the model splits it over
TP, -1 if replicated). Parameters may be DTensors on the grid's "tp" mesh dimension (a model made
tensor-parallel with ``parallelize_module``): their split dim is read from the placement
(``Shard(0)`` -> 0, ``Shard(1)`` -> 1, ``Replicate()`` -> -1) and the optimizer works on their
local shards (``placements.py``). State is per parameter, as torch keeps it: ``master`` (the fp32 copy of
the elements this rank owns), ``momentum`` or ``exp_avg``/``exp_avg_sq`` and ``step``; each is a
view into the bucket shard the collectives use. ``state_dict()`` / ``load_state_dict()``
round-trip on the same grid and layout.

Run it: ``python scripts/verify.py --dp 2 --tp 2 --layout bucket,owner`` (or under ``torchrun``).
"""
from __future__ import annotations

import torch
from torch.profiler import record_function

from .finite import check_finite
from .comm import Comm, Phase
from .flows import FLOWS
from .optim import DEFAULTS, call_closure, check_group, param_names
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
                 check_finite: bool = True, overlap: str | None = None, **hyper):
        unknown = set(hyper) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"unknown hyperparameters {sorted(unknown)}; known: {sorted(DEFAULTS)}")
        overlap = overlap or default_overlap(layout)
        if overlap not in OVERLAP_MODES:
            raise ValueError(f"overlap must be one of {OVERLAP_MODES}, got {overlap!r}")
        self.grid, self.overlap, self.check_finite = grid, overlap, check_finite
        self.comm = comm or Comm(grid)
        self.comm.naive_async = overlap == "naive"
        self._planned = False
        super().__init__(params, dict(DEFAULTS, use_muon=use_muon, **hyper))
        for g_idx, group in enumerate(self.param_groups):
            group["names"] = param_names(group, g_idx)
            group["tp_split_dims"] = resolve_tp_split_dims(group["names"], group["params"],
                                                           group.get("tp_split_dims"), grid)
            check_group(group, g_idx)
        specs = [[ParamSpec(n, self._full_shape(p, d), d) for n, p, d in zip(g["names"], g["params"], g["tp_split_dims"])]
                 for g in self.param_groups]
        self.muon_groups = [bool(g["use_muon"]) for g in self.param_groups]
        self._check_ranks_agree(plan_key(specs, [[str(p.dtype).replace("torch.", "") for p in g["params"]]
                                                 for g in self.param_groups], layout, bucket_numel, self.muon_groups))
        self.plan = build_plan(specs, grid.dp, grid.dp_rank, grid.tp, bucket_numel, layout, self.muon_groups)
        self.flow = self._make_flow(layout)
        self.shards = [[self._init_shard(g, b) for b in buckets] for g, buckets in enumerate(self.plan.buckets)]
        self._bind_state()
        self.steps_taken = 0
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
        flat = pack_bucket([local(p.detach()) for p in self.param_groups[g]["params"]], bucket, torch.float32)
        lo = bucket.shard_numel * self.grid.dp_rank
        master = flat[lo: lo + bucket.shard_numel].clone()
        kinds = MUON_STATE if self.muon_groups[g] else ADAMW_STATE
        return {k: master if k == "master" else torch.zeros_like(master) for k in kinds}

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
        sd["dmuon"] = self._signature()
        return sd

    def _signature(self) -> dict:
        """What a saved state depends on: resharding to another grid or layout is not done here."""
        return dict(dp=self.grid.dp, tp=self.grid.tp, dp_rank=self.grid.dp_rank, tp_rank=self.grid.tp_rank,
                    layout=self.layout, global_buffer_size=list(self.plan.global_buffer_size))

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state saved by the same optimizer on the same grid, layout and rank. Everything is
        checked before anything changes; a mismatch is an error naming it."""
        saved = state_dict.get("dmuon")
        if saved != self._signature():
            raise ValueError(f"this state was saved on {saved}; this optimizer is {self._signature()}. "
                             "Loading onto another grid or layout needs a resharding checkpoint")
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("the saved parameter groups differ from this optimizer's in number or size")
        ids = [i for g in groups for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(ids, params):
            theirs, ours = state_dict["state"].get(i, {}), self.state[p]
            if set(theirs) != set(ours) or any(theirs[k].shape != ours[k].shape for k in ours):
                raise ValueError(f"saved state of parameter {i} has {sorted(theirs)} with other shapes than "
                                 f"this optimizer's {sorted(ours)}")
        for i, p in zip(ids, params):
            for k, t in self.state[p].items():
                t.copy_(state_dict["state"][i][k])
        for ours, theirs in zip(self.param_groups, groups):
            ours.update({k: v for k, v in theirs.items() if k != "params"})

    # ---- the step ---------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = call_closure(closure)
        self._check_grads()
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["step"] += 1
        self.steps_taken += 1
        self.comm.ledger.begin_step(self.steps_taken)
        with record_function("optimizer.step"):
            self._update_master_shards()
            self._gather_params()
        return loss

    def _update_master_shards(self) -> None:
        """Reduce-scatter the gradients and update this rank's fp32 master shard of every bucket."""
        for g, group in enumerate(self.param_groups):
            params = group["params"]
            if group["use_muon"]:
                updates = ((bucket, self._momentum(g, group, bucket)) for bucket in self.plan.buckets[g])
                for meta, piece in self.flow.run(group, updates):
                    lr = group["lr"]
                    master = local_shard(self.shards[g][meta.bucket_idx]["master"], self.plan, meta)
                    apply_update_(master, piece, lr, group["weight_decay"],
                                  adjust_lr(lr, meta.full_shape, group["adjust_lr"]))
                continue
            for bucket in self.plan.buckets[g]:
                shard = self.shards[g][bucket.bucket_idx]
                step = int(self.state[params[bucket.param_indices[0]]]["step"])
                adamw_step_(shard["master"], self._reduce_scatter_grads(params, bucket), shard["exp_avg"],
                            shard["exp_avg_sq"], step, group["lr"], group["betas"], group["eps"], group["weight_decay"])

    def _momentum(self, g: int, group: dict, bucket) -> torch.Tensor:
        """This rank's gradient shard of the bucket through Muon's momentum: the shard to orthogonalise."""
        update = muon_momentum_(self.shards[g][bucket.bucket_idx]["momentum"],
                                self._reduce_scatter_grads(group["params"], bucket), group["momentum"], group["nesterov"])
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
        flat = pack_bucket([local(p.grad) for p in params], bucket, torch.float32)
        shard = self.comm.reduce_scatter_sum(flat, "dp", Phase.GRAD_REDUCE_SCATTER).div_(self.grid.dp)
        return self._trace("grad_shard", f"bucket {bucket.buffer_idx}.{bucket.bucket_idx}", shard)

    def _all_gather_params(self, params, bucket, master: torch.Tensor) -> None:
        dtype = params[bucket.param_indices[0]].dtype
        full = self.comm.all_gather(master.to(dtype), "dp", Phase.PARAM_ALL_GATHER)
        unpack_bucket(full, bucket, self.plan.metas[bucket.buffer_idx], [local(p.data) for p in params])

    def _check_grads(self) -> None:
        """Fail on this rank, before any collective, with a message naming the parameter."""
        where = f"rank {self.grid.rank} (dp {self.grid.dp_rank}, tp {self.grid.tp_rank}), step {self.steps_taken + 1}"
        grads = []  # checked for NaN/Inf together after the loop: one host sync (finite.py)
        for g, group in enumerate(self.param_groups):
            if bool(group["use_muon"]) != self.muon_groups[g]:
                raise ValueError(f"group {g}: use_muon changed after the optimizer was built; its state is "
                                 f"{'Muon' if self.muon_groups[g] else 'AdamW'}'s")
            for name, p in zip(group["names"], group["params"]):
                if p.grad is None:
                    raise ValueError(f"parameter {name!r} has no gradient on {where}. ZeRO-1 reduces every "
                                     "parameter's gradient on every rank, so every rank must have one: "
                                     "use zeros, or leave frozen parameters out of the optimizer")
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
        if self.check_finite:
            check_finite(grads, where)

    def state_bytes(self) -> dict:
        """Bytes of optimizer state on this rank, by kind (the master shard is listed apart)."""
        out: dict = {}
        for buckets in self.shards:
            for shard in buckets:
                for k, t in shard.items():
                    out[k] = out.get(k, 0) + t.numel() * t.element_size()
        return out


class DistributedMuon(ZeroOneOptimizer):
    """Muon under ZeRO-1 x TP; groups with ``use_muon=False`` run AdamW on the same plan (the hybrid)."""

    def __init__(self, params, grid, **kwargs):
        super().__init__(params, grid, use_muon=kwargs.pop("use_muon", True), **kwargs)


class DistributedAdamW(ZeroOneOptimizer):
    """AdamW under ZeRO-1: the baseline, with the same plan, buckets and ledger as Distributed Muon.

    Every group runs AdamW, whatever its ``use_muon`` says, so the same parameter groups can be
    given to both optimizers for a like-for-like comparison. A layout changes nothing here.
    """

    def __init__(self, params, grid, **kwargs):
        groups = list(params)
        if groups and isinstance(groups[0], dict):
            groups = [dict(g, use_muon=False) for g in groups]
        super().__init__(groups, grid, use_muon=False, **kwargs)
