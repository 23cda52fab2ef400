"""Muon for FSDP2 (``fully_shard``) models: each matrix orthogonalised once, by one owner rank.

    model = tp_gpt(vocab, grid)                      # tensor-parallel on grid.mesh["tp"] (or a plain model)
    fully_shard(model, mesh=grid.mesh["dp"])         # FSDP2 on "dp": parameters become Shard(0) DTensors
    opt = FSDPMuon(hybrid_param_groups(model.named_parameters()), grid)
    loss.backward(); opt.step(); opt.zero_grad()

    python scripts/train.py --fsdp --dp 2 --tp 2 --optimizer hybrid --steps 20 --compare-torch-muon

**Why.** After ``fully_shard`` every rank holds a block of rows of every parameter, and FSDP2 leaves each
gradient reduce-scattered and averaged over "dp", placed like its parameter. AdamW is elementwise and
runs on those blocks as they are. Newton-Schulz is not: it needs the whole matrix. ``torch.optim.Muon``
accepts the DTensors, and DTensor then gathers every matrix on every rank inside Newton-Schulz (a dozen
collectives per matrix), so each matrix is orthogonalised ``world`` times. Here, per step:

  1. momentum (``updates.muon_momentum_``) on the local block, elementwise, in the parameter's dtype;
  2. one all-to-all (bf16) sends each block to its matrix's owner (``fsdp_routes``: owners balance
     Newton-Schulz FLOPs with the engine's ``layouts.assign_owners``; a block replicated over TP is sent once);
  3. the owner places the blocks at their global offsets (DTensor's ``compute_local_shape_and_global_offset``:
     uneven rows, TP columns and FSDP2-over-TP's strided rows alike) and runs ``zeropower_ns5`` once;
  4. one all-to-all sends every rank its block of the result; ``updates.apply_update_`` applies it
     (decoupled decay, ``adjust_lr`` of the whole matrix's shape);
  AdamW groups: ``updates.adamw_step_`` on the local blocks. No other communication.

The math is the engine's pure functions, on the same numbers, so the parameters equal single-device
``muongrid.MuonW``'s bit for bit given the same gradients (``tests/test_fsdp.py``).

**Not a DistributedMuon mode.** ``DistributedMuon`` owns ZeRO-1's flat buffers: it reduce-scatters
gradients, keeps fp32 master shards cut anywhere in a bucket and all-gathers parameters. Under FSDP2 all
three belong to FSDP2 and the shards are DTensor rectangles, not buffer ranges, so the plan has nothing
to say. What is shared is what matters: the owner rule, the Newton-Schulz and update functions, and the
``Comm`` wrapper (ledger phases ``ns_to_owner`` / ``ns_from_owner``, Newton-Schulz calls counted).

**State** is torch's: per Muon parameter ``momentum_buffer``, per AdamW parameter ``step``, ``exp_avg``,
``exp_avg_sq``, each a DTensor placed like its parameter, created when the optimizer is built. So
``state_dict()`` round-trips, FSDP2's own ``get_state_dict`` / ``set_state_dict`` read it, and
``muongrid.checkpoint.save`` / ``load`` save it on one grid and load it on another (``checkpoint_fsdp.py``).

**Sharded by someone else.** A model sharded on any 1-D mesh whose ranks are the grid's DP group is read as
sharded over "dp", whatever the mesh's dimension is called: ``fully_shard(model)`` with no mesh (torch's default,
unnamed), Accelerate's and HF Trainer's FSDP2; ``Grid.from_mesh(mesh)`` is the grid of such a mesh. Built on
plain parameters (Accelerate's order: the optimizer first, then ``prepare`` shards the model and puts FSDP2's
parameters in ``param_groups``), FSDPMuon makes its plan and its state at the first step; a parameter still
plain then is refused, naming the order that works. Run on a CPU (``tests/test_fsdp.py``, 3 gloo ranks): the
default mesh, and accelerate 1.16's own FSDP2 ``prepare`` with its state set to FSDP2 by hand, since on a CPU it
wraps in DDP whatever its FSDP2 plugin says (refused here by name). On paper only: Accelerate and HF Trainer
reaching FSDP2 themselves (GPUs), with their mixed-precision upcast and ``cpu_ram_efficient_loading``.

**As a torch optimizer** (``contract.py``): parameters are updated in place (no master copy: FSDP2 keeps
the sharded parameters in their own dtype), so a step starts from their current values; a gradient that
is None on every rank skips its parameter, None on some ranks counts as zeros there (one small all-reduce
per step decides); ``opt.clip_grad_norm_`` clips FSDP2's DP-mean gradients by their global norm.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.profiler import record_function

from .finite import Deferred
from .step import Step
from .comm import Comm, Phase
from .fsdp_routes import Piece, routes
from .newton_schulz import NS_FORM, ns_flops, zeropower_ns5
from .contract import MomentumSync, job_place, lr_of, no_autocast, refuse_ddp, refuse_grad_scaler, vote, where_of
from .optim import call_closure, check_group, check_hyper, param_names, resolve_mode
from .placements import is_dtensor
from .rank_state import after_load, refuse_pickle
from .updates import adamw_step_, adjust_lr, apply_update_, muon_momentum_


def local_grad(p: torch.Tensor) -> torch.Tensor:
    """This rank's block of ``p``'s gradient, or zeros where this rank has none (another rank has one)."""
    return p.grad.to_local() if p.grad is not None else torch.zeros_like(p.to_local())


def refuse_ddp_model(params: list) -> None:
    """Parameters still plain at the first step because a DDP wrapper holds them (Accelerate on a CPU uses DDP
    whatever its FSDP2 plugin says): say that, rather than "a plain tensor"."""
    try:
        refuse_ddp(params)
    except RuntimeError as e:
        raise RuntimeError("these parameters belong to a model wrapped in DistributedDataParallel, not sharded by "
                           "FSDP2 (Accelerate on a CPU uses DDP whatever its FSDP2 plugin says): FSDPMuon needs "
                           "fully_shard's parameters; for a DDP model use DistributedMuon(groups, grid, "
                           "grad_reduce='ddp')") from e


def fsdp_piece(name: str, p: torch.Tensor, grid) -> Piece:
    """This rank's rectangle of an FSDP2 parameter, after checking that it is one and lives on ``grid``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    from torch.distributed.tensor.placement_types import _StridedShard

    if not is_dtensor(p):
        raise ValueError(f"parameter {name!r} is a plain tensor, not an FSDP2 parameter: call fully_shard(model) "
                         "before the first step (FSDPMuon built on plain parameters makes its plan there, once "
                         "Accelerate's prepare or your own fully_shard has replaced them); for a model without FSDP "
                         "use DistributedMuon")
    mesh, named = p.device_mesh, tuple(p.device_mesh.mesh_dim_names or ())
    if mesh.ndim == 1 and named != ("tp",):
        names = ("dp",)   # a 1-D mesh of any name (fully_shard's default, Accelerate's): read as the DP group
    elif named == ("dp", "tp"):
        names = named
    else:
        raise ValueError(f"parameter {name!r} is a DTensor on a mesh with dimensions {named or '(unnamed)'}; "
                         "FSDPMuon reads FSDP2 parameters sharded on a 1-D mesh (any name) whose ranks are the grid's "
                         "DP group, or on the grid's ('dp', 'tp') mesh")
    sizes = dict(dp=grid.dp, tp=grid.tp)
    for i, dim in enumerate(names):
        if mesh.size(i) != sizes[dim]:
            raise ValueError(f"parameter {name!r}: mesh dimension {named[i] if named else 0!r} has size "
                             f"{mesh.size(i)}, the grid has {dim}={sizes[dim]}; build the grid from the model's mesh "
                             "(Grid.from_mesh) or the model on grid.mesh")
    if names == ("dp",):
        expected = [d * grid.tp + grid.tp_rank for d in range(grid.dp)]
    else:
        expected = list(range(grid.dp * grid.tp))
    if [int(r) for r in mesh.mesh.reshape(-1)] != expected:
        raise ValueError(f"parameter {name!r} lives on ranks {mesh.mesh.tolist()}, not on this grid's "
                         f"{'DP group' if names == ('dp',) else 'mesh'} {expected}: build the grid from the model's "
                         "mesh (Grid.from_mesh) or the model on grid.mesh")
    for dim, pl in zip(names, p.placements):
        row_shard = isinstance(pl, (Shard, _StridedShard)) and pl.dim == 0
        if dim == "dp" and not (row_shard or (isinstance(pl, Replicate) and grid.dp == 1)):
            raise ValueError(f"parameter {name!r} is placed {p.placements}: FSDP2 shards rows over 'dp' (Shard(0)); "
                             "anything else is not a fully_shard parameter")
        if dim == "tp" and not isinstance(pl, (Shard, Replicate)):
            raise ValueError(f"parameter {name!r}: placement {pl} on 'tp' is not supported (Shard(d) or Replicate())")
    shape, offset = compute_local_shape_and_global_offset(p.shape, mesh, p.placements)
    if tuple(shape) != tuple(p.to_local().shape):
        raise ValueError(f"parameter {name!r}: local block {tuple(p.to_local().shape)} is not the {tuple(shape)} "
                         f"its placements {p.placements} give")
    return Piece(tuple(int(o) for o in offset), tuple(int(s) for s in shape))


class FSDPMuon(torch.optim.Optimizer):
    """Muon (and AdamW for groups with ``use_muon=False``) on FSDP2 parameters; one owner per matrix.

    Keywords as ``DistributedMuon``'s: ``torch.optim.Muon``'s with its meaning, except the default lr
    adjustment, Moonshot's ``adjust_lr_fn="match_rms_adamw"`` (torch's default None is "original").
    Clip FSDP2's mean gradients with ``opt.clip_grad_norm_(max_norm)`` (global norm, TP counted once).
    """

    _step_supports_amp_scaling = True   # so torch.amp.GradScaler hands us its step, and we refuse it (contract.py)
    checkpoint_engine = "fsdp"   # muongrid.checkpoint saves it through checkpoint_fsdp.py

    def __init__(self, params, grid, comm: Comm | None = None, use_muon: bool = True,
                 check_finite: bool | str | None = None, qk_clip=None, **hyper):
        from .optim import DEFAULTS
        if "grad_reduce" in hyper:
            raise TypeError(f"FSDPMuon takes no grad_reduce (got {hyper['grad_reduce']!r}): FSDP2 reduce-scatters "
                            "the gradients in backward itself, before step(); grad_reduce is DistributedMuon's")
        hyper = check_hyper(hyper)
        self.grid = grid
        self.check_finite = resolve_mode(check_finite, torch.device(grid.device))   # finite.py: "raise" or "defer"
        self._deferred = Deferred()
        self.comm = comm or Comm(grid)
        super().__init__(params, dict(DEFAULTS, use_muon=use_muon, **hyper))
        for g_idx, group in enumerate(self.param_groups):
            group["names"] = param_names(group, g_idx)
            check_group(group, g_idx, banks=True)
        self.muon_groups = [bool(g["use_muon"]) for g in self.param_groups]
        MomentumSync.of(self)
        self.steps_taken = 0
        self.qk_clip = qk_clip   # MuonClip (qk_clip.py): query and key rows rescaled after each update
        self.routes = None
        if any(is_dtensor(p) for p in self._all_params()):
            self._plan()
        # else every parameter is plain: Accelerate's order (the optimizer built first, then prepare shards the
        # model and swaps the parameters in param_groups for FSDP2's): the plan waits for the first step
        self._built = True

    def _plan(self) -> None:
        """Each rank's rectangle of every parameter (checked), the Muon matrices' owners and routes, and zero state
        for every parameter that has none: when built, or at the first step if the parameters were plain then."""
        grid, mine = self.grid, []
        for group in self.param_groups:
            for n, p in zip(group["names"], group["params"]):
                if group["use_muon"] and p.ndim == 3 and is_dtensor(p) and p.device_mesh.ndim != 1:
                    raise ValueError(f"parameter {n!r} is a bank of matrices on a {p.device_mesh.mesh_dim_names} "
                                     "mesh; FSDPMuon takes banks sharded over 'dp' only (each rank's experts whole)")
            mine.append([(n, tuple(p.shape), fsdp_piece(n, p, grid)) for n, p in zip(group["names"], group["params"])])
        self.pieces = {id(p): piece for g, group in zip(mine, self.param_groups)
                       for (_, _, piece), p in zip(g, group["params"])}
        everyone = self.comm.gather_objects(mine, "setup")  # one small all-gather when planned
        for rank, theirs in enumerate(everyone):
            if [[(n, s) for n, s, _ in g] for g in theirs] != [[(n, s) for n, s, _ in g] for g in mine]:
                raise ValueError(f"the ranks disagree about the parameters they optimize (rank {rank} differs from "
                                 f"rank {grid.rank} in names, shapes or groups); every rank must build the same model")
        # A bank of matrices (a MoE layer's experts, experts x out x in) is sharded by FSDP2 over its experts, so
        # each rank holds whole experts: Newton-Schulz runs on them where they are, with no route and no traffic.
        self.banks = [p for group in self.param_groups if group["use_muon"] for p in group["params"] if p.ndim == 3]
        self.muon_params = [p for group in self.param_groups if group["use_muon"] for p in group["params"]
                            if p.ndim == 2]
        where = [(g, i) for g, group in enumerate(self.param_groups) if group["use_muon"]
                 for i in range(len(group["params"])) if group["params"][i].ndim == 2]
        self.routes = routes([tuple(self.param_groups[g]["params"][i].shape) for g, i in where],
                             [[theirs[g][i][2] for g, i in where] for theirs in everyone], grid.tp)
        if self.qk_clip is not None:
            self.qk_clip.bind_fsdp(self)
        self._fill_state()

    def _fill_state(self) -> None:
        """Zero state for every parameter without any (made now, not at the first step: get_state_dict never
        steps it; a state loaded before the first step is kept)."""
        for group in self.param_groups:
            for p in group["params"]:
                if not self.state.get(p):
                    self.state[p] = (dict(momentum_buffer=torch.zeros_like(p)) if group["use_muon"] else
                                     dict(step=torch.zeros((), dtype=torch.float32), exp_avg=torch.zeros_like(p),
                                          exp_avg_sq=torch.zeros_like(p)))

    def add_param_group(self, param_group: dict) -> None:
        if getattr(self, "_built", False):
            raise RuntimeError("owners are fixed when FSDPMuon is built: give every parameter group to the constructor")
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None):
        loss = call_closure(closure)
        refuse_grad_scaler(self)
        # the contract's checks belong to the step; a caller's autocast stays outside it
        with record_function("optimizer.step"), no_autocast(self.grid.device):
            self.check_finite_now()
            if self.routes is None:   # built on plain parameters: planned now, on what FSDP2 put in their place
                refuse_ddp_model(self._all_params())
                self._plan()
            MomentumSync.of(self)(self.param_groups)
            if self.steps_taken == 0 and not getattr(self, "_ddp_checked", False):
                refuse_ddp(self._all_params())
                self._ddp_checked = True
            grads, index, where = self._check_grads()
            flags, keep, agreed = vote(self, self._all_params(), grads, index, where)
            present = dict(zip(map(id, self._all_params()), flags))
            self.steps_taken += 1
            self.comm.ledger.begin_step(self.steps_taken)
            step = Step(self.steps_taken)   # the ZeRO-1 optimizers' type (step.py)
            step.decide([[present[id(p)] for p in group["params"]] for group in self.param_groups], keep, agreed)
            counted = []
            for group in self.param_groups:
                if not group["use_muon"]:
                    for p in group["params"]:
                        if not present[id(p)]:
                            continue
                        st = self.state[p]
                        st["step"] += 1
                        counted.append(st["step"])
                        adamw_step_(p.to_local(), local_grad(p), st["exp_avg"].to_local(),
                                    st["exp_avg_sq"].to_local(), int(st["step"]), lr_of(group), group["betas"],
                                    group["eps"], group["weight_decay"], keep)
            if self.muon_params:
                self._muon_step(present, keep)
            if self.banks:
                self._bank_step(present, keep)
            if self.qk_clip is not None:
                self.qk_clip.apply_fsdp(self, step)
            if agreed is not None:   # "defer": reported at the next host read (where a skip's counts are taken back)
                self._deferred.launch(agreed, keep, [n for g in self.param_groups for n in g["names"]],
                                      self.steps_taken, self.grid.tp, job_place(self.grid)[1],
                                      self._uncount(counted, self.steps_taken))
        return loss

    def _uncount(self, counted: list, step: int):
        def undo(skipped: int = 1):
            for t in counted:
                t -= 1
            self.steps_taken = min(self.steps_taken, step - 1)
        return undo

    def check_finite_now(self) -> int | None:
        """With ``check_finite="defer"``: if the last step was skipped for a NaN/Inf gradient on some rank, say
        so now (a ``finite.SkippedStep`` warning), take back its step counts and return its number."""
        return self._deferred.check()

    @property
    def skipped_steps(self) -> list[int]:
        """The steps that ``check_finite="defer"`` skipped on every rank, as reported so far."""
        return self._deferred.skipped

    def _all_params(self) -> list:
        return [p for group in self.param_groups for p in group["params"]]

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False):
        """Clip FSDP2's DP-mean gradients in place by their global norm (blocks of every rank, TP-replicated
        parameters counted once); returns the total norm, as ``torch.nn.utils.clip_grad_norm_``."""
        from .clipping import clip_fsdp_
        with no_autocast(self.grid.device):
            return clip_fsdp_(self, max_norm, norm_type, error_if_nonfinite)

    def state_dict(self) -> dict:
        self.check_finite_now()   # a skipped "defer" step's counts are taken back before anything is handed out
        if self.routes is None and all(is_dtensor(p) for p in self._all_params()):
            self._fill_state()    # not planned yet (that needs every rank): the state it will have
        return super().state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        after_load(self)

    def __getstate__(self):
        refuse_pickle(self)

    def __deepcopy__(self, memo):
        raise TypeError("FSDPMuon cannot be deep-copied: its parameters are FSDP2 DTensors that belong to the "
                        "model; copy the model and build a new FSDPMuon on it, then load_state_dict(opt.state_dict())")

    def _muon_step(self, present: dict, keep=None) -> None:
        groups = {id(p): g for g in self.param_groups if g["use_muon"] for p in g["params"]}
        updates = []
        for p in self.muon_params:
            g = groups[id(p)]
            if not present[id(p)]:  # skipped: momentum kept, Newton-Schulz runs on zeros, nothing applied
                updates.append(torch.zeros_like(p.to_local()))
                continue
            updates.append(muon_momentum_(self.state[p]["momentum_buffer"].to_local(), local_grad(p),
                                          g["momentum"], g["nesterov"], keep))
        r, me = self.routes, self.grid.rank
        out = [updates[m].reshape(-1) for ms in r.outgoing(me) for m in ms]
        send = torch.cat(out).to(torch.bfloat16) if out else torch.zeros(0, dtype=torch.bfloat16, device=self.grid.device)
        got = self.comm.all_to_all(send, r.send_counts(me), r.recv_counts(me), "world", Phase.NS_TO_OWNER).wait()
        whole, offset = {}, 0
        for src, ms in enumerate(r.incoming(me)):
            for m in ms:
                piece = r.pieces[src][m]
                if m not in whole:
                    whole[m] = torch.empty(r.shapes[m], dtype=torch.bfloat16, device=send.device)
                whole[m][piece.slices()] = got[offset: offset + piece.numel].view(piece.shape)
                offset += piece.numel
        ortho = {}
        for m in r.owned(me):
            g = groups[id(self.muon_params[m])]
            form = g.get("ns_form", NS_FORM)
            self.comm.ledger.count_ns(ns_flops(*r.shapes[m], g["ns_steps"], form))
            with record_function("muon:newton_schulz"):
                ortho[m] = zeropower_ns5(whole[m], g["ns_steps"], g["ns_coefficients"], g["eps"], form=form)
        back = [ortho[m][r.pieces[q][m].slices()].reshape(-1) for q in range(r.world) for m in r.owned(me)]
        send = torch.cat(back) if back else torch.zeros(0, dtype=torch.bfloat16, device=self.grid.device)
        got = self.comm.all_to_all(send, r.back_counts(me), r.back_recv_counts(me), "world", Phase.NS_FROM_OWNER).wait()
        offset = 0
        for owner in range(r.world):
            for m in r.owned(owner):
                p, piece = self.muon_params[m], r.pieces[me][m]
                g, lr = groups[id(p)], lr_of(groups[id(p)])
                if present[id(p)]:
                    apply_update_(p.to_local(), got[offset: offset + piece.numel].view(piece.shape), lr,
                                  g["weight_decay"], adjust_lr(lr, r.shapes[m], g["adjust_lr"]), keep)
                offset += piece.numel

    def _bank_step(self, present: dict, keep=None) -> None:
        """Each bank's local experts: momentum, Newton-Schulz expert by expert (one batch), the update, all here."""
        groups = {id(p): g for g in self.param_groups if g["use_muon"] for p in g["params"]}
        for p in self.banks:
            g, block = groups[id(p)], p.to_local()
            if not present[id(p)] or not block.numel():
                continue
            update = muon_momentum_(self.state[p]["momentum_buffer"].to_local(), local_grad(p), g["momentum"],
                                    g["nesterov"], keep)
            form, lr = g.get("ns_form", NS_FORM), lr_of(g)
            self.comm.ledger.count_ns(block.shape[0] * ns_flops(*block.shape[-2:], g["ns_steps"], form))
            with record_function("muon:newton_schulz"):
                ortho = zeropower_ns5(update, g["ns_steps"], g["ns_coefficients"], g["eps"], form=form)
            apply_update_(block, ortho, lr, g["weight_decay"], adjust_lr(lr, tuple(p.shape[-2:]), g["adjust_lr"]), keep)

    def _check_grads(self):
        """Fail on this rank, before any collective, with a message naming the parameter. Returns the
        local gradients and where we are, for the NaN/Inf check read with the step's one host sync."""
        where = where_of(self.grid, self.steps_taken + 1)
        grads, index, i = [], [], -1  # voted on together after the loop: one host sync at most (finite.py)
        for g, group in enumerate(self.param_groups):
            if bool(group["use_muon"]) != self.muon_groups[g]:
                raise ValueError(f"group {g}: use_muon changed after the optimizer was built")
            for name, p in zip(group["names"], group["params"]):
                i += 1
                if p.grad is None:  # skipped if no rank has one, zeros here if another rank has one
                    continue
                if not is_dtensor(p.grad) or p.grad.placements != p.placements or p.grad.shape != p.shape:
                    raise ValueError(f"parameter {name!r}: gradient {getattr(p.grad, 'placements', 'a plain tensor')} "
                                     f"of shape {tuple(p.grad.shape)} is not placed like its parameter {p.placements} "
                                     f"{tuple(p.shape)} on {where} (FSDP2 leaves it so; was it replaced?)")
                if p.grad.to_local().shape != p.to_local().shape:
                    raise ValueError(f"parameter {name!r}: local gradient block {tuple(p.grad.to_local().shape)} "
                                     f"differs from the parameter's {tuple(p.to_local().shape)} on {where}")
                grads.append((name, p.grad.to_local()))
                index.append(i)
        return grads, index, where


# ---- checkpoints: muongrid.checkpoint's, for callers of these two -----------------------------------------

def save(model, opt, path, step: int, scheduler=None) -> None:
    """Deprecated (0.5.0; a ``FutureWarning``): ``muongrid.checkpoint.save(opt, path, step=step,
    scheduler=scheduler)``, which takes an FSDPMuon as it takes a DistributedMuon (``checkpoint_fsdp.py``) and
    which this calls; ``model`` is not needed (the optimizer holds its parameters). It saves nothing the optimizer
    does not hold (persistent buffers, parameters outside every group)."""
    from . import checkpoint
    _deprecated("save", "muongrid.checkpoint.save(opt, path, step=step, scheduler=scheduler)")
    checkpoint.save(opt, path, step=step, scheduler=scheduler)


def load(model, opt, path, scheduler=None) -> int:
    """Deprecated (0.5.0): ``muongrid.checkpoint.load(opt, path, scheduler=scheduler)``, on any grid; returns the
    saved step."""
    from . import checkpoint
    _deprecated("load", "muongrid.checkpoint.load(opt, path, scheduler=scheduler)")
    return checkpoint.load(opt, path, scheduler=scheduler)


def _deprecated(name: str, instead: str) -> None:
    import warnings
    warnings.warn(f"muongrid.fsdp.{name}(model, opt, ...) is deprecated and will be removed: call {instead}, which "
                  "takes an FSDPMuon as it takes a DistributedMuon (the model is not needed)", FutureWarning,
                  stacklevel=3)
