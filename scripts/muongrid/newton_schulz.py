"""Newton-Schulz orthogonalisation (NS5), the heart of Muon, as pure functions.

Muon replaces a momentum matrix ``G = U S V^T`` by something close to ``U V^T``: every
singular value pushed towards 1, the singular vectors kept. An SVD would do it exactly but
is slow and serial on accelerators; a few steps of an odd matrix polynomial do it with
nothing but matmuls. Each step maps every singular value ``s`` to
``a*s + b*s**3 + c*s**5``, so after scaling ``G`` to spectral norm <= 1 (we divide by the
Frobenius norm, which bounds it), five steps with Keller Jordan's coefficients
``(3.4445, -4.7750, 2.0315)`` drive every singular value into roughly [0.7, 1.2]. The
coefficients trade exact convergence for a steep slope at zero, so tiny singular values are
lifted quickly.

The iteration runs in bfloat16 by default: the result only needs to be roughly orthogonal,
and bf16 matmuls are several times faster than fp32 on GPUs and on CPUs with AVX-512/AMX.
A CPU without them (AVX2 only) has no fast bf16 GEMM: torch falls back to a scalar loop that
runs at a few GFLOP/s. There we *emulate* a bf16 GEMM exactly where its rounding happens:
bf16 inputs (products of bf16 numbers are exact in fp32), fp32 accumulation, output rounded to
bf16. That is what bf16 tensor cores do, so the numerics are bf16's; only the order of the
fp32 additions may differ, which moves an occasional element by one bf16 ulp.

Other coefficient schedules (Polar Express, the cubic) and the Gram form are options of the same
function (``ns_coefficients``, ``ns_form``; see ``ns_variants.py``); one matrix sharded over a group of
ranks is ``ns_group.py``. The defaults are the paper's, computed exactly as before.

Run ``python -m muongrid.newton_schulz`` to see the singular values before and after.
"""
from __future__ import annotations

import torch

from .ns_variants import check_ns_form, ns_flops, ns_schedule  # noqa: F401 (ns_flops: re-exported)

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7
NS_FORM = "standard"
# On CPUs a batch runs matrix by matrix. torch's CPU bmm/baddbmm is itself a loop of per-matrix GEMMs for
# most sizes (so one batched call saves only Python overhead), but for some small sizes it takes another
# kernel whose rounding differs from mm/addmm: measured with torch 2.13, 51 of 400 random (r, k, c) in
# [8, 70]^3 differ (each with a side <= 11), and 6x6x6. Looping keeps a batch bit-exact with one call per
# matrix. On GPUs the batch runs as one batched GEMM (same math, rounding-level agreement).
CPU_BATCH_AS_LOOP = True


def native_bf16_matmul(device: torch.device) -> bool:
    """Whether bf16 matmuls on ``device`` run on fast hardware paths (always on GPUs)."""
    if device.type != "cpu":
        return True
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # an older torch without the query: assume it is fast
        return True


def rounder(dtype: torch.dtype, device: torch.device):
    """The rounding every Newton-Schulz kernel here applies after each operation: where ``dtype`` is bf16
    and the device has no native bf16 matmul, round to bf16 and keep computing in fp32 (the emulation above);
    otherwise nothing (the tensors already are ``dtype``)."""
    if dtype == torch.bfloat16 and not native_bf16_matmul(device):
        return lambda t: t.to(dtype).to(torch.float32)
    return lambda t: t


def zeropower_ns5(
    G: torch.Tensor,
    steps: int = NS_STEPS,
    coefficients=NS_COEFFICIENTS,
    eps: float = NS_EPS,
    dtype: torch.dtype = torch.bfloat16,
    form: str = "standard",
) -> torch.Tensor:
    """Return an approximately orthogonal matrix with the singular vectors of ``G``.

    ``G`` must be 2-D, or 3-D for a batch of same-shape matrices, each orthogonalised on its own
    (on a CPU matrix by matrix, bit-exact with one call each; elsewhere with batched GEMMs: see
    ``CPU_BATCH_AS_LOOP``). The work happens on the wide orientation
    (rows <= columns), so the Gram matrix ``X X^T`` is the smaller square. The result has ``G``'s
    shape and ``dtype``. With ``dtype=bfloat16`` on a CPU without a fast bf16 GEMM, each matmul is
    done in fp32 on bf16 values and rounded to bf16 (see the module docstring).

    ``coefficients`` is one (a, b, c) triple (every step), a schedule of ``steps`` triples, or a name
    ("muon", "polar_express", "cubic"); ``form`` is "standard" or "gram" (``ns_variants.py``).
    """
    if G.ndim not in (2, 3):
        raise ValueError(
            f"Newton-Schulz needs a 2-D matrix (or a 3-D batch of them), got a tensor of shape {tuple(G.shape)}; "
            "a flattened shard must be viewed back to its matrix shape first"
        )
    schedule = ns_schedule(coefficients, steps)
    check_ns_form(form)
    if G.ndim == 3 and G.device.type == "cpu" and CPU_BATCH_AS_LOOP:
        return torch.stack([zeropower_ns5(g, steps, coefficients, eps, dtype, form) for g in G])
    r = rounder(dtype, G.device)
    X = r(G.to(dtype))
    tall = G.size(-2) > G.size(-1)
    if tall:
        X = X.mT
    if X.ndim == 2:
        norm = r(X.norm())
    else:  # one norm per matrix, in one reduction (a CPU never gets here: it loops, above)
        norm = r(torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True))
    X = r(X / norm.clamp(min=eps))  # Frobenius norm >= spectral norm, so ||X||_2 <= 1
    X = _gram_iterations(X, schedule, r) if form == "gram" else _standard_iterations(X, schedule, r)
    X = X.to(dtype)
    return X.mT if tall else X


def _standard_iterations(X: torch.Tensor, schedule, r) -> torch.Tensor:
    addmm = torch.addmm if X.ndim == 2 else torch.baddbmm
    for a, b, c in schedule:
        A = r(X @ X.mT)                              # Gram matrix, m x m
        B = r(addmm(A, A, A, beta=b, alpha=c))       # b*A + c*A^2
        X = r(addmm(X, B, X, beta=a))                # a*X + B X
    return X


def _gram_iterations(X: torch.Tensor, schedule, r) -> torch.Tensor:
    """``X_k = Q_k X_0`` with every step done on the m x m Gram matrix ``R = X_k X_k^T`` (``ns_variants.py``).

    The m x m iteration runs in fp32 even when ``X`` is bf16 (R accumulated in fp32 and never rounded):
    rounding R to bf16 loses its small eigenvalues (a singular value 1e-3 is an eigenvalue 1e-6 of R,
    below bf16's resolution of R's large entries); they may turn negative, and a negative eigenvalue
    grows by a^2 every step (we measured singular values of 133 from a skewed bf16 input). The standard
    form recomputes ``X X^T`` from X every step, so its rounding does not build up that way. Only the
    first Gram (fp32 accumulate) and the final ``Q X`` (in ``X``'s precision) touch the long side.
    """
    if not schedule:
        return X
    inner = torch.float64 if X.dtype == torch.float64 else torch.float32
    X32 = X.to(inner)
    return r(r(gram_polynomial(X32 @ X32.mT, schedule).to(X.dtype)) @ X)


def gram_polynomial(R: torch.Tensor, schedule) -> torch.Tensor:
    """``Q`` with ``X_s = Q X_0``, from the Gram matrix ``R = X_0 X_0^T`` alone (m x m, or a batch): the Gram
    form's whole iteration. Pure; the group layout runs it on an all-reduced R (``ns_gram_group.py``)."""
    addmm = torch.addmm if R.ndim == 2 else torch.baddbmm
    Q = None
    for k, (a, b, c) in enumerate(schedule):
        P = addmm(R, R, R, beta=b, alpha=c)          # b*R + c*R^2
        P.diagonal(dim1=-2, dim2=-1).add_(a)         # + a*I
        Q = P if Q is None else P @ Q
        if k < len(schedule) - 1:
            R = (P @ R) @ P                          # X_{k+1} X_{k+1}^T = P R P
    return Q


def singular_value_map(s: torch.Tensor, steps: int = NS_STEPS, coefficients=NS_COEFFICIENTS) -> torch.Tensor:
    """Apply the NS polynomial to singular values directly (in float64): what NS does to each one.

    Useful for plotting: ``zeropower_ns5`` acts on a matrix exactly as this acts on its
    (normalised) singular values, up to the rounding of the matrix arithmetic.
    """
    x = s.to(torch.float64)
    for a, b, c in ns_schedule(coefficients, steps):
        x = a * x + b * x**3 + c * x**5
    return x


def ns5_flops(rows: int, cols: int, steps: int = NS_STEPS) -> int:
    """Floating-point operations of ``zeropower_ns5`` on a rows x cols matrix (multiply-adds count 2).

    With m = min(rows, cols) and n = max(rows, cols), one step costs
    X X^T (2 m^2 n) + A A (2 m^3) + B X (2 m^2 n) = 4 m^2 n + 2 m^3.
    """
    m, n = min(rows, cols), max(rows, cols)
    return steps * (4 * m * m * n + 2 * m**3)


if __name__ == "__main__":
    torch.manual_seed(0)
    G = torch.randn(64, 32) @ torch.diag(torch.logspace(0, -3, 32))  # skewed spectrum
    before = torch.linalg.svdvals(G)
    after = torch.linalg.svdvals(zeropower_ns5(G).float())
    print("singular values before (max, min):", f"{before.max():.3g}", f"{before.min():.3g}")
    print("singular values after  (max, min):", f"{after.max():.3g}", f"{after.min():.3g}")
    print("NS5 FLOPs for 1024x1024:", f"{ns5_flops(1024, 1024):.3g}")
