"""Run by tests/test_contract.py under the launcher: the torch-optimizer contract on a real DP x TP grid.

For every layout (DistributedMuon, hybrid groups) and for DistributedAdamW, against single-device
``muongrid.MuonW`` on the DP-mean gradients (whole tensors, every rank computes it itself):

* ``clip``: ``opt.clip_grad_norm_`` every step (active: max_norm below the norm), the reference clipped by
  ``torch.nn.utils.clip_grads_with_norm_`` with ``muongrid.clipping.total_norm``; the returned norms and the
  parameters must be equal bit for bit (a matrix the "group" layout orthogonalises over several ranks:
  within its stated tolerance, see ``same``), the norm within 1e-6 of ``torch.nn.utils.get_total_norm``;
* ``edit``: parameters scaled between steps are where the next step starts (finding 1);
* ``none``: a gradient None on every rank is skipped, None on DP rank 0 only counts as zeros there (finding 6);
* ``rank0``: rank 0's state_dict loaded on every rank is refused on every rank, naming the ranks (finding 8);
* ``oracle``: Newton-Schulz replaced by the identity (``oracle.NSHook``), DistributedMuon (bucket, owner,
  aligned) against tests/oracle.py's float64 hand formula on the whole parameters, within its bound (issue 41).
Every case runs verify.py's varied groups (every hyperparameter differs) with a CyclicLR on lr and momentum.
With ``--fsdp`` also FSDPMuon on tests/fsdp_run.py's tiny GPT: clipping and a skipped parameter.
Prints one JSON line (rank 0) with every rank's findings.

    python tests/contract_run.py --dp 2 --tp 1 [--fsdp] [--cases clip,edit,none,rank0,oracle]
"""
import argparse
import json
import sys

import torch
import torch.distributed as dist

from muongrid import DistributedAdamW, DistributedMuon, MuonW
from muongrid.clipping import total_norm
from muongrid.launch import add_launch_args, launch
from muongrid.layouts import LAYOUTS
from muongrid.lab.synthetic import build_problem
from muongrid.sharding import tp_shard
from muongrid.verify import scheduler, vary_hyperparameters

SHAPES, TP_DIMS = [(12, 20), (17, 10), (9, 10)], [0, 1, -1]   # uneven over 3 ranks, one replicated over TP


def mean_grads(problem, step, dp, none_on_rank0=(), none_everywhere=()):
    """The DP mean the optimizer should step with: rank 0's gradient counted as zeros for ``none_on_rank0``."""
    total = None
    for r in range(dp):
        g = problem.grads(step, r, dp)
        if r == 0:
            g = {n: torch.zeros_like(t) if n in none_on_rank0 else t for n, t in g.items()}
        total = g if total is None else {n: total[n] + g[n] for n in g}
    return {n: t / dp for n, t in total.items() if n not in none_everywhere}


def give(opt, grads, grid, none=()):
    for g in opt.param_groups:
        for n, d, p in zip(g["names"], g["tp_split_dims"], g["params"]):
            p.grad = None if n in none else tp_shard(grads[n], d, grid.tp, grid.tp_rank, n)


# A matrix the "group" layout orthogonalises over several ranks adds its Gram sums in another order than
# one process (muongrid/ns_group.py), so it is held to the group layout's tolerance (tests/test_group_layout.py):
# within 1e-2 of the reference's update, on this rank's shard. Every other parameter: bit for bit.
GROUP_RTOL = 1e-2


def same(opt, ref_params, grid, first) -> bool:
    plan = opt.plan
    grouped = {plan.metas[b][i].name for (b, i) in plan.groups}
    ok = True
    for g in opt.param_groups:
        for n, d, p in zip(g["names"], g["tp_split_dims"], g["params"]):
            want = tp_shard(ref_params[n].detach(), d, grid.tp, grid.tp_rank, n)
            if n in grouped:
                update = want.double() - tp_shard(first[n], d, grid.tp, grid.tp_rank, n).double()
                ok &= float((p.detach().double() - want.double()).norm()) <= GROUP_RTOL * float(update.norm())
            else:
                ok &= torch.equal(p.detach(), want)
    return ok


def run_case(cls, layout, case, grid, comm) -> dict:
    problem = build_problem("hybrid", SHAPES, TP_DIMS, seed=5, tp=grid.tp)
    vary_hyperparameters(problem)
    opt = cls(problem.param_groups(grid.tp, grid.tp_rank), grid, layout=layout, bucket_numel=300)
    ref_params = {n: torch.nn.Parameter(t.clone()) for n, t in problem.full.items()}
    first = {n: t.detach().clone() for n, t in problem.full.items()}
    groups = problem.param_groups()
    for g in groups:
        g["params"] = [ref_params[n] for n in g["names"]]
        if cls is DistributedAdamW:
            g["use_muon"] = False
    ref = MuonW(groups)
    scheds = [scheduler(opt, problem), scheduler(ref, problem)]
    out = dict(equal=True, norms_equal=True, torch_rel=0.0)
    names = list(problem.full)
    for step in range(1, 4):
        none_all = {names[1]} if case == "none" and step == 2 else set()
        none_0 = {names[2]} if case == "none" and step >= 2 and grid.dp > 1 else set()
        if case == "edit" and step == 2:   # a user's edit between steps, on every rank and in the reference
            for g in opt.param_groups:
                for p in g["params"]:
                    p.data.mul_(0.5)
            for p in ref_params.values():
                p.data.mul_(0.5)
        give(opt, problem.grads(step, grid.dp_rank, grid.dp), grid, none_all | (none_0 if grid.dp_rank == 0 else set()))
        mean = mean_grads(problem, step, grid.dp, none_0, none_all)
        for n, p in ref_params.items():
            p.grad = mean.get(n)
        if case == "clip":
            max_norm = 0.5 * float(total_norm(list(mean.values())))
            theirs = torch.nn.utils.get_total_norm(list(mean.values()))
            norm = opt.clip_grad_norm_(max_norm)
            ref_norm = total_norm([p.grad for p in ref_params.values() if p.grad is not None])
            torch.nn.utils.clip_grads_with_norm_(list(ref_params.values()), max_norm, ref_norm)
            out["norms_equal"] &= bool(torch.equal(norm, ref_norm))
            out["torch_rel"] = max(out["torch_rel"], abs(float(norm) / float(theirs) - 1))
            if step == 3:
                inf = opt.clip_grad_norm_(1e9, norm_type=float("inf"))   # inactive: only the norm
                ref_inf = torch.nn.utils.get_total_norm([p.grad for p in ref_params.values() if p.grad is not None],
                                                        float("inf"))
                out["inf_equal"] = bool(torch.equal(inf, ref_inf))
        opt.step()
        ref.step()
        for sched in scheds:
            sched.step()
        out["equal"] &= same(opt, ref_params, grid, first)
    if case == "rank0" and grid.dp > 1:
        saved = [opt.state_dict()]
        dist.broadcast_object_list(saved, src=0)
        try:   # every rank loads rank 0's shard, as a trainer that saved on rank 0 only would: all refuse
            opt.load_state_dict(saved[0])
            out["refused"] = "loaded"
        except ValueError as e:
            out["refused"] = str(e)
    return out


def oracle_case(layout, grid) -> dict:
    """DistributedMuon with Newton-Schulz replaced by the identity against the float64 oracle (tests/oracle.py)
    on the whole parameters and the DP-mean gradients, every rank checking its own shards: the worst
    |param - oracle| / bound (at most 1), and whether each Newton-Schulz call got its group's ns_steps and eps."""
    import muongrid.flows
    from oracle import NSHook, Oracle, cyclic, identity
    from muongrid.verify import SCHEDULE
    hook, real = NSHook(), muongrid.flows.zeropower_ns5
    muongrid.flows.zeropower_ns5 = hook
    try:
        problem = build_problem("hybrid", SHAPES, TP_DIMS, seed=5, tp=grid.tp)
        vary_hyperparameters(problem)
        opt = DistributedMuon(problem.param_groups(grid.tp, grid.tp_rank), grid, layout=layout, bucket_numel=300)
        sched = scheduler(opt, problem)
        oracles = {n: Oracle(t, g["use_muon"], ns=identity) for g in problem.groups for n in g["names"]
                   for t in [problem.full[n]]}
        worst, size = 0.0, SCHEDULE["step_size_up"]
        for step in range(1, 4):
            give(opt, problem.grads(step, grid.dp_rank, grid.dp), grid)
            opt.step()
            sched.step()
            mean = mean_grads(problem, step, grid.dp)
            for g, group in zip(problem.groups, opt.param_groups):
                lo, hi = g["momentum_range"]
                h = dict(g["hyper"], lr=cyclic(step - 1, g["hyper"]["lr"], 2 * g["hyper"]["lr"], size))
                h.setdefault("weight_decay", 0.1)
                if g["use_muon"]:
                    h = dict({"momentum": 0.95, "nesterov": True, "ns_steps": 5, "eps": 1e-7,
                              "adjust_lr": "match_rms_adamw"}, **h, momentum=cyclic(step - 1, hi, lo, size))
                else:
                    h["betas"] = (cyclic(step - 1, hi, lo, size), h["betas"][1])
                for n, d, p in zip(group["names"], group["tp_split_dims"], group["params"]):
                    o = oracles[n]
                    want = o.step(mean[n], h)
                    ratio = (p.detach().double() - tp_shard(want, d, grid.tp, grid.tp_rank, n)).abs() / \
                        tp_shard(o.bound, d, grid.tp, grid.tp_rank, n)
                    worst = max(worst, float(ratio.max()) if ratio.numel() else 0.0)
        muon = next(g["hyper"] for g in problem.groups if g["use_muon"])
        calls_ok = all((c["steps"], c["eps"]) == (muon["ns_steps"], muon["eps"]) for c in hook.calls)
        return dict(oracle_worst=worst, ns_calls_ok=calls_ok, ns_calls=len(hook.calls))
    finally:
        muongrid.flows.zeropower_ns5 = real


def fsdp_checks(grid, comm) -> dict:
    from fsdp_run import CONTEXT, D, HEADS, HYPER, LAYERS, VOCAB, fsdp_model, give as give_fsdp, grads, groups
    from muongrid.fsdp import FSDPMuon
    from muongrid.lab.tpgpt import head_major_gpt
    torch.manual_seed(0)
    ref = head_major_gpt(VOCAB, d=D, n_layer=LAYERS, n_head=HEADS, context=CONTEXT)
    ref_opt = MuonW(groups(ref), **HYPER)
    model = fsdp_model(grid)
    opt = FSDPMuon(groups(model), grid, comm=comm, **HYPER)
    named = list(ref.named_parameters())
    skip = named[1][0]
    out = dict(fsdp_equal=True, fsdp_norms_equal=True)
    for step in range(1, 4):
        whole = grads(step, named)
        give_fsdp(model, grid, whole)
        for n, p in named:
            p.grad = whole[n].clone()
        if step == 2:   # no gradient anywhere for one matrix: skipped by both
            dict(model.named_parameters())[skip].grad = None
            dict(named)[skip].grad = None
        max_norm = 0.5 * float(total_norm([p.grad for _, p in named if p.grad is not None]))
        norm = opt.clip_grad_norm_(max_norm)
        ref_norm = total_norm([p.grad for _, p in named if p.grad is not None])
        torch.nn.utils.clip_grads_with_norm_([p for _, p in named], max_norm, ref_norm)
        out["fsdp_norms_equal"] &= bool(torch.equal(norm, ref_norm))
        opt.step()
        ref_opt.step()
        from muongrid.fsdp import fsdp_piece
        for n, p in model.named_parameters():
            block = dict(named)[n].detach()[fsdp_piece(n, p, grid).slices()]
            out["fsdp_equal"] &= bool(torch.equal(p.detach().to_local(), block))
    return out


def worker(grid, comm, args):
    torch.set_num_threads(1)
    found = {}
    cases = args.cases.split(",")
    for layout in LAYOUTS:
        for case in set(cases) & {"clip", "edit", "none"}:
            found[f"muon-{layout}-{case}"] = run_case(DistributedMuon, layout, case, grid, comm)
    if "oracle" in cases:
        for layout in ("bucket", "owner", "aligned"):
            found[f"oracle-{layout}"] = oracle_case(layout, grid)
    for case in set(cases) & {"clip", "none", "rank0"}:
        found[f"adamw-{case}"] = run_case(DistributedAdamW, "bucket", case, grid, comm)
    if args.fsdp:
        found["fsdp"] = fsdp_checks(grid, comm)
    everyone = comm.gather_objects(found, "report")
    if grid.rank == 0:
        print(json.dumps(dict(dp=grid.dp, tp=grid.tp, ranks=everyone)), flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_launch_args(p)
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--cases", default="clip,edit,none,rank0,oracle")
    sys.exit(launch(worker, p.parse_args()))
