"""One rank's state of the ZeRO-1 optimizers: its per-parameter views, what it costs, saving and loading it.

``ZeroOneOptimizer`` (``distributed.py``) calls these functions from thin methods; none runs inside ``step()``.
A saved state is one rank's shard of one plan; loading it elsewhere is refused with what to do
(``check_signature``), and resharding to another grid or layout goes through ``muongrid.checkpoint``. An
optimizer that holds process groups refuses pickling with that fix (``refuse_pickle``) and deep-copies sharing
its grid (``deepcopy_sharing``); after a load a Muon group's ``momentum`` is the truth (``after_load``).
"""
from __future__ import annotations

import copy

import torch

from .contract import MomentumSync


def bind_state(opt) -> None:
    """``opt.state[p]`` is the store's dict of views of ``p``'s part of every shard tensor (``Store.views``: the same
    object, so the step and a user read one thing), with its step count (a view of ``opt.counts``, ``step.py``)."""
    for g, group in enumerate(opt.param_groups):
        for i, p in enumerate(group["params"]):
            views = opt.store.views[g][i]
            views["step"] = opt.counts.view(g, i)
            opt.state[p] = views


def state_bytes(store) -> dict:
    """Bytes of optimizer state on this rank, by kind. ``master`` counts only master shards kept apart from the
    parameters (bf16 parameters' fp32 masters, unbound buckets): an fp32 parameter bound to its bucket's buffer is
    its own master and costs nothing more (``store.py``)."""
    out: dict = {}
    for row in store.shards:
        for shard in row:
            for kind, t in shard.items():
                if kind != "master":
                    out[kind] = out.get(kind, 0) + t.numel() * t.element_size()
    out["master"] = sum(b.master.numel() * b.master.element_size() for row in store.buffers for b in row
                        if not b.master_is_param)
    return out


def signature(opt) -> dict:
    """What a saved state depends on: resharding to another grid or layout is not done here."""
    return dict(dp=opt.grid.dp, tp=opt.grid.tp, dp_rank=opt.grid.dp_rank, tp_rank=opt.grid.tp_rank,
                layout=opt.layout, global_buffer_size=list(opt.plan.global_buffer_size))


def check_state_dict(opt, state_dict: dict) -> None:
    """Raise, naming the problem, unless ``opt.load_state_dict(state_dict)`` would fit (this rank's own shard of
    the same grid, layout and parameters); changes nothing."""
    pointer = next((k for k in POINTERS if k in state_dict), None)
    check_signature(state_dict.get("muongrid"), signature(opt), pointer)
    groups = state_dict["param_groups"]
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in opt.param_groups]:
        raise ValueError("the saved parameter groups differ from this optimizer's in number or size")
    ids = [i for g in groups for i in g["params"]]
    params = [p for g in opt.param_groups for p in g["params"]]
    for i, p in zip(ids, params):
        theirs, ours = state_dict["state"].get(i, {}), opt.state[p]
        if set(theirs) != set(ours) or any(torch.as_tensor(theirs[k]).shape != ours[k].shape for k in ours):
            raise ValueError(f"saved state of parameter {i} has {sorted(theirs)} with other shapes than "
                             f"this optimizer's {sorted(ours)}")


def load(opt, state_dict: dict) -> None:
    """``opt.load_state_dict``: a state saved by the same optimizer on the same grid, layout and rank. Everything is
    checked before anything changes; a mismatch is an error naming it. In a job of several ranks this is
    collective (call it on every rank, each with its own shard): a rank whose state does not fit makes every
    rank raise (``agree``), so none walks on into a collective the others never join. Hooks registered with
    ``register_load_state_dict_pre_hook`` and ``_post_hook`` run as in torch."""
    for pre_hook in opt._optimizer_load_state_dict_pre_hooks.values():
        result = pre_hook(opt, state_dict)
        if result is not None:
            state_dict = result
    problem = None
    try:
        check_state_dict(opt, state_dict)
    except (ValueError, KeyError, TypeError) as e:
        problem = e
    if job_world(opt.grid) == 1 and problem is not None:
        raise problem
    # every rank raises together, nothing changed (over the whole job where experts span several grids)
    one_grid = getattr(opt.grid, "ep", 1) == 1
    agree(problem and str(problem), "load_state_dict", opt.comm if one_grid else None)
    groups = state_dict["param_groups"]
    ids = [i for g in groups for i in g["params"]]
    params = [p for g in opt.param_groups for p in g["params"]]
    for i, p in zip(ids, params):
        for k, t in opt.state[p].items():
            t.copy_(torch.as_tensor(state_dict["state"][i][k]))  # a Python-number step too
    for ours, theirs in zip(opt.param_groups, groups):
        if not opt.capturable:
            ours.update({k: v for k, v in theirs.items() if k != "params"})
            continue
        for k, v in theirs.items():   # the hyperparameter tensors are written in place (capture.py)
            if k != "params":
                ours[k] = v
    after_load(opt)
    for post_hook in opt._optimizer_load_state_dict_post_hooks.values():
        post_hook(opt)


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete, foreign, or does not fit this optimizer (``muongrid.checkpoint``'s)."""


def job_world(grid) -> int:
    return grid.dp * grid.tp * getattr(grid, "ep", 1)


def agree(problem: str | None, what: str, comm=None) -> None:
    """Every rank of the job calls this with its own problem (None: fine); if any rank has one, every rank raises
    a ``CheckpointError`` naming each failed rank and its problem. One small all-gather of objects (never in a
    step): through the optimizer's ``comm`` where there is one (the one place that wraps collectives, and the
    one ``lab/devicecheck.py`` plays on the meta device), else over the default group."""
    import torch.distributed as dist
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    problems = [problem]
    if comm is not None:
        problems = comm.gather_objects(problem, "setup")
    elif world > 1:
        problems = [None] * world
        dist.all_gather_object(problems, problem)
    failed: dict[str, list[int]] = {}
    for r, p in enumerate(problems):
        if p:
            failed.setdefault(p, []).append(r)
    if failed:
        ranks = sorted(r for rs in failed.values() for r in rs)
        raise CheckpointError(f"{what} failed on {'rank' if len(ranks) == 1 else 'ranks'} "
                              f"{', '.join(map(str, ranks))} (this is rank {rank} of {world}), so every rank stops "
                              "here: " + "; ".join(f"{'rank' if len(rs) == 1 else 'ranks'} "
                                                    f"{', '.join(map(str, rs))}: {p}" for p, rs in failed.items()))


TRAINERS = ("HF Trainer, Accelerate and Lightning save the optimizer from rank 0 only: with Trainer, add "
            "callbacks=[muongrid.hf.ShardedCheckpoint(opt)]; with Accelerate, call "
            "muongrid.accelerate.ShardedState(accelerator, opt) after prepare; with Lightning, use "
            "strategy=muongrid.lightning.ShardedDDPStrategy() (Fabric: FabricShardedDDPStrategy()). Each saves and "
            "resumes every rank's shard")
# The records the trainer integrations leave where a trainer keeps rank 0's optimizer state: where, and what loads it
POINTERS = {"muongrid.hf.ShardedCheckpoint": ("Trainer's optimizer.pt",
                                              "callbacks=[muongrid.hf.ShardedCheckpoint(opt)] given to the Trainer"),
            "muongrid.lightning": ("a Lightning checkpoint", "strategy=muongrid.lightning.ShardedDDPStrategy() "
                                   "(Fabric: FabricShardedDDPStrategy())")}


def check_signature(saved: dict | None, ours: dict, pointer: str | None = None) -> None:
    """Refuse a state_dict from another rank, grid or layout, saying which and what to do (``pointer``: the
    ``POINTERS`` key the state_dict holds, if it is such a record)."""
    if saved == ours:
        return
    if saved is None and pointer:
        where, loader = POINTERS[pointer]
        raise ValueError(f"this state_dict is the record {pointer} writes into {where}, pointing at every rank's "
                         f"shard: resume with {loader}, which loads them")
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
                         f"(one folder, loadable on any grid and layout). {TRAINERS}")
    differ = {k: (saved.get(k), ours[k]) for k in grid_keys if saved.get(k) != ours[k]}
    hint = ""
    if saved.get("layout") == "bucket" and ours["layout"] == "owner":
        hint = (" DistributedMuon's default layout was 'bucket' before muongrid 0.5 and is 'owner' now: pass "
                "layout='bucket' to load this state as it was saved, or move it through muongrid.checkpoint.")
    raise ValueError(f"this state_dict was saved on another grid or layout ({', '.join(f'{k}: saved {a}, here {b}' for k, (a, b) in differ.items())}); "
                     "a state_dict is one rank's shard of one plan: resharding goes through muongrid.checkpoint.save/load."
                     + hint)


def after_load(opt) -> None:
    """After a load, a Muon group's ``momentum`` is the truth (a state saved before betas[0] followed it may carry
    AdamW's betas)."""
    sync = MomentumSync.of(opt)
    for group in opt.param_groups:
        if "ns_eps" in group:  # saved before eps meant Newton-Schulz's in a Muon group
            ns_eps = group.pop("ns_eps")
            if group.get("use_muon"):
                group["eps"] = ns_eps
        if group.get("use_muon") and "betas" in group:
            group["betas"] = (group["momentum"], *tuple(group["betas"])[1:])
    sync.reset(opt.param_groups)


def refuse_pickle(opt) -> None:
    raise TypeError(f"{type(opt).__name__} holds process groups, which cannot be pickled: save "
                    "opt.state_dict() (this rank's shard, with torch.save on every rank) or use muongrid.checkpoint "
                    "(one folder, any grid); copy.deepcopy(opt) works and shares the grid")


def deepcopy_sharing(opt, memo: dict, shared: tuple[str, ...]):
    """``copy.deepcopy`` of an optimizer that shares ``shared`` attributes (the grid, the Comm and its process
    groups cannot be copied) and copies everything else, state views kept as views (torch copies storages once)."""
    for name in shared:
        value = getattr(opt, name, None)
        if value is not None:
            memo[id(value)] = value
    new = type(opt).__new__(type(opt))
    memo[id(opt)] = new
    new.__dict__.update(copy.deepcopy(opt.__dict__, memo))
    return new
