"""The group's row form (``muongrid.ns_group.zeropower_rows``), its closed form and the choice of form.

The row form shares one matrix over k ranks along its short side: every member all-gathers the whole
matrix, then computes its rows of A = X X^T, of B and of the new X, and all-gathers A and X each step.
It runs here in threads (``ns_group.simulate(..., rows=True)``), against ``zeropower_ns5`` of the
whole matrix, on shapes whose sides do not divide by k.

Tolerance, any machine: the same as the Gram form's (``tests/test_ns_group.py``): fp32 relative
Frobenius difference <= 1e-5; bf16 <= min(1e-2, the reference's own bf16-vs-fp32 distance). Why: no
sum crosses ranks, but a GEMM called on fewer rows may take another kernel or split its inner sum
differently (MKL below 4 rows, or with 2 threads at 5-7 and 9-11 rows; cuBLAS split-K; oneDNN bf16),
which reorders fp32 sums exactly as the Gram form's partial sums do.

Bit for bit, where measured: on an AVX2 CPU with MKL and emulated bf16 (the machine this was built
on), one intra-op thread and every member holding >= 4 rows, the row form equals ``zeropower_ns5``
exactly (``ns_group.py`` says why); the test asserts that only on such a machine.

    pytest -q tests/test_group_rows.py
"""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from muongrid.lab import costmodel
from muongrid.newton_schulz import native_bf16_matmul, zeropower_ns5
from muongrid.ns_group import (group_form, group_ring_bytes, row_collectives, row_flops, simulate, split_long_side,
                            zeropower_rows)

MEASURED_EXACT = (torch.backends.cpu.get_cpu_capability() == "AVX2" and torch.backends.mkl.is_available()
                  and not native_bf16_matmul(torch.device("cpu")))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("shape", [(41, 130), (130, 41), (33, 101), (101, 34), (50, 49)])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_row_form_matches_one_process(shape, k, one_thread):
    G = torch.randn(shape, generator=torch.Generator().manual_seed(k + shape[0]))
    long_dim, blocks = split_long_side(G, k)
    assert shape[0] % k or shape[1] % k                       # a side that does not divide
    for dtype in (torch.float32, torch.bfloat16):
        parts = simulate(blocks, long_dim, rows=True, dtype=dtype)
        assert [p.shape for p in parts] == [b.shape for b in blocks] and all(p.dtype == dtype for p in parts)
        out, ref = torch.cat(parts, dim=long_dim), zeropower_ns5(G, dtype=dtype)
        if dtype == torch.float32:
            assert rel(out, ref) <= 1e-5, rel(out, ref)
        else:
            own = rel(ref, zeropower_ns5(G, dtype=torch.float32))
            assert rel(out, ref) <= min(1e-2, own), (rel(out, ref), own)
        if MEASURED_EXACT and min(shape) // k >= 4:
            assert torch.equal(out, ref), (shape, k, dtype, rel(out, ref))


def test_row_form_takes_schedules(one_thread):
    G = torch.randn(30, 70, generator=torch.Generator().manual_seed(3))
    _, blocks = split_long_side(G, 3)
    out = torch.cat(simulate(blocks, 1, rows=True, coefficients="polar_express", dtype=torch.float32), dim=1)
    assert rel(out, zeropower_ns5(G, 5, "polar_express", dtype=torch.float32)) <= 1e-5


def recorded(shape, k, i, dtype=torch.bfloat16):
    """Run member i of k alone with an all-gather that tiles its input k times (values are not the point):
    the collectives it issues, as (elements, dtype), and its FLOPs."""
    G = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    long_dim, blocks = split_long_side(G, k)
    calls = []

    def gather(t):
        calls.append((t.numel(), t.dtype))
        return t.repeat(k)
    with FlopCounterMode(display=False) as counter:
        out = zeropower_rows(blocks[i], gather, long_dim, max(shape), (i, k), dtype=dtype)
    assert out.shape == blocks[i].shape
    return calls, counter.get_total_flops()


@pytest.mark.parametrize("shape,k", [((96, 230), 4), ((228, 64), 3), ((50, 49), 2), ((7, 5), 4)])
def test_row_closed_form_is_the_ring_price_of_the_collectives_it_calls(shape, k):
    for i in range(k):
        calls, flops = recorded(shape, k, i)
        assert all(d == torch.bfloat16 for _, d in calls)
        n_calls, nbytes = row_collectives(*shape, k)
        assert (len(calls), 2 * sum(n for n, _ in calls)) == (n_calls, nbytes) and n_calls == 11
        ring = (k - 1) * 2 * sum(n for n, _ in calls)       # a ring all-gather: k - 1 hops of the input
        assert ring == group_ring_bytes("rows", *shape, k) == costmodel.group_row_bytes(*shape, k)
        assert flops == row_flops(*shape, (i, k))
    m, n = min(shape), max(shape)
    per_m, per_n = -(-m // k), -(-n // k)
    assert costmodel.group_row_bytes(*shape, k) == (k - 1) * 2 * (per_n * m + 5 * (per_m * m + per_m * n))
    assert group_ring_bytes("gram", *shape, k) == costmodel.group_gram_bytes(*shape, k)


def test_form_choice_is_the_one_with_fewer_bytes_and_depends_on_the_shape_only():
    for m in (8, 64, 96, 1000, 4096):
        for n in (m, 2 * m, 3 * m, 4 * m, 8 * m, m + 7):
            for k in (2, 3, 4, 8):
                for steps in (1, 5):
                    form = group_form(m, n, k, steps)
                    gram, row = costmodel.group_gram_bytes(m, n, k, steps), costmodel.group_row_bytes(m, n, k, steps)
                    assert form == ("rows" if row < gram else "gram"), (m, n, k, steps)
                    assert form == group_form(n, m, k, steps)                    # tall or wide alike
                    assert costmodel.group_bytes(m, n, k, steps) == min(gram, row)
    assert group_form(4096, 4096, 4) == "rows" and group_form(4096, 14336, 4) == "gram"
    # about 10 steps m^2 against 2 (m n + steps (m^2 + m n)): the row form wins below n = 3.33 m at 5 steps
    assert group_form(3000, 9900, 4) == "rows" and group_form(3000, 10100, 4) == "gram"
    assert costmodel.group_bytes(4096, 4096, 4) < 0.45 * costmodel.group_gram_bytes(4096, 4096, 4)


def test_bad_input_is_refused_with_the_fix():
    block = torch.randn(10, 20)
    with pytest.raises(ValueError, match="long_dim 0 or 1"):
        zeropower_rows(block, lambda t: t, 2, 20, (0, 1))
    with pytest.raises(ValueError, match="0 <= index < size"):
        zeropower_rows(block, lambda t: t, 1, 20, (2, 2))
    with pytest.raises(ValueError, match="pass the matrix's full long side"):
        zeropower_rows(block, lambda t: t, 1, 45, (0, 2))
    with pytest.raises(ValueError, match="must be the long side"):
        zeropower_rows(block, lambda t: t, 0, 10, (0, 1))
    with pytest.raises(ValueError, match="unknown ns_coefficients"):
        zeropower_rows(block, lambda t: t, 1, 20, (0, 1), coefficients="fast")
    for bad in ((0, 5, 2), (5, 5, 0), (5.0, 5, 2), (5, 5, True)):
        with pytest.raises(ValueError, match="positive int"):
            group_form(*bad)
    with pytest.raises(ValueError, match="non-negative int steps"):
        group_form(5, 5, 2, -1)
    with pytest.raises(ValueError, match="unknown group form"):
        group_ring_bytes("cols", 5, 5, 2)
