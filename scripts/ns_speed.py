"""How fast Newton-Schulz runs compared with a plain matmul of the same size and dtype, on this machine.

    python scripts/ns_speed.py                 # 1024 x 1024, the CPU's threads
    python scripts/ns_speed.py --size 2048 --repeats 5
    python scripts/ns_speed.py --device cuda   # on a GPU

NS5 is nothing but matmuls (``muongrid/newton_schulz.py``), so its FLOP rate should be close to the
matmul rate of the dtype it computes in: bf16 where the hardware has a fast bf16 GEMM (GPUs,
AVX-512 BF16 / AMX CPUs), else fp32 on bf16 values (the emulation). The script times NS5 and the
matching matmul alternately and ends with one JSON line holding both rates, their ratio and which
path ran: ``ratio`` from the medians (what ``calibrate_time_model.py`` records), ``best_ratio`` from
each one's fastest run, and ``pair_ratios``, the ratio of each back-to-back pair.

On a shared machine other work only ever adds time, so the fastest runs are the steadiest measure of
what the kernels can do; the median and the pairs show how far the load moved them. On an idle
2-core VM the median ratio at 1024 x 1024 ranged from 59% to 86% over four runs in a row, and one run
under a stress loop gave 48%: read the spread before any one figure.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from muongrid.lab.profiling import timed
from muongrid.newton_schulz import native_bf16_matmul, ns5_flops, zeropower_ns5


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=1024, help="rows = columns of the matrix (default 1024)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs of each (default 7)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    if args.size < 8 or args.repeats < 1:
        p.error("--size must be at least 8 and --repeats at least 1")
    dev = torch.device(args.device)
    native = native_bf16_matmul(dev)
    dtype = torch.bfloat16 if native else torch.float32  # what NS5's matmuls really run in
    n = args.size
    g = torch.randn(n, n, device=dev)
    a, b = torch.randn(n, n, device=dev, dtype=dtype), torch.randn(n, n, device=dev, dtype=dtype)
    ns, mm = [], []
    for i in range(args.repeats + 1):  # the first of each is a warm-up
        t_ns = timed(lambda: zeropower_ns5(g), dev)
        t_mm = timed(lambda: a @ b, dev)
        if i:
            ns.append(t_ns)
            mm.append(t_mm)
    flops_ns, flops_mm = ns5_flops(n, n), 2 * n**3
    ns_rate = flops_ns / statistics.median(ns) / 1e9
    mm_rate = flops_mm / statistics.median(mm) / 1e9
    best_ns, best_mm = flops_ns / min(ns) / 1e9, flops_mm / min(mm) / 1e9
    pairs = [(flops_ns / t_ns) / (flops_mm / t_mm) for t_ns, t_mm in zip(ns, mm)]
    path = "native bf16 matmul" if native else "bf16 emulated with fp32 matmuls (no fast bf16 GEMM here)"
    print(f"{n} x {n} on {dev} ({torch.get_num_threads()} threads), {path}; {args.repeats} runs of each")
    print(f"matmul ({str(dtype).replace('torch.', '')}): {best_mm:8.1f} GFLOP/s fastest, {mm_rate:8.1f} median")
    print(f"NS5:               {best_ns:8.1f} GFLOP/s fastest, {ns_rate:8.1f} median")
    print(f"NS5 / matmul: {best_ns / best_mm:.0%} fastest against fastest, {ns_rate / mm_rate:.0%} median against "
          f"median, {min(pairs):.0%}-{max(pairs):.0%} over the back-to-back pairs")
    print(json.dumps(dict(size=n, device=str(dev), threads=torch.get_num_threads(), native_bf16=native,
                          matmul_dtype=str(dtype).replace("torch.", ""), matmul_gflops=mm_rate, ns5_gflops=ns_rate,
                          ratio=ns_rate / mm_rate, best_ratio=best_ns / best_mm, pair_ratios=pairs,
                          best_matmul_gflops=best_mm, best_ns5_gflops=best_ns,
                          ns5_seconds=statistics.median(ns), matmul_seconds=statistics.median(mm))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
