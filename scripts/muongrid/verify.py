"""Check Distributed Muon / AdamW / the hybrid against the single-device reference, step by step.

    python scripts/verify.py --dp 2 --tp 2                          # spawns 4 local gloo ranks
    python scripts/verify.py --dp 3 --tp 2 --layout bucket,owner,aligned   # every layout in one run
    python scripts/verify.py --dp 2 --tp 2 --steps 2 --save ckpt          # a checkpoint after step 2 ...
    python scripts/verify.py --dp 3 --tp 1 --layout owner --steps 2 --resume ckpt   # ... resumed elsewhere
    python scripts/verify.py --dp 3 --tp 1 --optimizer hybrid --steps 5
    python scripts/verify.py --dp 2 --tp 4 --shapes 100x100,124x324 --tp-dims 0,1
    python scripts/verify.py --dp 3 --tp 2 --layout owner --ns-batch --ns-form gram --ns-coefficients polar_express
    torchrun --standalone --nproc-per-node 4 scripts/verify.py --dp 2 --tp 2   # NCCL when CUDA is there
    python -m muongrid.verify --dp 2 --tp 2        # the same, from an install (or: muongrid-verify --dp 2 --tp 2)

``scripts/verify.py`` is a thin wrapper around this module, so the book's commands and an installed
package run the same code with the same flags, output and JSON line.

Every rank builds the same seeded problem, takes its TP shard of each parameter, and runs the
distributed optimizer on gradients that differ per DP rank. Beside it, rank 0 runs the
single-device reference on the whole parameters with the DP-averaged gradients and broadcasts
the result; after each step every rank compares its own parameters with its TP shard of it. The largest difference
over all ranks is printed per step, then the communication ledger, then one JSON line:
``{"ok": ..., "max_abs_diff": ..., "dp": ..., "tp": ..., "layout": ..., "ns_calls": ..., "ledger": {...}, ...}``.
Exit code 0 iff ok.

``--layout`` takes a comma list: each layout runs its own optimizer on the same problem, beside the
others, against the same reference. The top-level fields are the first layout's (``ok`` and
``max_abs_diff`` cover all of them); ``"layouts"`` has every layout's: ``ok``, ``max_abs_diff``,
``ns_calls`` (Newton-Schulz runs in the last step, summed over all ranks), ``ns_flops_max_rank``,
``owners_agree`` (every rank computed the same owner for every matrix), ``groups`` and ``groups_agree``
(the same for the "group" layout's groups of ranks, sized by time on ``--hw`` when given; its grouped matrices are within a tolerance of the
reference, not bit-exact, so give it ``--atol``: ``tests/test_group_layout.py``), ``state_dict_roundtrip`` (after
the last step, ``state_dict()`` loaded into a new optimizer continues bit for bit as the original does,
checked with one extra step), ``ledger`` (rank 0's) and
``ledger_per_rank`` (the owner layouts move different bytes on different ranks).

``--save DIR`` writes a checkpoint of the first layout's optimizer after the last step
(``muongrid/checkpoint.py``: DCP, in global coordinates). ``--resume DIR`` loads one, on any grid and
into every layout given, runs ``--steps`` more steps and compares each with the single-device
reference run uninterrupted from step 1: steps N+1..N+M must match an uninterrupted run. The JSON
then has ``"resumed_from"`` (the folder, the step and the grid and layout it was saved on).

``--ns-coefficients``, ``--ns-form`` and ``--ns-batch`` run Newton-Schulz's options (``muongrid/ns_variants.py``,
``DistributedMuon(ns_batch=...)``) on every Muon group, the reference included, so each option is checked on
your grid as the default is: bit for bit under the owner and aligned layouts (a batched call gives the
unbatched bits on this machine's kernels; ``tests/test_ns_variants.py``), within ``--atol`` for grouped
matrices.

The groups' hyperparameters all differ, from the defaults and from each other (``VARIED_MUON``, ``VARIED_ADAMW``:
momentum, nesterov, ns_steps, eps, the lr adjustment, betas, weight decay), and a CyclicLR drives every group's lr
and momentum (AdamW's betas[0]) on each optimizer, the reference's too: a step that reads one hyperparameter from
the wrong place differs from the reference (issue 41).

``--atol`` defaults to 0: on one machine the distributed run executes the same kernels on the
same numbers as the reference, so it must match bit for bit (see the synthetic module for why
reduction order cannot matter).
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import warnings

import torch
import torch.distributed as dist

from muongrid import checkpoint
from muongrid.comm import Comm
from muongrid.distributed import OVERLAP_MODES, DistributedMuon
from muongrid.layouts import LAYOUTS, parse_layouts
from muongrid.launch import add_launch_args, arg_type, check_launch_args, launch
from muongrid.ns_variants import NAMED_SCHEDULES, NS_FORMS, check_ns_options
from muongrid.optim import MuonW
from muongrid.lab.poc_bugs import POC_BUGS
from muongrid.lab.timemodel import THIS_MACHINE, hw_arg, resolve_hw
from muongrid.sharding import tp_shard
from muongrid.lab.synthetic import OPTIMIZERS, add_problem_args, build_problem, check_problem_args, set_grads


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    add_problem_args(p)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="muon")
    p.add_argument("--groups", type=int, default=2, help="parameter groups for muon/adamw (default 2)")
    p.add_argument("--atol", type=float, default=0.0, help="largest allowed |param - reference| (default 0)")
    p.add_argument("--overlap", choices=OVERLAP_MODES, default=None,
                   help="how collectives overlap compute (default: each layout's own; see muongrid/flows.py)")
    p.add_argument("--layout", type=arg_type(parse_layouts), default=["bucket"],
                   help=f"comma-separated layouts from {','.join(LAYOUTS)} (default bucket; see muongrid/layouts.py)")
    p.add_argument("--hw", type=arg_type(hw_arg), default=None, metavar="PROFILE",
                   help="size the group layout's groups by time on this hardware profile: 'h100', a JSON file "
                        f"(muongrid.hardware) or '{THIS_MACHINE}' (default: by Newton-Schulz FLOPs)")
    p.add_argument("--ns-coefficients", default=None, metavar="NAME",
                   help=f"Newton-Schulz coefficients of the Muon groups: {', '.join(sorted(NAMED_SCHEDULES))} "
                        "(default muon, the paper's quintic)")
    p.add_argument("--ns-form", choices=NS_FORMS, default=None,
                   help="iterate on the matrix (standard, the default) or on its small Gram matrix (gram)")
    p.add_argument("--ns-batch", action="store_true",
                   help="one batched Newton-Schulz per distinct shape an owner holds (not with the bucket layout)")
    p.add_argument("--poc-bug", choices=sorted(POC_BUGS), default=None,
                   help="put one of the proof of concept's bugs back, to see this check catch it")
    p.add_argument("--save", default=None, metavar="DIR", help="write a checkpoint after the last step")
    p.add_argument("--resume", default=None, metavar="DIR", help="start from a checkpoint (any grid, any layout)")
    args = p.parse_args(argv)
    check_launch_args(p, args)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.hw is not None and ("group" not in args.layout or args.optimizer == "adamw"):
        p.error("--hw sizes the group layout's groups: give --layout group (or a list with group) and a Muon "
                "optimizer")
    if args.optimizer == "adamw" and (args.ns_coefficients or args.ns_form or args.ns_batch):
        p.error("--ns-coefficients, --ns-form and --ns-batch are Newton-Schulz options: give a Muon optimizer "
                "(--optimizer muon or hybrid), not adamw")
    if args.ns_batch and "bucket" in args.layout:
        p.error("--ns-batch batches same-shape matrices on their owner: the bucket layout has no owner; "
                "give --layout owner, aligned or group")
    try:
        check_ns_options(args.ns_coefficients or "muon", 5, args.ns_form or "standard")
    except ValueError as e:
        p.error(f"--ns-coefficients/--ns-form: {e}")
    args.hw_spec = args.hw
    resolve_hw(p, args)
    check_problem_args(p, args, args.optimizer, args.groups)
    if args.resume:
        try:
            saved = checkpoint.read_marker(args.resume)[1].get("extra", {})
        except checkpoint.CheckpointError as e:
            p.error(str(e))
        mine = problem_signature(args)
        if saved.get("problem") != mine:
            p.error(f"{args.resume} was saved by verify.py for the problem {saved.get('problem')}, not {mine}: "
                    "give the same --optimizer, --shapes, --tp-dims, --groups and --seed")
    return args


def reference_optimizer(problem, params: dict) -> MuonW:
    """The single-device optimizer over whole parameters; ``params`` (name -> tensor) become Parameters."""
    for n in params:
        params[n] = torch.nn.Parameter(params[n])
    return MuonW([dict(g["hyper"], params=[params[n] for n in g["names"]], names=g["names"], use_muon=g["use_muon"])
                  for g in problem.groups])


# Every per-group hyperparameter differs from the optimizer's defaults in some group and between groups (issue 41):
# a step that read the optimizer-wide value, or one group's for all, or left a hyperparameter out, differs from
# the reference. Muon group j takes VARIED_MUON[j % 2], AdamW group j VARIED_ADAMW[j % 2]; lr and momentum
# (AdamW: betas[0]) are driven by SCHEDULE, a CyclicLR over each group's own range. eps 1.0 in a Muon group
# is above the Frobenius norm of its momentum, so the clamp in Newton-Schulz's normalisation is active there.
VARIED_MUON = (dict(nesterov=False, ns_steps=3, eps=1.0, adjust_lr="original", momentum=(0.8, 0.9)),
               dict(nesterov=True, ns_steps=4, eps=1e-7, adjust_lr="match_rms_adamw", momentum=(0.85, 0.95)))
VARIED_ADAMW = (dict(betas=(0.9, 0.99), eps=1e-6, momentum=(0.85, 0.95)),
                dict(betas=(0.9, 0.95), eps=3e-8, momentum=(0.8, 0.9)))
# CyclicLR: lr from each group's lr up to twice it and back over 2 + 2 steps, momentum the other way. Periodic,
# so a run resumed from a checkpoint (--resume) follows the schedule of an uninterrupted run whatever --steps.
SCHEDULE = dict(step_size_up=2, mode="triangular")


def vary_hyperparameters(problem, keep_ns_steps: bool = False) -> None:
    """Give each of ``problem``'s groups its own hyperparameters (``VARIED_MUON``, ``VARIED_ADAMW``), in place.
    ``keep_ns_steps``: leave ns_steps at its default (a named coefficient schedule fixes its own length)."""
    counts = {True: 0, False: 0}
    for g in problem.groups:
        table = VARIED_MUON if g["use_muon"] else VARIED_ADAMW
        varied = dict(table[counts[g["use_muon"]] % len(table)])
        counts[g["use_muon"]] += 1
        g["momentum_range"] = varied.pop("momentum")
        if keep_ns_steps:
            varied.pop("ns_steps", None)
        if not g["use_muon"]:
            varied["weight_decay"] = g["hyper"].get("weight_decay", 0.1) / 2
        g["hyper"].update(varied)


def scheduler(opt, problem):
    """The CyclicLR every optimizer of a verify run (the reference too) steps after each step (see SCHEDULE)."""
    lrs = [g["hyper"]["lr"] for g in problem.groups]   # not the groups' lr: a loaded state holds a scheduled one
    momenta = [g["momentum_range"] for g in problem.groups]
    return torch.optim.lr_scheduler.CyclicLR(opt, base_lr=lrs, max_lr=[2 * lr for lr in lrs], cycle_momentum=True,
                                             base_momentum=[m[0] for m in momenta],
                                             max_momentum=[m[1] for m in momenta], **SCHEDULE)


def ns_options(args) -> dict:
    """The Newton-Schulz hyperparameters given on the command line (none: every group keeps the defaults)."""
    return {k: v for k, v in (("ns_coefficients", args.ns_coefficients), ("ns_form", args.ns_form)) if v}


def problem_signature(args) -> dict:
    """What must be equal for a resumed run to be compared with the same reference."""
    return dict(optimizer=args.optimizer, shapes=[list(x) for x in args.shapes], tp_dims=list(args.tp_dims),
                groups=args.groups, seed=args.seed, hyper="varied, CyclicLR", **ns_options(args))


def state_dict_roundtrip(opt, problem, args, grid, step: int) -> bool:
    """Save ``opt``'s state, take one more step; then load that state into a new optimizer over copies of
    the parameters and take the same step. True if both end bit for bit the same (parameters and state)."""
    saved = copy.deepcopy(opt.state_dict())
    copies = [dict(g, params=[torch.nn.Parameter(p.detach().clone()) for p in g["params"]]) for g in opt.param_groups]
    twin = type(opt)(copies, grid, layout=opt.layout, comm=Comm(grid, timeout_s=args.timeout),
                     bucket_numel=args.bucket_numel, overlap=args.overlap, hw=opt.hw, ns_batch=opt.ns_batch)
    twin.load_state_dict(saved)
    grads = problem.grads(step, grid.dp_rank, grid.dp)
    for o in (opt, twin):
        set_grads(o.param_groups, grads, grid)
        o.step()
    twin.comm.close()
    same = lambda a, b: torch.equal(a, b) and a.dtype == b.dtype  # noqa: E731
    params = all(same(a, b) for g, h in zip(opt.param_groups, twin.param_groups) for a, b in zip(g["params"], h["params"]))
    state = all(same(opt.state[a][k], twin.state[b][k]) for g, h in zip(opt.param_groups, twin.param_groups)
                for a, b in zip(g["params"], h["params"]) for k in opt.state[a])
    return params and state


def worker(grid, comm, args) -> int:
    problem = build_problem(args.optimizer, args.shapes, args.tp_dims, args.groups, args.seed, grid.tp)
    vary_hyperparameters(problem, keep_ns_steps=bool(args.ns_coefficients))
    for g in problem.groups:  # the distributed optimizers and the reference both read a group's hyper
        if g["use_muon"]:
            g["hyper"].update(ns_options(args))
    dev = grid.device
    optimizer_class = POC_BUGS[args.poc_bug] if args.poc_bug else DistributedMuon
    opts = {layout: optimizer_class(problem.param_groups(grid.tp, grid.tp_rank, dev), grid, layout=layout,
                                    comm=Comm(grid, timeout_s=args.timeout), bucket_numel=args.bucket_numel,
                                    overlap=args.overlap, hw=args.hw if layout == "group" else None,
                                    ns_batch=args.ns_batch)
            for layout in args.layout}
    # The reference runs once, on rank 0, and is broadcast: every rank then checks its own shard.
    ref_params = {n: t.to(dev).clone() for n, t in problem.full.items()}
    ref = reference_optimizer(problem, ref_params) if grid.rank == 0 else None
    # Every optimizer steps its own CyclicLR after each of its steps (lr and momentum per group, see SCHEDULE).
    ref_sched = scheduler(ref, problem) if ref is not None else None
    first_step, resumed_from = 1, None
    if args.resume:
        for opt in opts.values():
            saved_step = checkpoint.load(opt, args.resume)
        first_step = saved_step + 1
        resumed_from = dict(path=args.resume, step=saved_step, saved_on=checkpoint.read_marker(args.resume)[1]["saved_on"])
        if ref is not None:  # the reference runs uninterrupted from step 1
            for step in range(1, first_step):
                for n, g in problem.mean_grads(step, grid.dp).items():
                    ref_params[n].grad = g.to(dev)
                ref.step()
                ref_sched.step()
    scheds = [scheduler(opt, problem) for opt in opts.values()]   # made after a load, then wound on to first_step
    with warnings.catch_warnings():   # "lr_scheduler.step() before optimizer.step()": winding on, on purpose
        warnings.simplefilter("ignore")
        for sched in scheds:
            for _ in range(first_step - 1):
                sched.step()
    diffs = {layout: [] for layout in opts}
    last_step = first_step + args.steps - 1
    for step in range(first_step, last_step + 1):
        grads = problem.grads(step, grid.dp_rank, grid.dp)
        for opt in opts.values():
            set_grads(opt.param_groups, grads, grid)
            opt.step()
        if ref is not None:
            for n, g in problem.mean_grads(step, grid.dp).items():
                ref_params[n].grad = g.to(dev)
            ref.step()
            ref_sched.step()
        for sched in scheds:
            sched.step()
        expected = {n: comm.broadcast(t.data, "world", "verify") for n, t in ref_params.items()}
        for layout, opt in opts.items():
            diff = torch.zeros((), dtype=torch.float64, device=dev)
            for g in opt.param_groups:
                for n, d, p in zip(g["names"], g["tp_split_dims"], g["params"]):
                    expect = tp_shard(expected[n], d, grid.tp, grid.tp_rank, n)
                    diff = torch.maximum(diff, (p.detach().double() - expect.double()).abs().max())
            diffs[layout].append(comm.all_reduce(diff, "world", "verify", op=dist.ReduceOp.MAX).item())
        if grid.rank == 0:
            print(f"step {step}: max |param - reference| over all ranks = "
                  + ", ".join(f"{diffs[x][-1]:.3e} ({x})" for x in opts), flush=True)

    if args.save:  # before the state_dict round trip below takes an extra step
        checkpoint.save(opts[args.layout[0]], args.save, step=last_step, extra=dict(problem=problem_signature(args)))
    mine = {layout: dict(ledger=opt.comm.ledger.summary(), owners=sorted(opt.plan.owners.items()),
                         groups=sorted(opt.plan.groups.items()),
                         state_dict_roundtrip=state_dict_roundtrip(opt, problem, args, grid, last_step + 1))
            for layout, opt in opts.items()}
    everyone = comm.gather_objects(mine, "report")
    if grid.rank != 0:
        return 0
    layouts = {}
    for layout, opt in opts.items():
        per_rank = [r[layout]["ledger"] for r in everyone]
        layouts[layout] = dict(
            ok=max(diffs[layout]) <= args.atol, max_abs_diff=max(diffs[layout]), per_step_max_abs_diff=diffs[layout],
            ns_calls=sum(r["ns_calls"] for r in per_rank), ns_flops_max_rank=max(r["ns_flops"] for r in per_rank),
            owners_agree=all(r[layout]["owners"] == everyone[0][layout]["owners"] for r in everyone),
            owners={f"{g}.{i}": rank for (g, i), rank in everyone[0][layout]["owners"]},
            groups={f"{g}.{i}": list(ranks) for (g, i), ranks in everyone[0][layout]["groups"]},
            groups_agree=all(r[layout]["groups"] == everyone[0][layout]["groups"] for r in everyone),
            state_dict_roundtrip=all(r[layout]["state_dict_roundtrip"] for r in everyone),
            state_bytes=opt.state_bytes(), ledger=per_rank[0], ledger_per_rank=per_rank)
    ok = all(v["ok"] and v["state_dict_roundtrip"] for v in layouts.values())
    worst = max(v["max_abs_diff"] for v in layouts.values())
    first = layouts[args.layout[0]]
    for layout, v in layouts.items():
        print(f"\ncommunication per rank 0 in step {last_step} ({args.optimizer}, layout {layout}, "
              f"dp={grid.dp}, tp={grid.tp}); Newton-Schulz runs over all ranks: {v['ns_calls']}")
        print(opts[layout].comm.ledger.table())
        if v["groups"]:
            print(f"groups (matrix: ranks), sized by {'time on --hw' if args.hw else 'FLOPs'}: "
                  + ", ".join(f"{k}: {r}" for k, r in v["groups"].items()))
    print(f"\n{'OK' if ok else 'MISMATCH'}: largest difference {worst:.3e} (allowed {args.atol:g})")
    print(json.dumps(dict(
        ok=ok, max_abs_diff=worst, per_step_max_abs_diff=first["per_step_max_abs_diff"], dp=grid.dp, tp=grid.tp,
        world_size=grid.dp * grid.tp, optimizer=args.optimizer, steps=args.steps, seed=args.seed,
        shapes=[list(s) for s in args.shapes], tp_dims=args.tp_dims, bucket_numel=args.bucket_numel,
        atol=args.atol, poc_bug=args.poc_bug, hw=args.hw, ns_batch=args.ns_batch,
        ns_coefficients=args.ns_coefficients or "muon", ns_form=args.ns_form or "standard", overlap=opts[args.layout[0]].overlap, backend=dist.get_backend(), device=str(dev),
        resumed_from=resumed_from, saved_to=args.save, layout=args.layout[0], ns_calls=first["ns_calls"], ns_flops_max_rank=first["ns_flops_max_rank"],
        state_bytes=first["state_bytes"], ledger=first["ledger"], layouts=layouts)), flush=True)
    for opt in opts.values():
        opt.comm.close()
    return 0 if ok else 1


def main(argv=None) -> int:
    """Parse the flags and run ``worker`` on every rank; the exit code (0 iff every check passed)."""
    return launch(worker, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
