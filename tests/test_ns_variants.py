"""Newton-Schulz variants (coefficient schedules, the Gram form, same-shape batches): fast, one process."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from muongrid import newton_schulz
from muongrid.newton_schulz import NS_COEFFICIENTS, singular_value_map, zeropower_ns5
from muongrid.ns_variants import (CUBIC, POLAR_EXPRESS, composed_map, ns_flops, ns_matmuls, ns_schedule)
from muongrid.optim import Muon


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_default_schedule_is_the_papers_triple_and_bit_identical():
    """The named default, the triple and a 5-long schedule of it are the same run, bit for bit."""
    G = torch.randn(48, 80, generator=_gen(0))
    base = zeropower_ns5(G)
    assert ns_schedule("muon", 5) == (tuple(NS_COEFFICIENTS),) * 5
    for coefficients in ("muon", [NS_COEFFICIENTS] * 5, list(NS_COEFFICIENTS)):
        assert torch.equal(zeropower_ns5(G, 5, coefficients), base)


def test_polar_express_equioscillates_and_beats_the_quintic():
    """What the paper says of its schedule (arXiv:2505.16932): each step is the minimax odd quintic on the
    interval the last one left, so the error after each step is symmetric about 1 and shrinks; from
    [1e-3, 1] five steps end within 1 +- 0.142, where Muon's quintic leaves [0.47, 1.20] (float64)."""
    x = torch.logspace(-3, 0, 200_001, dtype=torch.float64)
    lows, highs = [], []
    for y in composed_map(x, POLAR_EXPRESS):
        lows.append(1 - float(y.min()))
        highs.append(float(y.max()) - 1)
    # symmetric about 1 to within the 2% safety factor folded into the coefficients
    assert all(abs(lo - hi) < 0.02 * max(lo, hi) + 1e-3 for lo, hi in zip(lows, highs)), (lows, highs)
    assert all(a > b for a, b in zip(highs, highs[1:])) and highs[-1] < 0.142
    muon = composed_map(x, [NS_COEFFICIENTS] * 5)[-1]
    assert float(muon.min()) < 0.48 and float(muon.max()) > 1.2
    # the matrix iteration does on singular values what the map does on numbers (float64)
    G = torch.randn(30, 50, dtype=torch.float64, generator=_gen(1))
    U, S, Vh = torch.linalg.svd(G, full_matrices=False)
    want = U @ torch.diag(singular_value_map(S / G.norm(), 5, "polar_express")) @ Vh
    torch.testing.assert_close(zeropower_ns5(G, 5, "polar_express", dtype=torch.float64), want, rtol=0, atol=1e-12)


def test_cubic_converges_to_one_but_slowly():
    y = composed_map(torch.tensor([1e-2, 0.5, 1.0], dtype=torch.float64), [CUBIC] * 5)[-1]
    assert float(y[2]) == 1.0 and 0.07 < float(y[0]) < 0.08 and float(y[1]) > 0.99


@pytest.mark.parametrize("shape", [(40, 160), (160, 40), (64, 64), (7, 33)])
@pytest.mark.parametrize("coefficients", ["muon", "polar_express"])
def test_gram_form_is_the_same_map_up_to_rounding(shape, coefficients):
    """In float64 the Gram form equals the standard form to 1e-10 (the same polynomial in X X^T, only the
    order of products differs); in float32 to 2e-4 (rounding of the m x m products, which the iteration
    amplifies by at most the polynomial's slope, about 8 for Polar Express's first step)."""
    G = torch.randn(shape, dtype=torch.float64, generator=_gen(2))
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-4)):
        std = zeropower_ns5(G, 5, coefficients, dtype=dtype)
        gram = zeropower_ns5(G, 5, coefficients, dtype=dtype, form="gram")
        assert (std - gram).abs().max() < tol, (dtype, float((std - gram).abs().max()))


@pytest.mark.parametrize("shape", [(64, 96), (96, 64), (50, 50), (20, 100)])
@pytest.mark.parametrize("form", ["standard", "gram"])
def test_flop_and_matmul_counts_match_what_runs(shape, form):
    with FlopCounterMode(display=False) as counter:
        zeropower_ns5(torch.randn(shape), 5, dtype=torch.float32, form=form)
    assert counter.get_total_flops() == ns_flops(*shape, 5, form)
    counts = counter.get_flop_counts()["Global"]
    assert sum(counts.values()) == ns_flops(*shape, 5, form)
    assert ns_matmuls(5, form) == (15 if form == "standard" else 19)


def test_gram_form_saves_flops_on_long_matrices_only():
    assert ns_flops(1024, 4096, 5, "gram") < 0.6 * ns_flops(1024, 4096, 5)
    assert ns_flops(1024, 1024, 5, "gram") > ns_flops(1024, 1024, 5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("form", ["standard", "gram"])
def test_batched_call_equals_one_call_per_matrix(dtype, form, monkeypatch):
    """A batch of same-shape matrices gives each matrix's own result: bit for bit as the CPU runs it (matrix
    by matrix), and within rounding with batched GEMMs (the GPU path, forced here), which on this CPU are
    bit-equal for these sizes but not for all (newton_schulz.CPU_BATCH_AS_LOOP says which)."""
    for shape in [(24, 40), (40, 24), (32, 32), (6, 14)]:
        G = torch.randn(3, *shape, generator=_gen(3))
        one = torch.stack([zeropower_ns5(g, 5, "polar_express", dtype=dtype, form=form) for g in G])
        assert torch.equal(zeropower_ns5(G, 5, "polar_express", dtype=dtype, form=form), one), shape
        monkeypatch.setattr(newton_schulz, "CPU_BATCH_AS_LOOP", False)
        kernels = zeropower_ns5(G, 5, "polar_express", dtype=dtype, form=form)
        monkeypatch.setattr(newton_schulz, "CPU_BATCH_AS_LOOP", True)
        # bf16: a different rounding order may move elements by a few bf16 ulps of the largest (|x| < 1)
        assert (kernels.float() - one.float()).abs().max() < (2e-2 if dtype == torch.bfloat16 else 1e-4), shape


@pytest.mark.parametrize("bad,match", [
    ("polar", "unknown ns_coefficients 'polar'"),
    ((1.0, 2.0), "one \\(a, b, c\\) triple"),
    ([NS_COEFFICIENTS] * 4, "schedule of 4 per-iteration triples but ns_steps is 5: pass ns_steps=4"),
    ((1.0, float("nan"), 0.0), "must be finite"),
    ([(1.0, 2.0, "x")] * 5, "one \\(a, b, c\\) triple"),
])
def test_bad_coefficients_are_refused_when_the_optimizer_is_built(bad, match):
    w = torch.nn.Parameter(torch.randn(4, 6))
    with pytest.raises(ValueError, match=match):
        Muon([w], ns_coefficients=bad)
    with pytest.raises(ValueError, match=match):
        zeropower_ns5(w.detach(), 5, bad)


def test_bad_form_is_refused_and_options_reach_the_step():
    w = torch.nn.Parameter(torch.randn(4, 6))
    with pytest.raises(ValueError, match="group 0: ns_form must be one of \\('standard', 'gram'\\)"):
        Muon([w], ns_form="gramm")
    with pytest.raises(ValueError, match="3-D batch"):
        zeropower_ns5(torch.randn(2, 2, 3, 4))
    # the options reach the step ("original" lr adjustment: lr * sqrt(max(1, 12/30)) = lr)
    G = torch.randn(12, 30, generator=_gen(4))
    p = torch.nn.Parameter(torch.zeros(12, 30))
    opt = Muon([p], lr=0.1, weight_decay=0.0, momentum=0.0, nesterov=False, ns_coefficients="polar_express",
               ns_form="gram", adjust_lr_fn="original")
    p.grad = G.clone()
    opt.step()
    want = -0.1 * zeropower_ns5(G, 5, "polar_express", form="gram").float()
    torch.testing.assert_close(p.detach(), want, rtol=0, atol=0)


def test_gram_form_in_bf16_stays_close_to_the_polar_factor():
    """bf16 on a skewed spectrum (singular values over three decades): the Gram form keeps its m x m
    iteration in fp32, so it lands as near the exact polar factor as the standard form (measured: err
    0.224 vs 0.233, largest singular value 1.14 vs 1.25 for Polar Express at 128x512); with R rounded to
    bf16 it had diverged (largest singular value 133). Bound: err within 0.03 of the standard form's."""
    g = _gen(5)
    U, _, Vh = torch.linalg.svd(torch.randn(64, 256, generator=g, dtype=torch.float64), full_matrices=False)
    G = ((U * torch.logspace(0, -3, 64, dtype=torch.float64)) @ Vh).float()
    exact = U @ Vh
    for coefficients in ("muon", "polar_express"):
        errs = {form: float((zeropower_ns5(G, 5, coefficients, form=form).double() - exact).norm() / exact.norm())
                for form in ("standard", "gram")}
        assert abs(errs["gram"] - errs["standard"]) < 0.03, errs
        assert torch.linalg.svdvals(zeropower_ns5(G, 5, coefficients, form="gram").double()).max() < 1.3


def test_ns_batch_in_one_process_counts_one_call_per_shape_and_refuses_the_bucket_layout():
    """1 x 1 grid, owner layout: the batched step equals single-device Muon bit for bit, with one NS call
    per distinct shape per group (the launch tests in test_ns_group.py cover 2x1 and 2x2)."""
    from muongrid import DistributedMuon, Grid
    from muongrid.lab.synthetic import build_problem
    shapes = [(12, 20), (12, 20), (9, 9), (12, 20), (9, 9), (20, 12)]
    problem = build_problem("muon", shapes, [-1] * 6, 1, seed=3)
    opt = DistributedMuon(problem.param_groups(), Grid.single(), layout="owner", bucket_numel=300, ns_batch=True)
    ref_groups = problem.param_groups()
    ref = Muon(ref_groups)
    for step in (1, 2):
        grads = problem.grads(step, 0)
        for g in (*opt.param_groups, *ref_groups):
            for n, p in zip(g["names"], g["params"]):
                p.grad = grads[n].clone()
        opt.step()
        ref.step()
    assert all(torch.equal(a, b) for g, h in zip(opt.param_groups, ref_groups) for a, b in zip(g["params"], h["params"]))
    assert opt.comm.ledger.summary(2)["ns_calls"] == 3
    with pytest.raises(ValueError, match="ns_batch=True .* needs layout='owner', 'aligned' or 'group'"):
        DistributedMuon(problem.param_groups(), Grid.single(), layout="bucket", ns_batch=True)


def test_variants_script_prints_every_row_and_the_bf16_path(capsys):
    import json
    import compare_ns_variants as script
    assert script.main(["--shapes", "16x24", "--repeats", "1", "--json"]) == 0
    out = capsys.readouterr().out
    assert "bf16 path: " + ("native" if newton_schulz.native_bf16_matmul(torch.device("cpu")) else "emulated") in out
    rows = json.loads(out.strip().splitlines()[-1])["rows"]
    assert len(rows) == 2 * 2 * len(script.VARIANTS)       # inputs x dtypes x variants
    assert all(r["ms_min"] <= r["ms_median"] <= r["ms_max"] for r in rows)
    pe = [r for r in rows if r["coefficients"] == "polar_express" and r["dtype"] == "fp32" and r["input"] == "gaussian"]
    assert all(r["sv_max"] < 1.15 for r in pe)
    with pytest.raises(SystemExit):
        script.main(["--shapes", "16by24"])
