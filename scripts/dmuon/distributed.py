"""Distributed Muon and Distributed AdamW: ZeRO-1 over DP, aware of TP, with the Moonshot flow.

Each rank holds its TP-local parameters and their gradients (a TP-parallel model's own
shards) and, thanks to ZeRO-1, optimizer state for only its DP shard of every bucket (see
``plan.py``). One step, bucket by bucket:

  pass 1, per bucket:
    1. gradients   pack -> reduce-scatter over DP (fp32, sum / dp)          -> my grad shard
    2. Muon groups momentum on my shard (fp32)
                   -> cast to bf16, all-gather over DP (the whole bucket)    "DP gather"
                   -> per matrix: all-gather over TP along tp_split_dim     "TP gather"
                   -> Newton-Schulz on the whole matrix
                   -> keep my TP slice, then my DP part of it               "TP shard", "DP shard"
                   -> update my fp32 master shard (decay, scaled lr)
       AdamW groups AdamW on my shard, elementwise, into the master shard
  pass 2, per bucket:
    3. parameters  all-gather the master shards over DP -> unpack into the parameters

This is the proof of concept's layout: every DP rank gathers whole buckets and every rank
orthogonalises every matrix, which costs the paper's 1.25x upper bound in bytes on a DP-only
grid and repeats Newton-Schulz dp*tp times. The math is in ``updates.py`` and
``newton_schulz.py``, the geometry in ``plan.py``, the tensor moves in ``sharding.py`` and every
collective in ``comm.py``; this file only orders them.

``overlap`` picks how collectives meet compute: "none" (each bucket finished in turn), "naive"
(every collective issued with ``async_op=True`` and waited for at once, the community report's
experiment) or "prefetch" (start every bucket's DP gather, and every matrix's TP gather, before
orthogonalising, so later transfers travel while Newton-Schulz runs). All three give the same
parameters, bit for bit.

Run it: ``python scripts/verify.py --dp 2 --tp 2`` (or under ``torchrun``).
"""
from __future__ import annotations

import torch
from torch.profiler import record_function

from .comm import Comm, Pending
from .newton_schulz import zeropower_ns5
from .optim import DEFAULTS, check_group, param_names
from .plan import DEFAULT_BUCKET_NUMEL, ParamSpec, build_plan
from .sharding import bucket_matrix, dp_shard_of, local_shard, pack_bucket, tp_shard, tp_unshard, unpack_bucket
from .updates import adamw_step_, adjust_lr, apply_update_, muon_momentum_


OVERLAP_MODES = ("none", "naive", "prefetch")


class ZeroOneOptimizer:
    """The engine: ZeRO-1 sharded state, Muon or AdamW per group. Use the two classes below."""

    def __init__(self, params, grid, comm: Comm | None = None, bucket_numel: int | None = DEFAULT_BUCKET_NUMEL,
                 use_muon: bool = True, check_finite: bool = True, overlap: str = "none", **hyper):
        unknown = set(hyper) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"unknown hyperparameters {sorted(unknown)}; known: {sorted(DEFAULTS)}")
        if overlap not in OVERLAP_MODES:
            raise ValueError(f"overlap must be one of {OVERLAP_MODES}, got {overlap!r}")
        self.grid = grid
        self.comm = comm or Comm(grid)
        self.overlap = overlap
        self.comm.naive_async = overlap == "naive"
        self.check_finite = check_finite
        groups = list(params)
        if groups and isinstance(groups[0], torch.Tensor):
            groups = [{"params": groups}]
        self.param_groups = []
        for g_idx, group in enumerate(groups):
            group = {**DEFAULTS, "use_muon": use_muon, **hyper, **group}
            group["params"] = list(group["params"])
            group["names"] = param_names(group, g_idx)
            group["tp_split_dims"] = list(group.get("tp_split_dims") or [-1] * len(group["params"]))
            check_group(group, g_idx)
            self.param_groups.append(group)
        specs = [[ParamSpec(n, self._full_shape(p, d), d)
                  for n, p, d in zip(g["names"], g["params"], g["tp_split_dims"])] for g in self.param_groups]
        self.plan = build_plan(specs, grid.dp, grid.dp_rank, grid.tp, bucket_numel)
        self.state = [[self._init_state(g, b) for b in buckets] for g, buckets in enumerate(self.plan.buckets)]
        self.steps_taken = 0
        self.trace = None  # optional callable(stage, name, tensor), called at each stage (see trace_step.py)

    def _full_shape(self, p: torch.Tensor, tp_split_dim: int) -> tuple[int, ...]:
        shape = list(p.shape)
        if tp_split_dim != -1:
            if not 0 <= tp_split_dim < len(shape):
                raise ValueError(f"tp_split_dim {tp_split_dim} is not a dimension of a {tuple(shape)} parameter")
            shape[tp_split_dim] *= self.grid.tp
        return tuple(shape)

    def _init_state(self, g: int, bucket) -> dict:
        """The fp32 master shard of the bucket's parameters, and Muon's or AdamW's state for it."""
        flat = pack_bucket([p.detach() for p in self.param_groups[g]["params"]], bucket, torch.float32)
        lo = bucket.shard_numel * self.grid.dp_rank
        state = {"master": flat[lo: lo + bucket.shard_numel].clone()}
        if self.param_groups[g]["use_muon"]:
            state["momentum"] = torch.zeros_like(state["master"])
        else:
            state["exp_avg"] = torch.zeros_like(state["master"])
            state["exp_avg_sq"] = torch.zeros_like(state["master"])
        return state

    @torch.no_grad()
    def step(self) -> None:
        self._check_grads()
        self.steps_taken += 1
        self.comm.ledger.begin_step(self.steps_taken)
        with record_function("optimizer.step"):
            self._update_master_shards()
            self._gather_params()

    def _update_master_shards(self) -> None:
        """Pass 1: reduce-scatter the gradients and update this rank's fp32 master shard of every bucket."""
        for g, group in enumerate(self.param_groups):
            params = group["params"]
            if group["use_muon"]:
                self._muon_group(g, group, params)
                continue
            for bucket in self.plan.buckets[g]:
                state = self.state[g][bucket.bucket_idx]
                grad_shard = self._reduce_scatter_grads(params, bucket)
                adamw_step_(state["master"], grad_shard, state["exp_avg"], state["exp_avg_sq"],
                            self.steps_taken, group["lr"], group["betas"], group["eps"], group["weight_decay"])

    def _gather_params(self) -> None:
        """Pass 2: all-gather the master shards into every rank's parameters."""
        for g, group in enumerate(self.param_groups):
            params = group["params"]  # the proof of concept's second loop lacked this line (bug #1)
            for bucket in self.plan.buckets[g]:
                self._all_gather_params(params, bucket, self.state[g][bucket.bucket_idx]["master"])

    def _trace(self, stage: str, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if self.trace is not None:
            self.trace(stage, name, tensor)
        return tensor

    def _reduce_scatter_grads(self, params, bucket) -> torch.Tensor:
        flat = pack_bucket([p.grad for p in params], bucket, torch.float32)
        shard = self.comm.reduce_scatter_sum(flat, "dp", "grad_reduce_scatter").div_(self.grid.dp)
        return self._trace("grad_shard", f"bucket {bucket.buffer_idx}.{bucket.bucket_idx}", shard)

    def _muon_group(self, g: int, group: dict, params) -> None:
        """Momentum and DP gather per bucket, then orthogonalise. With ``overlap="prefetch"`` every
        bucket's DP gather is started before any bucket is orthogonalised, so later gathers travel
        while Newton-Schulz runs on earlier buckets; otherwise each bucket is finished in turn."""
        prefetch = self.overlap == "prefetch"
        in_flight = []
        for bucket in self.plan.buckets[g]:
            state = self.state[g][bucket.bucket_idx]
            where = f"bucket {bucket.buffer_idx}.{bucket.bucket_idx}"
            update = muon_momentum_(state["momentum"], self._reduce_scatter_grads(params, bucket),
                                    group["momentum"], group["nesterov"])
            self._trace("momentum_shard", where, update)
            gather = self.comm.all_gather_async(update.to(torch.bfloat16), "dp", "ns_gather_dp",  # DP gather
                                                wait_now=not prefetch)
            in_flight.append((bucket, state, gather))
            if not prefetch:
                self._orthogonalise_bucket(group, *in_flight.pop())
        for item in in_flight:
            self._orthogonalise_bucket(group, *item)

    def _orthogonalise_bucket(self, group: dict, bucket, state: dict, gather) -> None:
        """TP gather, Newton-Schulz, TP shard, DP shard and update, for every matrix of a gathered bucket.

        Every matrix's TP gather is started first, so with ``overlap="prefetch"`` the gathers of later
        matrices travel while Newton-Schulz runs on earlier ones.
        """
        bucket_update = self._trace("dp_gathered", f"bucket {bucket.buffer_idx}.{bucket.bucket_idx}", gather.wait())
        metas = self.plan.metas[bucket.buffer_idx]
        matrices = []
        for i in bucket.param_indices:
            meta = metas[i]
            matrix = self._trace("ns_input", meta.name, self._unpack_ns_input(bucket_update, bucket, meta))
            if meta.tp_split_dim != -1 and self.grid.tp > 1:                                     # TP gather
                matrix = self.comm.all_gather_async(matrix, "tp", "ns_gather_tp", wait_now=self.overlap != "prefetch")
            matrices.append((meta, matrix))
        for meta, matrix in matrices:
            if isinstance(matrix, Pending):
                matrix = self._trace("tp_gathered", meta.name, tp_unshard(matrix.wait(), meta, self.grid.tp))
            with record_function("muon:newton_schulz"):
                ortho = zeropower_ns5(matrix, group["ns_steps"], group["ns_coefficients"], group["ns_eps"])
            self._trace("orthogonalised", meta.name, ortho)
            tp_part = self._trace("tp_shard", meta.name,                                          # TP shard
                                  tp_shard(ortho, meta.tp_split_dim, self.grid.tp, self.grid.tp_rank, meta.name))
            mine = self._trace("dp_shard", meta.name, dp_shard_of(tp_part, meta))                 # DP shard
            lr = group["lr"]
            apply_update_(local_shard(state["master"], self.plan, meta), mine, lr, group["weight_decay"],
                          adjust_lr(lr, meta.full_shape, group["adjust_lr"]))

    def _unpack_ns_input(self, bucket_update, bucket, meta) -> torch.Tensor:
        """A matrix's TP-local block of the gathered bucket, as a matrix (the PoC's bug #2 was a flat view)."""
        return bucket_matrix(bucket_update, bucket, meta)

    def _all_gather_params(self, params, bucket, master: torch.Tensor) -> None:
        dtype = params[bucket.param_indices[0]].dtype
        full = self.comm.all_gather(master.to(dtype), "dp", "param_all_gather")
        unpack_bucket(full, bucket, self.plan.metas[bucket.buffer_idx], [p.data for p in params])

    def _check_grads(self) -> None:
        """Fail on this rank, before any collective, with a message naming the parameter."""
        where = f"rank {self.grid.rank} (dp {self.grid.dp_rank}, tp {self.grid.tp_rank}), step {self.steps_taken + 1}"
        for group in self.param_groups:
            for name, p in zip(group["names"], group["params"]):
                if p.grad is None:
                    raise ValueError(f"parameter {name!r} has no gradient on {where}. ZeRO-1 reduces every "
                                     "parameter's gradient on every rank, so every rank must have one: "
                                     "use zeros, or leave frozen parameters out of the optimizer")
                if p.grad.shape != p.shape:
                    raise ValueError(f"parameter {name!r}: gradient shape {tuple(p.grad.shape)} differs from "
                                     f"parameter shape {tuple(p.shape)} on {where}")
                if self.check_finite and not torch.isfinite(p.grad).all():
                    bad = (~torch.isfinite(p.grad)).sum().item()
                    raise FloatingPointError(f"gradient of parameter {name!r} has {bad} NaN/Inf value(s) on "
                                             f"{where}; the step was not taken and nothing was changed")

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    def state_bytes(self) -> dict:
        """Bytes of optimizer state on this rank, by kind (the master shard is listed apart)."""
        out: dict = {}
        for buckets in self.state:
            for st in buckets:
                for k, t in st.items():
                    out[k] = out.get(k, 0) + t.numel() * t.element_size()
        return out


class DistributedMuon(ZeroOneOptimizer):
    """Muon under ZeRO-1 x TP; groups with ``use_muon=False`` run AdamW on the same plan (the hybrid)."""

    def __init__(self, params, grid, **kwargs):
        super().__init__(params, grid, use_muon=kwargs.pop("use_muon", True), **kwargs)


class DistributedAdamW(ZeroOneOptimizer):
    """AdamW under ZeRO-1: the baseline, with the same plan, buckets and ledger as Distributed Muon.

    Every group runs AdamW, whatever its ``use_muon`` says, so the same parameter groups can be
    given to both optimizers for a like-for-like comparison.
    """

    def __init__(self, params, grid, **kwargs):
        groups = list(params)
        if groups and isinstance(groups[0], dict):
            groups = [dict(g, use_muon=False) for g in groups]
        super().__init__(groups, grid, use_muon=False, **kwargs)
