"""Distributed Muon vs Distributed AdamW, measured side by side in one run: bytes, time, state, memory.

    python scripts/bench.py --dp 2 --tp 2                      # one grid
    python scripts/bench.py --sweep                            # DP4, TP4 and DP2xTP2, one after another
    python scripts/bench.py --sweep --grids 4x1,1x4,2x2,8x1,2x4  # 8-rank grids on request
    python scripts/bench.py --dp 2 --tp 2 --overlap none,naive,prefetch   # the async experiment
    python scripts/bench.py --dp 2 --tp 2 --report-shapes      # the report's ~23M parameters (slow on a CPU)
    python scripts/bench.py --dp 2 --tp 2 --layout bucket,owner --single --stack   # layouts vs one process
    torchrun --standalone --nproc-per-node 4 scripts/bench.py --dp 2 --tp 2
    python -m muongrid.bench --dp 2 --tp 2         # the same, from an install (or: muongrid-bench --dp 2 --tp 2)

``scripts/bench.py`` is a thin wrapper around this module, so the book's commands and an installed
package run the same code with the same flags, output and JSON line.

Both optimizers get the same seeded parameters and the same gradients, on the same grid, in the
same processes, and their steps alternate (the order flips every step), so machine noise hits both
alike. A step's time is the slowest rank's; the table reports medians over the measured steps.
Bytes come from each optimizer's own ledger and are checked against the closed form
(``muongrid/lab/costmodel.py``). Optimizer state is counted per rank (momentum vs AdamW's two moments;
the fp32 master shard, which both keep, separately). Peak memory per rank is the parameters,
gradients and state plus the largest transient allocation during one step
(``muongrid/lab/profiling.py``). The last line is JSON with everything, including ``bytes_ratio``,
``time_ratio`` and ``state_bytes_ratio`` (Muon / AdamW, for the first layout of ``--layout``).

``--layout bucket,owner,aligned`` runs Distributed Muon once per layout, beside the same AdamW, and
reports per layout (``"layouts"`` in the JSON): bytes (mean over ranks, and every rank's, each checked
against the closed form), ``ns_calls`` (Newton-Schulz runs per step over all ranks),
``ns_flops_max_rank`` and the step time. ``--single`` also times one process doing the whole step
with all the cores (rank 0, while the other ranks wait), in the same run, and adds
``grid_efficiency`` = single-process Muon step / distributed Muon step and ``muon_overhead_ratio`` =
(distributed Muon - distributed AdamW) / (single-process Muon - single-process AdamW): the time Muon
adds on the grid in units of what it adds in one process (1.0: no work repeated, traffic free).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from muongrid.comm import Comm
from muongrid.distributed import OVERLAP_MODES, DistributedAdamW, DistributedMuon, default_overlap
from muongrid.launch import add_launch_args, arg_type, check_launch_args, launch, under_torchrun
from muongrid.layouts import LAYOUTS, parse_layouts
from muongrid.newton_schulz import native_bf16_matmul
from muongrid.optim import MuonW
from muongrid.lab.costmodel import step_bytes
from muongrid.lab.timemodel import THIS_MACHINE, hw_arg, resolve_hw
from muongrid.lab.provenance import provenance
from muongrid.lab.profiling import slowest_rank_seconds, step_peak_bytes, timed
from muongrid.lab.verdicts import fastest, fastest_text
from muongrid.lab.synthetic import (REPORT_SHAPES, REPORT_TP_DIMS, add_problem_args, build_problem, check_problem_args,
                                 set_grads, stack_shapes)

SWEEP_GRIDS = "4x1,1x4,2x2"


def muon_name(layout: str, overlap: str = "default") -> str:
    """The variant's name: "muon" for the bucket layout (the paper's), "muon-owner" etc. for the others,
    with the overlap mode added when it is not the layout's default (``default_overlap``)."""
    overlap = default_overlap(layout) if overlap == "default" else overlap
    return ("muon" if layout == "bucket" else f"muon-{layout}") + \
        ("" if overlap == default_overlap(layout) else f"-{overlap}")


def variants(overlaps: list[str], layouts: list[str] = ("bucket",)) -> list[tuple[str, str, str, str]]:
    """(name, optimizer, overlap, layout) for every variant measured; AdamW has nothing to prefetch."""
    out = {}
    for lay in layouts:
        for o in overlaps:
            o = default_overlap(lay) if o == "default" else o
            out.setdefault(muon_name(lay, o), ("muon", o, lay))
    for o in overlaps:
        o = "none" if o == "default" else o
        if o != "prefetch":
            out.setdefault(f"adamw{'' if o == 'none' else '-' + o}", ("adamw", o, "bucket"))
    return [(name, *v) for name, v in out.items()]


def single_process_seconds(problem, args, dev) -> dict:
    """Median step time of one process doing the whole step with every core: Muon and AdamW, interleaved."""
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        opts = {}
        for kind in ("muon", "adamw"):
            groups = problem.param_groups(1, 0, dev)
            opts[kind] = MuonW([dict(g, use_muon=g["use_muon"] and kind == "muon") for g in groups])
        seconds = {kind: [] for kind in opts}
        for step in range(1, args.warmup + args.steps + 1):
            grads = problem.grads(step, 0)
            for kind in (list(opts) if step % 2 else list(reversed(opts))):
                for g in opts[kind].param_groups:
                    for n, p in zip(g["names"], g["params"]):
                        p.grad = grads[n].to(dev)
                t = timed(opts[kind].step, dev)
                if step > args.warmup:
                    seconds[kind].append(t)
        return ({kind: statistics.median(v) for kind, v in seconds.items()}
                | {f"{kind}_all": v for kind, v in seconds.items()} | dict(threads=torch.get_num_threads()))
    finally:
        torch.set_num_threads(threads)


def worker(grid, comm, args) -> int:
    dev = grid.device
    problem = build_problem("muon", args.shapes, args.tp_dims, 1, args.seed, grid.tp)
    single = None
    if args.single:  # first, while nothing else runs: rank 0 alone, the other ranks wait
        if grid.rank == 0:
            single = single_process_seconds(problem, args, dev)
        comm.all_reduce(torch.zeros(1, device=dev), "world", "sync")
    opts, comms = {}, {}
    for name, kind, overlap, layout in variants(args.overlap, args.layout):
        groups = problem.param_groups(grid.tp, grid.tp_rank, dev)
        comms[name] = Comm(grid, timeout_s=args.timeout, time_device=True)
        cls = DistributedMuon if kind == "muon" else DistributedAdamW
        opts[name] = cls(groups, grid, comm=comms[name], bucket_numel=args.bucket_numel, overlap=overlap, layout=layout,
                         hw=group_hw(args, layout))

    seconds = {name: [] for name in opts}
    for step in range(1, args.warmup + args.steps + 1):
        grads = problem.grads(step, grid.dp_rank, grid.dp)
        order = list(opts) if step % 2 else list(reversed(opts))
        for name in order:
            set_grads(opts[name].param_groups, grads, grid)
            t = slowest_rank_seconds(comm, opts[name].step)
            if step > args.warmup:
                seconds[name].append(t)

    measured = range(args.warmup + 1, args.warmup + args.steps + 1)
    mine = {}
    for name, opt in opts.items():
        set_grads(opt.param_groups, problem.grads(0, grid.dp_rank, grid.dp), grid)
        transient = step_peak_bytes(opt.step, dev)
        persistent = sum(2 * p.numel() * p.element_size() for g in opt.param_groups for p in g["params"])  # + grads
        last = comms[name].ledger.summary(args.warmup + args.steps)
        mine[name] = dict(peak_bytes=persistent + sum(opt.state_bytes().values()) + transient,
                          transient_bytes=transient, state_bytes=opt.state_bytes(),
                          bytes_per_phase={ph: p["bytes_sent"] for ph, p in last["phases"].items()},
                          bytes=last["bytes_sent"], ns_calls=last["ns_calls"], ns_flops=last["ns_flops"])
    everyone = comm.gather_objects(mine, "report")
    if grid.rank != 0:
        return 0

    results = {}
    for name in opts:
        per_step = [comms[name].ledger.summary(s) for s in measured]
        last = per_step[-1]
        state = everyone[0][name]["state_bytes"]
        bytes_per_rank = [r[name]["bytes"] for r in everyone]
        results[name] = dict(
            layout=opts[name].layout,
            bytes_per_phase={ph: p["bytes_sent"] for ph, p in last["phases"].items()},
            bytes_per_phase_per_rank=[r[name]["bytes_per_phase"] for r in everyone],
            bytes=last["bytes_sent"], bytes_per_rank=bytes_per_rank, bytes_mean=statistics.mean(bytes_per_rank),
            ns_calls=sum(r[name]["ns_calls"] for r in everyone),
            ns_flops_max_rank=max(r[name]["ns_flops"] for r in everyone),
            calls=sum(p["calls"] for p in last["phases"].values()),
            comm_seconds=statistics.median(s["seconds"] for s in per_step),
            comm_seconds_all=[s["seconds"] for s in per_step],
            comm_seconds_per_phase={ph: statistics.median(s["phases"][ph]["seconds"] for s in per_step)
                                    for ph in last["phases"]},
            step_seconds=statistics.median(seconds[name]), step_seconds_all=seconds[name],
            optimizer_state_bytes=sum(v for k, v in state.items() if k != "master"), master_bytes=state["master"],
            peak_bytes_per_rank=[r[name]["peak_bytes"] for r in everyone],
            transient_bytes_per_rank=[r[name]["transient_bytes"] for r in everyone])
    ratio = lambda a, b: a / b if b else None  # noqa: E731
    muon, adamw = results[muon_name(args.layout[0])], results["adamw"]
    layouts = {}
    for layout in args.layout:
        m = results[muon_name(layout)]
        hw = group_hw(args, layout)
        closed = [step_bytes(problem.groups, grid.dp, grid.tp, args.bucket_numel, layout=layout, rank=r, hw=hw)["total"]
                  for r in range(grid.dp * grid.tp)]
        layouts[layout] = dict(
            variant=muon_name(layout), bytes_mean=m["bytes_mean"], bytes_ratio=ratio(m["bytes_mean"], adamw["bytes_mean"]),
            closed_form_matches=closed == m["bytes_per_rank"], ns_calls=m["ns_calls"],
            ns_flops_max_rank=m["ns_flops_max_rank"], step_seconds=m["step_seconds"],
            groups={f"{b}.{i}": list(ranks) for (b, i), ranks in opts[muon_name(layout)].plan.groups.items()},
            time_ratio=ratio(m["step_seconds"], adamw["step_seconds"]))
        if single:
            single_extra = single["muon"] - single["adamw"]
            layouts[layout].update(
                grid_efficiency=single["muon"] / m["step_seconds"],
                muon_overhead_ratio=(m["step_seconds"] - adamw["step_seconds"]) / single_extra,
                # per measured step: that step's Muon and AdamW ran back to back, so their difference
                # shares the step's noise; the spread of these is the ratio's run-to-run spread
                muon_overhead_ratio_all=[(t - a) / single_extra
                                         for t, a in zip(m["step_seconds_all"], adamw["step_seconds_all"])])
        layouts[layout]["step_seconds_all"] = m["step_seconds_all"]
    closed = {k: step_bytes(problem.groups, grid.dp, grid.tp, args.bucket_numel, muon=k == "muon",
                            layout=args.layout[0], hw=group_hw(args, args.layout[0]) if k == "muon" else None)["total"]
              for k in ("muon", "adamw")}
    summary = dict(
        dp=grid.dp, tp=grid.tp, world_size=grid.dp * grid.tp, backend=dist.get_backend(), device=str(dev),
        shapes=[list(s) for s in args.shapes], tp_dims=args.tp_dims, bucket_numel=args.bucket_numel,
        steps=args.steps, warmup=args.warmup, variants=results, layouts=layouts, single=single, hw=args.hw,
        bf16_matmul="native" if native_bf16_matmul(dev) else "emulated (fp32 matmul on bf16 values)",
        bytes_ratio=ratio(muon["bytes_mean"], adamw["bytes_mean"]), time_ratio=ratio(muon["step_seconds"], adamw["step_seconds"]),
        comm_time_ratio=ratio(muon["comm_seconds"], adamw["comm_seconds"]),
        state_bytes_ratio=ratio(muon["optimizer_state_bytes"], adamw["optimizer_state_bytes"]),
        state_with_master_ratio=ratio(muon["optimizer_state_bytes"] + muon["master_bytes"],
                                      adamw["optimizer_state_bytes"] + adamw["master_bytes"]),
        peak_bytes_ratio=ratio(max(muon["peak_bytes_per_rank"]), max(adamw["peak_bytes_per_rank"])),
        closed_form=dict(muon_bytes=closed["muon"], adamw_bytes=closed["adamw"], bytes_ratio=ratio(*closed.values()),
                         matches_ledger=closed["muon"] == muon["bytes_mean"] and closed["adamw"] == adamw["bytes_mean"]
                         and all(v["closed_form_matches"] for v in layouts.values())))
    print_table(summary)
    print(json.dumps(summary), flush=True)
    if args.result_file:
        Path(args.result_file).write_text(json.dumps(summary))
    if args.out:
        record = dict(args.origin, load_average_1min=[args.load_before, round(os.getloadavg()[0], 1)],
                      nice=os.nice(0), result=summary)
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
        print(f"recorded in {args.out}")
    return 0


def group_hw(args, layout: str) -> dict | None:
    """The profile the group layout's groups are sized on (None: by FLOPs, and for every other layout)."""
    return args.hw if layout == "group" else None


def print_table(s: dict) -> None:
    print(f"\n{s['dp']} x {s['tp']} grid ({s['backend']}, bf16 matmul {s['bf16_matmul']}), medians of "
          f"{s['steps']} steps; bytes (mean over ranks) and times per step")
    print(f"{'variant':<20}{'step ms':>9}{'comm ms':>9}{'bytes sent':>13}{'NS runs':>8}{'opt. state':>12}{'peak MB':>9}")
    for name, v in s["variants"].items():
        print(f"{name:<20}{v['step_seconds'] * 1e3:>9.1f}{v['comm_seconds'] * 1e3:>9.1f}{v['bytes_mean']:>13,.0f}"
              f"{v['ns_calls']:>8}{v['optimizer_state_bytes']:>12,}{max(v['peak_bytes_per_rank']) / 1e6:>9.1f}")
    if s["single"]:
        print(f"one process, {s['single']['threads']} threads: Muon step {s['single']['muon'] * 1e3:.1f} ms, "
              f"AdamW step {s['single']['adamw'] * 1e3:.1f} ms")
    for layout, v in s["layouts"].items():
        extra = (f", grid efficiency {v['grid_efficiency']:.2f}, Muon overhead ratio {v['muon_overhead_ratio']:.2f}"
                 if "grid_efficiency" in v else "")
        print(f"layout {layout:<8} bytes/AdamW {v['bytes_ratio'] or float('nan'):.3f} "
              f"({'=' if v['closed_form_matches'] else 'DIFFERS FROM'} closed form), NS runs {v['ns_calls']}{extra}")
        if v["groups"]:
            print(f"  groups (matrix: ranks){' sized by time on --hw' if s['hw'] else ''}: "
                  + ", ".join(f"{k}: {r}" for k, r in v["groups"].items()))
    fmt = lambda x: "n/a (AdamW sends nothing)" if x is None else f"{x:.3f}"  # noqa: E731
    print(f"Muon / AdamW: bytes {fmt(s['bytes_ratio'])} (closed form {fmt(s['closed_form']['bytes_ratio'])}, "
          f"{'matches' if s['closed_form']['matches_ledger'] else 'DOES NOT MATCH'} the ledger), "
          f"step time {fmt(s['time_ratio'])}, comm time {fmt(s['comm_time_ratio'])}, "
          f"optimizer state {fmt(s['state_bytes_ratio'])}")


def parse_grids(text: str) -> list[tuple[int, int]]:
    try:
        return [tuple(int(x) for x in g.lower().split("x")) for g in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"grids {text!r}: write them like 4x1,1x4,2x2 (dp x tp)") from None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    add_problem_args(p)
    p.add_argument("--steps", type=int, default=5, help="measured steps per variant (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured steps first (default 2)")
    p.add_argument("--overlap", default="default",
                   help=f"comma-separated modes to compare, from {','.join(OVERLAP_MODES)} and default "
                        "(each layout's own: none for bucket, prefetch for owner and aligned)")
    p.add_argument("--report-shapes", action="store_true", help="the community report's ~23M-parameter shapes")
    p.add_argument("--stack", type=int, nargs="?", const=12, default=0, metavar="LAYERS",
                   help="a balanced transformer stack of LAYERS layers (default 12; see synthetic.stack_shapes)")
    p.add_argument("--layout", type=arg_type(parse_layouts), default=["bucket"], help=f"comma-separated layouts from {','.join(LAYOUTS)} (default bucket)")
    p.add_argument("--hw", type=arg_type(hw_arg), default=None, metavar="PROFILE",
                   help="size the group layout's groups by time on this profile: 'h100', a JSON file (muongrid.hardware), "
                        f"or '{THIS_MACHINE}' (the calibrated CPU profile of book/data, for this launch's ranks)")
    p.add_argument("--single", action="store_true", help="also time one process with all cores (grid efficiency)")
    p.add_argument("--sweep", action="store_true", help="run every grid of --grids in turn")
    p.add_argument("--grids", type=parse_grids, default=parse_grids(SWEEP_GRIDS), help=f"for --sweep (default {SWEEP_GRIDS})")
    p.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, metavar="FILE",
                   help="also write the result with its command, commit, machine and load average here (JSON): "
                        "how the book's recorded headline runs in book/data/ are made")
    args = p.parse_args(argv)
    if args.out and args.sweep:
        p.error("--out records one grid's run; drop --sweep or record each grid with --dp/--tp")
    if args.out:  # the code and the machine as the run began
        args.origin = provenance(sys.argv if argv is None else [sys.argv[0], *argv])
        args.load_before = round(os.getloadavg()[0], 1)
    args.hw_spec = args.hw
    if args.hw is not None and "group" not in args.layout:
        p.error("--hw sizes the group layout's groups: give --layout group (or a list with group)")
    if args.report_shapes and args.stack:
        p.error("--report-shapes and --stack are two different problems: pick one")
    if args.report_shapes:
        args.shapes, args.tp_dims = REPORT_SHAPES, REPORT_TP_DIMS
    if args.stack:
        args.shapes, args.tp_dims = stack_shapes(args.stack)
    args.overlap = [o.strip() for o in args.overlap.split(",")]
    if any(o not in (*OVERLAP_MODES, "default") for o in args.overlap):
        p.error(f"--overlap takes modes from {OVERLAP_MODES} or default")
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be at least 1 and --warmup at least 0")
    if not args.sweep:
        check_launch_args(p, args)
        check_problem_args(p, args)
        resolve_hw(p, args)
        return launch(worker, args)
    if under_torchrun():
        p.error("--sweep launches one run per grid; under torchrun run one grid at a time with --dp/--tp")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for dp, tp in args.grids:
            args.dp, args.tp, args.result_file = dp, tp, os.path.join(tmp, f"{dp}x{tp}.json")
            check_launch_args(p, args)
            check_problem_args(p, args)
            resolve_hw(p, args)
            if launch(worker, args):
                return 1
            runs.append(json.loads(Path(args.result_file).read_text()))
    print("\nsweep: median step time (ms) and Muon/AdamW ratios")
    print(f"{'grid':<8}{'Muon step':>11}{'AdamW step':>12}{'bytes ratio':>13}{'time ratio':>12}{'comm time ratio':>17}")
    for r in runs:
        m, a = r["variants"][muon_name(args.layout[0])], r["variants"]["adamw"]
        print(f"{r['dp']}x{r['tp']:<6}{m['step_seconds'] * 1e3:>11.1f}{a['step_seconds'] * 1e3:>12.1f}"
              f"{r['bytes_ratio'] or float('nan'):>13.3f}{r['time_ratio']:>12.3f}{r['comm_time_ratio'] or float('nan'):>17.3f}")
    muon_steps = {f"{r['dp']}x{r['tp']}": r["variants"][muon_name(args.layout[0])]["step_seconds_all"] for r in runs}
    print(f"Muon: {fastest_text(muon_steps)} (a winner only outside the noise: muongrid/lab/verdicts.py)")
    print(json.dumps(dict(sweep=runs, fastest_muon_grids=fastest(muon_steps))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
