"""The whole training iteration: DDP + torch's Muon, DDP + ZeroRedundancyOptimizer, and ours, side by side (issue 54).

    python scripts/iteration_bench.py --dp 2                                  # Llama hidden 256 and 512, 4 layers
    python scripts/iteration_bench.py --dp 3 --models llama:256x4,gpt2:256x4
    python scripts/iteration_bench.py --dp 2 --models llama:64x2 --runs 3 --iters 3   # seconds
    torchrun --standalone --nproc-per-node 2 scripts/iteration_bench.py --dp 2   # NCCL, one GPU per rank

Every option (``muongrid/lab/iteration.py`` says what each is: DDP + torch.optim.Muon + AdamW, DDP +
ZeroRedundancyOptimizer of both, the DDP mode where this version has it, and DistributedMuon in each layout without
DDP) is built from one seed and trained on the same batches, interleaved in one job: ``--runs`` runs of
``--iters`` iterations, after ``--warmup`` and one counted iteration (``lab/iteration_run.py``). It prints, per
model:

* the whole iteration (its slowest rank), median of the runs' medians with their min-max, and its ratio to ZeRO's
  run by run; then the parts: forward, backward, backward without DDP's reduction (under ``no_sync()``), the
  gradient reduction and how much of it is exposed after backward, the exchange, Newton-Schulz, our ballot (with
  its wait for the slowest rank's backward), the rest of the step (momentum, the update, copies: "update") and the
  parameter gather (``lab/iteration_report.py``);
* per rank and iteration: bytes sent and collectives (every one torch dispatched, DDP's and ZeRO's included,
  counted at the dispatcher: ``lab/c10d_count.py``), Newton-Schulz calls and FLOPs, beside the closed form
  (``lab/costmodel.py``) at the measured dp, and the closed form at dp 8, 64 and 1,024.

It ends with one JSON line and exits 1 if a count check fails: bytes equal to the closed form, every gradient
reduced once, each matrix orthogonalised once (ours), ZeRO's owners as ``costmodel.zero_partition`` gives them, and
the losses of every option within ``iteration_report.LOSS_TOLERANCE`` (1e-4) of ZeRO's at the first
``AGREE_ITERATIONS`` (3: the warm-up and the counted one); the largest gap over every iteration is printed. Not
0, and not every iteration: with more than 2 ranks DDP's average (each gradient divided, then summed) and ours
(summed, then divided) differ in the last bit, and so do two of our layouts whose buckets put an element at another
place in gloo's chunked sum; Newton-Schulz's bf16 roundings then grow such differences step by step (Llama hidden
256, 3 ranks: 1.6e-3 after 33 iterations, measured). With 2 ranks a sum is exact in either order: there our
exact layouts (bucket, owner, aligned) must also end with the same parameters, bit for bit. Times are reported,
never checked.

Newton-Schulz kernel: on a CPU without native bf16 matmuls (AVX2), torch.optim.Muon's bf16 matmuls take a scalar
path 100x slower than ours, which rounds to bf16 around fp32 matmuls; ``--torch-ns auto`` (the default) then runs
our kernel inside torch.optim.Muon, so every option runs the same Newton-Schulz and the comparison is about
distribution. ``--torch-ns torch`` keeps torch's own. Under torchrun with CUDA it uses NCCL, one GPU per rank; it
has not been run on GPUs yet.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from muongrid.launch import add_launch_args, check_launch_args, launch
from muongrid.lab.iteration import VARIANTS, install_torch_ns
from muongrid.lab.iteration_report import SCALE_DPS, ratio, summarize
from muongrid.lab.iteration_run import measure_model, parse_model
from muongrid.lab.provenance import provenance
from muongrid.lab.verdicts import spread_text

PART_COLUMNS = (("forward", "fwd"), ("backward", "bwd"), ("backward_no_reduction", "bwd-red"),
                ("reduction", "reduce"), ("exposed", "exposed"), ("exchange", "exch"), ("newton_schulz", "NS"),
                ("ballot", "ballot"), ("update", "update"), ("param_gather", "gather"))


def label(spec: dict, dp: int) -> str:
    names = dict(llama="Llama", gpt2="GPT-2 (tied)")
    return f"{names[spec['kind']]} hidden {spec['hidden']}, {spec['layers']} layers, dp={dp}"


def print_model(s: dict, args) -> None:
    print(f"\n{label(s['model'], s['dp'])}: {args.runs} runs x {args.iters} iterations; ms, slowest rank")
    print(f"{'option':<9}{'whole (runs min-max)':>22}{'/ ZeRO':>18}" + "".join(f"{h:>9}" for _, h in PART_COLUMNS))
    for n, row in s["options"].items():
        print(f"{n:<9}{spread_text(row['whole_runs']):>22}{ratio(row):>18}"
              + "".join(f"{row['parts'][k] * 1e3:>9.1f}" for k, _ in PART_COLUMNS))
    print(f"\nper rank and iteration (counted): bytes sent, the closed form, collectives by stage, NS GFLOP")
    print(f"{'option':<9}{'bytes (max rank)':>18}{'closed form':>14}{'collectives':>13}{'fwd/bwd/step':>14}"
          f"{'NS GFLOP per rank':>24}{'loss gap':>10}{'param gap':>11}")
    for n, row in s["options"].items():
        st = row["by_stage"]
        stages = "/".join(str(st.get(k, {}).get("calls", 0)) for k in ("forward", "backward", "step"))
        ns = ", ".join(f"{f / 1e9:.2f}" for f in row["ns_flops_per_rank"])
        print(f"{n:<9}{max(row['bytes_per_rank']):>18,}{max(row['closed_form_per_rank']):>14,}"
              f"{max(row['calls_per_rank']):>13}{stages:>14}{ns:>24}{row['loss_gap']:>10.1e}"
              f"{row['final_param_gap']:>11.1e}")
    print("\nthe closed form at scale: bytes per rank per iteration (mean over ranks), busiest rank's NS GFLOP")
    print(f"{'option':<9}" + "".join(f"{'dp=' + str(d):>16}" for d in args.scale)
          + "".join(f"{'NS dp=' + str(d):>12}" for d in args.scale))
    for n, row in s["options"].items():
        print(f"{n:<9}" + "".join(f"{row['closed_form_at'][str(d)]:>16,.0f}" for d in args.scale)
              + "".join(f"{row['busiest_ns_at'][str(d)] / 1e9:>12.2f}" for d in args.scale))


def worker(grid, comm, args):
    if grid.tp != 1:
        raise SystemExit("iteration_bench.py compares data-parallel options: give --tp 1")
    kernel = install_torch_ns(args.torch_ns, grid.device)
    load = os.getloadavg()[0]
    results = []
    for text in args.models.split(","):
        spec = parse_model(text)
        everyone = measure_model(grid, comm, args, spec)
        if grid.rank == 0:
            results.append(summarize(everyone, grid.dp, spec, args.scale))
            print_model(results[-1], args)
    if grid.rank != 0:
        return 0
    failed = [name for s in results for name, ok in s["checks"].items() if not ok]
    after = os.getloadavg()[0]
    print(f"\nNewton-Schulz inside torch.optim.Muon: {kernel}'s kernel. Load average {load:.2f} before, {after:.2f} "
          f"after ({'idle' if max(load, after) < 0.5 else 'measured while the machine was shared'}).")
    print(f"checks: {sum(len(s['checks']) for s in results) - len(failed)} passed"
          + (f"; FAILED: {failed}" if failed else ""))
    record = dict(provenance(["scripts/iteration_bench.py", *args.argv]), ok=not failed, failed=failed,
                  torch_ns=kernel, load_before=load, load_after=after, runs=args.runs, iters=args.iters,
                  batch=args.batch, seq=args.seq, vocab=args.vocab, results=results)
    text = json.dumps(record)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text, flush=True)
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    p.set_defaults(dp=2)
    p.add_argument("--models", default="llama:256x4,llama:512x4", help="KIND:HIDDENxLAYERS, comma-separated "
                   "(KIND llama or gpt2; 4 heads)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"from {', '.join(VARIANTS)}")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--iters", type=int, default=10, help="timed iterations per run")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--probes", type=int, default=3, help="no_sync backwards and lone all-reduces per run (DDP)")
    p.add_argument("--batch", type=int, default=8, help="global batch (rows), split over the DP ranks")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=1000, help="not a multiple of the hidden sizes, so no matrix looks vocabulary-sized")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-ns", choices=("auto", "torch", "ours"), default="auto",
                   help="the Newton-Schulz kernel inside torch.optim.Muon (see above)")
    p.add_argument("--scale", default=",".join(map(str, SCALE_DPS)),
                   help="the dp at which the closed forms are priced (the group layout's mean over 1,024 ranks takes "
                        "about a minute per model)")
    p.add_argument("--out", help="also write the JSON record here")
    args = p.parse_args(argv)
    check_launch_args(p, args)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = set(args.variants) - set(VARIANTS)
    if unknown or not args.variants:
        p.error(f"--variants: unknown {sorted(unknown)}; choose from {VARIANTS}")
    try:
        [parse_model(m) for m in args.models.split(",")]
    except ValueError as e:
        p.error(str(e))
    try:
        args.scale = tuple(int(d) for d in args.scale.split(","))
    except ValueError:
        p.error(f"--scale: whole numbers, comma-separated, got {args.scale!r}")
    if args.runs < 1 or args.iters < 1 or args.warmup < 2 or args.probes < 1 or args.batch < args.dp:
        p.error("--runs, --iters and --probes must be >= 1, --warmup >= 2 (DDP rebuilds its buckets in its second "
                "iteration: the counted one comes after), --batch >= --dp")
    return launch(worker, args)


if __name__ == "__main__":
    sys.exit(main())
