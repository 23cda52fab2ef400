"""Train the tensor-parallel tiny GPT on a DP x TP grid with Distributed Muon, the hybrid, or Distributed AdamW.

    python scripts/train.py --dp 2 --tp 2 --optimizer hybrid --layout owner --steps 50
    python scripts/train.py --dp 1 --tp 1 --optimizer adamw --steps 200 --eval-every 50
    python scripts/train.py --dp 2 --tp 2 --steps 10 --profile _build/traces/train   # Chrome traces of steps 2-4
    torchrun --standalone --nproc-per-node 4 scripts/train.py --dp 2 --tp 2 --optimizer hybrid --steps 50
    python scripts/train.py --fsdp --dp 2 --tp 2 --optimizer hybrid --steps 20 --compare-torch-muon
    python scripts/train.py --dp 2 --tp 2 --clip 1.0 --save _build/run --every 10 --steps 20
    python scripts/train.py --dp 4 --tp 1 --clip 1.0 --resume _build/run --steps 40   # another grid, same curve
    python scripts/train.py --dp 2 --tp 2 --layout group --hw h100   # groups sized by time (muongrid/hardware.py)

This is the book's measuring harness (the ledger, profiles, state metrics, comparisons with ``torch.optim``):
the loop to copy into a project is ``loop_zero1_tp.py`` (chapter 12), and ``loop_fsdp.py`` for FSDP2.

The model is chapter 1's character-level GPT on Python's docs, split over TP by PyTorch's own
``parallelize_module`` (``muongrid/lab/tpgpt.py``); the optimizer reads each parameter's TP split from
its DTensor placement. ``--optimizer``: ``hybrid`` (Muon for the hidden matrices, AdamW for
embeddings, head and norms: ``optim.routes_to_muon``), ``muon`` (Muon for every 2-D parameter, the
embeddings and head too; AdamW for the 1-D norms, which Muon cannot take) or ``adamw``.

**Same data on every grid.** Each step draws one global batch of ``--batch`` windows from a generator
seeded by ``--seed`` (the same on every rank); DP rank ``r`` trains on rows ``[r*B/dp, (r+1)*B/dp)``,
and the TP ranks of one replica share them. The ZeRO-1 reduce-scatter averages the DP ranks'
gradients, each a mean over an equal slice, so every grid computes the gradient of the same global
mean loss: for the same ``--batch`` and ``--seed`` all grids follow the same loss curve, up to the
order of floating-point reductions (which TP and DP change).

Every ``--eval-every`` K steps (and at step 0 and the last step) rank 0 prints one progress line
(step, train loss, estimates of train and validation loss on fixed windows, tokens/s); every
``--metrics-every`` steps (default K) the optimizer-state metrics are measured
(``muongrid/lab/statemetrics.py``: per Muon matrix, update RMS, momentum norm, singular-value spread
before and after Newton-Schulz). The run ends with one JSON line:

* ``step_loss`` (the global mean loss of every step), ``evals`` (step, tokens, train_loss, val_loss),
  ``tokens_seen``, ``tokens_per_s``;
* ``time_ms``: rank 0's mean per step after the first: forward_backward, waiting (for peers),
  optimizer, its ``communication`` per phase (the ledger's timings) and the rest,
  ``optimizer_compute``; ``time_ms_per_rank`` the same for every rank;
* ``profile_ms_per_rank`` (with ``--profile DIR``): each rank's medians over the traced steps, read
  from its Chrome trace, Newton-Schulz apart (``muongrid/lab/traces.py``);
* ``bytes_per_step``: what rank 0 sent in the optimizer's collectives (ring-algorithm bytes, from
  the ledger), with ``ledger`` per phase and ``bytes_per_step_per_rank``;
* ``tp_split_dims`` (what the plan read from the placements), ``state_metrics``, and under ``--layout group``
  ``ns_groups`` (each grouped matrix's ranks; sized by time on ``hw`` with ``--hw``).

**Clipping and checkpoints.** ``--clip MAX_NORM`` clips the DP-mean gradient by its global norm with
``opt.clip_grad_norm_`` (``muongrid/clipping.py``; the norms are in ``grad_norm``). ``--save DIR --every N``
checkpoints model, optimizer, scheduler, data position and RNG into ``DIR/step<N>`` every N steps (and at
the last step); ``--resume DIR`` continues from the newest of them (or from ``DIR/step<N>`` given
itself) on any grid and layout, also with ``--fsdp`` (``muongrid/resume.py``):
``step_loss`` then starts at ``first_step``.

**FSDP2** (``--fsdp``): after ``parallelize_module`` on "tp" the model is wrapped with ``fully_shard`` on
"dp", so parameters, gradients and optimizer state are row blocks (FSDP2 gathers the weights for the
forward and backward and reduce-scatters the gradients itself), and the optimizer is ``muongrid.fsdp.FSDPMuon``
(each Muon matrix orthogonalised once, by one owner; ``--optimizer adamw`` runs its AdamW only). The
ledger then holds only the optimizer's own traffic (``ns_to_owner``, ``ns_from_owner``); FSDP2's
gathers and reduce-scatters are the same for every optimizer and are not counted. State metrics are off.

``--compare-torch-muon`` (implies ``--fsdp``) trains a second copy of the model on the same batches
with ``torch.optim.Muon`` for the same Muon parameters and ``torch.optim.AdamW`` for the rest, in the
same run, and reports both side by side in ``compare``: bytes per step (ours: the ledger; torch's:
every collective DTensor issues inside its optimizer step, seen by ``CommDebugMode``, priced with the
same ring formulas, ``muongrid/lab/dtensor_comm.py``), collectives per step, Newton-Schulz calls per step
(ours: the ledger; torch's: calls of its ``_zeropower_via_newtonschulz``, counted), optimizer and step
time, and both loss curves.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from muongrid.comm import PHASES
from muongrid.devices import clock
from muongrid.distributed import DistributedAdamW, DistributedMuon
from muongrid.layouts import LAYOUTS
from muongrid.launch import add_launch_args, arg_type, check_launch_args, launch
from muongrid.optim import hybrid_param_groups
from muongrid.lab.charlm import batch, evaluate, load_corpus
from muongrid.lab.statemetrics import NSMetrics, merge as merge_metrics
from muongrid.lab.timemodel import THIS_MACHINE, hw_arg, resolve_hw
from muongrid.lab.tpgpt import TP_PLAN_NOTE, tp_gpt
from muongrid.lab.traces import breakdown as trace_breakdown, load_events, median_breakdown
from muongrid.fsdp import FSDPMuon
from muongrid.resume import load_run, save_run

# What makes two runs the same run: a resume refuses to change these (the grid, layout and --steps may change).
RUN_ARGS = ("optimizer", "fsdp", "batch", "context", "lr", "adamw_lr", "weight_decay", "warmup", "schedule", "seed",
            "width", "layers", "heads", "clip")

OPTIMIZERS = ("hybrid", "muon", "adamw")


def param_groups(model, optimizer: str, lr: float, adamw_lr: float, weight_decay: float) -> list[dict]:
    """The parameter groups for ``--optimizer`` (see the module docstring); names go along for errors."""
    named = list(model.named_parameters())
    if optimizer == "muon":
        groups = {True: dict(use_muon=True, lr=lr, params=[], names=[]),
                  False: dict(use_muon=False, lr=adamw_lr, params=[], names=[])}
        for name, p in named:
            g = groups[p.ndim == 2]
            g["params"].append(p)
            g["names"].append(name)
        groups = [g for g in groups.values() if g["params"]]
    else:
        groups = hybrid_param_groups(named, muon=dict(lr=lr), adamw=dict(lr=adamw_lr if optimizer == "hybrid" else lr))
    for g in groups:
        g["weight_decay"] = weight_decay
    return groups


def lr_factor(step: int, args) -> float:
    """Linear warm-up over ``--warmup`` steps, then constant or cosine down to 10% (``--schedule``)."""
    if step < args.warmup:
        return (step + 1) / args.warmup
    if args.schedule == "constant":
        return 1.0
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def mean_over_ranks(comm, value: float, device) -> float:
    """The mean of ``value`` over all ranks (TP ranks of a replica agree, so this is the DP mean)."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    return comm.all_reduce(t, "world", "metrics").item() / (comm.grid.dp * comm.grid.tp)


class StepProfiler:
    """torch.profiler over steps ``first..last``: each rank writes ``trace_rank<r>.json`` into ``folder``
    (open it at https://ui.perfetto.dev) and splits it into the parts of a step (``traces.py``)."""

    def __init__(self, folder: str | None, first: int, last: int, grid):
        self.folder, self.first, self.last, self.grid = folder, first, last, grid
        self.prof, self.result = None, None

    def before(self, step: int) -> None:
        if self.folder and step == self.first:
            cuda = [ProfilerActivity.CUDA] if self.grid.device.type == "cuda" else []
            self.prof = profile(activities=[ProfilerActivity.CPU] + cuda)
            self.prof.start()

    def after(self, step: int) -> None:
        if self.prof is None or step != self.last:
            return
        self.prof.stop()
        folder = Path(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / f"trace_rank{self.grid.rank}.json"
        self.prof.export_chrome_trace(str(trace))
        self.prof = None
        self.result = dict(median_breakdown(trace_breakdown(load_events(trace))), trace=str(trace),
                           steps=[self.first, self.last])


def build_model(grid, data, args):
    """The tensor-parallel tiny GPT; with ``--fsdp`` also ``fully_shard`` on the grid's "dp" dimension."""
    model = tp_gpt(data["vocab_size"], grid, d=args.width, n_layer=args.layers, n_head=args.heads,
                   context=args.context, seed=args.seed)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard
        if grid.mesh is None:
            raise ValueError("--fsdp needs a process group (the launcher makes one, even for 1 x 1)")
        fully_shard(model, mesh=grid.mesh["dp"])
    return model


class TorchMuon:
    """The comparison: torch.optim.Muon (+ torch.optim.AdamW) on an FSDP2 copy of the model, with what its
    step moves counted by CommDebugMode and its Newton-Schulz calls counted."""

    def __init__(self, grid, data, args):
        import torch.optim._muon as torch_muon
        self.model = build_model(grid, data, args)
        groups = param_groups(self.model, args.optimizer, args.lr, args.adamw_lr or args.lr, args.weight_decay)
        self.opts = []
        for g in groups:
            if g["use_muon"]:
                self.opts.append(torch.optim.Muon(g["params"], lr=g["lr"], weight_decay=g["weight_decay"],
                                                  adjust_lr_fn="match_rms_adamw"))
            else:
                self.opts.append(torch.optim.AdamW(g["params"], lr=g["lr"], weight_decay=g["weight_decay"]))
        self.scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: lr_factor(s, args)) for o in self.opts]
        self.ns_calls = 0
        original = torch_muon._zeropower_via_newtonschulz

        def counted(*a, **kw):
            self.ns_calls += 1
            return original(*a, **kw)
        torch_muon._zeropower_via_newtonschulz = counted
        self.rows = []

    def train_step(self, x, y, dev) -> float:
        from muongrid.lab.dtensor_comm import CountingCommMode
        t0 = clock(dev)
        loss = F.cross_entropy(self.model(x).flatten(0, 1), y.flatten())
        for o in self.opts:
            o.zero_grad(set_to_none=True)
        loss.backward()
        t1 = clock(dev)
        before = self.ns_calls
        with CountingCommMode() as mode:
            for o in self.opts:
                o.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t2 = time.perf_counter()
        for s in self.scheds:
            s.step()
        self.rows.append(dict(step_s=t2 - t0, optimizer_s=t2 - t1, collectives=mode.get_total_counts(),
                              by_op=mode.by_op(), bytes_sent=mode.bytes_sent(), ns_calls=self.ns_calls - before))
        return loss.item()


def worker(grid, comm, args) -> int:
    dev = grid.device
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.fsdp:  # torch.optim.Muon on 2-D DTensors warns at every redistribution; the counts say it better
        import logging
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    data = load_corpus()
    model = build_model(grid, data, args)
    groups = param_groups(model, args.optimizer, args.lr, args.adamw_lr or args.lr, args.weight_decay)
    if args.fsdp:
        opt = FSDPMuon([dict(g, use_muon=False) if args.optimizer == "adamw" else g for g in groups], grid, comm=comm)
    else:
        cls = DistributedAdamW if args.optimizer == "adamw" else DistributedMuon
        timed = {} if args.hw is None else dict(hw=args.hw)   # the group layout's groups sized by time
        opt = cls(groups, grid, comm=comm, layout=args.layout, bucket_numel=args.bucket_numel, **timed)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, args))
    metrics_every = args.eval_every if args.metrics_every is None else args.metrics_every
    metrics = NSMetrics(opt) if args.optimizer != "adamw" and metrics_every and not args.fsdp else None
    theirs = TorchMuon(grid, data, args) if args.compare_torch_muon else None
    torch_loss = []
    gen = torch.Generator().manual_seed(args.seed)
    rows = args.batch // grid.dp
    mine = slice(grid.dp_rank * rows, (grid.dp_rank + 1) * rows)
    tokens_per_step = args.batch * args.context
    run_args = {k: getattr(args, k) for k in RUN_ARGS}
    start = 1
    if args.resume:
        start = load_run(args.resume, opt, sched, gen, run_args, model=model, fsdp=args.fsdp) + 1
    grad_norms = []

    profiler = StepProfiler(args.profile, min(2, args.steps), min(args.steps, 1 + args.profile_steps), grid)
    step_loss, evals, state_metrics = [], [], []
    times = {k: [] for k in ("step", "forward_backward", "waiting", "optimizer", *PHASES)}

    def evaluation(step: int) -> dict:
        kw = dict(batches=args.eval_batches, batch_size=args.eval_batch)
        row = dict(step=step, tokens=step * tokens_per_step, train_loss=evaluate(model, data["train"], **kw),
                   val_loss=evaluate(model, data["val"], **kw))
        evals.append(row)
        return row

    first = evaluation(start - 1)
    n_params = sum(p.numel() for p in model.parameters())
    if grid.rank == 0:
        how = args.optimizer if args.optimizer == "adamw" else f"{args.optimizer}, layout {args.layout}"
        if args.fsdp:
            how = f"FSDP2 on dp, {args.optimizer} by FSDPMuon" + (" beside torch.optim.Muon" if theirs else "")
        print(f"tiny GPT {n_params:,} parameters on dp={grid.dp} x tp={grid.tp} ({how}); step {start - 1}: "
              f"train {first['train_loss']:.4f} val {first['val_loss']:.4f}", flush=True)
    for step in range(start, args.steps + 1):
        x, y = batch(data["train"], args.batch, args.context, gen)  # the global batch, the same on every rank
        x, y = x[mine].to(dev), y[mine].to(dev)
        measure = metrics is not None and step % metrics_every == 0
        if metrics is not None:
            metrics.active = measure
        profiler.before(step)
        with record_function("train_step"):
            t0 = clock(dev)  # clock(): perf_counter after a device synchronize on CUDA (devices.py)
            with record_function("forward_backward"):
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
                opt.zero_grad(set_to_none=True)
                loss.backward()
            t1 = clock(dev)
            with record_function("wait_for_peers"):  # waiting for a slower rank is not communication
                comm.all_reduce(torch.zeros(1, device=dev), "world", "sync")
            t2 = clock(dev)
            if args.clip is not None:  # the DP-mean gradient's global norm (the step's reduce-scatter, early)
                grad_norms.append(float(opt.clip_grad_norm_(args.clip)))
            opt.step()
            t3 = clock(dev)
        profiler.after(step)
        sched.step()
        if args.save and (step % args.every == 0 or step == args.steps):
            save_run(f"{args.save}/step{step}", step, opt, sched, gen, run_args, model=model, fsdp=args.fsdp)
        if theirs is not None:
            torch_loss.append(mean_over_ranks(comm, theirs.train_step(x, y, dev), dev))
        phases = opt.comm.ledger.summary(opt.steps_taken)["phases"]
        for k, v in (("step", t3 - t0), ("forward_backward", t1 - t0), ("waiting", t2 - t1), ("optimizer", t3 - t2)):
            times[k].append(v)
        for phase in PHASES:
            times[phase].append(phases.get(phase, {}).get("seconds", 0.0))
        step_loss.append(mean_over_ranks(comm, loss.item(), dev))
        if measure:
            merged = merge_metrics(comm.gather_objects(metrics.take(), "metrics"))
            state_metrics.append(dict(step=step, matrices=dict(sorted(merged.items()))))
        if step % args.eval_every == 0 or step == args.steps:
            row = evaluation(step)
            if grid.rank == 0:
                recent = times["step"][-args.eval_every:]
                print(f"step {step}/{args.steps}  loss {step_loss[-1]:.4f}  train {row['train_loss']:.4f}  "
                      f"val {row['val_loss']:.4f}  {tokens_per_step * len(recent) / sum(recent):,.0f} tokens/s",
                      flush=True)

    mean_ms = lambda xs: 1000 * sum(xs[1:] or xs) / len(xs[1:] or xs)  # noqa: E731  (the first step warms up)
    breakdown = {k: mean_ms(v) for k, v in times.items() if k not in PHASES}
    breakdown["communication"] = {p: mean_ms(times[p]) for p in PHASES if any(times[p])}
    breakdown["optimizer_compute"] = breakdown["optimizer"] - sum(breakdown["communication"].values())
    ledger = opt.comm.ledger.summary(opt.steps_taken)
    calls = sum(p["calls"] for p in ledger["phases"].values())
    mine = dict(time_ms=breakdown, bytes_per_step=ledger["bytes_sent"], profile=profiler.result,
                collectives=calls, ns_calls=ledger["ns_calls"])
    if theirs is not None:
        mine["torch"] = dict(bytes_per_step=theirs.rows[-1]["bytes_sent"], collectives=theirs.rows[-1]["collectives"],
                             ns_calls=theirs.rows[-1]["ns_calls"], by_op=theirs.rows[-1]["by_op"],
                             optimizer_ms=mean_ms([r["optimizer_s"] for r in theirs.rows]),
                             step_ms=mean_ms([r["step_s"] for r in theirs.rows]))
    everyone = comm.gather_objects(mine, "report")
    if grid.rank != 0:
        return 0
    compare = compare_report(everyone, breakdown, step_loss, torch_loss, args) if theirs is not None else None
    if args.fsdp:
        split = {n: [str(pl) for pl in p.placements] for g in opt.param_groups for n, p in zip(g["names"], g["params"])}
    else:
        split = {n: d for g in opt.param_groups for n, d in zip(g["names"], g["tp_split_dims"])}
    result = dict(
        script="train.py", dp=grid.dp, tp=grid.tp, world_size=grid.dp * grid.tp, optimizer=args.optimizer,
        layout=None if args.fsdp else args.layout, overlap=getattr(opt, "overlap", None), fsdp=args.fsdp, hw=args.hw,
        ns_groups={opt.plan.metas[b][i].name: list(m) for (b, i), m in opt.plan.groups.items()}
        if not args.fsdp else None,
        steps=args.steps, first_step=start, clip=args.clip, grad_norm=grad_norms, batch=args.batch, context=args.context,
        width=args.width, layers=args.layers, heads=args.heads, lr=args.lr, adamw_lr=args.adamw_lr or args.lr,
        weight_decay=args.weight_decay, warmup=args.warmup, schedule=args.schedule, seed=args.seed,
        eval_every=args.eval_every, threads=torch.get_num_threads(), n_params=n_params, tp_plan=TP_PLAN_NOTE,
        tp_split_dims=split, step_loss=step_loss, evals=evals, tokens_seen=args.steps * tokens_per_step,
        tokens_per_s=tokens_per_step / (breakdown["step"] / 1000), time_ms=breakdown,
        time_ms_per_rank=[r["time_ms"] for r in everyone], bytes_per_step=ledger["bytes_sent"],
        bytes_per_step_per_rank=[r["bytes_per_step"] for r in everyone], ledger=ledger,
        state_metrics=state_metrics, profile_ms_per_rank=[r["profile"] for r in everyone] if args.profile else None,
        state_bytes=state_bytes(opt), backend=dist.get_backend(), device=str(dev),
        torch=torch.__version__, collectives_per_step=calls, ns_calls_per_step=[r["ns_calls"] for r in everyone],
        compare=compare)
    print(json.dumps(result), flush=True)
    return 0


def state_bytes(opt) -> dict:
    """Bytes of optimizer state on this rank, by kind (FSDPMuon: its local blocks)."""
    if hasattr(opt, "state_bytes"):
        return opt.state_bytes()
    out: dict = {}
    for st in opt.state.values():
        for k, t in st.items():
            if k != "step":
                local = t.to_local() if hasattr(t, "to_local") else t
                out[k] = out.get(k, 0) + local.numel() * local.element_size()
    return out


def compare_report(everyone, ours_ms, step_loss, torch_loss, args) -> dict:
    """Ours and torch.optim.Muon's, side by side (rank 0's figures, totals over ranks where it matters);
    printed as a table and returned for the JSON line."""
    theirs = [r["torch"] for r in everyone]
    world = len(everyone)
    rows = dict(
        bytes_per_step=(everyone[0]["bytes_per_step"], theirs[0]["bytes_per_step"]),
        bytes_per_step_all_ranks=(sum(r["bytes_per_step"] for r in everyone), sum(t["bytes_per_step"] for t in theirs)),
        collectives_per_step=(everyone[0]["collectives"], theirs[0]["collectives"]),
        ns_calls_per_step_all_ranks=(sum(r["ns_calls"] for r in everyone), sum(t["ns_calls"] for t in theirs)),
        optimizer_ms=(ours_ms["optimizer"], theirs[0]["optimizer_ms"]),
        step_ms=(ours_ms["step"], theirs[0]["step_ms"]),
        final_loss=(step_loss[-1], torch_loss[-1]))
    print(f"\n{'per step (last step; times: mean after the first)':<52}{'muongrid FSDPMuon':>16}{'torch.optim.Muon':>18}")
    for k, (a, b) in rows.items():
        fmt = (lambda v: f"{v:,.4f}") if k == "final_loss" else (lambda v: f"{v:,.1f}") if k.endswith("_ms") \
            else (lambda v: f"{v:,}")
        print(f"{k + (' (rank 0)' if k in ('bytes_per_step', 'collectives_per_step', 'optimizer_ms', 'step_ms') else ''):<52}"
              f"{fmt(a):>16}{fmt(b):>18}")
    print(f"torch's collectives by op (rank 0): {theirs[0]['by_op']}; world = {world} ranks", flush=True)
    out = {k: dict(muongrid=a, torch=b) for k, (a, b) in rows.items()}
    out.update(step_loss_torch=torch_loss, torch_by_op=theirs[0]["by_op"],
               bytes_per_step_per_rank=dict(muongrid=[r["bytes_per_step"] for r in everyone],
                                            torch=[t["bytes_per_step"] for t in theirs]),
               step_time_ratio=theirs[0]["step_ms"] / ours_ms["step"],
               optimizer_time_ratio=theirs[0]["optimizer_ms"] / ours_ms["optimizer"],
               how_bytes=("muongrid: the ledger (comm.py), each collective muongrid's optimizer ran, priced as a ring "
                          "algorithm moves it, per rank; torch: each functional collective DTensor ran inside "
                          "torch.optim.Muon.step and AdamW.step, seen by CommDebugMode, priced with the same ring "
                          "formulas (muongrid/lab/dtensor_comm.py); FSDP2's own gathers and reduce-scatters of the "
                          "forward/backward are the same for both and counted in neither"))
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="hybrid")
    p.add_argument("--layout", choices=LAYOUTS, default="owner",
                   help="Distributed Muon's layout (default owner; 'group' orthogonalises a matrix above its fair "
                        "share of Newton-Schulz work over a group of ranks)")
    p.add_argument("--hw", type=arg_type(hw_arg), default=None, metavar="PROFILE",
                   help="with --layout group: size the groups by time on this hardware profile, 'h100', a JSON "
                        f"file (muongrid.hardware) or '{THIS_MACHINE}' (default: by Newton-Schulz FLOPs alone)")
    p.add_argument("--fsdp", action="store_true",
                   help="wrap the model with fully_shard on 'dp' (after TP on 'tp') and optimize with muongrid.fsdp.FSDPMuon")
    p.add_argument("--compare-torch-muon", action="store_true",
                   help="also train the same FSDP2 model with torch.optim.Muon (+ AdamW) in this run and compare "
                        "bytes, collectives, Newton-Schulz calls, time and loss (implies --fsdp)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=32, help="global batch: windows per step over all DP ranks")
    p.add_argument("--context", type=int, default=64, help="characters per window (default 64)")
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate (Muon's is matched to AdamW's RMS)")
    p.add_argument("--adamw-lr", type=float, default=None, help="the hybrid's AdamW groups (default --lr)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=0, help="linear warm-up steps")
    p.add_argument("--schedule", choices=["constant", "cosine"], default="constant")
    p.add_argument("--seed", type=int, default=0, help="initial weights and data order")
    p.add_argument("--eval-every", type=int, default=10, help="K: progress line, evaluation, state metrics")
    p.add_argument("--metrics-every", type=int, default=None,
                   help="Muon state metrics every this many steps (default --eval-every; 0: off). Each costs an SVD "
                        "of every Muon matrix on the rank that orthogonalises it")
    p.add_argument("--eval-batches", type=int, default=4, help="fixed windows per evaluation: batches ...")
    p.add_argument("--eval-batch", type=int, default=32, help="... of this many windows")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--bucket-numel", type=int, default=2**20)
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="trace steps 2..1+--profile-steps with torch.profiler: DIR/trace_rank<r>.json per rank")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--clip", type=float, default=None, metavar="MAX_NORM",
                   help="clip the DP-mean gradient to this global norm (opt.clip_grad_norm_)")
    p.add_argument("--save", default=None, metavar="DIR", help="checkpoint the run into DIR (see --every)")
    p.add_argument("--every", type=int, default=None, help="with --save: every N steps (default: the last step only)")
    p.add_argument("--resume", default=None, metavar="DIR", help="continue a run saved with --save, on any grid")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads per rank (default: the launcher's share of the cores). 1 is faster for tiny "
                        "models on a busy machine, where threads that wait for each other spin")
    args = p.parse_args(argv)
    check_launch_args(p, args)
    if args.compare_torch_muon:
        args.fsdp = True
        if args.optimizer == "adamw":
            p.error("--compare-torch-muon compares Muon: use --optimizer hybrid or muon")
    if args.fsdp and args.profile:
        p.error("--profile is not supported with --fsdp yet")
    if args.hw is not None and (args.layout != "group" or args.fsdp or args.optimizer == "adamw"):
        p.error("--hw sizes the group layout's groups: it needs --layout group (not --fsdp or --optimizer adamw)")
    args.hw_spec = args.hw
    resolve_hw(p, args, threads=args.threads or None)
    if args.every is not None and (args.every < 1 or not args.save):
        p.error("--every N needs --save DIR and N >= 1")
    args.every = args.every or args.steps
    if args.clip is not None and not args.clip > 0:
        p.error("--clip must be a positive norm")
    if (args.save or args.resume) and (args.profile or args.compare_torch_muon):
        p.error("--save/--resume do not combine with --profile or --compare-torch-muon")
    if args.metrics_every is not None and args.metrics_every < 0:
        p.error("--metrics-every must be 0 (off) or positive")
    for name in ("profile_steps", "steps", "batch", "context", "eval_every", "eval_batches", "eval_batch", "width",
                 "layers", "heads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.batch % args.dp:
        p.error(f"--batch {args.batch} must divide by --dp {args.dp}: every DP rank trains on an equal slice")
    if args.heads % args.tp or args.width % args.heads:
        p.error(f"--heads {args.heads} must divide by --tp {args.tp} and --width {args.width} by --heads")
    if args.context > 64 * 1024:
        p.error("--context is too long for this corpus")
    return args


if __name__ == "__main__":
    sys.exit(launch(worker, parse_args()))
