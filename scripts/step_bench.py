"""One optimizer step on real model shapes: ours against torch.optim.Muon + fused AdamW and the floor.

    python scripts/step_bench.py                                   # the meta-device counts (any machine, ~30 s)
    python scripts/step_bench.py --time --models gpt2-124m         # + timed steps on this CPU (slow: NS on a CPU)
    python scripts/step_bench.py --device cuda --time --out _build/step_bench_gpu.json   # on a GPU (make record-gpu)

Two parts, side by side in one run:

* **What a GPU step costs, counted on the meta device** (``muongrid/lab/stepcost.py``; no GPU, real shapes,
  seconds): bytes written + read, aten ops, copy bytes and host syncs of one ``step()`` of
  ``DistributedMuon(layout="owner", ns_batch=True)`` on one rank, against torch.optim.Muon on the matrices plus
  fused AdamW on the rest; and each rank's copy bytes on a 2-rank grid (the fake process group), against its
  fp32 parameter bytes, with gradients made fresh each step (``zero_grad()``) and zeroed in place
  (``zero_grad(set_to_none=False)``, so backward writes into the optimizer's buffers). Our one-rank step comes
  after a real backward, so the gradient hooks run, and its bytes include theirs (none on one DP rank: the step
  reads the gradients where autograd left them).
* **Gradients into the optimizer's buffers** (``stepcost.measure_landing``): on 2x1, 1x2 (TP, Megatron's split of
  each layer) and 2x2 grids, a real backward then ``step()``; per rank, the bytes copied into the optimizer's
  gradient buffers (by the hook during backward and by the step) over the rank's gradient bytes, with the loop
  zeroing by ``zero_grad()`` (``set_to_none=True``) and by ``zero_grad(set_to_none=False)``, and the bytes the
  hooks and the step move.
* **What stays between steps** (``stepcost.persistent_bytes``): on 2x1 and 2x2 grids, rank 0's gradient buffers,
  reduce-scattered gradient shards, the bucket flow's gather slots, the owner flow's exchange buffers and banks
  (made when the optimizer is built) and the optimizer state, per byte of its fp32 parameters, for the owner and bucket
  layouts.
* **Time** (``--time``): one step of each, median and fastest of ``--steps`` after ``--warmup``: host time (until
  ``step()`` returned) and, on a GPU, device time (CUDA events) apart, and the peak memory
  (``muongrid.lab.gpurecord.time_step``); host syncs counted by ``torch.cuda.set_sync_debug_mode`` on a GPU; the GPU's
  model, driver, CUDA and NCCL versions (``provenance.device_provenance``, None off a GPU); and the
  floor: the Newton-Schulz FLOPs at this device's measured bf16 matmul rate plus one fused AdamW pass over every
  parameter, measured. On a CPU the script says whether bf16 matmuls are native or emulated
  (``newton_schulz.native_bf16_matmul``): emulated, Newton-Schulz dominates everything.

Models (``lab/stepmodels.BENCH``, shapes from ``lab/model_shapes``): GPT-2 124M, Llama-3.2-1B, four layers of
Llama-3-8B. Ends with one JSON line (and ``--out`` FILE) with the provenance of the run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import torch

from muongrid.lab.gpurecord import time_step
from muongrid.lab.provenance import device_provenance, provenance
from muongrid.lab.stepcost import GiB, measure, measure_grid, measure_landing, param_bytes, persistent_bytes
from muongrid.lab.stepmodels import BENCH, is_muon, named_params, ours_hybrid, torch_hybrid
from muongrid.newton_schulz import native_bf16_matmul, ns5_flops


def proxies(model: str, layers: int | None = None) -> dict:
    """The meta-device counts of one step, ours and torch's, and the 2-rank copy bytes."""
    named = named_params(model, "meta", layers)
    theirs = measure(torch_hybrid(named)).summary()
    one = measure_landing(model, 1, 1, layers=layers)[0]   # after a real backward: the hooks' bytes with the step's
    mine = dict(one["step"].summary(), hook_gib=one["hook"].summary()["bytes_gib"])
    mine["bytes_gib"] += mine["hook_gib"]
    pb = param_bytes(model, layers)
    grid = {}
    for label, fresh in (("fresh_grads", True), ("grads_in_place", False)):
        costs = measure_grid(model, 2, fresh_grads=fresh, layers=layers)
        grid[label] = [c.summary()["copy_written_gib"] * GiB / pb for _, c in sorted(costs.items())]
    return dict(torch=theirs, ours=mine, bytes_ratio=mine["bytes_gib"] / theirs["bytes_gib"],
                ops_ratio=mine["ops"] / theirs["ops"], dp2_copy_over_param_bytes=grid)


GRIDS = ((2, 1), (1, 2), (2, 2))   # the gradient-landing rows


def landing(model: str, layers: int | None = None) -> list[dict]:
    """Per grid and ``zero_grad`` mode, the worst rank's gradient bytes copied over its gradient bytes."""
    rows = []
    for dp, tp in GRIDS:
        for set_to_none in (True, False):
            ranks = measure_landing(model, dp, tp, set_to_none=set_to_none, layers=layers).values()
            rows.append(dict(dp=dp, tp=tp, set_to_none=set_to_none,
                             grad_copied_over_grad_bytes=max(r["grad_copied"] / r["grad_bytes"] for r in ranks),
                             hook_gib=max(r["hook"].summary()["bytes_gib"] for r in ranks),
                             step_gib=max(r["step"].summary()["bytes_gib"] for r in ranks),
                             syncs=max(r["step"].summary()["syncs"] for r in ranks)))
    return rows


def timed(step, device, warmup: int, steps: int) -> list[float]:
    for _ in range(warmup):
        step()
    out = []
    for _ in range(steps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            step()
            out.append(time.perf_counter() - t0)
    return out


def host_syncs(step, device) -> int | None:
    """Host syncs in one step, as CUDA's sync debug mode reports them (None off a GPU)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode(1)
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def matmul_rate(device, n: int) -> float:
    """This device's bf16 matmul rate in FLOP/s (the fastest of a few runs of an n x n x n product)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    return 2 * n**3 / min(timed(lambda: a @ b, device, 2, 5))


def time_model(model: str, device, warmup: int, steps: int, rate: float, layers: int | None = None) -> dict:
    named = named_params(model, device, layers)
    flops = sum(ns5_flops(*p.shape) for n, p in named if is_muon(n, p))
    params = [p for _, p in named]
    state = [[torch.zeros_like(p) for p in params] for _ in range(2)]
    counts = [torch.ones((), device=device) for _ in params]
    fused = timed(lambda: torch._fused_adamw_(params, [p.grad for p in params], state[0], state[1], [], counts,
                                              lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.1, eps=1e-8,
                                              amsgrad=False, maximize=False), device, warmup, steps)
    runs = {}
    for label, make in (("torch", lambda: torch_hybrid(named)), ("ours", lambda: ours_hybrid(named, device).step)):
        step = make()
        runs[label] = dict(time_step(step, device, warmup, steps), host_syncs=host_syncs(step, device))
        del step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    floor = flops / rate + min(fused)
    return dict(ns_tflop=flops / 1e12, adamw_pass_ms=1e3 * min(fused), floor_ms=1e3 * floor, runs=runs,
                ours_over_torch=runs["ours"]["median_ms"] / runs["torch"]["median_ms"],
                ours_over_floor=runs["ours"]["median_ms"] / (1e3 * floor))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="gpt2-124m,llama-1b,llama-8b-4layers",
                   help=f"comma-separated, from {', '.join(BENCH)}")
    p.add_argument("--device", default="cpu", help="where --time runs (cpu or cuda)")
    p.add_argument("--time", action="store_true", help="also time the steps on --device")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--out", help="also write the JSON record here")
    p.add_argument("--layers", type=int, help="each model with this many layers (a quick check)")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in BENCH]
    if unknown:
        p.error(f"unknown model(s) {unknown}; choose from {sorted(BENCH)}")
    if args.warmup < 0 or args.steps < 1:
        p.error("--warmup must be >= 0 and --steps >= 1")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch sees no GPU here")
    given = sys.argv[1:] if argv is None else argv   # the command with its flags, as it was run
    record = dict(provenance(["scripts/step_bench.py", *given]), models={})
    print("one optimizer step, counted on the meta device (what a GPU would move; ours = DistributedMuon owner + "
          "ns_batch, one rank; torch = torch.optim.Muon + fused AdamW)")
    print(f"{'model':<18}{'GiB ours':>10}{'torch':>8}{'ratio':>7}{'ops ours':>10}{'torch':>7}{'copy GiB':>10}"
          f"{'syncs':>7}{'dp=2 copies / param bytes (fresh; in place)':>46}")
    for model in models:
        px = proxies(model, args.layers)
        record["models"][model] = dict(proxies=px)
        o, t, g = px["ours"], px["torch"], px["dp2_copy_over_param_bytes"]
        print(f"{model:<18}{o['bytes_gib']:>10.1f}{t['bytes_gib']:>8.1f}{px['bytes_ratio']:>7.2f}{o['ops']:>10}"
              f"{t['ops']:>7}{o['copy_written_gib']:>10.2f}{o['syncs']:>7}"
              f"{'  '.join(f'{x:.2f}' for x in g['fresh_grads']):>30};  {'  '.join(f'{x:.2f}' for x in g['grads_in_place'])}")
    print("\ngradients into the optimizer's buffers: a real backward, then step(); per rank (the worst), bytes "
          "copied into the gradient buffers over the gradient bytes")
    print(f"{'model':<18}{'dp x tp':>8}{'zero_grad':>22}{'copied/grad':>13}{'hook GiB':>10}{'step GiB':>10}"
          f"{'syncs':>7}")
    for model in models:
        rows = landing(model, args.layers)
        record["models"][model]["landing"] = rows
        for r in rows:
            mode = "set_to_none=True" if r["set_to_none"] else "set_to_none=False"
            print(f"{model:<18}{r['dp']:>4} x {r['tp']}{mode:>22}{r['grad_copied_over_grad_bytes']:>13.2f}"
                  f"{r['hook_gib']:>10.2f}{r['step_gib']:>10.2f}{r['syncs']:>7}")
    print("\nwhat stays between steps, per byte of the rank's fp32 parameters (rank 0)")
    kinds = ("gradient_buffers", "gradient_shards", "gather_slots", "exchange_buffers", "optimizer_state")
    print(f"{'model':<18}{'dp x tp':>8}{'layout':>8}" + "".join(f"{k.replace('_', ' '):>18}" for k in kinds))
    for model in models:
        record["models"][model]["persistent"] = rows = []
        for (dp, tp), layout in ((g, x) for g in GRIDS if g[0] > 1 for x in ("owner", "bucket")):
            rows.append(dict(dp=dp, tp=tp, layout=layout, **persistent_bytes(model, dp, tp, layout, args.layers)))
            print(f"{model:<18}{dp:>4} x {tp}{layout:>8}" + "".join(f"{rows[-1][k]:>18.3f}" for k in kinds))
    if args.time:
        rate = matmul_rate(device, 8192 if device.type == "cuda" else 1024)
        path = "native" if native_bf16_matmul(device) else "emulated (fp32 on bf16 values)"
        hw = device_provenance(device)
        record.update(device=str(device), bf16_matmul_tflops=rate / 1e12, bf16_path=path, hardware=hw)
        print(f"\ntimed on {device}: " + (hw["absent"] or f"{hw['gpu']}, driver {hw['driver']}, CUDA {hw['cuda']}, "
                                            f"NCCL {hw['nccl']}"))
        print(f"bf16 matmul {rate / 1e12:.2f} TFLOP/s, {path}; median (fastest) {'device' if hw['gpu'] else 'host'} "
              f"ms of {args.steps} after {args.warmup} warm-up; peak memory GiB")
        print(f"{'model':<18}{'torch ms':>16}{'ours ms':>16}{'floor ms':>10}{'ours/torch':>12}{'ours/floor':>12}"
              f"{'syncs':>8}{'host ms ours':>14}{'peak ours':>11}")
        for model in models:
            r = time_model(model, device, args.warmup, args.steps, rate, args.layers)
            record["models"][model]["time"] = r
            t, o = r["runs"]["torch"], r["runs"]["ours"]
            peak = "absent" if o["peak_memory_gib"] is None else f"{o['peak_memory_gib']:.2f}"
            print(f"{model:<18}{t['median_ms']:>9.1f} ({t['fastest_ms']:.1f}){o['median_ms']:>9.1f} "
                  f"({o['fastest_ms']:.1f}){r['floor_ms']:>10.1f}{r['ours_over_torch']:>12.2f}"
                  f"{r['ours_over_floor']:>12.2f}{str(o['host_syncs']):>8}{o['host_median_ms']:>14.1f}{peak:>11}")
    text = json.dumps(record)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
