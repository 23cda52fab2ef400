"""Mixed precision against an fp32-master reference, and the GPU's code paths reached where torch allows (issue 41).

* bf16 parameters under DistributedMuon (bucket and owner layouts) and DistributedAdamW, 20 steps whose updates
  are below bf16's resolution at the parameters' values, against a reference that keeps fp32 copies (stepped by
  ``MuonW`` / ``torch.optim.AdamW``, the same fp32 kernels), rounds them to bf16 after each step and compares:
  bf16 parameters and fp32 masters bit for bit. An fp32 master overwritten from the bf16 parameter each step
  loses every update (the parameters would stay where they started).
* The fused AdamW call (``updates.adamw_foreach_``'s GPU path, ``torch._fused_adamw_``), run on the CPU, where
  torch 2.13 has the kernel, against the per-tensor loop the CPU runs: within 4 fp32 ulps of the parameter
  (measured: at most 1.33 ulps, in 0.7% of the elements, after 10 steps; the kernel orders its fp32 operations
  otherwise). Swapped betas or a wrong step count are orders of magnitude outside.
* The same engine checks parametrised over devices: they run on every CUDA device torch sees (the fused kernel
  then runs inside DistributedAdamW), and are skipped where there is none.
"""
from __future__ import annotations

import pytest
import torch

from muongrid import DistributedAdamW, DistributedMuon, Grid, MuonW
from muongrid.updates import adamw_foreach_
from oracle import Oracle

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
ULP = torch.finfo(torch.float32).eps


# ---- the fused AdamW call on the CPU -----------------------------------------------------------------------

def adamw_run(fused, betas=(0.8, 0.95), steps=10, lr=1e-3, swap_in_kernel=False):
    gen = torch.Generator().manual_seed(0)
    ps = [torch.randn(s, generator=gen) for s in [(7,), (5, 6), (33, 17)]]
    ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
    for t in range(1, steps + 1):
        g = torch.Generator().manual_seed(100 + t)
        gs = [torch.randn(p.shape, generator=g) for p in ps]
        adamw_foreach_(ps, gs, ms, vs, [t + k for k in range(len(ps))], lr, betas[::-1] if swap_in_kernel else betas,
                       1e-6, 0.1, fused=fused)
    return ps


def test_the_fused_kernel_runs_off_the_cpu_and_when_asked(monkeypatch):
    """Which path ``adamw_foreach_`` takes: the loop on a CPU, the fused kernel elsewhere (the meta device here:
    torch has a meta kernel for it) or when ``fused=True``; counted by wrapping ``torch._fused_adamw_``."""
    calls = []
    real = torch._fused_adamw_
    monkeypatch.setattr(torch, "_fused_adamw_", lambda *a, **k: (calls.append(a[0][0].device.type), real(*a, **k)))
    for device, fused, want in (("cpu", None, []), ("cpu", False, []), ("cpu", True, ["cpu"]), ("meta", None, ["meta"])):
        calls.clear()
        ps = [torch.zeros(3, 4, device=device), torch.zeros(5, device=device)]
        adamw_foreach_(ps, [torch.ones_like(p) for p in ps], [torch.zeros_like(p) for p in ps],
                       [torch.zeros_like(p) for p in ps], [1, 1], 1e-3, (0.9, 0.99), 1e-8, 0.1, fused=fused)
        assert calls == want, (device, fused, calls)


@pytest.mark.parametrize("betas", [(0.8, 0.95), (0.9, 0.999), (0.5, 0.6)])
def test_fused_adamw_call_equals_the_loop_on_the_cpu(betas):
    loop, fused = adamw_run(False, betas), adamw_run(True, betas)
    for a, b in zip(loop, fused):
        assert ((a - b).abs() <= 4 * ULP * a.abs()).all(), float(((a - b).abs() / (ULP * a.abs())).max())
    for a, b in zip(loop, adamw_run(True, betas, swap_in_kernel=True)):   # the check can fail
        assert ((a - b).abs() > 4 * ULP * a.abs()).any()


# ---- bf16 parameters against fp32 masters rounded each step ------------------------------------------------

def bf16_problem():
    gen = torch.Generator().manual_seed(7)
    # near 1.0 (bf16 spacing 2**-8 below 1, 2**-7 above): updates of about 1e-4 per step are below resolution
    return [1.0 + 0.01 * torch.randn(s, generator=gen) for s in [(12, 20), (16, 8), (9, 10)]]


def bf16_grads(step, shapes, device):
    gen = torch.Generator().manual_seed(500 + step)
    return [(0.5 + torch.rand(s, generator=gen)).to(torch.bfloat16).to(device) for s in shapes]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["muon-bucket", "muon-owner", "adamw"])
def test_bf16_parameters_match_fp32_masters_rounded_each_step(kind, device):
    start = bf16_problem()
    ours = [torch.nn.Parameter(v.to(torch.bfloat16).to(device)) for v in start]
    ref = [torch.nn.Parameter(p.detach().float().clone()) for p in ours]   # the masters start from the bf16 values
    if kind == "adamw":
        hyper = dict(lr=2e-4, weight_decay=0.1, betas=(0.9, 0.95))
        opt = DistributedAdamW(ours, Grid.single(device), **hyper)
        # the same kernel as the engine's: the per-tensor loop on a CPU, the fused kernel on a GPU
        ref_opt = torch.optim.AdamW(ref, **({"fused": True} if device == "cuda" else {"foreach": False}), **hyper)
    else:
        hyper = dict(lr=1e-3, weight_decay=0.1, momentum=0.9)
        opt = DistributedMuon(ours, Grid.single(device), layout=kind.split("-")[1], **hyper)
        ref_opt = MuonW(ref, **hyper)
    moved = 0
    for step in range(1, 21):
        grads = bf16_grads(step, [p.shape for p in ours], device)
        for p, r, g in zip(ours, ref, grads):
            p.grad, r.grad = g, g.float()
        opt.step()
        ref_opt.step()
        for p, r in zip(ours, ref):
            assert torch.equal(p.detach(), r.detach().to(torch.bfloat16)), (kind, step)
            assert torch.equal(opt.state[p]["master"], r.detach().reshape(-1)), (kind, step)
        moved = max(moved, max(int((p.detach() != s.to(torch.bfloat16).to(device)).sum()) for p, s in zip(ours, start)))
    assert moved > 0   # the fp32 masters carried the small updates until the bf16 values moved
    one_step = max(float((r.detach() - s.to(device)).abs().max()) for r, s in zip(ref, start)) / 20
    assert one_step < 2**-9   # each step alone is below half of bf16's spacing at 1.0


# ---- the engine against the oracle, on every device ---------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_distributed_adamw_equals_the_hand_formula_on_each_device(device):
    """DistributedAdamW (the fused kernel on a GPU, the loop on a CPU) against the float64 oracle within its bound."""
    gen = torch.Generator().manual_seed(3)
    start = [torch.randn(s, generator=gen) for s in [(7,), (5, 6), (33, 17)]]
    params = [torch.nn.Parameter(v.to(device)) for v in start]
    hyper = dict(lr=3e-3, weight_decay=0.2, betas=(0.8, 0.95), eps=1e-6)
    opt = DistributedAdamW(params, Grid.single(device), **hyper)
    oracles = [Oracle(v, muon=False) for v in start]
    for step in range(1, 6):
        g = torch.Generator().manual_seed(50 + step)
        grads = [torch.randn(v.shape, generator=g) for v in start]
        for p, gr in zip(params, grads):
            p.grad = gr.to(device)
        opt.step()
        for p, o, gr in zip(params, oracles, grads):
            want = o.step(gr, hyper)
            assert ((p.detach().cpu().double() - want).abs() <= o.bound).all(), (device, step)


@pytest.mark.parametrize("device", DEVICES)
def test_distributed_muon_one_step_is_close_to_the_oracle_on_each_device(device):
    """One DistributedMuon step on ``device`` against the oracle with its own float64 NS5: each matrix's update
    within 4e-2 relative (bf16 Newton-Schulz, tests/test_oracle.py)."""
    gen = torch.Generator().manual_seed(4)
    start = [torch.randn(s, generator=gen) for s in [(12, 20), (33, 17)]]
    params = [torch.nn.Parameter(v.to(device)) for v in start]
    hyper = dict(lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=True, ns_steps=5, eps=1e-7,
                 adjust_lr="match_rms_adamw")
    opt = DistributedMuon(params, Grid.single(device), layout="owner", **hyper)
    grads = [torch.randn(v.shape, generator=gen) for v in start]
    for p, g in zip(params, grads):
        p.grad = g.to(device)
    opt.step()
    for p, v, g in zip(params, start, grads):
        want = Oracle(v, muon=True).step(g, hyper)
        assert float((p.detach().cpu().double() - want).norm() / (want - v.double()).norm()) <= 4e-2


# ---- what bf16 parameters send: the ledger against the closed form -----------------------------------------

@pytest.mark.parametrize("dp,tp,muon", [(3, 1, True), (2, 2, True), (2, 2, False)])
def test_bf16_parameters_send_fp32_gradients_and_bf16_parameters(dp, tp, muon):
    """With bf16 parameters the gradient buffer has the fp32 master's dtype, so the reduce-scatter sends 4
    bytes an element and the parameter all-gather 2: one step's ledger on every rank (simulated on the meta
    device over the fake process group) equals ``costmodel.step_bytes(..., param_bytes=2)`` phase by phase,
    and on a DP-only grid Muon / AdamW is (4 + 2 + 2) / (4 + 2) (chapter 6 prints it)."""
    from muongrid.lab.costmodel import PHASES, bytes_ratio, step_bytes
    from muongrid.lab.devicecheck import simulate
    from muongrid.lab.synthetic import build_problem

    problem = build_problem("muon" if muon else "adamw", tp=tp)
    ledgers = {}

    def worker(grid, comm, _):
        groups = [dict(g, params=[torch.nn.Parameter(p.detach().to(grid.device, torch.bfloat16))
                                  for p in g["params"]]) for g in problem.param_groups(grid.tp, grid.tp_rank)]
        make = DistributedMuon if muon else DistributedAdamW
        opt = make(groups, grid, comm=comm, layout="bucket", bucket_numel=20_000)
        for g in groups:
            for p in g["params"]:
                p.grad = torch.zeros_like(p)
        opt.step()
        ledgers[grid.rank] = comm.ledger.summary()["phases"]

    simulate(worker, dp, tp, None)
    for rank, phases in ledgers.items():
        expected = step_bytes(problem.groups, dp, tp, 20_000, muon=muon, rank=rank, param_bytes=2)
        assert {k: phases.get(k, {}).get("bytes_sent", 0) for k in PHASES} == {k: expected[k] for k in PHASES}
        assert phases["grad_reduce_scatter"]["dtype"] == "float32"
        assert phases["param_all_gather"]["dtype"] == "bfloat16"
    if tp == 1 and muon:
        assert bytes_ratio(problem.groups, dp, 1, 20_000, param_bytes=2) == pytest.approx((4 + 2 + 2) / (4 + 2))
