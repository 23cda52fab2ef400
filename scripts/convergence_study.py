"""A fair convergence study: AdamW vs the hybrid Muon on the tiny GPT, each at its own best learning rate.

    python scripts/convergence_study.py                                  # the defaults: what chapter 9 cites
    python scripts/convergence_study.py --out book/data/convergence_study.json
    python scripts/convergence_study.py --tiny                           # seconds: what CI runs

"Muon beats AdamW" means little unless both are tuned. The study runs ``train.py`` (one process
each, 1 x 1 grid: every grid follows the same loss curve, ``tests/test_train.py``) in three stages:

  1. **sweep**: every learning rate in ``--lrs-adamw`` with AdamW and every one in ``--lrs-hybrid``
     with the hybrid (Muon for the hidden matrices, AdamW at the same lr for embeddings, head and
     norms; Muon's per-matrix lr is matched to AdamW's update RMS, so one lr serves both), seed 0;
  2. **best**: per optimizer, the lr with the lowest final validation loss (a best at either end of
     the sweep is flagged: the sweep should then be widened);
  3. **seeds**: the best lr of each again with seeds 1 .. ``--seeds``-1 (new initial weights and
     data order).

Both see the same tokens (same ``--steps`` x ``--batch`` x ``--context``), the same warm-up and
cosine schedule, weight decay and evaluation windows. From the seeds' validation curves it
reports, per optimizer, the mean and spread (sample standard deviation) at each evaluation, the
final gap, and **tokens to target**: the tokens the hybrid's mean curve needs to reach AdamW's mean
final loss (linear between evaluations), as a fraction of AdamW's tokens, and the other way round
when AdamW gets there at all.

Runs go ``--jobs`` at a time, each with ``--threads`` CPU threads. ``--out`` writes every result so
far after each run, with the command, commit, versions and machine (``muongrid/lab/provenance.py``).
The last line printed is the same JSON.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from muongrid.lab.provenance import provenance

TRAIN_PY = Path(__file__).resolve().parent / "train.py"
OPTIMIZERS = ("adamw", "hybrid")


def train(args, optimizer: str, lr: float, seed: int) -> dict:
    """One ``train.py`` run; returns its JSON result with what the study needs (raises if the run failed)."""
    cmd = [sys.executable, str(TRAIN_PY), "--dp", "1", "--tp", "1", "--optimizer", optimizer, "--lr", repr(lr),
           "--seed", str(seed), "--steps", str(args.steps), "--batch", str(args.batch), "--context", str(args.context),
           "--width", str(args.width), "--layers", str(args.layers), "--heads", str(args.heads),
           "--warmup", str(args.warmup), "--schedule", "cosine", "--weight-decay", str(args.weight_decay),
           "--eval-every", str(args.eval_every), "--eval-batches", str(args.eval_batches), "--eval-batch", "32",
           "--metrics-every", "0", "--threads", str(args.threads)]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"train.py {optimizer} lr={lr} seed={seed} failed (exit {proc.returncode}):\n"
                           + proc.stdout[-2000:] + proc.stderr[-4000:])
    result = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    return dict(optimizer=optimizer, lr=lr, seed=seed, seconds=round(time.monotonic() - start, 1),
                tokens=[e["tokens"] for e in result["evals"]], val_loss=[e["val_loss"] for e in result["evals"]],
                train_loss=[e["train_loss"] for e in result["evals"]], final_val_loss=result["evals"][-1]["val_loss"],
                tokens_per_s=result["tokens_per_s"])


def tokens_to_reach(tokens: list[int], curve: list[float], target: float) -> float | None:
    """The first token count at which ``curve`` reaches ``target`` (linear between points); None if never."""
    for i, loss in enumerate(curve):
        if loss <= target:
            if i == 0:
                return float(tokens[0])
            t0, t1, l0, l1 = tokens[i - 1], tokens[i], curve[i - 1], curve[i]
            return t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
    return None


def summarise(runs: list[dict], args) -> dict:
    """Best lr per optimizer, the seeds' mean curves and spread, the final gap and tokens to target."""
    out = dict(sweep={}, best_lr={}, best_at_edge={}, curves={})
    for opt in OPTIMIZERS:
        sweep = sorted((r for r in runs if r["optimizer"] == opt and r["seed"] == 0), key=lambda r: r["lr"])
        out["sweep"][opt] = [dict(lr=r["lr"], final_val_loss=r["final_val_loss"]) for r in sweep]
        if not sweep:
            continue
        best = min(sweep, key=lambda r: r["final_val_loss"] if math.isfinite(r["final_val_loss"]) else math.inf)
        out["best_lr"][opt] = best["lr"]
        out["best_at_edge"][opt] = len(sweep) > 1 and best["lr"] in (sweep[0]["lr"], sweep[-1]["lr"])
        seeds = sorted((r for r in runs if r["optimizer"] == opt and r["lr"] == best["lr"]), key=lambda r: r["seed"])
        curves = [r["val_loss"] for r in seeds]
        mean = [statistics.fmean(c) for c in zip(*curves)]
        std = [statistics.stdev(c) if len(c) > 1 else 0.0 for c in zip(*curves)]
        out["curves"][opt] = dict(lr=best["lr"], seeds=[r["seed"] for r in seeds], tokens=seeds[0]["tokens"],
                                  mean=mean, std=std, final=[c[-1] for c in curves])
    if all(opt in out["curves"] for opt in OPTIMIZERS):
        a, h = out["curves"]["adamw"], out["curves"]["hybrid"]
        total = a["tokens"][-1]
        h_tokens = tokens_to_reach(h["tokens"], h["mean"], a["mean"][-1])
        a_tokens = tokens_to_reach(a["tokens"], a["mean"], h["mean"][-1])
        out.update(final_gap=a["mean"][-1] - h["mean"][-1],
                   hybrid_tokens_to_adamw_final=h_tokens,
                   hybrid_fraction_of_adamw_tokens=None if h_tokens is None else h_tokens / total,
                   adamw_tokens_to_hybrid_final=a_tokens, total_tokens=total)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lrs-adamw", default="0.0003,0.001,0.003,0.01,0.03,0.1", help="AdamW's learning rates to sweep")
    p.add_argument("--lrs-hybrid", default="0.0003,0.001,0.003,0.01,0.03,0.1", help="the hybrid's learning rates to sweep")
    p.add_argument("--seeds", type=int, default=3, help="seeds for the best lr of each (seed 0 is the sweep's)")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--eval-batches", type=int, default=8, help="validation windows: this many batches of 32")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per run")
    p.add_argument("--tiny", action="store_true", help="a seconds-long study of a tiny model (CI)")
    p.add_argument("--out", default=None, help="write the results (and provenance) to this JSON file")
    args = p.parse_args(argv)
    if args.tiny:
        args.steps, args.batch, args.context, args.width, args.layers, args.heads = 12, 8, 16, 32, 1, 2
        args.warmup, args.eval_every, args.eval_batches = 2, 4, 1
    try:
        lrs = {"adamw": [float(x) for x in args.lrs_adamw.split(",")],
               "hybrid": [float(x) for x in args.lrs_hybrid.split(",")]}
    except ValueError as e:
        p.error(f"--lrs-adamw / --lrs-hybrid must be comma-separated numbers: {e}")
    if any(lr <= 0 for v in lrs.values() for lr in v) or any(len(set(v)) != len(v) for v in lrs.values()):
        p.error("learning rates must be positive and listed once each")
    for name in ("seeds", "steps", "batch", "jobs", "threads", "eval_every", "eval_batches"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")

    record = dict(provenance(sys.argv if argv is None else [sys.argv[0], *argv]),
                  settings={k: v for k, v in vars(args).items() if k not in ("out", "jobs", "threads", "tiny")},
                  lrs=lrs, runs=[], complete=False)
    out = Path(args.out) if args.out else None

    def save(runs: list[dict]) -> None:
        record.update(runs=sorted(runs, key=lambda r: (r["optimizer"], r["lr"], r["seed"])),
                      summary=summarise(runs, args))
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(record, indent=1) + "\n")

    runs: list[dict] = []

    def stage(jobs: list[tuple[str, float, int]]) -> None:
        with ThreadPoolExecutor(args.jobs) as pool:
            for r in pool.map(lambda j: train(args, *j), jobs):
                runs.append(r)
                print(f"{r['optimizer']:<7} lr {r['lr']:<7g} seed {r['seed']}: final val loss {r['final_val_loss']:.4f}"
                      f"  ({r['seconds']:.0f} s)", flush=True)
                save(runs)

    stage([(opt, lr, 0) for opt in OPTIMIZERS for lr in lrs[opt]])
    best = summarise(runs, args)["best_lr"]
    stage([(opt, best[opt], seed) for opt in OPTIMIZERS for seed in range(1, args.seeds)])
    record["complete"] = True
    save(runs)
    s = record["summary"]
    tokens = s["total_tokens"]
    for opt in OPTIMIZERS:
        c = s["curves"][opt]
        edge = "  (best at the edge of the sweep)" if s["best_at_edge"][opt] else ""
        print(f"{opt:<7} best lr {c['lr']:g}{edge}: final val loss {c['mean'][-1]:.4f} +- {c['std'][-1]:.4f} "
              f"over seeds {c['seeds']}")
    frac = s["hybrid_fraction_of_adamw_tokens"]
    print(f"gap at {tokens:,} tokens: AdamW - hybrid = {s['final_gap']:+.4f} nats; the hybrid reaches AdamW's final "
          f"loss " + (f"after {frac:.0%} of the tokens" if frac is not None else "never in this budget"))
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
