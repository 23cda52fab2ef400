"""Newton-Schulz variants side by side: error against the exact polar factor, matmuls, time on this machine.

For each shape and dtype (fp32, bf16) and each variant (coefficient schedule x form, see
``muongrid/ns_variants.py``), on a Gaussian matrix (a momentum-like spectrum) and a skewed one (singular
values spread over three decades):

* ``err``: ||NS(G) - U V^T||_F / ||U V^T||_F, with ``U V^T`` the exact polar factor from
  ``torch.linalg.svd`` in float64;
* ``sv min/max``: the range of NS(G)'s singular values (1 for the exact factor);
* ``matmuls`` and ``GFLOP`` of one run (``ns_matmuls``, ``ns_flops``; a test checks them against
  torch's FLOP counter);
* ``ms min/med/max`` over ``--repeats`` rounds, after one warm-up run; each round times every variant in
  turn, and the standard/Gram time ratio is the median of the per-round ratios (side by side, so both
  forms meet the same load).

The bf16 path is printed: native bf16 GEMMs where the CPU has them (AVX-512 BF16/AMX), otherwise
bf16 emulated with fp32 GEMMs on bf16 values (``muongrid.newton_schulz``). Machines are shared and
noisy: read the spread, not one number. Run:

    python scripts/compare_ns_variants.py [--shapes 512x512,512x2048,2048x512] [--repeats 5] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from muongrid.newton_schulz import native_bf16_matmul, zeropower_ns5
from muongrid.ns_variants import ns_flops, ns_matmuls

VARIANTS = [("muon", "standard"), ("muon", "gram"), ("polar_express", "standard"), ("polar_express", "gram"),
            ("cubic", "standard")]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def polar_factor(G: torch.Tensor) -> torch.Tensor:
    U, _, Vh = torch.linalg.svd(G.double(), full_matrices=False)
    return U @ Vh


def inputs(shape, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    gauss = torch.randn(shape, generator=g)
    k = min(shape)
    U, _, Vh = torch.linalg.svd(torch.randn(shape, generator=g, dtype=torch.float64), full_matrices=False)
    skewed = (U * torch.logspace(0, -3, k, dtype=torch.float64)) @ Vh
    return {"gaussian": gauss, "skewed": skewed.float()}


def measure(G, exact, dtype, repeats) -> list[dict]:
    """Every variant on ``G``: accuracy once, then ``repeats`` rounds that time each variant in turn, so
    that every variant meets the same machine load (the per-round gram/standard ratios compare them)."""
    rows = []
    for coefficients, form in VARIANTS:
        out = zeropower_ns5(G, 5, coefficients, dtype=dtype, form=form)   # also the warm-up
        sv = torch.linalg.svdvals(out.double())
        rows.append(dict(coefficients=coefficients, form=form, err=float((out.double() - exact).norm() / exact.norm()),
                         sv_min=float(sv.min()), sv_max=float(sv.max()), matmuls=ns_matmuls(5, form),
                         gflop=ns_flops(*G.shape, 5, form) / 1e9, ms=[]))
    for _ in range(repeats):
        for row in rows:
            t0 = time.perf_counter()
            zeropower_ns5(G, 5, row["coefficients"], dtype=dtype, form=row["form"])
            row["ms"].append((time.perf_counter() - t0) * 1e3)
    for row in rows:
        row.update(ms_min=min(row["ms"]), ms_median=statistics.median(row["ms"]), ms_max=max(row["ms"]))
    return rows


def gram_speedups(rows: list[dict]) -> dict:
    """Per schedule, the median over rounds of standard time / Gram time (> 1: the Gram form is faster)."""
    by = {(r["coefficients"], r["form"]): r["ms"] for r in rows}
    return {c: statistics.median(s / g for s, g in zip(by[(c, "standard")], by[(c, "gram")]))
            for c, f in VARIANTS if f == "gram"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="512x512,512x2048,2048x512")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true", help="also print one JSON line with every row")
    args = p.parse_args(argv)
    try:
        shapes = [tuple(int(x) for x in s.lower().split("x")) for s in args.shapes.split(",")]
        assert all(len(s) == 2 and min(s) > 0 for s in shapes)
    except (ValueError, AssertionError):
        p.error(f"--shapes takes ROWSxCOLS,... with positive sizes, e.g. 512x2048; got {args.shapes!r}")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    native = native_bf16_matmul(torch.device("cpu"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; bf16 path: "
          f"{'native bf16 GEMM' if native else 'emulated (fp32 GEMM on bf16 values, rounded to bf16)'}")
    rows = []
    for shape in shapes:
        for kind, G in inputs(shape).items():
            exact = polar_factor(G)
            print(f"\n{shape[0]}x{shape[1]} {kind}")
            print(f"{'dtype':<5} {'coefficients':<14} {'form':<9} {'err':>8} {'sv min':>7} {'sv max':>7} "
                  f"{'matmuls':>7} {'GFLOP':>6} {'ms min/med/max':>22}")
            for dname, dtype in DTYPES.items():
                measured = measure(G, exact, dtype, args.repeats)
                for m in measured:
                    rows.append(dict(shape=list(shape), input=kind, dtype=dname, **m))
                    print(f"{dname:<5} {m['coefficients']:<14} {m['form']:<9} {m['err']:>8.4f} {m['sv_min']:>7.3f} "
                          f"{m['sv_max']:>7.3f} {m['matmuls']:>7} {m['gflop']:>6.2f} "
                          f"{m['ms_min']:>7.1f}/{m['ms_median']:>6.1f}/{m['ms_max']:>6.1f}")
                speed = gram_speedups(measured)
                rows[-1]["gram_speedup"] = speed
                print(f"{dname:<5} standard/gram time, median of {args.repeats} interleaved rounds: "
                      + ", ".join(f"{c} {v:.2f}x" for c, v in speed.items()))
    if args.json:
        print(json.dumps(dict(bf16_native=native, threads=torch.get_num_threads(), rows=rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
