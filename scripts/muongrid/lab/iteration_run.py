"""The schedule of ``scripts/iteration_bench.py`` on every rank: warm up, count one iteration, time the runs, probe.

For one model, every option of ``iteration.VARIANTS`` asked for is built from the same seed and sees the same
global batches (``--batch`` rows of ``--seq`` tokens, drawn from a seeded generator; rank r takes its rows):

1. ``--warmup`` iterations of each, untimed (state is made, DDP rebuilds its buckets in its second iteration);
2. one iteration of each, counted (``c10d_count.C10dCounter``) and untimed;
3. ``--runs`` runs of ``--iters`` iterations: each iteration runs every option once, after a barrier, in an order
   that rotates by one each time; then, per option that reduces under backward, ``--probes`` backwards under
   ``no_sync()`` and (DDP's) ``--probes`` all-reduces of its buckets alone (``iteration.probe_no_sync``, ``probe_reduction``).

Every rank's records go to rank 0 (``gather_objects``), which ``iteration_report.summarize`` reads.
"""
from __future__ import annotations

import gc
import time

import torch
import torch.distributed as dist

from .c10d_count import C10dCounter
from .iteration import build_model, iterate, make_variant, probe_no_sync, probe_reduction


def parse_model(text: str) -> dict:
    """``llama:256x4`` -> {"kind": "llama", "hidden": 256, "layers": 4}."""
    try:
        kind, size = text.split(":")
        hidden, layers = (int(x) for x in size.split("x"))
    except ValueError:
        raise ValueError(f"a model is KIND:HIDDENxLAYERS (llama:256x4, gpt2:128x2), got {text!r}") from None
    if kind not in ("llama", "gpt2") or hidden < 8 or hidden % 4 or layers < 1:
        raise ValueError(f"{text!r}: KIND is llama or gpt2, HIDDEN a multiple of 4 (4 heads), LAYERS >= 1")
    return dict(kind=kind, hidden=hidden, layers=layers)


def batches(args, n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(args.seed + 1)
    return [torch.randint(args.vocab, (args.batch, args.seq), generator=gen) for _ in range(n)]


def measure_model(grid, comm, args, spec: dict) -> list[dict] | None:
    """Run the schedule for one model; rank 0 gets every rank's records (the others None)."""
    names = list(args.variants)
    device, dp = grid.device, grid.dp
    modules = [build_model(spec["kind"], spec["hidden"], spec["layers"], args.vocab, args.seq, args.seed).to(device)
               for _ in names]
    first = [p.detach() for p in modules[0].parameters()]
    if any(not torch.equal(a, p) for m in modules[1:] for a, p in zip(first, m.parameters())):
        raise RuntimeError("the options' models differ before the first step: the seed did not fix them")
    variants = [make_variant(n, m, grid, args.timeout) for n, m in zip(names, modules)]
    rows = slice(grid.dp_rank * args.batch // dp, (grid.dp_rank + 1) * args.batch // dp)
    data = iter(batches(args, args.warmup + 1 + args.runs * args.iters))
    start = time.perf_counter()
    note = (lambda text: print(f"  [{time.perf_counter() - start:6.1f} s] {text}", flush=True)) if grid.rank == 0 \
        else (lambda text: None)
    mine = dict(rank=grid.rank, names=names, warmup={n: [] for n in names}, timed={n: [] for n in names},
                no_sync={n: [] for n in names}, reduction={n: [] for n in names}, counted={})
    for _ in range(args.warmup):
        x = next(data)[rows].to(device)
        for v in variants:
            mine["warmup"][v.name].append(iterate(v, x)["loss"])
    note(f"{spec['kind']} {spec['hidden']}x{spec['layers']}: {len(names)} options built, {args.warmup} warm-up "
         "iterations each")
    x = next(data)[rows].to(device)
    buckets = {}
    for v in variants:
        dist.barrier()
        with C10dCounter() as seen:
            rec = iterate(v, x, seen)
        mine["counted"][v.name] = dict(rec, calls=[vars(c) for c in seen.calls], summary=seen.summary(),
                                       **census(v))
        if v.ddp is not None:
            buckets[v.name] = [torch.zeros(n, device=device) for n in seen.numels("all_reduce", "backward")]
    note("one iteration each counted")
    step = 0
    for run in range(args.runs):
        for _ in range(args.iters):
            x = next(data)[rows].to(device)
            for v in variants[step % len(variants):] + variants[:step % len(variants)]:
                dist.barrier()
                mine["timed"][v.name].append(dict(iterate(v, x), run=run))
            step += 1
        for v in variants:
            if not v.reduces_in_backward:
                continue
            for _ in range(args.probes):
                dist.barrier()
                mine["no_sync"][v.name].append(probe_no_sync(v, x))
                if v.ddp is not None:
                    dist.barrier()
                    mine["reduction"][v.name].append(probe_reduction(buckets[v.name]))
        note(f"run {run + 1} of {args.runs}: {args.iters} iterations each, and the probes")
    mine["final_gap"] = final_gaps(variants)
    everyone = comm.gather_objects(mine, "report")
    for v in variants:
        if v.ours is not None:
            v.ours.comm.close()
    del variants, modules
    gc.collect()
    return everyone if grid.rank == 0 else None


def census(v) -> dict:
    """What the closed forms need of an option: its groups' shapes, its parameters' and buffers' sizes, and who owns
    what under ZeRO (read from the optimizer itself, for the check against ``costmodel.zero_partition``)."""
    out = dict(groups=[dict(shapes=[tuple(p.shape) for p in g["params"]], use_muon=bool(g["use_muon"]),
                            numels=[p.numel() for p in g["params"]]) for g in v.groups],
               buffers=[b.numel() for b in v.module.buffers()],
               grad_numel=sum(p.numel() for p in v.module.parameters() if p.requires_grad))
    if v.name == "zero":
        out["zero_owners"] = [[z._param_to_rank[p] for p in z.param_groups[0]["params"]] for z in v.optimizers]
        out["zero_numels"] = [[p.numel() for p in z.param_groups[0]["params"]] for z in v.optimizers]
    if v.ours is not None:
        out["check_finite"] = v.ours.check_finite
        out["n_params"] = sum(len(g["params"]) for g in v.ours.param_groups)
    return out


def final_gaps(variants) -> dict:
    """Largest elementwise difference of each option's parameters, after the last step, from ZeRO's (or the first
    option's) under "zero", and from our first layout's under "ours"."""
    def gaps(ref):
        ref = [p.detach() for p in ref.module.parameters()]
        return {v.name: max(float((p.detach() - r).abs().max()) for p, r in zip(v.module.parameters(), ref))
                for v in variants}
    ours = [v for v in variants if v.ours is not None and v.ddp is None]
    return dict(zero=gaps(next((v for v in variants if v.name == "zero"), variants[0])),
                ours=gaps(ours[0]) if ours else {})

